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
    const char *ffn_prefix;   /* "mlp" */
} model_arch_info_t;

const model_arch_info_t *model_arch_info(model_arch_t arch);

#endif
