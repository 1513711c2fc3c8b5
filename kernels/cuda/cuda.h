/* The CUDA backend's C interface: the extern "C" launchers of the kernels in
 * kernels/cuda/<layer>.cu (CUDA C++ stays inside those files), the cuBLASLt
 * products of blas.c, and the per-stream state that backend.c owns.
 *
 * Launchers take device pointers, dtypes and dimensions (the dispatch has
 * checked them, kernels/kernels.c), queue their kernels on `st` and return
 * the launch status (cudaGetLastError after the last launch), which the
 * backend turns into a sticky stream error naming the op. They never
 * synchronize. Shapes and semantics are those of the CPU twins
 * (kernels/cpu/cpu.h); every compute op takes f32 or bf16 data and computes
 * in fp32.
 *
 * Scratch: a launcher that needs device scratch says how much through its
 * *_scratch() function; the backend passes a buffer of at least that size
 * that stays untouched by others until the launched work is done.
 *
 * Data-dependent errors (a target outside the vocabulary, a position outside
 * the RoPE table) cannot panic on the device: the kernel sets its word of
 * `flags` (host memory mapped into the device, CUDA_FLAG_*), and the backend
 * reports it as the stream's error at the next sync or notification. */
#ifndef BT_KERNELS_CUDA_CUDA_H
#define BT_KERNELS_CUDA_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/backend.h"

/* Words of a stream's mapped flag array; a kernel stores 1 into its word. */
enum {
    CUDA_FLAG_XENT_TARGET = 0, /* kern_xent_fwd_bwd: target outside [0, V) */
    CUDA_FLAG_VP_TARGET,       /* kern_xent_vp_finish: negative target */
    CUDA_FLAG_ROPE_POS,        /* kern_rope_*: position outside [0, P) */
    CUDA_FLAG_COUNT,
};

/* ---- elementwise (elementwise.cu) ----------------------------------------- */

/* dst[n] = src[n] converted between float dtypes (f32, bf16, f16, f64), bit
 * for bit as kernels/cpu/elementwise.c (base/tensor.c rounding). */
cudaError_t cuda_convert(cudaStream_t st, void *dst, dtype_t dst_dt, const void *src,
                         dtype_t src_dt, int64_t n);
/* out = a + b; y += alpha x; p *= f (dt f32 or bf16, fp32 math) */
cudaError_t cuda_add(cudaStream_t st, void *out, const void *a, const void *b, dtype_t dt,
                     int64_t n);
cudaError_t cuda_copy_cols(cudaStream_t st, void *dst, const void *src, dtype_t dt, int64_t rows,
                           int64_t dcols, int64_t scols, int64_t d0, int64_t dstep, int64_t s0,
                           int64_t sstep, int64_t n, int64_t div, bool acc);
cudaError_t cuda_axpy(cudaStream_t st, void *y, float alpha, const void *x, dtype_t dt, int64_t n);
cudaError_t cuda_scale(cudaStream_t st, void *p, float f, dtype_t dt, int64_t n);

/* Reductions in a fixed order (deterministic): partial sums per block into
 * scratch, then one block adds the partials in index order and writes *out,
 * which may be host memory mapped into the device. dt: f32, bf16, f16, f64. */
size_t cuda_reduce_scratch(int64_t n);
cudaError_t cuda_sumsq(cudaStream_t st, double *out, const void *p, dtype_t dt, int64_t n,
                       void *scratch);
cudaError_t cuda_count_nonfinite(cudaStream_t st, int64_t *out, const void *p, dtype_t dt,
                                 int64_t n, void *scratch);

/* out[N,OC] rows = bias[OC] (linear_fwd when no bias epilogue is taken) */
cudaError_t cuda_bias_rows(cudaStream_t st, void *out, const void *bias, dtype_t dt, int64_t N,
                           int64_t OC);
/* dst[C] (dst_dt f32 or bf16) += column sums of src[N,C] (src_dt), fp32
 * partials per fixed row group, added in group order. */
size_t cuda_colsum_scratch(int64_t N, int64_t C);
cudaError_t cuda_colsum(cudaStream_t st, void *dst, dtype_t dst_dt, const void *src,
                        dtype_t src_dt, int64_t N, int64_t C, void *scratch);

/* SwiGLU: out = silu(gate) * up; dgate/dup += (=, when set; NULL skipped) */
cudaError_t cuda_swiglu_fwd(cudaStream_t st, void *out, const void *gate, const void *up,
                            dtype_t dt, int64_t n);
cudaError_t cuda_swiglu_bwd(cudaStream_t st, void *dgate, void *dup, const void *dout,
                            const void *gate, const void *up, dtype_t dt, int64_t n, bool set);

/* Squared ReLU: out = max(x, 0)^2; dx += 2 max(x, 0) dout (=, when set) */
cudaError_t cuda_relu2_fwd(cudaStream_t st, void *out, const void *x, dtype_t dt, int64_t n);
cudaError_t cuda_relu2_bwd(cudaStream_t st, void *dx, const void *dout, const void *x,
                           dtype_t dt, int64_t n, bool set);

/* RoPE over x[BT,H,D] with tables [P,D/2] f32 and pos[BT] i32: bwd 0 the
 * forward (out may alias x), 1 dx += R^T dout, 2 dx = R^T dout. */
cudaError_t cuda_rope(cudaStream_t st, void *out, const void *x, const float *cos,
                      const float *sin, const int32_t *pos, dtype_t dt, int64_t BT, int64_t H,
                      int64_t D, int64_t P, int bwd, unsigned *flags);

/* Embedding: out[N,C] = table rows (zero outside the shard). The backward
 * sorts (id, row) pairs with a stable radix sort and lets one thread per
 * (distinct id, column) add its rows in row order: deterministic, and for f32
 * the same sums in the same order as the CPU twin. */
cudaError_t cuda_embedding_fwd(cudaStream_t st, void *out, const void *table,
                               const int32_t *ids, dtype_t dt, int64_t N, int64_t V, int64_t C,
                               int64_t vocab_start);
size_t cuda_embedding_bwd_scratch(int64_t N, int64_t V);
cudaError_t cuda_embedding_bwd(cudaStream_t st, void *dtable, dtype_t dtable_dt,
                               const void *dout, dtype_t dt, const int32_t *ids, int64_t N,
                               int64_t V, int64_t C, int64_t vocab_start, void *scratch,
                               size_t scratch_bytes);

/* ---- RMSNorm (norm.cu) ----------------------------------------------------- */

cudaError_t cuda_rmsnorm_fwd(cudaStream_t st, void *out, float *rstd, const void *x,
                             const void *w, dtype_t dt, int64_t N, int64_t C, float eps);
/* xout = x + y (may alias either), then cuda_rmsnorm_fwd of xout into out:
 * the bits of cuda_add followed by cuda_rmsnorm_fwd */
cudaError_t cuda_add_rmsnorm_fwd(cudaStream_t st, void *xout, void *out, float *rstd,
                                 const void *x, const void *y, const void *w, dtype_t dt,
                                 int64_t N, int64_t C, float eps);
/* dx (dt) += ...; dw (dw_dt: f32 or dt) += sum over rows, deterministic */
size_t cuda_rmsnorm_bwd_scratch(int64_t N, int64_t C);
cudaError_t cuda_rmsnorm_bwd(cudaStream_t st, void *dx, void *dw, dtype_t dw_dt,
                             const void *dout, const void *x, const void *w, const float *rstd,
                             dtype_t dt, int64_t N, int64_t C, void *scratch);

/* ---- cross-entropy (xent.cu): fp32 math on f32 or bf16 logits ------------- */

cudaError_t cuda_xent_fwd_bwd(cudaStream_t st, float *losses, void *dlogits, const void *logits,
                              dtype_t dt, const int32_t *targets, int64_t N, int64_t V,
                              float dloss, int32_t ignore_index, unsigned *flags);
cudaError_t cuda_xent_vp_max(cudaStream_t st, float *row_max, const void *logits, dtype_t dt,
                             int64_t N, int64_t V);
cudaError_t cuda_xent_vp_sum(cudaStream_t st, float *sumexp, float *tgt_logit,
                             const void *logits, dtype_t dt, const float *gmax,
                             const int32_t *targets, int64_t N, int64_t V, int64_t vocab_start,
                             int32_t ignore_index);
cudaError_t cuda_xent_vp_finish(cudaStream_t st, float *losses, void *dlogits,
                                const void *logits, dtype_t dt, const float *gmax,
                                const float *sumexp, const float *tgt_logit,
                                const int32_t *targets, int64_t N, int64_t V,
                                int64_t vocab_start, float dloss, int32_t ignore_index,
                                unsigned *flags);

/* ---- AdamW (adamw.cu) ----------------------------------------------------- */

/* The per-element constants, formed on the host exactly as the CPU twin
 * forms them (kernels/cpu/adamw.c), so that f32 results are bit-identical. */
typedef struct {
    float decay, w1, b2, w2, bc2s, eps, neg_step;
    int decays;
} cuda_adamw_k_t;

/* param (param_dt f32 or bf16) updated with f32 moments m, v; grad in
 * grad_dt (f32 or bf16); param_copy (copy_dt any float dtype, or NULL) gets
 * the new parameter in the same pass. */
cudaError_t cuda_adamw(cudaStream_t st, void *param, dtype_t param_dt, void *param_copy,
                       dtype_t copy_dt, const void *grad, dtype_t grad_dt, float *m, float *v,
                       int64_t n, const cuda_adamw_k_t *k);

/* ---- routed experts (moe.cu) ------------------------------------------------ */

/* The CPU twins' semantics (kernels/cpu/moe.c); dt is the compute dtype of
 * logits / dlogits (route) and of x, xp, yp, y (permute, combine). Expert
 * ids outside [0, E) are dropped rather than faulted on. */
cudaError_t cuda_moe_route_fwd(cudaStream_t st, float *weights, int32_t *experts, float *probs,
                               const void *logits, dtype_t dt, int64_t N, int64_t E, int64_t K,
                               bool norm);
cudaError_t cuda_moe_route_reselect(cudaStream_t st, float *weights, int32_t *experts,
                                    const float *probs, const float *bias, int64_t N, int64_t E,
                                    int64_t K, bool norm);
cudaError_t cuda_moe_route_bwd(cudaStream_t st, void *dlogits, dtype_t dt, const float *dweights,
                               const float *dprobs, const float *probs, const int32_t *experts,
                               int64_t N, int64_t E, int64_t K, bool norm);
cudaError_t cuda_moe_route_stats(cudaStream_t st, float *counts, float *psum, const float *probs,
                                 const int32_t *experts, int64_t N, int64_t E, int64_t K);
cudaError_t cuda_moe_permute_fwd(cudaStream_t st, void *xp, int32_t *slot, int32_t *sizes,
                                 int32_t *routed, const void *x, const int32_t *experts, dtype_t dt,
                                 int64_t N, int64_t C, int64_t K, int64_t E, int64_t capacity,
                                 const int32_t *caps);
cudaError_t cuda_moe_permute_bwd(cudaStream_t st, void *dx, const void *dxp, const int32_t *slot,
                                 dtype_t dt, int64_t N, int64_t C, int64_t K);
cudaError_t cuda_moe_combine_fwd(cudaStream_t st, void *y, const void *yp, const int32_t *slot,
                                 const float *weights, dtype_t dt, int64_t N, int64_t C, int64_t K);
cudaError_t cuda_moe_combine_bwd(cudaStream_t st, void *dyp, float *dweights, const void *dy,
                                 const void *yp, const int32_t *slot, const float *weights,
                                 dtype_t dt, int64_t N, int64_t C, int64_t K);
/* out = sigmoid(gate[n]) x; backward dx += sigmoid(g) dout, dgate += sigmoid'(g) dout . x */
cudaError_t cuda_sigmoid_gate_fwd(cudaStream_t st, void *out, const void *gate, const void *x,
                                  dtype_t dt, int64_t N, int64_t C);
cudaError_t cuda_sigmoid_gate_bwd(cudaStream_t st, void *dx, void *dgate, const void *dout,
                                  const void *gate, const void *x, dtype_t dt, int64_t N,
                                  int64_t C);

/* ---- attention (attention.cu) --------------------------------------------- */

/* Which attention kernels run: tensor cores for bf16 when the head dims allow
 * (CUDA_ATTN_AUTO: probabilities and score gradients enter their products as
 * bf16 hi + lo parts), the same kernels with them rounded to bf16 once, as
 * cuDNN and FlashAttention do (CUDA_ATTN_FAST: half the tensor-core work of
 * those products, about four times the error), or the fp32 SIMT kernels for
 * everything (CUDA_ATTN_SIMT), or cuDNN's fused SDPA graphs where cuDNN is
 * present and takes the shape, the fast path elsewhere (CUDA_ATTN_CUDNN).
 * BATON_CUDA_ATTN=simt, =fast or =cudnn sets the path for the process. */
typedef enum {
    CUDA_ATTN_AUTO = 0,
    CUDA_ATTN_SIMT = 1,
    CUDA_ATTN_FAST = 2,
    CUDA_ATTN_CUDNN = 3, /* cuDNN's SDPA (dnn.cu) where it takes the call, else the fast path */
} cuda_attn_path_t;
void cuda_attn_set_path(cuda_attn_path_t p);
cuda_attn_path_t cuda_attn_get_path(void);
/* Whether the tensor-core forward takes this shape and dtype (the
 * backward takes the subset with D == Dv <= 128, see attention.cu). */
bool cuda_attn_uses_tc(const kern_attn_shape_t *sh, dtype_t dt);

/* Flash-style forward: out[B,Tq,Hq,Dv], lse[B,Hq,Tq] f32; no Tq x Tk matrix
 * is stored. Fails with cudaErrorInvalidValue when the head dims exceed what
 * the kernels' shared memory holds (see attention.cu). */
cudaError_t cuda_attn_fwd(cudaStream_t st, void *out, float *lse, const void *q, const void *k,
                          const void *v, dtype_t dt, const kern_attn_shape_t *sh);
/* kern_attention_merge: out [B,Tq,Hq,Dv], lse [B,Hq,Tq] merged in place
 * (two launches: the outputs read both lse, then lse is updated). */
cudaError_t cuda_attn_merge(cudaStream_t st, void *out, float *lse, const void *part_out,
                            const float *part_lse, dtype_t dt, int64_t B, int64_t Tq, int64_t Hq,
                            int64_t Dv);
/* Backward: dq, dk, dv += (=, when set; NULL skipped). Deterministic: dk, dv by one block
 * per (batch, kv head, key tile), dq by one block per (batch, head, query
 * tile), no atomics. Scratch holds rowsum(dout * out) [B,Hq,Tq] f32. */
size_t cuda_attn_bwd_scratch(const kern_attn_shape_t *sh);
cudaError_t cuda_attn_bwd(cudaStream_t st, void *dq, void *dk, void *dv, const void *dout,
                          const void *q, const void *k, const void *v, const void *out,
                          const float *lse, dtype_t dt, const kern_attn_shape_t *sh,
                          void *scratch, bool set);

/* ---- cuDNN attention (dnn.cu) ------------------------------------------------ */

/* One per stream: a cuDNN handle and the SDPA graphs built for the shapes it
 * ran. Create fails (false, why[] says so) where libcudnn.so.9 cannot be
 * opened, is older than 9.0, or the build lacked the frontend's headers. */
typedef struct cuda_dnn cuda_dnn_t;
bool cuda_dnn_create(cuda_dnn_t **out, char *why, size_t cap);
/* whether libcudnn.so.9 (9.0 or newer) opens, without making a handle */
bool cuda_dnn_usable(char *why, size_t cap);
void cuda_dnn_destroy(cuda_dnn_t *d);
/* What a call did: ran it (DONE), left it to the caller's kernels with the
 * reason in why[] (DECLINED: dtype, mask offset, a shape cuDNN does not
 * support), or failed (FAILED, why[] says how; the stream's work is unsafe). */
enum { CUDA_DNN_DONE = 0, CUDA_DNN_DECLINED = 1, CUDA_DNN_FAILED = 2 };
/* cuDNN's workspace of n bytes, stream-ordered like the launchers' scratch */
typedef void *(*cuda_dnn_ws_fn)(void *ctx, size_t n);
/* kern_attention_fwd: out[B,Tq,Hq,Dv], lse[B,Hq,Tq] f32 written */
int cuda_dnn_attn_fwd(cuda_dnn_t *d, cudaStream_t st, void *out, float *lse, const void *q,
                      const void *k, const void *v, dtype_t dt, const kern_attn_shape_t *sh,
                      cuda_dnn_ws_fn ws_fn, void *ws_ctx, char *why, size_t cap);
/* kern_attention_bwd_set: dq, dk, dv all written (declined when one is NULL) */
int cuda_dnn_attn_bwd(cuda_dnn_t *d, cudaStream_t st, void *dq, void *dk, void *dv,
                      const void *dout, const void *q, const void *k, const void *v,
                      const void *out, const float *lse, dtype_t dt, const kern_attn_shape_t *sh,
                      cuda_dnn_ws_fn ws_fn, void *ws_ctx, char *why, size_t cap);

/* how many calls cuDNN has run in this process (the op table's check) */
int64_t cuda_dnn_done_count(void);

/* ---- cuBLASLt (blas.c) ---------------------------------------------------- */

typedef struct cuda_lt cuda_lt_t; /* a handle and its plan cache, one per stream */
cudaError_t cuda_lt_create(cuda_lt_t **out, char *why, size_t why_cap);
void cuda_lt_destroy(cuda_lt_t *lt);

/* One product in row-major terms, as kern_matmul: c[M,N] = alpha op(a) op(b)
 * + beta c, a and b in ab_dt, c in c_dt (ab_dt, or f32 under bf16 inputs),
 * fp32 compute; bias (c_dt, [N] per column of c, or NULL) through the bias
 * epilogue. Returns false and a message in why[] on failure; *no_algo is set
 * when cuBLASLt declines the problem (no algorithm for it, or "not
 * supported"), which cuda_gemm_fallback then computes. */
typedef struct {
    void *c;
    const void *a, *b, *bias;
    dtype_t ab_dt, c_dt;
    int64_t M, N, K;
    bool trans_a, trans_b;
    float alpha, beta;
} cuda_gemm_t;
bool cuda_lt_gemm(cuda_lt_t *lt, cudaStream_t st, void *ws, size_t ws_bytes, const cuda_gemm_t *g,
                  bool *no_algo, char *why, size_t why_cap);

/* The same product by a plain tiled kernel (gemm.cu), for what cuBLASLt
 * declines; bias in c_dt. */
cudaError_t cuda_gemm_fallback(cudaStream_t st, const cuda_gemm_t *g);

/* Test hook: while on, cuda_lt_gemm declines every product, so that the
 * fallback kernel computes them all. Process-wide. */
void cuda_lt_set_declined(bool on);

/* cuBLASLt's version as the loaded library reports it (e.g. 130100). */
size_t cuda_lt_version(void);

/* ---- device memory held (held.c) ------------------------------------------- */

/* The bytes of device memory this process holds through the backend: every
 * cudaMalloc block (parameter, gradient and optimizer blocks, activation
 * arenas, IPC buffers, each stream's cuBLASLt workspace) and each stream's
 * scratch, added when allocated and taken off when freed (a pointer never
 * added is ignored). Not in it: the CUDA context, cuBLASLt's own state, and
 * what the memory pool keeps beyond the scratch it handed out. With
 * BATON_CUDA_MEM_REPORT=1 in the environment the process logs the versions
 * it runs with at its first allocation and, at exit, the most it held
 * ("cuda: device memory held at most N bytes ..."; bench/gpu_bench.sh reads
 * it beside torch's max_memory_allocated). Any thread. */
void cuda_held_add(const void *p, size_t nbytes);
void cuda_held_remove(const void *p);
size_t cuda_held_peak(int index);
void cuda_held_peak_restore(int index, size_t peak);

/* ---- backend (backend.c) --------------------------------------------------- */

/* The versions this process runs with, for logs and device checks:
 * "driver 13.0, runtime 13.0, cublasLt 13.1.0, GPU 0: NVIDIA H200 (sm_90) ..." */
void cuda_versions_str(char *buf, size_t cap);

/* Test hook: the next checked call of the op named `op` (e.g.
 * "kern_matmul") reports an injected failure instead of its own status,
 * through the same path as a real one; "<op> scratch" (e.g. "kern_sumsq
 * scratch") fails that op's next scratch allocation instead. NULL clears
 * it. Not thread-safe. */
void cuda_test_inject_failure(const char *op);

/* ---- Mamba2 mixer (mamba.cu): the units of kernels/mamba_seq.h, f32 ------------- */

#include "kernels/mamba_seq.h"

size_t cuda_conv1d_bwd_scratch(const mb_conv_t *a);
cudaError_t cuda_conv1d_causal_fwd(cudaStream_t st, const mb_conv_t *a);
cudaError_t cuda_conv1d_causal_bwd(cudaStream_t st, const mb_conv_t *a, void *scratch);
cudaError_t cuda_ssm_dt_fwd(cudaStream_t st, float *dt, const float *raw, const float *bias,
                            int64_t N, int64_t H, float lo, float hi);
cudaError_t cuda_ssm_dt_bwd(cudaStream_t st, float *draw, float *dbias, const float *ddt,
                            const float *raw, const float *bias, int64_t N, int64_t H, float lo,
                            float hi);
size_t cuda_ssd_fwd_scratch(const mb_ssd_t *a);
size_t cuda_ssd_bwd_scratch(const mb_ssd_t *a);
cudaError_t cuda_ssd_scan_fwd(cudaStream_t st, const mb_ssd_t *a, void *scratch);
/* a's dA_part, dD_part are set inside, from the scratch */
cudaError_t cuda_ssd_scan_bwd(cudaStream_t st, const mb_ssd_t *a, float *dA_log, float *dD,
                              void *scratch);
cudaError_t cuda_gated_rmsnorm_fwd(cudaStream_t st, const mb_gnorm_t *a);
cudaError_t cuda_gated_rmsnorm_bwd(cudaStream_t st, const mb_gnorm_t *a);

#ifdef __cplusplus
}
#endif

#endif
