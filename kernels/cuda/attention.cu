/* Grouped-query scaled dot-product attention, forward and backward, fused
 * flash-style: keys and values stream through shared memory in tiles, the
 * softmax is computed online (running max and sum per query row), and no
 * Tq x Tk matrix ever exists in memory. The saved lse[B,Hq,Tq] is the
 * log-sum-exp of the scaled scores, max + log(sum), exactly what the CPU
 * twin (kernels/cpu/attention.c) saves, so either backward takes either
 * forward's lse.
 *
 * Masking: query row i (absolute position q_offset + i) sees key j when
 * j < Tk and, if causal, j <= q_offset + i. Every row sees key 0, and the
 * first key tile is always processed, so running maxima are finite from the
 * first tile on; rows past Tq in the last tile are computed without a mask
 * and never stored.
 *
 * Tensor-core kernels (bf16, further down) take the common head dims: the
 * forward (D, Dv) in (32,32) (64,64) (96,96) (128,128) (192,128), the
 * backward D == Dv <= 128; q, k, v, dout 16-byte aligned. Everything else,
 * and everything under BATON_CUDA_ATTN=simt, runs on:
 *
 * SIMT kernels (every dtype and head size; fp32 math on f32 or bf16 data):
 * 32-row query tiles x 32-key tiles, 8 warps, everything staged in shared
 * memory as f32.
 *  - forward: warp w owns query rows 4w..4w+3 of the tile; lane j computes
 *    the scores of key j, the warp reduces max and sum by shuffles, and
 *    each lane accumulates output columns lane, lane+32, ... in shared
 *    memory.
 *  - backward, as in kernels/cpu/attention.c: P = exp(S - lse),
 *    dV += P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO O)), dQ += scale dS K,
 *    dK += scale dS^T Q. One kernel owns a (batch, kv head, key tile) and
 *    walks every query head of its group and every query tile that can see
 *    it, accumulating dK and dV in shared memory; a second owns a (batch,
 *    head, query tile) and accumulates dQ. No atomics: the results repeat
 *    bit for bit. S and P are computed twice, the price of that.
 */
#include "kernels/cuda/common.cuh"

#include "base/log.h"

#include <stdlib.h>
#include <string.h>

enum { AT_BQ = 32, AT_BK = 32, AT_THREADS = 256 };

static cuda_attn_path_t attn_path_forced = CUDA_ATTN_AUTO;
static int attn_path_env = -1; /* -1 unread, else 0 (auto), 1 (simt), 2 (fast) from BATON_CUDA_ATTN */

extern "C" void cuda_attn_set_path(cuda_attn_path_t p) { attn_path_forced = p; }

extern "C" cuda_attn_path_t cuda_attn_get_path(void)
{
    if (attn_path_env < 0) {
        const char *e = getenv("BATON_CUDA_ATTN");
        attn_path_env = !e                    ? 0
                        : !strcmp(e, "simt")  ? 1
                        : !strcmp(e, "fast")  ? 2
                        : !strcmp(e, "cudnn") ? 3
                                              : 0;
        if (e && attn_path_env == 0 && strcmp(e, "precise") && strcmp(e, "default") && *e)
            log_warn("BATON_CUDA_ATTN=%s is none of precise, fast, cudnn, simt: the precise "
                     "kernels run", e);
    }
    return attn_path_env ? (cuda_attn_path_t)attn_path_env : attn_path_forced;
}

/* P and dS rounded to bf16 once: the fast path, and the cuDNN path's own
 * kernels for what cuDNN declines */
static bool attn_fast(void)
{
    cuda_attn_path_t p = cuda_attn_get_path();
    return p == CUDA_ATTN_FAST || p == CUDA_ATTN_CUDNN;
}

/* the keys query row i sees */
__device__ __forceinline__ int64_t at_limit(const kern_attn_shape_t &s, int64_t i)
{
    if (!s.causal) return s.Tk;
    int64_t lim = s.q_offset + i + 1;
    return lim < s.Tk ? lim : s.Tk;
}

/* element offsets of row t of head h in [B,T,H,D] tensors */
__device__ __forceinline__ int64_t at_row(int64_t b, int64_t t, int64_t T, int64_t h, int64_t H,
                                          int64_t D)
{
    return ((b * T + t) * H + h) * D;
}

/* rows [r0, r0+nr) of head h into smem[nr][ld] as f32 (zeros past T) */
template <class T>
__device__ void at_load(float *sm, int ld, const T *g, int64_t b, int64_t r0, int nr, int64_t Tn,
                        int64_t h, int64_t H, int64_t D)
{
    for (int idx = threadIdx.x; idx < nr * D; idx += blockDim.x) {
        int r = idx / (int)D, c = idx % (int)D;
        int64_t t = r0 + r;
        sm[r * ld + c] = t < Tn ? cu_ld(g, at_row(b, t, Tn, h, H, D) + c) : 0.0f;
    }
}

/* ---- SIMT forward --------------------------------------------------------------- */

static size_t at_fwd_smem(const kern_attn_shape_t *s)
{
    int64_t D = s->D, Dv = s->Dv;
    return sizeof(float) * (size_t)(AT_BQ * D + AT_BK * (D + 1) + AT_BK * Dv + AT_BQ * Dv +
                                    AT_BQ * AT_BK);
}

template <class T>
__global__ void __launch_bounds__(AT_THREADS)
    k_attn_fwd_simt(T *out, float *lse, const T *q, const T *k, const T *v, kern_attn_shape_t s)
{
    extern __shared__ float sm[];
    const int D = (int)s.D, Dv = (int)s.Dv;
    float *Qs = sm;                      /* [BQ][D] */
    float *Ks = Qs + AT_BQ * D;          /* [BK][D+1] */
    float *Vs = Ks + AT_BK * (D + 1);    /* [BK][Dv] */
    float *Os = Vs + AT_BK * Dv;         /* [BQ][Dv] */
    float *Ps = Os + AT_BQ * Dv;         /* [BQ][BK] */
    const int64_t b = blockIdx.z, h = blockIdx.y, q0 = (int64_t)blockIdx.x * AT_BQ;
    const int64_t hk = h / (s.Hq / s.Hkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    at_load(Qs, D, q, b, q0, AT_BQ, s.Tq, h, s.Hq, s.D);
    for (int idx = threadIdx.x; idx < AT_BQ * Dv; idx += blockDim.x) Os[idx] = 0.0f;

    float m[4], l[4];
    for (int rr = 0; rr < 4; rr++) m[rr] = -INFINITY, l[rr] = 0.0f;
    int64_t last = q0 + AT_BQ < s.Tq ? q0 + AT_BQ - 1 : s.Tq - 1;
    int64_t nk = at_limit(s, last);
    for (int64_t k0 = 0; k0 < nk; k0 += AT_BK) {
        __syncthreads(); /* previous tile's K, V no longer read */
        at_load(Ks, D + 1, k, b, k0, AT_BK, s.Tk, hk, s.Hkv, s.D);
        at_load(Vs, Dv, v, b, k0, AT_BK, s.Tk, hk, s.Hkv, s.Dv);
        __syncthreads();
        float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const float *kr = Ks + lane * (D + 1);
        for (int e = 0; e < D; e++) {
            float kv = kr[e];
            for (int rr = 0; rr < 4; rr++) sc[rr] += Qs[(warp * 4 + rr) * D + e] * kv;
        }
        const int64_t j = k0 + lane;
        for (int rr = 0; rr < 4; rr++) {
            const int r = warp * 4 + rr;
            const int64_t i = q0 + r;
            bool ok = j < s.Tk && (i >= s.Tq || j < at_limit(s, i));
            float x = ok ? s.scale * sc[rr] : -INFINITY;
            float mn = fmaxf(m[rr], cu_warp_max(x));
            float alpha = expf(m[rr] - mn);
            float p = expf(x - mn);
            l[rr] = l[rr] * alpha + cu_warp_sum(p);
            m[rr] = mn;
            Ps[r * AT_BK + lane] = p;
            __syncwarp();
            for (int c = lane; c < Dv; c += 32) {
                float o = Os[r * Dv + c] * alpha;
                for (int jj = 0; jj < AT_BK; jj++) o += Ps[r * AT_BK + jj] * Vs[jj * Dv + c];
                Os[r * Dv + c] = o;
            }
            __syncwarp();
        }
    }
    for (int rr = 0; rr < 4; rr++) {
        const int r = warp * 4 + rr;
        const int64_t i = q0 + r;
        if (i >= s.Tq) continue;
        float inv = 1.0f / l[rr];
        for (int c = lane; c < Dv; c += 32)
            cu_st(out, at_row(b, i, s.Tq, h, s.Hq, s.Dv) + c, Os[r * Dv + c] * inv);
        if (lane == 0) lse[(b * s.Hq + h) * s.Tq + i] = m[rr] + logf(l[rr]);
    }
}

/* ---- SIMT backward --------------------------------------------------------------- */

/* delta[b,h,i] = sum_c dout * out, one warp per row */
template <class T>
__global__ void k_attn_delta(float *delta, const T *dout, const T *out, kern_attn_shape_t s)
{
    const int64_t rows = s.B * s.Tq * s.Hq;
    const int lane = threadIdx.x & 31;
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < rows;
         r += (int64_t)gridDim.x * blockDim.x / 32) {
        /* r enumerates [B,Tq,Hq] rows in memory order */
        int64_t h = r % s.Hq, i = (r / s.Hq) % s.Tq, b = r / (s.Hq * s.Tq);
        float acc = 0.0f;
        for (int64_t c = lane; c < s.Dv; c += 32) acc += cu_ld(dout, r * s.Dv + c) * cu_ld(out, r * s.Dv + c);
        acc = cu_warp_sum(acc);
        if (lane == 0) delta[(b * s.Hq + h) * s.Tq + i] = acc;
    }
}

/* The same with 8 lanes a row and 16-byte loads (Dv a multiple of the
 * width, rows aligned): each lane sums its vectors in order, then the 8
 * lanes by xor shuffles, so the order is fixed by Dv. */
template <class T>
__global__ void k_attn_delta_v(float *delta, const T *dout, const T *out, kern_attn_shape_t s)
{
    constexpr int W = CU_VW(T);
    const int64_t rows = s.B * s.Tq * s.Hq, nv = s.Dv / W;
    const int sub = threadIdx.x & 7;
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 8; r < rows;
         r += (int64_t)gridDim.x * blockDim.x / 8) {
        int64_t h = r % s.Hq, i = (r / s.Hq) % s.Tq, b = r / (s.Hq * s.Tq);
        float acc = 0.0f;
        for (int64_t v = sub; v < nv; v += 8) {
            float d[W], o[W];
            cu_ldv(dout, r * s.Dv + v * W, d);
            cu_ldv(out, r * s.Dv + v * W, o);
#pragma unroll
            for (int k = 0; k < W; k++) acc += d[k] * o[k];
        }
        for (int off = 4; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (sub == 0) delta[(b * s.Hq + h) * s.Tq + i] = acc;
    }
}

/* Scores of the tile pair: thread (i = t/32 + 8 rr, j = t%32) writes
 * P[i][j] = exp(scale q_i.k_j - lse_i) (0 when masked) and
 * dS[i][j] = P (dO_i.v_j - delta_i). */
__device__ __forceinline__ void at_bwd_scores(float *Ps, float *dSs, const float *Qs, int ldq,
                                              const float *dOs, int ldo, const float *Ks, int ldk,
                                              const float *Vs, int ldv, const float *lse_s,
                                              const float *delta_s, int64_t q0, int64_t k0,
                                              const kern_attn_shape_t &s)
{
    const int j = threadIdx.x & 31, i0 = threadIdx.x >> 5;
    const int D = (int)s.D, Dv = (int)s.Dv;
    for (int rr = 0; rr < AT_BQ / 8; rr++) {
        const int i = i0 + 8 * rr;
        float dot = 0.0f, dp = 0.0f;
        for (int e = 0; e < D; e++) dot += Qs[i * ldq + e] * Ks[j * ldk + e];
        for (int c = 0; c < Dv; c++) dp += dOs[i * ldo + c] * Vs[j * ldv + c];
        const int64_t gi = q0 + i, gj = k0 + j;
        bool ok = gi < s.Tq && gj < s.Tk && gj < at_limit(s, gi);
        float p = ok ? expf(s.scale * dot - lse_s[i]) : 0.0f;
        Ps[i * (AT_BK + 1) + j] = p;
        dSs[i * (AT_BK + 1) + j] = p * (dp - delta_s[i]);
    }
}

static size_t at_bwd_kv_smem(const kern_attn_shape_t *s)
{
    int64_t D = s->D, Dv = s->Dv;
    return sizeof(float) * (size_t)(AT_BK * (D + 1) + AT_BK * (Dv + 1) + AT_BK * D + AT_BK * Dv +
                                    AT_BQ * (D + 1) + AT_BQ * (Dv + 1) +
                                    2 * AT_BQ * (AT_BK + 1) + 2 * AT_BQ);
}

template <class T>
__global__ void __launch_bounds__(AT_THREADS)
    k_attn_bwd_kv_simt(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v,
                       const float *lse, const float *delta, kern_attn_shape_t s, bool set)
{
    extern __shared__ float sm[];
    const int D = (int)s.D, Dv = (int)s.Dv;
    float *Ks = sm;                          /* [BK][D+1] */
    float *Vs = Ks + AT_BK * (D + 1);        /* [BK][Dv+1] */
    float *dKs = Vs + AT_BK * (Dv + 1);      /* [BK][D] */
    float *dVs = dKs + AT_BK * D;            /* [BK][Dv] */
    float *Qs = dVs + AT_BK * Dv;            /* [BQ][D+1] */
    float *dOs = Qs + AT_BQ * (D + 1);       /* [BQ][Dv+1] */
    float *Ps = dOs + AT_BQ * (Dv + 1);      /* [BQ][BK+1] */
    float *dSs = Ps + AT_BQ * (AT_BK + 1);   /* [BQ][BK+1] */
    float *lse_s = dSs + AT_BQ * (AT_BK + 1);
    float *delta_s = lse_s + AT_BQ;
    const int64_t b = blockIdx.z, hk = blockIdx.y, k0 = (int64_t)blockIdx.x * AT_BK;
    const int64_t group = s.Hq / s.Hkv;

    at_load(Ks, D + 1, k, b, k0, AT_BK, s.Tk, hk, s.Hkv, s.D);
    at_load(Vs, Dv + 1, v, b, k0, AT_BK, s.Tk, hk, s.Hkv, s.Dv);
    for (int idx = threadIdx.x; idx < AT_BK * D; idx += blockDim.x) dKs[idx] = 0.0f;
    for (int idx = threadIdx.x; idx < AT_BK * Dv; idx += blockDim.x) dVs[idx] = 0.0f;
    /* the first query row that sees key k0 */
    int64_t i_start = 0;
    if (s.causal && k0 > s.q_offset) i_start = (k0 - s.q_offset) / AT_BQ * AT_BQ;
    for (int64_t g = 0; g < group; g++) {
        const int64_t h = hk * group + g;
        for (int64_t q0 = i_start; q0 < s.Tq; q0 += AT_BQ) {
            __syncthreads();
            at_load(Qs, D + 1, q, b, q0, AT_BQ, s.Tq, h, s.Hq, s.D);
            at_load(dOs, Dv + 1, dout, b, q0, AT_BQ, s.Tq, h, s.Hq, s.Dv);
            for (int r = threadIdx.x; r < AT_BQ; r += blockDim.x) {
                int64_t i = q0 + r;
                lse_s[r] = i < s.Tq ? lse[(b * s.Hq + h) * s.Tq + i] : 0.0f;
                delta_s[r] = i < s.Tq ? delta[(b * s.Hq + h) * s.Tq + i] : 0.0f;
            }
            __syncthreads();
            at_bwd_scores(Ps, dSs, Qs, D + 1, dOs, Dv + 1, Ks, D + 1, Vs, Dv + 1, lse_s, delta_s,
                          q0, k0, s);
            __syncthreads();
            for (int idx = threadIdx.x; idx < AT_BK * Dv; idx += blockDim.x) {
                int jj = idx / Dv, c = idx % Dv;
                float acc = 0.0f;
                for (int i = 0; i < AT_BQ; i++) acc += Ps[i * (AT_BK + 1) + jj] * dOs[i * (Dv + 1) + c];
                dVs[idx] += acc;
            }
            for (int idx = threadIdx.x; idx < AT_BK * D; idx += blockDim.x) {
                int jj = idx / D, e = idx % D;
                float acc = 0.0f;
                for (int i = 0; i < AT_BQ; i++) acc += dSs[i * (AT_BK + 1) + jj] * Qs[i * (D + 1) + e];
                dKs[idx] += s.scale * acc;
            }
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < AT_BK * D; idx += blockDim.x) {
        int jj = idx / D, e = idx % D;
        int64_t t = k0 + jj;
        if (dk && t < s.Tk) {
            int64_t o = at_row(b, t, s.Tk, hk, s.Hkv, s.D) + e;
            cu_st(dk, o, set ? dKs[idx] : cu_ld(dk, o) + dKs[idx]);
        }
    }
    for (int idx = threadIdx.x; idx < AT_BK * Dv; idx += blockDim.x) {
        int jj = idx / Dv, c = idx % Dv;
        int64_t t = k0 + jj;
        if (dv && t < s.Tk) {
            int64_t o = at_row(b, t, s.Tk, hk, s.Hkv, s.Dv) + c;
            cu_st(dv, o, set ? dVs[idx] : cu_ld(dv, o) + dVs[idx]);
        }
    }
}

static size_t at_bwd_q_smem(const kern_attn_shape_t *s)
{
    int64_t D = s->D, Dv = s->Dv;
    return sizeof(float) * (size_t)(AT_BQ * (D + 1) + AT_BQ * (Dv + 1) + AT_BK * (D + 1) +
                                    AT_BK * (Dv + 1) + 2 * AT_BQ * (AT_BK + 1) + AT_BQ * D +
                                    2 * AT_BQ);
}

template <class T>
__global__ void __launch_bounds__(AT_THREADS)
    k_attn_bwd_q_simt(T *dq, const T *dout, const T *q, const T *k, const T *v, const float *lse,
                      const float *delta, kern_attn_shape_t s, bool set)
{
    extern __shared__ float sm[];
    const int D = (int)s.D, Dv = (int)s.Dv;
    float *Qs = sm;                          /* [BQ][D+1] */
    float *dOs = Qs + AT_BQ * (D + 1);       /* [BQ][Dv+1] */
    float *Ks = dOs + AT_BQ * (Dv + 1);      /* [BK][D+1] */
    float *Vs = Ks + AT_BK * (D + 1);        /* [BK][Dv+1] */
    float *Ps = Vs + AT_BK * (Dv + 1);       /* [BQ][BK+1] */
    float *dSs = Ps + AT_BQ * (AT_BK + 1);   /* [BQ][BK+1] */
    float *dQs = dSs + AT_BQ * (AT_BK + 1);  /* [BQ][D] */
    float *lse_s = dQs + AT_BQ * D;
    float *delta_s = lse_s + AT_BQ;
    const int64_t b = blockIdx.z, h = blockIdx.y, q0 = (int64_t)blockIdx.x * AT_BQ;
    const int64_t hk = h / (s.Hq / s.Hkv);

    at_load(Qs, D + 1, q, b, q0, AT_BQ, s.Tq, h, s.Hq, s.D);
    at_load(dOs, Dv + 1, dout, b, q0, AT_BQ, s.Tq, h, s.Hq, s.Dv);
    for (int idx = threadIdx.x; idx < AT_BQ * D; idx += blockDim.x) dQs[idx] = 0.0f;
    for (int r = threadIdx.x; r < AT_BQ; r += blockDim.x) {
        int64_t i = q0 + r;
        lse_s[r] = i < s.Tq ? lse[(b * s.Hq + h) * s.Tq + i] : 0.0f;
        delta_s[r] = i < s.Tq ? delta[(b * s.Hq + h) * s.Tq + i] : 0.0f;
    }
    int64_t last = q0 + AT_BQ < s.Tq ? q0 + AT_BQ - 1 : s.Tq - 1;
    int64_t nk = at_limit(s, last);
    for (int64_t k0 = 0; k0 < nk; k0 += AT_BK) {
        __syncthreads();
        at_load(Ks, D + 1, k, b, k0, AT_BK, s.Tk, hk, s.Hkv, s.D);
        at_load(Vs, Dv + 1, v, b, k0, AT_BK, s.Tk, hk, s.Hkv, s.Dv);
        __syncthreads();
        at_bwd_scores(Ps, dSs, Qs, D + 1, dOs, Dv + 1, Ks, D + 1, Vs, Dv + 1, lse_s, delta_s, q0,
                      k0, s);
        __syncthreads();
        for (int idx = threadIdx.x; idx < AT_BQ * D; idx += blockDim.x) {
            int i = idx / D, e = idx % D;
            float acc = 0.0f;
            for (int jj = 0; jj < AT_BK; jj++) acc += dSs[i * (AT_BK + 1) + jj] * Ks[jj * (D + 1) + e];
            dQs[idx] += s.scale * acc;
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < AT_BQ * D; idx += blockDim.x) {
        int i = idx / D, e = idx % D;
        int64_t t = q0 + i;
        if (t < s.Tq) {
            int64_t o = at_row(b, t, s.Tq, h, s.Hq, s.D) + e;
            cu_st(dq, o, set ? dQs[idx] : cu_ld(dq, o) + dQs[idx]);
        }
    }
}

/* ---- launchers ---------------------------------------------------------------------- */

/* Dynamic shared memory beyond the default 48 KB needs the kernel's opt-in. */
template <class K> static cudaError_t at_smem_optin(K kernel, size_t bytes)
{
    if (bytes <= 48 * 1024) return cudaSuccess;
    int dev = 0, optin = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess) return e;
    if (bytes > (size_t)optin) return cudaErrorInvalidValue; /* head dims too large */
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

static dim3 at_grid(int64_t tiles, int64_t H, int64_t B)
{
    return dim3((unsigned)tiles, (unsigned)H, (unsigned)B);
}

/* ---- tensor-core forward (bf16) -------------------------------------------------------- */

/* mma.sync m16n8k16 (bf16 in, f32 accumulate) and ldmatrix, in the
 * register layouts of the PTX ISA: for a warp lane, g = lane / 4 and
 * c = lane % 4; an A fragment (16x16, row-major) holds rows g and g+8 at
 * columns 2c, 2c+1 and 2c+8, 2c+9 in a0..a3; a B fragment (16x8,
 * column-major) holds rows 2c, 2c+1 (b0) and 2c+8, 2c+9 (b1) of column g;
 * the C fragment holds rows g (c0, c1) and g+8 (c2, c3) at columns 2c,
 * 2c+1. ldmatrix.x4 gives thread t row t/4, columns 2(t%4), 2(t%4)+1 of
 * each of four 8x8 matrices whose row addresses threads 8m..8m+7 supply
 * (with .trans: rows 2(t%4), 2(t%4)+1 of column t/4). A C fragment of a
 * 16 x 16k product is, two n-tiles at a time, the A fragment of the next
 * product over those 16k columns: the layout FlashAttention-2 relies on. */
__device__ __forceinline__ void tc_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void tc_ldsm4(uint32_t r[4], const void *smem_row)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void tc_ldsm4_t(uint32_t r[4], const void *smem_row)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* two f32 as bf16 in one register, lo in the low half */
__device__ __forceinline__ uint32_t tc_pack(float lo, float hi)
{
    return (uint32_t)cu_f32_to_bf16(lo) | (uint32_t)cu_f32_to_bf16(hi) << 16;
}

/* x0, x1 as bf16 pairs hi (rounded values) and lo (their rounding errors,
 * rounded): hi + lo carries ~16 of the 24 bits */
__device__ __forceinline__ void tc_split(float x0, float x1, uint32_t *hi, uint32_t *lo)
{
    uint16_t h0 = cu_f32_to_bf16(x0), h1 = cu_f32_to_bf16(x1);
    *hi = (uint32_t)h0 | (uint32_t)h1 << 16;
    *lo = tc_pack(x0 - cu_bf16_to_f32(h0), x1 - cu_bf16_to_f32(h1));
}

/* The A fragment of a 16 x 16 block from the C fragments x0, x1 of its two
 * 8-column halves: as hi + lo parts (SPLIT), else hi only (rounded once) */
template <bool SPLIT>
__device__ __forceinline__ void tc_split_a(uint32_t hi[4], uint32_t lo[4], const float x0[4],
                                           const float x1[4])
{
    if (SPLIT) {
        tc_split(x0[0], x0[1], &hi[0], &lo[0]);
        tc_split(x0[2], x0[3], &hi[1], &lo[1]);
        tc_split(x1[0], x1[1], &hi[2], &lo[2]);
        tc_split(x1[2], x1[3], &hi[3], &lo[3]);
    } else {
        hi[0] = tc_pack(x0[0], x0[1]), hi[1] = tc_pack(x0[2], x0[3]);
        hi[2] = tc_pack(x1[0], x1[1]), hi[3] = tc_pack(x1[2], x1[3]);
    }
}

enum { TC_BQ = 64, TC_BK = 64, TC_WARPS = 4, TC_PAD = 8 };

/* rows [r0, r0 + TC_BK) of head h (dim DIM) into smem rows of LD elements,
 * 16 bytes at a time, zeros past T */
template <int DIM, int ROWS = TC_BK>
__device__ __forceinline__ void tc_load(uint16_t *sm, const uint16_t *g, int64_t b, int64_t r0,
                                        int64_t T, int64_t h, int64_t H)
{
    constexpr int LD = DIM + TC_PAD, VEC = DIM / 8;
    for (int idx = threadIdx.x; idx < ROWS * VEC; idx += TC_WARPS * 32) {
        int r = idx / VEC, c8 = idx % VEC;
        int64_t t = r0 + r;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (t < T) val = *(const uint4 *)(g + ((b * T + t) * H + h) * DIM + c8 * 8);
        *(uint4 *)(sm + r * LD + c8 * 8) = val;
    }
}

/* tc_load through cp.async (16 bytes a copy, zero-filled past T): the copies
 * land while the block computes; tc_async_commit closes a group of them and
 * tc_async_wait<N> waits until at most N groups are still in flight */
template <int DIM, int ROWS>
__device__ __forceinline__ void tc_load_async(uint16_t *sm, const uint16_t *g, int64_t b,
                                              int64_t r0, int64_t T, int64_t h, int64_t H)
{
    constexpr int LD = DIM + TC_PAD, VEC = DIM / 8;
    for (int idx = threadIdx.x; idx < ROWS * VEC; idx += TC_WARPS * 32) {
        int r = idx / VEC, c8 = idx % VEC;
        int64_t t = r0 + r;
        const uint16_t *src = t < T ? g + ((b * T + t) * H + h) * DIM + c8 * 8 : g;
        uint32_t dst = (uint32_t)__cvta_generic_to_shared(sm + r * LD + c8 * 8);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                     "r"(t < T ? 16 : 0)
                     : "memory");
    }
}

__device__ __forceinline__ void tc_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void tc_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* One block: 64 query rows of one (batch, head), 4 warps of 16 rows; the
 * scores, probabilities and output of a warp's rows stay in registers
 * (FlashAttention-2's layout): S = Q K^T by mma, the online softmax on the
 * C fragments in base 2 (scores pre-multiplied by log2(e)), P re-packed
 * from C to A fragments without leaving registers, O += P V by mma with V
 * read transposed by ldmatrix. P enters the second product as two bf16
 * parts (rounded value and rounding error), so the output is about as
 * accurate as an fp32 P would make it (rounding P to bf16 alone costs
 * about four times the error of the output's own rounding); max, sums, O
 * and lse stay fp32. The split doubles the P V products' tensor-core work,
 * not their shared-memory traffic. */
template <int D, int DV, bool SPLIT>
__global__ void __launch_bounds__(TC_WARPS * 32)
    k_attn_fwd_tc(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                  const uint16_t *v, kern_attn_shape_t s)
{
    constexpr int LDQ = D + TC_PAD, LDV = DV + TC_PAD;
    constexpr int KS = D / 16, NT = TC_BK / 8, OT = DV / 8;
    extern __shared__ __align__(16) uint16_t tc_sm[];
    uint16_t *Qs = tc_sm, *Ks = Qs + TC_BQ * LDQ, *Vs = Ks + TC_BK * LDQ;
    const int64_t b = blockIdx.z, h = blockIdx.y, q0 = (int64_t)blockIdx.x * TC_BQ;
    const int64_t hk = h / (s.Hq / s.Hkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int mi = lane >> 3, mr = lane & 7; /* ldmatrix: which matrix, which row */

    tc_load<D>(Qs, q, b, q0, s.Tq, h, s.Hq);
    __syncthreads();
    uint32_t qf[KS][4];
    #pragma unroll
    for (int kk = 0; kk < KS; kk++)
        tc_ldsm4(qf[kk], Qs + (warp * 16 + mr + (mi & 1) * 8) * LDQ + kk * 16 + (mi >> 1) * 8);

    float o[OT][4];
    #pragma unroll
    for (int t = 0; t < OT; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f; /* rows g and g+8 */
    const float sl2 = s.scale * 1.4426950408889634f;
    const int64_t i0 = q0 + warp * 16 + g, i1 = i0 + 8;
    const int64_t lim0 = i0 < s.Tq ? at_limit(s, i0) : s.Tk;
    const int64_t lim1 = i1 < s.Tq ? at_limit(s, i1) : s.Tk;
    int64_t last = q0 + TC_BQ < s.Tq ? q0 + TC_BQ - 1 : s.Tq - 1;
    int64_t nk = at_limit(s, last);

    for (int64_t k0 = 0; k0 < nk; k0 += TC_BK) {
        __syncthreads();
        tc_load<D>(Ks, k, b, k0, s.Tk, hk, s.Hkv);
        tc_load<DV>(Vs, v, b, k0, s.Tk, hk, s.Hkv);
        __syncthreads();
        float sc[NT][4];
        #pragma unroll
        for (int t = 0; t < NT; t++) sc[t][0] = sc[t][1] = sc[t][2] = sc[t][3] = 0.0f;
        #pragma unroll
        for (int kk = 0; kk < KS; kk++)
            #pragma unroll
            for (int n2 = 0; n2 < NT / 2; n2++) {
                uint32_t kb[4];
                tc_ldsm4(kb, Ks + (n2 * 16 + mr + (mi >> 1) * 8) * LDQ + kk * 16 + (mi & 1) * 8);
                tc_mma(sc[2 * n2], qf[kk], kb[0], kb[1]);
                tc_mma(sc[2 * n2 + 1], qf[kk], kb[2], kb[3]);
            }
        float mx0 = m0, mx1 = m1;
        #pragma unroll
        for (int t = 0; t < NT; t++)
            #pragma unroll
            for (int e = 0; e < 2; e++) {
                int64_t j = k0 + t * 8 + 2 * c + e;
                sc[t][e] = j < lim0 ? sc[t][e] * sl2 : -INFINITY;
                sc[t][2 + e] = j < lim1 ? sc[t][2 + e] * sl2 : -INFINITY;
                mx0 = fmaxf(mx0, sc[t][e]);
                mx1 = fmaxf(mx1, sc[t][2 + e]);
            }
        #pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
        }
        float a0 = exp2f(m0 - mx0), a1 = exp2f(m1 - mx1); /* 0 on the first tile */
        m0 = mx0, m1 = mx1;
        float ps0 = 0.0f, ps1 = 0.0f;
        #pragma unroll
        for (int t = 0; t < NT; t++)
            #pragma unroll
            for (int e = 0; e < 2; e++) {
                sc[t][e] = exp2f(sc[t][e] - mx0);
                sc[t][2 + e] = exp2f(sc[t][2 + e] - mx1);
                ps0 += sc[t][e];
                ps1 += sc[t][2 + e];
            }
        l0 = l0 * a0 + ps0;
        l1 = l1 * a1 + ps1;
        #pragma unroll
        for (int t = 0; t < OT; t++) o[t][0] *= a0, o[t][1] *= a0, o[t][2] *= a1, o[t][3] *= a1;
        #pragma unroll
        for (int kt = 0; kt < TC_BK / 16; kt++) {
            /* P as bf16 hi + lo parts: P V in two products keeps P to ~16 bits
             * (SPLIT), else P rounded to bf16 once */
            uint32_t ph[4], pl[4];
            tc_split_a<SPLIT>(ph, pl, sc[2 * kt], sc[2 * kt + 1]);
            #pragma unroll
            for (int np = 0; np < OT / 2; np++) {
                uint32_t vb[4];
                tc_ldsm4_t(vb, Vs + (kt * 16 + mr + (mi & 1) * 8) * LDV + np * 16 + (mi >> 1) * 8);
                tc_mma(o[2 * np], ph, vb[0], vb[1]);
                tc_mma(o[2 * np + 1], ph, vb[2], vb[3]);
                if (SPLIT) {
                    tc_mma(o[2 * np], pl, vb[0], vb[1]);
                    tc_mma(o[2 * np + 1], pl, vb[2], vb[3]);
                }
            }
        }
    }
    for (int off = 1; off < 4; off <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
    #pragma unroll
    for (int t = 0; t < OT; t++) {
        int col = t * 8 + 2 * c;
        if (i0 < s.Tq)
            *(uint32_t *)(out + ((b * s.Tq + i0) * s.Hq + h) * DV + col) =
                tc_pack(o[t][0] * inv0, o[t][1] * inv0);
        if (i1 < s.Tq)
            *(uint32_t *)(out + ((b * s.Tq + i1) * s.Hq + h) * DV + col) =
                tc_pack(o[t][2] * inv1, o[t][3] * inv1);
    }
    if (c == 0) {
        const float ln2 = 0.6931471805599453f;
        if (i0 < s.Tq) lse[(b * s.Hq + h) * s.Tq + i0] = m0 * ln2 + logf(l0);
        if (i1 < s.Tq) lse[(b * s.Hq + h) * s.Tq + i1] = m1 * ln2 + logf(l1);
    }
}

/* ---- tensor-core backward (bf16) ----------------------------------------------------- */

/* The same split of the work as the SIMT backward, on tensor cores, for
 * head dims up to 128 (register budget): the dK/dV kernel owns 64 keys (16
 * per warp) and walks the query heads of its group and the 32-query tiles
 * that see them; the dQ kernel owns 64 queries (16 per warp) and walks the
 * 64-key tiles. Per warp everything is an m16n8k16 product whose C fragment
 * feeds the next one:
 *   dK/dV: S^T = K Q^T, P^T = exp2(S^T log2e scale - lse2), dP^T = V dO^T,
 *          dS^T = P^T (dP^T - delta); dV += P^T dO, dK += dS^T Q;
 *   dQ:    S = Q K^T, P, dP = dO V^T, dS = P (dP - delta); dQ += dS K.
 * P and dS enter their products as bf16 hi + lo parts (tc_split). K, V, Q
 * and dO stay in shared memory and are read by ldmatrix (.trans where a
 * product needs the transpose). dQ, dK, dV accumulate in fp32 registers
 * and are added once into the bf16 gradients. */
enum { TC_BQ2 = 32 }; /* query rows per step of the dK/dV kernel */

/* the A fragment of rows [r, r+16) x cols [c, c+16) of a row-major smem tile */
__device__ __forceinline__ void tc_lda(uint32_t a[4], const uint16_t *sm, int ld, int r, int c,
                                       int mi, int mr)
{
    tc_ldsm4(a, sm + (r + mr + (mi & 1) * 8) * ld + c + (mi >> 1) * 8);
}

/* B fragments of two n-tiles [n, n+16) over k [c, c+16), B[k][n] = sm[n][k] */
__device__ __forceinline__ void tc_ldb(uint32_t b[4], const uint16_t *sm, int ld, int n, int c,
                                       int mi, int mr)
{
    tc_ldsm4(b, sm + (n + mr + (mi >> 1) * 8) * ld + c + (mi & 1) * 8);
}

/* B fragments of two n-tiles [n, n+16) over k [r, r+16), B[k][n] = sm[k][n] */
__device__ __forceinline__ void tc_ldbt(uint32_t b[4], const uint16_t *sm, int ld, int r, int n,
                                        int mi, int mr)
{
    tc_ldsm4_t(b, sm + (r + mr + (mi & 1) * 8) * ld + n + (mi >> 1) * 8);
}

/* acc[NO][4] += X[16][16*KT] B, X given as C fragments x[2*KT][4] (split in
 * hi + lo), B read by tc_ldbt from rows [0, 16*KT) of sm */
template <int KT, int NO, bool SPLIT>
__device__ __forceinline__ void tc_mma_cb(float acc[NO][4], float x[2 * KT][4], const uint16_t *sm,
                                          int ld, int mi, int mr)
{
#pragma unroll
    for (int kt = 0; kt < KT; kt++) {
        uint32_t xh[4], xl[4];
        tc_split_a<SPLIT>(xh, xl, x[2 * kt], x[2 * kt + 1]);
#pragma unroll
        for (int np = 0; np < NO / 2; np++) {
            uint32_t bb[4];
            tc_ldbt(bb, sm, ld, kt * 16, np * 16, mi, mr);
            tc_mma(acc[2 * np], xh, bb[0], bb[1]);
            tc_mma(acc[2 * np + 1], xh, bb[2], bb[3]);
            if (SPLIT) {
                tc_mma(acc[2 * np], xl, bb[0], bb[1]);
                tc_mma(acc[2 * np + 1], xl, bb[2], bb[3]);
            }
        }
    }
}

/* c[NT][4] = A[16 rows of sa from r][DIM] B, B[k][n] = sb[n][k] for n in [0, 8 NT) */
template <int DIM, int NT>
__device__ __forceinline__ void tc_mma_ab(float c[NT][4], const uint16_t *sa, int lda, int r,
                                          const uint16_t *sb, int ldb, int mi, int mr)
{
#pragma unroll
    for (int t = 0; t < NT; t++) c[t][0] = c[t][1] = c[t][2] = c[t][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < DIM / 16; kk++) {
        uint32_t a[4];
        tc_lda(a, sa, lda, r, kk * 16, mi, mr);
#pragma unroll
        for (int n2 = 0; n2 < NT / 2; n2++) {
            uint32_t bb[4];
            tc_ldb(bb, sb, ldb, n2 * 16, kk * 16, mi, mr);
            tc_mma(c[2 * n2], a, bb[0], bb[1]);
            tc_mma(c[2 * n2 + 1], a, bb[2], bb[3]);
        }
    }
}

/* g[row][col..col+1] += (x0, x1) on bf16 pairs; = when set (g not read) */
__device__ __forceinline__ void tc_add2(uint16_t *g, float x0, float x1, bool set)
{
    if (set) {
        *(uint32_t *)g = tc_pack(x0, x1);
        return;
    }
    uint32_t w = *(uint32_t *)g;
    *(uint32_t *)g = tc_pack(cu_bf16_to_f32((uint16_t)(w & 0xffffu)) + x0,
                             cu_bf16_to_f32((uint16_t)(w >> 16)) + x1);
}

/* With DQ the dK/dV kernel also gives dQ (the fast path): each step's dS^T
 * goes to shared memory as bf16, the block multiplies it by its 64 keys
 * (dQ[32 q][D] += dS K, warp w taking query rows 16 (w & 1) and half the
 * columns) and adds the products into the f32 dq_acc by float2 atomics, as
 * FlashAttention-2 does; S and P are computed once. The atomics' order
 * varies, so dQ's last bits vary from run to run on this path. */
enum { TC_LDS = TC_BQ2 + TC_PAD };

template <int D, int DV, bool SPLIT, bool DQ>
__global__ void __launch_bounds__(TC_WARPS * 32)
    k_attn_bwd_kv_tc(uint16_t *dk, uint16_t *dv, float *dq_acc, const uint16_t *dout,
                     const uint16_t *q, const uint16_t *k, const uint16_t *v, const float *lse,
                     const float *delta, kern_attn_shape_t s, bool set)
{
    constexpr int LDK = D + TC_PAD, LDV = DV + TC_PAD, NQ = TC_BQ2 / 8;
    extern __shared__ __align__(16) uint16_t tc_sm[];
    /* Q and dO tiles twice: the next step's copies land in one pair while
     * the block works on the other */
    uint16_t *Ks = tc_sm, *Vs = Ks + TC_BK * LDK, *Qb = Vs + TC_BK * LDV, *dOb = Qb + 2 * TC_BQ2 * LDK;
    uint16_t *dSs = dOb + 2 * TC_BQ2 * LDV; /* [TC_BK][TC_LDS] when DQ */
    float *lse_s = (float *)(dSs + (DQ ? TC_BK * TC_LDS : 0)), *delta_s = lse_s + TC_BQ2;
    const int64_t b = blockIdx.z, hk = blockIdx.y, k0 = (int64_t)blockIdx.x * TC_BK;
    const int64_t group = s.Hq / s.Hkv;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int mi = lane >> 3, mr = lane & 7;
    const float sl2 = s.scale * 1.4426950408889634f;
    const int64_t j0 = k0 + warp * 16 + g, j1 = j0 + 8; /* this thread's key rows */

    tc_load<D>(Ks, k, b, k0, s.Tk, hk, s.Hkv);
    tc_load<DV>(Vs, v, b, k0, s.Tk, hk, s.Hkv);
    float dka[D / 8][4], dva[DV / 8][4];
#pragma unroll
    for (int t = 0; t < D / 8; t++) dka[t][0] = dka[t][1] = dka[t][2] = dka[t][3] = 0.0f;
#pragma unroll
    for (int t = 0; t < DV / 8; t++) dva[t][0] = dva[t][1] = dva[t][2] = dva[t][3] = 0.0f;
    int64_t i_start = 0;
    if (s.causal && k0 > s.q_offset) i_start = (k0 - s.q_offset) / TC_BQ2 * TC_BQ2;
    /* the steps: the group's query heads in turn, each over its query tiles
     * from i_start; step n's Q and dO tiles are copied during step n - 1 */
    const int64_t nq = i_start < s.Tq ? (s.Tq - i_start + TC_BQ2 - 1) / TC_BQ2 : 0;
    const int64_t steps = group * nq;
    if (steps > 0) {
        tc_load_async<D, TC_BQ2>(Qb, q, b, i_start, s.Tq, hk * group, s.Hq);
        tc_load_async<DV, TC_BQ2>(dOb, dout, b, i_start, s.Tq, hk * group, s.Hq);
    }
    tc_async_commit();
    for (int64_t step = 0; step < steps; step++) {
        const int64_t h = hk * group + step / nq, q0 = i_start + step % nq * TC_BQ2;
        uint16_t *Qs = Qb + (step & 1) * TC_BQ2 * LDK, *dOs = dOb + (step & 1) * TC_BQ2 * LDV;
        __syncthreads(); /* every warp is done with the other pair and with lse_s, dSs */
        if (step + 1 < steps) {
            const int64_t n = step + 1, hn = hk * group + n / nq;
            const int64_t qn = i_start + n % nq * TC_BQ2;
            tc_load_async<D, TC_BQ2>(Qb + (n & 1) * TC_BQ2 * LDK, q, b, qn, s.Tq, hn, s.Hq);
            tc_load_async<DV, TC_BQ2>(dOb + (n & 1) * TC_BQ2 * LDV, dout, b, qn, s.Tq, hn, s.Hq);
        }
        tc_async_commit();
        for (int r = threadIdx.x; r < TC_BQ2; r += TC_WARPS * 32) {
            int64_t i = q0 + r;
            lse_s[r] = i < s.Tq ? lse[(b * s.Hq + h) * s.Tq + i] * 1.4426950408889634f : 0.0f;
            delta_s[r] = i < s.Tq ? delta[(b * s.Hq + h) * s.Tq + i] : 0.0f;
        }
        tc_async_wait<1>(); /* this step's pair is in (the next one may still fly) */
        __syncthreads();
        float pt[NQ][4], dpt[NQ][4];
        tc_mma_ab<D, NQ>(pt, Ks, LDK, warp * 16, Qs, LDK, mi, mr);    /* S^T */
        tc_mma_ab<DV, NQ>(dpt, Vs, LDV, warp * 16, dOs, LDV, mi, mr); /* dP^T */
#pragma unroll
        for (int t = 0; t < NQ; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int col = t * 8 + 2 * c + (e & 1);
                int64_t i = q0 + col, j = e < 2 ? j0 : j1;
                bool ok = i < s.Tq && j < s.Tk && j < at_limit(s, i);
                float p = ok ? exp2f(pt[t][e] * sl2 - lse_s[col]) : 0.0f;
                pt[t][e] = p;
                dpt[t][e] = p * (dpt[t][e] - delta_s[col]);
            }
        tc_mma_cb<TC_BQ2 / 16, DV / 8, SPLIT>(dva, pt, dOs, LDV, mi, mr); /* dV += P^T dO */
        tc_mma_cb<TC_BQ2 / 16, D / 8, SPLIT>(dka, dpt, Qs, LDK, mi, mr);  /* dK += dS^T Q */
        if constexpr (DQ) {
#pragma unroll
            for (int t = 0; t < NQ; t++) {
                int col = t * 8 + 2 * c;
                *(uint32_t *)(dSs + (warp * 16 + g) * TC_LDS + col) = tc_pack(dpt[t][0], dpt[t][1]);
                *(uint32_t *)(dSs + (warp * 16 + g + 8) * TC_LDS + col) = tc_pack(dpt[t][2], dpt[t][3]);
            }
            __syncthreads();
            const int mt = warp & 1, n0 = (warp >> 1) * (D / 2);
            float acc[D / 16][4];
#pragma unroll
            for (int t = 0; t < D / 16; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < TC_BK / 16; kk++) {
                uint32_t a[4]; /* dS rows mt*16.., keys kk*16..: dS^T read transposed */
                tc_ldsm4_t(a, dSs + (kk * 16 + (mi >> 1) * 8 + mr) * TC_LDS + mt * 16 + (mi & 1) * 8);
#pragma unroll
                for (int np = 0; np < D / 32; np++) {
                    uint32_t bb[4];
                    tc_ldbt(bb, Ks, LDK, kk * 16, n0 + np * 16, mi, mr);
                    tc_mma(acc[2 * np], a, bb[0], bb[1]);
                    tc_mma(acc[2 * np + 1], a, bb[2], bb[3]);
                }
            }
            const int64_t qi0 = q0 + mt * 16 + g, qi1 = qi0 + 8;
#pragma unroll
            for (int t = 0; t < D / 16; t++) {
                int col = n0 + t * 8 + 2 * c;
                if (qi0 < s.Tq)
                    atomicAdd((float2 *)(dq_acc + ((b * s.Tq + qi0) * s.Hq + h) * D + col),
                              make_float2(s.scale * acc[t][0], s.scale * acc[t][1]));
                if (qi1 < s.Tq)
                    atomicAdd((float2 *)(dq_acc + ((b * s.Tq + qi1) * s.Hq + h) * D + col),
                              make_float2(s.scale * acc[t][2], s.scale * acc[t][3]));
            }
        }
    }
#pragma unroll
    for (int t = 0; t < D / 8; t++) {
        int col = t * 8 + 2 * c;
        if (dk && j0 < s.Tk)
            tc_add2(dk + ((b * s.Tk + j0) * s.Hkv + hk) * D + col, s.scale * dka[t][0], s.scale * dka[t][1], set);
        if (dk && j1 < s.Tk)
            tc_add2(dk + ((b * s.Tk + j1) * s.Hkv + hk) * D + col, s.scale * dka[t][2], s.scale * dka[t][3], set);
    }
#pragma unroll
    for (int t = 0; t < DV / 8; t++) {
        int col = t * 8 + 2 * c;
        if (dv && j0 < s.Tk) tc_add2(dv + ((b * s.Tk + j0) * s.Hkv + hk) * DV + col, dva[t][0], dva[t][1], set);
        if (dv && j1 < s.Tk) tc_add2(dv + ((b * s.Tk + j1) * s.Hkv + hk) * DV + col, dva[t][2], dva[t][3], set);
    }
}

template <int D, int DV, bool SPLIT>
__global__ void __launch_bounds__(TC_WARPS * 32)
    k_attn_bwd_q_tc(uint16_t *dq, const uint16_t *dout, const uint16_t *q, const uint16_t *k,
                    const uint16_t *v, const float *lse, const float *delta, kern_attn_shape_t s,
                    bool set)
{
    constexpr int LDK = D + TC_PAD, LDV = DV + TC_PAD, NT = TC_BK / 8;
    extern __shared__ __align__(16) uint16_t tc_sm[];
    uint16_t *Qs = tc_sm, *dOs = Qs + TC_BQ * LDK, *Ks = dOs + TC_BQ * LDV, *Vs = Ks + TC_BK * LDK;
    const int64_t b = blockIdx.z, h = blockIdx.y, q0 = (int64_t)blockIdx.x * TC_BQ;
    const int64_t hk = h / (s.Hq / s.Hkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int mi = lane >> 3, mr = lane & 7;
    const float sl2 = s.scale * 1.4426950408889634f;
    const int64_t i0 = q0 + warp * 16 + g, i1 = i0 + 8;
    const int64_t lim0 = i0 < s.Tq ? at_limit(s, i0) : 0, lim1 = i1 < s.Tq ? at_limit(s, i1) : 0;
    const float l20 = i0 < s.Tq ? lse[(b * s.Hq + h) * s.Tq + i0] * 1.4426950408889634f : 0.0f;
    const float l21 = i1 < s.Tq ? lse[(b * s.Hq + h) * s.Tq + i1] * 1.4426950408889634f : 0.0f;
    const float de0 = i0 < s.Tq ? delta[(b * s.Hq + h) * s.Tq + i0] : 0.0f;
    const float de1 = i1 < s.Tq ? delta[(b * s.Hq + h) * s.Tq + i1] : 0.0f;

    tc_load<D>(Qs, q, b, q0, s.Tq, h, s.Hq);
    tc_load<DV>(dOs, dout, b, q0, s.Tq, h, s.Hq);
    float dqa[D / 8][4];
#pragma unroll
    for (int t = 0; t < D / 8; t++) dqa[t][0] = dqa[t][1] = dqa[t][2] = dqa[t][3] = 0.0f;
    int64_t last = q0 + TC_BQ < s.Tq ? q0 + TC_BQ - 1 : s.Tq - 1;
    int64_t nk = at_limit(s, last);
    for (int64_t k0 = 0; k0 < nk; k0 += TC_BK) {
        __syncthreads();
        tc_load<D>(Ks, k, b, k0, s.Tk, hk, s.Hkv);
        tc_load<DV>(Vs, v, b, k0, s.Tk, hk, s.Hkv);
        __syncthreads();
        float ps[NT][4], ds[NT][4];
        tc_mma_ab<D, NT>(ps, Qs, LDK, warp * 16, Ks, LDK, mi, mr);   /* S */
        tc_mma_ab<DV, NT>(ds, dOs, LDV, warp * 16, Vs, LDV, mi, mr); /* dP */
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int64_t j = k0 + t * 8 + 2 * c + (e & 1);
                bool hi = e >= 2;
                float p = j < (hi ? lim1 : lim0) ? exp2f(ps[t][e] * sl2 - (hi ? l21 : l20)) : 0.0f;
                ds[t][e] = p * (ds[t][e] - (hi ? de1 : de0));
            }
        tc_mma_cb<TC_BK / 16, D / 8, SPLIT>(dqa, ds, Ks, LDK, mi, mr); /* dQ += dS K */
    }
#pragma unroll
    for (int t = 0; t < D / 8; t++) {
        int col = t * 8 + 2 * c;
        if (i0 < s.Tq)
            tc_add2(dq + ((b * s.Tq + i0) * s.Hq + h) * D + col, s.scale * dqa[t][0], s.scale * dqa[t][1], set);
        if (i1 < s.Tq)
            tc_add2(dq + ((b * s.Tq + i1) * s.Hq + h) * D + col, s.scale * dqa[t][2], s.scale * dqa[t][3], set);
    }
}

/* The (D, Dv) pairs the tensor-core kernel is built for. */
#define TC_PAIRS(X) X(64, 64) X(128, 128) X(192, 128) X(32, 32) X(96, 96)

static bool tc_pair_built(int64_t D, int64_t Dv)
{
#define TC_HAS(d, dv) if (D == d && Dv == dv) return true;
    TC_PAIRS(TC_HAS)
#undef TC_HAS
    return false;
}

extern "C" bool cuda_attn_uses_tc(const kern_attn_shape_t *sh, dtype_t dt)
{
    return dt == DT_BF16 && cuda_attn_get_path() != CUDA_ATTN_SIMT && tc_pair_built(sh->D, sh->Dv);
}

template <int D, int DV, bool SPLIT>
static cudaError_t tc_launch_s(cudaStream_t st, void *out, float *lse, const void *q,
                               const void *k, const void *v, const kern_attn_shape_t *sh)
{
    size_t smem = sizeof(uint16_t) * (size_t)((TC_BQ + TC_BK) * (D + TC_PAD) + TC_BK * (DV + TC_PAD));
    cudaError_t e = at_smem_optin(k_attn_fwd_tc<D, DV, SPLIT>, smem);
    if (e != cudaSuccess) return e;
    dim3 grid((unsigned)((sh->Tq + TC_BQ - 1) / TC_BQ), (unsigned)sh->Hq, (unsigned)sh->B);
    k_attn_fwd_tc<D, DV, SPLIT><<<grid, TC_WARPS * 32, smem, st>>>(
        (uint16_t *)out, lse, (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, *sh);
    return cudaGetLastError();
}

template <int D, int DV>
static cudaError_t tc_launch(cudaStream_t st, void *out, float *lse, const void *q, const void *k,
                             const void *v, const kern_attn_shape_t *sh)
{
    if (attn_fast())
        return tc_launch_s<D, DV, false>(st, out, lse, q, k, v, sh);
    return tc_launch_s<D, DV, true>(st, out, lse, q, k, v, sh);
}

static cudaError_t cuda_attn_fwd_tc(cudaStream_t st, void *out, float *lse, const void *q,
                                    const void *k, const void *v, const kern_attn_shape_t *sh)
{
#define TC_GO(d, dv)                                                                               \
    if (sh->D == d && sh->Dv == dv) return tc_launch<d, dv>(st, out, lse, q, k, v, sh);
    TC_PAIRS(TC_GO)
#undef TC_GO
    return cudaErrorNotSupported;
}

/* 16-byte vector loads and 4-byte stores need aligned rows */
static bool tc_aligned(const void *q, const void *k, const void *v, const void *out)
{
    return !(((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) & 15) && !((uintptr_t)out & 3);
}

/* The backward's pairs (its fp32 accumulators must fit in registers). */
#define TC_BWD_PAIRS(X) X(32, 32) X(64, 64) X(96, 96) X(128, 128)

static bool tc_bwd_takes(const kern_attn_shape_t *sh, dtype_t dt)
{
    if (dt != DT_BF16 || cuda_attn_get_path() == CUDA_ATTN_SIMT) return false;
#define TC_HAS(d, dv) if (sh->D == d && sh->Dv == dv) return true;
    TC_BWD_PAIRS(TC_HAS)
#undef TC_HAS
    return false;
}

/* dq (+)= dq_acc, bf16 from f32, 8 at a time where aligned */
__global__ void k_dq_finish(uint16_t *dq, const float *acc, int64_t n, bool set)
{
    const bool vec = !(((uintptr_t)dq | (uintptr_t)acc) & 15);
    for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < n;
         i += (int64_t)gridDim.x * blockDim.x * 8) {
        if (vec && i + 8 <= n) {
            float a[8], o[8];
            cu_ldv(acc, i, a);
            cu_ldv(acc, i + 4, a + 4);
            if (!set) cu_ldv((const cu_bf16_t *)dq, i, o);
#pragma unroll
            for (int j = 0; j < 8; j++) o[j] = set ? a[j] : o[j] + a[j];
            cu_stv((cu_bf16_t *)dq, i, o);
        } else {
            for (int64_t j = i; j < n && j < i + 8; j++)
                dq[j] = cu_f32_to_bf16(set ? acc[j] : cu_bf16_to_f32(dq[j]) + acc[j]);
        }
    }
}

/* the fast path's f32 dQ accumulator, after delta in the scratch */
static size_t dq_acc_offset(const kern_attn_shape_t *sh)
{
    return cu_align256((size_t)(sh->B * sh->Hq * sh->Tq) * sizeof(float));
}

template <int D, int DV, bool SPLIT>
static cudaError_t tc_bwd_launch_s(cudaStream_t st, void *dq, void *dk, void *dv,
                                   const void *dout, const void *q, const void *k, const void *v,
                                   const float *lse, const float *delta,
                                   const kern_attn_shape_t *sh, bool set)
{
    const size_t LDK = D + TC_PAD, LDV = DV + TC_PAD;
    cudaError_t e = cudaSuccess;
    /* the fast path folds dQ into the dK/dV kernel when both are wanted */
    const bool fused = !SPLIT && dq && (dk || dv);
    if (dk || dv) {
        /* K, V, two Q and two dO tiles (bf16), lse and delta (f32) */
        size_t smem = 2 * (TC_BK * LDK + TC_BK * LDV + 2 * TC_BQ2 * LDK + 2 * TC_BQ2 * LDV) + 8 * TC_BQ2;
        dim3 grid((unsigned)((sh->Tk + TC_BK - 1) / TC_BK), (unsigned)sh->Hkv, (unsigned)sh->B);
        if (fused) {
            float *acc = (float *)((char *)(void *)delta + dq_acc_offset(sh));
            int64_t n = sh->B * sh->Tq * sh->Hq * D;
            smem += 2 * TC_BK * TC_LDS;
            e = at_smem_optin(k_attn_bwd_kv_tc<D, DV, false, true>, smem);
            if (e == cudaSuccess) e = cudaMemsetAsync(acc, 0, (size_t)n * sizeof(float), st);
            if (e != cudaSuccess) return e;
            k_attn_bwd_kv_tc<D, DV, false, true><<<grid, TC_WARPS * 32, smem, st>>>(
                (uint16_t *)dk, (uint16_t *)dv, acc, (const uint16_t *)dout, (const uint16_t *)q,
                (const uint16_t *)k, (const uint16_t *)v, lse, delta, *sh, set);
            k_dq_finish<<<cu_blocks((n + 7) / 8, 256), 256, 0, st>>>((uint16_t *)dq, acc, n, set);
            return cudaGetLastError();
        }
        e = at_smem_optin(k_attn_bwd_kv_tc<D, DV, SPLIT, false>, smem);
        if (e != cudaSuccess) return e;
        k_attn_bwd_kv_tc<D, DV, SPLIT, false><<<grid, TC_WARPS * 32, smem, st>>>(
            (uint16_t *)dk, (uint16_t *)dv, nullptr, (const uint16_t *)dout, (const uint16_t *)q,
            (const uint16_t *)k, (const uint16_t *)v, lse, delta, *sh, set);
    }
    if (dq) {
        size_t smem = 2 * (TC_BQ * LDK + TC_BQ * LDV + TC_BK * LDK + TC_BK * LDV);
        e = at_smem_optin(k_attn_bwd_q_tc<D, DV, SPLIT>, smem);
        if (e != cudaSuccess) return e;
        dim3 grid((unsigned)((sh->Tq + TC_BQ - 1) / TC_BQ), (unsigned)sh->Hq, (unsigned)sh->B);
        k_attn_bwd_q_tc<D, DV, SPLIT><<<grid, TC_WARPS * 32, smem, st>>>(
            (uint16_t *)dq, (const uint16_t *)dout, (const uint16_t *)q, (const uint16_t *)k,
            (const uint16_t *)v, lse, delta, *sh, set);
    }
    return cudaGetLastError();
}

template <int D, int DV>
static cudaError_t tc_bwd_launch(cudaStream_t st, void *dq, void *dk, void *dv, const void *dout,
                                 const void *q, const void *k, const void *v, const float *lse,
                                 const float *delta, const kern_attn_shape_t *sh, bool set)
{
    if (attn_fast())
        return tc_bwd_launch_s<D, DV, false>(st, dq, dk, dv, dout, q, k, v, lse, delta, sh, set);
    return tc_bwd_launch_s<D, DV, true>(st, dq, dk, dv, dout, q, k, v, lse, delta, sh, set);
}

static cudaError_t tc_bwd(cudaStream_t st, void *dq, void *dk, void *dv, const void *dout,
                          const void *q, const void *k, const void *v, const float *lse,
                          const float *delta, const kern_attn_shape_t *sh, bool set)
{
#define TC_GO(d, dv_)                                                                              \
    if (sh->D == d && sh->Dv == dv_)                                                               \
        return tc_bwd_launch<d, dv_>(st, dq, dk, dv, dout, q, k, v, lse, delta, sh, set);
    TC_BWD_PAIRS(TC_GO)
#undef TC_GO
    return cudaErrorNotSupported;
}

extern "C" cudaError_t cuda_attn_fwd(cudaStream_t st, void *out, float *lse, const void *q,
                                     const void *k, const void *v, dtype_t dt,
                                     const kern_attn_shape_t *sh)
{
    if (sh->B * sh->Hq * sh->Tq == 0) return cudaGetLastError();
    if (sh->B > 65535 || sh->Hq > 65535) return cudaErrorInvalidValue;
    if (cuda_attn_uses_tc(sh, dt) && tc_aligned(q, k, v, out))
        return cuda_attn_fwd_tc(st, out, lse, q, k, v, sh);
    size_t smem = at_fwd_smem(sh);
    dim3 grid = at_grid((sh->Tq + AT_BQ - 1) / AT_BQ, sh->Hq, sh->B);
    cudaError_t e;
    CU_DISPATCH_FT(dt, T, {
        e = at_smem_optin(k_attn_fwd_simt<T>, smem);
        if (e == cudaSuccess)
            k_attn_fwd_simt<T><<<grid, AT_THREADS, smem, st>>>((T *)out, lse, (const T *)q,
                                                               (const T *)k, (const T *)v, *sh);
    });
    return e != cudaSuccess ? e : cudaGetLastError();
}

extern "C" size_t cuda_attn_bwd_scratch(const kern_attn_shape_t *sh)
{
    size_t n = (size_t)(sh->B * sh->Hq * sh->Tq) * sizeof(float);
    if (attn_fast()) /* and the fused backward's dQ accumulator */
        n = dq_acc_offset(sh) + (size_t)(sh->B * sh->Tq * sh->Hq * sh->D) * sizeof(float);
    return n;
}

extern "C" cudaError_t cuda_attn_bwd(cudaStream_t st, void *dq, void *dk, void *dv,
                                     const void *dout, const void *q, const void *k,
                                     const void *v, const void *out, const float *lse,
                                     dtype_t dt, const kern_attn_shape_t *sh, void *scratch,
                                     bool set)
{
    if ((!dq && !dk && !dv) || sh->B * sh->Hq * sh->Tq == 0) return cudaGetLastError();
    if (sh->B > 65535 || sh->Hq > 65535) return cudaErrorInvalidValue;
    float *delta = (float *)scratch;
    size_t kv_smem = at_bwd_kv_smem(sh), q_smem = at_bwd_q_smem(sh);
    cudaError_t e = cudaSuccess;
    CU_DISPATCH_FT(dt, T, {
        int64_t rows = sh->B * sh->Tq * sh->Hq;
        if (cu_rows_vec(dt, sh->Dv, dout, out))
            k_attn_delta_v<T><<<cu_blocks(rows, 32), 256, 0, st>>>(delta, (const T *)dout,
                                                                   (const T *)out, *sh);
        else
            k_attn_delta<T><<<cu_blocks(rows, 8), 256, 0, st>>>(delta, (const T *)dout,
                                                                (const T *)out, *sh);
        if (tc_bwd_takes(sh, dt) && tc_aligned(q, k, v, dout) &&
            !(((uintptr_t)dq | (uintptr_t)dk | (uintptr_t)dv) & 3)) {
            e = tc_bwd(st, dq, dk, dv, dout, q, k, v, lse, delta, sh, set);
            return e != cudaSuccess ? e : cudaGetLastError();
        }
        if (dk || dv) {
            e = at_smem_optin(k_attn_bwd_kv_simt<T>, kv_smem);
            if (e == cudaSuccess)
                k_attn_bwd_kv_simt<T>
                    <<<at_grid((sh->Tk + AT_BK - 1) / AT_BK, sh->Hkv, sh->B), AT_THREADS, kv_smem,
                       st>>>((T *)dk, (T *)dv, (const T *)dout, (const T *)q, (const T *)k,
                             (const T *)v, lse, delta, *sh, set);
        }
        if (dq && e == cudaSuccess) {
            e = at_smem_optin(k_attn_bwd_q_simt<T>, q_smem);
            if (e == cudaSuccess)
                k_attn_bwd_q_simt<T>
                    <<<at_grid((sh->Tq + AT_BQ - 1) / AT_BQ, sh->Hq, sh->B), AT_THREADS, q_smem,
                       st>>>((T *)dq, (const T *)dout, (const T *)q, (const T *)k, (const T *)v,
                             lse, delta, *sh, set);
        }
    });
    return e != cudaSuccess ? e : cudaGetLastError();
}

/* ---- kern_attention_merge (context parallelism's ring) -------------------- */

/* The weights of cpu_attn_merge_weights (kernels/cpu/attention.c). */
__device__ __forceinline__ void at_merge_weights(float a, float b, float *wa, float *wb, float *l)
{
    float m = fmaxf(a, b);
    if (m == -INFINITY) {
        *wa = *wb = 0.f;
        *l = -INFINITY;
        return;
    }
    float ea = expf(a - m), eb = expf(b - m), sum = ea + eb;
    *wa = ea / sum;
    *wb = eb / sum;
    *l = m + logf(sum);
}

template <class T>
__global__ void k_attn_merge_out(T *out, const float *lse, const T *part_out,
                                 const float *part_lse, int64_t B, int64_t Tq, int64_t Hq,
                                 int64_t Dv)
{
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < B * Tq * Hq * Dv;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = e / Dv, h = row % Hq, bt = row / Hq, i = bt % Tq, b = bt / Tq;
        int64_t li = (b * Hq + h) * Tq + i;
        float wa, wb, l;
        at_merge_weights(lse[li], part_lse[li], &wa, &wb, &l);
        cu_st(out, e, wa * cu_ld(out, e) + wb * cu_ld(part_out, e));
    }
}

__global__ void k_attn_merge_lse(float *lse, const float *part_lse, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float wa, wb, l;
        at_merge_weights(lse[i], part_lse[i], &wa, &wb, &l);
        lse[i] = l;
    }
}

extern "C" cudaError_t cuda_attn_merge(cudaStream_t st, void *out, float *lse, const void *part_out,
                                       const float *part_lse, dtype_t dt, int64_t B, int64_t Tq,
                                       int64_t Hq, int64_t Dv)
{
    int64_t n = B * Tq * Hq * Dv;
    if (n == 0) return cudaGetLastError();
    CU_DISPATCH_FT(dt, T,
                   k_attn_merge_out<T><<<cu_blocks(n, 256), 256, 0, st>>>(
                       (T *)out, lse, (const T *)part_out, part_lse, B, Tq, Hq, Dv));
    k_attn_merge_lse<<<cu_blocks(B * Hq * Tq, 256), 256, 0, st>>>(lse, part_lse, B * Hq * Tq);
    return cudaGetLastError();
}
