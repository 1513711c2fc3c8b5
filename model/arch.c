/* Architecture tables (model/arch.h). */
#include "model/arch.h"

#include <stddef.h>

/* Llama, Mistral, Qwen2 and Qwen3 share every name; they differ in their configs
 * (biases, sliding windows), which ckpt/hf.c reads. Mixtral and Qwen2-MoE
 * name their routed experts as transformers' checkpoints do (one tensor per
 * expert; transformers 5 fuses them in memory and cuts them again on save). */
#define LLAMA_NAMES /* all but ffn_prefix */                                                       \
    .embed = "model.embed_tokens.weight", .final_norm = "model.norm.weight",                       \
    .lm_head = "lm_head.weight", .layer_prefix = "model.layers.%d",                                \
    .mixer_norm = "input_layernorm", .mixer_prefix = "self_attn",                                  \
    .ffn_norm = "post_attention_layernorm"

static const model_arch_info_t model_archs[] = {
    [MODEL_ARCH_LLAMA] = {.hf_class = "LlamaForCausalLM", LLAMA_NAMES, .ffn_prefix = "mlp"},
    [MODEL_ARCH_MISTRAL] = {.hf_class = "MistralForCausalLM", LLAMA_NAMES, .ffn_prefix = "mlp"},
    [MODEL_ARCH_QWEN2] = {.hf_class = "Qwen2ForCausalLM", LLAMA_NAMES, .ffn_prefix = "mlp"},
    [MODEL_ARCH_MIXTRAL] = {.hf_class = "MixtralForCausalLM", LLAMA_NAMES,
                            .ffn_prefix = "block_sparse_moe", .moe_router = "gate",
                            .expert_proj = {"w1", "w3", "w2"}},
    [MODEL_ARCH_QWEN2_MOE] = {.hf_class = "Qwen2MoeForCausalLM", LLAMA_NAMES, .ffn_prefix = "mlp",
                              .moe_router = "gate",
                              .expert_proj = {"gate_proj", "up_proj", "down_proj"},
                              .shared_expert = "shared_expert",
                              .shared_expert_gate = "shared_expert_gate"},
    /* one sublayer per layer, its norm and its mixer (of any kind) under the
     * same names; checkpoints name the body "backbone" */
    [MODEL_ARCH_NEMOTRON_H] = {.hf_class = "NemotronHForCausalLM",
                               .embed = "backbone.embeddings.weight",
                               .final_norm = "backbone.norm_f.weight", .lm_head = "lm_head.weight",
                               .layer_prefix = "backbone.layers.%d", .mixer_norm = "norm",
                               .mixer_prefix = "mixer", .ffn_norm = "norm", .ffn_prefix = "mixer"},
    /* DeepSeek-V2: MLA under self_attn (model/mla.c names its tensors), the
     * routed experts under mlp with their shared experts (one MLP, no gate) */
    [MODEL_ARCH_DEEPSEEK_V2] = {.hf_class = "DeepseekV2ForCausalLM", LLAMA_NAMES,
                                .ffn_prefix = "mlp", .moe_router = "gate",
                                .expert_proj = {"gate_proj", "up_proj", "down_proj"},
                                .shared_expert = "shared_experts"},
    [MODEL_ARCH_QWEN3] = {.hf_class = "Qwen3ForCausalLM", LLAMA_NAMES, .ffn_prefix = "mlp"},
    [MODEL_ARCH_QWEN3_MOE] = {.hf_class = "Qwen3MoeForCausalLM", LLAMA_NAMES, .ffn_prefix = "mlp",
                              .moe_router = "gate",
                              .expert_proj = {"gate_proj", "up_proj", "down_proj"}},
    [MODEL_ARCH_PHI3] = {.hf_class = "Phi3ForCausalLM", LLAMA_NAMES, .ffn_prefix = "mlp",
                         .fused_qkv = "qkv_proj", .fused_gate_up = "gate_up_proj"},
};
_Static_assert(sizeof model_archs / sizeof model_archs[0] == MODEL_ARCH_COUNT,
               "one entry per architecture");

const model_arch_info_t *model_arch_info(model_arch_t arch)
{
    return (unsigned)arch < MODEL_ARCH_COUNT ? &model_archs[arch] : NULL;
}

const char *model_arch_name(model_arch_t arch)
{
    return (unsigned)arch < MODEL_ARCH_COUNT ? model_archs[arch].hf_class : "?";
}
