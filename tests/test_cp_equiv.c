/* Context-parallel equivalence: CP layouts train the same 5 steps as the
 * single-process loop, as real processes (`baton run` spawning `baton
 * worker`s over tcp): cp in {2, 4}, the all-gather and the ring mode, and
 * CP combined with TP, PP and DP (ZeRO-1). Per-step losses (metrics JSONL)
 * must match the one-process run to 1e-5 relative, the validation losses
 * to 1e-5 and the final parameters (HF export) to lr / 20 absolute: the
 * dense matrix's bounds (tests/test_dist_equiv.c).
 *
 * Each CP rank holds chunks r and 2cp-1-r of every sequence (data actor,
 * positions, attention over the CP group); its loss share is summed by the
 * driver over the whole global batch, and the dense gradients are reduced
 * over dp x cp, so the totals are those of the one-process run.
 *
 * Fixtures: the dense matrix's random-init Llama (4 layers, hidden 64,
 * vocab 256, 4 heads, 2 KV heads), seq 16 (cp 4: 8 chunks of 2 tokens),
 * micro_batch 2, on a synthetic token stream; and the MLA fixtures written
 * by transformers (tests/fixtures/deepseek_v2_lite: q_lora_rank null;
 * deepseek_v2: q_lora_rank 12, group-limited routing; both 4 heads with
 * qk_nope 8 + qk_rope 4 = 12 key dims and v_head_dim 6, one dense layer
 * then two of shared and routed experts) on tests/fixtures/train_llama:
 * their K [.., H, 12] and V [.., H, 6] travel as separate exchanges. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/helpers/equiv.h"
#include "tests/test.h"

static char dir[256];

static int fixture(void)
{
    if (dir[0]) return 0;
    if (test_equiv_data_dir(dir, sizeof dir, "test_cp_equiv")) return -1;
    char p[512];
    snprintf(p, sizeof p, "%s/job.yaml", dir);
    FILE *f = fopen(p, "w");
    if (!f) return -1;
    fprintf(f, "model: {layers: 4, hidden: 64, heads: 4, kv_heads: 2, ffn: 128, vocab: 256, init_std: 0.02}\n"
               "data: {dir: %s/data, seq_len: 16, split: 0.1}\n"
               "train: {steps: 5, micro_batch: 2, grad_accum: 2, seed: 7, log_every: 100,\n"
               "        eval_every: 2, eval_batches: 3}\n"
               "optim: {lr: 0.01, min_lr: 0.001, warmup: 2, weight_decay: 0.1, clip: 1.0}\n", dir);
    fclose(f);
    snprintf(p, sizeof p, "%s/mla.yaml", dir);
    f = fopen(p, "w");
    if (!f) return -1;
    fprintf(f, "model: {hf: tests/fixtures/deepseek_v2_lite}\n"
               "data: {dir: tests/fixtures/train_llama, seq_len: 16, split: 0.2}\n"
               "train: {steps: 5, micro_batch: 2, grad_accum: 2, seed: 7, log_every: 100,\n"
               "        eval_every: 2, eval_batches: 2}\n"
               "optim: {lr: 0.01, min_lr: 0.001, warmup: 2, weight_decay: 0.1, clip: 1.0}\n");
    fclose(f);
    return 0;
}

/* model: NULL for the dense job, else the MLA job with model.hf = model */
static int run(const char *name, const char *model, const char *sets, int threads)
{
    char job[300], all[1400];
    snprintf(job, sizeof job, "%s/%s", dir, model ? "mla.yaml" : "job.yaml");
    snprintf(all, sizeof all, "%s%s %s", model ? "--set model.hf=tests/fixtures/" : "",
             model ? model : "", sets);
    return test_equiv_run(dir, job, name, all, threads);
}

/* CP layouts run at the dense matrix's TP learning rate (lr 1e-3,
 * tests/test_dist_equiv.c lr_small): attention over chunks (and the ring's
 * log-sum-exp merges) sums in another order than the whole sequence, and
 * AdamW turns the ~1e-7 relative gradient differences of near-zero
 * elements into parameter differences proportional to lr (measured here:
 * up to 8.5e-5 at lr 1e-2 for cp 4 ring, losses within 2.5e-7 either way). */
static const char *lr_small = "--set optim.lr=0.001 --set optim.min_lr=0.0001";
/* deepseek_v2 at lr 1e-4: at 1e-3 one element of layer 2's routed expert 1
 * (gate_proj, an expert few tokens reach) ends 2.3e-5 away at tp 2 without
 * CP, and 1.95e-5 at cp 2 (every other tensor within 4.3e-6): the same
 * AdamW amplification, of that fixture, not of CP (measured here). */
static const char *lr_tiny = "--set optim.lr=0.0001 --set optim.min_lr=0.00001";

static int reference(const char *model, int ga, int tied, const char *lr, char *name, size_t cap)
{
    snprintf(name, cap, "ref_%s_ga%d_tied%d_lr%s", model ? model : "dense", ga, tied,
             lr == lr_tiny ? "4" : "3");
    char p[512];
    snprintf(p, sizeof p, "%s/%s/ck/model.safetensors", dir, name);
    if (access(p, F_OK) == 0) return 0;
    char sets[256];
    snprintf(sets, sizeof sets, "--set train.grad_accum=%d %s %s", ga,
             model ? "" : tied ? "--set model.tie_embeddings=true" : "--set model.tie_embeddings=false",
             lr);
    return run(name, model, sets, 2);
}

static void cp_check_model(const char *name, const char *model, const char *sets, int ga)
{
    REQUIRE(fixture() == 0);
    char ref[96], all[1024];
    int tied = strstr(sets, "tie_embeddings=true") != NULL;
    const char *lr = model && !strcmp(model, "deepseek_v2") ? lr_tiny : lr_small;
    REQUIRE(reference(model, ga, tied, lr, ref, sizeof ref) == 0);
    snprintf(all, sizeof all, "%s %s", sets, lr);
    REQUIRE(run(name, model, all, 1) == 0);
    test_equiv_diff_t d;
    /* a one-process run of an HF model evaluates once more, at step 0 */
    REQUIRE(test_equiv_compare(dir, name, ref, 5, 3, model ? 1 : 0, &d) == 0);
    printf("  %-24s max rel loss diff %.3g, val loss %.3g, max param diff %.3g\n", name, d.loss_rel,
           d.val_rel, d.param_abs);
    CHECK(d.loss_rel <= 1e-5);
    CHECK(d.val_rel <= 1e-5);
    CHECK(d.param_abs <= test_equiv_param_bound(lr == lr_tiny ? 1e-4 : 1e-3));
}

static void cp_check(const char *name, const char *sets, int ga)
{
    cp_check_model(name, NULL, sets, ga);
}

static void test_cp2_allgather(void) { cp_check("cp2_allgather", "--set parallel.cp=2", 2); }
static void test_cp2_ring(void)
{
    cp_check("cp2_ring", "--set parallel.cp=2 --set parallel.cp_mode=ring", 2);
}
static void test_cp4_allgather(void) { cp_check("cp4_allgather", "--set parallel.cp=4", 2); }
static void test_cp4_ring(void)
{
    cp_check("cp4_ring", "--set parallel.cp=4 --set parallel.cp_mode=ring", 2);
}
/* The ring rows above and below pass their blocks as stage-actor messages
 * (parallel.cp_exchange auto: messages on the cpu, train/cp_ring.h); these
 * two keep the CP communicator's send/receive covered. */
static void test_cp4_ring_collective(void)
{
    cp_check("cp4_ring_collective",
             "--set parallel.cp=4 --set parallel.cp_mode=ring --set parallel.cp_exchange=collective", 2);
}
static void test_mla_cp2_tp2_ring_collective(void)
{
    cp_check_model("mla_cp2_tp2_ring_collective", "deepseek_v2_lite",
                   "--set parallel.cp=2 --set parallel.tp=2 --set parallel.cp_mode=ring "
                   "--set parallel.cp_exchange=collective", 2);
}
static void test_cp2_tp2_allgather(void)
{
    cp_check("cp2_tp2_allgather", "--set parallel.cp=2 --set parallel.tp=2", 2);
}
static void test_cp2_tp2_ring(void)
{
    cp_check("cp2_tp2_ring", "--set parallel.cp=2 --set parallel.tp=2 --set parallel.cp_mode=ring", 2);
}
static void test_cp2_pp2_ring(void)
{
    cp_check("cp2_pp2_ring", "--set parallel.cp=2 --set parallel.pp=2 --set parallel.cp_mode=ring", 2);
}
static void test_cp2_pp2_allgather_tied(void)
{
    cp_check("cp2_pp2_allgather_tied",
             "--set parallel.cp=2 --set parallel.pp=2 --set model.tie_embeddings=true "
             "--set train.grad_accum=2", 2);
}
/* The dense gradients reduce over dp x cp, ZeRO-1 shards over the same
 * four ranks; the data follows dp alone. */
static void test_cp2_dp2_zero1_ring(void)
{
    cp_check("cp2_dp2_zero1_ring",
             "--set parallel.cp=2 --set parallel.dp=2 --set parallel.zero1=true "
             "--set parallel.cp_mode=ring", 4);
}

/* MLA: K of qk_nope + qk_rope dims and V of v_head_dim, exchanged as what
 * they are; the rope key rotated at the chunks' positions. */
static const char *lite = "deepseek_v2_lite", *full = "deepseek_v2";
static void test_mla_cp2_allgather(void) { cp_check_model("mla_cp2_allgather", lite, "--set parallel.cp=2", 2); }
static void test_mla_cp2_ring(void)
{
    cp_check_model("mla_cp2_ring", lite, "--set parallel.cp=2 --set parallel.cp_mode=ring", 2);
}
static void test_mla_cp4_allgather(void) { cp_check_model("mla_cp4_allgather", lite, "--set parallel.cp=4", 2); }
static void test_mla_cp4_ring(void)
{
    cp_check_model("mla_cp4_ring", lite, "--set parallel.cp=4 --set parallel.cp_mode=ring", 2);
}
static void test_mla_cp2_tp2_allgather(void)
{
    cp_check_model("mla_cp2_tp2_allgather", lite, "--set parallel.cp=2 --set parallel.tp=2", 2);
}
static void test_mla_cp2_tp2_ring(void)
{
    cp_check_model("mla_cp2_tp2_ring", lite,
                   "--set parallel.cp=2 --set parallel.tp=2 --set parallel.cp_mode=ring", 2);
}
static void test_mla_cp2_pp2_ring(void)
{
    cp_check_model("mla_cp2_pp2_ring", lite,
                   "--set parallel.cp=2 --set parallel.pp=2 --set parallel.cp_mode=ring", 2);
}
/* the routed experts' grid folds over tp x cp: ep 2 over the two CP ranks */
static void test_mla_cp2_ep2_allgather(void)
{
    cp_check_model("mla_cp2_ep2_allgather", lite, "--set parallel.cp=2 --set parallel.ep=2", 2);
}
/* the low-rank query (q_a_proj, q_a_layernorm, q_b_proj) */
static void test_mla_q_lora_cp2_pp2_allgather(void)
{
    cp_check_model("mla_q_lora_cp2_pp2_allgather", full,
                   "--set parallel.cp=2 --set parallel.pp=2", 2);
}
static void test_mla_q_lora_cp2_tp2_pp2_ring(void)
{
    cp_check_model("mla_q_lora_cp2_tp2_pp2_ring", full,
                   "--set parallel.cp=2 --set parallel.tp=2 --set parallel.pp=2 "
                   "--set parallel.cp_mode=ring", 2);
}
static void test_mla_q_lora_cp4_tp2_ring(void)
{
    cp_check_model("mla_q_lora_cp4_tp2_ring", full,
                   "--set parallel.cp=4 --set parallel.tp=2 --set parallel.cp_mode=ring", 2);
}

/* Sequence parallelism inside TP: the same layout with and without
 * parallel.sequence_parallel, and each against the one-process run. The
 * norms and the residual stream run on each TP rank's rows, the TP
 * all-reduces become all-gathers and reduce-scatters, and the norm weights'
 * gradients are summed over the TP group: equal to TP without it. */
static void sp_check(const char *name, const char *model, const char *sets, int ga)
{
    char tp_name[96], all[1024];
    snprintf(tp_name, sizeof tp_name, "%s_nosp", name);
    cp_check_model(tp_name, model, sets, ga);
    snprintf(all, sizeof all, "%s --set parallel.sequence_parallel=true", sets);
    cp_check_model(name, model, all, ga);
    test_equiv_diff_t d;
    REQUIRE(test_equiv_compare(dir, name, tp_name, 5, 3, 0, &d) == 0);
    printf("  %-24s against tp without sp: loss %.3g, val loss %.3g, param %.3g\n", name,
           d.loss_rel, d.val_rel, d.param_abs);
    CHECK(d.loss_rel <= 1e-5);
    CHECK(d.val_rel <= 1e-5);
    double lr = model && !strcmp(model, "deepseek_v2") ? 1e-4 : 1e-3;
    CHECK(d.param_abs <= test_equiv_param_bound(lr));
}

static void test_sp_tp2(void) { sp_check("sp_tp2", NULL, "--set parallel.tp=2", 2); }
static void test_sp_tp2_pp2_tied(void)
{
    sp_check("sp_tp2_pp2_tied", NULL,
             "--set parallel.tp=2 --set parallel.pp=2 --set model.tie_embeddings=true", 2);
}
static void test_sp_tp2_cp2_ring(void)
{
    sp_check("sp_tp2_cp2_ring", NULL,
             "--set parallel.tp=2 --set parallel.cp=2 --set parallel.cp_mode=ring", 2);
}
static void test_sp_tp2_cp2_pp2_allgather(void)
{
    sp_check("sp_tp2_cp2_pp2_allgather", NULL,
             "--set parallel.tp=2 --set parallel.cp=2 --set parallel.pp=2", 2);
}
static void test_sp_tp2_cp4_allgather(void)
{
    sp_check("sp_tp2_cp4_allgather", NULL, "--set parallel.tp=2 --set parallel.cp=4", 2);
}
/* MLA and the DeepSeek-V2 experts (whose output is whole on every TP rank) */
static void test_sp_mla_tp2_cp2_ring(void)
{
    sp_check("sp_mla_tp2_cp2_ring", lite,
             "--set parallel.tp=2 --set parallel.cp=2 --set parallel.cp_mode=ring", 2);
}
/* the routed experts split over ep 2 (folded over tp x cp) */
static void test_sp_mla_tp2_cp2_ep2_allgather(void)
{
    sp_check("sp_mla_tp2_cp2_ep2_allgather", lite,
             "--set parallel.tp=2 --set parallel.cp=2 --set parallel.ep=2", 2);
}
static void test_sp_mla_q_lora_tp2_cp2_pp2_allgather(void)
{
    sp_check("sp_mla_q_lora_tp2_cp2_pp2_allgather", full,
             "--set parallel.tp=2 --set parallel.cp=2 --set parallel.pp=2", 2);
}
static void test_sp_mla_q_lora_tp2_cp4_ring(void)
{
    sp_check("sp_mla_q_lora_tp2_cp4_ring", full,
             "--set parallel.tp=2 --set parallel.cp=4 --set parallel.cp_mode=ring", 2);
}
/* Qwen3's per-head q/k norms (tests/fixtures/qwen3, tied embeddings): their
 * weights' gradients are each TP rank's heads' share, summed over the TP
 * group after the backward in one reduction with the norms' of sequence
 * parallelism; CP splits their rows like any other */
static void test_sp_qwen3_tp2_cp2_ring(void)
{
    sp_check("sp_qwen3_tp2_cp2_ring", "qwen3",
             "--set parallel.tp=2 --set parallel.cp=2 --set parallel.cp_mode=ring", 2);
}
static void test_qwen3_tp2_pp2(void)
{
    cp_check_model("qwen3_tp2_pp2", "qwen3", "--set parallel.tp=2 --set parallel.pp=2", 2);
}
/* Phi-3's fused qkv_proj / gate_up_proj (row parts split by TP one by one) */
static void test_phi3_tp2_cp2_ring(void)
{
    cp_check_model("phi3_tp2_cp2_ring", "phi3",
                   "--set parallel.tp=2 --set parallel.cp=2 --set parallel.cp_mode=ring", 2);
}
/* rows that do not split evenly: micro_batch 1 x seq 15 = 15 tokens, 8 and 7
 * a TP rank; against TP without sequence parallelism alone */
static void test_sp_uneven_rows(void)
{
    REQUIRE(fixture() == 0);
    const char *sets = "--set parallel.tp=2 --set data.seq_len=15 --set train.micro_batch=1 "
                       "--set optim.lr=0.001 --set optim.min_lr=0.0001";
    char all[512];
    REQUIRE(run("uneven_nosp", NULL, sets, 1) == 0);
    snprintf(all, sizeof all, "%s --set parallel.sequence_parallel=true", sets);
    REQUIRE(run("uneven_sp", NULL, all, 1) == 0);
    test_equiv_diff_t d;
    REQUIRE(test_equiv_compare(dir, "uneven_sp", "uneven_nosp", 5, 3, 0, &d) == 0);
    printf("  %-24s against tp without sp: loss %.3g, val loss %.3g, param %.3g\n", "sp_uneven",
           d.loss_rel, d.val_rel, d.param_abs);
    CHECK(d.loss_rel <= 1e-5);
    CHECK(d.val_rel <= 1e-5);
    CHECK(d.param_abs <= test_equiv_param_bound(1e-3));
}

/* Rank 0's activation estimate (KiB) of `baton graph` on the dense job. */
static double graph_acts_kib(const char *sets)
{
    const char *baton = getenv("BATON") ? getenv("BATON") : "build/baton";
    char cmd[1024], line[512];
    snprintf(cmd, sizeof cmd, "%s graph %s/job.yaml %s 2>&1", baton, dir, sets);
    FILE *p = popen(cmd, "r");
    double kib = -1;
    while (p && fgets(line, sizeof line, p)) {
        const char *a = strstr(line, "  rank 0: "), *b = a ? strstr(a, "activations ") : NULL;
        if (b && strstr(b, " KiB")) kib = atof(b + strlen("activations "));
    }
    if (p) pclose(p);
    return kib;
}

/* A training arena under sequence parallelism keeps the residual stream and
 * the norm outputs at the rank's rows: for the dense job (8 sublayers, N =
 * 2 x 16 tokens, C = 64, f32) at tp 2, x and ln go from (9 + 8) x N x C to
 * N x C (the stage input) + 8 x 16 x C + 8 x 16 x C + N x C (the whole norm
 * output), plus the [2, 9, C] norm-gradient buffers (8 bytes an element)
 * and a 64-byte empty stage-output slot: 48064 bytes less per arena, two
 * arenas (microbatches), which baton graph's estimate shows. */
static void test_sp_memory(void)
{
    REQUIRE(fixture() == 0);
    double tp = graph_acts_kib("--set parallel.tp=2");
    double sp = graph_acts_kib("--set parallel.tp=2 --set parallel.sequence_parallel=true");
    printf("  rank 0 activations: tp 2 %.1f KiB, with sequence parallelism %.1f KiB\n", tp, sp);
    REQUIRE(tp > 0 && sp > 0);
    CHECK(fabs((tp - sp) - 2 * 48064 / 1024.0) <= 1.0);
}

/* A sequence that does not cut into 2 x cp equal chunks is refused before
 * anything starts, naming the field. */
static void test_cp_bad_seq(void)
{
    REQUIRE(fixture() == 0);
    const char *baton = getenv("BATON") ? getenv("BATON") : "build/baton";
    char cmd[1024], out[4096] = "";
    snprintf(cmd, sizeof cmd, "%s graph %s/job.yaml --set parallel.cp=3 2>&1", baton, dir);
    FILE *p = popen(cmd, "r");
    REQUIRE(p != NULL);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int rc = pclose(p);
    CHECK(rc != 0);
    CHECK(strstr(out, "parallel.cp") != NULL);
    CHECK(strstr(out, "2 x cp = 6") != NULL);
}

/* Sliding-window attention: a window shorter than the sequence (16) trains
 * as one process and under TP (tests/test_model_hf, test_model_tp), but the
 * CP exchanges do not cut the keys to it: refused before training, naming
 * why, never a silently different model. */
static void test_cp_sliding_window_refused(void)
{
    REQUIRE(fixture() == 0);
    REQUIRE(run("window_one", "mistral_window", "--set train.steps=2", 1) == 0);
    int rc = run("window_cp2", "mistral_window", "--set parallel.cp=2 --set train.steps=2", 1);
    CHECK(rc != 0);
    char p[512], out[8192] = "";
    snprintf(p, sizeof p, "%s/window_cp2/log", dir);
    FILE *f = fopen(p, "re");
    REQUIRE(f != NULL);
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    fclose(f);
    CHECK_MSG(strstr(out, "sliding_window=6") && strstr(out, "does not run under context parallelism"),
              "log: %s", out);
}

static void test_cleanup(void) { CHECK(test_equiv_remove(dir) == 0); }

int main(int argc, char **argv)
{
    setenv("BATON_STEP_TIMEOUT", "30", 0); /* a hang fails in 30 s, not 300 */
    TEST_RUN(argc, argv, test_cp2_allgather, test_cp2_ring, test_cp4_allgather, test_cp4_ring,
             test_cp4_ring_collective, test_mla_cp2_tp2_ring_collective,
             test_cp2_tp2_allgather, test_cp2_tp2_ring, test_cp2_pp2_ring,
             test_cp2_pp2_allgather_tied, test_cp2_dp2_zero1_ring, test_mla_cp2_allgather,
             test_mla_cp2_ring, test_mla_cp4_allgather, test_mla_cp4_ring,
             test_mla_cp2_tp2_allgather, test_mla_cp2_tp2_ring, test_mla_cp2_pp2_ring,
             test_mla_cp2_ep2_allgather, test_mla_q_lora_cp2_pp2_allgather,
             test_mla_q_lora_cp2_tp2_pp2_ring, test_mla_q_lora_cp4_tp2_ring, test_sp_tp2,
             test_sp_tp2_pp2_tied, test_sp_tp2_cp2_ring, test_sp_tp2_cp2_pp2_allgather,
             test_sp_tp2_cp4_allgather,
             test_sp_mla_tp2_cp2_ring, test_sp_mla_tp2_cp2_ep2_allgather,
             test_sp_mla_q_lora_tp2_cp2_pp2_allgather,
             test_sp_mla_q_lora_tp2_cp4_ring, test_sp_qwen3_tp2_cp2_ring, test_qwen3_tp2_pp2,
             test_phi3_tp2_cp2_ring, test_sp_uneven_rows, test_sp_memory, test_cp_bad_seq,
             test_cp_sliding_window_refused, test_cleanup);
}
