/* baton flops JOB.yaml [--set k=v ...] [--seq T] [--tokens-per-s R --peak-tflops P]
 * [--json]: the job's model counted by the one MFU formula (model/flops.h,
 * docs/PERFORMANCE.md) at T = data.seq_len (or --seq), without building the
 * model or reading the data. With a rate and a peak it also prints the MFU,
 * so that scripts (bench/gpu_bench.sh) compute MFU for any implementation
 * with this formula and no copy of it. */
#include "launch/cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/job.h"
#include "launch/run_setup.h"
#include "model/flops.h"

static const char usage_line[] =
    "usage: baton flops JOB.yaml [--set section.key=value ...] [--seq T] "
    "[--tokens-per-s R --peak-tflops P] [--json]\n";

/* a positive finite number, or -1 */
static double positive(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    return end != s && !*end && isfinite(v) && v > 0 ? v : -1;
}

int cmd_flops(int argc, char **argv)
{
    const char *path = NULL;
    static job_t job;
    const char *sets[256];
    int n_sets = 0;
    bool json = false;
    double seq = 0, rate = 0, peak = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        double *num = !strcmp(a, "--seq")            ? &seq
                      : !strcmp(a, "--tokens-per-s") ? &rate
                      : !strcmp(a, "--peak-tflops")  ? &peak
                                                     : NULL;
        if (num) {
            *num = i + 1 < argc ? positive(argv[++i]) : -1;
            if (*num < 0 || (num == &seq && (seq != floor(seq) || seq > 1 << 24))) {
                fprintf(stderr, "baton flops: %s needs a positive %s\n%s", a,
                        num == &seq ? "integer up to 2^24" : "number", usage_line);
                return 2;
            }
        } else if (!strcmp(a, "--set") && i + 1 < argc && n_sets < 256) {
            sets[n_sets++] = argv[++i];
        } else if (!strncmp(a, "--set=", 6) && n_sets < 256) {
            sets[n_sets++] = a + 6;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s  training FLOPs per token of the job's model (model/flops.h), MFU's numerator;\n"
                   "  with a measured rate and a peak, the MFU\n", usage_line);
            return 0;
        } else if (a[0] != '-' && !path) {
            path = a;
        } else {
            fprintf(stderr, "baton flops: bad argument '%s'\n%s", a, usage_line);
            return 2;
        }
    }
    if (!path || (rate > 0) != (peak > 0)) {
        fprintf(stderr, "%s%s", path ? "baton flops: --tokens-per-s and --peak-tflops go together\n"
                                     : "", usage_line);
        return 2;
    }
    char err[JOB_ERR_MAX];
    if (job_load(path, &job, err, sizeof err)) goto bad;
    for (int i = 0; i < n_sets; i++)
        if (job_override(&job, sets[i], err, sizeof err)) goto bad;
    if (job_validate(&job, err, sizeof err)) goto bad;
    if (!job.model.hf[0] && job.model.vocab == 0) {
        fprintf(stderr, "baton flops: %s: model.vocab: set it (the count does not read the data "
                        "to find the vocabulary)\n", job.path);
        return 1;
    }
    static model_config_t cfg;
    if (run_model_config(&job, &cfg)) {
        fprintf(stderr, "baton flops: %s: cannot read the model's config (the error above says "
                        "why)\n", job.path);
        return 1;
    }
    int64_t T = seq > 0 ? (int64_t)seq : job.data.seq_len;
    model_flops_t f;
    model_flops_count(&cfg, T, &f);
    int64_t params = model_num_params(&cfg);
    double mfu = rate > 0 ? model_mfu(f.flops, rate, peak * 1e12) : NAN;
    if (json) {
        printf("{\"seq_len\": %lld, \"params\": %lld, \"matmul_params\": %.0f, \"attn_fma\": %.0f, "
               "\"flops_per_token\": %.0f",
               (long long)T, (long long)params, f.matmul_params, f.attn_fma, f.flops);
        if (rate > 0)
            printf(", \"tokens_per_s\": %.6g, \"peak_tflops\": %.6g, \"mfu\": %.6f", rate, peak, mfu);
        printf("}\n");
        return 0;
    }
    printf("%s: %lld parameters, %lld layers, hidden %lld, vocab %lld%s, T %lld\n", job.path,
           (long long)params, (long long)cfg.num_layers, (long long)cfg.hidden_size,
           (long long)cfg.vocab_size, cfg.tie_word_embeddings ? " (tied head)" : "",
           (long long)T);
    printf("  matrix weights per token %.0f, attention multiply-adds per token %.0f\n",
           f.matmul_params, f.attn_fma);
    printf("  training FLOPs per token 6 x (%.0f + %.0f) = %.0f (%.3f GFLOP)\n", f.matmul_params,
           f.attn_fma, f.flops, f.flops * 1e-9);
    if (rate > 0)
        printf("  at %.6g tokens/s: %.1f TFLOP/s, MFU %.1f%% of %.6g TFLOP/s\n", rate,
               f.flops * rate * 1e-12, 100 * mfu, peak);
    return 0;
bad:
    fprintf(stderr, "baton flops: %s\n", err);
    return 1;
}
