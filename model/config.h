/* What a model is, as read from a Hugging Face config.json (ckpt/hf.c) or a
 * GGUF file: the common dimensions, one sub-config per block kind, and the
 * kind of every layer's two sublayers.
 *
 * A layer is a mixer (attention today; MLA and Mamba2 join as kinds) and a
 * feed-forward (dense gated MLP today; routed experts join as a kind), each
 * a pre-norm residual sublayer; either may be absent, so that a hybrid stack
 * where every layer is a single mixer or a single feed-forward (NemotronH's
 * per-layer pattern) is a list of blocks like any other. The architecture
 * (model/arch.c) names the tensors. */
#ifndef BT_MODEL_CONFIG_H
#define BT_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

#define MODEL_MAX_LAYERS 1024
/* Config bounds (model_config_validate): far above real models, low enough
 * that no shape product overflows. vocab_size <= INT32_MAX, layers <= MODEL_MAX_LAYERS. */
#define MODEL_MAX_HIDDEN   (1 << 20)
#define MODEL_MAX_FFN      (1 << 22)
#define MODEL_MAX_HEADS    (1 << 16)
#define MODEL_MAX_HEAD_DIM (1 << 16)

typedef enum {
    MODEL_ARCH_LLAMA = 0,
    MODEL_ARCH_MISTRAL,
    MODEL_ARCH_QWEN2,
    MODEL_ARCH_COUNT,
} model_arch_t;

typedef enum {
    MODEL_MIXER_NONE = 0,
    MODEL_MIXER_ATTENTION, /* grouped-query attention with RoPE (model/attention.c) */
    MODEL_MIXER_COUNT,
} model_mixer_kind_t;

typedef enum {
    MODEL_FFN_NONE = 0,
    MODEL_FFN_DENSE, /* gated MLP: down(act(gate(x)) * up(x)) (model/mlp.c) */
    MODEL_FFN_COUNT,
} model_ffn_kind_t;

typedef struct {
    uint8_t mixer; /* model_mixer_kind_t */
    uint8_t ffn;   /* model_ffn_kind_t */
} model_block_t;

typedef enum {
    MODEL_ROPE_DEFAULT = 0, /* plain RoPE with rope_theta */
    MODEL_ROPE_LINEAR,      /* positions divided by factor */
    MODEL_ROPE_LLAMA3,      /* Llama 3.1 frequency-dependent scaling */
    MODEL_ROPE_COUNT,
} model_rope_kind_t;

typedef struct {
    model_rope_kind_t kind;
    double  theta;
    double  factor;                /* linear, llama3 */
    double  low_freq_factor;       /* llama3 */
    double  high_freq_factor;      /* llama3 */
    int64_t original_max_position; /* llama3: original_max_position_embeddings */
} model_rope_t;

/* Grouped-query attention (MODEL_MIXER_ATTENTION). */
typedef struct {
    int64_t      num_heads;      /* Hq */
    int64_t      num_kv_heads;   /* Hkv, Hq % Hkv == 0 */
    int64_t      head_dim;       /* D (may differ from hidden / Hq) */
    int64_t      sliding_window; /* 0: none; else sequences longer are rejected */
    bool         qkv_bias;       /* q/k/v_proj have a bias (Qwen2, Llama attention_bias) */
    bool         o_bias;         /* o_proj has a bias (Llama attention_bias) */
    model_rope_t rope;
} model_attn_config_t;

/* Dense gated MLP (MODEL_FFN_DENSE), SiLU gate. */
typedef struct {
    int64_t intermediate_size; /* F */
    bool    bias;              /* gate/up/down_proj have a bias (Llama mlp_bias) */
} model_mlp_config_t;

typedef struct {
    model_arch_t        arch;
    int64_t             vocab_size;
    int64_t             hidden_size; /* C */
    int64_t             num_layers;
    int64_t             max_position_embeddings;
    double              rms_norm_eps;
    bool                tie_word_embeddings;
    model_attn_config_t attn;
    model_mlp_config_t  mlp;
    model_block_t       blocks[MODEL_MAX_LAYERS]; /* [num_layers] */
} model_config_t;

/* Every layer {attention, dense MLP}: the Llama-family stack. */
void        model_config_blocks_uniform(model_config_t *c, model_mixer_kind_t mixer,
                                        model_ffn_kind_t ffn);
/* The plain Llama stack of the given dimensions (no biases, default RoPE,
 * head_dim = hidden / heads): what a job file without model.hf describes,
 * and what benchmarks and tests build. Not validated. */
typedef struct {
    int64_t vocab, hidden, layers, heads, kv_heads, ffn, max_position;
    double  norm_eps, rope_theta;
    bool    tie_embeddings;
} model_llama_dims_t;
void        model_config_llama(model_config_t *c, const model_llama_dims_t *d);
/* Checks every field (a clear error naming it); the kinds check their own
 * sub-configs for every layer that uses them. */
bt_status_t model_config_validate(const model_config_t *c);
const char *model_arch_name(model_arch_t arch); /* "LlamaForCausalLM", ... */

#endif
