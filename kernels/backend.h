/* The backend interface behind kernels/kernels.h (internal to kernels/).
 *
 * kernels.c checks every call (shapes, contiguity, dtypes, devices), reduces
 * the tensors to data pointers and dimensions, and calls the ops table of the
 * tensors' device. A backend therefore never re-validates: it gets pointers it
 * may trust, element counts, and the dtype of the data (one of the bits in its
 * compute_dtypes for compute ops; any dtype for zero/copy/sumsq/count, where
 * the backend decides and panics for what it lacks).
 *
 * Adding a backend (the CUDA twins): fill a kern_backend_ops_t with designated
 * initializers in its own file and put it in kern_backends[] in kernels.c.
 * Model code does not change. Every entry is required.
 *
 * Layouts and conventions are those of kernels.h: row-major contiguous,
 * backward entries accumulate (+=) and skip NULL gradient outputs.
 */
#ifndef BT_KERNELS_BACKEND_H
#define BT_KERNELS_BACKEND_H

#include "kernels/kernels.h"

/* Shape of one attention call: q[B,Tq,Hq,D] k[B,Tk,Hkv,D] v[B,Tk,Hkv,Dv]. */
typedef struct {
    int64_t B, Tq, Tk, Hq, Hkv, D, Dv;
    float   scale;
    bool    causal;
    int64_t q_offset;
} kern_attn_shape_t;

typedef struct {
    const char *name;
    uint32_t    compute_dtypes; /* bit (1u << dtype) per dtype the compute ops take */

    void (*set_threads)(int n);

    /* c[M,N] = alpha op(a) op(b) + beta c; a is [M,K] or [K,M] (trans_a), b [K,N] or [N,K] */
    void (*matmul)(void *c, const void *a, const void *b, dtype_t dt, int64_t M, int64_t N,
                   int64_t K, bool trans_a, bool trans_b, float alpha, float beta);
    void (*linear_fwd)(void *out, const void *x, const void *w, const void *bias, dtype_t dt,
                       int64_t N, int64_t IC, int64_t OC);
    void (*linear_bwd)(void *dx, void *dw, void *dbias, const void *dout, const void *x,
                       const void *w, dtype_t dt, int64_t N, int64_t IC, int64_t OC);

    void (*zero)(void *p, size_t nbytes);
    void (*copy)(void *dst, dtype_t dst_dt, const void *src, dtype_t src_dt, int64_t n);
    void (*add)(void *out, const void *a, const void *b, dtype_t dt, int64_t n);
    void (*axpy)(void *y, float alpha, const void *x, dtype_t dt, int64_t n);
    void (*scale)(void *p, float s, dtype_t dt, int64_t n);
    double (*sumsq)(const void *p, dtype_t dt, int64_t n);
    int64_t (*count_nonfinite)(const void *p, dtype_t dt, int64_t n);

    void (*embedding_fwd)(void *out, const void *table, const int32_t *ids, dtype_t dt, int64_t N,
                          int64_t V, int64_t C, int64_t vocab_start);
    void (*embedding_bwd)(void *dtable, const void *dout, const int32_t *ids, dtype_t dt,
                          int64_t N, int64_t V, int64_t C, int64_t vocab_start);

    void (*rmsnorm_fwd)(void *out, float *rstd, const void *x, const void *w, dtype_t dt,
                        int64_t N, int64_t C, float eps);
    void (*rmsnorm_bwd)(void *dx, void *dw, const void *dout, const void *x, const void *w,
                        const float *rstd, dtype_t dt, int64_t N, int64_t C);

    /* BT = tokens, H heads of D; P rows in the cos/sin tables */
    void (*rope_fwd)(void *out, const void *x, const float *cos, const float *sin,
                     const int32_t *pos, dtype_t dt, int64_t BT, int64_t H, int64_t D, int64_t P);
    void (*rope_bwd)(void *dx, const void *dout, const float *cos, const float *sin,
                     const int32_t *pos, dtype_t dt, int64_t BT, int64_t H, int64_t D, int64_t P);

    void (*attention_fwd)(void *out, float *lse, const void *q, const void *k, const void *v,
                          dtype_t dt, const kern_attn_shape_t *s);
    void (*attention_bwd)(void *dq, void *dk, void *dv, const void *dout, const void *q,
                          const void *k, const void *v, const void *out, const float *lse,
                          dtype_t dt, const kern_attn_shape_t *s);

    void (*swiglu_fwd)(void *out, const void *gate, const void *up, dtype_t dt, int64_t n);
    void (*swiglu_bwd)(void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                       dtype_t dt, int64_t n);

    int64_t (*xent_fwd_bwd)(float *losses, void *dlogits, const void *logits,
                            const int32_t *targets, dtype_t dt, int64_t N, int64_t V, float dloss,
                            int32_t ignore_index);
    void (*xent_vp_max)(float *row_max, const void *logits, dtype_t dt, int64_t N, int64_t V);
    void (*xent_vp_sum)(float *sumexp, float *tgt_logit, const void *logits, const float *gmax,
                        const int32_t *targets, dtype_t dt, int64_t N, int64_t V,
                        int64_t vocab_start, int32_t ignore_index);
    int64_t (*xent_vp_finish)(float *losses, void *dlogits, const void *logits, const float *gmax,
                              const float *sumexp, const float *tgt_logit, const int32_t *targets,
                              dtype_t dt, int64_t N, int64_t V, int64_t vocab_start, float dloss,
                              int32_t ignore_index);

    void (*adamw)(void *param, const void *grad, float *m, float *v, dtype_t dt, int64_t n,
                  const adamw_args_t *args);
} kern_backend_ops_t;

extern const kern_backend_ops_t kern_cpu_ops;
#ifdef BT_HAVE_CUDA
extern const kern_backend_ops_t kern_cuda_ops;
#endif

#endif
