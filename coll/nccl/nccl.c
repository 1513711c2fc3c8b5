/* The nccl collective backend (coll/coll.h): NCCL communicators behind the
 * ops table, built into libbaton_nccl.so (coll/backend.c loads it).
 *
 * Communicators are non-blocking (ncclConfig_t.blocking = 0): creation and
 * every call return at once, possibly with ncclInProgress, and
 * ncclCommGetAsyncError says when NCCL has finished with them, or failed.
 * Nothing in here waits on NCCL without a deadline.
 *
 * A call is queued on the caller's CUDA stream (coll_call_t.stream) or the
 * communicator's own, followed by an event. The watchdog, one thread per
 * communicator, polls the events of the calls in flight (in start order)
 * and the communicator's asynchronous error: an event that completes
 * completes its call; an asynchronous error, a failed event, or a call
 * older than the collective timeout (coll_config_t.timeout_ms, counted from its
 * start, so it includes the work queued before it on its stream) fails
 * every call in flight and every later one at once, then aborts the
 * communicator with ncclCommAbort, so that no rank stays blocked in a
 * kernel waiting for a dead peer (the abort itself may wait for work queued
 * ahead of the call on its stream; the callers do not wait for it). The report (logged once, and coll_failure) names the group,
 * the op, its sequence number on the communicator and the rank.
 *
 * Locking: one mutex per communicator guards its NCCL handle, the list in
 * flight and the failure; NCCL calls on the handle are made under it, from
 * the caller's thread (start, group_end) or the watchdog (polling, abort).
 * A communicator is driven by one thread at a time (as a stream is), since
 * NCCL's groups belong to the calling thread. Known gap: a communicator
 * that fails between coll_group_begin and coll_group_end leaves that
 * thread's NCCL group unclosed (ending it would hand NCCL calls of an
 * aborted communicator); the worker stops on such a failure anyway.
 */
#include "coll/coll.h"

#include "base/clock.h"
#include "base/log.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NCCL_POLL_NS 200000ull /* watchdog period while calls are in flight: 0.2 ms */

extern const coll_ops_t coll_nccl_backend;

struct coll_req {
    struct coll_req *next;
    struct coll_nccl *c;
    coll_kind_t kind;
    uint64_t seq;
    cudaStream_t st;
    cudaEvent_t ev;
    uint64_t t0_ns;
    coll_done_fn done;
    void *arg;
    bool detached, finished;
    bt_status_t status;
};

typedef struct coll_nccl {
    coll_comm_t base;
    char name[32];
    int device;
    unsigned timeout_ms, connect_ms;
    ncclUniqueId id; /* rank 0's, drawn at open */
    ncclComm_t comm; /* NULL before connect and after a failure */
    ncclComm_t doomed; /* a failed communicator not yet aborted (nccl_reap) */
    cudaStream_t own;
    int *scratch; /* one device int for the barrier */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    coll_req_t *head, **tail; /* in flight, start order */
    coll_req_t *held, **held_tail; /* started inside a group */
    int group_depth;
    uint64_t seq;
    pthread_t wd;
    bool wd_on, stop;
    bt_status_t failed;
    char failure[384];
} coll_nccl_t;

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

/* ---- failure -------------------------------------------------------------------------- */

/* Under mu: records the first failure, logs its report and takes the NCCL
 * communicator out of use; nccl_reap aborts it once mu is released and the
 * calls in flight have been failed. ncclCommAbort can wait for whatever is
 * queued on the streams it used (work ahead of a call that never started),
 * so a caller must not wait for it to learn of the failure. Later failures
 * are not reported again. */
static void nccl_fail(coll_nccl_t *c, bt_status_t st, const char *op, uint64_t seq,
                      const char *why)
{
    if (c->failed) return;
    c->failed = st;
    snprintf(c->failure, sizeof c->failure, "nccl group %s rank %d of %d: %s #%llu: %s%s",
             c->name, c->base.rank, c->base.size, op, (unsigned long long)seq, why,
             c->comm ? "; communicator aborted" : "");
    log_error("%s", c->failure);
    if (c->comm) {
        c->doomed = c->comm;
        c->comm = NULL;
    }
}

/* Without mu: aborts the communicator nccl_fail took out of use, if any. */
static void nccl_reap(coll_nccl_t *c)
{
    pthread_mutex_lock(&c->mu);
    ncclComm_t d = c->doomed;
    c->doomed = NULL;
    pthread_mutex_unlock(&c->mu);
    if (d) {
        cudaSetDevice(c->device);
        ncclCommAbort(d);
    }
}

/* Under mu: waits (bounded) until NCCL has taken the last non-blocking call;
 * BT_OK, or the communicator failed. */
static bt_status_t nccl_settle(coll_nccl_t *c, ncclResult_t r, const char *op, uint64_t seq,
                               unsigned limit_ms)
{
    uint64_t t0 = clock_now_ns();
    char why[200];
    for (;;) {
        if (r == ncclSuccess) return BT_OK;
        if (r != ncclInProgress) {
            snprintf(why, sizeof why, "%s (%s)", ncclGetErrorString(r), ncclGetLastError(c->comm));
            nccl_fail(c, r == ncclRemoteError || r == ncclSystemError ? BT_ERR_PEER_CLOSED
                                                                      : BT_ERR_DEVICE,
                      op, seq, why);
            return c->failed;
        }
        if (clock_now_ns() - t0 > (uint64_t)limit_ms * 1000000ull) {
            snprintf(why, sizeof why, "not finished after %u ms (a rank of the group is missing "
                                      "or stuck)", limit_ms);
            nccl_fail(c, BT_ERR_PEER_TIMEOUT, op, seq, why);
            return c->failed;
        }
        pthread_mutex_unlock(&c->mu);
        sleep_ns(NCCL_POLL_NS);
        pthread_mutex_lock(&c->mu);
        if (c->failed) return c->failed;
        if (ncclCommGetAsyncError(c->comm, &r) != ncclSuccess) r = ncclInternalError;
    }
}

/* ---- completion and the watchdog ------------------------------------------------------ */

/* Under mu: req leaves the list in flight with st. */
static void req_finish(coll_nccl_t *c, coll_req_t *r, bt_status_t st)
{
    r->status = st;
    r->finished = true;
    if (r->ev) {
        cudaEventDestroy(r->ev); /* released once the stream passes it, if it has not */
        r->ev = NULL;
    }
    if (r->done) r->done(r->arg, st);
    if (r->detached) free(r);
    else pthread_cond_broadcast(&c->cv);
}

static void *watchdog_main(void *arg)
{
    coll_nccl_t *c = arg;
    cudaSetDevice(c->device);
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->head && !c->stop) pthread_cond_wait(&c->cv, &c->mu);
        if (!c->head && c->stop) break;
        coll_req_t *r = c->head;
        if (!c->failed) {
            ncclResult_t ar = ncclSuccess;
            if (ncclCommGetAsyncError(c->comm, &ar) != ncclSuccess) ar = ncclInternalError;
            if (ar != ncclSuccess && ar != ncclInProgress) {
                char why[200];
                snprintf(why, sizeof why, "asynchronous error %s (%s)", ncclGetErrorString(ar),
                         ncclGetLastError(c->comm));
                nccl_fail(c, ar == ncclRemoteError || ar == ncclSystemError ? BT_ERR_PEER_CLOSED
                                                                          : BT_ERR_DEVICE,
                          coll_kind_name(r->kind), r->seq, why);
            }
        }
        if (!c->failed) {
            cudaError_t e = cudaEventQuery(r->ev);
            if (e == cudaSuccess) {
                c->head = r->next;
                if (!c->head) c->tail = &c->head;
                req_finish(c, r, BT_OK);
                continue;
            }
            char why[200];
            if (e != cudaErrorNotReady) {
                snprintf(why, sizeof why, "CUDA: %s", cudaGetErrorString(e));
                nccl_fail(c, BT_ERR_DEVICE, coll_kind_name(r->kind), r->seq, why);
            } else if (clock_now_ns() - r->t0_ns > (uint64_t)c->timeout_ms * 1000000ull) {
                snprintf(why, sizeof why, "not finished after the collective timeout of %u ms "
                                          "(launch.collective_timeout; a peer is dead, stuck or "
                                          "issued another collective)",
                         c->timeout_ms);
                nccl_fail(c, BT_ERR_PEER_TIMEOUT, coll_kind_name(r->kind), r->seq, why);
            }
        }
        if (c->failed) {
            while (c->head) {
                coll_req_t *f = c->head;
                c->head = f->next;
                req_finish(c, f, c->failed);
            }
            c->tail = &c->head;
            pthread_mutex_unlock(&c->mu);
            nccl_reap(c);
            pthread_mutex_lock(&c->mu);
            continue;
        }
        pthread_mutex_unlock(&c->mu);
        sleep_ns(NCCL_POLL_NS);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ---- creation ------------------------------------------------------------------------- */

static const char *cuda_why(cudaError_t e) { return cudaGetErrorString(e); }

static bt_status_t nccl_open(const coll_config_t *cfg, coll_comm_t **out, char *addr,
                             size_t addr_cap)
{
    *out = NULL;
    if (cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size) {
        log_error("coll nccl %s: rank %d of %d", cfg->name ? cfg->name : "?", cfg->rank, cfg->size);
        return BT_ERR_INVALID;
    }
    coll_nccl_t *c = calloc(1, sizeof *c);
    if (!c) return BT_ERR_NOMEM;
    snprintf(c->name, sizeof c->name, "%s", cfg->name ? cfg->name : "nccl");
    c->base = (coll_comm_t){.ops = &coll_nccl_backend, .rank = cfg->rank, .size = cfg->size,
                            .id = cfg->comm_id, .name = c->name,
                            .mem_devices = 1u << DEV_CUDA};
    c->device = cfg->device;
    c->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : 30000;
    c->connect_ms = cfg->connect_ms ? cfg->connect_ms : 120000;
    c->tail = &c->head;
    c->held_tail = &c->held;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (cfg->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&c->id);
        if (r != ncclSuccess) {
            log_error("coll nccl %s rank 0: ncclGetUniqueId: %s (%s)", c->name,
                      ncclGetErrorString(r), ncclGetLastError(NULL));
            free(c);
            return BT_ERR_DEVICE;
        }
        coll_nccl_addr_format(addr, addr_cap, (const uint8_t *)&c->id, sizeof c->id);
    } else {
        snprintf(addr, addr_cap, "%s", COLL_NCCL_PEER_ADDR);
    }
    if (!addr[0]) {
        log_error("coll nccl %s: an address buffer of %zu bytes is too small", c->name, addr_cap);
        free(c);
        return BT_ERR_INVALID;
    }
    *out = &c->base;
    return BT_OK;
}

static bt_status_t nccl_connect(coll_comm_t *comm, const char *const *addrs)
{
    coll_nccl_t *c = (coll_nccl_t *)comm;
    char why[200];
    if (coll_nccl_addr_parse(addrs[0], (uint8_t *)&c->id, sizeof c->id, why, sizeof why)) {
        log_error("coll nccl %s rank %d: rank 0's address: %s", c->name, comm->rank, why);
        return BT_ERR_INVALID;
    }
    cudaError_t e = cudaSetDevice(c->device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->own, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc((void **)&c->scratch, sizeof *c->scratch);
    if (e != cudaSuccess) {
        log_error("coll nccl %s rank %d: cuda device %d: %s", c->name, comm->rank, c->device,
                  cuda_why(e));
        return BT_ERR_DEVICE;
    }
    ncclConfig_t conf = NCCL_CONFIG_INITIALIZER;
    conf.blocking = 0;
    conf.commName = c->name;
    pthread_mutex_lock(&c->mu);
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, comm->size, c->id, comm->rank, &conf);
    bt_status_t st = nccl_settle(c, r, "init", 0, c->connect_ms);
    if (st == BT_OK) {
        if (pthread_create(&c->wd, NULL, watchdog_main, c) == 0) c->wd_on = true;
        else {
            nccl_fail(c, BT_ERR_NOMEM, "init", 0, "cannot start the watchdog thread");
            st = c->failed;
        }
    }
    pthread_mutex_unlock(&c->mu);
    nccl_reap(c);
    return st;
}

/* ---- calls ---------------------------------------------------------------------------- */

static ncclDataType_t nccl_dtype(dtype_t dt, bool *ok)
{
    *ok = true;
    switch (dt) {
    case DT_F32: return ncclFloat32;
    case DT_BF16: return ncclBfloat16;
    case DT_F16: return ncclFloat16;
    case DT_F64: return ncclFloat64;
    case DT_I32: return ncclInt32;
    case DT_I64: return ncclInt64;
    case DT_U8: return ncclUint8;
    default: *ok = false; return ncclFloat32;
    }
}

static ncclRedOp_t nccl_op(coll_op_t op)
{
    switch (op) {
    case COLL_MAX: return ncclMax;
    case COLL_MIN: return ncclMin;
    case COLL_AVG: return ncclAvg;
    default: return ncclSum;
    }
}

static bool counts_even(const size_t *counts, int n)
{
    for (int i = 1; i < n; i++)
        if (counts[i] != counts[0]) return false;
    return true;
}

/* The result of two NCCL calls in a row: the first error, else in progress
 * when either is. */
static ncclResult_t nccl_worse(ncclResult_t a, ncclResult_t b)
{
    if (a != ncclSuccess && a != ncclInProgress) return a;
    if (b != ncclSuccess && b != ncclInProgress) return b;
    return a == ncclInProgress ? a : b;
}

/* Under mu: hands one call to NCCL on st; the first NCCL result that is
 * not success or in progress. */
static ncclResult_t nccl_issue(coll_nccl_t *c, const coll_call_t *k, cudaStream_t st)
{
    bool ok;
    ncclDataType_t dt = nccl_dtype(k->dt, &ok);
    ncclRedOp_t op = nccl_op(k->op);
    size_t es = dtype_size(k->dt);
    int n = c->base.size;
    ncclComm_t m = c->comm;
    ncclResult_t r = ncclSuccess, r2;
#define NCCL_ACC(call) (r2 = (call), r = nccl_worse(r, r2))
    switch (k->kind) {
    case COLL_KIND_ALL_REDUCE: return ncclAllReduce(k->recv, k->recv, k->count, dt, op, m, st);
    case COLL_KIND_BROADCAST: return ncclBroadcast(k->recv, k->recv, k->count, dt, k->root, m, st);
    case COLL_KIND_BARRIER: return ncclAllReduce(c->scratch, c->scratch, 1, ncclInt32, ncclSum, m, st);
    case COLL_KIND_REDUCE_SCATTER:
        if (counts_even(k->counts, n))
            return ncclReduceScatter(k->send, k->recv, k->counts[0], dt, op, m, st);
        /* uneven: rank j's slice reduced onto j */
        NCCL_ACC(ncclGroupStart());
        for (int j = 0, off = 0; j < n; off += (int)k->counts[j], j++)
            NCCL_ACC(ncclReduce((const char *)k->send + (size_t)off * es, k->recv, k->counts[j], dt,
                                op, j, m, st));
        NCCL_ACC(ncclGroupEnd());
        return r;
    case COLL_KIND_ALL_GATHER:
        if (counts_even(k->counts, n))
            return ncclAllGather(k->send, k->recv, k->counts[0], dt, m, st);
        NCCL_ACC(ncclGroupStart());
        for (int j = 0; j < n; j++) {
            size_t off = 0;
            for (int i = 0; i < j; i++) off += k->counts[i];
            char *dst = (char *)k->recv + off * es;
            NCCL_ACC(ncclBroadcast(j == c->base.rank ? k->send : dst, dst, k->counts[j], dt, j, m,
                                   st));
        }
        NCCL_ACC(ncclGroupEnd());
        return r;
    case COLL_KIND_ALL_TO_ALL: {
        size_t so = 0, ro = 0;
        NCCL_ACC(ncclGroupStart());
        for (int j = 0; j < n; j++) {
            NCCL_ACC(ncclSend((const char *)k->send + so * es, k->send_counts[j], dt, j, m, st));
            NCCL_ACC(ncclRecv((char *)k->recv + ro * es, k->recv_counts[j], dt, j, m, st));
            so += k->send_counts[j];
            ro += k->recv_counts[j];
        }
        NCCL_ACC(ncclGroupEnd());
        return r;
    }
    default: return ncclInvalidArgument;
    }
#undef NCCL_ACC
}

/* Under mu: r's event goes on its stream and r joins the list in flight. */
static bt_status_t req_track(coll_nccl_t *c, coll_req_t *r)
{
    cudaError_t e = cudaEventCreateWithFlags(&r->ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(r->ev, r->st);
    if (e != cudaSuccess) {
        char why[160];
        snprintf(why, sizeof why, "cannot record its completion event: %s", cuda_why(e));
        nccl_fail(c, BT_ERR_DEVICE, coll_kind_name(r->kind), r->seq, why);
        return c->failed;
    }
    r->t0_ns = clock_now_ns();
    *c->tail = r;
    c->tail = &r->next;
    r->next = NULL;
    pthread_cond_broadcast(&c->cv);
    return BT_OK;
}

static bt_status_t nccl_start(coll_comm_t *comm, const coll_call_t *call, coll_done_fn done,
                              void *arg, coll_req_t **out)
{
    coll_nccl_t *c = (coll_nccl_t *)comm;
    coll_call_check(comm, call);
    bool ok;
    nccl_dtype(call->dt, &ok);
    if (!ok || (call->op == COLL_AVG && call->dt != DT_F32 && call->dt != DT_BF16 &&
                call->dt != DT_F16 && call->dt != DT_F64)) {
        log_error("coll nccl %s: %s of dtype %s%s is not supported", c->name,
                  coll_kind_name(call->kind), dtype_name(call->dt),
                  call->op == COLL_AVG ? " with op avg" : "");
        return BT_ERR_UNSUPPORTED;
    }
    coll_req_t *r = calloc(1, sizeof *r);
    if (!r) return BT_ERR_NOMEM;
    r->c = c;
    r->kind = call->kind;
    r->st = call->stream ? (cudaStream_t)call->stream : c->own;
    r->done = done;
    r->arg = arg;
    r->detached = out == NULL;
    pthread_mutex_lock(&c->mu);
    r->seq = ++c->seq;
    bt_status_t st = c->failed;
    if (!st && !c->comm) {
        log_error("coll nccl %s: %s before the communicator connected", c->name,
                  coll_kind_name(call->kind));
        st = BT_ERR_INVALID;
    }
    if (!st) {
        cudaSetDevice(c->device);
        st = nccl_settle(c, nccl_issue(c, call, r->st), coll_kind_name(r->kind), r->seq,
                         c->timeout_ms);
    }
    if (!st && c->group_depth > 0) {
        *c->held_tail = r; /* its event goes on after ncclGroupEnd */
        c->held_tail = &r->next;
    } else if (!st) {
        st = req_track(c, r);
    }
    pthread_mutex_unlock(&c->mu);
    if (st) {
        free(r);
        nccl_reap(c);
        return st;
    }
    if (out) *out = r;
    return BT_IN_PROGRESS;
}

static bt_status_t nccl_wait(coll_req_t *r)
{
    coll_nccl_t *c = r->c;
    pthread_mutex_lock(&c->mu);
    while (!r->finished) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    bt_status_t st = r->status;
    free(r);
    return st;
}

static void nccl_group_begin(coll_comm_t *comm)
{
    coll_nccl_t *c = (coll_nccl_t *)comm;
    pthread_mutex_lock(&c->mu);
    if (c->group_depth++ == 0 && !c->failed) ncclGroupStart();
    pthread_mutex_unlock(&c->mu);
}

static void nccl_group_end(coll_comm_t *comm)
{
    coll_nccl_t *c = (coll_nccl_t *)comm;
    pthread_mutex_lock(&c->mu);
    if (--c->group_depth > 0) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    coll_req_t *held = c->held;
    c->held = NULL;
    c->held_tail = &c->held;
    if (!c->failed) {
        cudaSetDevice(c->device);
        nccl_settle(c, ncclGroupEnd(), "group", c->seq, c->timeout_ms);
    }
    while (held) {
        coll_req_t *r = held;
        held = r->next;
        if (c->failed || req_track(c, r) != BT_OK) req_finish(c, r, c->failed);
    }
    pthread_mutex_unlock(&c->mu);
    nccl_reap(c);
}

static void nccl_destroy(coll_comm_t *comm)
{
    coll_nccl_t *c = (coll_nccl_t *)comm;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->wd_on) pthread_join(c->wd, NULL); /* the calls in flight finish or time out */
    cudaSetDevice(c->device);
    if (c->comm) {
        /* finalize flushes NCCL's own work; bounded like any call */
        pthread_mutex_lock(&c->mu);
        if (nccl_settle(c, ncclCommFinalize(c->comm), "finalize", c->seq, c->timeout_ms) ==
            BT_OK) {
            ncclCommDestroy(c->comm);
            c->comm = NULL;
        }
        pthread_mutex_unlock(&c->mu);
    }
    nccl_reap(c);
    if (c->scratch) cudaFree(c->scratch);
    if (c->own) cudaStreamDestroy(c->own);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static const char *nccl_failure(coll_comm_t *comm)
{
    coll_nccl_t *c = (coll_nccl_t *)comm;
    return c->failed ? c->failure : "";
}

const coll_ops_t coll_nccl_backend = {
    .name = "nccl",
    .open = nccl_open,
    .connect = nccl_connect,
    .start = nccl_start,
    .wait = nccl_wait,
    .group_begin = nccl_group_begin,
    .group_end = nccl_group_end,
    .destroy = nccl_destroy,
    .failure = nccl_failure,
};

/* Whether NCCL and a CUDA device work in this process (coll/backend.c asks
 * before it hands out the table). */
bool coll_nccl_probe(char *why, size_t why_cap);
bool coll_nccl_probe(char *why, size_t why_cap)
{
    int v = 0, n = 0;
    ncclResult_t r = ncclGetVersion(&v);
    if (r != ncclSuccess) {
        snprintf(why, why_cap, "ncclGetVersion: %s", ncclGetErrorString(r));
        return false;
    }
    if (v < NCCL_VERSION(2, 19, 0)) {
        snprintf(why, why_cap, "NCCL %d.%d.%d is loaded; non-blocking communicators as used "
                               "here need 2.19 or newer", v / 10000, v / 100 % 100, v % 100);
        return false;
    }
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(why, why_cap, "NCCL %d.%d.%d loaded, but no CUDA device: %s", v / 10000,
                 v / 100 % 100, v % 100, e != cudaSuccess ? cuda_why(e) : "none found");
        return false;
    }
    return true;
}
