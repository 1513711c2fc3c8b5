/* The reference case's layout on CPU processes (issue 19, docs/MODELS.md
 * "The reference layout"): a DeepSeek-V2-Lite-shaped model of 27 layers at
 * tiny widths (tests/fixtures/deepseek_v2_ref, tools/gen_deepseek_fixtures.py
 * --reference: layer 0 dense, 26 MoE layers of 8 experts, MLA with YaRN),
 * the pipeline split [14, 13], trained for 5 steps by real processes (`baton
 * run` spawning `baton worker`s over tcp) and compared with the one-process
 * run: every step's loss within 1e-5 relative, every exported parameter
 * within 1e-5 absolute (the dense matrix's bounds, tests/test_dist_equiv.c).
 *
 * Cases of `make test` (8 processes, no context parallelism):
 *   TP=2 PP=2 DP=2 for the dense parts, EP=4 (EDP=1) for the experts;
 *   its checkpoint of step 2 resumed in one process, and at (tp, pp, ep) =
 *   (1, 3, 2) (dp 2, split [10, 9, 8]); that run's checkpoint of step 4
 *   resumed back in the [14, 13] layout; each continues as the one-process
 *   run. A resume on another data seed must differ (the comparison can
 *   fail), and the fixture evaluates to transformers' loss.
 *
 * With BATON_TEST_REFERENCE=16 (`make test-reference`): the full layout,
 * TP=2 PP=2 CP=2 (ring) DP=2 for the dense parts and EP=4 EDP=2 for the
 * experts, 16 processes, the same comparisons and the same round trips
 * through one process and (1, 3, 2); and the layout once more with CP's
 * all-gather mode. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "tests/helpers/equiv.h"
#include "tests/test.h"

#define FIXTURE "tests/fixtures/deepseek_v2_ref"
#define STEPS 5

static char dir[256];
static char job[300];

static int fixture(void)
{
    if (dir[0]) return 0;
    if (test_equiv_data_dir(dir, sizeof dir, "test_reference")) return -1;
    snprintf(job, sizeof job, "%s/job.yaml", dir);
    FILE *f = fopen(job, "w");
    if (!f) return -1;
    /* 8 sequences of 16 a step: one process 4 microbatches of 2 */
    fprintf(f,
            "model: {hf: " FIXTURE "}\n"
            "data: {dir: %s/data, seq_len: 16, split: 0}\n"
            "train: {steps: %d, micro_batch: 2, grad_accum: 4, seed: 7, log_every: 100}\n"
            "optim: {lr: 0.001, min_lr: 0.0001, warmup: 2, weight_decay: 0.1, clip: 1.0}\n",
            dir, STEPS);
    fclose(f);
    return 0;
}

/* `baton run` of the job as NAME with SETS, checkpoints every 2 steps
 * under DIR/NAME/ckpt, one CPU thread per process when several. */
static int run(const char *name, const char *sets, int threads)
{
    char all[2048];
    snprintf(all, sizeof all, "%s --set checkpoint.dir=%s/%s/ckpt --set checkpoint.every=2", sets,
             dir, name);
    return test_equiv_run(dir, job, name, all, threads);
}

/* The losses of run NAME by step: n of them, steps in [1, STEPS]. */
static int losses(const char *name, double *by_step, bool *have)
{
    char p[512], line[4096];
    snprintf(p, sizeof p, "%s/%s/m.jsonl", dir, name);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    int n = 0;
    for (int s = 0; s <= STEPS; s++) have[s] = false;
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        json_t *l = j ? json_object_get(j, "loss") : NULL,
               *s = j ? json_object_get(j, "step") : NULL;
        if (l && s && json_is_number(l) && json_is_integer(s) && json_integer_value(s) >= 1 &&
            json_integer_value(s) <= STEPS) {
            by_step[json_integer_value(s)] = json_number_value(l);
            have[json_integer_value(s)] = true;
            n++;
        }
        json_decref(j);
    }
    fclose(f);
    return n;
}

/* Run NAME's steps [first, STEPS] against the one-process run: the largest
 * relative loss difference (-1 when a step is missing) and the largest
 * parameter difference of the final exports. */
static int compare(const char *name, int first, double *loss_rel, double *param_abs)
{
    double a[STEPS + 1], b[STEPS + 1];
    bool ha[STEPS + 1], hb[STEPS + 1];
    int na = losses(name, a, ha), nb = losses("one", b, hb);
    if (na != STEPS - first + 1 || nb != STEPS) {
        fprintf(stderr, "%s: %d losses (want %d), the one-process run %d\n", name, na,
                STEPS - first + 1, nb);
        return -1;
    }
    *loss_rel = 0;
    for (int s = first; s <= STEPS; s++) {
        if (!ha[s] || !hb[s]) return -1;
        double r = fabs(a[s] - b[s]) / fabs(b[s]);
        if (r > *loss_rel) *loss_rel = r;
    }
    return test_equiv_params(dir, name, "one", param_abs);
}

static int reference(void)
{
    char p[512];
    snprintf(p, sizeof p, "%s/one/ck/model.safetensors", dir);
    if (access(p, F_OK) == 0) return 0;
    return run("one", "", 2);
}

/* NAME (SETS, resumed from RESUME under DIR when given) continues as the
 * one-process run from step `first`. */
static void check(const char *name, const char *sets, const char *resume, int first)
{
    REQUIRE(fixture() == 0);
    REQUIRE(reference() == 0);
    char all[1536];
    if (resume) {
        snprintf(all, sizeof all, "%s/%s/index.json", dir, resume);
        if (access(all, F_OK) != 0) fprintf(stderr, "%s: no checkpoint %s\n", name, all);
        REQUIRE(access(all, F_OK) == 0);
        snprintf(all, sizeof all, "%s --resume %s/%s", sets, dir, resume);
    } else {
        snprintf(all, sizeof all, "%s", sets);
    }
    REQUIRE(run(name, all, 1) == 0);
    double lr, pa;
    REQUIRE(compare(name, first, &lr, &pa) == 0);
    printf("  %-22s steps %d-%d: max rel loss diff %.3g, max param diff %.3g\n", name, first, STEPS,
           lr, pa);
    CHECK(lr <= 1e-5);
    CHECK(pa <= 1e-5);
}

/* the layouts: [14, 13] as the reference case, and (tp, pp, ep) = (1, 3, 2) */
#define LAYOUT8                                                                                    \
    "--set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=4 "             \
    "--set parallel.split=[14,13] --set train.grad_accum=2"
#define LAYOUT16                                                                                   \
    "--set parallel.tp=2 --set parallel.pp=2 --set parallel.cp=2 "                                 \
    "--set parallel.cp_mode=ring --set parallel.dp=2 --set parallel.ep=4 "                         \
    "--set parallel.split=[14,13] --set train.grad_accum=2"
/* pp 3 needs 3 microbatches: 4 of one row per replica */
#define LAYOUT132                                                                                  \
    "--set parallel.pp=3 --set parallel.dp=2 --set parallel.ep=2 "                                 \
    "--set parallel.split=[10,9,8] --set train.micro_batch=1 --set train.grad_accum=4"

static void test_ref_eval_matches_transformers(void)
{
    const char *baton = getenv("BATON") ? getenv("BATON") : "build/baton";
    char cmd[512], out[1024] = "", want[1024] = "";
    snprintf(cmd, sizeof cmd, "%s eval --model " FIXTURE " --ids " FIXTURE "/ids.txt --json",
             baton);
    FILE *p = popen(cmd, "r");
    REQUIRE(p != NULL);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    CHECK(pclose(p) == 0);
    FILE *f = fopen(FIXTURE "/expected.json", "r");
    REQUIRE(f != NULL);
    n = fread(want, 1, sizeof want - 1, f);
    want[n] = 0;
    fclose(f);
    json_t *a = json_loads(out, 0, NULL), *b = json_loads(want, 0, NULL);
    REQUIRE(a && b);
    double la = json_number_value(json_object_get(a, "loss"));
    double lb = json_number_value(json_object_get(b, "loss"));
    printf("  baton %.9f, transformers %.9f (rel %.3g)\n", la, lb, fabs(la - lb) / lb);
    CHECK(lb > 0 && fabs(la - lb) <= 1e-5 * lb);
    json_decref(a);
    json_decref(b);
}

static void test_ref_layout8(void) { check("layout8", LAYOUT8, NULL, 1); }
static void test_ref_layout8_resume_one(void)
{
    check("l8_one", "", "layout8/ckpt/step-00000002", 3);
}
static void test_ref_layout8_resume_132(void)
{
    check("l8_132", LAYOUT132, "layout8/ckpt/step-00000002", 3);
}
static void test_ref_layout8_back(void)
{
    check("l8_back", LAYOUT8, "l8_132/ckpt/step-00000004", 5);
}
/* the comparison can fail: a resume on another data seed is not the run */
static void test_ref_resume_detects(void)
{
    REQUIRE(fixture() == 0);
    REQUIRE(reference() == 0);
    char all[512];
    snprintf(all, sizeof all, "--set train.seed=8 --resume %s/layout8/ckpt/step-00000002", dir);
    REQUIRE(run("l8_seed", all, 1) == 0);
    double lr, pa;
    REQUIRE(compare("l8_seed", 3, &lr, &pa) == 0);
    printf("  another seed: max rel loss diff %.3g, max param diff %.3g\n", lr, pa);
    CHECK(lr > 1e-4);
    CHECK(pa > 1e-4);
}

static void test_ref_layout16(void) { check("layout16", LAYOUT16, NULL, 1); }
/* the same layout with CP's other mode: K and V all-gathered */
static void test_ref_layout16_allgather(void)
{
    check("layout16_ag", LAYOUT16 " --set parallel.cp_mode=allgather", NULL, 1);
}
static void test_ref_layout16_resume_one(void)
{
    check("l16_one", "", "layout16/ckpt/step-00000002", 3);
}
static void test_ref_layout16_resume_132(void)
{
    check("l16_132", LAYOUT132, "layout16/ckpt/step-00000002", 3);
}
static void test_ref_layout16_back(void)
{
    check("l16_back", LAYOUT16, "l16_132/ckpt/step-00000004", 5);
}

static void test_cleanup(void) { CHECK(test_equiv_remove(dir) == 0); }

int main(int argc, char **argv)
{
    setenv("BATON_STEP_TIMEOUT", "60", 0); /* a hang fails in a minute, not 300 s */
    const char *full = getenv("BATON_TEST_REFERENCE");
    if (full && !strcmp(full, "16"))
        TEST_RUN(argc, argv, test_ref_layout16, test_ref_layout16_allgather,
                 test_ref_layout16_resume_one, test_ref_layout16_resume_132, test_ref_layout16_back,
                 test_cleanup);
    TEST_RUN(argc, argv, test_ref_eval_matches_transformers, test_ref_layout8,
             test_ref_layout8_resume_one, test_ref_layout8_resume_132, test_ref_layout8_back,
             test_ref_resume_detects, test_cleanup);
}
