/* Collectives behind one ops table (STYLE.md rule 2).
 *
 * Bulk collectives (data-parallel gradient reduction, tensor-parallel
 * reductions, expert all-to-all) leave the actor path and run on a
 * communicator of their own: a group of `size` ranks, each holding one
 * coll_comm_t. Backends:
 *   host  ring/chain/pairwise algorithms over a transport (coll_host.c), CPU;
 *   nccl  (GPU issue) fills the same table.
 *
 * Contract, identical for every backend:
 *  - Calls are blocking for the calling thread, which must be a compute/worker
 *    thread, never an actor loop: a communicator drives its own private loop.
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
 */
#ifndef BT_COLL_COLL_H
#define BT_COLL_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/tensor.h"
#include "transport/xport.h"

typedef enum {
    COLL_SUM = 0,
    COLL_MAX,
    COLL_MIN,
    COLL_OP_COUNT,
} coll_op_t;

typedef struct coll_comm coll_comm_t;

typedef struct coll_ops {
    const char *name;
    /* buf[count] reduced in place across ranks. */
    bt_status_t (*all_reduce)(coll_comm_t *c, void *buf, size_t count, dtype_t dt, coll_op_t op);
    /* send[sum(counts)] reduced across ranks; this rank keeps its slice in
     * recv[counts[rank]]. recv may point into send at this rank's slice. */
    bt_status_t (*reduce_scatter)(coll_comm_t *c, void *recv, const void *send,
                                  const size_t *counts, dtype_t dt, coll_op_t op);
    /* recv[sum(counts)] = concatenation of every rank's send[counts[r]].
     * send may point into recv at this rank's slice. */
    bt_status_t (*all_gather)(coll_comm_t *c, void *recv, const void *send,
                              const size_t *counts, dtype_t dt);
    /* send_counts[j]: elements this rank sends to rank j (concatenated in send);
     * recv_counts[j]: elements it receives from rank j (concatenated in recv). */
    bt_status_t (*all_to_all)(coll_comm_t *c, void *recv, const size_t *recv_counts,
                              const void *send, const size_t *send_counts, dtype_t dt);
    bt_status_t (*broadcast)(coll_comm_t *c, void *buf, size_t count, dtype_t dt, int root);
    bt_status_t (*barrier)(coll_comm_t *c);
    void        (*destroy)(coll_comm_t *c);
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
};

static inline bt_status_t coll_all_reduce(coll_comm_t *c, void *buf, size_t count, dtype_t dt,
                                          coll_op_t op)
{
    return c->ops->all_reduce(c, buf, count, dt, op);
}
static inline bt_status_t coll_reduce_scatter(coll_comm_t *c, void *recv, const void *send,
                                              const size_t *counts, dtype_t dt, coll_op_t op)
{
    return c->ops->reduce_scatter(c, recv, send, counts, dt, op);
}
static inline bt_status_t coll_all_gather(coll_comm_t *c, void *recv, const void *send,
                                          const size_t *counts, dtype_t dt)
{
    return c->ops->all_gather(c, recv, send, counts, dt);
}
static inline bt_status_t coll_all_to_all(coll_comm_t *c, void *recv, const size_t *recv_counts,
                                          const void *send, const size_t *send_counts,
                                          dtype_t dt)
{
    return c->ops->all_to_all(c, recv, recv_counts, send, send_counts, dt);
}
static inline bt_status_t coll_broadcast(coll_comm_t *c, void *buf, size_t count, dtype_t dt,
                                         int root)
{
    return c->ops->broadcast(c, buf, count, dt, root);
}
static inline bt_status_t coll_barrier(coll_comm_t *c) { return c->ops->barrier(c); }
static inline void coll_destroy(coll_comm_t *c) { c->ops->destroy(c); }

/* Split `total` elements into `size` near-even counts (the first total%size
 * ranks get one more), as used for ZeRO-1 shards and ring chunks. */
void coll_counts_even(size_t total, int size, size_t *counts);

/* Element-wise dst = op(dst, src) for n elements of dt (f32, f64, i32, i64). */
void coll_reduce_local(void *dst, const void *src, size_t n, dtype_t dt, coll_op_t op);

/* ---- host backend --------------------------------------------------------
 * Full mesh of transport endpoints among the group (rank i connects to every
 * j > i), on a private libev loop that the calling thread drives. Creation is
 * two-phase because addresses travel out of band (driver, rendezvous file):
 *   coll_host_open()    -> listens, returns this rank's address
 *   coll_host_connect() -> given all ranks' addresses, connects the mesh and
 *                          waits until every peer has passed the handshake. */
typedef struct {
    int             rank, size;
    uint32_t        comm_id;
    const char     *name;          /* group name for logs; copied */
    xport_kind_t    kind;          /* inproc (threads as ranks), tcp, ucx */
    const char     *job_id;
    const uint8_t  *secret;
    size_t          secret_len;
    const char     *listen_addr;   /* NULL -> 127.0.0.1:0 (inproc: generated name) */
    unsigned        timeout_ms;    /* no progress for this long fails the call; 0 -> 30000 */
    unsigned        connect_ms;    /* handshake and mesh set-up deadline; 0 -> 120000. Long,
                                    * because this rank's loop runs only inside calls: a peer
                                    * still loading its model answers a handshake late. */
    size_t          segment_bytes; /* largest frame payload; 0 -> 4 MiB */
} coll_host_config_t;

bt_status_t coll_host_open(const coll_host_config_t *cfg, coll_comm_t **out,
                           char *addr, size_t addr_cap);
bt_status_t coll_host_connect(coll_comm_t *c, const char *const *addrs);

extern const coll_ops_t coll_host_ops;

#endif
