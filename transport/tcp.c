/* Raw TCP transport: non-blocking sockets on libev io watchers.
 *
 * Wire: after the handshake (handshake.h), each frame is
 *   frame header (24 B) | hdr (hdr_len B) | payload (payload_len B)
 * with the frame header  magic u32 | version u16 | flags u16 (0) |
 * hdr_len u32 | reserved u32 (0) | payload_len u64, little-endian. Lengths are
 * checked against XPORT_HDR_MAX and cfg.max_frame before anything is
 * allocated. Sends go out with one sendmsg of header+hdr+payload iovecs
 * (several queued frames batched), partial writes resume from the watcher.
 * The payload is read straight into the buffer cbs.alloc returned.
 *
 * Lifetime: an endpoint holds one reference for the xport's list; every
 * handler that may run user callbacks holds another for its duration, so a
 * callback may close (or fail) the endpoint it was called for. A failed or
 * closed endpoint is marked DEAD at once and freed when the last reference
 * goes.
 *
 * Close: frames send() accepted are delivered. close() of an endpoint with
 * unwritten frames makes it CLOSING: no more reads or callbacks, the queue
 * drains from the write watcher, then FIN and close; if it cannot drain
 * within TCP_CLOSE_S the rest is canceled. destroy() drains every such
 * endpoint the same way, waiting on the sockets for that bounded time.
 *
 * Completions: send() never calls done() itself. Completed sends go on the
 * xport's done list, which handlers flush before they return and an ev_idle
 * watcher flushes when a send finished inside send() or close().
 */
#include "transport/xport.h"

#include "base/clock.h"
#include "base/log.h"
#include "transport/handshake.h"
#include "transport/sockaddr.h"

#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define TCP_FRAME_MAGIC   0x52465442u /* "BTFR" */
#define TCP_FRAME_VERSION 1u
#define TCP_FHDR_LEN      24
#define TCP_RBUF_LEN      (64u * 1024u)
#define TCP_IO_BUDGET     (8u << 20)  /* bytes per handler call, for fairness */
#define TCP_IOV_BATCH     64
#define TCP_DEFAULT_MAX_FRAME (1ull << 30)
#define TCP_DEFAULT_HS_MS 5000u
#define TCP_CLOSE_S       2.0   /* how long a closed endpoint may take to drain its queue */

typedef struct tcp_xport tcp_xport_t;

typedef struct tcp_send {
    struct tcp_send   *next;
    xport_send_done_fn done;
    void              *arg;
    bt_status_t        status;
    size_t             total;   /* bytes of all iovecs */
    size_t             sent;
    int                iovcnt;
    uint8_t            fhdr[TCP_FHDR_LEN];
    struct iovec       iov[];   /* fhdr, hdr, payload pieces (zero-length ones left out) */
} tcp_send_t;

typedef enum { EP_CONNECTING, EP_HANDSHAKE, EP_OPEN, EP_CLOSING, EP_DEAD } tcp_ep_state_t;
typedef enum { RX_FHDR, RX_HDR, RX_PAYLOAD } tcp_rx_stage_t;

typedef struct tcp_ep {
    xport_ep_t     base;         /* first: xport_ep_t* <-> tcp_ep_t* */
    tcp_xport_t   *x;
    struct tcp_ep *prev, *next;  /* the xport's list (while not DEAD) */
    int            refs;
    int            fd;
    tcp_ep_state_t state;
    bool           is_server;
    int            connect_err;  /* errno of a connect() that failed at once */
    ev_io          rio, wio;
    ev_timer       hs_timer;

    xport_hs_t     hs;
    int            hs_step;      /* 0: waiting for the peer's hello, 1: for its proof */
    uint8_t        hs_in[XPORT_HS_HELLO_LEN];
    size_t         hs_in_got;
    uint8_t        hs_out[XPORT_HS_HELLO_LEN + XPORT_HS_PROOF_LEN];
    size_t         hs_out_len, hs_out_off;

    tcp_send_t    *sq_head, *sq_tail;

    uint8_t       *rbuf;
    size_t         rpos, rlen;
    tcp_rx_stage_t rstage;
    uint8_t        fhdr[TCP_FHDR_LEN];
    size_t         fhdr_got;
    uint8_t       *hdr;
    size_t         hdr_cap, hdr_len, hdr_got;
    uint8_t       *payload;
    size_t         payload_len, payload_got;
} tcp_ep_t;

struct tcp_xport {
    xport_t        base;         /* first */
    xport_config_t cfg;
    char          *job_id;
    uint8_t       *secret;
    char          *listen_addr;
    unsigned       events;       /* frames delivered + peers accepted, for progress() */
    int            lfd;
    ev_io          lio;
    char           laddr[XPORT_ADDR_MAX];
    tcp_ep_t      *eps;
    tcp_send_t    *done_head, *done_tail;
    ev_idle        idle;
};

typedef struct {
    xport_rx_t   rx;
    tcp_xport_t *x;
} tcp_rx_t;

static void tcp_ep_read(tcp_ep_t *ep);
static void tcp_ep_write(tcp_ep_t *ep);

/* ---- small helpers ---------------------------------------------------- */

static void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put_u32(uint8_t *p, uint32_t v) { put_u16(p, (uint16_t)v); put_u16(p + 2, (uint16_t)(v >> 16)); }
static void put_u64(uint8_t *p, uint64_t v) { put_u32(p, (uint32_t)v); put_u32(p + 4, (uint32_t)(v >> 32)); }
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get_u32(const uint8_t *p) { return (uint32_t)get_u16(p) | (uint32_t)get_u16(p + 2) << 16; }
static uint64_t get_u64(const uint8_t *p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

static void tcp_ep_hold(tcp_ep_t *ep) { ep->refs++; }

static void tcp_ep_unref(tcp_ep_t *ep)
{
    if (--ep->refs > 0) return;
    xport_hs_clear(&ep->hs);
    free(ep->rbuf);
    free(ep->hdr);
    free(ep);
}

static void tcp_done_push(tcp_xport_t *x, tcp_send_t *s, bt_status_t status)
{
    s->status = status;
    s->next = NULL;
    if (x->done_tail) x->done_tail->next = s;
    else x->done_head = s;
    x->done_tail = s;
}

/* Fire completed sends in completion order. A done() may send (appending to
 * the list) or close; each entry is unlinked before its callback runs. */
static int tcp_done_flush(tcp_xport_t *x)
{
    int n = 0;
    while (x->done_head) {
        tcp_send_t *s = x->done_head;
        x->done_head = s->next;
        if (!x->done_head) x->done_tail = NULL;
        if (s->done) s->done(s->arg, s->status);
        free(s);
        n++;
    }
    /* A send that completed inside send() started the idle watcher; flushed
     * here, it must not cost the loop an extra non-blocking epoll_wait. */
    if (ev_is_active(&x->idle)) ev_idle_stop(x->cfg.loop, &x->idle);
    return n;
}

static void tcp_idle_cb(struct ev_loop *loop, ev_idle *w, int revents)
{
    tcp_xport_t *x = w->data;
    ev_idle_stop(loop, w);
    tcp_done_flush(x);
}

static void tcp_done_schedule(tcp_xport_t *x)
{
    if (x->done_head && !ev_is_active(&x->idle)) ev_idle_start(x->cfg.loop, &x->idle);
}

static void tcp_ep_unlink(tcp_ep_t *ep)
{
    tcp_xport_t *x = ep->x;
    if (ep->prev) ep->prev->next = ep->next;
    else x->eps = ep->next;
    if (ep->next) ep->next->prev = ep->prev;
    ep->prev = ep->next = NULL;
}

/* Stop watchers, close the socket, hand back a half-received payload, move
 * the send queue to the done list with `status`. */
static void tcp_ep_teardown(tcp_ep_t *ep, bt_status_t status)
{
    tcp_xport_t *x = ep->x;
    ev_io_stop(x->cfg.loop, &ep->rio);
    ev_io_stop(x->cfg.loop, &ep->wio);
    ev_timer_stop(x->cfg.loop, &ep->hs_timer);
    if (ep->fd >= 0) close(ep->fd);
    ep->fd = -1;
    if (ep->payload) {
        if (x->cfg.cbs.free) x->cfg.cbs.free(x->cfg.cbs.arg, ep->payload, ep->payload_len);
        else free(ep->payload);
        ep->payload = NULL;
    }
    while (ep->sq_head) {
        tcp_send_t *s = ep->sq_head;
        ep->sq_head = s->next;
        tcp_done_push(x, s, status);
    }
    ep->sq_tail = NULL;
}

/* The endpoint failed: log once with the reason and the peer's address,
 * complete pending sends with `status`, then tell the owner (error for an
 * open endpoint, connected for our own unfinished connect; a peer that never
 * passed the handshake on our listener is only logged). */
static void tcp_ep_fail(tcp_ep_t *ep, bt_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void tcp_ep_fail(tcp_ep_t *ep, bt_status_t status, const char *fmt, ...)
{
    if (ep->state == EP_DEAD) return;
    tcp_xport_t *x = ep->x;
    tcp_ep_state_t was = ep->state;
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (was == EP_CLOSING)
        log_warn("tcp: closing %s: %s; frames not yet written are dropped", ep->base.peer_addr, why);
    else if (was == EP_OPEN && status == BT_ERR_PEER_CLOSED && !strcmp(why, "connection closed"))
        log_debug("tcp: peer %s (id %u) closed the connection", ep->base.peer_addr, ep->base.peer_id);
    else if (was == EP_OPEN && status == BT_ERR_PEER_CLOSED)
        log_warn("tcp: peer %s (id %u) closed: %s", ep->base.peer_addr, ep->base.peer_id, why);
    else
        log_error("tcp: dropping peer %s (id %d, %s): %s [%s]", ep->base.peer_addr,
                  ep->base.peer_id == XPORT_PEER_ID_UNKNOWN ? -1 : (int)ep->base.peer_id,
                  was == EP_OPEN ? "open" : "handshake", why, bt_status_str(status));

    ep->state = EP_DEAD;
    tcp_ep_hold(ep);
    tcp_ep_unlink(ep);
    tcp_ep_teardown(ep, status);
    tcp_done_flush(x);
    if (was == EP_CLOSING) {
        /* closed by its owner: nobody to tell */
    } else if (was == EP_OPEN) {
        if (x->cfg.cbs.error) x->cfg.cbs.error(x->cfg.cbs.arg, &ep->base, status);
    } else if (!ep->is_server) {
        if (x->cfg.cbs.connected) x->cfg.cbs.connected(x->cfg.cbs.arg, &ep->base, status);
    }
    ep->refs--;        /* the list's reference; ours keeps ep alive */
    tcp_ep_unref(ep);  /* ours */
}

static void tcp_sock_tune(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* ---- handshake -------------------------------------------------------- */

static void tcp_hs_out_append(tcp_ep_t *ep, const uint8_t *p, size_t n)
{
    if (ep->hs_out_len + n > sizeof ep->hs_out) BT_PANIC("handshake out buffer overflow");
    memcpy(ep->hs_out + ep->hs_out_len, p, n);
    ep->hs_out_len += n;
}

/* The handshake's deadline, or a close's. */
static void tcp_hs_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    tcp_ep_t *ep = w->data;
    if (ep->state == EP_CLOSING)
        tcp_ep_fail(ep, BT_ERR_CANCELED, "queue not drained within %.0f s of the close", TCP_CLOSE_S);
    else
        tcp_ep_fail(ep, BT_ERR_PEER_TIMEOUT, "handshake not finished within %u ms",
                    ep->x->cfg.handshake_ms);
}

/* Both sides: start the handshake once the socket is connected. */
static bt_status_t tcp_hs_start(tcp_ep_t *ep)
{
    tcp_xport_t *x = ep->x;
    bt_status_t st = xport_hs_init(&ep->hs, ep->is_server, x->job_id, x->secret,
                                   x->cfg.secret_len, x->cfg.self_id);
    if (st != BT_OK) return st;
    uint8_t hello[XPORT_HS_HELLO_LEN];
    xport_hs_hello_write(&ep->hs, hello);
    tcp_hs_out_append(ep, hello, sizeof hello);
    ep->state = EP_HANDSHAKE;
    ev_io_start(x->cfg.loop, &ep->rio);
    ev_io_start(x->cfg.loop, &ep->wio);
    return BT_OK;
}

/* The handshake passed: report the endpoint and let queued sends go. */
static void tcp_hs_finish(tcp_ep_t *ep)
{
    tcp_xport_t *x = ep->x;
    ev_timer_stop(x->cfg.loop, &ep->hs_timer);
    ep->state = EP_OPEN;
    ep->base.peer_id = ep->hs.peer_id;
    xport_hs_clear(&ep->hs);
    log_debug("tcp: peer %s (id %u) passed the handshake", ep->base.peer_addr, ep->base.peer_id);
    if (ep->is_server) {
        if (x->cfg.cbs.accept) x->cfg.cbs.accept(x->cfg.cbs.arg, &ep->base, ep->base.peer_id);
    } else {
        if (x->cfg.cbs.connected) x->cfg.cbs.connected(x->cfg.cbs.arg, &ep->base, BT_OK);
    }
    if (ep->state == EP_OPEN && (ep->sq_head || ep->hs_out_off < ep->hs_out_len))
        ev_io_start(x->cfg.loop, &ep->wio);
}

/* Consume handshake bytes from rbuf. */
static void tcp_hs_consume(tcp_ep_t *ep)
{
    size_t need = ep->hs_step == 0 ? XPORT_HS_HELLO_LEN : XPORT_HS_PROOF_LEN;
    size_t take = ep->rlen - ep->rpos;
    if (take > need - ep->hs_in_got) take = need - ep->hs_in_got;
    memcpy(ep->hs_in + ep->hs_in_got, ep->rbuf + ep->rpos, take);
    ep->rpos += take;
    ep->hs_in_got += take;
    if (ep->hs_in_got < need) return;
    ep->hs_in_got = 0;

    char why[160];
    bt_status_t st;
    if (ep->hs_step == 0) {
        st = xport_hs_hello_read(&ep->hs, ep->hs_in, why, sizeof why);
        if (st != BT_OK) {
            tcp_ep_fail(ep, st, "%s", why);
            return;
        }
        ep->hs_step = 1;
        if (!ep->is_server) { /* the client proves first */
            uint8_t proof[XPORT_HS_PROOF_LEN];
            xport_hs_proof_write(&ep->hs, proof);
            tcp_hs_out_append(ep, proof, sizeof proof);
            ev_io_start(ep->x->cfg.loop, &ep->wio);
        }
        return;
    }
    st = xport_hs_proof_check(&ep->hs, ep->hs_in, why, sizeof why);
    if (st != BT_OK) {
        tcp_ep_fail(ep, st, "%s", why);
        return;
    }
    if (ep->is_server) {
        uint8_t proof[XPORT_HS_PROOF_LEN];
        xport_hs_proof_write(&ep->hs, proof);
        tcp_hs_out_append(ep, proof, sizeof proof);
    }
    tcp_hs_finish(ep);
}

/* ---- receive ---------------------------------------------------------- */

static void tcp_rx_release(xport_rx_t *rx)
{
    tcp_rx_t *r = (tcp_rx_t *)rx;
    if (rx->payload) {
        if (r->x->cfg.cbs.free) r->x->cfg.cbs.free(r->x->cfg.cbs.arg, rx->payload, rx->payload_len);
        else free(rx->payload);
    }
    free(r);
}

static void tcp_frame_deliver(tcp_ep_t *ep)
{
    tcp_xport_t *x = ep->x;
    tcp_rx_t *r = malloc(sizeof *r);
    if (!r) {
        tcp_ep_fail(ep, BT_ERR_NOMEM, "out of memory for a received frame");
        return;
    }
    r->x = x;
    r->rx = (xport_rx_t){
        .hdr = ep->hdr, .hdr_len = ep->hdr_len,
        .payload = ep->payload, .payload_len = ep->payload_len,
        .release = tcp_rx_release, .priv = NULL,
    };
    ep->payload = NULL; /* the rx owns it now */
    x->events++;
    ep->rstage = RX_FHDR;
    ep->fhdr_got = 0;
    if (x->cfg.cbs.recv) x->cfg.cbs.recv(x->cfg.cbs.arg, &ep->base, &r->rx);
    else tcp_rx_release(&r->rx);
}

/* hdr complete: pick the payload buffer, or deliver at once. */
static void tcp_frame_hdr_done(tcp_ep_t *ep)
{
    tcp_xport_t *x = ep->x;
    if (ep->payload_len == 0) {
        tcp_frame_deliver(ep);
        return;
    }
    void *p = x->cfg.cbs.alloc
        ? x->cfg.cbs.alloc(x->cfg.cbs.arg, &ep->base, ep->hdr, ep->hdr_len, ep->payload_len)
        : malloc(ep->payload_len);
    if (ep->state == EP_DEAD) { /* alloc() closed the endpoint */
        if (p) {
            if (x->cfg.cbs.free) x->cfg.cbs.free(x->cfg.cbs.arg, p, ep->payload_len);
            else free(p);
        }
        return;
    }
    if (!p) {
        tcp_ep_fail(ep, BT_ERR_PEER_PROTO, "receiver refused a %zu-byte payload", ep->payload_len);
        return;
    }
    ep->payload = p;
    ep->payload_got = 0;
    ep->rstage = RX_PAYLOAD;
}

static void tcp_frame_fhdr_done(tcp_ep_t *ep)
{
    tcp_xport_t *x = ep->x;
    uint32_t magic = get_u32(ep->fhdr);
    uint16_t version = get_u16(ep->fhdr + 4);
    uint16_t flags = get_u16(ep->fhdr + 6);
    uint32_t hdr_len = get_u32(ep->fhdr + 8);
    uint32_t reserved = get_u32(ep->fhdr + 12);
    uint64_t payload_len = get_u64(ep->fhdr + 16);
    if (magic != TCP_FRAME_MAGIC) {
        tcp_ep_fail(ep, BT_ERR_PEER_PROTO, "bad frame magic 0x%08x", magic);
        return;
    }
    if (version != TCP_FRAME_VERSION || flags != 0 || reserved != 0) {
        tcp_ep_fail(ep, BT_ERR_PEER_PROTO, "frame version %u flags 0x%x reserved 0x%x not understood",
                    version, flags, reserved);
        return;
    }
    if (hdr_len > XPORT_HDR_MAX || hdr_len > x->cfg.max_frame
        || payload_len > x->cfg.max_frame - hdr_len) {
        tcp_ep_fail(ep, BT_ERR_PEER_PROTO, "frame of %u+%llu bytes exceeds the limit (hdr %u, frame %zu)",
                    hdr_len, (unsigned long long)payload_len, XPORT_HDR_MAX, x->cfg.max_frame);
        return;
    }
    if (hdr_len > ep->hdr_cap) {
        uint8_t *h = realloc(ep->hdr, hdr_len);
        if (!h) {
            tcp_ep_fail(ep, BT_ERR_NOMEM, "out of memory for a %u-byte frame header", hdr_len);
            return;
        }
        ep->hdr = h;
        ep->hdr_cap = hdr_len;
    }
    ep->hdr_len = hdr_len;
    ep->hdr_got = 0;
    ep->payload_len = (size_t)payload_len;
    ep->rstage = RX_HDR;
    if (hdr_len == 0) tcp_frame_hdr_done(ep);
}

/* Consume frame bytes from rbuf. */
static void tcp_frame_consume(tcp_ep_t *ep)
{
    size_t avail = ep->rlen - ep->rpos;
    const uint8_t *src = ep->rbuf + ep->rpos;
    size_t take;
    switch (ep->rstage) {
    case RX_FHDR:
        take = TCP_FHDR_LEN - ep->fhdr_got;
        if (take > avail) take = avail;
        memcpy(ep->fhdr + ep->fhdr_got, src, take);
        ep->fhdr_got += take;
        ep->rpos += take;
        if (ep->fhdr_got == TCP_FHDR_LEN) tcp_frame_fhdr_done(ep);
        return;
    case RX_HDR:
        take = ep->hdr_len - ep->hdr_got;
        if (take > avail) take = avail;
        memcpy(ep->hdr + ep->hdr_got, src, take);
        ep->hdr_got += take;
        ep->rpos += take;
        if (ep->hdr_got == ep->hdr_len) tcp_frame_hdr_done(ep);
        return;
    case RX_PAYLOAD:
        take = ep->payload_len - ep->payload_got;
        if (take > avail) take = avail;
        memcpy(ep->payload + ep->payload_got, src, take);
        ep->payload_got += take;
        ep->rpos += take;
        if (ep->payload_got == ep->payload_len) tcp_frame_deliver(ep);
        return;
    }
}

static void tcp_ep_eof(tcp_ep_t *ep)
{
    if (ep->state != EP_OPEN)
        tcp_ep_fail(ep, BT_ERR_PEER_AUTH, "closed during the handshake");
    else if (ep->rstage == RX_FHDR && ep->fhdr_got == 0)
        tcp_ep_fail(ep, BT_ERR_PEER_CLOSED, "connection closed");
    else if (ep->rstage == RX_PAYLOAD)
        tcp_ep_fail(ep, BT_ERR_PEER_CLOSED, "closed mid-frame (payload %zu of %zu bytes)",
                    ep->payload_got, ep->payload_len);
    else
        tcp_ep_fail(ep, BT_ERR_PEER_CLOSED, "closed mid-frame (truncated frame header)");
}

/* Read until the socket is drained or the budget is spent; the caller holds
 * a reference. A recv that returns less than asked for means the kernel had
 * no more bytes queued: stop there instead of paying for a recv that returns
 * EAGAIN (the io watcher is level-triggered, so later bytes wake us again).
 * This halves the syscalls per small message. */
static void tcp_ep_read(tcp_ep_t *ep)
{
    size_t budget = TCP_IO_BUDGET;
    bool drained = false;
    while (ep->state == EP_HANDSHAKE || ep->state == EP_OPEN) {
        if (ep->rpos < ep->rlen) {
            if (ep->state == EP_HANDSHAKE) tcp_hs_consume(ep);
            else tcp_frame_consume(ep);
            continue;
        }
        if (budget == 0 || drained) return;
        ssize_t r;
        size_t want_direct = 0;
        bool direct = ep->state == EP_OPEN && ep->rstage == RX_PAYLOAD
                      && ep->payload_len - ep->payload_got >= TCP_RBUF_LEN;
        if (direct) { /* large payload: straight into the receiver's buffer */
            size_t want = ep->payload_len - ep->payload_got;
            if (want > budget) want = budget;
            want_direct = want;
            r = recv(ep->fd, ep->payload + ep->payload_got, want, 0);
        } else {
            r = recv(ep->fd, ep->rbuf, TCP_RBUF_LEN, 0);
        }
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            tcp_ep_fail(ep, BT_ERR_PEER_CLOSED, "recv: %s", strerror(errno));
            return;
        }
        if (r == 0) {
            tcp_ep_eof(ep);
            return;
        }
        budget = (size_t)r >= budget ? 0 : budget - (size_t)r;
        drained = (size_t)r < (direct ? want_direct : (size_t)TCP_RBUF_LEN);
        if (direct) {
            ep->payload_got += (size_t)r;
            if (ep->payload_got == ep->payload_len) tcp_frame_deliver(ep);
        } else {
            ep->rpos = 0;
            ep->rlen = (size_t)r;
        }
    }
}

/* ---- send ------------------------------------------------------------- */

/* Write handshake bytes then (when open) queued frames until EAGAIN. */
/* A closing endpoint's queue is empty: FIN after the last byte, and gone. */
static void tcp_close_finish(tcp_ep_t *ep)
{
    if (ep->fd >= 0) shutdown(ep->fd, SHUT_WR);
    ep->state = EP_DEAD;
    tcp_ep_unlink(ep);
    tcp_ep_teardown(ep, BT_ERR_CANCELED);
    tcp_done_schedule(ep->x);
    tcp_ep_unref(ep); /* the list's reference */
}

static void tcp_ep_write(tcp_ep_t *ep)
{
    tcp_xport_t *x = ep->x;
    size_t budget = TCP_IO_BUDGET;
    while (ep->hs_out_off < ep->hs_out_len) {
        ssize_t w = send(ep->fd, ep->hs_out + ep->hs_out_off, ep->hs_out_len - ep->hs_out_off,
                         MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) goto wait_writable;
            tcp_ep_fail(ep, ep->state == EP_OPEN ? BT_ERR_PEER_CLOSED : BT_ERR_PEER_AUTH,
                        "send: %s", strerror(errno));
            return;
        }
        ep->hs_out_off += (size_t)w;
    }
    if (ep->state != EP_OPEN && ep->state != EP_CLOSING) goto stop_writable;
    while (ep->sq_head && budget > 0) {
        struct iovec iov[TCP_IOV_BATCH];
        int n = 0;
        for (tcp_send_t *s = ep->sq_head; s && n < TCP_IOV_BATCH; s = s->next) {
            size_t skip = s->sent;
            for (int i = 0; i < s->iovcnt && n < TCP_IOV_BATCH; i++) {
                if (skip >= s->iov[i].iov_len) {
                    skip -= s->iov[i].iov_len;
                    continue;
                }
                iov[n].iov_base = (uint8_t *)s->iov[i].iov_base + skip;
                iov[n].iov_len = s->iov[i].iov_len - skip;
                skip = 0;
                n++;
            }
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(ep->fd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) goto wait_writable;
            tcp_ep_fail(ep, BT_ERR_PEER_CLOSED, "send: %s", strerror(errno));
            return;
        }
        size_t left = (size_t)w;
        budget = left >= budget ? 0 : budget - left;
        while (left > 0 || (ep->sq_head && ep->sq_head->sent == ep->sq_head->total)) {
            tcp_send_t *s = ep->sq_head;
            size_t need = s->total - s->sent;
            if (left < need) {
                s->sent += left;
                left = 0;
                break;
            }
            left -= need;
            s->sent = s->total;
            ep->sq_head = s->next;
            if (!ep->sq_head) ep->sq_tail = NULL;
            tcp_done_push(x, s, BT_OK);
        }
    }
    if (ep->sq_head) goto wait_writable;
    if (ep->state == EP_CLOSING) {
        tcp_close_finish(ep);
        return;
    }
stop_writable:
    if (ep->state != EP_CONNECTING) ev_io_stop(x->cfg.loop, &ep->wio);
    return;
wait_writable:
    ev_io_start(x->cfg.loop, &ep->wio);
}

static bt_status_t tcp_send(xport_ep_t *base, const void *hdr, size_t hdr_len,
                            const struct iovec *iov, int iovcnt,
                            xport_send_done_fn done, void *arg)
{
    tcp_ep_t *ep = (tcp_ep_t *)base;
    tcp_xport_t *x = ep->x;
    if (ep->state == EP_DEAD || ep->state == EP_CLOSING) return BT_ERR_PEER_CLOSED;
    size_t payload_len;
    bt_status_t st = xport_send_check(base, x->cfg.max_frame, hdr, hdr_len, iov, iovcnt, &payload_len);
    if (st != BT_OK) return st;
    tcp_send_t *s = malloc(sizeof *s + (size_t)(2 + iovcnt) * sizeof(struct iovec));
    if (!s) return BT_ERR_NOMEM;
    s->next = NULL;
    s->done = done;
    s->arg = arg;
    s->status = BT_OK;
    s->sent = 0;
    put_u32(s->fhdr, TCP_FRAME_MAGIC);
    put_u16(s->fhdr + 4, TCP_FRAME_VERSION);
    put_u16(s->fhdr + 6, 0);
    put_u32(s->fhdr + 8, (uint32_t)hdr_len);
    put_u32(s->fhdr + 12, 0);
    put_u64(s->fhdr + 16, payload_len);
    int n = 0;
    s->iov[n++] = (struct iovec){.iov_base = s->fhdr, .iov_len = TCP_FHDR_LEN};
    if (hdr_len) s->iov[n++] = (struct iovec){.iov_base = (void *)hdr, .iov_len = hdr_len};
    for (int i = 0; i < iovcnt; i++)
        if (iov[i].iov_len) s->iov[n++] = iov[i];
    s->iovcnt = n;
    s->total = TCP_FHDR_LEN + hdr_len + payload_len;

    bool was_empty = ep->sq_head == NULL;
    if (ep->sq_tail) ep->sq_tail->next = s;
    else ep->sq_head = s;
    ep->sq_tail = s;
    /* Optimistic write when nothing is ahead of us; a hard error is left for
     * the watcher to find, so no callback runs inside send(). */
    if (was_empty && ep->state == EP_OPEN && ep->hs_out_off == ep->hs_out_len) {
        size_t before = s->sent;
        struct iovec one[TCP_IOV_BATCH];
        int cnt = s->iovcnt < TCP_IOV_BATCH ? s->iovcnt : TCP_IOV_BATCH;
        memcpy(one, s->iov, (size_t)cnt * sizeof one[0]);
        struct msghdr mh = {.msg_iov = one, .msg_iovlen = (size_t)cnt};
        ssize_t w = sendmsg(ep->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) s->sent = before + (size_t)w;
        if (s->sent == s->total) {
            ep->sq_head = ep->sq_tail = NULL;
            tcp_done_push(x, s, BT_OK);
            tcp_done_schedule(x);
        } else {
            ev_io_start(x->cfg.loop, &ep->wio);
        }
    } else if (ep->state == EP_OPEN) {
        ev_io_start(x->cfg.loop, &ep->wio);
    }
    return BT_IN_PROGRESS;
}

/* ---- watchers --------------------------------------------------------- */

static void tcp_rio_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    tcp_ep_t *ep = w->data;
    tcp_xport_t *x = ep->x;
    tcp_ep_hold(ep);
    tcp_ep_read(ep);
    tcp_ep_unref(ep);
    tcp_done_flush(x);
}

static void tcp_connect_finish(tcp_ep_t *ep)
{
    int err = ep->connect_err;
    socklen_t len = sizeof err;
    if (!err && getsockopt(ep->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err == EINPROGRESS || err == EALREADY) return;
    if (err != 0) {
        tcp_ep_fail(ep, BT_ERR_PEER_UNREACH, "connect: %s", strerror(err));
        return;
    }
    bt_status_t st = tcp_hs_start(ep);
    if (st != BT_OK) tcp_ep_fail(ep, st, "cannot start the handshake");
}

static void tcp_wio_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    tcp_ep_t *ep = w->data;
    tcp_xport_t *x = ep->x;
    tcp_ep_hold(ep);
    if (ep->state == EP_CONNECTING) tcp_connect_finish(ep);
    if (ep->state != EP_DEAD && ep->state != EP_CONNECTING) tcp_ep_write(ep);
    tcp_ep_unref(ep);
    tcp_done_flush(x);
}

static tcp_ep_t *tcp_ep_new(tcp_xport_t *x, int fd, bool is_server)
{
    tcp_ep_t *ep = calloc(1, sizeof *ep);
    if (!ep) return NULL;
    ep->rbuf = malloc(TCP_RBUF_LEN);
    if (!ep->rbuf) {
        free(ep);
        return NULL;
    }
    ep->base.ops = &xport_tcp_ops;
    ep->base.x = &x->base;
    ep->base.peer_id = XPORT_PEER_ID_UNKNOWN;
    ep->x = x;
    ep->refs = 1;
    ep->fd = fd;
    ep->is_server = is_server;
    ev_io_init(&ep->rio, tcp_rio_cb, fd, EV_READ);
    ev_io_init(&ep->wio, tcp_wio_cb, fd, EV_WRITE);
    ep->rio.data = ep->wio.data = ep;
    double hs_s = (double)x->cfg.handshake_ms / 1000.0;
    ev_timer_init(&ep->hs_timer, tcp_hs_timer_cb, hs_s, 0.0);
    ep->hs_timer.data = ep;
    ep->next = x->eps;
    if (x->eps) x->eps->prev = ep;
    x->eps = ep;
    return ep;
}

static void tcp_lio_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    tcp_xport_t *x = w->data;
    for (int i = 0; i < 64; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(x->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                log_error("tcp: accept on %s: %s", x->laddr, strerror(errno));
            break;
        }
        unsigned pending = 0;
        for (tcp_ep_t *o = x->eps; o; o = o->next) pending += o->is_server && o->state != EP_OPEN;
        if (pending >= XPORT_HS_PENDING_MAX) {
            char who[XPORT_ADDR_MAX];
            xport_sockaddr_format((struct sockaddr *)&ss, who, sizeof who);
            log_warn("tcp: refusing %s on %s: %u peers already in their handshake", who, x->laddr,
                     pending);
            close(fd);
            continue;
        }
        tcp_sock_tune(fd);
        tcp_ep_t *ep = tcp_ep_new(x, fd, true);
        if (!ep) {
            log_error("tcp: out of memory accepting a peer on %s", x->laddr);
            close(fd);
            continue;
        }
        xport_sockaddr_format((struct sockaddr *)&ss, ep->base.peer_addr, sizeof ep->base.peer_addr);
        ev_timer_start(loop, &ep->hs_timer);
        bt_status_t st = tcp_hs_start(ep);
        if (st != BT_OK) tcp_ep_fail(ep, st, "cannot start the handshake");
    }
    tcp_done_flush(x);
}

/* ---- ops -------------------------------------------------------------- */

static bt_status_t tcp_create(const xport_config_t *cfg, xport_t **out)
{
    if (!cfg || !cfg->loop || !cfg->job_id || !cfg->secret || cfg->secret_len == 0
        || cfg->secret_len > XPORT_SECRET_MAX || strlen(cfg->job_id) > XPORT_HS_JOB_MAX) {
        log_error("tcp: create needs a loop, a job id (<= %d bytes) and a secret (1..%d bytes)",
                  XPORT_HS_JOB_MAX, XPORT_SECRET_MAX);
        return BT_ERR_INVALID;
    }
    tcp_xport_t *x = calloc(1, sizeof *x);
    if (!x) return BT_ERR_NOMEM;
    x->base.ops = &xport_tcp_ops;
    x->base.caps = xport_tcp_ops.caps;
    x->cfg = *cfg;
    x->lfd = -1;
    if (!x->cfg.max_frame) x->cfg.max_frame = TCP_DEFAULT_MAX_FRAME;
    if (!x->cfg.handshake_ms) x->cfg.handshake_ms = TCP_DEFAULT_HS_MS;
    x->job_id = strdup(cfg->job_id);
    x->secret = malloc(cfg->secret_len);
    x->listen_addr = strdup(cfg->listen_addr ? cfg->listen_addr : "127.0.0.1:0");
    if (!x->job_id || !x->secret || !x->listen_addr) {
        free(x->listen_addr);
        free(x->job_id);
        free(x->secret);
        free(x);
        return BT_ERR_NOMEM;
    }
    memcpy(x->secret, cfg->secret, cfg->secret_len);
    x->cfg.job_id = x->job_id;
    x->cfg.secret = x->secret;
    x->cfg.listen_addr = x->listen_addr;
    ev_idle_init(&x->idle, tcp_idle_cb);
    x->idle.data = x;
    *out = &x->base;
    return BT_OK;
}

static void tcp_close(xport_ep_t *base)
{
    tcp_ep_t *ep = (tcp_ep_t *)base;
    if (ep->state == EP_DEAD || ep->state == EP_CLOSING) return;
    if (ep->state == EP_OPEN && ep->sq_head && ep->fd >= 0) {
        /* deliver what send() accepted: drain, then close (tcp_close_finish) */
        tcp_xport_t *x = ep->x;
        ep->state = EP_CLOSING;
        ev_io_stop(x->cfg.loop, &ep->rio);
        ev_timer_stop(x->cfg.loop, &ep->hs_timer);
        ev_timer_set(&ep->hs_timer, TCP_CLOSE_S, 0.0);
        ev_timer_start(x->cfg.loop, &ep->hs_timer);
        ev_io_start(x->cfg.loop, &ep->wio);
        return;
    }
    ep->state = EP_DEAD;
    tcp_ep_unlink(ep);
    tcp_ep_teardown(ep, BT_ERR_CANCELED);
    tcp_done_schedule(ep->x);
    tcp_ep_unref(ep);
}

static void tcp_destroy(xport_t *base)
{
    tcp_xport_t *x = (tcp_xport_t *)base;
    /* Open endpoints with unwritten frames drain first (bounded): a peer
     * gets every frame sent before destroy, then the FIN. */
    for (tcp_ep_t *ep = x->eps, *next; ep; ep = next) {
        next = ep->next;
        tcp_close(&ep->base);
    }
    uint64_t deadline = clock_now_ns() + (uint64_t)(TCP_CLOSE_S * 1e9);
    size_t cap = 0;
    for (tcp_ep_t *ep = x->eps; ep; ep = ep->next) cap++;
    struct pollfd *pfd = malloc((cap ? cap : 1) * sizeof *pfd);
    tcp_ep_t **who = malloc((cap ? cap : 1) * sizeof *who);
    while (pfd && who && x->eps && clock_now_ns() < deadline) {
        nfds_t n = 0; /* the list only shrinks: cap bounds it */
        for (tcp_ep_t *ep = x->eps; ep; ep = ep->next) {
            pfd[n] = (struct pollfd){.fd = ep->fd, .events = POLLOUT};
            who[n++] = ep;
        }
        if (poll(pfd, n, 10) < 0 && errno != EINTR) break;
        for (nfds_t i = 0; i < n; i++)
            if (pfd[i].revents) tcp_ep_write(who[i]); /* may finish (free) who[i] only */
    }
    free(pfd);
    free(who);
    while (x->eps) tcp_ep_fail(x->eps, BT_ERR_CANCELED, "queue not drained within %.0f s of destroy", TCP_CLOSE_S);
    if (x->lfd >= 0) {
        ev_io_stop(x->cfg.loop, &x->lio);
        close(x->lfd);
    }
    tcp_done_flush(x);
    ev_idle_stop(x->cfg.loop, &x->idle);
    free(x->job_id);
    free(x->listen_addr);
    memset(x->secret, 0, x->cfg.secret_len);
    free(x->secret);
    free(x);
}

static bt_status_t tcp_listen_at(tcp_xport_t *x, const char *text)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    bt_status_t st = xport_sockaddr_parse(text, &ss, &sl);
    if (st != BT_OK) return st;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        log_error("tcp: socket: %s", strerror(errno));
        return BT_ERR_IO;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, SOMAXCONN) != 0) {
        log_error("tcp: cannot listen on %s: %s", text ? text : "127.0.0.1:0", strerror(errno));
        close(fd);
        return BT_ERR_IO;
    }
    sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    xport_sockaddr_format((struct sockaddr *)&ss, x->laddr, sizeof x->laddr);
    x->lfd = fd;
    ev_io_init(&x->lio, tcp_lio_cb, fd, EV_READ);
    x->lio.data = x;
    ev_io_start(x->cfg.loop, &x->lio);
    return BT_OK;
}

static bt_status_t tcp_connect(xport_t *base, const char *addr, xport_ep_t **out)
{
    tcp_xport_t *x = (tcp_xport_t *)base;
    struct sockaddr_storage ss;
    socklen_t sl;
    bt_status_t st = xport_sockaddr_parse(addr, &ss, &sl);
    if (st != BT_OK) return st;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        log_error("tcp: socket: %s", strerror(errno));
        return BT_ERR_IO;
    }
    tcp_sock_tune(fd);
    tcp_ep_t *ep = tcp_ep_new(x, fd, false);
    if (!ep) {
        close(fd);
        return BT_ERR_NOMEM;
    }
    snprintf(ep->base.peer_addr, sizeof ep->base.peer_addr, "%s", addr);
    ev_timer_start(x->cfg.loop, &ep->hs_timer);
    /* The outcome (even an immediate refusal) is reported from the watcher so
     * that connected() never runs inside connect(). */
    if (connect(fd, (struct sockaddr *)&ss, sl) != 0 && errno != EINPROGRESS) {
        ep->connect_err = errno; /* SO_ERROR will not repeat it */
        log_debug("tcp: connect to %s: %s (reported from the loop)", addr, strerror(errno));
    }
    ep->state = EP_CONNECTING;
    ev_io_start(x->cfg.loop, &ep->wio);
    *out = &ep->base;
    return BT_IN_PROGRESS;
}

/* Busy poll: try every socket without waiting for the loop to report it. */
static int tcp_progress(xport_t *base)
{
    tcp_xport_t *x = (tcp_xport_t *)base;
    unsigned before = x->events;
    if (!x->cfg.busy_poll) return tcp_done_flush(x);
    tcp_ep_t *stack[64];
    tcp_ep_t **snap = stack;
    size_t n = 0, cap = 64;
    for (tcp_ep_t *ep = x->eps; ep; ep = ep->next) {
        if (n == cap) {
            tcp_ep_t **grown = malloc(2 * cap * sizeof *grown);
            if (!grown) break;
            memcpy(grown, snap, n * sizeof *grown);
            if (snap != stack) free(snap);
            snap = grown;
            cap *= 2;
        }
        tcp_ep_hold(ep);
        snap[n++] = ep;
    }
    for (size_t i = 0; i < n; i++) {
        tcp_ep_t *ep = snap[i];
        if (ep->state == EP_HANDSHAKE || ep->state == EP_OPEN) tcp_ep_read(ep);
        if (ep->state == EP_HANDSHAKE || ep->state == EP_OPEN) tcp_ep_write(ep);
        tcp_ep_unref(ep);
    }
    if (snap != stack) free(snap);
    return tcp_done_flush(x) + (int)(x->events - before);
}

static uint32_t tcp_ep_peer_id(const xport_ep_t *ep) { return ep->peer_id; }

static bt_status_t tcp_listen(xport_t *base, char *addr, size_t addr_cap)
{
    tcp_xport_t *x = (tcp_xport_t *)base;
    if (x->lfd < 0) {
        bt_status_t st = tcp_listen_at(x, x->listen_addr);
        if (st != BT_OK) return st;
    }
    if ((size_t)snprintf(addr, addr_cap, "%s", x->laddr) >= addr_cap) return BT_ERR_INVALID;
    return BT_OK;
}

const xport_ops_t xport_tcp_ops = {
    .name       = "tcp",
    .caps       = XPORT_CAP_HOST_MEM,
    .create     = tcp_create,
    .destroy    = tcp_destroy,
    .listen     = tcp_listen,
    .connect    = tcp_connect,
    .send       = tcp_send,
    .close      = tcp_close,
    .progress   = tcp_progress,
    .ep_peer_id = tcp_ep_peer_id,
};
