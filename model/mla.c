/* Multi-head latent attention (MODEL_MIXER_MLA): DeepSeek-V2, as
 * transformers' DeepseekV2Attention computes it. Per TP rank H heads, each
 * with a query and key of D = Dn + Dr dims (Dn = qk_nope_head_dim, Dr =
 * qk_rope_head_dim) and a value of Dv = v_head_dim:
 *
 *   q   = ln Wq^T                          (q_lora_rank 0: q_proj)
 *       | rmsnorm(ln Wqa^T) Wqb^T          (q_a_proj, q_a_layernorm, q_b_proj)   [N, H, D]
 *   c   = rmsnorm(ln Wkva[:R]^T)           the latent, R = kv_lora_rank         [N, R]
 *   kpe = rope(ln Wkva[R:]^T)              one rope key for every head          [N, Dr]
 *   kv  = c Wkvb^T                          per head k_nope (Dn), then v (Dv)    [N, H, Dn+Dv]
 *   k   = [k_nope, kpe] per head, v = kv's last Dv per head
 *   y   = attention(q with rope on its last Dr, k, v) Wo^T
 *
 * K [.., H, D] and V [.., H, Dv] are separate tensors of their own shapes
 * everywhere (saved, cached, handed to the attention core): mla_core is the
 * one call that takes q, k, v, which context parallelism can replace.
 *
 * RoPE: transformers rotates the rope dims as complex pairs (2i, 2i+1);
 * baton's kernel rotates halves (i, i + Dr/2). The rope dims of q and of
 * kpe are moved apart into halves (kern_copy_cols, steps of 2) before the
 * kernel and stay so in q and k: scores are dot products, unchanged by the
 * same permutation of q's and k's dims, and the weights keep their HF
 * layout. The tables carry YaRN's attention factor (cos and sin times it,
 * as transformers scales its complex table).
 *
 * TP (by heads): q_proj / q_b_proj and kv_b_proj column-parallel by whole
 * heads, o_proj row-parallel; q_a_proj, kv_a_proj_with_mqa and the two
 * latent norms replicated. In backward the gradients of what the
 * replicated part produced (the q latent, the kv latent, kpe) are partial
 * sums over each rank's heads: they are all-reduced (one call) before the
 * replicated part's backward, so its weight gradients are whole and equal on
 * every rank; with q_proj the input gradient of q's part is all-reduced
 * instead. */
#include "model/kind.h"
#include "model/require.h"

#include "base/log.h"
#include "model/cp_xchg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { M_Q = 0, M_QA, M_QAN, M_KVA, M_KVAN, M_KVB, M_O, M_SLOTS };
_Static_assert(M_SLOTS <= MODEL_SUB_SLOTS, "mla slots fit a sublayer");

#define MLA_NORM_EPS 1e-6f /* DeepseekV2RMSNorm's default: the latent norms take no config eps */

/* This TP rank's dimensions. */
typedef struct {
    int64_t H, Dn, Dr, Dv, D, Rq, R;
} mla_dims_t;

static mla_dims_t mla_dims(const model_t *m)
{
    const model_mla_config_t *a = &m->cfg.mla;
    mla_dims_t d = {.H = a->num_heads / m->par.tp_size, .Dn = a->qk_nope_dim, .Dr = a->qk_rope_dim,
                    .Dv = a->v_head_dim, .Rq = a->q_lora_rank, .R = a->kv_lora_rank};
    d.D = d.Dn + d.Dr;
    return d;
}

/* YaRN's mscale (transformers' get_mscale). */
static double yarn_mscale(double scale, double mscale)
{
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* The factor the rope tables carry (YaRN's attention factor; 1 otherwise). */
static double mla_rope_factor(const model_rope_t *r)
{
    if (r->kind != MODEL_ROPE_YARN) return 1.0;
    if (r->attention_factor > 0) return r->attention_factor;
    if (r->mscale != 0 && r->mscale_all_dim != 0)
        return yarn_mscale(r->factor, r->mscale) / yarn_mscale(r->factor, r->mscale_all_dim);
    return yarn_mscale(r->factor, 1.0);
}

/* The softmax scale: 1/sqrt(qk_nope + qk_rope), and under YaRN with
 * mscale_all_dim set times mscale(factor, mscale_all_dim)^2 (transformers'
 * yarn_apply_mscale). */
static float mla_scale(const model_t *m)
{
    const model_mla_config_t *a = &m->cfg.mla;
    double s = pow((double)(a->qk_nope_dim + a->qk_rope_dim), -0.5);
    if (a->rope.kind == MODEL_ROPE_YARN && a->rope.mscale_all_dim != 0) {
        double ms = yarn_mscale(a->rope.factor, a->rope.mscale_all_dim);
        s = s * ms * ms;
    }
    return (float)s;
}

static bt_status_t mla_validate(const model_config_t *c, int tp)
{
    const model_mla_config_t *a = &c->mla;
    const model_rope_t *r = &a->rope;
    MODEL_REQUIRE(a->num_heads > 0 && a->num_heads <= MODEL_MAX_HEADS,
                  "model config: num_attention_heads=%lld must be in [1, %d]",
                  (long long)a->num_heads, MODEL_MAX_HEADS);
    MODEL_REQUIRE(a->qk_nope_dim > 0 && a->qk_nope_dim <= MODEL_MAX_HEAD_DIM,
                  "model config: qk_nope_head_dim=%lld must be in [1, %d]",
                  (long long)a->qk_nope_dim, MODEL_MAX_HEAD_DIM);
    MODEL_REQUIRE(a->qk_rope_dim > 0 && a->qk_rope_dim % 2 == 0 &&
                      a->qk_rope_dim <= MODEL_MAX_HEAD_DIM,
                  "model config: qk_rope_head_dim=%lld must be even and in [2, %d]",
                  (long long)a->qk_rope_dim, MODEL_MAX_HEAD_DIM);
    MODEL_REQUIRE(a->v_head_dim > 0 && a->v_head_dim <= MODEL_MAX_HEAD_DIM,
                  "model config: v_head_dim=%lld must be in [1, %d]", (long long)a->v_head_dim,
                  MODEL_MAX_HEAD_DIM);
    MODEL_REQUIRE(a->kv_lora_rank > 0 && a->kv_lora_rank <= MODEL_MAX_HIDDEN,
                  "model config: kv_lora_rank=%lld must be in [1, %d]", (long long)a->kv_lora_rank,
                  MODEL_MAX_HIDDEN);
    MODEL_REQUIRE(a->q_lora_rank >= 0 && a->q_lora_rank <= MODEL_MAX_HIDDEN,
                  "model config: q_lora_rank=%lld must be null or in [1, %d]",
                  (long long)a->q_lora_rank, MODEL_MAX_HIDDEN);
    MODEL_REQUIRE(r->kind == MODEL_ROPE_DEFAULT || r->kind == MODEL_ROPE_YARN,
                  "model config: MLA supports rope_type default or yarn (got kind %d)",
                  (int)r->kind);
    MODEL_REQUIRE(r->theta > 0, "model config: rope_theta=%g must be > 0", r->theta);
    if (r->kind == MODEL_ROPE_YARN) {
        MODEL_REQUIRE(r->factor > 0, "model config: rope_scaling.factor=%g must be > 0", r->factor);
        MODEL_REQUIRE(
            r->original_max_position > 0,
            "model config: rope_scaling.original_max_position_embeddings=%lld must be > 0",
            (long long)r->original_max_position);
        MODEL_REQUIRE(r->beta_fast > 0 && r->beta_slow > 0,
                      "model config: rope_scaling.beta_fast=%g and beta_slow=%g must be > 0",
                      r->beta_fast, r->beta_slow);
    }
    if (tp > 1)
        MODEL_REQUIRE(
            a->num_heads % tp == 0,
            "model: tp_size=%d does not divide num_attention_heads=%lld (MLA splits whole "
            "heads)",
            tp, (long long)a->num_heads);
    return BT_OK;
}

static void mla_layout(model_layout_t *lb, const model_config_t *c, const char *prefix,
                       model_sub_t *sub)
{
    const model_mla_config_t *a = &c->mla;
    int64_t C = c->hidden_size, H = a->num_heads, D = a->qk_nope_dim + a->qk_rope_dim;
    int64_t Dkv = a->qk_nope_dim + a->v_head_dim, R = a->kv_lora_rank, Rq = a->q_lora_rank;
    char n[MODEL_NAME_MAX];
#define ADD(slot, suffix, ndim, d0, d1, dim, unit)                                                 \
    do {                                                                                           \
        snprintf(n, sizeof n, "%s.%s", prefix, suffix);                                            \
        sub->ix[slot] = model_layout_add(lb, n, ndim, d0, d1, dim, unit);                          \
    } while (0)
    if (Rq == 0) {
        ADD(M_Q, "q_proj.weight", 2, H * D, C, 0, D);
    } else {
        ADD(M_QA, "q_a_proj.weight", 2, Rq, C, -1, 1);
        ADD(M_QAN, "q_a_layernorm.weight", 1, Rq, 0, -1, 1);
        ADD(M_Q, "q_b_proj.weight", 2, H * D, Rq, 0, D);
    }
    ADD(M_KVA, "kv_a_proj_with_mqa.weight", 2, R + a->qk_rope_dim, C, -1, 1);
    ADD(M_KVAN, "kv_a_layernorm.weight", 1, R, 0, -1, 1);
    ADD(M_KVB, "kv_b_proj.weight", 2, H * Dkv, R, 0, Dkv);
    ADD(M_O, "o_proj.weight", 2, C, H * a->v_head_dim, 1, a->v_head_dim);
#undef ADD
}

/* ---- regions ------------------------------------------------------------------------ */

/* One region of rows x cols in dtype dt (DT_COUNT: the activation dtype). */
typedef struct {
    dtype_t dt;
    double  rows, cols;
} mla_region_t;

/* saved: what the backward reads */
enum { V_QA = 0, V_QAN, V_QRSTD, V_KVL, V_KVN, V_KVRSTD, V_Q, V_K, V_V, V_ATT, V_LSE, V_COUNT };
/* scratch of the forward */
enum { F_QRAW = 0, F_KVB, F_KPERAW, F_KPE, F_QPE, F_COUNT };
/* scratch of the backward (B_RED: the q latent's, kv latent's and raw kpe's
 * gradients back to back, all-reduced over TP in one call) */
enum { B_DATT = 0, B_DQ, B_DK, B_DV, B_DKVB, B_DQPE, B_DQPE2, B_DQRAW, B_RED, B_DKPE, B_DKPE2,
       B_DQA, B_DKVL, B_COUNT };

static void mla_regions(const model_t *m, double B, double T, mla_region_t *saved,
                        mla_region_t *fwd, mla_region_t *bwd)
{
    mla_dims_t d = mla_dims(m);
    double N = B * T, H = (double)d.H, D = (double)d.D, Dr = (double)d.Dr, Dv = (double)d.Dv;
    double Dkv = (double)(d.Dn + d.Dv), R = (double)d.R, Rq = (double)d.Rq;
    const dtype_t A = DT_COUNT;
    if (saved) {
        saved[V_QA] = (mla_region_t){A, N, Rq};
        saved[V_QAN] = (mla_region_t){A, N, Rq};
        saved[V_QRSTD] = (mla_region_t){DT_F32, Rq > 0 ? N : 0, 1};
        saved[V_KVL] = (mla_region_t){A, N, R};
        saved[V_KVN] = (mla_region_t){A, N, R};
        saved[V_KVRSTD] = (mla_region_t){DT_F32, N, 1};
        saved[V_Q] = (mla_region_t){A, N, H * D};
        saved[V_K] = (mla_region_t){A, N, H * D};
        saved[V_V] = (mla_region_t){A, N, H * Dv};
        saved[V_ATT] = (mla_region_t){A, N, H * Dv};
        saved[V_LSE] = (mla_region_t){DT_F32, B * H, T};
    }
    if (fwd) {
        fwd[F_QRAW] = (mla_region_t){A, N, H * D};
        fwd[F_KVB] = (mla_region_t){A, N, H * Dkv};
        fwd[F_KPERAW] = (mla_region_t){A, N, Dr};
        fwd[F_KPE] = (mla_region_t){A, N, Dr};
        fwd[F_QPE] = (mla_region_t){A, N * H, Dr};
    }
    if (bwd) {
        bwd[B_DATT] = (mla_region_t){A, N, H * Dv};
        bwd[B_DQ] = (mla_region_t){A, N, H * D};
        bwd[B_DK] = (mla_region_t){A, N, H * D};
        bwd[B_DV] = (mla_region_t){A, N, H * Dv};
        bwd[B_DKVB] = (mla_region_t){A, N, H * Dkv};
        bwd[B_DQPE] = (mla_region_t){A, N * H, Dr};
        bwd[B_DQPE2] = (mla_region_t){A, N * H, Dr};
        bwd[B_DQRAW] = (mla_region_t){A, N, H * D};
        bwd[B_RED] = (mla_region_t){A, N, Rq + R + Dr};
        bwd[B_DKPE] = (mla_region_t){A, N, Dr};
        bwd[B_DKPE2] = (mla_region_t){A, N, Dr};
        bwd[B_DQA] = (mla_region_t){A, N, Rq};
        bwd[B_DKVL] = (mla_region_t){A, N, R};
    }
}

static double regions_size(const model_t *m, const mla_region_t *r, int n)
{
    double total = 0;
    for (int i = 0; i < n; i++) {
        dtype_t dt = r[i].dt == DT_COUNT ? m->place.act_dtype : r[i].dt;
        total += model_align_d(r[i].rows * r[i].cols * (double)dtype_size(dt));
    }
    return total;
}

static void regions_carve(const model_t *m, void *base, const mla_region_t *r, int n, tensor_t *out)
{
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        dtype_t dt = r[i].dt == DT_COUNT ? m->place.act_dtype : r[i].dt;
        int64_t rows = (int64_t)r[i].rows, cols = (int64_t)r[i].cols;
        out[i] = tensor_make((char *)base + off, dt, m->place.dev, 2, (int64_t[]){rows, cols});
        off += model_align((size_t)(rows * cols) * dtype_size(dt));
    }
}

static double mla_saved_bytes(const model_t *m, int64_t B, int64_t T)
{
    mla_region_t s[V_COUNT];
    mla_regions(m, (double)B, (double)T, s, NULL, NULL);
    return regions_size(m, s, V_COUNT);
}

/* scratch: the forward's or the backward's regions, then context
 * parallelism's (model/cp_xchg.h: K [.., H, D] and V [.., H, Dv] as what
 * they are) */
static double mla_own_scratch(const model_t *m, int64_t B, int64_t T)
{
    mla_region_t f[F_COUNT], b[B_COUNT];
    mla_regions(m, (double)B, (double)T, NULL, f, b);
    double a = regions_size(m, f, F_COUNT), c = regions_size(m, b, B_COUNT);
    return a > c ? a : c;
}

static double mla_scratch_bytes(const model_t *m, int64_t B, int64_t T)
{
    mla_dims_t d = mla_dims(m);
    return mla_own_scratch(m, B, T) + model_cp_attn_scratch_bytes(m, B, T, d.H, d.H, d.D, d.Dv);
}

/* ---- RoPE tables ------------------------------------------------------------------------ */

/* shared: cos, sin [T, Dr/2] f32 for positions 0..T-1, times the rope factor */
static double mla_shared_bytes(const model_t *m, int64_t T)
{
    return 2 * model_align_d((double)T * (double)(m->cfg.mla.qk_rope_dim / 2) * 4);
}

/* Inverse frequencies as transformers computes them (default, or YaRN's
 * ramp between interpolated and extrapolated frequencies), float32. */
static void mla_inv_freq(const model_rope_t *r, int64_t dim, float *inv)
{
    int64_t half = dim / 2;
    float base = (float)r->theta;
    double lo = 0, hi = 0;
    if (r->kind == MODEL_ROPE_YARN) {
        double omp = (double)r->original_max_position, lb = log(r->theta);
        lo = (double)dim * log(omp / (r->beta_fast * 2 * M_PI)) / (2 * lb);
        hi = (double)dim * log(omp / (r->beta_slow * 2 * M_PI)) / (2 * lb);
        if (r->truncate) {
            lo = floor(lo);
            hi = ceil(hi);
        }
        if (lo < 0) lo = 0;
        if (hi > (double)(dim - 1)) hi = (double)(dim - 1);
        if (lo == hi) hi += 0.001;
    }
    for (int64_t i = 0; i < half; i++) {
        float pf = powf(base, (float)(2 * i) / (float)dim);
        float extra = 1.0f / pf;
        if (r->kind != MODEL_ROPE_YARN) {
            inv[i] = extra;
            continue;
        }
        float inter = 1.0f / ((float)r->factor * pf);
        float ramp = ((float)i - (float)lo) / (float)(hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float ef = 1.0f - ramp;
        inv[i] = inter * (1.0f - ef) + extra * ef;
    }
}

static void mla_tables(const model_t *m, int64_t T, void *shared, tensor_t *cos, tensor_t *sin)
{
    int64_t half = m->cfg.mla.qk_rope_dim / 2, shape[2] = {T, half};
    size_t bytes = model_align((size_t)(T * half) * sizeof(float));
    *cos = tensor_make(shared, DT_F32, m->place.dev, 2, shape);
    *sin = tensor_make((char *)shared + bytes, DT_F32, m->place.dev, 2, shape);
}

static bt_status_t mla_shared_init(const model_t *m, int64_t T, void *shared)
{
    const model_mla_config_t *c = &m->cfg.mla;
    int64_t half = c->qk_rope_dim / 2;
    float *inv = malloc((size_t)half * sizeof *inv);
    float *h = malloc((size_t)(2 * T * half) * sizeof *h);
    if (!inv || !h) {
        free(inv);
        free(h);
        return BT_ERR_NOMEM;
    }
    mla_inv_freq(&c->rope, c->qk_rope_dim, inv);
    float f = (float)mla_rope_factor(&c->rope);
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < half; i++) {
            float ang = (float)t * inv[i];
            h[t * half + i] = cosf(ang) * f;
            h[T * half + t * half + i] = sinf(ang) * f;
        }
    tensor_t cos, sin;
    mla_tables(m, T, shared, &cos, &sin);
    kern_upload(m->stream, &cos, h);
    kern_upload(m->stream, &sin, h + T * half);
    bt_status_t st = kern_stream_sync(m->stream);
    free(inv);
    free(h);
    return st;
}

/* decode cache: K [T, H*D] then V [T, H*Dv] (model_kv_cache_append) */
static double mla_cache_bytes(const model_t *m, int64_t T)
{
    mla_dims_t d = mla_dims(m);
    return model_kv_cache_bytes(m, T, d.H * d.D, d.H * d.Dv);
}

/* ---- helpers ---------------------------------------------------------------------------- */

static tensor_t view2(const tensor_t *t, int64_t rows, int64_t cols)
{
    return tensor_make(t->data, t->dtype, t->device, 2, (int64_t[]){rows, cols});
}

static tensor_t view4(const tensor_t *t, int64_t a, int64_t b, int64_t c, int64_t d)
{
    return tensor_make(t->data, t->dtype, t->device, 4, (int64_t[]){a, b, c, d});
}

/* rows [r0, r0 + n) of a 2-D parameter or gradient */
static tensor_t param_rows(const tensor_t *t, int64_t r0, int64_t n)
{
    size_t row = (size_t)t->shape[1] * dtype_size(t->dtype);
    return tensor_make((char *)t->data + (size_t)r0 * row, t->dtype, t->device, 2,
                       (int64_t[]){n, t->shape[1]});
}

static void copy_cols(kern_stream_t *s, tensor_t *dst, int64_t d0, int64_t dstep,
                      const tensor_t *src, int64_t s0, int64_t sstep, int64_t n, int64_t div,
                      bool acc)
{
    kern_cols_t c = {.d0 = d0, .dstep = dstep, .s0 = s0, .sstep = sstep, .n = n, .div = div,
                     .acc = acc};
    kern_copy_cols(s, dst, src, &c);
}

/* dst[:, d0 + i] = src[:, s0 + 2i], dst[:, d0 + Dr/2 + i] = src[:, s0 + 2i + 1] (pairs to
 * halves); back: the inverse, into dst at d0 */
static void pairs_to_halves(kern_stream_t *s, tensor_t *dst, int64_t d0, const tensor_t *src,
                            int64_t s0, int64_t Dr)
{
    copy_cols(s, dst, d0, 1, src, s0, 2, Dr / 2, 1, false);
    copy_cols(s, dst, d0 + Dr / 2, 1, src, s0 + 1, 2, Dr / 2, 1, false);
}

static void halves_to_pairs(kern_stream_t *s, tensor_t *dst, int64_t d0, const tensor_t *src,
                            int64_t s0, int64_t Dr)
{
    copy_cols(s, dst, d0, 2, src, s0, 1, Dr / 2, 1, false);
    copy_cols(s, dst, d0 + 1, 2, src, s0 + Dr / 2, 1, Dr / 2, 1, false);
}

/* The attention core, on the kind's own q [B,T,H,D], k [B,Tk,H,D] and v
 * [B,Tk,H,Dv] (separate tensors, their own head sizes), causal from query
 * position q_offset. Under context parallelism (training and evaluation;
 * decoding keeps one sequence whole) the same q, k, v are this CP rank's
 * chunks and model_cp_attn_fwd / _bwd exchange k and v over the CP group,
 * each as the tensor it is: the rope key's positions are already those of
 * the chunks (r->pos). */
static void *mla_cp_scratch(const model_run_t *r)
{
    return (char *)r->scratch + (size_t)mla_own_scratch(r->m, r->B, r->T);
}

static bt_status_t mla_core_fwd(model_run_t *r, tensor_t *out, tensor_t *lse, const tensor_t *q,
                                const tensor_t *k, const tensor_t *v, float scale,
                                int64_t q_offset, int layer)
{
    if (r->m->par.cp_size > 1 && !r->cache)
        return model_cp_attn_fwd(r->m, mla_cp_scratch(r), out, lse, q, k, v, scale, layer);
    kern_attention_fwd(r->s, out, lse, q, k, v, scale, true, q_offset);
    return BT_OK;
}

static bt_status_t mla_core_bwd(model_run_t *r, tensor_t *dq, tensor_t *dk, tensor_t *dv,
                                const tensor_t *dout, const tensor_t *q, const tensor_t *k,
                                const tensor_t *v, const tensor_t *out, const tensor_t *lse,
                                float scale, int layer)
{
    if (r->m->par.cp_size > 1)
        return model_cp_attn_bwd(r->m, mla_cp_scratch(r), dq, dk, dv, dout, q, k, v, out, lse,
                                 scale, layer);
    kern_attention_bwd_set(r->s, dq, dk, dv, dout, q, k, v, out, lse, scale, true, 0);
    return BT_OK;
}

/* ---- forward and backward ------------------------------------------------------------------ */

static bt_status_t mla_forward(model_run_t *r, const model_sub_t *sub, void *saved,
                               const tensor_t *ln, tensor_t *y)
{
    model_t *m = r->m;
    kern_stream_t *s = r->s;
    mla_dims_t d = mla_dims(m);
    int64_t N = r->N, B = r->B, T = r->T, H = d.H, Dn = d.Dn, Dr = d.Dr;
    mla_region_t rs[V_COUNT], rf[F_COUNT];
    mla_regions(m, (double)B, (double)T, rs, rf, NULL);
    tensor_t v[V_COUNT], f[F_COUNT];
    regions_carve(m, saved, rs, V_COUNT, v);
    regions_carve(m, r->scratch, rf, F_COUNT, f);
    tensor_t cos, sin;
    mla_tables(m, r->T_cap, r->shared, &cos, &sin);
    const tensor_t *wkva = model_sub_param(m, sub, M_KVA);
    tensor_t wkv_l = param_rows(wkva, 0, d.R), wkv_r = param_rows(wkva, d.R, Dr);

    /* the query, HF layout [N, H, Dn | Dr pairs] */
    if (d.Rq > 0) {
        kern_linear_fwd(s, &v[V_QA], ln, model_sub_param(m, sub, M_QA), NULL);
        kern_rmsnorm_fwd(s, &v[V_QAN], &v[V_QRSTD], &v[V_QA], model_sub_param(m, sub, M_QAN),
                         MLA_NORM_EPS);
        kern_linear_fwd(s, &f[F_QRAW], &v[V_QAN], model_sub_param(m, sub, M_Q), NULL);
    } else {
        kern_linear_fwd(s, &f[F_QRAW], ln, model_sub_param(m, sub, M_Q), NULL);
    }
    /* the latent, its keys and values, the rope key */
    kern_linear_fwd(s, &v[V_KVL], ln, &wkv_l, NULL);
    kern_rmsnorm_fwd(s, &v[V_KVN], &v[V_KVRSTD], &v[V_KVL], model_sub_param(m, sub, M_KVAN),
                     MLA_NORM_EPS);
    kern_linear_fwd(s, &f[F_KVB], &v[V_KVN], model_sub_param(m, sub, M_KVB), NULL);
    kern_linear_fwd(s, &f[F_KPERAW], ln, &wkv_r, NULL);

    /* q: nope dims as they are, rope dims to halves, rotated */
    tensor_t qraw = view2(&f[F_QRAW], N * H, d.D), q2 = view2(&v[V_Q], N * H, d.D);
    copy_cols(s, &q2, 0, 1, &qraw, 0, 1, Dn, 1, false);
    pairs_to_halves(s, &f[F_QPE], 0, &qraw, Dn, Dr);
    tensor_t qpe4 = view4(&f[F_QPE], B, T, H, Dr);
    kern_rope_fwd(s, &qpe4, &qpe4, &cos, &sin, r->pos);
    copy_cols(s, &q2, Dn, 1, &f[F_QPE], 0, 1, Dr, 1, false);
    /* k: k_nope per head, then the one rotated rope key; v */
    tensor_t kvb = view2(&f[F_KVB], N * H, Dn + d.Dv), k2 = view2(&v[V_K], N * H, d.D);
    tensor_t v2 = view2(&v[V_V], N * H, d.Dv);
    copy_cols(s, &k2, 0, 1, &kvb, 0, 1, Dn, 1, false);
    copy_cols(s, &v2, 0, 1, &kvb, Dn, 1, d.Dv, 1, false);
    pairs_to_halves(s, &f[F_KPE], 0, &f[F_KPERAW], 0, Dr);
    tensor_t kpe4 = view4(&f[F_KPE], B, T, 1, Dr);
    kern_rope_fwd(s, &kpe4, &kpe4, &cos, &sin, r->pos);
    copy_cols(s, &k2, Dn, 1, &f[F_KPE], 0, 1, Dr, H, false);

    tensor_t q4 = view4(&v[V_Q], B, T, H, d.D), att4 = view4(&v[V_ATT], B, T, H, d.Dv);
    tensor_t lse = tensor_make(v[V_LSE].data, DT_F32, m->place.dev, 3, (int64_t[]){B, H, T});
    float scale = mla_scale(m);
    if (r->cache) { /* decoding: every cached position and these */
        tensor_t kc, vc;
        model_kv_cache_append(r, &v[V_K], &v[V_V], H, d.D, d.Dv, &kc, &vc);
        bt_status_t st = mla_core_fwd(r, &att4, &lse, &q4, &kc, &vc, scale, r->pos0, sub->layer);
        if (st != BT_OK) return st;
    } else {
        tensor_t k4 = view4(&v[V_K], B, T, H, d.D), v4 = view4(&v[V_V], B, T, H, d.Dv);
        bt_status_t st = mla_core_fwd(r, &att4, &lse, &q4, &k4, &v4, scale, 0, sub->layer);
        if (st != BT_OK) return st;
    }
    return model_row_parallel_fwd(r, y, &v[V_ATT], model_sub_param(m, sub, M_O), NULL,
                                  "o_proj output", sub->layer);
}

static bt_status_t mla_backward(model_run_t *r, const model_sub_t *sub, void *saved,
                                const tensor_t *ln, const tensor_t *dy, tensor_t *dln)
{
    model_t *m = r->m;
    kern_stream_t *s = r->s;
    mla_dims_t d = mla_dims(m);
    int64_t N = r->N, B = r->B, T = r->T, H = d.H, Dn = d.Dn, Dr = d.Dr, D = d.D;
    mla_region_t rs[V_COUNT], rb[B_COUNT];
    mla_regions(m, (double)B, (double)T, rs, NULL, rb);
    tensor_t v[V_COUNT], g[B_COUNT];
    regions_carve(m, saved, rs, V_COUNT, v);
    regions_carve(m, r->scratch, rb, B_COUNT, g);
    tensor_t cos, sin;
    mla_tables(m, r->T_cap, r->shared, &cos, &sin);
    const tensor_t *wkva = model_sub_param(m, sub, M_KVA);
    tensor_t *gkva = model_sub_grad(m, sub, M_KVA);
    tensor_t wkv_l = param_rows(wkva, 0, d.R), wkv_r = param_rows(wkva, d.R, Dr);
    tensor_t gkv_l = param_rows(gkva, 0, d.R), gkv_r = param_rows(gkva, d.R, Dr);
    /* the reduced block: dq latent [N, Rq], dkv latent [N, R], raw dkpe [N, Dr] */
    size_t es = dtype_size(m->place.act_dtype);
    char *red = g[B_RED].data;
    tensor_t dqan = tensor_make(red, m->place.act_dtype, m->place.dev, 2, (int64_t[]){N, d.Rq});
    tensor_t dkvn = tensor_make(red + (size_t)(N * d.Rq) * es, m->place.act_dtype, m->place.dev,
                                2, (int64_t[]){N, d.R});
    tensor_t dkpe_raw = tensor_make(red + (size_t)(N * (d.Rq + d.R)) * es, m->place.act_dtype,
                                    m->place.dev, 2, (int64_t[]){N, Dr});
    tensor_t red_all = tensor_make(red, m->place.act_dtype, m->place.dev, 1,
                                   (int64_t[]){N * (d.Rq + d.R + Dr)});

    kern_linear_bwd_set(s, &g[B_DATT], model_sub_grad(m, sub, M_O), NULL, dy, &v[V_ATT],
                        model_sub_param(m, sub, M_O));
    {
        tensor_t dq4 = view4(&g[B_DQ], B, T, H, D), dk4 = view4(&g[B_DK], B, T, H, D);
        tensor_t dv4 = view4(&g[B_DV], B, T, H, d.Dv), datt4 = view4(&g[B_DATT], B, T, H, d.Dv);
        tensor_t q4 = view4(&v[V_Q], B, T, H, D), k4 = view4(&v[V_K], B, T, H, D);
        tensor_t v4 = view4(&v[V_V], B, T, H, d.Dv), att4 = view4(&v[V_ATT], B, T, H, d.Dv);
        tensor_t lse = tensor_make(v[V_LSE].data, DT_F32, m->place.dev, 3, (int64_t[]){B, H, T});
        bt_status_t st = mla_core_bwd(r, &dq4, &dk4, &dv4, &datt4, &q4, &k4, &v4, &att4, &lse,
                                      mla_scale(m), sub->layer);
        if (st != BT_OK) return st;
    }
    /* k, v back to kv_b's output; the rope key's gradient summed over heads (in head order) */
    tensor_t dk2 = view2(&g[B_DK], N * H, D), dv2 = view2(&g[B_DV], N * H, d.Dv);
    tensor_t dkvb = view2(&g[B_DKVB], N * H, Dn + d.Dv);
    copy_cols(s, &dkvb, 0, 1, &dk2, 0, 1, Dn, 1, false);
    copy_cols(s, &dkvb, Dn, 1, &dv2, 0, 1, d.Dv, 1, false);
    for (int64_t h = 0; h < H; h++)
        copy_cols(s, &g[B_DKPE], 0, 1, &g[B_DK], h * D + Dn, 1, Dr, 1, h > 0);
    kern_linear_bwd_set(s, &dkvn, model_sub_grad(m, sub, M_KVB), NULL, &g[B_DKVB], &v[V_KVN],
                        model_sub_param(m, sub, M_KVB));
    tensor_t dkpe4 = view4(&g[B_DKPE], B, T, 1, Dr), dkpe24 = view4(&g[B_DKPE2], B, T, 1, Dr);
    kern_rope_bwd_set(s, &dkpe24, &dkpe4, &cos, &sin, r->pos);
    halves_to_pairs(s, &dkpe_raw, 0, &g[B_DKPE2], 0, Dr);
    /* q back to its projection's HF layout */
    tensor_t dq2 = view2(&g[B_DQ], N * H, D), dqraw2 = view2(&g[B_DQRAW], N * H, D);
    copy_cols(s, &g[B_DQPE], 0, 1, &dq2, Dn, 1, Dr, 1, false);
    tensor_t dqpe4 = view4(&g[B_DQPE], B, T, H, Dr), dqpe24 = view4(&g[B_DQPE2], B, T, H, Dr);
    kern_rope_bwd_set(s, &dqpe24, &dqpe4, &cos, &sin, r->pos);
    copy_cols(s, &dqraw2, 0, 1, &dq2, 0, 1, Dn, 1, false);
    halves_to_pairs(s, &dqraw2, Dn, &g[B_DQPE2], 0, Dr);
    if (d.Rq > 0)
        kern_linear_bwd_set(s, &dqan, model_sub_grad(m, sub, M_Q), NULL, &g[B_DQRAW], &v[V_QAN],
                            model_sub_param(m, sub, M_Q));
    /* the replicated part needs the whole gradient of what it produced */
    bt_status_t st = model_tp_sum(m, &red_all, "the MLA latent gradients", sub->layer);
    if (st != BT_OK) return st;
    if (d.Rq > 0) {
        kern_zero(s, &g[B_DQA]);
        kern_rmsnorm_bwd(s, &g[B_DQA], model_sub_grad(m, sub, M_QAN), &dqan, &v[V_QA],
                         model_sub_param(m, sub, M_QAN), &v[V_QRSTD]);
        kern_linear_bwd_set(s, dln, model_sub_grad(m, sub, M_QA), NULL, &g[B_DQA], ln,
                            model_sub_param(m, sub, M_QA));
    } else {
        kern_linear_bwd_set(s, dln, model_sub_grad(m, sub, M_Q), NULL, &g[B_DQRAW], ln,
                            model_sub_param(m, sub, M_Q));
        if ((st = model_tp_input_sum(r, dln, "the MLA input gradient", sub->layer)) != BT_OK)
            return st;
    }
    kern_zero(s, &g[B_DKVL]);
    kern_rmsnorm_bwd(s, &g[B_DKVL], model_sub_grad(m, sub, M_KVAN), &dkvn, &v[V_KVL],
                     model_sub_param(m, sub, M_KVAN), &v[V_KVRSTD]);
    kern_linear_bwd(s, dln, &gkv_l, NULL, &g[B_DKVL], ln, &wkv_l);
    kern_linear_bwd(s, dln, &gkv_r, NULL, &dkpe_raw, ln, &wkv_r);
    return BT_OK;
}

/* weights that multiply every token: the query's path, kv_a, kv_b, o;
 * scores over D dims and values over Dv per head at the causal T/2 */
static void mla_flops(const model_config_t *c, int64_t T, model_flops_t *f)
{
    const model_mla_config_t *a = &c->mla;
    double C = (double)c->hidden_size, H = (double)a->num_heads;
    double D = (double)(a->qk_nope_dim + a->qk_rope_dim), Dv = (double)a->v_head_dim;
    double R = (double)a->kv_lora_rank, Rq = (double)a->q_lora_rank;
    f->matmul_params += Rq > 0 ? C * Rq + Rq * H * D : C * H * D;
    f->matmul_params += C * (R + (double)a->qk_rope_dim) + R * H * ((double)a->qk_nope_dim + Dv) +
                        H * Dv * C;
    f->attn_fma += H * (D + Dv) / 2 * (double)T;
}

static const kern_op_t mla_ops[] = {KERN_OP_LINEAR,    KERN_OP_ROPE,       KERN_OP_ATTENTION,
                                    KERN_OP_MATMUL,    KERN_OP_ELEMENTWISE, KERN_OP_RMSNORM};

const model_kind_t model_kind_mla = {
    .name = "mla",
    .validate = mla_validate,
    .layout = mla_layout,
    .saved_bytes = mla_saved_bytes,
    .scratch_bytes = mla_scratch_bytes,
    .shared_bytes = mla_shared_bytes,
    .shared_init = mla_shared_init,
    .cache_bytes = mla_cache_bytes,
    .forward = mla_forward,
    .backward = mla_backward,
    .flops = mla_flops,
    .ops = mla_ops,
    .n_ops = (int)(sizeof mla_ops / sizeof mla_ops[0]),
};
