/* Routed experts on CUDA: routing, dispatch, combine and the shared
 * expert's sigmoid gate (kernels/kernels.h),
 * the CPU twins' semantics (kernels/cpu/moe.c). Written to be simple and
 * deterministic, not fast: one thread per row for routing, one thread per
 * expert walking every choice in row order for the dispatch's counts and
 * slots (so a slot is the same as on the CPU), one thread per element for
 * the copies and sums; no atomics. Not yet run on a device (docs/KERNELS.md).
 * The experts' products are cuBLASLt calls per group (backend.c). */
#include "kernels/cuda/common.cuh"

#define GS_LOOP(i, n)                                                                              \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

/* ---- routing ----------------------------------------------------------------- */

/* One row's top-K by selection on p[e] (+ bias[e] when bias, the sum
 * rounded to f32): the largest remaining score, the lower index first on
 * ties (strict >); the weights are the probabilities themselves
 * (renormalised when norm). The CPU twin's topk_row. */
__device__ void cu_topk_row(float *w, int32_t *ex, const float *p, const float *bias, int64_t E,
                            int64_t K, bool norm)
{
    double top = 0;
    for (int64_t k = 0; k < K; k++) {
        int64_t best = -1;
        float bs = 0;
        for (int64_t e = 0; e < E; e++) {
            bool taken = false;
            for (int64_t j = 0; j < k && !taken; j++) taken = ex[j] == e;
            float sc = bias ? __fadd_rn(p[e], bias[e]) : p[e];
            if (!taken && (best < 0 || sc > bs)) {
                best = e;
                bs = sc;
            }
        }
        ex[k] = (int32_t)best;
        w[k] = p[best];
        top += (double)p[best];
    }
    if (norm)
        for (int64_t k = 0; k < K; k++) w[k] = (float)((double)w[k] / top);
}

template <class T>
__global__ void k_route_fwd(float *weights, int32_t *experts, float *probs, const T *logits,
                            int64_t N, int64_t E, int64_t K, bool norm)
{
    GS_LOOP(n, N)
    {
        const T *l = logits + n * E;
        float *p = probs + n * E;
        float mx = -INFINITY;
        for (int64_t e = 0; e < E; e++) mx = fmaxf(mx, cu_ld(l, e));
        double sum = 0;
        for (int64_t e = 0; e < E; e++) sum += exp((double)cu_ld(l, e) - (double)mx);
        for (int64_t e = 0; e < E; e++) p[e] = (float)(exp((double)cu_ld(l, e) - (double)mx) / sum);
        cu_topk_row(weights + n * K, experts + n * K, p, NULL, E, K, norm);
    }
}

/* The top-K of probs + bias (auxiliary-loss-free balancing), the weights
 * the unbiased probabilities. */
__global__ void k_route_reselect(float *weights, int32_t *experts, const float *probs,
                                 const float *bias, int64_t N, int64_t E, int64_t K, bool norm)
{
    GS_LOOP(n, N) cu_topk_row(weights + n * K, experts + n * K, probs + n * E, bias, E, K, norm);
}

/* dlogit_e = p_e (dp_e - sum_e' p_e' dp_e'), dp_e = dprobs[e] + g_k when
 * e = e_k, g_k = (dw_k - sum_j dw_j w_j) / S (norm) or dw_k. Expert ids
 * outside [0, E) contribute nothing. */
template <class T>
__global__ void k_route_bwd(T *dlogits, const float *dweights, const float *dprobs,
                            const float *probs, const int32_t *experts, int64_t N, int64_t E,
                            int64_t K, bool norm)
{
    GS_LOOP(n, N)
    {
        const float *p = probs + n * E;
        const int32_t *ex = experts + n * K;
        const float *dw = dweights ? dweights + n * K : NULL;
        double S = 0, dot = 0, pdp = 0;
        for (int64_t k = 0; k < K; k++)
            if (ex[k] >= 0 && ex[k] < E) S += (double)p[ex[k]];
        if (dw && norm)
            for (int64_t k = 0; k < K; k++)
                if (ex[k] >= 0 && ex[k] < E) dot += (double)dw[k] * (double)p[ex[k]] / S;
        for (int64_t e = 0; e < E; e++) pdp += dprobs ? (double)p[e] * (double)dprobs[e] : 0.0;
        if (dw)
            for (int64_t k = 0; k < K; k++) {
                if (ex[k] < 0 || ex[k] >= E) continue;
                double g = norm ? ((double)dw[k] - dot) / S : (double)dw[k];
                pdp += (double)p[ex[k]] * g;
            }
        T *dl = dlogits + n * E;
        for (int64_t e = 0; e < E; e++) {
            double dp = dprobs ? (double)dprobs[e] : 0.0;
            if (dw)
                for (int64_t k = 0; k < K; k++)
                    if (ex[k] == e) dp += norm ? ((double)dw[k] - dot) / S : (double)dw[k];
            cu_st(dl, e, cu_ld(dl, e) + (float)((double)p[e] * (dp - pdp)));
        }
    }
}

/* one thread per expert, rows in order */
__global__ void k_route_stats(float *counts, float *psum, const float *probs,
                              const int32_t *experts, int64_t N, int64_t E, int64_t K)
{
    GS_LOOP(e, E)
    {
        double c = 0, ps = 0;
        for (int64_t n = 0; n < N; n++) {
            for (int64_t k = 0; k < K; k++) c += experts[n * K + k] == e;
            ps += (double)probs[n * E + e];
        }
        counts[e] += (float)c;
        psum[e] += (float)ps;
    }
}

extern "C" cudaError_t cuda_moe_route_fwd(cudaStream_t st, float *weights, int32_t *experts,
                                          float *probs, const void *logits, dtype_t dt, int64_t N,
                                          int64_t E, int64_t K, bool norm)
{
    if (N > 0)
        CU_DISPATCH_FT(dt, T,
                       k_route_fwd<T><<<cu_blocks(N, 128), 128, 0, st>>>(
                           weights, experts, probs, (const T *)logits, N, E, K, norm));
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_moe_route_reselect(cudaStream_t st, float *weights,
                                               int32_t *experts, const float *probs,
                                               const float *bias, int64_t N, int64_t E,
                                               int64_t K, bool norm)
{
    if (N > 0)
        k_route_reselect<<<cu_blocks(N, 128), 128, 0, st>>>(weights, experts, probs, bias, N, E,
                                                            K, norm);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_moe_route_bwd(cudaStream_t st, void *dlogits, dtype_t dt,
                                          const float *dweights, const float *dprobs,
                                          const float *probs, const int32_t *experts, int64_t N,
                                          int64_t E, int64_t K, bool norm)
{
    if (N > 0)
        CU_DISPATCH_FT(dt, T,
                       k_route_bwd<T><<<cu_blocks(N, 128), 128, 0, st>>>(
                           (T *)dlogits, dweights, dprobs, probs, experts, N, E, K, norm));
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_moe_route_stats(cudaStream_t st, float *counts, float *psum,
                                            const float *probs, const int32_t *experts, int64_t N,
                                            int64_t E, int64_t K)
{
    if (E > 0) k_route_stats<<<cu_blocks(E, 64), 64, 0, st>>>(counts, psum, probs, experts, N, E, K);
    return cudaGetLastError();
}

/* ---- dispatch ------------------------------------------------------------------ */

/* one thread per expert: its routed choices and the rows it keeps */
__global__ void k_permute_count(int32_t *sizes, int32_t *routed, const int32_t *experts,
                                int64_t NK, int64_t E, int64_t capacity, const int32_t *caps)
{
    GS_LOOP(e, E)
    {
        int64_t c = 0, cap = caps ? (int64_t)caps[e] : capacity;
        for (int64_t i = 0; i < NK; i++) c += experts[i] == e;
        routed[e] = (int32_t)c;
        sizes[e] = (int32_t)(cap >= 0 && c > cap ? cap : c);
    }
}

/* one thread per expert: the slots of its choices, in row order */
__global__ void k_permute_slots(int32_t *slot, const int32_t *sizes, const int32_t *experts,
                                int64_t NK, int64_t E)
{
    GS_LOOP(e, E)
    {
        int64_t off = 0, j = 0;
        for (int64_t f = 0; f < e; f++) off += sizes[f];
        for (int64_t i = 0; i < NK; i++) {
            if (experts[i] != e) continue;
            slot[i] = j < sizes[e] ? (int32_t)(off + j) : -1;
            j++;
        }
    }
}

/* choices with an expert id outside [0, E) are dropped */
__global__ void k_permute_invalid(int32_t *slot, const int32_t *experts, int64_t NK, int64_t E)
{
    GS_LOOP(i, NK) if (experts[i] < 0 || experts[i] >= E) slot[i] = -1;
}

template <class T>
__global__ void k_permute_copy(T *xp, const T *x, const int32_t *slot, int64_t NK, int64_t K,
                               int64_t C)
{
    GS_LOOP(i, NK * C)
    {
        int64_t ch = i / C, c = i % C;
        int32_t r = slot[ch];
        if (r >= 0) xp[(int64_t)r * C + c] = x[(ch / K) * C + c];
    }
}

template <class T>
__global__ void k_permute_bwd(T *dx, const T *dxp, const int32_t *slot, int64_t N, int64_t K,
                              int64_t C)
{
    GS_LOOP(i, N * C)
    {
        int64_t n = i / C, c = i % C;
        float acc = cu_ld(dx, i);
        for (int64_t k = 0; k < K; k++) {
            int32_t r = slot[n * K + k];
            if (r >= 0) acc += cu_ld(dxp, (int64_t)r * C + c);
        }
        cu_st(dx, i, acc);
    }
}

extern "C" cudaError_t cuda_moe_permute_fwd(cudaStream_t st, void *xp, int32_t *slot,
                                            int32_t *sizes, int32_t *routed, const void *x,
                                            const int32_t *experts, dtype_t dt, int64_t N,
                                            int64_t C, int64_t K, int64_t E, int64_t capacity,
                                            const int32_t *caps)
{
    int64_t NK = N * K;
    cudaError_t e = cudaMemsetAsync(xp, 0, (size_t)(NK * C) * dtype_size(dt), st);
    if (e != cudaSuccess) return e;
    k_permute_count<<<cu_blocks(E, 64), 64, 0, st>>>(sizes, routed, experts, NK, E, capacity, caps);
    if (NK > 0) {
        k_permute_invalid<<<cu_blocks(NK, 256), 256, 0, st>>>(slot, experts, NK, E);
        k_permute_slots<<<cu_blocks(E, 64), 64, 0, st>>>(slot, sizes, experts, NK, E);
        if (C > 0)
            CU_DISPATCH_FT(dt, T,
                           k_permute_copy<T><<<cu_blocks(NK * C, 256), 256, 0, st>>>(
                               (T *)xp, (const T *)x, slot, NK, K, C));
    }
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_moe_permute_bwd(cudaStream_t st, void *dx, const void *dxp,
                                            const int32_t *slot, dtype_t dt, int64_t N, int64_t C,
                                            int64_t K)
{
    if (N * C > 0)
        CU_DISPATCH_FT(dt, T,
                       k_permute_bwd<T><<<cu_blocks(N * C, 256), 256, 0, st>>>(
                           (T *)dx, (const T *)dxp, slot, N, K, C));
    return cudaGetLastError();
}

/* ---- combine -------------------------------------------------------------------- */

template <class T>
__global__ void k_combine_fwd(T *y, const T *yp, const int32_t *slot, const float *weights,
                              int64_t N, int64_t K, int64_t C)
{
    GS_LOOP(i, N * C)
    {
        int64_t n = i / C, c = i % C;
        float acc = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            int32_t r = slot[n * K + k];
            if (r >= 0) acc += weights[n * K + k] * cu_ld(yp, (int64_t)r * C + c);
        }
        cu_st(y, i, acc);
    }
}

/* each slot belongs to one choice: no two threads write one element */
template <class T>
__global__ void k_combine_bwd_dyp(T *dyp, const T *dy, const int32_t *slot, const float *weights,
                                  int64_t NK, int64_t K, int64_t C)
{
    GS_LOOP(i, NK * C)
    {
        int64_t ch = i / C, c = i % C;
        int32_t r = slot[ch];
        if (r < 0) continue;
        int64_t at = (int64_t)r * C + c;
        cu_st(dyp, at, cu_ld(dyp, at) + weights[ch] * cu_ld(dy, (ch / K) * C + c));
    }
}

template <class T>
__global__ void k_combine_bwd_dw(float *dweights, const T *dy, const T *yp, const int32_t *slot,
                                 int64_t NK, int64_t K, int64_t C)
{
    GS_LOOP(ch, NK)
    {
        int32_t r = slot[ch];
        if (r < 0) continue;
        double dot = 0;
        for (int64_t c = 0; c < C; c++)
            dot += (double)cu_ld(dy, (ch / K) * C + c) * (double)cu_ld(yp, (int64_t)r * C + c);
        dweights[ch] += (float)dot;
    }
}

extern "C" cudaError_t cuda_moe_combine_fwd(cudaStream_t st, void *y, const void *yp,
                                            const int32_t *slot, const float *weights, dtype_t dt,
                                            int64_t N, int64_t C, int64_t K)
{
    if (N * C > 0)
        CU_DISPATCH_FT(dt, T,
                       k_combine_fwd<T><<<cu_blocks(N * C, 256), 256, 0, st>>>(
                           (T *)y, (const T *)yp, slot, weights, N, K, C));
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_moe_combine_bwd(cudaStream_t st, void *dyp, float *dweights,
                                            const void *dy, const void *yp, const int32_t *slot,
                                            const float *weights, dtype_t dt, int64_t N, int64_t C,
                                            int64_t K)
{
    int64_t NK = N * K;
    if (dyp && NK * C > 0)
        CU_DISPATCH_FT(dt, T,
                       k_combine_bwd_dyp<T><<<cu_blocks(NK * C, 256), 256, 0, st>>>(
                           (T *)dyp, (const T *)dy, slot, weights, NK, K, C));
    if (dweights && NK > 0)
        CU_DISPATCH_FT(dt, T,
                       k_combine_bwd_dw<T><<<cu_blocks(NK, 128), 128, 0, st>>>(
                           dweights, (const T *)dy, (const T *)yp, slot, NK, K, C));
    return cudaGetLastError();
}

/* ---- a shared expert's sigmoid gate ------------------------------------------------ */

__device__ __forceinline__ double cu_sigmoid(float g) { return 1.0 / (1.0 + exp(-(double)g)); }

template <class T>
__global__ void k_sigmoid_gate_fwd(T *out, const T *gate, const T *x, int64_t N, int64_t C)
{
    GS_LOOP(i, N * C) cu_st(out, i, (float)cu_sigmoid(cu_ld(gate, i / C)) * cu_ld(x, i));
}

template <class T>
__global__ void k_sigmoid_gate_dx(T *dx, const T *dout, const T *gate, int64_t N, int64_t C)
{
    GS_LOOP(i, N * C)
    cu_st(dx, i, cu_ld(dx, i) + (float)cu_sigmoid(cu_ld(gate, i / C)) * cu_ld(dout, i));
}

template <class T>
__global__ void k_sigmoid_gate_dgate(T *dgate, const T *dout, const T *gate, const T *x,
                                     int64_t N, int64_t C)
{
    GS_LOOP(n, N)
    {
        double dot = 0, sg = cu_sigmoid(cu_ld(gate, n));
        for (int64_t c = 0; c < C; c++) dot += (double)cu_ld(dout, n * C + c) * (double)cu_ld(x, n * C + c);
        cu_st(dgate, n, cu_ld(dgate, n) + (float)(sg * (1.0 - sg) * dot));
    }
}

extern "C" cudaError_t cuda_sigmoid_gate_fwd(cudaStream_t st, void *out, const void *gate,
                                             const void *x, dtype_t dt, int64_t N, int64_t C)
{
    if (N * C > 0)
        CU_DISPATCH_FT(dt, T,
                       k_sigmoid_gate_fwd<T><<<cu_blocks(N * C, 256), 256, 0, st>>>(
                           (T *)out, (const T *)gate, (const T *)x, N, C));
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_sigmoid_gate_bwd(cudaStream_t st, void *dx, void *dgate,
                                             const void *dout, const void *gate, const void *x,
                                             dtype_t dt, int64_t N, int64_t C)
{
    if (dx && N * C > 0)
        CU_DISPATCH_FT(dt, T,
                       k_sigmoid_gate_dx<T><<<cu_blocks(N * C, 256), 256, 0, st>>>(
                           (T *)dx, (const T *)dout, (const T *)gate, N, C));
    if (dgate && N > 0)
        CU_DISPATCH_FT(dt, T,
                       k_sigmoid_gate_dgate<T><<<cu_blocks(N, 128), 128, 0, st>>>(
                           (T *)dgate, (const T *)dout, (const T *)gate, (const T *)x, N, C));
    return cudaGetLastError();
}
