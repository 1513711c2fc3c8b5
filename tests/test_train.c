/* Training loop: exactness against the PyTorch reference loop
 * (tools/gen_train_fixture.py: same model, data order, schedule, clipping,
 * accumulation, AdamW), plus the pieces on their own. */
#include "train/train.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "kernels/kernels.h"
#include "launch/job.h"
#include "launch/run_setup.h"
#include "tests/test.h"

#define FIXTURE "tests/fixtures/train_llama"

static json_t *expected_load(void)
{
    json_error_t jerr;
    json_t *j = json_load_file(FIXTURE "/expected.json", 0, &jerr);
    if (!j) fprintf(stderr, "expected.json: %s\n", jerr.text);
    return j;
}

static double jnum(json_t *o, const char *key) { return json_number_value(json_object_get(o, key)); }

/* A job equivalent to the fixture's hyper-parameters. */
static bt_status_t fixture_job(json_t *ex, job_t *job)
{
    json_t *hp = json_object_get(ex, "hyper");
    json_t *betas = json_object_get(hp, "betas");
    char yaml[2048], err[JOB_ERR_MAX];
    snprintf(yaml, sizeof yaml,
             "model: {hf: " FIXTURE "}\n"
             "data: {dir: " FIXTURE ", seq_len: %lld, split: 0}\n"
             "train: {steps: %lld, micro_batch: %lld, grad_accum: %lld, seed: %lld}\n"
             "optim: {lr: %.17g, min_lr: %.17g, warmup: %lld, warmup_from: %s, betas: [%.17g, %.17g],"
             " eps: %.17g, weight_decay: %.17g, clip: %.17g, decay: %s}\n",
             (long long)jnum(hp, "seq_len"), (long long)jnum(hp, "steps"),
             (long long)jnum(hp, "micro_batch"), (long long)jnum(hp, "grad_accum"),
             (long long)jnum(hp, "seed"), jnum(hp, "lr"), jnum(hp, "min_lr"),
             (long long)jnum(hp, "warmup"),
             json_is_true(json_object_get(hp, "warmup_from_min")) ? "min_lr" : "zero",
             json_number_value(json_array_get(betas, 0)), json_number_value(json_array_get(betas, 1)),
             jnum(hp, "eps"), jnum(hp, "weight_decay"), jnum(hp, "clip"),
             json_string_value(json_object_get(hp, "decay")));
    bt_status_t st = job_load_string("fixture.yaml", yaml, job, err, sizeof err);
    if (st == BT_OK) st = job_validate(job, err, sizeof err);
    if (st) fprintf(stderr, "%s\n", err);
    return st;
}

static void test_train_matches_torch(void)
{
    json_t *ex = expected_load();
    REQUIRE(ex);
    job_t job;
    model_t *m = NULL;
    train_t *t = NULL;
    int32_t *tokens = NULL;
    const int32_t *val;
    int64_t n_train, n_val;
    if (fixture_job(ex, &job) || run_model_create(&job, &m) ||
        run_tokens_load(job.data.dir, 0.0, &tokens, &n_train, &val, &n_val, NULL)) {
        CHECK(!"fixture setup");
        goto out;
    }
    CHECK(n_train == (int64_t)jnum(ex, "n_tokens") && n_val == 0);
    train_config_t cfg;
    run_train_config(&job, &cfg);
    if (train_create(&cfg, m, tokens, n_train, NULL, 0, &t)) {
        CHECK(!"train_create");
        goto out;
    }
    json_t *steps = json_object_get(ex, "steps");
    REQUIRE(json_array_size(steps) == (size_t)cfg.steps);
    double worst = 0;
    for (int64_t s = 0; s < cfg.steps; s++) {
        train_step_info_t info;
        REQUIRE(train_step(t, &info) == BT_OK);
        json_t *e = json_array_get(steps, (size_t)s);
        double rel = fabs(info.loss - jnum(e, "loss")) / fabs(jnum(e, "loss"));
        if (rel > worst) worst = rel;
        printf("step %2lld loss %.7f torch %.7f rel %.2e | norm %.6f torch %.6f | lr %.6g\n",
               (long long)info.step, info.loss, jnum(e, "loss"), rel, info.grad_norm,
               jnum(e, "grad_norm"), info.lr);
        CHECK(info.step == s + 1);
        CHECK_NEAR(info.loss, jnum(e, "loss"), 1e-5, 0);
        CHECK_NEAR(info.lr, jnum(e, "lr"), 1e-12, 0);
        CHECK_NEAR(info.grad_norm, jnum(e, "grad_norm"), 1e-5, 0);
        CHECK(info.tokens == cfg.micro_batch * cfg.grad_accum * cfg.seq_len);
    }
    printf("worst relative loss difference over %lld steps: %.3e\n", (long long)cfg.steps, worst);
    /* final parameters: sum, sum of squares and the first values of each */
    json_t *final = json_object_get(ex, "final");
    CHECK((int)json_object_size(final) == m->n_params);
    for (int i = 0; i < m->n_params; i++) {
        json_t *f = json_object_get(final, m->params[i].name);
        CHECK_MSG(f != NULL, "%s not in expected.json", m->params[i].name);
        if (!f) continue;
        const float *d = m->params[i].t.data;
        double sum = 0, sq = 0;
        for (int64_t j = 0; j < tensor_numel(&m->params[i].t); j++) { sum += d[j]; sq += (double)d[j] * d[j]; }
        CHECK_NEAR(sq, jnum(f, "sumsq"), 1e-5, 0);
        CHECK_NEAR(sum, jnum(f, "sum"), 1e-4, 1e-4 * sqrt(jnum(f, "sumsq")));
        json_t *first = json_object_get(f, "first");
        for (size_t k = 0; k < json_array_size(first); k++)
            CHECK_NEAR(d[k], json_number_value(json_array_get(first, k)), 1e-4, 1e-6);
    }
out:
    train_destroy(t);
    model_destroy(m);
    free(tokens);
    json_decref(ex);
}

static void test_train_sampler_matches_python(void)
{
    json_t *ex = expected_load();
    REQUIRE(ex);
    json_t *hp = json_object_get(ex, "hyper"), *w = json_object_get(ex, "windows");
    int64_t n_windows = ((int64_t)jnum(ex, "n_tokens") - 1) / (int64_t)jnum(hp, "seq_len");
    train_sampler_t s;
    REQUIRE(train_sampler_init(&s, (uint64_t)jnum(hp, "seed"), n_windows) == BT_OK);
    REQUIRE(json_array_size(w) > (size_t)n_windows); /* crosses an epoch */
    for (size_t g = 0; g < json_array_size(w); g++)
        CHECK(train_sampler_window(&s, (int64_t)g) == json_integer_value(json_array_get(w, g)));
    /* every epoch is a permutation; epochs differ; another seed differs */
    int seen[64] = {0}, same = 0;
    REQUIRE(n_windows <= 64);
    for (int64_t g = 0; g < n_windows; g++) seen[train_sampler_window(&s, g)]++;
    for (int64_t i = 0; i < n_windows; i++) CHECK(seen[i] == 1);
    for (int64_t g = 0; g < n_windows; g++)
        same += train_sampler_window(&s, g) == train_sampler_window(&s, g + n_windows);
    CHECK(same < n_windows / 2);
    train_sampler_t s2;
    REQUIRE(train_sampler_init(&s2, 99, n_windows) == BT_OK);
    same = 0;
    for (int64_t g = 0; g < n_windows; g++) same += train_sampler_window(&s, g) == train_sampler_window(&s2, g);
    CHECK(same < n_windows / 2);
    /* splitmix64 reference value (seed 0, first output) */
    uint64_t st = 0;
    CHECK(train_splitmix64(&st) == 0xE220A8397B1DCDAFull);
    train_sampler_free(&s);
    train_sampler_free(&s2);
    json_decref(ex);
}

static void test_train_lr_schedule(void)
{
    lr_schedule_t s = {.lr = 1.0, .min_lr = 0.1, .warmup = 4, .total = 14};
    CHECK_NEAR(lr_schedule_at(&s, 0), 0.25, 1e-15, 0);
    CHECK_NEAR(lr_schedule_at(&s, 3), 1.0, 1e-15, 0);
    /* decay: p = (s - 3) / 10 */
    for (int64_t k = 4; k < 14; k++) {
        double p = (double)(k - 3) / 10.0;
        CHECK_NEAR(lr_schedule_at(&s, k), 0.1 + 0.45 * (1 + cos(M_PI * p)), 1e-15, 0);
        CHECK(lr_schedule_at(&s, k) < lr_schedule_at(&s, k - 1));
    }
    CHECK_NEAR(lr_schedule_at(&s, 8), 0.55, 1e-15, 0); /* half way: mean of lr and min_lr */
    CHECK_NEAR(lr_schedule_at(&s, 13), 0.1, 1e-15, 0);
    CHECK_NEAR(lr_schedule_at(&s, 100), 0.1, 1e-15, 0);
    s.warmup_from_min = true;
    CHECK_NEAR(lr_schedule_at(&s, 0), 0.1 + 0.9 * 0.25, 1e-15, 0);
    s.warmup = 0;
    CHECK(lr_schedule_at(&s, 0) < 1.0 && lr_schedule_at(&s, 0) > 0.97);
}

/* Two parameters (a matrix and a vector): grad norm, clip coefficient,
 * decay groups and one AdamW update against a double-precision reference. */
static void test_train_optim_clip_adamw(void)
{
    float w[6] = {0.5f, -1.0f, 0.25f, 2.0f, -0.75f, 1.5f}, gw[6] = {3, -4, 1, 0.5f, -2, 1};
    float b[3] = {0.1f, -0.2f, 0.3f}, gb[3] = {1, 2, -2};
    float w0[6], b0[3], gw0[6], gb0[3];
    memcpy(w0, w, sizeof w); memcpy(b0, b, sizeof b); memcpy(gw0, gw, sizeof gw); memcpy(gb0, gb, sizeof gb);
    optim_param_t ps[2] = {
        {"w", tensor_2d(w, DT_F32, 2, 3), tensor_2d(gw, DT_F32, 2, 3), {0}},
        {"b", tensor_1d(b, DT_F32, 3), tensor_1d(gb, DT_F32, 3), {0}},
    };
    optim_config_t cfg = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                          .decay = OPTIM_DECAY_MATRICES};
    optim_t *o;
    REQUIRE(optim_create(&cfg, ps, 2, kern_stream_host(), &o) == BT_OK);
    CHECK(optim_param_decays(o, 0) && !optim_param_decays(o, 1));
    double sq = 0;
    for (int i = 0; i < 6; i++) sq += (double)gw[i] * gw[i];
    for (int i = 0; i < 3; i++) sq += (double)gb[i] * gb[i];
    double norm = optim_grad_norm(o);
    CHECK_NEAR(norm, sqrt(sq), 1e-12, 0);
    double coef = optim_clip_coef(norm, 2.0);
    CHECK_NEAR(coef, 2.0 / (sqrt(sq) + 1e-6), 1e-12, 0);
    CHECK(optim_clip_coef(norm, 100.0) == 1.0 && optim_clip_coef(norm, 0) == 1.0);
    double lr = 0.01;
    optim_step(o, lr, coef);
    /* reference: first AdamW step with bias correction, m = (1-b1) g, v = (1-b2) g^2 */
    for (int k = 0; k < 9; k++) {
        bool is_w = k < 6;
        double p = is_w ? w0[k] : b0[k - 6], g = (is_w ? gw0[k] : gb0[k - 6]) * coef;
        double wd = is_w ? 0.1 : 0.0;
        p *= 1 - lr * wd;
        double m = 0.1 * g, v = 0.05 * g * g;
        double mhat = m / (1 - 0.9), vhat = v / (1 - 0.95);
        p -= lr * mhat / (sqrt(vhat) + 1e-8);
        CHECK_NEAR(is_w ? w[k] : b[k - 6], p, 2e-6, 1e-7);
    }
    /* the gradients were clipped in place, as clip_grad_norm_ does */
    CHECK_NEAR(gw[0], 3 * coef, 1e-6, 0);
    CHECK(optim_step_count(o) == 1);
    /* NaN gradient detection names the parameter */
    gb[1] = NAN;
    CHECK(optim_find_nonfinite_grad(o) && !strcmp(optim_find_nonfinite_grad(o), "b"));
    CHECK(isnan(optim_grad_norm(o)));
    optim_destroy(o);
}

/* grad_accum 2 x micro_batch 2 must equal grad_accum 1 x micro_batch 4 on
 * the same samples: same loss, same update. */
static void test_train_accumulation_equivalence(void)
{
    json_t *ex = expected_load();
    REQUIRE(ex);
    job_t job;
    model_t *m1 = NULL, *m2 = NULL;
    train_t *t1 = NULL, *t2 = NULL;
    int32_t *tokens = NULL;
    const int32_t *val;
    int64_t n_train, n_val;
    if (fixture_job(ex, &job) || run_model_create(&job, &m1) || run_model_create(&job, &m2) ||
        run_tokens_load(job.data.dir, 0.0, &tokens, &n_train, &val, &n_val, NULL)) {
        CHECK(!"fixture setup");
        goto out;
    }
    train_config_t c1, c2;
    run_train_config(&job, &c1);
    c1.grad_accum = 2; c1.micro_batch = 2;
    c2 = c1;
    c2.grad_accum = 1; c2.micro_batch = 4;
    REQUIRE(train_create(&c1, m1, tokens, n_train, NULL, 0, &t1) == BT_OK);
    REQUIRE(train_create(&c2, m2, tokens, n_train, NULL, 0, &t2) == BT_OK);
    for (int s = 0; s < 3; s++) {
        train_step_info_t a, b;
        REQUIRE(train_step(t1, &a) == BT_OK && train_step(t2, &b) == BT_OK);
        CHECK_NEAR(a.loss, b.loss, 1e-6, 0);
        CHECK_NEAR(a.grad_norm, b.grad_norm, 1e-5, 0);
    }
    double maxdiff = 0;
    const float *p1 = m1->param_mem, *p2 = m2->param_mem;
    for (size_t i = 0; i < m1->param_bytes / sizeof(float); i++) {
        double d = fabs((double)p1[i] - p2[i]);
        if (d > maxdiff) maxdiff = d;
    }
    CHECK_MSG(maxdiff < 1e-5, "max parameter difference %g", maxdiff);
out:
    train_destroy(t1);
    train_destroy(t2);
    model_destroy(m1);
    model_destroy(m2);
    free(tokens);
    json_decref(ex);
}

/* A NaN in the weights: the step fails with BT_ERR_NUMERIC and leaves the
 * parameters untouched; validation loss on held-out data is finite before. */
static void test_train_nan_and_eval(void)
{
    json_t *ex = expected_load();
    REQUIRE(ex);
    job_t job;
    model_t *m = NULL;
    train_t *t = NULL;
    int32_t *tokens = NULL;
    float *copy = NULL;
    const int32_t *val;
    int64_t n_train, n_val;
    if (fixture_job(ex, &job) || run_model_create(&job, &m) ||
        run_tokens_load(job.data.dir, 0.25, &tokens, &n_train, &val, &n_val, NULL)) {
        CHECK(!"fixture setup");
        goto out;
    }
    CHECK(n_val == 100 && n_train == 301);
    train_config_t c;
    run_train_config(&job, &c);
    c.eval_batches = 2;
    REQUIRE(train_create(&c, m, tokens, n_train, val, n_val, &t) == BT_OK);
    double loss, ppl;
    REQUIRE(train_eval(t, &loss, &ppl) == BT_OK);
    /* untrained: near the uniform distribution's log(256) = 5.545 */
    CHECK(loss > 5.0 && loss < 6.5);
    CHECK_NEAR(ppl, exp(loss), 1e-12, 0);
    /* eval_batches 0 = the whole stream (6 windows of 16 in 100 tokens) = a
     * large enough explicit count, and differs from the first 2x2 windows */
    train_t *t_all = NULL, *t_many = NULL;
    train_config_t c_all = c, c_many = c;
    c_all.eval_batches = 0;
    c_many.eval_batches = 1000;
    double l_all = 0, l_many = 0, p_unused;
    CHECK(train_create(&c_all, m, tokens, n_train, val, n_val, &t_all) == BT_OK &&
          train_eval(t_all, &l_all, &p_unused) == BT_OK);
    CHECK(train_create(&c_many, m, tokens, n_train, val, n_val, &t_many) == BT_OK &&
          train_eval(t_many, &l_many, &p_unused) == BT_OK);
    CHECK(l_all == l_many && l_all != loss);
    train_destroy(t_all);
    train_destroy(t_many);
    int emb = model_param_find(m, "model.layers.0.mlp.up_proj.weight");
    REQUIRE(emb >= 0);
    ((float *)m->params[emb].t.data)[5] = NAN;
    size_t n_el = m->param_bytes / sizeof(float);
    const float *pm = m->param_mem;
    copy = malloc(m->param_bytes);
    REQUIRE(copy);
    memcpy(copy, m->param_mem, m->param_bytes);
    train_step_info_t info;
    CHECK(train_step(t, &info) == BT_ERR_NUMERIC);
    CHECK(train_steps_done(t) == 0);
    size_t changed = 0;
    for (size_t i = 0; i < n_el; i++) changed += memcmp(&copy[i], &pm[i], sizeof(float)) != 0;
    CHECK(changed == 0);
out:
    free(copy);
    train_destroy(t);
    model_destroy(m);
    free(tokens);
    json_decref(ex);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_train_matches_torch, test_train_sampler_matches_python,
             test_train_lr_schedule, test_train_optim_clip_adamw,
             test_train_accumulation_equivalence, test_train_nan_and_eval);
}
