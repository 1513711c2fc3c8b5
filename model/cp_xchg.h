/* Context parallelism's exchanges for the attention kinds (model/cp_attn.h
 * has the math): K and V moved over the CP group (model_parallel_t.cp_comm)
 * on the collective backend, each as the tensor it is ([.., H, Dh] with its
 * own head size: never concatenated with the other).
 *
 * Every call runs on the thread that runs the model (the compute thread),
 * in the same order on every CP rank. Memory the communicator cannot take
 * is staged through host buffers. Errors are logged here, naming `what`,
 * the layer and the CP rank. */
#ifndef BT_MODEL_CP_XCHG_H
#define BT_MODEL_CP_XCHG_H

#include "model/model.h"

typedef struct coll_req coll_req_t;

/* All-gather mode. seq [B,T,H,Dh] = every CP rank's local [B,2L,H,Dh] in
 * sequence order; ranks [cp*B,2L,H,Dh] is scratch (the gathered rank
 * order). */
bt_status_t model_cp_gather(model_t *m, tensor_t *seq, tensor_t *ranks, const tensor_t *local,
                            const char *what, int layer);
/* local [B,2L,H,Dh] = this rank's chunks of the sum over the CP group of
 * every rank's seq [B,T,H,Dh] (a reduce-scatter; overwrites local); ranks
 * is scratch as above. */
bt_status_t model_cp_scatter_sum(model_t *m, tensor_t *local, tensor_t *ranks,
                                 const tensor_t *seq, const char *what, int layer);

/* Ring mode: one step of blocks around the CP group. send[i] goes to CP
 * rank + 1, recv[i] comes from CP rank - 1 (i < n <= 2: K and V, or dK and
 * dV, as two calls), started now and finished by model_cp_ring_wait; the
 * caller computes in between (the overlap) and touches neither send nor
 * recv until then. */
typedef struct {
    coll_req_t *req[2];
    void       *host;          /* staging (send then recv of each), or NULL */
    size_t      off[2][2];     /* staging offsets of send/recv i */
    tensor_t    recv[2];
    int         n;
    uint64_t    t0;
} model_cp_ring_t;

bt_status_t model_cp_ring_start(model_t *m, model_cp_ring_t *x, int n, tensor_t *const *recv,
                                const tensor_t *const *send, const char *what, int layer);
bt_status_t model_cp_ring_wait(model_t *m, model_cp_ring_t *x, const char *what, int layer);

#endif
