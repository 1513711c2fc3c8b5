/* Grouped-query attention with rotary embeddings (MODEL_MIXER_ATTENTION):
 * Llama, Mistral, Qwen2, Qwen3.
 *
 *   q, k, v = ln Wq^T (+bq), ln Wk^T (+bk), ln Wv^T (+bv)
 *   q, k    = rmsnorm(q; wqn), rmsnorm(k; wkn) over each head's D channels
 *             (qk_norm: Qwen3's q_norm, k_norm)
 *   rope(q), rope(k);  y = attention(q, k, v) Wo^T (+bo)
 *
 * TP (Megatron): q/k/v (and their biases) column-parallel by whole heads,
 * each rank holding whole KV-head groups; o row-parallel, its bias
 * replicated and added once after the all-reduce. The input gradient is a
 * partial sum over the ranks' heads and is all-reduced here. The per-head
 * norm weights are replicated; each rank's gradient of them is its heads'
 * share, summed over the group after the backward (grad_tp_partial).
 *
 * More TP ranks than KV heads (tp a multiple of num_key_value_heads): KV
 * heads are replicated, as Megatron does. k/v (and their biases) are then
 * whole on every rank, and each rank computes only the one KV head its
 * query heads use (rows [g D, (g+1) D) of the weights, g = rank / (tp /
 * Hkv)); their gradients are that head's share from this rank's queries,
 * summed over the group like the norms' (grad_tp_partial), so every replica
 * ends the step with the full gradient. */
#include "model/kind.h"
#include "model/require.h"

#include "model/arch.h"

#include "base/log.h"
#include "model/cp_xchg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { A_Q = 0, A_K, A_V, A_O, A_QB, A_KB, A_VB, A_OB, A_QN, A_KN, A_SLOTS };
_Static_assert(A_SLOTS <= MODEL_SUB_SLOTS, "attention slots fit a sublayer");

/* This TP rank's dimensions. */
typedef struct {
    int64_t Hq, Hkv, D, Cq, Ckv, half;
    int64_t kv_head; /* replicated KV heads: the one this rank computes; else -1 */
} attn_dims_t;

/* whether tp ranks replicate the KV heads (more ranks than KV heads) */
static bool attn_kv_replicated(const model_attn_config_t *a, int tp)
{
    return tp > 1 && a->num_kv_heads < tp;
}

static attn_dims_t attn_dims(const model_t *m)
{
    const model_attn_config_t *a = &m->cfg.attn;
    int tp = m->par.tp_size;
    bool rep = attn_kv_replicated(a, tp);
    attn_dims_t d = {.Hq = a->num_heads / tp, .Hkv = rep ? 1 : a->num_kv_heads / tp,
                     .D = a->head_dim, .kv_head = -1};
    if (rep) d.kv_head = m->par.tp_rank / (tp / a->num_kv_heads);
    d.Cq = d.Hq * d.D;
    d.Ckv = d.Hkv * d.D;
    d.half = d.D / 2;
    return d;
}

/* The k/v weight or bias in `slot` as this rank uses it: the whole local
 * tensor, or under replicated KV heads the rows of its one head. */
static tensor_t kv_rows(const attn_dims_t *d, const tensor_t *t)
{
    return d->kv_head < 0 ? *t : tensor_narrow(t, d->kv_head * d->D, d->D);
}

/* kv_rows of a parameter and of its gradient (NULL stays NULL) */
static const tensor_t *kv_param(const model_t *m, const model_sub_t *sub, int slot,
                                const attn_dims_t *d, tensor_t *buf)
{
    const tensor_t *t = model_sub_param(m, sub, slot);
    if (!t || d->kv_head < 0) return t;
    *buf = kv_rows(d, t);
    return buf;
}

static tensor_t *kv_grad(model_t *m, const model_sub_t *sub, int slot, const attn_dims_t *d,
                         tensor_t *buf)
{
    tensor_t *t = model_sub_grad(m, sub, slot);
    if (!t || d->kv_head < 0) return t;
    *buf = kv_rows(d, t);
    return buf;
}

static bt_status_t attn_validate(const model_config_t *c, int tp)
{
    const model_attn_config_t *a = &c->attn;
    const model_rope_t *r = &a->rope;
    MODEL_REQUIRE(a->num_heads > 0 && a->num_heads <= MODEL_MAX_HEADS,
                  "model config: num_attention_heads=%lld must be in [1, %d]",
                  (long long)a->num_heads, MODEL_MAX_HEADS);
    MODEL_REQUIRE(a->num_kv_heads > 0 && a->num_heads % a->num_kv_heads == 0,
                  "model config: num_key_value_heads=%lld must divide num_attention_heads=%lld",
                  (long long)a->num_kv_heads, (long long)a->num_heads);
    MODEL_REQUIRE(a->head_dim > 0 && a->head_dim % 2 == 0 && a->head_dim <= MODEL_MAX_HEAD_DIM,
                  "model config: head_dim=%lld must be even and in [2, %d]", (long long)a->head_dim,
                  MODEL_MAX_HEAD_DIM);
    MODEL_REQUIRE(a->sliding_window >= 0, "model config: sliding_window=%lld must be >= 0",
                  (long long)a->sliding_window);
    MODEL_REQUIRE((unsigned)r->kind < MODEL_ROPE_COUNT, "model config: unknown rope kind %d",
                  (int)r->kind);
    MODEL_REQUIRE(r->kind != MODEL_ROPE_YARN,
                  "model config: rope_type 'yarn' is implemented for DeepseekV2's MLA only");
    if (r->kind != MODEL_ROPE_NONE)
        MODEL_REQUIRE(r->theta > 0, "model config: rope_theta=%g must be > 0", r->theta);
    if (r->kind != MODEL_ROPE_DEFAULT && r->kind != MODEL_ROPE_NONE)
        MODEL_REQUIRE(r->factor > 0, "model config: rope factor=%g must be > 0", r->factor);
    if (r->kind == MODEL_ROPE_LLAMA3) {
        MODEL_REQUIRE(r->high_freq_factor > r->low_freq_factor && r->low_freq_factor > 0,
                      "model config: llama3 rope needs high_freq_factor > low_freq_factor > 0 "
                      "(got %g, %g)",
                      r->high_freq_factor, r->low_freq_factor);
        MODEL_REQUIRE(r->original_max_position > 0,
                      "model config: llama3 rope original_max_position_embeddings=%lld",
                      (long long)r->original_max_position);
    }
    if (tp > 1) {
        MODEL_REQUIRE(a->num_heads % tp == 0,
                      "model: tp_size=%d does not divide num_attention_heads=%lld", tp,
                      (long long)a->num_heads);
        if (attn_kv_replicated(a, tp)) {
            MODEL_REQUIRE(tp % a->num_kv_heads == 0,
                          "model: tp_size=%d is more than num_key_value_heads=%lld but not a "
                          "multiple of it (replicated KV heads: each rank's query heads must "
                          "share one KV head)",
                          tp, (long long)a->num_kv_heads);
            MODEL_REQUIRE(!model_arch_info(c->arch)->fused_qkv,
                          "model: tp_size=%d is more than num_key_value_heads=%lld, and the "
                          "fused qkv_proj of %s cannot replicate its KV heads",
                          tp, (long long)a->num_kv_heads, model_arch_name(c->arch));
        } else {
            MODEL_REQUIRE(a->num_kv_heads % tp == 0,
                          "model: tp_size=%d does not divide num_key_value_heads=%lld (each TP "
                          "rank holds whole KV-head groups, or with more ranks than KV heads "
                          "a multiple of them replicates each)",
                          tp, (long long)a->num_kv_heads);
        }
    }
    return BT_OK;
}

static void attn_layout(model_layout_t *lb, const model_config_t *c, const char *prefix,
                        model_sub_t *sub)
{
    const model_attn_config_t *a = &c->attn;
    int64_t C = c->hidden_size, D = a->head_dim;
    int64_t Cq = a->num_heads * D, Ckv = a->num_kv_heads * D;
    char n[MODEL_NAME_MAX];
#define ADD(slot, suffix, ndim, d0, d1, dim)                                                       \
    do {                                                                                           \
        snprintf(n, sizeof n, "%s.%s", prefix, suffix);                                            \
        sub->ix[slot] = model_layout_add(lb, n, ndim, d0, d1, dim, D);                             \
    } while (0)
    /* q, k, v (and their biases) of their own, or row parts 0, 1, 2 of the
     * architecture's fused tensor (Phi-3's qkv_proj: model.h MODEL_PART_MARK),
     * each TP-split by heads all the same */
    const char *fused = model_arch_info(c->arch)->fused_qkv;
    static const char *const own[3] = {"q_proj", "k_proj", "v_proj"};
    const int w_slot[3] = {A_Q, A_K, A_V}, b_slot[3] = {A_QB, A_KB, A_VB};
    const int64_t rows[3] = {Cq, Ckv, Ckv};
    const bool rep = attn_kv_replicated(a, lb->tp_size); /* k, v whole on every rank */
    for (int i = 0; i < 3; i++) {
        char w[64], b[64];
        model_layout_proj_name(w, sizeof w, fused, i, own[i], "weight");
        model_layout_proj_name(b, sizeof b, fused, i, own[i], "bias");
        const int split = rep && i > 0 ? -1 : 0;
        ADD(w_slot[i], w, 2, rows[i], C, split);
        if (split < 0) model_layout_grad_tp_partial(lb, sub->ix[w_slot[i]]);
        if (a->qkv_bias) {
            ADD(b_slot[i], b, 1, rows[i], 0, split);
            if (split < 0) model_layout_grad_tp_partial(lb, sub->ix[b_slot[i]]);
        }
    }
    ADD(A_O, "o_proj.weight", 2, C, Cq, 1);
    if (a->o_bias) ADD(A_OB, "o_proj.bias", 1, C, 0, -1);
    if (a->qk_norm) {
        ADD(A_QN, "q_norm.weight", 1, D, 0, -1);
        model_layout_grad_tp_partial(lb, sub->ix[A_QN]);
        ADD(A_KN, "k_norm.weight", 1, D, 0, -1);
        model_layout_grad_tp_partial(lb, sub->ix[A_KN]);
    }
#undef ADD
}

/* saved: q [N,Cq] k v [N,Ckv] att [N,Cq] (activation dtype), lse [B,Hq,T] f32;
 * with qk_norm also the norms' inputs qp [N,Cq] kp [N,Ckv] (activation
 * dtype) and their rstd [N*Hq], [N*Hkv] f32 */
typedef struct {
    size_t q, k, v, att, lse, qp, kp, qr, kr, total;
} attn_saved_t;

static attn_saved_t attn_saved_layout(const model_t *m, int64_t B, int64_t T)
{
    attn_dims_t d = attn_dims(m);
    size_t N = (size_t)(B * T), es = dtype_size(m->place.act_dtype);
    attn_saved_t s;
    s.q = 0;
    s.k = s.q + model_align(N * (size_t)d.Cq * es);
    s.v = s.k + model_align(N * (size_t)d.Ckv * es);
    s.att = s.v + model_align(N * (size_t)d.Ckv * es);
    s.lse = s.att + model_align(N * (size_t)d.Cq * es);
    s.qp = s.lse + model_align((size_t)(B * d.Hq * T) * sizeof(float));
    s.total = s.qp;
    if (m->cfg.attn.qk_norm) {
        s.kp = s.qp + model_align(N * (size_t)d.Cq * es);
        s.qr = s.kp + model_align(N * (size_t)d.Ckv * es);
        s.kr = s.qr + model_align(N * (size_t)d.Hq * sizeof(float));
        s.total = s.kr + model_align(N * (size_t)d.Hkv * sizeof(float));
    }
    return s;
}

static double attn_saved_bytes(const model_t *m, int64_t B, int64_t T)
{
    attn_dims_t d = attn_dims(m);
    double N = (double)B * (double)T, es = (double)dtype_size(m->place.act_dtype);
    double b = 2 * model_align_d(N * (double)d.Cq * es) + 2 * model_align_d(N * (double)d.Ckv * es) +
               model_align_d((double)B * (double)d.Hq * (double)T * 4);
    if (m->cfg.attn.qk_norm)
        b += model_align_d(N * (double)d.Cq * es) + model_align_d(N * (double)d.Ckv * es) +
             model_align_d(N * (double)d.Hq * 4) + model_align_d(N * (double)d.Hkv * 4);
    return b;
}

/* scratch: datt dq dqr [N,Cq], dk dkr dv [N,Ckv], then context parallelism's
 * (model/cp_xchg.h) */
static double attn_scratch_bytes(const model_t *m, int64_t B, int64_t T)
{
    attn_dims_t d = attn_dims(m);
    double N = (double)B * (double)T, es = (double)dtype_size(m->place.act_dtype);
    return 3 * model_align_d(N * (double)d.Cq * es) + 3 * model_align_d(N * (double)d.Ckv * es) +
           model_cp_attn_scratch_bytes(m, B, T, d.Hq, d.Hkv, d.D, d.D);
}

/* shared: the RoPE tables cos, sin [T, D/2] f32 for positions 0..T-1 */
static double attn_shared_bytes(const model_t *m, int64_t T)
{
    return 2 * model_align_d((double)T * (double)(m->cfg.attn.head_dim / 2) * 4);
}

/* Inverse frequencies as transformers computes them (float32 arithmetic). */
static void rope_inv_freq(const model_attn_config_t *c, float *inv, int64_t half)
{
    const model_rope_t *r = &c->rope;
    int64_t dim = c->head_dim;
    for (int64_t i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)dim;
        float f = 1.0f / powf((float)r->theta, e);
        if (r->kind == MODEL_ROPE_LINEAR) {
            f = f / (float)r->factor;
        } else if (r->kind == MODEL_ROPE_LLAMA3) {
            double old = (double)r->original_max_position;
            double low_wl = old / r->low_freq_factor, high_wl = old / r->high_freq_factor;
            double wl = 2.0 * M_PI / (double)f;
            float scaled = wl > low_wl ? f / (float)r->factor : f;
            if (!(wl < high_wl) && !(wl > low_wl)) {
                double smooth =
                    (old / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
                scaled = (float)((1.0 - smooth) * scaled / r->factor + smooth * scaled);
            }
            f = scaled;
        }
        inv[i] = f;
    }
}

static void rope_tables(const model_t *m, int64_t T, void *shared, tensor_t *cos, tensor_t *sin)
{
    int64_t half = m->cfg.attn.head_dim / 2, shape[2] = {T, half};
    size_t bytes = model_align((size_t)(T * half) * sizeof(float));
    *cos = tensor_make(shared, DT_F32, m->place.dev, 2, shape);
    *sin = tensor_make((char *)shared + bytes, DT_F32, m->place.dev, 2, shape);
}

/* The sliding window of layer l's attention, 0 when it has none. */
static int64_t attn_window(const model_t *m, int layer)
{
    return layer >= 0 && layer < MODEL_MAX_LAYERS && m->cfg.blocks[layer].sliding
               ? m->cfg.attn.sliding_window
               : 0;
}

static bt_status_t attn_shared_init(const model_t *m, int64_t T, void *shared)
{
    const model_attn_config_t *c = &m->cfg.attn;
    bool slides = false;
    for (int k = 0; k < m->n_subs; k++)
        slides |= m->subs[k].kind == &model_kind_attention && attn_window(m, m->subs[k].layer) > 0;
    char why[256] = "";
    if (slides && T > c->sliding_window &&
        (m->par.cp_size > 1 ||
         !kern_attention_window_supported(m->place.dev, m->place.act_dtype, why, sizeof why))) {
        log_error("model: sequence length %lld exceeds sliding_window=%lld, and sliding-window "
                  "attention %s",
                  (long long)T, (long long)c->sliding_window,
                  m->par.cp_size > 1 ? "does not run under context parallelism (the CP exchanges "
                                       "do not cut keys to it)"
                                     : why);
        return BT_ERR_UNSUPPORTED;
    }
    if (c->rope.kind == MODEL_ROPE_NONE) return BT_OK; /* the tables are never read */
    int64_t half = c->head_dim / 2;
    float *inv = malloc((size_t)half * sizeof *inv);
    float *h = malloc((size_t)(2 * T * half) * sizeof *h);
    if (!inv || !h) {
        free(inv);
        free(h);
        return BT_ERR_NOMEM;
    }
    rope_inv_freq(c, inv, half);
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < half; i++) {
            float ang = (float)t * inv[i];
            h[t * half + i] = cosf(ang);
            h[T * half + t * half + i] = sinf(ang);
        }
    tensor_t cos, sin;
    rope_tables(m, T, shared, &cos, &sin);
    kern_upload(m->stream, &cos, h);
    kern_upload(m->stream, &sin, h + T * half);
    bt_status_t st = kern_stream_sync(m->stream);
    free(inv);
    free(h);
    return st;
}

/* The views of one sublayer's saved region. */
typedef struct {
    tensor_t q, k, v, att, q4, k4, v4, att4, lse;
    tensor_t qp, kp, qr, kr; /* qk_norm: the norms' inputs and rstd */
} attn_views_t;

static attn_views_t attn_views(const model_run_t *r, void *saved)
{
    const model_t *m = r->m;
    attn_dims_t d = attn_dims(m);
    attn_saved_t L = attn_saved_layout(m, r->B, r->T);
    int64_t N = r->N;
    attn_views_t v;
    v.q = model_act_view(m, saved, L.q, 2, (int64_t[]){N, d.Cq});
    v.k = model_act_view(m, saved, L.k, 2, (int64_t[]){N, d.Ckv});
    v.v = model_act_view(m, saved, L.v, 2, (int64_t[]){N, d.Ckv});
    v.att = model_act_view(m, saved, L.att, 2, (int64_t[]){N, d.Cq});
    v.q4 = model_act_view(m, saved, L.q, 4, (int64_t[]){r->B, r->T, d.Hq, d.D});
    v.k4 = model_act_view(m, saved, L.k, 4, (int64_t[]){r->B, r->T, d.Hkv, d.D});
    v.v4 = model_act_view(m, saved, L.v, 4, (int64_t[]){r->B, r->T, d.Hkv, d.D});
    v.att4 = model_act_view(m, saved, L.att, 4, (int64_t[]){r->B, r->T, d.Hq, d.D});
    v.lse = tensor_make((char *)saved + L.lse, DT_F32, m->place.dev, 3,
                        (int64_t[]){r->B, d.Hq, r->T});
    if (m->cfg.attn.qk_norm) {
        v.qp = model_act_view(m, saved, L.qp, 2, (int64_t[]){N, d.Cq});
        v.kp = model_act_view(m, saved, L.kp, 2, (int64_t[]){N, d.Ckv});
        v.qr = tensor_make((char *)saved + L.qr, DT_F32, m->place.dev, 1, (int64_t[]){N * d.Hq});
        v.kr = tensor_make((char *)saved + L.kr, DT_F32, m->place.dev, 1, (int64_t[]){N * d.Hkv});
    }
    return v;
}

/* decode cache: K then V, [T, Ckv] each (B = 1), after RoPE (model_kv_cache_append) */
static double attn_cache_bytes(const model_t *m, int64_t T)
{
    attn_dims_t d = attn_dims(m);
    return model_kv_cache_bytes(m, T, d.Ckv, d.Ckv);
}

/* Context parallelism (docs/PARALLEL.md, model/cp_xchg.h): its scratch,
 * after the non-CP backward's part. */
static char *attn_cp_base(const model_run_t *r, const attn_dims_t *d)
{
    size_t es = dtype_size(r->m->place.act_dtype);
    size_t bq = model_align((size_t)(r->N * d->Cq) * es), bkv = model_align((size_t)(r->N * d->Ckv) * es);
    return (char *)r->scratch + 3 * bq + 3 * bkv;
}

/* [N, H*D] seen as [N*H, D]: one row per head and position (the per-head
 * norms of qk_norm). */
static tensor_t heads_rows(const tensor_t *t, int64_t D)
{
    int64_t shape[2] = {tensor_numel(t) / D, D};
    return tensor_reshape(t, 2, shape);
}

static bt_status_t attn_forward(model_run_t *r, const model_sub_t *sub, void *saved,
                                const tensor_t *ln, tensor_t *y)
{
    model_t *m = r->m;
    kern_stream_t *s = r->s;
    attn_dims_t d = attn_dims(m);
    attn_views_t v = attn_views(r, saved);
    tensor_t cos, sin;
    rope_tables(m, r->T_cap, r->shared, &cos, &sin);
    float scale = 1.0f / sqrtf((float)d.D);
    bool qkn = m->cfg.attn.qk_norm;
    kern_linear_fwd(s, qkn ? &v.qp : &v.q, ln, model_sub_param(m, sub, A_Q),
                    model_sub_param(m, sub, A_QB));
    tensor_t kw, kb, vw, vb; /* this rank's KV rows (replicated KV heads) */
    kern_linear_fwd(s, qkn ? &v.kp : &v.k, ln, kv_param(m, sub, A_K, &d, &kw),
                    kv_param(m, sub, A_KB, &d, &kb));
    kern_linear_fwd(s, &v.v, ln, kv_param(m, sub, A_V, &d, &vw), kv_param(m, sub, A_VB, &d, &vb));
    if (qkn) { /* every head's D channels a row of its own */
        float eps = (float)m->cfg.rms_norm_eps;
        tensor_t q2 = heads_rows(&v.q, d.D), k2 = heads_rows(&v.k, d.D);
        tensor_t qp2 = heads_rows(&v.qp, d.D), kp2 = heads_rows(&v.kp, d.D);
        kern_rmsnorm_fwd(s, &q2, &v.qr, &qp2, model_sub_param(m, sub, A_QN), eps);
        kern_rmsnorm_fwd(s, &k2, &v.kr, &kp2, model_sub_param(m, sub, A_KN), eps);
    }
    if (m->cfg.attn.rope.kind != MODEL_ROPE_NONE) {
        kern_rope_fwd(s, &v.q4, &v.q4, &cos, &sin, r->pos);
        kern_rope_fwd(s, &v.k4, &v.k4, &cos, &sin, r->pos);
    }
    if (r->cache) { /* decoding: attend over every cached position and these */
        tensor_t k4, v4;
        model_kv_cache_append(r, &v.k, &v.v, d.Hkv, d.D, d.D, &k4, &v4);
        kern_attention_fwd_window(s, &v.att4, &v.lse, &v.q4, &k4, &v4, scale, true, r->pos0,
                                  attn_window(m, sub->layer));
    } else if (m->par.cp_size > 1) {
        bt_status_t st = model_cp_attn_fwd(m, attn_cp_base(r, &d), &v.att4, &v.lse, &v.q4, &v.k4,
                                           &v.v4, scale, sub->layer);
        if (st != BT_OK) return st;
    } else {
        kern_attention_fwd_window(s, &v.att4, &v.lse, &v.q4, &v.k4, &v.v4, scale, true, 0,
                                  attn_window(m, sub->layer));
    }
    return model_row_parallel_fwd(r, y, &v.att, model_sub_param(m, sub, A_O),
                                  model_sub_param(m, sub, A_OB), "o_proj output", sub->layer);
}

static bt_status_t attn_backward(model_run_t *r, const model_sub_t *sub, void *saved,
                                 const tensor_t *ln, const tensor_t *dy, tensor_t *dln)
{
    model_t *m = r->m;
    kern_stream_t *s = r->s;
    attn_dims_t d = attn_dims(m);
    attn_views_t v = attn_views(r, saved);
    tensor_t cos, sin;
    rope_tables(m, r->T_cap, r->shared, &cos, &sin);
    float scale = 1.0f / sqrtf((float)d.D);
    int64_t N = r->N, B = r->B, T = r->T;
    size_t es = dtype_size(m->place.act_dtype);
    size_t bq = model_align((size_t)(N * d.Cq) * es), bkv = model_align((size_t)(N * d.Ckv) * es);
    void *sc = r->scratch;
    tensor_t datt = model_act_view(m, sc, 0, 2, (int64_t[]){N, d.Cq});
    tensor_t datt4 = model_act_view(m, sc, 0, 4, (int64_t[]){B, T, d.Hq, d.D});
    tensor_t dq4 = model_act_view(m, sc, bq, 4, (int64_t[]){B, T, d.Hq, d.D});
    tensor_t dqr = model_act_view(m, sc, 2 * bq, 2, (int64_t[]){N, d.Cq});
    tensor_t dqr4 = model_act_view(m, sc, 2 * bq, 4, (int64_t[]){B, T, d.Hq, d.D});
    tensor_t dk4 = model_act_view(m, sc, 3 * bq, 4, (int64_t[]){B, T, d.Hkv, d.D});
    tensor_t dkr = model_act_view(m, sc, 3 * bq + bkv, 2, (int64_t[]){N, d.Ckv});
    tensor_t dkr4 = model_act_view(m, sc, 3 * bq + bkv, 4, (int64_t[]){B, T, d.Hkv, d.D});
    tensor_t dv = model_act_view(m, sc, 3 * bq + 2 * bkv, 2, (int64_t[]){N, d.Ckv});
    tensor_t dv4 = model_act_view(m, sc, 3 * bq + 2 * bkv, 4, (int64_t[]){B, T, d.Hkv, d.D});

    /* every gradient buffer here has one producer, or a first one: the _set
     * ops write it instead of zero + accumulate (on the CPU the same bits) */
    kern_linear_bwd_set(s, &datt, model_sub_grad(m, sub, A_O), model_sub_grad(m, sub, A_OB), dy,
                        &v.att, model_sub_param(m, sub, A_O));
    if (m->par.cp_size > 1) {
        bt_status_t st = model_cp_attn_bwd(m, attn_cp_base(r, &d), &dq4, &dk4, &dv4, &datt4, &v.q4,
                                           &v.k4, &v.v4, &v.att4, &v.lse, scale, sub->layer);
        if (st != BT_OK) return st;
    } else {
        kern_attention_bwd_set_window(s, &dq4, &dk4, &dv4, &datt4, &v.q4, &v.k4, &v.v4, &v.att4,
                                      &v.lse, scale, true, 0, attn_window(m, sub->layer));
    }
    if (m->cfg.attn.rope.kind != MODEL_ROPE_NONE) {
        kern_rope_bwd_set(s, &dqr4, &dq4, &cos, &sin, r->pos);
        kern_rope_bwd_set(s, &dkr4, &dk4, &cos, &sin, r->pos);
    } else { /* no rotation: the gradients pass as they are */
        kern_copy(s, &dqr4, &dq4);
        kern_copy(s, &dkr4, &dk4);
    }
    const tensor_t *dqp = &dqr, *dkp = &dkr;
    tensor_t dq = tensor_reshape(&dq4, 2, (int64_t[]){N, d.Cq});
    tensor_t dk = tensor_reshape(&dk4, 2, (int64_t[]){N, d.Ckv});
    if (m->cfg.attn.qk_norm) { /* through the per-head norms, into dq, dk (free again) */
        tensor_t dq2 = heads_rows(&dq, d.D), dk2 = heads_rows(&dk, d.D);
        tensor_t dqr2 = heads_rows(&dqr, d.D), dkr2 = heads_rows(&dkr, d.D);
        tensor_t qp2 = heads_rows(&v.qp, d.D), kp2 = heads_rows(&v.kp, d.D);
        kern_zero(s, &dq);
        kern_zero(s, &dk);
        kern_rmsnorm_bwd(s, &dq2, model_sub_grad(m, sub, A_QN), &dqr2, &qp2,
                         model_sub_param(m, sub, A_QN), &v.qr);
        kern_rmsnorm_bwd(s, &dk2, model_sub_grad(m, sub, A_KN), &dkr2, &kp2,
                         model_sub_param(m, sub, A_KN), &v.kr);
        dqp = &dq;
        dkp = &dk;
    }
    kern_linear_bwd_set(s, dln, model_sub_grad(m, sub, A_Q), model_sub_grad(m, sub, A_QB), dqp,
                        ln, model_sub_param(m, sub, A_Q));
    tensor_t kw, gkw, gkb, vw, gvw, gvb; /* this rank's KV rows (replicated KV heads) */
    kern_linear_bwd(s, dln, kv_grad(m, sub, A_K, &d, &gkw), kv_grad(m, sub, A_KB, &d, &gkb), dkp,
                    ln, kv_param(m, sub, A_K, &d, &kw));
    kern_linear_bwd(s, dln, kv_grad(m, sub, A_V, &d, &gvw), kv_grad(m, sub, A_VB, &d, &gvb), &dv,
                    ln, kv_param(m, sub, A_V, &d, &vw));
    return model_tp_input_sum(r, dln, "the attention input gradient", sub->layer);
}

/* weights: q, o (C x Cq each), k, v (C x Ckv each); biases are additions.
 * Scores and values under the causal mask: query t meets t + 1 keys, T/2 on
 * average (the convention drops the exact count's +1/2), D multiply-adds
 * each in q.k and in p.v, for each of the Hq heads: Cq * T. A sliding
 * window's saving (a query meets at most window keys) is not taken off:
 * the count is the full causal one, as the MFU convention (docs) states. */
static void attn_flops(const model_config_t *c, int64_t T, model_flops_t *f)
{
    const model_attn_config_t *a = &c->attn;
    double C = (double)c->hidden_size, Cq = (double)(a->num_heads * a->head_dim);
    double Ckv = (double)(a->num_kv_heads * a->head_dim);
    f->matmul_params += 2.0 * C * Cq + 2.0 * C * Ckv;
    f->attn_fma += Cq * (double)T;
}

static const kern_op_t attn_ops[] = {KERN_OP_LINEAR, KERN_OP_ROPE, KERN_OP_ATTENTION,
                                     KERN_OP_MATMUL, KERN_OP_ELEMENTWISE, KERN_OP_RMSNORM};

const model_kind_t model_kind_attention = {
    .name = "attention",
    .validate = attn_validate,
    .layout = attn_layout,
    .saved_bytes = attn_saved_bytes,
    .scratch_bytes = attn_scratch_bytes,
    .shared_bytes = attn_shared_bytes,
    .shared_init = attn_shared_init,
    .cache_bytes = attn_cache_bytes,
    .forward = attn_forward,
    .backward = attn_backward,
    .flops = attn_flops,
    .ops = attn_ops,
    .n_ops = (int)(sizeof attn_ops / sizeof attn_ops[0]),
};
