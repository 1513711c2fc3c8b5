/* The kernel dispatch: model code calls only these (and kernels/device.h
 * for memory, copies and streams). Every op runs on a stream and on the
 * stream's device: all its tensors must live there. The call checks its
 * arguments, then hands the tensors to the device's backend (cpu/, fenced/,
 * cuda/), so model code never changes when a backend is added. Misuse (a
 * shape, dtype or device that does not match, a dtype the backend lacks)
 * panics with the op's name: it is a caller bug, not bad input; the model
 * asks kern_supports() for every op it needs when it is built.
 *
 * Conventions (llm.c style):
 *  - arguments go stream, outputs, inputs, then scalars;
 *  - every tensor is contiguous; shapes are in the comments, with
 *    N = rows (tokens, B*T flattened), C = channels;
 *  - backward functions ACCUMULATE into their gradient outputs (+=), so that
 *    gradient accumulation over microbatches and branches needs no copies;
 *    a NULL gradient output is skipped;
 *  - forward functions overwrite their outputs;
 *  - on cpu and fenced an op is done when it returns; on cuda it is queued
 *    (kernels/device.h). The two reductions that return a value to the host
 *    (kern_sumsq, kern_count_nonfinite) wait for the stream.
 */
#ifndef BT_KERNELS_KERNELS_H
#define BT_KERNELS_KERNELS_H

#include "base/tensor.h"
#include "kernels/device.h"

/* ---- backend control ---------------------------------------------------- */

/* Threads the CPU backend may use inside one kernel call (its own pool;
 * OpenBLAS itself always runs single-threaded); n <= 0 means "all cores".
 * Several rank processes sharing a host should each ask for their share
 * (cores / local ranks). Process-wide. Results are bit-identical for every
 * thread count. BATON_CPU_THREADS, when set, overrides every request. */
void kern_cpu_set_threads(int n);
/* Host work in n_tasks pieces on the same pool: fn(arg, task) for every
 * task in [0, n_tasks), on as many threads as kern_cpu_set_threads allows;
 * returns when all are done. The tasks must touch disjoint memory, so
 * that what they compute never depends on the thread count. */
void kern_host_parallel(int64_t n_tasks, void (*fn)(void *arg, int64_t task), void *arg);
/* The fp32 FLOP/s of this process's CPU products, measured now (about
 * 0.12 s: every thread of the backend's pool running its own 512-cubed
 * products at once, summed): the peak that a CPU run's MFU is reported
 * against. 0 when it cannot be measured. */
double kern_cpu_peak_flops(void);
/* The product rate of dev in dtype dt, measured now: on cpu and fenced
 * kern_cpu_peak_flops; elsewhere the best of five rounds of ten
 * 4096 x 4096 x 4096 kern_matmul calls on a stream of its own after three
 * warm-up calls (about 20 ms on an H200; the three 4096-squared operands,
 * 96 MiB in bf16, are held meanwhile but do not count in kern_mem_peak). 0 when it
 * cannot be measured (no memory, a failing stream). */
double kern_peak_flops(device_t dev, dtype_t dt);

/* "f32[2,3]": a tensor's dtype and shape, for error messages. */
typedef struct {
    char s[96];
} kern_shape_str_t;
kern_shape_str_t kern_shape_str(const tensor_t *t);

/* ---- dense algebra ---------------------------------------------------- */

/* C[M,N] = alpha * op(A) @ op(B) + beta * C, with op(X) = X or X^T.
 * A, B, C are 2-D (or flattened to rows x cols). */
void kern_matmul(kern_stream_t *s, tensor_t *c, const tensor_t *a, const tensor_t *b, bool trans_a,
                 bool trans_b, float alpha, float beta);

/* out[N,OC] = x[N,IC] @ w[OC,IC]^T + bias[OC] (bias may be NULL). */
void kern_linear_fwd(kern_stream_t *s, tensor_t *out, const tensor_t *x, const tensor_t *w,
                     const tensor_t *bias);
/* dx[N,IC] += dout @ w; dw[OC,IC] += dout^T @ x; dbias[OC] += sum_rows(dout). */
void kern_linear_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, tensor_t *dbias,
                     const tensor_t *dout, const tensor_t *x, const tensor_t *w);

/* Overwriting twins (_set) of four backward ops, for activation gradients
 * that have one producer: the outputs named are written (=) instead of
 * accumulated (+=), so the caller needs no kern_zero before and the op
 * reads no old values. Parameter gradients (dw, dbias) still accumulate.
 * cpu and fenced zero the outputs and accumulate: the bits of kern_zero
 * followed by the accumulating op. cuda writes them outright (products with
 * beta = 0, kernels that store), which equals zero + accumulate except that
 * a -0 result stays -0. An overwritten output may not alias an input. */
/* dx[N,IC] = dout @ w; dw, dbias as kern_linear_bwd. */
void kern_linear_bwd_set(kern_stream_t *s, tensor_t *dx, tensor_t *dw, tensor_t *dbias,
                         const tensor_t *dout, const tensor_t *x, const tensor_t *w);

/* ---- elementwise -------------------------------------------------------- */

void kern_zero(kern_stream_t *s, tensor_t *t);
/* dst = src, converting dtype (f32 <-> bf16/f16/f64); same numel. */
void kern_copy(kern_stream_t *s, tensor_t *dst, const tensor_t *src);
/* out = a + b (out may alias a or b). */
void kern_add(kern_stream_t *s, tensor_t *out, const tensor_t *a, const tensor_t *b);
/* y += alpha * x */
void kern_axpy(kern_stream_t *s, tensor_t *y, float alpha, const tensor_t *x);
void kern_scale(kern_stream_t *s, tensor_t *t, float f);
/* Strided column copy between 2-D views (rows = all dimensions but the
 * last, each row contiguous): for r < rows(dst) and j < n,
 *   dst[r, d0 + j*dstep]  =  (acc ? dst[r, d0 + j*dstep] : 0) + src[r / div, s0 + j*sstep].
 * rows(dst) == rows(src) * div. It splits and joins the parts of attention
 * heads (MLA: the no-rope and rope dims of q and k, k and v out of one
 * projection), repeats one row over div consecutive rows (MLA's rope key
 * shared by every head) and moves interleaved pairs apart or back
 * together (steps of 2). dst and src: the same dtype, no overlap. */
typedef struct {
    int64_t d0, dstep, s0, sstep, n, div;
    bool    acc;
} kern_cols_t;
void kern_copy_cols(kern_stream_t *s, tensor_t *dst, const tensor_t *src, const kern_cols_t *c);
/* sum of squares in double (for global-norm clipping). */
double kern_sumsq(kern_stream_t *s, const tensor_t *t);
/* number of non-finite elements (NaN/Inf check). */
int64_t kern_count_nonfinite(kern_stream_t *s, const tensor_t *t);

/* ---- embedding ---------------------------------------------------------- */

/* out[N,C] = table[ids[n] - vocab_start, :] for ids inside
 * [vocab_start, vocab_start + V); rows for ids outside are zero (this is the
 * vocabulary-parallel embedding shard; vocab_start = 0 unsharded).
 * table[V,C], ids[N] i32. */
void kern_embedding_fwd(kern_stream_t *s, tensor_t *out, const tensor_t *table, const tensor_t *ids,
                        int64_t vocab_start);
/* dtable[V,C] += scatter of dout[N,C] by ids (same range rule). */
void kern_embedding_bwd(kern_stream_t *s, tensor_t *dtable, const tensor_t *dout,
                        const tensor_t *ids, int64_t vocab_start);

/* ---- RMSNorm ------------------------------------------------------------ */

/* out[N,C] = x * rstd * w, rstd[N] (f32) = 1/sqrt(mean(x^2) + eps). */
void kern_rmsnorm_fwd(kern_stream_t *s, tensor_t *out, tensor_t *rstd, const tensor_t *x,
                      const tensor_t *w, float eps);
void kern_rmsnorm_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, const tensor_t *dout,
                      const tensor_t *x, const tensor_t *w, const tensor_t *rstd);
/* The residual add and the next norm in one pass: xout[N,C] = x + y, then
 * ln = xout * rstd * w as kern_rmsnorm_fwd of xout. The bits of kern_add
 * followed by kern_rmsnorm_fwd on every backend: xout is rounded to its
 * dtype before the norm reads it. xout may alias x or y; ln may not alias
 * xout, x or y. */
void kern_add_rmsnorm_fwd(kern_stream_t *s, tensor_t *xout, tensor_t *ln, tensor_t *rstd,
                          const tensor_t *x, const tensor_t *y, const tensor_t *w, float eps);

/* ---- rotary embeddings (HF "rotate_half" convention) ------------------ */

/* x, out [B,T,H,D]; cos, sin [P,D/2] f32 tables (row p = position p);
 * pos[B*T] i32 gives each token's position (p < P). out may alias x.
 * out[..., i]       = x[i] * cos[p,i] - x[i+D/2] * sin[p,i]
 * out[..., i+D/2]   = x[i+D/2] * cos[p,i] + x[i] * sin[p,i]      (i < D/2) */
void kern_rope_fwd(kern_stream_t *s, tensor_t *out, const tensor_t *x, const tensor_t *cos,
                   const tensor_t *sin, const tensor_t *pos);
/* dx += R^T dout (dx may alias dout only when dx was zero: use a copy). */
void kern_rope_bwd(kern_stream_t *s, tensor_t *dx, const tensor_t *dout, const tensor_t *cos,
                   const tensor_t *sin, const tensor_t *pos);
/* dx = R^T dout (kern_linear_bwd_set above; dx may not alias dout). */
void kern_rope_bwd_set(kern_stream_t *s, tensor_t *dx, const tensor_t *dout, const tensor_t *cos,
                       const tensor_t *sin, const tensor_t *pos);

/* ---- attention ---------------------------------------------------------- */

/* Grouped-query scaled dot-product attention.
 * q[B,Tq,Hq,D], k[B,Tk,Hkv,D], v[B,Tk,Hkv,Dv], out[B,Tq,Hq,Dv],
 * lse[B,Hq,Tq] f32 (log-sum-exp of the scaled scores, saved for backward).
 * Hq % Hkv == 0; query head h uses kv head h / (Hq/Hkv).
 * causal: query i (absolute position q_offset + i) sees keys j <= q_offset + i
 * (q_offset lets a context-parallel shard of queries attend to a longer key
 * range; 0 for ordinary attention with Tq == Tk). */
void kern_attention_fwd(kern_stream_t *s, tensor_t *out, tensor_t *lse, const tensor_t *q,
                        const tensor_t *k, const tensor_t *v, float scale, bool causal,
                        int64_t q_offset);
/* dq, dk, dv accumulate. */
void kern_attention_bwd(kern_stream_t *s, tensor_t *dq, tensor_t *dk, tensor_t *dv,
                        const tensor_t *dout, const tensor_t *q, const tensor_t *k,
                        const tensor_t *v, const tensor_t *out, const tensor_t *lse, float scale,
                        bool causal, int64_t q_offset);
/* Merge a partial attention result over another key block into an
 * accumulated one (context parallelism's ring): out[B,Tq,Hq,Dv], lse[B,Hq,Tq]
 * f32 become those over the union of both key sets:
 *   l = log(exp(lse) + exp(part_lse)),
 *   out = exp(lse - l) * out + exp(part_lse - l) * part_out. */
void kern_attention_merge(kern_stream_t *s, tensor_t *out, tensor_t *lse,
                          const tensor_t *part_out, const tensor_t *part_lse);
/* dq, dk, dv overwritten (kern_linear_bwd_set above). */
void kern_attention_bwd_set(kern_stream_t *s, tensor_t *dq, tensor_t *dk, tensor_t *dv,
                            const tensor_t *dout, const tensor_t *q, const tensor_t *k,
                            const tensor_t *v, const tensor_t *out, const tensor_t *lse,
                            float scale, bool causal, int64_t q_offset);
/* The same under a sliding window (window > 0; 0: none): query i
 * (absolute q_offset + i) sees keys j with q_offset + i - window < j <=
 * q_offset + i, as transformers' sliding-window causal mask. Causal only,
 * with the queries the last Tq of the Tk keys (q_offset + Tq == Tk). On the
 * CPU and fenced backends; the CUDA kernels do not take a window (the model
 * refuses such a layer on a GPU before it runs). */
void kern_attention_fwd_window(kern_stream_t *s, tensor_t *out, tensor_t *lse, const tensor_t *q,
                               const tensor_t *k, const tensor_t *v, float scale, bool causal,
                               int64_t q_offset, int64_t window);
void kern_attention_bwd_set_window(kern_stream_t *s, tensor_t *dq, tensor_t *dk, tensor_t *dv,
                                   const tensor_t *dout, const tensor_t *q, const tensor_t *k,
                                   const tensor_t *v, const tensor_t *out, const tensor_t *lse,
                                   float scale, bool causal, int64_t q_offset, int64_t window);

/* ---- MLP ---------------------------------------------------------------- */

/* out[N,F] = silu(gate) * up. */
void kern_swiglu_fwd(kern_stream_t *s, tensor_t *out, const tensor_t *gate, const tensor_t *up);
void kern_swiglu_bwd(kern_stream_t *s, tensor_t *dgate, tensor_t *dup, const tensor_t *dout,
                     const tensor_t *gate, const tensor_t *up);
/* dgate, dup overwritten (kern_linear_bwd_set above). */
void kern_swiglu_bwd_set(kern_stream_t *s, tensor_t *dgate, tensor_t *dup, const tensor_t *dout,
                         const tensor_t *gate, const tensor_t *up);

/* ---- mixture of experts -------------------------------------------------
 *
 * A routed feed-forward layer runs as four steps with explicit buffers, so
 * that expert parallelism can put an all-to-all between them (model/moe.c):
 *   route    logits[N,E] -> probs, each row's top-K experts and their weights
 *   permute  x[N,C] -> xp[M,C], M = N*K: a copy of the row per chosen expert,
 *            the copies grouped by expert (sizes[e] rows each, experts in order)
 *   experts  kern_grouped_linear_* on xp: one product per expert over its rows
 *   combine  yp[M,C] -> y[N,C]: each row's copies weighted and summed back
 * Expert ids, slots and group sizes are i32; probabilities, routing weights
 * and statistics are f32; x, xp, yp, y and the logits are in the compute
 * dtype. Expert ids come from kern_moe_route_fwd: an id outside [0, E) is a
 * caller bug (the CPU twin panics on it). */

/* probs[N,E] f32 = softmax(logits[N,E]) (kept for the backward);
 * experts[N,K] i32 = the K most probable experts of each row, the most
 * probable first (ties: the lower index first); weights[N,K] f32 = their
 * probabilities, divided by the sum of the K when norm. 1 <= K <= E. */
void kern_moe_route_fwd(kern_stream_t *s, tensor_t *weights, tensor_t *experts, tensor_t *probs,
                        const tensor_t *logits, bool norm);
/* dlogits[N,E] += the gradient through the softmax of dweights[N,K] f32 (the
 * gradient of weights: through the renormalisation when norm, and the top-K
 * selection) and, when dprobs is non-NULL, of dprobs[E] f32 added to the
 * gradient of every row's probabilities (a loss linear in the column sums of
 * probs: the router's load-balancing loss). dweights may be NULL. */
void kern_moe_route_bwd(kern_stream_t *s, tensor_t *dlogits, const tensor_t *dweights,
                        const tensor_t *dprobs, const tensor_t *probs, const tensor_t *experts,
                        bool norm);
/* A selection bias (auxiliary-loss-free balancing): experts[N,K] i32 = the
 * K experts of largest probs[n,e] + bias[e] (probs [N,E] f32 as
 * kern_moe_route_fwd wrote them, bias [E] f32; ties: the lower index
 * first), weights[N,K] f32 = their probabilities without the bias (divided
 * by their sum when norm), both overwritten. kern_moe_route_bwd then takes
 * these experts like any others. KERN_OP_MOE_RESELECT: f32 (cpu, fenced, cuda). */
void kern_moe_route_reselect(kern_stream_t *s, tensor_t *weights, tensor_t *experts,
                             const tensor_t *probs, const tensor_t *bias, bool norm);
/* Load-balancing statistics, accumulated: counts[E] f32 += the number of
 * rows whose top-K holds each expert; psum[E] f32 += the column sums of
 * probs[N,E]. */
void kern_moe_route_stats(kern_stream_t *s, tensor_t *counts, tensor_t *psum,
                          const tensor_t *probs, const tensor_t *experts);

/* Dispatch: routed[E] i32 = how many choices (n, k) picked each expert;
 * expert e keeps the first min(routed[e], capacity) of them in row order
 * (capacity < 0: all, dropless) as its sizes[e] i32 consecutive rows of
 * xp[N*K, C], experts in order: xp[off_e + j] = x[n] for e's j-th kept
 * choice (n, k), off_e = sizes[0] + ... + sizes[e-1]. slot[N,K] i32 = the row
 * of xp that choice went to, -1 when dropped. Rows of xp past the kept ones
 * are zeroed. experts[N,K] i32 as kern_moe_route_fwd writes them. */
void kern_moe_permute_fwd(kern_stream_t *s, tensor_t *xp, tensor_t *slot, tensor_t *sizes,
                          tensor_t *routed, const tensor_t *x, const tensor_t *experts,
                          int64_t capacity);
/* The same with a capacity per expert: caps[E] i32 (each >= 0) on the
 * stream's device, expert e keeping the first min(routed[e], caps[e]) of its
 * choices (a share of a microbatch whose budget was worked out over all of
 * it, model/moe.c). */
void kern_moe_permute_fwd_caps(kern_stream_t *s, tensor_t *xp, tensor_t *slot, tensor_t *sizes,
                               tensor_t *routed, const tensor_t *x, const tensor_t *experts,
                               const tensor_t *caps);
/* dx[N,C] += the sum over k of dxp[slot[n,k]] (dropped choices add nothing). */
void kern_moe_permute_bwd(kern_stream_t *s, tensor_t *dx, const tensor_t *dxp,
                          const tensor_t *slot);
/* Combine: y[N,C] = the sum over k of weights[n,k] * yp[slot[n,k]], kept
 * choices only (overwritten; 0 for a row whose choices were all dropped). */
void kern_moe_combine_fwd(kern_stream_t *s, tensor_t *y, const tensor_t *yp, const tensor_t *slot,
                          const tensor_t *weights);
/* dyp[M,C] += weights[n,k] * dy[n] at row slot[n,k]; dweights[N,K] f32 +=
 * dy[n] . yp[slot[n,k]]; nothing for dropped choices. Either output may be NULL. */
void kern_moe_combine_bwd(kern_stream_t *s, tensor_t *dyp, tensor_t *dweights, const tensor_t *dy,
                          const tensor_t *yp, const tensor_t *slot, const tensor_t *weights);

/* A shared expert's gate (Qwen2-MoE): out[N,C] = sigmoid(gate[n]) * x[N,C],
 * gate [N] or [N,1] (overwritten; all in the compute dtype). */
void kern_sigmoid_gate_fwd(kern_stream_t *s, tensor_t *out, const tensor_t *gate,
                           const tensor_t *x);
/* dx[N,C] += sigmoid(gate[n]) * dout; dgate[N] += sigmoid'(gate[n]) * (dout[n] . x[n]).
 * Either output may be NULL. */
void kern_sigmoid_gate_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dgate, const tensor_t *dout,
                           const tensor_t *gate, const tensor_t *x);

/* Grouped products (the experts): the rows of x[M,IC] form G consecutive
 * groups of sizes[g] rows (sizes[G] i32 on the stream's device, summing to
 * at most M), and group g is multiplied by its own matrix: the rows of out
 * of group g = those of x @ w[g]^T, w[G,OC,IC]; rows of out past the groups
 * are zeroed. One product per group (cpu: one sgemm, tiled over the pool as
 * kern_matmul; cuda: one cuBLASLt call per group for now, after reading
 * sizes back, so the call waits for the stream). */
void kern_grouped_linear_fwd(kern_stream_t *s, tensor_t *out, const tensor_t *x, const tensor_t *w,
                             const tensor_t *sizes);
/* dx[M,IC] += dout_g @ w[g] on each group's rows; dw[G,OC,IC] += dout_g^T @ x_g
 * (dw f32 or the compute dtype). Either may be NULL. */
void kern_grouped_linear_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, const tensor_t *dout,
                             const tensor_t *x, const tensor_t *w, const tensor_t *sizes);

/* ---- Mamba2 mixer ---------------------------------------------------------
 *
 * The sequence ops of a Mamba2 mixer, as HF's NemotronHMamba2Mixer computes
 * them on its torch path: causal depthwise conv over x, B, C; dt with its
 * bias, softplus and limits; the chunked SSD scan with the D skip; the gated,
 * grouped RMSNorm (docs/KERNELS.md, "Mamba2 mixer"). Tokens are [B,T,...]
 * rows (batch-major); everything is in the compute dtype except the scan's
 * chunk and decode states and the norm's rstd (f32), and the mixer's small
 * parameters: dt's bias, A_log, D and the gated norm's weight are the
 * compute dtype or f32 (a bf16 model keeps them in f32, model/mamba.c), as
 * parameter gradients are. KERN_OP_MAMBA: f32 on
 * cpu, fenced and cuda, and bf16 on cuda (kernels/cuda/mamba.cu: f32 kernels
 * on f32 copies of the bf16 operands, kernels/cuda/backend.c). */

typedef enum { KERN_ACT_NONE = 0, KERN_ACT_SILU } kern_act_t;

/* out[B,T,C] = act(bias[c] + sum_k w[c,k] * x[b, t-K+1+k, c]), w[C,K],
 * bias[C] or NULL. Inputs before t = 0 are zero or, when state[B,K-1,C] is
 * non-NULL, the last K-1 inputs of the previous call (read, then replaced
 * by the last K-1 inputs of this call's history: the decode cache). */
void kern_conv1d_causal_fwd(kern_stream_t *s, tensor_t *out, tensor_t *state, const tensor_t *x,
                            const tensor_t *w, const tensor_t *bias, kern_act_t act);
/* dx[B,T,C], dw[C,K], dbias[C] += (zero history); any may be NULL. */
void kern_conv1d_causal_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, tensor_t *dbias,
                            const tensor_t *dout, const tensor_t *x, const tensor_t *w,
                            const tensor_t *bias, kern_act_t act);

/* dt[N,H] = clamp(softplus(raw[N,H] + bias[H]), lo, hi) (softplus as torch:
 * the identity above 20). */
void kern_ssm_dt_fwd(kern_stream_t *s, tensor_t *dt, const tensor_t *raw, const tensor_t *bias,
                     float lo, float hi);
/* draw[N,H], dbias[H] += (the clamp passes the gradient where lo <= v <= hi). */
void kern_ssm_dt_bwd(kern_stream_t *s, tensor_t *draw, tensor_t *dbias, const tensor_t *ddt,
                     const tensor_t *raw, const tensor_t *bias, float lo, float hi);

/* The SSD scan, per batch row and head h (group g = h / (H/G)), with
 * A = -exp(A_log[h]) and the state S_t [P,N] (S_{-1} = state or zero):
 *   S_t = exp(dt[t,h] A) S_{t-1} + dt[t,h] x[t,h,:] B[t,g,:]^T
 *   y[t,h,:] = S_t C[t,g,:] + D[h] x[t,h,:]
 * computed by chunks of `chunk` tokens as HF's torch path does (intra-chunk
 * products under the decay mask, chunk states, the recurrence across
 * chunks, back to outputs). x, y [B,T,H,P]; dt [B,T,H]; A_log, D [H] (D may
 * be NULL); Bm, Cm [B,T,G,N]. chunk_states [B,ceil(T/chunk),H,P,N] f32, when
 * non-NULL, receives each chunk's start state (for the backward); state
 * [B,H,P,N] f32, when non-NULL, is the start state and receives the end
 * state (the decode cache). */
void kern_ssd_scan_fwd(kern_stream_t *s, tensor_t *y, tensor_t *chunk_states, tensor_t *state,
                       const tensor_t *x, const tensor_t *dt, const tensor_t *A_log,
                       const tensor_t *Bm, const tensor_t *Cm, const tensor_t *D, int64_t chunk);
/* Gradients (+=; any may be NULL except that chunk_states is the forward's). */
void kern_ssd_scan_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *ddt, tensor_t *dA_log,
                       tensor_t *dB, tensor_t *dC, tensor_t *dD, const tensor_t *dy,
                       const tensor_t *x, const tensor_t *dt, const tensor_t *A_log,
                       const tensor_t *Bm, const tensor_t *Cm, const tensor_t *D,
                       const tensor_t *chunk_states, int64_t chunk);

/* Gated grouped RMSNorm (NemotronHRMSNormGated): h = y * silu(z) over the
 * columns of y, z [N,C], normalised per group of C/groups columns:
 * out = w * h * rstd, rstd[N,groups] f32 = 1/sqrt(mean_group(h^2) + eps). */
void kern_gated_rmsnorm_fwd(kern_stream_t *s, tensor_t *out, tensor_t *rstd, const tensor_t *y,
                            const tensor_t *z, const tensor_t *w, int64_t groups, float eps);
/* dy, dz [N,C], dw [C] +=; any may be NULL. */
void kern_gated_rmsnorm_bwd(kern_stream_t *s, tensor_t *dy, tensor_t *dz, tensor_t *dw,
                            const tensor_t *dout, const tensor_t *y, const tensor_t *z,
                            const tensor_t *w, const tensor_t *rstd, int64_t groups);

/* Squared ReLU (NemotronH's MLP, transformers' relu2): out[n] = max(x, 0)^2.
 * KERN_OP_RELU2: f32 on cpu and fenced, f32 and bf16 on cuda. */
void kern_relu2_fwd(kern_stream_t *s, tensor_t *out, const tensor_t *x);
/* dx[n] += 2 max(x, 0) dout (kern_relu2_bwd_set: =). */
void kern_relu2_bwd(kern_stream_t *s, tensor_t *dx, const tensor_t *dout, const tensor_t *x);
void kern_relu2_bwd_set(kern_stream_t *s, tensor_t *dx, const tensor_t *dout, const tensor_t *x);

/* ---- loss --------------------------------------------------------------- */

/* Fused softmax cross-entropy. logits[N,V], targets[N] i32 (ignore_index ->
 * loss 0, no gradient). losses[N] f32 (nats). When dlogits[N,V] is non-NULL
 * it is OVERWRITTEN with dloss * (softmax - onehot) per row, dloss being the
 * gradient of the caller's total loss w.r.t. each row's loss (1/num_scored
 * for a mean). */
void kern_xent_fwd_bwd(kern_stream_t *s, tensor_t *losses, tensor_t *dlogits,
                       const tensor_t *logits, const tensor_t *targets, float dloss,
                       int32_t ignore_index);

/* Vocabulary-parallel pieces of the same loss (tensor parallelism): each rank
 * holds logits[N,Vr] for vocab [vocab_start, vocab_start+Vr).
 * Pass 1: row_max[N] = max over the shard.                (all-reduce MAX)
 * Pass 2: sumexp[N] = sum exp(logit - gmax); tgt[N] = logit of the target
 *         when it is in this shard else 0.                (all-reduce SUM)
 * Pass 3: losses = log(sumexp) + gmax - tgt; dlogits as above for the shard. */
void kern_xent_vp_max(kern_stream_t *s, tensor_t *row_max, const tensor_t *logits);
void kern_xent_vp_sum(kern_stream_t *s, tensor_t *sumexp, tensor_t *tgt_logit,
                      const tensor_t *logits, const tensor_t *gmax, const tensor_t *targets,
                      int64_t vocab_start, int32_t ignore_index);
void kern_xent_vp_finish(kern_stream_t *s, tensor_t *losses, tensor_t *dlogits,
                         const tensor_t *logits, const tensor_t *gmax, const tensor_t *sumexp,
                         const tensor_t *tgt_logit, const tensor_t *targets, int64_t vocab_start,
                         float dloss, int32_t ignore_index);

/* ---- optimizer ---------------------------------------------------------- */

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    int64_t step; /* 1-based step for bias correction */
} adamw_args_t;

/* PyTorch torch.optim.AdamW semantics (decoupled weight decay, bias
 * correction as in torch's single-tensor path):
 *   p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *   p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
 * param, grad, m, v share shape; m, v are f32. */
/* param_copy, when non-NULL, receives the updated parameter in its own
 * dtype in the same pass (the bf16 compute copy of an f32 master). grad is
 * param's dtype or f32. */
void kern_adamw(kern_stream_t *s, tensor_t *param, tensor_t *param_copy, const tensor_t *grad,
                tensor_t *m, tensor_t *v, const adamw_args_t *args);

#endif
