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

/* The tag of one ring block: the layer, the pass (MODEL_CP_FWD: the
 * forward's K/V; MODEL_CP_BWD: the backward's K/V and dK/dV accumulators),
 * the ring step of that pass and the tensor (MODEL_CP_K ... _DV; the same
 * values as wire/msg.h CP_BLOCK_*). The caller of the ops adds the step,
 * microbatch and model chunk. */
enum { MODEL_CP_K = 1, MODEL_CP_V = 2, MODEL_CP_DK = 3, MODEL_CP_DV = 4 };
enum { MODEL_CP_FWD = 1, MODEL_CP_BWD = 2 };
typedef struct {
    int32_t  layer;
    uint32_t phase, ring_step, what;
} model_cp_tag_t;

/* The ring over messages (model_parallel_t cp_msgs; train/cp_ring.h):
 * send hands a copy of t (this rank's block, [B,2L,H,Dh]) to CP rank + 1
 * and returns without waiting for the wire (t may be overwritten after);
 * recv waits for the block of `tag` from CP rank - 1 and writes it into t.
 * Both on the compute thread, with m's stream; an error is logged by them
 * (naming the CP group, layer, ring step and peer). */
typedef struct model_cp_msg_ops {
    bt_status_t (*send)(void *arg, model_t *m, const model_cp_tag_t *tag, const tensor_t *t);
    bt_status_t (*recv)(void *arg, model_t *m, const model_cp_tag_t *tag, tensor_t *t);
} model_cp_msg_ops_t;

/* Ring mode: one step of blocks around the CP group. send[i] goes to CP
 * rank + 1, recv[i] comes from CP rank - 1 (i < n <= 2: K and V, or dK and
 * dV, as two calls), started now and finished by model_cp_ring_wait; the
 * caller computes in between (the overlap) and touches neither send nor
 * recv until then. Tensor i's tag is {layer, phase, ring_step, what0 + i}. */
typedef struct {
    coll_req_t    *req[2];
    void          *host;          /* staging (send then recv of each), or NULL */
    size_t         off[2][2];     /* staging offsets of send/recv i */
    tensor_t       recv[2];
    model_cp_tag_t tag[2];        /* messages: what recv[i] waits for */
    bool           msgs;
    int            n;
    uint64_t       t0;
} model_cp_ring_t;

bt_status_t model_cp_ring_start(model_t *m, model_cp_ring_t *x, int n, tensor_t *const *recv,
                                const tensor_t *const *send, const char *what, int layer,
                                uint32_t phase, int ring_step, uint32_t what0);
bt_status_t model_cp_ring_wait(model_t *m, model_cp_ring_t *x, const char *what, int layer);

/* ---- the whole exchange of one attention call, for any attention kind ----
 * The kind computes its own q [B,2L,Hq,Dk], k [B,2L,Hkv,Dk] and v
 * [B,2L,Hkv,Dv] (this CP rank's chunks, rotated at their global
 * positions) and calls these in place of kern_attention_fwd / _bwd_set:
 * all-gather or ring by m->par.cp_ring. K and V (dK and dV) stay separate
 * tensors of their own head sizes, Dv != Dk included (MLA). `scratch` is
 * model_cp_attn_scratch_bytes of the kind's scratch, for this call only. */
double model_cp_attn_scratch_bytes(const model_t *m, int64_t B, int64_t T, int64_t Hq,
                                   int64_t Hkv, int64_t Dk, int64_t Dv);
/* out [B,2L,Hq,Dv], lse [B,2,Hq,L] (the saved region of a [B,Hq,2L] one). */
bt_status_t model_cp_attn_fwd(model_t *m, void *scratch, tensor_t *out, tensor_t *lse,
                              const tensor_t *q, const tensor_t *k, const tensor_t *v,
                              float scale, int layer);
/* dq, dk, dv overwritten (dk, dv: the gradients of this rank's own k, v,
 * summed over every CP rank's queries). */
bt_status_t model_cp_attn_bwd(model_t *m, void *scratch, tensor_t *dq, tensor_t *dk,
                              tensor_t *dv, const tensor_t *dout, const tensor_t *q,
                              const tensor_t *k, const tensor_t *v, const tensor_t *out,
                              const tensor_t *lse, float scale, int layer);

#endif
