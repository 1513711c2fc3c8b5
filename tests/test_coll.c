/* Host collectives against a sequential reference, over every transport:
 * threads as ranks over inproc, forked processes as ranks over tcp and ucx.
 *
 * Inputs are multiples of 1/64 of small magnitude, so float sums over a few
 * ranks are exact whatever the reduction order: results must be bit-equal to
 * the sequential reference, which makes any misplaced chunk visible. */
#include "coll/coll.h"
#include "base/log.h"
#include "tests/helpers/group.h"
#include "tests/test.h"

#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

/* ---- group runner ----------------------------------------------------------- */

static float in_f32(int rank, size_t i)
{
    return (float)((int)((rank * 7919u + i * 104729u) % 1001u) - 500) / 64.0f;
}

static test_group_t coll_group(xport_kind_t kind, int n, unsigned timeout_ms)
{
    return (test_group_t){.job_id = "coll-test", .comm_id = 7, .kind = kind, .size = n,
                          .timeout_ms = timeout_ms, .segment_bytes = 1 << 20, .kill_rank = -1};
}

static int run_threads(xport_kind_t kind, int n, unsigned timeout_ms, test_group_body_fn body,
                       void *arg)
{
    test_group_t g = coll_group(kind, n, timeout_ms);
    return test_group_threads(&g, body, arg);
}

/* Forked ranks; `kill_rank` (>= 0) gets SIGKILL `kill_after_ms` after start. */
static int run_procs(xport_kind_t kind, int n, unsigned timeout_ms, test_group_body_fn body,
                     void *arg, int kill_rank, int kill_after_ms)
{
    test_group_t g = coll_group(kind, n, timeout_ms);
    g.kill_rank = kill_rank;
    g.kill_after_ms = kill_after_ms;
    return test_group_procs(&g, body, arg);
}

static int run_group(xport_kind_t kind, int n, test_group_body_fn body, void *arg)
{
    if (kind == XPORT_INPROC) return run_threads(kind, n, 20000, body, arg);
    return run_procs(kind, n, 20000, body, arg, -1, 0);
}

/* ---- bodies ------------------------------------------------------------------ */

#define BODY_CHECK(cond) do { if (!(cond)) { fprintf(stderr, "rank %d: %s:%d: %s\n", c->rank, \
    __FILE__, __LINE__, #cond); return 1; } } while (0)

static int body_all_reduce(coll_comm_t *c, void *arg)
{
    const size_t *sizes = arg;
    for (int k = 0; sizes[k]; k++) {
        size_t n = sizes[k];
        float *buf = malloc(n * sizeof *buf);
        int32_t *ib = malloc(n * sizeof *ib);
        for (size_t i = 0; i < n; i++) {
            buf[i] = in_f32(c->rank, i);
            ib[i] = (int32_t)((c->rank * 31 + i * 7) % 97);
        }
        BODY_CHECK(coll_all_reduce(c, buf, n, DT_F32, COLL_SUM) == BT_OK);
        BODY_CHECK(coll_all_reduce(c, ib, n, DT_I32, COLL_MAX) == BT_OK);
        for (size_t i = 0; i < n; i++) {
            float ref = 0;
            int32_t mx = INT32_MIN;
            for (int r = 0; r < c->size; r++) {
                ref += in_f32(r, i);
                int32_t v = (int32_t)((r * 31 + i * 7) % 97);
                mx = v > mx ? v : mx;
            }
            if (buf[i] != ref || ib[i] != mx) {
                fprintf(stderr, "rank %d: all_reduce n=%zu i=%zu got %g/%d want %g/%d\n", c->rank,
                        n, i, buf[i], ib[i], ref, mx);
                free(buf); free(ib);
                return 1;
            }
        }
        free(buf);
        free(ib);
    }
    return 0;
}

/* uneven, with zero counts: counts[j] = (j * 5 + base) % 7 * scale */
static void uneven_counts(int size, size_t scale, size_t *counts)
{
    for (int j = 0; j < size; j++) counts[j] = (size_t)((j * 5 + 3) % 7) * scale;
    counts[0] = 0;
}

static int body_rs_ag(coll_comm_t *c, void *arg)
{
    size_t scale = *(const size_t *)arg;
    size_t counts[64], offs[64], total = 0;
    uneven_counts(c->size, scale, counts);
    for (int j = 0; j < c->size; j++) { offs[j] = total; total += counts[j]; }
    float *send = malloc((total + 1) * sizeof *send);
    float *recv = malloc((counts[c->rank] + 1) * sizeof *recv);
    for (size_t i = 0; i < total; i++) send[i] = in_f32(c->rank, i);
    BODY_CHECK(coll_reduce_scatter(c, recv, send, counts, DT_F32, COLL_SUM) == BT_OK);
    for (size_t i = 0; i < counts[c->rank]; i++) {
        float ref = 0;
        for (int r = 0; r < c->size; r++) ref += in_f32(r, offs[c->rank] + i);
        BODY_CHECK(recv[i] == ref);
    }
    /* all_gather: every rank contributes in_f32(rank, offset+i) */
    float *mine = malloc((counts[c->rank] + 1) * sizeof *mine);
    for (size_t i = 0; i < counts[c->rank]; i++) mine[i] = in_f32(c->rank + 100, offs[c->rank] + i);
    float *all = malloc((total + 1) * sizeof *all);
    { bt_status_t st_ = coll_all_gather(c, all, mine, counts, DT_F32); if (st_) fprintf(stderr, "ag status %s\n", bt_status_str(st_)); BODY_CHECK(st_ == BT_OK); }
    for (int r = 0; r < c->size; r++)
        for (size_t i = 0; i < counts[r]; i++) BODY_CHECK(all[offs[r] + i] == in_f32(r + 100, offs[r] + i));
    free(send); free(recv); free(mine); free(all);
    return 0;
}

static int body_a2a_bcast(coll_comm_t *c, void *arg)
{
    size_t scale = *(const size_t *)arg;
    int n = c->size, r = c->rank;
    size_t sc[64] = {0}, rc[64] = {0}, so = 0, ro = 0;
    /* rank i sends ((i + 2j) % 4) * scale elements to rank j (zero included) */
    for (int j = 0; j < n; j++) {
        sc[j] = (size_t)((r + 2 * j) % 4) * scale;
        rc[j] = (size_t)((j + 2 * r) % 4) * scale;
        so += sc[j];
        ro += rc[j];
    }
    int64_t *send = calloc(so + 1, sizeof *send), *recv = calloc(ro + 1, sizeof *recv);
    size_t o = 0;
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < sc[j]; i++) send[o++] = (int64_t)r * 1000000 + j * 1000 + (int64_t)i;
    BODY_CHECK(coll_all_to_all(c, recv, rc, send, sc, DT_I64) == BT_OK);
    o = 0;
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < rc[j]; i++) BODY_CHECK(recv[o++] == (int64_t)j * 1000000 + r * 1000 + (int64_t)i);
    free(send);
    free(recv);
    /* broadcast from the last rank, several segments long */
    size_t bn = 3 * scale * 1000 + 17;
    double *b = malloc(bn * sizeof *b);
    for (size_t i = 0; i < bn; i++) b[i] = r == n - 1 ? (double)i * 0.5 : -1.0;
    BODY_CHECK(coll_broadcast(c, b, bn, DT_F64, n - 1) == BT_OK);
    for (size_t i = 0; i < bn; i++) BODY_CHECK(b[i] == (double)i * 0.5);
    free(b);
    BODY_CHECK(coll_barrier(c) == BT_OK);
    return 0;
}

/* ---- cases ----------------------------------------------------------------- */

static const size_t small_sizes[] = {1, 2, 3, 7, 1000, 65537, (1u << 20) + 3, 0};

static void check_kind_sizes(xport_kind_t kind)
{
    if (!xport_ops_get(kind)) {
        fprintf(stderr, "transport %s not built\n", xport_kind_name(kind));
        CHECK(kind == XPORT_UCX); /* only ucx may be absent */
        return;
    }
    size_t scale_small = 1, scale_big = 4099;
    for (int n = 1; n <= 4; n++) {
        CHECK_MSG(run_group(kind, n, body_all_reduce, (void *)small_sizes) == 0, "%s n=%d all_reduce",
                  xport_kind_name(kind), n);
        CHECK_MSG(run_group(kind, n, body_rs_ag, &scale_small) == 0, "%s n=%d rs/ag small", xport_kind_name(kind), n);
        CHECK_MSG(run_group(kind, n, body_rs_ag, &scale_big) == 0, "%s n=%d rs/ag", xport_kind_name(kind), n);
        CHECK_MSG(run_group(kind, n, body_a2a_bcast, &scale_big) == 0, "%s n=%d a2a/bcast", xport_kind_name(kind), n);
    }
}

static void test_coll_inproc(void) { check_kind_sizes(XPORT_INPROC); }
static void test_coll_tcp(void) { check_kind_sizes(XPORT_TCP); }
static void test_coll_ucx(void) { check_kind_sizes(XPORT_UCX); }

/* 64M elements (256 MiB) all-reduce between two processes over tcp. */
static void test_coll_64m_tcp(void)
{
    static const size_t big[] = {64u << 20, 0};
    CHECK(run_procs(XPORT_TCP, 2, 60000, body_all_reduce, (void *)big, -1, 0) == 0);
}

static int body_mismatch(coll_comm_t *c, void *arg)
{
    float buf[16] = {0};
    /* rank 0 reduces 10 elements, the others 12: must fail, not hang */
    bt_status_t st = coll_all_reduce(c, buf, c->rank == 0 ? 10 : 12, DT_F32, COLL_SUM);
    BODY_CHECK(st == BT_ERR_PEER_PROTO || st == BT_ERR_PEER_CLOSED);
    BODY_CHECK(coll_barrier(c) != BT_OK); /* the communicator stays failed */
    return 0;
}

static void test_coll_mismatch_detected(void)
{
    CHECK(run_procs(XPORT_TCP, 2, 5000, body_mismatch, NULL, -1, 0) == 0);
    CHECK(run_threads(XPORT_INPROC, 3, 5000, body_mismatch, NULL) == 0);
}

static int body_survivor(coll_comm_t *c, void *arg)
{
    /* rank 1 is killed by the parent while everyone loops on all-reduces */
    float *buf = calloc(1 << 20, sizeof *buf);
    bt_status_t st = BT_OK;
    for (int i = 0; i < 100000 && st == BT_OK; i++) st = coll_all_reduce(c, buf, 1 << 20, DT_F32, COLL_SUM);
    free(buf);
    BODY_CHECK(bt_status_is_peer(st));
    return 0;
}

static void test_coll_peer_killed(void)
{
    uint64_t t0 = (uint64_t)time(NULL);
    CHECK(run_procs(XPORT_TCP, 3, 2000, body_survivor, NULL, 1, 300) == 0);
    CHECK((uint64_t)time(NULL) - t0 < 10);
}

/* The non-blocking contract: calls started back to back (one inside a
 * group, one with only a callback) run in start order, each reports once,
 * and their results are those of the blocking calls. */
typedef struct {
    _Atomic int calls;
    _Atomic int order_bad;
    _Atomic int last;
} nb_count_t;

typedef struct {
    nb_count_t *n;
    int         id;
} nb_tag_t;

static void nb_done(void *arg, bt_status_t st)
{
    nb_tag_t *t = arg;
    if (st != BT_OK) return;
    int prev = atomic_exchange(&t->n->last, t->id);
    if (prev != t->id - 1) atomic_fetch_add(&t->n->order_bad, 1);
    atomic_fetch_add(&t->n->calls, 1);
}

static int body_nonblocking(coll_comm_t *c, void *arg)
{
    (void)arg;
    enum { N = 3000 };
    nb_count_t cnt = {.last = -1};
    nb_tag_t tags[4];
    for (int i = 0; i < 4; i++) tags[i] = (nb_tag_t){&cnt, i};
    float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    float *gath = malloc((size_t)c->size * 4 * sizeof *gath), mine[4];
    for (size_t i = 0; i < N; i++) a[i] = b[i] = in_f32(c->rank, i);
    for (int i = 0; i < 4; i++) mine[i] = (float)(c->rank * 4 + i);
    size_t *counts = malloc((size_t)c->size * sizeof *counts);
    for (int r = 0; r < c->size; r++) counts[r] = 4;
    coll_req_t *r0 = NULL, *r2 = NULL, *r3 = NULL;
    BODY_CHECK(coll_start(c, &(coll_call_t){.kind = COLL_KIND_ALL_REDUCE, .recv = a, .count = N,
                                            .dt = DT_F32, .op = COLL_SUM},
                          nb_done, &tags[0], &r0) == BT_IN_PROGRESS);
    /* callback only: the request releases itself */
    BODY_CHECK(coll_start(c, &(coll_call_t){.kind = COLL_KIND_ALL_REDUCE, .recv = b, .count = N,
                                            .dt = DT_F32, .op = COLL_MAX},
                          nb_done, &tags[1], NULL) == BT_IN_PROGRESS);
    coll_group_begin(c);
    BODY_CHECK(coll_start(c, &(coll_call_t){.kind = COLL_KIND_ALL_GATHER, .recv = gath,
                                            .send = mine, .counts = counts, .dt = DT_F32},
                          nb_done, &tags[2], &r2) == BT_IN_PROGRESS);
    memset(counts, 0, (size_t)c->size * sizeof *counts); /* start copied them */
    BODY_CHECK(coll_start(c, &(coll_call_t){.kind = COLL_KIND_BARRIER}, nb_done, &tags[3], &r3) ==
               BT_IN_PROGRESS);
    coll_group_end(c);
    BODY_CHECK(coll_wait(c, r3) == BT_OK);
    BODY_CHECK(coll_wait(c, r0) == BT_OK && coll_wait(c, r2) == BT_OK);
    BODY_CHECK(atomic_load(&cnt.calls) == 4 && atomic_load(&cnt.order_bad) == 0);
    int bad = 0;
    for (size_t i = 0; i < N; i++) {
        float sum = 0, mx = -1e30f;
        for (int r = 0; r < c->size; r++) {
            sum += in_f32(r, i);
            mx = in_f32(r, i) > mx ? in_f32(r, i) : mx;
        }
        bad += a[i] != sum || b[i] != mx;
    }
    for (int i = 0; i < c->size * 4; i++) bad += gath[i] != (float)i;
    free(a), free(b), free(gath), free(counts);
    BODY_CHECK(bad == 0);
    return 0;
}

static void test_coll_nonblocking(void)
{
    CHECK(run_group(XPORT_INPROC, 3, body_nonblocking, NULL) == 0);
    CHECK(run_group(XPORT_TCP, 2, body_nonblocking, NULL) == 0);
}

static void test_coll_counts_even(void)
{
    size_t c[4];
    coll_counts_even(10, 4, c);
    CHECK(c[0] == 3 && c[1] == 3 && c[2] == 2 && c[3] == 2);
    coll_counts_even(2, 4, c);
    CHECK(c[0] == 1 && c[1] == 1 && c[2] == 0 && c[3] == 0);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    TEST_RUN(argc, argv, test_coll_counts_even, test_coll_nonblocking, test_coll_inproc, test_coll_tcp, test_coll_ucx,
             test_coll_64m_tcp, test_coll_mismatch_detected, test_coll_peer_killed);
}
