#include "train/stage_actor.h"

#include "model/cp_attn.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "trace/trace.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "kernels/kernels.h"
#include "train/ckpt_state.h"
#include "train/data_actor.h"
#include "train/expert_actor.h"

enum { JOB_OP = 1, JOB_END = 2, JOB_GATHER = 3, JOB_STAGED = 4, JOB_SNAP = 5 };

/* ---- host buffers of staged outputs ---------------------------------------- */

/* Buffers of one activation's bytes (the largest [B,T,C] of the stage),
 * from kern_host_alloc (pinned on cuda: the copy from the device runs at
 * full speed and asynchronously). A message borrows one and gives it back
 * when it is freed, on whatever thread that is; the pool outlives its
 * owner until the last borrowed buffer is back. */
#define STAGING_MAX 64
typedef struct staging_buf {
    stage_staging_t    *pool;
    void               *p;
    struct staging_buf *next;
} staging_buf_t;

struct stage_staging {
    pthread_mutex_t mu;
    device_t        dev;
    size_t          cap;
    staging_buf_t  *free;
    int             n, out;
    bool            closing;
};

static stage_staging_t *staging_new(device_t dev, size_t cap)
{
    stage_staging_t *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    if (pthread_mutex_init(&p->mu, NULL)) {
        free(p);
        return NULL;
    }
    p->dev = dev;
    p->cap = cap;
    return p;
}

static staging_buf_t *staging_get(stage_staging_t *p)
{
    pthread_mutex_lock(&p->mu);
    staging_buf_t *b = p->free;
    if (b) p->free = b->next;
    else if (p->n < STAGING_MAX && (b = calloc(1, sizeof *b))) {
        if (kern_host_alloc(p->dev, p->cap, &b->p)) {
            free(b);
            b = NULL;
        } else {
            b->pool = p;
            p->n++;
        }
    }
    if (b) p->out++;
    pthread_mutex_unlock(&p->mu);
    if (!b) log_error("stage: no host buffer for a staged activation (%d in flight)", p->n);
    return b;
}

static void staging_free_pool(stage_staging_t *p)
{
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static void staging_put(void *arg)
{
    staging_buf_t *b = arg;
    stage_staging_t *p = b->pool;
    pthread_mutex_lock(&p->mu);
    p->out--;
    bool last = false;
    if (p->closing) {
        kern_host_free(p->dev, b->p);
        free(b);
        last = p->out == 0;
    } else {
        b->next = p->free;
        p->free = b;
    }
    pthread_mutex_unlock(&p->mu);
    if (last) staging_free_pool(p);
}

static void staging_close(stage_staging_t *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->closing = true;
    while (p->free) {
        staging_buf_t *b = p->free;
        p->free = b->next;
        kern_host_free(p->dev, b->p);
        free(b);
    }
    bool last = p->out == 0;
    pthread_mutex_unlock(&p->mu);
    if (last) staging_free_pool(p);
}

/* A staged output on its way: sent when its copy is done. */
typedef struct {
    stage_actor_t *s;
    actor_msg_t   *m;
    actor_addr_t   to;
} stage_send_t;

static void stage_send_drop(void *arg)
{
    stage_send_t *r = arg;
    actor_msg_free(r->m);
    free(r);
}

/* The one job in flight (ops run one at a time, in list order). */
struct stage_job {
    stage_actor_t *s;
    pipe_op_t      op;
    int            v;           /* virtual stage */
    float          dloss;       /* 0 for an evaluation forward */
    model_acts_t  *acts;
    model_batch_t  batch;
    const void    *x_in, *dx_out; /* host: message payloads in the activation dtype */
    /* the router's load-balancing carry (model_aux_len doubles, "aux" with
     * the activation, "daux" with its gradient): what came in, and where
     * the outgoing message holds it; NULL when none */
    const double  *aux_in;
    double        *aux_out;
    int64_t        aux_n;
    actor_msg_t   *out;         /* sent on completion (ACTIVATION / ACT_GRAD) */
    model_loss_t   loss;
    int64_t        step;
    double         grad_norm, lr;
    bool           skipped;   /* the step's norm was not finite: no update anywhere */
    /* handoff (train/handoff.h): the op's input is a neighbour's buffer
     * (ho_in, from ho_in_src), its output goes into one of ours (ho_out
     * asked, ho_taken once the compute thread has the buffer) */
    bool           ho_in, ho_out, ho_taken;
    handoff_desc_t ho_in_d, ho_out_d;
    actor_addr_t   ho_in_src;
    int64_t        out_shape[3];
    actor_addr_t   out_to;         /* where the output goes (next or previous stage) */
    int            arena;          /* index of acts in s->acts */
    stage_send_t  *staged;         /* the output goes out when its copy is done */
    void          *stage_buf;      /* ... from the device into this host buffer */
    bool           staged_queued;  /* the copy and its notification are queued */
};

static uint32_t name_fwd, name_bwd, name_opt, name_moe_exchange, name_moe_experts, name_moe_a2a,
    name_moe_a2a_wait, name_moe_dropped, name_moe_x[MODEL_MOE_X_COUNT];

static void export_params(stage_actor_t *s);
static void export_bufs_free(stage_actor_t *s);
struct stage_snap {
    stage_actor_t  *s;
    int64_t         step;
    ckpt_snapshot_t snap;
    atomic_int      refs;
};
static void snap_send(stage_actor_t *s, stage_snap_t *sn);
static void snap_drop(void *arg);

static int ix(const stage_actor_t *s, int mb, int chunk) { return mb * s->cfg.pipe.vpp + chunk; }
static int vstage_of(const stage_actor_t *s, int chunk)
{
    return chunk * s->cfg.pipe.pp + s->cfg.pp_rank;
}

static bt_status_t pass_alloc(stage_pass_t *p, int n_mb, int vpp, int n_ops, bool eval)
{
    p->eval = eval;
    p->n_mb = n_mb;
    p->n_ops = n_ops;
    p->ops = calloc((size_t)n_ops + 1, sizeof *p->ops);
    p->data_in = calloc((size_t)n_mb + 1, sizeof *p->data_in);
    p->act_in = calloc((size_t)(n_mb * vpp) + 1, sizeof *p->act_in);
    p->grad_in = calloc((size_t)(n_mb * vpp) + 1, sizeof *p->grad_in);
    return p->ops && p->data_in && p->act_in && p->grad_in ? BT_OK : BT_ERR_NOMEM;
}

static void pass_release(stage_pass_t *p, int vpp)
{
    if (!p->data_in) return;
    for (int k = 0; k < p->n_mb; k++)
        if (p->data_in[k]) { actor_msg_free(p->data_in[k]); p->data_in[k] = NULL; }
    for (int k = 0; k < p->n_mb * vpp; k++) {
        if (p->act_in[k]) { actor_msg_free(p->act_in[k]); p->act_in[k] = NULL; }
        if (p->grad_in[k]) { actor_msg_free(p->grad_in[k]); p->grad_in[k] = NULL; }
    }
}

static void pass_free(stage_pass_t *p)
{
    free(p->ops);
    free(p->data_in);
    free(p->act_in);
    free(p->grad_in);
}

/* Local evaluation microbatches of data-parallel rank d: global ones d, d+dp, ... */
static int eval_local_mbs(const stage_actor_config_t *c)
{
    int64_t K = (c->eval_rows + c->B - 1) / c->B;
    int d = c->eval_pad ? 0 : c->dp_rank;
    return K > d ? (int)((K - d + c->dp_size - 1) / c->dp_size) : 0;
}

bt_status_t stage_actor_init(stage_actor_t *s, const stage_actor_config_t *cfg)
{
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    s->dropped = -1;
    if (s->cfg.dp_size < 1) s->cfg.dp_size = 1;
    if (s->cfg.cp_size < 1) s->cfg.cp_size = 1;
    int M = cfg->pipe.microbatches, V = cfg->pipe.vpp, E = eval_local_mbs(&s->cfg);
    s->acts = calloc((size_t)(M * V), sizeof *s->acts);
    s->job = calloc(1, sizeof *s->job);
    bt_status_t st = s->acts && s->job ? BT_OK : BT_ERR_NOMEM;
    if (!st && s->cfg.cp_size > 1) { /* every microbatch's rows hold the same chunks */
        if (cfg->T % 2 || !(s->cp_pos = malloc((size_t)(cfg->B * cfg->T) * sizeof *s->cp_pos))) {
            log_error("stage: %lld tokens a row do not hold two CP chunks", (long long)cfg->T);
            st = cfg->T % 2 ? BT_ERR_INVALID : BT_ERR_NOMEM;
        } else {
            cp_attn_positions(s->cp_pos, cfg->B, cfg->T / 2, s->cfg.cp_size, s->cfg.cp_rank);
        }
    }
    if (!st && s->cfg.cp_size > 1 && cfg->cp_msgs) { /* the ring's blocks as CP_BLOCK messages */
        cp_ring_config_t rc = {.stage = &s->a, .rank = cfg->rank, .cp_rank = cfg->cp_rank,
                               .cp_size = cfg->cp_size, .cp_ranks = cfg->cp_ranks,
                               .next = cfg->cp_next, .prev = cfg->cp_prev,
                               .timeout_s = cfg->cp_timeout_s > 0 ? cfg->cp_timeout_s : 300};
        st = cp_ring_init(&s->cp_ring, &rc);
        s->cp_ring_on = st == BT_OK;
        for (int k = 0; k < V && !st; k++) {
            cfg->chunks[k]->par.cp_msgs = &cp_ring_ops;
            cfg->chunks[k]->par.cp_msgs_arg = &s->cp_ring;
        }
    }
    if (!st) st = pass_alloc(&s->train, M, V, pipe_ops_per_stage(&cfg->pipe), false);
    if (!st) st = pass_alloc(&s->eval, E, V, E * V, true);
    if (!st) st = pipe_schedule_build(&cfg->pipe, cfg->pp_rank, s->train.ops);
    for (int j = 0, n = 0; j < E; j++) /* forward only: microbatch by microbatch, chunk by chunk */
        for (int k = 0; k < V; k++)
            s->eval.ops[n++] = (pipe_op_t){.kind = PIPE_OP_FWD, .mb = j, .chunk = k};
    /* evaluation runs microbatch 0's arena of each chunk (ix(s, 0, chunk)) */
    for (int k = 0; k < (cfg->eval_only ? V : M * V) && !st; k++)
        st = (cfg->eval_only ? model_acts_create_fwd : model_acts_create)(cfg->chunks[k % V], cfg->B,
                                                                        cfg->T, &s->acts[k]);
    if (st) {
        stage_actor_fini(s);
        return st;
    }
    device_t dev = cfg->chunks[0]->place.dev;
    size_t act_bytes = (size_t)cfg->B * (size_t)cfg->T * (size_t)cfg->chunks[0]->cfg.hidden_size *
                       dtype_size(cfg->chunks[0]->place.act_dtype);
    s->ev_copied = calloc((size_t)(M * V), sizeof *s->ev_copied);
    s->staging = staging_new(dev, act_bytes);
    if (!st && (!s->ev_copied || !s->staging)) st = BT_ERR_NOMEM;
    if (!st) st = kern_stream_create(dev, &s->copy);
    if (!st) st = kern_event_create(dev, &s->ev_compute);
    for (int k = 0; k < M * V && !st; k++) st = kern_event_create(dev, &s->ev_copied[k]);
    if (st) {
        stage_actor_fini(s);
        return st;
    }
    if (cfg->rank == 0 && !device_is_host(dev) && dev.kind != DEV_FENCED)
        s->peak_flops = kern_peak_flops(dev, cfg->chunks[0]->place.param_dtype);
    handoff_map_init(&s->ho_map, dev);
    for (int k = 0; k < V; k++) s->ho_on |= cfg->handoff_next[k] || cfg->handoff_prev[k];
    if (s->ho_on && (st = handoff_pool_init(&s->ho_pool, dev))) {
        s->ho_on = false;
        stage_actor_fini(s);
        return st;
    }
    s->cur = &s->train;
    s->step = s->done_step = cfg->first_step;
    name_fwd = trace_intern("fwd");
    name_moe_exchange = trace_intern("moe exchange ms");
    name_moe_experts = trace_intern("moe experts ms");
    name_moe_a2a = trace_intern("moe a2a ms");
    name_moe_a2a_wait = trace_intern("moe a2a wait ms");
    name_moe_dropped = trace_intern("moe dropped");
    static const char *const xnames[MODEL_MOE_X_COUNT] = {
        [MODEL_MOE_X_DISPATCH] = "moe dispatch", [MODEL_MOE_X_COMBINE] = "moe combine",
        [MODEL_MOE_X_DISPATCH_GRAD] = "moe dispatch grad", [MODEL_MOE_X_COMBINE_GRAD] = "moe combine grad"};
    for (int k = 0; k < MODEL_MOE_X_COUNT; k++) name_moe_x[k] = trace_intern(xnames[k]);
    name_bwd = trace_intern("bwd");
    name_opt = trace_intern("optim");
    return BT_OK;
}

static void inputs_release(stage_actor_t *s)
{
    pass_release(&s->train, s->cfg.pipe.vpp);
    pass_release(&s->eval, s->cfg.pipe.vpp);
}

void stage_actor_fini(stage_actor_t *s)
{
    if (s->acts)
        for (int k = 0; k < s->cfg.pipe.microbatches * s->cfg.pipe.vpp; k++)
            model_acts_destroy(s->acts[k]);
    free(s->acts);
    free(s->load);
    free(s->cp_pos);
    if (s->cp_ring_on) {
        for (int k = 0; k < s->cfg.pipe.vpp; k++)
            if (s->cfg.chunks[k]) s->cfg.chunks[k]->par.cp_msgs = NULL;
        cp_ring_fini(&s->cp_ring);
    }
    pass_free(&s->train);
    pass_free(&s->eval);
    export_bufs_free(s);
    stage_snap_t *spare = atomic_exchange(&s->snap_spare, NULL);
    if (spare) {
        ckpt_snapshot_free(&spare->snap);
        free(spare);
    }
    free(s->job);
    if (s->copy) { /* the last staged copies read the arenas: let them finish */
        kern_stream_sync(s->copy);
        kern_stream_destroy(s->copy);
    }
    if (s->ev_compute) kern_event_destroy(s->ev_compute);
    if (s->ev_copied)
        for (int k = 0; k < s->cfg.pipe.microbatches * s->cfg.pipe.vpp; k++)
            if (s->ev_copied[k]) kern_event_destroy(s->ev_copied[k]);
    free(s->ev_copied);
    staging_close(s->staging);
    handoff_map_fini(&s->ho_map);
    if (s->ho_on) {
        int n;
        size_t bytes;
        handoff_pool_usage(&s->ho_pool, &n, &bytes);
        log_info("rank %d: handed %llu tensors off through %d shared buffers (%.2f MB), %llu released",
                 s->cfg.rank, (unsigned long long)s->ho_pool.handed, n, (double)bytes / 1e6,
                 (unsigned long long)s->ho_pool.released);
        handoff_pool_fini(&s->ho_pool);
    }
    memset(s, 0, sizeof *s);
}

static void report(stage_actor_t *s, bt_status_t status, uint32_t peer, const char *where,
                   const char *text)
{
    actor_msg_t *m = actor_msg_new(MSG_ERROR_REPORT);
    if (!m) return;
    msg_error_report_t *r = &m->body.error_report;
    r->status = status;
    r->actor = s->a.addr;
    r->peer = peer;
    snprintf(r->where, sizeof r->where, "%s", where);
    snprintf(r->text, sizeof r->text, "%s", text);
    m->env.step = s->step;
    actor_send(&s->a, s->cfg.driver, m);
}

/* The "wait" text of an ALIVE heartbeat (train/stage_actor.h): built once
 * a heartbeat interval, nothing on the path of a step. */
static void wait_describe(stage_actor_t *s, char *buf, size_t cap)
{
    uint64_t now = clock_now_ns();
    size_t at = 0;
    int k = 0;
    buf[0] = 0;
    if (s->running && s->busy)
        k = snprintf(buf, cap, "busy %lld %llu\n", (long long)s->step,
                     (unsigned long long)((now - s->busy_t0) / 1000000));
    else if (s->running && s->wait_type)
        k = snprintf(buf, cap, "pipe %s %lld %d %d %u %llu\n", msg_type_name(s->wait_type),
                     (long long)(s->cur && s->cur->eval ? STAGE_EVAL_STEP : s->step), s->wait_mb,
                     s->wait_vstage, s->wait_from, (unsigned long long)((now - s->wait_t0) / 1000000));
    if (k > 0 && (size_t)k < cap) at = (size_t)k;
    at += coll_watch_describe(buf + at, cap - at, now);
    actor_last_msg_t lm[2];
    actor_last_msgs(&lm[0], &lm[1]);
    for (int i = 0; i < 2 && at + 1 < cap; i++) {
        if (!lm[i].valid) continue;
        k = snprintf(buf + at, cap - at, "%s %s %u %lld %d %llu\n", i ? "recv" : "sent",
                     msg_type_name(lm[i].type), lm[i].peer, (long long)lm[i].step, lm[i].mb,
                     (unsigned long long)(now > lm[i].t_ns ? (now - lm[i].t_ns) / 1000000 : 0));
        if (k > 0) at += (size_t)k < cap - at ? (size_t)k : cap - at - 1;
    }
}

static void heartbeat_send(stage_actor_t *s, uint32_t state)
{
    actor_msg_t *m = actor_msg_new(MSG_HEARTBEAT);
    if (!m) return;
    m->body.heartbeat = (msg_heartbeat_t){.t_ns = clock_now_ns(), .rank = (uint32_t)s->cfg.rank,
                                          .state = state, .step = s->done_step};
    if (state == STAGE_ST_ALIVE) {
        char text[1024];
        wait_describe(s, text, sizeof text);
        if (text[0]) actor_msg_text_add(m, "wait", text); /* out of memory: a plain heartbeat */
    }
    actor_send(&s->a, s->cfg.driver, m);
}

static void stage_on_timer(actor_t *self, actor_timer_t *t)
{
    (void)t;
    heartbeat_send((stage_actor_t *)self, STAGE_ST_ALIVE);
}

static void stage_start(actor_t *self)
{
    stage_actor_t *s = (stage_actor_t *)self;
    heartbeat_send(s, STAGE_ST_READY);
    actor_timer_start(self, &s->hb, s->cfg.heartbeat_s, s->cfg.heartbeat_s, stage_on_timer);
}

static void stage_stop(actor_t *self)
{
    stage_actor_t *s = (stage_actor_t *)self;
    /* a compute job waiting for a ring block gives up now */
    if (s->cp_ring_on) cp_ring_fail(&s->cp_ring, BT_ERR_CANCELED, "this rank's stage is stopping");
    inputs_release(s);
}

/* ---- compute jobs (worker thread) ----------------------------------------- */

/* CPU time of the calling (compute) thread, for the spans' per-op compute
 * time; 0 when the clock is unavailable. */
static uint64_t stage_cpu_ns(void)
{
    struct timespec ts;
    if (!trace_enabled() || clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)) return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The copy of a staged output is done (any thread): its message may go. */
static void staged_copied(void *arg, bt_status_t status)
{
    stage_send_t *r = arg;
    actor_complete_owned(&r->s->a, JOB_STAGED, r, status, stage_send_drop);
}

/* Test hook: BATON_TEST_SLOW_EVAL_MS=N makes every evaluation forward of
 * this process take N ms longer (tests/sh/test_run.sh watches the driver's
 * progress lines of a long evaluation with it). */
static void test_slow_eval(void)
{
    const char *e = getenv("BATON_TEST_SLOW_EVAL_MS");
    long ms = e ? strtol(e, NULL, 10) : 0;
    if (ms > 0) nanosleep(&(struct timespec){ms / 1000, ms % 1000 * 1000000L}, NULL);
}

/* The op's EP row all-to-alls (model_t moe_xlog) as communication spans
 * of this stage, beside its compute span: in flight from start to
 * completion, so where they lie inside the compute span is the overlap. */
static void moe_xlog_trace(stage_actor_t *s, model_t *m, const stage_job_t *j)
{
    for (int i = 0; trace_enabled() && i < m->moe_xlog_n; i++) {
        const model_moe_x_t *x = &m->moe_xlog[i];
        trace_span(s->a.addr, TRACE_SPAN_COMM, name_moe_x[x->what], 0xffff, j->step, j->op.mb,
                   x->t0, x->t1);
    }
    m->moe_xlog_n = 0;
}

static bt_status_t job_op_run(void *arg)
{
    stage_job_t *j = arg;
    stage_actor_t *s = j->s;
    model_t *m = s->cfg.chunks[j->op.chunk];
    model_acts_t *a = j->acts;
    uint64_t t0 = clock_now_ns(), c0 = stage_cpu_ns();
    bool fwd = j->op.kind == PIPE_OP_FWD;
    tensor_t in_v, out_v;
    bt_status_t st = j->ho_in ? handoff_map_view(&s->ho_map, &j->ho_in_d, &in_v) : BT_OK;
    if (st == BT_OK && j->ho_out) {
        st = handoff_take(&s->ho_pool, m->place.act_dtype, 3, j->out_shape, &out_v, &j->ho_out_d);
        j->ho_taken = st == BT_OK;
    }
    model_io_t in = j->ho_in ? MODEL_IO_DEV(&in_v) : MODEL_IO_HOST(fwd ? j->x_in : j->dx_out);
    /* no output (the last stage forward, the first backward), or one of ours handed off, or staged */
    model_io_t out = j->ho_taken ? MODEL_IO_DEV(&out_v) : j->staged ? MODEL_IO_KEEP : (model_io_t){0};
    /* this arena's last output may still be on its way to the host */
    kern_stream_wait(m->stream, s->ev_copied[j->arena]);
    if (fwd && s->cur->eval) test_slow_eval();
    if (s->cp_ring_on) /* the tag of the op's ring blocks */
        cp_ring_context(&s->cp_ring, s->cur->eval ? STAGE_EVAL_STEP : j->step, j->op.mb,
                        (uint32_t)j->op.chunk);
    if (j->aux_in) memcpy(model_acts_aux(a, !fwd), j->aux_in, (size_t)j->aux_n * sizeof *j->aux_in);
    if (st == BT_OK && fwd)
        st = model_stage_forward_at(m, a, &j->batch, in, j->dloss, out,
                                    m->stage.has_head ? &j->loss : NULL);
    else if (st == BT_OK)
        st = model_stage_backward_at(m, a, in, out);
    moe_xlog_trace(s, m, j);
    if (st == BT_OK && j->aux_out)
        memcpy(j->aux_out, model_acts_aux(a, !fwd), (size_t)j->aux_n * sizeof *j->aux_out);
    if (st && j->ho_taken) { /* nothing goes out: the buffer is ours again */
        handoff_release(&s->ho_pool, j->ho_out_d.slot, j->ho_out_d.gen);
        j->ho_taken = false;
    }
    if (st == BT_OK && j->staged) { /* the copy overlaps with the next op */
        tensor_t y = fwd ? model_acts_x_out(a) : model_acts_dx_in(a);
        kern_event_record(s->ev_compute, m->stream);
        kern_stream_wait(s->copy, s->ev_compute);
        kern_download(s->copy, j->stage_buf, &y);
        kern_event_record(s->ev_copied[j->arena], s->copy);
        st = kern_stream_notify(s->copy, staged_copied, j->staged);
        j->staged_queued = st == BT_OK;
    }
    trace_span_cpu(s->a.addr, j->op.kind == PIPE_OP_FWD ? name_fwd : name_bwd, j->step, j->op.mb, t0,
                   clock_now_ns(), stage_cpu_ns() - c0);
    return st;
}

/* This step's routed-expert load of every chunk into s->load (compute
 * thread: the counts live on the device), reset for the next step. */
static bt_status_t load_take(stage_actor_t *s)
{
    int rows = 0, cols = 0;
    for (int k = 0; k < s->cfg.pipe.vpp; k++) {
        rows += s->cfg.chunks[k]->n_moe;
        cols = (int)s->cfg.chunks[k]->cfg.moe.n_experts + 1;
    }
    s->n_load = 0;
    s->dropped = -1;
    for (int k = 0; k < s->cfg.pipe.vpp; k++) {
        int64_t d = model_moe_dropped_take(s->cfg.chunks[k]);
        if (d >= 0) s->dropped = (s->dropped < 0 ? 0 : s->dropped) + d;
    }
    if (!rows) return BT_OK;
    if (!s->load && !(s->load = malloc((size_t)rows * (size_t)cols * sizeof *s->load)))
        return BT_ERR_NOMEM;
    for (int k = 0; k < s->cfg.pipe.vpp; k++)
        s->n_load += model_moe_load_take(s->cfg.chunks[k], s->load + (size_t)s->n_load * (size_t)cols);
    s->load_cols = cols;
    /* the step's load over the global batch: the data-parallel replicas'
     * sum (TP ranks counted the same rows), then every rank moves its
     * selection biases alike */
    bt_status_t st = s->cfg.opt ? dist_optim_load_sum(s->cfg.opt, s->load, s->n_load, cols) : BT_OK;
    for (int k = 0, at = 0; k < s->cfg.pipe.vpp && !st; at += s->cfg.chunks[k]->n_moe, k++)
        st = model_moe_balance(s->cfg.chunks[k], s->load + (size_t)at * (size_t)cols);
    return st;
}

static bt_status_t job_end_run(void *arg)
{
    stage_job_t *j = arg;
    uint64_t t0 = clock_now_ns();
    bt_status_t lst = load_take(j->s);
    if (lst) return lst;
    /* only the last stage's tp rank 0 sums the loss (stage_on_work_done) */
    bool loss_bad = !isfinite(j->s->loss_sum);
    bt_status_t st =
        dist_optim_step(j->s->cfg.opt, j->step - 1, loss_bad, &j->grad_norm, &j->lr, &j->skipped);
    trace_span(j->s->a.addr, TRACE_SPAN_COMPUTE, name_opt, 0xffff, j->step, -1, t0, clock_now_ns());
    return st;
}

/* The export's tensors of chunk m: its parameters, then its selection
 * biases (model_moe_bias_views; the same on every rank, sent by the
 * exporter from its own). */
static int export_n(const model_t *m) { return m->n_params + model_moe_bias_views(m, NULL, NULL); }

static void export_bufs_free(stage_actor_t *s)
{
    for (int c = 0; c < STAGE_MAX_CHUNKS; c++) {
        if (!s->export_buf[c]) continue;
        for (int i = 0; i < export_n(s->cfg.chunks[c]); i++) free(s->export_buf[c][i]);
        free(s->export_buf[c]);
        s->export_buf[c] = NULL;
    }
}

/* Whether this rank takes part in gathering parameter i of m for the
 * export: the exporter always; a TP shard's TP group of data-parallel
 * replica 0; an expert tensor's EP group of edp rank 0 (the exporter's). */
static bool gather_joins(const stage_actor_t *s, const model_t *m, int i)
{
    const shard_spec_t *sp = &m->params[i].spec;
    if (s->cfg.exporter) return true;
    if (MODEL_PARAM_IS_EXPERT(sp)) return m->par.ep_size > 1 && m->par.edp_rank == 0;
    return sp->group != SHARD_GROUP_NONE && m->par.tp_size > 1 && s->cfg.dp_rank == 0 &&
           s->cfg.cp_rank == 0;
}

/* Whether this rank has any gathering of the export to join. */
static bool gather_any(const stage_actor_t *s)
{
    for (int k = 0; k < s->cfg.pipe.vpp; k++)
        for (int i = 0; i < s->cfg.chunks[k]->n_params; i++)
            if (gather_joins(s, s->cfg.chunks[k], i)) return true;
    return false;
}

/* The export's tensors, whole, in host memory: one f32 buffer per parameter
 * (read from the device; with TP gathered over the group, a collective
 * every TP rank of the replica takes part in; an expert tensor over the
 * exporter's EP group). The exporter keeps them, each to travel in its
 * CKPT_SHARD message, which frees it; the other ranks gather what they
 * join (gather_joins) into one scratch buffer they reuse. */
static bt_status_t job_gather_run(void *arg)
{
    stage_job_t *j = arg;
    stage_actor_t *s = j->s;
    export_bufs_free(s);
    bool keep = s->cfg.exporter;
    float *scratch = NULL;
    int64_t scratch_n = 0;
    bt_status_t st = BT_OK;
    for (int k = 0; k < s->cfg.pipe.vpp && st == BT_OK; k++) {
        model_t *m = s->cfg.chunks[k];
        if (keep && !(s->export_buf[k] = calloc((size_t)export_n(m) + 1, sizeof(float *)))) {
            st = BT_ERR_NOMEM;
            break;
        }
        int nb = keep ? model_moe_bias_views(m, NULL, NULL) : 0;
        tensor_t *bv = nb ? calloc((size_t)nb, sizeof *bv) : NULL;
        if (nb && !bv) st = BT_ERR_NOMEM;
        else if (nb) model_moe_bias_views(m, bv, NULL);
        for (int b = 0; b < nb && st == BT_OK; b++) {
            float *buf = s->export_buf[k][m->n_params + b] = malloc((size_t)tensor_numel(&bv[b]) * sizeof *buf);
            if (!buf) st = BT_ERR_NOMEM;
            else kern_download(m->stream, buf, &bv[b]);
        }
        if (nb && st == BT_OK) st = kern_stream_sync(m->stream);
        free(bv);
        for (int i = 0; i < m->n_params && st == BT_OK; i++) {
            if (!gather_joins(s, m, i)) continue;
            int64_t n = shard_global_numel(&m->params[i].spec);
            float *buf;
            if (keep) {
                buf = s->export_buf[k][i] = malloc((size_t)n * sizeof *buf + 1);
            } else {
                if (n > scratch_n) {
                    free(scratch);
                    scratch = malloc((size_t)n * sizeof *scratch + 1);
                    scratch_n = scratch ? n : 0;
                }
                buf = scratch;
            }
            st = buf ? model_param_gather(m, i, false, buf) : BT_ERR_NOMEM;
        }
    }
    free(scratch);
    return st;
}

static void export_buf_release(void *buf) { free(buf); }

/* ---- the op walk (loop thread) --------------------------------------------- */

static bt_status_t job_submit(stage_actor_t *s, actor_work_fn fn, uint64_t tag)
{
    bt_status_t st = actor_worker_submit(s->cfg.worker, &s->a, fn, s->job, NULL, tag);
    if (st == BT_OK) {
        s->busy = true;
        s->wait_type = 0;
        s->busy_t0 = clock_now_ns();
    }
    return st;
}

/* advance() stops: the op due needs message `type` of mb for virtual stage
 * vstage from `from` (kept for the heartbeat's "wait"). */
static void wait_for(stage_actor_t *s, uint32_t type, int mb, int vstage, actor_addr_t from)
{
    if (s->wait_type == type && s->wait_mb == mb && s->wait_vstage == vstage) return;
    s->wait_type = type;
    s->wait_mb = mb;
    s->wait_vstage = vstage;
    s->wait_from = actor_addr_rank(from);
    s->wait_t0 = clock_now_ns();
}

/* Test hook for hang reports: BATON_TEST_HOLD_ACTIVATION="STEP@RANK" makes
 * that rank drop (never send) its ACTIVATION of microbatch 0 of that step.
 * True when m was that message (then freed). */
static bool test_hold_due(const stage_actor_t *s, actor_msg_t *m)
{
    const char *v = getenv("BATON_TEST_HOLD_ACTIVATION");
    long long at;
    int r;
    if (!v || m->env.type != MSG_ACTIVATION || m->env.mb != 0 || sscanf(v, "%lld@%d", &at, &r) != 2 ||
        at != m->env.step || r != s->cfg.rank)
        return false;
    log_warn("rank %d: BATON_TEST_HOLD_ACTIVATION: the ACTIVATION of step %lld microbatch 0 is never sent",
             s->cfg.rank, at);
    actor_msg_free(m);
    return true;
}

static void fail(stage_actor_t *s, bt_status_t st, const char *what)
{
    char text[MSG_TEXT_MAX];
    snprintf(text, sizeof text, "rank %d step %lld: %s failed (%s)", s->cfg.rank,
             (long long)s->step, what, bt_status_str(st));
    log_error("%s", text);
    report(s, st, 0xffffffffu, what, text);
    s->running = false;
}

static void metrics_send(stage_actor_t *s);

/* The op's pipeline input NAME from message m, as bytes or handed off:
 * checked against [rows, T, C] in the activation dtype (rows < 0: any, the
 * activation's own) before anything reads it. Sets the job's input and
 * out_shape[0] to its rows; false after a failure report. */
static bool pipe_input(stage_actor_t *s, stage_job_t *j, actor_msg_t *m, const char *name, int chunk,
                       int64_t rows)
{
    const model_t *mod = s->cfg.chunks[chunk];
    bool handed;
    tensor_t *t = handoff_msg_tensor(m, name, &handed);
    int nd = t->ndim;
    const int64_t *sh = t->shape;
    dtype_t dt = t->dtype;
    if (handed) {
        char err[160], text[224];
        bt_status_t st = handoff_desc_read(t, &j->ho_in_d, err, sizeof err);
        if (st) {
            snprintf(text, sizeof text, "%s from rank %u: %s", name, actor_addr_rank(m->env.src), err);
            fail(s, st, text);
            return false;
        }
        nd = j->ho_in_d.ndim, sh = j->ho_in_d.shape, dt = j->ho_in_d.dtype;
        j->ho_in = true;
        j->ho_in_src = m->env.src;
    }
    if (nd != 3 || dt != mod->place.act_dtype || (rows >= 0 && sh[0] != rows) || sh[1] != s->cfg.T ||
        sh[2] != mod->cfg.hidden_size) {
        char text[160];
        snprintf(text, sizeof text, "%s from rank %u: not [%s, %lld, %lld] %s", name, actor_addr_rank(m->env.src),
                 rows >= 0 ? "B" : "rows", (long long)s->cfg.T, (long long)mod->cfg.hidden_size,
                 dtype_name(mod->place.act_dtype));
        fail(s, BT_ERR_INVALID, text);
        return false;
    }
    /* the router's load-balancing sums (forward) or gradient (backward) */
    bool grad = j->op.kind != PIPE_OP_FWD;
    int64_t na = model_aux_len(mod, grad);
    const char *aux = grad ? "daux" : "aux";
    tensor_t *at = na ? actor_msg_tensor(m, aux) : NULL;
    if (na && (!at || at->dtype != DT_F64 || at->ndim != 1 || at->shape[0] != na)) {
        char text[200];
        snprintf(text, sizeof text, "%s from rank %u: %s (the router's load-balancing %s, [%lld] f64)",
                 aux, actor_addr_rank(m->env.src), at ? "wrong shape or dtype" : "missing",
                 grad ? "gradient" : "sums", (long long)na);
        fail(s, BT_ERR_INVALID, text);
        return false;
    }
    j->aux_in = at ? at->data : NULL;
    j->aux_n = na;
    j->out_shape[0] = sh[0];
    if (!handed) {
        if (j->op.kind == PIPE_OP_FWD) j->x_in = t->data;
        else j->dx_out = t->data;
    }
    return true;
}

/* The op's output message: the tensor NAME [rows, T, C] as bytes, or (hand)
 * a buffer of ours the compute thread takes and the message describes. */
static bool pipe_output(stage_actor_t *s, stage_job_t *j, uint32_t type, const char *name, int chunk,
                        int64_t rows, bool hand)
{
    const model_t *mod = s->cfg.chunks[chunk];
    int64_t shape[3] = {rows, s->cfg.T, mod->cfg.hidden_size};
    memcpy(j->out_shape, shape, sizeof shape);
    j->out_to = j->op.kind == PIPE_OP_FWD ? s->cfg.next[chunk] : s->cfg.prev[chunk];
    j->out = actor_msg_new(type);
    if (j->out) {
        j->out->env.step = s->cur->eval ? STAGE_EVAL_STEP : s->step;
        j->out->env.mb = j->op.mb;
    }
    /* the router's load-balancing sums or gradient travel with it */
    int64_t na = model_aux_len(mod, type != MSG_ACTIVATION);
    tensor_t *at = j->out && na ? actor_msg_tensor_new(j->out, type == MSG_ACTIVATION ? "aux" : "daux",
                                                       DT_F64, 1, &na) : NULL;
    if (na && j->out && !at) {
        actor_msg_free(j->out);
        j->out = NULL;
    }
    j->aux_out = at ? at->data : NULL;
    j->aux_n = na;
    if (j->out && hand) {
        j->ho_out = true;
        return true;
    }
    /* staged: the bytes in a host buffer the message borrows, copied there
     * on the copy stream; the message leaves when they are */
    staging_buf_t *b = j->out ? staging_get(s->staging) : NULL;
    j->staged = b ? malloc(sizeof *j->staged) : NULL;
    tensor_t view = tensor_make(b ? b->p : NULL, mod->place.act_dtype, mod->place.dev, 3, shape);
    if (!j->staged || actor_msg_tensor_add(j->out, name, &view)) {
        if (b) staging_put(b);
        free(j->staged);
        j->staged = NULL;
        if (j->out) actor_msg_free(j->out);
        j->out = NULL;
        fail(s, BT_ERR_NOMEM, type == MSG_ACTIVATION ? "activation buffer" : "gradient buffer");
        return false;
    }
    actor_msg_on_free(j->out, staging_put, b);
    *j->staged = (stage_send_t){.s = s, .m = j->out, .to = j->out_to};
    j->stage_buf = b->p;
    return true;
}

/* Start the next op whose inputs are here; after the last op, the
 * end-of-step job (training) or the metrics (evaluation). */
static void advance(stage_actor_t *s)
{
    if (!s->running || s->busy) return;
    const stage_actor_config_t *c = &s->cfg;
    stage_pass_t *p = s->cur;
    if (s->pc == p->n_ops) {
        if (s->ending) return;
        s->ending = true;
        if (p->eval) {
            s->running = false;
            pass_release(p, c->pipe.vpp);
            metrics_send(s);
            return;
        }
        *s->job = (stage_job_t){.s = s, .step = s->step};
        bt_status_t st = job_submit(s, job_end_run, JOB_END);
        if (st) fail(s, st, "optimizer submit");
        return;
    }
    pipe_op_t op = p->ops[s->pc];
    int v = vstage_of(s, op.chunk), last = c->n_vstages - 1, k = ix(s, op.mb, op.chunk);
    stage_job_t *j = s->job;
    /* evaluation ops carry STAGE_EVAL_STEP, as their messages do: the trace
     * keeps them apart from the training step they follow */
    *j = (stage_job_t){.s = s, .op = op, .v = v, .step = p->eval ? STAGE_EVAL_STEP : s->step, .dloss = p->eval ? 0.0f : c->dloss,
                       .acts = s->acts[p->eval ? ix(s, 0, op.chunk) : k], .arena = p->eval ? ix(s, 0, op.chunk) : k};
    int64_t rows = c->B;
    if (op.kind == PIPE_OP_FWD) {
        actor_msg_t *d = p->data_in[op.mb];
        if ((v == 0 || v == last) && !d) {
            wait_for(s, MSG_DATA_BATCH, op.mb, v, c->data);
            return;
        }
        if (v != 0 && !p->act_in[k]) {
            wait_for(s, MSG_ACTIVATION, op.mb, v, c->prev[op.chunk]);
            return;
        }
        if (v != 0 && !pipe_input(s, j, p->act_in[k], "x", op.chunk, -1)) return;
        rows = d ? actor_msg_tensor(d, "tokens")->shape[0] : j->out_shape[0];
        if (rows < 1 || rows > c->B || (v != 0 && j->out_shape[0] != rows)) {
            fail(s, BT_ERR_INVALID, "microbatch rows");
            return;
        }
        j->batch = (model_batch_t){.B = rows, .T = c->T, .pos = s->cp_pos};
        if (v == 0) j->batch.ids = actor_msg_tensor(d, "tokens")->data;
        if (v == last) j->batch.targets = actor_msg_tensor(d, "targets")->data;
        if (v != last && !pipe_output(s, j, MSG_ACTIVATION, "x", op.chunk, rows, c->handoff_next[op.chunk]))
            return;
        if (v != last) j->out->body.activation.vstage = v + 1;
    } else {
        if (v != last && !p->grad_in[k]) {
            wait_for(s, MSG_ACT_GRAD, op.mb, v, c->next[op.chunk]);
            return;
        }
        if (v != last && !pipe_input(s, j, p->grad_in[k], "dx", op.chunk, rows)) return;
        if (v != 0 && !pipe_output(s, j, MSG_ACT_GRAD, "dx", op.chunk, rows, c->handoff_prev[op.chunk]))
            return;
        if (v != 0) j->out->body.act_grad = (msg_act_grad_t){.vstage = v - 1, .loss_scale = 1.0f};
    }
    if (j->staged) j->out = NULL; /* the send record owns it now */
    bt_status_t st = job_submit(s, job_op_run, JOB_OP);
    if (st) {
        if (j->out) actor_msg_free(j->out);
        if (j->staged) stage_send_drop(j->staged);
        fail(s, st, "compute submit");
    }
}

static void metrics_send(stage_actor_t *s)
{
    actor_msg_t *m = actor_msg_new(MSG_METRICS);
    int64_t two = 2;
    tensor_t *l = m ? actor_msg_tensor_new(m, "loss", DT_F64, 1, &two) : NULL;
    if (!l) {
        fail(s, BT_ERR_NOMEM, "metrics");
        return;
    }
    ((double *)l->data)[0] = s->loss_sum;
    ((double *)l->data)[1] = (double)s->n_scored;
    /* the process's peak resident bytes so far, for the driver's progress
     * line (a tensor: METRICS bodies of older builds stay readable) */
    long long rss = s->cur->eval ? 0 : base_mem_peak_rss();
    int64_t one = 1;
    tensor_t *mt = rss > 0 ? actor_msg_tensor_new(m, "mem_peak", DT_I64, 1, &one) : NULL;
    if (mt) ((int64_t *)mt->data)[0] = rss;
    device_t dev = s->cfg.chunks[0]->place.dev;
    uint64_t dev_peak = s->cur->eval ? 0 : kern_mem_peak(dev);
    tensor_t *dt = dev_peak ? actor_msg_tensor_new(m, "dev_mem_peak", DT_I64, 1, &one) : NULL;
    if (dt) ((int64_t *)dt->data)[0] = (int64_t)dev_peak;
    tensor_t *pf = s->peak_flops > 0 ? actor_msg_tensor_new(m, "peak_flops", DT_F64, 1, &one) : NULL;
    if (pf) {
        ((double *)pf->data)[0] = s->peak_flops;
        s->peak_flops = 0;
    }
    /* the routed-expert load of a training step, summed over the
     * data-parallel replicas already (load_take): replica 0's TP rank 0
     * reports it */
    if (!s->cur->eval && s->n_load && s->cfg.tp_rank == 0 && s->cfg.dp_rank == 0 &&
        s->cfg.cp_rank == 0) {
        int64_t shape[2] = {s->n_load, s->load_cols};
        tensor_t *t = actor_msg_tensor_new(m, "expert_tokens", DT_F64, 2, shape);
        if (!t) {
            actor_msg_free(m);
            fail(s, BT_ERR_NOMEM, "metrics");
            return;
        }
        memcpy(t->data, s->load, (size_t)(s->n_load * s->load_cols) * sizeof(double));
        uint64_t now = clock_now_ns();
        /* time in the EP exchanges and in the experts so far (ms) */
        for (int k = 0; trace_enabled() && k < s->cfg.pipe.vpp; k++) {
            const model_t *cm = s->cfg.chunks[k];
            if (!cm->n_moe) continue;
            trace_counter(s->a.addr, name_moe_exchange, (double)cm->moe_exchange_ns * 1e-6, now);
            trace_counter(s->a.addr, name_moe_experts, (double)cm->moe_expert_ns * 1e-6, now);
            trace_counter(s->a.addr, name_moe_a2a, (double)cm->moe_a2a_ns * 1e-6, now);
            trace_counter(s->a.addr, name_moe_a2a_wait, (double)cm->moe_a2a_wait_ns * 1e-6, now);
        }
        for (int i = 0; trace_enabled() && i < s->n_load; i++)
            for (int e = 1; e < s->load_cols; e++) {
                char name[48];
                snprintf(name, sizeof name, "tokens L%d e%d", (int)s->load[i * s->load_cols],
                         e - 1);
                trace_counter(s->a.addr, trace_intern(name), s->load[i * s->load_cols + e], now);
            }
    }
    /* what the capacity dropped: every rank its own share (a TP rank
     * dispatches part of each microbatch's rows, a CP rank holds part of
     * its tokens), the driver sums them */
    if (!s->cur->eval && s->dropped >= 0) {
        tensor_t *t = actor_msg_tensor_new(m, "moe_dropped", DT_I64, 1, &one);
        if (!t) {
            actor_msg_free(m);
            fail(s, BT_ERR_NOMEM, "metrics");
            return;
        }
        ((int64_t *)t->data)[0] = s->dropped;
        /* this rank's share of the step's count, on its stage's track */
        if (trace_enabled()) trace_counter(s->a.addr, name_moe_dropped, (double)s->dropped, clock_now_ns());
    }
    m->env.step = s->cur->eval ? STAGE_EVAL_STEP : s->step;
    m->body.metrics = (msg_metrics_t){
        .loss = s->n_scored ? (float)(s->loss_sum / (double)s->n_scored) : NAN,
        .grad_norm = s->cur->eval ? NAN : (float)s->job->grad_norm,
        .lr = s->cur->eval ? NAN : (float)s->job->lr,
        .tokens = (uint64_t)s->n_scored,
        .t_step_ms = (double)(clock_now_ns() - s->t_step0) * 1e-6};
    actor_send(&s->a, s->cfg.driver, m);
}

static actor_ret_t stage_on_work_done(actor_t *self, actor_msg_t *m)
{
    stage_actor_t *s = (stage_actor_t *)self;
    stage_job_t *j = s->job;
    bt_status_t st = m->sys.work.status;
    if (m->sys.work.tag == JOB_STAGED) { /* a staged output's bytes are on the host */
        stage_send_t *r = m->sys.work.arg;
        actor_msg_t *out = r->m;
        actor_addr_t to = r->to;
        free(r);
        if (st) {
            actor_msg_free(out);
            fail(s, st, "copying an output to the host");
            return ACTOR_DONE;
        }
        if (test_hold_due(s, out)) return ACTOR_DONE;
        st = actor_send(self, to, out);
        if (st && st != BT_ERR_BUSY) fail(s, st, "pipeline send");
        return ACTOR_DONE;
    }
    if (m->sys.work.tag == CP_RING_JOB_SEND) { /* a ring block from the compute thread */
        if (!s->cp_ring_on) BT_PANIC("stage of rank %d: a CP block without a CP ring", s->cfg.rank);
        cp_ring_send(&s->cp_ring, m->sys.work.arg);
        return ACTOR_DONE;
    }
    if (m->sys.work.tag == EXPERT_JOB_ROUTED) { /* the op's sparse layer hands its rows over */
        if (!s->cfg.experts) BT_PANIC("stage of rank %d: expert rows routed without an expert group", s->cfg.rank);
        /* a failure is the op's: its layer returns it */
        expert_actor_tokens_send(self, s->cfg.experts, m->sys.work.arg, j->step, j->op.mb, &s->exp_call);
        return ACTOR_DONE;
    }
    s->busy = false;
    if (m->sys.work.tag == JOB_SNAP) {
        stage_snap_t *sn = m->sys.work.arg;
        if (st) {
            snap_drop(sn);
            fail(s, st, "checkpoint copy");
            return ACTOR_DONE;
        }
        snap_send(s, sn);
        advance(s); /* the next step may be waiting */
        return ACTOR_DONE;
    }
    if (m->sys.work.tag == JOB_GATHER) {
        if (st) fail(s, st, "export gather");
        else export_params(s);
        return ACTOR_DONE;
    }
    if (m->sys.work.tag == JOB_END) {
        if (st) {
            fail(s, st, "gradient reduction / optimizer");
            return ACTOR_DONE;
        }
        s->done_step = s->step;
        s->running = false;
        inputs_release(s);
        metrics_send(s);
        return ACTOR_DONE;
    }
    if (st) {
        if (j->out) actor_msg_free(j->out);
        if (j->staged && !j->staged_queued) stage_send_drop(j->staged);
        fail(s, st, j->op.kind == PIPE_OP_FWD ? "forward" : "backward");
        return ACTOR_DONE;
    }
    const stage_actor_config_t *c = &s->cfg;
    int k = ix(s, j->op.mb, j->op.chunk);
    /* TP ranks compute the same loss: count it once */
    if (j->op.kind == PIPE_OP_FWD && j->v == c->n_vstages - 1 && c->tp_rank == 0) {
        s->loss_sum += j->loss.loss_sum;
        s->n_scored += j->loss.n_scored;
    }
    if (j->ho_in) { /* its buffer is read: the neighbour may reuse it */
        actor_msg_t *r = actor_msg_new(MSG_RELEASE);
        if (r) {
            r->body.release = (msg_release_t){.slot = j->ho_in_d.slot, .gen = j->ho_in_d.gen};
            bt_status_t rs = actor_send(self, j->ho_in_src, r);
            if (rs && rs != BT_ERR_BUSY) log_warn("rank %d: RELEASE to %#x not sent (%s)", c->rank,
                                                  j->ho_in_src, bt_status_str(rs));
        }
    }
    if (j->ho_taken && handoff_attach(j->out, j->op.kind == PIPE_OP_FWD ? "x" : "dx", &j->ho_out_d)) {
        actor_msg_free(j->out);
        fail(s, BT_ERR_NOMEM, "handoff descriptor");
        return ACTOR_DONE;
    }
    if (j->out) { /* handed off: the descriptor is attached */
        st = test_hold_due(s, j->out) ? BT_OK : actor_send(self, j->out_to, j->out);
        j->out = NULL;
        if (st && st != BT_ERR_BUSY) {
            fail(s, st, "pipeline send");
            return ACTOR_DONE;
        }
    }
    stage_pass_t *p = s->cur;
    if (j->op.kind == PIPE_OP_BWD || p->eval) { /* this microbatch-chunk is finished */
        if (p->act_in[k]) { actor_msg_free(p->act_in[k]); p->act_in[k] = NULL; }
        if (p->grad_in[k]) { actor_msg_free(p->grad_in[k]); p->grad_in[k] = NULL; }
    }
    s->pc++;
    advance(s);
    return ACTOR_DONE;
}

/* The pass a received message belongs to. */
static stage_pass_t *pass_of(stage_actor_t *s, const actor_msg_t *m)
{
    return m->env.step == STAGE_EVAL_STEP ? &s->eval : &s->train;
}

/* Keep a pipeline message in its slot until its op is due. */
static actor_ret_t keep(stage_actor_t *s, actor_msg_t *m, bool grad, int vstage, const char *what,
                        const char *tensor)
{
    stage_pass_t *p = pass_of(s, m);
    int chunk = vstage / s->cfg.pipe.pp;
    if (vstage < 0 || vstage >= s->cfg.n_vstages || vstage % s->cfg.pipe.pp != s->cfg.pp_rank ||
        m->env.mb < 0 || m->env.mb >= p->n_mb || !handoff_msg_tensor(m, tensor, &(bool){false}) ||
        (grad && p->eval)) {
        log_error("rank %d: %s from %#x for virtual stage %d microbatch %d does not belong here; dropped",
                  s->cfg.rank, what, m->env.src, vstage, m->env.mb);
        return ACTOR_DONE;
    }
    actor_msg_t **table = grad ? p->grad_in : p->act_in;
    int k = ix(s, m->env.mb, chunk);
    if (table[k]) {
        log_error("rank %d: second %s for virtual stage %d microbatch %d (step %lld); dropped",
                  s->cfg.rank, what, vstage, m->env.mb, (long long)m->env.step);
        return ACTOR_DONE;
    }
    table[k] = m;
    advance(s);
    return ACTOR_KEPT;
}

static actor_ret_t stage_on_activation(actor_t *self, actor_msg_t *m)
{
    stage_actor_t *s = (stage_actor_t *)self;
    return keep(s, m, false, m->body.activation.vstage, "ACTIVATION", "x");
}

static actor_ret_t stage_on_act_grad(actor_t *self, actor_msg_t *m)
{
    stage_actor_t *s = (stage_actor_t *)self;
    return keep(s, m, true, m->body.act_grad.vstage, "ACT_GRAD", "dx");
}

static actor_ret_t stage_on_expert_done(actor_t *self, actor_msg_t *m)
{
    stage_actor_t *s = (stage_actor_t *)self;
    if (m->env.src != s->cfg.experts || !expert_actor_done(&s->exp_call, m))
        log_error("rank %d: EXPERT_DONE from %#x ignored", s->cfg.rank, m->env.src);
    return ACTOR_DONE;
}

static actor_ret_t stage_on_cp_block(actor_t *self, actor_msg_t *m)
{
    stage_actor_t *s = (stage_actor_t *)self;
    if (!s->cp_ring_on) {
        log_error("rank %d: CP_BLOCK from %#x, but this stage runs no CP ring over messages; dropped",
                  s->cfg.rank, m->env.src);
        return ACTOR_DONE;
    }
    return cp_ring_on_block(&s->cp_ring, m);
}

static actor_ret_t stage_on_release(actor_t *self, actor_msg_t *m)
{
    stage_actor_t *s = (stage_actor_t *)self;
    const msg_release_t *r = &m->body.release;
    if (!s->ho_on || handoff_release(&s->ho_pool, r->slot, r->gen))
        log_error("rank %d: RELEASE from %#x of buffer %u (use %u), which is not in flight; ignored",
                  s->cfg.rank, m->env.src, r->slot, r->gen);
    return ACTOR_DONE;
}

static actor_ret_t stage_on_data(actor_t *self, actor_msg_t *m)
{
    stage_actor_t *s = (stage_actor_t *)self;
    stage_pass_t *p = pass_of(s, m);
    int mb = m->env.mb;
    if (mb < 0 || mb >= p->n_mb || p->data_in[mb] || !actor_msg_tensor(m, "tokens") ||
        !actor_msg_tensor(m, "targets")) {
        log_error("rank %d: unexpected DATA_BATCH microbatch %d; dropped", s->cfg.rank, mb);
        return ACTOR_DONE;
    }
    p->data_in[mb] = m;
    advance(s);
    return ACTOR_KEPT;
}

/* Sends the gathered host copies (job_gather_run) to the driver. */
static void export_params(stage_actor_t *s)
{
    bool ok = true;
    for (int c = 0; c < s->cfg.pipe.vpp && s->cfg.exporter && ok; c++) {
        const model_t *mod = s->cfg.chunks[c];
        int nb = model_moe_bias_views(mod, NULL, NULL);
        char (*bn)[MODEL_NAME_MAX] = nb ? calloc((size_t)nb, sizeof *bn) : NULL;
        tensor_t *bv = nb ? calloc((size_t)nb, sizeof *bv) : NULL;
        if (nb && (!bn || !bv)) {
            free(bn);
            free(bv);
            fail(s, BT_ERR_NOMEM, "export");
            ok = false;
            break;
        }
        if (nb) model_moe_bias_views(mod, bv, bn);
        for (int i = 0; i < mod->n_params + nb && ok; i++) {
            float *at = s->export_buf[c][i];
            bool bias = i >= mod->n_params;
            shard_spec_t whole = bias ? shard_whole(1, bv[i - mod->n_params].shape) : (shard_spec_t){0};
            const shard_spec_t *sp = bias ? &whole : &mod->params[i].spec;
            actor_msg_t *m = actor_msg_new(MSG_CKPT_SHARD);
            if (!m) {
                fail(s, BT_ERR_NOMEM, "export");
                ok = false;
                break;
            }
            msg_ckpt_shard_t *b = &m->body.ckpt_shard;
            tensor_t t = tensor_make((void *)at, DT_F32, DEVICE_CPU, sp->ndim, sp->global);
            snprintf(b->name, sizeof b->name, "%s", bias ? bn[i - mod->n_params] : mod->params[i].name);
            b->ckpt_step = s->done_step;
            b->ndim = (uint32_t)t.ndim;
            for (int d = 0; d < t.ndim; d++) b->global_shape[d] = t.shape[d];
            if (actor_msg_tensor_add(m, "data", &t)) {
                actor_msg_free(m);
                fail(s, BT_ERR_INVALID, "export");
                ok = false;
                break;
            }
            /* the message borrows the buffer: it frees it when it is freed */
            actor_msg_on_free(m, export_buf_release, at);
            s->export_buf[c][i] = NULL;
            bt_status_t st = actor_send(&s->a, s->cfg.driver, m);
            if (st && st != BT_ERR_BUSY) {
                fail(s, st, "export send");
                ok = false;
            }
        }
        free(bn);
        free(bv);
    }
    export_bufs_free(s);
    if (ok) heartbeat_send(s, STAGE_ST_EXPORTED);
}

/* ---- checkpoints -------------------------------------------------------------- */

/* The host copy of one save, shared by its pieces' messages: freed with
 * the last of them (the writer frees them once the file is written). */


/* The last message of a save is freed (the writer wrote the file): its
 * host block goes back to the stage for the next save (any thread). */
static void snap_unref(void *arg)
{
    stage_snap_t *sn = arg;
    if (atomic_fetch_sub(&sn->refs, 1) != 1) return;
    free(sn->snap.puts);
    sn->snap.puts = NULL;
    stage_snap_t *old = atomic_exchange(&sn->s->snap_spare, sn);
    if (old) {
        ckpt_snapshot_free(&old->snap);
        free(old);
    }
}

static bt_status_t job_snap_run(void *arg)
{
    stage_snap_t *sn = arg;
    uint64_t t0 = clock_now_ns();
    bt_status_t st = ckpt_snapshot_take(sn->s->cfg.ckpt, &sn->snap);
    log_debug("rank %d: checkpoint of step %lld: %.1f MB copied to the host in %.1f ms",
              sn->s->cfg.rank, (long long)sn->step, (double)sn->snap.bytes / 1e6,
              (double)(clock_now_ns() - t0) * 1e-6);
    return st;
}

/* BEGIN and the pieces to the writer; the snapshot goes with them. */
static void snap_send(stage_actor_t *s, stage_snap_t *sn)
{
    const ckpt_snapshot_t *sp = &sn->snap;
    atomic_store(&sn->refs, sp->n + 1);
    actor_msg_t *b = actor_msg_new(MSG_CKPT_CTL);
    if (!b) {
        snap_unref(sn);
        fail(s, BT_ERR_NOMEM, "checkpoint");
        return;
    }
    b->body.ckpt_ctl = (msg_ckpt_ctl_t){.step = sn->step, .phase = CKPT_CTL_BEGIN,
                                        .rank = (uint32_t)s->cfg.rank, .count = (uint32_t)sp->n};
    b->env.step = sn->step;
    bt_status_t st = actor_send(&s->a, s->cfg.writer, b);
    for (int i = 0; i < sp->n; i++) {
        const ckpt_put_t *p = &sp->puts[i];
        actor_msg_t *m = st && st != BT_ERR_BUSY ? NULL : actor_msg_new(MSG_CKPT_PIECE);
        if (!m) {
            for (int k = i; k < sp->n; k++) snap_unref(sn);
            break;
        }
        msg_ckpt_piece_t *b2 = &m->body.ckpt_piece;
        snprintf(b2->name, sizeof b2->name, "%s", p->tensor);
        b2->step = sn->step;
        b2->index = (uint32_t)i;
        b2->count = (uint32_t)sp->n;
        b2->ndim = (uint32_t)p->spec.ndim;
        int64_t *g[4] = {&b2->glob0, &b2->glob1, &b2->glob2, &b2->glob3};
        int64_t *o[4] = {&b2->off0, &b2->off1, &b2->off2, &b2->off3};
        int64_t *e[4] = {&b2->ext0, &b2->ext1, &b2->ext2, &b2->ext3};
        for (int d = 0; d < p->spec.ndim; d++) {
            *g[d] = p->spec.global[d];
            *o[d] = p->spec.offset[d];
            *e[d] = p->spec.extent[d];
        }
        b2->flat_start = p->spec.flat_len < 0 ? 0 : p->spec.flat_start;
        b2->flat_len = p->spec.flat_len < 0 ? -1 : p->spec.flat_len;
        int64_t n = shard_numel(&p->spec);
        tensor_t t = tensor_make((void *)p->data, p->dtype, DEVICE_CPU, 1, &n);
        m->env.step = sn->step;
        actor_msg_on_free(m, snap_unref, sn);
        if (actor_msg_tensor_add(m, "data", &t)) {
            actor_msg_free(m);
            for (int k = i + 1; k < sp->n; k++) snap_unref(sn);
            st = BT_ERR_INVALID;
            break;
        }
        st = actor_send(&s->a, s->cfg.writer, m);
    }
    snap_unref(sn);
    if (st && st != BT_ERR_BUSY) fail(s, st, "checkpoint hand-over to the writer");
}

static void snap_drop(void *arg)
{
    stage_snap_t *sn = arg;
    ckpt_snapshot_free(&sn->snap);
    free(sn);
}

static void snap_start(stage_actor_t *s, int64_t step)
{
    if (!s->cfg.ckpt || !s->cfg.writer) {
        fail(s, BT_ERR_INVALID, "a checkpoint on a rank without a writer");
        return;
    }
    if (s->running || s->busy || step != s->done_step) {
        fail(s, BT_ERR_INVALID, "checkpoint command out of order");
        return;
    }
    stage_snap_t *sn = atomic_exchange(&s->snap_spare, NULL); /* the last save's block */
    if (!sn && !(sn = calloc(1, sizeof *sn))) {
        fail(s, BT_ERR_NOMEM, "checkpoint");
        return;
    }
    sn->s = s;
    sn->step = step;
    bt_status_t st = actor_worker_submit(s->cfg.worker, &s->a, job_snap_run, sn, snap_drop, JOB_SNAP);
    if (st) {
        snap_drop(sn);
        fail(s, st, "checkpoint submit");
        return;
    }
    s->busy = true;
}

/* Fault injection for the resume and restart tests: BATON_TEST_KILL=
 * "STEP@RANK" makes that rank SIGKILL itself when told to run that step; a
 * comma list of "STEP@RANK/ATTEMPT" does so only in that attempt of a
 * restarting run (BATON_ATTEMPT, 1 first, launch/restart.h). */
static bool test_kill_due(int64_t step, int rank)
{
    const char *v = getenv("BATON_TEST_KILL"), *a = getenv("BATON_ATTEMPT");
    int attempt = a ? atoi(a) : 1;
    for (; v && *v; v += strcspn(v, ",") + (v[strcspn(v, ",")] == ',')) {
        long long at;
        int r, want = -1, n = sscanf(v, "%lld@%d/%d", &at, &r, &want);
        if (n >= 2 && at == step && r == rank && (n == 2 || want == attempt)) return true;
    }
    return false;
}

static actor_ret_t stage_on_heartbeat(actor_t *self, actor_msg_t *m)
{
    stage_actor_t *s = (stage_actor_t *)self;
    const msg_heartbeat_t *h = &m->body.heartbeat;
    if (actor_addr_rank(m->env.src) != actor_addr_rank(s->cfg.driver)) return ACTOR_DONE;
    if (h->state == STAGE_CMD_EXPORT) {
        /* the parameters are device memory: the compute thread reads them
         * (and, with TP, gathers them over the exporter's TP group) into
         * host copies first */
        if (!gather_any(s)) {
            heartbeat_send(s, STAGE_ST_EXPORTED);
            return ACTOR_DONE;
        }
        *s->job = (stage_job_t){.s = s, .step = s->done_step};
        bt_status_t st = job_submit(s, job_gather_run, JOB_GATHER);
        if (st) fail(s, st, "export gather submit");
        return ACTOR_DONE;
    }
    if (h->state == STAGE_CMD_STEP && test_kill_due(h->step, s->cfg.rank)) {
        fprintf(stderr, "baton: fault injection: rank %d killed at the start of step %lld\n",
                s->cfg.rank, (long long)h->step);
        fflush(stderr);
        kill(getpid(), SIGKILL);
    }
    if (h->state == STAGE_CMD_SAVE) {
        snap_start(s, h->step);
        return ACTOR_DONE;
    }
    if (h->state != STAGE_CMD_STEP && h->state != STAGE_CMD_EVAL) return ACTOR_DONE;
    bool eval = h->state == STAGE_CMD_EVAL;
    if (!eval && s->cfg.eval_only) {
        fail(s, BT_ERR_INVALID, "a training step on an evaluation-only stage");
        return ACTOR_DONE;
    }
    if (s->running || (!eval && h->step != s->done_step + 1)) { /* (a save may still copy: busy) */
        fail(s, BT_ERR_INVALID, "command out of order");
        return ACTOR_DONE;
    }
    s->cur = eval ? &s->eval : &s->train;
    if (!eval) s->step = h->step;
    s->pc = 0;
    s->ending = false;
    s->running = true;
    s->loss_sum = 0;
    s->n_scored = 0;
    s->t_step0 = clock_now_ns();
    if (!eval)
        for (int c = 0; c < s->cfg.pipe.vpp; c++) model_grads_zero(s->cfg.chunks[c]);
    if (s->cfg.data) {
        actor_msg_t *d = actor_msg_new(MSG_HEARTBEAT);
        if (!d) { fail(s, BT_ERR_NOMEM, "data request"); return ACTOR_DONE; }
        d->body.heartbeat = (msg_heartbeat_t){.t_ns = clock_now_ns(), .rank = (uint32_t)s->cfg.rank,
                                              .state = eval ? DATA_CMD_EVAL : DATA_CMD_STEP,
                                              .step = eval ? STAGE_EVAL_STEP : s->step};
        actor_send(self, s->cfg.data, d);
    }
    advance(s);
    return ACTOR_DONE;
}

static actor_ret_t stage_on_stop(actor_t *self, actor_msg_t *m)
{
    stage_actor_t *s = (stage_actor_t *)self;
    bt_status_t st = (bt_status_t)m->body.stop.status;
    if (st == BT_IN_PROGRESS) {
        /* first phase of a normal end: stop treating peer closes as failures,
         * tell the driver, and wait for the final STOP */
        actor_router_quiesce(s->cfg.rt);
        actor_msg_t *a = actor_msg_new(MSG_HEARTBEAT);
        if (!a) { fail(s, BT_ERR_NOMEM, "quiesce reply"); return ACTOR_DONE; }
        a->body.heartbeat = (msg_heartbeat_t){.t_ns = clock_now_ns(), .rank = (uint32_t)s->cfg.rank,
                                              .state = STAGE_ST_QUIESCED, .step = s->step};
        actor_send(self, s->cfg.driver, a);
        return ACTOR_DONE;
    }
    if (st) log_info("rank %d: stopped by the driver: %s", s->cfg.rank, m->body.stop.why);
    actor_router_stop_request(s->cfg.rt, st);
    return ACTOR_DONE;
}

static actor_ret_t stage_on_error(actor_t *self, actor_msg_t *m)
{
    stage_actor_t *s = (stage_actor_t *)self;
    const msg_error_report_t *r = &m->body.error_report;
    if (r->peer == actor_addr_rank(s->cfg.driver)) {
        log_error("rank %d: lost the driver (%s: %s); stopping", s->cfg.rank, r->where, r->text);
        actor_router_stop_request(s->cfg.rt, (bt_status_t)r->status);
        return ACTOR_DONE;
    }
    if (s->cp_ring_on && cp_ring_is_peer(&s->cp_ring, (int)r->peer)) {
        char why[200];
        snprintf(why, sizeof why, "rank %u failed (%.60s: %.100s)", r->peer, r->where, r->text);
        cp_ring_fail(&s->cp_ring, (bt_status_t)r->status, why);
    }
    report(s, (bt_status_t)r->status, r->peer, r->where, r->text);
    return ACTOR_DONE;
}

const actor_class_t stage_actor_class = {
    .name = "stage",
    .handlers = {
        [MSG_HEARTBEAT] = stage_on_heartbeat,
        [MSG_STOP] = stage_on_stop,
        [MSG_ERROR_REPORT] = stage_on_error,
        [MSG_ACTIVATION] = stage_on_activation,
        [MSG_ACT_GRAD] = stage_on_act_grad,
        [MSG_DATA_BATCH] = stage_on_data,
        [MSG_RELEASE] = stage_on_release,
        [MSG_EXPERT_DONE] = stage_on_expert_done,
        [MSG_CP_BLOCK] = stage_on_cp_block,
        [ACTOR_SYS_WORK_DONE] = stage_on_work_done,
    },
    .start = stage_start,
    .stop = stage_stop,
};
