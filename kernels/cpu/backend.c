/* The CPU backend's ops table: fp32 compute, all float dtypes for copy and
 * the reductions. The adapters only turn the dispatch's void pointers into
 * the float pointers of the layer files; kernels.c guarantees the dtype. */
#include "kernels/cpu/cpu.h"

static void cpu_op_matmul(void *c, const void *a, const void *b, dtype_t dt, int64_t M, int64_t N,
                          int64_t K, bool trans_a, bool trans_b, float alpha, float beta)
{
    cpu_matmul(c, a, b, M, N, K, trans_a, trans_b, alpha, beta);
}

static void cpu_op_linear_fwd(void *out, const void *x, const void *w, const void *bias,
                              dtype_t dt, int64_t N, int64_t IC, int64_t OC)
{
    cpu_linear_fwd(out, x, w, bias, N, IC, OC);
}

static void cpu_op_linear_bwd(void *dx, void *dw, void *dbias, const void *dout, const void *x,
                              const void *w, dtype_t dt, int64_t N, int64_t IC, int64_t OC)
{
    cpu_linear_bwd(dx, dw, dbias, dout, x, w, N, IC, OC);
}

static void cpu_op_add(void *out, const void *a, const void *b, dtype_t dt, int64_t n)
{
    cpu_add(out, a, b, n);
}

static void cpu_op_axpy(void *y, float alpha, const void *x, dtype_t dt, int64_t n)
{
    cpu_axpy(y, alpha, x, n);
}

static void cpu_op_scale(void *p, float s, dtype_t dt, int64_t n) { cpu_scale(p, s, n); }

static void cpu_op_embedding_fwd(void *out, const void *table, const int32_t *ids, dtype_t dt,
                                 int64_t N, int64_t V, int64_t C, int64_t vocab_start)
{
    cpu_embedding_fwd(out, table, ids, N, V, C, vocab_start);
}

static void cpu_op_embedding_bwd(void *dtable, const void *dout, const int32_t *ids, dtype_t dt,
                                 int64_t N, int64_t V, int64_t C, int64_t vocab_start)
{
    cpu_embedding_bwd(dtable, dout, ids, N, V, C, vocab_start);
}

static void cpu_op_rmsnorm_fwd(void *out, float *rstd, const void *x, const void *w, dtype_t dt,
                               int64_t N, int64_t C, float eps)
{
    cpu_rmsnorm_fwd(out, rstd, x, w, N, C, eps);
}

static void cpu_op_rmsnorm_bwd(void *dx, void *dw, const void *dout, const void *x, const void *w,
                               const float *rstd, dtype_t dt, int64_t N, int64_t C)
{
    cpu_rmsnorm_bwd(dx, dw, dout, x, w, rstd, N, C);
}

static void cpu_op_rope_fwd(void *out, const void *x, const float *cos, const float *sin,
                            const int32_t *pos, dtype_t dt, int64_t BT, int64_t H, int64_t D,
                            int64_t P)
{
    cpu_rope_fwd(out, x, cos, sin, pos, BT, H, D, P);
}

static void cpu_op_rope_bwd(void *dx, const void *dout, const float *cos, const float *sin,
                            const int32_t *pos, dtype_t dt, int64_t BT, int64_t H, int64_t D,
                            int64_t P)
{
    cpu_rope_bwd(dx, dout, cos, sin, pos, BT, H, D, P);
}

static void cpu_op_attention_fwd(void *out, float *lse, const void *q, const void *k,
                                 const void *v, dtype_t dt, const kern_attn_shape_t *s)
{
    cpu_attention_fwd(out, lse, q, k, v, s);
}

static void cpu_op_attention_bwd(void *dq, void *dk, void *dv, const void *dout, const void *q,
                                 const void *k, const void *v, const void *out, const float *lse,
                                 dtype_t dt, const kern_attn_shape_t *s)
{
    cpu_attention_bwd(dq, dk, dv, dout, q, k, v, out, lse, s);
}

static void cpu_op_swiglu_fwd(void *out, const void *gate, const void *up, dtype_t dt, int64_t n)
{
    cpu_swiglu_fwd(out, gate, up, n);
}

static void cpu_op_swiglu_bwd(void *dgate, void *dup, const void *dout, const void *gate,
                              const void *up, dtype_t dt, int64_t n)
{
    cpu_swiglu_bwd(dgate, dup, dout, gate, up, n);
}

static int64_t cpu_op_xent_fwd_bwd(float *losses, void *dlogits, const void *logits,
                                   const int32_t *targets, dtype_t dt, int64_t N, int64_t V,
                                   float dloss, int32_t ignore_index)
{
    return cpu_xent_fwd_bwd(losses, dlogits, logits, targets, N, V, dloss, ignore_index);
}

static void cpu_op_xent_vp_max(float *row_max, const void *logits, dtype_t dt, int64_t N,
                               int64_t V)
{
    cpu_xent_vp_max(row_max, logits, N, V);
}

static void cpu_op_xent_vp_sum(float *sumexp, float *tgt_logit, const void *logits,
                               const float *gmax, const int32_t *targets, dtype_t dt, int64_t N,
                               int64_t V, int64_t vocab_start, int32_t ignore_index)
{
    cpu_xent_vp_sum(sumexp, tgt_logit, logits, gmax, targets, N, V, vocab_start, ignore_index);
}

static int64_t cpu_op_xent_vp_finish(float *losses, void *dlogits, const void *logits,
                                     const float *gmax, const float *sumexp,
                                     const float *tgt_logit, const int32_t *targets, dtype_t dt,
                                     int64_t N, int64_t V, int64_t vocab_start, float dloss,
                                     int32_t ignore_index)
{
    return cpu_xent_vp_finish(losses, dlogits, logits, gmax, sumexp, tgt_logit, targets, N, V,
                              vocab_start, dloss, ignore_index);
}

static void cpu_op_adamw(void *param, const void *grad, float *m, float *v, dtype_t dt, int64_t n,
                         const adamw_args_t *args)
{
    cpu_adamw(param, grad, m, v, n, args);
}

const kern_backend_ops_t kern_cpu_ops = {
    .name = "cpu",
    .compute_dtypes = 1u << DT_F32,
    .set_threads = cpu_set_threads,
    .matmul = cpu_op_matmul,
    .linear_fwd = cpu_op_linear_fwd,
    .linear_bwd = cpu_op_linear_bwd,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .add = cpu_op_add,
    .axpy = cpu_op_axpy,
    .scale = cpu_op_scale,
    .sumsq = cpu_sumsq,
    .count_nonfinite = cpu_count_nonfinite,
    .embedding_fwd = cpu_op_embedding_fwd,
    .embedding_bwd = cpu_op_embedding_bwd,
    .rmsnorm_fwd = cpu_op_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_op_rmsnorm_bwd,
    .rope_fwd = cpu_op_rope_fwd,
    .rope_bwd = cpu_op_rope_bwd,
    .attention_fwd = cpu_op_attention_fwd,
    .attention_bwd = cpu_op_attention_bwd,
    .swiglu_fwd = cpu_op_swiglu_fwd,
    .swiglu_bwd = cpu_op_swiglu_bwd,
    .xent_fwd_bwd = cpu_op_xent_fwd_bwd,
    .xent_vp_max = cpu_op_xent_vp_max,
    .xent_vp_sum = cpu_op_xent_vp_sum,
    .xent_vp_finish = cpu_op_xent_vp_finish,
    .adamw = cpu_op_adamw,
};
