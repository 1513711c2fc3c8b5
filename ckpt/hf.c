#include "ckpt/hf.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "base/save.h"
#include "base/file.h"
#include "ckpt/safetensors.h"
#include "model/arch.h"

/* ---- config.json ----------------------------------------------------------- */

/* model_type of each architecture (config.json, when architectures is absent) */
static const char *const hf_model_types[] = {
    [MODEL_ARCH_LLAMA] = "llama",     [MODEL_ARCH_MISTRAL] = "mistral",
    [MODEL_ARCH_QWEN2] = "qwen2",     [MODEL_ARCH_MIXTRAL] = "mixtral",
    [MODEL_ARCH_QWEN2_MOE] = "qwen2_moe", [MODEL_ARCH_NEMOTRON_H] = "nemotron_h",
    [MODEL_ARCH_DEEPSEEK_V2] = "deepseek_v2", [MODEL_ARCH_QWEN3] = "qwen3",
    [MODEL_ARCH_QWEN3_MOE] = "qwen3_moe", [MODEL_ARCH_PHI3] = "phi3",
};
_Static_assert(sizeof hf_model_types / sizeof hf_model_types[0] == MODEL_ARCH_COUNT,
               "model_type per arch");

typedef struct {
    const char *what;
    json_t     *root;
} hf_cfg_t;

/* An integer field; absent or null -> def (def < 0: required). */
static bt_status_t cfg_int(const hf_cfg_t *c, json_t *obj, const char *key, int64_t def,
                           int64_t *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (def < 0) {
            log_error("%s: required field '%s' is missing", c->what, key);
            return BT_ERR_INVALID;
        }
        *out = def;
        return BT_OK;
    }
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return BT_OK;
    }
    if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
        fabs(json_real_value(v)) < 9e15) {
        *out = (int64_t)json_real_value(v);
        return BT_OK;
    }
    log_error("%s: field '%s' must be an integer", c->what, key);
    return BT_ERR_INVALID;
}

static bt_status_t cfg_num(const hf_cfg_t *c, json_t *obj, const char *key, double def,
                           bool required, double *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) {
            log_error("%s: required field '%s' is missing", c->what, key);
            return BT_ERR_INVALID;
        }
        *out = def;
        return BT_OK;
    }
    if (!json_is_number(v)) {
        log_error("%s: field '%s' must be a number", c->what, key);
        return BT_ERR_INVALID;
    }
    *out = json_number_value(v);
    return BT_OK;
}

static bt_status_t cfg_bool(const hf_cfg_t *c, json_t *obj, const char *key, bool def, bool *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return BT_OK;
    }
    if (!json_is_boolean(v)) {
        log_error("%s: field '%s' must be true or false", c->what, key);
        return BT_ERR_INVALID;
    }
    *out = json_is_true(v);
    return BT_OK;
}

/* RoPE from the new "rope_parameters" or the legacy "rope_theta" +
 * "rope_scaling" fields; type key "rope_type" or "type". */
static bt_status_t cfg_rope(const hf_cfg_t *c, model_arch_t arch, int64_t max_pos,
                            model_rope_t *r)
{
    bt_status_t st;
    json_t *root = c->root;
    const char *field = "rope_parameters";
    json_t *rp = json_object_get(root, "rope_parameters");
    if (!rp || json_is_null(rp)) {
        field = "rope_scaling";
        rp = json_object_get(root, "rope_scaling");
    }
    if (rp && !json_is_null(rp) && !json_is_object(rp)) {
        log_error("%s: '%s' must be an object or null", c->what, field);
        return BT_ERR_INVALID;
    }
    if (rp && json_is_null(rp)) rp = NULL;
    memset(r, 0, sizeof *r);
    if ((st = cfg_num(c, root, "rope_theta", 10000.0, false, &r->theta)) != BT_OK) return st;
    double prf = 1.0;
    if ((st = cfg_num(c, root, "partial_rotary_factor", 1.0, false, &prf)) != BT_OK) return st;
    if (!rp) goto check_partial;
    if ((st = cfg_num(c, rp, "rope_theta", r->theta, false, &r->theta)) != BT_OK) return st;
    if ((st = cfg_num(c, rp, "partial_rotary_factor", prf, false, &prf)) != BT_OK) return st;
    json_t *jt = json_object_get(rp, "rope_type");
    const char *tkey = "rope_type";
    if (!jt) {
        jt = json_object_get(rp, "type");
        tkey = "type";
    }
    const char *type = jt && json_is_string(jt) ? json_string_value(jt) : "default";
    if (jt && !json_is_string(jt)) {
        log_error("%s: '%s.%s' must be a string", c->what, field, tkey);
        return BT_ERR_INVALID;
    }
    if (!strcmp(type, "default")) {
        r->kind = MODEL_ROPE_DEFAULT;
    } else if (!strcmp(type, "linear")) {
        r->kind = MODEL_ROPE_LINEAR;
        if ((st = cfg_num(c, rp, "factor", 0, true, &r->factor)) != BT_OK) return st;
    } else if (!strcmp(type, "llama3")) {
        r->kind = MODEL_ROPE_LLAMA3;
        if ((st = cfg_num(c, rp, "factor", 0, true, &r->factor)) != BT_OK ||
            (st = cfg_num(c, rp, "low_freq_factor", 0, true, &r->low_freq_factor)) != BT_OK ||
            (st = cfg_num(c, rp, "high_freq_factor", 0, true, &r->high_freq_factor)) != BT_OK)
            return st;
        int64_t omp;
        if ((st = cfg_int(c, root, "original_max_position_embeddings", max_pos, &omp)) != BT_OK ||
            (st = cfg_int(c, rp, "original_max_position_embeddings", omp, &omp)) != BT_OK)
            return st;
        r->original_max_position = omp;
    } else if (!strcmp(type, "yarn") && arch == MODEL_ARCH_DEEPSEEK_V2) {
        /* transformers' _compute_yarn_parameters; 0 marks mscale, mscale_all_dim
         * and attention_factor unset */
        r->kind = MODEL_ROPE_YARN;
        int64_t omp;
        if ((st = cfg_num(c, rp, "factor", 0, true, &r->factor)) != BT_OK ||
            (st = cfg_num(c, rp, "beta_fast", 32, false, &r->beta_fast)) != BT_OK ||
            (st = cfg_num(c, rp, "beta_slow", 1, false, &r->beta_slow)) != BT_OK ||
            (st = cfg_num(c, rp, "mscale", 0, false, &r->mscale)) != BT_OK ||
            (st = cfg_num(c, rp, "mscale_all_dim", 0, false, &r->mscale_all_dim)) != BT_OK ||
            (st = cfg_num(c, rp, "attention_factor", 0, false, &r->attention_factor)) != BT_OK ||
            (st = cfg_bool(c, rp, "truncate", true, &r->truncate)) != BT_OK ||
            (st = cfg_int(c, root, "original_max_position_embeddings", max_pos, &omp)) != BT_OK ||
            (st = cfg_int(c, rp, "original_max_position_embeddings", omp, &omp)) != BT_OK)
            return st;
        if (r->beta_fast == 0) r->beta_fast = 32; /* transformers: `or 32`, `or 1` */
        if (r->beta_slow == 0) r->beta_slow = 1;
        r->original_max_position = omp;
    } else {
        log_error("%s: %s.%s='%s' is not supported (supported: default, linear, llama3%s)",
                  c->what, field, tkey, type,
                  arch == MODEL_ARCH_DEEPSEEK_V2 ? ", yarn" : "; yarn for DeepseekV2 only");
        return BT_ERR_UNSUPPORTED;
    }
check_partial:
    if (prf != 1.0) {
        log_error("%s: partial_rotary_factor=%g is not supported (only 1.0)", c->what, prf);
        return BT_ERR_UNSUPPORTED;
    }
    return BT_OK;
}

/* "A, B, C": every architecture's class (classes) or model_type, for errors */
static const char *arch_list(bool classes, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < MODEL_ARCH_COUNT && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "",
                              classes ? model_arch_name((model_arch_t)i) : hf_model_types[i]);
    return buf;
}

static bt_status_t cfg_arch(const hf_cfg_t *c, model_arch_t *arch)
{
    char list[512];
    json_t *archs = json_object_get(c->root, "architectures");
    const char *name = NULL;
    if (archs && json_is_array(archs) && json_array_size(archs) > 0) {
        json_t *a0 = json_array_get(archs, 0);
        if (!json_is_string(a0)) {
            log_error("%s: architectures[0] must be a string", c->what);
            return BT_ERR_INVALID;
        }
        if (json_array_size(archs) > 1) {
            log_error("%s: architectures lists %zu classes; exactly one is supported", c->what,
                      json_array_size(archs));
            return BT_ERR_UNSUPPORTED;
        }
        name = json_string_value(a0);
        for (int i = 0; i < MODEL_ARCH_COUNT; i++)
            if (!strcmp(name, model_arch_name((model_arch_t)i))) {
                *arch = (model_arch_t)i;
                return BT_OK;
            }
        log_error("%s: architectures[0]='%s' is not supported (supported: %s)", c->what, name,
                  arch_list(true, list, sizeof list));
        return BT_ERR_UNSUPPORTED;
    }
    json_t *mt = json_object_get(c->root, "model_type");
    if (mt && json_is_string(mt)) {
        for (int i = 0; i < MODEL_ARCH_COUNT; i++)
            if (!strcmp(json_string_value(mt), hf_model_types[i])) {
                *arch = (model_arch_t)i;
                return BT_OK;
            }
        log_error("%s: model_type='%s' is not supported (supported: %s)", c->what,
                  json_string_value(mt), arch_list(false, list, sizeof list));
        return BT_ERR_UNSUPPORTED;
    }
    log_error("%s: neither 'architectures' nor 'model_type' names the model class", c->what);
    return BT_ERR_INVALID;
}

/* Sliding window: Mistral, Mixtral and Phi-3 apply sliding_window (when set) to
 * every layer; Qwen3-MoE to every layer when use_sliding_window; Qwen2,
 * Qwen2-MoE and Qwen3 only when use_sliding_window, to the layers layer_types
 * marks "sliding_attention" (or, in older configs, layers >= max_window_layers).
 * cfg->attn.sliding_window holds the window, each layer's block whether it
 * applies there (model/attention.c). */
static bt_status_t cfg_sliding(const hf_cfg_t *c, model_config_t *m)
{
    bt_status_t st;
    int64_t w = 0, layers = m->num_layers;
    model_arch_t arch = m->arch;
    bool slide[MODEL_MAX_LAYERS];
    for (int64_t l = 0; l < MODEL_MAX_LAYERS; l++) slide[l] = true;
    m->attn.sliding_window = 0;
    if (arch == MODEL_ARCH_LLAMA || arch == MODEL_ARCH_DEEPSEEK_V2) return BT_OK;
    if ((st = cfg_int(c, c->root, "sliding_window", 0, &w)) != BT_OK) return st;
    bool use = false;
    if ((arch == MODEL_ARCH_QWEN2 || arch == MODEL_ARCH_QWEN2_MOE || arch == MODEL_ARCH_QWEN3 ||
         arch == MODEL_ARCH_QWEN3_MOE) &&
        (st = cfg_bool(c, c->root, "use_sliding_window", false, &use)) != BT_OK)
        return st;
    if (arch == MODEL_ARCH_QWEN3_MOE) {
        if (!use) w = 0;
    } else if (arch == MODEL_ARCH_QWEN2 || arch == MODEL_ARCH_QWEN2_MOE ||
               arch == MODEL_ARCH_QWEN3) {
        bool any = false;
        json_t *lt = json_object_get(c->root, "layer_types");
        if (lt && json_is_array(lt)) {
            size_t i;
            json_t *e;
            if ((int64_t)json_array_size(lt) != layers) {
                log_error("%s: layer_types has %zu entries for num_hidden_layers=%lld", c->what,
                          json_array_size(lt), (long long)layers);
                return BT_ERR_INVALID;
            }
            json_array_foreach(lt, i, e) {
                const char *s = json_is_string(e) ? json_string_value(e) : "";
                if (i < MODEL_MAX_LAYERS) slide[i] = !strcmp(s, "sliding_attention");
                if (!strcmp(s, "sliding_attention")) any = true;
                else if (strcmp(s, "full_attention")) {
                    log_error("%s: layer_types[%zu]='%s' is not supported", c->what, i, s);
                    return BT_ERR_UNSUPPORTED;
                }
            }
        } else if (use) {
            int64_t mwl;
            if ((st = cfg_int(c, c->root, "max_window_layers", 0, &mwl)) != BT_OK) return st;
            any = mwl < layers;
            for (int64_t l = 0; l < layers && l < MODEL_MAX_LAYERS; l++) slide[l] = l >= mwl;
        }
        if (!use || !any) w = 0;
    }
    if (w < 0) {
        log_error("%s: sliding_window=%lld must be >= 0", c->what, (long long)w);
        return BT_ERR_INVALID;
    }
    m->attn.sliding_window = w;
    for (int64_t l = 0; l < layers && l < MODEL_MAX_LAYERS; l++) m->blocks[l].sliding = w > 0 && slide[l];
    return BT_OK;
}

/* An optional string field that, when present, must be one of the values
 * baton implements (the router variants other MoE families name). */
static bt_status_t cfg_only(const hf_cfg_t *c, const char *key, const char *only)
{
    json_t *v = json_object_get(c->root, key);
    if (!v || json_is_null(v)) return BT_OK;
    if (json_is_string(v) && !strcmp(json_string_value(v), only)) return BT_OK;
    log_error("%s: %s=%s%s%s is not supported (only '%s': a softmax router taking the top "
              "num_experts_per_tok experts)", c->what, key, json_is_string(v) ? "'" : "",
              json_is_string(v) ? json_string_value(v) : "(not a string)",
              json_is_string(v) ? "'" : "", only);
    return BT_ERR_UNSUPPORTED;
}

/* An integer field transformers reads under either of two keys (a config
 * class's attribute_map: Mixtral's and Qwen3-MoE's num_experts is their
 * num_local_experts); both present must agree. */
static bt_status_t cfg_int_alias(const hf_cfg_t *c, const char *key, const char *alias,
                                 int64_t def, int64_t *out)
{
    int64_t a, b;
    bt_status_t st;
    if ((st = cfg_int(c, c->root, key, def, &a)) != BT_OK ||
        (st = cfg_int(c, c->root, alias, a, &b)) != BT_OK)
        return st;
    json_t *k = json_object_get(c->root, key);
    if (k && !json_is_null(k) && a != b) {
        log_error("%s: %s=%lld and %s=%lld disagree (transformers reads them as one field)",
                  c->what, key, (long long)a, alias, (long long)b);
        return BT_ERR_INVALID;
    }
    *out = b;
    return BT_OK;
}

/* Routed experts: Mixtral's every layer; Qwen2-MoE's and Qwen3-MoE's layer l
 * when l is not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0
 * (the others are dense MLPs of intermediate_size), as transformers builds
 * them; Qwen3-MoE has no shared expert, and with num_experts 0 every layer
 * is dense. Defaults are transformers'. capacity_factor is baton's own key (0: dropless, what
 * transformers computes), and so is router_bias_update_rate (0: no
 * selection bias). */
static bt_status_t cfg_moe(const hf_cfg_t *c, model_config_t *m)
{
    json_t *root = c->root;
    model_moe_config_t *e = &m->moe;
    bt_status_t st;
    bool mixtral = m->arch == MODEL_ARCH_MIXTRAL, qwen3 = m->arch == MODEL_ARCH_QWEN3_MOE;
    bool output_router_logits = false;
    double coef = 0;
    e->router = MODEL_ROUTER_SOFTMAX_TOPK;
    if ((st = mixtral || qwen3
                  ? cfg_int_alias(c, "num_local_experts", "num_experts", mixtral ? 8 : 128,
                                  &e->n_experts)
                  : cfg_int(c, root, "num_experts", 60, &e->n_experts)) != BT_OK ||
        (st = cfg_int(c, root, "num_experts_per_tok", mixtral ? 2 : qwen3 ? 8 : 4, &e->top_k)) !=
            BT_OK ||
        (st = cfg_num(c, root, "router_aux_loss_coef", 0.001, false, &coef)) != BT_OK ||
        (st = cfg_bool(c, root, "output_router_logits", false, &output_router_logits)) != BT_OK ||
        (st = cfg_num(c, root, "capacity_factor", 0, false, &e->capacity_factor)) != BT_OK ||
        (st = cfg_num(c, root, "router_bias_update_rate", 0, false, &e->bias_rate)) != BT_OK ||
        (st = cfg_only(c, "scoring_func", "softmax")) != BT_OK ||
        (st = cfg_only(c, "topk_method", "greedy")) != BT_OK)
        return st;
    /* transformers adds the loss only when the model outputs router logits */
    e->aux_loss_coef = output_router_logits ? coef : 0;
    if (mixtral) {
        e->expert_ffn = m->mlp.intermediate_size;
        e->shared_ffn = 0;
        e->norm_topk = true;
        double jitter = 0;
        if ((st = cfg_num(c, root, "router_jitter_noise", 0, false, &jitter)) != BT_OK) return st;
        if (jitter != 0)
            log_warn("%s: router_jitter_noise=%g is ignored (baton's router adds no noise; "
                     "transformers adds it only while training)", c->what, jitter);
        model_config_blocks_uniform(m, MODEL_MIXER_ATTENTION, MODEL_FFN_MOE);
        return BT_OK;
    }
    int64_t step = 1;
    if ((st = cfg_int(c, root, "moe_intermediate_size", qwen3 ? 768 : 1408, &e->expert_ffn)) !=
            BT_OK ||
        (st = cfg_int(c, root, "shared_expert_intermediate_size", qwen3 ? 0 : 5632,
                      &e->shared_ffn)) != BT_OK ||
        (st = cfg_bool(c, root, "norm_topk_prob", false, &e->norm_topk)) != BT_OK ||
        (st = cfg_int(c, root, "decoder_sparse_step", 1, &step)) != BT_OK)
        return st;
    if (e->n_experts < 0) {
        log_error("%s: num_experts=%lld must be >= 0 (0: every layer a dense MLP)", c->what,
                  (long long)e->n_experts);
        return BT_ERR_INVALID;
    }
    if (qwen3) {
        if (e->shared_ffn != 0)
            log_warn("%s: shared_expert_intermediate_size=%lld is ignored (Qwen3-MoE has no "
                     "shared expert, as in transformers)", c->what, (long long)e->shared_ffn);
        e->shared_ffn = 0;
    } else if (e->shared_ffn <= 0) {
        log_error("%s: shared_expert_intermediate_size=%lld is not supported (a Qwen2-MoE shared "
                  "expert of width 0 still has a gate tensor; baton needs width >= 1)", c->what,
                  (long long)e->shared_ffn);
        return BT_ERR_UNSUPPORTED;
    }
    if (step < 1) {
        log_error("%s: decoder_sparse_step=%lld must be >= 1", c->what, (long long)step);
        return BT_ERR_INVALID;
    }
    bool dense[MODEL_MAX_LAYERS] = {0};
    json_t *only = json_object_get(root, "mlp_only_layers");
    if (only && !json_is_null(only)) {
        if (!json_is_array(only)) {
            log_error("%s: mlp_only_layers must be a list of layer indices", c->what);
            return BT_ERR_INVALID;
        }
        size_t i;
        json_t *v;
        json_array_foreach(only, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) >= m->num_layers) {
                log_error("%s: mlp_only_layers[%zu] is not a layer index in [0, "
                          "num_hidden_layers=%lld)", c->what, i, (long long)m->num_layers);
                return BT_ERR_INVALID;
            }
            if (json_integer_value(v) < MODEL_MAX_LAYERS) dense[json_integer_value(v)] = true;
        }
    }
    for (int64_t l = 0; l < m->num_layers && l < MODEL_MAX_LAYERS; l++) {
        bool sparse = !dense[l] && e->n_experts > 0 && (l + 1) % step == 0;
        m->blocks[l] = (model_block_t){.mixer = MODEL_MIXER_ATTENTION,
                                       .ffn = sparse ? MODEL_FFN_MOE : MODEL_FFN_DENSE};
    }
    return BT_OK;
}

/* A string field that must be `only` when present (default `def`). */
static bt_status_t cfg_str_only(const hf_cfg_t *c, const char *key, const char *def,
                                const char *only)
{
    json_t *v = json_object_get(c->root, key);
    const char *s = !v || json_is_null(v) ? def : json_is_string(v) ? json_string_value(v) : NULL;
    if (s && !strcmp(s, only)) return BT_OK;
    log_error("%s: %s='%s' is not supported (only %s)", c->what, key, s ? s : "(not a string)",
              only);
    return BT_ERR_UNSUPPORTED;
}

/* NemotronH (transformers' NemotronHConfig): the layer pattern
 * layers_block_type (or the older hybrid_override_pattern string, M * - E),
 * every layer one block: a Mamba2 mixer, attention without RoPE, or a relu2
 * MLP; its keys and defaults as transformers 5.24 reads them, the older
 * mamba_* spellings included (they win, as there). transformers' class never
 * ties the head to the embedding, whatever tie_word_embeddings says. */
static bt_status_t cfg_nemotron_h(const hf_cfg_t *c, model_config_t *m)
{
    json_t *root = c->root;
    bt_status_t st;
    int64_t heads = 0;
    if ((st = cfg_int(c, root, "vocab_size", 131072, &m->vocab_size)) != BT_OK ||
        (st = cfg_int(c, root, "hidden_size", 4096, &m->hidden_size)) != BT_OK ||
        (st = cfg_int(c, root, "max_position_embeddings", 4096, &m->max_position_embeddings)) !=
            BT_OK ||
        (st = cfg_num(c, root, "layer_norm_epsilon", 1e-5, false, &m->rms_norm_eps)) != BT_OK ||
        (st = cfg_int(c, root, "num_attention_heads", 32, &heads)) != BT_OK ||
        (st = cfg_int(c, root, "num_key_value_heads", heads, &m->attn.num_kv_heads)) != BT_OK ||
        (st = cfg_int(c, root, "head_dim", 128, &m->attn.head_dim)) != BT_OK ||
        (st = cfg_int(c, root, "intermediate_size", 21504, &m->mlp.intermediate_size)) != BT_OK ||
        (st = cfg_bool(c, root, "mlp_bias", false, &m->mlp.bias)) != BT_OK ||
        (st = cfg_str_only(c, "mlp_hidden_act", "relu2", "relu2")) != BT_OK ||
        (st = cfg_str_only(c, "mamba_hidden_act", "silu", "silu")) != BT_OK)
        return st;
    m->attn.num_heads = heads;
    m->attn.rope.kind = MODEL_ROPE_NONE;
    m->mlp.act = MODEL_MLP_RELU2;
    model_mamba_config_t *a = &m->mamba;
    if ((st = cfg_int(c, root, "mamba_num_heads", 128, &a->num_heads)) != BT_OK ||
        (st = cfg_int(c, root, "mamba_head_dim", 64, &a->head_dim)) != BT_OK ||
        (st = cfg_int(c, root, "ssm_state_size", 128, &a->state_size)) != BT_OK ||
        (st = cfg_int(c, root, "n_groups", 8, &a->n_groups)) != BT_OK ||
        (st = cfg_int(c, root, "mamba_n_groups", a->n_groups, &a->n_groups)) != BT_OK ||
        (st = cfg_int(c, root, "conv_kernel", 4, &a->conv_kernel)) != BT_OK ||
        (st = cfg_int(c, root, "mamba_d_conv", a->conv_kernel, &a->conv_kernel)) != BT_OK ||
        (st = cfg_int(c, root, "chunk_size", 128, &a->chunk_size)) != BT_OK ||
        (st = cfg_int(c, root, "mamba_chunk_size", a->chunk_size, &a->chunk_size)) != BT_OK ||
        (st = cfg_bool(c, root, "use_conv_bias", true, &a->conv_bias)) != BT_OK ||
        (st = cfg_bool(c, root, "mamba_conv_bias", a->conv_bias, &a->conv_bias)) != BT_OK ||
        (st = cfg_bool(c, root, "use_bias", false, &a->proj_bias)) != BT_OK ||
        (st = cfg_num(c, root, "time_step_min", 0.001, false, &a->dt_min)) != BT_OK ||
        (st = cfg_num(c, root, "mamba_dt_min", a->dt_min, false, &a->dt_min)) != BT_OK)
        return st;
    /* the mixer clamps dt to (time_step_min, inf): time_step_limit is not read */
    a->dt_max = INFINITY;
    a->norm_eps = m->rms_norm_eps;
    bool tie = false, attn_bias = false;
    if ((st = cfg_bool(c, root, "tie_word_embeddings", false, &tie)) != BT_OK ||
        (st = cfg_bool(c, root, "attention_bias", false, &attn_bias)) != BT_OK)
        return st;
    if (tie)
        log_warn("%s: tie_word_embeddings=true is ignored, as transformers' NemotronHForCausalLM "
                 "ignores it (lm_head.weight is a tensor of its own)", c->what);
    if (attn_bias)
        log_warn("%s: attention_bias is ignored (NemotronH's attention has no biases, as in "
                 "transformers)", c->what);
    m->tie_word_embeddings = false;
    int64_t mtp = 0;
    if ((st = cfg_int(c, root, "num_nextn_predict_layers", 0, &mtp)) != BT_OK) return st;
    if (mtp > 0)
        log_warn("%s: num_nextn_predict_layers=%lld: the multi-token prediction layers are not "
                 "part of the model (transformers does not load them either)", c->what,
                 (long long)mtp);
    /* the pattern */
    json_t *lt = json_object_get(root, "layers_block_type");
    if (!lt || json_is_null(lt)) lt = json_object_get(root, "layer_types");
    json_t *pat = json_object_get(root, "hybrid_override_pattern");
    const char *where = "layers_block_type";
    int64_t n = 0;
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt)) {
            log_error("%s: layers_block_type must be a list of strings", c->what);
            return BT_ERR_INVALID;
        }
        n = (int64_t)json_array_size(lt);
    } else if (pat && json_is_string(pat)) {
        where = "hybrid_override_pattern";
        n = (int64_t)strlen(json_string_value(pat));
    } else {
        log_error("%s: neither layers_block_type nor hybrid_override_pattern gives the layers",
                  c->what);
        return BT_ERR_INVALID;
    }
    if (n < 1 || n > MODEL_MAX_LAYERS) {
        log_error("%s: %s has %lld layers (must be 1 to %d)", c->what, where, (long long)n,
                  MODEL_MAX_LAYERS);
        return BT_ERR_INVALID;
    }
    m->num_layers = n;
    for (int64_t l = 0; l < n; l++) {
        const char *t = NULL;
        char one[2] = {0, 0};
        if (lt && !json_is_null(lt)) {
            json_t *e = json_array_get(lt, (size_t)l);
            t = json_is_string(e) ? json_string_value(e) : "(not a string)";
        } else {
            one[0] = json_string_value(pat)[l];
            t = one;
        }
        model_block_t b = {0};
        if (!strcmp(t, "linear_attention") || !strcmp(t, "M")) b.mixer = MODEL_MIXER_MAMBA2;
        else if (!strcmp(t, "full_attention") || !strcmp(t, "*")) b.mixer = MODEL_MIXER_ATTENTION;
        else if (!strcmp(t, "mlp") || !strcmp(t, "-")) b.ffn = MODEL_FFN_DENSE;
        else if (!strcmp(t, "moe") || !strcmp(t, "E")) {
            log_error("%s: %s[%lld] is a mixture-of-experts layer ('%s'), which baton does not "
                      "implement for NemotronH yet (sigmoid group routing, relu2 experts)",
                      c->what, where, (long long)l, t);
            return BT_ERR_UNSUPPORTED;
        } else {
            log_error("%s: %s[%lld]='%s' is not a NemotronH layer type (linear_attention, "
                      "full_attention, mlp, moe or M * - E)", c->what, where, (long long)l, t);
            return BT_ERR_INVALID;
        }
        m->blocks[l] = b;
    }
    return BT_OK;
}

/* DeepSeek-V2's attention (MLA) fields, with transformers' defaults;
 * q_lora_rank null: q_proj (Lite). Keys and values have their own heads,
 * as many as the queries: num_key_value_heads, when set, must say so. */
static bt_status_t cfg_mla(const hf_cfg_t *c, model_config_t *m)
{
    json_t *root = c->root;
    model_mla_config_t *a = &m->mla;
    bt_status_t st;
    json_t *q = json_object_get(root, "q_lora_rank");
    a->num_heads = m->attn.num_heads;
    if ((st = cfg_int(c, root, "q_lora_rank", q && json_is_null(q) ? 0 : 1536, &a->q_lora_rank)) !=
            BT_OK ||
        (st = cfg_int(c, root, "kv_lora_rank", 512, &a->kv_lora_rank)) != BT_OK ||
        (st = cfg_int(c, root, "qk_nope_head_dim", 128, &a->qk_nope_dim)) != BT_OK ||
        (st = cfg_int(c, root, "qk_rope_head_dim", 64, &a->qk_rope_dim)) != BT_OK ||
        (st = cfg_int(c, root, "v_head_dim", 128, &a->v_head_dim)) != BT_OK)
        return st;
    if (a->q_lora_rank == 0 && q && !json_is_null(q)) {
        log_error("%s: q_lora_rank=0 must be null (no query bottleneck) or >= 1", c->what);
        return BT_ERR_INVALID;
    }
    if (m->attn.num_kv_heads != m->attn.num_heads) {
        log_error("%s: num_key_value_heads=%lld must equal num_attention_heads=%lld "
                  "(DeepseekV2's MLA has a key and value per query head)", c->what,
                  (long long)m->attn.num_kv_heads, (long long)m->attn.num_heads);
        return BT_ERR_UNSUPPORTED;
    }
    return BT_OK;
}

/* DeepSeek-V2's experts, as transformers' DeepseekV2 builds them: layers
 * below first_k_dense_replace dense MLPs of intermediate_size, every later
 * one n_routed_experts routed experts of moe_intermediate_size and one
 * shared MLP of n_shared_experts x that width, added ungated; softmax
 * scores, greedy or group-limited top-k, the weights times
 * routed_scaling_factor. transformers' DeepseekV2 ignores norm_topk_prob and
 * moe_layer_freq, and has no load-balancing loss: baton ignores the first
 * (with a warning), refuses a moe_layer_freq other than 1 (DeepSeek's own
 * code would skip layers that transformers makes sparse) and sets no aux
 * loss. */
static bt_status_t cfg_deepseek_moe(const hf_cfg_t *c, model_config_t *m)
{
    json_t *root = c->root;
    model_moe_config_t *e = &m->moe;
    bt_status_t st;
    int64_t shared = 0, first_dense = 0, freq = 1;
    bool norm = false;
    json_t *ns = json_object_get(root, "n_shared_experts");
    if (ns && json_is_null(ns)) {
        log_error("%s: n_shared_experts=null is not supported (transformers' DeepseekV2 adds "
                  "its shared experts to every MoE layer; baton needs n_shared_experts >= 1)",
                  c->what);
        return BT_ERR_UNSUPPORTED;
    }
    if ((st = cfg_int(c, root, "n_routed_experts", 64, &e->n_experts)) != BT_OK ||
        (st = cfg_int(c, root, "num_experts_per_tok", -1, &e->top_k)) != BT_OK ||
        (st = cfg_int(c, root, "moe_intermediate_size", 1407, &e->expert_ffn)) != BT_OK ||
        (st = cfg_int(c, root, "n_shared_experts", 2, &shared)) != BT_OK ||
        (st = cfg_int(c, root, "first_k_dense_replace", 0, &first_dense)) != BT_OK ||
        (st = cfg_int(c, root, "moe_layer_freq", 1, &freq)) != BT_OK ||
        (st = cfg_num(c, root, "routed_scaling_factor", 1.0, false, &e->routed_scale)) != BT_OK ||
        (st = cfg_bool(c, root, "norm_topk_prob", false, &norm)) != BT_OK ||
        (st = cfg_num(c, root, "capacity_factor", 0, false, &e->capacity_factor)) != BT_OK ||
        (st = cfg_num(c, root, "router_bias_update_rate", 0, false, &e->bias_rate)) != BT_OK ||
        (st = cfg_only(c, "scoring_func", "softmax")) != BT_OK)
        return st;
    if (shared < 1) {
        log_error("%s: n_shared_experts=%lld is not supported (baton needs >= 1)", c->what,
                  (long long)shared);
        return BT_ERR_UNSUPPORTED;
    }
    if (freq != 1) {
        log_error("%s: moe_layer_freq=%lld is not supported (transformers' DeepseekV2 makes every "
                  "layer from first_k_dense_replace on sparse, as moe_layer_freq 1 does)",
                  c->what, (long long)freq);
        return BT_ERR_UNSUPPORTED;
    }
    if (first_dense < 0 || first_dense > m->num_layers) {
        log_error("%s: first_k_dense_replace=%lld must be in [0, num_hidden_layers=%lld]",
                  c->what, (long long)first_dense, (long long)m->num_layers);
        return BT_ERR_INVALID;
    }
    if (!(e->routed_scale > 0)) {
        log_error("%s: routed_scaling_factor=%g must be > 0", c->what, e->routed_scale);
        return BT_ERR_INVALID;
    }
    if (norm)
        log_warn("%s: norm_topk_prob=true is ignored, as transformers' DeepseekV2 ignores it "
                 "(the routing weights are the top-k probabilities times routed_scaling_factor)",
                 c->what);
    e->norm_topk = false;
    e->shared_ffn = shared * e->expert_ffn;
    e->aux_loss_coef = 0;
    json_t *tm = json_object_get(root, "topk_method");
    const char *method = tm && json_is_string(tm) ? json_string_value(tm) : "greedy";
    if (tm && !json_is_null(tm) && !json_is_string(tm)) {
        log_error("%s: topk_method must be a string", c->what);
        return BT_ERR_INVALID;
    }
    if (!strcmp(method, "greedy")) {
        e->router = MODEL_ROUTER_SOFTMAX_TOPK;
    } else if (!strcmp(method, "group_limited_greedy")) {
        e->router = MODEL_ROUTER_SOFTMAX_GROUP_TOPK;
        if ((st = cfg_int(c, root, "n_group", -1, &e->n_group)) != BT_OK ||
            (st = cfg_int(c, root, "topk_group", -1, &e->topk_group)) != BT_OK)
            return st;
    } else {
        log_error("%s: topk_method='%s' is not supported (only 'greedy' and "
                  "'group_limited_greedy')", c->what, method);
        return BT_ERR_UNSUPPORTED;
    }
    for (int64_t l = 0; l < m->num_layers && l < MODEL_MAX_LAYERS; l++)
        m->blocks[l] = (model_block_t){.mixer = MODEL_MIXER_MLA,
                                       .ffn = l < first_dense ? MODEL_FFN_DENSE : MODEL_FFN_MOE};
    return BT_OK;
}

bt_status_t ckpt_hf_config_parse(const char *text, size_t len, const char *what,
                                 model_config_t *out)
{
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root) {
        log_error("%s: not valid JSON: %s (line %d column %d)", what, jerr.text, jerr.line,
                  jerr.column);
        return BT_ERR_INVALID;
    }
    bt_status_t st = BT_ERR_INVALID;
    hf_cfg_t c = {.what = what, .root = root};
    model_config_t m;
    memset(&m, 0, sizeof m);
    if (!json_is_object(root)) {
        log_error("%s: not a JSON object", what);
        goto free_root;
    }
    if ((st = cfg_arch(&c, &m.arch)) != BT_OK) goto free_root;
    if (m.arch == MODEL_ARCH_NEMOTRON_H) { /* a hybrid: its own keys throughout */
        if ((st = cfg_nemotron_h(&c, &m)) == BT_OK && (st = model_config_validate(&m)) == BT_OK)
            *out = m;
        goto free_root;
    }
    if ((st = cfg_int(&c, root, "vocab_size", -1, &m.vocab_size)) != BT_OK ||
        (st = cfg_int(&c, root, "hidden_size", -1, &m.hidden_size)) != BT_OK ||
        (st = cfg_int(&c, root, "intermediate_size", -1, &m.mlp.intermediate_size)) != BT_OK ||
        (st = cfg_int(&c, root, "num_hidden_layers", -1, &m.num_layers)) != BT_OK ||
        (st = cfg_int(&c, root, "num_attention_heads", -1, &m.attn.num_heads)) != BT_OK ||
        (st = cfg_int(&c, root, "num_key_value_heads", m.attn.num_heads, &m.attn.num_kv_heads)) !=
            BT_OK ||
        (st = cfg_int(&c, root, "max_position_embeddings", 2048, &m.max_position_embeddings)) !=
            BT_OK ||
        (st = cfg_num(&c, root, "rms_norm_eps", 1e-6, false, &m.rms_norm_eps)) != BT_OK ||
        (st = cfg_bool(&c, root, "tie_word_embeddings", false, &m.tie_word_embeddings)) != BT_OK)
        goto free_root;
    if (m.attn.num_heads <= 0 || m.hidden_size <= 0) {
        log_error("%s: hidden_size=%lld and num_attention_heads=%lld must be > 0", what,
                  (long long)m.hidden_size, (long long)m.attn.num_heads);
        st = BT_ERR_INVALID;
        goto free_root;
    }
    /* Qwen3Config's own default is 128; the others' hidden / heads */
    int64_t head_dim = m.arch == MODEL_ARCH_QWEN3 ? 128 : m.hidden_size / m.attn.num_heads;
    if ((st = cfg_int(&c, root, "head_dim", head_dim, &m.attn.head_dim)) != BT_OK)
        goto free_root;
    /* every layer of these architectures: attention, then the dense MLP */
    model_config_blocks_uniform(&m, MODEL_MIXER_ATTENTION, MODEL_FFN_DENSE);

    json_t *act = json_object_get(root, "hidden_act");
    const char *act_s = act && json_is_string(act) ? json_string_value(act) : (act ? "?" : "silu");
    if (strcmp(act_s, "silu") && strcmp(act_s, "swish")) {
        log_error("%s: hidden_act='%s' is not supported (only silu)", what, act_s);
        st = BT_ERR_UNSUPPORTED;
        goto free_root;
    }
    bool attn_bias = false, mlp_bias = false;
    if ((st = cfg_bool(&c, root, "attention_bias", false, &attn_bias)) != BT_OK ||
        (st = cfg_bool(&c, root, "mlp_bias", false, &mlp_bias)) != BT_OK)
        goto free_root;
    switch (m.arch) {
    case MODEL_ARCH_LLAMA:
        m.attn.qkv_bias = m.attn.o_bias = attn_bias;
        m.mlp.bias = mlp_bias;
        break;
    case MODEL_ARCH_MISTRAL: /* transformers' Mistral, Mixtral and Phi-3 have no biases at all */
    case MODEL_ARCH_MIXTRAL:
    case MODEL_ARCH_PHI3:
    case MODEL_ARCH_QWEN2:   /* q/k/v biases always, no o/MLP bias */
        m.attn.qkv_bias = m.arch == MODEL_ARCH_QWEN2;
        if (attn_bias || mlp_bias)
            log_warn("%s: attention_bias/mlp_bias are ignored by %s (as transformers does)",
                     what, model_arch_name(m.arch));
        break;
    case MODEL_ARCH_QWEN2_MOE: /* q/k/v biases unless qkv_bias is false; no o/MLP bias */
        if ((st = cfg_bool(&c, root, "qkv_bias", true, &m.attn.qkv_bias)) != BT_OK)
            goto free_root;
        if (attn_bias || mlp_bias)
            log_warn("%s: attention_bias/mlp_bias are ignored by %s (as transformers does)",
                     what, model_arch_name(m.arch));
        break;
    case MODEL_ARCH_QWEN3: /* attention_bias on q/k/v/o, no MLP bias; q/k normed per head */
    case MODEL_ARCH_QWEN3_MOE:
        m.attn.qkv_bias = m.attn.o_bias = attn_bias;
        m.attn.qk_norm = true;
        if (mlp_bias)
            log_warn("%s: mlp_bias is ignored by %s (as transformers does)", what,
                     model_arch_name(m.arch));
        break;
    case MODEL_ARCH_DEEPSEEK_V2:
        if (attn_bias || mlp_bias) {
            log_error("%s: %s=true is not supported for DeepseekV2ForCausalLM (baton's MLA and "
                      "experts have no biases)", what, attn_bias ? "attention_bias" : "mlp_bias");
            st = BT_ERR_UNSUPPORTED;
            goto free_root;
        }
        if ((st = cfg_mla(&c, &m)) != BT_OK || (st = cfg_deepseek_moe(&c, &m)) != BT_OK)
            goto free_root;
        break;
    default:
        BT_PANIC("unhandled arch %d", (int)m.arch);
    }
    if ((m.arch == MODEL_ARCH_MIXTRAL || m.arch == MODEL_ARCH_QWEN2_MOE ||
         m.arch == MODEL_ARCH_QWEN3_MOE) &&
        (st = cfg_moe(&c, &m)) != BT_OK)
        goto free_root;
    if ((st = cfg_rope(&c, m.arch, m.max_position_embeddings, &m.attn.rope)) != BT_OK)
        goto free_root;
    if (m.arch == MODEL_ARCH_DEEPSEEK_V2) m.mla.rope = m.attn.rope; /* MLA's, over qk_rope_head_dim */
    if ((st = cfg_sliding(&c, &m)) != BT_OK) goto free_root;
    double drop = 0;
    if ((st = cfg_num(&c, root, "attention_dropout", 0, false, &drop)) != BT_OK) goto free_root;
    if (drop != 0)
        log_warn("%s: attention_dropout=%g is ignored (no dropout is applied)", what, drop);
    static const char *const other_drops[] = {"resid_pdrop", "embd_pdrop"}; /* Phi-3's */
    for (size_t k = 0; k < 2; k++) {
        if ((st = cfg_num(&c, root, other_drops[k], 0, false, &drop)) != BT_OK) goto free_root;
        if (drop != 0)
            log_warn("%s: %s=%g is ignored (no dropout is applied)", what, other_drops[k], drop);
    }
    /* model_config_validate logs the offending field */
    if ((st = model_config_validate(&m)) != BT_OK) goto free_root;
    *out = m;
    st = BT_OK;
free_root:
    json_decref(root);
    return st;
}

static char *hf_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

bt_status_t ckpt_hf_config_load(const char *dir, model_config_t *out)
{
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        log_error("%s: not a model directory (%s)", dir,
                  stat(dir, &sb) != 0 ? strerror(errno) : "not a directory");
        return BT_ERR_NOT_FOUND;
    }
    char *path = hf_path(dir, "config.json");
    if (!path) return BT_ERR_NOMEM;
    char *text;
    size_t len;
    bt_status_t st = base_file_read(path, 256u << 20, &text, &len);
    if (st == BT_OK) {
        st = ckpt_hf_config_parse(text, len, path, out);
        free(text);
    }
    free(path);
    return st;
}

/* ---- weights ----------------------------------------------------------------- */

typedef struct {
    int              n_files;
    ckpt_st_file_t **files;
    /* index: weight_map name -> file number (single file: NULL, all in file 0) */
    int              n_map;
    char           **map_names;
    int             *map_file;
} hf_weights_t;

static void hf_weights_close(hf_weights_t *w)
{
    for (int i = 0; i < w->n_files; i++) ckpt_st_close(w->files[i]);
    for (int i = 0; i < w->n_map; i++) free(w->map_names[i]);
    free(w->files);
    free(w->map_names);
    free(w->map_file);
    memset(w, 0, sizeof *w);
}

static bt_status_t hf_weights_open_index(const char *dir, const char *ipath, hf_weights_t *w)
{
    char *text;
    size_t len;
    bt_status_t st = base_file_read(ipath, 256u << 20, &text, &len);
    if (st != BT_OK) return st;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    free(text);
    if (!root) {
        log_error("%s: not valid JSON: %s (line %d)", ipath, jerr.text, jerr.line);
        return BT_ERR_INVALID;
    }
    st = BT_ERR_INVALID;
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        log_error("%s: no 'weight_map' object", ipath);
        goto free_root;
    }
    size_t n = json_object_size(map);
    char **fnames = calloc(n ? n : 1, sizeof *fnames);
    w->map_names = calloc(n ? n : 1, sizeof *w->map_names);
    w->map_file = calloc(n ? n : 1, sizeof *w->map_file);
    w->files = calloc(n ? n : 1, sizeof *w->files);
    if (!fnames || !w->map_names || !w->map_file || !w->files) {
        free(fnames);
        st = BT_ERR_NOMEM;
        goto free_root;
    }
    int nf = 0;
    const char *key;
    json_t *val;
    json_object_foreach(map, key, val) {
        const char *fn = json_is_string(val) ? json_string_value(val) : NULL;
        if (!fn || !*fn || strchr(fn, '/') || !strcmp(fn, "..") || !strcmp(fn, ".")) {
            log_error("%s: weight_map['%s'] must be a plain file name in the model directory",
                      ipath, key);
            goto free_fnames;
        }
        int fi = 0;
        while (fi < nf && strcmp(fnames[fi], fn)) fi++;
        if (fi == nf) fnames[nf++] = (char *)fn;
        w->map_names[w->n_map] = strdup(key);
        w->map_file[w->n_map] = fi;
        if (!w->map_names[w->n_map]) {
            st = BT_ERR_NOMEM;
            goto free_fnames;
        }
        w->n_map++;
    }
    for (int i = 0; i < nf; i++) {
        char *p = hf_path(dir, fnames[i]);
        if (!p) {
            st = BT_ERR_NOMEM;
            goto free_fnames;
        }
        st = ckpt_st_open(p, &w->files[i]);
        free(p);
        if (st != BT_OK) goto free_fnames;
        w->n_files++;
    }
    /* Every mapped tensor must be in the file the index names. */
    for (int i = 0; i < w->n_map; i++) {
        if (!ckpt_st_find(w->files[w->map_file[i]], w->map_names[i])) {
            log_error("%s: tensor '%s' is missing (%s maps it there)",
                      w->files[w->map_file[i]]->path, w->map_names[i], ipath);
            st = BT_ERR_CORRUPT;
            goto free_fnames;
        }
    }
    st = BT_OK;
free_fnames:
    free(fnames);
free_root:
    json_decref(root);
    if (st != BT_OK) hf_weights_close(w);
    return st;
}

static bt_status_t hf_weights_open(const char *dir, hf_weights_t *w)
{
    memset(w, 0, sizeof *w);
    char *ipath = hf_path(dir, "model.safetensors.index.json");
    if (!ipath) return BT_ERR_NOMEM;
    struct stat sb;
    bt_status_t st;
    if (stat(ipath, &sb) == 0) {
        st = hf_weights_open_index(dir, ipath, w);
        free(ipath);
        return st;
    }
    free(ipath);
    char *path = hf_path(dir, "model.safetensors");
    w->files = calloc(1, sizeof *w->files);
    if (!path || !w->files) {
        free(path);
        free(w->files);
        return BT_ERR_NOMEM;
    }
    st = ckpt_st_open(path, &w->files[0]);
    if (st == BT_ERR_NOT_FOUND)
        log_error("%s: no model.safetensors or model.safetensors.index.json", dir);
    free(path);
    if (st != BT_OK) {
        free(w->files);
        w->files = NULL;
        return st;
    }
    w->n_files = 1;
    return BT_OK;
}

/* The file holding `name` and the tensor, or NULL. */
static const ckpt_st_tensor_t *hf_weights_find(const hf_weights_t *w, const char *name,
                                               const ckpt_st_file_t **file)
{
    if (w->n_map == 0) {
        *file = w->files[0];
        return ckpt_st_find(w->files[0], name);
    }
    for (int i = 0; i < w->n_map; i++)
        if (!strcmp(w->map_names[i], name)) {
            *file = w->files[w->map_file[i]];
            return ckpt_st_find(*file, name);
        }
    return NULL;
}

static bool hf_name_ignorable(const char *name)
{
    size_t n = strlen(name);
    const char *suffix = "rotary_emb.inv_freq"; /* buffers some old checkpoints saved */
    size_t k = strlen(suffix);
    return n >= k && !strcmp(name + n - k, suffix);
}

/* With tie_word_embeddings the head is the embedding, so a stored
 * lm_head.weight has no parameter to go to. transformers (5.x) ties the two
 * only when they are equal and otherwise keeps both untied, with a warning
 * that the config does not match the checkpoint; 4.x overwrote the head
 * with the embedding. Either way the loss depends on the version, so baton
 * accepts the tensor only when it equals model.embed_tokens.weight (same
 * shape, every element equal after widening to f32: the checkpoints that
 * save both names for one tensor), and otherwise refuses it as it refuses
 * any other tensor the config does not have. */
static bt_status_t hf_check_tied_head(const hf_weights_t *w, const ckpt_st_file_t *hf,
                                      const ckpt_st_tensor_t *head)
{
    const ckpt_st_file_t *ef = NULL;
    const ckpt_st_tensor_t *emb = hf_weights_find(w, "model.embed_tokens.weight", &ef);
    bool same = emb && emb->ndim == head->ndim;
    for (int d = 0; same && d < head->ndim; d++) same = emb->shape[d] == head->shape[d];
    enum { CHUNK = 1 << 14 };
    float *a = same ? malloc(2 * CHUNK * sizeof *a) : NULL;
    if (same && !a) return BT_ERR_NOMEM;
    for (int64_t at = 0; same && at < head->numel; at += CHUNK) {
        int64_t n = head->numel - at < CHUNK ? head->numel - at : CHUNK;
        bt_status_t st;
        if ((st = ckpt_st_read_f32_range(hf, head, at, n, a)) != BT_OK ||
            (st = ckpt_st_read_f32_range(ef, emb, at, n, a + CHUNK)) != BT_OK) {
            free(a);
            return st;
        }
        for (int64_t i = 0; same && i < n; i++) same = a[i] == a[CHUNK + i];
    }
    free(a);
    if (same) return BT_OK;
    log_error("%s: tensor 'lm_head.weight' %s model.embed_tokens.weight, but config.json has "
              "tie_word_embeddings=true, so the head is the embedding and has no tensor of its own; "
              "set tie_word_embeddings to false to use this head, or remove the tensor", hf->path,
              emb ? "differs from" : "is stored without");
    return BT_ERR_INVALID;
}

/* Auxiliary-loss-free balancing's selection biases (model.h
 * model_moe_bias_views) travel in HF files under the name transformers
 * gives the same bias in DeepSeek-V3's router: beside the router's weight,
 * "<router>.e_score_correction_bias", [E] f32. */
#define HF_BIAS_SUFFIX ".e_score_correction_bias"

/* hf's name for a checkpoint's "<router>.selection_bias" into out[cap]. */
static void hf_bias_name(const char *native, char *out, size_t cap)
{
    size_t n = strlen(native), k = strlen(".selection_bias");
    if (n < k || strcmp(native + n - k, ".selection_bias"))
        BT_PANIC("hf_bias_name: %s is no selection bias", native);
    snprintf(out, cap, "%.*s%s", (int)(n - k), native, HF_BIAS_SUFFIX);
}

/* Whether name is a selection bias beside one of the n routers of all[]
 * (only when the config balances by bias). */
static bool hf_bias_router(const model_t *m, const char *name, const model_param_t *all, int n)
{
    const char *router = model_arch_info(m->cfg.arch)->moe_router;
    size_t len = strlen(name), k = strlen(HF_BIAS_SUFFIX);
    if (m->cfg.moe.bias_rate <= 0 || !router || len <= k || strcmp(name + len - k, HF_BIAS_SUFFIX))
        return false;
    char w[MODEL_NAME_MAX + 32];
    snprintf(w, sizeof w, "%.*s.weight", (int)(len - k), name);
    size_t r = strlen(router), stem = len - k;
    if (stem <= r || name[stem - r - 1] != '.' || strncmp(name + stem - r, router, r)) return false;
    for (int j = 0; j < n; j++)
        if (!strcmp(all[j].name, w)) return true;
    return false;
}

/* Rejects file tensors that no parameter of the whole model has. */
static bt_status_t hf_check_extra(const model_t *m, const hf_weights_t *w)
{
    int n = model_layout(&m->cfg, NULL, NULL);
    model_param_t *all = calloc((size_t)n, sizeof *all);
    if (!all) return BT_ERR_NOMEM;
    model_layout(&m->cfg, NULL, all);
    bt_status_t st = BT_OK;
    for (int f = 0; f < w->n_files && st == BT_OK; f++)
        for (int i = 0; i < w->files[f]->n; i++) {
            const char *name = w->files[f]->tensors[i].name;
            if (m->cfg.tie_word_embeddings && !strcmp(name, "lm_head.weight")) {
                if ((st = hf_check_tied_head(w, w->files[f], &w->files[f]->tensors[i])) != BT_OK)
                    break;
                continue;
            }
            bool known = hf_name_ignorable(name) || hf_bias_router(m, name, all, n);
            for (int j = 0; j < n && !known; j++) {
                int64_t e;
                char base[MODEL_NAME_MAX];
                int part;
                known = !strcmp(all[j].name, name) ||
                        (model_name_part(all[j].name, base, sizeof base, &part) &&
                         !strcmp(base, name)) ||
                        (model_name_stack_index(all[j].name, name, &e) && e < all[j].spec.global[0]);
            }
            if (!known) {
                log_error("%s: unexpected tensor '%s' (not a parameter of this %s config)",
                          w->files[f]->path, name, model_arch_name(m->cfg.arch));
                st = BT_ERR_INVALID;
                break;
            }
        }
    free(all);
    return st;
}

static void hf_shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* The HF tensor `name` of the file(s), checked against the shape the config
 * needs (ndim, shape); NULL after logging what is wrong. */
static const ckpt_st_tensor_t *hf_tensor_get(const hf_weights_t *w, const char *dir,
                                             const char *name, int ndim, const int64_t *shape,
                                             const ckpt_st_file_t **f, bt_status_t *st)
{
    const ckpt_st_tensor_t *t = hf_weights_find(w, name, f);
    if (!t) {
        log_error("%s: tensor '%s' is missing from %s", dir, name,
                  w->n_map ? "model.safetensors.index.json" : "model.safetensors");
        *st = BT_ERR_NOT_FOUND;
        return NULL;
    }
    bool same = t->ndim == ndim;
    for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == shape[d];
    if (!same) {
        char got[128], want[128];
        hf_shape_str(got, sizeof got, t->ndim, t->shape);
        hf_shape_str(want, sizeof want, ndim, shape);
        log_error("%s: tensor '%s' has shape %s, the config needs %s", (*f)->path, name, got,
                  want);
        *st = BT_ERR_INVALID;
        return NULL;
    }
    return t;
}

/* Reads parameter i's piece (its shard spec against the whole tensor: one
 * range per contiguous run) from its HF tensor, or, for a stacked parameter
 * (model.h, MODEL_STACK_MARK), each index's slab from that index's tensor:
 * straight into the parameter when it is host f32, else into *host
 * (allocated on first need, the size of the largest parameter) and from
 * there to the model's device. */
static bt_status_t hf_param_read(model_t *m, int i, const hf_weights_t *w, const char *dir,
                                 float **host)
{
    const model_param_t *p = &m->params[i];
    float *dst = model_param_host_f32(m, i);
    if (!dst) {
        if (!*host) {
            int64_t most = 1;
            for (int j = 0; j < m->n_params; j++)
                if (tensor_numel(&m->params[j].t) > most) most = tensor_numel(&m->params[j].t);
            if (!(*host = malloc((size_t)most * sizeof **host))) return BT_ERR_NOMEM;
        }
        dst = *host;
    }
    const ckpt_st_file_t *f = NULL;
    const ckpt_st_tensor_t *t;
    bt_status_t st = BT_OK;
    char base[MODEL_NAME_MAX];
    int part;
    int64_t row0, rows;
    if (model_name_part(p->name, base, sizeof base, &part) &&
        model_part_rows(m->params, m->n_params, i, &row0, &rows)) {
        /* rows [row0, row0 + its rows) of the HF tensor (model.h, MODEL_PART_MARK) */
        shard_spec_t in = p->spec;
        in.global[0] = rows;
        in.offset[0] += row0;
        if (!(t = hf_tensor_get(w, dir, base, in.ndim, in.global, &f, &st))) return st;
        st = ckpt_st_read_piece(f, t, &in, dst);
    } else if (!model_name_is_stacked(p->name)) {
        if (!(t = hf_tensor_get(w, dir, p->name, p->spec.ndim, p->spec.global, &f, &st))) return st;
        st = ckpt_st_read_piece(f, t, &p->spec, dst);
    } else {
        /* index e's slab: the piece's box without its first dimension */
        shard_spec_t slab = shard_whole(p->spec.ndim - 1, p->spec.global + 1);
        int64_t per = 1;
        for (int d = 1; d < p->spec.ndim; d++) {
            slab.offset[d - 1] = p->spec.offset[d];
            slab.extent[d - 1] = p->spec.extent[d];
            per *= p->spec.extent[d];
        }
        for (int64_t k = 0; k < p->spec.extent[0] && st == BT_OK; k++) {
            char name[MODEL_NAME_MAX + 24];
            if (!model_name_unstack(p->name, p->spec.offset[0] + k, name, sizeof name))
                BT_PANIC("hf_param_read: %s does not unstack", p->name);
            if (!(t = hf_tensor_get(w, dir, name, slab.ndim, slab.global, &f, &st))) return st;
            st = ckpt_st_read_piece(f, t, &slab, dst + k * per);
        }
    }
    if (st != BT_OK || dst != *host) return st;
    return model_param_write(m, i, *host);
}

/* The stage's selection biases from their HF tensors where the file has
 * them (an HF model that never trained with them starts at zero). */
static bt_status_t hf_bias_read(model_t *m, const hf_weights_t *w, const char *dir)
{
    int nb = model_moe_bias_views(m, NULL, NULL);
    if (nb == 0) return BT_OK;
    tensor_t *views = calloc((size_t)nb, sizeof *views);
    char (*names)[MODEL_NAME_MAX] = calloc((size_t)nb, sizeof *names);
    float *h = malloc((size_t)m->cfg.moe.n_experts * sizeof *h);
    bt_status_t st = views && names && h ? BT_OK : BT_ERR_NOMEM;
    if (st == BT_OK) model_moe_bias_views(m, views, names);
    for (int k = 0; k < nb && st == BT_OK; k++) {
        char hn[MODEL_NAME_MAX + 32];
        hf_bias_name(names[k], hn, sizeof hn);
        const ckpt_st_file_t *f = NULL;
        if (!hf_weights_find(w, hn, &f)) continue;
        const ckpt_st_tensor_t *t = hf_tensor_get(w, dir, hn, 1, views[k].shape, &f, &st);
        if (!t) break;
        if ((st = ckpt_st_read_f32_range(f, t, 0, t->numel, h)) != BT_OK) break;
        kern_upload(m->stream, &views[k], h);
        st = kern_stream_sync(m->stream);
    }
    free(h);
    free(names);
    free(views);
    return st;
}

bt_status_t ckpt_hf_weights_load(model_t *m, const char *dir)
{
    hf_weights_t w;
    bt_status_t st = hf_weights_open(dir, &w);
    if (st != BT_OK) return st;
    float *host = NULL;
    if ((st = hf_check_extra(m, &w)) != BT_OK) goto close_weights;
    for (int i = 0; i < m->n_params && st == BT_OK; i++) st = hf_param_read(m, i, &w, dir, &host);
    if (st == BT_OK) st = hf_bias_read(m, &w, dir);
close_weights:
    free(host);
    hf_weights_close(&w);
    return st;
}

bt_status_t ckpt_hf_load(const char *dir, const model_stage_t *stage, model_t **out)
{
    return ckpt_hf_load_tp(dir, stage, NULL, out);
}

bt_status_t ckpt_hf_load_tp(const char *dir, const model_stage_t *stage,
                            const model_parallel_t *par, model_t **out)
{
    return ckpt_hf_load_part(dir, stage, par, NULL, out);
}

bt_status_t ckpt_hf_load_part(const char *dir, const model_stage_t *stage,
                              const model_parallel_t *par, const model_place_t *place,
                              model_t **out)
{
    model_config_t cfg;
    bt_status_t st = ckpt_hf_config_load(dir, &cfg);
    if (st != BT_OK) return st;
    model_place_t host = model_place_host();
    model_t *m;
    if ((st = model_create_on(&cfg, stage, par, place ? place : &host, &m)) != BT_OK) return st;
    if ((st = ckpt_hf_weights_load(m, dir)) != BT_OK) {
        model_destroy(m);
        return st;
    }
    *out = m;
    return BT_OK;
}

/* ---- export ------------------------------------------------------------------ */

/* The routed experts' fields, as transformers' configs spell them (the
 * dense layers of Qwen2-MoE as mlp_only_layers, decoder_sparse_step 1). */
static void hf_moe_json(json_t *j, const model_config_t *c)
{
    const model_moe_config_t *e = &c->moe;
    bool mixtral = c->arch == MODEL_ARCH_MIXTRAL, qwen3 = c->arch == MODEL_ARCH_QWEN3_MOE;
    json_object_set_new(j, mixtral ? "num_local_experts" : "num_experts",
                        json_integer(e->n_experts));
    json_object_set_new(j, "num_experts_per_tok", json_integer(e->top_k));
    if (mixtral) {
        json_object_set_new(j, "intermediate_size", json_integer(e->expert_ffn));
        json_object_set_new(j, "router_jitter_noise", json_real(0.0));
    } else {
        json_object_set_new(j, "moe_intermediate_size", json_integer(e->expert_ffn));
        if (!qwen3) {
            json_object_set_new(j, "shared_expert_intermediate_size", json_integer(e->shared_ffn));
            json_object_set_new(j, "qkv_bias", json_boolean(c->attn.qkv_bias));
        }
        json_object_set_new(j, "norm_topk_prob", json_boolean(e->norm_topk));
        json_object_set_new(j, "decoder_sparse_step", json_integer(1));
        json_t *dense = json_array();
        for (int64_t l = 0; l < c->num_layers; l++)
            if (c->blocks[l].ffn != MODEL_FFN_MOE) json_array_append_new(dense, json_integer(l));
        json_object_set_new(j, "mlp_only_layers", dense);
    }
    /* the coefficient baton trained with: 0 when the loss was off */
    json_object_set_new(j, "router_aux_loss_coef", json_real(e->aux_loss_coef));
    json_object_set_new(j, "output_router_logits", json_boolean(e->aux_loss_coef > 0));
    if (e->capacity_factor > 0)
        json_object_set_new(j, "capacity_factor", json_real(e->capacity_factor));
    if (e->bias_rate > 0)
        json_object_set_new(j, "router_bias_update_rate", json_real(e->bias_rate));
}

/* NemotronH's config.json: its keys, and the layer pattern as a list. */
static json_t *hf_nemotron_h_json(const model_config_t *c)
{
    json_t *j = json_object();
    const model_mamba_config_t *a = &c->mamba;
    json_object_set_new(j, "architectures", json_pack("[s]", model_arch_name(c->arch)));
    json_object_set_new(j, "model_type", json_string(hf_model_types[c->arch]));
    json_object_set_new(j, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(j, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(j, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(j, "layer_norm_epsilon", json_real(c->rms_norm_eps));
    json_object_set_new(j, "tie_word_embeddings", json_false());
    json_object_set_new(j, "num_attention_heads", json_integer(c->attn.num_heads));
    json_object_set_new(j, "num_key_value_heads", json_integer(c->attn.num_kv_heads));
    json_object_set_new(j, "head_dim", json_integer(c->attn.head_dim));
    json_object_set_new(j, "intermediate_size", json_integer(c->mlp.intermediate_size));
    json_object_set_new(j, "mlp_hidden_act", json_string("relu2"));
    json_object_set_new(j, "mlp_bias", json_boolean(c->mlp.bias));
    json_object_set_new(j, "mamba_num_heads", json_integer(a->num_heads));
    json_object_set_new(j, "mamba_head_dim", json_integer(a->head_dim));
    json_object_set_new(j, "n_groups", json_integer(a->n_groups));
    json_object_set_new(j, "ssm_state_size", json_integer(a->state_size));
    json_object_set_new(j, "conv_kernel", json_integer(a->conv_kernel));
    json_object_set_new(j, "chunk_size", json_integer(a->chunk_size));
    json_object_set_new(j, "use_conv_bias", json_boolean(a->conv_bias));
    json_object_set_new(j, "use_bias", json_boolean(a->proj_bias));
    json_object_set_new(j, "mamba_hidden_act", json_string("silu"));
    json_object_set_new(j, "time_step_min", json_real(a->dt_min));
    json_t *types = json_array();
    for (int64_t l = 0; l < c->num_layers; l++) {
        const model_block_t *b = &c->blocks[l];
        json_array_append_new(types, json_string(b->mixer == MODEL_MIXER_MAMBA2 ? "linear_attention"
                                                 : b->mixer == MODEL_MIXER_ATTENTION
                                                     ? "full_attention"
                                                     : "mlp"));
    }
    json_object_set_new(j, "layers_block_type", types);
    json_object_set_new(j, "torch_dtype", json_string("float32"));
    return j;
}

/* DeepSeek-V2's MLA and expert fields (the dense layers as
 * first_k_dense_replace: the leading ones, as the reader requires). */
static void hf_deepseek_json(json_t *j, const model_config_t *c)
{
    const model_mla_config_t *a = &c->mla;
    const model_moe_config_t *e = &c->moe;
    json_object_set_new(j, "q_lora_rank", a->q_lora_rank ? json_integer(a->q_lora_rank) : json_null());
    json_object_set_new(j, "kv_lora_rank", json_integer(a->kv_lora_rank));
    json_object_set_new(j, "qk_nope_head_dim", json_integer(a->qk_nope_dim));
    json_object_set_new(j, "qk_rope_head_dim", json_integer(a->qk_rope_dim));
    json_object_set_new(j, "v_head_dim", json_integer(a->v_head_dim));
    json_object_set_new(j, "head_dim", json_integer(a->qk_rope_dim));
    json_object_set_new(j, "attention_bias", json_false());
    json_object_set_new(j, "mlp_bias", json_false());
    int64_t first = 0;
    while (first < c->num_layers && c->blocks[first].ffn != MODEL_FFN_MOE) first++;
    json_object_set_new(j, "first_k_dense_replace", json_integer(first));
    json_object_set_new(j, "moe_layer_freq", json_integer(1));
    json_object_set_new(j, "n_routed_experts", json_integer(e->n_experts));
    json_object_set_new(j, "num_experts_per_tok", json_integer(e->top_k));
    json_object_set_new(j, "moe_intermediate_size", json_integer(e->expert_ffn));
    json_object_set_new(j, "n_shared_experts",
                        json_integer(e->expert_ffn > 0 ? e->shared_ffn / e->expert_ffn : 0));
    json_object_set_new(j, "routed_scaling_factor",
                        json_real(e->routed_scale > 0 ? e->routed_scale : 1.0));
    json_object_set_new(j, "norm_topk_prob", json_false());
    bool group = e->router == MODEL_ROUTER_SOFTMAX_GROUP_TOPK;
    json_object_set_new(j, "topk_method", json_string(group ? "group_limited_greedy" : "greedy"));
    json_object_set_new(j, "n_group", group ? json_integer(e->n_group) : json_null());
    json_object_set_new(j, "topk_group", group ? json_integer(e->topk_group) : json_null());
    if (e->capacity_factor > 0)
        json_object_set_new(j, "capacity_factor", json_real(e->capacity_factor));
    if (e->bias_rate > 0)
        json_object_set_new(j, "router_bias_update_rate", json_real(e->bias_rate));
}

static json_t *hf_config_json(const model_config_t *c)
{
    if (c->arch == MODEL_ARCH_NEMOTRON_H) return hf_nemotron_h_json(c);
    json_t *j = json_object();
    json_object_set_new(j, "architectures", json_pack("[s]", model_arch_name(c->arch)));
    json_object_set_new(j, "model_type", json_string(hf_model_types[c->arch]));
    json_object_set_new(j, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(j, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(j, "intermediate_size", json_integer(c->mlp.intermediate_size));
    json_object_set_new(j, "num_hidden_layers", json_integer(c->num_layers));
    json_object_set_new(j, "num_attention_heads", json_integer(c->attn.num_heads));
    json_object_set_new(j, "num_key_value_heads", json_integer(c->attn.num_kv_heads));
    json_object_set_new(j, "head_dim", json_integer(c->attn.head_dim));
    json_object_set_new(j, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(j, "rms_norm_eps", json_real(c->rms_norm_eps));
    json_object_set_new(j, "hidden_act", json_string("silu"));
    json_object_set_new(j, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(j, "torch_dtype", json_string("float32"));
    if (c->arch == MODEL_ARCH_LLAMA) {
        json_object_set_new(j, "attention_bias", json_boolean(c->attn.qkv_bias));
        json_object_set_new(j, "mlp_bias", json_boolean(c->mlp.bias));
    }
    if (c->arch == MODEL_ARCH_QWEN3 || c->arch == MODEL_ARCH_QWEN3_MOE)
        json_object_set_new(j, "attention_bias", json_boolean(c->attn.qkv_bias));
    if (c->arch == MODEL_ARCH_MISTRAL || c->arch == MODEL_ARCH_MIXTRAL || c->arch == MODEL_ARCH_PHI3)
        json_object_set_new(j, "sliding_window",
                            c->attn.sliding_window ? json_integer(c->attn.sliding_window)
                                                   : json_null());
    if (c->arch == MODEL_ARCH_QWEN2 || c->arch == MODEL_ARCH_QWEN2_MOE ||
        c->arch == MODEL_ARCH_QWEN3 || c->arch == MODEL_ARCH_QWEN3_MOE) {
        /* the window and the layers it applies to, as the reader takes them */
        bool w = c->attn.sliding_window > 0;
        json_object_set_new(j, "use_sliding_window", json_boolean(w));
        json_object_set_new(j, "sliding_window", w ? json_integer(c->attn.sliding_window)
                                                   : json_null());
        if (c->arch != MODEL_ARCH_QWEN3_MOE) {
            json_t *types = json_array();
            for (int64_t l = 0; l < c->num_layers; l++)
                json_array_append_new(types, json_string(w && c->blocks[l].sliding
                                                             ? "sliding_attention"
                                                             : "full_attention"));
            json_object_set_new(j, "layer_types", types);
            json_object_set_new(j, "max_window_layers", json_integer(c->num_layers));
        }
    }
    if (c->arch == MODEL_ARCH_MIXTRAL || c->arch == MODEL_ARCH_QWEN2_MOE ||
        c->arch == MODEL_ARCH_QWEN3_MOE)
        hf_moe_json(j, c);
    if (c->arch == MODEL_ARCH_DEEPSEEK_V2) hf_deepseek_json(j, c);
    const model_rope_t *rope = c->arch == MODEL_ARCH_DEEPSEEK_V2 ? &c->mla.rope : &c->attn.rope;
    json_object_set_new(j, "rope_theta", json_real(rope->theta));
    json_t *rp = json_object();
    json_object_set_new(rp, "rope_theta", json_real(rope->theta));
    switch (rope->kind) {
    case MODEL_ROPE_DEFAULT:
        json_object_set_new(rp, "rope_type", json_string("default"));
        break;
    case MODEL_ROPE_LINEAR:
        json_object_set_new(rp, "rope_type", json_string("linear"));
        json_object_set_new(rp, "factor", json_real(c->attn.rope.factor));
        break;
    case MODEL_ROPE_LLAMA3:
        json_object_set_new(rp, "rope_type", json_string("llama3"));
        json_object_set_new(rp, "factor", json_real(c->attn.rope.factor));
        json_object_set_new(rp, "low_freq_factor", json_real(c->attn.rope.low_freq_factor));
        json_object_set_new(rp, "high_freq_factor", json_real(c->attn.rope.high_freq_factor));
        json_object_set_new(rp, "original_max_position_embeddings",
                            json_integer(c->attn.rope.original_max_position));
        break;
    case MODEL_ROPE_YARN: /* unset values stay unset */
        json_object_set_new(rp, "rope_type", json_string("yarn"));
        json_object_set_new(rp, "factor", json_real(rope->factor));
        json_object_set_new(rp, "original_max_position_embeddings",
                            json_integer(rope->original_max_position));
        json_object_set_new(rp, "beta_fast", json_real(rope->beta_fast));
        json_object_set_new(rp, "beta_slow", json_real(rope->beta_slow));
        if (rope->mscale != 0) json_object_set_new(rp, "mscale", json_real(rope->mscale));
        if (rope->mscale_all_dim != 0)
            json_object_set_new(rp, "mscale_all_dim", json_real(rope->mscale_all_dim));
        if (rope->attention_factor > 0)
            json_object_set_new(rp, "attention_factor", json_real(rope->attention_factor));
        json_object_set_new(rp, "truncate", json_boolean(rope->truncate));
        break;
    default:
        BT_PANIC("unhandled rope kind %d", (int)c->attn.rope.kind);
    }
    /* Both spellings: transformers >= 5 reads rope_parameters, older ones
     * rope_scaling (null means default there). */
    json_object_set(j, "rope_parameters", rp);
    json_object_set_new(j, "rope_scaling",
                        rope->kind == MODEL_ROPE_DEFAULT ? json_null() : json_incref(rp));
    json_decref(rp);
    return j;
}

/* The names an HF export owns: a new export drops them from the previous
 * version (a sharded predecessor's index and shards included), and carries
 * everything else over (base/save.h). */
char *ckpt_hf_config_text(const model_config_t *c)
{
    json_t *j = hf_config_json(c);
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    return text;
}

static const char *const hf_owned[] = {"config.json", "model.safetensors",
                                       "model.safetensors.index.json", "model-*.safetensors", NULL};

bt_status_t ckpt_hf_save(const model_t *m, const char *dir)
{
    if (!m->stage.has_embedding || !m->stage.has_head ||
        m->stage.first_layer != 0 || m->stage.last_layer != m->cfg.num_layers) {
        log_error("ckpt: HF export needs a whole model, not stage [%d,%d)", m->stage.first_layer,
                  m->stage.last_layer);
        return BT_ERR_INVALID;
    }
    if (m->par.tp_size != 1) {
        log_error("ckpt: HF export needs whole tensors, not TP rank %d of %d (gather them into a "
                  "tp_size-1 model with model_tp_gather first)", m->par.tp_rank, m->par.tp_size);
        return BT_ERR_INVALID;
    }
    /* one entry per HF tensor: a stacked parameter (model.h) is one per
     * index, the row parts of one tensor one together; then the selection
     * biases (HF_BIAS_SUFFIX) */
    int n_entries = 0, nb = model_moe_bias_views(m, NULL, NULL), part;
    char base[MODEL_NAME_MAX];
    for (int i = 0; i < m->n_params; i++) {
        if (model_name_part(m->params[i].name, base, sizeof base, &part)) n_entries += part == 0;
        else n_entries += model_name_is_stacked(m->params[i].name) ? (int)m->params[i].spec.global[0] : 1;
    }
    n_entries += nb;
    ckpt_st_entry_t *e = calloc((size_t)n_entries + 1, sizeof *e);
    char (*names)[MODEL_NAME_MAX + 32] = calloc((size_t)n_entries + 1, sizeof *names);
    float **host = calloc((size_t)m->n_params + (size_t)nb + 1, sizeof *host);
    if (!e || !names || !host) {
        free(e);
        free(names);
        free(host);
        return BT_ERR_NOMEM;
    }
    /* the writer reads host f32: device (or lower-precision) parameters are
     * downloaded first */
    bool direct = device_is_host(m->place.dev) && m->place.param_dtype == DT_F32;
    bt_status_t st = BT_OK;
    int n = 0;
    for (int i = 0; i < m->n_params && st == BT_OK; i++) {
        int64_t row0, rows;
        if (model_name_part(m->params[i].name, base, sizeof base, &part)) {
            if (part != 0) continue; /* written with part 0 */
            /* the HF tensor: every part's rows in order, into one buffer */
            model_part_rows(m->params, m->n_params, i, &row0, &rows);
            const tensor_t *p0 = &m->params[i].t;
            int64_t per = tensor_numel(p0) / p0->shape[0];
            host[i] = malloc((size_t)(rows * per) * sizeof(float) + 1);
            if (!host[i]) {
                st = BT_ERR_NOMEM;
                break;
            }
            char other[MODEL_NAME_MAX];
            int k;
            for (int j = 0; j < m->n_params && st == BT_OK; j++)
                if (model_name_part(m->params[j].name, other, sizeof other, &k) &&
                    !strcmp(other, base) && model_part_rows(m->params, m->n_params, j, &row0, &rows))
                    st = model_param_read(m, j, false, host[i] + row0 * per);
            int64_t shape[SHARD_MAX_DIMS];
            memcpy(shape, m->params[i].spec.global, sizeof shape);
            shape[0] = rows;
            snprintf(names[n], sizeof names[n], "%s", base);
            e[n].name = names[n];
            e[n++].t = tensor_make(host[i], DT_F32, DEVICE_CPU, p0->ndim, shape);
            continue;
        }
        tensor_t t = tensor_on(m->params[i].t, DEVICE_CPU);
        if (!direct) {
            host[i] = malloc((size_t)tensor_numel(&t) * sizeof(float) + 1);
            if (!host[i]) st = BT_ERR_NOMEM;
            else st = model_param_read(m, i, false, host[i]);
            t.dtype = DT_F32;
            t.data = host[i];
        }
        const char *name = m->params[i].name;
        if (!model_name_is_stacked(name)) {
            e[n].name = name;
            e[n++].t = t;
            continue;
        }
        size_t per = (size_t)(tensor_numel(&t) / t.shape[0]) * dtype_size(t.dtype);
        for (int64_t k = 0; k < t.shape[0]; k++, n++) {
            if (!model_name_unstack(name, k, names[n], sizeof names[n]))
                BT_PANIC("ckpt_hf_save: %s does not unstack", name);
            e[n].name = names[n];
            e[n].t = tensor_make((char *)t.data + (size_t)k * per, t.dtype, DEVICE_CPU,
                                 t.ndim - 1, t.shape + 1);
        }
    }
    if (st == BT_OK && nb > 0) { /* read through the stream: they live on the device */
        tensor_t *bv = calloc((size_t)nb, sizeof *bv);
        char (*bn)[MODEL_NAME_MAX] = calloc((size_t)nb, sizeof *bn);
        if (!bv || !bn) st = BT_ERR_NOMEM;
        else model_moe_bias_views(m, bv, bn);
        for (int k = 0; k < nb && st == BT_OK; k++, n++) {
            float *hb = host[m->n_params + k] = malloc((size_t)tensor_numel(&bv[k]) * sizeof *hb);
            if (!hb) {
                st = BT_ERR_NOMEM;
                break;
            }
            kern_download(m->stream, hb, &bv[k]);
            hf_bias_name(bn[k], names[n], sizeof names[n]);
            e[n].name = names[n];
            e[n].t = tensor_make(hb, DT_F32, DEVICE_CPU, 1, bv[k].shape);
        }
        if (st == BT_OK) st = kern_stream_sync(m->stream);
        free(bn);
        free(bv);
    }
    if (st != BT_OK) goto free_host;
    json_t *j = hf_config_json(&m->cfg);
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    size_t tlen = text ? strlen(text) : 0;
    char *config = text ? malloc(tlen + 2) : NULL;
    if (!config) {
        free(text);
        st = BT_ERR_NOMEM;
        goto free_host;
    }
    memcpy(config, text, tlen);
    config[tlen] = '\n';
    free(text);

    base_save_dir_t sd = {0};
    char wpath[BASE_SAVE_PATH_MAX], cpath[BASE_SAVE_PATH_MAX];
    const char *meta[] = {"format", "pt"};
    st = base_save_dir_begin(&sd, dir);
    if (st) goto free_all;
    base_save_dir_path(&sd, "model.safetensors", wpath, sizeof wpath);
    base_save_dir_path(&sd, "config.json", cpath, sizeof cpath);
    if ((st = ckpt_st_write(wpath, e, n_entries, meta, 1)) ||
        (st = base_save_file(cpath, config, tlen + 1, 0644))) {
        base_save_dir_abort(&sd);
        goto free_all;
    }
    st = base_save_dir_commit(&sd, hf_owned);
free_all:
    free(config);
free_host:
    for (int i = 0; i < m->n_params + nb; i++) free(host[i]);
    free(host);
    free(names);
    free(e);
    return st;
}

bt_status_t ckpt_hf_save_tp(const model_t *m, const char *dir)
{
    if (m->par.tp_size == 1) return ckpt_hf_save(m, dir);
    if (!m->stage.has_embedding || !m->stage.has_head || m->stage.first_layer != 0 ||
        m->stage.last_layer != m->cfg.num_layers) {
        log_error("ckpt: HF export needs a whole model, not stage [%d,%d)", m->stage.first_layer,
                  m->stage.last_layer);
        return BT_ERR_INVALID;
    }
    model_t *full = NULL;
    bt_status_t st = BT_OK;
    /* only rank 0 holds the whole model; the others gather into scratch */
    if (m->par.tp_rank == 0 && (st = model_create(&m->cfg, &m->stage, &full)) != BT_OK)
        return st;
    if ((st = model_tp_gather(m, false, full)) == BT_OK && full) st = ckpt_hf_save(full, dir);
    model_destroy(full);
    return st;
}

const char *const ckpt_hf_tokenizer_files[] = {"tokenizer.json", "tokenizer_config.json",
                                               "special_tokens_map.json", NULL};

static bool file_is_regular(const char *dir, const char *name)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

bt_status_t ckpt_hf_tokenizer_copy(const char *src, const char *dst, char *err, size_t errlen)
{
    struct stat sb;
    if (stat(src, &sb) != 0) {
        snprintf(err, errlen, "%s: %s", src, strerror(errno));
        return BT_ERR_NOT_FOUND;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", src);
    if (!S_ISDIR(sb.st_mode)) {
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
    }
    if (!file_is_regular(dir, "tokenizer.json")) {
        snprintf(err, errlen, "%s: no tokenizer.json there", src);
        return BT_ERR_NOT_FOUND;
    }
    for (int i = 0; ckpt_hf_tokenizer_files[i]; i++) {
        const char *name = ckpt_hf_tokenizer_files[i];
        if (!file_is_regular(dir, name)) continue;
        char from[4200], to[4200];
        snprintf(from, sizeof from, "%s/%s", dir, name);
        snprintf(to, sizeof to, "%s/%s", dst, name);
        char *text = NULL;
        size_t len = 0;
        bt_status_t st = base_file_read(from, 1u << 30, &text, &len);
        if (!st) st = base_save_file(to, text, len, 0644);
        free(text);
        if (st) {
            snprintf(err, errlen, "%s: cannot copy it to %s", from, to);
            return st;
        }
    }
    return BT_OK;
}
