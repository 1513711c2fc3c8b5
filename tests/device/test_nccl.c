/* The nccl collective backend on one GPU (coll/nccl/nccl.c).
 *
 * One-rank communicators, created non-blocking from a unique id that went
 * through its address string (open on "rank 0", connect with that address),
 * as the workers do. Rows:
 *
 *   - every collective (all_reduce sum, avg, max; reduce_scatter and
 *     all_gather, out of place and in place; all_to_all; broadcast;
 *     barrier; a group of two) in f32 and bf16, on the kernels' stream:
 *     the input is scaled by 2 on that stream just before the call and by
 *     0.5 after it, nothing synchronised in between, so that a collective
 *     that did not order with the kernels reads or leaves the wrong values.
 *     The result is compared bit for bit with what the host computes for one
 *     rank (values drawn exact in bf16, so x*2*0.5 == x);
 *   - a call finished through its callback only (no request);
 *   - no asynchronous error afterwards (coll_failure empty);
 *   - step timeout: the stream is held by a blocking host callback, an
 *     all_reduce queued behind it; the watchdog must abort the communicator
 *     after timeout_ms (1 s), well before the callback lets go (8 s); the
 *     report names the group, "all_reduce #1" and the rank; a later call
 *     fails at once;
 *   - a peer that never joins: rank 0 of a two-rank communicator alone;
 *     connect must give up with BT_ERR_PEER_TIMEOUT after connect_ms (2 s),
 *     the init aborted, the report naming the group, "init" and the rank.
 *
 * Exit status 0 when every row passes, 1 when one fails, 2 when cuda:0 is
 * not usable here. NCCL_NVLS_ENABLE=0 is set before NCCL loads, as baton
 * sets it (docs/PARALLEL.md). */
#include "base/clock.h"
#include "base/log.h"
#include "coll/coll.h"
#include "kernels/device.h"
#include "kernels/kernels.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const device_t GPU = {DEV_CUDA, 0};
static const coll_ops_t *OPS;
static kern_stream_t *GS;
static int fails;

static void row(const char *what, const char *dt, bool ok, const char *detail)
{
    printf("%-40s %-5s %-4s %s\n", what, dt, ok ? "PASS" : "FAIL", detail ? detail : "");
    if (!ok) fails++;
}

static double ms_since(uint64_t t0) { return (double)(clock_now_ns() - t0) / 1e6; }

static coll_comm_t *comm_up(const char *name, int rank, int size, unsigned timeout_ms,
                            unsigned connect_ms, bt_status_t *st)
{
    coll_config_t cfg = {.rank = rank, .size = size, .name = name, .device = 0,
                         .timeout_ms = timeout_ms, .connect_ms = connect_ms};
    char addr[XPORT_LISTEN_ADDR_MAX];
    coll_comm_t *c = NULL;
    *st = coll_open(OPS, &cfg, &c, addr, sizeof addr);
    if (*st != BT_OK) return NULL;
    const char *addrs[2] = {addr, COLL_NCCL_PEER_ADDR};
    *st = coll_connect(c, addrs);
    return c;
}

/* n values exact in bf16 and after a scale by 2 */
static void draw(float *v, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        v[i] = bf16_to_f32(f32_to_bf16((float)((int)(seed >> 9 & 0xffff) - 32768) / 1024.0f));
    }
}

static void to_dt(void *dst, const float *src, size_t n, dtype_t dt)
{
    for (size_t i = 0; i < n; i++) {
        if (dt == DT_BF16) ((uint16_t *)dst)[i] = f32_to_bf16(src[i]);
        else ((float *)dst)[i] = src[i];
    }
}

/* One collective on a one-rank communicator: send = x (n elements), recv
 * poisoned; the call sees 2x (scaled on the stream before it) and the
 * output is scaled back after it; want = what the host says the output is,
 * as a function of x. */
static void one(coll_comm_t *c, const char *what, coll_call_t call, dtype_t dt, size_t n,
                bool in_place)
{
    size_t es = dtype_size(dt);
    float *x = malloc(n * sizeof *x);
    uint8_t *hx = malloc(n * es), *got = malloc(n * es), *poison = malloc(n * es);
    void *dsend = NULL, *drecv = NULL;
    draw(x, n, (unsigned)n * 7u + (unsigned)call.kind);
    to_dt(hx, x, n, dt);
    memset(poison, 0x7f, n * es);
    bool ok = kern_mem_alloc(GPU, n * es, &dsend) == BT_OK && kern_mem_alloc(GPU, n * es, &drecv) == BT_OK;
    if (!ok) {
        row(what, dtype_name(dt), false, "device allocation failed");
        goto out;
    }
    tensor_t ts = tensor_on(tensor_1d(dsend, dt, (int64_t)n), GPU);
    tensor_t tr = tensor_on(tensor_1d(drecv, dt, (int64_t)n), GPU);
    tensor_t *in = in_place ? &tr : &ts;
    kern_upload(GS, in, hx);
    if (!in_place) kern_upload(GS, &tr, poison);
    kern_scale(GS, in, 2.0f);
    size_t counts[1] = {n};
    call.dt = dt;
    call.stream = kern_stream_native(GS);
    call.recv = drecv;
    call.send = in_place ? drecv : dsend;
    call.count = n;
    call.counts = counts;
    call.send_counts = counts;
    call.recv_counts = counts;
    coll_req_t *req = NULL;
    bt_status_t st = coll_start(c, &call, NULL, NULL, &req);
    if (st == BT_IN_PROGRESS) {
        kern_scale(GS, &tr, 0.5f); /* after the collective, on the same stream */
        st = coll_wait(c, req);
    }
    kern_download(GS, got, &tr);
    bt_status_t ss = kern_stream_sync(GS);
    char detail[160];
    if (st != BT_OK || ss != BT_OK) {
        snprintf(detail, sizeof detail, "call %s, stream %s", bt_status_str(st), bt_status_str(ss));
        row(what, dtype_name(dt), false, detail);
        goto out;
    }
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(got + i * es, hx + i * es, es) && !bad++) first = i;
    snprintf(detail, sizeof detail, "n=%zu%s", n, in_place ? " in place" : "");
    if (bad)
        snprintf(detail, sizeof detail, "n=%zu: %zu elements differ, first at %zu", n, bad, first);
    row(what, dtype_name(dt), bad == 0, detail);
out:
    if (dsend) kern_mem_free(GPU, dsend);
    if (drecv) kern_mem_free(GPU, drecv);
    free(x), free(hx), free(got), free(poison);
}

static void collectives(coll_comm_t *c)
{
    static const dtype_t dts[] = {DT_F32, DT_BF16};
    for (int d = 0; d < 2; d++) {
        dtype_t dt = dts[d];
        for (int s = 0; s < 2; s++) {
            size_t n = s ? 1000003 : 1027; /* odd sizes: no vector-width luck */
            one(c, "all_reduce sum", (coll_call_t){.kind = COLL_KIND_ALL_REDUCE, .op = COLL_SUM},
                dt, n, true);
            one(c, "all_reduce avg", (coll_call_t){.kind = COLL_KIND_ALL_REDUCE, .op = COLL_AVG},
                dt, n, true);
            one(c, "all_reduce max", (coll_call_t){.kind = COLL_KIND_ALL_REDUCE, .op = COLL_MAX},
                dt, n, true);
            one(c, "reduce_scatter sum",
                (coll_call_t){.kind = COLL_KIND_REDUCE_SCATTER, .op = COLL_SUM}, dt, n, false);
            one(c, "reduce_scatter sum",
                (coll_call_t){.kind = COLL_KIND_REDUCE_SCATTER, .op = COLL_SUM}, dt, n, true);
            one(c, "reduce_scatter avg",
                (coll_call_t){.kind = COLL_KIND_REDUCE_SCATTER, .op = COLL_AVG}, dt, n, false);
            one(c, "all_gather", (coll_call_t){.kind = COLL_KIND_ALL_GATHER}, dt, n, false);
            one(c, "all_gather", (coll_call_t){.kind = COLL_KIND_ALL_GATHER}, dt, n, true);
            one(c, "all_to_all", (coll_call_t){.kind = COLL_KIND_ALL_TO_ALL}, dt, n, false);
            one(c, "broadcast", (coll_call_t){.kind = COLL_KIND_BROADCAST, .root = 0}, dt, n, true);
        }
    }
}

static void barrier_and_group(coll_comm_t *c)
{
    row("barrier", "i32", coll_barrier(c) == BT_OK, NULL);
    /* a group of two all-reduces on the communicator's own stream */
    float h[64], g[64];
    draw(h, 64, 3);
    void *a = NULL, *b = NULL;
    bool ok = kern_mem_alloc(GPU, sizeof h, &a) == BT_OK && kern_mem_alloc(GPU, sizeof h, &b) == BT_OK;
    tensor_t ta = tensor_on(tensor_1d(a, DT_F32, 64), GPU), tb = tensor_on(tensor_1d(b, DT_F32, 64), GPU);
    if (ok) {
        kern_upload(GS, &ta, h);
        kern_upload(GS, &tb, h);
        ok = kern_stream_sync(GS) == BT_OK;
    }
    coll_req_t *ra = NULL, *rb = NULL;
    if (ok) {
        coll_group_begin(c);
        bt_status_t s1 = coll_start(c, &(coll_call_t){.kind = COLL_KIND_ALL_REDUCE, .recv = a,
                                                      .count = 64, .dt = DT_F32, .op = COLL_SUM},
                                    NULL, NULL, &ra);
        bt_status_t s2 = coll_start(c, &(coll_call_t){.kind = COLL_KIND_BROADCAST, .recv = b,
                                                      .count = 64, .dt = DT_F32, .root = 0},
                                    NULL, NULL, &rb);
        coll_group_end(c);
        ok = s1 == BT_IN_PROGRESS && s2 == BT_IN_PROGRESS;
        if (s1 == BT_IN_PROGRESS) ok = coll_wait(c, ra) == BT_OK && ok;
        if (s2 == BT_IN_PROGRESS) ok = coll_wait(c, rb) == BT_OK && ok;
    }
    if (ok) {
        kern_download(GS, g, &ta);
        ok = kern_stream_sync(GS) == BT_OK && !memcmp(g, h, sizeof h);
        kern_download(GS, g, &tb);
        ok = ok && kern_stream_sync(GS) == BT_OK && !memcmp(g, h, sizeof h);
    }
    row("group {all_reduce, broadcast}", "f32", ok, NULL);
    if (a) kern_mem_free(GPU, a);
    if (b) kern_mem_free(GPU, b);
}

/* ---- a call finished through its callback only ---- */

static pthread_mutex_t cb_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cb_cv = PTHREAD_COND_INITIALIZER;
static int cb_calls;
static bt_status_t cb_status = BT_ERR_INVALID;

static void cb_done(void *arg, bt_status_t st)
{
    pthread_mutex_lock(&cb_mu);
    cb_calls++;
    cb_status = st;
    pthread_cond_signal(&cb_cv);
    pthread_mutex_unlock(&cb_mu);
}

static void detached(coll_comm_t *c)
{
    bt_status_t st = coll_start(c, &(coll_call_t){.kind = COLL_KIND_BARRIER, .dt = DT_I32},
                                cb_done, NULL, NULL);
    pthread_mutex_lock(&cb_mu);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 10;
    while (st == BT_IN_PROGRESS && cb_calls == 0 && pthread_cond_timedwait(&cb_cv, &cb_mu, &dl) == 0) {
    }
    bool ok = st == BT_IN_PROGRESS && cb_calls == 1 && cb_status == BT_OK;
    pthread_mutex_unlock(&cb_mu);
    row("barrier, callback only", "i32", ok, NULL);
}

/* ---- the watchdog ---- */

/* Holds its stream until released or 8 s passed (a stuck kernel's stand-in). */
static volatile int hold_release;
static void hold_cb(void *arg, bt_status_t st)
{
    uint64_t t0 = clock_now_ns();
    while (!hold_release && clock_now_ns() - t0 < 8000000000ull) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

static void step_timeout(void)
{
    bt_status_t st;
    coll_comm_t *c = comm_up("wd1", 0, 1, 1000, 0, &st);
    if (st != BT_OK) {
        row("step timeout: communicator", "f32", false, bt_status_str(st));
        if (c) coll_destroy(c);
        return;
    }
    kern_stream_t *hs = NULL;
    void *buf = NULL;
    if (kern_stream_create(GPU, &hs) != BT_OK || kern_mem_alloc(GPU, 4096, &buf) != BT_OK) {
        row("step timeout: stream", "f32", false, "cannot create");
        return;
    }
    kern_stream_notify(hs, hold_cb, NULL);
    uint64_t t0 = clock_now_ns();
    bt_status_t w = coll_run(c, &(coll_call_t){.kind = COLL_KIND_ALL_REDUCE, .recv = buf,
                                              .count = 1024, .dt = DT_F32, .op = COLL_SUM,
                                              .stream = kern_stream_native(hs)});
    double ms = ms_since(t0);
    const char *rep = coll_failure(c);
    char detail[512];
    snprintf(detail, sizeof detail, "%s after %.0f ms: \"%s\"", bt_status_str(w), ms, rep);
    row("step timeout: aborted by the watchdog", "f32",
        w == BT_ERR_PEER_TIMEOUT && ms >= 900 && ms < 5000, detail);
    row("step timeout: report", "f32",
        strstr(rep, "group wd1") && strstr(rep, "rank 0") && strstr(rep, "all_reduce #1") &&
            strstr(rep, "aborted"),
        NULL);
    t0 = clock_now_ns();
    w = coll_barrier(c);
    snprintf(detail, sizeof detail, "%s after %.1f ms", bt_status_str(w), ms_since(t0));
    row("step timeout: later call fails at once", "i32",
        w == BT_ERR_PEER_TIMEOUT && ms_since(t0) < 100, detail);
    hold_release = 1;
    kern_stream_sync(hs);
    coll_destroy(c);
    kern_mem_free(GPU, buf);
    kern_stream_destroy(hs);
}

static void missing_peer(void)
{
    bt_status_t st;
    uint64_t t0 = clock_now_ns();
    coll_comm_t *c = comm_up("wd2", 0, 2, 1000, 2000, &st);
    double ms = ms_since(t0);
    const char *rep = c ? coll_failure(c) : "";
    char detail[512];
    snprintf(detail, sizeof detail, "%s after %.0f ms: \"%s\"", bt_status_str(st), ms, rep);
    row("peer never joins: init aborted", "-", st == BT_ERR_PEER_TIMEOUT && ms >= 1900 && ms < 6000,
        detail);
    row("peer never joins: report", "-",
        strstr(rep, "group wd2") && strstr(rep, "rank 0 of 2") && strstr(rep, "init #0"), NULL);
    if (c) {
        t0 = clock_now_ns();
        coll_destroy(c);
        snprintf(detail, sizeof detail, "%.1f ms", ms_since(t0));
        row("peer never joins: destroy returns", "-", ms_since(t0) < 2000, detail);
    }
}

int main(int argc, char **argv)
{
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    char why[768] = "";
    if (!kern_device_usable(GPU, why, sizeof why)) {
        printf("cuda:0 is not usable here: %s\n", why);
        return 2;
    }
    OPS = coll_nccl_ops(why, sizeof why);
    if (!OPS) {
        printf("%s\n", why);
        return 1;
    }
    if (kern_stream_create(GPU, &GS) != BT_OK) {
        printf("cannot create a stream on cuda:0\n");
        return 1;
    }
    printf("%-40s %-5s %-4s %s\n", "row", "dtype", "", "detail");
    bt_status_t st;
    uint64_t t0 = clock_now_ns();
    coll_comm_t *c = comm_up("one", 0, 1, 10000, 0, &st);
    char detail[96];
    snprintf(detail, sizeof detail, "%s in %.0f ms", bt_status_str(st), ms_since(t0));
    row("one-rank communicator, non-blocking init", "-", st == BT_OK, detail);
    if (st == BT_OK) {
        collectives(c);
        barrier_and_group(c);
        detached(c);
        row("no asynchronous error afterwards", "-", !coll_failure(c)[0], coll_failure(c));
    }
    if (c) coll_destroy(c);
    step_timeout();
    missing_peer();
    printf("%s: %d failed\n", fails ? "FAILED" : "all passed", fails);
    return fails ? 1 : 0;
}
