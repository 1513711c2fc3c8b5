#include "train/expert_actor.h"

#include <stdio.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "trace/trace.h"

enum { EXPERT_JOB_RUN = 1 };

static uint32_t name_x[MODEL_MOE_X_COUNT];

/* ---- the compute thread's side ------------------------------------------------ */

/* model_t moe_group: the layer's expert part goes to the group through the
 * stage, and this thread runs the group's job when it comes (yield). */
static bt_status_t expert_group_run(void *arg, model_moe_job_t *job)
{
    expert_actor_t *x = arg;
    expert_call_t c = {.job = job, .call = ++x->calls, .x = x, .status = BT_OK};
    atomic_init(&c.done, false);
    atomic_store(&x->pending, &c);
    actor_complete(x->cfg.stage, EXPERT_JOB_ROUTED, &c, BT_OK);
    bt_status_t st = actor_worker_yield_until(x->cfg.worker, &c.done);
    expert_call_t *mine = &c;
    atomic_compare_exchange_strong(&x->pending, &mine, NULL); /* never taken (stopping) */
    if (st) {
        log_error("rank %d: layer %d: the expert group did not answer (%s)", x->cfg.rank,
                  job->layer, bt_status_str(st));
        return st;
    }
    return c.status;
}

/* The group's job, on the same compute thread: the layer's expert part,
 * and its row all-to-alls as this actor's communication spans. */
static bt_status_t expert_job_run(void *arg)
{
    expert_actor_t *x = arg;
    expert_call_t *c = x->running;
    model_moe_job_t *job = c->job;
    model_t *m = job->model;
    bt_status_t st = job->run(job);
    for (int i = 0; trace_enabled() && i < m->moe_xlog_n; i++) {
        const model_moe_x_t *e = &m->moe_xlog[i];
        trace_span(x->a.addr, TRACE_SPAN_COMM, name_x[e->what], 0xffff, x->run_step, x->run_mb, e->t0, e->t1);
    }
    m->moe_xlog_n = 0;
    return st;
}

/* ---- the stage's side (its loop) ---------------------------------------------- */

static void call_finish(expert_call_t *c, bt_status_t st)
{
    c->status = st;
    actor_worker_t *w = c->x->cfg.worker;
    atomic_store(&c->done, true);
    actor_worker_wake(w);
}

bt_status_t expert_actor_tokens_send(actor_t *stage, actor_addr_t to, expert_call_t *c, int64_t step,
                                     int32_t mb, expert_call_t **in_flight)
{
    bt_status_t st = BT_ERR_NOMEM;
    actor_msg_t *m = *in_flight ? NULL : actor_msg_new(MSG_EXPERT_TOKENS);
    if (*in_flight) {
        log_error("stage %#x: a second expert hand-over (layer %d) while call %llu is in flight",
                  stage->addr, c->job->layer, (unsigned long long)(*in_flight)->call);
        st = BT_ERR_INVALID;
    }
    if (m) {
        m->body.expert = (msg_expert_t){.call = c->call, .layer = c->job->layer,
                                        .phase = c->job->backward ? EXPERT_BWD : EXPERT_FWD,
                                        .rows = c->job->rows_out};
        m->env.step = step;
        m->env.mb = mb;
        *in_flight = c;
        if ((st = actor_send(stage, to, m)) == BT_ERR_BUSY) st = BT_OK;
        if (st) *in_flight = NULL;
    }
    if (st) call_finish(c, st);
    return st;
}

bool expert_actor_done(expert_call_t **in_flight, actor_msg_t *m)
{
    const msg_expert_t *b = &m->body.expert;
    expert_call_t *c = *in_flight;
    if (!c || b->call != c->call || b->layer != c->job->layer) {
        log_error("EXPERT_DONE from %#x for call %llu layer %d, which is not in flight; dropped",
                  m->env.src, (unsigned long long)b->call, (int)b->layer);
        return false;
    }
    *in_flight = NULL;
    call_finish(c, (bt_status_t)b->status);
    return true;
}

/* ---- the actor --------------------------------------------------------------- */

static void reply(expert_actor_t *x, const msg_expert_t *to, int64_t step, int32_t mb, int64_t rows_in,
                  bt_status_t status)
{
    actor_msg_t *m = actor_msg_new(MSG_EXPERT_DONE);
    if (!m) BT_PANIC("expert group of rank %d: out of memory for EXPERT_DONE", x->cfg.rank);
    m->body.expert = *to;
    m->body.expert.rows_in = rows_in;
    m->body.expert.status = status;
    m->env.step = step;
    m->env.mb = mb;
    bt_status_t st = actor_send(&x->a, x->cfg.stage->addr, m);
    if (st && st != BT_ERR_BUSY)
        log_error("rank %d: EXPERT_DONE not delivered to the stage (%s)", x->cfg.rank, bt_status_str(st));
}

static actor_ret_t expert_on_tokens(actor_t *self, actor_msg_t *m)
{
    expert_actor_t *x = (expert_actor_t *)self;
    const msg_expert_t *b = &m->body.expert;
    expert_call_t *c = atomic_load(&x->pending);
    const char *why = m->env.src != x->cfg.stage->addr ? "not from this rank's stage"
                      : !c || c->call != b->call      ? "no such hand-over is waiting"
                      : c->job->layer != b->layer || (b->phase == EXPERT_BWD) != c->job->backward
                          ? "not the layer and phase waiting"
                      : x->running ? "another one runs" : NULL;
    if (why) {
        log_error("rank %d: EXPERT_TOKENS from %#x (call %llu, layer %d): %s; refused", x->cfg.rank,
                  m->env.src, (unsigned long long)b->call, (int)b->layer, why);
        if (m->env.src == x->cfg.stage->addr) reply(x, b, m->env.step, m->env.mb, 0, BT_ERR_INVALID);
        return ACTOR_DONE;
    }
    atomic_store(&x->pending, NULL);
    x->running = c;
    x->run_step = m->env.step;
    x->run_mb = m->env.mb;
    bt_status_t st = actor_worker_submit(x->cfg.worker, self, expert_job_run, x, NULL, EXPERT_JOB_RUN);
    if (st) {
        x->running = NULL;
        reply(x, b, m->env.step, m->env.mb, 0, st);
    }
    return ACTOR_DONE;
}

static actor_ret_t expert_on_work_done(actor_t *self, actor_msg_t *m)
{
    expert_actor_t *x = (expert_actor_t *)self;
    expert_call_t *c = x->running;
    x->running = NULL;
    x->rows_in += (uint64_t)c->job->rows_in;
    msg_expert_t b = {.call = c->call, .layer = c->job->layer,
                      .phase = c->job->backward ? EXPERT_BWD : EXPERT_FWD, .rows = c->job->rows_out};
    reply(x, &b, x->run_step, x->run_mb, c->job->rows_in, m->sys.work.status);
    return ACTOR_DONE;
}

bt_status_t expert_actor_init(expert_actor_t *x, const expert_actor_config_t *cfg)
{
    if (cfg->n_chunks > EXPERT_MAX_CHUNKS || !cfg->stage || !cfg->worker)
        BT_PANIC("expert_actor_init: %d chunks, stage %p, worker %p", cfg->n_chunks,
                 (void *)cfg->stage, (void *)cfg->worker);
    memset(x, 0, sizeof *x);
    x->cfg = *cfg;
    atomic_init(&x->pending, NULL);
    static const char *const xnames[MODEL_MOE_X_COUNT] = {
        [MODEL_MOE_X_DISPATCH] = "moe dispatch", [MODEL_MOE_X_COMBINE] = "moe combine",
        [MODEL_MOE_X_DISPATCH_GRAD] = "moe dispatch grad", [MODEL_MOE_X_COMBINE_GRAD] = "moe combine grad"};
    for (int k = 0; k < MODEL_MOE_X_COUNT; k++) name_x[k] = trace_intern(xnames[k]);
    for (int k = 0; k < cfg->n_chunks; k++) {
        cfg->chunks[k]->moe_group = expert_group_run;
        cfg->chunks[k]->moe_group_arg = x;
    }
    return BT_OK;
}

void expert_actor_fini(expert_actor_t *x)
{
    for (int k = 0; k < x->cfg.n_chunks; k++)
        if (x->cfg.chunks[k] && x->cfg.chunks[k]->moe_group_arg == x) {
            x->cfg.chunks[k]->moe_group = NULL;
            x->cfg.chunks[k]->moe_group_arg = NULL;
        }
    if (x->cfg.n_chunks)
        log_debug("rank %d: expert group ran its experts on %llu routed rows in %llu hand-overs",
                  x->cfg.rank, (unsigned long long)x->rows_in, (unsigned long long)x->calls);
    memset(x, 0, sizeof *x);
}

const actor_class_t expert_actor_class = {
    .name = "experts",
    .handlers = {
        [MSG_EXPERT_TOKENS] = expert_on_tokens,
        [ACTOR_SYS_WORK_DONE] = expert_on_work_done,
    },
};
