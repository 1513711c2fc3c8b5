#include "actors/actor.h"

#include <assert.h>
#include <ev.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "actors/router.h"
#include "trace/trace.h"
#include "base/clock.h"
#include "base/freelist.h"
#include "base/log.h"

_Static_assert(sizeof(ev_timer) <= sizeof(((actor_timer_t *)0)->w), "actor_timer_t.w holds an ev_timer");
_Static_assert(offsetof(actor_msg_t, item) == 0, "a message is its queue item");

/* > 0 while this thread runs actor code (handler, hook, timer). Runtime
 * callbacks (transport receive) dispatch directly only at depth 0, so a
 * handler that sends to an actor of its own loop never recurses. */
static _Thread_local int actor_depth;

/* ---- messages ------------------------------------------------------------ */

/* Local view arithmetic (the runtime needs no more of kernels/). */
static size_t msg_view_nbytes(const tensor_t *t)
{
    size_t n = wire_dtype_size(t->dtype);
    for (int k = 0; k < t->ndim; k++) n *= (size_t)t->shape[k];
    return n;
}

static bool msg_view_contiguous(const tensor_t *t)
{
    uint64_t want = 1; /* unsigned: hostile shapes may overflow the product */
    for (int k = t->ndim - 1; k >= 0; k--) {
        if (t->shape[k] != 1 && (uint64_t)t->stride[k] != want) return false;
        want *= (uint64_t)t->shape[k];
    }
    return true;
}

static tensor_t msg_view_make(void *data, dtype_t dt, int ndim, const int64_t *shape)
{
    tensor_t t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = ndim;
    t.device = DEVICE_CPU;
    t.data = data;
    uint64_t stride = 1; /* unsigned: a product of large dims may overflow */
    for (int k = TENSOR_MAX_DIMS - 1; k >= 0; k--) {
        t.shape[k] = k < ndim ? shape[k] : 1;
        t.stride[k] = (int64_t)stride;
        stride *= (uint64_t)t.shape[k];
    }
    return t;
}

/* Freed messages kept per thread for reuse: a message (~3.6 KB) is above
 * malloc's per-thread cache sizes, so each malloc/free pair went through the
 * arena (and its consolidation) once per message sent or received. The
 * cache is bounded and released when its thread exits. */
#define MSG_CACHE_MAX 64u

static _Thread_local base_freelist_t msg_cache = {.max = MSG_CACHE_MAX};

static void msg_cache_put(actor_msg_t *m)
{
    base_freelist_free_at_exit(&msg_cache);
    if (!base_freelist_push(&msg_cache, m)) free(m);
}

static actor_msg_t *msg_alloc(uint32_t type, bool zero_body)
{
    actor_msg_t *m = base_freelist_pop(&msg_cache);
    if (!m && !(m = malloc(sizeof *m))) return NULL;
    /* The descriptor and view arrays (2.5 KB) are written as tensors are
     * added and read only below ntensors, the small buffer only when taken:
     * zero everything else. */
    memset(m, 0, offsetof(actor_msg_t, env) + offsetof(wire_env_t, tensors));
    /* The body of a wire type is its struct (up to ~400 bytes for the
     * largest member of the union): zero that one. */
    if (zero_body) memset(&m->body, 0, type < MSG_TYPE_COUNT ? msg_types[type].size : sizeof m->body);
    memset((char *)m + offsetof(actor_msg_t, sys), 0, offsetof(actor_msg_t, owned) - offsetof(actor_msg_t, sys));
    m->env.ver = WIRE_VERSION;
    m->env.type = type;
    m->env.step = -1;
    m->env.mb = -1;
    return m;
}

actor_msg_t *actor_msg_new(uint32_t type) { return msg_alloc(type, true); }

actor_msg_t *actor_msg_new_rx_(void) { return msg_alloc(0, false); }

void actor_msg_free(actor_msg_t *m)
{
    if (!m) return;
    if (m->rx) {
        actor_router_rx_free_(m); /* comes back here with m->rx == NULL */
        return;
    }
    if (m->on_free) m->on_free(m->on_free_arg);
    for (uint32_t i = 0; i < m->nowned; i++) free(m->owned[i]);
    msg_cache_put(m);
}

static bt_status_t msg_tensor_name_check(actor_msg_t *m, const char *name, size_t *len_out)
{
    if (m->env.ntensors >= WIRE_MAX_TENSORS) {
        log_error("message %s: more than %d tensors", msg_type_name(m->env.type), WIRE_MAX_TENSORS);
        return BT_ERR_INVALID;
    }
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len >= WIRE_NAME_MAX) {
        log_error("message %s: tensor name must be 1..%d bytes", msg_type_name(m->env.type),
                  WIRE_NAME_MAX - 1);
        return BT_ERR_INVALID;
    }
    *len_out = len;
    return BT_OK;
}

static void msg_tensor_set(actor_msg_t *m, const char *name, size_t len, const tensor_t *view)
{
    uint32_t i = m->env.ntensors++;
    wire_tensor_desc_t *d = &m->env.tensors[i];
    /* every field is written (the name up to its NUL): no memset of the
     * 152-byte descriptor */
    memcpy(d->name, name, len + 1);
    d->dtype = view->dtype;
    d->ndim = view->ndim;
    for (int k = 0; k < TENSOR_MAX_DIMS; k++) d->shape[k] = k < view->ndim ? view->shape[k] : 0;
    d->offset = 0;
    d->nbytes = msg_view_nbytes(view);
    d->device = view->device;
    m->tensors[i] = *view;
}

tensor_t *actor_msg_tensor_new(actor_msg_t *m, const char *name, dtype_t dt, int ndim,
                               const int64_t *shape)
{
    size_t len;
    if (msg_tensor_name_check(m, name, &len) != BT_OK) return NULL;
    if (ndim < 1 || ndim > TENSOR_MAX_DIMS || !wire_dtype_size(dt)) {
        log_error("message %s: tensor '%s': bad dtype or ndim %d", msg_type_name(m->env.type), name, ndim);
        return NULL;
    }
    tensor_t t = msg_view_make(NULL, dt, ndim, shape);
    size_t nbytes = msg_view_nbytes(&t);
    size_t cap = (size_t)wire_align_up(nbytes ? nbytes : 1);
    uint32_t i = m->env.ntensors;
    void *buf;
    if (cap <= ACTOR_MSG_SMALL && !m->small_used) {
        m->small_used = true;
        buf = m->small + (wire_align_up((uintptr_t)m->small) - (uintptr_t)m->small);
    } else {
        buf = aligned_alloc(WIRE_ALIGN, cap);
        if (!buf) return NULL;
        /* owned[] is not cleared per message: entries below i that no
         * allocation wrote (views, the small buffer, received tensors) */
        for (uint32_t j = m->nowned; j < i; j++) m->owned[j] = NULL;
        m->owned[i] = buf;
        m->nowned = i + 1;
    }
    memset(buf, 0, cap);
    t.data = buf;
    msg_tensor_set(m, name, len, &t);
    return &m->tensors[i];
}

bt_status_t actor_msg_tensor_add(actor_msg_t *m, const char *name, const tensor_t *view)
{
    size_t len;
    bt_status_t st = msg_tensor_name_check(m, name, &len);
    if (st != BT_OK) return st;
    if (!msg_view_contiguous(view) || !wire_dtype_size(view->dtype)) {
        log_error("message %s: tensor '%s' is not contiguous", msg_type_name(m->env.type), name);
        return BT_ERR_INVALID;
    }
    msg_tensor_set(m, name, len, view);
    return BT_OK;
}

void actor_msg_on_free(actor_msg_t *m, actor_free_fn fn, void *arg)
{
    m->on_free = fn;
    m->on_free_arg = arg;
}

tensor_t *actor_msg_tensor(actor_msg_t *m, const char *name)
{
    for (uint32_t i = 0; i < m->env.ntensors; i++)
        if (!strcmp(m->env.tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

bool actor_msg_text_add(actor_msg_t *m, const char *name, const char *text)
{
    int64_t n = (int64_t)strlen(text);
    tensor_t *t = actor_msg_tensor_new(m, name, DT_U8, 1, &n);
    if (t) memcpy(t->data, text, (size_t)n);
    return t != NULL;
}

const char *actor_msg_text(actor_msg_t *m, const char *name, size_t *len)
{
    tensor_t *t = actor_msg_tensor(m, name);
    if (!t || t->dtype != DT_U8 || t->ndim != 1) return NULL;
    *len = (size_t)t->shape[0];
    return t->data;
}

size_t actor_msg_payload_bytes(const actor_msg_t *m)
{
    size_t n = 0;
    for (uint32_t i = 0; i < m->env.ntensors; i++) n += (size_t)m->env.tensors[i].nbytes;
    return n;
}

/* ---- dispatch ------------------------------------------------------------ */

static void actor_start_now(actor_t *a)
{
    if (a->state != ACTOR_NEW) return;
    a->state = ACTOR_RUNNING;
    if (a->cls->start) {
        actor_depth++;
        a->cls->start(a);
        actor_depth--;
    }
}

/* A message that will never reach a handler. */
static void msg_drop(actor_msg_t *m)
{
    if (m->env.type == ACTOR_SYS_WORK_DONE && m->sys.work.cleanup)
        m->sys.work.cleanup(m->sys.work.arg);
    actor_msg_free(m);
}

/* queued: m waited in the loop's queue (else it is dispatched from the
 * call that delivered it, the receive callback for a remote frame). */
/* actor_last_msgs: [0] sent, [1] handled; w0 = type << 56 | peer rank << 32
 * | low 32 bits of the step, w1 = the microbatch, t = when. */
static struct {
    _Atomic uint64_t w0, w1, t;
} last_msg[2];

static inline void last_msg_note(int which, uint32_t type, uint32_t peer_rank, int64_t step, int32_t mb)
{
    if (type == MSG_HEARTBEAT || type == MSG_CREDIT || type == MSG_PING || type == MSG_PONG ||
        type >= MSG_TYPE_COUNT)
        return;
    atomic_store_explicit(&last_msg[which].w0,
                          (uint64_t)type << 56 | (uint64_t)(peer_rank & 0xffffffu) << 32 | (uint32_t)step,
                          memory_order_relaxed);
    atomic_store_explicit(&last_msg[which].w1, (uint64_t)(uint32_t)mb, memory_order_relaxed);
    atomic_store_explicit(&last_msg[which].t, clock_now_ns(), memory_order_relaxed);
}

void actor_last_msgs(actor_last_msg_t *sent, actor_last_msg_t *handled)
{
    actor_last_msg_t *out[2] = {sent, handled};
    for (int i = 0; i < 2; i++) {
        uint64_t t = atomic_load_explicit(&last_msg[i].t, memory_order_relaxed);
        uint64_t w0 = atomic_load_explicit(&last_msg[i].w0, memory_order_relaxed);
        uint64_t w1 = atomic_load_explicit(&last_msg[i].w1, memory_order_relaxed);
        *out[i] = (actor_last_msg_t){.valid = t != 0, .type = (uint32_t)(w0 >> 56),
                                     .peer = (uint32_t)(w0 >> 32) & 0xffffffu,
                                     .step = (int32_t)(uint32_t)w0, .mb = (int32_t)(uint32_t)w1, .t_ns = t};
    }
}

static void msg_dispatch(actor_t *a, actor_msg_t *m, bool queued)
{
    if (a->state == ACTOR_NEW) actor_start_now(a);
    uint32_t type = m->env.type;
    if (a->state != ACTOR_RUNNING) {
        log_debug("actor %s: dropping %s after stop", a->name, msg_type_name(type));
        msg_drop(m);
        return;
    }
    actor_handler_fn h = type < ACTOR_TYPE_COUNT ? a->cls->handlers[type] : NULL;
    if (!h) {
        if (type == MSG_STOP) {
            actor_msg_free(m);
            actor_stop(a);
            return;
        }
        log_debug("actor %s: no handler for %s", a->name, msg_type_name(type));
        msg_drop(m);
        return;
    }
    /* Traced: one record for the receive and the handler span it started.
     * Arrival: the router's stamp for a remote frame, else the dispatch. A
     * remote frame handled from its receive callback starts its handler at
     * the arrival stamp (taken just before: one clock read less per
     * message on the critical path). */
    uint64_t t0 = 0, t_arr = 0, bytes = 0, seq = 0;
    actor_addr_t src = 0;
    if (trace_enabled()) {
        bool stamped = m->rx && m->t_recv_tk;
        t0 = stamped && !queued ? m->t_recv_tk : trace_ticks();
        t_arr = stamped && m->t_recv_tk <= t0 ? m->t_recv_tk : t0;
        bytes = m->rx ? m->rx_bytes : actor_msg_payload_bytes(m);
        seq = m->env.seq;
        src = m->env.src;
    }
    int64_t step = m->env.step;
    int32_t mb = m->env.mb;
    last_msg_note(1, type, actor_addr_rank(m->env.src), step, mb);
    actor_depth++;
    actor_ret_t r = h(a, m);
    actor_depth--;
    if (t0) {
        if (type < MSG_TYPE_COUNT)
            trace_recv_handled_tk(a->addr, src, type, seq, bytes, step, mb, t_arr, t0, trace_ticks());
        else
            trace_span_tk(a->addr, TRACE_SPAN_HANDLER, type, step, mb, t0, trace_ticks());
    }
    if (r == ACTOR_DONE) actor_msg_free(m);
}

static void msg_item_run(actor_item_t *it)
{
    actor_msg_t *m = (actor_msg_t *)it;
    msg_dispatch(m->to, m, true);
}

static void msg_item_cancel(actor_item_t *it) { msg_drop((actor_msg_t *)it); }

void actor_deliver_(actor_t *to, actor_msg_t *m)
{
    m->to = to;
    if (actor_depth == 0 && actor_loop_current() == to->loop) {
        msg_dispatch(to, m, false);
        return;
    }
    m->item.run = msg_item_run;
    m->item.cancel = msg_item_cancel;
    actor_loop_post(to->loop, &m->item);
}

/* ---- actors -------------------------------------------------------------- */

static void actor_start_item(void *arg) { actor_start_now(arg); }

bt_status_t actor_register(actor_router_t *rt, actor_t *self, const actor_class_t *cls,
                           actor_loop_t *loop, const char *name, uint32_t slot)
{
    assert(cls && loop && rt);
    self->cls = cls;
    self->rt = rt;
    self->loop = loop;
    self->name = name ? name : cls->name;
    self->seq = 0;
    self->state = ACTOR_NEW;
    self->timers = NULL;
    bt_status_t st = actor_router_register_(rt, self, slot);
    if (st != BT_OK) return st;
    trace_actor_name(self->addr, self->name);
    return actor_loop_post_fn(loop, actor_start_item, self);
}

bt_status_t actor_send(actor_t *self, uint32_t dst, actor_msg_t *m)
{
    assert(actor_loop_current() == self->loop);
    m->env.src = self->addr;
    m->env.dst = dst;
    m->env.seq = self->seq++;
    last_msg_note(0, m->env.type, actor_addr_rank(dst), m->env.step, m->env.mb);
    if (actor_addr_rank(dst) != actor_router_rank(self->rt))
        return actor_router_send_remote_(self->rt, self, m);
    actor_t *to = actor_router_lookup_(self->rt, actor_addr_slot(dst));
    if (!to) {
        log_error("actor %s: no actor at slot %u of rank %u for %s", self->name,
                  actor_addr_slot(dst), actor_addr_rank(dst), msg_type_name(m->env.type));
        actor_msg_free(m);
        return BT_ERR_NOT_FOUND;
    }
    if (trace_enabled())
        trace_send_tk(self->addr, dst, m->env.type, m->env.seq, actor_msg_payload_bytes(m),
                      m->env.step, m->env.mb, trace_ticks());
    actor_deliver_(to, m);
    return BT_OK;
}

void actor_stop(actor_t *self)
{
    if (self->state == ACTOR_STOPPED) return;
    while (self->timers) actor_timer_stop(self->timers);
    bool was_running = self->state == ACTOR_RUNNING;
    self->state = ACTOR_STOPPED;
    if (was_running && self->cls->stop) {
        actor_depth++;
        self->cls->stop(self);
        actor_depth--;
    }
}

/* ---- timers -------------------------------------------------------------- */

static void actor_timer_cb(struct ev_loop *ev, ev_timer *w, int revents)
{
    (void)ev; (void)revents;
    actor_timer_t *t = w->data;
    actor_t *a = t->owner;
    if (!ev_is_active(w)) actor_timer_stop(t); /* one-shot: unlink before the callback */
    if (a->state != ACTOR_RUNNING) return;
    uint64_t t0 = trace_enabled() ? trace_ticks() : 0;
    actor_depth++;
    t->cb(a, t);
    actor_depth--;
    if (t0) trace_span_tk(a->addr, TRACE_SPAN_HANDLER, 0xffff, -1, -1, t0, trace_ticks());
}

void actor_timer_start(actor_t *self, actor_timer_t *t, double after_s, double repeat_s,
                       actor_timer_fn cb)
{
    assert(actor_loop_current() == self->loop);
    if (t->active) actor_timer_stop(t);
    ev_timer *w = (ev_timer *)(void *)t->w;
    ev_timer_init(w, actor_timer_cb, after_s, repeat_s);
    w->data = t;
    t->owner = self;
    t->cb = cb;
    t->active = true;
    t->next = self->timers;
    self->timers = t;
    ev_timer_start(actor_loop_ev(self->loop), w);
}

void actor_timer_stop(actor_timer_t *t)
{
    if (!t->active) return;
    actor_t *a = t->owner;
    ev_timer_stop(actor_loop_ev(a->loop), (ev_timer *)(void *)t->w);
    for (actor_timer_t **p = &a->timers; *p; p = &(*p)->next) {
        if (*p == t) {
            *p = t->next;
            break;
        }
    }
    t->next = NULL;
    t->active = false;
}
