/* Model configs (model/config.h): the common fields, the layer pattern, and
 * the kinds' tables, which let each kind check its own sub-config. */
#include "model/config.h"

#include "base/log.h"
#include "model/kind.h"
#include "model/require.h"

#include <stddef.h>
#include <string.h>

static const model_kind_t *const mixer_kinds[] = {
    [MODEL_MIXER_NONE] = NULL,
    [MODEL_MIXER_ATTENTION] = &model_kind_attention,
    [MODEL_MIXER_MAMBA2] = &model_kind_mamba2,
    [MODEL_MIXER_MLA] = &model_kind_mla,
};
_Static_assert(sizeof mixer_kinds / sizeof mixer_kinds[0] == MODEL_MIXER_COUNT,
               "one entry per mixer kind");

static const model_kind_t *const ffn_kinds[] = {
    [MODEL_FFN_NONE] = NULL,
    [MODEL_FFN_DENSE] = &model_kind_mlp,
    [MODEL_FFN_MOE] = &model_kind_moe,
};
_Static_assert(sizeof ffn_kinds / sizeof ffn_kinds[0] == MODEL_FFN_COUNT,
               "one entry per feed-forward kind");

const model_kind_t *model_mixer_kind(unsigned k)
{
    return k < MODEL_MIXER_COUNT ? mixer_kinds[k] : NULL;
}

const model_kind_t *model_ffn_kind(unsigned k) { return k < MODEL_FFN_COUNT ? ffn_kinds[k] : NULL; }

void model_config_blocks_uniform(model_config_t *c, model_mixer_kind_t mixer, model_ffn_kind_t ffn)
{
    for (int l = 0; l < MODEL_MAX_LAYERS; l++)
        c->blocks[l] = (model_block_t){.mixer = (uint8_t)mixer, .ffn = (uint8_t)ffn};
}

void model_config_llama(model_config_t *c, const model_llama_dims_t *d)
{
    memset(c, 0, sizeof *c);
    c->arch = MODEL_ARCH_LLAMA;
    c->vocab_size = d->vocab;
    c->hidden_size = d->hidden;
    c->num_layers = d->layers;
    c->max_position_embeddings = d->max_position;
    c->rms_norm_eps = d->norm_eps;
    c->tie_word_embeddings = d->tie_embeddings;
    c->attn = (model_attn_config_t){
        .num_heads = d->heads, .num_kv_heads = d->kv_heads,
        .head_dim = d->heads > 0 ? d->hidden / d->heads : 0,
        .rope = {.kind = MODEL_ROPE_DEFAULT, .theta = d->rope_theta}};
    c->mlp = (model_mlp_config_t){.intermediate_size = d->ffn};
    model_config_blocks_uniform(c, MODEL_MIXER_ATTENTION, MODEL_FFN_DENSE);
}

bt_status_t model_config_kinds_validate(const model_config_t *c, int tp_size)
{
    /* each kind in use checks its sub-config once */
    bool seen_mixer[MODEL_MIXER_COUNT] = {0}, seen_ffn[MODEL_FFN_COUNT] = {0};
    for (int64_t l = 0; l < c->num_layers; l++) {
        const model_block_t *b = &c->blocks[l];
        if (b->mixer >= MODEL_MIXER_COUNT || b->ffn >= MODEL_FFN_COUNT) {
            log_error("model config: layer %lld has an unknown block kind (%u, %u)", (long long)l,
                      b->mixer, b->ffn);
            return BT_ERR_INVALID;
        }
        if (b->mixer == MODEL_MIXER_NONE && b->ffn == MODEL_FFN_NONE) {
            log_error("model config: layer %lld has neither a mixer nor a feed-forward",
                      (long long)l);
            return BT_ERR_INVALID;
        }
        const model_kind_t *k[2] = {mixer_kinds[b->mixer], ffn_kinds[b->ffn]};
        bool *seen[2] = {&seen_mixer[b->mixer], &seen_ffn[b->ffn]};
        for (int i = 0; i < 2; i++) {
            if (!k[i] || *seen[i]) continue;
            *seen[i] = true;
            bt_status_t st = k[i]->validate(c, tp_size);
            if (st != BT_OK) return st;
        }
    }
    return BT_OK;
}

bt_status_t model_config_validate(const model_config_t *c)
{
    MODEL_REQUIRE((unsigned)c->arch < MODEL_ARCH_COUNT, "model config: unknown architecture %d",
                  (int)c->arch);
    MODEL_REQUIRE(c->vocab_size > 0, "model config: vocab_size=%lld must be > 0",
                  (long long)c->vocab_size);
    MODEL_REQUIRE(c->vocab_size <= INT32_MAX, "model config: vocab_size=%lld too large",
                  (long long)c->vocab_size);
    /* Upper bounds far above any real model keep every shape product inside
     * int64 (and exact in a double): vocab x hidden <= 2^51. */
    MODEL_REQUIRE(c->hidden_size > 0 && c->hidden_size <= MODEL_MAX_HIDDEN,
                  "model config: hidden_size=%lld must be in [1, %d]", (long long)c->hidden_size,
                  MODEL_MAX_HIDDEN);
    MODEL_REQUIRE(c->num_layers > 0 && c->num_layers <= MODEL_MAX_LAYERS,
                  "model config: num_hidden_layers=%lld outside [1, %d]", (long long)c->num_layers,
                  MODEL_MAX_LAYERS);
    MODEL_REQUIRE(c->max_position_embeddings > 0,
                  "model config: max_position_embeddings=%lld must be > 0",
                  (long long)c->max_position_embeddings);
    MODEL_REQUIRE(c->rms_norm_eps > 0 && c->rms_norm_eps < 1,
                  "model config: rms_norm_eps=%g out of range", c->rms_norm_eps);
    return model_config_kinds_validate(c, 1);
}
