/* baton run JOB.yaml [--set section.key=value ...]: training from a job file
 * (docs/JOBS.md), in its own run directory (launch/rundir.h). tp = pp = dp =
 * 1 trains in this process; a layout goes to the driver (launch/driver.h). */
#include "launch/cli.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "ckpt/hf.h"
#include "kernels/device.h"
#include "launch/driver.h"
#include "launch/job.h"
#include "launch/report.h"
#include "launch/restart.h"
#include "launch/rundir.h"
#include "ckpt/store.h"
#include "launch/run_ckpt.h"
#include "launch/run_mem.h"
#include "launch/run_setup.h"
#include "launch/split.h"
#include "train/ckpt_state.h"
#include "train/train.h"

static void run_usage(FILE *f)
{
    fprintf(f, "usage: baton run JOB.yaml [--set section.key=value ...] [--resume [latest|DIR]] "
               "[--quiet]\n"
               "  trains as the job file says (docs/JOBS.md lists every field), in a directory of\n"
               "  its own: runs/JOB/RUN_ID/ (runs/JOB/latest points at the newest)\n"
               "  --set:    override a field of the job file (section.key=value)\n"
               "  --resume: continue from a checkpoint (docs/CHECKPOINTS.md): `latest` (the default)\n"
               "            is the newest under checkpoint.dir; DIR a step directory or a root\n"
               "  --quiet:  no progress lines and no log lines below warnings\n");
}

/* What one process cannot be: virtual stages and ZeRO-1 shard over ranks,
 * and processes on other hosts need a launcher this build lacks. */
static bool layout_supported(const job_t *job)
{
    const job_parallel_t *p = &job->parallel;
    bool local = job->n_hosts == 1 && (!strcmp(job->hosts[0], "local") ||
                                       !strcmp(job->hosts[0], "localhost") ||
                                       !strcmp(job->hosts[0], "127.0.0.1"));
    if (p->virtual_stages == 1 && !p->zero1 && local) return true;
    fprintf(stderr,
            "baton run: %s: tp = pp = dp = 1 is one process, which has no %s; set parallel.pp "
            "or parallel.dp above 1, or drop it\n", job->path,
            p->virtual_stages != 1 ? "virtual stages (parallel.virtual_stages)"
            : p->zero1 ? "optimizer state to shard (parallel.zero1)" : "remote hosts (hosts)");
    return false;
}

/* The single-process run's checkpoint writer: a thread per save, so that
 * training goes on while the files are written; one save at a time. */
typedef struct {
    pthread_t       th;
    bool            running;
    bt_status_t     st;
    ckpt_snapshot_t snap;
    char            root[JOB_PATH_MAX];
    int64_t         step, keep;
    char           *meta;
    double          seconds;
    char            err[768];
} saver_t;

static void *saver_main(void *arg)
{
    saver_t *w = arg;
    uint64_t t0 = clock_now_ns();
    char file[64];
    run_ckpt_shard_name(0, file, sizeof file);
    w->st = run_ckpt_save_one(w->root, w->step, file, w->snap.puts, w->snap.n, w->meta, w->keep,
                              w->err, sizeof w->err);
    w->seconds = (double)(clock_now_ns() - t0) * 1e-9;
    return NULL;
}

/* Waits for the save in flight; says how it went. */
static bt_status_t saver_join(saver_t *w)
{
    if (!w->running) return BT_OK;
    pthread_join(w->th, NULL);
    w->running = false;
    double mb = (double)w->snap.bytes / 1e6;
    ckpt_snapshot_free(&w->snap);
    free(w->meta);
    w->meta = NULL;
    if (w->st) {
        log_error("checkpoint of step %lld: %s", (long long)w->step, w->err);
        return w->st;
    }
    log_info("checkpoint of step %lld committed under %s (%.1f MB in %.2f s)", (long long)w->step,
             w->root, mb, w->seconds);
    return BT_OK;
}

static bt_status_t saver_start(saver_t *w, const job_t *job, const char *const *sets, int n_sets,
                               const model_t *m, train_t *t, const ckpt_items_t *items)
{
    bt_status_t st = saver_join(w);
    if (st) return st;
    train_position_t pos;
    train_position(t, &pos);
    int64_t rows = job->train.grad_accum * job->train.micro_batch;
    w->meta = run_ckpt_meta_json(job, sets, n_sets, &m->cfg, &pos, rows);
    if (!w->meta) return BT_ERR_NOMEM;
    if ((st = ckpt_snapshot_take(items, &w->snap))) return st; /* the only wait of training */
    if ((st = run_ckpt_root(job, 0, w->root, sizeof w->root))) return st;
    w->step = pos.step;
    w->keep = job->checkpoint.keep;
    w->st = BT_OK;
    if (pthread_create(&w->th, NULL, saver_main, w)) {
        ckpt_snapshot_free(&w->snap);
        return BT_ERR_NOMEM;
    }
    w->running = true;
    return BT_OK;
}

/* --resume DIR names a checkpoint that is not there (or holds none): said
 * once, with the directory looked in (absolute), before anything starts. */
static bool resume_check(const char *what)
{
    char dir[CKPT_PATH_MAX], err[1024], cwd[JOB_PATH_MAX];
    if (run_ckpt_find(what, NULL, dir, sizeof dir, err, sizeof err) == BT_OK) return false;
    if (what[0] != '/' && getcwd(cwd, sizeof cwd))
        fprintf(stderr, "baton run: --resume: %s (looked at %s/%s)\n", err, cwd, what);
    else
        fprintf(stderr, "baton run: --resume: %s\n", err);
    return true;
}

/* --resume: parameters, optimizer state and position from the checkpoint. */
static bt_status_t resume_load(const job_t *job, const char *what, model_t *m, train_t *t,
                               const ckpt_items_t *items, train_position_t *pos)
{
    char root[JOB_PATH_MAX] = "", dir[CKPT_PATH_MAX], err[1024];
    if (job->checkpoint.dir[0] && run_ckpt_root(job, 0, root, sizeof root)) return BT_ERR_INVALID;
    bt_status_t st = run_ckpt_find(what, root, dir, sizeof dir, err, sizeof err);
    const char *dirs[1] = {dir};
    run_ckpt_meta_t meta;
    if (!st) st = run_ckpt_restore(dirs, 1, NULL, NULL, job, &m->cfg, root, items, &meta, NULL, err,
                                   sizeof err);
    if (st) {
        fprintf(stderr, "baton run: --resume: %s\n", err);
        return st;
    }
    train_resume(t, &meta.pos);
    *pos = meta.pos;
    int64_t rows = job->train.grad_accum * job->train.micro_batch;
    printf("resumed from %s: step %lld, %lld samples consumed%s\n", dir, (long long)meta.pos.step,
           (long long)meta.pos.samples,
           meta.rows_per_step != rows ? " (the global batch changed: the data goes on from there)" : "");
    return BT_OK;
}

static bt_status_t eval_report(train_t *t, report_t *rep, int64_t step, double *loss)
{
    double ppl;
    bt_status_t st = train_eval(t, loss, &ppl);
    if (st == BT_OK) report_eval(rep, step, *loss);
    return st;
}

int cmd_run(int argc, char **argv)
{
    const char *job_path = NULL;
    const char *sets[256];
    int n_sets = 0;
    bool quiet = false, resume = false;
    const char *resume_what = NULL;
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
        } else if (!strcmp(argv[i], "--resume")) {
            /* its value, when given, is `latest` or a checkpoint directory:
             * the next word unless it is an option, or the job file (an
             * existing file while no job file came yet); a directory that
             * does not exist is taken as the value, to be reported missing */
            resume = true;
            struct stat sb;
            const char *next = i + 1 < argc ? argv[i + 1] : NULL;
            bool is_file = next && stat(next, &sb) == 0 && !S_ISDIR(sb.st_mode);
            if (next && next[0] != '-' && (!strcmp(next, "latest") || job_path || !is_file))
                resume_what = argv[++i];
        } else if (!strncmp(argv[i], "--resume=", 9)) {
            resume = true;
            resume_what = argv[i] + 9;
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
    if (job_validate(&job, err, sizeof err) || run_split_resolve(&job, err, sizeof err)) goto bad_job;
    if (resume && resume_what && strcmp(resume_what, "latest") && resume_check(resume_what))
        return 1; /* before a run directory or a process exists */
    /* --quiet: nothing but warnings and errors from here on, in this process
     * and in the workers (unless BATON_LOG says otherwise) */
    if (quiet && !getenv("BATON_LOG")) {
        log_set_level(LOG_WARN);
        setenv("BATON_LOG", "warn", 1);
    }
    /* attention: the CUDA attention path for this process and every worker it
     * starts (they inherit the environment; ssh forwards BATON_*) */
    const char *attn = job_attention_env(job.attention);
    if (attn) {
        const char *was = getenv("BATON_CUDA_ATTN");
        if (was && strcmp(was, attn))
            log_warn("attention: %s (the job's) replaces BATON_CUDA_ATTN=%s", attn, was);
        setenv("BATON_CUDA_ATTN", attn, 1);
    }
    if (job.parallel.tp * job.parallel.cp * job.parallel.pp * job.parallel.dp == 1 && !layout_supported(&job)) return 1;
    if (job.export.dir[0] && !run_export_tokenizer(&job)[0])
        log_warn("export.tokenizer: not set and model.hf has no tokenizer.json: the export "
                 "will hold no tokenizer (baton generate and eval --text need one)");
    static rundir_t rd;
    {
        char *full[258];
        int n = 0;
        full[n++] = "baton";
        for (int i = 0; i < argc && n < 258; i++) full[n++] = argv[i];
        if (rundir_create(&job, n, full, sets, n_sets, &rd, err, sizeof err)) goto bad_job;
    }
    if (job.parallel.tp * job.parallel.cp * job.parallel.pp * job.parallel.dp > 1) /* multi-process: launch/driver.h */
        return (job.restart.max ? restart_run : driver_run)(&job, sets, n_sets, quiet,
                                                            resume ? (resume_what ? resume_what : "latest") : NULL,
                                                            &rd);
    if (job.trace_dir[0]) log_warn("trace.dir: tracing of single-process runs is not built yet; ignored");

    int rc = 1;
    static saver_t saver;
    static report_t rep;
    ckpt_items_t items = {0};
    train_position_t pos = {0};
    int32_t *tokens = NULL, *val_tokens = NULL;
    const int32_t *val = NULL;
    int64_t n_train = 0, n_val = 0;
    model_t *m = NULL;
    double *load = NULL; /* a step's routed-expert load (metrics) */
    train_t *t = NULL;
    bool rep_open = false;
    uint32_t data_vocab = 0, val_vocab = 0;
    if (job.data.val_dir[0]) {
        if (run_stream_load(job.data.dir, &tokens, &n_train, &data_vocab)) {
            run_data_error("run", &job, "data.dir");
            goto out;
        }
        if (run_stream_load(job.data.val_dir, &val_tokens, &n_val, &val_vocab)) {
            run_data_error("run", &job, "data.val_dir");
            goto out;
        }
        val = val_tokens;
    } else if (run_tokens_load(job.data.dir, job.data.split, &tokens, &n_train, &val, &n_val,
                               &data_vocab)) {
        run_data_error("run", &job, "data.dir");
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
    if ((job.checkpoint.dir[0] || resume) &&
        (ckpt_items_params(&items, m, true, -1) ||
         ckpt_items_optim(&items, m, train_optimizer(t), true, -1)))
        goto out;
    int64_t tokens_before = 0;
    if (resume && (resume_load(&job, resume_what, m, t, &items, &pos) ||
                   run_metrics_trim(job.metrics.file, pos.step, &tokens_before)))
        goto out;
    if (report_open(&rep, &job, &m->cfg, 1, resume, quiet, rd.id, rd.path)) goto out;
    rep_open = true;
    if (!device_is_host(place.dev)) report_peak_measure(&rep, place.dev, place.param_dtype);
    rep.base_step = pos.step;
    rep.tokens_before = tokens_before;
    double vloss = NAN;
    int64_t last = rep.last_step;
    char layout[128];
    snprintf(layout, sizeof layout, "1 process (tp=1 pp=1 dp=1), %lld microbatch%s of %lld per step",
             (long long)tc.grad_accum, tc.grad_accum == 1 ? "" : "es", (long long)tc.micro_batch);
    report_header(&rep, &m->cfg, model_num_params(&m->cfg), layout,
                  tc.micro_batch * tc.grad_accum * tc.seq_len, n_train, n_val);

    /* Fine-tuning a pretrained model: the starting validation loss, so that
     * the run shows how far it moved from it (step 0 in metrics). */
    if (job.model.hf[0] && n_val > tc.seq_len && job.train.eval_every && !resume)
        if (eval_report(t, &rep, 0, &vloss)) goto out;
    for (int64_t s = pos.step; s < last; s++) {
        train_step_info_t info;
        if (train_step(t, &info)) goto out;
        long long rss = base_mem_peak_rss();
        uint64_t mem = rss > 0 ? (uint64_t)rss : 0, dev_mem = kern_mem_peak(place.dev);
        report_step_t rs = {.step = info.step, .tokens = info.tokens, .loss = info.loss, .lr = info.lr,
                            .grad_norm = info.grad_norm, .step_s = info.seconds, .skipped = info.skipped,
                            .skipped_total = info.skipped_total, .mem = &mem,
                            .dev_mem = &dev_mem};
        if (m->n_moe && (load || (load = malloc((size_t)m->n_moe * (size_t)(m->cfg.moe.n_experts + 1) *
                                                 sizeof *load)))) {
            rs.load = load;
            rs.load_rows = model_moe_load_take(m, load);
            rs.load_cols = (int)m->cfg.moe.n_experts + 1;
            if (model_moe_balance(m, load)) goto out;
            rs.moe_dropped = model_moe_dropped_take(m);
            rs.has_dropped = rs.moe_dropped >= 0;
        }
        report_step(&rep, &rs);
        if (n_val > tc.seq_len && job.train.eval_every && info.step % job.train.eval_every == 0 &&
            info.step != tc.steps)
            if (eval_report(t, &rep, info.step, &vloss)) goto out;
        if (job.export.dir[0] && job.export.every && info.step % job.export.every == 0 &&
            info.step != tc.steps)
            if (run_model_export(m, &job)) goto out;
        if (job.checkpoint.dir[0] &&
            (info.step == last || (job.checkpoint.every && info.step % job.checkpoint.every == 0)))
            if (saver_start(&saver, &job, sets, n_sets, m, t, &items)) goto out;
    }
    if (saver_join(&saver)) goto out;
    if (job.checkpoint.dir[0]) printf("checkpoint of step %lld written under %s\n", (long long)last, saver.root);
    if (last < tc.steps) { /* stopped early, as asked: the checkpoint is what goes on */
        printf("stopped after step %lld of %lld (train.stop_after)\n", (long long)last,
               (long long)tc.steps);
        rc = report_finish(&rep, false) ? 1 : 0;
        goto out;
    }
    if (n_val > tc.seq_len) {
        if (eval_report(t, &rep, tc.steps, &vloss)) goto out;
        printf("final validation loss %.4f, perplexity %.2f\n", vloss, exp(vloss));
    } else {
        printf("no validation split (data.split = %g): no validation perplexity\n", job.data.split);
    }
    if (job.export.dir[0]) {
        if (run_model_export(m, &job)) goto out;
        printf("model written to %s (HF format%s)\n", job.export.dir,
               run_export_tokenizer(&job)[0] ? ", with its tokenizer" : ", no tokenizer");
    }
    if (report_finish(&rep, true)) goto out;
    rc = 0;
out:
    if (saver_join(&saver)) rc = 1;
    if (rep_open) report_close(&rep);
    ckpt_items_free(&items);
    free(load);
    train_destroy(t);
    model_destroy(m);
    free(tokens);
    free(val_tokens);
    return rc;
bad_job:
    fprintf(stderr, "baton run: %s\n", err);
    return 1;
}
