/* baton bench transport: ping-pong through the whole actor path.
 *
 * Two actors in two processes (inproc: two ranks, two threads, one process):
 * the pinger on rank 0 and the echo actor on rank 1, each on its rank's I/O
 * loop. Every message is a real actor message: envelope encoded (msgpack),
 * sent with its tensor payload as an iovec, received, decoded, dispatched to
 * a handler, answered.
 *
 *  latency    PING with an 8-byte tensor, answered by a PONG with an 8-byte
 *             tensor; one message in flight. One-way latency = RTT / 2.
 *  bandwidth  a window of ACTIVATION messages of one size in flight, each
 *             acknowledged by a small PONG; bandwidth = payload bytes / time
 *             from the first timed send to the last acknowledgement. One
 *             window per size goes first, untimed: it fills the receiver's
 *             buffer cache (a fresh 256 MiB buffer page-faults as long as
 *             the copy takes), as ucx_perftest's warm-up iteration does.
 *  tracing    rounds of (ping-pong with tracing off, the same with tracing on
 *             in both processes); the overhead is 1 - median(on/off rate).
 *
 * Busy polling (--busy-us) keeps each I/O loop spinning on its transport
 * while messages are in flight instead of sleeping in epoll.
 */
#include "bench/bench.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "actors/actor.h"
#include "actors/router.h"
#include "trace/trace.h"
#include "base/clock.h"
#include "base/log.h"

#define BT_MAX_SIZES 16
#define BT_WARMUP 2000
#define BT_CREDITS 64

typedef enum { PH_WARM = 0, PH_LAT, PH_TRACE, PH_BW, PH_DONE } bench_phase_t;

/* control codes in MSG_HEARTBEAT.state */
enum { CTL_TRACE_OFF = 0, CTL_TRACE_ON = 1, CTL_QUIT = 2, CTL_FLUSH = 3 };

typedef struct {
    xport_kind_t kind;
    bool         json;
    uint32_t     iters;
    size_t       sizes[BT_MAX_SIZES];
    int          nsizes;
    uint32_t     busy_us;
    uint32_t     trace_rounds;   /* 0: no tracing comparison */
    uint32_t     trace_msgs;     /* ping-pongs per half round */
    bool         refs;
    char         trace_dir[256];
    const char  *trace_all;      /* --trace-all DIR: trace the whole run (both ranks) */
} bench_opts_t;

typedef struct {
    double lat_us, lat_p50_us, lat_p99_us, msgs_per_s;
    double bw_gbps[BT_MAX_SIZES];
    double trace_overhead_pct, trace_off_rate, trace_on_rate;
    double trace_cpu_overhead_pct, trace_off_cpu_ns, trace_on_cpu_ns; /* CPU ns per round trip */
    double trace_rec_ns;   /* one record plus the clock read that goes with it */
    bool   ok;
} bench_result_t;

/* CPU time of the calling thread: unlike wall time it does not count the
 * time other processes of a loaded machine took the core away. */
static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Cost of one trace record with its clock read, measured in a tight loop
 * in batches that fit the ring (flushed between batches, untimed). A round
 * trip of the ping-pong records 6 events (a send, a receive and a handler
 * span on each side) and reads the clock about 6 more times than untraced. */
#define BT_TRACE_RECS_PER_RT 4 /* per round trip: a send, and a receive with its handler span, per message */
static double trace_record_cost_ns(const char *dir)
{
    trace_config_t tc = {.no_flusher = true};
    if (trace_start(dir, 0, &tc) != BT_OK) return 0;
    const int batch = 4096, batches = 64;
    uint64_t total = 0;
    for (int b = 0; b < batches; b++) {
        uint64_t t0 = thread_cpu_ns();
        for (int i = 0; i < batch; i++)
            trace_send_tk(ACTOR_ADDR(0, 1), ACTOR_ADDR(1, 1), MSG_PING, (uint64_t)i, 100, i, 3, trace_ticks());
        total += thread_cpu_ns() - t0;
        trace_flush();
    }
    trace_stop();
    return (double)total / (batch * batches);
}

/* ---- the echo actor (rank 1) ------------------------------------------------ */

typedef struct {
    actor_t     base;
    bool        own_trace;  /* toggles tracing of its process (not for inproc) */
    bool        tracing;    /* its trace session is started */
    const char *trace_dir;
} echo_actor_t;

static actor_ret_t echo_on_ping(actor_t *self, actor_msg_t *m)
{
    actor_msg_t *r = actor_msg_new(MSG_PONG);
    if (!r) return ACTOR_DONE;
    r->body.pong = m->body.ping;
    r->env.step = m->env.step;
    tensor_t *in = m->env.ntensors ? &m->tensors[0] : NULL;
    if (in) {
        int64_t shape[1] = {in->shape[0]};
        tensor_t *out = actor_msg_tensor_new(r, "x", DT_U8, 1, shape);
        if (out) memcpy(out->data, in->data, (size_t)shape[0]);
    }
    actor_send(self, m->env.src, r);
    return ACTOR_DONE;
}

static actor_ret_t echo_on_act(actor_t *self, actor_msg_t *m)
{
    actor_msg_t *r = actor_msg_new(MSG_PONG);
    if (!r) return ACTOR_DONE;
    r->body.pong.id = m->env.seq;
    actor_send(self, m->env.src, r);
    return ACTOR_DONE;
}

static actor_ret_t echo_on_ctl(actor_t *self, actor_msg_t *m)
{
    echo_actor_t *e = (echo_actor_t *)self;
    uint32_t code = m->body.heartbeat.state;
    if (code == CTL_QUIT) {
        actor_router_stop_request(self->rt, BT_OK);
        return ACTOR_DONE;
    }
    /* Benchmark control only: starting a trace file is I/O, done between
     * measured halves, never inside them; writing the records is not (a
     * half ends with CTL_FLUSH). The reply carries this thread's CPU time
     * before (end of the last half) and after the switch. */
    if (code == CTL_FLUSH && e->own_trace) trace_flush();
    uint64_t cpu_before = thread_cpu_ns();
    if (e->own_trace && code != CTL_FLUSH) {
        /* one session for all rounds, paused in the "off" halves */
        if (!e->tracing && trace_start(e->trace_dir, actor_router_rank(self->rt), NULL) == BT_OK) e->tracing = true;
        trace_set_recording(code == CTL_TRACE_ON);
    }
    actor_msg_t *r = actor_msg_new(MSG_HEARTBEAT);
    if (r) {
        r->body.heartbeat.t_ns = cpu_before;
        r->body.heartbeat.step = (int64_t)thread_cpu_ns();
        actor_send(self, m->env.src, r);
    }
    return ACTOR_DONE;
}

static actor_ret_t echo_on_report(actor_t *self, actor_msg_t *m)
{
    (void)m;
    actor_router_stop_request(self->rt, BT_ERR_PEER_CLOSED); /* the pinger went away */
    return ACTOR_DONE;
}

static const actor_class_t echo_class = {
    .name = "echo",
    .handlers = {[MSG_PING] = echo_on_ping, [MSG_ACTIVATION] = echo_on_act,
                 [MSG_HEARTBEAT] = echo_on_ctl, [MSG_ERROR_REPORT] = echo_on_report},
};

/* ---- the pinger (rank 0) ---------------------------------------------------- */

typedef struct {
    actor_t             base;
    const bench_opts_t *o;
    bench_result_t     *res;
    uint32_t            peer;
    bench_phase_t       phase;
    bool                held;      /* out of credit: wait for CREDIT_READY */
    bool                waiting_ctl;
    bool                flushing;  /* a tracing half's CTL_FLUSH is out */
    uint64_t            n, target, sent, acked;
    uint64_t            warm;      /* bandwidth: untimed messages before the timed ones */
    uint64_t            t_start, t_ping;
    double             *rtt_ns;
    /* tracing rounds */
    uint32_t            round;
    bool                tr_on;
    double             *ratios, *cpu_ratios;
    double              off_rate_sum, on_rate_sum;
    uint64_t            cpu_start, echo_cpu_start;
    double              half_cpu;          /* pinger CPU ns of the half just measured */
    double              off_cpu;           /* both sides' CPU ns per round trip, this round's off half */
    double              off_cpu_sum, on_cpu_sum;
    /* bandwidth */
    int                 size_i;
    size_t              size;
    uint32_t            window;
    void               *buf;
} pinger_t;

static void pinger_next_phase(pinger_t *p);

static void pinger_ping(pinger_t *p)
{
    actor_msg_t *m = actor_msg_new(MSG_PING);
    if (!m) BT_PANIC("bench: out of memory");
    m->body.ping.id = p->n;
    int64_t shape[1] = {8};
    tensor_t *x = actor_msg_tensor_new(m, "x", DT_U8, 1, shape);
    if (!x) BT_PANIC("bench: out of memory");
    memcpy(x->data, &p->n, 8);
    p->t_ping = clock_now_ns();
    bt_status_t st = actor_send(&p->base, p->peer, m);
    if (st == BT_ERR_BUSY) p->held = true;
    else if (st != BT_OK) actor_router_stop_request(p->base.rt, st);
}

static void pinger_ctl(pinger_t *p, uint32_t code)
{
    actor_msg_t *m = actor_msg_new(MSG_HEARTBEAT);
    m->body.heartbeat.state = code;
    p->waiting_ctl = true;
    actor_send(&p->base, p->peer, m);
}

static void pinger_bw_send(pinger_t *p)
{
    while (!p->held && p->sent < p->target && p->sent - p->acked < p->window) {
        actor_msg_t *m = actor_msg_new(MSG_ACTIVATION);
        if (!m) BT_PANIC("bench: out of memory");
        tensor_t v = {.dtype = DT_U8, .ndim = 1, .shape = {(int64_t)p->size, 1, 1, 1},
                      .stride = {1, 1, 1, 1}, .device = {DEV_CPU, 0}, .data = p->buf};
        /* the same read-only buffer for every message in flight */
        actor_msg_tensor_add(m, "x", &v);
        p->sent++;
        bt_status_t st = actor_send(&p->base, p->peer, m);
        if (st == BT_ERR_BUSY) p->held = true;
        else if (st != BT_OK) {
            actor_router_stop_request(p->base.rt, st);
            return;
        }
    }
}

static uint64_t bw_count(size_t size)
{
    uint64_t n = (512ull << 20) / size;
    if (n > 20000) n = 20000;
    if (n < 8) n = 8;
    return n;
}

static void pinger_bw_start(pinger_t *p)
{
    free(p->buf);
    p->size = p->o->sizes[p->size_i];
    p->buf = aligned_alloc(WIRE_ALIGN, (size_t)wire_align_up(p->size));
    if (!p->buf) BT_PANIC("bench: cannot allocate %zu bytes", p->size);
    memset(p->buf, 0x5a, p->size);
    size_t w = (64u << 20) / p->size;
    p->window = (uint32_t)(w < 2 ? 2 : w > 32 ? 32 : w);
    p->warm = p->window;
    p->target = p->warm + bw_count(p->size);
    p->sent = p->acked = 0;
    p->t_start = clock_now_ns();
    pinger_bw_send(p);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void pinger_next_phase(pinger_t *p)
{
    const bench_opts_t *o = p->o;
    switch (p->phase) {
    case PH_WARM:
        p->phase = PH_LAT;
        p->n = 0;
        p->target = o->iters;
        p->t_start = clock_now_ns();
        pinger_ping(p);
        return;
    case PH_LAT:
        if (o->trace_rounds > 0) {
            /* One trace session for all rounds (inproc: it covers the echo
             * rank too), recording in the "on" halves only: what is
             * measured is tracing's steady state, as a traced run has it,
             * not the start of a session. The first control message
             * (tracing off) starts the first half. */
            p->phase = PH_TRACE;
            p->round = 0;
            p->tr_on = false;
            p->target = o->trace_msgs;
            if (trace_start(o->trace_dir, 0, NULL) != BT_OK) {
                actor_router_stop_request(p->base.rt, BT_ERR_IO);
                return;
            }
            trace_set_recording(false);
            pinger_ctl(p, CTL_TRACE_OFF);
            return;
        }
        /* fall through */
    case PH_TRACE:
        if (o->nsizes > 0) {
            p->phase = PH_BW;
            p->size_i = 0;
            pinger_bw_start(p);
            return;
        }
        /* fall through */
    case PH_BW:
    case PH_DONE:
        p->phase = PH_DONE;
        p->res->ok = true;
        pinger_ctl(p, CTL_QUIT);
        actor_router_stop_request(p->base.rt, BT_OK);
        return;
    }
}

static void pinger_start(actor_t *self)
{
    pinger_t *p = (pinger_t *)self;
    p->phase = PH_WARM;
    p->n = 0;
    p->target = BT_WARMUP;
    pinger_ping(p);
}

static void pinger_trace_half_done(pinger_t *p)
{
    const bench_opts_t *o = p->o;
    double rate = (double)o->trace_msgs / ((double)(clock_now_ns() - p->t_start) / 1e9);
    p->half_cpu = (double)(thread_cpu_ns() - p->cpu_start);
    if (!p->tr_on) {
        p->ratios[p->round] = rate; /* off rate, divided below */
        p->off_rate_sum += rate;
        p->tr_on = true;
        trace_set_recording(true);
        pinger_ctl(p, CTL_TRACE_ON);
    } else {
        p->ratios[p->round] = rate / p->ratios[p->round];
        p->on_rate_sum += rate;
        p->tr_on = false;
        trace_set_recording(false);
        pinger_ctl(p, CTL_TRACE_OFF);
        p->round++;
    }
}

static double median(double *v, uint32_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A control message was acknowledged: account the half that ended (the
 * echo's CPU up to the switch) and start the next one. */
static actor_ret_t pinger_on_ctl_ack(actor_t *self, actor_msg_t *m)
{
    pinger_t *p = (pinger_t *)self;
    const bench_opts_t *o = p->o;
    p->waiting_ctl = false;
    if (p->phase != PH_TRACE) return ACTOR_DONE;
    if (p->flushing) {
        p->flushing = false;
        pinger_trace_half_done(p);
        return ACTOR_DONE;
    }
    uint64_t echo_before = m->body.heartbeat.t_ns, echo_after = (uint64_t)m->body.heartbeat.step;
    if (p->echo_cpu_start) {
        /* the half that just ended: tr_on already flipped for the next one */
        double cpu_rt = (p->half_cpu + (double)(echo_before - p->echo_cpu_start)) / o->trace_msgs;
        bool ended_on = !p->tr_on;
        uint32_t r = ended_on ? p->round - 1 : p->round;
        if (!ended_on) {
            p->off_cpu = cpu_rt;
            p->off_cpu_sum += cpu_rt;
        } else {
            p->cpu_ratios[r] = cpu_rt / p->off_cpu;
            p->on_cpu_sum += cpu_rt;
        }
    }
    if (p->round == o->trace_rounds) {
        uint32_t n = o->trace_rounds;
        trace_stop();
        p->res->trace_overhead_pct = (1.0 - median(p->ratios, n)) * 100.0;
        p->res->trace_off_rate = p->off_rate_sum / n;
        p->res->trace_on_rate = p->on_rate_sum / n;
        p->res->trace_cpu_overhead_pct = (median(p->cpu_ratios, n) - 1.0) * 100.0;
        p->res->trace_off_cpu_ns = p->off_cpu_sum / n;
        p->res->trace_on_cpu_ns = p->on_cpu_sum / n;
        pinger_next_phase(p);
        return ACTOR_DONE;
    }
    p->echo_cpu_start = echo_after;
    p->n = 0;
    p->cpu_start = thread_cpu_ns();
    p->t_start = clock_now_ns();
    pinger_ping(p);
    return ACTOR_DONE;
}

static actor_ret_t pinger_on_pong(actor_t *self, actor_msg_t *m)
{
    pinger_t *p = (pinger_t *)self;
    const bench_opts_t *o = p->o;
    switch (p->phase) {
    case PH_WARM:
    case PH_LAT:
    case PH_TRACE:
        if (p->phase == PH_LAT) p->rtt_ns[p->n] = (double)(clock_now_ns() - p->t_ping);
        if (m->body.pong.id != p->n || m->env.ntensors != 1 || memcmp(m->tensors[0].data, &p->n, 8)) {
            log_error("bench: pong %llu does not echo ping %llu", (unsigned long long)m->body.pong.id,
                      (unsigned long long)p->n);
            actor_router_stop_request(self->rt, BT_ERR_CORRUPT);
            return ACTOR_DONE;
        }
        if (++p->n < p->target) {
            pinger_ping(p);
            return ACTOR_DONE;
        }
        if (p->phase == PH_LAT) {
            double total = (double)(clock_now_ns() - p->t_start);
            p->res->lat_us = total / (double)p->target / 2.0 / 1000.0;
            p->res->msgs_per_s = 2.0 * (double)p->target / (total / 1e9);
            qsort(p->rtt_ns, p->target, sizeof *p->rtt_ns, cmp_double);
            p->res->lat_p50_us = p->rtt_ns[p->target / 2] / 2.0 / 1000.0;
            p->res->lat_p99_us = p->rtt_ns[p->target * 99 / 100] / 2.0 / 1000.0;
        }
        if (p->phase == PH_TRACE) {
            /* Both halves end with a flush round trip inside their window,
             * so the "on" half pays for writing all its records (the ring
             * of a short half would otherwise go out after it). */
            trace_flush();
            p->flushing = true;
            pinger_ctl(p, CTL_FLUSH);
            return ACTOR_DONE;
        }
        pinger_next_phase(p);
        return ACTOR_DONE;
    case PH_BW:
        p->acked++;
        if (p->acked == p->warm) p->t_start = clock_now_ns(); /* warm-up window done */
        if (p->acked == p->target) {
            double secs = (double)(clock_now_ns() - p->t_start) / 1e9;
            p->res->bw_gbps[p->size_i] = (double)p->size * (double)(p->target - p->warm) / secs / 1e9;
            if (++p->size_i < o->nsizes) pinger_bw_start(p);
            else pinger_next_phase(p);
            return ACTOR_DONE;
        }
        pinger_bw_send(p);
        return ACTOR_DONE;
    case PH_DONE:
        return ACTOR_DONE;
    }
    return ACTOR_DONE;
}

static actor_ret_t pinger_on_credit(actor_t *self, actor_msg_t *m)
{
    pinger_t *p = (pinger_t *)self;
    (void)m;
    p->held = false;
    if (p->phase == PH_BW) pinger_bw_send(p);
    return ACTOR_DONE;
}

static actor_ret_t pinger_on_report(actor_t *self, actor_msg_t *m)
{
    log_error("bench: link to the echo process failed: %s (%s)", m->body.error_report.text,
              m->body.error_report.where);
    actor_router_stop_request(self->rt, (bt_status_t)m->body.error_report.status);
    return ACTOR_DONE;
}

static const actor_class_t pinger_class = {
    .name = "pinger",
    .start = pinger_start,
    .handlers = {[MSG_PONG] = pinger_on_pong, [MSG_HEARTBEAT] = pinger_on_ctl_ack,
                 [ACTOR_SYS_CREDIT_READY] = pinger_on_credit,
                 [MSG_ERROR_REPORT] = pinger_on_report},
};

/* ---- processes ---------------------------------------------------------------- */

static actor_router_t *bench_router(uint32_t rank, const bench_opts_t *o)
{
    actor_router_config_t cfg = {.rank = rank, .job_id = "baton-bench", .credits = BT_CREDITS,
                                 .busy_poll_us = o->busy_us};
    actor_router_t *rt;
    if (actor_router_create(&cfg, &rt) != BT_OK) return NULL;
    return rt;
}

/* The echo side: rank 1. Writes its card to card_fd, serves until told. */
static int bench_echo_serve(actor_router_t *rt, echo_actor_t *echo, const bench_opts_t *o, char *card,
                            size_t cap)
{
    if (actor_register(rt, &echo->base, &echo_class, actor_router_io_loop(rt), "echo", 1) != BT_OK) return -1;
    actor_router_supervisor_set(rt, echo->base.addr);
    if (actor_router_listen(rt, 1u << o->kind, card, cap) != BT_OK) return -1;
    return 0;
}

static void bench_child(int card_fd, const bench_opts_t *o)
{
    log_set_tag("echo");
    if (o->trace_all && trace_start(o->trace_all, 1, NULL) != BT_OK) _exit(6);
    actor_router_t *rt = bench_router(1, o);
    if (!rt) _exit(3);
    echo_actor_t echo = {.own_trace = true, .trace_dir = o->trace_dir};
    char card[ACTOR_CARD_MAX];
    if (bench_echo_serve(rt, &echo, o, card, sizeof card) != 0) _exit(4);
    if (write(card_fd, card, strlen(card) + 1) < 0) _exit(5);
    close(card_fd);
    actor_router_wait(rt, 0);
    trace_stop();
    actor_router_destroy(rt);
    _exit(0);
}

static void bench_pin_self(void *arg)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)(intptr_t)arg, &set);
    sched_setaffinity(0, sizeof set, &set);
}

static bt_status_t bench_run(const bench_opts_t *o, bench_result_t *res)
{
    memset(res, 0, sizeof *res);
    pid_t pid = -1;
    /* forked below: the echo process starts its own */
    if (o->trace_all && trace_start(o->trace_all, 0, NULL) != BT_OK) return BT_ERR_IO;
    actor_router_t *r1 = NULL;
    echo_actor_t echo = {.own_trace = false};
    char card[ACTOR_CARD_MAX] = {0};
    if (o->kind == XPORT_INPROC) {
        r1 = bench_router(1, o);
        if (!r1 || bench_echo_serve(r1, &echo, o, card, sizeof card) != 0) {
            actor_router_destroy(r1);
            return BT_ERR_IO;
        }
    } else {
        int fds[2];
        if (pipe2(fds, O_CLOEXEC) != 0) return BT_ERR_IO;
        fflush(NULL);
        pid = fork();
        if (pid < 0) return BT_ERR_IO;
        if (pid == 0) {
            close(fds[0]);
            bench_child(fds[1], o);
        }
        close(fds[1]);
        ssize_t n = read(fds[0], card, sizeof card - 1);
        close(fds[0]);
        if (n <= 0) {
            log_error("bench: the echo process did not start");
            waitpid(pid, NULL, 0);
            return BT_ERR_IO;
        }
    }
    bt_status_t st = BT_ERR_IO;
    actor_router_t *r0 = bench_router(0, o);
    pinger_t *p = calloc(1, sizeof *p);
    if (!r0 || !p) goto out;
    p->o = o;
    p->res = res;
    p->peer = ACTOR_ADDR(1, 1);
    p->rtt_ns = calloc(o->iters ? o->iters : 1, sizeof *p->rtt_ns);
    p->ratios = calloc(o->trace_rounds ? o->trace_rounds : 1, sizeof *p->ratios);
    p->cpu_ratios = calloc(o->trace_rounds ? o->trace_rounds : 1, sizeof *p->cpu_ratios);
    if (!p->rtt_ns || !p->ratios || !p->cpu_ratios) goto out;
    actor_router_supervisor_set(r0, ACTOR_ADDR(0, 1));
    st = actor_router_connect(r0, 1, card, o->kind, false);
    if (st == BT_OK) st = actor_router_wait_peer(r0, 1, 10000);
    if (st != BT_OK) {
        log_error("bench: cannot connect to the echo side over %s: %s", xport_kind_name(o->kind),
                  bt_status_str(st));
        goto out;
    }
    if (getenv("BT_PIN") && *getenv("BT_PIN")) {
        actor_loop_post_fn(actor_router_io_loop(r0), bench_pin_self, (void *)0);
        if (r1) actor_loop_post_fn(actor_router_io_loop(r1), bench_pin_self, (void *)1);
    }
    st = actor_register(r0, &p->base, &pinger_class, actor_router_io_loop(r0), "pinger", 1);
    if (st == BT_OK) st = actor_router_wait(r0, 0);
out:
    actor_router_destroy(r0);
    actor_router_destroy(r1);
    if (p) {
        free(p->rtt_ns);
        free(p->ratios);
        free(p->buf);
        free(p);
    }
    if (pid > 0) {
        int status = 0;
        /* the echo process exits on CTL_QUIT or when our link closes */
        waitpid(pid, &status, 0);
    }
    trace_stop();
    return st == BT_OK && res->ok ? BT_OK : (st != BT_OK ? st : BT_ERR_IO);
}

/* The trace files of the overhead rounds are only a by-product. */
static void bench_trace_dir_remove(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "trace-", 6) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* ---- command line ------------------------------------------------------------------ */

static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v <= 0) return -1;
    if (*end == 'K' || *end == 'k') v *= 1024, end++;
    else if (*end == 'M' || *end == 'm') v *= 1024 * 1024, end++;
    else if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024, end++;
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (*end) return -1;
    *out = (size_t)v;
    return 0;
}

static void bench_usage(FILE *f)
{
    fprintf(f,
            "usage: baton bench transport [--transport inproc|tcp|ucx] [--json] [--iters N]\n"
            "                             [--sizes 4K,64K,1M,16M,256M] [--busy-us N]\n"
            "                             [--trace-rounds N] [--trace-msgs N] [--trace-all DIR] [--no-ref]\n"
            "  latency: 8-byte ping-pong, one-way = RTT/2 (--iters round trips)\n"
            "  bandwidth: a window of in-flight messages per size, each acknowledged\n"
            "  --trace-rounds N: N rounds of ping-pong with tracing off then on (overhead)\n"
            "  --trace-all DIR: trace the whole run into DIR (`baton trace DIR` reads it);\n"
            "                   with an instruction counter, the cost of tracing per message\n"
            "  --busy-us N: spin on the transport N us after each event (default 2000 for\n"
            "               ucx and inproc, 0 for tcp)\n");
}

static void print_human(const bench_opts_t *o, const bench_result_t *r, const bench_ref_t *ref)
{
    printf("transport %s (busy poll %u us), whole actor path\n", xport_kind_name(o->kind), o->busy_us);
    printf("  latency 8 B one-way: %.2f us avg, %.2f us p50, %.2f us p99 (%u round trips, %.0f msgs/s)\n",
           r->lat_us, r->lat_p50_us, r->lat_p99_us, o->iters, r->msgs_per_s);
    if (ref && ref->latency_us > 0)
        printf("  reference %s: %.2f us one-way -> ratio %.2fx\n", ref->name, ref->latency_us,
               r->lat_us / ref->latency_us);
    if (ref && ref->latency_plain_us > 0)
        printf("  (ucx_perftest ucp_am_lat without error handling: %.2f us one-way)\n", ref->latency_plain_us);
    for (int i = 0; i < o->nsizes; i++)
        printf("  bandwidth %10zu B: %.3f GB/s\n", o->sizes[i], r->bw_gbps[i]);
    if (ref && ref->bandwidth_gbps > 0 && o->nsizes)
        printf("  reference %s: %.3f GB/s at %zu B -> %.0f%%\n", ref->name, ref->bandwidth_gbps,
               ref->bandwidth_bytes, 100.0 * r->bw_gbps[o->nsizes - 1] / ref->bandwidth_gbps);
    if (o->trace_rounds)
        printf("  tracing: off %.0f round trips/s, on %.0f round trips/s, overhead %.2f%% (median of %u "
               "rounds)\n           CPU per round trip (both sides): off %.0f ns, on %.0f ns, overhead %.2f%%\n",
               r->trace_off_rate, r->trace_on_rate, r->trace_overhead_pct, o->trace_rounds,
               r->trace_off_cpu_ns, r->trace_on_cpu_ns, r->trace_cpu_overhead_pct);
    if (o->trace_rounds && r->trace_off_cpu_ns > 0)
        printf("           one record + clock read: %.1f ns x %d per round trip = %.2f%% of the CPU per round trip\n",
               r->trace_rec_ns, BT_TRACE_RECS_PER_RT,
               100.0 * r->trace_rec_ns * BT_TRACE_RECS_PER_RT / r->trace_off_cpu_ns);
}

static void print_json(const bench_opts_t *o, const bench_result_t *r, const bench_ref_t *ref)
{
    char nproc_buf[32];
    snprintf(nproc_buf, sizeof nproc_buf, "%ld", sysconf(_SC_NPROCESSORS_ONLN));
    printf("{\"transport\":\"%s\",\"busy_us\":%u,\"iters\":%u,\"latency_us\":%.4f,\"latency_p50_us\":%.4f,"
           "\"latency_p99_us\":%.4f,\"msgs_per_s\":%.0f,\"bandwidth_GBps\":%.4f,\"bandwidth_bytes\":%zu,\"sizes\":[",
           xport_kind_name(o->kind), o->busy_us, o->iters, r->lat_us, r->lat_p50_us, r->lat_p99_us, r->msgs_per_s,
           o->nsizes ? r->bw_gbps[o->nsizes - 1] : 0.0, o->nsizes ? o->sizes[o->nsizes - 1] : 0);
    for (int i = 0; i < o->nsizes; i++)
        printf("%s{\"bytes\":%zu,\"GBps\":%.4f}", i ? "," : "", o->sizes[i], r->bw_gbps[i]);
    printf("]");
    if (ref && ref->name[0]) {
        printf(",\"ref\":\"%s\",\"ref_latency_us\":%.4f,\"ref_bandwidth_GBps\":%.4f", ref->name,
               ref->latency_us, ref->bandwidth_gbps);
        printf(",\"latency_ratio\":%.4f", ref->latency_us > 0 ? r->lat_us / ref->latency_us : 0.0);
        if (ref->latency_plain_us > 0) printf(",\"ref_latency_plain_us\":%.4f", ref->latency_plain_us);
        printf(",\"bandwidth_ratio\":%.4f",
               ref->bandwidth_gbps > 0 && o->nsizes ? r->bw_gbps[o->nsizes - 1] / ref->bandwidth_gbps : 0.0);
    }
    if (o->trace_rounds)
        printf(",\"trace_rounds\":%u,\"trace_off_rt_per_s\":%.0f,\"trace_on_rt_per_s\":%.0f,"
               "\"trace_overhead_pct\":%.3f,\"trace_off_cpu_ns_per_rt\":%.1f,\"trace_on_cpu_ns_per_rt\":%.1f,"
               "\"trace_cpu_overhead_pct\":%.3f,\"trace_record_ns\":%.2f,\"trace_record_pct\":%.3f",
               o->trace_rounds, r->trace_off_rate, r->trace_on_rate, r->trace_overhead_pct,
               r->trace_off_cpu_ns, r->trace_on_cpu_ns, r->trace_cpu_overhead_pct, r->trace_rec_ns,
               r->trace_off_cpu_ns > 0 ? 100.0 * r->trace_rec_ns * BT_TRACE_RECS_PER_RT / r->trace_off_cpu_ns : 0.0);
    printf(",\"nproc\":%s}\n", nproc_buf);
}

int bench_transport_main(int argc, char **argv)
{
    bench_opts_t o = {.kind = XPORT_TCP, .iters = 20000, .refs = true, .trace_msgs = 20000};
    static const size_t default_sizes[] = {4096, 65536, 1u << 20, 16u << 20, 256u << 20};
    int busy = -1;
    static const struct option opts[] = {
        {"transport", required_argument, NULL, 't'}, {"json", no_argument, NULL, 'j'},
        {"iters", required_argument, NULL, 'n'},     {"sizes", required_argument, NULL, 's'},
        {"busy-us", required_argument, NULL, 'b'},   {"trace-rounds", required_argument, NULL, 'r'},
        {"trace-msgs", required_argument, NULL, 'm'}, {"no-ref", no_argument, NULL, 'R'},
        {"trace-all", required_argument, NULL, 'T'},
        {"help", no_argument, NULL, 'h'},            {NULL, 0, NULL, 0},
    };
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "t:jn:s:b:r:m:RT:h", opts, NULL)) != -1) {
        switch (c) {
        case 't': {
            bool is_auto;
            if (xport_kind_parse(optarg, &o.kind, &is_auto) != BT_OK || is_auto) {
                fprintf(stderr, "baton bench transport: --transport must be inproc, tcp or ucx\n");
                return 2;
            }
            if (!xport_ops_get(o.kind)) {
                fprintf(stderr, "baton bench transport: %s is not built into this binary\n", optarg);
                return 2;
            }
            break;
        }
        case 'j': o.json = true; break;
        case 'n': o.iters = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'b': busy = atoi(optarg); break;
        case 'r': o.trace_rounds = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'm': o.trace_msgs = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'R': o.refs = false; break;
        case 'T': o.trace_all = optarg; break;
        case 's': {
            char *dup = strdup(optarg), *save = NULL;
            o.nsizes = 0;
            for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (o.nsizes == BT_MAX_SIZES || parse_size(t, &o.sizes[o.nsizes]) != 0) {
                    fprintf(stderr, "baton bench transport: bad --sizes entry '%s' (e.g. 4K,1M,256M)\n", t);
                    free(dup);
                    return 2;
                }
                o.nsizes++;
            }
            free(dup);
            if (o.nsizes == 0) o.nsizes = -1; /* "--sizes ''" below: none */
            break;
        }
        case 'h': bench_usage(stdout); return 0;
        default: bench_usage(stderr); return 2;
        }
    }
    if (o.nsizes == 0) {
        o.nsizes = (int)(sizeof default_sizes / sizeof default_sizes[0]);
        memcpy(o.sizes, default_sizes, sizeof default_sizes);
    } else if (o.nsizes < 0) {
        o.nsizes = 0;
    }
    if (o.iters == 0 || o.iters > 10000000) {
        fprintf(stderr, "baton bench transport: --iters must be 1..10000000\n");
        return 2;
    }
    if (o.trace_rounds > 1000 || (o.trace_rounds && o.trace_msgs == 0)) {
        fprintf(stderr, "baton bench transport: --trace-rounds 0..1000 with --trace-msgs > 0\n");
        return 2;
    }
    if (o.trace_all && o.trace_rounds) {
        fprintf(stderr, "baton bench transport: --trace-all and --trace-rounds exclude each other\n");
        return 2;
    }
    o.busy_us = busy >= 0 ? (uint32_t)busy : (o.kind == XPORT_TCP ? 0u : 2000u);
    const char *tmp = getenv("TMPDIR");
    snprintf(o.trace_dir, sizeof o.trace_dir, "%s/baton-bench-trace-%ld", tmp && *tmp ? tmp : "/tmp",
             (long)getpid());
    signal(SIGPIPE, SIG_IGN);

    bench_ref_t ref = {0};
    bool have_ref = false;
    if (o.refs) {
        size_t big = o.nsizes ? o.sizes[o.nsizes - 1] : 0;
        have_ref = bench_ref_run(o.kind, o.iters, big, &ref) == BT_OK;
        if (!have_ref) log_warn("bench: no reference numbers for %s", xport_kind_name(o.kind));
    }
    bench_result_t res;
    bt_status_t st = bench_run(&o, &res);
    if (o.trace_rounds) {
        res.trace_rec_ns = trace_record_cost_ns(o.trace_dir);
        bench_trace_dir_remove(o.trace_dir);
    }
    if (st != BT_OK) {
        fprintf(stderr, "baton bench transport: failed: %s\n", bt_status_str(st));
        return 1;
    }
    print_human(&o, &res, have_ref ? &ref : NULL);
    if (o.json) print_json(&o, &res, have_ref ? &ref : NULL);
    fflush(stdout);
    return 0;
}
