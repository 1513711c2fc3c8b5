/* The Mamba2 mixer's sequence ops on the CPU (kernels.h, "Mamba2 mixer"),
 * as HF's NemotronHMamba2Mixer torch path computes them in fp32. The units
 * of work are kernels/mamba_seq.h's (the CUDA twins run the same ones); here
 * each pool task runs units fixed by the shape alone (a block of channels of
 * the conv, one (batch row, head) of the scan's forward, one (batch row,
 * group) of its backward), so the bits never depend on the thread count.
 * The per-head A_log and D gradients are summed over batch rows after the
 * run, in row order. */
#include "kernels/cpu/cpu.h"

#include "base/log.h"
#include "kernels/mamba_seq.h"

#include <stdlib.h>

#define CONV_BLOCK 64 /* channels per conv task */

static double *scratch_alloc(const char *op, int64_t n)
{
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    if (!p) BT_PANIC("%s: out of memory for %lld scratch values", op, (long long)n);
    return p;
}

/* ---- causal depthwise conv1d ------------------------------------------------ */

static void conv_fwd_task(void *arg, int64_t task)
{
    const mb_conv_t *a = arg;
    int64_t c0 = task * CONV_BLOCK, c1 = c0 + CONV_BLOCK < a->C ? c0 + CONV_BLOCK : a->C;
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t c = c0; c < c1; c++) mb_conv_fwd_one(a, b, c);
}

void cpu_conv1d_causal_fwd(float *out, float *state, const float *x, const float *w,
                           const float *bias, int64_t B, int64_t T, int64_t C, int64_t K,
                           kern_act_t act)
{
    mb_conv_t a = {.out = out, .state = state, .x = x, .w = w, .bias = bias,
                   .B = B, .T = T, .C = C, .K = K, .act = act};
    cpu_pool_run((C + CONV_BLOCK - 1) / CONV_BLOCK, conv_fwd_task, &a);
}

static void conv_bwd_task(void *arg, int64_t task)
{
    const mb_conv_t *a = arg;
    int64_t c0 = task * CONV_BLOCK, c1 = c0 + CONV_BLOCK < a->C ? c0 + CONV_BLOCK : a->C;
    double *scr = scratch_alloc("cpu_conv1d_causal_bwd", a->T + a->K);
    for (int64_t c = c0; c < c1; c++) mb_conv_bwd_one(a, c, scr);
    free(scr);
}

void cpu_conv1d_causal_bwd(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                           const float *w, const float *bias, int64_t B, int64_t T, int64_t C,
                           int64_t K, kern_act_t act)
{
    mb_conv_t a = {.dx = dx, .dw = dw, .dbias = dbias, .dout = dout, .x = x, .w = w,
                   .bias = bias, .B = B, .T = T, .C = C, .K = K, .act = act};
    cpu_pool_run((C + CONV_BLOCK - 1) / CONV_BLOCK, conv_bwd_task, &a);
}

/* ---- dt: bias, softplus, limits ---------------------------------------------- */

void cpu_ssm_dt_fwd(float *dt, const float *raw, const float *bias, int64_t N, int64_t H, float lo,
                    float hi)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t h = 0; h < H; h++)
            dt[n * H + h] = mb_dt_fwd_one(raw[n * H + h], bias[h], lo, hi);
}

void cpu_ssm_dt_bwd(float *draw, float *dbias, const float *ddt, const float *raw,
                    const float *bias, int64_t N, int64_t H, float lo, float hi)
{
    if (draw)
        for (int64_t n = 0; n < N; n++)
            for (int64_t h = 0; h < H; h++)
                draw[n * H + h] += mb_dt_bwd_one(ddt[n * H + h], raw[n * H + h], bias[h], lo, hi);
    if (dbias)
        for (int64_t h = 0; h < H; h++) {
            double s = 0;
            for (int64_t n = 0; n < N; n++)
                s += mb_dt_bwd_one(ddt[n * H + h], raw[n * H + h], bias[h], lo, hi);
            dbias[h] += (float)s;
        }
}

/* ---- the chunked SSD scan ------------------------------------------------------ */

static mb_ssd_t ssd_args(const cpu_ssd_shape_t *sh)
{
    return (mb_ssd_t){.B = sh->B, .T = sh->T, .H = sh->H, .P = sh->P, .G = sh->G, .N = sh->N,
                      .chunk = sh->chunk};
}

static void ssd_fwd_task(void *arg, int64_t task)
{
    const mb_ssd_t *a = arg;
    double *scr = scratch_alloc("cpu_ssd_scan_fwd", mb_ssd_fwd_scratch(a));
    mb_ssd_fwd_one(a, task / a->H, task % a->H, scr);
    free(scr);
}

void cpu_ssd_scan_fwd(float *y, float *chunk_states, float *state, const float *x, const float *dt,
                      const float *A_log, const float *Bm, const float *Cm, const float *D,
                      const cpu_ssd_shape_t *sh)
{
    if (sh->T == 0) return;
    mb_ssd_t a = ssd_args(sh);
    a.y = y, a.chunk_states = chunk_states, a.state = state;
    a.x = x, a.dt = dt, a.A_log = A_log, a.Bm = Bm, a.Cm = Cm, a.D = D;
    cpu_pool_run(sh->B * sh->H, ssd_fwd_task, &a);
}

static void ssd_bwd_task(void *arg, int64_t task)
{
    const mb_ssd_t *a = arg;
    double *scr = scratch_alloc("cpu_ssd_scan_bwd", mb_ssd_bwd_scratch(a));
    mb_ssd_bwd_one(a, task / a->G, task % a->G, scr);
    free(scr);
}

void cpu_ssd_scan_bwd(float *dx, float *ddt, float *dA_log, float *dB, float *dC, float *dD,
                      const float *dy, const float *x, const float *dt, const float *A_log,
                      const float *Bm, const float *Cm, const float *D, const float *chunk_states,
                      const cpu_ssd_shape_t *sh)
{
    if (sh->T == 0) return;
    mb_ssd_t a = ssd_args(sh);
    a.dx = dx, a.ddt = ddt, a.dB = dB, a.dC = dC;
    a.dy = dy, a.x = x, a.dt = dt, a.A_log = A_log, a.Bm = Bm, a.Cm = Cm, a.D = D;
    a.cstates = chunk_states;
    a.dA_part = scratch_alloc("cpu_ssd_scan_bwd", sh->B * sh->H);
    a.dD_part = scratch_alloc("cpu_ssd_scan_bwd", sh->B * sh->H);
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

void cpu_gated_rmsnorm_fwd(float *out, float *rstd, const float *y, const float *z, const float *w,
                           int64_t N, int64_t C, int64_t G, float eps)
{
    mb_gnorm_t a = {.out = out, .rstd = rstd, .y = y, .z = z, .w = w, .N = N, .C = C, .G = G,
                    .eps = eps};
    for (int64_t n = 0; n < N; n++) mb_gnorm_fwd_row(&a, n);
}

void cpu_gated_rmsnorm_bwd(float *dy, float *dz, float *dw, const float *dout, const float *y,
                           const float *z, const float *w, const float *rstd, int64_t N, int64_t C,
                           int64_t G)
{
    mb_gnorm_t a = {.dy = dy, .dz = dz, .dw = dw, .dout = dout, .y = y, .z = z, .w = w,
                    .rs = rstd, .N = N, .C = C, .G = G};
    if (dy || dz)
        for (int64_t n = 0; n < N; n++) mb_gnorm_bwd_row(&a, n);
    if (dw)
        for (int64_t c = 0; c < C; c++) mb_gnorm_dw_col(&a, c);
}
