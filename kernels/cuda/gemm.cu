/* A plain tiled product for what cuBLASLt declines (no algorithm for a
 * shape, dtype or alignment): c = alpha op(a) op(b) + beta c (+ bias per
 * column), row-major as kern_matmul, fp32 accumulation, f32 or bf16 in and
 * out. 64 x 64 output tiles, 16 x 16 threads with 4 x 4 outputs each, K in
 * steps of 16 through shared memory. Correct for every shape and
 * alignment; far slower than cuBLASLt, so used only as its fallback. */
#include "kernels/cuda/common.cuh"

enum { GM_T = 64, GM_K = 16 };

/* element (r, k) of op(a) where op(a) is [R, K] */
template <class T>
__device__ __forceinline__ float gm_at(const T *a, bool trans, int64_t R, int64_t K, int64_t r,
                                       int64_t k)
{
    if (r >= R || k >= K) return 0.0f;
    return trans ? cu_ld(a, k * R + r) : cu_ld(a, r * K + k);
}

template <class TA, class TC>
__global__ void __launch_bounds__(256)
    k_gemm(TC *c, const TA *a, const TA *b, const TC *bias, int64_t M, int64_t N, int64_t K,
           bool ta, bool tb, float alpha, float beta)
{
    __shared__ float As[GM_K][GM_T + 1], Bs[GM_K][GM_T + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int64_t m0 = (int64_t)blockIdx.y * GM_T, n0 = (int64_t)blockIdx.x * GM_T;
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < K; k0 += GM_K) {
        for (int idx = threadIdx.x; idx < GM_K * GM_T; idx += 256) {
            int kk = idx / GM_T, rr = idx % GM_T;
            As[kk][rr] = gm_at(a, ta, M, K, m0 + rr, k0 + kk);     /* op(a)[m][k] */
            Bs[kk][rr] = gm_at(b, !tb, N, K, n0 + rr, k0 + kk);    /* op(b)[k][n]: op(b)^T is [N,K] */
        }
        __syncthreads();
        for (int kk = 0; kk < GM_K; kk++)
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] += As[kk][ty * 4 + i] * Bs[kk][tx * 4 + j];
        __syncthreads();
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            int64_t m = m0 + ty * 4 + i, n = n0 + tx * 4 + j;
            if (m >= M || n >= N) continue;
            float x = alpha * acc[i][j];
            if (beta != 0.0f) x += beta * cu_ld(c, m * N + n);
            if (bias) x += cu_ld(bias, n);
            cu_st(c, m * N + n, x);
        }
}

extern "C" cudaError_t cuda_gemm_fallback(cudaStream_t st, const cuda_gemm_t *g)
{
    if (g->M == 0 || g->N == 0) return cudaGetLastError();
    if ((g->M + GM_T - 1) / GM_T > 65535) return cudaErrorInvalidValue;
    dim3 grid((unsigned)((g->N + GM_T - 1) / GM_T), (unsigned)((g->M + GM_T - 1) / GM_T));
    if (g->ab_dt == DT_BF16) {
        if (g->c_dt == DT_BF16)
            k_gemm<cu_bf16_t, cu_bf16_t><<<grid, 256, 0, st>>>(
                (cu_bf16_t *)g->c, (const cu_bf16_t *)g->a, (const cu_bf16_t *)g->b,
                (const cu_bf16_t *)g->bias, g->M, g->N, g->K, g->trans_a, g->trans_b, g->alpha,
                g->beta);
        else
            k_gemm<cu_bf16_t, float><<<grid, 256, 0, st>>>(
                (float *)g->c, (const cu_bf16_t *)g->a, (const cu_bf16_t *)g->b,
                (const float *)g->bias, g->M, g->N, g->K, g->trans_a, g->trans_b, g->alpha,
                g->beta);
    } else {
        k_gemm<float, float><<<grid, 256, 0, st>>>((float *)g->c, (const float *)g->a,
                                                   (const float *)g->b, (const float *)g->bias,
                                                   g->M, g->N, g->K, g->trans_a, g->trans_b,
                                                   g->alpha, g->beta);
    }
    return cudaGetLastError();
}
