/* A fault-injecting transport that wraps tcp (a test hook; docs/FAULTS.md).
 *
 * When BATON_TEST_XPORT_FAULT is set in a process, xport_ops_get(XPORT_TCP)
 * hands out this wrapper instead of tcp itself (transport/xport.c), so every
 * tcp link the process opens (router edges, collective groups) goes through
 * it. The value is comma-separated KEY=VALUE:
 *   delay_ms=D    every frame is handed to tcp D ms after send() (frames of
 *                 one endpoint keep their order);
 *   jitter_ms=J   plus a uniform draw in [0, J) ms per frame (still in order:
 *                 a frame never leaves before the one sent before it);
 *   drop_after=N  after the N-th frame on an endpoint the link is cut: the
 *                 tcp connection is closed under it (the peer sees the
 *                 connection end) and the local side gets the endpoint's
 *                 error callback with BT_ERR_IO, as for a broken link;
 *   host=ADDR     only in a process whose BATON_LISTEN_HOST is ADDR (the
 *                 ranks of that host of a multi-host job);
 *   peer=PREFIX   only on endpoints whose peer address starts with PREFIX
 *                 (a link toward one host: "10.0.0.12:").
 * The wrapper changes no byte: a delayed frame is the same frame later, so
 * a job under delay must end with the same numbers. Corruption is not
 * offered: tcp frames carry no checksum of their own above TCP's, so a
 * flipped payload byte would be a wrong number rather than a fault the job
 * can detect (docs/FAULTS.md says what is not done). */
#include <ev.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "transport/xport.h"

#define FAULT_ENV "BATON_TEST_XPORT_FAULT"

typedef struct {
    double   delay_s, jitter_s;
    uint64_t drop_after;
    char     peer[XPORT_ADDR_MAX];
} fault_spec_t;

typedef struct pending {
    struct pending    *next;
    ev_tstamp          due;
    void              *hdr;
    size_t             hdr_len;
    struct iovec      *iov;
    int                iovcnt;
    xport_send_done_fn done;
    void              *arg;
} pending_t;

struct fault_ep;
typedef struct {
    xport_t          pub;
    xport_t         *inner;
    xport_cbs_t      cbs; /* the caller's */
    struct ev_loop  *loop;
    fault_spec_t     spec;
    uint64_t         rng;
    struct fault_ep *eps; /* every live endpoint, for destroy */
} fault_x_t;

typedef struct fault_ep {
    xport_ep_t       pub;
    xport_ep_t      *inner;
    fault_x_t       *fx;
    pending_t       *head, *tail;
    ev_timer         timer;
    uint64_t         sent;
    bool             cut;
    struct fault_ep *next, **prevp;
} fault_ep_t;

static bt_status_t spec_parse(const char *text, fault_spec_t *s, bool *applies, bool quiet)
{
    memset(s, 0, sizeof *s);
    *applies = true;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        if (!eq) goto bad;
        *eq = 0;
        const char *v = eq + 1;
        char *end;
        if (!strcmp(t, "delay_ms")) s->delay_s = strtod(v, &end) / 1e3;
        else if (!strcmp(t, "jitter_ms")) s->jitter_s = strtod(v, &end) / 1e3;
        else if (!strcmp(t, "drop_after")) s->drop_after = strtoull(v, &end, 10);
        else if (!strcmp(t, "peer")) snprintf(s->peer, sizeof s->peer, "%s", v), end = (char *)v + strlen(v);
        else if (!strcmp(t, "host")) {
            const char *me = getenv("BATON_LISTEN_HOST");
            if (!me || strcmp(me, v)) *applies = false;
            end = (char *)v + strlen(v);
        } else goto bad;
        if (*end || end == v || s->delay_s < 0 || s->jitter_s < 0) goto bad;
    }
    return BT_OK;
bad:
    if (!quiet)
        log_error("%s=%s: expected delay_ms=, jitter_ms=, drop_after=, host=, peer= (comma-separated)", FAULT_ENV,
              text);
    return BT_ERR_INVALID;
}

/* Whether this process runs its tcp links through the wrapper: where the
 * setting applies, or is malformed (create() then fails, saying why). */
bool xport_fault_wanted(void)
{
    const char *v = getenv(FAULT_ENV);
    if (!v || !*v) return false;
    fault_spec_t s;
    bool applies;
    return spec_parse(v, &s, &applies, true) != BT_OK || applies;
}

static bool ep_faulted(const fault_ep_t *fe)
{
    const char *p = fe->fx->spec.peer;
    return !p[0] || !strncmp(fe->pub.peer_addr, p, strlen(p));
}

static void pending_free(pending_t *p)
{
    free(p->hdr);
    free(p->iov);
    free(p);
}

/* Completes every queued frame with st (they never reached tcp). */
static void queue_fail(fault_ep_t *fe, bt_status_t st)
{
    ev_timer_stop(fe->fx->loop, &fe->timer);
    while (fe->head) {
        pending_t *p = fe->head;
        fe->head = p->next;
        p->done(p->arg, st);
        pending_free(p);
    }
    fe->tail = NULL;
}

/* tcp's completion of a queued frame: the header copy lives until then
 * (tcp sends from the caller's buffers, the header included) */
static void pass_done(void *arg, bt_status_t st)
{
    pending_t *p = arg;
    p->done(p->arg, st);
    pending_free(p);
}

static void pass_on(fault_ep_t *fe, pending_t *p)
{
    bt_status_t st = xport_send(fe->inner, p->hdr, p->hdr_len, p->iov, p->iovcnt, pass_done, p);
    if (st != BT_IN_PROGRESS) pass_done(p, st);
}

/* Hands every queued frame to tcp now, in order. */
static void queue_flush(fault_ep_t *fe)
{
    ev_timer_stop(fe->fx->loop, &fe->timer);
    while (fe->head) {
        pending_t *p = fe->head;
        fe->head = p->next;
        pass_on(fe, p);
    }
    fe->tail = NULL;
}

static void ep_free(fault_ep_t *fe)
{
    ev_timer_stop(fe->fx->loop, &fe->timer);
    if (fe->inner) fe->inner->user = NULL;
    *fe->prevp = fe->next;
    if (fe->next) fe->next->prevp = fe->prevp;
    free(fe);
}

static void ep_arm(fault_ep_t *fe)
{
    if (!fe->head) return;
    ev_tstamp wait = fe->head->due - ev_now(fe->fx->loop);
    ev_timer_stop(fe->fx->loop, &fe->timer);
    ev_timer_set(&fe->timer, wait > 0 ? wait : 0, 0);
    ev_timer_start(fe->fx->loop, &fe->timer);
}

/* The link is cut: tcp's connection closed under the endpoint, queued
 * frames failed, the caller told through its error callback. */
static void ep_cut(fault_ep_t *fe)
{
    const char *me = getenv("BATON_LISTEN_HOST");
    log_error("fault: %s: cutting the link %s -> %s (id %u) after %llu frames", FAULT_ENV, me ? me : "this host",
              fe->pub.peer_addr, fe->pub.peer_id, (unsigned long long)fe->sent - 1);
    queue_fail(fe, BT_ERR_IO);
    fe->inner->user = NULL;
    xport_close(fe->inner);
    fe->inner = NULL;
    fault_x_t *fx = fe->fx;
    fx->cbs.error(fx->cbs.arg, &fe->pub, BT_ERR_IO);
    ep_free(fe);
}

static void timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    fault_ep_t *fe = (fault_ep_t *)((char *)w - offsetof(fault_ep_t, timer));
    if (fe->cut) {
        ep_cut(fe);
        return;
    }
    ev_tstamp now = ev_now(loop) + 1e-4;
    while (fe->head && fe->head->due <= now) {
        pending_t *p = fe->head;
        fe->head = p->next;
        if (!fe->head) fe->tail = NULL;
        pass_on(fe, p);
    }
    ep_arm(fe);
}

static fault_ep_t *ep_new(fault_x_t *fx, xport_ep_t *inner)
{
    fault_ep_t *fe = calloc(1, sizeof *fe);
    if (!fe) return NULL;
    fe->pub.ops = fx->pub.ops;
    fe->pub.x = &fx->pub;
    fe->pub.peer_id = inner->peer_id;
    snprintf(fe->pub.peer_addr, sizeof fe->pub.peer_addr, "%s", inner->peer_addr);
    fe->inner = inner;
    fe->fx = fx;
    ev_timer_init(&fe->timer, timer_cb, 0, 0);
    inner->user = fe;
    fe->next = fx->eps;
    if (fx->eps) fx->eps->prevp = &fe->next;
    fe->prevp = &fx->eps;
    fx->eps = fe;
    return fe;
}

/* ---- tcp's callbacks, passed on with our endpoint ------------------------ */

static void on_accept(void *arg, xport_ep_t *inner, uint32_t peer_id)
{
    fault_x_t *fx = arg;
    fault_ep_t *fe = ep_new(fx, inner);
    if (!fe) {
        xport_close(inner);
        return;
    }
    fx->cbs.accept(fx->cbs.arg, &fe->pub, peer_id);
}

static void on_connected(void *arg, xport_ep_t *inner, bt_status_t status)
{
    fault_x_t *fx = arg;
    fault_ep_t *fe = inner->user;
    if (!fe) return;
    fe->pub.peer_id = inner->peer_id;
    if (status != BT_OK) {
        queue_fail(fe, status);
        fe->inner = NULL; /* tcp frees it after we return */
    }
    fx->cbs.connected(fx->cbs.arg, &fe->pub, status);
    if (status != BT_OK) ep_free(fe);
}

static void *on_alloc(void *arg, xport_ep_t *inner, const void *hdr, size_t hdr_len, size_t payload_len)
{
    fault_x_t *fx = arg;
    fault_ep_t *fe = inner->user;
    return fe ? fx->cbs.alloc(fx->cbs.arg, &fe->pub, hdr, hdr_len, payload_len) : NULL;
}

static void on_free(void *arg, void *payload, size_t payload_len)
{
    fault_x_t *fx = arg;
    fx->cbs.free(fx->cbs.arg, payload, payload_len);
}

static void on_recv(void *arg, xport_ep_t *inner, xport_rx_t *rx)
{
    fault_x_t *fx = arg;
    fault_ep_t *fe = inner->user;
    if (!fe) {
        xport_rx_release(rx);
        return;
    }
    fx->cbs.recv(fx->cbs.arg, &fe->pub, rx);
}

static void on_error(void *arg, xport_ep_t *inner, bt_status_t why)
{
    fault_x_t *fx = arg;
    fault_ep_t *fe = inner->user;
    if (!fe) return;
    queue_fail(fe, why);
    fe->inner = NULL;
    fx->cbs.error(fx->cbs.arg, &fe->pub, why);
    ep_free(fe);
}

/* ---- ops ------------------------------------------------------------------ */

const xport_ops_t xport_fault_ops;

static bt_status_t fault_create(const xport_config_t *cfg, xport_t **out)
{
    fault_x_t *fx = calloc(1, sizeof *fx);
    if (!fx) return BT_ERR_NOMEM;
    bool applies;
    if (spec_parse(getenv(FAULT_ENV) ? getenv(FAULT_ENV) : "", &fx->spec, &applies, false)) {
        free(fx);
        return BT_ERR_INVALID;
    }
    fx->pub.ops = &xport_fault_ops;
    fx->cbs = cfg->cbs;
    fx->loop = cfg->loop;
    fx->rng = 0x9e3779b97f4a7c15ull ^ cfg->self_id;
    xport_config_t ic = *cfg;
    ic.cbs = (xport_cbs_t){.arg = fx, .accept = on_accept, .connected = on_connected,
                           .alloc = cfg->cbs.alloc ? on_alloc : NULL, .free = cfg->cbs.free ? on_free : NULL,
                           .recv = on_recv, .error = on_error};
    bt_status_t st = xport_create(&xport_tcp_ops, &ic, &fx->inner);
    if (st) {
        free(fx);
        return st;
    }
    fx->pub.caps = fx->inner->caps;
    static atomic_flag said = ATOMIC_FLAG_INIT;
    if (!atomic_flag_test_and_set(&said))
        log_warn("fault: %s=%s: tcp links of this process go through the fault wrapper", FAULT_ENV,
                 getenv(FAULT_ENV));
    *out = &fx->pub;
    return BT_OK;
}

static void fault_destroy(xport_t *x)
{
    fault_x_t *fx = (fault_x_t *)x;
    for (fault_ep_t *fe = fx->eps; fe; fe = fe->next)
        if (fe->inner) queue_flush(fe);
    xport_destroy(fx->inner); /* closes tcp's endpoints: no callbacks to us */
    while (fx->eps) {
        fx->eps->inner = NULL;
        ep_free(fx->eps);
    }
    free(fx);
}

static bt_status_t fault_listen(xport_t *x, char *addr, size_t cap)
{
    return xport_listen(((fault_x_t *)x)->inner, addr, cap);
}

static bt_status_t fault_connect(xport_t *x, const char *addr, xport_ep_t **ep)
{
    fault_x_t *fx = (fault_x_t *)x;
    xport_ep_t *inner;
    bt_status_t st = xport_connect(fx->inner, addr, &inner);
    if (st != BT_IN_PROGRESS) return st;
    fault_ep_t *fe = ep_new(fx, inner);
    if (!fe) {
        xport_close(inner);
        return BT_ERR_NOMEM;
    }
    *ep = &fe->pub;
    return st;
}

static double draw(fault_x_t *fx)
{
    fx->rng ^= fx->rng << 13;
    fx->rng ^= fx->rng >> 7;
    fx->rng ^= fx->rng << 17;
    return (double)(fx->rng >> 11) / 9007199254740992.0;
}

static bt_status_t fault_send(xport_ep_t *ep, const void *hdr, size_t hdr_len, const struct iovec *iov, int iovcnt,
                              xport_send_done_fn done, void *arg)
{
    fault_ep_t *fe = (fault_ep_t *)ep;
    fault_x_t *fx = fe->fx;
    if (!fe->inner || fe->cut) return BT_ERR_IO;
    bool faulted = ep_faulted(fe);
    fe->sent++;
    bool cut = faulted && fx->spec.drop_after && fe->sent > fx->spec.drop_after;
    bool delayed = faulted && (fx->spec.delay_s > 0 || fx->spec.jitter_s > 0);
    if (!cut && !delayed && !fe->head) return xport_send(fe->inner, hdr, hdr_len, iov, iovcnt, done, arg);
    pending_t *p = calloc(1, sizeof *p);
    if (!p) return BT_ERR_NOMEM;
    p->hdr = hdr_len ? malloc(hdr_len) : NULL;
    p->iov = iovcnt ? malloc((size_t)iovcnt * sizeof *iov) : NULL;
    if ((hdr_len && !p->hdr) || (iovcnt && !p->iov)) {
        pending_free(p);
        return BT_ERR_NOMEM;
    }
    if (hdr_len) memcpy(p->hdr, hdr, hdr_len);
    if (iovcnt) memcpy(p->iov, iov, (size_t)iovcnt * sizeof *iov);
    p->hdr_len = hdr_len;
    p->iovcnt = iovcnt;
    p->done = done;
    p->arg = arg;
    ev_tstamp now = ev_now(fx->loop);
    p->due = now + (delayed ? fx->spec.delay_s + fx->spec.jitter_s * draw(fx) : 0);
    if (fe->tail && p->due < fe->tail->due) p->due = fe->tail->due;
    if (fe->tail) fe->tail->next = p;
    else fe->head = p;
    fe->tail = p;
    if (cut) { /* from the loop, not inside send() */
        fe->cut = true;
        ev_timer_stop(fx->loop, &fe->timer);
        ev_timer_set(&fe->timer, 0, 0);
        ev_timer_start(fx->loop, &fe->timer);
    } else {
        ep_arm(fe);
    }
    return BT_IN_PROGRESS;
}

static void fault_close(xport_ep_t *ep)
{
    fault_ep_t *fe = (fault_ep_t *)ep;
    xport_ep_t *inner = fe->inner;
    if (inner && !fe->cut) queue_flush(fe);
    else queue_fail(fe, BT_ERR_CANCELED);
    ep_free(fe);
    if (inner) xport_close(inner);
}

static int fault_progress(xport_t *x) { return xport_progress(((fault_x_t *)x)->inner); }

static uint32_t fault_ep_peer_id(const xport_ep_t *ep) { return ep->peer_id; }

const xport_ops_t xport_fault_ops = {
    .name = "tcp",
    .caps = XPORT_CAP_HOST_MEM,
    .create = fault_create,
    .destroy = fault_destroy,
    .listen = fault_listen,
    .connect = fault_connect,
    .send = fault_send,
    .close = fault_close,
    .progress = fault_progress,
    .ep_peer_id = fault_ep_peer_id,
};
