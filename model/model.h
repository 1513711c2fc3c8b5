/* Decoder-only transformer of the Llama family (LlamaForCausalLM,
 * MistralForCausalLM, Qwen2ForCausalLM) with hand-written forward and
 * backward over kernels/kernels.h (llm.c style).
 *
 * Layout contract (STYLE.md rule 9):
 *  - All parameters a model instance holds live in ONE f32 allocation
 *    (model->param_mem) carved into named views model->params[i]; the names
 *    are exactly the Hugging Face tensor names ("model.embed_tokens.weight",
 *    "model.layers.3.self_attn.q_proj.weight", "lm_head.weight", ...), so
 *    import, export and sharding are driven by name.
 *  - Gradients live in a second allocation (model->grad_mem) carved the same
 *    way: model->grads[i] is the gradient of model->params[i], at the same
 *    element offset (grad_mem + (params[i].data - param_mem)). Backward
 *    ACCUMULATES into it; model_grads_zero() clears it.
 *  - A model instance may hold only a pipeline stage: layers [first, last)
 *    plus, optionally, the embedding (first stage) and the final norm and head
 *    (last stage). Layer tensors keep their GLOBAL layer index in their names.
 *    With tied embeddings a head stage without the embedding holds its own
 *    copy named "model.embed_tokens.weight" (the distributed code sums the two
 *    gradients, between the stages' ranks of the same TP rank: both hold the
 *    same vocabulary slice); a stage with both uses the one view for both.
 *
 * Running a batch: a batch is B rows of T tokens; rows shorter than T are
 * right-padded (any valid id) with target -100, which is exact because
 * attention is causal and padded positions are never scored. Targets follow
 * transformers' convention for labels = input ids: targets[t] = ids[t+1],
 * the last position of each sequence -100 (model_targets_from_ids).
 *
 *   model_acts_t *a;  model_acts_create(m, B, T, &a);
 *   model_stage_forward(m, a, &batch, x_in, dloss, x_out, &loss);
 *   model_stage_backward(m, a, dx_out, dx_in);
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
 * the rank holds Hq/tp query heads and Hkv/tp kv heads (whole GQA groups),
 * F/tp of the MLP and a near-even slice [vocab_start, vocab_start + vocab)
 * of the vocabulary. Parameter names stay the HF names; each view records
 * how it slices the HF tensor (model_param_t.shard_dim/shard_offset/
 * full_shape), which is all ckpt/ needs to import or gather by name.
 * Forward and backward issue their TP all-reduces on the calling thread
 * (blocking, actors/coll.h): every TP rank of a stage must run the same
 * calls on the same batch, x_in and dx_out; x_out, dx_in and the loss come
 * out identical on every TP rank.
 */
#ifndef BT_MODEL_MODEL_H
#define BT_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "kernels/tensor.h"

#define MODEL_IGNORE_INDEX (-100)
/* Config bounds (model_config_validate): far above real models, low enough
 * that no shape product overflows. vocab_size <= INT32_MAX, layers < 100000. */
#define MODEL_MAX_HIDDEN   (1 << 20)
#define MODEL_MAX_FFN      (1 << 22)
#define MODEL_MAX_HEADS    (1 << 16)
#define MODEL_MAX_HEAD_DIM (1 << 16)
#define MODEL_NAME_MAX 96

typedef enum {
    MODEL_ARCH_LLAMA = 0,
    MODEL_ARCH_MISTRAL,
    MODEL_ARCH_QWEN2,
    MODEL_ARCH_COUNT,
} model_arch_t;

typedef enum {
    MODEL_ROPE_DEFAULT = 0, /* plain RoPE with rope_theta */
    MODEL_ROPE_LINEAR,      /* positions divided by factor */
    MODEL_ROPE_LLAMA3,      /* Llama 3.1 frequency-dependent scaling */
    MODEL_ROPE_COUNT,
} model_rope_kind_t;

typedef struct {
    model_rope_kind_t kind;
    double theta;
    double factor;                /* linear, llama3 */
    double low_freq_factor;       /* llama3 */
    double high_freq_factor;      /* llama3 */
    int64_t original_max_position; /* llama3: original_max_position_embeddings */
} model_rope_t;

/* Everything the model needs from a Hugging Face config.json
 * (ckpt/hf.c fills it from config.json and rejects what we do not implement). */
typedef struct {
    model_arch_t arch;
    int64_t vocab_size;
    int64_t hidden_size;        /* C */
    int64_t intermediate_size;  /* F */
    int64_t num_layers;
    int64_t num_heads;          /* Hq */
    int64_t num_kv_heads;       /* Hkv, Hq % Hkv == 0 */
    int64_t head_dim;           /* D (may differ from C / Hq) */
    int64_t max_position_embeddings;
    int64_t sliding_window;     /* 0: none; else sequences longer are rejected */
    double rms_norm_eps;
    model_rope_t rope;
    bool tie_word_embeddings;
    bool qkv_bias;              /* q/k/v_proj have a bias (Qwen2, Llama attention_bias) */
    bool o_bias;                /* o_proj has a bias (Llama attention_bias) */
    bool mlp_bias;              /* gate/up/down_proj have a bias (Llama mlp_bias) */
} model_config_t;

/* Which part of the network a model instance holds and runs. */
typedef struct {
    int first_layer, last_layer; /* layers [first_layer, last_layer) */
    bool has_embedding;          /* input is token ids (else hidden states [B,T,C]) */
    bool has_head;               /* final norm + lm_head + loss (else output hidden) */
} model_stage_t;

/* How a parameter is split over the tensor-parallel group. */
typedef enum {
    MODEL_SHARD_NONE = -1, /* replicated: every TP rank holds the whole tensor */
    MODEL_SHARD_ROWS = 0,  /* split along dim 0 (column-parallel weights, their biases, vocab) */
    MODEL_SHARD_COLS = 1,  /* split along dim 1 (row-parallel weights: o_proj, down_proj) */
} model_shard_dim_t;

typedef struct {
    char     name[MODEL_NAME_MAX]; /* HF tensor name */
    tensor_t t;                    /* f32 view into param_mem (or grad_mem) */
    /* The view is the HF tensor of shape full_shape[0..t.ndim) narrowed along
     * shard_dim to [shard_offset, shard_offset + t.shape[shard_dim]). The
     * split dim is recorded even at tp_size 1 (offset 0, whole extent).
     * Replicated parameters (norm weights, o_proj/down_proj biases) get
     * bit-identical gradients on every TP rank after backward: the gradient
     * norm must count them once (model_grads_sumsq_unique). */
    model_shard_dim_t shard_dim;
    int64_t  shard_offset;
    int64_t  full_shape[2];
} model_param_t;

typedef struct coll_comm coll_comm_t; /* actors/coll.h */

/* Where a model instance sits in a tensor-parallel group. */
typedef struct {
    int          tp_rank, tp_size; /* {0, 1}: no tensor parallelism */
    coll_comm_t *tp_comm;          /* the TP group (rank tp_rank of tp_size); NULL at tp_size 1 */
} model_parallel_t;

/* Indices into model->params of one layer's tensors; -1 when absent. */
typedef struct {
    int input_norm, q, k, v, o, q_bias, k_bias, v_bias, o_bias;
    int post_norm, gate, up, down, gate_bias, up_bias, down_bias;
} model_layer_ix_t;

typedef struct model {
    model_config_t cfg;
    model_stage_t  stage;
    float         *param_mem;  /* n_elems floats, all parameters */
    float         *grad_mem;   /* n_elems floats or NULL (model_grads_alloc) */
    size_t         n_elems;
    int            n_params;
    model_param_t *params;     /* [n_params] views into param_mem */
    model_param_t *grads;      /* [n_params] same names, views into grad_mem */
    model_layer_ix_t *layers;  /* [last_layer - first_layer] */
    int            embed, final_norm, lm_head; /* indices; -1 when absent */
    model_parallel_t par;
    /* This TP rank's share (the whole model's values at tp_size 1). */
    int64_t        n_heads, n_kv_heads;  /* Hq/tp, Hkv/tp */
    int64_t        ffn;                  /* F/tp */
    int64_t        vocab, vocab_start;   /* vocabulary rows [vocab_start, vocab_start+vocab) */
} model_t;

/* Per-microbatch activations and scratch, sized for B x T (opaque). */
typedef struct model_acts model_acts_t;

typedef struct {
    int64_t B, T;              /* rows, tokens per row (T <= acts' T) */
    const int32_t *ids;        /* [B*T] token ids; needed when stage has_embedding */
    const int32_t *targets;    /* [B*T] next-token targets or -100; needed when has_head */
    const int32_t *pos;        /* [B*T] positions, or NULL for 0..T-1 in every row */
    float *logits_out;         /* optional [B*T, vocab] copy of the logits (head stage) */
} model_batch_t;

typedef struct {
    double  loss_sum;   /* sum of per-position NLL (nats) over scored positions */
    int64_t n_scored;   /* number of scored positions (targets != -100) */
} model_loss_t;

/* ---- lifetime ------------------------------------------------------------ */

/* Validates cfg (clear error naming the field) and allocates a zeroed
 * parameter block for `stage` (NULL: the whole model). Same as
 * model_create_tp with par NULL. */
bt_status_t model_create(const model_config_t *cfg, const model_stage_t *stage, model_t **out);
/* One tensor-parallel rank's share of `stage` (par NULL: no TP). cfg is the
 * whole model's config. Fails with an error naming the field when tp_size
 * does not divide num_attention_heads, num_key_value_heads or
 * intermediate_size, exceeds vocab_size, or when tp_comm does not match
 * (tp_rank, tp_size). The model keeps par->tp_comm (not owned). */
bt_status_t model_create_tp(const model_config_t *cfg, const model_stage_t *stage,
                            const model_parallel_t *par, model_t **out);
bt_status_t model_parallel_validate(const model_config_t *cfg, const model_parallel_t *par);
/* The part [*start, *start + *count) of `extent` that TP rank tp_rank holds:
 * near-even, the first extent % tp_size ranks one more (only the vocabulary
 * can be uneven; heads and the MLP divide exactly). */
void model_tp_split(int64_t extent, int tp_size, int tp_rank, int64_t *start, int64_t *count);
void        model_destroy(model_t *m);
bt_status_t model_config_validate(const model_config_t *cfg);
/* The full-model stage of cfg. */
model_stage_t model_stage_full(const model_config_t *cfg);

/* Initialization for training from scratch: N(0, std) for matrices and the
 * embedding, 1 for norm weights, 0 for biases; deterministic in seed. */
void model_init_random(model_t *m, uint64_t seed, float std);

/* The parameter layout of `stage` of cfg (NULL: whole model), in HF order:
 * fills out[i].name and out[i].t's shape (data NULL) when out is non-NULL and
 * returns the count. ckpt/ uses it with the whole model to know every valid
 * tensor name. */
int model_layout(const model_config_t *cfg, const model_stage_t *stage, model_param_t *out);
/* The same for one TP rank (par NULL: no TP): local shapes plus the shard
 * fields. */
int model_layout_tp(const model_config_t *cfg, const model_stage_t *stage,
                    const model_parallel_t *par, model_param_t *out);

/* Index of the parameter named `name`, or -1. */
int model_param_find(const model_t *m, const char *name);

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

/* ---- tensor-parallel gathering (collective over m->par.tp_comm) --------- */

/* full[numel of full_shape] = the HF-shaped tensor of parameter i (grad:
 * its gradient) assembled from every TP rank. Every TP rank must call it
 * with the same i, in the same order; each gets the whole tensor. */
bt_status_t model_param_gather(const model_t *m, int i, bool grad, float *full);
/* Every parameter (grads: gradients, which `full` must have allocated) into
 * `full`, a tp_size-1 model of the same config and stage, matched by name.
 * Collective; full may be NULL on ranks that do not need the result. Use:
 * gather, then ckpt_hf_save(full) on one rank. */
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
    double acts;         /* one model_acts_create(B, T) arena (0 when B or T is 0) */
} model_mem_t;

/* For `stage` (NULL: the whole model) of TP rank tp_rank of tp_size, with an
 * activation arena of B rows of T tokens. Exact for params (view alignment
 * included) and acts (tests/test_model_api.c compares them with what
 * model_create_tp and model_acts_create allocate). */
void model_mem_estimate(const model_config_t *cfg, const model_stage_t *stage, int tp_rank,
                        int tp_size, int64_t B, int64_t T, model_mem_t *out);

/* The shapes an activation arena depends on (one TP share of a stage). */
typedef struct {
    int64_t C, F, Hq, Hkv, D, V; /* hidden, MLP, heads, kv heads, head dim, vocab rows (this rank's) */
    int     layers;              /* layers of the stage */
    bool    head;                /* the stage has the final norm and lm_head */
} model_acts_dims_t;
double model_acts_bytes(const model_acts_dims_t *d, int64_t B, int64_t T);

/* ---- running ------------------------------------------------------------- */

/* Activation arena for up to B rows of T tokens for m's stage. Fails with a
 * clear error when T exceeds a Mistral/Qwen2 sliding window. */
bt_status_t model_acts_create(model_t *m, int64_t B, int64_t T, model_acts_t **out);
void        model_acts_destroy(model_acts_t *a);

/* Forward of m's stage on one microbatch.
 *  x_in  [B,T,C]: input hidden states when the stage has no embedding (else NULL)
 *  x_out [B,T,C]: output hidden states when the stage has no head (else NULL)
 *  loss: filled when the stage has a head (else NULL)
 *  dloss: per-scored-position weight of the loss gradient; 0 = no backward.
 * With dloss > 0 and a head, lm_head/final-norm gradients are accumulated
 * here already (see top of file). */
bt_status_t model_stage_forward(model_t *m, model_acts_t *a, const model_batch_t *batch,
                                const float *x_in, float dloss, float *x_out,
                                model_loss_t *loss);

/* Backward of the last forward run on `a` (which must have had dloss > 0).
 *  dx_out [B,T,C]: gradient w.r.t. x_out when the stage has no head (else NULL)
 *  dx_in  [B,T,C]: OVERWRITTEN with the gradient w.r.t. x_in when the stage
 *                  has no embedding (else NULL)
 * Parameter gradients accumulate into m->grads. */
bt_status_t model_stage_backward(model_t *m, model_acts_t *a, const float *dx_out, float *dx_in);

/* Whole-model convenience: forward (+ backward when dloss > 0) of a full
 * model (stage with embedding and head). */
bt_status_t model_forward_backward(model_t *m, model_acts_t *a, const model_batch_t *batch,
                                   float dloss, model_loss_t *loss);

/* targets[b*T+t] = ids[b*T+t+1] for t+1 < len[b], else -100 (labels = input
 * ids, shifted as transformers does, padding ignored). len NULL: all T. */
void    model_targets_from_ids(int32_t *targets, const int32_t *ids, const int64_t *len,
                               int64_t B, int64_t T);
int64_t model_count_scored(const int32_t *targets, int64_t n);

/* FLOPs of one forward+backward per token (6N + attention), for MFU. */
double model_flops_per_token(const model_config_t *cfg, int64_t T);
/* Number of parameters of the full model described by cfg. */
int64_t model_num_params(const model_config_t *cfg);

const char *model_arch_name(model_arch_t arch); /* "LlamaForCausalLM", ... */

#endif
