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

/* ---- elementwise maps over 16-byte vectors ------------------------------------- */

/* k_map runs F on every element i < n of NI inputs into NO outputs: each
 * thread takes CU_VW(T) consecutive elements (one 16-byte load per input and
 * one store per output when `vec`, the host's word that every pointer is
 * 16-byte aligned), the tail and unaligned tensors go element by element.
 * A NULL input reads as 0, a NULL output is not written. Each thread loads
 * all its inputs before it stores, so an output may alias an input. F is a
 * functor: y[NO] from x[NI], fp32, the same formula as the scalar CPU twin. */
template <class T, int NI, int NO> struct map_ptrs {
    const T *in[NI];
    T *out[NO];
};

template <class T, int NI, int NO, class F>
__global__ void k_map(map_ptrs<T, NI, NO> p, int64_t n, bool vec, F f)
{
    constexpr int W = CU_VW(T);
    for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * W; i < n;
         i += (int64_t)gridDim.x * blockDim.x * W) {
        const int m = n - i < W ? (int)(n - i) : W;
        const bool v = vec && m == W;
        float x[NI][W], y[NO][W];
#pragma unroll
        for (int k = 0; k < NI; k++) {
            if (!p.in[k]) {
#pragma unroll
                for (int j = 0; j < W; j++) x[k][j] = 0.0f;
            } else if (v) {
                cu_ldv(p.in[k], i, x[k]);
            } else {
                for (int j = 0; j < W; j++) x[k][j] = j < m ? cu_ld(p.in[k], i + j) : 0.0f;
            }
        }
#pragma unroll
        for (int j = 0; j < W; j++) {
            float xs[NI], ys[NO];
#pragma unroll
            for (int k = 0; k < NI; k++) xs[k] = x[k][j];
            f(ys, xs);
#pragma unroll
            for (int k = 0; k < NO; k++) y[k][j] = ys[k];
        }
#pragma unroll
        for (int k = 0; k < NO; k++) {
            if (!p.out[k]) continue;
            if (v) cu_stv(p.out[k], i, y[k]);
            else
                for (int j = 0; j < m; j++) cu_st(p.out[k], i + j, y[k][j]);
        }
    }
}

template <class T, int NI, int NO, class F>
static cudaError_t map_run(cudaStream_t st, map_ptrs<T, NI, NO> p, int64_t n, F f)
{
    if (n <= 0) return cudaGetLastError();
    bool vec = true;
    for (int k = 0; k < NI; k++) vec = vec && cu_aligned16(p.in[k]);
    for (int k = 0; k < NO; k++) vec = vec && cu_aligned16(p.out[k]);
    int64_t nv = (n + CU_VW(T) - 1) / CU_VW(T);
    k_map<T, NI, NO, F><<<cu_blocks(nv, 256), 256, 0, st>>>(p, n, vec, f);
    return cudaGetLastError();
}

/* ---- add, axpy, scale ---------------------------------------------------------- */

struct add_f {
    __device__ void operator()(float *y, const float *x) const { y[0] = x[0] + x[1]; }
};

struct axpy_f {
    float alpha;
    __device__ void operator()(float *y, const float *x) const { y[0] = x[0] + alpha * x[1]; }
};

struct scale_f {
    float f;
    __device__ void operator()(float *y, const float *x) const { y[0] = x[0] * f; }
};

extern "C" cudaError_t cuda_add(cudaStream_t st, void *out, const void *a, const void *b,
                                dtype_t dt, int64_t n)
{
    cudaError_t e;
    CU_DISPATCH_FT(dt, T,
                   e = map_run(st, map_ptrs<T, 2, 1>{{(const T *)a, (const T *)b}, {(T *)out}}, n,
                               add_f{}));
    return e;
}

extern "C" cudaError_t cuda_axpy(cudaStream_t st, void *y, float alpha, const void *x, dtype_t dt,
                                 int64_t n)
{
    cudaError_t e;
    CU_DISPATCH_FT(dt, T,
                   e = map_run(st, map_ptrs<T, 2, 1>{{(const T *)y, (const T *)x}, {(T *)y}}, n,
                               axpy_f{alpha}));
    return e;
}

/* kern_copy_cols: one thread per (row, column) of the copy */
template <class T>
__global__ void k_copy_cols(T *dst, const T *src, int64_t rows, int64_t dcols, int64_t scols,
                            int64_t d0, int64_t dstep, int64_t s0, int64_t sstep, int64_t n,
                            int64_t div, bool acc)
{
    GS_LOOP(i, rows * n)
    {
        int64_t r = i / n, j = i % n;
        int64_t di = r * dcols + d0 + j * dstep;
        float x = cu_ld(src, (r / div) * scols + s0 + j * sstep);
        cu_st(dst, di, acc ? cu_ld(dst, di) + x : x);
    }
}

extern "C" cudaError_t cuda_copy_cols(cudaStream_t st, void *dst, const void *src, dtype_t dt,
                                      int64_t rows, int64_t dcols, int64_t scols, int64_t d0,
                                      int64_t dstep, int64_t s0, int64_t sstep, int64_t n,
                                      int64_t div, bool acc)
{
    if (rows * n > 0)
        CU_DISPATCH_FT(dt, T,
                       k_copy_cols<T><<<cu_blocks(rows * n, 256), 256, 0, st>>>(
                           (T *)dst, (const T *)src, rows, dcols, scols, d0, dstep, s0, sstep, n,
                           div, acc));
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_scale(cudaStream_t st, void *p, float f, dtype_t dt, int64_t n)
{
    cudaError_t e;
    CU_DISPATCH_FT(dt, T,
                   e = map_run(st, map_ptrs<T, 1, 1>{{(const T *)p}, {(T *)p}}, n, scale_f{f}));
    return e;
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

/* silu(g) = g / (1 + exp(-g)) as torch computes it; x = {gate, up} */
struct swiglu_fwd_f {
    __device__ void operator()(float *y, const float *x) const
    {
        float g = x[0];
        y[0] = g / (1.0f + expf(-g)) * x[1];
    }
};

/* dgate (+)= dout * u * s (1 + g (1 - s)), dup (+)= dout * g s, s = sigmoid(g);
 * x = {dout, gate, up, old dgate, old dup} (the old values NULL, read as 0,
 * under SET: they are not read and the terms are stored as they are) */
template <bool SET> struct swiglu_bwd_f {
    __device__ void operator()(float *y, const float *x) const
    {
        float d = x[0], g = x[1], u = x[2];
        float s = 1.0f / (1.0f + expf(-g));
        float dg = d * u * (s * (1.0f + g * (1.0f - s))), du = d * (g * s);
        if constexpr (SET) {
            y[0] = dg, y[1] = du;
        } else {
            y[0] = x[3] + dg, y[1] = x[4] + du;
        }
    }
};

extern "C" cudaError_t cuda_swiglu_fwd(cudaStream_t st, void *out, const void *gate,
                                       const void *up, dtype_t dt, int64_t n)
{
    cudaError_t e;
    CU_DISPATCH_FT(dt, T,
                   e = map_run(st, map_ptrs<T, 2, 1>{{(const T *)gate, (const T *)up}, {(T *)out}},
                               n, swiglu_fwd_f{}));
    return e;
}

extern "C" cudaError_t cuda_swiglu_bwd(cudaStream_t st, void *dgate, void *dup, const void *dout,
                                       const void *gate, const void *up, dtype_t dt, int64_t n,
                                       bool set)
{
    if (n <= 0 || (!dgate && !dup)) return cudaGetLastError();
    cudaError_t e;
    if (set)
        CU_DISPATCH_FT(dt, T,
                       e = map_run(st,
                                   map_ptrs<T, 3, 2>{{(const T *)dout, (const T *)gate,
                                                      (const T *)up},
                                                     {(T *)dgate, (T *)dup}},
                                   n, swiglu_bwd_f<true>{}));
    else
        CU_DISPATCH_FT(dt, T,
                       e = map_run(st,
                                   map_ptrs<T, 5, 2>{{(const T *)dout, (const T *)gate,
                                                      (const T *)up, (const T *)dgate,
                                                      (const T *)dup},
                                                     {(T *)dgate, (T *)dup}},
                                   n, swiglu_bwd_f<false>{}));
    return e;
}

/* ---- squared ReLU ---------------------------------------------------------------- */

struct relu2_fwd_f {
    __device__ void operator()(float *y, const float *x) const
    {
        float r = x[0] > 0.0f ? x[0] : 0.0f;
        y[0] = r * r;
    }
};

/* x = {dout, x, old dx} (old dx absent under SET) */
template <bool SET> struct relu2_bwd_f {
    __device__ void operator()(float *y, const float *x) const
    {
        float t = x[1] > 0.0f ? 2.0f * x[1] * x[0] : 0.0f;
        if constexpr (SET) y[0] = t;
        else y[0] = x[2] + t;
    }
};

extern "C" cudaError_t cuda_relu2_fwd(cudaStream_t st, void *out, const void *x, dtype_t dt,
                                      int64_t n)
{
    cudaError_t e;
    CU_DISPATCH_FT(dt, T,
                   e = map_run(st, map_ptrs<T, 1, 1>{{(const T *)x}, {(T *)out}}, n,
                               relu2_fwd_f{}));
    return e;
}

extern "C" cudaError_t cuda_relu2_bwd(cudaStream_t st, void *dx, const void *dout, const void *x,
                                      dtype_t dt, int64_t n, bool set)
{
    if (n <= 0) return cudaGetLastError();
    cudaError_t e;
    if (set)
        CU_DISPATCH_FT(dt, T,
                       e = map_run(st, map_ptrs<T, 2, 1>{{(const T *)dout, (const T *)x},
                                                         {(T *)dx}},
                                   n, relu2_bwd_f<true>{}));
    else
        CU_DISPATCH_FT(dt, T,
                       e = map_run(st, map_ptrs<T, 3, 1>{{(const T *)dout, (const T *)x,
                                                          (const T *)dx},
                                                         {(T *)dx}},
                                   n, relu2_bwd_f<false>{}));
    return e;
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

/* The same with CU_VW(T) consecutive pairs a thread, 16-byte loads of both
 * halves, of cos and sin (half a multiple of the width, everything aligned:
 * the launcher checks). Same arithmetic, so the same bits. */
template <class T, int BWD>
__global__ void k_rope_v(T *out, const T *x, const float *cos, const float *sin,
                         const int32_t *pos, int64_t BT, int64_t H, int64_t D, int64_t P,
                         unsigned *flags)
{
    constexpr int W = CU_VW(T);
    const int64_t half = D / 2, hv = half / W;
    GS_LOOP(idx, BT * H * hv)
    {
        int64_t i = (idx % hv) * W, th = idx / hv, t = th / H;
        int64_t base = th * D;
        int32_t p = pos[t];
        float y1[W], y2[W];
        if (p < 0 || p >= P) {
            *(volatile unsigned *)&flags[CUDA_FLAG_ROPE_POS] = 1u;
#pragma unroll
            for (int k = 0; k < W; k++) y1[k] = y2[k] = NAN;
        } else {
            float x1[W], x2[W], c[W], s[W];
            cu_ldv(x, base + i, x1);
            cu_ldv(x, base + i + half, x2);
#pragma unroll
            for (int k = 0; k < W; k += 4) {
                cu_ldv(cos, (int64_t)p * half + i + k, c + k);
                cu_ldv(sin, (int64_t)p * half + i + k, s + k);
            }
            float o1[W], o2[W];
            if (BWD == 1) {
                cu_ldv(out, base + i, o1);
                cu_ldv(out, base + i + half, o2);
            }
#pragma unroll
            for (int k = 0; k < W; k++) {
                if (BWD == 2) {
                    y1[k] = x1[k] * c[k] + x2[k] * s[k];
                    y2[k] = x2[k] * c[k] - x1[k] * s[k];
                } else if (BWD == 1) {
                    y1[k] = o1[k] + (x1[k] * c[k] + x2[k] * s[k]);
                    y2[k] = o2[k] + (x2[k] * c[k] - x1[k] * s[k]);
                } else {
                    y1[k] = x1[k] * c[k] - x2[k] * s[k];
                    y2[k] = x2[k] * c[k] + x1[k] * s[k];
                }
            }
        }
        cu_stv(out, base + i, y1);
        cu_stv(out, base + i + half, y2);
    }
}

template <int BWD>
static void rope_launch(cudaStream_t st, void *out, const void *x, const float *cos,
                        const float *sin, const int32_t *pos, dtype_t dt, int64_t BT, int64_t H,
                        int64_t D, int64_t P, unsigned *flags)
{
    int64_t half = D / 2;
    if (cu_rows_vec(dt, half, out, x, cos, sin)) { /* and cos/sin rows of half f32 */
        int64_t n = BT * H * (half / cu_vw_of(dt));
        CU_DISPATCH_FT(dt, T,
                       k_rope_v<T, BWD><<<cu_blocks(n, 256), 256, 0, st>>>(
                           (T *)out, (const T *)x, cos, sin, pos, BT, H, D, P, flags));
    } else {
        int64_t n = BT * H * half;
        CU_DISPATCH_FT(dt, T,
                       k_rope<T, BWD><<<cu_blocks(n, 256), 256, 0, st>>>(
                           (T *)out, (const T *)x, cos, sin, pos, BT, H, D, P, flags));
    }
}

extern "C" cudaError_t cuda_rope(cudaStream_t st, void *out, const void *x, const float *cos,
                                 const float *sin, const int32_t *pos, dtype_t dt, int64_t BT,
                                 int64_t H, int64_t D, int64_t P, int bwd, unsigned *flags)
{
    if (BT * H * (D / 2) <= 0) return cudaGetLastError();
    if (bwd == 2) rope_launch<2>(st, out, x, cos, sin, pos, dt, BT, H, D, P, flags);
    else if (bwd == 1) rope_launch<1>(st, out, x, cos, sin, pos, dt, BT, H, D, P, flags);
    else rope_launch<0>(st, out, x, cos, sin, pos, dt, BT, H, D, P, flags);
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
    return 4 * cu_align256((size_t)N * 4) + cu_align256(embedding_sort_temp(N, V));
}

extern "C" cudaError_t cuda_embedding_bwd(cudaStream_t st, void *dtable, dtype_t dtable_dt,
                                          const void *dout, dtype_t dt, const int32_t *ids,
                                          int64_t N, int64_t V, int64_t C, int64_t vocab_start,
                                          void *scratch, size_t scratch_bytes)
{
    if (N <= 0 || C <= 0) return cudaGetLastError();
    if (N > INT32_MAX || V >= INT32_MAX) return cudaErrorInvalidValue;
    char *sp = (char *)scratch;
    size_t arr = cu_align256((size_t)N * 4);
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
