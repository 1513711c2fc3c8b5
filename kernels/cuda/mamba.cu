/* The Mamba2 mixer's sequence ops on CUDA (kernels/kernels.h, "Mamba2
 * mixer"), written for speed: f32 data and f32 sums (the CPU twins,
 * kernels/mamba_seq.h, sum in double and are the float64-checked
 * reference the device check compares with). bf16 operands reach these
 * kernels as f32 copies staged by the launchers (backend.c, mb_stage).
 *
 * The scan is the chunked SSD decomposition, every product a block-level
 * 64x64 tile product over shared memory (mb_mm below) whose operand
 * loaders apply the decay weights, masks and bounds on the fly, so nothing
 * of the [L,L] decay matrix is materialised except where the backward needs
 * it per head:
 *   forward   cs = in-chunk cumsum of dt A;  CB = C B^T per (row, chunk,
 *             group); local chunk end states X^T (w B); the recurrence over
 *             chunks per state element (gives the chunk start states the
 *             backward reads); y = (CB o decay o dt) x + e^cs C S0^T + D x.
 *   backward  the same cs and CB; Q = sum_l e^cs_l dy_l C_l^T per chunk and
 *             the reverse recurrence for the end-state gradients; du, the
 *             per-head dy.x products under the decay mask, their group
 *             sums, dC and dB as tile products over the group's heads
 *             (K = heads x head dim), and per-token terms for dt, A_log, D.
 * Every sum has a fixed order (no atomics): results repeat bit for bit.
 * Conv, dt and the gated norm are elementwise or warp/column reductions. */
#include "kernels/cuda/common.cuh"
#include "kernels/mamba_seq.h"

#define MB_LOOP(i, n)                                                                              \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

/* ---- column sums: block (32, MB_CR) threads over 32 columns, fixed order ---------- */

#define MB_CR 16

/* outs[k][col] += (ADD) or = sum_r f(r, col, k) for k < nk <= KM, r in
 * [r0, r1), over rows in order within each thread's stride, then the MB_CR
 * partials in order; a NULL outs[k] is skipped */
template <int KM, bool ADD = true, class F>
__device__ void mb_colsum(int64_t r0, int64_t r1, int64_t cols, int nk, F f, float *const *outs)
{
    __shared__ float red[MB_CR][32][KM];
    int cx = threadIdx.x, ry = threadIdx.y;
    int64_t col = (int64_t)blockIdx.x * 32 + cx;
    float acc[KM];
#pragma unroll
    for (int k = 0; k < KM; k++) acc[k] = 0.f;
    if (col < cols)
        for (int64_t r = r0 + ry; r < r1; r += MB_CR)
#pragma unroll
            for (int k = 0; k < KM; k++)
                if (k < nk) acc[k] += f(r, col, k);
#pragma unroll
    for (int k = 0; k < KM; k++) red[ry][cx][k] = acc[k];
    __syncthreads();
    if (ry == 0 && col < cols)
        for (int k = 0; k < nk; k++) {
            float s = 0.f;
            for (int j = 0; j < MB_CR; j++) s += red[j][cx][k];
            if (outs[k]) {
                if (ADD) outs[k][col] += s;
                else outs[k][col] = s;
            }
        }
}

/* ---- causal conv1d ------------------------------------------------------------- */

__device__ __forceinline__ float mb_actf(float v, kern_act_t act)
{
    return act == KERN_ACT_SILU ? v / (1.f + expf(-v)) : v;
}

__device__ __forceinline__ float mb_act_gradf(float v, kern_act_t act)
{
    if (act != KERN_ACT_SILU) return 1.f;
    float sg = 1.f / (1.f + expf(-v));
    return sg * (1.f + v * (1.f - sg));
}

__device__ __forceinline__ float mb_conv_inf(const mb_conv_t &a, const float *state, int64_t b,
                                             int64_t j, int64_t c)
{
    if (j >= 0) return a.x[(b * a.T + j) * a.C + c];
    if (!state) return 0.f;
    return state[(b * (a.K - 1) + (a.K - 1) + j) * a.C + c];
}

__device__ __forceinline__ float mb_conv_pref(const mb_conv_t &a, const float *state, int64_t b,
                                              int64_t t, int64_t c)
{
    float v = a.bias ? a.bias[c] : 0.f;
    for (int64_t k = 0; k < a.K; k++)
        v += a.w[c * a.K + k] * mb_conv_inf(a, state, b, t - a.K + 1 + k, c);
    return v;
}

__global__ void k_conv_fwd(mb_conv_t a)
{
    MB_LOOP(i, a.B * a.T * a.C)
    {
        int64_t c = i % a.C, t = (i / a.C) % a.T, b = i / (a.C * a.T);
        a.out[i] = mb_actf(mb_conv_pref(a, a.state, b, t, c), a.act);
    }
}

/* the decode state: the last K-1 inputs of the history, per (row, channel) */
__global__ void k_conv_state(mb_conv_t a)
{
    MB_LOOP(i, a.B * a.C)
    {
        int64_t b = i / a.C, c = i % a.C;
        float hist[MB_CONV_KMAX];
        for (int64_t j = 0; j < a.K - 1; j++) hist[j] = mb_conv_inf(a, a.state, b, a.T - (a.K - 1) + j, c);
        for (int64_t j = 0; j < a.K - 1; j++) a.state[(b * (a.K - 1) + j) * a.C + c] = hist[j];
    }
}

__global__ void k_conv_dpre(mb_conv_t a, float *dpre)
{
    MB_LOOP(i, a.B * a.T * a.C)
    {
        int64_t c = i % a.C, t = (i / a.C) % a.T, b = i / (a.C * a.T);
        dpre[i] = a.dout[i] * mb_act_gradf(mb_conv_pref(a, NULL, b, t, c), a.act);
    }
}

/* input j feeds outputs j + K-1-k */
__global__ void k_conv_dx(mb_conv_t a, const float *dpre)
{
    MB_LOOP(i, a.B * a.T * a.C)
    {
        int64_t c = i % a.C, j = (i / a.C) % a.T, b = i / (a.C * a.T);
        float g = 0.f;
        for (int64_t k = 0; k < a.K; k++) {
            int64_t t = j + a.K - 1 - k;
            if (t < a.T) g += a.w[c * a.K + k] * dpre[(b * a.T + t) * a.C + c];
        }
        a.dx[i] += g;
    }
}

/* The weight and bias gradients over every (row, token), split over
 * gridDim.y row ranges: part[y][k][c] = the range's sum for dw[c,k] (k < K)
 * and dbias[c] (k = K), k in [k0, k0 + MB_CONV_KB); k_conv_dw_fin sums the
 * ranges in order. */
#define MB_CONV_KB 8
__global__ void k_conv_dw(mb_conv_t a, const float *dpre, float *part, int k0)
{
    float *outs[MB_CONV_KB];
    int64_t T = a.T, C = a.C, K = a.K, rows = a.B * T, y = blockIdx.y;
    int64_t per = (rows + gridDim.y - 1) / gridDim.y;
    int nk = (int)(K + 1 - k0 < MB_CONV_KB ? K + 1 - k0 : MB_CONV_KB);
    for (int k = 0; k < MB_CONV_KB; k++) outs[k] = k < nk ? part + (y * (K + 1) + k0 + k) * C : NULL;
    int64_t r0 = y * per, r1 = r0 + per < rows ? r0 + per : rows;
    mb_colsum<MB_CONV_KB, false>(r0, r1, C, nk,
                                 [&](int64_t r, int64_t c, int k) {
                                     float d = dpre[r * C + c];
                                     int64_t kk = k0 + k;
                                     if (kk == K) return d;
                                     int64_t t = r % T, j = t - K + 1 + kk;
                                     return j >= 0 ? d * a.x[(r - t + j) * C + c] : 0.f;
                                 },
                                 outs);
}

__global__ void k_conv_dw_fin(mb_conv_t a, const float *part, int64_t splits)
{
    MB_LOOP(i, (a.K + 1) * a.C)
    {
        int64_t k = i / a.C, c = i % a.C;
        float v = 0.f;
        for (int64_t y = 0; y < splits; y++) v += part[(y * (a.K + 1) + k) * a.C + c];
        if (k < a.K && a.dw) a.dw[c * a.K + k] += v;
        if (k == a.K && a.dbias) a.dbias[c] += v;
    }
}

#define MB_CONV_SPLITS 64
static int64_t mb_conv_splits(const mb_conv_t *a)
{
    int64_t s = a->B * a->T / 256;
    return s < 1 ? 1 : s > MB_CONV_SPLITS ? MB_CONV_SPLITS : s;
}

extern "C" size_t cuda_conv1d_bwd_scratch(const mb_conv_t *a)
{
    return (size_t)(a->B * a->T * a->C + mb_conv_splits(a) * (a->K + 1) * a->C) * sizeof(float);
}

extern "C" cudaError_t cuda_conv1d_causal_fwd(cudaStream_t st, const mb_conv_t *a)
{
    if (a->K > MB_CONV_KMAX) return cudaErrorInvalidValue;
    int64_t n = a->B * a->T * a->C;
    if (n > 0) k_conv_fwd<<<cu_blocks(n, 256), 256, 0, st>>>(*a);
    if (a->state && a->K > 1 && a->B * a->C > 0)
        k_conv_state<<<cu_blocks(a->B * a->C, 128), 128, 0, st>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_conv1d_causal_bwd(cudaStream_t st, const mb_conv_t *a, void *scratch)
{
    int64_t n = a->B * a->T * a->C;
    if (n == 0) return cudaGetLastError();
    if (a->K > MB_CONV_KMAX) return cudaErrorInvalidValue;
    float *dpre = (float *)scratch, *part = dpre + n;
    k_conv_dpre<<<cu_blocks(n, 256), 256, 0, st>>>(*a, dpre);
    if (a->dx) k_conv_dx<<<cu_blocks(n, 256), 256, 0, st>>>(*a, dpre);
    if (a->dw || a->dbias) {
        int64_t sp = mb_conv_splits(a);
        dim3 blk(32, MB_CR), grid((unsigned)((a->C + 31) / 32), (unsigned)sp);
        for (int k0 = 0; k0 < a->K + 1; k0 += MB_CONV_KB)
            k_conv_dw<<<grid, blk, 0, st>>>(*a, dpre, part, k0);
        k_conv_dw_fin<<<cu_blocks((a->K + 1) * a->C, 256), 256, 0, st>>>(*a, part, sp);
    }
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
    float *outs[1] = {dbias};
    mb_colsum<1>(0, N, H, 1,
                 [&](int64_t r, int64_t h, int) {
                     return mb_dt_bwd_one(ddt[r * H + h], raw[r * H + h], bias[h], lo, hi);
                 },
                 outs);
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
        k_dt_dbias<<<dim3((unsigned)((H + 31) / 32)), dim3(32, MB_CR), 0, st>>>(dbias, ddt, raw,
                                                                               bias, N, H, lo, hi);
    return cudaGetLastError();
}

/* ---- tile products ------------------------------------------------------------------ */

#define MB_TS 64  /* tile rows and columns */
#define MB_TK 16  /* the reduction dimension per shared-memory step */
#define MB_NT 256 /* threads per block: 16 x 16, each a 4 x 4 part of the tile */

struct mb_smem {
    float a[MB_TK][MB_TS + 4];
    float b[MB_TK][MB_TS + 4];
    float t[MB_TS][MB_TS + 1]; /* an epilogue's tile, for row and column sums */
};

/* acc (this thread's rows ty*4+i, columns tx*4+j of the tile) += sum over
 * k in [k0, k1) of fa(i, k) fb(k, j), i and j the tile's local row and
 * column; AK / BK: the loaders' memory runs along k (else along i / j), which
 * picks the thread-to-element mapping that reads consecutive addresses. */
template <bool AK, bool BK, class FA, class FB>
__device__ void mb_mm(float (&acc)[4][4], mb_smem &sm, int64_t k0, int64_t k1, FA fa, FB fb)
{
    int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    for (int64_t kb = k0; kb < k1; kb += MB_TK) {
        for (int e = tid; e < MB_TK * MB_TS; e += MB_NT) {
            int i = AK ? e / MB_TK : e % MB_TS, k = AK ? e % MB_TK : e / MB_TS;
            sm.a[k][i] = kb + k < k1 ? fa(i, kb + k) : 0.f;
        }
        for (int e = tid; e < MB_TK * MB_TS; e += MB_NT) {
            int j = BK ? e / MB_TK : e % MB_TS, k = BK ? e % MB_TK : e / MB_TS;
            sm.b[k][j] = kb + k < k1 ? fb(kb + k, j) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < MB_TK; k++) {
            float4 av = *(const float4 *)&sm.a[k][ty * 4], bv = *(const float4 *)&sm.b[k][tx * 4];
            float ar[4] = {av.x, av.y, av.z, av.w}, br[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += ar[i] * br[j];
        }
        __syncthreads();
    }
}

/* acc += the tile (rows r0.., columns c0..) of U V^T over k < K, U and V
 * given by row: fu(l, k), fv(s, k), rows past len read as 0 */
template <class FU, class FV>
__device__ void mb_mm_rows(float (&acc)[4][4], mb_smem &sm, int64_t K, int64_t r0, int64_t c0,
                           int64_t len, FU fu, FV fv)
{
    mb_mm<true, true>(
        acc, sm, 0, K, [&](int i, int64_t k) { return r0 + i < len ? fu(r0 + i, k) : 0.f; },
        [&](int64_t k, int j) { return c0 + j < len ? fv(c0 + j, k) : 0.f; });
}

__device__ __forceinline__ void mb_zero(float (&acc)[4][4])
{
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.f;
}

/* f(i, j, acc value) for each element of the tile this thread holds */
template <class F> __device__ __forceinline__ void mb_each(float (&acc)[4][4], F f)
{
    int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) f(ty * 4 + i, tx * 4 + j, acc[i][j]);
}

/* v(i, j) into the shared tile, then row sums (rs[i], i < 64) and column sums
 * (cs[j]) in a fixed order; either may be NULL. Called by every thread. */
template <class F>
__device__ void mb_tile_sums(float (&acc)[4][4], mb_smem &sm, F v, float *rs, float *csum)
{
    mb_each(acc, [&](int i, int j, float x) { sm.t[i][j] = v(i, j, x); });
    __syncthreads();
    int tid = threadIdx.x;
    if (rs && tid < MB_TS) {
        float s = 0.f;
        for (int j = 0; j < MB_TS; j++) s += sm.t[tid][j];
        rs[tid] = s;
    }
    if (csum && tid >= MB_TS && tid < 2 * MB_TS) {
        int j = tid - MB_TS;
        float s = 0.f;
        for (int i = 0; i < MB_TS; i++) s += sm.t[i][j];
        csum[j] = s;
    }
    __syncthreads();
}

/* ---- the chunked SSD scan ------------------------------------------------------------ */

/* sizes and indexing of one call */
struct mb_ssd_dims {
    int64_t B, T, H, P, G, N, L, nc, hpg, ntL, ntP, ntN;
    __host__ __device__ mb_ssd_dims(const mb_ssd_t &a)
        : B(a.B), T(a.T), H(a.H), P(a.P), G(a.G), N(a.N), L(a.chunk),
          nc((a.T + a.chunk - 1) / a.chunk), hpg(a.H / a.G), ntL((a.chunk + MB_TS - 1) / MB_TS),
          ntP((a.P + MB_TS - 1) / MB_TS), ntN((a.N + MB_TS - 1) / MB_TS)
    {
    }
    __device__ int64_t len(int64_t c) const { return T - c * L < L ? T - c * L : L; }
    /* x, dy, dx [B,T,H,P] */
    __device__ int64_t xi(int64_t b, int64_t t, int64_t h, int64_t p) const { return ((b * T + t) * H + h) * P + p; }
    /* dt [B,T,H] */
    __device__ int64_t ti(int64_t b, int64_t t, int64_t h) const { return (b * T + t) * H + h; }
    /* B, C [B,T,G,N] */
    __device__ int64_t bi(int64_t b, int64_t t, int64_t g, int64_t n) const { return ((b * T + t) * G + g) * N + n; }
    /* per (row, chunk, head): cs [.., L] and states [.., P, N] */
    __device__ int64_t ch(int64_t b, int64_t c, int64_t h) const { return (b * nc + c) * H + h; }
};

/* the scratch of a call, as float offsets */
struct mb_ssd_scr {
    float *cs, *CB, *S1, *S2, *DU, *Gh, *W, *fpart, *zpart, *rpart, *cpart, *s0ds, *dApart, *ddir,
        *dDpart;
};

static size_t mb_ssd_layout(const mb_ssd_t *a, bool bwd, float *base, mb_ssd_scr *s)
{
    mb_ssd_dims d(*a);
    int64_t nbch = d.B * d.nc * d.H, ncs = nbch * d.L, nst = nbch * d.P * d.N;
    int64_t ncb = d.B * d.nc * d.G * d.L * d.L, ntok = d.B * d.T * d.H;
    int64_t sz[15] = {ncs, ncb, nst, nst, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    if (bwd) {
        sz[4] = ntok * d.P;         /* DU */
        sz[5] = nbch * d.L * d.L;   /* Gh */
        sz[6] = ncb;                /* W */
        sz[7] = d.ntP * ncs;        /* fpart */
        sz[8] = d.ntP * ncs;        /* zpart */
        sz[9] = d.ntL * ncs;        /* rpart */
        sz[10] = d.ntL * ncs;       /* cpart */
        sz[11] = nbch, sz[12] = nbch, sz[13] = ntok, sz[14] = ntok;
    }
    float **f[15] = {&s->cs, &s->CB, &s->S1, &s->S2, &s->DU, &s->Gh, &s->W, &s->fpart, &s->zpart,
                     &s->rpart, &s->cpart, &s->s0ds, &s->dApart, &s->ddir, &s->dDpart};
    size_t off = 0;
    for (int i = 0; i < 15; i++) {
        if (base) *f[i] = base + off;
        off += ((size_t)sz[i] + 63) & ~(size_t)63;
    }
    return off * sizeof(float);
}

/* cs[l] = sum_{l' <= l} dt A within each chunk, a thread per (row, chunk, head) */
__global__ void k_ssd_cumsum(mb_ssd_t a, float *cs)
{
    mb_ssd_dims d(a);
    MB_LOOP(i, d.B * d.nc * d.H)
    {
        int64_t h = i % d.H, c = (i / d.H) % d.nc, b = i / (d.H * d.nc), len = d.len(c);
        float A = -expf(a.A_log[h]), run = 0.f;
        for (int64_t l = 0; l < len; l++) cs[i * d.L + l] = run += a.dt[d.ti(b, c * d.L + l, h)] * A;
    }
}

/* CB[l,s] = C_l . B_s per (row, chunk, group), tiles on or below the diagonal */
__global__ void __launch_bounds__(MB_NT) k_ssd_cb(mb_ssd_t a, float *CB)
{
    __shared__ mb_smem sm;
    mb_ssd_dims d(a);
    int64_t bcg = blockIdx.x, g = bcg % d.G, c = (bcg / d.G) % d.nc, b = bcg / (d.G * d.nc);
    int64_t lt = blockIdx.y / d.ntL, st = blockIdx.y % d.ntL, len = d.len(c), t0 = c * d.L;
    if (st > lt) return;
    float acc[4][4];
    mb_zero(acc);
    mb_mm_rows(acc, sm, d.N, lt * MB_TS, st * MB_TS, len,
               [&](int64_t l, int64_t n) { return a.Cm[d.bi(b, t0 + l, g, n)]; },
               [&](int64_t s, int64_t n) { return a.Bm[d.bi(b, t0 + s, g, n)]; });
    mb_each(acc, [&](int i, int j, float v) {
        int64_t l = lt * MB_TS + i, s = st * MB_TS + j;
        if (l < len && s < len) CB[(bcg * d.L + l) * d.L + s] = v;
    });
}

/* Per (row, chunk, head), a [P,N] product over the chunk's tokens:
 *   Q = false: S1 = sum_s e^{cs_last - cs_s} dt_s x_s B_s^T  (local end state)
 *   Q = true:  S1 = sum_l e^{cs_l} dy_l C_l^T                (start-state gradient's share) */
template <bool Q> __global__ void __launch_bounds__(MB_NT) k_ssd_cstate(mb_ssd_t a, const float *cs, float *S1)
{
    __shared__ mb_smem sm;
    mb_ssd_dims d(a);
    int64_t bch = blockIdx.x, h = bch % d.H, c = (bch / d.H) % d.nc, b = bch / (d.H * d.nc);
    int64_t g = h / d.hpg, len = d.len(c), t0 = c * d.L;
    int64_t pt = blockIdx.y / d.ntN, nt = blockIdx.y % d.ntN;
    const float *csc = cs + bch * d.L;
    float last = csc[len - 1];
    const float *U = Q ? a.dy : a.x, *V = Q ? a.Cm : a.Bm;
    float acc[4][4];
    mb_zero(acc);
    mb_mm<false, false>(acc, sm, 0, len,
                        [&](int i, int64_t s) {
                            int64_t p = pt * MB_TS + i;
                            if (p >= d.P) return 0.f;
                            float w = Q ? expf(csc[s]) : expf(last - csc[s]) * a.dt[d.ti(b, t0 + s, h)];
                            return U[d.xi(b, t0 + s, h, p)] * w;
                        },
                        [&](int64_t s, int j) {
                            int64_t n = nt * MB_TS + j;
                            return n < d.N ? V[d.bi(b, t0 + s, g, n)] : 0.f;
                        });
    mb_each(acc, [&](int i, int j, float v) {
        int64_t p = pt * MB_TS + i, n = nt * MB_TS + j;
        if (p < d.P && n < d.N) S1[(bch * d.P + p) * d.N + n] = v;
    });
}

/* The recurrence across chunks, a thread per (row, head, state element):
 * forward (R = false): start[c] = S, S = e^{cs_last(c)} S + loc[c] (S from
 * the initial state or 0; the end state back to it); backward (R = true):
 * from the last chunk, end-gradient[c] = dS, dS = e^{cs_last(c)} dS + Q[c]. */
template <bool R>
__global__ void k_ssd_pass(mb_ssd_t a, const float *cs, const float *loc, float *out, float *state)
{
    mb_ssd_dims d(a);
    int64_t PN = d.P * d.N;
    MB_LOOP(i, d.B * d.H * PN)
    {
        int64_t e = i % PN, h = (i / PN) % d.H, b = i / (PN * d.H);
        float S = !R && state ? state[i] : 0.f;
        for (int64_t k = 0; k < d.nc; k++) {
            int64_t c = R ? d.nc - 1 - k : k, bch = d.ch(b, c, h);
            out[bch * PN + e] = S;
            S = expf(cs[bch * d.L + d.len(c) - 1]) * S + loc[bch * PN + e];
        }
        if (!R && state) state[i] = S;
    }
}

/* y[l,p] = sum_{s<=l} CB[l,s] e^{cs_l-cs_s} dt_s x_s[p] + e^{cs_l} sum_n C_l[n] S0[p,n] + D x_l[p],
 * a tile (l, p) per block */
__global__ void __launch_bounds__(MB_NT) k_ssd_out(mb_ssd_t a, const float *cs, const float *CB, const float *S0)
{
    __shared__ mb_smem sm;
    mb_ssd_dims d(a);
    int64_t bch = blockIdx.x, h = bch % d.H, c = (bch / d.H) % d.nc, b = bch / (d.H * d.nc);
    int64_t g = h / d.hpg, len = d.len(c), t0 = c * d.L, bcg = (b * d.nc + c) * d.G + g;
    int64_t lt = blockIdx.y / d.ntP, pt = blockIdx.y % d.ntP;
    const float *csc = cs + bch * d.L, *S0h = S0 + bch * d.P * d.N;
    int64_t kend = (lt + 1) * MB_TS < len ? (lt + 1) * MB_TS : len;
    float acc[4][4];
    mb_zero(acc);
    mb_mm<true, false>(acc, sm, 0, kend,
                       [&](int i, int64_t s) {
                           int64_t l = lt * MB_TS + i;
                           if (l >= len || s > l) return 0.f;
                           return CB[(bcg * d.L + l) * d.L + s] * expf(csc[l] - csc[s]) *
                                  a.dt[d.ti(b, t0 + s, h)];
                       },
                       [&](int64_t s, int j) {
                           int64_t p = pt * MB_TS + j;
                           return p < d.P ? a.x[d.xi(b, t0 + s, h, p)] : 0.f;
                       });
    mb_mm<true, true>(acc, sm, 0, d.N,
                      [&](int i, int64_t n) {
                          int64_t l = lt * MB_TS + i;
                          return l < len ? a.Cm[d.bi(b, t0 + l, g, n)] * expf(csc[l]) : 0.f;
                      },
                      [&](int64_t n, int j) {
                          int64_t p = pt * MB_TS + j;
                          return p < d.P ? S0h[p * d.N + n] : 0.f;
                      });
    float Dh = a.D ? a.D[h] : 0.f;
    mb_each(acc, [&](int i, int j, float v) {
        int64_t l = lt * MB_TS + i, p = pt * MB_TS + j;
        if (l < len && p < d.P) {
            int64_t o = d.xi(b, t0 + l, h, p);
            a.y[o] = v + Dh * a.x[o];
        }
    });
}

extern "C" size_t cuda_ssd_fwd_scratch(const mb_ssd_t *a) { return mb_ssd_layout(a, false, NULL, NULL); }
extern "C" size_t cuda_ssd_bwd_scratch(const mb_ssd_t *a) { return mb_ssd_layout(a, true, NULL, NULL); }

extern "C" cudaError_t cuda_ssd_scan_fwd(cudaStream_t st, const mb_ssd_t *a, void *scratch)
{
    if (a->B * a->H == 0 || a->T == 0) return cudaGetLastError();
    mb_ssd_dims d(*a);
    mb_ssd_scr s;
    mb_ssd_layout(a, false, (float *)scratch, &s);
    float *starts = a->chunk_states ? a->chunk_states : s.S2;
    unsigned nbch = (unsigned)(d.B * d.nc * d.H), nbcg = (unsigned)(d.B * d.nc * d.G);
    k_ssd_cumsum<<<cu_blocks(nbch, 128), 128, 0, st>>>(*a, s.cs);
    k_ssd_cb<<<dim3(nbcg, (unsigned)(d.ntL * d.ntL)), MB_NT, 0, st>>>(*a, s.CB);
    k_ssd_cstate<false><<<dim3(nbch, (unsigned)(d.ntP * d.ntN)), MB_NT, 0, st>>>(*a, s.cs, s.S1);
    k_ssd_pass<false><<<cu_blocks(d.B * d.H * d.P * d.N, 256), 256, 0, st>>>(*a, s.cs, s.S1, starts,
                                                                             a->state);
    k_ssd_out<<<dim3(nbch, (unsigned)(d.ntL * d.ntP)), MB_NT, 0, st>>>(*a, s.cs, s.CB, starts);
    return cudaGetLastError();
}

/* du[s,p] = sum_{l>=s} CB[l,s] e^{cs_l-cs_s} dy_l[p] + e^{E-cs_s} sum_n B_s[n] dSend[p,n]
 * into DU; fpart[pt][s] = dt_s sum_p x_s[p] (the second term)[s,p] */
__global__ void __launch_bounds__(MB_NT) k_ssd_du(mb_ssd_t a, mb_ssd_scr s)
{
    __shared__ mb_smem sm;
    __shared__ float rs[MB_TS];
    mb_ssd_dims d(a);
    int64_t bch = blockIdx.x, h = bch % d.H, c = (bch / d.H) % d.nc, b = bch / (d.H * d.nc);
    int64_t g = h / d.hpg, len = d.len(c), t0 = c * d.L, bcg = (b * d.nc + c) * d.G + g;
    int64_t st = blockIdx.y / d.ntP, pt = blockIdx.y % d.ntP;
    const float *csc = s.cs + bch * d.L, *dS = s.S2 + bch * d.P * d.N;
    float last = csc[len - 1];
    float a1[4][4], a2[4][4];
    mb_zero(a1), mb_zero(a2);
    mb_mm<false, false>(a1, sm, st * MB_TS, len,
                        [&](int i, int64_t l) {
                            int64_t s_ = st * MB_TS + i;
                            if (s_ >= len || l < s_) return 0.f;
                            return s.CB[(bcg * d.L + l) * d.L + s_] * expf(csc[l] - csc[s_]);
                        },
                        [&](int64_t l, int j) {
                            int64_t p = pt * MB_TS + j;
                            return p < d.P ? a.dy[d.xi(b, t0 + l, h, p)] : 0.f;
                        });
    mb_mm<true, true>(a2, sm, 0, d.N,
                      [&](int i, int64_t n) {
                          int64_t s_ = st * MB_TS + i;
                          return s_ < len ? a.Bm[d.bi(b, t0 + s_, g, n)] * expf(last - csc[s_]) : 0.f;
                      },
                      [&](int64_t n, int j) {
                          int64_t p = pt * MB_TS + j;
                          return p < d.P ? dS[p * d.N + n] : 0.f;
                      });
    {
        int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int64_t s_ = st * MB_TS + ty * 4 + i, p = pt * MB_TS + tx * 4 + j;
                if (s_ < len && p < d.P) s.DU[d.xi(b, t0 + s_, h, p)] = a1[i][j] + a2[i][j];
            }
    }
    mb_tile_sums(a2, sm,
                 [&](int i, int j, float v) {
                     int64_t s_ = st * MB_TS + i, p = pt * MB_TS + j;
                     return s_ < len && p < d.P ? v * a.x[d.xi(b, t0 + s_, h, p)] : 0.f;
                 },
                 rs, NULL);
    for (int i = threadIdx.x; i < MB_TS; i += MB_NT) {
        int64_t s_ = st * MB_TS + i;
        if (s_ < len) s.fpart[(pt * d.B * d.nc * d.H + bch) * d.L + s_] = rs[i] * a.dt[d.ti(b, t0 + s_, h)];
    }
}

/* Gh[l,s] = e^{cs_l-cs_s} dt_s (dy_l . x_s) for s <= l, per head; its products
 * with CB summed by rows (rpart[st][l]) and columns (cpart[lt][s]) */
__global__ void __launch_bounds__(MB_NT) k_ssd_dyx(mb_ssd_t a, mb_ssd_scr s)
{
    __shared__ mb_smem sm;
    __shared__ float rs[MB_TS], cs2[MB_TS];
    mb_ssd_dims d(a);
    int64_t bch = blockIdx.x, h = bch % d.H, c = (bch / d.H) % d.nc, b = bch / (d.H * d.nc);
    int64_t g = h / d.hpg, len = d.len(c), t0 = c * d.L, bcg = (b * d.nc + c) * d.G + g;
    int64_t lt = blockIdx.y / d.ntL, st = blockIdx.y % d.ntL, nbch = d.B * d.nc * d.H;
    const float *csc = s.cs + bch * d.L;
    if (st > lt) { /* above the diagonal: nothing, but the partial sums are read */
        for (int i = threadIdx.x; i < MB_TS; i += MB_NT) {
            if (lt * MB_TS + i < d.L) s.rpart[(st * nbch + bch) * d.L + lt * MB_TS + i] = 0.f;
            if (st * MB_TS + i < d.L) s.cpart[(lt * nbch + bch) * d.L + st * MB_TS + i] = 0.f;
        }
        return;
    }
    float acc[4][4];
    mb_zero(acc);
    mb_mm_rows(acc, sm, d.P, lt * MB_TS, st * MB_TS, len,
               [&](int64_t l, int64_t p) { return a.dy[d.xi(b, t0 + l, h, p)]; },
               [&](int64_t s_, int64_t p) { return a.x[d.xi(b, t0 + s_, h, p)]; });
    mb_each(acc, [&](int i, int j, float &v) {
        int64_t l = lt * MB_TS + i, s_ = st * MB_TS + j;
        v = l < len && s_ <= l ? v * expf(csc[l] - csc[s_]) * a.dt[d.ti(b, t0 + s_, h)] : 0.f;
        if (l < len && s_ < len) s.Gh[(bch * d.L + l) * d.L + s_] = v;
    });
    mb_tile_sums(acc, sm,
                 [&](int i, int j, float v) {
                     int64_t l = lt * MB_TS + i, s_ = st * MB_TS + j;
                     return l < len && s_ <= l ? v * s.CB[(bcg * d.L + l) * d.L + s_] : 0.f;
                 },
                 rs, cs2);
    for (int i = threadIdx.x; i < MB_TS; i += MB_NT) {
        if (lt * MB_TS + i < d.L) s.rpart[(st * nbch + bch) * d.L + lt * MB_TS + i] = rs[i];
        if (st * MB_TS + i < d.L) s.cpart[(lt * nbch + bch) * d.L + st * MB_TS + i] = cs2[i];
    }
}

/* W[l,s] = sum over the group's heads of Gh[l,s] (0 above the diagonal) */
__global__ void k_ssd_wsum(mb_ssd_t a, mb_ssd_scr s)
{
    mb_ssd_dims d(a);
    int64_t LL = d.L * d.L;
    MB_LOOP(i, d.B * d.nc * d.G * LL)
    {
        int64_t e = i % LL, l = e / d.L, s_ = e % d.L, bcg = i / LL, g = bcg % d.G;
        int64_t bc = bcg / d.G, c = bc % d.nc, len = d.len(c);
        float v = 0.f;
        if (s_ <= l && l < len)
            for (int64_t j = 0; j < d.hpg; j++) v += s.Gh[((bc * d.H + g * d.hpg + j) * d.L + l) * d.L + s_];
        s.W[i] = v;
    }
}

/* zpart[pt][l] = e^{cs_l} sum_p dy_l[p] sum_n C_l[n] S0[p,n]: the start state's
 * share of y, for the gradient of cs */
__global__ void __launch_bounds__(MB_NT) k_ssd_zst(mb_ssd_t a, mb_ssd_scr s)
{
    __shared__ mb_smem sm;
    __shared__ float rs[MB_TS];
    mb_ssd_dims d(a);
    int64_t bch = blockIdx.x, h = bch % d.H, c = (bch / d.H) % d.nc, b = bch / (d.H * d.nc);
    int64_t g = h / d.hpg, len = d.len(c), t0 = c * d.L;
    int64_t lt = blockIdx.y / d.ntP, pt = blockIdx.y % d.ntP;
    const float *csc = s.cs + bch * d.L, *S0h = a.cstates + bch * d.P * d.N;
    float acc[4][4];
    mb_zero(acc);
    mb_mm<true, true>(acc, sm, 0, d.N,
                      [&](int i, int64_t n) {
                          int64_t l = lt * MB_TS + i;
                          return l < len ? a.Cm[d.bi(b, t0 + l, g, n)] * expf(csc[l]) : 0.f;
                      },
                      [&](int64_t n, int j) {
                          int64_t p = pt * MB_TS + j;
                          return p < d.P ? S0h[p * d.N + n] : 0.f;
                      });
    mb_tile_sums(acc, sm,
                 [&](int i, int j, float v) {
                     int64_t l = lt * MB_TS + i, p = pt * MB_TS + j;
                     return l < len && p < d.P ? v * a.dy[d.xi(b, t0 + l, h, p)] : 0.f;
                 },
                 rs, NULL);
    for (int i = threadIdx.x; i < MB_TS; i += MB_NT)
        if (lt * MB_TS + i < len) s.zpart[(pt * d.B * d.nc * d.H + bch) * d.L + lt * MB_TS + i] = rs[i];
}

/* Per (row, chunk, group), tiles (token, n):
 *   DC = true:  dC_l += sum_s W[l,s] B_s + sum_{h in g} e^{cs_l,h} sum_p dy_l,h[p] S0_h[p,:]
 *   DC = false: dB_s += sum_l W[l,s] C_l + sum_{h in g} e^{E_h-cs_s,h} dt_s,h sum_p x_s,h[p] dSend_h[p,:] */
template <bool DC> __global__ void __launch_bounds__(MB_NT) k_ssd_dbc(mb_ssd_t a, mb_ssd_scr s)
{
    __shared__ mb_smem sm;
    mb_ssd_dims d(a);
    int64_t bcg = blockIdx.x, g = bcg % d.G, c = (bcg / d.G) % d.nc, b = bcg / (d.G * d.nc);
    int64_t len = d.len(c), t0 = c * d.L, h0 = g * d.hpg, bch0 = d.ch(b, c, h0);
    int64_t rt = blockIdx.y / d.ntN, nt = blockIdx.y % d.ntN;
    const float *Wg = s.W + bcg * d.L * d.L, *V = DC ? a.Bm : a.Cm;
    const float *St = DC ? a.cstates : s.S2; /* the group's heads are consecutive */
    float *out = DC ? a.dC : a.dB;
    float acc[4][4];
    mb_zero(acc);
    int64_t k0 = DC ? 0 : rt * MB_TS;
    int64_t k1 = DC ? ((rt + 1) * MB_TS < len ? (rt + 1) * MB_TS : len) : len;
    auto fv = [&](int64_t k, int j) {
        int64_t n = nt * MB_TS + j;
        return n < d.N ? V[d.bi(b, t0 + k, g, n)] : 0.f;
    };
    if (DC)
        mb_mm<true, false>(acc, sm, k0, k1,
                           [&](int i, int64_t k) {
                               int64_t r = rt * MB_TS + i;
                               return r < len ? Wg[r * d.L + k] : 0.f;
                           },
                           fv);
    else
        mb_mm<false, false>(acc, sm, k0, k1,
                            [&](int i, int64_t k) {
                                int64_t r = rt * MB_TS + i;
                                return r < len ? Wg[k * d.L + r] : 0.f;
                            },
                            fv);
    mb_mm<true, false>(acc, sm, 0, d.hpg * d.P,
                       [&](int i, int64_t q) {
                           int64_t r = rt * MB_TS + i, h = h0 + q / d.P, p = q % d.P;
                           if (r >= len) return 0.f;
                           const float *csc = s.cs + d.ch(b, c, h) * d.L;
                           if (DC) return a.dy[d.xi(b, t0 + r, h, p)] * expf(csc[r]);
                           return a.x[d.xi(b, t0 + r, h, p)] * expf(csc[len - 1] - csc[r]) *
                                  a.dt[d.ti(b, t0 + r, h)];
                       },
                       [&](int64_t q, int j) {
                           int64_t n = nt * MB_TS + j;
                           return n < d.N ? St[bch0 * d.P * d.N + q * d.N + n] : 0.f;
                       });
    if (!out) return;
    mb_each(acc, [&](int i, int j, float v) {
        int64_t r = rt * MB_TS + i, n = nt * MB_TS + j;
        if (r < len && n < d.N) out[d.bi(b, t0 + r, g, n)] += v;
    });
}

/* s0ds[bch] = <S0, dSend>, a block per (row, chunk, head) */
__global__ void k_ssd_s0ds(mb_ssd_t a, mb_ssd_scr s)
{
    __shared__ float red[32];
    mb_ssd_dims d(a);
    int64_t bch = blockIdx.x, PN = d.P * d.N;
    const float *S0 = a.cstates + bch * PN, *dS = s.S2 + bch * PN;
    float v = 0.f;
    for (int64_t e = threadIdx.x; e < PN; e += blockDim.x) v += S0[e] * dS[e];
    v = cu_block_sum(v, red);
    if (threadIdx.x == 0) s.s0ds[bch] = v;
}

/* per (row, token, head), a warp with its lanes along the head dim:
 * dx += du dt + D dy; ddir = du . x; dDpart = dy . x */
__global__ void k_ssd_tok(mb_ssd_t a, mb_ssd_scr s)
{
    mb_ssd_dims d(a);
    int64_t lane = threadIdx.x % 32, nw = (int64_t)gridDim.x * blockDim.x / 32;
    for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; i < d.B * d.T * d.H;
         i += nw) {
        int64_t h = i % d.H;
        float dtv = a.dt[i], Dh = a.D ? a.D[h] : 0.f, ud = 0.f, yd = 0.f;
        const float *du = s.DU + i * d.P, *x = a.x + i * d.P, *dy = a.dy + i * d.P;
        float *dx = a.dx ? a.dx + i * d.P : NULL;
        for (int64_t p = lane; p < d.P; p += 32) {
            ud += du[p] * x[p];
            yd += dy[p] * x[p];
            if (dx) dx[p] += du[p] * dtv + Dh * dy[p];
        }
        ud = cu_warp_sum(ud);
        yd = cu_warp_sum(yd);
        if (lane == 0) s.ddir[i] = ud, s.dDpart[i] = yd;
    }
}

/* per (row, chunk, head): the gradient of cs from its parts, reverse-summed
 * into those of dt (ddt += ddir + R A) and of A (dApart = A sum R dt) */
__global__ void k_ssd_assemble(mb_ssd_t a, mb_ssd_scr s)
{
    mb_ssd_dims d(a);
    int64_t nbch = d.B * d.nc * d.H;
    MB_LOOP(bch, nbch)
    {
        int64_t h = bch % d.H, c = (bch / d.H) % d.nc, b = bch / (d.H * d.nc);
        int64_t len = d.len(c), t0 = c * d.L;
        const float *csc = s.cs + bch * d.L;
        float A = -expf(a.A_log[h]);
        float fsum = 0.f;
        for (int64_t l = 0; l < len; l++)
            for (int64_t pt = 0; pt < d.ntP; pt++) fsum += s.fpart[(pt * nbch + bch) * d.L + l];
        float R = 0.f, dA = 0.f;
        for (int64_t l = len - 1; l >= 0; l--) {
            float g = 0.f;
            for (int64_t t = 0; t < d.ntL; t++)
                g += s.rpart[(t * nbch + bch) * d.L + l] - s.cpart[(t * nbch + bch) * d.L + l];
            for (int64_t pt = 0; pt < d.ntP; pt++)
                g += s.zpart[(pt * nbch + bch) * d.L + l] - s.fpart[(pt * nbch + bch) * d.L + l];
            if (l == len - 1) g += expf(csc[len - 1]) * s.s0ds[bch] + fsum;
            R += g;
            int64_t ti = d.ti(b, t0 + l, h);
            if (a.ddt) a.ddt[ti] += s.ddir[ti] + R * A;
            dA += R * a.dt[ti];
        }
        s.dApart[bch] = dA * A; /* dA/dA_log = A */
    }
}

/* dA_log[h] += sum over (row, chunk) of dApart; dD[h] += sum over tokens of dDpart */
__global__ void k_ssd_params(int64_t rows, int64_t H, const float *part, float *out)
{
    float *outs[1] = {out};
    mb_colsum<1>(0, rows, H, 1, [&](int64_t r, int64_t h, int) { return part[r * H + h]; }, outs);
}

extern "C" cudaError_t cuda_ssd_scan_bwd(cudaStream_t st, const mb_ssd_t *a, float *dA_log,
                                         float *dD, void *scratch)
{
    if (a->B * a->G == 0 || a->T == 0) return cudaGetLastError();
    mb_ssd_dims d(*a);
    mb_ssd_scr s;
    mb_ssd_layout(a, true, (float *)scratch, &s);
    unsigned nbch = (unsigned)(d.B * d.nc * d.H), nbcg = (unsigned)(d.B * d.nc * d.G);
    k_ssd_cumsum<<<cu_blocks(nbch, 128), 128, 0, st>>>(*a, s.cs);
    k_ssd_cb<<<dim3(nbcg, (unsigned)(d.ntL * d.ntL)), MB_NT, 0, st>>>(*a, s.CB);
    k_ssd_cstate<true><<<dim3(nbch, (unsigned)(d.ntP * d.ntN)), MB_NT, 0, st>>>(*a, s.cs, s.S1);
    k_ssd_pass<true><<<cu_blocks(d.B * d.H * d.P * d.N, 256), 256, 0, st>>>(*a, s.cs, s.S1, s.S2,
                                                                            NULL);
    k_ssd_du<<<dim3(nbch, (unsigned)(d.ntL * d.ntP)), MB_NT, 0, st>>>(*a, s);
    k_ssd_dyx<<<dim3(nbch, (unsigned)(d.ntL * d.ntL)), MB_NT, 0, st>>>(*a, s);
    k_ssd_wsum<<<cu_blocks(d.B * d.nc * d.G * d.L * d.L, 256), 256, 0, st>>>(*a, s);
    k_ssd_zst<<<dim3(nbch, (unsigned)(d.ntL * d.ntP)), MB_NT, 0, st>>>(*a, s);
    if (a->dC) k_ssd_dbc<true><<<dim3(nbcg, (unsigned)(d.ntL * d.ntN)), MB_NT, 0, st>>>(*a, s);
    if (a->dB) k_ssd_dbc<false><<<dim3(nbcg, (unsigned)(d.ntL * d.ntN)), MB_NT, 0, st>>>(*a, s);
    k_ssd_s0ds<<<nbch, 256, 0, st>>>(*a, s);
    k_ssd_tok<<<cu_blocks(d.B * d.T * d.H * 32, 256), 256, 0, st>>>(*a, s);
    k_ssd_assemble<<<cu_blocks(nbch, 64), 64, 0, st>>>(*a, s);
    dim3 pg((unsigned)((d.H + 31) / 32)), pb(32, MB_CR);
    if (dA_log) k_ssd_params<<<pg, pb, 0, st>>>(d.B * d.nc, d.H, s.dApart, dA_log);
    if (dD) k_ssd_params<<<pg, pb, 0, st>>>(d.B * d.T, d.H, s.dDpart, dD);
    return cudaGetLastError();
}

/* ---- gated grouped RMSNorm: a warp per (row, group) --------------------------------- */

__global__ void k_gnorm_fwd(mb_gnorm_t a)
{
    int64_t Cg = a.C / a.G, lane = threadIdx.x % 32;
    int64_t nw = (int64_t)gridDim.x * blockDim.x / 32;
    for (int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; w < a.N * a.G; w += nw) {
    int64_t n = w / a.G, gi = w % a.G, c0 = n * a.C + gi * Cg;
    float ss = 0.f;
    for (int64_t c = lane; c < Cg; c += 32) {
        float hv = a.y[c0 + c] * mb_silu(a.z[c0 + c]);
        ss += hv * hv;
    }
    ss = cu_warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)Cg + a.eps);
    if (lane == 0) a.rstd[n * a.G + gi] = r;
    for (int64_t c = lane; c < Cg; c += 32)
        a.out[c0 + c] = a.w[gi * Cg + c] * (a.y[c0 + c] * mb_silu(a.z[c0 + c]) * r);
    }
}

/* with h = y silu(z) and o = w h r per group:
 * dh_c = r w_c do_c - (r^3 / Cg) h_c sum_j w_j do_j h_j */
__global__ void k_gnorm_bwd(mb_gnorm_t a)
{
    int64_t Cg = a.C / a.G, lane = threadIdx.x % 32;
    int64_t nw = (int64_t)gridDim.x * blockDim.x / 32;
    for (int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; w < a.N * a.G; w += nw) {
    int64_t n = w / a.G, gi = w % a.G, c0 = n * a.C + gi * Cg;
    float r = a.rs[n * a.G + gi], dot = 0.f;
    for (int64_t c = lane; c < Cg; c += 32)
        dot += a.w[gi * Cg + c] * a.dout[c0 + c] * (a.y[c0 + c] * mb_silu(a.z[c0 + c]));
    dot = cu_warp_sum(dot);
    float k = dot * r * r * r / (float)Cg;
    for (int64_t c = lane; c < Cg; c += 32) {
        float zv = a.z[c0 + c], sg = 1.f / (1.f + expf(-zv)), sl = zv * sg;
        float dh = r * a.w[gi * Cg + c] * a.dout[c0 + c] - k * (a.y[c0 + c] * sl);
        if (a.dy) a.dy[c0 + c] += dh * sl;
        if (a.dz) a.dz[c0 + c] += dh * a.y[c0 + c] * sg * (1.f + zv * (1.f - sg));
    }
    }
}

__global__ void k_gnorm_dw(mb_gnorm_t a)
{
    float *outs[1] = {a.dw};
    int64_t Cg = a.C / a.G;
    mb_colsum<1>(0, a.N, a.C, 1,
                 [&](int64_t n, int64_t c, int) {
                     int64_t i = n * a.C + c;
                     return a.dout[i] * (a.y[i] * mb_silu(a.z[i])) * a.rs[n * a.G + c / Cg];
                 },
                 outs);
}

extern "C" cudaError_t cuda_gated_rmsnorm_fwd(cudaStream_t st, const mb_gnorm_t *a)
{
    if (a->N > 0) k_gnorm_fwd<<<cu_blocks(a->N * a->G * 32, 256), 256, 0, st>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_gated_rmsnorm_bwd(cudaStream_t st, const mb_gnorm_t *a)
{
    if (a->N > 0 && (a->dy || a->dz))
        k_gnorm_bwd<<<cu_blocks(a->N * a->G * 32, 256), 256, 0, st>>>(*a);
    if (a->N > 0 && a->dw)
        k_gnorm_dw<<<dim3((unsigned)((a->C + 31) / 32)), dim3(32, MB_CR), 0, st>>>(*a);
    return cudaGetLastError();
}
