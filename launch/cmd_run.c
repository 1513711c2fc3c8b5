/* baton run JOB.yaml [--set section.key=value ...]: single-process training
 * from a job file (docs/JOBS.md). Layouts with tp/pp/dp > 1 are parsed and
 * validated but refused here until the distributed runtime lands. */
#include "launch/cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/clock.h"
#include "base/log.h"
#include "ckpt/hf.h"
#include "launch/driver.h"
#include "launch/job.h"
#include "launch/plot.h"
#include "launch/run_mem.h"
#include "launch/run_setup.h"
#include "train/train.h"

static void run_usage(FILE *f)
{
    fprintf(f, "usage: baton run JOB.yaml [--set section.key=value ...] [--quiet]\n"
               "  trains as the job file says (docs/JOBS.md lists every field)\n");
}

/* The distributed layouts this build cannot run yet: say so instead of
 * silently training something else. */
static bool layout_supported(const job_t *job)
{
    const job_parallel_t *p = &job->parallel;
    bool local = job->n_hosts == 1 && (!strcmp(job->hosts[0], "local") ||
                                       !strcmp(job->hosts[0], "localhost") ||
                                       !strcmp(job->hosts[0], "127.0.0.1"));
    if (p->tp == 1 && p->pp == 1 && p->dp == 1 && p->virtual_stages == 1 && !p->zero1 && local)
        return true;
    fprintf(stderr,
            "baton run: %s: the layout tp=%lld pp=%lld dp=%lld virtual_stages=%lld zero1=%s "
            "hosts=%d (%s...) is valid, but this build runs single-process training only "
            "(tp=pp=dp=1 on host local); multi-process layouts are not supported yet\n",
            job->path, (long long)p->tp, (long long)p->pp, (long long)p->dp,
            (long long)p->virtual_stages, p->zero1 ? "true" : "false", job->n_hosts, job->hosts[0]);
    return false;
}

/* Hugging Face directory (config.json + model.safetensors) that
 * `baton eval --model DIR` and transformers can load, replaced as a whole
 * (ckpt_hf_save). */
static bt_status_t model_export(const model_t *m, const char *dir, int64_t step)
{
    bt_status_t st = run_parent_make(dir);
    if (st) return st;
    st = ckpt_hf_save(m, dir);
    if (st == BT_OK) log_debug("model of step %lld written to %s", (long long)step, dir);
    return st;
}

static bt_status_t eval_report(train_t *t, FILE *metrics, int64_t step,
                               plot_curve_t *val_curve, double *loss, double *ppl)
{
    bt_status_t st = train_eval(t, loss, ppl);
    if (st) return st;
    printf("eval  step %lld | val loss %.4f | val ppl %.2f\n", (long long)step, *loss, *ppl);
    fflush(stdout);
    plot_curve_push(val_curve, (double)step, *loss);
    run_eval_metrics_write(metrics, step, *loss);
    return BT_OK;
}

int cmd_run(int argc, char **argv)
{
    const char *job_path = NULL;
    const char *sets[256];
    int n_sets = 0;
    bool quiet = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            run_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--set") && i + 1 < argc && n_sets < 256) {
            sets[n_sets++] = argv[++i];
        } else if (!strncmp(argv[i], "--set=", 6) && n_sets < 256) {
            sets[n_sets++] = argv[i] + 6;
        } else if (!strcmp(argv[i], "--quiet")) {
            quiet = true;
        } else if (argv[i][0] != '-' && !job_path) {
            job_path = argv[i];
        } else {
            fprintf(stderr, "baton run: unexpected argument '%s'\n", argv[i]);
            run_usage(stderr);
            return 2;
        }
    }
    if (!job_path) {
        run_usage(stderr);
        return 2;
    }

    static job_t job;
    char err[JOB_ERR_MAX];
    if (job_load(job_path, &job, err, sizeof err)) goto bad_job;
    for (int i = 0; i < n_sets; i++)
        if (job_override(&job, sets[i], err, sizeof err)) goto bad_job;
    if (job_validate(&job, err, sizeof err)) goto bad_job;
    if (job.parallel.tp * job.parallel.pp * job.parallel.dp > 1) /* multi-process: launch/driver.h */
        return driver_run(&job, sets, n_sets, quiet);
    if (!layout_supported(&job)) return 1;
    if (job.trace_dir[0]) log_warn("trace.dir: tracing of single-process runs is not built yet; ignored");

    int rc = 1;
    int32_t *tokens = NULL, *val_tokens = NULL;
    const int32_t *val = NULL;
    int64_t n_train = 0, n_val = 0;
    model_t *m = NULL;
    train_t *t = NULL;
    FILE *metrics = NULL;
    plot_curve_t curve = {0}, val_curve = {0};
    uint32_t data_vocab = 0, val_vocab = 0;
    if (job.data.val_dir[0]) {
        if (run_stream_load(job.data.dir, &tokens, &n_train, &data_vocab)) goto out;
        if (run_stream_load(job.data.val_dir, &val_tokens, &n_val, &val_vocab)) goto out;
        val = val_tokens;
    } else {
        if (run_tokens_load(job.data.dir, job.data.split, &tokens, &n_train, &val, &n_val,
                            &data_vocab))
            goto out;
    }
    if (val_vocab > data_vocab) data_vocab = val_vocab;
    if (!job.model.hf[0] && job.model.vocab == 0) {
        if (data_vocab == 0) {
            fprintf(stderr, "baton run: %s: model.vocab: required when the data (tokens.txt) "
                            "does not state its vocabulary\n", job.path);
            goto out;
        }
        job.model.vocab = data_vocab;
    }
    if (data_vocab > (uint32_t)job.model.vocab) {
        fprintf(stderr, "baton run: %s: the data's tokenizer has %u ids but the model's vocabulary "
                        "is %lld (model.vocab or model.hf)\n", job.path, data_vocab,
                (long long)job.model.vocab);
        goto out;
    }
    if (run_mem_job_check(&job, err, sizeof err)) {
        fprintf(stderr, "baton run: %s\n", err);
        goto out;
    }
    model_place_t place;
    if (run_model_place(&job, &place) || run_model_create_part(&job, NULL, NULL, &place, &m))
        goto out;
    train_config_t tc;
    run_train_config(&job, &tc);
    if (train_create(&tc, m, tokens, n_train, val, n_val, &t)) goto out;
    if ((job.metrics.file[0] && run_parent_make(job.metrics.file)) ||
        (job.metrics.plot[0] && run_parent_make(job.metrics.plot)))
        goto out;
    if (job.metrics.file[0] && !(metrics = fopen(job.metrics.file, "we"))) {
        log_error("metrics.file: cannot create %s: %s", job.metrics.file, strerror(errno));
        goto out;
    }
    double vloss = NAN, vppl = NAN;
    printf("baton run %s: %s model, %lld params, %lld layers, hidden %lld, vocab %lld | %lld train tokens, "
           "%lld val tokens | %lld steps x %lld tokens\n",
           job.path, job.model.hf[0] ? job.model.hf : "random-init",
           (long long)model_num_params(&m->cfg), (long long)m->cfg.num_layers,
           (long long)m->cfg.hidden_size, (long long)m->cfg.vocab_size, (long long)n_train, (long long)n_val,
           (long long)tc.steps, (long long)(tc.micro_batch * tc.grad_accum * tc.seq_len));
    fflush(stdout);

    /* Fine-tuning a pretrained model: the starting validation loss, so that
     * the run shows how far it moved from it (step 0 in metrics). */
    if (job.model.hf[0] && n_val > tc.seq_len && job.train.eval_every)
        if (eval_report(t, metrics, 0, &val_curve, &vloss, &vppl)) goto out;
    uint64_t t0 = clock_now_ns();
    int64_t tokens_done = 0;
    double train_seconds = 0; /* step time only: evaluations and exports excluded */
    for (int64_t s = 0; s < tc.steps; s++) {
        train_step_info_t info;
        if (train_step(t, &info)) goto out;
        tokens_done += info.tokens;
        train_seconds += info.seconds;
        double elapsed = (double)(clock_now_ns() - t0) * 1e-9;
        double tps = (double)tokens_done / train_seconds;
        double eta = elapsed / (double)info.step * (double)(tc.steps - info.step);
        if (isfinite(info.loss)) plot_curve_push(&curve, (double)info.step, info.loss);
        run_step_report_t rep = {.step = info.step, .steps = tc.steps, .tokens = tokens_done,
                                 .loss = info.loss, .lr = info.lr, .grad_norm = info.grad_norm,
                                 .tokens_per_s = tps, .elapsed_s = elapsed, .eta_s = eta,
                                 .skipped = info.skipped, .skipped_total = info.skipped_total};
        run_metrics_write(metrics, &rep);
        if (!quiet && (info.step == 1 || info.step % job.train.log_every == 0 ||
                       info.step == tc.steps || info.skipped))
            run_progress_print(&rep);
        if (n_val > tc.seq_len && job.train.eval_every && info.step % job.train.eval_every == 0 &&
            info.step != tc.steps)
            if (eval_report(t, metrics, info.step, &val_curve, &vloss, &vppl)) goto out;
        if (job.checkpoint.dir[0] && job.checkpoint.every && info.step % job.checkpoint.every == 0 &&
            info.step != tc.steps)
            if (model_export(m, job.checkpoint.dir, info.step)) goto out;
    }
    if (n_val > tc.seq_len) {
        if (eval_report(t, metrics, tc.steps, &val_curve, &vloss, &vppl)) goto out;
        printf("final validation loss %.4f, perplexity %.2f\n", vloss, vppl);
    } else {
        printf("no validation split (data.split = %g): no validation perplexity\n", job.data.split);
    }
    if (job.checkpoint.dir[0]) {
        if (model_export(m, job.checkpoint.dir, tc.steps)) goto out;
        printf("model written to %s (HF format)\n", job.checkpoint.dir);
    }
    if (job.metrics.plot[0]) {
        plot_series_t tr = plot_curve_view(&curve), va = plot_curve_view(&val_curve);
        if (plot_loss_png(job.metrics.plot, &tr, &va, NULL)) goto out;
        printf("loss curve written to %s\n", job.metrics.plot);
    }
    rc = 0;
out:
    if (metrics) fclose(metrics);
    plot_curve_free(&curve);
    plot_curve_free(&val_curve);
    train_destroy(t);
    model_destroy(m);
    free(tokens);
    free(val_tokens);
    return rc;
bad_job:
    fprintf(stderr, "baton run: %s\n", err);
    return 1;
}
