#include "launch/driver.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "actors/router.h"
#include "trace/trace.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/file.h"
#include "ckpt/hf.h"
#include "ckpt/native.h"
#include "ckpt/store.h"
#include "launch/run_ckpt.h"
#include "launch/graph.h"
#include "launch/hang.h"
#include "launch/jobdir.h"
#include "launch/report.h"
#include "launch/run_mem.h"
#include "launch/run_setup.h"
#include "launch/spawn.h"
#include "launch/slurm.h"
#include "launch/ssh.h"
#include "launch/worker.h"
#include "train/stage_actor.h"

typedef enum {
    DRV_RENDEZVOUS = 0, /* waiting for every rank.R file */
    DRV_READY_WAIT,     /* book written, waiting for READY from every rank */
    DRV_RUNNING,
    DRV_EVAL,           /* forward-only pass over the evaluation rows */
    DRV_EXPORTING,      /* EXPORT sent, collecting every parameter (CKPT_SHARD) */
    DRV_SAVING,         /* the saver thread writes export.dir */
    DRV_CKPT_WAIT,      /* a checkpoint is due (or the run ends) while one is being written */
    DRV_QUIESCING,      /* STOP(IN_PROGRESS) sent, waiting for QUIESCED from every rank */
    DRV_DONE,
    DRV_FAILING,
} drv_phase_t;

struct held_fetch {
    actor_msg_t       *m;
    struct held_fetch *next;
};

typedef struct {
    actor_t        a; /* first */
    actor_router_t *rt;
    const job_t    *job;
    const graph_t  *g;
    const char     *run_dir;
    spawn_group_t  *procs;
    bool            quiet;
    drv_phase_t     phase;
    int             world;
    uint64_t       *last_seen;  /* [world] ns of the last message of each rank */
    int             n_ready, n_metrics, n_exported, n_quiesced;
    /* routed experts: this step's tokens per expert, rows [layer, expert 0..E-1]
     * per layer of the model (load_seen: some rank reported the layer) */
    double         *load;
    bool           *load_seen;
    double         *load_rows;  /* the seen rows, in layer order, for the report */
    /* with a capacity factor: this step's dropped choices, the sum of the
     * ranks' "moe_dropped" (has_dropped: some rank sent one) */
    int64_t         dropped;
    bool            has_dropped;
    uint64_t        t_quiesce0;
    int64_t         step;       /* step running (1-based) */
    double          loss_sum, scored, grad_norm, lr;
    double         *rank_loss;  /* [world] this step's loss sum of each rank: summed in rank
                                 * order, so that the step's loss does not depend on which
                                 * rank's METRICS came first */
    int64_t         skip_run, skipped; /* non-finite steps: in a row now, in all */
    uint64_t        t0, t_step0, t_phase0;
    uint64_t        beat_ns;     /* the last lifeline beat to the agents (spawn_beat) */
    bool            has_eval;   /* evaluation rows were written for the workers */
    bool            eval_only;  /* one evaluation, no training (baton eval --layout) */
    double          eval_loss;  /* result of the last evaluation */
    int64_t         eval_tokens;
    report_t        rep;        /* progress, metrics, pictures, summary (launch/report.h) */
    bool            rep_open;
    uint64_t       *mem;        /* [world] each rank's peak resident bytes, from METRICS */
    clock_every_t   eval_every; /* progress lines of a long evaluation pass */
    uint64_t       *dev_mem;    /* [world] each rank's peak device bytes (0: none), from METRICS */
    model_t        *full;       /* export target */
    bool           *received;   /* [full->n_params + its selection biases] */
    actor_worker_t *saver;      /* writes the exports, off the driver's loop */
    int64_t         saved_step; /* step of the last export written (0: none) */
    /* native checkpoints (train/ckpt_writer.h): one save in flight at a time */
    const char *const *sets;
    int             n_sets;
    int64_t         last_step;   /* train.stop_after, else train.steps */
    int64_t         base_step, base_samples; /* resumed from (0, 0: a fresh run) */
    int64_t         ck_step;     /* save in flight (0: none) */
    int64_t         ck_saved;    /* step of the last save started */
    int             ck_written, ck_commits, ck_committed;
    bool           *ck_wrote;    /* [world] */
    char          **ck_root;     /* [world] the root each writer reported */
    ckpt_index_t    ck_idx;
    uint64_t        ck_t0;
    ckpt_reader_t  *serve;       /* --resume: the checkpoint, for the fetches it serves */
    bool           *ck_up;       /* [world] the rank's writer said CKPT_CTL UP */
    bool           *ready;       /* [world] the rank said READY (heartbeats are due from then) */
    struct held_fetch *fetch_held; /* fetches for writers not up yet (their messages kept) */
    int64_t         fetch_served, fetch_forwarded; /* requests */
    actor_timer_t   watch, diag;
    bt_status_t     fail_status;
    int             fail_rank;
    int             link_down;   /* the first rank whose link to the driver went down, -1: none */
    int             fail_peer;   /* the peer of the first link failure a rank reported, -1: none */
    char            fail_text[512];
    double          hb_timeout_s, step_timeout_s, start_timeout_s;
    hang_t          hang;        /* each rank's last "wait" text (launch/hang.h) */
} driver_t;

static double env_seconds(const char *name, double dflt)
{
    const char *v = getenv(name);
    double x = v ? atof(v) : 0;
    return x > 0 ? x : dflt;
}

static void rank_describe(driver_t *d, int r, char *buf, size_t cap)
{
    graph_coord_t c = graph_coord(d->g, r);
    snprintf(buf, cap, "rank %d (pid %ld, host %s, tp=%d dp=%d pp=%d)", r,
             d->procs->procs ? (long)d->procs->procs[r].pid : -1L,
             d->procs->procs && d->procs->procs[r].host ? d->procs->procs[r].host : d->job->hosts[0],
             c.tp, c.dp, c.pp);
}

static void send_all(driver_t *d, uint32_t type, uint32_t state, int64_t step, bt_status_t status,
                     const char *why)
{
    for (int r = 0; r < d->world; r++) {
        if (d->procs->procs && d->procs->procs[r].exited) continue;
        actor_msg_t *m = actor_msg_new(type);
        if (!m) return;
        if (type == MSG_STOP) {
            m->body.stop.status = status;
            snprintf(m->body.stop.why, sizeof m->body.stop.why, "%s", why ? why : "");
        } else {
            m->body.heartbeat = (msg_heartbeat_t){.t_ns = clock_now_ns(), .rank = (uint32_t)d->world,
                                                  .state = state, .step = step};
        }
        m->env.step = step;
        actor_send(&d->a, ACTOR_ADDR(r, GRAPH_SLOT_STAGE), m);
    }
}

static void hang_describe(void *arg, int r, char *buf, size_t cap) { rank_describe(arg, r, buf, cap); }

/* The last job failure of this process (driver_last_failure) and where
 * its verdict and hang report are also written (driver_attempt_log). */
static struct {
    bool        failed;
    bt_status_t status;
    char        text[1024];
    int         rank;       /* the rank blamed, -1: none */
    int         host;       /* the host ssh could not start on, -1: none */
    FILE       *log;
} drv_last;

void driver_attempt_log(FILE *f) { drv_last.log = f; }

bool driver_last_failure(bt_status_t *status, char *text, size_t cap)
{
    if (!drv_last.failed) return false;
    *status = drv_last.status;
    snprintf(text, cap, "%s", drv_last.text);
    return true;
}

void driver_last_blame(int *rank, int *host, char *text, size_t cap)
{
    *rank = drv_last.failed ? drv_last.rank : -1;
    *host = drv_last.host;
    if (drv_last.host >= 0) snprintf(text, cap, "%s", drv_last.text);
}

/* The verdict comes a moment after the first symptom: a killed process
 * closes its sockets just before it becomes reapable, and its peers may
 * report the broken links first. Naming the dead process wins. */
static void diag_fire(actor_t *self, actor_timer_t *t)
{
    (void)t;
    driver_t *d = (driver_t *)self;
    spawn_poll(d->procs);
    char who[192], how[96], text[1024];
    int dead = -1;
    for (int r = 0; r < d->world; r++)
        if (d->procs->procs[r].exited) { dead = r; break; }
    if (dead >= 0) {
        rank_describe(d, dead, who, sizeof who);
        spawn_describe(&d->procs->procs[dead], how, sizeof how);
        if (d->step)
            snprintf(text, sizeof text, "%s %s during step %lld (first symptom: %s)", who, how,
                     (long long)d->step, d->fail_text);
        else
            snprintf(text, sizeof text, "%s %s during start-up (first symptom: %s)", who, how,
                     d->fail_text);
    } else if (d->fail_rank >= 0) {
        rank_describe(d, d->fail_rank, who, sizeof who);
        snprintf(text, sizeof text, "%s: %s", who, d->fail_text);
    } else {
        snprintf(text, sizeof text, "%s", d->fail_text);
    }
    log_error("job failed: %s; stopping every process", text);
    drv_last.failed = true;
    drv_last.status = d->fail_status ? d->fail_status : BT_ERR_CANCELED;
    /* whom a restart blames (launch/restart.h): the dead process; else, on
     * other hosts (their deaths are seen as broken links), the rank whose
     * link to the driver broke, or the peer of a link a rank reported
     * broken (the reporter is alive) */
    drv_last.rank = dead >= 0 ? dead : d->link_down >= 0 ? d->link_down : d->fail_peer >= 0 ? d->fail_peer
                                                                                          : d->fail_rank;
    snprintf(drv_last.text, sizeof drv_last.text, "%s", text);
    if (drv_last.log) fprintf(drv_last.log, "job failed: %s\n", text);
    /* no process died: something waits; say what each rank waited in */
    if (dead < 0 && d->step && (d->fail_status == BT_ERR_TIMEOUT || d->fail_status == BT_ERR_PEER_TIMEOUT)) {
        hang_report(&d->hang, d->g, hang_describe, d, clock_now_ns(), stderr);
        /* a restart blames the host of the missing ranks, when they share one */
        int miss[GRAPH_MAX_WORLD], n_miss = drv_last.rank < 0 ? hang_missing(&d->hang, d->g, miss, GRAPH_MAX_WORLD) : 0;
        int per = d->world / (d->job->n_hosts > 0 ? d->job->n_hosts : 1);
        bool one_host = n_miss > 0 && per > 0;
        for (int i = 1; i < n_miss && one_host; i++) one_host = miss[i] / per == miss[0] / per;
        if (one_host) drv_last.rank = miss[0];
        if (drv_last.log) hang_report(&d->hang, d->g, hang_describe, d, clock_now_ns(), drv_last.log);
    }
    if (drv_last.log) fflush(drv_last.log);
    send_all(d, MSG_STOP, 0, d->step, d->fail_status, text);
    actor_router_stop_request(d->rt, d->fail_status ? d->fail_status : BT_ERR_CANCELED);
}

static void fail(driver_t *d, bt_status_t st, int rank, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail(driver_t *d, bt_status_t st, int rank, const char *fmt, ...)
{
    if (d->phase == DRV_FAILING || d->phase == DRV_DONE) return;
    d->phase = DRV_FAILING;
    d->fail_status = st;
    d->fail_rank = rank;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->fail_text, sizeof d->fail_text, fmt, ap);
    va_end(ap);
    actor_timer_start(&d->a, &d->diag, 0.25, 0, diag_fire);
}

/* After every print: SIGPIPE is ignored (driver_main), so a standard output
 * nobody reads any more (`baton run JOB | head -1`) shows as a failed
 * write. The job then stops as for a signal: every worker is stopped and
 * reaped and the run directory removed. */
static void drv_stdout_check(driver_t *d)
{
    int err = errno; /* callers clear errno before their prints */
    if (fflush(stdout)) err = errno;
    else if (!ferror(stdout)) return;
    fail(d, BT_ERR_CANCELED, -1, "cannot write to standard output (%s); nobody reads the progress",
         err ? strerror(err) : "an earlier write failed");
}

static bool file_exists(const char *dir, const char *name)
{
    char p[CKPT_PATH_MAX + 256];
    snprintf(p, sizeof p, "%.4095s/%.255s", dir, name);
    return access(p, F_OK) == 0;
}

/* All rank.R files are there: concatenate them into the book, each line
 * prefixed with its rank (lines of any length: ucx addresses are long). */
static bt_status_t book_write(driver_t *d)
{
    char tmp[1024], dst[1024];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", d->run_dir, RUN_FILE_BOOK);
    snprintf(dst, sizeof dst, "%s/%s", d->run_dir, RUN_FILE_BOOK);
    FILE *out = fopen(tmp, "we");
    if (!out) {
        log_error("driver: cannot write %s: %s", tmp, strerror(errno));
        return BT_ERR_IO;
    }
    char *line = NULL;
    size_t line_cap = 0;
    for (int r = 0; r < d->world; r++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/rank.%d", d->run_dir, r);
        FILE *in = fopen(p, "re");
        if (!in) {
            free(line);
            fclose(out);
            log_error("driver: cannot read %s: %s", p, strerror(errno));
            return BT_ERR_IO;
        }
        ssize_t got;
        while ((got = getline(&line, &line_cap, in)) >= 0)
            fprintf(out, "%d %s%s", r, line, got > 0 && line[got - 1] == '\n' ? "" : "\n");
        fclose(in);
    }
    free(line);
    if (fclose(out) || rename(tmp, dst)) {
        log_error("driver: cannot write %s: %s", dst, strerror(errno));
        return BT_ERR_IO;
    }
    return BT_OK;
}

static void finish(driver_t *d);

static void watch_fire(actor_t *self, actor_timer_t *t)
{
    (void)t;
    driver_t *d = (driver_t *)self;
    if (d->phase == DRV_FAILING || d->phase == DRV_DONE) return;
    int r = spawn_poll(d->procs);
    if (r >= 0) {
        fail(d, BT_ERR_PEER_CLOSED, r, "the process ended unexpectedly");
        return;
    }
    uint64_t now = clock_now_ns();
    if ((double)(now - d->beat_ns) * 1e-9 >= d->job->launch.heartbeat_interval) {
        d->beat_ns = now;
        spawn_beat(d->procs);
    }
    if (d->phase == DRV_RENDEZVOUS) {
        int have = 0;
        for (int k = 0; k < d->world; k++) {
            char name[32];
            snprintf(name, sizeof name, "rank.%d", k);
            have += file_exists(d->run_dir, name);
        }
        if (have == d->world) {
            if (book_write(d)) {
                fail(d, BT_ERR_IO, -1, "cannot write the address book");
                return;
            }
            d->phase = DRV_READY_WAIT;
        }
    }
    if ((d->phase == DRV_RENDEZVOUS || d->phase == DRV_READY_WAIT) &&
        (double)(now - d->t_phase0) * 1e-9 > d->start_timeout_s) {
        fail(d, BT_ERR_TIMEOUT, -1, "start-up took longer than %.0f s (%d of %d ranks ready)",
             d->start_timeout_s, d->n_ready, d->world);
        return;
    }
    if (d->phase >= DRV_READY_WAIT) {
        for (int k = 0; k < d->world; k++) {
            /* before READY a rank may be loading or restoring (its stage
             * is not up to send heartbeats): the start-up timeout covers it */
            if (!d->last_seen[k] || !d->ready[k]) continue;
            double silent = (double)(now - d->last_seen[k]) * 1e-9;
            if (silent > d->hb_timeout_s) {
                /* every rank of its host silent too: say it is the host or its link */
                const char *h = d->procs->procs[k].host;
                int on = 0, quiet = 0;
                for (int j = 0; h && j < d->procs->n; j++) {
                    const char *hj = d->procs->procs[j].host;
                    if (!hj || strcmp(hj, h)) continue;
                    on++;
                    quiet += !d->last_seen[j] || (double)(now - d->last_seen[j]) * 1e-9 > d->hb_timeout_s / 2;
                }
                if (on > 1 && quiet == on)
                    fail(d, BT_ERR_PEER_TIMEOUT, k, "no heartbeat for %.1f s, nor from the other %d rank(s) of "
                         "host %s: that host, or the link between it and this driver, is down", silent, on - 1, h);
                else
                    fail(d, BT_ERR_PEER_TIMEOUT, k, "no heartbeat for %.1f s", silent);
                return;
            }
        }
    }
    if (d->phase == DRV_QUIESCING && (double)(now - d->t_quiesce0) * 1e-9 > 5.0) {
        log_warn("driver: %d of %d ranks acknowledged the end of the job within 5 s; stopping all",
                 d->n_quiesced, d->world);
        finish(d);
        return;
    }
    if (d->ck_step && (double)(now - d->ck_t0) * 1e-9 > d->step_timeout_s) {
        char missing[256] = "";
        size_t at = 0;
        for (int k = 0; k < d->world && at + 8 < sizeof missing; k++)
            if (!d->ck_wrote[k]) at += (size_t)snprintf(missing + at, sizeof missing - at, "%s%d",
                                                        at ? ", " : "", k);
        fail(d, BT_ERR_TIMEOUT, -1, "the checkpoint of step %lld did not finish within %.0f s "
             "(BATON_STEP_TIMEOUT): %s", (long long)d->ck_step, d->step_timeout_s,
             at ? "no file written by rank(s) " : "written, but a commit did not come back");
        if (at) snprintf(d->fail_text + strlen(d->fail_text), sizeof d->fail_text - strlen(d->fail_text),
                         "%s", missing);
        return;
    }
    double el;
    if (d->phase == DRV_EVAL && !d->rep.quiet && clock_every_due(&d->eval_every, &el)) {
        printf("eval  after step %lld: %.0f s so far, %d of %d ranks done\n", (long long)d->step, el,
               d->n_metrics, d->world);
        fflush(stdout);
    }
    if ((d->phase == DRV_RUNNING || d->phase == DRV_EVAL) &&
        (double)(now - d->t_step0) * 1e-9 > d->step_timeout_s)
        fail(d, BT_ERR_TIMEOUT, -1, "step %lld did not finish within %.0f s (step watchdog, "
             "BATON_STEP_TIMEOUT); %d of %d ranks reported", (long long)d->step, d->step_timeout_s,
             d->n_metrics, d->world);
}

static void step_start(driver_t *d, int64_t step)
{
    d->step = step;
    d->n_metrics = 0;
    d->dropped = 0;
    d->has_dropped = false;
    if (d->load) {
        int64_t L = d->job->model.layers, E = d->job->model.n_experts;
        memset(d->load, 0, (size_t)(L * (E + 1)) * sizeof *d->load);
        memset(d->load_seen, 0, (size_t)L * sizeof *d->load_seen);
    }
    d->loss_sum = 0;
    d->scored = 0;
    d->t_step0 = clock_now_ns();
    send_all(d, MSG_HEARTBEAT, STAGE_CMD_STEP, step, BT_OK, NULL);
}

static void eval_start(driver_t *d)
{
    d->phase = DRV_EVAL;
    d->n_metrics = 0;
    d->loss_sum = 0;
    d->scored = 0;
    d->t_step0 = clock_now_ns();
    clock_every_start(&d->eval_every);
    send_all(d, MSG_HEARTBEAT, STAGE_CMD_EVAL, d->step, BT_OK, NULL);
}

static void done(driver_t *d);

/* EXPORT: the ranks of data-parallel replica 0 (TP: gathered first) send
 * every parameter of the model as it is after step d->step. */
static void export_start(driver_t *d)
{
    d->phase = DRV_EXPORTING;
    d->n_exported = 0;
    memset(d->received, 0, (size_t)(d->full->n_params + model_moe_bias_views(d->full, NULL, NULL)) *
                               sizeof *d->received);
    send_all(d, MSG_HEARTBEAT, STAGE_CMD_EXPORT, d->step, BT_OK, NULL);
}

/* SAVE: every stage copies its state after step d->step to the host and
 * hands it to its writer; the writers report WRITTEN (drv_on_ckpt). */
static void next_after(driver_t *d, bool evaluated);

static void ckpt_save_start(driver_t *d)
{
    d->ck_step = d->ck_saved = d->step;
    d->ck_written = d->ck_commits = d->ck_committed = 0;
    d->ck_t0 = clock_now_ns();
    ckpt_index_free(&d->ck_idx);
    for (int r = 0; r < d->world; r++) {
        d->ck_wrote[r] = false;
        free(d->ck_root[r]);
        d->ck_root[r] = NULL;
    }
    send_all(d, MSG_HEARTBEAT, STAGE_CMD_SAVE, d->step, BT_OK, NULL);
}

/* What follows step d->step: its evaluation, its export (every
 * export.every steps and after the last), the next step, the end. The
 * order is the single-process run's (launch/cmd_run.c). */
static void next_after(driver_t *d, bool evaluated)
{
    if (d->phase == DRV_FAILING || d->phase == DRV_DONE) return;
    int64_t steps = d->job->train.steps, every = d->job->train.eval_every;
    int64_t ck_every = d->job->export.every;
    if (!evaluated && d->has_eval &&
        (d->step == steps || (every && d->step % every == 0))) {
        eval_start(d);
        return;
    }
    d->phase = DRV_RUNNING;
    if (d->full && d->saved_step != d->step &&
        (d->step == steps || (ck_every && d->step % ck_every == 0))) {
        export_start(d);
        return;
    }
    int64_t every_ck = d->job->checkpoint.every;
    if (d->job->checkpoint.dir[0] && d->ck_saved != d->step &&
        (d->step == d->last_step || (every_ck && d->step % every_ck == 0))) {
        if (d->ck_step) { /* the previous save is still being written */
            d->phase = DRV_CKPT_WAIT;
            return;
        }
        ckpt_save_start(d);
    }
    if (d->step < d->last_step) step_start(d, d->step + 1);
    else if (d->ck_step) d->phase = DRV_CKPT_WAIT; /* the end waits for the last commit */
    else done(d);
}

/* The saver thread: export.dir replaced as a whole, with the tokenizer. */
static bt_status_t save_run(void *arg)
{
    driver_t *d = arg;
    return run_model_export(d->full, d->job);
}

static void save_start(driver_t *d)
{
    d->phase = DRV_SAVING;
    bt_status_t st = actor_worker_submit(d->saver, &d->a, save_run, d, NULL, (uint64_t)d->step);
    if (st) fail(d, st, -1, "export.dir: cannot start writing %s", d->job->export.dir);
}

static actor_ret_t drv_on_work_done(actor_t *self, actor_msg_t *m)
{
    driver_t *d = (driver_t *)self;
    if (d->phase != DRV_SAVING) return ACTOR_DONE;
    bt_status_t st = m->sys.work.status;
    if (st) {
        fail(d, st, -1, "export.dir: cannot write the model of step %lld to %s (%s)",
             (long long)d->step, d->job->export.dir, bt_status_str(st));
        return ACTOR_DONE;
    }
    d->saved_step = d->step;
    if (d->step == d->job->train.steps) {
        errno = 0;
        printf("model written to %s (HF format%s)\n", d->job->export.dir,
               run_export_tokenizer(d->job)[0] ? ", with its tokenizer" : ", no tokenizer");
        drv_stdout_check(d);
    } else {
        log_debug("model of step %lld written to %s", (long long)d->step, d->job->export.dir);
    }
    next_after(d, true);
    return ACTOR_DONE;
}

static int msg_rank(driver_t *d, actor_msg_t *m)
{
    int r = (int)actor_addr_rank(m->env.src);
    if (r < 0 || r >= d->world) return -1;
    d->last_seen[r] = clock_now_ns();
    return r;
}

/* A normal end takes two phases, so that no rank tears its links down while
 * another still counts a closing peer as a failure: every rank first
 * quiesces (and says so), then all are told to stop. */
static void finish(driver_t *d)
{
    d->phase = DRV_DONE;
    send_all(d, MSG_STOP, 0, d->step, BT_OK, "job finished");
    actor_router_stop_request(d->rt, BT_OK);
}

static void done(driver_t *d)
{
    d->phase = DRV_QUIESCING;
    d->n_quiesced = 0;
    d->t_quiesce0 = clock_now_ns();
    actor_router_quiesce(d->rt);
    send_all(d, MSG_STOP, 0, d->step, BT_IN_PROGRESS, "job finishing");
}

static actor_ret_t drv_on_heartbeat(actor_t *self, actor_msg_t *m)
{
    driver_t *d = (driver_t *)self;
    int r = msg_rank(d, m);
    if (r < 0 || d->phase >= DRV_DONE) return ACTOR_DONE;
    uint32_t state = m->body.heartbeat.state;
    size_t wl;
    const char *wt = state == STAGE_ST_ALIVE ? actor_msg_text(m, "wait", &wl) : NULL;
    if (state == STAGE_ST_ALIVE) hang_note(&d->hang, r, wt ? wt : "", wt ? wl : 0, d->last_seen[r]);
    if (state == STAGE_ST_READY && !d->ready[r]) d->ready[r] = true;
    else if (state == STAGE_ST_READY) return ACTOR_DONE;
    if (state == STAGE_ST_READY && ++d->n_ready == d->world) {
        d->phase = DRV_RUNNING;
        d->t0 = clock_now_ns();
        if (d->eval_only) eval_start(d);
        else step_start(d, d->step + 1);
    } else if (state == STAGE_ST_QUIESCED && d->phase == DRV_QUIESCING) {
        if (++d->n_quiesced == d->world) finish(d);
    } else if (state == STAGE_ST_EXPORTED && d->phase == DRV_EXPORTING && ++d->n_exported == d->world) {
        for (int i = 0; i < d->full->n_params; i++)
            if (!d->received[i]) {
                fail(d, BT_ERR_INVALID, -1, "export: no rank sent parameter %s", d->full->params[i].name);
                return ACTOR_DONE;
            }
        for (int k = 0; k < model_moe_bias_views(d->full, NULL, NULL); k++)
            if (!d->received[d->full->n_params + k]) {
                fail(d, BT_ERR_INVALID, -1, "export: no rank sent sparse layer %d's selection bias", k);
                return ACTOR_DONE;
            }
        save_start(d);
    }
    return ACTOR_DONE;
}

/* A rank's routed-expert load (rows [layer, tokens per expert], f64, its
 * replicas' sum: one rank of each pipeline stage sends it) added to the
 * step's; -1 when it is not one. */
static int load_add(driver_t *d, const tensor_t *t)
{
    int64_t L = d->job->model.layers, E = d->job->model.n_experts;
    if (!d->load || t->dtype != DT_F64 || t->ndim != 2 || t->shape[1] != E + 1) return -1;
    const double *v = t->data;
    for (int64_t i = 0; i < t->shape[0]; i++) {
        double l = v[i * (E + 1)];
        if (!(l >= 0 && l < (double)L) || l != (double)(int64_t)l) return -1;
        int64_t li = (int64_t)l;
        d->load_seen[li] = true;
        d->load[li * (E + 1)] = l;
        for (int64_t e = 1; e <= E; e++) d->load[li * (E + 1) + e] += v[i * (E + 1) + e];
    }
    return 0;
}

/* The step's load rows of the layers some rank reported, in layer order. */
static int load_report(driver_t *d)
{
    if (!d->load) return 0;
    int64_t L = d->job->model.layers, E = d->job->model.n_experts;
    int n = 0;
    for (int64_t l = 0; l < L; l++)
        if (d->load_seen[l])
            memcpy(d->load_rows + (size_t)(n++) * (size_t)(E + 1), d->load + l * (E + 1),
                   (size_t)(E + 1) * sizeof *d->load);
    return n;
}

static actor_ret_t drv_on_metrics(actor_t *self, actor_msg_t *m)
{
    driver_t *d = (driver_t *)self;
    int r = msg_rank(d, m);
    if (r < 0 || (d->phase != DRV_RUNNING && d->phase != DRV_EVAL)) return ACTOR_DONE;
    tensor_t *l = actor_msg_tensor(m, "loss");
    int64_t want = d->phase == DRV_EVAL ? STAGE_EVAL_STEP : d->step;
    if (m->env.step != want || !l || l->dtype != DT_F64 || tensor_numel(l) != 2) {
        fail(d, BT_ERR_PEER_PROTO, r, "bad METRICS for step %lld", (long long)m->env.step);
        return ACTOR_DONE;
    }
    d->rank_loss[r] = ((double *)l->data)[0];
    d->scored += ((double *)l->data)[1];
    tensor_t *ld = d->phase == DRV_RUNNING ? actor_msg_tensor(m, "expert_tokens") : NULL;
    if (ld && load_add(d, ld)) {
        fail(d, BT_ERR_PEER_PROTO, r, "bad expert_tokens in the METRICS of step %lld",
             (long long)m->env.step);
        return ACTOR_DONE;
    }
    tensor_t *dr = d->phase == DRV_RUNNING ? actor_msg_tensor(m, "moe_dropped") : NULL;
    if (dr) {
        if (dr->dtype != DT_I64 || tensor_numel(dr) != 1 || ((int64_t *)dr->data)[0] < 0) {
            fail(d, BT_ERR_PEER_PROTO, r, "bad moe_dropped in the METRICS of step %lld",
                 (long long)m->env.step);
            return ACTOR_DONE;
        }
        d->dropped += ((int64_t *)dr->data)[0];
        d->has_dropped = true;
    }
    if (r == 0) {
        d->grad_norm = m->body.metrics.grad_norm;
        d->lr = m->body.metrics.lr;
    }
    tensor_t *mt = actor_msg_tensor(m, "mem_peak");
    if (mt && mt->dtype == DT_I64 && tensor_numel(mt) == 1 && ((int64_t *)mt->data)[0] > (int64_t)d->mem[r])
        d->mem[r] = (uint64_t)((int64_t *)mt->data)[0];
    tensor_t *dm = actor_msg_tensor(m, "dev_mem_peak");
    if (dm && dm->dtype == DT_I64 && tensor_numel(dm) == 1 &&
        ((int64_t *)dm->data)[0] > (int64_t)d->dev_mem[r])
        d->dev_mem[r] = (uint64_t)((int64_t *)dm->data)[0];
    tensor_t *pf = r == 0 ? actor_msg_tensor(m, "peak_flops") : NULL;
    if (pf && pf->dtype == DT_F64 && tensor_numel(pf) == 1) {
        char what[96];
        snprintf(what, sizeof what, "%s 4096-cubed products measured by rank 0 on %s",
                 d->job->dtype == JOB_DTYPE_BF16 ? "bf16" : "f32", d->job->device);
        report_set_peak(&d->rep, ((double *)pf->data)[0], what);
    }
    if (++d->n_metrics < d->world) return ACTOR_DONE;
    d->loss_sum = 0;
    for (int k = 0; k < d->world; k++) d->loss_sum += d->rank_loss[k];

    int64_t steps = d->job->train.steps;
    if (d->phase == DRV_EVAL) {
        double vloss = d->loss_sum / d->scored;
        d->eval_loss = vloss;
        d->eval_tokens = (int64_t)d->scored;
        if (d->eval_only) {
            done(d);
            return ACTOR_DONE;
        }
        errno = 0;
        report_eval(&d->rep, d->step, vloss);
        if (d->step == steps) printf("final validation loss %.4f, perplexity %.2f\n", vloss, exp(vloss));
        drv_stdout_check(d);
        next_after(d, true);
        return ACTOR_DONE;
    }
    double loss = d->loss_sum / d->scored;
    /* every rank's norm is the global one, and a non-finite loss share makes
     * it NaN (train/dist_optim.h): a non-finite norm means no rank updated */
    bool skipped = !isfinite(d->grad_norm) || !isfinite(loss);
    if (skipped) {
        d->skip_run++;
        d->skipped++;
        char what[64];
        if (!isfinite(loss)) snprintf(what, sizeof what, "loss is %s", isnan(loss) ? "NaN" : "Inf");
        else snprintf(what, sizeof what, "gradient norm is %s", isnan(d->grad_norm) ? "NaN" : "Inf");
        if (d->skip_run > d->job->train.max_skipped_steps) {
            fail(d, BT_ERR_NUMERIC, -1,
                 "step %lld: %s; %lld consecutive non-finite steps, more than "
                 "train.max_skipped_steps = %lld (the ranks' lines above say where)",
                 (long long)d->step, what, (long long)d->skip_run,
                 (long long)d->job->train.max_skipped_steps);
            return ACTOR_DONE;
        }
        log_warn("step %lld skipped, no update on any rank: %s (%lld in a row, %lld in all; the "
                 "ranks' lines say where)",
                 (long long)d->step, what, (long long)d->skip_run, (long long)d->skipped);
    } else {
        d->skip_run = 0;
    }
    errno = 0;
    report_step(&d->rep, &(report_step_t){.step = d->step, .tokens = (int64_t)d->scored, .loss = loss,
                                          .lr = d->lr, .grad_norm = d->grad_norm,
                                          .step_s = (double)(clock_now_ns() - d->t_step0) * 1e-9,
                                          .skipped = skipped, .skipped_total = d->skipped,
                                          .mem = d->mem, .dev_mem = d->dev_mem, .load = d->load_rows,
                                          .load_rows = load_report(d),
                                          .load_cols = (int)d->job->model.n_experts + 1,
                                          .has_dropped = d->has_dropped, .moe_dropped = d->dropped});
    drv_stdout_check(d);
    next_after(d, false);
    return ACTOR_DONE;
}

/* A selection bias of the export (model_moe_bias_views' names): into
 * the whole model's, through its stream. */
static actor_ret_t drv_bias_shard(driver_t *d, int r, const char *name, const tensor_t *t)
{
    int nb = model_moe_bias_views(d->full, NULL, NULL);
    tensor_t *bv = calloc((size_t)nb + 1, sizeof *bv);
    char (*bn)[MODEL_NAME_MAX] = calloc((size_t)nb + 1, sizeof *bn);
    int k = -1;
    if (bv && bn) {
        model_moe_bias_views(d->full, bv, bn);
        for (int j = 0; j < nb && k < 0; j++)
            if (!strcmp(bn[j], name)) k = j;
    }
    if (k < 0 || !tensor_same_shape(t, &bv[k]) || t->dtype != DT_F32) {
        fail(d, bv && bn ? BT_ERR_PEER_PROTO : BT_ERR_NOMEM, r,
             "export: parameter '%s' is unknown or has the wrong shape", name);
    } else {
        kern_upload(d->full->stream, &bv[k], t->data);
        bt_status_t st = kern_stream_sync(d->full->stream);
        if (st) fail(d, st, r, "export: cannot store '%s'", name);
        else d->received[d->full->n_params + k] = true;
    }
    free(bn);
    free(bv);
    return ACTOR_DONE;
}

static actor_ret_t drv_on_shard(actor_t *self, actor_msg_t *m)
{
    driver_t *d = (driver_t *)self;
    int r = msg_rank(d, m);
    if (r < 0 || d->phase != DRV_EXPORTING) return ACTOR_DONE;
    const msg_ckpt_shard_t *b = &m->body.ckpt_shard;
    int i = model_param_find(d->full, b->name);
    tensor_t *t = actor_msg_tensor(m, "data");
    if (i < 0 && t && b->ckpt_step == d->step) return drv_bias_shard(d, r, b->name, t);
    if (i < 0 || !t || !tensor_same_shape(t, &d->full->params[i].t) || t->dtype != DT_F32) {
        fail(d, BT_ERR_PEER_PROTO, r, "export: parameter '%s' is unknown or has the wrong shape",
             b->name);
        return ACTOR_DONE;
    }
    if (b->ckpt_step != d->step) {
        fail(d, BT_ERR_PEER_PROTO, r, "export: parameter '%s' is of step %lld, the export of step %lld",
             b->name, (long long)b->ckpt_step, (long long)d->step);
        return ACTOR_DONE;
    }
    memcpy(d->full->params[i].t.data, t->data, (size_t)tensor_numel(t) * sizeof(float));
    d->received[i] = true;
    return ACTOR_DONE;
}

/* The text of a CKPT_CTL's u8 tensor `name` (NUL-terminated copy), or NULL. */
static char *ctl_text(actor_msg_t *m, const char *name)
{
    size_t len;
    const char *text = actor_msg_text(m, name, &len);
    return text ? strndup(text, len) : NULL;
}

/* Every writer wrote: the whole index (with the run's metadata), checked,
 * goes to one writer per root to commit. */
static void ckpt_commit_start(driver_t *d)
{
    char err[1024];
    int64_t rows = (int64_t)d->g->dp * d->g->microbatches * d->g->micro_batch;
    train_position_t pos = {.step = d->ck_step,
                            .samples = d->base_samples + (d->ck_step - d->base_step) * rows,
                            .skipped = d->skipped, .skip_run = d->skip_run,
                            .optim_steps = d->ck_step - d->skipped};
    model_config_t mc;
    char *meta = NULL, *text = NULL;
    bt_status_t st = run_model_config(d->job, &mc);
    if (!st && !(meta = run_ckpt_meta_json(d->job, d->sets, d->n_sets, &mc, &pos, rows))) st = BT_ERR_NOMEM;
    if (!st) st = ckpt_index_set_meta(&d->ck_idx, meta);
    free(meta);
    if (!st && (st = ckpt_index_check(&d->ck_idx, err, sizeof err))) {
        fail(d, st, -1, "checkpoint of step %lld: the ranks' pieces do not make a whole: %s",
             (long long)d->ck_step, err);
        return;
    }
    if (!st && !(text = ckpt_index_dump(&d->ck_idx))) st = BT_ERR_NOMEM;
    for (int r = 0; r < d->world && !st; r++) {
        bool first = true;
        for (int q = 0; q < r && first; q++) first = strcmp(d->ck_root[q], d->ck_root[r]) != 0;
        if (!first) continue;
        actor_msg_t *m = actor_msg_new(MSG_CKPT_CTL);
        if (!m || !actor_msg_text_add(m, "index", text)) {
            if (m) actor_msg_free(m);
            st = BT_ERR_NOMEM;
            break;
        }
        m->body.ckpt_ctl = (msg_ckpt_ctl_t){.step = d->ck_step, .phase = CKPT_CTL_COMMIT,
                                            .rank = (uint32_t)r};
        m->env.step = d->ck_step;
        d->ck_commits++;
        bt_status_t ss = actor_send(&d->a, ACTOR_ADDR(r, GRAPH_SLOT_CKPT), m);
        if (ss && ss != BT_ERR_BUSY) st = ss;
    }
    free(text);
    if (st) fail(d, st, -1, "checkpoint of step %lld: cannot start the commit (%s)",
                 (long long)d->ck_step, bt_status_str(st));
}

static actor_ret_t drv_on_fetch(actor_t *self, actor_msg_t *m);

static actor_ret_t drv_on_ckpt(actor_t *self, actor_msg_t *m)
{
    driver_t *d = (driver_t *)self;
    int r = msg_rank(d, m);
    if (r < 0 || d->phase == DRV_FAILING || d->phase == DRV_DONE) return ACTOR_DONE;
    const msg_ckpt_ctl_t *c = &m->body.ckpt_ctl;
    if (c->phase == CKPT_CTL_UP) { /* its held fetches can go now */
        d->ck_up[r] = true;
        struct held_fetch *held = d->fetch_held;
        d->fetch_held = NULL;
        while (held) {
            struct held_fetch *next = held->next;
            if (drv_on_fetch(self, held->m) == ACTOR_DONE) actor_msg_free(held->m);
            free(held);
            held = next;
        }
        return ACTOR_DONE;
    }
    if (c->phase == CKPT_CTL_FAILED) {
        fail(d, c->status ? (bt_status_t)c->status : BT_ERR_IO, r, "checkpoint of step %lld: %s",
             (long long)c->step, c->text);
        return ACTOR_DONE;
    }
    if (!d->ck_step || c->step != d->ck_step) {
        fail(d, BT_ERR_PEER_PROTO, r, "checkpoint report for step %lld, none of that step in flight",
             (long long)c->step);
        return ACTOR_DONE;
    }
    if (c->phase == CKPT_CTL_WRITTEN) {
        char err[1024];
        char *frag = ctl_text(m, "index"), *root = ctl_text(m, "root");
        ckpt_index_t part = {0};
        bt_status_t st = frag && root && !d->ck_wrote[r] ? BT_OK : BT_ERR_PEER_PROTO;
        if (st) snprintf(err, sizeof err, "a second report, or one without its index or root");
        if (!st) st = ckpt_index_parse(frag, strlen(frag), "a writer's index", &part, err, sizeof err);
        if (!st) st = ckpt_index_merge(&d->ck_idx, &part, err, sizeof err);
        ckpt_index_free(&part);
        free(frag);
        if (st) {
            free(root);
            fail(d, st, r, "checkpoint of step %lld: %s", (long long)c->step, err);
            return ACTOR_DONE;
        }
        d->ck_wrote[r] = true;
        d->ck_root[r] = root;
        if (++d->ck_written == d->world) ckpt_commit_start(d);
        return ACTOR_DONE;
    }
    if (c->phase == CKPT_CTL_COMMITTED && d->ck_written == d->world && ++d->ck_committed == d->ck_commits) {
        double secs = (double)(clock_now_ns() - d->ck_t0) * 1e-9;
        uint64_t bytes = 0;
        for (int i = 0; i < d->ck_idx.n_files; i++) bytes += d->ck_idx.files[i].bytes;
        log_info("checkpoint of step %lld committed: %d files, %.1f MB, %d root(s), %.2f s",
                 (long long)d->ck_step, d->ck_idx.n_files, (double)bytes / 1e6, d->ck_commits, secs);
        if (d->ck_step == d->last_step) {
            errno = 0;
            printf("checkpoint of step %lld written under %s\n", (long long)d->ck_step,
                   d->job->checkpoint.dir);
            drv_stdout_check(d);
        }
        d->ck_step = 0;
        ckpt_index_free(&d->ck_idx);
        if (d->phase == DRV_CKPT_WAIT) next_after(d, true);
    }
    return ACTOR_DONE;
}

/* The rank that wrote `file` ("shard-r00003.safetensors": 3), or -1. */
static int file_writer_rank(const char *file)
{
    int r = -1, n = 0;
    if (sscanf(file, "shard-r%5d.safetensors%n", &r, &n) != 1 || file[n]) return -1;
    return r;
}

/* CKPT_FETCH (resume): a request goes to the rank that wrote the file when
 * that rank runs in this job and its root holds it; else the driver serves
 * it from the checkpoint's directories. Answers go back to the requester. */
static actor_ret_t drv_on_fetch(actor_t *self, actor_msg_t *m)
{
    driver_t *d = (driver_t *)self;
    int r = msg_rank(d, m);
    if (r < 0 || d->phase == DRV_FAILING || d->phase == DRV_DONE) return ACTOR_DONE;
    msg_ckpt_fetch_t f = m->body.ckpt_fetch;
    actor_msg_t *out = actor_msg_new(MSG_CKPT_FETCH);
    if (!out) return ACTOR_DONE;
    uint32_t to;
    if (f.phase == CKPT_FETCH_REPLY) { /* from the rank that served it */
        if (f.from >= (uint32_t)d->world) { actor_msg_free(out); return ACTOR_DONE; }
        to = f.from;
        tensor_t *t = actor_msg_tensor(m, "data");
        if (!f.status && t) {
            tensor_t *c = actor_msg_tensor_new(out, "data", DT_U8, 1, t->shape);
            if (!c) { actor_msg_free(out); return ACTOR_DONE; }
            memcpy(c->data, t->data, (size_t)t->shape[0]);
        }
    } else {
        f.from = (uint32_t)r;
        int q = file_writer_rank(f.file);
        char root[JOB_PATH_MAX], sd[CKPT_PATH_MAX];
        bool owner = q >= 0 && q < d->world && q != r && !d->procs->procs[q].exited &&
                     d->job->checkpoint.dir[0] && run_ckpt_root(d->job, q, root, sizeof root) == BT_OK;
        if (owner) {
            ckpt_step_dir(root, f.step, sd, sizeof sd);
            owner = file_exists(sd, f.file);
        }
        struct held_fetch *h = owner && !d->ck_up[q] ? malloc(sizeof *h) : NULL;
        if (h) { /* held until its writer is up */
            actor_msg_free(out);
            *h = (struct held_fetch){.m = m, .next = d->fetch_held};
            d->fetch_held = h;
            return ACTOR_KEPT;
        }
        if (owner) {
            to = (uint32_t)q;
            d->fetch_forwarded++;
        } else { /* served here */
            to = (uint32_t)r;
            d->fetch_served++;
            f.phase = CKPT_FETCH_REPLY;
            char err[1024] = "";
            bt_status_t st = d->serve ? BT_OK : BT_ERR_NOT_FOUND;
            tensor_t *c = NULL;
            int64_t n = (int64_t)f.length;
            if (!st && !(c = actor_msg_tensor_new(out, "data", DT_U8, 1, &n))) st = BT_ERR_NOMEM;
            if (!st) st = ckpt_file_bytes(d->serve, f.file, f.offset, f.length, c->data, err, sizeof err);
            if (st) { /* no data then: a fresh message with the reason */
                actor_msg_free(out);
                if (!(out = actor_msg_new(MSG_CKPT_FETCH))) return ACTOR_DONE;
                f.status = st;
                snprintf(f.text, sizeof f.text, "driver: %s", d->serve ? err : "no checkpoint to serve");
            }
        }
    }
    out->body.ckpt_fetch = f;
    out->env.step = f.step;
    bt_status_t st = actor_send(&d->a, ACTOR_ADDR(to, GRAPH_SLOT_CKPT), out);
    if (st && st != BT_ERR_BUSY) log_warn("driver: CKPT_FETCH to rank %u not sent (%s)", to, bt_status_str(st));
    return ACTOR_DONE;
}

static actor_ret_t drv_on_error(actor_t *self, actor_msg_t *m)
{
    driver_t *d = (driver_t *)self;
    const msg_error_report_t *e = &m->body.error_report;
    int from = (int)actor_addr_rank(m->env.src);
    if (d->phase == DRV_DONE) return ACTOR_DONE;
    /* our own router's reports come from the peer's address */
    if (from < d->world && (int)e->peer == from && d->link_down < 0) d->link_down = from;
    if (d->phase == DRV_FAILING) return ACTOR_DONE;
    if (from < d->world && (int)e->peer != from && e->peer < (uint32_t)d->world &&
        bt_status_is_peer((bt_status_t)e->status))
        d->fail_peer = (int)e->peer;
    if (from == d->world) /* our own router: the link to rank e->peer */
        fail(d, (bt_status_t)e->status, (int)e->peer, "link %s failed (%s): %s", e->where,
             bt_status_str((bt_status_t)e->status), e->text);
    else if (from < d->world)
        fail(d, (bt_status_t)e->status, from, "reported: %s [%s]", e->text, e->where);
    return ACTOR_DONE;
}

static void drv_start(actor_t *self)
{
    driver_t *d = (driver_t *)self;
    d->t_phase0 = clock_now_ns();
    actor_timer_start(self, &d->watch, 0.02, 0.02, watch_fire);
}

static const actor_class_t driver_class = {
    .name = "driver",
    .handlers = {
        [MSG_HEARTBEAT] = drv_on_heartbeat,
        [MSG_METRICS] = drv_on_metrics,
        [MSG_CKPT_SHARD] = drv_on_shard,
        [MSG_CKPT_CTL] = drv_on_ckpt,
        [MSG_CKPT_FETCH] = drv_on_fetch,
        [MSG_ERROR_REPORT] = drv_on_error,
        [ACTOR_SYS_WORK_DONE] = drv_on_work_done,
    },
    .start = drv_start,
};

/* ---- signals ------------------------------------------------------------------- */

/* SIGINT/SIGTERM: a handler (on whatever thread the kernel picks; OpenBLAS
 * and libev threads exist already, so blocking the signals is no option)
 * writes the signal number into a pipe; a thread reads it and hands it to
 * the driver actor's loop. The job then fails like any other failure (STOP
 * to every rank, reap, remove the run directory) instead of dying with its
 * run directory left behind. */
typedef struct {
    pthread_t        thread;
    int              pipe[2];
    struct sigaction old_int, old_term;
    actor_loop_t    *loop;
    driver_t        *d;
} drv_signals_t;

static int drv_signal_fd = -1;

static void drv_signal_handler(int sig)
{
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    if (drv_signal_fd >= 0 && write(drv_signal_fd, &b, 1) < 0) {}
    errno = saved;
}

static void drv_on_signal(void *arg)
{
    drv_signals_t *sg = arg;
    if (sg->d->a.state != ACTOR_RUNNING) { /* not started yet: nothing to tell the ranks */
        actor_router_stop_request(sg->d->rt, BT_ERR_CANCELED);
        return;
    }
    fail(sg->d, BT_ERR_CANCELED, -1, "interrupted by a signal");
}

static void *drv_signal_main(void *arg)
{
    drv_signals_t *sg = arg;
    unsigned char b;
    for (;;) {
        ssize_t n = read(sg->pipe[0], &b, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0 || b == 0) return NULL; /* 0: drv_signals_stop */
        actor_loop_post_fn(sg->loop, drv_on_signal, sg);
    }
}

static bt_status_t drv_signals_start(drv_signals_t *sg, actor_loop_t *loop, driver_t *d)
{
    sg->loop = loop;
    sg->d = d;
    if (pipe2(sg->pipe, O_CLOEXEC)) {
        log_error("driver: pipe: %s", strerror(errno));
        return BT_ERR_IO;
    }
    if (pthread_create(&sg->thread, NULL, drv_signal_main, sg)) {
        close(sg->pipe[0]);
        close(sg->pipe[1]);
        log_error("driver: cannot start the signal thread");
        return BT_ERR_NOMEM;
    }
    drv_signal_fd = sg->pipe[1];
    struct sigaction sa = {.sa_handler = drv_signal_handler};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &sg->old_int);
    sigaction(SIGTERM, &sa, &sg->old_term);
    return BT_OK;
}

static void drv_signals_stop(drv_signals_t *sg)
{
    sigaction(SIGINT, &sg->old_int, NULL);
    sigaction(SIGTERM, &sg->old_term, NULL);
    unsigned char zero = 0;
    if (write(sg->pipe[1], &zero, 1) < 0) {}
    pthread_join(sg->thread, NULL);
    drv_signal_fd = -1;
    close(sg->pipe[0]);
    close(sg->pipe[1]);
}

/* ---- run directory ---------------------------------------------------------- */

static bt_status_t file_write(const char *dir, const char *name, const void *data, size_t n,
                              mode_t mode)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        log_error("driver: cannot create %s: %s", p, strerror(errno));
        return BT_ERR_IO;
    }
    bool ok = write(fd, data, n) == (ssize_t)n;
    if (close(fd) || !ok) {
        log_error("driver: cannot write %s", p);
        return BT_ERR_IO;
    }
    return BT_OK;
}

static unsigned xport_kinds(const job_t *job)
{
    unsigned kinds = 1u << XPORT_TCP;
    for (int e = 0; e < JOB_EDGE_COUNT; e++)
        if (job->transport[e] == JOB_XPORT_UCX) kinds |= 1u << XPORT_UCX;
    return kinds;
}

/* The validation rows of the job, as the single-process train_eval takes
 * them: consecutive (unshuffled) windows of the validation stream, at most
 * eval_batches microbatches of micro_batch rows (eval_batches 0: all). *has: whether there are any. */
static bt_status_t eval_rows_prepare(const job_t *job, const char *run_dir, bool *has)
{
    int32_t *all = NULL, *valbuf = NULL;
    const int32_t *val = NULL;
    int64_t n_train = 0, n_val = 0, T = job->data.seq_len;
    uint32_t vocab;
    bt_status_t st;
    *has = false;
    if (job->data.val_dir[0]) {
        if ((st = run_stream_load(job->data.val_dir, &valbuf, &n_val, &vocab))) return st;
        val = valbuf;
    } else {
        if ((st = run_tokens_load(job->data.dir, job->data.split, &all, &n_train, &val, &n_val, &vocab)))
            return st;
    }
    int64_t n_windows = n_val > T ? (n_val - 1) / T : 0;
    int64_t rows = job->train.eval_batches * job->train.micro_batch; /* 0: all windows */
    if (rows > n_windows || job->train.eval_batches == 0) rows = n_windows;
    if (rows > 0) {
        int32_t *ids = malloc((size_t)(rows * T) * sizeof *ids);
        int32_t *tg = malloc((size_t)(rows * T) * sizeof *tg);
        st = ids && tg ? BT_OK : BT_ERR_NOMEM;
        for (int64_t w = 0; w < rows && !st; w++) {
            memcpy(ids + w * T, val + w * T, (size_t)T * sizeof *ids);
            memcpy(tg + w * T, val + w * T + 1, (size_t)T * sizeof *tg);
        }
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", run_dir, RUN_FILE_EVAL);
        if (!st) st = run_eval_write(p, ids, tg, rows, T);
        *has = st == BT_OK;
        free(ids);
        free(tg);
    }
    free(all);
    free(valbuf);
    return st;
}

/* Eval-only runs (baton eval --layout): the rows and the result. */
typedef struct {
    const int32_t *ids, *targets;
    int64_t        rows;
    double         loss;
    int64_t        tokens;
} driver_eval_t;

/* A multi-process job. job_text: the job file's bytes (copied to the run
 * directory for the workers). ev non-NULL: one evaluation pass over ev's
 * rows instead of training. */
/* --resume: the step directories the ranks read (one per root that holds
 * the step), written to the run directory, and where the run stands. For
 * `latest`, the newest step that some root has committed and whose files
 * all exist in the roots; a file in none of them is an error naming it,
 * before any process starts. */
static bt_status_t resume_prepare(const job_t *job, const graph_t *g, const char *what,
                                  const char *run_dir, run_ckpt_meta_t *meta, ckpt_reader_t **serve)
{
    static char roots[GRAPH_MAX_WORLD][JOB_PATH_MAX];
    int n_roots = 0;
    /* every rank's root, and those of ranks past this job's world that exist
     * here: a run saved by more processes than resume it left folders that
     * no rank of this one owns (the driver serves their files) */
    for (int r = 0; r < GRAPH_MAX_WORLD && job->checkpoint.dir[0] && n_roots < GRAPH_MAX_WORLD; r++) {
        char root[JOB_PATH_MAX];
        if (run_ckpt_root(job, r, root, sizeof root)) return BT_ERR_INVALID;
        if (r >= g->world && access(root, F_OK) != 0) continue;
        bool seen = false;
        for (int k = 0; k < n_roots && !seen; k++) seen = !strcmp(roots[k], root);
        if (!seen) snprintf(roots[n_roots++], JOB_PATH_MAX, "%s", root);
    }
    static char dirs[GRAPH_MAX_WORLD + 1][CKPT_PATH_MAX];
    char err[1024];
    int n_dirs = 0;
    int64_t cand[64];
    int n_cand = 0;
    bool latest = !strcmp(what, "latest");
    if (latest) { /* every step any root committed, newest first */
        if (!n_roots) {
            fprintf(stderr, "baton run: --resume latest: checkpoint.dir names no checkpoint root\n");
            return BT_ERR_INVALID;
        }
        for (int k = 0; k < n_roots; k++) {
            int64_t st[64];
            int n = ckpt_list_steps(roots[k], st, 64);
            for (int i = 0; i < n; i++) {
                bool dup = false;
                for (int j = 0; j < n_cand && !dup; j++) dup = cand[j] == st[i];
                if (!dup && n_cand < 64) cand[n_cand++] = st[i];
            }
        }
        for (int i = 0; i < n_cand; i++) /* descending */
            for (int j = i + 1; j < n_cand; j++)
                if (cand[j] > cand[i]) { int64_t t = cand[i]; cand[i] = cand[j]; cand[j] = t; }
        if (!n_cand) {
            fprintf(stderr, "baton run: --resume latest: no committed checkpoint under %s%s\n",
                    roots[0], n_roots > 1 ? " (nor the other ranks' roots)" : "");
            return BT_ERR_NOT_FOUND;
        }
    } else {
        if (ckpt_resolve(what, dirs[0], CKPT_PATH_MAX, err, sizeof err)) {
            fprintf(stderr, "baton run: --resume: %s\n", err);
            return BT_ERR_NOT_FOUND;
        }
        n_dirs = 1;
        cand[n_cand++] = -1; /* the step comes from its index */
    }
    ckpt_index_t idx = {0};
    for (int c = 0; c < n_cand; c++) {
        ckpt_index_free(&idx);
        if (latest) {
            n_dirs = 0;
            for (int k = 0; k < n_roots; k++) {
                ckpt_step_dir(roots[k], cand[c], dirs[n_dirs], CKPT_PATH_MAX);
                if (file_exists(dirs[n_dirs], CKPT_INDEX_FILE)) n_dirs++;
            }
        }
        if (ckpt_index_read(dirs[0], &idx, err, sizeof err) ||
            ckpt_index_check(&idx, err, sizeof err)) {
            if (latest && c + 1 < n_cand) {
                log_warn("resume: %s cannot be used (%s); trying the one before", dirs[0], err);
                continue;
            }
            fprintf(stderr, "baton run: --resume: %s\n", err);
            ckpt_index_free(&idx);
            return BT_ERR_CORRUPT;
        }
        if (!latest) { /* the same step in the other roots may hold the other ranks' files */
            json_int_t step = -1;
            json_t *mj = json_loads(idx.meta, 0, NULL);
            if (mj && json_is_integer(json_object_get(mj, "step")))
                step = json_integer_value(json_object_get(mj, "step"));
            json_decref(mj);
            for (int k = 0; k < n_roots && step >= 0; k++) {
                char sd[CKPT_PATH_MAX];
                ckpt_step_dir(roots[k], step, sd, sizeof sd);
                char a[PATH_MAX], b[PATH_MAX];
                if (access(sd, F_OK) || !realpath(sd, a) || !realpath(dirs[0], b) || !strcmp(a, b)) continue;
                snprintf(dirs[n_dirs++], CKPT_PATH_MAX, "%s", sd);
            }
        }
        /* every file somewhere */
        const char *missing = NULL;
        for (int f = 0; f < idx.n_files && !missing; f++) {
            bool found = false;
            for (int k = 0; k < n_dirs && !found; k++) found = file_exists(dirs[k], idx.files[f].name);
            if (!found) missing = idx.files[f].name;
        }
        if (missing) {
            if (latest && c + 1 < n_cand) {
                log_warn("resume: step %lld: %s is in none of the checkpoint roots; trying the "
                         "one before", (long long)cand[c], missing);
                continue;
            }
            fprintf(stderr, "baton run: --resume: %s: file %s (listed in its index) is in none of "
                    "the %d checkpoint director%s of this job; the ranks that wrote it may hold "
                    "it on another disk\n", dirs[0], missing, n_dirs, n_dirs == 1 ? "y" : "ies");
            ckpt_index_free(&idx);
            return BT_ERR_NOT_FOUND;
        }
        break;
    }
    model_config_t mc;
    bt_status_t st = run_model_config(job, &mc);
    if (!st && (st = run_ckpt_meta_check(&idx, dirs[0], job, &mc, meta, err, sizeof err)))
        fprintf(stderr, "baton run: --resume: %s\n", err);
    for (int k = 0; k < n_roots && !st; k++) {
        /* `latest` fell back past a newer step some root committed but
         * others did not (a save cut short between its commits): that
         * incomplete one moves aside, kept, so that the run can save it anew */
        int64_t newer[64];
        int n = latest ? ckpt_list_steps(roots[k], newer, 64) : 0;
        for (int i = 0; i < n; i++) {
            if (newer[i] <= meta->pos.step) continue;
            char from[CKPT_PATH_MAX], to[CKPT_PATH_MAX + 64];
            ckpt_step_dir(roots[k], newer[i], from, sizeof from);
            snprintf(to, sizeof to, "%s.incomplete-%lld", from, (long long)time(NULL));
            if (rename(from, to) == 0)
                log_warn("resume: %s is incomplete (other roots lack it): moved to %s", from, to);
        }
        if ((st = run_ckpt_newer_check(roots[k], meta->pos.step, err, sizeof err)))
            fprintf(stderr, "baton run: --resume: %s\n", err);
    }
    ckpt_index_free(&idx);
    if (st) return st;
    char *text = malloc(64);
    if (!text) return BT_ERR_NOMEM;
    size_t len = (size_t)sprintf(text, "step %lld\n", (long long)meta->pos.step);
    for (int k = 0; k < n_dirs; k++) {
        char *nt = realloc(text, len + strlen(dirs[k]) + 8);
        if (!nt) { free(text); return BT_ERR_NOMEM; }
        text = nt;
        len += (size_t)sprintf(text + len, "dir %s\n", dirs[k]);
    }
    st = file_write(run_dir, RUN_FILE_RESUME, text, len, 0600);
    free(text);
    /* the index, for ranks whose disks hold no copy of it */
    char ip[CKPT_PATH_MAX + 16], idir[1200];
    char *itext = NULL;
    size_t ilen = 0;
    snprintf(ip, sizeof ip, "%s/%s", dirs[0], CKPT_INDEX_FILE);
    snprintf(idir, sizeof idir, "%s/%s", run_dir, RUN_DIR_RESUME_INDEX);
    if (!st && (mkdir(idir, 0700) != 0 || base_file_read(ip, CKPT_INDEX_MAX_BYTES, &itext, &ilen) ||
                file_write(idir, CKPT_INDEX_FILE, itext, ilen, 0600)))
        st = BT_ERR_IO;
    free(itext);
    /* the driver serves the files of the checkpoint that no live rank wrote */
    const char *dp[GRAPH_MAX_WORLD + 1];
    for (int k = 0; k < n_dirs; k++) dp[k] = dirs[k];
    if (!st && (st = ckpt_reader_open(dp, n_dirs, serve, err, sizeof err)))
        fprintf(stderr, "baton run: --resume: %s\n", err);
    if (!st)
        printf("resuming from %s: step %lld, %lld samples consumed (%d director%s)\n", dirs[0],
               (long long)meta->pos.step, (long long)meta->pos.samples, n_dirs, n_dirs == 1 ? "y" : "ies");
    return st;
}

static int driver_main(job_t *job, const char *job_text, size_t job_len, const char *const *sets,
                       int n_sets, bool quiet, driver_eval_t *ev, const char *resume,
                       const rundir_t *rd)
{
    static graph_t g;
    char err[JOB_ERR_MAX];
    drv_last.failed = false;
    drv_last.rank = drv_last.host = -1;
    if (graph_build(job, &g, err, sizeof err)) {
        fprintf(stderr, "baton run: %s: %s\n", job->path, err);
        return 1;
    }
    int slurm_nodes = 0;
    bool slurm = slurm_job_wanted(job, &slurm_nodes);
    if (slurm && slurm_nodes < 1) {
        fprintf(stderr, "baton run: %s: hosts: slurm, but this is not inside a Slurm allocation "
                        "(SLURM_JOB_ID / SLURM_JOB_NUM_NODES unset; run it under salloc or sbatch)\n", job->path);
        return 1;
    }
    if (slurm && g.world % slurm_nodes) {
        fprintf(stderr, "baton run: %s: %d ranks do not split evenly over the Slurm allocation's %d nodes\n",
                job->path, g.world, slurm_nodes);
        return 1;
    }
    bool remote = !slurm && ssh_job_remote(job);
    for (int h = 0; remote && h < job->n_hosts; h++)
        if (!strcmp(job->hosts[h], "local")) {
            fprintf(stderr, "baton run: %s: hosts[%d]: 'local' beside ssh hosts; name this machine "
                            "as an ssh destination too\n", job->path, h);
            return 1;
        }
    if (remote && g.world % job->n_hosts) {
        fprintf(stderr, "baton run: %s: hosts: %d ranks do not split evenly over %d hosts\n", job->path,
                g.world, job->n_hosts);
        return 1;
    }

    int rc = 1;
    int32_t *tokens = NULL;
    int64_t n_tokens = 0;
    uint32_t vocab = 0;
    char vocab_set[64] = "";
    if (!ev && worker_train_stream(job, &tokens, &n_tokens, &vocab)) return 1;
    free(tokens);
    if (!ev && !job->model.hf[0] && job->model.vocab == 0) {
        if (vocab == 0) {
            fprintf(stderr, "baton run: %s: model.vocab: required when the data (tokens.txt) does "
                            "not state its vocabulary\n", job->path);
            return 1;
        }
        job->model.vocab = vocab;
        snprintf(vocab_set, sizeof vocab_set, "model.vocab=%u", vocab);
    }
    if (run_mem_job_check(job, err, sizeof err)) { /* before any process starts */
        fprintf(stderr, "baton %s: %s\n", ev ? "eval" : "run", err);
        return 1;
    }
    if (!ev && n_tokens < job->data.seq_len + 1) {
        fprintf(stderr, "baton run: %s: the training stream has %lld tokens, fewer than one window\n",
                job->path, (long long)n_tokens);
        return 1;
    }

    /* Private run directory: job, overrides, rendezvous files. It goes away
     * with the driver however the driver ends (launch/jobdir.h). A closed
     * standard output must not kill the driver before it has stopped the
     * workers (SIGPIPE): writes to it fail with EPIPE instead, and the
     * driver stops the job (drv_stdout_check). The workers inherit the
     * ignored SIGPIPE through exec: a worker whose output is gone writes
     * into the void rather than dying of it. */
    struct sigaction ign = {.sa_handler = SIG_IGN}, old_pipe;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old_pipe);
    static jobdir_t jd;
    if (jobdir_create(&jd)) {
        sigaction(SIGPIPE, &old_pipe, NULL);
        return 1;
    }
    const char *run_dir = jd.path;
    actor_router_t *rt = NULL;
    actor_loop_t *loop = NULL;
    static driver_t d;
    spawn_group_t procs = {0};
    /* The secret lives in this process and in the spawn pipes only
     * (launch/spawn.h), never in the run directory. */
    uint8_t secret[RUN_SECRET_LEN];
    char *sets_text = NULL, card[ACTOR_CARD_MAX];
    memset(&d, 0, sizeof d);
    d.eval_only = ev != NULL;
    if (getrandom(secret, sizeof secret, 0) != (ssize_t)sizeof secret) {
        log_error("driver: getrandom: %s", strerror(errno));
        goto remove_dir;
    }
    if (file_write(run_dir, RUN_FILE_JOB, job_text, job_len, 0600)) goto remove_dir;
    size_t sets_len = 0;
    sets_text = calloc(1, 64 + 1);
    /* the workers' overrides: the user's, the vocabulary taken from the
     * data, the paths in which {run} became the run's directory */
    int n_rd = rd ? rd->n_sets : 0;
    for (int i = 0; i < n_sets + 1 + n_rd && sets_text; i++) {
        const char *s = i < n_sets ? sets[i] : i == n_sets ? vocab_set : rd->sets[i - n_sets - 1];
        if (!*s) continue;
        if (strchr(s, '\n')) {
            fprintf(stderr, "baton run: --set %s: a newline in an override\n", s);
            goto remove_dir;
        }
        char *ns = realloc(sets_text, sets_len + strlen(s) + 2);
        if (!ns) break;
        sets_text = ns;
        sets_len += (size_t)sprintf(sets_text + sets_len, "%s\n", s);
    }
    if (!sets_text || file_write(run_dir, RUN_FILE_SETS, sets_text, sets_len, 0600)) goto remove_dir;
    if (rd && file_write(run_dir, RUN_FILE_RUN_ID, rd->id, strlen(rd->id), 0600)) goto remove_dir;

    run_ckpt_meta_t rmeta = {0};
    int64_t tokens_before = 0;
    if (resume && (resume_prepare(job, &g, resume, run_dir, &rmeta, &d.serve) ||
                   run_metrics_trim(job->metrics.file, rmeta.pos.step, &tokens_before)))
        goto remove_dir;
    if (ev) {
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", run_dir, RUN_FILE_EVAL);
        if (run_eval_write(p, ev->ids, ev->targets, ev->rows, job->data.seq_len) ||
            file_write(run_dir, RUN_FILE_MODE, "eval\n", 5, 0600))
            goto remove_dir;
        d.has_eval = d.eval_only = true;
    } else if (eval_rows_prepare(job, run_dir, &d.has_eval)) {
        goto remove_dir;
    }

    /* Other hosts: every one checked before any rank starts; the driver
     * listens on its address toward them (launch/ssh.h). */
    char self_addr[64] = "";
    if (remote) {
        if (ssh_probe(job, run_dir, err, sizeof err)) {
            fprintf(stderr, "baton run: %s: %s\n", job->path, err);
            /* which host (its errors start "hosts[N] ..."): a restart may leave it out */
            if (sscanf(err, "hosts[%d]", &drv_last.host) != 1 || drv_last.host < 0 || drv_last.host >= job->n_hosts)
                drv_last.host = -1;
            snprintf(drv_last.text, sizeof drv_last.text, "%s", err);
            goto remove_dir;
        }
        if (launch_addr_toward(job->hosts[0], self_addr, sizeof self_addr)) goto remove_dir;
    }
    if (slurm && slurm_driver_addr(self_addr, sizeof self_addr)) goto remove_dir;
    const char *job_id = strrchr(run_dir, '/') + 1;
    actor_router_config_t rc_cfg = {.rank = (uint32_t)g.world, .job_id = job_id, .secret = secret,
                                    .secret_len = sizeof secret,
                                    .listen_host = self_addr[0] ? self_addr : NULL};
    if (actor_router_create(&rc_cfg, &rt)) goto remove_dir;
    if (actor_router_listen(rt, xport_kinds(job), card, sizeof card)) goto destroy_router;
    if (file_write(run_dir, RUN_FILE_DRIVER, card, strlen(card), 0600)) goto destroy_router;
    if (actor_router_loop_new(rt, "driver", &loop)) goto destroy_router;

    if (!ev) {
        model_config_t mc;
        if (run_model_config(job, &mc)) goto destroy_router;
        if (report_open(&d.rep, job, &mc, g.world, resume != NULL, quiet, rd ? rd->id : NULL,
                        rd ? rd->path : NULL))
            goto close_metrics;
        d.rep_open = true;
        d.rep.base_step = rmeta.pos.step;
        d.rep.tokens_before = tokens_before;
    }
    if (job->export.dir[0]) {
        model_config_t mc;
        if (run_model_config(job, &mc) || model_create(&mc, NULL, &d.full)) goto close_metrics;
        d.received = calloc((size_t)(d.full->n_params + model_moe_bias_views(d.full, NULL, NULL)) + 1,
                            sizeof *d.received);
        if (!d.received || actor_router_worker_new(rt, "saver", &d.saver)) goto close_metrics;
    }
    d.last_seen = calloc((size_t)g.world, sizeof *d.last_seen);
    d.ck_wrote = calloc((size_t)g.world, sizeof *d.ck_wrote);
    d.rank_loss = calloc((size_t)g.world, sizeof *d.rank_loss);
    d.ck_up = calloc((size_t)g.world, sizeof *d.ck_up);
    d.ready = calloc((size_t)g.world, sizeof *d.ready);
    d.ck_root = calloc((size_t)g.world, sizeof *d.ck_root);
    d.mem = calloc((size_t)g.world, sizeof *d.mem);
    d.dev_mem = calloc((size_t)g.world, sizeof *d.dev_mem);
    if (!d.last_seen || !d.ck_wrote || !d.ck_root || !d.rank_loss || !d.ck_up || !d.ready || !d.mem ||
        !d.dev_mem || hang_init(&d.hang, g.world))
        goto close_metrics;
    if (job_has_experts(job)) {
        size_t cells = (size_t)job->model.layers * (size_t)(job->model.n_experts + 1);
        d.load = calloc(cells, sizeof *d.load);
        d.load_rows = calloc(cells, sizeof *d.load_rows);
        d.load_seen = calloc((size_t)job->model.layers, sizeof *d.load_seen);
        if (!d.load || !d.load_rows || !d.load_seen) goto close_metrics;
    }
    d.sets = sets;
    d.n_sets = n_sets;
    d.last_step = job->train.stop_after ? job->train.stop_after : job->train.steps;
    d.base_step = d.step = d.ck_saved = rmeta.pos.step;
    d.base_samples = rmeta.pos.samples;
    d.skipped = rmeta.pos.skipped;
    d.skip_run = rmeta.pos.skip_run;
    d.rt = rt;
    d.job = job;
    d.g = &g;
    d.run_dir = run_dir;
    d.procs = &procs;
    d.quiet = quiet;
    d.world = g.world;
    d.fail_rank = d.link_down = d.fail_peer = -1;
    d.hb_timeout_s = env_seconds("BATON_HEARTBEAT_TIMEOUT", job->launch.heartbeat_timeout);
    d.step_timeout_s = env_seconds("BATON_STEP_TIMEOUT", job->launch.step_timeout);
    d.start_timeout_s = env_seconds("BATON_START_TIMEOUT", 120);

    if (!ev) {
        char layout[576], xp[256] = "", cwhy[600];
        coll_backend_t cb = COLL_BACKEND_HOST;
        if (job_collectives(job, &cb, cwhy, sizeof cwhy)) cb = COLL_BACKEND_HOST;
        int n = 0;
        static const job_edge_t shown[] = {JOB_EDGE_CONTROL, JOB_EDGE_PIPELINE, JOB_EDGE_DATA_PARALLEL,
                                           JOB_EDGE_TENSOR_PARALLEL};
        for (size_t k = 0; k < sizeof shown / sizeof shown[0]; k++)
            n += snprintf(xp + n, sizeof xp - (size_t)n, "%s%s %s", k ? ", " : "",
                          job_edge_name(shown[k]), graph_edge_xport(job, shown[k]));
        char cps[48] = "";
        if (g.cp > 1) snprintf(cps, sizeof cps, " cp=%d %s", g.cp, g.cp_ring ? "ring" : "allgather");
        snprintf(layout, sizeof layout,
                 "%d processes (tp=%d pp=%d dp=%d%s), %d virtual stage%s per rank, %s, %d microbatches "
                 "of %lld per replica, ZeRO-1 %s | transports: %s | collectives: %s",
                 g.world, g.tp, g.pp, g.dp, cps, g.vpp, g.vpp == 1 ? "" : "s", pipe_sched_name(g.pipe.kind),
                 g.microbatches, (long long)g.micro_batch, g.zero1 ? "on" : "off", xp,
                 coll_backend_name(cb));
        model_config_t mc;
        if (run_model_config(job, &mc)) goto close_metrics;
        report_header(&d.rep, &mc, model_num_params(&mc), layout,
                      g.dp * g.microbatches * g.micro_batch * g.seq_len, n_tokens, -1);
    }
    if (job->trace_dir[0]) {
        trace_config_t tcfg = {.run_id = rd ? rd->id : NULL};
        if (trace_start(job->trace_dir, (uint32_t)g.world, &tcfg))
            log_warn("trace.dir: cannot trace into %s; the driver runs untraced", job->trace_dir);
        trace_actor_name(ACTOR_ADDR(g.world, GRAPH_SLOT_DRIVER), "driver");
    }
    static drv_signals_t sig;
    if (drv_signals_start(&sig, loop, &d)) goto close_metrics;
    if (remote || slurm) {
        char life[32]; /* how long an agent waits for a lifeline beat (spawn_beat) */
        snprintf(life, sizeof life, "%.3f", 2 * d.hb_timeout_s);
        setenv(SPAWN_LIFELINE_ENV, life, 1);
        const char *tcp = strstr(card, ";tcp=");
        char peer[96];
        snprintf(peer, sizeof peer, "%.*s", tcp ? (int)strcspn(tcp + 5, ";") : 0, tcp ? tcp + 5 : "");
        if (!peer[0] ||
            (slurm ? slurm_start(job, run_dir, secret, sizeof secret, g.world, slurm_nodes, peer, &procs)
                   : ssh_start(job, run_dir, secret, sizeof secret, g.world, peer, &procs)))
            goto stop_signals;
    } else if (spawn_workers(run_dir, secret, sizeof secret, g.world, &procs)) {
        goto stop_signals;
    }
    actor_router_supervisor_set(rt, ACTOR_ADDR(g.world, GRAPH_SLOT_DRIVER));
    if (actor_register(rt, &d.a, &driver_class, loop, "driver", GRAPH_SLOT_DRIVER)) goto stop_procs;

    bt_status_t st = actor_router_wait(rt, 0);
    int failed = -1;
    int killed = spawn_stop(&procs, st == BT_OK ? 10.0 : 3.0, &failed);
    if (killed) log_warn("driver: %d worker process(es) did not exit and were killed", killed);
    if (st == BT_OK && failed >= 0) {
        log_error("driver: rank %d did not exit cleanly after the job finished", failed);
        st = BT_ERR_PEER_CLOSED;
    }
    if (st == BT_OK && !ev && d.rep_open) {
        if (!d.has_eval)
            printf("no validation split (data.split = %g): no validation perplexity\n", job->data.split);
        st = report_finish(&d.rep, d.step >= job->train.steps);
    }
    if (st == BT_OK && ev) {
        ev->loss = d.eval_loss;
        ev->tokens = d.eval_tokens;
        rc = killed ? 1 : 0;
    } else if (st == BT_OK) {
        rc = killed ? 1 : 0;
    }
stop_procs:
    if (procs.procs) spawn_stop(&procs, 0.5, NULL);
stop_signals:
    drv_signals_stop(&sig);
close_metrics:
    if (d.rep_open) report_close(&d.rep);
destroy_router:
    actor_router_destroy(rt);
    free(d.last_seen);
    hang_free(&d.hang);
    free(d.received);
    for (int r = 0; d.ck_root && r < g.world; r++) free(d.ck_root[r]);
    free(d.ck_root);
    free(d.ck_wrote);
    free(d.rank_loss);
    free(d.load);
    free(d.load_rows);
    free(d.load_seen);
    free(d.ck_up);
    free(d.ready);
    while (d.fetch_held) {
        struct held_fetch *next = d.fetch_held->next;
        actor_msg_free(d.fetch_held->m);
        free(d.fetch_held);
        d.fetch_held = next;
    }
    ckpt_index_free(&d.ck_idx);
    if (d.fetch_served || d.fetch_forwarded)
        log_info("driver: resume fetches: %lld forwarded to the ranks that wrote them, %lld served "
                 "here", (long long)d.fetch_forwarded, (long long)d.fetch_served);
    ckpt_reader_close(d.serve);
    free(d.mem);
    free(d.dev_mem);
    model_destroy(d.full);
remove_dir:
    trace_stop();
    free(sets_text);
    explicit_bzero(secret, sizeof secret);
    jobdir_remove(&jd);
    sigaction(SIGPIPE, &old_pipe, NULL);
    return rc;
}

int driver_run(job_t *job, const char *const *sets, int n_sets, bool quiet, const char *resume,
               const rundir_t *rd)
{
    char *text = NULL;
    size_t len = 0;
    if (base_file_read(job->path, 0, &text, &len)) return 1;
    int rc = driver_main(job, text, len, sets, n_sets, quiet, NULL, resume, rd);
    free(text);
    return rc;
}

int driver_eval(const char *model_dir, const char *layout, const char *device, const char *dtype,
                const int32_t *ids, const int32_t *targets, int64_t rows, int64_t T, double *loss,
                int64_t *tokens)
{
    int64_t tp = 1, pp = 1, dp = 1, cp = 1, ep = 1;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", layout);
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char key[16];
        long long v;
        int64_t *at = NULL;
        if (sscanf(kv, "%15[a-z]=%lld", key, &v) == 2 && v >= 1)
            at = !strcmp(key, "tp") ? &tp : !strcmp(key, "pp") ? &pp : !strcmp(key, "dp") ? &dp
               : !strcmp(key, "cp") ? &cp : !strcmp(key, "ep") ? &ep : NULL;
        if (!at) {
            fprintf(stderr, "baton eval: --layout %s: expected tp=N,pp=N,dp=N (and optionally cp=N, ep=N; "
                            "got '%s')\n", layout, kv);
            return 2;
        }
        *at = v;
    }
    if (strpbrk(model_dir, "\"\n\\")) {
        fprintf(stderr, "baton eval: --model %s: unsupported characters in the path\n", model_dir);
        return 2;
    }
    if (!device) device = "cpu";
    if (!dtype) dtype = "fp32";
    if (strpbrk(device, "\"\n\\{},:") && strncmp(device, "cuda:", 5)) {
        fprintf(stderr, "baton eval: --device %s: not a device\n", device);
        return 2;
    }
    if (strpbrk(dtype, "\"\n\\{},:")) {
        fprintf(stderr, "baton eval: --dtype %s: not a precision\n", dtype);
        return 2;
    }
    /* A job for the workers: the model, the layout, microbatches of 4 rows
     * of T tokens (data.dir is required by the schema; eval-only workers
     * never read it). What the user's options decide is set as overrides
     * labelled with the option (job_override_as), so that an error names
     * the option, not a position in this generated text; the workers get
     * the same text and overrides. */
    char *text = NULL;
    int n = asprintf(&text,
                     "data: {dir: \"%s\", split: 0}\n"
                     "train: {steps: 1, micro_batch: 4}\n",
                     model_dir);
    if (n < 0) return 1;
    char o_model[JOB_PATH_MAX + 16], o_layout[300], o_ids[64], o_device[96], o_dtype[96];
    snprintf(o_model, sizeof o_model, "--model %s", model_dir);
    snprintf(o_layout, sizeof o_layout, "--layout %s", layout);
    snprintf(o_ids, sizeof o_ids, "--ids (rows of %lld tokens)", (long long)T);
    snprintf(o_device, sizeof o_device, "--device %s", device);
    snprintf(o_dtype, sizeof o_dtype, "--dtype %s", dtype);
    static char sets[10][JOB_PATH_MAX + 32];
    const char *set_ptrs[10], *labels[10];
    int n_sets = 0;
#define EVAL_SET(label, ...)                                                                       \
    do {                                                                                           \
        snprintf(sets[n_sets], sizeof sets[n_sets], __VA_ARGS__);                                  \
        set_ptrs[n_sets] = sets[n_sets];                                                           \
        labels[n_sets++] = label;                                                                  \
    } while (0)
    EVAL_SET(o_model, "model.hf=\"%s\"", model_dir);
    EVAL_SET(o_ids, "data.seq_len=%lld", (long long)T);
    EVAL_SET(o_layout, "train.grad_accum=%lld", (long long)pp);
    EVAL_SET(o_layout, "parallel.tp=%lld", (long long)tp);
    EVAL_SET(o_layout, "parallel.pp=%lld", (long long)pp);
    EVAL_SET(o_layout, "parallel.dp=%lld", (long long)dp);
    EVAL_SET(o_layout, "parallel.cp=%lld", (long long)cp);
    EVAL_SET(o_layout, "parallel.ep=%lld", (long long)ep);
    EVAL_SET(o_device, "device=\"%s\"", device);
    EVAL_SET(o_dtype, "dtype=\"%s\"", dtype);
#undef EVAL_SET
    static job_t job;
    char err[JOB_ERR_MAX];
    bt_status_t st = job_load_string("baton eval", text, &job, err, sizeof err);
    for (int i = 0; i < n_sets && !st; i++)
        st = job_override_as(&job, set_ptrs[i], labels[i], err, sizeof err);
    if (st || job_validate(&job, err, sizeof err)) {
        fprintf(stderr, "baton eval: %s\n", err);
        free(text);
        return 1;
    }
    driver_eval_t ev = {.ids = ids, .targets = targets, .rows = rows};
    int rc = driver_main(&job, text, (size_t)n, set_ptrs, n_sets, true, &ev, NULL, NULL);
    free(text);
    if (rc == 0) {
        *loss = ev.loss;
        *tokens = ev.tokens;
    }
    return rc;
}
