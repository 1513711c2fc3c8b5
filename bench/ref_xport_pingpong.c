/* Our transports without actors: two threads ping-pong over one connection
 * (see ref.h). Receive buffers are chosen once up front (cbs.alloc returns
 * them), as a real receiver would, so that page faults do not dominate large
 * transfers. */
#include "bench/ref.h"

#include "base/clock.h"
#include "base/log.h"

#include <ev.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define PP_TIMEOUT_NS (120ull * 1000000000ull)

typedef struct {
    xport_kind_t    kind;
    size_t          bytes;
    int             iters, warm;
    bool            busy;
    uint8_t         secret[32];
    char            addr[XPORT_LISTEN_ADDR_MAX];
    atomic_int      addr_ready;   /* 1 ok, -1 server failed */
    atomic_int      stop;
    bt_status_t     st;           /* client outcome */
    double          lat_us, gbytes_s;
} pp_t;

typedef struct {
    pp_t           *pp;
    struct ev_loop *loop;
    xport_t        *x;
    xport_ep_t     *ep;
    uint8_t        *rbuf;         /* receive buffer returned by alloc */
    uint8_t        *sbuf;         /* client: payload sent */
    uint64_t        hdr;
    int             count;
    uint64_t        t0, t1;
    bool            done, failed;
} pp_side_t;

static void *pp_alloc(void *arg, xport_ep_t *ep, const void *hdr, size_t hdr_len, size_t len)
{
    pp_side_t *s = arg;
    return len <= s->pp->bytes ? s->rbuf : NULL;
}

static void pp_free(void *arg, void *p, size_t len) { (void)arg; (void)p; (void)len; }

static void pp_server_done(void *arg, bt_status_t st) { xport_rx_release(arg); }

static void pp_server_recv(void *arg, xport_ep_t *ep, xport_rx_t *rx)
{
    pp_side_t *s = arg;
    struct iovec iov = {.iov_base = rx->payload, .iov_len = rx->payload_len};
    if (xport_send(ep, &s->hdr, sizeof s->hdr, &iov, 1, pp_server_done, rx) != BT_IN_PROGRESS)
        xport_rx_release(rx);
}

static void pp_error(void *arg, xport_ep_t *ep, bt_status_t why)
{
    pp_side_t *s = arg;
    if (!s->done) s->failed = true;
}

static void pp_client_send(pp_side_t *s)
{
    struct iovec iov = {.iov_base = s->sbuf, .iov_len = s->pp->bytes};
    if (xport_send(s->ep, &s->hdr, sizeof s->hdr, &iov, 1, NULL, NULL) != BT_IN_PROGRESS)
        s->failed = true;
}

static void pp_client_connected(void *arg, xport_ep_t *ep, bt_status_t st)
{
    pp_side_t *s = arg;
    if (st != BT_OK) {
        s->failed = true;
        return;
    }
    pp_client_send(s);
}

static void pp_client_recv(void *arg, xport_ep_t *ep, xport_rx_t *rx)
{
    pp_side_t *s = arg;
    bool ok = rx->payload_len == s->pp->bytes;
    xport_rx_release(rx);
    if (!ok) {
        s->failed = true;
        return;
    }
    s->count++;
    if (s->count == s->pp->warm) s->t0 = clock_now_ns();
    if (s->count == s->pp->warm + s->pp->iters) {
        s->t1 = clock_now_ns();
        s->done = true;
        return;
    }
    pp_client_send(s);
}

static bt_status_t pp_side_open(pp_side_t *s, pp_t *pp, bool server)
{
    memset(s, 0, sizeof *s);
    s->pp = pp;
    s->loop = ev_loop_new(EVFLAG_AUTO);
    s->rbuf = malloc(pp->bytes ? pp->bytes : 1);
    if (!s->loop || !s->rbuf) return BT_ERR_NOMEM;
    memset(s->rbuf, 0, pp->bytes); /* fault the pages in before timing */
    char name[64];
    snprintf(name, sizeof name, "inproc:bench-pp-%d-%p", (int)getpid(), (void *)pp);
    xport_config_t cfg = {
        .loop = s->loop, .job_id = "bench", .secret = pp->secret, .secret_len = sizeof pp->secret,
        .self_id = server ? 0 : 1, .busy_poll = pp->busy,
        .listen_addr = pp->kind == XPORT_INPROC ? name : NULL,
        .cbs = {.arg = s, .alloc = pp_alloc, .free = pp_free, .error = pp_error,
                .recv = server ? pp_server_recv : pp_client_recv,
                .connected = server ? NULL : pp_client_connected},
    };
    const xport_ops_t *ops = xport_ops_get(pp->kind);
    if (!ops) return BT_ERR_UNSUPPORTED;
    return xport_create(ops, &cfg, &s->x);
}

static void pp_side_close(pp_side_t *s)
{
    if (s->x) xport_destroy(s->x);
    if (s->loop) ev_loop_destroy(s->loop);
    free(s->rbuf);
    free(s->sbuf);
}

static void pp_tick(struct ev_loop *loop, ev_timer *w, int revents) { ev_break(loop, EVBREAK_ONE); }

/* Turn the loop once (or spin once in busy mode). */
static void pp_turn(pp_side_t *s)
{
    if (s->pp->busy) {
        ev_run(s->loop, EVRUN_NOWAIT);
        xport_progress(s->x);
    } else {
        ev_run(s->loop, EVRUN_ONCE);
    }
}

static void *pp_server(void *arg)
{
    pp_t *pp = arg;
    pp_side_t s;
    bt_status_t st = pp_side_open(&s, pp, true);
    if (st == BT_OK) st = xport_listen(s.x, pp->addr, sizeof pp->addr);
    atomic_store(&pp->addr_ready, st == BT_OK ? 1 : -1);
    if (st == BT_OK) {
        ev_timer tick;
        ev_timer_init(&tick, pp_tick, 0.01, 0.01);
        ev_timer_start(s.loop, &tick);
        while (!atomic_load(&pp->stop)) pp_turn(&s);
        ev_timer_stop(s.loop, &tick);
    }
    pp_side_close(&s);
    return NULL;
}

bt_status_t bench_xport_pingpong(xport_kind_t kind, size_t bytes, int iters, bool busy_poll,
                                 double *lat_us, double *gbytes_s)
{
    if (iters <= 0) return BT_ERR_INVALID;
    pp_t *pp = calloc(1, sizeof *pp);
    if (!pp) return BT_ERR_NOMEM;
    pp->kind = kind;
    pp->bytes = bytes;
    pp->iters = iters;
    pp->warm = bytes <= (1u << 20) ? 100 : 1;
    pp->busy = busy_poll;
    if (getrandom(pp->secret, sizeof pp->secret, 0) != (ssize_t)sizeof pp->secret) {
        free(pp);
        return BT_ERR_IO;
    }
    pthread_t th;
    if (pthread_create(&th, NULL, pp_server, pp) != 0) {
        free(pp);
        return BT_ERR_IO;
    }
    while (atomic_load(&pp->addr_ready) == 0) usleep(1000);
    bt_status_t st = BT_ERR_IO;
    pp_side_t c;
    if (atomic_load(&pp->addr_ready) < 0) goto stop_server;
    st = pp_side_open(&c, pp, false);
    if (st == BT_OK) {
        c.sbuf = malloc(bytes ? bytes : 1);
        if (!c.sbuf) st = BT_ERR_NOMEM;
        else memset(c.sbuf, 0xa5, bytes);
    }
    if (st == BT_OK) st = xport_connect(c.x, pp->addr, &c.ep) == BT_IN_PROGRESS ? BT_OK : BT_ERR_PEER_UNREACH;
    if (st == BT_OK) {
        ev_timer tick;
        ev_timer_init(&tick, pp_tick, 0.01, 0.01);
        ev_timer_start(c.loop, &tick);
        uint64_t deadline = clock_now_ns() + PP_TIMEOUT_NS;
        while (!c.done && !c.failed && clock_now_ns() < deadline) pp_turn(&c);
        ev_timer_stop(c.loop, &tick);
        if (c.done) {
            double one_way_s = (double)(c.t1 - c.t0) / 1e9 / iters / 2.0;
            *lat_us = one_way_s * 1e6;
            *gbytes_s = (double)bytes / one_way_s / 1e9;
        } else {
            log_error("xport pingpong %s %zu B: %s", xport_kind_name(kind), bytes,
                      c.failed ? "the connection failed" : "timed out");
            st = c.failed ? BT_ERR_PEER_CLOSED : BT_ERR_TIMEOUT;
        }
    }
    pp_side_close(&c);
stop_server:
    atomic_store(&pp->stop, 1);
    pthread_join(th, NULL);
    free(pp);
    return st;
}
