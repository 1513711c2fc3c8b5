/* Fused softmax cross-entropy, whole-vocabulary and vocabulary-parallel, in
 * fp32 over f32 or bf16 logits, one block per row. The row is read twice
 * (an online max-and-sum pass, then the gradient pass); no fp32 copy of the
 * logits is ever made. Formulas and order of operations follow
 * kernels/cpu/xent.c: loss = log(sumexp) + max - x[target], dlogits =
 * exp(x - max) * (dloss / sumexp) - dloss at the target. */
#include "kernels/cuda/common.cuh"

static int xent_threads(int64_t V) { return V >= 8192 ? 1024 : V >= 1024 ? 256 : 64; }

/* f(j, x[j]) for the row's columns of this thread: with `vec` (V a multiple
 * of the width, the row 16-byte aligned) CU_VW(T) consecutive columns from
 * one load, else one column at a time. The order a thread sees its columns
 * in is fixed by V and the block size. */
template <class T, class F> __device__ __forceinline__ void row_each(const T *x, int64_t V, bool vec, F f)
{
    constexpr int W = CU_VW(T);
    if (vec) {
        for (int64_t v = threadIdx.x; v < V / W; v += blockDim.x) {
            float a[W];
            cu_ldv(x, v * W, a);
#pragma unroll
            for (int k = 0; k < W; k++) f(v * W + k, a[k]);
        }
    } else {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) f(j, cu_ld(x, j));
    }
}

/* d[j] = f(j, x[j]) (x may be NULL: f(j, 0)), vectorised as row_each */
template <class T, class F>
__device__ __forceinline__ void row_write(T *d, const T *x, int64_t V, bool vec, F f)
{
    constexpr int W = CU_VW(T);
    if (vec) {
        for (int64_t v = threadIdx.x; v < V / W; v += blockDim.x) {
            float a[W], y[W];
            if (x) cu_ldv(x, v * W, a);
#pragma unroll
            for (int k = 0; k < W; k++) y[k] = f(v * W + k, x ? a[k] : 0.0f);
            cu_stv(d, v * W, y);
        }
    } else {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) cu_st(d, j, f(j, x ? cu_ld(x, j) : 0.0f));
    }
}

/* running (max, sum exp(x - max)) of one thread, merged over the block */
struct ms_t {
    float m, s;
};

__device__ __forceinline__ ms_t ms_merge(ms_t a, ms_t b)
{
    float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return ms_t{m, 0.0f};
    return ms_t{m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

template <class T>
__device__ ms_t row_max_sumexp(const T *x, int64_t V, bool vec, float *red_m, float *red_s)
{
    ms_t a{-INFINITY, 0.0f};
    row_each(x, V, vec, [&](int64_t, float v) {
        if (v == -INFINITY) return; /* exp(-inf) adds nothing */
        if (v > a.m) {
            a.s = a.s * expf(a.m - v) + 1.0f;
            a.m = v;
        } else {
            a.s += expf(v - a.m); /* NaN propagates through here */
        }
    });
    for (int o = 16; o > 0; o >>= 1) {
        ms_t b{__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o)};
        a = ms_merge(a, b);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) red_m[warp] = a.m, red_s[warp] = a.s;
    __syncthreads();
    a = lane < nw ? ms_t{red_m[lane], red_s[lane]} : ms_t{-INFINITY, 0.0f};
    for (int o = 16; o > 0; o >>= 1) {
        ms_t b{__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o)};
        a = ms_merge(a, b);
    }
    return a;
}

/* d[j] = exp(x[j] - max) * (dloss / sumexp), minus dloss at column tcol */
template <class T>
__device__ void row_dlogits(T *d, const T *x, int64_t V, bool vec, float max, float sumexp,
                            int64_t tcol, float dloss)
{
    float k = dloss / sumexp;
    row_write(d, x, V, vec, [&](int64_t j, float v) {
        float g = expf(v - max) * k;
        return j == tcol ? g - dloss : g;
    });
}

template <class T> __device__ void row_fill(T *d, int64_t V, bool vec, float v)
{
    row_write(d, (const T *)nullptr, V, vec, [&](int64_t, float) { return v; });
}

template <class T>
__global__ void k_xent_fwd_bwd(float *losses, T *dlogits, const T *logits, const int32_t *targets,
                               int64_t N, int64_t V, float dloss, int32_t ignore_index,
                               bool vec, unsigned *flags)
{
    __shared__ float red_m[32], red_s[32];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const T *x = logits + n * V;
        T *d = dlogits ? dlogits + n * V : nullptr;
        int32_t t = targets[n];
        if (t == ignore_index) {
            if (threadIdx.x == 0) losses[n] = 0.0f;
            if (d) row_fill(d, V, vec, 0.0f);
            continue;
        }
        if (t < 0 || t >= V) {
            if (threadIdx.x == 0) {
                *(volatile unsigned *)&flags[CUDA_FLAG_XENT_TARGET] = 1u;
                losses[n] = NAN;
            }
            if (d) row_fill(d, V, vec, NAN);
            continue;
        }
        ms_t a = row_max_sumexp(x, V, vec, red_m, red_s);
        if (threadIdx.x == 0) losses[n] = logf(a.s) + a.m - cu_ld(x, t);
        if (d) row_dlogits(d, x, V, vec, a.m, a.s, t, dloss);
    }
}

template <class T>
__global__ void k_xent_vp_max(float *row_max, const T *logits, int64_t N, int64_t V, bool vec)
{
    __shared__ float red[32];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const T *x = logits + n * V;
        float m = -INFINITY;
        row_each(x, V, vec, [&](int64_t, float v) { m = fmaxf(m, v); });
        m = cu_block_max(m, red);
        if (threadIdx.x == 0) row_max[n] = m;
    }
}

template <class T>
__global__ void k_xent_vp_sum(float *sumexp, float *tgt_logit, const T *logits, const float *gmax,
                              const int32_t *targets, int64_t N, int64_t V, int64_t vocab_start,
                              int32_t ignore_index, bool vec)
{
    __shared__ float red[32];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const T *x = logits + n * V;
        float m = gmax[n], s = 0.0f;
        row_each(x, V, vec, [&](int64_t, float v) { s += expf(v - m); });
        s = cu_block_sum(s, red);
        if (threadIdx.x == 0) {
            sumexp[n] = s;
            int64_t tcol = (int64_t)targets[n] - vocab_start;
            bool mine = targets[n] != ignore_index && tcol >= 0 && tcol < V;
            tgt_logit[n] = mine ? cu_ld(x, tcol) : 0.0f;
        }
    }
}

template <class T>
__global__ void k_xent_vp_finish(float *losses, T *dlogits, const T *logits, const float *gmax,
                                 const float *sumexp, const float *tgt_logit,
                                 const int32_t *targets, int64_t N, int64_t V, int64_t vocab_start,
                                 float dloss, int32_t ignore_index, bool vec, unsigned *flags)
{
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        T *d = dlogits ? dlogits + n * V : nullptr;
        int32_t t = targets[n];
        if (t == ignore_index) {
            if (losses && threadIdx.x == 0) losses[n] = 0.0f;
            if (d) row_fill(d, V, vec, 0.0f);
            continue;
        }
        if (t < 0) {
            if (threadIdx.x == 0) {
                *(volatile unsigned *)&flags[CUDA_FLAG_VP_TARGET] = 1u;
                if (losses) losses[n] = NAN;
            }
            if (d) row_fill(d, V, vec, NAN);
            continue;
        }
        if (losses && threadIdx.x == 0) losses[n] = logf(sumexp[n]) + gmax[n] - tgt_logit[n];
        if (d)
            row_dlogits(d, logits + n * V, V, vec, gmax[n], sumexp[n], (int64_t)t - vocab_start,
                        dloss);
    }
}

extern "C" cudaError_t cuda_xent_fwd_bwd(cudaStream_t st, float *losses, void *dlogits,
                                         const void *logits, dtype_t dt, const int32_t *targets,
                                         int64_t N, int64_t V, float dloss, int32_t ignore_index,
                                         unsigned *flags)
{
    if (N > 0)
        CU_DISPATCH_FT(dt, T,
                       k_xent_fwd_bwd<T><<<cu_blocks(N, 1), xent_threads(V), 0, st>>>(
                           losses, (T *)dlogits, (const T *)logits, targets, N, V, dloss,
                           ignore_index, cu_rows_vec(dt, V, logits, dlogits), flags));
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_xent_vp_max(cudaStream_t st, float *row_max, const void *logits,
                                        dtype_t dt, int64_t N, int64_t V)
{
    if (N > 0)
        CU_DISPATCH_FT(dt, T,
                       k_xent_vp_max<T><<<cu_blocks(N, 1), xent_threads(V), 0, st>>>(
                           row_max, (const T *)logits, N, V, cu_rows_vec(dt, V, logits)));
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_xent_vp_sum(cudaStream_t st, float *sumexp, float *tgt_logit,
                                        const void *logits, dtype_t dt, const float *gmax,
                                        const int32_t *targets, int64_t N, int64_t V,
                                        int64_t vocab_start, int32_t ignore_index)
{
    if (N > 0)
        CU_DISPATCH_FT(dt, T,
                       k_xent_vp_sum<T><<<cu_blocks(N, 1), xent_threads(V), 0, st>>>(
                           sumexp, tgt_logit, (const T *)logits, gmax, targets, N, V,
                           vocab_start, ignore_index, cu_rows_vec(dt, V, logits)));
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_xent_vp_finish(cudaStream_t st, float *losses, void *dlogits,
                                           const void *logits, dtype_t dt, const float *gmax,
                                           const float *sumexp, const float *tgt_logit,
                                           const int32_t *targets, int64_t N, int64_t V,
                                           int64_t vocab_start, float dloss,
                                           int32_t ignore_index, unsigned *flags)
{
    if (N > 0)
        CU_DISPATCH_FT(dt, T,
                       k_xent_vp_finish<T><<<cu_blocks(N, 1), xent_threads(V), 0, st>>>(
                           losses, (T *)dlogits, (const T *)logits, gmax, sumexp, tgt_logit,
                           targets, N, V, vocab_start, dloss, ignore_index,
                           cu_rows_vec(dt, V, logits, dlogits), flags));
    return cudaGetLastError();
}
