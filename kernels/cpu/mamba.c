/* The Mamba2 mixer's sequence ops on the CPU (kernels.h, "Mamba2 mixer"),
 * as HF's NemotronHMamba2Mixer torch path computes them in fp32.
 *
 * Work is cut into tasks by shape alone (channel blocks for the conv, one
 * (batch row, head) per task for the scan's forward, one (batch row, group)
 * for its backward, whose B and C gradients sum over the group's heads), and
 * every sum runs in a fixed order in double, so the bits never depend on the
 * pool's thread count. Per-head parameter gradients (A_log, D) are summed
 * over batch rows after the run, in row order. */
#include "kernels/cpu/cpu.h"

#include "base/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CONV_BLOCK 64 /* channels per conv task */

static void *mamba_calloc(const char *op, size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) BT_PANIC("%s: out of memory for %zu scratch values", op, n);
    return p;
}

static inline double act_fwd(double v, kern_act_t act)
{
    return act == KERN_ACT_SILU ? v / (1.0 + exp(-v)) : v;
}

static inline double act_grad(double v, kern_act_t act)
{
    if (act != KERN_ACT_SILU) return 1.0;
    double sg = 1.0 / (1.0 + exp(-v));
    return sg * (1.0 + v * (1.0 - sg));
}

/* ---- causal depthwise conv1d ------------------------------------------------ */

typedef struct {
    float *out, *state, *dx, *dw, *dbias;
    const float *x, *w, *bias, *dout;
    int64_t B, T, C, K;
    kern_act_t act;
} conv_args_t;

/* input j of batch row b, channel c: j < 0 reaches into the history */
static inline double conv_in(const conv_args_t *a, const float *state, int64_t b, int64_t j,
                             int64_t c)
{
    if (j >= 0) return a->x[(b * a->T + j) * a->C + c];
    if (!state) return 0.0;
    return state[(b * (a->K - 1) + (a->K - 1) + j) * a->C + c];
}

static double conv_pre(const conv_args_t *a, const float *state, int64_t b, int64_t t, int64_t c)
{
    double v = a->bias ? a->bias[c] : 0.0;
    for (int64_t k = 0; k < a->K; k++)
        v += (double)a->w[c * a->K + k] * conv_in(a, state, b, t - a->K + 1 + k, c);
    return v;
}

static void conv_fwd_task(void *arg, int64_t task)
{
    const conv_args_t *a = arg;
    int64_t c0 = task * CONV_BLOCK, c1 = c0 + CONV_BLOCK < a->C ? c0 + CONV_BLOCK : a->C;
    double hist[64];
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t c = c0; c < c1; c++) {
            for (int64_t t = 0; t < a->T; t++)
                a->out[(b * a->T + t) * a->C + c] =
                    (float)act_fwd(conv_pre(a, a->state, b, t, c), a->act);
            if (!a->state) continue;
            for (int64_t i = 0; i < a->K - 1; i++)
                hist[i] = conv_in(a, a->state, b, a->T - (a->K - 1) + i, c);
            for (int64_t i = 0; i < a->K - 1; i++)
                a->state[(b * (a->K - 1) + i) * a->C + c] = (float)hist[i];
        }
}

void cpu_conv1d_causal_fwd(float *out, float *state, const float *x, const float *w,
                           const float *bias, int64_t B, int64_t T, int64_t C, int64_t K,
                           kern_act_t act)
{
    if (K > 65) BT_PANIC("cpu_conv1d_causal_fwd: kernel width %lld > 65", (long long)K);
    conv_args_t a = {.out = out, .state = state, .x = x, .w = w, .bias = bias,
                     .B = B, .T = T, .C = C, .K = K, .act = act};
    cpu_pool_run((C + CONV_BLOCK - 1) / CONV_BLOCK, conv_fwd_task, &a);
}

static void conv_bwd_task(void *arg, int64_t task)
{
    const conv_args_t *a = arg;
    int64_t c0 = task * CONV_BLOCK, c1 = c0 + CONV_BLOCK < a->C ? c0 + CONV_BLOCK : a->C;
    double *dpre = mamba_calloc("cpu_conv1d_causal_bwd", (size_t)a->T, sizeof *dpre);
    double *dwc = mamba_calloc("cpu_conv1d_causal_bwd", (size_t)a->K, sizeof *dwc);
    for (int64_t c = c0; c < c1; c++) {
        double db = 0;
        memset(dwc, 0, (size_t)a->K * sizeof *dwc);
        for (int64_t b = 0; b < a->B; b++) {
            for (int64_t t = 0; t < a->T; t++)
                dpre[t] = (double)a->dout[(b * a->T + t) * a->C + c] *
                          act_grad(conv_pre(a, NULL, b, t, c), a->act);
            for (int64_t t = 0; t < a->T; t++) {
                db += dpre[t];
                for (int64_t k = 0; k < a->K; k++)
                    dwc[k] += dpre[t] * conv_in(a, NULL, b, t - a->K + 1 + k, c);
            }
            if (a->dx)
                for (int64_t j = 0; j < a->T; j++) {
                    /* input j feeds outputs t = j + K-1-k */
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
    free(dpre);
    free(dwc);
}

void cpu_conv1d_causal_bwd(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                           const float *w, const float *bias, int64_t B, int64_t T, int64_t C,
                           int64_t K, kern_act_t act)
{
    conv_args_t a = {.dx = dx, .dw = dw, .dbias = dbias, .dout = dout, .x = x, .w = w,
                     .bias = bias, .B = B, .T = T, .C = C, .K = K, .act = act};
    cpu_pool_run((C + CONV_BLOCK - 1) / CONV_BLOCK, conv_bwd_task, &a);
}

/* ---- dt: bias, softplus, limits ---------------------------------------------- */

/* torch's softplus (beta 1, threshold 20) in float */
static inline float softplus_f(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

void cpu_ssm_dt_fwd(float *dt, const float *raw, const float *bias, int64_t N, int64_t H, float lo,
                    float hi)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t h = 0; h < H; h++) {
            float v = softplus_f(raw[n * H + h] + bias[h]);
            v = v < lo ? lo : v;
            dt[n * H + h] = v > hi ? hi : v;
        }
}

void cpu_ssm_dt_bwd(float *draw, float *dbias, const float *ddt, const float *raw,
                    const float *bias, int64_t N, int64_t H, float lo, float hi)
{
    double *db = dbias ? mamba_calloc("cpu_ssm_dt_bwd", (size_t)H, sizeof *db) : NULL;
    for (int64_t n = 0; n < N; n++)
        for (int64_t h = 0; h < H; h++) {
            float v = raw[n * H + h] + bias[h], sp = softplus_f(v);
            float g = 0.0f;
            if (sp >= lo && sp <= hi) {
                float e = expf(v);
                g = ddt[n * H + h] * (v > 20.0f ? 1.0f : e / (e + 1.0f));
            }
            if (draw) draw[n * H + h] += g;
            if (db) db[h] += g;
        }
    if (db) {
        for (int64_t h = 0; h < H; h++) dbias[h] += (float)db[h];
        free(db);
    }
}

/* ---- the chunked SSD scan ------------------------------------------------------ */

typedef struct {
    const cpu_ssd_shape_t *sh;
    float *y, *chunk_states, *state;
    float *dx, *ddt, *dB, *dC;
    double *dA_part, *dD_part; /* [B,H] */
    const float *x, *dt, *A_log, *Bm, *Cm, *D, *dy, *cstates;
} ssd_args_t;

#define SSD_X(a, b, t, h) ((a)->x + (((b) * (a)->sh->T + (t)) * (a)->sh->H + (h)) * (a)->sh->P)
#define SSD_DY(a, b, t, h) ((a)->dy + (((b) * (a)->sh->T + (t)) * (a)->sh->H + (h)) * (a)->sh->P)
#define SSD_DT(a, b, t, h) ((a)->dt[((b) * (a)->sh->T + (t)) * (a)->sh->H + (h)])
#define SSD_BC(a, M, b, t, g) ((M) + (((b) * (a)->sh->T + (t)) * (a)->sh->G + (g)) * (a)->sh->N)

static inline double dotf(const float *u, const float *v, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)u[i] * v[i];
    return s;
}

static void ssd_fwd_task(void *arg, int64_t task)
{
    const ssd_args_t *a = arg;
    const cpu_ssd_shape_t *sh = a->sh;
    int64_t T = sh->T, H = sh->H, P = sh->P, N = sh->N, L = sh->chunk;
    int64_t b = task / H, h = task % H, g = h / (H / sh->G), nc = (T + L - 1) / L;
    double A = -exp((double)a->A_log[h]), Dh = a->D ? a->D[h] : 0.0;
    double *S = mamba_calloc("cpu_ssd_scan_fwd", (size_t)(P * N), sizeof *S);
    double *cs = mamba_calloc("cpu_ssd_scan_fwd", (size_t)L, sizeof *cs);
    double *yl = mamba_calloc("cpu_ssd_scan_fwd", (size_t)P, sizeof *yl);
    float *st = a->state ? a->state + (b * H + h) * P * N : NULL;
    if (st)
        for (int64_t i = 0; i < P * N; i++) S[i] = st[i];
    for (int64_t c = 0; c < nc; c++) {
        int64_t t0 = c * L, len = T - t0 < L ? T - t0 : L;
        if (a->chunk_states) {
            float *o = a->chunk_states + ((b * nc + c) * H + h) * P * N;
            for (int64_t i = 0; i < P * N; i++) o[i] = (float)S[i];
        }
        double run = 0;
        for (int64_t l = 0; l < len; l++) cs[l] = run += (double)SSD_DT(a, b, t0 + l, h) * A;
        for (int64_t l = 0; l < len; l++) {
            const float *Cl = SSD_BC(a, a->Cm, b, t0 + l, g);
            memset(yl, 0, (size_t)P * sizeof *yl);
            for (int64_t s = 0; s <= l; s++) { /* intra-chunk, under the decay mask */
                double w = dotf(Cl, SSD_BC(a, a->Bm, b, t0 + s, g), N) * exp(cs[l] - cs[s]) *
                           SSD_DT(a, b, t0 + s, h);
                const float *xs = SSD_X(a, b, t0 + s, h);
                for (int64_t p = 0; p < P; p++) yl[p] += w * xs[p];
            }
            double e = exp(cs[l]); /* the chunk's start state, decayed to l */
            const float *xl = SSD_X(a, b, t0 + l, h);
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
            double w = exp(E - cs[s]) * SSD_DT(a, b, t0 + s, h);
            const float *xs = SSD_X(a, b, t0 + s, h), *Bs = SSD_BC(a, a->Bm, b, t0 + s, g);
            for (int64_t p = 0; p < P; p++)
                for (int64_t n = 0; n < N; n++) S[p * N + n] += w * xs[p] * Bs[n];
        }
    }
    if (st)
        for (int64_t i = 0; i < P * N; i++) st[i] = (float)S[i];
    free(S);
    free(cs);
    free(yl);
}

void cpu_ssd_scan_fwd(float *y, float *chunk_states, float *state, const float *x, const float *dt,
                      const float *A_log, const float *Bm, const float *Cm, const float *D,
                      const cpu_ssd_shape_t *sh)
{
    if (sh->T == 0) return;
    ssd_args_t a = {.sh = sh, .y = y, .chunk_states = chunk_states, .state = state, .x = x,
                    .dt = dt, .A_log = A_log, .Bm = Bm, .Cm = Cm, .D = D};
    cpu_pool_run(sh->B * sh->H, ssd_fwd_task, &a);
}

/* The backward of one chunk for one head, walking the chunks from the last:
 * with u_s = dt_s x_s, cs the in-chunk cumulative sum of dt A, E = cs at the
 * chunk's end, S0 its start state and dS the gradient of its end state,
 *   y_l = sum_{s<=l} (C_l.B_s) e^{cs_l-cs_s} u_s + e^{cs_l} S0 C_l + D x_l
 *   S_end = e^E S0 + sum_s e^{E-cs_s} u_s B_s^T
 * and the gradient of S0 (e^E dS + sum_l e^{cs_l} dy_l C_l^T) goes to the
 * chunk before. Gradients of cs become those of dt A by a reverse cumsum. */
static void ssd_bwd_task(void *arg, int64_t task)
{
    const ssd_args_t *a = arg;
    const cpu_ssd_shape_t *sh = a->sh;
    const char *op = "cpu_ssd_scan_bwd";
    int64_t T = sh->T, H = sh->H, P = sh->P, N = sh->N, L = sh->chunk, G = sh->G;
    int64_t b = task / G, g = task % G, hpg = H / G, nc = (T + L - 1) / L;
    double *dS = mamba_calloc(op, (size_t)(P * N), sizeof *dS);
    double *dSn = mamba_calloc(op, (size_t)(P * N), sizeof *dSn);
    double *cs = mamba_calloc(op, (size_t)L, sizeof *cs);
    double *dcs = mamba_calloc(op, (size_t)L, sizeof *dcs);
    double *ddtl = mamba_calloc(op, (size_t)L, sizeof *ddtl);
    double *du = mamba_calloc(op, (size_t)(L * P), sizeof *du);
    double *dBg = mamba_calloc(op, (size_t)(T * N), sizeof *dBg);
    double *dCg = mamba_calloc(op, (size_t)(T * N), sizeof *dCg);
    for (int64_t h = g * hpg; h < (g + 1) * hpg; h++) {
        double A = -exp((double)a->A_log[h]), Dh = a->D ? a->D[h] : 0.0;
        double dA = 0, dD = 0;
        memset(dS, 0, (size_t)(P * N) * sizeof *dS);
        for (int64_t c = nc - 1; c >= 0; c--) {
            int64_t t0 = c * L, len = T - t0 < L ? T - t0 : L;
            const float *S0 = a->cstates + ((b * nc + c) * H + h) * P * N;
            double run = 0;
            for (int64_t l = 0; l < len; l++) cs[l] = run += (double)SSD_DT(a, b, t0 + l, h) * A;
            double E = cs[len - 1], eE = exp(E);
            memset(dcs, 0, (size_t)len * sizeof *dcs);
            memset(ddtl, 0, (size_t)len * sizeof *ddtl);
            memset(du, 0, (size_t)(len * P) * sizeof *du);
            /* through the chunk's end state */
            double s0ds = 0;
            for (int64_t i = 0; i < P * N; i++) s0ds += S0[i] * dS[i];
            dcs[len - 1] += eE * s0ds;
            for (int64_t s = 0; s < len; s++) {
                double dec = exp(E - cs[s]), dts = SSD_DT(a, b, t0 + s, h), f = 0;
                const float *xs = SSD_X(a, b, t0 + s, h), *Bs = SSD_BC(a, a->Bm, b, t0 + s, g);
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
                const float *Cl = SSD_BC(a, a->Cm, b, t0 + l, g), *dyl = SSD_DY(a, b, t0 + l, h);
                for (int64_t s = 0; s <= l; s++) {
                    const float *Bs = SSD_BC(a, a->Bm, b, t0 + s, g), *xs = SSD_X(a, b, t0 + s, h);
                    double cb = dotf(Cl, Bs, N), dec = exp(cs[l] - cs[s]);
                    double ud = (double)SSD_DT(a, b, t0 + s, h) * dotf(xs, dyl, P);
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
                const float *Cl = SSD_BC(a, a->Cm, b, t0 + l, g), *dyl = SSD_DY(a, b, t0 + l, h);
                for (int64_t p = 0; p < P; p++)
                    for (int64_t n = 0; n < N; n++) dSn[p * N + n] += e * Cl[n] * dyl[p];
            }
            /* u = dt x, and the D skip */
            for (int64_t l = 0; l < len; l++) {
                const float *xl = SSD_X(a, b, t0 + l, h), *dyl = SSD_DY(a, b, t0 + l, h);
                double dtl = SSD_DT(a, b, t0 + l, h);
                dD += dotf(dyl, xl, P);
                for (int64_t p = 0; p < P; p++) ddtl[l] += du[l * P + p] * xl[p];
                if (a->dx) {
                    float *dxl = a->dx + ((b * T + t0 + l) * H + h) * P;
                    for (int64_t p = 0; p < P; p++) dxl[p] += (float)(du[l * P + p] * dtl + Dh * dyl[p]);
                }
            }
            /* cs -> dt A */
            run = 0;
            for (int64_t k = len - 1; k >= 0; k--) {
                run += dcs[k];
                ddtl[k] += run * A;
                dA += run * SSD_DT(a, b, t0 + k, h);
            }
            if (a->ddt)
                for (int64_t l = 0; l < len; l++)
                    a->ddt[(b * T + t0 + l) * H + h] += (float)ddtl[l];
            double *tmp = dS;
            dS = dSn;
            dSn = tmp;
        }
        a->dA_part[b * H + h] = dA * A; /* dA/dA_log = A */
        a->dD_part[b * H + h] = dD;
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            if (a->dB) SSD_BC(a, a->dB, b, t, g)[n] += (float)dBg[t * N + n];
            if (a->dC) SSD_BC(a, a->dC, b, t, g)[n] += (float)dCg[t * N + n];
        }
    free(dS), free(dSn), free(cs), free(dcs), free(ddtl), free(du), free(dBg), free(dCg);
}

void cpu_ssd_scan_bwd(float *dx, float *ddt, float *dA_log, float *dB, float *dC, float *dD,
                      const float *dy, const float *x, const float *dt, const float *A_log,
                      const float *Bm, const float *Cm, const float *D, const float *chunk_states,
                      const cpu_ssd_shape_t *sh)
{
    if (sh->T == 0) return;
    ssd_args_t a = {.sh = sh, .dx = dx, .ddt = ddt, .dB = dB, .dC = dC, .dy = dy, .x = x,
                    .dt = dt, .A_log = A_log, .Bm = Bm, .Cm = Cm, .D = D,
                    .cstates = chunk_states};
    a.dA_part = mamba_calloc("cpu_ssd_scan_bwd", (size_t)(sh->B * sh->H), sizeof(double));
    a.dD_part = mamba_calloc("cpu_ssd_scan_bwd", (size_t)(sh->B * sh->H), sizeof(double));
    cpu_pool_run(sh->B * sh->G, ssd_bwd_task, &a);
    for (int64_t h = 0; h < sh->H; h++) {
        double sa = 0, sd = 0;
        for (int64_t b = 0; b < sh->B; b++) {
            sa += a.dA_part[b * sh->H + h];
            sd += a.dD_part[b * sh->H + h];
        }
        if (dA_log) dA_log[h] += (float)sa;
        if (dD) dD[h] += (float)sd;
    }
    free(a.dA_part);
    free(a.dD_part);
}

/* ---- gated grouped RMSNorm ------------------------------------------------------ */

static inline float silu_f(float v) { return v / (1.0f + expf(-v)); }

void cpu_gated_rmsnorm_fwd(float *out, float *rstd, const float *y, const float *z, const float *w,
                           int64_t N, int64_t C, int64_t G, float eps)
{
    int64_t Cg = C / G;
    for (int64_t n = 0; n < N; n++)
        for (int64_t gi = 0; gi < G; gi++) {
            int64_t c0 = n * C + gi * Cg;
            double ss = 0;
            for (int64_t c = 0; c < Cg; c++) {
                float hv = y[c0 + c] * silu_f(z[c0 + c]);
                ss += (double)hv * hv;
            }
            float r = 1.0f / sqrtf((float)(ss / (double)Cg) + eps);
            rstd[n * G + gi] = r;
            for (int64_t c = 0; c < Cg; c++)
                out[c0 + c] = w[gi * Cg + c] * (y[c0 + c] * silu_f(z[c0 + c]) * r);
        }
}

/* with h = y silu(z) and o = w h r per group:
 * dh_c = r w_c do_c - (r^3 / Cg) h_c sum_j w_j do_j h_j */
void cpu_gated_rmsnorm_bwd(float *dy, float *dz, float *dw, const float *dout, const float *y,
                           const float *z, const float *w, const float *rstd, int64_t N, int64_t C,
                           int64_t G)
{
    int64_t Cg = C / G;
    double *dwa = dw ? mamba_calloc("cpu_gated_rmsnorm_bwd", (size_t)C, sizeof *dwa) : NULL;
    for (int64_t n = 0; n < N; n++)
        for (int64_t gi = 0; gi < G; gi++) {
            int64_t c0 = n * C + gi * Cg;
            double r = rstd[n * G + gi], dot = 0;
            for (int64_t c = 0; c < Cg; c++) {
                double hv = (double)y[c0 + c] * silu_f(z[c0 + c]);
                dot += (double)w[gi * Cg + c] * dout[c0 + c] * hv;
                if (dwa) dwa[gi * Cg + c] += (double)dout[c0 + c] * hv * r;
            }
            double k = dot * r * r * r / (double)Cg;
            for (int64_t c = 0; c < Cg; c++) {
                double zv = z[c0 + c], sg = 1.0 / (1.0 + exp(-zv)), sl = zv * sg;
                double hv = (double)y[c0 + c] * sl;
                double dh = r * w[gi * Cg + c] * dout[c0 + c] - k * hv;
                if (dy) dy[c0 + c] += (float)(dh * sl);
                if (dz) dz[c0 + c] += (float)(dh * y[c0 + c] * sg * (1.0 + zv * (1.0 - sg)));
            }
        }
    if (dwa) {
        for (int64_t c = 0; c < C; c++) dw[c] += (float)dwa[c];
        free(dwa);
    }
}
