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

extern "C" cudaError_t cuda_rmsnorm_fwd(cudaStream_t st, void *out, float *rstd, const void *x,
                                        const void *w, dtype_t dt, int64_t N, int64_t C, float eps)
{
    if (N > 0)
        CU_DISPATCH_FT(dt, T,
                       k_rmsnorm_fwd<T><<<cu_blocks(N, 1), NORM_THREADS, 0, st>>>(
                           (T *)out, rstd, (const T *)x, (const T *)w, N, C, eps));
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
    if (dx)
        CU_DISPATCH_FT(dt, T,
                       k_rmsnorm_bwd_dx<T><<<cu_blocks(N, 1), NORM_THREADS, 0, st>>>(
                           (T *)dx, (const T *)dout, (const T *)x, (const T *)w, rstd, N, C));
    if (dw)
        CU_DISPATCH_FT(dt, T,
                       e = cu_colsum_run(st, dw, dw_dt,
                                         rms_dw_f<T>{(const T *)dout, (const T *)x, rstd, C}, N,
                                         C, scratch));
    return e != cudaSuccess ? e : cudaGetLastError();
}
