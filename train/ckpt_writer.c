#include "train/ckpt_writer.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "ckpt/store.h"

enum { JOB_WRITE = 1, JOB_COMMIT = 2, JOB_SERVE = 3, TAG_FETCH = 4 };

/* One fetch of this rank's restore: the restore thread waits on it; the
 * loop sends it, matches the reply and signals. Freed by the last of the
 * two to let go (a restore that timed out abandons it). */
struct ckpt_fetch_req {
    ckpt_fetch_req_t *next;     /* w->pending (loop thread) */
    uint64_t          id;
    int64_t           step;
    char              file[MSG_NAME_MAX];
    uint64_t          offset, len;
    void             *dst;
    pthread_mutex_t   mu;
    pthread_cond_t    cv;
    bool              done, abandoned;
    bt_status_t       status;
    char              text[MSG_TEXT_MAX];
};

/* A served request (io thread): the request and, once read, the bytes. */
typedef struct {
    ckpt_writer_t   *w;
    msg_ckpt_fetch_t q;
    uint8_t         *data;
    char             err[MSG_TEXT_MAX];
} serve_job_t;

struct ckpt_writer_job {
    ckpt_writer_t *w;
    int            kind;
    int64_t        step;
    ckpt_put_t    *puts;
    int            n;
    ckpt_index_t   idx;
    actor_msg_t   *commit;   /* the COMMIT message (its "index" tensor is parsed on io) */
    char          *fragment; /* JOB_WRITE: the written file's index, as JSON */
    char           err[768];
};

bt_status_t ckpt_writer_init(ckpt_writer_t *w, const ckpt_writer_config_t *cfg)
{
    memset(w, 0, sizeof *w);
    w->cfg = *cfg;
    w->step = -1;
    w->job = calloc(1, sizeof *w->job);
    return w->job ? BT_OK : BT_ERR_NOMEM;
}

static void pieces_free(ckpt_writer_t *w)
{
    if (w->pieces)
        for (uint32_t i = 0; i < w->count; i++)
            if (w->pieces[i]) actor_msg_free(w->pieces[i]);
    free(w->pieces);
    w->pieces = NULL;
    w->count = w->got = 0;
}

static void req_release(ckpt_fetch_req_t *q)
{
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
}

void ckpt_writer_fini(ckpt_writer_t *w)
{
    pieces_free(w);
    while (w->pending) { /* only abandoned ones can be left: their waiters are gone */
        ckpt_fetch_req_t *q = w->pending;
        w->pending = q->next;
        req_release(q);
    }
    ckpt_reader_close(w->serve);
    if (w->job) {
        free(w->job->puts);
        free(w->job->fragment);
        ckpt_index_free(&w->job->idx);
        if (w->job->commit) actor_msg_free(w->job->commit);
        free(w->job);
    }
    memset(w, 0, sizeof *w);
}

/* A CKPT_CTL to the driver; text (may be NULL) and tensors "index" and
 * "root" when given. */
static void ctl_send(ckpt_writer_t *w, uint32_t phase, int64_t step, bt_status_t status,
                     const char *text, const char *index)
{
    actor_msg_t *m = actor_msg_new(MSG_CKPT_CTL);
    if (!m) return;
    m->body.ckpt_ctl = (msg_ckpt_ctl_t){.step = step, .phase = phase, .status = status,
                                        .rank = (uint32_t)w->cfg.rank};
    snprintf(m->body.ckpt_ctl.text, sizeof m->body.ckpt_ctl.text, "%s", text ? text : "");
    m->env.step = step;
    const char *names[2] = {"index", "root"};
    const char *vals[2] = {index, phase == CKPT_CTL_WRITTEN ? w->cfg.root : NULL};
    for (int i = 0; i < 2; i++) {
        if (vals[i] && !actor_msg_text_add(m, names[i], vals[i])) {
            actor_msg_free(m);
            log_error("rank %d: checkpoint of step %lld: out of memory for the report", w->cfg.rank,
                      (long long)step);
            return;
        }
    }
    bt_status_t st = actor_send(&w->a, w->cfg.driver, m);
    if (st && st != BT_ERR_BUSY)
        log_error("rank %d: checkpoint report to the driver not sent (%s)", w->cfg.rank,
                  bt_status_str(st));
}

static void failed(ckpt_writer_t *w, int64_t step, bt_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void failed(ckpt_writer_t *w, int64_t step, bt_status_t st, const char *fmt, ...)
{
    char text[MSG_TEXT_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    log_error("rank %d: checkpoint of step %lld: %s", w->cfg.rank, (long long)step, text);
    ctl_send(w, CKPT_CTL_FAILED, step < 0 ? 0 : step, st ? st : BT_ERR_INVALID, text, NULL);
}

/* ---- io jobs --------------------------------------------------------------- */

/* The writer's I/O thread runs below the compute threads: on a machine
 * whose cores all train, a save then takes longer instead of slowing the
 * steps (it needs little CPU: copies into the page cache, a hash, fsync). */
static void io_thread_lower(void)
{
    static _Thread_local bool done;
    if (done) return;
    done = true;
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10) != 0)
        log_debug("checkpoint writer: cannot lower its I/O thread's priority: %s", strerror(errno));
}

static bt_status_t job_run(void *arg)
{
    ckpt_writer_job_t *j = arg;
    ckpt_writer_t *w = j->w;
    bt_status_t st;
    io_thread_lower();
    if (j->kind == JOB_WRITE) {
        if ((st = ckpt_stage_begin(w->cfg.root, j->step, j->err, sizeof j->err))) return st;
        char tmp[CKPT_PATH_MAX];
        ckpt_step_tmp(w->cfg.root, j->step, tmp, sizeof tmp);
        if (j->n && (st = ckpt_shard_write(&j->idx, tmp, w->cfg.file, j->puts, j->n, j->err,
                                           sizeof j->err)))
            return st;
        j->fragment = ckpt_index_dump(&j->idx);
        return j->fragment ? BT_OK : BT_ERR_NOMEM;
    }
    size_t len;
    const char *text = actor_msg_text(j->commit, "index", &len);
    if (!text) {
        snprintf(j->err, sizeof j->err, "COMMIT without its index");
        return BT_ERR_PEER_PROTO;
    }
    if ((st = ckpt_index_parse(text, len, "the driver's index", &j->idx, j->err, sizeof j->err)))
        return st;
    return ckpt_commit(w->cfg.root, j->step, &j->idx, w->cfg.keep, j->err, sizeof j->err);
}

static void job_reset(ckpt_writer_job_t *j)
{
    free(j->puts);
    free(j->fragment);
    ckpt_index_free(&j->idx);
    if (j->commit) actor_msg_free(j->commit);
    ckpt_writer_t *w = j->w;
    memset(j, 0, sizeof *j);
    j->w = w;
}

static bt_status_t job_start(ckpt_writer_t *w, int kind, int64_t step)
{
    ckpt_writer_job_t *j = w->job;
    j->w = w;
    j->kind = kind;
    j->step = step;
    bt_status_t st = actor_worker_submit(w->cfg.io, &w->a, job_run, j, NULL, (uint64_t)kind);
    if (st == BT_OK) w->busy = true;
    return st;
}

/* All pieces are here: write them. */
static void write_start(ckpt_writer_t *w)
{
    ckpt_writer_job_t *j = w->job;
    job_reset(j);
    j->puts = calloc((size_t)w->count + 1, sizeof *j->puts);
    if (!j->puts) {
        failed(w, w->step, BT_ERR_NOMEM, "out of memory");
        return;
    }
    for (uint32_t i = 0; i < w->count; i++) {
        actor_msg_t *m = w->pieces[i];
        const msg_ckpt_piece_t *p = &m->body.ckpt_piece;
        shard_spec_t sp = {.ndim = (int)p->ndim, .flat_start = p->flat_start,
                           .flat_len = p->flat_len, .split_dim = -1, .size = 1};
        const int64_t g[4] = {p->glob0, p->glob1, p->glob2, p->glob3};
        const int64_t o[4] = {p->off0, p->off1, p->off2, p->off3};
        const int64_t e[4] = {p->ext0, p->ext1, p->ext2, p->ext3};
        for (int d = 0; d < sp.ndim; d++) {
            sp.global[d] = g[d];
            sp.offset[d] = o[d];
            sp.extent[d] = e[d];
        }
        if (sp.flat_len < 0) sp.flat_start = 0;
        tensor_t *t = actor_msg_tensor(m, "data");
        if (!t || tensor_numel(t) != shard_numel(&sp)) {
            failed(w, w->step, BT_ERR_PEER_PROTO, "piece %u (%s) holds %lld values, its spec %lld",
                   i, p->name, t ? (long long)tensor_numel(t) : -1LL, (long long)shard_numel(&sp));
            return;
        }
        j->puts[i] = (ckpt_put_t){.tensor = p->name, .dtype = t->dtype, .spec = sp, .data = t->data};
    }
    j->n = (int)w->count;
    bt_status_t st = job_start(w, JOB_WRITE, w->step);
    if (st) failed(w, w->step, st, "cannot start writing");
}

/* ---- handlers --------------------------------------------------------------- */

/* ---- resume: fetches ------------------------------------------------------------ */

static bt_status_t serve_run(void *arg)
{
    serve_job_t *j = arg;
    ckpt_writer_t *w = j->w;
    char err[1024] = "";
    io_thread_lower();
    bt_status_t st = BT_OK;
    if (!w->serve || w->serve_step != j->q.step) {
        ckpt_reader_close(w->serve);
        w->serve = NULL;
        char dir[CKPT_PATH_MAX];
        ckpt_step_dir(w->cfg.root, j->q.step, dir, sizeof dir);
        const char *dirs[1] = {dir};
        st = ckpt_reader_open(dirs, 1, &w->serve, err, sizeof err);
        w->serve_step = j->q.step;
    }
    if (!st && !(j->data = malloc(j->q.length ? j->q.length : 1))) st = BT_ERR_NOMEM;
    if (!st) st = ckpt_file_bytes(w->serve, j->q.file, j->q.offset, j->q.length, j->data, err, sizeof err);
    if (st) snprintf(j->err, sizeof j->err, "rank %d: %s", w->cfg.rank, err);
    return st;
}

/* The answer to a served request goes back through the driver. */
static void serve_reply(ckpt_writer_t *w, serve_job_t *j, bt_status_t st)
{
    actor_msg_t *m = actor_msg_new(MSG_CKPT_FETCH);
    if (!m) goto out;
    m->body.ckpt_fetch = j->q;
    m->body.ckpt_fetch.phase = CKPT_FETCH_REPLY;
    m->body.ckpt_fetch.status = st;
    snprintf(m->body.ckpt_fetch.text, sizeof m->body.ckpt_fetch.text, "%s", st ? j->err : "");
    if (!st) {
        int64_t n = (int64_t)j->q.length;
        tensor_t *t = actor_msg_tensor_new(m, "data", DT_U8, 1, &n);
        if (!t) {
            actor_msg_free(m);
            goto out;
        }
        memcpy(t->data, j->data, (size_t)n);
    }
    bt_status_t ss = actor_send(&w->a, w->cfg.driver, m);
    if (ss && ss != BT_ERR_BUSY) log_error("rank %d: fetch reply not sent (%s)", w->cfg.rank, bt_status_str(ss));
out:
    free(j->data);
    free(j);
}

static actor_ret_t on_fetch(actor_t *self, actor_msg_t *m)
{
    ckpt_writer_t *w = (ckpt_writer_t *)self;
    const msg_ckpt_fetch_t *f = &m->body.ckpt_fetch;
    if (actor_addr_rank(m->env.src) != actor_addr_rank(w->cfg.driver)) {
        log_warn("rank %d: CKPT_FETCH from rank %u, not the driver; ignored", w->cfg.rank,
                 actor_addr_rank(m->env.src));
        return ACTOR_DONE;
    }
    if (f->phase == CKPT_FETCH_REQUEST) { /* another rank's: read it on io */
        serve_job_t *j = calloc(1, sizeof *j);
        if (!j) return ACTOR_DONE;
        j->w = w;
        j->q = *f;
        if (actor_worker_submit(w->cfg.io, &w->a, serve_run, j, free, JOB_SERVE)) free(j);
        return ACTOR_DONE;
    }
    ckpt_fetch_req_t **at = &w->pending; /* the answer to one of ours */
    while (*at && (*at)->id != f->req) at = &(*at)->next;
    ckpt_fetch_req_t *q = *at;
    if (!q) {
        log_warn("rank %d: an answer to fetch %llu, which is not pending; ignored", w->cfg.rank,
                 (unsigned long long)f->req);
        return ACTOR_DONE;
    }
    *at = q->next;
    tensor_t *t = actor_msg_tensor(m, "data");
    pthread_mutex_lock(&q->mu);
    if (q->abandoned) {
        pthread_mutex_unlock(&q->mu);
        req_release(q);
        return ACTOR_DONE;
    }
    q->status = (bt_status_t)f->status;
    snprintf(q->text, sizeof q->text, "%s", f->text);
    if (!q->status && (!t || t->dtype != DT_U8 || t->ndim != 1 || (uint64_t)t->shape[0] != q->len ||
                       f->offset != q->offset || strcmp(f->file, q->file))) {
        q->status = BT_ERR_PEER_PROTO;
        snprintf(q->text, sizeof q->text, "the answer does not match the request");
    }
    if (!q->status) memcpy(q->dst, t->data, (size_t)q->len);
    q->done = true;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return ACTOR_DONE;
}

/* On the loop: a request of this rank's restore goes out. */
static void fetch_send(ckpt_writer_t *w, ckpt_fetch_req_t *q)
{
    q->id = ++w->next_req;
    q->next = w->pending;
    w->pending = q;
    actor_msg_t *m = actor_msg_new(MSG_CKPT_FETCH);
    bt_status_t st = BT_ERR_NOMEM;
    if (m) {
        m->body.ckpt_fetch = (msg_ckpt_fetch_t){.req = q->id, .from = (uint32_t)w->cfg.rank,
                                                .phase = CKPT_FETCH_REQUEST, .step = q->step,
                                                .offset = q->offset, .length = q->len};
        snprintf(m->body.ckpt_fetch.file, sizeof m->body.ckpt_fetch.file, "%s", q->file);
        st = actor_send(&w->a, w->cfg.driver, m);
        if (st == BT_ERR_BUSY) st = BT_OK;
    }
    if (st) { /* answer it ourselves: it did not go out */
        w->pending = q->next;
        pthread_mutex_lock(&q->mu);
        bool gone = q->abandoned;
        q->status = st;
        snprintf(q->text, sizeof q->text, "the request could not be sent (%s)", bt_status_str(st));
        q->done = true;
        pthread_cond_signal(&q->cv);
        pthread_mutex_unlock(&q->mu);
        if (gone) req_release(q);
    }
}

bt_status_t ckpt_writer_fetch(void *ctx, const char *file, uint64_t offset, uint64_t len,
                              void *dst, char *err, size_t errlen)
{
    ckpt_writer_fetch_ctx_t *c = ctx;
    ckpt_fetch_req_t *q = calloc(1, sizeof *q);
    if (!q) return BT_ERR_NOMEM;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->step = c->step;
    snprintf(q->file, sizeof q->file, "%s", file);
    q->offset = offset;
    q->len = len;
    q->dst = dst;
    actor_complete(&c->w->a, TAG_FETCH, q, BT_OK);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)c->timeout_s;
    pthread_mutex_lock(&q->mu);
    int rc = 0;
    while (!q->done && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&q->cv, &q->mu, &until);
    bool done = q->done;
    bt_status_t st = done ? q->status : BT_ERR_TIMEOUT;
    if (!done) {
        q->abandoned = true; /* the loop frees it when (if) the answer comes */
        snprintf(err, errlen, "%s: no answer to a fetch of %llu bytes at %llu within %.0f s", file,
                 (unsigned long long)len, (unsigned long long)offset, c->timeout_s);
    } else if (st) {
        snprintf(err, errlen, "%s: fetch of %llu bytes at %llu: %s", file, (unsigned long long)len,
                 (unsigned long long)offset, q->text);
    }
    pthread_mutex_unlock(&q->mu);
    if (done) req_release(q);
    return st;
}

static bool test_hang(const ckpt_writer_t *w)
{
    const char *hang = getenv("BATON_TEST_CKPT_HANG"); /* tests: this rank never writes */
    return hang && *hang && atoi(hang) == w->cfg.rank;
}

static actor_ret_t on_ctl(actor_t *self, actor_msg_t *m)
{
    ckpt_writer_t *w = (ckpt_writer_t *)self;
    const msg_ckpt_ctl_t *c = &m->body.ckpt_ctl;
    uint32_t from = actor_addr_rank(m->env.src);
    if ((c->phase == CKPT_CTL_BEGIN && from != (uint32_t)w->cfg.rank) ||
        (c->phase == CKPT_CTL_COMMIT && from != actor_addr_rank(w->cfg.driver))) {
        log_warn("rank %d: checkpoint writer: CKPT_CTL phase %u from rank %u; ignored", w->cfg.rank,
                 c->phase, from);
        return ACTOR_DONE;
    }
    if (c->phase == CKPT_CTL_BEGIN) {
        if (test_hang(w)) {
            log_warn("rank %d: BATON_TEST_CKPT_HANG: the checkpoint of step %lld is never written",
                     w->cfg.rank, (long long)c->step);
            return ACTOR_DONE;
        }
        if (w->busy || w->pieces) {
            failed(w, c->step, BT_ERR_BUSY, "a save of step %lld while step %lld is still in hand",
                   (long long)c->step, (long long)w->step);
            return ACTOR_DONE;
        }
        if (c->count > (1u << 24)) {
            failed(w, c->step, BT_ERR_PEER_PROTO, "%u pieces announced", c->count);
            return ACTOR_DONE;
        }
        w->step = c->step;
        w->count = c->count;
        w->got = 0;
        w->pieces = calloc((size_t)c->count + 1, sizeof *w->pieces);
        if (!w->pieces) {
            failed(w, c->step, BT_ERR_NOMEM, "out of memory");
            return ACTOR_DONE;
        }
        if (c->count == 0) write_start(w);
        return ACTOR_DONE;
    }
    if (c->phase == CKPT_CTL_COMMIT) {
        if (w->busy || c->step != w->step) {
            failed(w, c->step, BT_ERR_PEER_PROTO, "COMMIT of step %lld, but the save in hand is "
                   "of step %lld%s", (long long)c->step, (long long)w->step, w->busy ? " (busy)" : "");
            return ACTOR_DONE;
        }
        job_reset(w->job);
        w->job->commit = m;
        bt_status_t st = job_start(w, JOB_COMMIT, c->step);
        if (st) {
            w->job->commit = NULL;
            failed(w, c->step, st, "cannot start the commit");
            return ACTOR_DONE;
        }
        return ACTOR_KEPT;
    }
    log_warn("rank %d: checkpoint writer: unexpected CKPT_CTL phase %u from %#x; ignored",
             w->cfg.rank, c->phase, m->env.src);
    return ACTOR_DONE;
}

static actor_ret_t on_piece(actor_t *self, actor_msg_t *m)
{
    ckpt_writer_t *w = (ckpt_writer_t *)self;
    const msg_ckpt_piece_t *p = &m->body.ckpt_piece;
    if (test_hang(w)) return ACTOR_DONE;
    if (actor_addr_rank(m->env.src) != (uint32_t)w->cfg.rank) {
        log_warn("rank %d: checkpoint writer: a piece from rank %u; ignored", w->cfg.rank,
                 actor_addr_rank(m->env.src));
        return ACTOR_DONE;
    }
    if (!w->pieces || w->busy || p->step != w->step || p->count != w->count || p->index >= w->count ||
        w->pieces[p->index]) {
        failed(w, p->step, BT_ERR_PEER_PROTO, "piece %u of %u (%s) of step %lld does not belong to "
               "the save in hand (step %lld, %u pieces)", p->index, p->count, p->name,
               (long long)p->step, (long long)w->step, w->count);
        return ACTOR_DONE;
    }
    w->pieces[p->index] = m;
    if (++w->got == w->count) write_start(w);
    return ACTOR_KEPT;
}

static actor_ret_t on_work_done(actor_t *self, actor_msg_t *m)
{
    ckpt_writer_t *w = (ckpt_writer_t *)self;
    ckpt_writer_job_t *j = w->job;
    bt_status_t st = m->sys.work.status;
    if (m->sys.work.tag == TAG_FETCH) {
        fetch_send(w, m->sys.work.arg);
        return ACTOR_DONE;
    }
    if (m->sys.work.tag == JOB_SERVE) {
        serve_reply(w, m->sys.work.arg, st);
        return ACTOR_DONE;
    }
    w->busy = false;
    if (m->sys.work.tag == JOB_WRITE) {
        pieces_free(w); /* the stage's snapshot goes with them */
        if (st) failed(w, j->step, st, "%s", j->err);
        else ctl_send(w, CKPT_CTL_WRITTEN, j->step, BT_OK, w->cfg.file, j->fragment);
    } else {
        if (st) failed(w, j->step, st, "%s", j->err);
        else ctl_send(w, CKPT_CTL_COMMITTED, j->step, BT_OK, NULL, NULL);
    }
    job_reset(j);
    return ACTOR_DONE;
}

static void writer_stop(actor_t *self) { pieces_free((ckpt_writer_t *)self); }

/* The driver forwards other ranks' fetches here only once it knows we are up. */
static void writer_start(actor_t *self)
{
    ckpt_writer_t *w = (ckpt_writer_t *)self;
    ctl_send(w, CKPT_CTL_UP, 0, BT_OK, NULL, NULL);
}

const actor_class_t ckpt_writer_class = {
    .name = "ckpt",
    .handlers = {
        [MSG_CKPT_CTL] = on_ctl,
        [MSG_CKPT_PIECE] = on_piece,
        [MSG_CKPT_FETCH] = on_fetch,
        [ACTOR_SYS_WORK_DONE] = on_work_done,
    },
    .start = writer_start,
    .stop = writer_stop,
};
