/* Collectives behind one ops table.
 *
 * Bulk collectives (data-parallel gradient reduction, tensor-parallel
 * reductions, expert all-to-all) leave the actor path and run on a
 * communicator of their own: a group of `size` ranks, each holding one
 * coll_comm_t. Backends:
 *   host  ring/chain/pairwise algorithms over a transport (coll/host.c), CPU
 *         memory, run by a progress thread of the communicator;
 *   nccl  NCCL communicators (coll/nccl/nccl.c, libbaton_nccl.so, loaded on
 *         first use): start() queues on the caller's CUDA stream
 *         (coll_call_t.stream); a watchdog aborts the communicator on an
 *         asynchronous error or the step timeout.
 *
 * Contract, identical for every backend:
 *  - Creation is two-phase, through the ops table, because addresses travel
 *    out of band (driver, rendezvous): open() returns this rank's address
 *    (host: where it listens; nccl: rank 0's unique id), connect() takes
 *    every rank's and returns once the group is up.
 *  - A call is described by a coll_call_t and started with coll_start(),
 *    which returns at once (BT_IN_PROGRESS) with a request; the buffers
 *    belong to the collective until it completes. Completion is reported
 *    exactly once: done(arg, status) runs on a backend thread (it must only
 *    hand the completion to its owner, e.g. actor_complete() to post it to
 *    the owning actor), and coll_wait(req) returns the status and releases
 *    the request. Pass req NULL to get only the callback (the request then
 *    releases itself). coll_all_reduce() and the others below are start +
 *    wait, for compute threads; no call ever blocks an actor loop.
 *  - Calls of one communicator run one after another in start order.
 *    Between coll_group_begin() and coll_group_end() they are only queued,
 *    and start together at the end (NCCL: one fused group).
 *  - Every rank of a communicator issues the same collectives in the same
 *    order with the same counts (the schedule fixes the order). A rank that
 *    diverges is detected: the frame header names the collective and step,
 *    and a mismatch fails the call with BT_ERR_PEER_PROTO and a log line that
 *    says which rank sent what.
 *  - A dead or silent peer fails the call (BT_ERR_PEER_CLOSED, or
 *    BT_ERR_PEER_TIMEOUT after the configured timeout) and the communicator
 *    stays failed: every later call returns the same status at once.
 *  - Counts are elements, per rank; `counts` arrays have `size` entries and
 *    may be uneven or zero. Data of rank r in a concatenated buffer starts at
 *    the prefix sum of counts[0..r).
 *  - Results are deterministic for a given size and counts (fixed reduction
 *    order), but not bit-identical to a sequential sum.
 *  - Memory: mem_devices says which devices' memory the buffers may be in
 *    (host: the host only; callers stage device memory through host buffers).
 */
#ifndef BT_COLL_COLL_H
#define BT_COLL_COLL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/tensor.h"
#include "transport/xport.h"

typedef enum {
    COLL_SUM = 0,
    COLL_MAX,
    COLL_MIN,
    COLL_AVG, /* sum / size, floating types (nccl; the host backend refuses it) */
    COLL_OP_COUNT,
} coll_op_t;

typedef struct coll_comm coll_comm_t;

/* Values travel in frame headers: append only. */
typedef enum {
    COLL_KIND_NONE = 0,
    COLL_KIND_ALL_REDUCE,
    COLL_KIND_REDUCE_SCATTER,
    COLL_KIND_ALL_GATHER,
    COLL_KIND_ALL_TO_ALL,
    COLL_KIND_BROADCAST,
    COLL_KIND_BARRIER,
    COLL_KIND_COUNT,
} coll_kind_t;

const char *coll_kind_name(coll_kind_t k); /* "all_reduce", ... */

/* One collective call.
 *   all_reduce      recv[count] reduced in place (send unused)
 *   reduce_scatter  send[sum(counts)] reduced; this rank keeps its slice in
 *                   recv[counts[rank]] (recv may point into send at it)
 *   all_gather      recv[sum(counts)] = every rank's send[counts[r]] (send
 *                   may point into recv at this rank's slice)
 *   all_to_all      send_counts[j] elements to rank j (concatenated in send),
 *                   recv_counts[j] from rank j (concatenated in recv)
 *   broadcast       recv[count] from rank root
 *   barrier         nothing */
typedef struct {
    coll_kind_t   kind;
    void         *recv;
    const void   *send;
    size_t        count;
    const size_t *counts;                   /* [size]; the array is copied at start */
    const size_t *send_counts, *recv_counts; /* [size]; copied at start */
    dtype_t       dt;
    coll_op_t     op;
    int           root;
    void         *stream; /* nccl: the cudaStream_t the call is queued on, so that it
                           * orders with the kernels of that stream (kern_stream_native
                           * of the stage's stream); NULL: the communicator's own stream.
                           * The host backend ignores it. */
} coll_call_t;

typedef struct coll_req coll_req_t;
typedef void (*coll_done_fn)(void *arg, bt_status_t status);

/* How to build a communicator. Backends use what they need (the host
 * backend: all of it; nccl: rank, size, name, timeouts). */
typedef struct {
    int             rank, size;
    uint32_t        comm_id;
    const char     *name;          /* group name for logs; copied */
    xport_kind_t    kind;          /* inproc (threads as ranks), tcp, ucx */
    const char     *job_id;
    const uint8_t  *secret;
    size_t          secret_len;
    const char     *listen_addr;   /* NULL -> 127.0.0.1:0 (inproc: generated name) */
    unsigned        timeout_ms;    /* no progress for this long fails the call; 0 -> 30000
                                      (a worker's: launch.collective_timeout) */
    unsigned        connect_ms;    /* handshake and mesh set-up deadline; 0 -> 120000. Long,
                                    * because a peer still loading its model answers a
                                    * handshake late. */
    size_t          segment_bytes; /* largest frame payload; 0 -> 4 MiB */
    int             device;        /* nccl: this rank's CUDA device index */
} coll_config_t;

typedef struct coll_ops {
    const char *name;
    /* Phase 1: a communicator and this rank's address (addr[addr_cap]). */
    bt_status_t (*open)(const coll_config_t *cfg, coll_comm_t **out, char *addr,
                        size_t addr_cap);
    /* Phase 2: every rank's address (addrs[size]); returns when the group is up. */
    bt_status_t (*connect)(coll_comm_t *c, const char *const *addrs);
    /* BT_IN_PROGRESS and *req (or, req NULL, a self-releasing request); any
     * other status: not started, no callback. */
    bt_status_t (*start)(coll_comm_t *c, const coll_call_t *call, coll_done_fn done, void *arg,
                         coll_req_t **req);
    /* The request's status once it completed; releases it. */
    bt_status_t (*wait)(coll_req_t *req);
    void        (*group_begin)(coll_comm_t *c);
    void        (*group_end)(coll_comm_t *c);
    /* Finishes the calls started before, then frees everything. */
    void        (*destroy)(coll_comm_t *c);
    /* Optional: the report of the failure that failed the communicator (group,
     * op, its sequence number, rank, reason), "" while none did. */
    const char *(*failure)(coll_comm_t *c);
} coll_ops_t;

/* Public head of every backend's communicator. */
struct coll_comm {
    const coll_ops_t *ops;
    int               rank;
    int               size;
    uint32_t          id;     /* communicator id (distinguishes groups in logs) */
    const char       *name;   /* e.g. "dp0", "tp1" (owned by the backend) */
    unsigned          mem_devices; /* bit (1u << device_kind_t) per kind of memory the
                                    * buffers may be in (host backend: the host only) */
    uint64_t          n_run;  /* coll_run calls so far (zero at open): the number of the
                               * one in progress, the same on every rank of the group
                               * (they issue the same calls in the same order) */
};

static inline bt_status_t coll_open(const coll_ops_t *ops, const coll_config_t *cfg,
                                    coll_comm_t **out, char *addr, size_t addr_cap)
{
    return ops->open(cfg, out, addr, addr_cap);
}
static inline bt_status_t coll_connect(coll_comm_t *c, const char *const *addrs)
{
    return c->ops->connect(c, addrs);
}
static inline bt_status_t coll_start(coll_comm_t *c, const coll_call_t *call, coll_done_fn done,
                                     void *arg, coll_req_t **req)
{
    return c->ops->start(c, call, done, arg, req);
}
static inline bt_status_t coll_wait(coll_comm_t *c, coll_req_t *req) { return c->ops->wait(req); }
static inline void coll_group_begin(coll_comm_t *c) { c->ops->group_begin(c); }
static inline void coll_group_end(coll_comm_t *c) { c->ops->group_end(c); }
static inline void coll_destroy(coll_comm_t *c) { c->ops->destroy(c); }
static inline const char *coll_failure(coll_comm_t *c)
{
    return c->ops->failure ? c->ops->failure(c) : "";
}

/* Panics on a call no backend can run (kind out of range, counts missing
 * for its kind, a broadcast root outside the group): a caller bug. */
void coll_call_check(const coll_comm_t *c, const coll_call_t *call);

/* start + wait: the blocking form, for compute threads. It also records,
 * for the calling thread, which call it waits in (group, number, kind,
 * bytes, since when): what coll_watch_describe reports. Cost: two
 * uncontended mutex pairs per call, nothing per element.
 * Test hook: BATON_TEST_COLL_STALL="NAME:RANK:SEQ" makes rank RANK of group
 * NAME sleep (for good) before its call number SEQ, without arriving;
 * "NAME:RANK:SEQ/ATTEMPT" only in that attempt of a restarting run
 * (BATON_ATTEMPT, 1 first, launch/restart.h); a comma list of them. */
bt_status_t coll_run(coll_comm_t *c, const coll_call_t *call);

/* What the threads of this process wait in right now, one line each:
 *   "coll NAME SEQ KIND BYTES SINCE_MS RANK SIZE\n"
 * (the group's name, the call's number in it, its kind, the bytes this rank
 * contributes, how long it has waited, its rank in the group and the group's
 * size). Any thread; returns the length written (truncated to cap - 1). */
size_t coll_watch_describe(char *buf, size_t cap, uint64_t now_ns);

static inline bt_status_t coll_all_reduce(coll_comm_t *c, void *buf, size_t count, dtype_t dt,
                                          coll_op_t op)
{
    return coll_run(c, &(coll_call_t){.kind = COLL_KIND_ALL_REDUCE, .recv = buf, .count = count,
                                      .dt = dt, .op = op});
}
static inline bt_status_t coll_reduce_scatter(coll_comm_t *c, void *recv, const void *send,
                                              const size_t *counts, dtype_t dt, coll_op_t op)
{
    return coll_run(c, &(coll_call_t){.kind = COLL_KIND_REDUCE_SCATTER, .recv = recv,
                                      .send = send, .counts = counts, .dt = dt, .op = op});
}
static inline bt_status_t coll_all_gather(coll_comm_t *c, void *recv, const void *send,
                                          const size_t *counts, dtype_t dt)
{
    return coll_run(c, &(coll_call_t){.kind = COLL_KIND_ALL_GATHER, .recv = recv, .send = send,
                                      .counts = counts, .dt = dt});
}
static inline bt_status_t coll_all_to_all(coll_comm_t *c, void *recv, const size_t *recv_counts,
                                          const void *send, const size_t *send_counts,
                                          dtype_t dt)
{
    return coll_run(c, &(coll_call_t){.kind = COLL_KIND_ALL_TO_ALL, .recv = recv, .send = send,
                                      .recv_counts = recv_counts, .send_counts = send_counts,
                                      .dt = dt});
}
static inline bt_status_t coll_broadcast(coll_comm_t *c, void *buf, size_t count, dtype_t dt,
                                         int root)
{
    return coll_run(c, &(coll_call_t){.kind = COLL_KIND_BROADCAST, .recv = buf, .count = count,
                                      .dt = dt, .root = root});
}
static inline bt_status_t coll_barrier(coll_comm_t *c)
{
    return coll_run(c, &(coll_call_t){.kind = COLL_KIND_BARRIER, .dt = DT_I32});
}

/* Split `total` elements into `size` near-even counts (the first total%size
 * ranks get one more), as used for ZeRO-1 shards and ring chunks. */
void coll_counts_even(size_t total, int size, size_t *counts);

/* Element-wise dst = op(dst, src) for n elements of dt (f32, f64, i32, i64). */
void coll_reduce_local(void *dst, const void *src, size_t n, dtype_t dt, coll_op_t op);

/* ---- host backend --------------------------------------------------------
 * Full mesh of transport endpoints among the group (rank i connects to every
 * j > i) on a private libev loop: the caller's thread drives it while the
 * mesh is built (open, connect), the communicator's progress thread after.
 * coll_host_open / coll_host_connect are its ops' open and connect. */
bt_status_t coll_host_open(const coll_config_t *cfg, coll_comm_t **out, char *addr,
                           size_t addr_cap);
bt_status_t coll_host_connect(coll_comm_t *c, const char *const *addrs);

extern const coll_ops_t coll_host_ops;

/* ---- backend selection (coll/backend.c) -----------------------------------
 * A job's parallel.collectives: auto, host or nccl. auto takes nccl when every
 * rank's device is CUDA and libbaton_nccl.so is there, else host. The choice
 * is made where the job is checked (the driver, a CPU process), so it only
 * looks for the file; each worker loads it (coll_nccl_ops) and fails its
 * start, naming the reason, when it cannot. */
typedef enum {
    COLL_BACKEND_AUTO = 0,
    COLL_BACKEND_HOST,
    COLL_BACKEND_NCCL,
    COLL_BACKEND_COUNT,
} coll_backend_t;

const char *coll_backend_name(coll_backend_t b); /* "auto", "host", "nccl" */
/* BT_ERR_INVALID for a word that is none of them. */
bt_status_t coll_backend_parse(const char *s, coll_backend_t *out);
/* The backend a job with `want` runs on: all_cuda says whether every rank's
 * device is CUDA. nccl without all_cuda, or without the library, is
 * BT_ERR_UNSUPPORTED with why[] saying which; auto never fails. */
bt_status_t coll_backend_choose(coll_backend_t want, bool all_cuda, coll_backend_t *out,
                                char *why, size_t why_cap);

/* ---- nccl backend (coll/nccl/, its own shared object) ---------------------
 * NCCL communicators behind the same table, in libbaton_nccl.so, loaded on
 * the first call here as the CUDA kernels are (kernels/device.c), so that a
 * CPU process never maps libnccl or cudart. Looked for: $BATON_NCCL_LIB (a
 * path; naming nothing is an error), else libbaton_nccl.so beside the
 * executable, then one folder up. The library is loaded and asked whether
 * NCCL and a CUDA device work (its probe); NULL and why[] when not. */
const coll_ops_t *coll_nccl_ops(char *why, size_t why_cap);
/* Where libbaton_nccl.so would be loaded from, without loading it: false
 * (and why[]) when there is none. */
bool coll_nccl_lib_find(char *path, size_t cap, char *why, size_t why_cap);

/* A rank's address on an nccl communicator: rank 0's is "nccl:" and the hex
 * of its ncclUniqueId (n bytes), the others' "nccl:peer". Parse is strict
 * (prefix, length, hex digits) and says what is wrong. */
#define COLL_NCCL_PEER_ADDR "nccl:peer"
void        coll_nccl_addr_format(char *addr, size_t cap, const uint8_t *id, size_t n);
bt_status_t coll_nccl_addr_parse(const char *addr, uint8_t *id, size_t n, char *why,
                                 size_t why_cap);

#endif
