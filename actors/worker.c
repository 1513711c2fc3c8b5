#include "actors/worker.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace/trace.h"
#include "base/clock.h"
#include "base/log.h"

typedef struct worker_job {
    struct worker_job *next;
    actor_t           *self;
    actor_work_fn      fn;
    void              *arg;
    actor_free_fn      cleanup;
    uint64_t           tag;
} worker_job_t;

struct actor_worker {
    char            name[32];
    pthread_t       thread;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    worker_job_t   *head, **tail;
    uint32_t        backlog;
    bool            stopping;
};

static void actor_complete_(actor_t *self, uint64_t tag, void *arg, bt_status_t st,
                            actor_free_fn cleanup)
{
    actor_msg_t *m = actor_msg_new(ACTOR_SYS_WORK_DONE);
    if (!m) BT_PANIC("actor %#x: out of memory for a completion", self->addr);
    m->sys.work = (actor_work_result_t){.tag = tag, .arg = arg, .status = st, .cleanup = cleanup};
    m->env.src = m->env.dst = self->addr;
    actor_deliver_(self, m);
}

void actor_complete(actor_t *self, uint64_t tag, void *arg, bt_status_t status)
{
    actor_complete_(self, tag, arg, status, NULL);
}

void actor_complete_owned(actor_t *self, uint64_t tag, void *arg, bt_status_t status,
                          actor_free_fn cleanup)
{
    actor_complete_(self, tag, arg, status, cleanup);
}

/* Runs one job taken off the queue, on the calling (worker) thread. */
static void job_exec(actor_worker_t *w, worker_job_t *j)
{
    uint64_t t0 = clock_now_ns();
    bt_status_t st = j->fn(j->arg);
    trace_span(j->self->addr, TRACE_SPAN_COMPUTE, 0, 0xffff, -1, -1, t0, clock_now_ns());

    actor_t *self = j->self;
    actor_complete_(self, j->tag, j->arg, st, j->cleanup);
    free(j);

    pthread_mutex_lock(&w->mu);
    w->backlog--;
    pthread_mutex_unlock(&w->mu);
}

/* The next job, or NULL once stopping with nothing queued (or, with done,
 * once *done is set); with w->mu held. */
static worker_job_t *job_next(actor_worker_t *w, _Atomic bool *done)
{
    while (!w->head && !w->stopping && !(done && atomic_load(done))) pthread_cond_wait(&w->cv, &w->mu);
    if (done && atomic_load(done)) return NULL;
    worker_job_t *j = w->head;
    if (!j) return NULL;
    w->head = j->next;
    if (!w->head) w->tail = &w->head;
    return j;
}

static void *worker_main(void *arg)
{
    actor_worker_t *w = arg;
    trace_thread_name(w->name);
    for (;;) {
        pthread_mutex_lock(&w->mu);
        worker_job_t *j = job_next(w, NULL);
        pthread_mutex_unlock(&w->mu);
        if (!j) break; /* stopping and empty */
        job_exec(w, j);
    }
    return NULL;
}

bt_status_t actor_worker_yield_until(actor_worker_t *w, _Atomic bool *done)
{
    for (;;) {
        pthread_mutex_lock(&w->mu);
        worker_job_t *j = job_next(w, done);
        bool stopping = w->stopping;
        pthread_mutex_unlock(&w->mu);
        if (!j) return atomic_load(done) ? BT_OK : stopping ? BT_ERR_CANCELED : BT_ERR_INVALID;
        job_exec(w, j);
    }
}

void actor_worker_wake(actor_worker_t *w)
{
    pthread_mutex_lock(&w->mu);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

bt_status_t actor_worker_create(const char *name, actor_worker_t **out)
{
    actor_worker_t *w = calloc(1, sizeof *w);
    if (!w) return BT_ERR_NOMEM;
    snprintf(w->name, sizeof w->name, "%s", name ? name : "worker");
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->tail = &w->head;
    int rc = pthread_create(&w->thread, NULL, worker_main, w);
    if (rc != 0) {
        log_error("worker %s: pthread_create: %s", w->name, strerror(rc));
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return BT_ERR_IO;
    }
    *out = w;
    return BT_OK;
}

bt_status_t actor_worker_submit(actor_worker_t *w, actor_t *self, actor_work_fn fn, void *arg,
                                actor_free_fn cleanup, uint64_t tag)
{
    worker_job_t *j = calloc(1, sizeof *j);
    if (!j) return BT_ERR_NOMEM;
    *j = (worker_job_t){.self = self, .fn = fn, .arg = arg, .cleanup = cleanup, .tag = tag};
    pthread_mutex_lock(&w->mu);
    if (w->stopping) {
        pthread_mutex_unlock(&w->mu);
        free(j);
        return BT_ERR_CANCELED;
    }
    *w->tail = j;
    w->tail = &j->next;
    w->backlog++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return BT_OK;
}

uint32_t actor_worker_backlog(actor_worker_t *w)
{
    pthread_mutex_lock(&w->mu);
    uint32_t n = w->backlog;
    pthread_mutex_unlock(&w->mu);
    return n;
}

void actor_worker_destroy(actor_worker_t *w)
{
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stopping = true;
    worker_job_t *j = w->head;
    w->head = NULL;
    w->tail = &w->head;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    /* Jobs that never started are canceled: their args go back through cleanup. */
    while (j) {
        worker_job_t *next = j->next;
        if (j->cleanup) j->cleanup(j->arg);
        free(j);
        j = next;
    }
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
