/* Progress, metrics and the summary of a training run (launch/report.h). */
#include "launch/report.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "kernels/device.h"
#include "kernels/kernels.h"
#include "launch/run_setup.h"
#include "model/flops.h"

bt_status_t report_open(report_t *r, const job_t *job, const model_config_t *cfg, int n_ranks,
                        bool resume, bool quiet, const char *run_id, const char *run_dir)
{
    memset(r, 0, sizeof *r);
    r->job = job;
    r->quiet = quiet;
    r->run_id = run_id;
    r->run_dir = run_dir;
    r->n_ranks = n_ranks < 1 ? 1 : n_ranks > REPORT_MAX_RANKS ? REPORT_MAX_RANKS : n_ranks;
    r->last_step = job->train.stop_after ? job->train.stop_after : job->train.steps;
    r->best_val = NAN;
    r->flops_per_token = model_flops_per_token(cfg, job->data.seq_len);
    const char *env = getenv("BATON_PEAK_TFLOPS");
    double tf = env ? strtod(env, NULL) : 0;
    if (tf > 0) {
        r->peak_flops = tf * 1e12;
        snprintf(r->peak_what, sizeof r->peak_what, "%.4g TFLOP/s (BATON_PEAK_TFLOPS)", tf);
    } else if (!strcmp(job->device, "cpu")) {
        r->peak_flops = kern_cpu_peak_flops();
        snprintf(r->peak_what, sizeof r->peak_what, "%.1f GFLOP/s fp32, measured on this host now",
                 r->peak_flops * 1e-9);
    } else {
        snprintf(r->peak_what, sizeof r->peak_what,
                 "the matrix rate of %s, measured before the first step", job->device);
    }
    if (job->metrics.file[0]) {
        if (run_parent_make(job->metrics.file)) return BT_ERR_IO;
        if (!(r->metrics = fopen(job->metrics.file, resume ? "ae" : "we"))) {
            log_error("metrics.file: cannot create %s: %s", job->metrics.file, strerror(errno));
            return BT_ERR_IO;
        }
    }
    if (job->metrics.tensorboard[0] && tb_open(&r->tb, job->metrics.tensorboard)) return BT_ERR_IO;
    if ((job->metrics.plot[0] && run_parent_make(job->metrics.plot)) ||
        (job->metrics.throughput_plot[0] && run_parent_make(job->metrics.throughput_plot)))
        return BT_ERR_IO;
    r->t_start = r->t_int = clock_now_ns();
    return BT_OK;
}

static void count_fmt(double v, char *buf, size_t cap)
{
    if (v >= 1e9) snprintf(buf, cap, "%.2f B", v * 1e-9);
    else if (v >= 1e6) snprintf(buf, cap, "%.2f M", v * 1e-6);
    else if (v >= 1e3) snprintf(buf, cap, "%.1f k", v * 1e-3);
    else snprintf(buf, cap, "%.0f", v);
}

void report_header(report_t *r, const model_config_t *cfg, int64_t n_params, const char *layout,
                   int64_t tokens_per_step, int64_t train_tokens, int64_t val_tokens)
{
    const job_t *job = r->job;
    char np[32];
    count_fmt((double)n_params, np, sizeof np);
    printf("baton run %s", job->path);
    if (r->run_dir) printf(": run %s in %s", r->run_id, r->run_dir);
    printf("\n  model: %s, %s parameters (%lld), %lld layers, hidden %lld, vocab %lld\n",
           job->model.hf[0] ? job->model.hf : "random init", np, (long long)n_params,
           (long long)cfg->num_layers, (long long)cfg->hidden_size, (long long)cfg->vocab_size);
    if (layout) printf("  layout: %s\n", layout);
    printf("  batch: %lld tokens per step (%lld sequences of %lld), %lld steps | data: %lld train tokens",
           (long long)tokens_per_step, (long long)(tokens_per_step / job->data.seq_len),
           (long long)job->data.seq_len, (long long)job->train.steps, (long long)train_tokens);
    if (val_tokens >= 0) printf(", %lld val tokens", (long long)val_tokens);
    printf("\n");
    printf("  MFU: %.4g GFLOP per token (model/flops.h) against %s\n", r->flops_per_token * 1e-9,
           r->peak_what);
    fflush(stdout);
}

void report_set_peak(report_t *r, double flops, const char *what)
{
    const char *env = getenv("BATON_PEAK_TFLOPS");
    if (env && strtod(env, NULL) > 0) return;
    r->peak_flops = flops > 0 ? flops : 0;
    if (flops > 0)
        snprintf(r->peak_what, sizeof r->peak_what, "%.1f TFLOP/s, %s", flops * 1e-12, what);
    else
        snprintf(r->peak_what, sizeof r->peak_what, "n/a: %s could not be measured (set BATON_PEAK_TFLOPS)",
                 what);
}

void report_peak_measure(report_t *r, device_t dev, dtype_t dt)
{
    char d[DEVICE_STR_MAX], what[80];
    snprintf(what, sizeof what, "%s 4096-cubed products on %s, measured now", dtype_name(dt),
             device_str(dev, d));
    report_set_peak(r, kern_peak_flops(dev, dt), what);
}

static double mfu_of(const report_t *r, double tokens_per_s)
{
    return r->peak_flops > 0 ? model_mfu(r->flops_per_token, tokens_per_s, r->peak_flops) : NAN;
}

static void mfu_fmt(double mfu, char *buf, size_t cap)
{
    if (isfinite(mfu)) snprintf(buf, cap, "%.1f%%", 100 * mfu);
    else snprintf(buf, cap, "n/a");
}

/* The rank holding the most of mem[], and how much. */
static int mem_max(const report_t *r, const uint64_t *mem, uint64_t *bytes)
{
    int at = -1;
    *bytes = 0;
    for (int k = 0; k < r->n_ranks; k++)
        if (mem[k] > *bytes) *bytes = mem[k], at = k;
    return at;
}

/* "1.2 GiB (rank 3)" for the rank holding the most; false when none. */
static bool mem_max_fmt(const report_t *r, const uint64_t *mem, char *buf, size_t cap)
{
    uint64_t b;
    int at = mem_max(r, mem, &b);
    if (at < 0) return false;
    base_mem_size_fmt((double)b, buf, cap);
    if (r->n_ranks > 1) snprintf(buf + strlen(buf), cap - strlen(buf), " (rank %d)", at);
    return true;
}

static void mem_list(FILE *f, const report_t *r, const uint64_t *mem)
{
    for (int k = 0; k < r->n_ranks; k++) fprintf(f, "%s%llu", k ? ", " : "", (unsigned long long)mem[k]);
}

static void metrics_line(const report_t *r, const report_step_t *s, double tps, double mfu,
                         double elapsed)
{
    FILE *f = r->metrics;
    if (!f) return;
    fprintf(f, "{\"step\": %lld, \"loss\": ", (long long)s->step);
    run_json_num(f, "%.17g", s->loss); /* round-trips: runs compare bit for bit */
    fputs(", \"lr\": ", f);
    run_json_num(f, "%.7g", s->lr);
    fputs(", \"grad_norm\": ", f);
    run_json_num(f, "%.17g", s->grad_norm);
    fprintf(f, ", \"tokens\": %lld, \"tokens_per_s\": ", (long long)(r->tokens_before + r->tokens));
    run_json_num(f, "%.1f", tps);
    fputs(", \"elapsed_s\": ", f);
    run_json_num(f, "%.3f", elapsed);
    fputs(", \"step_s\": ", f);
    run_json_num(f, "%.6f", s->step_s);
    fputs(", \"mfu\": ", f);
    run_json_num(f, "%.6f", mfu);
    fputs(", \"mem_peak_bytes\": [", f);
    mem_list(f, r, r->mem);
    uint64_t dev_b;
    if (mem_max(r, r->dev_mem, &dev_b) >= 0) {
        fputs("], \"device_mem_peak_bytes\": [", f);
        mem_list(f, r, r->dev_mem);
    }
    fprintf(f, "], \"skipped\": %s, \"skipped_steps\": %lld", s->skipped ? "true" : "false",
            (long long)s->skipped_total);
    if (s->load && s->load_rows) {
        fputs(", \"expert_tokens\": {", f);
        for (int i = 0; i < s->load_rows; i++) {
            const double *row = s->load + (size_t)i * (size_t)s->load_cols;
            fprintf(f, "%s\"%d\": [", i ? ", " : "", (int)row[0]);
            for (int e = 1; e < s->load_cols; e++) {
                if (e > 1) fputs(", ", f);
                run_json_num(f, "%.0f", row[e]);
            }
            fputc(']', f);
        }
        fputc('}', f);
    }
    if (s->has_dropped) fprintf(f, ", \"moe_dropped\": %lld", (long long)s->moe_dropped);
    fputs("}\n", f);
    fflush(f);
}

static void eta_fmt(double s, char *eta, size_t cap)
{
    if (!isfinite(s) || s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(eta, cap, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(eta, cap, "%ldm%02lds", t / 60, t % 60);
    else snprintf(eta, cap, "%lds", t);
}

void report_step(report_t *r, const report_step_t *s)
{
    const job_t *job = r->job;
    r->tokens += s->tokens;
    r->train_s += s->step_s;
    r->steps_int++;
    r->step_s_int += s->step_s;
    for (int k = 0; k < r->n_ranks; k++) {
        if (s->mem && s->mem[k] > r->mem[k]) r->mem[k] = s->mem[k];
        if (s->dev_mem && s->dev_mem[k] > r->dev_mem[k]) r->dev_mem[k] = s->dev_mem[k];
    }
    double elapsed = (double)(clock_now_ns() - r->t_start) * 1e-9;
    double tps = s->step_s > 0 ? (double)s->tokens / s->step_s : NAN;
    double mfu = mfu_of(r, tps);
    if (isfinite(s->loss)) plot_curve_push(&r->loss, (double)s->step, s->loss);
    if (isfinite(tps)) plot_curve_push(&r->tput, (double)s->step, tps);
    metrics_line(r, s, tps, mfu, elapsed);
    tb_scalar(&r->tb, "train/loss", s->step, s->loss);
    tb_scalar(&r->tb, "train/lr", s->step, s->lr);
    tb_scalar(&r->tb, "train/grad_norm", s->step, s->grad_norm);
    tb_scalar(&r->tb, "train/tokens_per_s", s->step, tps);
    tb_scalar(&r->tb, "train/step_time_s", s->step, s->step_s);
    if (isfinite(mfu)) tb_scalar(&r->tb, "train/mfu", s->step, mfu);
    uint64_t mb;
    if (mem_max(r, r->mem, &mb) >= 0)
        tb_scalar(&r->tb, "memory/peak_rss_mib_max_rank", s->step, (double)mb / (1 << 20));
    if (mem_max(r, r->dev_mem, &mb) >= 0)
        tb_scalar(&r->tb, "memory/peak_device_mib_max_rank", s->step, (double)mb / (1 << 20));

    bool show = s->step == 1 || s->step % job->train.log_every == 0 || s->step == job->train.steps ||
                s->step == r->last_step || s->skipped;
    if (!show) return;
    /* the interval since the last line: its mean step time and rate */
    double int_s = r->step_s_int, int_tps = int_s > 0 ? (double)(r->tokens - r->tok_int) / int_s : NAN;
    char eta[32], mfus[16], mem[96] = "n/a", dev[48];
    eta_fmt(elapsed / (double)(s->step - r->base_step) * (double)(r->last_step - s->step), eta, sizeof eta);
    mfu_fmt(mfu_of(r, int_tps), mfus, sizeof mfus);
    mem_max_fmt(r, r->mem, mem, sizeof mem);
    if (mem_max_fmt(r, r->dev_mem, dev, sizeof dev))
        snprintf(mem + strlen(mem), sizeof mem - strlen(mem), " host, %s device", dev);
    if (!r->quiet) {
        printf("step %6lld/%lld | loss %.4f | lr %.3e | gnorm %.3f | %.1f ms/step | %.0f tok/s | "
               "MFU %s | mem %s | skipped %lld | ETA %s%s\n",
               (long long)s->step, (long long)job->train.steps, s->loss, s->lr, s->grad_norm,
               1e3 * int_s / (double)r->steps_int, int_tps, mfus, mem, (long long)s->skipped_total, eta,
               s->skipped ? " | SKIPPED: non-finite, no update" : "");
        fflush(stdout);
    }
    r->tok_int = r->tokens;
    r->steps_int = 0;
    r->step_s_int = 0;
    r->t_int = clock_now_ns();
}

void report_eval(report_t *r, int64_t step, double loss)
{
    if (!isfinite(r->best_val) || loss < r->best_val) r->best_val = loss, r->best_val_step = step;
    printf("eval  step %lld | val loss %.4f | val ppl %.2f\n", (long long)step, loss, exp(loss));
    fflush(stdout);
    plot_curve_push(&r->val, (double)step, loss);
    run_eval_metrics_write(r->metrics, step, loss);
    tb_scalar(&r->tb, "val/loss", step, loss);
    tb_scalar(&r->tb, "val/ppl", step, exp(loss));
}

/* "  what  path", and the command that uses it: cmd with %s for the path. */
static void output_line(const char *what, const char *path, const char *cmd)
{
    if (!path[0]) return;
    printf("  %-15s %s", what, path);
    if (cmd) {
        printf("  (");
        printf(cmd, path);
        printf(")");
    }
    printf("\n");
}

bt_status_t report_finish(report_t *r, bool completed)
{
    const job_t *job = r->job;
    bt_status_t st = BT_OK;
    char title[JOB_PATH_MAX + 64];
    const char *name = strrchr(job->path, '/') ? strrchr(job->path, '/') + 1 : job->path;
    if (job->metrics.plot[0] && r->loss.n > 0) {
        plot_series_t s[2] = {plot_curve_view(&r->loss, "training loss", PLOT_RGB_TRAIN, false),
                              plot_curve_view(&r->val, "validation loss", PLOT_RGB_VAL, true)};
        snprintf(title, sizeof title, "%s: loss%s", name, job->metrics.log_scale ? " (log scale)" : "");
        plot_opts_t o = {.title = title, .xlabel = "step", .ylabel = "loss (nats per token)",
                         .log_y = job->metrics.log_scale};
        if (plot_png(job->metrics.plot, s, r->val.n ? 2 : 1, &o)) st = BT_ERR_IO;
    }
    if (job->metrics.throughput_plot[0] && r->tput.n > 0) {
        plot_series_t s = plot_curve_view(&r->tput, "tokens/s of the step", PLOT_RGB_TPUT, false);
        snprintf(title, sizeof title, "%s: throughput", name);
        plot_opts_t o = {.title = title, .xlabel = "step", .ylabel = "tokens per second"};
        if (plot_png(job->metrics.throughput_plot, &s, 1, &o)) st = BT_ERR_IO;
    }
    double wall = (double)(clock_now_ns() - r->t_start) * 1e-9;
    double tps = r->train_s > 0 ? (double)r->tokens / r->train_s : NAN;
    char mfus[16];
    mfu_fmt(mfu_of(r, tps), mfus, sizeof mfus);
    printf("%s: %lld tokens in %.1f s wall (%.1f s of steps), %.0f tok/s, MFU %s",
           completed ? "done" : "stopped", (long long)r->tokens, wall, r->train_s, tps, mfus);
    if (isfinite(r->best_val))
        printf(" | best val loss %.4f (ppl %.2f) at step %lld", r->best_val, exp(r->best_val),
               (long long)r->best_val_step);
    printf("\n");
    const uint64_t *mems[2] = {r->mem, r->dev_mem};
    const char *kinds[2] = {"resident", "device"};
    for (int i = 0; i < 2; i++) {
        uint64_t mb;
        if (mem_max(r, mems[i], &mb) < 0) continue;
        printf("  peak memory (%s)%s:", kinds[i], r->n_ranks > 1 ? " per rank" : "");
        for (int k = 0; k < r->n_ranks; k++) {
            char b[32];
            base_mem_size_fmt((double)mems[i][k], b, sizeof b);
            printf("%s %s", k ? "," : "", b);
        }
        printf("\n");
    }
    if (r->run_dir) printf("  run directory   %s (job.yaml, run.json)\n", r->run_dir);
    output_line("metrics", job->metrics.file, NULL);
    output_line("loss plot", r->loss.n ? job->metrics.plot : "", NULL);
    output_line("throughput plot", r->tput.n ? job->metrics.throughput_plot : "", NULL);
    output_line("tensorboard", r->tb.path[0] ? job->metrics.tensorboard : "", "tensorboard --logdir %s");
    output_line("trace", job->trace_dir, "baton trace %s --summary");
    output_line("checkpoints", job->checkpoint.dir, NULL);
    output_line("export", completed ? job->export.dir : "", "baton generate --model %s --prompt TEXT");
    fflush(stdout);
    return st;
}

void report_close(report_t *r)
{
    if (r->metrics) fclose(r->metrics);
    r->metrics = NULL;
    tb_close(&r->tb);
    plot_curve_free(&r->loss);
    plot_curve_free(&r->val);
    plot_curve_free(&r->tput);
}
