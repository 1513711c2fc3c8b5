/* Elementwise kernels, dtype conversion, the two host-returning reductions,
 * bias rows and column sums, SwiGLU, RoPE and the embedding. Grid-stride
 * loops over 64-bit indices; fp32 math on f32 or bf16 storage. */
#include "kernels/cuda/common.cuh"

#include <cub/device/device_radix_sort.cuh>

#define GS_LOOP(i, n)                                                                              \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

/* ---- conversion -------------------------------------------------------------- */

__global__ void k_convert(void *dst, dtype_t ddt, const void *src, dtype_t sdt, int64_t n)
{
    GS_LOOP(i, n)
    {
        switch (ddt) {
        case DT_F32: ((float *)dst)[i] = cu_ld_dt(src, sdt, i); break;
        case DT_F64: ((double *)dst)[i] = cu_ld_dt_f64(src, sdt, i); break;
        /* f64 -> bf16/f16 goes through f32 (double rounding), as on the CPU */
        case DT_BF16: ((uint16_t *)dst)[i] = cu_f32_to_bf16(cu_ld_dt(src, sdt, i)); break;
        default: ((uint16_t *)dst)[i] = cu_f32_to_f16(cu_ld_dt(src, sdt, i)); break;
        }
    }
}

extern "C" cudaError_t cuda_convert(cudaStream_t st, void *dst, dtype_t dst_dt, const void *src,
                                    dtype_t src_dt, int64_t n)
{
    if (n > 0) k_convert<<<cu_blocks(n, 256), 256, 0, st>>>(dst, dst_dt, src, src_dt, n);
    return cudaGetLastError();
}

/* ---- add, axpy, scale ---------------------------------------------------------- */

template <class T> __global__ void k_add(T *out, const T *a, const T *b, int64_t n)
{
    GS_LOOP(i, n) cu_st(out, i, cu_ld(a, i) + cu_ld(b, i));
}

template <class T> __global__ void k_axpy(T *y, float alpha, const T *x, int64_t n)
{
    GS_LOOP(i, n) cu_st(y, i, cu_ld(y, i) + alpha * cu_ld(x, i));
}

template <class T> __global__ void k_scale(T *p, float f, int64_t n)
{
    GS_LOOP(i, n) cu_st(p, i, cu_ld(p, i) * f);
}

extern "C" cudaError_t cuda_add(cudaStream_t st, void *out, const void *a, const void *b,
                                dtype_t dt, int64_t n)
{
    if (n > 0)
        CU_DISPATCH_FT(dt, T,
                       k_add<T><<<cu_blocks(n, 256), 256, 0, st>>>((T *)out, (const T *)a,
                                                                   (const T *)b, n));
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_axpy(cudaStream_t st, void *y, float alpha, const void *x, dtype_t dt,
                                 int64_t n)
{
    if (n > 0)
        CU_DISPATCH_FT(dt, T,
                       k_axpy<T><<<cu_blocks(n, 256), 256, 0, st>>>((T *)y, alpha, (const T *)x,
                                                                    n));
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_scale(cudaStream_t st, void *p, float f, dtype_t dt, int64_t n)
{
    if (n > 0)
        CU_DISPATCH_FT(dt, T, k_scale<T><<<cu_blocks(n, 256), 256, 0, st>>>((T *)p, f, n));
    return cudaGetLastError();
}

/* ---- reductions ---------------------------------------------------------------- */

enum { RED_THREADS = 256, RED_MAX_BLOCKS = 1024 };

static unsigned red_blocks(int64_t n) { return cu_blocks(n, RED_THREADS * 8, RED_MAX_BLOCKS); }

extern "C" size_t cuda_reduce_scratch(int64_t n) { return (size_t)red_blocks(n) * 8; }

/* Stage 1: one double or count per block, tree-reduced in a fixed order. */
template <bool COUNT>
__global__ void k_reduce_partial(void *partial, const void *p, dtype_t dt, int64_t n)
{
    __shared__ double sd[RED_THREADS];
    __shared__ unsigned long long sc[RED_THREADS];
    double acc = 0.0;
    unsigned long long cnt = 0;
    GS_LOOP(i, n)
    {
        double x = cu_ld_dt_f64(p, dt, i);
        if (COUNT) cnt += !isfinite(x);
        else acc += x * x;
    }
    sd[threadIdx.x] = acc;
    sc[threadIdx.x] = cnt;
    __syncthreads();
    for (int w = RED_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            sd[threadIdx.x] += sd[threadIdx.x + w];
            sc[threadIdx.x] += sc[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (COUNT) ((unsigned long long *)partial)[blockIdx.x] = sc[0];
        else ((double *)partial)[blockIdx.x] = sd[0];
    }
}

/* Stage 2: one warp adds the partials in a fixed order and writes *out. */
template <bool COUNT> __global__ void k_reduce_finish(void *out, const void *partial, int G)
{
    double acc = 0.0;
    unsigned long long cnt = 0;
    for (int g = threadIdx.x; g < G; g += 32) {
        if (COUNT) cnt += ((const unsigned long long *)partial)[g];
        else acc += ((const double *)partial)[g];
    }
    for (int o = 16; o > 0; o >>= 1) {
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
        cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
    }
    if (threadIdx.x == 0) {
        if (COUNT) *(volatile long long *)out = (long long)cnt;
        else *(volatile double *)out = acc;
    }
}

template <bool COUNT>
static cudaError_t reduce_run(cudaStream_t st, void *out, const void *p, dtype_t dt, int64_t n,
                              void *scratch)
{
    unsigned G = red_blocks(n);
    k_reduce_partial<COUNT><<<G, RED_THREADS, 0, st>>>(scratch, p, dt, n);
    k_reduce_finish<COUNT><<<1, 32, 0, st>>>(out, scratch, (int)G);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_sumsq(cudaStream_t st, double *out, const void *p, dtype_t dt,
                                  int64_t n, void *scratch)
{
    return reduce_run<false>(st, out, p, dt, n, scratch);
}

extern "C" cudaError_t cuda_count_nonfinite(cudaStream_t st, int64_t *out, const void *p,
                                            dtype_t dt, int64_t n, void *scratch)
{
    return reduce_run<true>(st, out, p, dt, n, scratch);
}

/* ---- bias rows, column sums ------------------------------------------------------ */

template <class T> __global__ void k_bias_rows(T *out, const T *bias, int64_t N, int64_t OC)
{
    GS_LOOP(i, N * OC) out[i] = bias[i % OC];
}

extern "C" cudaError_t cuda_bias_rows(cudaStream_t st, void *out, const void *bias, dtype_t dt,
                                      int64_t N, int64_t OC)
{
    if (N * OC > 0)
        CU_DISPATCH_FT(dt, T,
                       k_bias_rows<T><<<cu_blocks(N * OC, 256), 256, 0, st>>>(
                           (T *)out, (const T *)bias, N, OC));
    return cudaGetLastError();
}

template <class T> struct colsum_src_f {
    const T *src;
    int64_t C;
    __device__ float operator()(int64_t n, int64_t c) const { return cu_ld(src, n * C + c); }
};

extern "C" size_t cuda_colsum_scratch(int64_t N, int64_t C) { return cu_colsum_bytes(N, C); }

extern "C" cudaError_t cuda_colsum(cudaStream_t st, void *dst, dtype_t dst_dt, const void *src,
                                   dtype_t src_dt, int64_t N, int64_t C, void *scratch)
{
    cudaError_t e;
    CU_DISPATCH_FT(src_dt, T,
                   e = cu_colsum_run(st, dst, dst_dt, colsum_src_f<T>{(const T *)src, C}, N, C,
                                     scratch));
    return e;
}

/* ---- SwiGLU ---------------------------------------------------------------------- */

/* silu(g) = g / (1 + exp(-g)) as torch computes it */
template <class T> __global__ void k_swiglu_fwd(T *out, const T *gate, const T *up, int64_t n)
{
    GS_LOOP(i, n)
    {
        float g = cu_ld(gate, i);
        cu_st(out, i, g / (1.0f + expf(-g)) * cu_ld(up, i));
    }
}

/* dgate += dout * u * s (1 + g (1 - s)), dup += dout * g s, s = sigmoid(g);
 * SET: = instead of += (the old values are not read) */
template <class T, bool SET>
__global__ void k_swiglu_bwd(T *dgate, T *dup, const T *dout, const T *gate, const T *up,
                             int64_t n)
{
    GS_LOOP(i, n)
    {
        float g = cu_ld(gate, i), d = cu_ld(dout, i);
        float s = 1.0f / (1.0f + expf(-g));
        if (dgate) {
            float x = d * cu_ld(up, i) * (s * (1.0f + g * (1.0f - s)));
            cu_st(dgate, i, SET ? x : cu_ld(dgate, i) + x);
        }
        if (dup) {
            float x = d * (g * s);
            cu_st(dup, i, SET ? x : cu_ld(dup, i) + x);
        }
    }
}

extern "C" cudaError_t cuda_swiglu_fwd(cudaStream_t st, void *out, const void *gate,
                                       const void *up, dtype_t dt, int64_t n)
{
    if (n > 0)
        CU_DISPATCH_FT(dt, T,
                       k_swiglu_fwd<T><<<cu_blocks(n, 256), 256, 0, st>>>(
                           (T *)out, (const T *)gate, (const T *)up, n));
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_swiglu_bwd(cudaStream_t st, void *dgate, void *dup, const void *dout,
                                       const void *gate, const void *up, dtype_t dt, int64_t n,
                                       bool set)
{
    if (n <= 0 || (!dgate && !dup)) return cudaGetLastError();
    if (set)
        CU_DISPATCH_FT(dt, T,
                       k_swiglu_bwd<T, true><<<cu_blocks(n, 256), 256, 0, st>>>(
                           (T *)dgate, (T *)dup, (const T *)dout, (const T *)gate,
                           (const T *)up, n));
    else
        CU_DISPATCH_FT(dt, T,
                       k_swiglu_bwd<T, false><<<cu_blocks(n, 256), 256, 0, st>>>(
                           (T *)dgate, (T *)dup, (const T *)dout, (const T *)gate,
                           (const T *)up, n));
    return cudaGetLastError();
}

/* ---- RoPE ------------------------------------------------------------------------ */

/* One thread per rotated pair (t, h, i < D/2): reads both halves before
 * writing, so out may alias x. BWD 1: out += R^T x, 2: out = R^T x. */
template <class T, int BWD>
__global__ void k_rope(T *out, const T *x, const float *cos, const float *sin,
                       const int32_t *pos, int64_t BT, int64_t H, int64_t D, int64_t P,
                       unsigned *flags)
{
    int64_t half = D / 2;
    GS_LOOP(idx, BT * H * half)
    {
        int64_t i = idx % half, th = idx / half, t = th / H;
        int64_t base = th * D;
        int32_t p = pos[t];
        if (p < 0 || p >= P) {
            *(volatile unsigned *)&flags[CUDA_FLAG_ROPE_POS] = 1u;
            cu_st(out, base + i, NAN);
            cu_st(out, base + i + half, NAN);
            continue;
        }
        float c = cos[(int64_t)p * half + i], s = sin[(int64_t)p * half + i];
        float x1 = cu_ld(x, base + i), x2 = cu_ld(x, base + i + half);
        if (BWD == 2) {
            cu_st(out, base + i, x1 * c + x2 * s);
            cu_st(out, base + i + half, x2 * c - x1 * s);
        } else if (BWD == 1) {
            cu_st(out, base + i, cu_ld(out, base + i) + (x1 * c + x2 * s));
            cu_st(out, base + i + half, cu_ld(out, base + i + half) + (x2 * c - x1 * s));
        } else {
            cu_st(out, base + i, x1 * c - x2 * s);
            cu_st(out, base + i + half, x2 * c + x1 * s);
        }
    }
}

extern "C" cudaError_t cuda_rope(cudaStream_t st, void *out, const void *x, const float *cos,
                                 const float *sin, const int32_t *pos, dtype_t dt, int64_t BT,
                                 int64_t H, int64_t D, int64_t P, int bwd, unsigned *flags)
{
    int64_t n = BT * H * (D / 2);
    if (n <= 0) return cudaGetLastError();
    unsigned nb = cu_blocks(n, 256);
    if (bwd == 2)
        CU_DISPATCH_FT(dt, T,
                       k_rope<T, 2><<<nb, 256, 0, st>>>((T *)out, (const T *)x, cos, sin, pos,
                                                        BT, H, D, P, flags));
    else if (bwd == 1)
        CU_DISPATCH_FT(dt, T,
                       k_rope<T, 1><<<nb, 256, 0, st>>>((T *)out, (const T *)x, cos, sin, pos,
                                                        BT, H, D, P, flags));
    else
        CU_DISPATCH_FT(dt, T,
                       k_rope<T, 0><<<nb, 256, 0, st>>>((T *)out, (const T *)x, cos, sin,
                                                        pos, BT, H, D, P, flags));
    return cudaGetLastError();
}

/* ---- embedding --------------------------------------------------------------------- */

template <class T>
__global__ void k_embedding_fwd(T *out, const T *table, const int32_t *ids, int64_t N, int64_t V,
                                int64_t C, int64_t vocab_start)
{
    GS_LOOP(i, N * C)
    {
        int64_t n = i / C, c = i % C, r = (int64_t)ids[n] - vocab_start;
        out[i] = r >= 0 && r < V ? table[r * C + c] : T{};
    }
}

extern "C" cudaError_t cuda_embedding_fwd(cudaStream_t st, void *out, const void *table,
                                          const int32_t *ids, dtype_t dt, int64_t N, int64_t V,
                                          int64_t C, int64_t vocab_start)
{
    if (N * C > 0)
        CU_DISPATCH_FT(dt, T,
                       k_embedding_fwd<T><<<cu_blocks(N * C, 256), 256, 0, st>>>(
                           (T *)out, (const T *)table, ids, N, V, C, vocab_start));
    return cudaGetLastError();
}

/* key = row of the shard, or V for ids outside it (sorted last, skipped) */
__global__ void k_embedding_keys(uint32_t *keys, int32_t *rows, const int32_t *ids, int64_t N,
                                 int64_t V, int64_t vocab_start)
{
    GS_LOOP(n, N)
    {
        int64_t r = (int64_t)ids[n] - vocab_start;
        keys[n] = r >= 0 && r < V ? (uint32_t)r : (uint32_t)V;
        rows[n] = (int32_t)n;
    }
}

/* Block p handles sorted position p when it starts a run of equal keys: its
 * threads (one per column) add the run's rows in row order onto dtable. */
template <class TD, class T>
__global__ void k_embedding_runs(TD *dtable, const T *dout, const uint32_t *keys,
                                 const int32_t *rows, int64_t N, int64_t V, int64_t C)
{
    for (int64_t p = blockIdx.x; p < N; p += gridDim.x) {
        uint32_t key = keys[p];
        if (key >= (uint32_t)V || (p > 0 && keys[p - 1] == key)) continue;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float acc = cu_ld(dtable, (int64_t)key * C + c);
            for (int64_t q = p; q < N && keys[q] == key; q++)
                acc += cu_ld(dout, (int64_t)rows[q] * C + c);
            cu_st(dtable, (int64_t)key * C + c, acc);
        }
    }
}

static int embedding_key_bits(int64_t V)
{
    int bits = 1;
    while (bits < 32 && ((int64_t)1 << bits) <= V) bits++; /* keys go up to V itself */
    return bits;
}

static size_t align256(size_t n) { return (n + 255) / 256 * 256; }

static size_t embedding_sort_temp(int64_t N, int64_t V)
{
    size_t temp = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, temp, (const uint32_t *)nullptr, (uint32_t *)nullptr,
                                    (const int32_t *)nullptr, (int32_t *)nullptr, (int)N, 0,
                                    embedding_key_bits(V));
    return temp;
}

extern "C" size_t cuda_embedding_bwd_scratch(int64_t N, int64_t V)
{
    if (N <= 0) return 0;
    return 4 * align256((size_t)N * 4) + align256(embedding_sort_temp(N, V));
}

extern "C" cudaError_t cuda_embedding_bwd(cudaStream_t st, void *dtable, dtype_t dtable_dt,
                                          const void *dout, dtype_t dt, const int32_t *ids,
                                          int64_t N, int64_t V, int64_t C, int64_t vocab_start,
                                          void *scratch, size_t scratch_bytes)
{
    if (N <= 0 || C <= 0) return cudaGetLastError();
    if (N > INT32_MAX || V >= INT32_MAX) return cudaErrorInvalidValue;
    char *sp = (char *)scratch;
    size_t arr = align256((size_t)N * 4);
    uint32_t *keys_in = (uint32_t *)sp, *keys_out = (uint32_t *)(sp + arr);
    int32_t *rows_in = (int32_t *)(sp + 2 * arr), *rows_out = (int32_t *)(sp + 3 * arr);
    void *temp = sp + 4 * arr;
    size_t temp_bytes = scratch_bytes - 4 * arr;
    k_embedding_keys<<<cu_blocks(N, 256), 256, 0, st>>>(keys_in, rows_in, ids, N, V, vocab_start);
    cudaError_t e = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, rows_in,
                                                    rows_out, (int)N, 0, embedding_key_bits(V), st);
    if (e != cudaSuccess) return e;
    unsigned nb = N < 65535 * 16 ? (unsigned)N : 65535u * 16u;
    int threads = C >= 256 ? 256 : C >= 128 ? 128 : C >= 64 ? 64 : 32;
    if (dtable_dt == DT_BF16)
        CU_DISPATCH_FT(dt, T,
                       k_embedding_runs<cu_bf16_t, T><<<nb, threads, 0, st>>>(
                           (cu_bf16_t *)dtable, (const T *)dout, keys_out, rows_out, N, V, C));
    else
        CU_DISPATCH_FT(dt, T,
                       k_embedding_runs<float, T><<<nb, threads, 0, st>>>(
                           (float *)dtable, (const T *)dout, keys_out, rows_out, N, V, C));
    return cudaGetLastError();
}
