/* Training-throughput benchmark (bench_train.h). Both sides run the same
 * work per step: forward and backward of B x T tokens, global-norm clipping
 * and one AdamW update, on random token windows; tokens/s is B*T*steps over
 * the wall time of the measured steps (warmup steps excluded). */
#include "bench/bench_train.h"

#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "kernels/kernels.h"
#include "launch/run_setup.h"
#include "model/model.h"
#include "train/train.h"

typedef struct {
    int64_t layers, hidden, heads, kv_heads, ffn, vocab, seq, batch, steps, warmup;
    int threads;
    bool json, torch;
} bench_cfg_t;

static void bench_usage(FILE *f)
{
    fprintf(f, "usage: baton bench train [--layers 4] [--hidden 256] [--heads 8] [--kv-heads 8]\n"
               "         [--ffn 768] [--vocab 8192] [--seq 256] [--batch 4] [--steps 5]\n"
               "         [--warmup 1] [--threads 2] [--no-torch] [--json]\n");
}

/* baton side: tokens/s over the measured steps. */
static bt_status_t bench_baton(const bench_cfg_t *b, double *tps, double *first_loss)
{
    model_config_t cfg;
    model_config_llama(&cfg, &(model_llama_dims_t){
                                 .vocab = b->vocab, .hidden = b->hidden, .layers = b->layers,
                                 .heads = b->heads, .kv_heads = b->kv_heads, .ffn = b->ffn,
                                 .max_position = b->seq, .norm_eps = 1e-5, .rope_theta = 10000.0});
    kern_cpu_set_threads(b->threads);
    model_t *m;
    bt_status_t st = model_create(&cfg, NULL, &m);
    if (st) return st;
    model_init_random(m, 1, 0.02f);
    /* enough random tokens for every window of every step to differ */
    int64_t n = (b->steps + b->warmup) * b->batch * b->seq + 1;
    int32_t *tok = malloc((size_t)n * sizeof *tok);
    if (!tok) { model_destroy(m); return BT_ERR_NOMEM; }
    uint64_t s = 42;
    for (int64_t i = 0; i < n; i++) tok[i] = (int32_t)(train_splitmix64(&s) % (uint64_t)b->vocab);
    train_config_t tc = {
        .steps = b->steps + b->warmup, .micro_batch = b->batch, .grad_accum = 1, .seq_len = b->seq,
        .seed = 1, .eval_batches = 1,
        .lr = {.lr = 3e-4, .min_lr = 3e-5, .warmup = 0, .total = b->steps + b->warmup},
        .optim = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1},
        .clip = 1.0,
    };
    train_t *t;
    if ((st = train_create(&tc, m, tok, n, NULL, 0, &t))) goto out_tok;
    uint64_t t0 = 0;
    for (int64_t i = 0; i < b->steps + b->warmup; i++) {
        if (i == b->warmup) t0 = clock_now_ns();
        train_step_info_t info;
        if ((st = train_step(t, &info))) break;
        if (i == 0) *first_loss = info.loss;
    }
    if (st == BT_OK)
        *tps = (double)(b->steps * b->batch * b->seq) / ((double)(clock_now_ns() - t0) * 1e-9);
    train_destroy(t);
out_tok:
    free(tok);
    model_destroy(m);
    return st;
}

/* bench/bench_train.py next to the working directory or to the binary. */
static bool torch_script_find(char *out, size_t len)
{
    const char *env = getenv("BATON_BENCH_TRAIN_PY");
    if (env && access(env, R_OK) == 0) { snprintf(out, len, "%s", env); return true; }
    if (access("bench/bench_train.py", R_OK) == 0) { snprintf(out, len, "bench/bench_train.py"); return true; }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return false;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return false;
    *slash = '\0';
    for (int up = 1; up <= 3; up++) {
        char cand[PATH_MAX + 64];
        snprintf(cand, sizeof cand, "%s/%s/bench/bench_train.py", exe,
                 up == 1 ? ".." : up == 2 ? "../.." : "../../..");
        if (access(cand, R_OK) == 0 && strlen(cand) < len) { memcpy(out, cand, strlen(cand) + 1); return true; }
    }
    return false;
}

/* Runs the PyTorch side; 0 ok, -1 failed, -2 python3/torch missing. */
static int bench_torch(const bench_cfg_t *b, double *tps, double *first_loss, char *why, size_t wlen)
{
    char script[PATH_MAX];
    if (!torch_script_find(script, sizeof script)) {
        snprintf(why, wlen, "bench/bench_train.py not found (run from the repository root)");
        return -1;
    }
    char cmd[PATH_MAX + 512];
    snprintf(cmd, sizeof cmd,
             "python3 '%s' --layers %lld --hidden %lld --heads %lld --kv-heads %lld --ffn %lld "
             "--vocab %lld --seq %lld --batch %lld --steps %lld --warmup %lld --threads %d 2>&1",
             script, (long long)b->layers, (long long)b->hidden, (long long)b->heads,
             (long long)b->kv_heads, (long long)b->ffn, (long long)b->vocab, (long long)b->seq,
             (long long)b->batch, (long long)b->steps, (long long)b->warmup, b->threads);
    FILE *p = popen(cmd, "re");
    if (!p) {
        snprintf(why, wlen, "cannot start python3");
        return -2;
    }
    char line[1024];
    int found = 0;
    why[0] = '\0';
    while (fgets(line, sizeof line, p)) {
        if (sscanf(line, "RESULT tokens_per_s=%lf first_loss=%lf", tps, first_loss) == 2) found = 1;
        else if (strstr(line, "NO_TORCH")) snprintf(why, wlen, "PyTorch is not installed for python3 "
                                                            "(pip install torch transformers)");
        else if (!why[0]) snprintf(why, wlen, "%.*s", (int)strcspn(line, "\n"), line);
    }
    int rc = pclose(p);
    if (found) return 0;
    if (rc == 127 * 256) snprintf(why, wlen, "python3 not found");
    return strstr(why, "not installed") || strstr(why, "not found") ? -2 : -1;
}

int bench_train_main(int argc, char **argv)
{
    bench_cfg_t b = {.layers = 4, .hidden = 256, .heads = 8, .kv_heads = 8, .ffn = 768,
                     .vocab = 8192, .seq = 256, .batch = 4, .steps = 5, .warmup = 1,
                     .threads = 2, .json = false, .torch = true};
    static const struct option opts[] = {
        {"layers", required_argument, 0, 'l'}, {"hidden", required_argument, 0, 'd'},
        {"heads", required_argument, 0, 'H'}, {"kv-heads", required_argument, 0, 'K'},
        {"ffn", required_argument, 0, 'f'}, {"vocab", required_argument, 0, 'v'},
        {"seq", required_argument, 0, 'T'}, {"batch", required_argument, 0, 'B'},
        {"steps", required_argument, 0, 's'}, {"warmup", required_argument, 0, 'w'},
        {"threads", required_argument, 0, 't'}, {"no-torch", no_argument, 0, 'n'},
        {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        long long v = optarg ? atoll(optarg) : 0;
        switch (c) {
        case 'l': b.layers = v; break;
        case 'd': b.hidden = v; break;
        case 'H': b.heads = v; break;
        case 'K': b.kv_heads = v; break;
        case 'f': b.ffn = v; break;
        case 'v': b.vocab = v; break;
        case 'T': b.seq = v; break;
        case 'B': b.batch = v; break;
        case 's': b.steps = v; break;
        case 'w': b.warmup = v; break;
        case 't': b.threads = (int)v; break;
        case 'n': b.torch = false; break;
        case 'j': b.json = true; break;
        case 'h': bench_usage(stdout); return 0;
        default: bench_usage(stderr); return 2;
        }
    }
    if (b.layers < 1 || b.hidden < 2 || b.heads < 1 || b.kv_heads < 1 || b.hidden % b.heads ||
        b.heads % b.kv_heads || b.ffn < 1 || b.vocab < 2 || b.seq < 2 || b.batch < 1 ||
        b.steps < 1 || b.warmup < 0 || b.threads < 1) {
        fprintf(stderr, "baton bench train: inconsistent model/run sizes\n");
        bench_usage(stderr);
        return 2;
    }
    if (!b.json)
        printf("bench train: llama d=%lld layers=%lld heads=%lld/%lld ffn=%lld vocab=%lld T=%lld "
               "B=%lld, %lld steps (+%lld warmup), %d threads\n",
               (long long)b.hidden, (long long)b.layers, (long long)b.heads, (long long)b.kv_heads,
               (long long)b.ffn, (long long)b.vocab, (long long)b.seq, (long long)b.batch,
               (long long)b.steps, (long long)b.warmup, b.threads);
    fflush(stdout);
    double baton_tps = 0, baton_loss = 0, torch_tps = 0, torch_loss = 0;
    if (bench_baton(&b, &baton_tps, &baton_loss) != BT_OK) {
        fprintf(stderr, "baton bench train: the baton run failed\n");
        return 1;
    }
    if (!b.json) printf("baton   %10.1f tokens/s  (first loss %.4f)\n", baton_tps, baton_loss);
    fflush(stdout);
    int trc = -3;
    char why[512] = "";
    if (b.torch) trc = bench_torch(&b, &torch_tps, &torch_loss, why, sizeof why);
    if (b.json) {
        printf("{\"bench\": \"train\", \"hidden\": %lld, \"layers\": %lld, \"heads\": %lld, "
               "\"seq\": %lld, \"batch\": %lld, \"vocab\": %lld, \"threads\": %d, \"steps\": %lld, "
               "\"baton_tokens_per_s\": ",
               (long long)b.hidden, (long long)b.layers, (long long)b.heads, (long long)b.seq,
               (long long)b.batch, (long long)b.vocab, b.threads, (long long)b.steps);
        run_json_num(stdout, "%.1f", baton_tps);
        if (trc == 0) {
            printf(", \"torch_tokens_per_s\": ");
            run_json_num(stdout, "%.1f", torch_tps);
            printf(", \"ratio\": ");
            run_json_num(stdout, "%.3f", baton_tps / torch_tps);
        } else if (b.torch) {
            printf(", \"torch_error\": "); /* python's own words: escaped */
            run_json_str(stdout, why, strlen(why));
        }
        printf("}\n");
    } else if (trc == 0) {
        printf("pytorch %10.1f tokens/s  (first loss %.4f)\n", torch_tps, torch_loss);
        printf("ratio baton/pytorch: %.2fx\n", baton_tps / torch_tps);
    } else if (b.torch) {
        printf("pytorch: skipped: %s\n", why);
    }
    return b.torch && trc == -1 ? 1 : 0;
}
