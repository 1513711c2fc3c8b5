/* Architectures: the Hugging Face class and the names of every tensor
 * around the blocks (embedding, final norm, head, and per layer the norm and
 * prefix of each sublayer). The kinds name their own tensors under the
 * prefix. */
#ifndef BT_MODEL_ARCH_H
#define BT_MODEL_ARCH_H

#include "model/config.h"

typedef struct {
    const char *hf_class;     /* "LlamaForCausalLM" */
    const char *embed;        /* "model.embed_tokens.weight" */
    const char *final_norm;   /* "model.norm.weight" */
    const char *lm_head;      /* "lm_head.weight" */
    const char *layer_prefix; /* printf format of a layer's prefix: "model.layers.%d" */
    const char *mixer_norm;   /* "input_layernorm" */
    const char *mixer_prefix; /* "self_attn" */
    const char *ffn_norm;     /* "post_attention_layernorm" */
    const char *ffn_prefix;   /* "mlp" ("block_sparse_moe": Mixtral's routed experts) */
    /* Routed experts (model/moe.c), under ffn_prefix: the router's linear map
     * "<router>.weight", expert e's projections "experts.<e>.<proj>.weight"
     * (gate, up, down), and, where the architecture has one, the shared
     * expert "<shared>.{gate,up,down}_proj.weight" and its gate
     * "<shared_gate>.weight"; NULL where the architecture has none. */
    const char *moe_router;        /* "gate" */
    const char *expert_proj[3];    /* {"w1", "w3", "w2"} or {"gate_proj", "up_proj", "down_proj"} */
    const char *shared_expert;     /* "shared_expert" */
    const char *shared_expert_gate; /* "shared_expert_gate"; NULL: the shared expert is added
                                     * ungated (DeepSeek-V2's shared_experts) */
    /* Fused projections (Phi-3): q, k, v as row parts 0, 1, 2 of
     * "<fused_qkv>.weight" under the mixer prefix, gate and up as parts 0, 1
     * of "<fused_gate_up>.weight" under the feed-forward prefix; NULL: the
     * separate q/k/v_proj and gate/up_proj */
    const char *fused_qkv;     /* "qkv_proj" */
    const char *fused_gate_up; /* "gate_up_proj" */
} model_arch_info_t;

const model_arch_info_t *model_arch_info(model_arch_t arch);

#endif
