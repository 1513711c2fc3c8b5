/* What a model is, as read from a Hugging Face config.json (ckpt/hf.c) or a
 * GGUF file: the common dimensions, one sub-config per block kind, and the
 * kind of every layer's two sublayers.
 *
 * A layer is a mixer (attention today; MLA and Mamba2 join as kinds) and a
 * feed-forward (a dense gated MLP, or routed experts), each
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
#define MODEL_MAX_EXPERTS  (1 << 12) /* and experts x their width <= 4 * MODEL_MAX_FFN */

typedef enum {
    MODEL_ARCH_LLAMA = 0,
    MODEL_ARCH_MISTRAL,
    MODEL_ARCH_QWEN2,
    MODEL_ARCH_MIXTRAL,   /* attention + routed experts in every layer */
    MODEL_ARCH_QWEN2_MOE, /* attention + routed experts with a shared expert, or a dense MLP */
    MODEL_ARCH_NEMOTRON_H, /* hybrid: each layer one Mamba2 mixer, attention or relu2 MLP */
    MODEL_ARCH_DEEPSEEK_V2, /* MLA + first_k_dense_replace dense MLPs, then routed experts with
                             * ungated shared experts */
    MODEL_ARCH_QWEN3,       /* Qwen2's stack without q/k/v biases, q and k RMS-normed per head */
    MODEL_ARCH_QWEN3_MOE,   /* Qwen3's attention + routed experts (no shared expert), or a dense
                             * MLP */
    MODEL_ARCH_PHI3,        /* Llama's stack with q/k/v in one qkv_proj and gate/up in one
                             * gate_up_proj (row parts, model.h MODEL_PART_MARK) */
    MODEL_ARCH_COUNT,
} model_arch_t;

typedef enum {
    MODEL_MIXER_NONE = 0,
    MODEL_MIXER_ATTENTION, /* grouped-query attention with RoPE (model/attention.c) */
    MODEL_MIXER_MAMBA2,    /* the Mamba2 mixer: conv, selective SSD scan, gated norm (model/mamba.c) */
    MODEL_MIXER_MLA,       /* multi-head latent attention, DeepSeek-V2 (model/mla.c) */
    MODEL_MIXER_COUNT,
} model_mixer_kind_t;

typedef enum {
    MODEL_FFN_NONE = 0,
    MODEL_FFN_DENSE, /* gated MLP: down(act(gate(x)) * up(x)) (model/mlp.c) */
    MODEL_FFN_MOE,   /* routed experts, each a gated MLP, + optional shared expert (model/moe.c) */
    MODEL_FFN_COUNT,
} model_ffn_kind_t;

typedef struct {
    uint8_t mixer;   /* model_mixer_kind_t */
    uint8_t ffn;     /* model_ffn_kind_t */
    uint8_t sliding; /* attention under attn.sliding_window (a "sliding_attention" layer) */
} model_block_t;

typedef enum {
    MODEL_ROPE_DEFAULT = 0, /* plain RoPE with rope_theta */
    MODEL_ROPE_LINEAR,      /* positions divided by factor */
    MODEL_ROPE_LLAMA3,      /* Llama 3.1 frequency-dependent scaling */
    MODEL_ROPE_NONE,        /* no positional rotation at all (NemotronH's attention) */
    MODEL_ROPE_YARN,        /* YaRN as DeepSeek-V2 ships it (MLA only) */
    MODEL_ROPE_COUNT,
} model_rope_kind_t;

typedef struct {
    model_rope_kind_t kind;
    double  theta;
    double  factor;                /* linear, llama3 */
    double  low_freq_factor;       /* llama3 */
    double  high_freq_factor;      /* llama3 */
    int64_t original_max_position; /* llama3, yarn: original_max_position_embeddings */
    /* yarn: the ramp's rotation bounds (beta_fast, beta_slow), mscale and
     * mscale_all_dim (0: unset), attention_factor (0: derived from them),
     * truncate (the ramp's bounds rounded outwards) */
    double  beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor;
    bool    truncate;
} model_rope_t;

/* Grouped-query attention (MODEL_MIXER_ATTENTION). */
typedef struct {
    int64_t      num_heads;      /* Hq */
    int64_t      num_kv_heads;   /* Hkv, Hq % Hkv == 0 */
    int64_t      head_dim;       /* D (may differ from hidden / Hq) */
    int64_t      sliding_window; /* 0: none; else the window of the layers whose block has
                                  * sliding set */
    bool         qkv_bias;       /* q/k/v_proj have a bias (Qwen2, Llama attention_bias) */
    bool         o_bias;         /* o_proj has a bias (Llama attention_bias) */
    /* q and k RMS-normed over each head's D channels before RoPE, one weight
     * [D] each shared by all heads (q_norm, k_norm; Qwen3), eps rms_norm_eps */
    bool         qk_norm;
    model_rope_t rope;
} model_attn_config_t;

/* The dense MLP's activation. */
typedef enum {
    MODEL_MLP_SWIGLU = 0, /* gated: down(silu(gate(x)) * up(x)) (Llama) */
    MODEL_MLP_RELU2,      /* plain: down(relu(up(x))^2), no gate_proj (NemotronH) */
    MODEL_MLP_ACT_COUNT,
} model_mlp_act_t;

/* Multi-head latent attention (MODEL_MIXER_MLA), as transformers'
 * DeepseekV2Attention: per head a query and key of qk_nope + qk_rope dims
 * (RoPE on the last qk_rope only, one rope key shared by every head) and a
 * value of v_head_dim; the query straight from the input (q_lora_rank 0) or
 * through a rank-q_lora_rank bottleneck with its RMSNorm, keys and values
 * through the kv_lora_rank latent with its RMSNorm (model/mla.c). */
typedef struct {
    int64_t      num_heads;    /* H */
    int64_t      q_lora_rank;  /* 0: q_proj (DeepSeek-V2-Lite); else q_a_proj, q_b_proj */
    int64_t      kv_lora_rank; /* the latent's width */
    int64_t      qk_nope_dim;  /* qk_nope_head_dim */
    int64_t      qk_rope_dim;  /* qk_rope_head_dim (even) */
    int64_t      v_head_dim;
    model_rope_t rope;         /* over qk_rope_dim */
} model_mla_config_t;

/* Dense MLP (MODEL_FFN_DENSE). */
typedef struct {
    int64_t         intermediate_size; /* F */
    bool            bias;              /* gate/up/down_proj have a bias (Llama mlp_bias) */
    model_mlp_act_t act;
} model_mlp_config_t;

/* The Mamba2 mixer (MODEL_MIXER_MAMBA2), as transformers' NemotronHMamba2Mixer:
 * in_proj maps C to z [I], x [I], B [G*N], C [G*N], dt [H] (I = H * P); a
 * causal depthwise conv of conv_kernel taps (SiLU) over x, B, C; dt =
 * clamp(softplus(dt + dt_bias), dt_min, dt_max); the SSD scan (chunk_size)
 * with A = -exp(A_log) and the D skip; the gated RMSNorm per group of I/G
 * columns; out_proj back to C. */
typedef struct {
    int64_t num_heads;   /* H: mamba_num_heads */
    int64_t head_dim;    /* P: mamba_head_dim */
    int64_t n_groups;    /* G: n_groups, H % G == 0 */
    int64_t state_size;  /* N: ssm_state_size */
    int64_t conv_kernel; /* K: conv_kernel */
    int64_t chunk_size;  /* chunk_size */
    bool    conv_bias;   /* use_conv_bias */
    bool    proj_bias;   /* in_proj/out_proj biases (use_bias) */
    double  dt_min, dt_max; /* the clamp of dt (transformers: time_step_min, infinity) */
    double  norm_eps;    /* the gated norm's epsilon (layer_norm_epsilon) */
} model_mamba_config_t;

/* How a router picks a token's experts. */
typedef enum {
    MODEL_ROUTER_SOFTMAX_TOPK = 0, /* softmax over every expert, the K most probable (Mixtral,
                                    * Qwen2-MoE, DeepSeek-V2 greedy); their weights
                                    * renormalised when norm_topk */
    MODEL_ROUTER_SOFTMAX_GROUP_TOPK, /* DeepSeek-V2 group_limited_greedy: the experts in n_group
                                      * consecutive groups, a group scored by its most probable
                                      * expert; the K most probable experts of the topk_group
                                      * best groups */
    MODEL_ROUTER_COUNT,
} model_router_kind_t;

/* Routed experts (MODEL_FFN_MOE): a router (a linear map to n_experts
 * logits), n_experts gated SiLU MLPs of width expert_ffn of which each token
 * runs top_k, their outputs weighted by the router and summed; optionally a
 * shared expert every token runs, scaled by sigmoid(a linear gate). */
typedef struct {
    int64_t             n_experts;  /* E: num_local_experts (Mixtral), num_experts (Qwen2-MoE) */
    int64_t             top_k;      /* K: num_experts_per_tok, 1 <= K <= E */
    int64_t             expert_ffn; /* F of an expert: intermediate_size (Mixtral),
                                     * moe_intermediate_size (Qwen2-MoE) */
    int64_t             shared_ffn; /* the shared expert's F (shared_expert_intermediate_size);
                                     * 0: no shared expert */
    model_router_kind_t router;
    bool                norm_topk;  /* the K weights divided by their sum (norm_topk_prob) */
    int64_t             n_group, topk_group; /* MODEL_ROUTER_SOFTMAX_GROUP_TOPK */
    double              routed_scale; /* the K weights times this (routed_scaling_factor; 0: 1) */
    /* The router's load-balancing loss (Switch Transformer, as transformers
     * computes it) enters the loss with this coefficient: router_aux_loss_coef
     * when output_router_logits is set, else 0 (off). */
    double              aux_loss_coef;
    /* 0: dropless (every token reaches its K experts). > 0: in each forward an
     * expert keeps at most ceil(capacity_factor * N * K / E) of the N tokens'
     * choices, the first in token order; the others are dropped (the token
     * gets the rest of its experts, its residual unchanged) and counted. */
    double              capacity_factor;
    /* Auxiliary-loss-free balancing (baton's own key router_bias_update_rate,
     * 0: off): every sparse layer keeps a per-expert bias added to the
     * probabilities for the top-K selection only (the weights stay the
     * unbiased probabilities); after each training step every bias moves by
     * this rate times sign(mean - tokens of its expert) over the step's
     * global batch (model_moe_balance). */
    double              bias_rate;
} model_moe_config_t;

typedef struct {
    model_arch_t        arch;
    int64_t             vocab_size;
    int64_t             hidden_size; /* C */
    int64_t             num_layers;
    int64_t             max_position_embeddings;
    double              rms_norm_eps;
    bool                tie_word_embeddings;
    model_attn_config_t attn;
    model_mla_config_t  mla; /* layers of MODEL_MIXER_MLA */
    model_mlp_config_t  mlp; /* dense layers (Qwen2-MoE: mlp_only_layers, decoder_sparse_step) */
    model_moe_config_t  moe; /* layers of routed experts */
    model_mamba_config_t mamba; /* Mamba2 mixers */
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
