/* The memory estimate of launch/run_mem.h: what each process of a layout
 * holds, which part dominates, the refusal against BATON_MEM_LIMIT and the
 * sizes in base/mem.h. */
#include "launch/run_mem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "launch/run_setup.h"
#include "tests/test.h"

static char err[JOB_ERR_MAX];

static void job_of(const char *yaml, job_t *job, model_config_t *cfg)
{
    CHECK_MSG(job_load_string("m.yaml", yaml, job, err, sizeof err) == BT_OK, "%s", err);
    CHECK_MSG(job_validate(job, err, sizeof err) == BT_OK, "%s", err);
    CHECK(run_model_config(job, cfg) == BT_OK);
}

static void test_run_mem_single_process(void)
{
    static job_t job;
    model_config_t cfg;
    job_of("data: {dir: x, seq_len: 32}\ntrain: {micro_batch: 3}\n"
           "model: {layers: 2, hidden: 64, heads: 4, vocab: 5000}\n", &job, &cfg);
    run_mem_plan_t p;
    REQUIRE(run_mem_plan_job(&job, &cfg, &p, err, sizeof err) == BT_OK);
    model_mem_t mm;
    model_mem_estimate(&cfg, NULL, 0, 1, 3, 32, &mm);
    /* parameters, gradients, AdamW m and v, one arena of 3 x 32 */
    CHECK(p.n_procs == 1 && p.largest_rank == -1);
    CHECK(p.largest.params == mm.params && p.largest.grads == mm.params);
    CHECK(p.largest.optim == 2 * mm.params && p.largest.acts == mm.acts);
    CHECK(p.total == 4 * mm.params + mm.acts && p.largest.peak == p.total);
    CHECK_NEAR(p.part[RUN_MEM_VOCAB], 4 * mm.vocab_params, 1e-12, 0);
    CHECK_NEAR(p.part[RUN_MEM_VOCAB] + p.part[RUN_MEM_LAYERS] + p.part[RUN_MEM_ACTS], p.total, 1e-12, 0);
    CHECK(run_mem_plan_main_part(&p) == RUN_MEM_VOCAB); /* 2 x 5000 x 64 of ~0.42 M */

    /* long sequences: the activations dominate; many layers: the layers */
    job_of("data: {dir: x, seq_len: 4096}\ntrain: {micro_batch: 8}\nmodel: {seq: 4096, vocab: 100}\n",
           &job, &cfg);
    REQUIRE(run_mem_plan_job(&job, &cfg, &p, err, sizeof err) == BT_OK);
    CHECK(run_mem_plan_main_part(&p) == RUN_MEM_ACTS);
    char hint[192];
    CHECK(!strcmp(run_mem_part_field(&job, RUN_MEM_ACTS, hint, sizeof hint), "train.micro_batch"));
    CHECK_MSG(strstr(hint, "train.micro_batch 8 x data.seq_len 4096"), "%s", hint);
    job_of("data: {dir: x, seq_len: 8}\nmodel: {layers: 64, hidden: 512, heads: 8, vocab: 100}\n",
           &job, &cfg);
    REQUIRE(run_mem_plan_job(&job, &cfg, &p, err, sizeof err) == BT_OK);
    CHECK(run_mem_plan_main_part(&p) == RUN_MEM_LAYERS);
    CHECK(!strcmp(run_mem_part_field(&job, RUN_MEM_LAYERS, hint, sizeof hint), "model.layers"));
}

/* Workers: each rank's chunks and TP share, the arenas of every microbatch,
 * ZeRO-1's shard of the moments, one tensor's piece while loading, the
 * export's host copies in replica 0 (the whole stage on the exporter, one
 * tensor at a time on the other TP ranks), the driver's whole model for
 * checkpoints. */
static void test_run_mem_layout(void)
{
    static job_t job;
    model_config_t cfg;
    job_of("data: {dir: x, seq_len: 16}\ntrain: {micro_batch: 2, grad_accum: 4}\n"
           "model: {layers: 4, hidden: 64, heads: 4, kv_heads: 2, vocab: 1001}\n"
           "parallel: {tp: 2, pp: 2, dp: 2, zero1: true}\nexport: {dir: /tmp/x}\n", &job, &cfg);
    run_mem_plan_t p;
    REQUIRE(run_mem_plan_job(&job, &cfg, &p, err, sizeof err) == BT_OK);
    CHECK(p.n_procs == 8 + 1);
    model_mem_t whole, s0, s1, f0, f1;
    model_mem_estimate(&cfg, NULL, 0, 1, 0, 0, &whole);
    model_stage_t st0 = {.first_layer = 0, .last_layer = 2, .has_embedding = true};
    model_stage_t st1 = {.first_layer = 2, .last_layer = 4, .has_head = true};
    double sum = whole.params; /* the driver */
    for (int pp = 0; pp < 2; pp++)
        for (int dp = 0; dp < 2; dp++)
            for (int tp = 0; tp < 2; tp++) {
                model_mem_estimate(&cfg, pp ? &st1 : &st0, tp, 2, 2, 16, pp ? &s1 : &s0);
                model_mem_estimate(&cfg, pp ? &st1 : &st0, 0, 1, 0, 0, pp ? &f1 : &f0);
                const model_mem_t *s = pp ? &s1 : &s0, *f = pp ? &f1 : &f0;
                double copies = dp == 0 ? (tp == 0 ? f->params : f->largest) : 0;
                double steady = 2 * s->params + 2 * s->params / 2 + 4 * s->acts + copies;
                double start = f->largest + 2 * s->params + copies;
                sum += fmax(steady, start);
            }
    CHECK_NEAR(p.total, sum, 1e-12, 0);
    /* vocabulary 1001 over tp 2: rank tp 0 holds 501 rows, tp 1 500 */
    model_mem_estimate(&cfg, &st1, 0, 2, 0, 0, &s0);
    model_mem_estimate(&cfg, &st1, 1, 2, 0, 0, &s1);
    CHECK(s0.vocab_params == 501 * 64 * 4 && s1.vocab_params == 500 * 64 * 4);
}

/* Expert parallelism: each rank holds E / ep of every sparse layer's
 * experts, with their gradients and moments, and an arena sized for the
 * rows its experts may receive. The fixture Mixtral (hidden 32, 4 heads of 8, 2 kv heads, experts
 * 4 x 48, 2 layers, vocab 256, untied) counted by hand, in floats (every
 * view a multiple of 64 bytes, so no alignment padding):
 *   embedding + head + final norm   2 x 256 x 32 + 32           = 16416
 *   a layer's dense part            2 norms 64, q 1024, k 512, v 512, o 1024, router 128 = 3264
 *   one expert                      gate 48 x 32, up 48 x 32, down 32 x 48 = 4608 */
static void test_run_mem_experts(void)
{
    static job_t job;
    model_config_t cfg;
    const double dense = 4.0 * (16416 + 2 * 3264), expert = 4.0 * 4608;
    model_mem_t mm;
    for (int ep = 1; ep <= 4; ep *= 2) {
        char yaml[256];
        snprintf(yaml, sizeof yaml,
                 "data: {dir: x, seq_len: 16}\ntrain: {micro_batch: 2, grad_accum: 4}\n"
                 "model: {hf: tests/fixtures/mixtral}\nparallel: {dp: 4, ep: %d}\n",
                 ep);
        job_of(yaml, &job, &cfg);
        run_mem_proc_t procs[5];
        run_mem_plan_t p;
        REQUIRE(run_mem_plan_procs(&job, &cfg, &p, procs, 5, err, sizeof err) == BT_OK);
        double experts = 2 * (4 / ep) * expert;
        for (int r = 0; r < 4; r++) {
            CHECK_MSG(procs[r].params == dense + experts, "ep=%d rank %d: %.0f bytes, by hand %.0f",
                      ep, r, procs[r].params, dense + experts);
            CHECK(procs[r].grads == procs[r].params);
            CHECK(procs[r].optim == 2 * procs[r].params);
        }
        /* the instance the estimate describes: what model_mem_estimate_par says for EP rank 1 */
        model_parallel_t par = {.tp_size = 1, .ep_rank = ep > 1, .ep_size = ep};
        model_mem_estimate_par(&cfg, NULL, &par, 2, 16, &mm);
        CHECK(mm.params == dense + experts && mm.expert_params == experts);
        CHECK(procs[1].acts == 4 * mm.acts); /* grad_accum 4: four microbatches in flight */
    }
}

static void test_run_mem_limit(void)
{
    static job_t job;
    model_config_t cfg;
    job_of("data: {dir: x, seq_len: 16}\nmodel: {layers: 2, hidden: 64, heads: 4, vocab: 70000}\n",
           &job, &cfg);
    run_mem_plan_t p;
    REQUIRE(run_mem_plan_job(&job, &cfg, &p, err, sizeof err) == BT_OK);
    setenv("BATON_MEM_LIMIT", "10M", 1);
    CHECK(run_mem_job_check(&job, err, sizeof err) == BT_ERR_NOMEM);
    CHECK_MSG(strstr(err, "m.yaml:2:42: model.vocab: the job needs about 171 MiB of memory (parameters 34.6 MiB, "
                          "gradients 34.6 MiB, optimizer state 69.2 MiB, activations 32.3 MiB)") &&
              strstr(err, "more than the 10.0 MiB available (BATON_MEM_LIMIT=10M); 80% of it is for "
                          "model.vocab 70000 x model.hidden 64"), "%s", err);
    setenv("BATON_MEM_LIMIT", "1G", 1);
    CHECK(run_mem_job_check(&job, err, sizeof err) == BT_OK);
    setenv("BATON_MEM_LIMIT", "off", 1);
    CHECK(run_mem_check(&p, err, sizeof err) == BT_OK);
    setenv("BATON_MEM_LIMIT", "12 parsecs", 1);
    CHECK(run_mem_job_check(&job, err, sizeof err) == BT_ERR_INVALID);
    CHECK_MSG(strstr(err, "BATON_MEM_LIMIT=12 parsecs: expected a size"), "%s", err);
    unsetenv("BATON_MEM_LIMIT");
    base_mem_limit_t lim;
    CHECK(base_mem_limit_get(&lim, err, sizeof err) == BT_OK);
    CHECK(lim.bytes > 0); /* /proc/meminfo is there on Linux */

    double b;
    CHECK(base_mem_size_parse("2G", &b) == BT_OK && b == 2147483648.0);
    CHECK(base_mem_size_parse("1.5GiB", &b) == BT_OK && b == 1610612736.0);
    CHECK(base_mem_size_parse("512m", &b) == BT_OK && b == 536870912.0);
    CHECK(base_mem_size_parse("4096", &b) == BT_OK && b == 4096.0);
    CHECK(base_mem_size_parse("-1G", &b) == BT_ERR_INVALID);
    CHECK(base_mem_size_parse("1Q", &b) == BT_ERR_INVALID);
    CHECK(base_mem_size_parse("1GB2", &b) == BT_ERR_INVALID);
    char buf[32];
    base_mem_size_fmt(8.13 * 1073741824.0, buf, sizeof buf);
    CHECK(!strcmp(buf, "8.13 GiB"));
    base_mem_size_fmt(37.4 * 1048576.0, buf, sizeof buf);
    CHECK(!strcmp(buf, "37.4 MiB"));
    base_mem_size_fmt(100, buf, sizeof buf);
    CHECK(!strcmp(buf, "100 B"));
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_run_mem_single_process, test_run_mem_layout, test_run_mem_experts,
             test_run_mem_limit);
}
