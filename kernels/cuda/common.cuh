/* Device helpers shared by the kernels of kernels/cuda/<layer>.cu: element loads
 * and stores of the float dtypes (with base/tensor.c's rounding, bit for
 * bit), block reductions, launch sizes. */
#ifndef BT_KERNELS_CUDA_COMMON_CUH
#define BT_KERNELS_CUDA_COMMON_CUH

#include "kernels/cuda/cuda.h"

#include <cuda_runtime.h>
#include <stdint.h>

/* ---- scalar conversions (the same bits as base/tensor.c) ------------------ */

__device__ __forceinline__ float cu_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ uint16_t cu_f32_to_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    /* NaN keeps its sign and top payload bits and is forced quiet */
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even; carries into the exponent */
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float cu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (man << 13));
    if (exp != 0) return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
    if (man == 0) return __uint_as_float(sign);
    float v = (float)man * 0x1p-24f; /* subnormal half, exact in f32 */
    return sign ? -v : v;
}

__device__ __forceinline__ uint16_t cu_f32_to_f16(float f)
{
    uint32_t u = __float_as_uint(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x1ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        if (a < 0x33000000u) return sign;
        uint32_t exp = a >> 23, man = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - exp;
        uint32_t q = man >> shift, rem = man & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

/* ---- typed element access ------------------------------------------------- */

/* The storage types of the compute dtypes: float (f32) and cu_bf16_t (bf16
 * bits). Kernels are templates over these; ld/st convert to and from f32. */
struct cu_bf16_t {
    uint16_t bits;
};

__device__ __forceinline__ float cu_ld(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float cu_ld(const cu_bf16_t *p, int64_t i) { return cu_bf16_to_f32(p[i].bits); }
__device__ __forceinline__ void cu_st(float *p, int64_t i, float x) { p[i] = x; }
__device__ __forceinline__ void cu_st(cu_bf16_t *p, int64_t i, float x) { p[i].bits = cu_f32_to_bf16(x); }

/* ---- 16-byte vectors --------------------------------------------------------- */

/* CU_VW<T> elements make 16 bytes: 4 f32 or 8 bf16. cu_ldv / cu_stv move one
 * such vector at element offset i of p (p + i 16-byte aligned: the caller
 * checks with cu_aligned16) and convert to and from f32 with the scalar
 * rounding above, so a vector kernel gives the bits of its scalar twin. */
template <class T> struct cu_vw;
template <> struct cu_vw<float> {
    static constexpr int N = 4;
};
template <> struct cu_vw<cu_bf16_t> {
    static constexpr int N = 8;
};
#define CU_VW(T) (cu_vw<T>::N)

__device__ __forceinline__ void cu_ldv(const float *p, int64_t i, float *x)
{
    float4 v = *(const float4 *)(p + i);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
}

__device__ __forceinline__ void cu_stv(float *p, int64_t i, const float *x)
{
    *(float4 *)(p + i) = make_float4(x[0], x[1], x[2], x[3]);
}

__device__ __forceinline__ void cu_ldv(const cu_bf16_t *p, int64_t i, float *x)
{
    uint4 v = *(const uint4 *)(p + i);
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        x[2 * k] = __uint_as_float(w[k] << 16);
        x[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
}

__device__ __forceinline__ void cu_stv(cu_bf16_t *p, int64_t i, const float *x)
{
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
        w[k] = (uint32_t)cu_f32_to_bf16(x[2 * k]) | ((uint32_t)cu_f32_to_bf16(x[2 * k + 1]) << 16);
    *(uint4 *)(p + i) = make_uint4(w[0], w[1], w[2], w[3]);
}

/* Every non-NULL pointer 16-byte aligned. */
static inline bool cu_aligned16(const void *a, const void *b = nullptr, const void *c = nullptr,
                                const void *d = nullptr, const void *e = nullptr)
{
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d | (uintptr_t)e) & 15u) == 0;
}

/* CU_VW of a compute dtype, on the host */
static inline int cu_vw_of(dtype_t dt) { return dt == DT_BF16 ? 8 : 4; }

/* Rows of `width` elements of dtype dt starting at these pointers can go by
 * 16-byte vectors: the width a multiple of the vector, every pointer aligned
 * (then every row start is aligned too). */
static inline bool cu_rows_vec(dtype_t dt, int64_t width, const void *a, const void *b = nullptr,
                               const void *c = nullptr, const void *d = nullptr)
{
    return width % cu_vw_of(dt) == 0 && cu_aligned16(a, b, c, d);
}

/* for (n = this warp's first row; n < N; n += the grid's warps), ROW_WARPS
 * warps a block: the row loop of the one-warp-a-row kernels */
#define CU_WARP_ROWS(n, N, ROW_WARPS)                                                              \
    for (int64_t n = (int64_t)blockIdx.x * (ROW_WARPS) + (threadIdx.x >> 5); n < (N);             \
         n += (int64_t)gridDim.x * (ROW_WARPS))

/* Any float dtype as a double / f32, by dtype tag (reductions, conversions). */
__device__ __forceinline__ float cu_ld_dt(const void *p, dtype_t dt, int64_t i)
{
    switch (dt) {
    case DT_F32: return ((const float *)p)[i];
    case DT_F64: return (float)((const double *)p)[i];
    case DT_BF16: return cu_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return cu_f16_to_f32(((const uint16_t *)p)[i]);
    }
}

__device__ __forceinline__ double cu_ld_dt_f64(const void *p, dtype_t dt, int64_t i)
{
    return dt == DT_F64 ? ((const double *)p)[i] : (double)cu_ld_dt(p, dt, i);
}

/* ---- reductions ----------------------------------------------------------- */

__device__ __forceinline__ float cu_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float cu_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every
 * thread gets the result. `red` is __shared__ float[32]. The order is fixed
 * by the block size, so results repeat bit for bit. */
__device__ __forceinline__ float cu_block_sum(float v, float *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cu_warp_sum(v);
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return cu_warp_sum(v);
}

__device__ __forceinline__ float cu_block_max(float v, float *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cu_warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : -INFINITY;
    return cu_warp_max(v);
}

/* ---- launch helpers ------------------------------------------------------- */

/* Blocks for n elements at `per_block` each, capped (kernels grid-stride). */
static inline unsigned cu_blocks(int64_t n, int per_block, unsigned cap = 65535u * 8u)
{
    int64_t b = (n + per_block - 1) / per_block;
    if (b < 1) b = 1;
    return b > (int64_t)cap ? cap : (unsigned)b;
}

static inline size_t cu_align256(size_t n) { return (n + 255) / 256 * 256; }

/* Dispatches a kernel template on the compute dtype (f32 or bf16). */
#define CU_DISPATCH_FT(dt, T, ...)                                                                 \
    do {                                                                                           \
        if ((dt) == DT_BF16) {                                                                     \
            typedef cu_bf16_t T;                                                                   \
            __VA_ARGS__;                                                                           \
        } else {                                                                                   \
            typedef float T;                                                                       \
            __VA_ARGS__;                                                                           \
        }                                                                                          \
    } while (0)


/* ---- column sums in a fixed order ----------------------------------------- */

/* dst[c] += sum over rows n of f(n, c), for [N, C] data: threads of a
 * (32 x 8) block sum rows n = g*8 + ty + k*8G of row group g in fp32, the
 * block adds its 8 lanes in order into partial[g][c], and a second kernel
 * adds the G partials in group order. G depends on N only, so results repeat
 * bit for bit. */
static inline int cu_colsum_groups(int64_t N)
{
    int64_t g = (N + 63) / 64;
    return g < 1 ? 1 : g > 256 ? 256 : (int)g;
}

template <class F>
__global__ void cu_colsum_partial(float *partial, F f, int64_t N, int64_t C, int G)
{
    __shared__ float red[8][33];
    int64_t c = (int64_t)blockIdx.x * 32 + threadIdx.x;
    float acc = 0.0f;
    if (c < C)
        for (int64_t n = (int64_t)blockIdx.y * 8 + threadIdx.y; n < N; n += 8 * (int64_t)G)
            acc += f(n, c);
    red[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float s = 0.0f;
        for (int i = 0; i < 8; i++) s += red[i][threadIdx.x];
        partial[(int64_t)blockIdx.y * C + c] = s;
    }
}

template <class TD>
__global__ void cu_colsum_finish(TD *dst, const float *partial, int64_t C, int G)
{
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C;
         c += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int g = 0; g < G; g++) s += partial[(int64_t)g * C + c];
        cu_st(dst, c, cu_ld(dst, c) + s);
    }
}

/* The second stage: dst (f32 or bf16) += the G partials of each column. */
static inline void cu_colsum_finish_run(cudaStream_t st, void *dst, dtype_t dst_dt,
                                        const float *partial, int64_t C, int G)
{
    unsigned nb = cu_blocks(C, 256);
    if (dst_dt == DT_BF16)
        cu_colsum_finish<<<nb, 256, 0, st>>>((cu_bf16_t *)dst, partial, C, G);
    else
        cu_colsum_finish<<<nb, 256, 0, st>>>((float *)dst, partial, C, G);
}

/* Both stages; scratch holds cu_colsum_groups(N) * C floats. */
template <class F>
static cudaError_t cu_colsum_run(cudaStream_t st, void *dst, dtype_t dst_dt, F f, int64_t N,
                                 int64_t C, void *scratch)
{
    if (C == 0) return cudaGetLastError();
    int G = cu_colsum_groups(N);
    float *partial = (float *)scratch;
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)G), block(32, 8);
    cu_colsum_partial<<<grid, block, 0, st>>>(partial, f, N, C, G);
    cu_colsum_finish_run(st, dst, dst_dt, partial, C, G);
    return cudaGetLastError();
}

static inline size_t cu_colsum_bytes(int64_t N, int64_t C)
{
    return (size_t)cu_colsum_groups(N) * (size_t)(C > 0 ? C : 1) * sizeof(float);
}

#endif
