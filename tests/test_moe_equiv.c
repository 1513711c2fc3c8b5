/* The equivalence matrix for routed experts: expert layouts trained 5 steps
 * as real processes (`baton run` spawning `baton worker`s over tcp) against
 * the single-process run of the same global batch, on the fixture MoE
 * models (tests/fixtures/qwen2_moe: 8 experts, a shared expert and a dense
 * layer; mixtral: 4 experts and the router's load-balancing loss, pooled
 * over pipeline stages and CP ranks as the one process pools it). Per-step losses to 1e-5 relative, the final parameters
 * (the HF export the driver gathers) to lr / 20 absolute, validation losses
 * (evaluation passes after steps 2, 4, 5; with dp = 4 and two evaluation
 * microbatches two ranks run padding ones) to 1e-5, and step 1's tokens per
 * expert (metrics expert_tokens) exactly, the bounds of the dense matrix
 * (tests/test_dist_equiv.c); TP layouts at lr 1e-3 as there.
 *
 * The cases cover EP in {1, 2, 4} x EDP in {1, 2} with TP, PP and CP, from 2
 * to 8 processes; the whole matrix takes about 1.5 s here (the models are
 * tiny), so `make test` runs all of it. One case
 * starts from routers that no token leaves for EP rank 1's experts (the
 * fixture rewritten, tests/helpers/moe.h): in step 1 that rank receives no
 * tokens at all, which its metrics show, and the run still matches.
 *
 * Reference for dp replicas of M microbatches: grad_accum = dp * M. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/hf.h"
#include "tests/helpers/equiv.h"
#include "tests/helpers/moe.h"
#include "tests/test.h"

static char dir[256];

/* TP layouts sum the attention products in another order, and AdamW turns
 * the ~1e-7 relative differences of near-zero gradient elements into
 * parameter differences proportional to lr (tests/test_dist_equiv.c): lr
 * 1e-3 as the dense matrix, and 1e-4 for TP over four data-parallel
 * replicas, where one element of layer 0's o_proj came out 2.0e-5 away at
 * lr 1e-3 (every expert tensor within 1.3e-6; losses 1.1e-7). CP layouts
 * merge attention over key blocks in another order too: lr 1e-3 as TP (at
 * 1e-2 cp=2 dp=2 ep=4 ended 1.03e-5 away in the parameters, losses 2.3e-8). */
static const char *lr_of[] = {"", "--set optim.lr=0.001 --set optim.min_lr=0.0001",
                              "--set optim.lr=0.0001 --set optim.min_lr=0.00001"};

static int fixture(void)
{
    if (dir[0]) return 0;
    snprintf(dir, sizeof dir, "/tmp/test_moe_equiv.XXXXXX");
    if (!mkdtemp(dir)) return -1;
    char p[512];
    snprintf(p, sizeof p, "%s/job.yaml", dir);
    FILE *f = fopen(p, "w");
    if (!f) return -1;
    fprintf(f, "model: {hf: tests/fixtures/qwen2_moe}\n"
               "data: {dir: tests/fixtures/train_llama, seq_len: 16, split: 0.2}\n"
               "train: {steps: 5, micro_batch: 2, grad_accum: 2, seed: 7, log_every: 100,\n"
               "        eval_every: 2, eval_batches: 2}\n"
               "optim: {lr: 0.01, min_lr: 0.001, warmup: 2, weight_decay: 0.1, clip: 1.0}\n");
    fclose(f);
    /* the zero-token fixture: qwen2_moe with routers tied so that EP rank 1
     * of 2 gets nothing in the first step */
    model_t *m = NULL;
    snprintf(p, sizeof p, "%s/tied", dir);
    bt_status_t st = ckpt_hf_load("tests/fixtures/qwen2_moe", NULL, &m);
    if (!st) st = test_moe_routers_tie(m, 2);
    if (!st) st = ckpt_hf_save(m, p);
    model_destroy(m);
    /* the bias-balancing fixture: qwen2_moe with router_bias_update_rate */
    m = NULL;
    snprintf(p, sizeof p, "%s/bias", dir);
    if (!st) st = ckpt_hf_load("tests/fixtures/qwen2_moe", NULL, &m);
    if (!st) {
        m->cfg.moe.bias_rate = 0.01;
        st = ckpt_hf_save(m, p);
    }
    model_destroy(m);
    /* the capacity fixture: qwen2_moe whose experts keep at most their
     * share of the choices (capacity_factor 1) */
    m = NULL;
    snprintf(p, sizeof p, "%s/cap", dir);
    if (!st) st = ckpt_hf_load("tests/fixtures/qwen2_moe", NULL, &m);
    if (!st) {
        m->cfg.moe.capacity_factor = 1.0;
        st = ckpt_hf_save(m, p);
    }
    model_destroy(m);
    return st ? -1 : 0;
}

/* Run `name`'s moe_dropped of steps 1..5 into d[5]; how many steps had one. */
static int drops_load(const char *name, long long *d)
{
    char p[512], line[8192];
    snprintf(p, sizeof p, "%s/%s/m.jsonl", dir, name);
    FILE *f = fopen(p, "r");
    int n = 0, step;
    while (f && fgets(line, sizeof line, f)) {
        const char *a = strstr(line, "\"moe_dropped\": ");
        if (a && sscanf(line, "{\"step\": %d,", &step) == 1 && step >= 1 && step <= 5) {
            d[step - 1] = atoll(a + 15);
            n++;
        }
    }
    if (f) fclose(f);
    return n;
}

/* Step 1's expert_tokens text of run `name` ({"0": [...], ...}), or "". */
static void step1_load(const char *name, char *out, size_t cap)
{
    char p[512], line[8192];
    snprintf(p, sizeof p, "%s/%s/m.jsonl", dir, name);
    out[0] = 0;
    FILE *f = fopen(p, "r");
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "{\"step\": 1,", 11)) continue;
        char *a = strstr(line, "\"expert_tokens\": {");
        char *b = a ? strchr(a, '}') : NULL;
        if (a && b && (size_t)(b - a) < cap) snprintf(out, cap, "%.*s", (int)(b - a + 1), a);
        break;
    }
    if (f) fclose(f);
}

static int run(const char *name, const char *model, const char *sets)
{
    char job[300], all[1500];
    snprintf(job, sizeof job, "%s/job.yaml", dir);
    snprintf(all, sizeof all, "--set model.hf=%s %s", model, sets);
    return test_equiv_run(dir, job, name, all, 0);
}

/* The reference of (model, global microbatches, lr), run once. */
static int reference(const char *model, const char *tag, int ga, int lr, char *name, size_t cap)
{
    snprintf(name, cap, "ref_%s_ga%d_lr%d", tag, ga, lr);
    char p[512], sets[256];
    snprintf(p, sizeof p, "%s/%s/ck/model.safetensors", dir, name);
    if (access(p, F_OK) == 0) return 0;
    snprintf(sets, sizeof sets, "--set train.grad_accum=%d %s", ga, lr_of[lr]);
    return run(name, model, sets);
}

typedef struct {
    const char *name, *model, *tag, *sets;
    int         ga;   /* the reference's grad_accum: dp x microbatches */
    bool        tiny_lr; /* lr 1e-4 (TP over four replicas; Mixtral dp=4 ep=4, docs/PARALLEL.md) */
} ep_layout_t;

static void layout_check(const ep_layout_t *L)
{
    REQUIRE(fixture() == 0);
    int lr = L->tiny_lr ? 2 : strstr(L->sets, "parallel.tp=") || strstr(L->sets, "parallel.cp=");
    char ref[96], model[300];
    if (!strcmp(L->model, "tied") || !strcmp(L->model, "bias") || !strcmp(L->model, "cap"))
        snprintf(model, sizeof model, "%s/%s", dir, L->model);
    else snprintf(model, sizeof model, "tests/fixtures/%s", L->model);
    REQUIRE(reference(model, L->tag, L->ga, lr, ref, sizeof ref) == 0);
    char sets[1024];
    snprintf(sets, sizeof sets, "%s %s", L->sets, lr_of[lr]);
    REQUIRE(run(L->name, model, sets) == 0);
    test_equiv_diff_t d;
    REQUIRE(test_equiv_compare(dir, L->name, ref, 5, 3, 1, &d) == 0);
    char la[4096], lb[4096];
    step1_load(L->name, la, sizeof la);
    step1_load(ref, lb, sizeof lb);
    printf("  %-24s max rel loss diff %.3g, val loss %.3g, max param diff %.3g; step 1 %s\n",
           L->name, d.loss_rel, d.val_rel, d.param_abs, la);
    CHECK(d.loss_rel <= 1e-5);
    CHECK(d.val_rel <= 1e-5);
    CHECK(d.param_abs <= test_equiv_param_bound(lr == 2 ? 1e-4 : lr == 1 ? 1e-3 : 1e-2));
    CHECK_MSG(la[0] && !strcmp(la, lb), "step 1 tokens per expert: %s, one process %s", la, lb);
    if (!strcmp(L->model, "cap")) { /* the one process drops, and every layout the same */
        long long da[5] = {0}, db[5] = {0};
        CHECK(drops_load(L->name, da) == 5 && drops_load(ref, db) == 5);
        printf("  %-24s dropped per step %lld %lld %lld %lld %lld (one process %lld %lld %lld %lld %lld)\n",
               L->name, da[0], da[1], da[2], da[3], da[4], db[0], db[1], db[2], db[3], db[4]);
        for (int i = 0; i < 5; i++) CHECK(db[i] > 0 && da[i] == db[i]);
    }
}

static const ep_layout_t layouts[] = {
    {"qwen_dp2_ep2", "qwen2_moe", "qwen", "--set parallel.dp=2 --set parallel.ep=2 --set train.grad_accum=1", 2, false},
    {"qwen_dp4_ep2_edp2", "qwen2_moe", "qwen", "--set parallel.dp=4 --set parallel.ep=2 --set train.grad_accum=1", 4, false},
    {"qwen_tp2_dp2_ep4", "qwen2_moe", "qwen", "--set parallel.tp=2 --set parallel.dp=2 --set parallel.ep=4 --set train.grad_accum=1", 2, false},
    {"qwen_pp2_dp2_ep2", "qwen2_moe", "qwen", "--set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2", 4, false},
    {"qwen_tp2_ep1_edp2", "qwen2_moe", "qwen", "--set parallel.tp=2", 2, false},
    {"mixtral_tp2_ep2", "mixtral", "mixtral", "--set parallel.tp=2 --set parallel.ep=2", 2, false},
    {"zero_tokens_dp2_ep2", "tied", "tied", "--set parallel.dp=2 --set parallel.ep=2 --set train.grad_accum=1", 2, false},
    {"qwen_dp2_ep1_edp2", "qwen2_moe", "qwen", "--set parallel.dp=2 --set train.grad_accum=1", 2, false},
    {"qwen_dp4_ep4", "qwen2_moe", "qwen", "--set parallel.dp=4 --set parallel.ep=4 --set train.grad_accum=1", 4, false},
    {"qwen_tp2_dp4_ep4_edp2", "qwen2_moe", "qwen", "--set parallel.tp=2 --set parallel.dp=4 --set parallel.ep=4 --set train.grad_accum=1", 4, true},
    {"qwen_tp2_pp2_ep2", "qwen2_moe", "qwen", "--set parallel.tp=2 --set parallel.pp=2 --set parallel.ep=2", 2, false},
    {"qwen_tp2_pp2_dp2_ep2_edp2", "qwen2_moe", "qwen", "--set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2", 4, true},
    {"qwen_pp2_dp4_ep4", "qwen2_moe", "qwen", "--set parallel.pp=2 --set parallel.dp=4 --set parallel.ep=4", 8, false},
    {"mixtral_dp4_ep4", "mixtral", "mixtral", "--set parallel.dp=4 --set parallel.ep=4 --set train.grad_accum=1", 4, true},
    {"mixtral_tp2_dp2_ep2_edp2", "mixtral", "mixtral", "--set parallel.tp=2 --set parallel.dp=2 --set parallel.ep=2 --set train.grad_accum=1", 2, false},
    /* aux-loss-free bias balancing: the biases follow the global batch's counts */
    {"bias_dp4_ep2_edp2", "bias", "bias", "--set parallel.dp=4 --set parallel.ep=2 --set train.grad_accum=1", 4, false},
    {"bias_tp2_pp2_ep2", "bias", "bias", "--set parallel.tp=2 --set parallel.pp=2 --set parallel.ep=2", 2, false},
    /* the expert grid folded over CP ranks too (each routes its two chunks
     * of every row; the counts and the biases' load sum over dp x cp) */
    {"qwen_cp2_ep2", "qwen2_moe", "qwen", "--set parallel.cp=2 --set parallel.ep=2", 2, false},
    {"qwen_cp2_dp2_ep4", "qwen2_moe", "qwen", "--set parallel.cp=2 --set parallel.dp=2 --set parallel.ep=4 --set train.grad_accum=1", 2, false},
    {"bias_cp2_dp2_ep2_edp2", "bias", "bias", "--set parallel.cp=2 --set parallel.dp=2 --set parallel.ep=2 --set train.grad_accum=1", 2, false},
    /* mixtral's load-balancing loss pooled over stages and CP ranks: the
     * sums travel forward with the activations, the gradient per expert
     * back (model_aux_len). dp=2 ep=2 at lr 1e-4 as mixtral_dp4_ep4: at
     * 1e-2 the same layout without pp ends 1.8e-4 away in the parameters
     * as well (losses 1.5e-6), with pp exactly as far */
    {"mixtral_pp2", "mixtral", "mixtral", "--set parallel.pp=2", 2, false},
    {"mixtral_pp2_dp2_ep2", "mixtral", "mixtral", "--set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2", 4, true},
    {"mixtral_cp2_ep2", "mixtral", "mixtral", "--set parallel.cp=2 --set parallel.ep=2", 2, false},
    {"mixtral_pp2_cp2_ep2", "mixtral", "mixtral", "--set parallel.pp=2 --set parallel.cp=2 --set parallel.ep=2", 2, false},
    {"mixtral_tp2_pp2_ep2", "mixtral", "mixtral", "--set parallel.tp=2 --set parallel.pp=2 --set parallel.ep=2", 2, false},
    /* a capacity factor: each expert's budget over the whole microbatch,
     * split in token order over the TP ranks' rows and the CP ranks' chunks */
    {"cap_tp2", "cap", "cap", "--set parallel.tp=2", 2, false},
    {"cap_cp2", "cap", "cap", "--set parallel.cp=2", 2, false},
    {"cap_tp2_cp2_ep2", "cap", "cap", "--set parallel.tp=2 --set parallel.cp=2 --set parallel.ep=2", 2, false},
    {"cap_cp2_dp2_ep4", "cap", "cap", "--set parallel.cp=2 --set parallel.dp=2 --set parallel.ep=4 --set train.grad_accum=1", 2, false},
    /* Qwen3-MoE (tests/fixtures/qwen3_moe): per-head q/k norms whose
     * gradients TP sums after the backward, no shared expert, a dense
     * layer, the aux loss carried across stages and CP ranks */
    {"qwen3_tp2_pp2_ep2", "qwen3_moe", "qwen3", "--set parallel.tp=2 --set parallel.pp=2 --set parallel.ep=2", 2, false},
    {"qwen3_tp2_cp2_ep2", "qwen3_moe", "qwen3", "--set parallel.tp=2 --set parallel.cp=2 --set parallel.ep=2", 2, false},
};

/* Each case by name, so that `test_moe_equiv NAME` runs one. */
#define CASE(i, fn) static void fn(void) { layout_check(&layouts[i]); }
CASE(0, test_qwen_dp2_ep2)
CASE(1, test_qwen_dp4_ep2_edp2)
CASE(2, test_qwen_tp2_dp2_ep4)
CASE(3, test_qwen_pp2_dp2_ep2)
CASE(4, test_qwen_tp2_ep1_edp2)
CASE(5, test_mixtral_tp2_ep2)
CASE(6, test_zero_tokens_dp2_ep2)
CASE(7, test_qwen_dp2_ep1_edp2)
CASE(8, test_qwen_dp4_ep4)
CASE(9, test_qwen_tp2_dp4_ep4_edp2)
CASE(10, test_qwen_tp2_pp2_ep2)
CASE(11, test_qwen_tp2_pp2_dp2_ep2_edp2)
CASE(12, test_qwen_pp2_dp4_ep4)
CASE(13, test_mixtral_dp4_ep4)
CASE(14, test_mixtral_tp2_dp2_ep2_edp2)
CASE(15, test_bias_dp4_ep2_edp2)
CASE(16, test_bias_tp2_pp2_ep2)
CASE(17, test_qwen_cp2_ep2)
CASE(18, test_qwen_cp2_dp2_ep4)
CASE(19, test_bias_cp2_dp2_ep2_edp2)
CASE(20, test_mixtral_pp2)
CASE(21, test_mixtral_pp2_dp2_ep2)
CASE(22, test_mixtral_cp2_ep2)
CASE(23, test_mixtral_pp2_cp2_ep2)
CASE(24, test_mixtral_tp2_pp2_ep2)
CASE(25, test_cap_tp2)
CASE(26, test_cap_cp2)
CASE(27, test_cap_tp2_cp2_ep2)
CASE(28, test_cap_cp2_dp2_ep4)
CASE(29, test_qwen3_tp2_pp2_ep2)
CASE(30, test_qwen3_tp2_cp2_ep2)
_Static_assert(sizeof layouts / sizeof layouts[0] == 31, "one CASE per layout");

/* The biases moved the routing: from step 2 on, the bias runs' tokens per
 * expert differ from those of the same layout without balancing, and they
 * are more even over the steps (the spread of the counts shrinks). */
static int load_spread(const char *name, int step, double *spread)
{
    char p[512], line[8192], want[32];
    snprintf(p, sizeof p, "%s/%s/m.jsonl", dir, name);
    snprintf(want, sizeof want, "{\"step\": %d,", step);
    FILE *f = fopen(p, "r");
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) {
        if (strncmp(line, want, strlen(want))) continue;
        const char *a = strstr(line, "\"expert_tokens\": {");
        double lo = 1e300, hi = -1e300;
        for (const char *q = a ? strchr(a, '[') : NULL; q; q = strchr(q + 1, '[')) {
            const char *end = strchr(q, ']');
            for (const char *c = q + 1; c && c < end; c = strchr(c, ',') ? strchr(c, ',') + 1 : NULL) {
                double v = atof(c);
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
                if (!strchr(c, ',') || strchr(c, ',') > end) break;
            }
        }
        *spread = hi - lo;
        found = a != NULL;
    }
    if (f) fclose(f);
    return found ? 0 : -1;
}

static void test_bias_moves_routing(void)
{
    REQUIRE(fixture() == 0);
    double b1, b5, p1, p5;
    REQUIRE(load_spread("bias_dp4_ep2_edp2", 1, &b1) == 0 && load_spread("bias_dp4_ep2_edp2", 5, &b5) == 0);
    REQUIRE(load_spread("qwen_dp4_ep2_edp2", 1, &p1) == 0 && load_spread("qwen_dp4_ep2_edp2", 5, &p5) == 0);
    printf("  max - min tokens per expert: balanced %g -> %g, plain %g -> %g\n", b1, b5, p1, p5);
    CHECK(b1 == p1);  /* step 1: every bias still 0 */
    CHECK(b5 < p5);
}

/* The zero-token case really had a rank with no tokens: in step 1 none of
 * EP rank 1's experts (4..7) got a token in either sparse layer. */
static void test_zero_tokens_seen(void)
{
    REQUIRE(fixture() == 0);
    char la[4096];
    step1_load("zero_tokens_dp2_ep2", la, sizeof la);
    int a[8], b[8];
    int n = sscanf(la, "\"expert_tokens\": {\"0\": [%d, %d, %d, %d, %d, %d, %d, %d], \"2\": [%d, %d, %d, %d, "
                       "%d, %d, %d, %d]}", &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6], &a[7],
                   &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &b[6], &b[7]);
    REQUIRE(n == 16);
    int rank0 = 0, rank1 = 0;
    for (int e = 0; e < 8; e++) {
        if (e < 4) rank0 += a[e] + b[e];
        else rank1 += a[e] + b[e];
    }
    CHECK_MSG(rank1 == 0 && rank0 > 0, "%s", la);
}

/* The comparison can fail: another data seed gives other losses. */
static void test_detects_difference(void)
{
    REQUIRE(fixture() == 0);
    char ref[96];
    REQUIRE(reference("tests/fixtures/qwen2_moe", "qwen", 2, 0, ref, sizeof ref) == 0);
    REQUIRE(run("seed8", "tests/fixtures/qwen2_moe",
                "--set parallel.dp=2 --set parallel.ep=2 --set train.grad_accum=1 --set train.seed=8") == 0);
    test_equiv_diff_t d;
    REQUIRE(test_equiv_compare(dir, "seed8", ref, 5, 3, 1, &d) == 0);
    CHECK(d.loss_rel > 1e-3);
    CHECK(d.param_abs > 1e-4);
}

static void test_cleanup(void) { CHECK(test_equiv_remove(dir) == 0); }

int main(int argc, char **argv)
{
    setenv("BATON_STEP_TIMEOUT", "30", 0); /* a hang fails in 30 s, not 300 */
    TEST_RUN(argc, argv, test_qwen_dp2_ep2, test_qwen_dp4_ep2_edp2, test_qwen_tp2_dp2_ep4,
             test_qwen_pp2_dp2_ep2, test_qwen_tp2_ep1_edp2, test_mixtral_tp2_ep2,
             test_zero_tokens_dp2_ep2, test_zero_tokens_seen, test_qwen_dp2_ep1_edp2,
             test_qwen_dp4_ep4, test_qwen_tp2_dp4_ep4_edp2, test_qwen_tp2_pp2_ep2,
             test_qwen_tp2_pp2_dp2_ep2_edp2, test_qwen_pp2_dp4_ep4, test_mixtral_dp4_ep4,
             test_mixtral_tp2_dp2_ep2_edp2, test_bias_dp4_ep2_edp2, test_bias_tp2_pp2_ep2,
             test_qwen_cp2_ep2, test_qwen_cp2_dp2_ep4, test_bias_cp2_dp2_ep2_edp2,
             test_mixtral_pp2, test_mixtral_pp2_dp2_ep2, test_mixtral_cp2_ep2,
             test_mixtral_pp2_cp2_ep2, test_mixtral_tp2_pp2_ep2, test_cap_tp2, test_cap_cp2,
             test_cap_tp2_cp2_ep2, test_cap_cp2_dp2_ep4,
             test_qwen3_tp2_pp2_ep2, test_qwen3_tp2_cp2_ep2, test_bias_moves_routing,
             test_detects_difference, test_cleanup);
}
