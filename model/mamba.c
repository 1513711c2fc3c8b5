/* The Mamba2 mixer (MODEL_MIXER_MAMBA2), as transformers' NemotronHMamba2Mixer
 * computes it on its torch path (model/config.h, model_mamba_config_t):
 *
 *   z, x, B, C, dt = split(ln Win^T (+bin))        [I, I, G*N, G*N, H]
 *   x, B, C        = silu(conv1d_causal(x, B, C))  (depthwise, K taps, +bias)
 *   dt             = clamp(softplus(dt + dt_bias), dt_min, dt_max)
 *   y              = ssd_scan(x, dt, A = -exp(A_log), B, C) + D x   (by chunks)
 *   y              = w * rmsnorm_per_group(y * silu(z))
 *   out            = y Wout^T (+bout)
 *
 * in_proj is one HF tensor of I + (I + 2 G N) + H rows; its five row blocks
 * are five parameters here (row parts, model.h MODEL_PART_MARK:
 * in_proj.weight#0 .. #4, the bias likewise), and the depthwise conv over
 * xBC is three convs over x, B and C (conv1d.weight#0 .. #2: the channels
 * are independent), so that every kernel sees contiguous operands and no
 * split or concatenation is copied. The decode cache holds, per sublayer,
 * the last K-1 inputs of each conv and the scan's state [H, P, N] (f32).
 *
 * TP by heads and groups: tp must divide n_groups, and TP rank r holds
 * groups [r G/tp, (r+1) G/tp) and their heads (head h is in group
 * h / (H/G)), so every block is a box of its own part: z, x and dt rows of
 * its heads, B and C rows of its groups (in_proj column-parallel), the conv
 * channels of its x, B, C, dt_bias, A_log, D of its heads, the norm weight
 * of its groups (each group normalised whole on one rank), out_proj's
 * columns of its heads (row-parallel: one all-reduce of the output, and one
 * of the input gradient in backward, as an MLP; nothing else is
 * exchanged). */
#include "model/kind.h"
#include "model/require.h"

#include "base/log.h"

#include <math.h>
#include <stdio.h>

enum {
    MB_IN = 0,            /* in_proj.weight#0..4: z, x, B, C, dt */
    MB_INB = MB_IN + 5,   /* in_proj.bias#0..4 */
    MB_CONV = MB_INB + 5, /* conv1d.weight#0..2: x, B, C */
    MB_CONVB = MB_CONV + 3,
    MB_DTB = MB_CONVB + 3, MB_ALOG, MB_D, MB_NORM, MB_OUT, MB_OUTB,
    MB_SLOTS
};
_Static_assert(MB_SLOTS <= MODEL_SUB_SLOTS, "mamba2 slots fit a sublayer");

typedef struct {
    int64_t H, P, G, Ns, K, I, GN, conv, proj;
} mb_dims_t;

/* The dimensions of one TP rank's share of tp (1: the whole mixer). */
static mb_dims_t mb_dims_tp(const model_config_t *c, int tp)
{
    const model_mamba_config_t *a = &c->mamba;
    mb_dims_t d = {.H = a->num_heads / tp, .P = a->head_dim, .G = a->n_groups / tp,
                   .Ns = a->state_size, .K = a->conv_kernel};
    d.I = d.H * d.P;
    d.GN = d.G * d.Ns;
    d.conv = d.I + 2 * d.GN;
    d.proj = d.I + d.conv + d.H;
    return d;
}

static mb_dims_t mb_dims(const model_t *m) { return mb_dims_tp(&m->cfg, m->par.tp_size); }

static bt_status_t mb_validate(const model_config_t *c, int tp)
{
    const model_mamba_config_t *a = &c->mamba;
    MODEL_REQUIRE(a->num_heads > 0 && a->num_heads <= MODEL_MAX_HEADS,
                  "model config: mamba_num_heads=%lld must be in [1, %d]", (long long)a->num_heads,
                  MODEL_MAX_HEADS);
    MODEL_REQUIRE(a->head_dim > 0 && a->head_dim <= MODEL_MAX_HEAD_DIM,
                  "model config: mamba_head_dim=%lld must be in [1, %d]", (long long)a->head_dim,
                  MODEL_MAX_HEAD_DIM);
    MODEL_REQUIRE(a->num_heads * a->head_dim <= MODEL_MAX_FFN,
                  "model config: mamba_num_heads x mamba_head_dim = %lld exceeds %d",
                  (long long)(a->num_heads * a->head_dim), MODEL_MAX_FFN);
    MODEL_REQUIRE(a->n_groups > 0 && a->num_heads % a->n_groups == 0,
                  "model config: n_groups=%lld must divide mamba_num_heads=%lld",
                  (long long)a->n_groups, (long long)a->num_heads);
    MODEL_REQUIRE(a->state_size > 0 && a->state_size <= MODEL_MAX_HEAD_DIM,
                  "model config: ssm_state_size=%lld must be in [1, %d]", (long long)a->state_size,
                  MODEL_MAX_HEAD_DIM);
    MODEL_REQUIRE(a->conv_kernel >= 1 && a->conv_kernel <= 65,
                  "model config: conv_kernel=%lld must be in [1, 65]", (long long)a->conv_kernel);
    MODEL_REQUIRE(a->chunk_size >= 1 && a->chunk_size <= (1 << 16),
                  "model config: chunk_size=%lld must be in [1, 65536]", (long long)a->chunk_size);
    MODEL_REQUIRE(
        a->dt_min >= 0 && a->dt_min <= a->dt_max,
        "model config: the dt limits [%g, %g] (time_step_min, time_step_max) are empty or "
        "negative",
        a->dt_min, a->dt_max);
    MODEL_REQUIRE(a->norm_eps > 0 && a->norm_eps < 1,
                  "model config: the Mamba2 norm's layer_norm_epsilon=%g is out of range",
                  a->norm_eps);
    MODEL_REQUIRE(tp >= 1 && a->n_groups % tp == 0,
                  "model: tp_size=%d must divide the Mamba2 mixer's n_groups=%lld (its heads and "
                  "groups are split together, each group whole on one rank)",
                  tp, (long long)a->n_groups);
    return BT_OK;
}

static void mb_layout(model_layout_t *lb, const model_config_t *c, const char *prefix,
                      model_sub_t *sub)
{
    mb_dims_t d = mb_dims_tp(c, 1); /* global shapes; the layout splits them */
    int64_t C = c->hidden_size;
    bool pb = c->mamba.proj_bias;
    char n[MODEL_NAME_MAX];
#define ADD(slot, suffix, ndim, d0, d1, dim, unit)                                                 \
    do {                                                                                           \
        snprintf(n, sizeof n, "%s.%s", prefix, suffix);                                            \
        sub->ix[slot] = model_layout_add(lb, n, ndim, d0, d1, dim, unit);                          \
    } while (0)
    /* the parts of in_proj, its bias and the conv: rows, and the unit a
     * rank's share is made of (a head's P rows, a group's N) */
    const int64_t rows[5] = {d.I, d.I, d.GN, d.GN, d.H}, unit[5] = {d.P, d.P, d.Ns, d.Ns, 1};
    for (int i = 0; i < 5; i++) {
        char s[40];
        snprintf(s, sizeof s, "in_proj.weight%c%d", MODEL_PART_MARK, i);
        ADD(MB_IN + i, s, 2, rows[i], C, 0, unit[i]);
        snprintf(s, sizeof s, "in_proj.bias%c%d", MODEL_PART_MARK, i);
        if (pb) ADD(MB_INB + i, s, 1, rows[i], 0, 0, unit[i]);
    }
    for (int i = 0; i < 3; i++) { /* [rows, 1, K] as torch's Conv1d */
        snprintf(n, sizeof n, "%s.conv1d.weight%c%d", prefix, MODEL_PART_MARK, i);
        sub->ix[MB_CONV + i] =
            model_layout_add_nd(lb, n, 3, (int64_t[]){rows[i + 1], 1, d.K}, 0, unit[i + 1]);
        char s[40];
        snprintf(s, sizeof s, "conv1d.bias%c%d", MODEL_PART_MARK, i);
        if (c->mamba.conv_bias) ADD(MB_CONVB + i, s, 1, rows[i + 1], 0, 0, unit[i + 1]);
    }
    ADD(MB_DTB, "dt_bias", 1, d.H, 0, 0, 1);
    ADD(MB_ALOG, "A_log", 1, d.H, 0, 0, 1);
    ADD(MB_D, "D", 1, d.H, 0, 0, 1);
    ADD(MB_NORM, "norm.weight", 1, d.I, 0, 0, d.I / d.G); /* whole groups */
    /* f32 under a bf16 compute dtype: only the mixer's own ops read these,
     * in f32 (kernels/kernels.h, "Mamba2 mixer"), and a bf16 A_log moves
     * every decay exp(dt A) (transformers under autocast reads them all in
     * f32; the Mamba convention keeps A_log and D out of weight decay, as
     * the 1-D rule of the optimizer does) */
    const int keep[4] = {MB_DTB, MB_ALOG, MB_D, MB_NORM};
    for (int i = 0; i < 4; i++) model_layout_keep_f32(lb, sub->ix[keep[i]]);
    ADD(MB_OUT, "out_proj.weight", 2, C, d.I, 1, d.P);
    if (pb) ADD(MB_OUTB, "out_proj.bias", 1, C, 0, -1, 1);
#undef ADD
}

/* The saved region of one sublayer (bytes from its start), N rows:
 * z, x, B, C before the conv, x, B, C after it, dt raw and final, the scan
 * output y, the norm's output g (activation dtype), the norm's rstd [N, G]
 * and the chunk start states [B, chunks, H, P, N] (f32). */
enum { SV_Z = 0, SV_XR, SV_BR, SV_CR, SV_XC, SV_BC, SV_CC, SV_DTR, SV_DT, SV_Y, SV_G, SV_RSTD,
       SV_CS, SV_COUNT };

static void mb_saved_offsets(const model_t *m, int64_t B, int64_t T, double off[SV_COUNT + 1])
{
    mb_dims_t d = mb_dims(m);
    double N = (double)B * (double)T, es = (double)dtype_size(m->place.act_dtype);
    double chunks = ceil((double)T / (double)m->cfg.mamba.chunk_size);
    double cols[SV_COUNT] = {[SV_Z] = (double)d.I,   [SV_XR] = (double)d.I,
                             [SV_BR] = (double)d.GN, [SV_CR] = (double)d.GN,
                             [SV_XC] = (double)d.I,  [SV_BC] = (double)d.GN,
                             [SV_CC] = (double)d.GN, [SV_DTR] = (double)d.H,
                             [SV_DT] = (double)d.H,  [SV_Y] = (double)d.I,
                             [SV_G] = (double)d.I};
    double at = 0;
    for (int i = 0; i < SV_COUNT; i++) {
        off[i] = at;
        double bytes;
        if (i == SV_RSTD) bytes = N * (double)d.G * 4;
        else if (i == SV_CS)
            bytes = (double)B * chunks * (double)(d.H * d.P * d.Ns) * 4;
        else bytes = N * cols[i] * es;
        at += model_align_d(bytes > 0 ? bytes : 1);
    }
    off[SV_COUNT] = at;
}

static double mb_saved_bytes(const model_t *m, int64_t B, int64_t T)
{
    double off[SV_COUNT + 1];
    mb_saved_offsets(m, B, T, off);
    return off[SV_COUNT];
}

/* scratch (backward): dg dy dz dxc dxr [N, I], dbc dcc dbr dcr [N, G N], ddt ddtr [N, H] */
enum { SC_DG = 0, SC_DY, SC_DZ, SC_DXC, SC_DXR, SC_DBC, SC_DCC, SC_DBR, SC_DCR, SC_DDT, SC_DDTR,
       SC_COUNT };

static void mb_scratch_offsets(const model_t *m, int64_t B, int64_t T, double off[SC_COUNT + 1])
{
    mb_dims_t d = mb_dims(m);
    double N = (double)B * (double)T, es = (double)dtype_size(m->place.act_dtype), at = 0;
    for (int i = 0; i < SC_COUNT; i++) {
        off[i] = at;
        double cols = i <= SC_DXR ? (double)d.I : i <= SC_DCR ? (double)d.GN : (double)d.H;
        at += model_align_d(N * cols * es > 0 ? N * cols * es : 1);
    }
    off[SC_COUNT] = at;
}

static double mb_scratch_bytes(const model_t *m, int64_t B, int64_t T)
{
    double off[SC_COUNT + 1];
    mb_scratch_offsets(m, B, T, off);
    return off[SC_COUNT];
}

/* decode cache: conv histories of x, B, C [K-1, I | GN | GN] (activation
 * dtype), then the scan state [H, P, N] f32 (B = 1) */
static void mb_cache_offsets(const model_t *m, double off[5])
{
    mb_dims_t d = mb_dims(m);
    double es = (double)dtype_size(m->place.act_dtype), h = (double)(d.K - 1), at = 0;
    double bytes[4] = {h * (double)d.I * es, h * (double)d.GN * es, h * (double)d.GN * es,
                       (double)(d.H * d.P * d.Ns) * 4};
    for (int i = 0; i < 4; i++) {
        off[i] = at;
        at += model_align_d(bytes[i] > 0 ? bytes[i] : 1);
    }
    off[4] = at;
}

static double mb_cache_bytes(const model_t *m, int64_t T)
{
    (void)T;
    double off[5];
    mb_cache_offsets(m, off);
    return off[4];
}

/* Rows [r0, r0 + n) of a parameter (or gradient) t of shape [R, ...], as a
 * 2-D [n, numel / R] view; NULL for an absent t. */
static tensor_t rows_of(const tensor_t *t, int64_t r0, int64_t n)
{
    int64_t inner = tensor_numel(t) / t->shape[0];
    tensor_t flat = tensor_reshape(t, 2, (int64_t[]){t->shape[0], inner});
    return tensor_narrow(&flat, r0, n);
}

/* The five row blocks of in_proj (z, x, B, C, dt), the three of the conv
 * (2-D [rows, K] views): the parameters, or their gradients. */
typedef struct {
    tensor_t w[5], b[5], cw[3], cb[3];
    bool     has_b, has_cb;
} mb_split_t;

static mb_split_t mb_split(model_t *m, const model_sub_t *sub, bool grad)
{
    mb_split_t s = {.has_b = sub->ix[MB_INB] >= 0, .has_cb = sub->ix[MB_CONVB] >= 0};
#define MB_T(slot) (grad ? model_sub_grad(m, sub, slot) : model_sub_param(m, sub, slot))
    for (int i = 0; i < 5; i++) {
        s.w[i] = *MB_T(MB_IN + i);
        if (s.has_b) s.b[i] = *MB_T(MB_INB + i);
    }
    for (int i = 0; i < 3; i++) {
        const tensor_t *cw = MB_T(MB_CONV + i);
        s.cw[i] = rows_of(cw, 0, cw->shape[0]);
        if (s.has_cb) s.cb[i] = *MB_T(MB_CONVB + i);
    }
#undef MB_T
    return s;
}

typedef struct {
    tensor_t v[SV_COUNT]; /* 2-D [N, cols] (rstd [N, G], chunk states 1-D) */
    tensor_t x4, y4, B4, C4, dt3;
} mb_views_t;

static mb_views_t mb_views(const model_run_t *r, void *saved)
{
    const model_t *m = r->m;
    mb_dims_t d = mb_dims(m);
    double off[SV_COUNT + 1];
    mb_saved_offsets(m, r->B, r->T, off);
    int64_t N = r->N, cols[SV_COUNT] = {d.I, d.I, d.GN, d.GN, d.I, d.GN, d.GN, d.H, d.H, d.I, d.I};
    mb_views_t v;
    for (int i = 0; i < SV_RSTD; i++)
        v.v[i] = model_act_view(m, saved, (size_t)off[i], 2, (int64_t[]){N, cols[i]});
    v.v[SV_RSTD] = tensor_make((char *)saved + (size_t)off[SV_RSTD], DT_F32, m->place.dev, 2,
                               (int64_t[]){N, d.G});
    int64_t chunks = (r->T + m->cfg.mamba.chunk_size - 1) / m->cfg.mamba.chunk_size;
    v.v[SV_CS] = tensor_make((char *)saved + (size_t)off[SV_CS], DT_F32, m->place.dev, 1,
                             (int64_t[]){r->B * chunks * d.H * d.P * d.Ns});
    int64_t x4[4] = {r->B, r->T, d.H, d.P}, g4[4] = {r->B, r->T, d.G, d.Ns};
    v.x4 = tensor_reshape(&v.v[SV_XC], 4, x4);
    v.y4 = tensor_reshape(&v.v[SV_Y], 4, x4);
    v.B4 = tensor_reshape(&v.v[SV_BC], 4, g4);
    v.C4 = tensor_reshape(&v.v[SV_CC], 4, g4);
    v.dt3 = tensor_reshape(&v.v[SV_DT], 3, (int64_t[]){r->B, r->T, d.H});
    return v;
}

static tensor_t as_btc(const tensor_t *t, int64_t B, int64_t T)
{
    return tensor_reshape(t, 3, (int64_t[]){B, T, tensor_cols(t)});
}

static bt_status_t mb_forward(model_run_t *r, const model_sub_t *sub, void *saved,
                              const tensor_t *ln, tensor_t *y)
{
    model_t *m = r->m;
    kern_stream_t *s = r->s;
    const model_mamba_config_t *c = &m->cfg.mamba;
    mb_dims_t d = mb_dims(m);
    mb_views_t v = mb_views(r, saved);
    mb_split_t w = mb_split(m, sub, false);
    /* z, x, B, C, dt raw */
    const int proj_to[5] = {SV_Z, SV_XR, SV_BR, SV_CR, SV_DTR};
    for (int i = 0; i < 5; i++)
        kern_linear_fwd(s, &v.v[proj_to[i]], ln, &w.w[i], w.has_b ? &w.b[i] : NULL);
    /* the decode cache: conv histories and the scan state, zero at position 0 */
    tensor_t hist[3], state;
    tensor_t *hp[3] = {NULL, NULL, NULL}, *sp = NULL;
    if (r->cache) {
        double off[5];
        mb_cache_offsets(m, off);
        int64_t hc[3] = {d.I, d.GN, d.GN};
        for (int i = 0; i < 3; i++) {
            hist[i] = model_act_view(m, r->cache, (size_t)off[i], 3, (int64_t[]){1, d.K - 1, hc[i]});
            hp[i] = &hist[i];
        }
        state = tensor_make((char *)r->cache + (size_t)off[3], DT_F32, m->place.dev, 1,
                            (int64_t[]){d.H * d.P * d.Ns});
        sp = &state;
        if (r->pos0 == 0) {
            for (int i = 0; i < 3 && d.K > 1; i++) kern_zero(s, &hist[i]);
            kern_zero(s, &state);
        }
    }
    for (int i = 0; i < 3; i++) {
        tensor_t in = as_btc(&v.v[SV_XR + i], r->B, r->T), out = as_btc(&v.v[SV_XC + i], r->B, r->T);
        kern_conv1d_causal_fwd(s, &out, d.K > 1 ? hp[i] : NULL, &in, &w.cw[i],
                               w.has_cb ? &w.cb[i] : NULL, KERN_ACT_SILU);
    }
    kern_ssm_dt_fwd(s, &v.v[SV_DT], &v.v[SV_DTR], model_sub_param(m, sub, MB_DTB),
                    (float)c->dt_min, (float)c->dt_max);
    kern_ssd_scan_fwd(s, &v.y4, r->cache ? NULL : &v.v[SV_CS], sp, &v.x4, &v.dt3,
                      model_sub_param(m, sub, MB_ALOG), &v.B4, &v.C4, model_sub_param(m, sub, MB_D),
                      c->chunk_size);
    kern_gated_rmsnorm_fwd(s, &v.v[SV_G], &v.v[SV_RSTD], &v.v[SV_Y], &v.v[SV_Z],
                           model_sub_param(m, sub, MB_NORM), d.G, (float)c->norm_eps);
    return model_row_parallel_fwd(r, y, &v.v[SV_G], model_sub_param(m, sub, MB_OUT),
                                  model_sub_param(m, sub, MB_OUTB), "out_proj output", sub->layer);
}

static bt_status_t mb_backward(model_run_t *r, const model_sub_t *sub, void *saved,
                               const tensor_t *ln, const tensor_t *dy, tensor_t *dln)
{
    model_t *m = r->m;
    kern_stream_t *s = r->s;
    const model_mamba_config_t *c = &m->cfg.mamba;
    mb_dims_t d = mb_dims(m);
    mb_views_t v = mb_views(r, saved);
    mb_split_t w = mb_split(m, sub, false), g = mb_split(m, sub, true);
    double off[SC_COUNT + 1];
    mb_scratch_offsets(m, r->B, r->T, off);
    int64_t N = r->N;
    int64_t cols[SC_COUNT] = {d.I, d.I, d.I, d.I, d.I, d.GN, d.GN, d.GN, d.GN, d.H, d.H};
    tensor_t sc[SC_COUNT];
    for (int i = 0; i < SC_COUNT; i++) {
        sc[i] = model_act_view(m, r->scratch, (size_t)off[i], 2, (int64_t[]){N, cols[i]});
        if (i != SC_DG) kern_zero(s, &sc[i]); /* the Mamba ops accumulate */
    }
    /* out_proj, then the gated norm */
    kern_linear_bwd_set(s, &sc[SC_DG], model_sub_grad(m, sub, MB_OUT), model_sub_grad(m, sub, MB_OUTB),
                        dy, &v.v[SV_G], model_sub_param(m, sub, MB_OUT));
    kern_gated_rmsnorm_bwd(s, &sc[SC_DY], &sc[SC_DZ], model_sub_grad(m, sub, MB_NORM), &sc[SC_DG],
                           &v.v[SV_Y], &v.v[SV_Z], model_sub_param(m, sub, MB_NORM), &v.v[SV_RSTD],
                           d.G);
    /* the scan */
    int64_t x4[4] = {r->B, r->T, d.H, d.P}, g4[4] = {r->B, r->T, d.G, d.Ns};
    tensor_t dy4 = tensor_reshape(&sc[SC_DY], 4, x4), dx4 = tensor_reshape(&sc[SC_DXC], 4, x4);
    tensor_t dB4 = tensor_reshape(&sc[SC_DBC], 4, g4), dC4 = tensor_reshape(&sc[SC_DCC], 4, g4);
    tensor_t ddt3 = tensor_reshape(&sc[SC_DDT], 3, (int64_t[]){r->B, r->T, d.H});
    kern_ssd_scan_bwd(s, &dx4, &ddt3, model_sub_grad(m, sub, MB_ALOG), &dB4, &dC4,
                      model_sub_grad(m, sub, MB_D), &dy4, &v.x4, &v.dt3,
                      model_sub_param(m, sub, MB_ALOG), &v.B4, &v.C4,
                      model_sub_param(m, sub, MB_D), &v.v[SV_CS], c->chunk_size);
    kern_ssm_dt_bwd(s, &sc[SC_DDTR], model_sub_grad(m, sub, MB_DTB), &sc[SC_DDT], &v.v[SV_DTR],
                    model_sub_param(m, sub, MB_DTB), (float)c->dt_min, (float)c->dt_max);
    /* the convs */
    const int dpre[3] = {SC_DXR, SC_DBR, SC_DCR}, dpost[3] = {SC_DXC, SC_DBC, SC_DCC};
    for (int i = 0; i < 3; i++) {
        tensor_t dxr = as_btc(&sc[dpre[i]], r->B, r->T), dxc = as_btc(&sc[dpost[i]], r->B, r->T);
        tensor_t xr = as_btc(&v.v[SV_XR + i], r->B, r->T);
        kern_conv1d_causal_bwd(s, &dxr, &g.cw[i], g.has_cb ? &g.cb[i] : NULL, &dxc, &xr, &w.cw[i],
                               w.has_cb ? &w.cb[i] : NULL, KERN_ACT_SILU);
    }
    /* in_proj: dln from the five blocks */
    const int from[5] = {SC_DZ, SC_DXR, SC_DBR, SC_DCR, SC_DDTR};
    for (int i = 0; i < 5; i++) {
        if (i == 0)
            kern_linear_bwd_set(s, dln, &g.w[i], g.has_b ? &g.b[i] : NULL, &sc[from[i]], ln,
                                &w.w[i]);
        else
            kern_linear_bwd(s, dln, &g.w[i], g.has_b ? &g.b[i] : NULL, &sc[from[i]], ln, &w.w[i]);
    }
    return model_tp_input_sum(r, dln, "the Mamba2 input gradient", sub->layer);
}

/* in_proj (C x proj) and out_proj (I x C) multiply every token; the conv
 * (conv x K), the scan and the norm are per-token work between activations.
 * The scan by chunks of L: per token and head, the intra-chunk products
 * C.B (N) and their weighting of x (P) over L/2 earlier tokens on average,
 * the chunk state's update (P N) and its read-out (P N): counted as
 * H (L/2 (N + P) + 2 P N) multiply-adds. */
static void mb_flops(const model_config_t *c, int64_t T, model_flops_t *f)
{
    (void)T;
    mb_dims_t d = mb_dims_tp(c, 1);
    double C = (double)c->hidden_size, L = (double)c->mamba.chunk_size;
    f->matmul_params += C * (double)d.proj + (double)d.I * C;
    f->attn_fma += (double)d.conv * (double)d.K +
                   (double)d.H * (L / 2 * (double)(d.Ns + d.P) + 2.0 * (double)(d.P * d.Ns));
}

static const kern_op_t mb_ops[] = {KERN_OP_LINEAR, KERN_OP_MAMBA, KERN_OP_MATMUL,
                                   KERN_OP_ELEMENTWISE};

const model_kind_t model_kind_mamba2 = {
    .name = "mamba2",
    .validate = mb_validate,
    .layout = mb_layout,
    .saved_bytes = mb_saved_bytes,
    .scratch_bytes = mb_scratch_bytes,
    .shared_bytes = NULL,
    .shared_init = NULL,
    .cache_bytes = mb_cache_bytes,
    .forward = mb_forward,
    .backward = mb_backward,
    .flops = mb_flops,
    .ops = mb_ops,
    .n_ops = (int)(sizeof mb_ops / sizeof mb_ops[0]),
};
