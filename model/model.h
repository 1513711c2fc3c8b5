/* A decoder-only transformer as a sequence of blocks (model/config.h), with
 * hand-written forward and backward over the kernels (llm.c style), on any
 * device the kernels have a backend for.
 *
 * Parameters (model/model.c):
 *  - All parameters a model instance holds live in ONE device allocation
 *    (param_mem) carved into named views params[i]; the names are exactly
 *    the Hugging Face tensor names ("model.embed_tokens.weight",
 *    "model.layers.3.self_attn.q_proj.weight", "lm_head.weight", ...), so
 *    import, export and sharding are driven by name. Each view carries its
 *    shard spec (base/shard_spec.h): the HF tensor's global shape and the piece
 *    this instance holds.
 *  - Gradients live in a second allocation (grad_mem) carved the same way:
 *    grads[i] is the gradient of params[i]. Backward ACCUMULATES into it;
 *    model_grads_zero() clears it.
 *  - Host code never dereferences either: they are device memory of
 *    place.dev. model_param_read / model_param_write move a tensor between
 *    the device and host f32.
 *  - A model instance may hold only a pipeline stage: layers [first, last)
 *    plus, optionally, the embedding (first stage) and the final norm and
 *    head (last stage). Layer tensors keep their GLOBAL layer index in their
 *    names. With tied embeddings a head stage without the embedding holds its
 *    own copy named "model.embed_tokens.weight" (the distributed code sums
 *    the two gradients); a stage with both uses the one view for both.
 *
 * Blocks (model/kind.h): every layer is up to two pre-norm residual
 * sublayers, a mixer and a feed-forward, each of a kind that owns its
 * parameter layout, activation sizing, forward, backward and TP rule.
 *
 * Running a batch: a batch is B rows of T tokens; rows shorter than T are
 * right-padded (any valid id) with target -100, which is exact because
 * attention is causal and padded positions are never scored. Targets follow
 * transformers' convention for labels = input ids: targets[t] = ids[t+1],
 * the last position of each sequence -100 (model_targets_from_ids).
 *
 *   model_acts_t *a;  model_acts_create(m, B, T, &a);
 *   tensor_t x = model_acts_x_in(a, B, T);   kern_upload(m->stream, &x, host);  (no embedding)
 *   model_stage_forward(m, a, &batch, dloss, &loss);
 *   tensor_t y = model_acts_x_out(a);        kern_download(m->stream, host, &y); (no head)
 *   tensor_t dy = model_acts_dx_out(a);      kern_upload(...)                    (no head)
 *   model_stage_backward(m, a);
 *   tensor_t dx = model_acts_dx_in(a);       kern_download(...)                  (no embedding)
 *
 * Forward with dloss > 0 prepares backward: the head stage computes its
 * gradients (lm_head, d of the final hidden) during forward, chunk by chunk,
 * so the [N, vocab] logits never exist whole. dloss is the weight of each
 * scored position in the caller's loss (1 / total scored positions for a
 * mean over several microbatches). dloss = 0 is inference (no gradients).
 * One model_acts_t holds what one microbatch needs between its forward and
 * its backward; a pipeline schedule with k microbatches in flight keeps k.
 *
 * Tensor parallelism (Megatron-style; docs/PARALLEL.md): model_create_tp()
 * builds one TP rank's share of a stage. cfg stays the WHOLE model's config;
 * each kind takes its share (whole KV-head groups, F/tp of the MLP) and the
 * vocabulary is split near-evenly. Forward and backward issue their TP
 * all-reduces on the calling thread (coll/coll.h): every TP rank of a stage
 * must run the same calls on the same batch and inputs; outputs, input
 * gradients and the loss come out identical on every TP rank.
 */
#ifndef BT_MODEL_MODEL_H
#define BT_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/tensor.h"
#include "kernels/device.h"
#include "model/config.h"
#include "base/shard_spec.h"

#define MODEL_IGNORE_INDEX (-100)
#define MODEL_NAME_MAX 96
#define MODEL_SUB_SLOTS 24 /* tensors one sublayer kind may own */
#define MODEL_MAX_EP 256    /* ranks of an expert-parallel group */

typedef struct model_kind model_kind_t; /* model/kind.h */
typedef struct coll_comm coll_comm_t;   /* coll/coll.h */

/* Which part of the network a model instance holds and runs. */
typedef struct {
    int  first_layer, last_layer; /* layers [first_layer, last_layer) */
    bool has_embedding;           /* input is token ids (else hidden states [B,T,C]) */
    bool has_head;                /* final norm + lm_head + loss (else output hidden) */
} model_stage_t;

/* Where a model instance sits in a tensor-parallel group and, for routed
 * experts, in the expert grid (docs/PARALLEL.md "Expert parallelism").
 *
 * Expert parallelism: the stacked expert tensors ([E, ...], see "Stacked
 * parameters" below) are split along dimension 0 over an EP group of
 * ep_size ranks (rank ep_rank holds experts [ep_rank * E/ep, (ep_rank + 1)
 * * E/ep)); each MoE forward sends every routed token to the rank of its
 * expert and gets the result back (all-to-all on ep_comm, counts first).
 * The members of an EP group hold different tokens: under TP each TP rank
 * routes its own near-even share of the rows (the rest come back by an
 * all-gather over tp_comm). An expert's replicas over the expert-data-
 * parallel group (edp) sum their gradients there (train/dist_optim.c);
 * edp_rank 0 counts and stores them once. All zero (or ep_size 1, ep_comm
 * NULL): every expert here. */
typedef struct {
    int          tp_rank, tp_size; /* {0, 1}: no tensor parallelism */
    coll_comm_t *tp_comm;          /* the TP group (rank tp_rank of tp_size); NULL at tp_size 1 */
    int          ep_rank, ep_size; /* {0, 0 or 1}: no expert parallelism */
    coll_comm_t *ep_comm;          /* the EP group (rank ep_rank of ep_size); NULL at ep_size <= 1 */
    int          edp_rank;         /* place in the expert-data-parallel group (0: stores experts) */
    /* Context parallelism (docs/PARALLEL.md, model/cp_attn.h): every
     * sequence is cut into 2*cp_size chunks and this rank holds chunks
     * cp_rank and 2*cp_size-1-cp_rank, as its [B, T/cp_size] rows; the
     * batch's positions (model_batch_t.pos) must say so. The attention
     * kinds exchange K and V over cp_comm (all-gather, or a ring of K/V
     * blocks when cp_ring). {0 or 1}: none. */
    int          cp_rank, cp_size;
    coll_comm_t *cp_comm;          /* the CP group (rank cp_rank of cp_size); NULL at cp_size <= 1 */
    bool         cp_ring;
    /* Ring mode over actor messages (model/cp_xchg.h model_cp_msg_ops_t,
     * train/cp_ring.h): set, the ring's blocks go through these callbacks
     * (the stage actor's CP_BLOCK messages) instead of cp_comm. NULL: the
     * communicator's send/receive. */
    const struct model_cp_msg_ops *cp_msgs;
    void        *cp_msgs_arg;
    /* Sequence parallelism inside TP (docs/PARALLEL.md): the residual stream
     * and the norms of a microbatch's N tokens are sharded over the TP group
     * (near-even row ranges, model_sp_rows); all-gather before the
     * column-parallel products, reduce-scatter after the row-parallel ones
     * in place of the TP all-reduce. Stage inputs and outputs stay whole.
     * Ignored at tp_size 1 and in decode arenas. */
    bool         sp;
} model_parallel_t;

/* Whether a parameter's spec belongs to the routed experts (split over EP,
 * reduced over edp), whatever ep_size is. */
#define MODEL_PARAM_IS_EXPERT(spec) ((spec)->group == SHARD_GROUP_EP)

/* Where, and in which precisions, a model instance runs. */
typedef struct {
    device_t dev;
    dtype_t  param_dtype; /* the parameters the kernels read */
    dtype_t  act_dtype;   /* activations and their gradients */
    dtype_t  grad_dtype;  /* parameter gradients (f32 or param_dtype) */
} model_place_t;

/* The host in f32 throughout. */
model_place_t model_place_host(void);

typedef struct {
    char         name[MODEL_NAME_MAX]; /* HF tensor name */
    tensor_t     t;                    /* view into param_mem (or grad_mem), on place.dev */
    /* The HF tensor's global shape and the piece t holds. A parameter that
     * is whole on every TP rank (norm weights, o_proj/down_proj biases) has
     * group SHARD_GROUP_NONE: its gradients come out bit-identical on every
     * TP rank after backward, and the gradient norm counts them once
     * (model_grads_sumsq_unique). */
    shard_spec_t spec;
    /* Kept in f32 whatever the compute dtype (model_param_dtype): a small
     * parameter that only the f32 arithmetic of a kind's own ops reads, and
     * that rounding to bf16 would move (the Mamba2 mixer's A_log, D,
     * dt_bias and gated-norm weight). Under a bf16 compute dtype its view in
     * param_mem is f32 and is its own master (masters[i] aliases params[i]);
     * its gradient stays in place.grad_dtype like every other. */
    bool         keep_f32;
    /* Whole on every TP rank, but a backward's gradient is only this rank's
     * share (a weight every head shares, fed by this rank's heads: Qwen3's
     * q_norm and k_norm); the backward sums the shares over the TP group so
     * that the gradients come out bit-identical on every rank again. */
    bool         grad_tp_partial;
} model_param_t;

/* The dtype parameter p is stored in when the kernels compute in `compute`. */
dtype_t model_param_dtype(const model_param_t *p, dtype_t compute);

/* One sublayer of one layer: a pre-norm residual block of some kind. */
typedef struct {
    const model_kind_t *kind;
    int                 layer;               /* global layer index */
    int                 norm;                /* param index of its pre-norm weight */
    int                 ix[MODEL_SUB_SLOTS]; /* the kind's tensors: slot -> param index, -1 absent */
} model_sub_t;

/* One EP row all-to-all: sparse layer `layer`, MODEL_MOE_X_* (the forward's
 * dispatch of the routed rows and combine of the experts' outputs, the
 * backward's of their gradients), chunk `chunk`, [t0, t1] clock_now_ns
 * from its start to its completion. */
enum { MODEL_MOE_X_DISPATCH = 0, MODEL_MOE_X_COMBINE, MODEL_MOE_X_DISPATCH_GRAD,
       MODEL_MOE_X_COMBINE_GRAD, MODEL_MOE_X_COUNT };
#define MODEL_MOE_XLOG 64
typedef struct {
    int32_t  layer, what, chunk;
    uint64_t t0, t1, bytes;
} model_moe_x_t;

/* The expert part of one sparse layer's forward or backward (model/moe.c):
 * with expert parallelism the count exchange, the routed rows out to their
 * experts' ranks, the experts' grouped products and the results back (in
 * two chunks, overlapped); without, the products. run(job) does it on the
 * model's stream, on the calling thread, with buffers of the layer's
 * arena that the model set up before and reads after. */
typedef struct model_moe_job model_moe_job_t;
struct model_moe_job {
    bt_status_t (*run)(model_moe_job_t *job);
    struct model *model;    /* the instance (its moe_xlog gets the job's row all-to-alls) */
    int          layer;     /* global layer index */
    bool         backward;
    int64_t      rows_out;  /* routed rows (token, expert choices) this rank dispatches */
    int64_t      rows_in;   /* rows this rank's experts ran on (set by run) */
};
/* Who runs the expert part of a sparse layer (model_t moe_group): called on
 * the thread of the forward or backward, in layer order; it must have
 * job->run(job) run exactly once on that same thread before it returns,
 * and return its status (an error without running it fails the layer).
 * The stage of a worker hands it to its expert-group actor this way
 * (train/expert_actor.h); NULL: the model runs it itself. */
typedef bt_status_t (*model_moe_group_fn)(void *arg, model_moe_job_t *job);

typedef struct model {
    model_config_t   cfg;
    model_stage_t    stage;
    model_parallel_t par;
    model_place_t    place;
    kern_stream_t   *stream;     /* every op of this instance runs on it */
    void            *param_mem;  /* device: all parameters */
    void            *grad_mem;   /* device: gradients, or NULL (model_grads_alloc) */
    /* When the parameters are not f32 (a bf16 compute copy): their f32
     * masters, carved the same way, which loading and initialisation write
     * exactly and the optimizer updates (writing the copy in the same pass);
     * else NULL, the parameters being their own masters. A keep_f32
     * parameter's master is the parameter itself (the same view). */
    void            *master_mem;
    model_param_t   *masters;    /* [n_params] or NULL */
    size_t           param_bytes, grad_bytes, master_bytes;
    int              n_params;
    model_param_t   *params;     /* [n_params] views into param_mem */
    model_param_t   *grads;      /* [n_params] same names, views into grad_mem */
    int              n_subs;
    model_sub_t     *subs;       /* [n_subs] the stage's sublayers, in order */
    int              embed, final_norm, lm_head; /* indices; -1 when absent */
    /* This TP rank's vocabulary rows [vocab_start, vocab_start + vocab). */
    int64_t          vocab, vocab_start;
    /* Host staging for collectives that take host memory only. */
    void            *host_buf;
    size_t           host_buf_bytes;
    /* Routed choices (token, expert) dropped by an expert's capacity
     * (model_moe_config_t.capacity_factor) in this instance's forwards since
     * it was created; 0 when dropless. moe_dropped_train: those of the
     * training forwards since the last model_moe_dropped_take. */
    int64_t          moe_dropped, moe_dropped_train;
    /* With expert parallelism: the routed rows this rank's experts received
     * from the EP group in its forwards since it was created (0 is normal:
     * no member chose them). */
    int64_t          moe_rows_in;
    /* With expert parallelism: wall time in the EP exchanges (counts and
     * rows, forward and backward, staging included) and in the experts'
     * products, since creation (bench/bench_moe.sh reads them through the
     * stage's trace counters). The exchanges wait for the stream anyway; the
     * experts' time is queueing time on an asynchronous device unless
     * moe_time_sync makes each block wait for its stream. */
    uint64_t         moe_exchange_ns, moe_expert_ns;
    bool             moe_time_sync;
    /* With expert parallelism, of the row all-to-alls (dispatch and combine,
     * forward and backward): the time they were in flight (started to
     * completed, on the collective's own thread) and the part of it this
     * thread waited for them; the rest overlapped the experts' compute of
     * another chunk (model/moe.c, MOE_CHUNKS). Since creation. */
    uint64_t         moe_a2a_ns, moe_a2a_wait_ns;
    /* The row all-to-alls since the caller last reset moe_xlog_n (the expert
     * group, train/expert_actor.c, or without one the stage actor turns them
     * into trace spans after each expert part or op),
     * the first MODEL_MOE_XLOG of them; moe_xlog_lost counts the rest. */
    model_moe_x_t    moe_xlog[MODEL_MOE_XLOG];
    int              moe_xlog_n, moe_xlog_lost;
    /* Routed experts' load: per sparse layer of this stage, in stage order,
     * [n_moe][3][E] f32 on the device: the choices routed to each expert
     * (before any capacity) in the training forwards (dloss > 0) since the
     * last model_moe_load_take, scratch for the probability sums the same
     * kernel adds, and the layer's selection bias (model_moe_balance; 0
     * unless bias balancing is on). NULL / 0 without routed experts. */
    void            *moe_load_mem;
    int              n_moe;
    /* The expert part's runner (model_moe_group_fn; NULL: inline) and, for
     * the benchmark's reference (bench/bench_moe.sh), moe_serial: each
     * row all-to-all is waited for as soon as it is started, so nothing
     * overlaps the experts' compute (the same collectives in the same
     * order: the same bits). */
    model_moe_group_fn moe_group;
    void            *moe_group_arg;
    bool             moe_serial;
} model_t;

/* Per-microbatch activations and scratch, sized for B x T (opaque). */
typedef struct model_acts model_acts_t;

typedef struct {
    int64_t        B, T;       /* rows, tokens per row (T <= acts' T) */
    const int32_t *ids;        /* host [B*T] token ids; needed when stage has_embedding */
    const int32_t *targets;    /* host [B*T] next-token targets or -100; needed when has_head */
    const int32_t *pos;        /* host [B*T] positions, or NULL for 0..T-1 in every row */
    float         *logits_out; /* optional host [B*T - logits_from, vocab] copy of the logits
                                * of rows [logits_from, B*T) (head stage) */
    int64_t        logits_from; /* first row copied to logits_out (0: all); chunks of rows
                                 * before it with nothing scored are not computed */
} model_batch_t;

typedef struct {
    double  loss_sum; /* sum of per-position NLL (nats) over scored positions, plus aux_sum */
    int64_t n_scored; /* number of scored positions (targets != -100) */
    /* of loss_sum: the kinds' auxiliary terms (the router's load-balancing
     * loss, model/kind.h model_moe_aux_end) times n_scored; 0 without any */
    double  aux_sum;
} model_loss_t;

/* ---- lifetime ------------------------------------------------------------ */

/* Validates cfg (clear error naming the field) and allocates a zeroed
 * parameter block for `stage` (NULL: the whole model) on the host, f32. */
bt_status_t model_create(const model_config_t *cfg, const model_stage_t *stage, model_t **out);
/* One tensor-parallel rank's share of `stage` (par NULL: no TP), on the host. */
bt_status_t model_create_tp(const model_config_t *cfg, const model_stage_t *stage,
                            const model_parallel_t *par, model_t **out);
/* The same on any device and in any precision its backend supports: every
 * kernel op the stage's blocks need is checked with kern_supports() here, so
 * that a missing one is an error naming the op now, not a panic mid-step. */
bt_status_t model_create_on(const model_config_t *cfg, const model_stage_t *stage,
                            const model_parallel_t *par, const model_place_t *place,
                            model_t **out);
bt_status_t model_parallel_validate(const model_config_t *cfg, const model_parallel_t *par);
void        model_destroy(model_t *m);
/* The full-model stage of cfg. */
model_stage_t model_stage_full(const model_config_t *cfg);

/* Initialization for training from scratch: N(0, std) for matrices and the
 * embedding, 1 for norm weights, 0 for biases; deterministic in seed and
 * addressed by global element, so every stage and TP piece gets exactly its
 * part of the whole model's values. */
bt_status_t model_init_random(model_t *m, uint64_t seed, float std);

/* The parameter layout of `stage` of cfg (NULL: whole model), in HF order:
 * fills out[i].name and out[i].spec (and t's shape, data NULL) when out is
 * non-NULL and returns the count. ckpt/ uses it with the whole model to know
 * every valid tensor name. */
int model_layout(const model_config_t *cfg, const model_stage_t *stage, model_param_t *out);
/* The same for one TP rank (par NULL: no TP). */
int model_layout_tp(const model_config_t *cfg, const model_stage_t *stage,
                    const model_parallel_t *par, model_param_t *out);

/* Stacked parameters. A parameter whose name holds one MODEL_STACK_MARK
 * stacks, along its first dimension, the Hugging Face tensors named with
 * 0, 1, ... in the mark's place: "model.layers.0.block_sparse_moe.experts.*.w1.weight"
 * [E, F, C] is experts.0.w1.weight ... experts.<E-1>.w1.weight, each [F, C]
 * (routed experts: the index is the global expert index, so an expert-
 * parallel split is a box along dimension 0). The HF import and export
 * (ckpt/hf.c) read and write the per-index tensors; everything else
 * (initialisation, the optimizer, checkpoints) sees one tensor. */
#define MODEL_STACK_MARK '*'
bool model_name_is_stacked(const char *name);
/* out[cap] = stacked name with index i in the mark's place; false if it
 * does not fit (or name is not stacked). */
bool model_name_unstack(const char *name, int64_t i, char *out, size_t cap);
/* Whether hf is stacked name with a decimal index (no leading zeros) in the
 * mark's place; the index in *i. */
bool model_name_stack_index(const char *stacked, const char *hf, int64_t *i);

/* Row parts. A parameter named "<hf>#<k>" (MODEL_PART_MARK, a decimal k)
 * is part k of the Hugging Face tensor <hf>: the parts 0, 1, ... of one
 * name are consecutive row blocks of it along dimension 0, in order (the
 * Mamba2 in_proj's z, x, B, C and dt, so that each is TP-split by heads or
 * groups on its own). The HF import and export (ckpt/hf.c, `baton
 * convert`) read and write the one HF tensor; everything else sees the
 * parts. */
#define MODEL_PART_MARK '#'
/* Whether name is a part; its HF name in base[cap] and its index in *k. */
bool model_name_part(const char *name, char *base, size_t cap, int *k);
/* For part ps[i] among ps[n] (which must hold all its siblings, as a layout
 * of whole sublayers does): the HF row of its row 0 and the HF tensor's
 * rows (from the parts' global shapes). False when ps[i] is no part. */
bool model_part_rows(const model_param_t *ps, int n, int i, int64_t *row0, int64_t *rows);

/* Index of the parameter named `name`, or -1. */
int model_param_find(const model_t *m, const char *name);
/* host[numel] (f32) = parameter i (grad: its gradient), this instance's
 * piece; the f32 master when there is one. */
bt_status_t model_param_read(const model_t *m, int i, bool grad, float *host);
/* parameter i = host[numel] (f32), converted to the parameter dtype (and
 * its f32 master, exactly, when there is one). */
bt_status_t model_param_write(model_t *m, int i, const float *host);
/* Parameter i's own memory when it is one contiguous f32 tensor on the CPU
 * with no master copy (a loader then reads straight into it, with no host
 * buffer between); NULL otherwise, and model_param_write is the way in. */
float *model_param_host_f32(model_t *m, int i);
/* The name of the first parameter (or master copy) holding a NaN or an
 * infinity; NULL when all are finite. One scan per tensor, on its device. */
const char *model_first_nonfinite_param(const model_t *m);

/* ---- gradients ----------------------------------------------------------- */

bt_status_t model_grads_alloc(model_t *m); /* allocates (zeroed) if absent */
void        model_grads_zero(model_t *m);
/* Sum of squares over all of m's grads (a TP share's replicated gradients
 * included: use model_grads_sumsq_unique for a global norm under TP). */
double      model_grads_sumsq(const model_t *m);
/* This TP rank's share of the gradient sum of squares: sharded gradients in
 * full, replicated ones only on tp_rank 0. Summed over the TP group (and
 * over pipeline stages) it is the global squared norm, each element counted
 * once. Equals model_grads_sumsq at tp_size 1. */
double      model_grads_sumsq_unique(const model_t *m);
/* Whether this rank counts (and stores) parameter i's piece for the whole
 * model: a TP-replicated one on tp_rank 0, an expert's on edp_rank 0, any
 * other (a TP shard) always. Data-parallel replicas are the caller's. */
bool        model_param_counted(const model_t *m, int i);

/* The routed experts' load since the last call, then reset: out (host, or
 * NULL) gets one row of E + 1 doubles per sparse layer of the stage, in
 * order: its global layer index, then each expert's routed choices;
 * returns n_moe (0: no routed experts). Under TP every TP rank counts every
 * row (the router is replicated); data-parallel ranks count their own. */
int model_moe_load_take(model_t *m, double *out);
/* The choices the capacity dropped in the training forwards since the last
 * call (m->moe_dropped_train), reset to 0; -1 for a dropless model (no
 * capacity_factor). */
int64_t model_moe_dropped_take(model_t *m);

/* Auxiliary-loss-free balancing (model_moe_config_t.bias_rate > 0; else
 * nothing): every sparse layer's selection bias moves by rate * sign(mean -
 * tokens) per expert, from load (rows as model_moe_load_take writes them,
 * summed over every replica of the step: the same on every rank). */
bt_status_t model_moe_balance(model_t *m, const double *load);
/* The selection biases (f32 [E] on the device, one per sparse layer of the
 * stage, in order) as views and names ("<router>.selection_bias") for
 * checkpoints; returns how many (0 without bias balancing). Either array
 * may be NULL. */
int model_moe_bias_views(const model_t *m, tensor_t *views, char (*names)[MODEL_NAME_MAX]);

/* ---- tensor-parallel gathering (collective over m->par.tp_comm) --------- */

/* full[global numel] (host f32) = the HF-shaped tensor of parameter i (grad:
 * its gradient) assembled from every TP rank (an expert tensor: from every
 * EP rank, over ep_comm). Every rank of that group must call it with the
 * same i, in the same order; each gets the whole tensor. */
bt_status_t model_param_gather(const model_t *m, int i, bool grad, float *full);
/* Every parameter (grads: gradients, which `full` must have allocated) into
 * `full`, a tp_size-1 model of the same config and stage, matched by name.
 * Collective; full may be NULL on ranks that do not need the result. */
bt_status_t model_tp_gather(const model_t *m, bool grads, model_t *full);

/* ---- memory -------------------------------------------------------------- */

/* What one model instance allocates, in bytes, computed from the config
 * alone (nothing is allocated; doubles, so that an absurd config gives an
 * absurd number instead of a wrapped one). The launcher adds these up per
 * process to refuse a job that cannot fit before it starts (launch/mem.h). */
typedef struct {
    double params;       /* model_create_tp's parameter block; model_grads_alloc's
                            gradient block is the same size */
    double vocab_params; /* of params: the vocabulary-sized tensors (embedding, lm_head) */
    double expert_params; /* of params: the routed experts' stacked tensors (E / ep_size
                             experts of each sparse layer under expert parallelism) */
    double acts;         /* one model_acts_create(B, T) arena (0 when B or T is 0) */
    double acts_scratch; /* of acts: the scratch region its sublayers share (the largest
                            sublayer's, 64-byte aligned) */
    int    n_shared;     /* of acts: each kind's state shared by its sublayers (RoPE tables) */
    const model_kind_t *shared_kind[8];
    double acts_shared[8];
    double acts_fwd;     /* one model_acts_create_fwd(B, T) arena (0 likewise) */
    double acts_decode;  /* one model_acts_create_decode(T) arena (0 likewise) */
    double largest;      /* the largest whole tensor of the stage in f32 (what gathering
                            one for an export holds) */
} model_mem_t;

/* For `stage` (NULL: the whole model) of TP rank tp_rank of tp_size, with an
 * activation arena of B rows of T tokens, on the host in f32. Exact for
 * params (view alignment included) and acts: both are computed by the code
 * that allocates them (tests/test_model_api.c compares them with what
 * model_create_tp and model_acts_create allocate). */
void model_mem_estimate(const model_config_t *cfg, const model_stage_t *stage, int tp_rank,
                        int tp_size, int64_t B, int64_t T, model_mem_t *out);
/* The same for the place par gives (its tp_rank, tp_size, ep_rank and
 * ep_size; the communicators unused): under expert parallelism the rank's
 * experts only, and the arena sized for the rows its experts may receive. */
void model_mem_estimate_par(const model_config_t *cfg, const model_stage_t *stage,
                            const model_parallel_t *par, int64_t B, int64_t T, model_mem_t *out);


/* ---- running ------------------------------------------------------------- */

/* Activation arena for up to B rows of T tokens for m's stage, on m's
 * device. Fails with a clear error when T exceeds a sliding window. */
bt_status_t model_acts_create(model_t *m, int64_t B, int64_t T, model_acts_t **out);
/* The same for forward passes only (evaluation, generation): it keeps one
 * sublayer's state at a time, so its size does not grow with the layers
 * (SmolLM2-135M, 511 tokens: 1063 MB peak resident with the training arena,
 * see bench/RESULTS.md). A forward with dloss > 0 on it is an error. */
bt_status_t model_acts_create_fwd(model_t *m, int64_t B, int64_t T, model_acts_t **out);
/* A forward-only arena for decoding one sequence of up to T positions: it
 * also keeps each sublayer's cache (attention: K and V of every position
 * seen), so a forward of the next tokens (B = 1; positions continuing the
 * earlier ones, batch->pos) computes only them. The first forward on it
 * must start at position 0. */
bt_status_t model_acts_create_decode(model_t *m, int64_t T, model_acts_t **out);
void        model_acts_destroy(model_acts_t *a);
/* Views of the arena, on m's device, for a batch of B x T:
 *  x_in   [B,T,C] the stage's input hidden states (no embedding): fill before forward;
 *  x_out  [B,T,C] its output (no head): valid after forward;
 *  dx_out [B,T,C] the gradient of x_out (no head): fill before backward;
 *  dx_in  [B,T,C] the gradient of x_in (no embedding): valid after backward. */
tensor_t    model_acts_x_in(model_acts_t *a, int64_t B, int64_t T);
tensor_t    model_acts_x_out(model_acts_t *a);
tensor_t    model_acts_dx_out(model_acts_t *a);
tensor_t    model_acts_dx_in(model_acts_t *a);

/* The router's load-balancing loss across pipeline stages (model/moe.c,
 * docs/PARALLEL.md): it pools every sparse layer of the model, so each
 * stage hands the next the sums so far with the activation, and the
 * stage with the head hands the global gradient per expert back with the
 * activation gradient. model_aux_len(m, false) doubles travel forward
 * (per expert top-k counts, per expert probability sums, rows, scored
 * positions), model_aux_len(m, true) backward (per expert); 0: the model
 * has no such term and nothing travels. model_acts_aux(a, false) is read
 * by a forward of a stage without the embedding (fill it with what the
 * previous stage sent) and holds the sums to send on after every forward;
 * model_acts_aux(a, true) is written by the forward of the stage with the
 * head and read by every backward (fill it with what the next stage sent
 * on a stage without the head; it is what to send on). */
int64_t     model_aux_len(const model_t *m, bool grad);
double     *model_acts_aux(model_acts_t *a, bool grad);

/* Forward of m's stage on one microbatch; loss is filled when the stage has
 * a head (else NULL). dloss: per-scored-position weight of the loss
 * gradient; 0 = no backward. With dloss > 0 and a head, lm_head/final-norm
 * gradients are accumulated here already (see top of file). */
bt_status_t model_stage_forward(model_t *m, model_acts_t *a, const model_batch_t *batch,
                                float dloss, model_loss_t *loss);
/* Backward of the last forward run on `a` (which must have had dloss > 0):
 * reads dx_out (no head), writes dx_in (no embedding); parameter gradients
 * accumulate into m->grads. */
bt_status_t model_stage_backward(model_t *m, model_acts_t *a);

/* The same with host buffers (activation dtype, [B,T,C]) for the stage's
 * input and output: x_in is uploaded before the forward (no embedding),
 * x_out downloaded after it (no head), dx_out uploaded before the backward,
 * dx_in downloaded after it; each returns once the host buffers are done. */
bt_status_t model_stage_forward_io(model_t *m, model_acts_t *a, const model_batch_t *batch,
                                   const void *x_in, float dloss, void *x_out,
                                   model_loss_t *loss);
bt_status_t model_stage_backward_io(model_t *m, model_acts_t *a, const void *dx_out,
                                    void *dx_in);

/* The same with each end chosen: host memory as above, or a tensor on m's
 * device (in the activation dtype, [B,T,C]; e.g. a pipeline neighbour's
 * memory mapped into this process, train/handoff.h), copied on the device.
 * Either way the end is done when the call returns. */
typedef struct {
    void           *host; /* host memory, or NULL */
    const tensor_t *dev;  /* else a device tensor */
    bool            keep; /* else (an output): left in the arena (model_acts_x_out /
                           * dx_in) for the caller to copy when it likes */
} model_io_t;
#define MODEL_IO_HOST(p) ((model_io_t){.host = (void *)(p)})
#define MODEL_IO_DEV(t)  ((model_io_t){.dev = (t)})
#define MODEL_IO_KEEP    ((model_io_t){.keep = true})
bt_status_t model_stage_forward_at(model_t *m, model_acts_t *a, const model_batch_t *batch,
                                   model_io_t x_in, float dloss, model_io_t x_out,
                                   model_loss_t *loss);
bt_status_t model_stage_backward_at(model_t *m, model_acts_t *a, model_io_t dx_out,
                                    model_io_t dx_in);

/* Whole-model convenience: forward (+ backward when dloss > 0) of a full
 * model (stage with embedding and head). */
bt_status_t model_forward_backward(model_t *m, model_acts_t *a, const model_batch_t *batch,
                                   float dloss, model_loss_t *loss);

/* targets[b*T+t] = ids[b*T+t+1] for t+1 < len[b], else -100 (labels = input
 * ids, shifted as transformers does, padding ignored). len NULL: all T. */
void    model_targets_from_ids(int32_t *targets, const int32_t *ids, const int64_t *len,
                               int64_t B, int64_t T);
int64_t model_count_scored(const int32_t *targets, int64_t n);

/* Number of parameters of the full model described by cfg (FLOPs per token
 * for MFU: model/flops.h). */
int64_t model_num_params(const model_config_t *cfg);
#endif
