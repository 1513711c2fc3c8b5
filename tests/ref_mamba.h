/* Float64 references of the Mamba2 mixer's kernels (kernels.h, "Mamba2
 * mixer"), shared by tests/test_kernels_mamba.c (against the CPU kernels,
 * with finite differences of them for the backwards) and
 * tests/device/test_cuda_ops.c (against the CUDA twins). The scan's
 * reference is the plain token-by-token recurrence, not the chunked form. */
#ifndef BT_TESTS_REF_MAMBA_H
#define BT_TESTS_REF_MAMBA_H

#include "tests/test_kernels_common.h"

static inline double ref_silu(double v) { return v / (1.0 + exp(-v)); }

typedef struct {
    double *x, *w, *bias, *R;
    int64_t B, T, C, K;
    kern_act_t act;
} conv_ctx_t;

static inline void ref_conv(double *out, const conv_ctx_t *c)
{
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t t = 0; t < c->T; t++)
            for (int64_t ch = 0; ch < c->C; ch++) {
                double v = c->bias ? c->bias[ch] : 0;
                for (int64_t k = 0; k < c->K; k++) {
                    int64_t j = t - c->K + 1 + k;
                    if (j >= 0) v += c->w[ch * c->K + k] * c->x[(b * c->T + j) * c->C + ch];
                }
                out[(b * c->T + t) * c->C + ch] = c->act == KERN_ACT_SILU ? ref_silu(v) : v;
            }
}

static inline double ref_dt(double v, double lo, double hi)
{
    double sp = v > 20 ? v : log1p(exp(v));
    return sp < lo ? lo : sp > hi ? hi : sp;
}

typedef struct {
    double *x, *dt, *A_log, *Bm, *Cm, *D, *R, *S0; /* S0 [B,H,P,N] or NULL */
    int64_t B, T, H, P, G, N;
} ssd_ctx_t;

/* the recurrence, token by token; end state into S_end when non-NULL */
static inline void ref_ssd(double *y, double *S_end, const ssd_ctx_t *c)
{
    int64_t H = c->H, P = c->P, N = c->N, G = c->G, T = c->T;
    double *S = kt_alloc_d(P * N);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < H; h++) {
            int64_t g = h / (H / G);
            double A = -exp(c->A_log[h]);
            for (int64_t i = 0; i < P * N; i++) S[i] = c->S0 ? c->S0[(b * H + h) * P * N + i] : 0;
            for (int64_t t = 0; t < T; t++) {
                double dt = c->dt[(b * T + t) * H + h], dA = exp(dt * A);
                const double *x = c->x + ((b * T + t) * H + h) * P;
                const double *Bv = c->Bm + ((b * T + t) * G + g) * N;
                const double *Cv = c->Cm + ((b * T + t) * G + g) * N;
                for (int64_t p = 0; p < P; p++) {
                    double acc = 0;
                    for (int64_t n = 0; n < N; n++) {
                        S[p * N + n] = dA * S[p * N + n] + dt * x[p] * Bv[n];
                        acc += S[p * N + n] * Cv[n];
                    }
                    y[((b * T + t) * H + h) * P + p] = acc + (c->D ? c->D[h] : 0) * x[p];
                }
            }
            if (S_end)
                for (int64_t i = 0; i < P * N; i++) S_end[(b * H + h) * P * N + i] = S[i];
        }
    free(S);
}

typedef struct {
    double *y, *z, *w, *R;
    int64_t N, C, G;
    double eps;
} gn_ctx_t;

static inline void ref_gnorm(double *out, const gn_ctx_t *c)
{
    int64_t Cg = c->C / c->G;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t g = 0; g < c->G; g++) {
            const double *y = c->y + n * c->C + g * Cg, *z = c->z + n * c->C + g * Cg;
            double ss = 0;
            for (int64_t i = 0; i < Cg; i++) ss += pow(y[i] * ref_silu(z[i]), 2);
            double r = 1 / sqrt(ss / (double)Cg + c->eps);
            for (int64_t i = 0; i < Cg; i++)
                out[n * c->C + g * Cg + i] = c->w[g * Cg + i] * y[i] * ref_silu(z[i]) * r;
        }
}

#endif
