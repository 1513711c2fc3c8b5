/* The Mamba2 mixer's sequence ops on CUDA (kernels/kernels.h, "Mamba2
 * mixer"): one thread per unit of kernels/mamba_seq.h, the units the CPU
 * twins run (kernels/cpu/mamba.c), so both compute one algorithm in the same
 * order. f32 data: bf16 operands reach them as f32 copies staged by the
 * launchers (backend.c, mb_stage). Written to be simple and correct, not
 * fast: the scan's forward is a thread per (batch row, head) and its
 * backward a thread per (batch row, group), each walking its chunks with its
 * own scratch in device memory; no atomics, so results repeat bit for bit.
 * The f32 path ran on an H200 on 3 Dec (bench/RESULTS.md); the bf16 staging
 * has not yet (docs/KERNELS.md). */
#include "kernels/cuda/common.cuh"
#include "kernels/mamba_seq.h"

#define MB_LOOP(i, n)                                                                              \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

/* ---- causal conv1d ------------------------------------------------------------- */

__global__ void k_conv_fwd(mb_conv_t a)
{
    MB_LOOP(i, a.B * a.C) mb_conv_fwd_one(&a, i / a.C, i % a.C);
}

__global__ void k_conv_bwd(mb_conv_t a, double *scratch)
{
    MB_LOOP(c, a.C) mb_conv_bwd_one(&a, c, scratch + c * (a.T + a.K));
}

extern "C" size_t cuda_conv1d_bwd_scratch(const mb_conv_t *a)
{
    return (size_t)(a->C * (a->T + a->K)) * sizeof(double);
}

extern "C" cudaError_t cuda_conv1d_causal_fwd(cudaStream_t st, const mb_conv_t *a)
{
    if (a->B * a->C > 0 && a->T > 0) k_conv_fwd<<<cu_blocks(a->B * a->C, 128), 128, 0, st>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_conv1d_causal_bwd(cudaStream_t st, const mb_conv_t *a, void *scratch)
{
    if (a->C > 0 && a->T > 0)
        k_conv_bwd<<<cu_blocks(a->C, 128), 128, 0, st>>>(*a, (double *)scratch);
    return cudaGetLastError();
}

/* ---- dt -------------------------------------------------------------------------- */

__global__ void k_dt_fwd(float *dt, const float *raw, const float *bias, int64_t N, int64_t H,
                         float lo, float hi)
{
    MB_LOOP(i, N * H) dt[i] = mb_dt_fwd_one(raw[i], bias[i % H], lo, hi);
}

__global__ void k_dt_draw(float *draw, const float *ddt, const float *raw, const float *bias,
                          int64_t N, int64_t H, float lo, float hi)
{
    MB_LOOP(i, N * H) draw[i] += mb_dt_bwd_one(ddt[i], raw[i], bias[i % H], lo, hi);
}

__global__ void k_dt_dbias(float *dbias, const float *ddt, const float *raw, const float *bias,
                           int64_t N, int64_t H, float lo, float hi)
{
    MB_LOOP(h, H)
    {
        double s = 0;
        for (int64_t n = 0; n < N; n++)
            s += mb_dt_bwd_one(ddt[n * H + h], raw[n * H + h], bias[h], lo, hi);
        dbias[h] += (float)s;
    }
}

extern "C" cudaError_t cuda_ssm_dt_fwd(cudaStream_t st, float *dt, const float *raw,
                                       const float *bias, int64_t N, int64_t H, float lo, float hi)
{
    if (N * H > 0) k_dt_fwd<<<cu_blocks(N * H, 256), 256, 0, st>>>(dt, raw, bias, N, H, lo, hi);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_ssm_dt_bwd(cudaStream_t st, float *draw, float *dbias, const float *ddt,
                                       const float *raw, const float *bias, int64_t N, int64_t H,
                                       float lo, float hi)
{
    if (draw && N * H > 0)
        k_dt_draw<<<cu_blocks(N * H, 256), 256, 0, st>>>(draw, ddt, raw, bias, N, H, lo, hi);
    if (dbias && H > 0)
        k_dt_dbias<<<cu_blocks(H, 128), 128, 0, st>>>(dbias, ddt, raw, bias, N, H, lo, hi);
    return cudaGetLastError();
}

/* ---- the chunked SSD scan ------------------------------------------------------------ */

__global__ void k_ssd_fwd(mb_ssd_t a, double *scratch)
{
    int64_t per = mb_ssd_fwd_scratch(&a);
    MB_LOOP(i, a.B * a.H) mb_ssd_fwd_one(&a, i / a.H, i % a.H, scratch + i * per);
}

__global__ void k_ssd_bwd(mb_ssd_t a, double *scratch)
{
    int64_t per = mb_ssd_bwd_scratch(&a);
    MB_LOOP(i, a.B * a.G) mb_ssd_bwd_one(&a, i / a.G, i % a.G, scratch + i * per);
}

/* the per-row A_log and D gradients summed in row order */
__global__ void k_ssd_params(float *dA_log, float *dD, const double *dA_part,
                             const double *dD_part, int64_t B, int64_t H)
{
    MB_LOOP(h, H)
    {
        double sa = 0, sd = 0;
        for (int64_t b = 0; b < B; b++) {
            sa += dA_part[b * H + h];
            sd += dD_part[b * H + h];
        }
        if (dA_log) dA_log[h] += (float)sa;
        if (dD) dD[h] += (float)sd;
    }
}

extern "C" size_t cuda_ssd_fwd_scratch(const mb_ssd_t *a)
{
    return (size_t)(a->B * a->H * mb_ssd_fwd_scratch(a)) * sizeof(double);
}

extern "C" size_t cuda_ssd_bwd_scratch(const mb_ssd_t *a)
{
    return (size_t)(a->B * a->G * mb_ssd_bwd_scratch(a) + 2 * a->B * a->H) * sizeof(double);
}

extern "C" cudaError_t cuda_ssd_scan_fwd(cudaStream_t st, const mb_ssd_t *a, void *scratch)
{
    if (a->B * a->H > 0 && a->T > 0)
        k_ssd_fwd<<<cu_blocks(a->B * a->H, 64), 64, 0, st>>>(*a, (double *)scratch);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_ssd_scan_bwd(cudaStream_t st, const mb_ssd_t *a, float *dA_log,
                                         float *dD, void *scratch)
{
    if (a->B * a->G == 0 || a->T == 0) return cudaGetLastError();
    mb_ssd_t b = *a;
    double *s = (double *)scratch;
    b.dA_part = s;
    b.dD_part = s + a->B * a->H;
    k_ssd_bwd<<<cu_blocks(a->B * a->G, 64), 64, 0, st>>>(b, s + 2 * a->B * a->H);
    k_ssd_params<<<cu_blocks(a->H, 128), 128, 0, st>>>(dA_log, dD, b.dA_part, b.dD_part, a->B,
                                                      a->H);
    return cudaGetLastError();
}

/* ---- gated grouped RMSNorm ------------------------------------------------------------ */

__global__ void k_gnorm_fwd(mb_gnorm_t a) { MB_LOOP(n, a.N) mb_gnorm_fwd_row(&a, n); }
__global__ void k_gnorm_bwd(mb_gnorm_t a) { MB_LOOP(n, a.N) mb_gnorm_bwd_row(&a, n); }
__global__ void k_gnorm_dw(mb_gnorm_t a) { MB_LOOP(c, a.C) mb_gnorm_dw_col(&a, c); }

extern "C" cudaError_t cuda_gated_rmsnorm_fwd(cudaStream_t st, const mb_gnorm_t *a)
{
    if (a->N > 0) k_gnorm_fwd<<<cu_blocks(a->N, 128), 128, 0, st>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_gated_rmsnorm_bwd(cudaStream_t st, const mb_gnorm_t *a)
{
    if (a->N > 0 && (a->dy || a->dz)) k_gnorm_bwd<<<cu_blocks(a->N, 128), 128, 0, st>>>(*a);
    if (a->N > 0 && a->dw) k_gnorm_dw<<<cu_blocks(a->C, 128), 128, 0, st>>>(*a);
    return cudaGetLastError();
}
