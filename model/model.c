/* Model lifetime: config validation, the named parameter layout, the one
 * parameter block and its gradient twin. Forward/backward: model/llama.c. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kernels/kernels.h"

static const char *const model_arch_names[] = {
    [MODEL_ARCH_LLAMA] = "LlamaForCausalLM",
    [MODEL_ARCH_MISTRAL] = "MistralForCausalLM",
    [MODEL_ARCH_QWEN2] = "Qwen2ForCausalLM",
};
_Static_assert(sizeof model_arch_names / sizeof model_arch_names[0] == MODEL_ARCH_COUNT,
               "model_arch_names must name every architecture");

const char *model_arch_name(model_arch_t arch)
{
    return (unsigned)arch < MODEL_ARCH_COUNT ? model_arch_names[arch] : "?";
}

/* Views start on 64-byte boundaries (16 floats) so that kernels see aligned rows. */
#define MODEL_VIEW_ALIGN 16

bt_status_t model_config_validate(const model_config_t *c)
{
#define MODEL_REQUIRE(cond, ...) do { if (!(cond)) { log_error(__VA_ARGS__); \
    return BT_ERR_INVALID; } } while (0)
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
    MODEL_REQUIRE(c->intermediate_size > 0 && c->intermediate_size <= MODEL_MAX_FFN,
                  "model config: intermediate_size=%lld must be in [1, %d]",
                  (long long)c->intermediate_size, MODEL_MAX_FFN);
    MODEL_REQUIRE(c->num_heads <= MODEL_MAX_HEADS && c->head_dim <= MODEL_MAX_HEAD_DIM,
                  "model config: num_attention_heads=%lld and head_dim=%lld must be at most %d "
                  "and %d", (long long)c->num_heads, (long long)c->head_dim, MODEL_MAX_HEADS,
                  MODEL_MAX_HEAD_DIM);
    MODEL_REQUIRE(c->num_layers > 0 && c->num_layers < 100000,
                  "model config: num_hidden_layers=%lld out of range", (long long)c->num_layers);
    MODEL_REQUIRE(c->num_heads > 0, "model config: num_attention_heads=%lld must be > 0",
                  (long long)c->num_heads);
    MODEL_REQUIRE(c->num_kv_heads > 0 && c->num_heads % c->num_kv_heads == 0,
                  "model config: num_key_value_heads=%lld must divide num_attention_heads=%lld",
                  (long long)c->num_kv_heads, (long long)c->num_heads);
    MODEL_REQUIRE(c->head_dim > 0 && c->head_dim % 2 == 0,
                  "model config: head_dim=%lld must be even and > 0", (long long)c->head_dim);
    MODEL_REQUIRE(c->max_position_embeddings > 0,
                  "model config: max_position_embeddings=%lld must be > 0",
                  (long long)c->max_position_embeddings);
    MODEL_REQUIRE(c->sliding_window >= 0, "model config: sliding_window=%lld must be >= 0",
                  (long long)c->sliding_window);
    MODEL_REQUIRE(c->rms_norm_eps > 0 && c->rms_norm_eps < 1,
                  "model config: rms_norm_eps=%g out of range", c->rms_norm_eps);
    MODEL_REQUIRE((unsigned)c->rope.kind < MODEL_ROPE_COUNT, "model config: unknown rope kind %d",
                  (int)c->rope.kind);
    MODEL_REQUIRE(c->rope.theta > 0, "model config: rope_theta=%g must be > 0", c->rope.theta);
    if (c->rope.kind != MODEL_ROPE_DEFAULT)
        MODEL_REQUIRE(c->rope.factor > 0, "model config: rope factor=%g must be > 0",
                      c->rope.factor);
    if (c->rope.kind == MODEL_ROPE_LLAMA3) {
        MODEL_REQUIRE(c->rope.high_freq_factor > c->rope.low_freq_factor &&
                      c->rope.low_freq_factor > 0,
                      "model config: llama3 rope needs high_freq_factor > low_freq_factor > 0 "
                      "(got %g, %g)", c->rope.high_freq_factor, c->rope.low_freq_factor);
        MODEL_REQUIRE(c->rope.original_max_position > 0,
                      "model config: llama3 rope original_max_position_embeddings=%lld",
                      (long long)c->rope.original_max_position);
    }
    return BT_OK;
#undef MODEL_REQUIRE
}

model_stage_t model_stage_full(const model_config_t *cfg)
{
    return (model_stage_t){.first_layer = 0, .last_layer = (int)cfg->num_layers,
                           .has_embedding = true, .has_head = true};
}

/* Layout under construction for one TP rank. */
typedef struct {
    model_param_t *out; /* NULL: count only */
    int            n;
    int            tp_rank, tp_size;
    /* floats of the parameter block with its view alignment, and those of
     * the vocabulary-sized tensors: doubles, so that no config wraps them */
    double         elems, vocab_elems;
} layout_ctx_t;

/* Appends one parameter of HF shape [d0, d1] (ndim 1: [d0]) to the layout,
 * split along `dim` over the TP group (near-even; exact for heads and the
 * MLP, which validation makes divisible), and returns its index. */
static int layout_add(layout_ctx_t *lc, int ndim, int64_t d0, int64_t d1, model_shard_dim_t dim,
                      const char *fmt, int layer, const char *suffix)
{
    int64_t shape[2] = {d0, ndim > 1 ? d1 : 1}, shard_offset = 0;
    if (dim != MODEL_SHARD_NONE)
        model_tp_split(shape[dim], lc->tp_size, lc->tp_rank, &shard_offset, &shape[dim]);
    double numel = (double)shape[0] * (double)shape[1];
    lc->elems = ceil(lc->elems / MODEL_VIEW_ALIGN) * MODEL_VIEW_ALIGN + numel;
    if (layer < 0 && (!strcmp(fmt, "model.embed_tokens.weight") || !strcmp(fmt, "lm_head.weight")))
        lc->vocab_elems += numel;
    if (lc->out) {
        model_param_t *p = &lc->out[lc->n];
        memset(p, 0, sizeof *p);
        if (layer >= 0) snprintf(p->name, sizeof p->name, fmt, layer, suffix);
        else snprintf(p->name, sizeof p->name, "%s", fmt);
        p->shard_dim = dim;
        p->full_shape[0] = d0;
        p->full_shape[1] = ndim > 1 ? d1 : 1;
        p->shard_offset = shard_offset;
        p->t.dtype = DT_F32;
        p->t.device = DEVICE_CPU;
        p->t.ndim = ndim;
        p->t.shape[0] = shape[0];
        p->t.shape[1] = shape[1];
        p->t.stride[0] = ndim > 1 ? shape[1] : 1;
        p->t.stride[1] = 1;
    }
    return lc->n++;
}

/* Megatron splits: q/k/v, gate/up (and their biases) column-parallel (rows of
 * the HF [out, in] weight), o/down row-parallel (columns) with replicated
 * biases, embedding and lm_head by vocabulary rows, norms replicated. */
static int layout_build_ctx(layout_ctx_t *ctx, const model_config_t *c, const model_stage_t *st,
                            model_layer_ix_t *lix, int *embed, int *final_norm, int *lm_head);

static int layout_build(const model_config_t *c, const model_stage_t *st,
                        const model_parallel_t *par, model_param_t *out, model_layer_ix_t *lix,
                        int *embed, int *final_norm, int *lm_head)
{
    layout_ctx_t lc = {.out = out, .tp_rank = par ? par->tp_rank : 0,
                       .tp_size = par ? par->tp_size : 1};
    return layout_build_ctx(&lc, c, st, lix, embed, final_norm, lm_head);
}

static int layout_build_ctx(layout_ctx_t *ctx, const model_config_t *c, const model_stage_t *st,
                            model_layer_ix_t *lix, int *embed, int *final_norm, int *lm_head)
{
    layout_ctx_t lc = *ctx;
    int64_t C = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    int64_t Cq = c->num_heads * c->head_dim, Ckv = c->num_kv_heads * c->head_dim;
    const model_shard_dim_t ROW = MODEL_SHARD_ROWS, COL = MODEL_SHARD_COLS, REP = MODEL_SHARD_NONE;
    const char *L = "model.layers.%d.%s";
    int e = -1, fn = -1, lh = -1;
    if (st->has_embedding || (st->has_head && c->tie_word_embeddings))
        e = layout_add(&lc, 2, V, C, ROW, "model.embed_tokens.weight", -1, NULL);
    for (int l = st->first_layer; l < st->last_layer; l++) {
        model_layer_ix_t x;
        memset(&x, -1, sizeof x);
        x.input_norm = layout_add(&lc, 1, C, 0, REP, L, l, "input_layernorm.weight");
        x.q = layout_add(&lc, 2, Cq, C, ROW, L, l, "self_attn.q_proj.weight");
        if (c->qkv_bias) x.q_bias = layout_add(&lc, 1, Cq, 0, ROW, L, l, "self_attn.q_proj.bias");
        x.k = layout_add(&lc, 2, Ckv, C, ROW, L, l, "self_attn.k_proj.weight");
        if (c->qkv_bias) x.k_bias = layout_add(&lc, 1, Ckv, 0, ROW, L, l, "self_attn.k_proj.bias");
        x.v = layout_add(&lc, 2, Ckv, C, ROW, L, l, "self_attn.v_proj.weight");
        if (c->qkv_bias) x.v_bias = layout_add(&lc, 1, Ckv, 0, ROW, L, l, "self_attn.v_proj.bias");
        x.o = layout_add(&lc, 2, C, Cq, COL, L, l, "self_attn.o_proj.weight");
        if (c->o_bias) x.o_bias = layout_add(&lc, 1, C, 0, REP, L, l, "self_attn.o_proj.bias");
        x.post_norm = layout_add(&lc, 1, C, 0, REP, L, l, "post_attention_layernorm.weight");
        x.gate = layout_add(&lc, 2, F, C, ROW, L, l, "mlp.gate_proj.weight");
        if (c->mlp_bias) x.gate_bias = layout_add(&lc, 1, F, 0, ROW, L, l, "mlp.gate_proj.bias");
        x.up = layout_add(&lc, 2, F, C, ROW, L, l, "mlp.up_proj.weight");
        if (c->mlp_bias) x.up_bias = layout_add(&lc, 1, F, 0, ROW, L, l, "mlp.up_proj.bias");
        x.down = layout_add(&lc, 2, C, F, COL, L, l, "mlp.down_proj.weight");
        if (c->mlp_bias) x.down_bias = layout_add(&lc, 1, C, 0, REP, L, l, "mlp.down_proj.bias");
        if (lix) lix[l - st->first_layer] = x;
    }
    if (st->has_head) {
        fn = layout_add(&lc, 1, C, 0, REP, "model.norm.weight", -1, NULL);
        lh = c->tie_word_embeddings ? e : layout_add(&lc, 2, V, C, ROW, "lm_head.weight", -1, NULL);
    }
    if (embed) *embed = st->has_embedding ? e : -1;
    if (final_norm) *final_norm = fn;
    if (lm_head) *lm_head = lh;
    *ctx = lc;
    return lc.n;
}

void model_mem_estimate(const model_config_t *cfg, const model_stage_t *stage, int tp_rank,
                        int tp_size, int64_t B, int64_t T, model_mem_t *out)
{
    model_stage_t full = model_stage_full(cfg);
    const model_stage_t *s = stage ? stage : &full;
    layout_ctx_t lc = {.out = NULL, .tp_rank = tp_rank, .tp_size = tp_size > 0 ? tp_size : 1};
    layout_build_ctx(&lc, cfg, s, NULL, NULL, NULL, NULL);
    memset(out, 0, sizeof *out);
    out->params = 4.0 * lc.elems;
    out->vocab_params = 4.0 * lc.vocab_elems;
    if (B > 0 && T > 0) {
        int64_t vs, vocab;
        model_tp_split(cfg->vocab_size, lc.tp_size, tp_rank, &vs, &vocab);
        model_acts_dims_t d = {
            .C = cfg->hidden_size, .F = cfg->intermediate_size / lc.tp_size,
            .Hq = cfg->num_heads / lc.tp_size, .Hkv = cfg->num_kv_heads / lc.tp_size,
            .D = cfg->head_dim, .V = vocab, .layers = s->last_layer - s->first_layer,
            .head = s->has_head,
        };
        out->acts = model_acts_bytes(&d, B, T);
    }
}

int model_layout(const model_config_t *cfg, const model_stage_t *stage, model_param_t *out)
{
    return model_layout_tp(cfg, stage, NULL, out);
}

int model_layout_tp(const model_config_t *cfg, const model_stage_t *stage,
                    const model_parallel_t *par, model_param_t *out)
{
    model_stage_t full = model_stage_full(cfg);
    return layout_build(cfg, stage ? stage : &full, par, out, NULL, NULL, NULL, NULL);
}

bt_status_t model_create(const model_config_t *cfg, const model_stage_t *stage, model_t **out)
{
    return model_create_tp(cfg, stage, NULL, out);
}

bt_status_t model_create_tp(const model_config_t *cfg, const model_stage_t *stage,
                            const model_parallel_t *par, model_t **out)
{
    bt_status_t st = model_config_validate(cfg);
    if (st != BT_OK) return st;
    model_parallel_t solo = {.tp_rank = 0, .tp_size = 1, .tp_comm = NULL};
    if (!par) par = &solo;
    if ((st = model_parallel_validate(cfg, par)) != BT_OK) return st;
    model_stage_t full = model_stage_full(cfg);
    const model_stage_t *s = stage ? stage : &full;
    if (s->first_layer < 0 || s->last_layer < s->first_layer || s->last_layer > cfg->num_layers) {
        log_error("model: stage layers [%d, %d) outside the model's %lld layers", s->first_layer,
                  s->last_layer, (long long)cfg->num_layers);
        return BT_ERR_INVALID;
    }
    model_mem_t mem;
    model_mem_estimate(cfg, s, par->tp_rank, par->tp_size, 0, 0, &mem);
    if (mem.params > 0x1p62) { /* would wrap the size_t offsets below */
        log_error("model: the parameters would take %.3g bytes", mem.params);
        return BT_ERR_NOMEM;
    }
    model_t *m = calloc(1, sizeof *m);
    if (!m) return BT_ERR_NOMEM;
    m->cfg = *cfg;
    m->stage = *s;
    m->par = *par;
    m->n_heads = cfg->num_heads / par->tp_size;
    m->n_kv_heads = cfg->num_kv_heads / par->tp_size;
    m->ffn = cfg->intermediate_size / par->tp_size;
    model_tp_split(cfg->vocab_size, par->tp_size, par->tp_rank, &m->vocab_start, &m->vocab);
    int nl = s->last_layer - s->first_layer;
    int n = layout_build(cfg, s, par, NULL, NULL, NULL, NULL, NULL);
    m->params = calloc((size_t)n ? (size_t)n : 1, sizeof *m->params);
    m->grads = calloc((size_t)n ? (size_t)n : 1, sizeof *m->grads);
    m->layers = calloc(nl ? (size_t)nl : 1, sizeof *m->layers);
    if (!m->params || !m->grads || !m->layers) {
        st = BT_ERR_NOMEM;
        goto free_model;
    }
    m->n_params = layout_build(cfg, s, par, m->params, m->layers, &m->embed, &m->final_norm,
                               &m->lm_head);
    size_t off = 0;
    for (int i = 0; i < m->n_params; i++) {
        off = (off + MODEL_VIEW_ALIGN - 1) / MODEL_VIEW_ALIGN * MODEL_VIEW_ALIGN;
        m->params[i].t.data = (void *)(uintptr_t)off; /* offset until the block exists */
        off += (size_t)tensor_numel(&m->params[i].t);
    }
    m->n_elems = off;
    m->param_mem = aligned_alloc(64, (off * sizeof(float) + 63) / 64 * 64);
    if (!m->param_mem) {
        log_error("model: cannot allocate %zu parameters", off);
        st = BT_ERR_NOMEM;
        goto free_model;
    }
    memset(m->param_mem, 0, off * sizeof(float));
    for (int i = 0; i < m->n_params; i++) {
        size_t o = (size_t)(uintptr_t)m->params[i].t.data;
        m->params[i].t.data = m->param_mem + o;
        m->grads[i] = m->params[i];
        m->grads[i].t.data = NULL;
    }
    *out = m;
    return BT_OK;

free_model:
    free(m->layers);
    free(m->grads);
    free(m->params);
    free(m);
    return st;
}

void model_destroy(model_t *m)
{
    if (!m) return;
    free(m->grad_mem);
    free(m->param_mem);
    free(m->layers);
    free(m->grads);
    free(m->params);
    free(m);
}

int model_param_find(const model_t *m, const char *name)
{
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) return i;
    return -1;
}

bt_status_t model_grads_alloc(model_t *m)
{
    if (m->grad_mem) return BT_OK;
    m->grad_mem = aligned_alloc(64, (m->n_elems * sizeof(float) + 63) / 64 * 64);
    if (!m->grad_mem) {
        log_error("model: cannot allocate gradients for %zu parameters", m->n_elems);
        return BT_ERR_NOMEM;
    }
    memset(m->grad_mem, 0, m->n_elems * sizeof(float));
    for (int i = 0; i < m->n_params; i++)
        m->grads[i].t.data = m->grad_mem + ((float *)m->params[i].t.data - m->param_mem);
    return BT_OK;
}

void model_grads_zero(model_t *m)
{
    if (m->grad_mem) memset(m->grad_mem, 0, m->n_elems * sizeof(float));
}

double model_grads_sumsq(const model_t *m)
{
    if (!m->grad_mem) return 0.0;
    double s = 0.0;
    for (int i = 0; i < m->n_params; i++) s += kern_sumsq(&m->grads[i].t);
    return s;
}

/* splitmix64, addressed by draw number: draw k (0-based) from seed s. Being
 * counter-based lets a TP shard draw exactly its elements' numbers. */
static uint64_t model_rng_at(uint64_t s, uint64_t k)
{
    uint64_t z = s + (k + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double model_rng_uniform(uint64_t s, uint64_t k)
{
    return ((double)(model_rng_at(s, k) >> 11) + 0.5) / 9007199254740992.0;
}

void model_init_random(model_t *m, uint64_t seed, float std)
{
    for (int i = 0; i < m->n_params; i++) {
        model_param_t *p = &m->params[i];
        float *d = p->t.data;
        int64_t rows = p->t.shape[0], cols = p->t.ndim > 1 ? p->t.shape[1] : 1;
        int64_t full_cols = p->t.ndim > 1 ? p->full_shape[1] : 1;
        size_t len = strlen(p->name);
        bool is_norm = len > 11 && strstr(p->name, "norm.weight") != NULL;
        bool is_bias = len > 5 && !strcmp(p->name + len - 5, ".bias");
        /* Seed per tensor by name so that a stage initializes its layers
         * exactly as the whole model would; element j of the HF tensor uses
         * draws 2j and 2j+1, so a TP shard gets its slice of the same values. */
        uint64_t s = seed;
        for (size_t k = 0; k < len; k++) s = (s ^ (uint8_t)p->name[k]) * 0x100000001b3ull;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                int64_t gr = r, gc = c;
                if (p->shard_dim == MODEL_SHARD_ROWS) gr += p->shard_offset;
                if (p->shard_dim == MODEL_SHARD_COLS) gc += p->shard_offset;
                uint64_t g = (uint64_t)(gr * full_cols + gc);
                float *dst = &d[r * cols + c];
                if (is_norm) *dst = 1.0f;
                else if (is_bias) *dst = 0.0f;
                else {
                    double u1 = model_rng_uniform(s, 2 * g), u2 = model_rng_uniform(s, 2 * g + 1);
                    *dst = (float)(std * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
                }
            }
    }
}

void model_targets_from_ids(int32_t *targets, const int32_t *ids, const int64_t *len,
                            int64_t B, int64_t T)
{
    for (int64_t b = 0; b < B; b++) {
        int64_t n = len ? len[b] : T;
        for (int64_t t = 0; t < T; t++)
            targets[b * T + t] = t + 1 < n ? ids[b * T + t + 1] : MODEL_IGNORE_INDEX;
    }
}

int64_t model_count_scored(const int32_t *targets, int64_t n)
{
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += targets[i] != MODEL_IGNORE_INDEX;
    return k;
}

int64_t model_num_params(const model_config_t *cfg)
{
    int n = model_layout(cfg, NULL, NULL);
    model_param_t *p = calloc((size_t)n, sizeof *p);
    if (!p) return -1;
    model_layout(cfg, NULL, p);
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += tensor_numel(&p[i].t);
    free(p);
    return total;
}

double model_flops_per_token(const model_config_t *c, int64_t T)
{
    /* 6 flops per matmul weight per token (forward 2, backward 4), the
     * embedding lookup excluded; attention scores and values 12*L*Hq*D*T
     * (PaLM's convention, not halved for the causal mask). */
    int64_t C = c->hidden_size, F = c->intermediate_size;
    int64_t Cq = c->num_heads * c->head_dim, Ckv = c->num_kv_heads * c->head_dim;
    double per_layer = (double)C * Cq * 2 + (double)C * Ckv * 2 + 3.0 * C * F;
    double dense = per_layer * (double)c->num_layers + (double)c->vocab_size * C;
    return 6.0 * dense + 12.0 * (double)c->num_layers * (double)Cq * (double)T;
}
