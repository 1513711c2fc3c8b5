/* The Mamba2 mixer's sequence ops (kernels.h, "Mamba2 mixer") as one unit
 * of work each, run by the CPU backend (kernels/cpu/mamba.c: a pool task per
 * unit); the CUDA kernels (kernels/cuda/mamba.cu) share the small elementwise
 * helpers (dt, silu) and are checked against these. f32 data, sums in double, in a fixed order;
 * every unit writes only its own outputs, and scratch comes from the caller
 * (no allocation, no library call that a device lacks).
 *
 * Units: conv forward per (batch row, channel), conv backward per channel
 * (its weight and bias gradients sum over rows and tokens); dt per element,
 * its bias gradient per head; the scan forward per (batch row, head), its
 * backward per (batch row, group), whose B and C gradients sum over the
 * group's heads, with the per-head A_log and D gradients left per batch row
 * for the caller to sum in row order; the gated norm per row, its weight
 * gradient per column. */
#ifndef BT_KERNELS_MAMBA_SEQ_H
#define BT_KERNELS_MAMBA_SEQ_H

#include "kernels/kernels.h"

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define MB_FN static __host__ __device__ inline
#else
#define MB_FN static inline
#endif

/* ---- causal depthwise conv1d ------------------------------------------------- */

typedef struct {
    float *out, *state, *dx, *dw, *dbias;
    const float *x, *w, *bias, *dout;
    int64_t B, T, C, K;
    kern_act_t act;
} mb_conv_t;

MB_FN double mb_act(double v, kern_act_t act)
{
    return act == KERN_ACT_SILU ? v / (1.0 + exp(-v)) : v;
}

MB_FN double mb_act_grad(double v, kern_act_t act)
{
    if (act != KERN_ACT_SILU) return 1.0;
    double sg = 1.0 / (1.0 + exp(-v));
    return sg * (1.0 + v * (1.0 - sg));
}

/* input j of batch row b, channel c: j < 0 reaches into the history */
MB_FN double mb_conv_in(const mb_conv_t *a, const float *state, int64_t b, int64_t j, int64_t c)
{
    if (j >= 0) return a->x[(b * a->T + j) * a->C + c];
    if (!state) return 0.0;
    return state[(b * (a->K - 1) + (a->K - 1) + j) * a->C + c];
}

MB_FN double mb_conv_pre(const mb_conv_t *a, const float *state, int64_t b, int64_t t, int64_t c)
{
    double v = a->bias ? a->bias[c] : 0.0;
    for (int64_t k = 0; k < a->K; k++)
        v += (double)a->w[c * a->K + k] * mb_conv_in(a, state, b, t - a->K + 1 + k, c);
    return v;
}

#define MB_CONV_KMAX 65 /* widest kernel: the history is kept in a local array */

/* outputs of (b, c), then its state replaced by the last K-1 inputs */
MB_FN void mb_conv_fwd_one(const mb_conv_t *a, int64_t b, int64_t c)
{
    double hist[MB_CONV_KMAX];
    for (int64_t t = 0; t < a->T; t++)
        a->out[(b * a->T + t) * a->C + c] = (float)mb_act(mb_conv_pre(a, a->state, b, t, c), a->act);
    if (!a->state) return;
    for (int64_t i = 0; i < a->K - 1; i++)
        hist[i] = mb_conv_in(a, a->state, b, a->T - (a->K - 1) + i, c);
    for (int64_t i = 0; i < a->K - 1; i++)
        a->state[(b * (a->K - 1) + i) * a->C + c] = (float)hist[i];
}

/* channel c over every row; scratch: T + K doubles */
MB_FN void mb_conv_bwd_one(const mb_conv_t *a, int64_t c, double *scratch)
{
    double *dpre = scratch, *dwc = scratch + a->T, db = 0;
    for (int64_t k = 0; k < a->K; k++) dwc[k] = 0;
    for (int64_t b = 0; b < a->B; b++) {
        for (int64_t t = 0; t < a->T; t++)
            dpre[t] = (double)a->dout[(b * a->T + t) * a->C + c] *
                      mb_act_grad(mb_conv_pre(a, NULL, b, t, c), a->act);
        for (int64_t t = 0; t < a->T; t++) {
            db += dpre[t];
            for (int64_t k = 0; k < a->K; k++)
                dwc[k] += dpre[t] * mb_conv_in(a, NULL, b, t - a->K + 1 + k, c);
        }
        if (a->dx)
            for (int64_t j = 0; j < a->T; j++) { /* input j feeds outputs j + K-1-k */
                double g = 0;
                for (int64_t k = 0; k < a->K; k++) {
                    int64_t t = j + a->K - 1 - k;
                    if (t < a->T) g += (double)a->w[c * a->K + k] * dpre[t];
                }
                a->dx[(b * a->T + j) * a->C + c] += (float)g;
            }
    }
    if (a->dbias) a->dbias[c] += (float)db;
    if (a->dw)
        for (int64_t k = 0; k < a->K; k++) a->dw[c * a->K + k] += (float)dwc[k];
}

/* ---- dt: bias, softplus, limits ---------------------------------------------- */

/* torch's softplus (beta 1, threshold 20) in float */
MB_FN float mb_softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

MB_FN float mb_dt_fwd_one(float raw, float bias, float lo, float hi)
{
    float v = mb_softplus(raw + bias);
    v = v < lo ? lo : v;
    return v > hi ? hi : v;
}

/* the gradient of raw (and of the bias) for one element */
MB_FN float mb_dt_bwd_one(float ddt, float raw, float bias, float lo, float hi)
{
    float v = raw + bias, sp = mb_softplus(v);
    if (!(sp >= lo && sp <= hi)) return 0.0f;
    float e = expf(v);
    return ddt * (v > 20.0f ? 1.0f : e / (e + 1.0f));
}

/* ---- the chunked SSD scan ------------------------------------------------------ */

typedef struct {
    int64_t B, T, H, P, G, N, chunk; /* batch, tokens, heads, head dim, groups, state, chunk */
    float *y, *chunk_states, *state;
    float *dx, *ddt, *dB, *dC;
    double *dA_part, *dD_part; /* [B,H]: per batch row, summed by the caller */
    const float *x, *dt, *A_log, *Bm, *Cm, *D, *dy, *cstates;
} mb_ssd_t;

#define MB_X(a, b, t, h) ((a)->x + (((b) * (a)->T + (t)) * (a)->H + (h)) * (a)->P)
#define MB_DY(a, b, t, h) ((a)->dy + (((b) * (a)->T + (t)) * (a)->H + (h)) * (a)->P)
#define MB_DT(a, b, t, h) ((a)->dt[((b) * (a)->T + (t)) * (a)->H + (h)])
#define MB_BC(a, M, b, t, g) ((M) + (((b) * (a)->T + (t)) * (a)->G + (g)) * (a)->N)

MB_FN double mb_dot(const float *u, const float *v, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)u[i] * v[i];
    return s;
}

MB_FN int64_t mb_ssd_chunks(const mb_ssd_t *a) { return (a->T + a->chunk - 1) / a->chunk; }
/* doubles of scratch per unit */
MB_FN int64_t mb_ssd_fwd_scratch(const mb_ssd_t *a) { return a->P * a->N + a->chunk + a->P; }
MB_FN int64_t mb_ssd_bwd_scratch(const mb_ssd_t *a)
{
    return 2 * a->P * a->N + 3 * a->chunk + a->chunk * a->P + 2 * a->T * a->N;
}

/* Per chunk of L tokens with start state S0 [P,N], cs the in-chunk
 * cumulative sum of dt A and u_s = dt_s x_s:
 *   y_l = sum_{s<=l} (C_l.B_s) e^{cs_l-cs_s} u_s + e^{cs_l} S0 C_l + D x_l
 *   S_end = e^{cs_last} S0 + sum_s e^{cs_last-cs_s} u_s B_s^T */
MB_FN void mb_ssd_fwd_one(const mb_ssd_t *a, int64_t b, int64_t h, double *scratch)
{
    int64_t T = a->T, H = a->H, P = a->P, N = a->N, L = a->chunk;
    int64_t g = h / (H / a->G), nc = mb_ssd_chunks(a);
    double A = -exp((double)a->A_log[h]), Dh = a->D ? a->D[h] : 0.0;
    double *S = scratch, *cs = S + P * N, *yl = cs + L;
    float *st = a->state ? a->state + (b * H + h) * P * N : NULL;
    for (int64_t i = 0; i < P * N; i++) S[i] = st ? st[i] : 0.0;
    for (int64_t c = 0; c < nc; c++) {
        int64_t t0 = c * L, len = T - t0 < L ? T - t0 : L;
        if (a->chunk_states) {
            float *o = a->chunk_states + ((b * nc + c) * H + h) * P * N;
            for (int64_t i = 0; i < P * N; i++) o[i] = (float)S[i];
        }
        double run = 0;
        for (int64_t l = 0; l < len; l++) cs[l] = run += (double)MB_DT(a, b, t0 + l, h) * A;
        for (int64_t l = 0; l < len; l++) {
            const float *Cl = MB_BC(a, a->Cm, b, t0 + l, g);
            for (int64_t p = 0; p < P; p++) yl[p] = 0;
            for (int64_t s = 0; s <= l; s++) { /* intra-chunk, under the decay mask */
                double w = mb_dot(Cl, MB_BC(a, a->Bm, b, t0 + s, g), N) * exp(cs[l] - cs[s]) *
                           MB_DT(a, b, t0 + s, h);
                const float *xs = MB_X(a, b, t0 + s, h);
                for (int64_t p = 0; p < P; p++) yl[p] += w * xs[p];
            }
            double e = exp(cs[l]); /* the chunk's start state, decayed to l */
            const float *xl = MB_X(a, b, t0 + l, h);
            float *yo = a->y + ((b * T + t0 + l) * H + h) * P;
            for (int64_t p = 0; p < P; p++) {
                double acc = 0;
                for (int64_t n = 0; n < N; n++) acc += Cl[n] * S[p * N + n];
                yo[p] = (float)(yl[p] + e * acc + Dh * xl[p]);
            }
        }
        double E = cs[len - 1], eE = exp(E); /* the recurrence to the next chunk */
        for (int64_t i = 0; i < P * N; i++) S[i] *= eE;
        for (int64_t s = 0; s < len; s++) {
            double w = exp(E - cs[s]) * MB_DT(a, b, t0 + s, h);
            const float *xs = MB_X(a, b, t0 + s, h), *Bs = MB_BC(a, a->Bm, b, t0 + s, g);
            for (int64_t p = 0; p < P; p++)
                for (int64_t n = 0; n < N; n++) S[p * N + n] += w * xs[p] * Bs[n];
        }
    }
    if (st)
        for (int64_t i = 0; i < P * N; i++) st[i] = (float)S[i];
}

/* The backward for the heads of group g, walking the chunks from the last,
 * with dS the gradient of a chunk's end state; the gradient of its start
 * state (e^{cs_last} dS + sum_l e^{cs_l} dy_l C_l^T) goes to the chunk
 * before. Gradients of cs become those of dt A by a reverse cumsum. */
MB_FN void mb_ssd_bwd_one(const mb_ssd_t *a, int64_t b, int64_t g, double *scratch)
{
    int64_t T = a->T, H = a->H, P = a->P, N = a->N, L = a->chunk;
    int64_t hpg = H / a->G, nc = mb_ssd_chunks(a);
    double *dS = scratch, *dSn = dS + P * N, *cs = dSn + P * N, *dcs = cs + L, *ddtl = dcs + L;
    double *du = ddtl + L, *dBg = du + L * P, *dCg = dBg + T * N;
    for (int64_t i = 0; i < 2 * T * N; i++) dBg[i] = 0;
    for (int64_t h = g * hpg; h < (g + 1) * hpg; h++) {
        double A = -exp((double)a->A_log[h]), Dh = a->D ? a->D[h] : 0.0;
        double dA = 0, dD = 0;
        for (int64_t i = 0; i < P * N; i++) dS[i] = 0;
        for (int64_t c = nc - 1; c >= 0; c--) {
            int64_t t0 = c * L, len = T - t0 < L ? T - t0 : L;
            const float *S0 = a->cstates + ((b * nc + c) * H + h) * P * N;
            double run = 0;
            for (int64_t l = 0; l < len; l++) cs[l] = run += (double)MB_DT(a, b, t0 + l, h) * A;
            double E = cs[len - 1], eE = exp(E);
            for (int64_t l = 0; l < len; l++) dcs[l] = ddtl[l] = 0;
            for (int64_t i = 0; i < len * P; i++) du[i] = 0;
            /* through the chunk's end state */
            double s0ds = 0;
            for (int64_t i = 0; i < P * N; i++) s0ds += S0[i] * dS[i];
            dcs[len - 1] += eE * s0ds;
            for (int64_t s = 0; s < len; s++) {
                double dec = exp(E - cs[s]), dts = MB_DT(a, b, t0 + s, h), f = 0;
                const float *xs = MB_X(a, b, t0 + s, h), *Bs = MB_BC(a, a->Bm, b, t0 + s, g);
                for (int64_t p = 0; p < P; p++) {
                    double v = 0;
                    for (int64_t n = 0; n < N; n++) v += Bs[n] * dS[p * N + n];
                    du[s * P + p] += dec * v;
                    f += dts * xs[p] * v;
                }
                f *= dec;
                dcs[len - 1] += f;
                dcs[s] -= f;
                for (int64_t n = 0; n < N; n++) {
                    double acc = 0;
                    for (int64_t p = 0; p < P; p++) acc += dts * xs[p] * dS[p * N + n];
                    dBg[(t0 + s) * N + n] += dec * acc;
                }
            }
            /* the intra-chunk products */
            for (int64_t l = 0; l < len; l++) {
                const float *Cl = MB_BC(a, a->Cm, b, t0 + l, g), *dyl = MB_DY(a, b, t0 + l, h);
                for (int64_t s = 0; s <= l; s++) {
                    const float *Bs = MB_BC(a, a->Bm, b, t0 + s, g), *xs = MB_X(a, b, t0 + s, h);
                    double cb = mb_dot(Cl, Bs, N), dec = exp(cs[l] - cs[s]);
                    double ud = (double)MB_DT(a, b, t0 + s, h) * mb_dot(xs, dyl, P);
                    for (int64_t p = 0; p < P; p++) du[s * P + p] += cb * dec * dyl[p];
                    double gv = cb * dec * ud;
                    dcs[l] += gv;
                    dcs[s] -= gv;
                    for (int64_t n = 0; n < N; n++) {
                        dCg[(t0 + l) * N + n] += Bs[n] * dec * ud;
                        dBg[(t0 + s) * N + n] += Cl[n] * dec * ud;
                    }
                }
                /* the start state's share of y_l */
                double e = exp(cs[l]);
                for (int64_t n = 0; n < N; n++) {
                    double q = 0;
                    for (int64_t p = 0; p < P; p++) q += S0[p * N + n] * dyl[p];
                    dCg[(t0 + l) * N + n] += e * q;
                    dcs[l] += e * Cl[n] * q;
                }
            }
            /* the gradient of the start state, for the chunk before */
            for (int64_t i = 0; i < P * N; i++) dSn[i] = eE * dS[i];
            for (int64_t l = 0; l < len; l++) {
                double e = exp(cs[l]);
                const float *Cl = MB_BC(a, a->Cm, b, t0 + l, g), *dyl = MB_DY(a, b, t0 + l, h);
                for (int64_t p = 0; p < P; p++)
                    for (int64_t n = 0; n < N; n++) dSn[p * N + n] += e * Cl[n] * dyl[p];
            }
            /* u = dt x, and the D skip */
            for (int64_t l = 0; l < len; l++) {
                const float *xl = MB_X(a, b, t0 + l, h), *dyl = MB_DY(a, b, t0 + l, h);
                double dtl = MB_DT(a, b, t0 + l, h);
                dD += mb_dot(dyl, xl, P);
                for (int64_t p = 0; p < P; p++) ddtl[l] += du[l * P + p] * xl[p];
                if (a->dx) {
                    float *dxl = a->dx + ((b * T + t0 + l) * H + h) * P;
                    for (int64_t p = 0; p < P; p++)
                        dxl[p] += (float)(du[l * P + p] * dtl + Dh * dyl[p]);
                }
            }
            /* cs -> dt A */
            run = 0;
            for (int64_t k = len - 1; k >= 0; k--) {
                run += dcs[k];
                ddtl[k] += run * A;
                dA += run * MB_DT(a, b, t0 + k, h);
            }
            if (a->ddt)
                for (int64_t l = 0; l < len; l++) a->ddt[(b * T + t0 + l) * H + h] += (float)ddtl[l];
            double *tmp = dS;
            dS = dSn;
            dSn = tmp;
        }
        a->dA_part[b * H + h] = dA * A; /* dA/dA_log = A */
        a->dD_part[b * H + h] = dD;
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            if (a->dB) MB_BC(a, a->dB, b, t, g)[n] += (float)dBg[t * N + n];
            if (a->dC) MB_BC(a, a->dC, b, t, g)[n] += (float)dCg[t * N + n];
        }
}

/* ---- gated grouped RMSNorm ------------------------------------------------------ */

typedef struct {
    float *out, *rstd, *dy, *dz, *dw;
    const float *y, *z, *w, *dout, *rs;
    int64_t N, C, G;
    float eps;
} mb_gnorm_t;

MB_FN float mb_silu(float v) { return v / (1.0f + expf(-v)); }

MB_FN void mb_gnorm_fwd_row(const mb_gnorm_t *a, int64_t n)
{
    int64_t Cg = a->C / a->G;
    for (int64_t gi = 0; gi < a->G; gi++) {
        int64_t c0 = n * a->C + gi * Cg;
        double ss = 0;
        for (int64_t c = 0; c < Cg; c++) {
            float hv = a->y[c0 + c] * mb_silu(a->z[c0 + c]);
            ss += (double)hv * hv;
        }
        float r = 1.0f / sqrtf((float)(ss / (double)Cg) + a->eps);
        a->rstd[n * a->G + gi] = r;
        for (int64_t c = 0; c < Cg; c++)
            a->out[c0 + c] = a->w[gi * Cg + c] * (a->y[c0 + c] * mb_silu(a->z[c0 + c]) * r);
    }
}

/* with h = y silu(z) and o = w h r per group:
 * dh_c = r w_c do_c - (r^3 / Cg) h_c sum_j w_j do_j h_j */
MB_FN void mb_gnorm_bwd_row(const mb_gnorm_t *a, int64_t n)
{
    int64_t Cg = a->C / a->G;
    for (int64_t gi = 0; gi < a->G; gi++) {
        int64_t c0 = n * a->C + gi * Cg;
        double r = a->rs[n * a->G + gi], dot = 0;
        for (int64_t c = 0; c < Cg; c++)
            dot += (double)a->w[gi * Cg + c] * a->dout[c0 + c] * ((double)a->y[c0 + c] * mb_silu(a->z[c0 + c]));
        double k = dot * r * r * r / (double)Cg;
        for (int64_t c = 0; c < Cg; c++) {
            double zv = a->z[c0 + c], sg = 1.0 / (1.0 + exp(-zv)), sl = zv * sg;
            double dh = r * a->w[gi * Cg + c] * a->dout[c0 + c] - k * ((double)a->y[c0 + c] * sl);
            if (a->dy) a->dy[c0 + c] += (float)(dh * sl);
            if (a->dz) a->dz[c0 + c] += (float)(dh * a->y[c0 + c] * sg * (1.0 + zv * (1.0 - sg)));
        }
    }
}

MB_FN void mb_gnorm_dw_col(const mb_gnorm_t *a, int64_t c)
{
    int64_t g = c / (a->C / a->G);
    double s = 0;
    for (int64_t n = 0; n < a->N; n++) {
        int64_t i = n * a->C + c;
        s += (double)a->dout[i] * ((double)a->y[i] * mb_silu(a->z[i])) * a->rs[n * a->G + g];
    }
    a->dw[c] += (float)s;
}

#endif
