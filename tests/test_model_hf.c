/* The model against Hugging Face transformers' own outputs
 * (tests/fixtures/<name>/ref.safetensors, written by tools/gen_fixtures.py):
 * pooled loss, all logits, and the gradient of every parameter.
 *
 * Metric: loss relative error |a-b|/|b| <= 1e-5; logits and each gradient
 * tensor max|a-b| / max|b| <= 1e-4 (norm-relative, per tensor). */
#include <stdlib.h>
#include <string.h>

#include "ckpt/hf.h"
#include "ckpt/safetensors.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "tests/test.h"

#define FIX "tests/fixtures/"
#define LOSS_RTOL 1e-5
#define TENSOR_RTOL 1e-4

typedef struct {
    ckpt_st_file_t *ref;
    int64_t S, Tmax;
    int32_t *ids;  /* [S, Tmax] */
    int32_t *lens; /* [S] */
    double loss;
    int64_t n_scored;
} ref_t;

static int ref_open(const char *name, ref_t *r)
{
    char path[256];
    snprintf(path, sizeof path, FIX "%s/ref.safetensors", name);
    memset(r, 0, sizeof *r);
    if (ckpt_st_open(path, &r->ref) != BT_OK) return -1;
    const ckpt_st_tensor_t *ids = ckpt_st_find(r->ref, "ids"), *lens = ckpt_st_find(r->ref, "lens");
    const ckpt_st_tensor_t *loss = ckpt_st_find(r->ref, "loss");
    if (!ids || !lens || !loss || ids->dtype != DT_I32 || loss->dtype != DT_F64) return -1;
    r->S = ids->shape[0];
    r->Tmax = ids->shape[1];
    r->ids = malloc((size_t)(r->S * r->Tmax) * 4);
    r->lens = malloc((size_t)r->S * 4);
    memcpy(r->ids, ids->data, (size_t)(r->S * r->Tmax) * 4);
    memcpy(r->lens, lens->data, (size_t)r->S * 4);
    memcpy(&r->loss, loss->data, 8);
    for (int64_t s = 0; s < r->S; s++) r->n_scored += r->lens[s] - 1;
    return 0;
}

static void ref_close(ref_t *r)
{
    free(r->ids);
    free(r->lens);
    ckpt_st_close(r->ref);
}

/* max|a-b| / max|b| */
static double rel_err(const float *a, const float *b, int64_t n)
{
    double md = 0, mb = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > md || d != d) md = d != d ? INFINITY : d;
        if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
    }
    return mb > 0 ? md / mb : md;
}

/* Compares every gradient of m (whole or a stage) with the reference, a
 * stacked parameter (model.h) slab by slab against each index's tensor, a
 * row part against its rows of its tensor; returns the worst relative
 * error. */
static double grads_check(const model_t *m, const ref_t *r, const char *fixture)
{
    double worst = 0;
    for (int i = 0; i < m->n_params; i++) {
        const char *name = m->params[i].name;
        char base[128], key[160];
        int part;
        int64_t row0, rows;
        if (model_name_part(name, base, sizeof base, &part)) {
            CHECK(model_part_rows(m->params, m->n_params, i, &row0, &rows));
            snprintf(key, sizeof key, "grad.%s", base);
            const ckpt_st_tensor_t *g = ckpt_st_find(r->ref, key);
            CHECK_MSG(g != NULL, "%s: no reference for %s", fixture, key);
            int64_t n = tensor_numel(&m->grads[i].t), per = n / m->params[i].t.shape[0];
            if (!g || g->numel != rows * per) {
                CHECK_MSG(0, "%s: %s: reference of %lld elements", fixture, name,
                          g ? (long long)g->numel : -1LL);
                continue;
            }
            float *want = malloc((size_t)n * 4);
            memcpy(want, (const float *)g->data + row0 * per, (size_t)n * 4);
            double e = rel_err((const float *)m->grads[i].t.data, want, n);
            CHECK_MSG(e <= TENSOR_RTOL, "%s: gradient %s rel err %.3g", fixture, name, e);
            if (e > worst) worst = e;
            free(want);
            continue;
        }
        bool stacked = model_name_is_stacked(name);
        int64_t slabs = stacked ? m->params[i].spec.global[0] : 1;
        int64_t n = tensor_numel(&m->grads[i].t) / slabs;
        for (int64_t k = 0; k < slabs; k++) {
            char hf[128];
            if (stacked && !model_name_unstack(name, k, hf, sizeof hf)) {
                CHECK_MSG(0, "%s: %s does not unstack", fixture, name);
                continue;
            }
            snprintf(key, sizeof key, "grad.%s", stacked ? hf : name);
            const ckpt_st_tensor_t *g = ckpt_st_find(r->ref, key);
            CHECK_MSG(g != NULL, "%s: no reference for %s", fixture, key);
            if (!g) continue;
            CHECK(g->numel == n);
            if (g->numel != n) continue;
            float *want = malloc((size_t)n * 4);
            memcpy(want, g->data, (size_t)n * 4);
            double e = rel_err((const float *)m->grads[i].t.data + k * n, want, n);
            CHECK_MSG(e <= TENSOR_RTOL, "%s: gradient %s rel err %.3g", fixture, key + 5, e);
            if (e > worst) worst = e;
            free(want);
        }
    }
    return worst;
}

/* One sequence at a time (B = 1, T = its length), as transformers does. */
static void fixture_check(const char *name)
{
    char dir[256];
    snprintf(dir, sizeof dir, FIX "%s", name);
    ref_t r;
    REQUIRE(ref_open(name, &r) == 0);
    model_t *m = NULL;
    REQUIRE(ckpt_hf_load(dir, NULL, &m) == BT_OK);
    model_acts_t *a = NULL;
    REQUIRE(model_acts_create(m, 1, r.Tmax, &a) == BT_OK);
    int64_t V = m->cfg.vocab_size;
    const ckpt_st_tensor_t *lg = ckpt_st_find(r.ref, "logits");
    REQUIRE(lg != NULL);
    float *want_logits = malloc((size_t)lg->numel * 4);
    memcpy(want_logits, lg->data, (size_t)lg->numel * 4);
    float *logits = malloc((size_t)lg->numel * 4);
    int32_t *targets = malloc((size_t)r.Tmax * 4);

    double sum = 0, aux = 0;
    int64_t scored = 0, row = 0;
    float dloss = 1.0f / (float)r.n_scored;
    for (int64_t s = 0; s < r.S; s++) {
        int64_t T = r.lens[s];
        const int32_t *ids = r.ids + s * r.Tmax;
        model_targets_from_ids(targets, ids, NULL, 1, T);
        model_batch_t b = {.B = 1, .T = T, .ids = ids, .targets = targets,
                           .logits_out = logits + row * V};
        model_loss_t l;
        REQUIRE(model_forward_backward(m, a, &b, dloss, &l) == BT_OK);
        sum += l.loss_sum;
        aux += l.aux_sum;
        scored += l.n_scored;
        row += T;
    }
    CHECK(scored == r.n_scored);
    double loss = sum / (double)scored;
    double lerr = fabs(loss - r.loss) / fabs(r.loss);
    CHECK_MSG(lerr <= LOSS_RTOL, "%s: loss %.9g vs %.9g", name, loss, r.loss);
    /* the router's load-balancing term alone (MoE fixtures), pooled as the loss */
    const ckpt_st_tensor_t *ra = ckpt_st_find(r.ref, "aux");
    if (ra) {
        double want_aux;
        memcpy(&want_aux, ra->data, 8);
        want_aux *= m->cfg.moe.aux_loss_coef;
        double aerr = want_aux != 0 ? fabs(aux / (double)scored - want_aux) / want_aux
                                    : fabs(aux);
        CHECK_MSG(aerr <= LOSS_RTOL, "%s: aux term %.9g vs %.9g", name, aux / (double)scored,
                  want_aux);
        printf("  %-18s router aux term %.7f (ref %.7f, rel %.2e)\n", name,
               aux / (double)scored, want_aux, aerr);
    }
    double logit_err = rel_err(logits, want_logits, lg->numel);
    CHECK_MSG(logit_err <= TENSOR_RTOL, "%s: logits rel err %.3g", name, logit_err);
    double gerr = grads_check(m, &r, name);
    printf("  %-18s loss %.7f (ref %.7f, rel %.2e)  logits %.2e  worst grad %.2e\n", name,
           loss, r.loss, lerr, logit_err, gerr);

    free(targets);
    free(logits);
    free(want_logits);
    model_acts_destroy(a);
    model_destroy(m);
    ref_close(&r);
}

static void test_hf_llama(void) { fixture_check("llama"); }
static void test_hf_llama_tied_llama3(void) { fixture_check("llama_tied_llama3"); }
static void test_hf_mistral(void) { fixture_check("mistral"); }
static void test_hf_qwen2(void) { fixture_check("qwen2"); }
static void test_hf_llama_f16(void) { fixture_check("llama_f16"); }
static void test_hf_qwen2_bf16(void) { fixture_check("qwen2_bf16"); }
static void test_hf_llama_sharded(void) { fixture_check("llama_sharded"); }
static void test_hf_mixtral(void) { fixture_check("mixtral"); }
static void test_hf_qwen2_moe(void) { fixture_check("qwen2_moe"); }
static void test_hf_qwen2_moe_norm(void) { fixture_check("qwen2_moe_norm"); }
/* Qwen3: q and k RMS-normed per head before RoPE (q_norm, k_norm), head_dim
 * 16 x 4 heads != hidden 48, tied embeddings; Qwen3-MoE: the same attention
 * with its biases on, routed experts without a shared expert, a dense layer,
 * the router's aux loss */
static void test_hf_qwen3(void) { fixture_check("qwen3"); }
static void test_hf_qwen3_moe(void) { fixture_check("qwen3_moe"); }
/* Phi-3: q/k/v as row parts of one qkv_proj, gate/up of one gate_up_proj */
static void test_hf_phi3(void) { fixture_check("phi3"); }
/* sliding windows shorter than the sequences: every layer's (Mistral, 6),
 * layers 1 and 2 of 3 only (Qwen2 max_window_layers 1, window 5) */
static void test_hf_mistral_window(void) { fixture_check("mistral_window"); }
static void test_hf_qwen2_window(void) { fixture_check("qwen2_window"); }
/* NemotronH (tools/gen_nemotronh_fixtures.py): Mamba2 mixers, attention
 * without RoPE and relu2 MLPs, one block per layer */
static void test_hf_nemotronh(void) { fixture_check("nemotronh"); }
static void test_hf_nemotronh_bias(void) { fixture_check("nemotronh_bias"); }
static void test_hf_deepseek_v2_lite(void) { fixture_check("deepseek_v2_lite"); }
static void test_hf_deepseek_v2(void) { fixture_check("deepseek_v2"); }

/* All sequences in one right-padded batch give the same loss and grads. */
static void test_hf_padded_batch(void)
{
    const char *name = "llama_tied_llama3";
    char dir[256];
    snprintf(dir, sizeof dir, FIX "%s", name);
    ref_t r;
    REQUIRE(ref_open(name, &r) == 0);
    model_t *m = NULL;
    REQUIRE(ckpt_hf_load(dir, NULL, &m) == BT_OK);
    model_acts_t *a = NULL;
    REQUIRE(model_acts_create(m, r.S, r.Tmax, &a) == BT_OK);
    int32_t *targets = malloc((size_t)(r.S * r.Tmax) * 4);
    int64_t *lens = malloc((size_t)r.S * 8);
    for (int64_t s = 0; s < r.S; s++) lens[s] = r.lens[s];
    model_targets_from_ids(targets, r.ids, lens, r.S, r.Tmax);
    CHECK(model_count_scored(targets, r.S * r.Tmax) == r.n_scored);
    model_batch_t b = {.B = r.S, .T = r.Tmax, .ids = r.ids, .targets = targets};
    model_loss_t l;
    REQUIRE(model_forward_backward(m, a, &b, 1.0f / (float)r.n_scored, &l) == BT_OK);
    CHECK(l.n_scored == r.n_scored);
    CHECK_NEAR(l.loss_sum / (double)l.n_scored, r.loss, LOSS_RTOL, 0);
    grads_check(m, &r, "padded batch");
    free(lens);
    free(targets);
    model_acts_destroy(a);
    model_destroy(m);
    ref_close(&r);
}

/* Three pipeline stages [0,1) [1,2) [2,3) of the 3-layer qwen2 fixture, hidden
 * states passed by hand, give the whole model's loss and gradients. */
static void test_hf_stages(void)
{
    const char *name = "qwen2";
    ref_t r;
    REQUIRE(ref_open(name, &r) == 0);
    model_t *st[3] = {0};
    model_acts_t *a[3] = {0};
    for (int i = 0; i < 3; i++) {
        model_stage_t s = {.first_layer = i, .last_layer = i + 1, .has_embedding = i == 0,
                           .has_head = i == 2};
        REQUIRE(ckpt_hf_load(FIX "qwen2", &s, &st[i]) == BT_OK);
        REQUIRE(model_acts_create(st[i], 1, r.Tmax, &a[i]) == BT_OK);
    }
    CHECK(st[0]->lm_head < 0 && st[1]->embed < 0 && st[2]->embed < 0 && st[2]->lm_head >= 0);
    CHECK(model_param_find(st[1], "model.layers.1.self_attn.q_proj.bias") >= 0);
    CHECK(model_param_find(st[1], "model.layers.0.self_attn.q_proj.bias") < 0);
    int64_t C = st[0]->cfg.hidden_size;
    float *x1 = malloc((size_t)(r.Tmax * C) * 4), *x2 = malloc((size_t)(r.Tmax * C) * 4);
    float *d1 = malloc((size_t)(r.Tmax * C) * 4), *d2 = malloc((size_t)(r.Tmax * C) * 4);
    int32_t *targets = malloc((size_t)r.Tmax * 4);
    double sum = 0;
    float dloss = 1.0f / (float)r.n_scored;
    for (int64_t s = 0; s < r.S; s++) {
        int64_t T = r.lens[s];
        const int32_t *ids = r.ids + s * r.Tmax;
        model_targets_from_ids(targets, ids, NULL, 1, T);
        model_batch_t b = {.B = 1, .T = T, .ids = ids, .targets = targets};
        model_loss_t l;
        REQUIRE(model_stage_forward_io(st[0], a[0], &b, NULL, dloss, x1, NULL) == BT_OK);
        REQUIRE(model_stage_forward_io(st[1], a[1], &b, x1, dloss, x2, NULL) == BT_OK);
        REQUIRE(model_stage_forward_io(st[2], a[2], &b, x2, dloss, NULL, &l) == BT_OK);
        REQUIRE(model_stage_backward_io(st[2], a[2], NULL, d2) == BT_OK);
        REQUIRE(model_stage_backward_io(st[1], a[1], d2, d1) == BT_OK);
        REQUIRE(model_stage_backward_io(st[0], a[0], d1, NULL) == BT_OK);
        sum += l.loss_sum;
    }
    CHECK_NEAR(sum / (double)r.n_scored, r.loss, LOSS_RTOL, 0);
    for (int i = 0; i < 3; i++) grads_check(st[i], &r, "stage");
    /* backward twice without a forward is a caller error, reported */
    CHECK(model_stage_backward_io(st[1], a[1], d2, d1) == BT_ERR_INVALID);
    free(targets);
    free(x1);
    free(x2);
    free(d1);
    free(d2);
    for (int i = 0; i < 3; i++) {
        model_acts_destroy(a[i]);
        model_destroy(st[i]);
    }
    ref_close(&r);
}

/* Tied embeddings split over two stages: the head stage holds its own copy
 * of model.embed_tokens.weight; the two stages' gradients of it sum to the
 * whole model's (what the distributed code must all-reduce). */
static void test_hf_stages_tied(void)
{
    const char *name = "llama_tied_llama3";
    ref_t r;
    REQUIRE(ref_open(name, &r) == 0);
    model_stage_t s0 = {.first_layer = 0, .last_layer = 1, .has_embedding = true};
    model_stage_t s1 = {.first_layer = 1, .last_layer = 2, .has_head = true};
    model_t *m0 = NULL, *m1 = NULL;
    REQUIRE(ckpt_hf_load(FIX "llama_tied_llama3", &s0, &m0) == BT_OK);
    REQUIRE(ckpt_hf_load(FIX "llama_tied_llama3", &s1, &m1) == BT_OK);
    CHECK(m0->embed >= 0 && m0->lm_head < 0 && m0->final_norm < 0);
    CHECK(m1->embed < 0 && m1->lm_head >= 0 && m1->final_norm >= 0);
    CHECK(!strcmp(m1->params[m1->lm_head].name, "model.embed_tokens.weight"));
    model_acts_t *a0 = NULL, *a1 = NULL;
    REQUIRE(model_acts_create(m0, 1, r.Tmax, &a0) == BT_OK);
    REQUIRE(model_acts_create(m1, 1, r.Tmax, &a1) == BT_OK);
    int64_t C = m0->cfg.hidden_size;
    float *x = malloc((size_t)(r.Tmax * C) * 4), *dx = malloc((size_t)(r.Tmax * C) * 4);
    int32_t *targets = malloc((size_t)r.Tmax * 4);
    double sum = 0;
    for (int64_t s = 0; s < r.S; s++) {
        int64_t T = r.lens[s];
        const int32_t *ids = r.ids + s * r.Tmax;
        model_targets_from_ids(targets, ids, NULL, 1, T);
        model_batch_t b = {.B = 1, .T = T, .ids = ids, .targets = targets};
        model_loss_t l;
        float dloss = 1.0f / (float)r.n_scored;
        REQUIRE(model_stage_forward_io(m0, a0, &b, NULL, dloss, x, NULL) == BT_OK);
        REQUIRE(model_stage_forward_io(m1, a1, &b, x, dloss, NULL, &l) == BT_OK);
        REQUIRE(model_stage_backward_io(m1, a1, NULL, dx) == BT_OK);
        REQUIRE(model_stage_backward_io(m0, a0, dx, NULL) == BT_OK);
        sum += l.loss_sum;
    }
    CHECK_NEAR(sum / (double)r.n_scored, r.loss, LOSS_RTOL, 0);
    /* sum the two embedding gradients into stage 0's, then compare all */
    tensor_t *g0 = &m0->grads[m0->embed].t;
    kern_axpy(kern_stream_host(), g0, 1.0f, &m1->grads[m1->lm_head].t);
    grads_check(m0, &r, "tied stage 0 (+ head copy)");
    for (int i = 0; i < m1->n_params; i++) {
        if (i == m1->lm_head) continue;
        char key[160];
        snprintf(key, sizeof key, "grad.%s", m1->params[i].name);
        const ckpt_st_tensor_t *g = ckpt_st_find(r.ref, key);
        REQUIRE(g != NULL);
        float *want = malloc((size_t)g->numel * 4);
        memcpy(want, g->data, (size_t)g->numel * 4);
        double e = rel_err(m1->grads[i].t.data, want, g->numel);
        CHECK_MSG(e <= TENSOR_RTOL, "tied stage 1: %s rel err %.3g", m1->params[i].name, e);
        free(want);
    }
    free(targets);
    free(x);
    free(dx);
    model_acts_destroy(a0);
    model_acts_destroy(a1);
    model_destroy(m0);
    model_destroy(m1);
    ref_close(&r);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_hf_llama, test_hf_llama_tied_llama3, test_hf_mistral, test_hf_qwen2,
             test_hf_llama_f16, test_hf_qwen2_bf16, test_hf_llama_sharded, test_hf_mixtral,
             test_hf_qwen2_moe, test_hf_qwen2_moe_norm, test_hf_qwen3, test_hf_qwen3_moe,
             test_hf_phi3, test_hf_mistral_window, test_hf_qwen2_window, test_hf_nemotronh, test_hf_nemotronh_bias,
             test_hf_deepseek_v2_lite, test_hf_deepseek_v2, test_hf_padded_batch,
             test_hf_stages, test_hf_stages_tied);
}
