#include "actors/router.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "actors/credit.h"
#include "trace/trace.h"
#include "base/clock.h"
#include "base/freelist.h"
#include "base/log.h"

#define ROUTER_MAX_LOOPS   64
#define ROUTER_MAX_WORKERS 64
/* Large receive buffers are recycled: a fresh 256 MiB malloc is an mmap
 * whose page faults cost as much as the copy itself. */
#define ROUTER_CACHE_MIN   (1u << 20)
#define ROUTER_CACHE_SLOTS 4
/* Small payloads (a ping's 8 bytes, a loss, a control tensor) come from a
 * free list of fixed blocks: aligned_alloc + free cost ~550 instructions per
 * received frame, more than a tenth of the whole actor path. */
#define ROUTER_SMALL_MAX   256u
#define ROUTER_SMALL_KEEP  256u

static const uint8_t router_test_secret[] = "baton-default-secret-for-local-tests";

/* A frame on its way out (I/O loop only). Control frames (CREDIT) have no
 * message. Recycled per edge. */
typedef struct send_ctx {
    struct send_ctx *next;
    struct edge     *e;
    actor_msg_t     *m;
    msg_frame_t      frame;
} send_ctx_t;

typedef struct edge {
    actor_router_t   *rt;
    uint32_t          rank;
    xport_kind_t      kind;
    bool              is_auto, fell_back;
    char              card[ACTOR_CARD_MAX];
    /* I/O loop only */
    xport_ep_t       *ep;
    send_ctx_t       *free_ctx;
    actor_credit_rx_t crx;
    /* guarded by rt->mu (waited on by actor_router_wait_peer) */
    bool              up, failed, closed;
    bt_status_t       status;
    /* any thread */
    actor_credit_tx_t ctx_tx;
    _Atomic uint64_t  n_sent, n_received;
} edge_t;

struct actor_router {
    actor_router_config_t cfg;
    char                  job_id[64];
    uint8_t              *secret;
    size_t                secret_len;
    char                  host[64];
    actor_loop_t         *io;
    xport_t              *xp[XPORT_KIND_COUNT];     /* I/O loop only */
    char                  addr[XPORT_KIND_COUNT][XPORT_LISTEN_ADDR_MAX];
    _Atomic(actor_t *)    slots[ACTOR_ROUTER_MAX_SLOTS];
    _Atomic(edge_t *)     edges[ACTOR_ROUTER_MAX_RANKS];
    actor_loop_t         *loops[ROUTER_MAX_LOOPS];
    int                   nloops;
    actor_worker_t       *workers[ROUTER_MAX_WORKERS];
    int                   nworkers;
    _Atomic uint32_t      supervisor; /* 0: none */

    pthread_mutex_t       mu;      /* registration, edge states, stop request */
    pthread_cond_t        cv;
    bool                  stop_req;
    bool                  quiesced;  /* peers may leave: their close is not a failure */
    bt_status_t           stop_status;

    struct { void *p; size_t len; } cache[ROUTER_CACHE_SLOTS]; /* I/O loop only */
    base_freelist_t  small;        /* ROUTER_SMALL_MAX-byte blocks; I/O loop only */
};

/* ---- small helpers ------------------------------------------------------- */

/* The edge counters are written on the I/O loop only (read by stats from
 * any thread): a relaxed load and store, without a locked read-modify-write. */
static inline void edge_count(_Atomic uint64_t *c)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1, memory_order_relaxed);
}

uint32_t actor_router_rank(const actor_router_t *rt) { return rt->cfg.rank; }
actor_loop_t *actor_router_io_loop(actor_router_t *rt) { return rt->io; }

static bool on_io(actor_router_t *rt) { return actor_loop_current() == rt->io; }

static edge_t *edge_get(actor_router_t *rt, uint32_t rank)
{
    if (rank >= ACTOR_ROUTER_MAX_RANKS) return NULL;
    return atomic_load_explicit(&rt->edges[rank], memory_order_acquire);
}

static edge_t *edge_get_or_new(actor_router_t *rt, uint32_t rank)
{
    if (rank >= ACTOR_ROUTER_MAX_RANKS) return NULL;
    pthread_mutex_lock(&rt->mu);
    edge_t *e = atomic_load(&rt->edges[rank]);
    if (!e) {
        e = calloc(1, sizeof *e);
        if (e) {
            e->rt = rt;
            e->rank = rank;
            e->kind = XPORT_TCP;
            actor_credit_tx_init(&e->ctx_tx, rt->cfg.credits > 0);
            actor_credit_rx_init(&e->crx, rt->cfg.credits);
            atomic_store_explicit(&rt->edges[rank], e, memory_order_release);
        }
    }
    pthread_mutex_unlock(&rt->mu);
    return e;
}

static const char *edge_where(const edge_t *e, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s %s", xport_kind_name(e->kind),
             e->ep && e->ep->peer_addr[0] ? e->ep->peer_addr : "(not connected)");
    return buf;
}

/* ---- payload buffers ------------------------------------------------------ */

static void *router_payload_alloc(void *arg, xport_ep_t *ep, const void *hdr, size_t hdr_len,
                                  size_t payload_len)
{
    (void)ep; (void)hdr; (void)hdr_len;
    actor_router_t *rt = arg;
    if (payload_len <= ROUTER_SMALL_MAX) {
        void *p = base_freelist_pop(&rt->small);
        return p ? p : aligned_alloc(WIRE_ALIGN, ROUTER_SMALL_MAX);
    }
    if (payload_len >= ROUTER_CACHE_MIN) {
        for (int i = 0; i < ROUTER_CACHE_SLOTS; i++) {
            if (rt->cache[i].p && rt->cache[i].len == payload_len) {
                void *p = rt->cache[i].p;
                rt->cache[i].p = NULL;
                return p;
            }
        }
    }
    size_t cap = (size_t)wire_align_up(payload_len ? payload_len : 1);
    return aligned_alloc(WIRE_ALIGN, cap);
}

static void router_payload_free(void *arg, void *payload, size_t payload_len)
{
    actor_router_t *rt = arg;
    if (payload && payload_len <= ROUTER_SMALL_MAX && base_freelist_push(&rt->small, payload)) return;
    if (payload && payload_len >= ROUTER_CACHE_MIN) {
        for (int i = 0; i < ROUTER_CACHE_SLOTS; i++) {
            if (!rt->cache[i].p) {
                rt->cache[i].p = payload;
                rt->cache[i].len = payload_len;
                return;
            }
        }
    }
    free(payload);
}

/* ---- supervision ----------------------------------------------------------- */

static void router_report(actor_router_t *rt, edge_t *e, bt_status_t why, const char *text)
{
    uint32_t sup = atomic_load(&rt->supervisor);
    if (!sup) return;
    actor_t *to = actor_router_lookup_(rt, actor_addr_slot(sup));
    if (!to) return;
    actor_msg_t *m = actor_msg_new(MSG_ERROR_REPORT);
    if (!m) {
        log_error("rank %u: out of memory reporting a failure of rank %u", rt->cfg.rank, e->rank);
        return;
    }
    m->env.src = ACTOR_ADDR(e->rank, 0);
    m->env.dst = sup;
    msg_error_report_t *r = &m->body.error_report;
    r->status = why;
    r->actor = ACTOR_ADDR(e->rank, 0);
    r->peer = e->rank;
    char where[XPORT_ADDR_MAX + 16];
    snprintf(r->where, sizeof r->where, "%s", edge_where(e, where, sizeof where));
    snprintf(r->text, sizeof r->text, "%s", text);
    actor_deliver_(to, m);
}

static void edge_state_set(edge_t *e, bool up, bool failed, bt_status_t status)
{
    actor_router_t *rt = e->rt;
    pthread_mutex_lock(&rt->mu);
    e->up = up;
    if (failed) __atomic_store_n(&e->failed, true, __ATOMIC_RELEASE); /* read unlocked by senders */
    e->status = status;
    pthread_cond_broadcast(&rt->cv);
    pthread_mutex_unlock(&rt->mu);
}

/* The edge is unusable: drop what it holds, tell the supervisor. I/O loop. */
static void edge_fail(edge_t *e, bt_status_t why, const char *text, bool close_ep)
{
    if (e->failed) return;
    char where[XPORT_ADDR_MAX + 16];
    pthread_mutex_lock(&e->rt->mu);
    bool stopping = e->rt->stop_req || e->rt->quiesced;
    pthread_mutex_unlock(&e->rt->mu);
    /* A peer that closes while we stop anyway is the normal end of a job. */
    if (stopping && why == BT_ERR_PEER_CLOSED)
        log_debug("rank %u: link to rank %u (%s) closed during stop", e->rt->cfg.rank, e->rank,
                 edge_where(e, where, sizeof where));
    else
        log_error("rank %u: link to rank %u (%s) failed: %s: %s", e->rt->cfg.rank, e->rank,
                  edge_where(e, where, sizeof where), bt_status_str(why), text);
    router_report(e->rt, e, why, text);
    if (close_ep && e->ep) xport_close(e->ep);
    e->ep = NULL;
    edge_state_set(e, false, true, why);
    actor_msg_t *m = actor_credit_tx_drain(&e->ctx_tx);
    while (m) {
        actor_msg_t *next = (actor_msg_t *)m->item.next;
        actor_msg_free(m);
        m = next;
    }
}

/* ---- sending (I/O loop) ------------------------------------------------------ */

static send_ctx_t *send_ctx_get(edge_t *e)
{
    send_ctx_t *c = e->free_ctx;
    if (c) {
        e->free_ctx = c->next;
    } else {
        c = calloc(1, sizeof *c);
        if (!c) return NULL;
        msg_frame_init(&c->frame);
        c->e = e;
    }
    c->next = NULL;
    return c;
}

static void send_ctx_put(send_ctx_t *c)
{
    edge_t *e = c->e;
    c->m = NULL;
    c->next = e->free_ctx;
    e->free_ctx = c;
}

static void edge_send_done(void *arg, bt_status_t status)
{
    send_ctx_t *c = arg;
    if (status != BT_OK && status != BT_ERR_CANCELED)
        log_debug("rank %u: send to rank %u finished with %s", c->e->rt->cfg.rank, c->e->rank,
                  bt_status_str(status));
    actor_msg_t *m = c->m;
    send_ctx_put(c);
    if (m) actor_msg_free(m);
}

/* Encode and hand one frame to the transport. Takes m (NULL env+body for a
 * control frame is given through env/body). */
static void edge_frame_send(edge_t *e, actor_msg_t *m, const wire_env_t *env, const void *body)
{
    actor_router_t *rt = e->rt;
    if (e->failed || e->closed || !e->ep) {
        if (m) actor_msg_free(m);
        return;
    }
    send_ctx_t *c = send_ctx_get(e);
    if (!c) {
        log_error("rank %u: out of memory sending to rank %u", rt->cfg.rank, e->rank);
        if (m) actor_msg_free(m);
        return;
    }
    c->m = m;
    const char *names[WIRE_MAX_TENSORS];
    int n = 0;
    if (m)
        for (; n < (int)m->env.ntensors; n++) names[n] = m->env.tensors[n].name;
    wire_err_t err;
    bt_status_t st = msg_frame_build(&c->frame, env, body, m ? m->tensors : NULL, names, n, &err);
    if (st != BT_OK) {
        log_error("rank %u: cannot encode %s for %08x: %s", rt->cfg.rank, msg_type_name(env->type),
                  env->dst, err.reason);
        send_ctx_put(c);
        if (m) actor_msg_free(m);
        return;
    }
    /* The send is stamped when the frame goes to the transport: a stamp
     * taken after xport_send returns can come after the peer's receive
     * stamp (a tcp or inproc send hands the frame over at once, and the
     * sender may lose its core right then), which made negative latencies. */
    uint64_t t_send = trace_enabled() ? trace_ticks() : 0;
    st = xport_send(e->ep, c->frame.hdr.data, c->frame.hdr.size, c->frame.iov, c->frame.iovcnt,
                    edge_send_done, c);
    if (st != BT_IN_PROGRESS) {
        log_error("rank %u: send of %s to rank %u refused: %s", rt->cfg.rank,
                  msg_type_name(env->type), e->rank, bt_status_str(st));
        send_ctx_put(c);
        if (m) actor_msg_free(m);
        return;
    }
    log_debug("rank %u: sent %s to %08x (%zu+%zu bytes)", rt->cfg.rank, msg_type_name(env->type), env->dst,
              c->frame.hdr.size, c->frame.payload_len);
    if (m) {
        edge_count(&e->n_sent);
        if (t_send)
            trace_send_tk(env->src, env->dst, env->type, env->seq,
                          c->frame.hdr.size + c->frame.payload_len, env->step, env->mb, t_send);
    }
    actor_loop_busy_arm(rt->io);
}

static void edge_msg_send(edge_t *e, actor_msg_t *m) { edge_frame_send(e, m, &m->env, &m->body); }

static void edge_credit_send(edge_t *e, uint32_t n)
{
    /* Only the scalar fields: msg_frame_build reads no descriptor, and an
     * initializer would zero all 16 of them (2.4 KB) per credit frame. */
    wire_env_t env;
    env.ver = WIRE_VERSION;
    env.type = MSG_CREDIT;
    env.src = ACTOR_ADDR(e->rt->cfg.rank, 0);
    env.dst = ACTOR_ADDR(e->rank, 0);
    env.seq = 0;
    env.step = -1;
    env.mb = -1;
    env.ntensors = 0;
    msg_credit_t body = {.edge = e->rt->cfg.rank, .credits = n};
    edge_frame_send(e, NULL, &env, &body);
}

static void edge_send_item(actor_item_t *it)
{
    actor_msg_t *m = (actor_msg_t *)it;
    edge_msg_send(m->tx_edge, m);
}

static void edge_send_cancel(actor_item_t *it) { actor_msg_free((actor_msg_t *)it); }

static void edge_submit(edge_t *e, actor_msg_t *m)
{
    if (on_io(e->rt)) {
        edge_msg_send(e, m);
        return;
    }
    m->tx_edge = e;
    m->item.run = edge_send_item;
    m->item.cancel = edge_send_cancel;
    actor_loop_post(e->rt->io, &m->item);
}

bt_status_t actor_router_send_remote_(actor_router_t *rt, actor_t *from, actor_msg_t *m)
{
    uint32_t rank = actor_addr_rank(m->env.dst);
    edge_t *e = edge_get(rt, rank);
    if (!e) {
        log_error("rank %u: no route to rank %u (%s from %s)", rt->cfg.rank, rank,
                  msg_type_name(m->env.type), from ? from->name : "?");
        actor_msg_free(m);
        return BT_ERR_NOT_FOUND;
    }
    /* failed is set once and never cleared: a sender that misses a fresh
     * failure hands the message to the I/O loop, which drops it there. */
    if (__atomic_load_n(&e->failed, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&rt->mu);
        bt_status_t why = e->status;
        pthread_mutex_unlock(&rt->mu);
        actor_msg_free(m);
        return why < 0 ? why : BT_ERR_PEER_CLOSED;
    }
    if (!actor_credit_tx_take(&e->ctx_tx, from, m)) {
        log_debug("rank %u: %s to rank %u held (no credit)", rt->cfg.rank, msg_type_name(m->env.type), rank);
        return BT_ERR_BUSY;
    }
    edge_submit(e, m);
    return BT_OK;
}

/* Credit arrived from rank: release held messages, wake held actors. */
static void edge_credit_recv(edge_t *e, uint32_t n)
{
    actor_t **waiters;
    uint32_t nwaiters;
    actor_msg_t *m = actor_credit_tx_grant(&e->ctx_tx, n, &waiters, &nwaiters);
    log_debug("rank %u: %u credits from rank %u: releases %s, wakes %u", e->rt->cfg.rank, n, e->rank,
              m ? "some" : "none", nwaiters);
    while (m) {
        actor_msg_t *next = (actor_msg_t *)m->item.next;
        m->item.next = NULL;
        edge_msg_send(e, m);
        m = next;
    }
    for (uint32_t i = 0; i < nwaiters; i++) {
        actor_msg_t *note = actor_msg_new(ACTOR_SYS_CREDIT_READY);
        if (!note) BT_PANIC("out of memory for a credit notice");
        note->sys.credit_rank = e->rank;
        note->env.src = ACTOR_ADDR(e->rank, 0);
        note->env.dst = waiters[i]->addr;
        actor_deliver_(waiters[i], note);
    }
    free(waiters);
}

/* ---- receiving (I/O loop) ------------------------------------------------------ */

static void router_rx_free_now(actor_msg_t *m)
{
    xport_rx_t *rx = m->rx;
    edge_t *e = m->edge;
    m->rx = NULL;
    xport_rx_release(rx);
    if (e && !e->failed && !e->closed) {
        uint32_t n = actor_credit_rx_release(&e->crx);
        if (n) edge_credit_send(e, n);
    }
    actor_msg_free(m);
}

static void router_rx_free_item(actor_item_t *it) { router_rx_free_now((actor_msg_t *)it); }

void actor_router_rx_free_(actor_msg_t *m)
{
    edge_t *e = m->edge;
    if (!e || on_io(e->rt)) {
        router_rx_free_now(m);
        return;
    }
    /* Transport buffers go back on the loop that owns the transport; the
     * loop is gone only after every transport was destroyed, so a canceled
     * release can run here. */
    m->item.run = router_rx_free_item;
    m->item.cancel = router_rx_free_item;
    actor_loop_post(e->rt->io, &m->item);
}

static void router_on_recv(void *arg, xport_ep_t *ep, xport_rx_t *rx)
{
    actor_router_t *rt = arg;
    edge_t *e = ep->user;
    actor_loop_busy_arm(rt->io);
    char where[XPORT_ADDR_MAX + 16];
    if (!e) {
        log_error("rank %u: frame from an unknown endpoint %s; closing it", rt->cfg.rank, ep->peer_addr);
        xport_rx_release(rx);
        xport_close(ep);
        return;
    }
    actor_msg_t *m = actor_msg_new_rx_();
    if (!m) BT_PANIC("out of memory receiving a frame");
    wire_err_t err;
    bt_status_t st = msg_decode(rx->hdr, rx->hdr_len, rx->payload_len, NULL, &m->env, &m->body, &err);
    if (st == BT_OK && actor_addr_rank(m->env.dst) != rt->cfg.rank) {
        snprintf(err.reason, sizeof err.reason, "frame for rank %u arrived at rank %u",
                 actor_addr_rank(m->env.dst), rt->cfg.rank);
        st = BT_ERR_PEER_PROTO;
    }
    if (st != BT_OK) {
        log_error("rank %u: bad frame from rank %u (%s): %s; closing this connection", rt->cfg.rank,
                  e->rank, edge_where(e, where, sizeof where), err.reason);
        xport_rx_release(rx);
        actor_msg_free(m);
        if (e->ep == ep) {
            edge_fail(e, BT_ERR_PEER_PROTO, err.reason, true);
        } else {
            xport_close(ep);
        }
        return;
    }
    log_debug("rank %u: got %s from %08x", rt->cfg.rank, msg_type_name(m->env.type), m->env.src);
    if (m->env.type == MSG_CREDIT) {
        xport_rx_release(rx);
        uint32_t n = m->body.credit.credits;
        actor_msg_free(m);
        edge_credit_recv(e, n);
        return;
    }
    m->rx = rx;
    m->edge = e;
    for (uint32_t i = 0; i < m->env.ntensors; i++) m->tensors[i] = wire_tensor_view(&m->env, i, rx->payload);
    edge_count(&e->n_received);
    /* The arrival, for the trace only (no clock read per frame otherwise),
     * stamped once the frame is decoded: a message handled right away
     * starts its handler at this stamp. The receive is recorded with its
     * handler span at dispatch (actor.c). */
    m->t_recv_tk = trace_enabled() ? trace_ticks() : 0;
    m->rx_bytes = rx->hdr_len + rx->payload_len;
    actor_t *to = actor_router_lookup_(rt, actor_addr_slot(m->env.dst));
    if (!to) {
        log_warn("rank %u: %s from rank %u for slot %u, which has no actor; dropped", rt->cfg.rank,
                 msg_type_name(m->env.type), e->rank, actor_addr_slot(m->env.dst));
        actor_msg_free(m);
        return;
    }
    actor_deliver_(to, m);
}

/* A link came up: grant the peer its window. */
static void edge_up(edge_t *e)
{
    edge_state_set(e, true, false, BT_OK);
    if (e->rt->cfg.credits > 0) edge_credit_send(e, e->rt->cfg.credits);
}

static void router_on_accept(void *arg, xport_ep_t *ep, uint32_t peer_id)
{
    actor_router_t *rt = arg;
    edge_t *e = edge_get_or_new(rt, peer_id);
    if (!e) {
        log_error("rank %u: peer id %u out of range; closing %s", rt->cfg.rank, peer_id, ep->peer_addr);
        xport_close(ep);
        return;
    }
    if (e->ep && e->ep != ep) {
        log_warn("rank %u: second connection from rank %u (%s); keeping the first", rt->cfg.rank,
                 peer_id, ep->peer_addr);
        xport_close(ep);
        return;
    }
    ep->user = e;
    e->ep = ep;
    e->kind = XPORT_KIND_COUNT;
    for (int k = 0; k < XPORT_KIND_COUNT; k++)
        if (rt->xp[k] == ep->x) e->kind = (xport_kind_t)k;
    log_debug("rank %u: accepted rank %u over %s", rt->cfg.rank, peer_id, xport_kind_name(e->kind));
    edge_up(e);
}

static void edge_connect_start(edge_t *e);

static void router_on_connected(void *arg, xport_ep_t *ep, bt_status_t status)
{
    actor_router_t *rt = arg;
    edge_t *e = ep->user;
    if (!e || e->ep != ep) return;
    if (status == BT_OK) {
        log_debug("rank %u: connected to rank %u over %s", rt->cfg.rank, e->rank, xport_kind_name(e->kind));
        edge_up(e);
        return;
    }
    if (e->is_auto && e->kind == XPORT_UCX && !e->fell_back) {
        e->ep = NULL; /* freed by the transport after we return */
        log_warn("rank %u: ucx connect to rank %u failed (%s); falling back to tcp", rt->cfg.rank,
                 e->rank, bt_status_str(status));
        e->fell_back = true;
        e->kind = XPORT_TCP;
        edge_connect_start(e);
        return;
    }
    edge_fail(e, status, "connect failed", false);
}

static void router_on_error(void *arg, xport_ep_t *ep, bt_status_t why)
{
    (void)arg;
    edge_t *e = ep->user;
    if (!e || e->ep != ep) return;
    /* ep is freed by the transport after we return; edge_fail forgets it */
    edge_fail(e, why, why == BT_ERR_PEER_CLOSED ? "peer closed the connection or died" : "transport error",
              false);
}

/* ---- transports (I/O loop) ----------------------------------------------------- */

static int router_poll(void *arg)
{
    xport_t *x = arg;
    return xport_progress(x);
}

/* xport_config_t.spinning: the io loop spins on the transports' progress. */
static bool router_io_spinning(void *arg) { return actor_loop_spinning(((actor_router_t *)arg)->io); }

static bt_status_t router_xport_get(actor_router_t *rt, xport_kind_t kind, xport_t **out)
{
    if (rt->xp[kind]) {
        *out = rt->xp[kind];
        return BT_OK;
    }
    const xport_ops_t *ops = xport_ops_get(kind);
    if (!ops) return BT_ERR_UNSUPPORTED;
    char listen[96];
    snprintf(listen, sizeof listen, "%s:0", rt->host);
    xport_config_t cfg = {
        .loop = actor_loop_ev(rt->io),
        .job_id = rt->job_id,
        .secret = rt->secret,
        .secret_len = rt->secret_len,
        .self_id = rt->cfg.rank,
        .listen_addr = kind == XPORT_INPROC ? NULL : listen,
        .max_frame = rt->cfg.max_frame,
        .busy_poll = rt->cfg.busy_poll_us > 0,
        .spinning = router_io_spinning,
        .cbs = {
            .arg = rt,
            .accept = router_on_accept,
            .connected = router_on_connected,
            .alloc = router_payload_alloc,
            .free = router_payload_free,
            .recv = router_on_recv,
            .error = router_on_error,
        },
    };
    xport_t *x;
    bt_status_t st = xport_create(ops, &cfg, &x);
    if (st != BT_OK) {
        log_error("rank %u: cannot create the %s transport: %s", rt->cfg.rank, ops->name, bt_status_str(st));
        return st;
    }
    x->user = rt;
    rt->xp[kind] = x;
    if (rt->cfg.busy_poll_us > 0) actor_loop_poller_add(rt->io, router_poll, x);
    *out = x;
    return BT_OK;
}

static void edge_connect_start(edge_t *e)
{
    actor_router_t *rt = e->rt;
    char key[16];
    snprintf(key, sizeof key, "%s=", xport_kind_name(e->kind));
    const char *p = strstr(e->card, key);
    char addr[XPORT_LISTEN_ADDR_MAX];
    xport_t *x;
    bt_status_t st = BT_ERR_INVALID;
    if (p) {
        p += strlen(key);
        size_t len = strcspn(p, ";");
        if (len < sizeof addr) {
            memcpy(addr, p, len);
            addr[len] = '\0';
            st = BT_OK;
        }
    }
    if (st != BT_OK) {
        log_error("rank %u: card of rank %u has no %s address: '%s'", rt->cfg.rank, e->rank,
                  xport_kind_name(e->kind), e->card);
        edge_fail(e, BT_ERR_PEER_UNREACH, "no address for the transport", false);
        return;
    }
    st = router_xport_get(rt, e->kind, &x);
    if (st != BT_OK) {
        edge_fail(e, BT_ERR_PEER_UNREACH, "transport not available", false);
        return;
    }
    xport_ep_t *ep = NULL;
    st = xport_connect(x, addr, &ep);
    if (st != BT_IN_PROGRESS && st != BT_OK && e->is_auto && e->kind == XPORT_UCX && !e->fell_back) {
        /* refused at once (a ucx address UCX cannot reach): as a failed
         * connect, auto takes tcp */
        log_warn("rank %u: ucx connect to rank %u refused (%s); falling back to tcp", rt->cfg.rank, e->rank,
                 bt_status_str(st));
        e->fell_back = true;
        e->kind = XPORT_TCP;
        edge_connect_start(e);
        return;
    }
    if (st != BT_IN_PROGRESS && st != BT_OK) {
        log_error("rank %u: connect to rank %u at %s %.96s: %s", rt->cfg.rank, e->rank,
                  xport_kind_name(e->kind), addr, bt_status_str(st));
        edge_fail(e, st < 0 ? st : BT_ERR_PEER_UNREACH, "connect refused", false);
        return;
    }
    ep->user = e;
    e->ep = ep;
}

typedef struct {
    actor_router_t *rt;
    unsigned        kinds;
    bt_status_t     st;
} listen_call_t;

static void router_listen_io(void *arg)
{
    listen_call_t *c = arg;
    actor_router_t *rt = c->rt;
    c->st = BT_OK;
    for (int k = 0; k < XPORT_KIND_COUNT; k++) {
        if (!(c->kinds & (1u << k)) || !xport_ops_get((xport_kind_t)k) || rt->addr[k][0]) continue;
        xport_t *x;
        bt_status_t st = router_xport_get(rt, (xport_kind_t)k, &x);
        if (st == BT_OK) st = xport_listen(x, rt->addr[k], sizeof rt->addr[k]);
        if (st != BT_OK) {
            rt->addr[k][0] = '\0';
            /* ucx may be built but unusable here: auto then uses tcp. */
            if (k == XPORT_UCX) {
                log_warn("rank %u: ucx listen failed (%s); peers will use tcp", rt->cfg.rank,
                         bt_status_str(st));
                continue;
            }
            log_error("rank %u: %s listen failed: %s", rt->cfg.rank, xport_kind_name((xport_kind_t)k),
                      bt_status_str(st));
            c->st = st;
        }
    }
}

bt_status_t actor_router_listen(actor_router_t *rt, unsigned kinds, char *card, size_t cap)
{
    listen_call_t c = {.rt = rt, .kinds = kinds};
    if (on_io(rt)) router_listen_io(&c);
    else actor_loop_call(rt->io, router_listen_io, &c);
    if (c.st != BT_OK) return c.st;
    int n = snprintf(card, cap, "pid=%ld", (long)getpid());
    for (int k = 0; k < XPORT_KIND_COUNT && n >= 0 && (size_t)n < cap; k++)
        if (rt->addr[k][0])
            n += snprintf(card + n, cap - (size_t)n, ";%s=%s", xport_kind_name((xport_kind_t)k), rt->addr[k]);
    if (n < 0 || (size_t)n >= cap) return BT_ERR_INVALID;
    return BT_OK;
}

static bool card_has(const char *card, const char *kind)
{
    char key[16];
    snprintf(key, sizeof key, ";%s=", kind);
    return strstr(card, key) != NULL;
}

static void edge_connect_io(void *arg) { edge_connect_start(arg); }

bt_status_t actor_router_connect(actor_router_t *rt, uint32_t rank, const char *card,
                                 xport_kind_t kind, bool is_auto)
{
    if (rank == rt->cfg.rank || rank >= ACTOR_ROUTER_MAX_RANKS || !card || strlen(card) >= ACTOR_CARD_MAX) {
        log_error("rank %u: cannot connect to rank %u (bad rank or card)", rt->cfg.rank, rank);
        return BT_ERR_INVALID;
    }
    if (is_auto) {
        long pid = -1;
        sscanf(card, "pid=%ld", &pid);
        if (pid == (long)getpid() && card_has(card, "inproc")) kind = XPORT_INPROC;
        else if (xport_ops_get(XPORT_UCX) && card_has(card, "ucx")) kind = XPORT_UCX;
        else kind = XPORT_TCP;
    }
    if (!xport_ops_get(kind)) {
        log_error("rank %u: transport %s is not built", rt->cfg.rank, xport_kind_name(kind));
        return BT_ERR_UNSUPPORTED;
    }
    edge_t *e = edge_get_or_new(rt, rank);
    if (!e) return BT_ERR_NOMEM;
    e->kind = kind;
    e->is_auto = is_auto;
    snprintf(e->card, sizeof e->card, "%s", card);
    if (on_io(rt)) edge_connect_start(e);
    else return actor_loop_call(rt->io, edge_connect_io, e);
    return BT_OK;
}

bt_status_t actor_router_connect_str(actor_router_t *rt, uint32_t rank, const char *card,
                                     const char *kind)
{
    xport_kind_t k;
    bool is_auto;
    if (xport_kind_parse(kind, &k, &is_auto) != BT_OK) {
        log_error("unknown transport '%s' (inproc|tcp|ucx|auto)", kind ? kind : "(null)");
        return BT_ERR_INVALID;
    }
    return actor_router_connect(rt, rank, card, k, is_auto);
}

static void deadline_after(struct timespec *ts, unsigned ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

bt_status_t actor_router_wait_peer(actor_router_t *rt, uint32_t rank, unsigned timeout_ms)
{
    assert(!on_io(rt));
    struct timespec dl;
    deadline_after(&dl, timeout_ms);
    bt_status_t st = BT_ERR_TIMEOUT;
    pthread_mutex_lock(&rt->mu);
    for (;;) {
        edge_t *e = rank < ACTOR_ROUTER_MAX_RANKS ? atomic_load(&rt->edges[rank]) : NULL;
        if (e && e->up) { st = BT_OK; break; }
        if (e && e->failed) { st = e->status; break; }
        if (pthread_cond_timedwait(&rt->cv, &rt->mu, &dl) == ETIMEDOUT) break;
    }
    pthread_mutex_unlock(&rt->mu);
    return st;
}

int actor_router_peer_kind(actor_router_t *rt, uint32_t rank)
{
    edge_t *e = edge_get(rt, rank);
    if (!e) return -1;
    pthread_mutex_lock(&rt->mu);
    int k = e->up ? (int)e->kind : -1;
    pthread_mutex_unlock(&rt->mu);
    return k;
}

bt_status_t actor_router_edge_stats(actor_router_t *rt, uint32_t rank, actor_edge_stats_t *out)
{
    edge_t *e = edge_get(rt, rank);
    if (!e) return BT_ERR_NOT_FOUND;
    memset(out, 0, sizeof *out);
    out->sent = atomic_load(&e->n_sent);
    out->received = atomic_load(&e->n_received);
    pthread_mutex_lock(&e->ctx_tx.mu);
    out->held = e->ctx_tx.held_total;
    out->credits = e->ctx_tx.avail;
    out->pending = e->ctx_tx.npending;
    pthread_mutex_unlock(&e->ctx_tx.mu);
    pthread_mutex_lock(&rt->mu);
    out->up = e->up;
    out->failed = e->failed;
    pthread_mutex_unlock(&rt->mu);
    return BT_OK;
}

/* ---- actors table ---------------------------------------------------------------- */

actor_t *actor_router_lookup_(actor_router_t *rt, uint32_t slot)
{
    if (slot >= ACTOR_ROUTER_MAX_SLOTS) return NULL;
    return atomic_load_explicit(&rt->slots[slot], memory_order_acquire);
}

bt_status_t actor_router_register_(actor_router_t *rt, actor_t *a, uint32_t slot)
{
    bt_status_t st = BT_OK;
    pthread_mutex_lock(&rt->mu);
    if (slot == ACTOR_SLOT_ANY) {
        /* slot 0 stays free: address (rank, 0) names the process in reports */
        for (slot = 1; slot < ACTOR_ROUTER_MAX_SLOTS && atomic_load(&rt->slots[slot]); slot++) {}
        if (slot == ACTOR_ROUTER_MAX_SLOTS) st = BT_ERR_BUSY;
    } else if (slot >= ACTOR_ROUTER_MAX_SLOTS || atomic_load(&rt->slots[slot])) {
        st = BT_ERR_BUSY;
    }
    if (st == BT_OK) {
        a->addr = ACTOR_ADDR(rt->cfg.rank, slot);
        atomic_store_explicit(&rt->slots[slot], a, memory_order_release);
    }
    pthread_mutex_unlock(&rt->mu);
    if (st != BT_OK) log_error("rank %u: cannot register actor %s: slot taken or table full", rt->cfg.rank,
                               a->name);
    return st;
}

void actor_router_supervisor_set(actor_router_t *rt, uint32_t addr) { atomic_store(&rt->supervisor, addr); }

/* ---- lifecycle --------------------------------------------------------------------- */

bt_status_t actor_router_create(const actor_router_config_t *cfg, actor_router_t **out)
{
    if (cfg->rank >= ACTOR_ROUTER_MAX_RANKS) {
        log_error("rank %u out of range (max %u)", cfg->rank, ACTOR_ROUTER_MAX_RANKS - 1);
        return BT_ERR_INVALID;
    }
    actor_router_t *rt = calloc(1, sizeof *rt);
    if (!rt) return BT_ERR_NOMEM;
    rt->cfg = *cfg;
    rt->small.max = ROUTER_SMALL_KEEP;
    snprintf(rt->job_id, sizeof rt->job_id, "%s", cfg->job_id ? cfg->job_id : "baton");
    snprintf(rt->host, sizeof rt->host, "%s", cfg->listen_host ? cfg->listen_host : "127.0.0.1");
    rt->cfg.job_id = rt->job_id;
    rt->cfg.listen_host = rt->host;
    const uint8_t *secret = cfg->secret ? cfg->secret : router_test_secret;
    rt->secret_len = cfg->secret ? cfg->secret_len : sizeof router_test_secret - 1;
    rt->secret = malloc(rt->secret_len);
    if (!rt->secret) goto fail_secret;
    memcpy(rt->secret, secret, rt->secret_len);
    rt->cfg.secret = NULL; /* not kept twice */
    pthread_mutex_init(&rt->mu, NULL);
    pthread_cond_init(&rt->cv, NULL);

    bt_status_t st = actor_loop_create("io", &rt->io);
    if (st != BT_OK) goto fail_loop;
    actor_loop_busy_config(rt->io, cfg->busy_poll_us);
    st = actor_loop_start(rt->io);
    if (st != BT_OK) goto fail_start;
    *out = rt;
    return BT_OK;

fail_start:
    actor_loop_destroy(rt->io);
fail_loop:
    pthread_cond_destroy(&rt->cv);
    pthread_mutex_destroy(&rt->mu);
    free(rt->secret);
fail_secret:
    free(rt);
    return BT_ERR_NOMEM;
}

bt_status_t actor_router_loop_new(actor_router_t *rt, const char *name, actor_loop_t **out)
{
    pthread_mutex_lock(&rt->mu);
    bool full = rt->nloops == ROUTER_MAX_LOOPS;
    pthread_mutex_unlock(&rt->mu);
    if (full) {
        log_error("rank %u: more than %d loops", rt->cfg.rank, ROUTER_MAX_LOOPS);
        return BT_ERR_BUSY;
    }
    actor_loop_t *l;
    bt_status_t st = actor_loop_create(name, &l);
    if (st != BT_OK) return st;
    st = actor_loop_start(l);
    if (st != BT_OK) {
        actor_loop_destroy(l);
        return st;
    }
    pthread_mutex_lock(&rt->mu);
    rt->loops[rt->nloops++] = l;
    pthread_mutex_unlock(&rt->mu);
    *out = l;
    return BT_OK;
}

bt_status_t actor_router_worker_new(actor_router_t *rt, const char *name, actor_worker_t **out)
{
    pthread_mutex_lock(&rt->mu);
    bool full = rt->nworkers == ROUTER_MAX_WORKERS;
    pthread_mutex_unlock(&rt->mu);
    if (full) {
        log_error("rank %u: more than %d workers", rt->cfg.rank, ROUTER_MAX_WORKERS);
        return BT_ERR_BUSY;
    }
    actor_worker_t *w;
    bt_status_t st = actor_worker_create(name, &w);
    if (st != BT_OK) return st;
    pthread_mutex_lock(&rt->mu);
    rt->workers[rt->nworkers++] = w;
    pthread_mutex_unlock(&rt->mu);
    *out = w;
    return BT_OK;
}

void actor_router_quiesce(actor_router_t *rt)
{
    pthread_mutex_lock(&rt->mu);
    rt->quiesced = true;
    pthread_mutex_unlock(&rt->mu);
}

void actor_router_stop_request(actor_router_t *rt, bt_status_t status)
{
    pthread_mutex_lock(&rt->mu);
    if (!rt->stop_req) {
        rt->stop_req = true;
        rt->stop_status = status;
    }
    pthread_cond_broadcast(&rt->cv);
    pthread_mutex_unlock(&rt->mu);
}

bt_status_t actor_router_wait(actor_router_t *rt, unsigned timeout_ms)
{
    struct timespec dl;
    deadline_after(&dl, timeout_ms);
    bt_status_t st = BT_ERR_TIMEOUT;
    pthread_mutex_lock(&rt->mu);
    for (;;) {
        if (rt->stop_req) { st = rt->stop_status; break; }
        if (timeout_ms == 0) pthread_cond_wait(&rt->cv, &rt->mu);
        else if (pthread_cond_timedwait(&rt->cv, &rt->mu, &dl) == ETIMEDOUT) break;
    }
    pthread_mutex_unlock(&rt->mu);
    return st;
}

static void router_actor_stop_io(void *arg) { actor_stop(arg); }
static void router_noop(void *arg) { (void)arg; }

static void router_close_edges_io(void *arg)
{
    actor_router_t *rt = arg;
    for (uint32_t r = 0; r < ACTOR_ROUTER_MAX_RANKS; r++) {
        edge_t *e = atomic_load(&rt->edges[r]);
        if (!e) continue;
        pthread_mutex_lock(&rt->mu);
        e->closed = true;
        e->up = false;
        pthread_mutex_unlock(&rt->mu);
        if (e->ep) xport_close(e->ep);
        e->ep = NULL;
    }
}

static void router_xports_destroy_io(void *arg)
{
    actor_router_t *rt = arg;
    for (int k = 0; k < XPORT_KIND_COUNT; k++) {
        if (!rt->xp[k]) continue;
        if (rt->cfg.busy_poll_us > 0) actor_loop_poller_remove(rt->io, router_poll, rt->xp[k]);
        xport_destroy(rt->xp[k]);
        rt->xp[k] = NULL;
    }
    for (uint32_t r = 0; r < ACTOR_ROUTER_MAX_RANKS; r++) {
        edge_t *e = atomic_load(&rt->edges[r]);
        while (e && e->free_ctx) {
            send_ctx_t *c = e->free_ctx;
            e->free_ctx = c->next;
            msg_frame_fini(&c->frame);
            free(c);
        }
    }
}

static void router_barrier(actor_router_t *rt)
{
    for (int i = 0; i < rt->nloops; i++) actor_loop_call(rt->loops[i], router_noop, NULL);
    actor_loop_call(rt->io, router_noop, NULL);
}

void actor_router_destroy(actor_router_t *rt)
{
    if (!rt) return;
    /* it waits on every loop of rt: calling it from one of them would hang */
    assert(!on_io(rt));
    for (int i = 0; i < rt->nloops; i++) assert(!actor_loop_is_current(rt->loops[i]));
    /* 1. stop hooks, each on its actor's loop */
    for (uint32_t s = 0; s < ACTOR_ROUTER_MAX_SLOTS; s++) {
        actor_t *a = atomic_load(&rt->slots[s]);
        if (a) actor_loop_call(a->loop, router_actor_stop_io, a);
    }
    /* 2. workers finish their queues; completions for stopped actors are dropped */
    for (int i = 0; i < rt->nworkers; i++) actor_worker_destroy(rt->workers[i]);
    rt->nworkers = 0;
    /* 3. no new frames, then drain every loop (drops post buffer releases to io) */
    actor_loop_call(rt->io, router_close_edges_io, rt);
    router_barrier(rt);
    router_barrier(rt);
    /* 4. transports go (their completions free what they still held) */
    actor_loop_call(rt->io, router_xports_destroy_io, rt);
    router_barrier(rt);
    /* 5. loops exit and are joined */
    for (int i = 0; i < rt->nloops; i++) actor_loop_stop(rt->loops[i]);
    for (int i = 0; i < rt->nloops; i++) {
        actor_loop_join(rt->loops[i]);
        actor_loop_destroy(rt->loops[i]);
    }
    actor_loop_stop(rt->io);
    actor_loop_join(rt->io);
    actor_loop_destroy(rt->io);
    for (uint32_t r = 0; r < ACTOR_ROUTER_MAX_RANKS; r++) {
        edge_t *e = atomic_load(&rt->edges[r]);
        if (!e) continue;
        actor_credit_tx_fini(&e->ctx_tx);
        free(e);
    }
    for (int i = 0; i < ROUTER_CACHE_SLOTS; i++) free(rt->cache[i].p);
    base_freelist_drain(&rt->small);
    pthread_cond_destroy(&rt->cv);
    pthread_mutex_destroy(&rt->mu);
    free(rt->secret);
    free(rt);
}
