/* Block kinds: what a mixer or a feed-forward kind implements, and the
 * services the model gives it (model/model.c, model/run.c, model/tp.c).
 *
 * A sublayer of kind K in layer l computes, on the residual stream x,
 *     ln = rmsnorm(x; norm weight)       (generic, run.c)
 *     y  = K.forward(ln)                 (the kind)
 *     x' = x + y                         (generic)
 * and backward gets dy = d x' (the residual gradient), returns d ln; the
 * generic part adds the norm's backward into the residual gradient. So a
 * kind sees only its own input and output, whole ([N, C] on every TP rank),
 * and owns everything in between: its tensors and their names under the
 * prefix the architecture gives, their TP split, what it keeps for
 * backward, its scratch, and its collectives (a row-parallel output or a
 * column-parallel input gradient is the kind's to reduce).
 *
 * Adding a kind: a file with a const model_kind_t, an entry in its enum
 * (model/config.h), a sub-config there if it has one, its row in the kind
 * tables (model/config.c), the prefix its architectures put it under
 * (model/arch.c) and the config reader that sets it per layer (ckpt/hf.c).
 * No other kind changes.
 */
#ifndef BT_MODEL_KIND_H
#define BT_MODEL_KIND_H

#include "kernels/kernels.h"
#include "model/flops.h"
#include "model/model.h"

/* Layout under construction: kinds append their tensors. */
typedef struct {
    model_param_t *out; /* NULL: count only */
    int            n;
    int            tp_rank, tp_size;
    int            ep_rank, ep_size; /* the expert split (model_layout_add_experts) */
} model_layout_t;

/* Appends the HF tensor `name` of global shape [d0] (ndim 1) or [d0, d1],
 * split over the TP group along split_dim in whole runs of `unit` elements
 * (split_dim -1: replicated, whole on every rank); returns its index. */
int model_layout_add(model_layout_t *lb, const char *name, int ndim, int64_t d0, int64_t d1,
                     int split_dim, int64_t unit);
/* The same for any shape[ndim] (ndim <= SHARD_MAX_DIMS): a stacked tensor
 * (model.h, MODEL_STACK_MARK) of routed experts is [E, rows, cols]. */
int model_layout_add_nd(model_layout_t *lb, const char *name, int ndim, const int64_t *shape,
                        int split_dim, int64_t unit);

/* Marks tensor ix (an index model_layout_add* returned) as kept in f32
 * under any compute dtype (model_param_t keep_f32). */
void model_layout_keep_f32(model_layout_t *lb, int ix);
/* out[cap] = "<own>.<what>", or with fused set "<fused>.<what>#<part>" (row
 * part `part` of the architecture's fused tensor, model.h MODEL_PART_MARK):
 * the suffix of a projection's tensor that some architectures fuse
 * (Phi-3's qkv_proj, gate_up_proj); what is "weight" or "bias". */
void model_layout_proj_name(char *out, size_t cap, const char *fused, int part, const char *own,
                            const char *what);

/* Marks tensor ix (replicated: split_dim -1) as one whose gradient each TP
 * rank computes only its share of (model_param_t grad_tp_partial). */
void model_layout_grad_tp_partial(model_layout_t *lb, int ix);

/* A stacked expert tensor (MODEL_STACK_MARK) of global shape[ndim], split
 * along dimension 0 over the EP group (group SHARD_GROUP_EP even at
 * ep_size 1, which marks it as an expert's: MODEL_PARAM_IS_EXPERT). */
int model_layout_add_experts(model_layout_t *lb, const char *name, int ndim,
                             const int64_t *shape);

/* What a kind's forward and backward run with. */
typedef struct {
    model_t       *m;
    kern_stream_t *s;           /* m->stream */
    int64_t        B, T, N;     /* this microbatch; N = B*T */
    int64_t        T_cap;       /* the arena's T: rows of per-position tables */
    int64_t        N_cap;       /* the arena's B*T: the most rows any microbatch has */
    const tensor_t *pos;        /* [N] i32 positions */
    const tensor_t *ones;       /* [N, 1] of 1 in the activation dtype (bias after a reduction) */
    void          *shared;      /* this kind's per-arena state (shared_init), or NULL */
    void          *scratch;     /* scratch_bytes, shared by every sublayer */
    /* Decoding (model_acts_create_decode; B = 1): this sublayer's cache of
     * cache_bytes, holding what earlier positions left there, and the
     * position of this batch's first token (its positions are pos0 ..
     * pos0 + T - 1). NULL / 0 otherwise. */
    void          *cache;
    int64_t        pos0;
    bool           training;    /* a forward with a backward to follow (dloss > 0) */
    /* Sequence parallelism (model_parallel_t.sp, on in this arena): ln and dy
     * come in whole [N, C], gathered over the TP group; of y and dln only
     * this TP rank's rows (model_sp_rows) need be right on return, which
     * model_row_parallel_fwd and model_tp_input_sum give. */
    bool           sp;
} model_run_t;

struct model_kind {
    const char *name; /* "attention", "mlp" */
    /* Checks the kind's sub-config and that tp_size divides what it splits,
     * naming the config field. */
    bt_status_t (*validate)(const model_config_t *c, int tp_size);
    /* Appends the sublayer's tensors (names "<prefix>.<tensor>"), filling
     * sub->ix with their indices (-1 for absent optional ones). */
    void (*layout)(model_layout_t *lb, const model_config_t *c, const char *prefix,
                   model_sub_t *sub);
    /* Bytes one microbatch of B x T keeps between forward and backward, and
     * the scratch its forward/backward needs (shared by all sublayers): in
     * doubles, so that an absurd shape gives an absurd size instead of a
     * wrapped one (the arena refuses what cannot be allocated). */
    double (*saved_bytes)(const model_t *m, int64_t B, int64_t T);
    double (*scratch_bytes)(const model_t *m, int64_t B, int64_t T);
    /* State shared by every sublayer of this kind in one arena (e.g. RoPE
     * tables): its size, and filling it once (NULL when none). Fails when T
     * is not supported (a sliding window shorter than T). */
    double (*shared_bytes)(const model_t *m, int64_t T);
    bt_status_t (*shared_init)(const model_t *m, int64_t T, void *shared);
    /* Bytes a sublayer keeps across forward calls while decoding one
     * sequence of up to T positions (attention: K and V); NULL when the kind
     * needs none (it then computes each token from its input alone). */
    double (*cache_bytes)(const model_t *m, int64_t T);
    /* y[N, C] (overwritten) from ln[N, C]; saved is this sublayer's region. */
    bt_status_t (*forward)(model_run_t *r, const model_sub_t *sub, void *saved, const tensor_t *ln,
                           tensor_t *y);
    /* dln[N, C] (overwritten) from dy[N, C]; parameter gradients accumulate. */
    bt_status_t (*backward)(model_run_t *r, const model_sub_t *sub, void *saved,
                            const tensor_t *ln, const tensor_t *dy, tensor_t *dln);
    /* What a token costs this sublayer, for MFU (model/flops.h): adds to
     * f->matmul_params the weights that multiply every token and to
     * f->attn_fma its forward multiply-adds per token between activations
     * (attention: the causal scores and values at sequence length T). The
     * routed experts (model/moe.c) add their active parameters only: the
     * router's and top_k experts' weights (and a shared expert's), not
     * every expert's. */
    void (*flops)(const model_config_t *c, int64_t T, model_flops_t *f);
    const kern_op_t *ops; /* kernel ops it calls, checked with kern_supports */
    int              n_ops;
};

extern const model_kind_t model_kind_attention;
extern const model_kind_t model_kind_mla;
extern const model_kind_t model_kind_mlp;
extern const model_kind_t model_kind_moe;

/* The router's load-balancing loss (model/moe.c), the one loss term that
 * spans stages and CP ranks; shared is the moe kind's state in the arena
 * (r->shared; NULL on a stage without sparse layers). aux_begin runs before
 * the stage's first sublayer (the layers' sums start over); aux_end after
 * the last: carry[model_aux_len(m, false)] holds the sums of the stages
 * before (ignored on the first) and gets this stage's added; on the stage
 * with the head *value = the term of this forward, its coefficient
 * applied, and grad[model_aux_len(m, true)] its gradient per expert for a
 * backward whose loss weight is dloss per scored position (scored: this
 * rank's). aux_grad hands that gradient to this stage's routers before its
 * backward. The caller adds value times this rank's scored positions to
 * the loss sum (model_loss_t.aux_sum), so that a mean over positions gets
 * the term once per forward, weighted by its positions, as transformers'
 * per-sequence loss = cross-entropy + coefficient * term pools. */
bt_status_t model_moe_aux_begin(model_run_t *r);
bt_status_t model_moe_aux_end(model_run_t *r, double *carry, double *grad, float dloss,
                              int64_t scored, double *value);
bt_status_t model_moe_aux_grad(model_run_t *r, const double *grad);
extern const model_kind_t model_kind_mamba2;

/* The kind of a mixer / feed-forward enum value (NULL for NONE). */
const model_kind_t *model_mixer_kind(unsigned k);
const model_kind_t *model_ffn_kind(unsigned k);
/* Every kind the layers of c use checks its sub-config at tp_size. */
bt_status_t model_config_kinds_validate(const model_config_t *c, int tp_size);

/* ---- services for kinds ---------------------------------------------------- */

/* A view of `bytes` at byte offset off of region base (kinds carve their
 * saved and scratch regions with it), in the activation dtype. */
tensor_t model_act_view(const model_t *m, void *base, size_t off, int ndim, const int64_t *shape);
/* The parameter (or its gradient) in slot `slot` of sub; NULL when absent. */
const tensor_t *model_sub_param(const model_t *m, const model_sub_t *sub, int slot);
tensor_t       *model_sub_grad(model_t *m, const model_sub_t *sub, int slot);

/* t reduced (sum) in place over the TP group; nothing without TP. Memory
 * the collective cannot take is staged through host memory. `what` and
 * `layer` (-1: none) name the tensor in the error. */
bt_status_t model_tp_sum(model_t *m, tensor_t *t, const char *what, int layer);
/* The input gradient dln[N, C] of a sublayer whose column-parallel products
 * each TP rank ran on its heads or columns: summed over the TP group (an
 * all-reduce), or under sequence parallelism reduce-scattered, leaving this
 * rank's rows of the sum. */
bt_status_t model_tp_input_sum(model_run_t *r, tensor_t *dln, const char *what, int layer);
/* Sequence parallelism: this TP rank's rows [*r0, *r0 + *n) of N (near-even,
 * the first N % tp ranks one more; all of them without TP). */
void model_sp_rows(const model_t *m, int64_t N, int64_t *r0, int64_t *n);
/* t[N, cols]: every TP rank's rows gathered into place (an all-gather). */
bt_status_t model_sp_gather(model_t *m, tensor_t *t, const char *what, int layer);
/* The same from mine[n, cols] (this rank's rows, kept elsewhere). */
bt_status_t model_sp_gather_from(model_t *m, tensor_t *t, const tensor_t *mine, const char *what,
                                 int layer);
/* t[N, cols] summed over the TP group into this rank's rows (a
 * reduce-scatter; the other rows are left as they were). */
bt_status_t model_sp_scatter_sum(model_t *m, tensor_t *t, const char *what, int layer);
/* Row-parallel linear: out[N, OC] = sum over TP ranks of x_r w_r^T, then the
 * replicated bias added once after the sum. Under sequence parallelism
 * (r->sp) a reduce-scatter instead: only this rank's rows of out are the
 * sum (and get the bias). */
bt_status_t model_row_parallel_fwd(model_run_t *r, tensor_t *out, const tensor_t *x,
                                   const tensor_t *w, const tensor_t *bias, const char *what,
                                   int layer);

/* The decode cache of an attention kind (model_kind_t.cache_bytes): K rows
 * of k_row elements for T positions, then (64-byte aligned) V rows of v_row
 * elements; K and V keep their own widths (MLA: H x (qk_nope + qk_rope) and
 * H x v_head_dim). */
double model_kv_cache_bytes(const model_t *m, int64_t T, int64_t k_row, int64_t v_row);
/* Appends this batch's k [T, H*Dk] and v [T, H*Dv] (B = 1, positions pos0 ..
 * pos0 + T - 1) to r->cache, laid out as model_kv_cache_bytes counts for
 * r->T_cap positions, and views the first pos0 + T positions as k4 [1, Tk,
 * H, Dk] and v4 [1, Tk, H, Dv]. */
void model_kv_cache_append(model_run_t *r, const tensor_t *k, const tensor_t *v, int64_t H,
                           int64_t Dk, int64_t Dv, tensor_t *k4, tensor_t *v4);

/* Bytes rounded up so that carved views start on 64-byte boundaries. */
static inline size_t model_align(size_t n) { return (n + 63) / 64 * 64; }
static inline double model_align_d(double n) { return __builtin_ceil(n / 64) * 64; }

#endif
