/* RMSNorm as kernels/cpu/rmsnorm.c computes it: out = w * (x * rstd),
 * rstd = 1/sqrt(mean(x^2) + eps), fp32 row sums (block tree, fixed order). */
#include "kernels/cuda/common.cuh"

enum { NORM_THREADS = 256 };

template <class T>
__global__ void k_rmsnorm_fwd(T *out, float *rstd, const T *x, const T *w, int64_t N, int64_t C,
                              float eps)
{
    __shared__ float red[32];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const int64_t base = n * C;
        float ss = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float v = cu_ld(x, base + c);
            ss += v * v;
        }
        ss = cu_block_sum(ss, red);
        float r = 1.0f / sqrtf(ss / (float)C + eps);
        if (threadIdx.x == 0) rstd[n] = r;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            cu_st(out, base + c, cu_ld(w, c) * (cu_ld(x, base + c) * r));
    }
}

/* One warp a row, 16-byte vectors (C a multiple of the width, pointers
 * aligned: the launchers check): lanes sum their vectors in order, then the
 * warp's xor tree, so the order is fixed by C alone. Rows are read twice; the
 * second read comes from L1/L2. */
enum { ROW_WARPS = 8 };

template <class T>
__global__ void k_rmsnorm_fwd_v(T *out, float *rstd, const T *x, const T *w, int64_t N, int64_t C,
                                float eps)
{
    constexpr int W = CU_VW(T);
    const int lane = threadIdx.x & 31;
    const int64_t CV = C / W;
    CU_WARP_ROWS(n, N, ROW_WARPS)
    {
        const int64_t base = n * C;
        float ss = 0.0f;
        for (int64_t v = lane; v < CV; v += 32) {
            float a[W];
            cu_ldv(x, base + v * W, a);
#pragma unroll
            for (int k = 0; k < W; k++) ss += a[k] * a[k];
        }
        ss = cu_warp_sum(ss);
        float r = 1.0f / sqrtf(ss / (float)C + eps);
        if (lane == 0) rstd[n] = r;
        for (int64_t v = lane; v < CV; v += 32) {
            float a[W], g[W], y[W];
            cu_ldv(x, base + v * W, a);
            cu_ldv(w, v * W, g);
#pragma unroll
            for (int k = 0; k < W; k++) y[k] = g[k] * (a[k] * r);
            cu_stv(out, base + v * W, y);
        }
    }
}

static unsigned row_blocks(int64_t N) { return cu_blocks(N, ROW_WARPS); }

extern "C" cudaError_t cuda_rmsnorm_fwd(cudaStream_t st, void *out, float *rstd, const void *x,
                                        const void *w, dtype_t dt, int64_t N, int64_t C, float eps)
{
    if (N <= 0) return cudaGetLastError();
    if (cu_rows_vec(dt, C, out, x, w))
        CU_DISPATCH_FT(dt, T,
                       k_rmsnorm_fwd_v<T><<<row_blocks(N), 32 * ROW_WARPS, 0, st>>>(
                           (T *)out, rstd, (const T *)x, (const T *)w, N, C, eps));
    else
        CU_DISPATCH_FT(dt, T,
                       k_rmsnorm_fwd<T><<<cu_blocks(N, 1), NORM_THREADS, 0, st>>>(
                           (T *)out, rstd, (const T *)x, (const T *)w, N, C, eps));
    return cudaGetLastError();
}

/* ---- residual add + RMSNorm in one pass --------------------------------------- */

/* f rounded to T's storage and back: the value a load of a stored f gives */
__device__ __forceinline__ float cu_stored(float f, const float *) { return f; }
__device__ __forceinline__ float cu_stored(float f, const cu_bf16_t *)
{
    return cu_bf16_to_f32(cu_f32_to_bf16(f));
}

/* xout = x + y, then k_rmsnorm_fwd of xout, one block a row: each thread
 * reads back only the elements it stored itself, so no barrier is needed
 * between the two, and the sums are k_rmsnorm_fwd's on the stored values. */
template <class T>
__global__ void k_add_rmsnorm_fwd(T *xout, T *out, float *rstd, const T *x, const T *y,
                                  const T *w, int64_t N, int64_t C, float eps)
{
    __shared__ float red[32];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const int64_t base = n * C;
        float ss = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float v = cu_stored(cu_ld(x, base + c) + cu_ld(y, base + c), xout);
            cu_st(xout, base + c, v);
            ss += v * v;
        }
        ss = cu_block_sum(ss, red);
        float r = 1.0f / sqrtf(ss / (float)C + eps);
        if (threadIdx.x == 0) rstd[n] = r;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            cu_st(out, base + c, cu_ld(w, c) * (cu_ld(xout, base + c) * r));
    }
}

/* One warp a row as k_rmsnorm_fwd_v (the same per-lane order, so the same
 * bits): the first KEEP vectors of each lane stay in registers for the
 * second pass, later ones are read back from xout (the lane's own stores).
 * xy_vec: x and y are 16-byte aligned too; otherwise they are read element
 * by element, so the choice of the norm's path (and its bits) depends on
 * xout, out and w alone, as kern_rmsnorm_fwd's does on its out, x and w. */
template <class T, int KEEP>
__global__ void k_add_rmsnorm_fwd_v(T *xout, T *out, float *rstd, const T *x, const T *y,
                                    const T *w, int64_t N, int64_t C, float eps, bool xy_vec)
{
    constexpr int W = CU_VW(T);
    const int lane = threadIdx.x & 31;
    const int64_t CV = C / W;
    CU_WARP_ROWS(n, N, ROW_WARPS)
    {
        const int64_t base = n * C;
        float keep[KEEP][W];
        float ss = 0.0f;
        auto sum_vec = [&](int64_t v, float *a) {
            float b[W];
            if (xy_vec) {
                cu_ldv(x, base + v * W, a);
                cu_ldv(y, base + v * W, b);
            } else {
#pragma unroll
                for (int k = 0; k < W; k++)
                    a[k] = cu_ld(x, base + v * W + k), b[k] = cu_ld(y, base + v * W + k);
            }
#pragma unroll
            for (int k = 0; k < W; k++) a[k] = cu_stored(a[k] + b[k], xout);
            cu_stv(xout, base + v * W, a);
#pragma unroll
            for (int k = 0; k < W; k++) ss += a[k] * a[k];
        };
#pragma unroll
        for (int i = 0; i < KEEP; i++) {
            int64_t v = lane + 32 * i;
            if (v < CV) sum_vec(v, keep[i]);
        }
        for (int64_t v = lane + 32 * KEEP; v < CV; v += 32) {
            float a[W];
            sum_vec(v, a);
        }
        ss = cu_warp_sum(ss);
        float r = 1.0f / sqrtf(ss / (float)C + eps);
        if (lane == 0) rstd[n] = r;
#pragma unroll
        for (int i = 0; i < KEEP; i++) {
            int64_t v = lane + 32 * i;
            if (v < CV) {
                float g[W], o[W];
                cu_ldv(w, v * W, g);
#pragma unroll
                for (int k = 0; k < W; k++) o[k] = g[k] * (keep[i][k] * r);
                cu_stv(out, base + v * W, o);
            }
        }
        for (int64_t v = lane + 32 * KEEP; v < CV; v += 32) {
            float a[W], g[W], o[W];
            cu_ldv(xout, base + v * W, a);
            cu_ldv(w, v * W, g);
#pragma unroll
            for (int k = 0; k < W; k++) o[k] = g[k] * (a[k] * r);
            cu_stv(out, base + v * W, o);
        }
    }
}

extern "C" cudaError_t cuda_add_rmsnorm_fwd(cudaStream_t st, void *xout, void *out, float *rstd,
                                            const void *x, const void *y, const void *w,
                                            dtype_t dt, int64_t N, int64_t C, float eps)
{
    if (N <= 0) return cudaGetLastError();
    if (cu_rows_vec(dt, C, out, xout, w)) {
        bool xy_vec = cu_aligned16(x, y);
        int64_t per_lane = (C / cu_vw_of(dt) + 31) / 32;
        if (per_lane <= 4)
            CU_DISPATCH_FT(dt, T,
                           k_add_rmsnorm_fwd_v<T, 4><<<row_blocks(N), 32 * ROW_WARPS, 0, st>>>(
                               (T *)xout, (T *)out, rstd, (const T *)x, (const T *)y,
                               (const T *)w, N, C, eps, xy_vec));
        else
            CU_DISPATCH_FT(dt, T,
                           k_add_rmsnorm_fwd_v<T, 8><<<row_blocks(N), 32 * ROW_WARPS, 0, st>>>(
                               (T *)xout, (T *)out, rstd, (const T *)x, (const T *)y,
                               (const T *)w, N, C, eps, xy_vec));
    } else {
        CU_DISPATCH_FT(dt, T,
                       k_add_rmsnorm_fwd<T><<<cu_blocks(N, 1), NORM_THREADS, 0, st>>>(
                           (T *)xout, (T *)out, rstd, (const T *)x, (const T *)y, (const T *)w,
                           N, C, eps));
    }
    return cudaGetLastError();
}

/* dx_c += r w_c g_c - (r^3 / C) x_c sum_j(w_j g_j x_j) */
template <class T>
__global__ void k_rmsnorm_bwd_dx(T *dx, const T *dout, const T *x, const T *w, const float *rstd,
                                 int64_t N, int64_t C)
{
    __shared__ float red[32];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const int64_t base = n * C;
        float r = rstd[n], dot = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            dot += cu_ld(w, c) * cu_ld(dout, base + c) * cu_ld(x, base + c);
        dot = cu_block_sum(dot, red);
        float k = dot * r * r * r / (float)C;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            cu_st(dx, base + c,
                  cu_ld(dx, base + c) + (r * cu_ld(w, c) * cu_ld(dout, base + c) -
                                         k * cu_ld(x, base + c)));
    }
}

template <class T>
__global__ void k_rmsnorm_bwd_dx_v(T *dx, const T *dout, const T *x, const T *w,
                                   const float *rstd, int64_t N, int64_t C)
{
    constexpr int W = CU_VW(T);
    const int lane = threadIdx.x & 31;
    const int64_t CV = C / W;
    CU_WARP_ROWS(n, N, ROW_WARPS)
    {
        const int64_t base = n * C;
        float r = rstd[n], dot = 0.0f;
        for (int64_t v = lane; v < CV; v += 32) {
            float g[W], d[W], a[W];
            cu_ldv(w, v * W, g);
            cu_ldv(dout, base + v * W, d);
            cu_ldv(x, base + v * W, a);
#pragma unroll
            for (int k = 0; k < W; k++) dot += g[k] * d[k] * a[k];
        }
        dot = cu_warp_sum(dot);
        float kk = dot * r * r * r / (float)C;
        for (int64_t v = lane; v < CV; v += 32) {
            float g[W], d[W], a[W], o[W];
            cu_ldv(w, v * W, g);
            cu_ldv(dout, base + v * W, d);
            cu_ldv(x, base + v * W, a);
            cu_ldv(dx, base + v * W, o);
#pragma unroll
            for (int k = 0; k < W; k++) o[k] = o[k] + (r * g[k] * d[k] - kk * a[k]);
            cu_stv(dx, base + v * W, o);
        }
    }
}

/* dw partial sums with CU_VW(T) columns a thread: the layout of
 * cu_colsum_partial (a 32 x 8 block, row group g = blockIdx.y, lanes added
 * in order) on vectors, so the order is fixed by N and C alone */
template <class T>
__global__ void k_rms_dw_partial_v(float *partial, const T *dout, const T *x, const float *rstd,
                                   int64_t N, int64_t C, int G)
{
    constexpr int W = CU_VW(T);
    __shared__ float red[8][32 * W + 1];
    int64_t c = ((int64_t)blockIdx.x * 32 + threadIdx.x) * W;
    float acc[W];
#pragma unroll
    for (int k = 0; k < W; k++) acc[k] = 0.0f;
    if (c < C)
        for (int64_t n = (int64_t)blockIdx.y * 8 + threadIdx.y; n < N; n += 8 * (int64_t)G) {
            float d[W], a[W], r = rstd[n];
            cu_ldv(dout, n * C + c, d);
            cu_ldv(x, n * C + c, a);
#pragma unroll
            for (int k = 0; k < W; k++) acc[k] += d[k] * a[k] * r;
        }
#pragma unroll
    for (int k = 0; k < W; k++) red[threadIdx.y][threadIdx.x * W + k] = acc[k];
    __syncthreads();
    if (threadIdx.y == 0 && c < C)
#pragma unroll
        for (int k = 0; k < W; k++) {
            float s = 0.0f;
            for (int i = 0; i < 8; i++) s += red[i][threadIdx.x * W + k];
            partial[(int64_t)blockIdx.y * C + c + k] = s;
        }
}

/* dw_c += sum_n g_nc x_nc r_n */
template <class T> struct rms_dw_f {
    const T *dout, *x;
    const float *rstd;
    int64_t C;
    __device__ float operator()(int64_t n, int64_t c) const
    {
        return cu_ld(dout, n * C + c) * cu_ld(x, n * C + c) * rstd[n];
    }
};

extern "C" size_t cuda_rmsnorm_bwd_scratch(int64_t N, int64_t C) { return cu_colsum_bytes(N, C); }

extern "C" cudaError_t cuda_rmsnorm_bwd(cudaStream_t st, void *dx, void *dw, dtype_t dw_dt,
                                        const void *dout, const void *x, const void *w,
                                        const float *rstd, dtype_t dt, int64_t N, int64_t C,
                                        void *scratch)
{
    if (N <= 0) return cudaGetLastError();
    cudaError_t e = cudaSuccess;
    bool vec = cu_rows_vec(dt, C, dout, x, w, dx);
    if (dx && vec)
        CU_DISPATCH_FT(dt, T,
                       k_rmsnorm_bwd_dx_v<T><<<row_blocks(N), 32 * ROW_WARPS, 0, st>>>(
                           (T *)dx, (const T *)dout, (const T *)x, (const T *)w, rstd, N, C));
    else if (dx)
        CU_DISPATCH_FT(dt, T,
                       k_rmsnorm_bwd_dx<T><<<cu_blocks(N, 1), NORM_THREADS, 0, st>>>(
                           (T *)dx, (const T *)dout, (const T *)x, (const T *)w, rstd, N, C));
    if (dw && vec && C > 0) {
        int G = cu_colsum_groups(N), cols = 32 * cu_vw_of(dt);
        float *partial = (float *)scratch;
        dim3 grid((unsigned)((C + cols - 1) / cols), (unsigned)G), block(32, 8);
        CU_DISPATCH_FT(dt, T,
                       k_rms_dw_partial_v<T><<<grid, block, 0, st>>>(
                           partial, (const T *)dout, (const T *)x, rstd, N, C, G));
        cu_colsum_finish_run(st, dw, dw_dt, partial, C, G);
    } else if (dw) {
        CU_DISPATCH_FT(dt, T,
                       e = cu_colsum_run(st, dw, dw_dt,
                                         rms_dw_f<T>{(const T *)dout, (const T *)x, rstd, C}, N,
                                         C, scratch));
    }
    return e != cudaSuccess ? e : cudaGetLastError();
}
