/* CPU fp32 kernels, one layer per file, forward beside backward
 * (CONVENTIONS.md: kernels). Arguments go outputs, inputs, dimensions; shapes are in the
 * comments; backward functions accumulate into their gradients (+=) and skip
 * NULL ones. Inputs are trusted: kernels.c has checked them.
 * These are the reference twins that CUDA kernels are tested against. */
#ifndef BT_KERNELS_CPU_CPU_H
#define BT_KERNELS_CPU_CPU_H

#include "kernels/backend.h"

#include <stdint.h>

/* vmath.c: vectorized row primitives (AVX2+FMA when the CPU has it).
 * exp here is within 2 ulp of expf; see vmath.c for its range contract. */
float  cpu_expf_fast(float x);
/* y[n] = exp(x[n] - shift) (y may alias x); returns sum(y) accumulated in double */
double cpu_vexp_sum(float *y, const float *x, int64_t n, float shift);
float  cpu_vmax(const float *x /* [n] */, int64_t n); /* -inf when n == 0 */
void   cpu_vscale(float *y /* [n] */, int64_t n, float s);
/* y[n] = y * (a[n] - c) */
void   cpu_vmul_sub(float *y, const float *a, int64_t n, float c);
/* out[n] = silu(g) * u, and its backward (accumulating, NULL skipped) */
void   cpu_vsilu_mul(float *out, const float *g, const float *u, int64_t n);
void   cpu_vsilu_mul_bwd(float *dgate, float *dup, const float *dout, const float *g,
                         const float *u, int64_t n);

/* pool.c: the backend's threads (see pool.c for the contract). n <= 0: all
 * cores; BATON_CPU_THREADS, when set, overrides every request. */
typedef void (*cpu_task_fn)(void *arg, int64_t task);
void cpu_pool_set_threads(int n);
int  cpu_pool_threads(void);
void cpu_pool_run(int64_t n_tasks, cpu_task_fn fn, void *arg);

/* matmul.c (OpenBLAS, one thread per call; large products tiled over the
 * pool by shape, so the bits never depend on the thread count) */
void cpu_matmul(float *c,       /* [M,N] */
                const float *a, /* [M,K], or [K,M] when trans_a */
                const float *b, /* [K,N], or [N,K] when trans_b */
                int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, float alpha,
                float beta);
/* cpu_matmul on strided row-major views: rows of a, b, c are lda, ldb, ldc apart. */
void cpu_matmul_ld(float *c, const float *a, const float *b, int64_t M, int64_t N, int64_t K,
                   int64_t lda, int64_t ldb, int64_t ldc, bool trans_a, bool trans_b, float alpha,
                   float beta);
void cpu_linear_fwd(float *out,        /* [N,OC] */
                    const float *x,    /* [N,IC] */
                    const float *w,    /* [OC,IC] */
                    const float *bias, /* [OC] or NULL */
                    int64_t N, int64_t IC, int64_t OC);
void cpu_linear_bwd(float *dx,         /* [N,IC] or NULL, += */
                    float *dw,         /* [OC,IC] or NULL, += */
                    float *dbias,      /* [OC] or NULL, += */
                    const float *dout, /* [N,OC] */
                    const float *x,    /* [N,IC] */
                    const float *w,    /* [OC,IC] */
                    int64_t N, int64_t IC, int64_t OC);

/* grouped products (matmul.c): rows of x in G consecutive groups of sizes[g]
 * rows (sum <= M), group g times w[g]; one product per group */
void cpu_grouped_linear_fwd(float *out,           /* [M,OC]; rows past the groups zeroed */
                            const float *x,       /* [M,IC] */
                            const float *w,       /* [G,OC,IC] */
                            const int32_t *sizes, /* [G] */
                            int64_t M, int64_t IC, int64_t OC, int64_t G);
void cpu_grouped_linear_bwd(float *dx,            /* [M,IC] or NULL, += */
                            float *dw,            /* [G,OC,IC] or NULL, += */
                            const float *dout,    /* [M,OC] */
                            const float *x,       /* [M,IC] */
                            const float *w,       /* [G,OC,IC] */
                            const int32_t *sizes, /* [G] */
                            int64_t M, int64_t IC, int64_t OC, int64_t G);

/* elementwise.c; the dtype-generic ones take any float dtype */
void    cpu_zero(void *p, size_t nbytes);
void    cpu_copy(void *dst, dtype_t dst_dt, const void *src, dtype_t src_dt, int64_t n);
void    cpu_add(float *out /* [n] */, const float *a /* [n] */, const float *b /* [n] */,
                int64_t n);
void    cpu_axpy(float *y /* [n] */, float alpha, const float *x /* [n] */, int64_t n);
void    cpu_scale(float *p /* [n] */, float s, int64_t n);
double  cpu_sumsq(const void *p /* [n] */, dtype_t dt, int64_t n);
int64_t cpu_count_nonfinite(const void *p /* [n] */, dtype_t dt, int64_t n);

/* embedding.c: ids outside [vocab_start, vocab_start+V) give zero rows / no gradient */
void cpu_embedding_fwd(float *out,         /* [N,C] */
                       const float *table, /* [V,C] */
                       const int32_t *ids, /* [N] */
                       int64_t N, int64_t V, int64_t C, int64_t vocab_start);
void cpu_embedding_bwd(float *dtable,      /* [V,C] += */
                       const float *dout,  /* [N,C] */
                       const int32_t *ids, /* [N] */
                       int64_t N, int64_t V, int64_t C, int64_t vocab_start);

/* rmsnorm.c */
void cpu_rmsnorm_fwd(float *out,     /* [N,C] */
                     float *rstd,    /* [N] */
                     const float *x, /* [N,C] */
                     const float *w, /* [C] */
                     int64_t N, int64_t C, float eps);
void cpu_rmsnorm_bwd(float *dx,         /* [N,C] or NULL, += */
                     float *dw,         /* [C] or NULL, += */
                     const float *dout, /* [N,C] */
                     const float *x,    /* [N,C] */
                     const float *w,    /* [C] */
                     const float *rstd, /* [N] */
                     int64_t N, int64_t C);
/* xout = x + y (may alias either), then cpu_rmsnorm_fwd of xout */
void cpu_add_rmsnorm_fwd(float *xout,    /* [N,C] */
                         float *out,     /* [N,C] */
                         float *rstd,    /* [N] */
                         const float *x, /* [N,C] */
                         const float *y, /* [N,C] */
                         const float *w, /* [C] */
                         int64_t N, int64_t C, float eps);

/* rope.c */
void cpu_rope_fwd(float *out,         /* [BT,H,D], may alias x */
                  const float *x,     /* [BT,H,D] */
                  const float *cos,   /* [P,D/2] */
                  const float *sin,   /* [P,D/2] */
                  const int32_t *pos, /* [BT], each in [0,P) */
                  int64_t BT, int64_t H, int64_t D, int64_t P);
void cpu_rope_bwd(float *dx,          /* [BT,H,D] += */
                  const float *dout,  /* [BT,H,D] */
                  const float *cos,   /* [P,D/2] */
                  const float *sin,   /* [P,D/2] */
                  const int32_t *pos, /* [BT], each in [0,P) */
                  int64_t BT, int64_t H, int64_t D, int64_t P);

/* attention.c */
void cpu_attention_fwd(float *out,     /* [B,Tq,Hq,Dv] */
                       float *lse,     /* [B,Hq,Tq] */
                       const float *q, /* [B,Tq,Hq,D] */
                       const float *k, /* [B,Tk,Hkv,D] */
                       const float *v, /* [B,Tk,Hkv,Dv] */
                       const kern_attn_shape_t *s);
/* out [B,Tq,Hq,Dv], lse [B,Hq,Tq] merged with part_out, part_lse in place */
void cpu_attention_merge(float *out, float *lse, const float *part_out, const float *part_lse,
                         int64_t B, int64_t Tq, int64_t Hq, int64_t Dv);
void cpu_attention_bwd(float *dq,         /* [B,Tq,Hq,D] or NULL, += */
                       float *dk,         /* [B,Tk,Hkv,D] or NULL, += */
                       float *dv,         /* [B,Tk,Hkv,Dv] or NULL, += */
                       const float *dout, /* [B,Tq,Hq,Dv] */
                       const float *q,    /* [B,Tq,Hq,D] */
                       const float *k,    /* [B,Tk,Hkv,D] */
                       const float *v,    /* [B,Tk,Hkv,Dv] */
                       const float *out,  /* [B,Tq,Hq,Dv] */
                       const float *lse,  /* [B,Hq,Tq] */
                       const kern_attn_shape_t *s);

/* swiglu.c */
void cpu_swiglu_fwd(float *out /* [n] */, const float *gate /* [n] */, const float *up /* [n] */,
                    int64_t n);
void cpu_swiglu_bwd(float *dgate,      /* [n] or NULL, += */
                    float *dup,        /* [n] or NULL, += */
                    const float *dout, /* [n] */
                    const float *gate, /* [n] */
                    const float *up,   /* [n] */
                    int64_t n);

/* xent.c */
int64_t cpu_xent_fwd_bwd(float *losses,          /* [N] */
                         float *dlogits,         /* [N,V] or NULL, overwritten */
                         const float *logits,    /* [N,V] */
                         const int32_t *targets, /* [N] */
                         int64_t N, int64_t V, float dloss, int32_t ignore_index);
void    cpu_xent_vp_max(float *row_max /* [N] */, const float *logits /* [N,V] */, int64_t N,
                        int64_t V);
void    cpu_xent_vp_sum(float *sumexp,          /* [N] */
                        float *tgt_logit,       /* [N] */
                        const float *logits,    /* [N,V] shard */
                        const float *gmax,      /* [N] */
                        const int32_t *targets, /* [N] */
                        int64_t N, int64_t V, int64_t vocab_start, int32_t ignore_index);
int64_t cpu_xent_vp_finish(float *losses,          /* [N] */
                           float *dlogits,         /* [N,V] shard or NULL, overwritten */
                           const float *logits,    /* [N,V] shard */
                           const float *gmax,      /* [N] */
                           const float *sumexp,    /* [N] */
                           const float *tgt_logit, /* [N] */
                           const int32_t *targets, /* [N] */
                           int64_t N, int64_t V, int64_t vocab_start, float dloss,
                           int32_t ignore_index);

/* moe.c: routing, dispatch and combine of routed experts (kernels.h) */
void cpu_moe_route_reselect(float *weights, int32_t *experts, const float *probs,
                            const float *bias, int64_t N, int64_t E, int64_t K, bool norm);
void cpu_moe_route_fwd(float *weights,      /* [N,K] */
                       int32_t *experts,    /* [N,K] */
                       float *probs,        /* [N,E] */
                       const float *logits, /* [N,E] */
                       int64_t N, int64_t E, int64_t K, bool norm);
void cpu_moe_route_bwd(float *dlogits,         /* [N,E] += */
                       const float *dweights,  /* [N,K] or NULL */
                       const float *dprobs,    /* [E] or NULL */
                       const float *probs,     /* [N,E] */
                       const int32_t *experts, /* [N,K] */
                       int64_t N, int64_t E, int64_t K, bool norm);
void cpu_moe_route_stats(float *counts,          /* [E] += */
                         float *psum,            /* [E] += */
                         const float *probs,     /* [N,E] */
                         const int32_t *experts, /* [N,K] */
                         int64_t N, int64_t E, int64_t K);
void cpu_moe_permute_fwd(float *xp,              /* [N*K,C] */
                         int32_t *slot,          /* [N,K] */
                         int32_t *sizes,         /* [E] */
                         int32_t *routed,        /* [E] */
                         const float *x,         /* [N,C] */
                         const int32_t *experts, /* [N,K] */
                         int64_t N, int64_t C, int64_t K, int64_t E, int64_t capacity,
                         const int32_t *caps);   /* [E], or NULL: capacity for all */
void cpu_moe_permute_bwd(float *dx,           /* [N,C] += */
                         const float *dxp,    /* [N*K,C] */
                         const int32_t *slot, /* [N,K] */
                         int64_t N, int64_t C, int64_t K);
void cpu_moe_combine_fwd(float *y,              /* [N,C] */
                         const float *yp,       /* [N*K,C] */
                         const int32_t *slot,   /* [N,K] */
                         const float *weights,  /* [N,K] */
                         int64_t N, int64_t C, int64_t K);
void cpu_moe_combine_bwd(float *dyp,            /* [N*K,C] or NULL, += */
                         float *dweights,       /* [N,K] or NULL, += */
                         const float *dy,       /* [N,C] */
                         const float *yp,       /* [N*K,C] */
                         const int32_t *slot,   /* [N,K] */
                         const float *weights,  /* [N,K] */
                         int64_t N, int64_t C, int64_t K);
void cpu_sigmoid_gate_fwd(float *out,        /* [N,C] */
                          const float *gate,  /* [N] */
                          const float *x,     /* [N,C] */
                          int64_t N, int64_t C);
void cpu_sigmoid_gate_bwd(float *dx,          /* [N,C] or NULL, += */
                          float *dgate,       /* [N] or NULL, += */
                          const float *dout,  /* [N,C] */
                          const float *gate,  /* [N] */
                          const float *x,     /* [N,C] */
                          int64_t N, int64_t C);

/* mamba.c: the Mamba2 mixer's sequence ops (kernels.h, "Mamba2 mixer") */
typedef struct {
    int64_t B, T, H, P, G, N, chunk; /* batch, tokens, heads, head dim, groups, state, chunk */
} cpu_ssd_shape_t;
void cpu_conv1d_causal_fwd(float *out,        /* [B,T,C] */
                           float *state,      /* [B,K-1,C] or NULL, read then replaced */
                           const float *x,    /* [B,T,C] */
                           const float *w,    /* [C,K] */
                           const float *bias, /* [C] or NULL */
                           int64_t B, int64_t T, int64_t C, int64_t K, kern_act_t act);
void cpu_conv1d_causal_bwd(float *dx,         /* [B,T,C] or NULL, += */
                           float *dw,         /* [C,K] or NULL, += */
                           float *dbias,      /* [C] or NULL, += */
                           const float *dout, /* [B,T,C] */
                           const float *x,    /* [B,T,C] */
                           const float *w,    /* [C,K] */
                           const float *bias, /* [C] or NULL */
                           int64_t B, int64_t T, int64_t C, int64_t K, kern_act_t act);
void cpu_ssm_dt_fwd(float *dt /* [N,H] */, const float *raw /* [N,H] */,
                    const float *bias /* [H] */, int64_t N, int64_t H, float lo, float hi);
void cpu_ssm_dt_bwd(float *draw /* [N,H] or NULL, += */, float *dbias /* [H] or NULL, += */,
                    const float *ddt, const float *raw, const float *bias, int64_t N, int64_t H,
                    float lo, float hi);
void cpu_ssd_scan_fwd(float *y,            /* [B,T,H,P] */
                      float *chunk_states, /* [B,nc,H,P,N] or NULL */
                      float *state,        /* [B,H,P,N] or NULL: start, then end state */
                      const float *x,      /* [B,T,H,P] */
                      const float *dt,     /* [B,T,H] */
                      const float *A_log,  /* [H] */
                      const float *Bm,     /* [B,T,G,N] */
                      const float *Cm,     /* [B,T,G,N] */
                      const float *D,      /* [H] or NULL */
                      const cpu_ssd_shape_t *sh);
void cpu_ssd_scan_bwd(float *dx, float *ddt, float *dA_log, float *dB, float *dC,
                      float *dD, /* shaped as their inputs, or NULL; += */
                      const float *dy, const float *x, const float *dt, const float *A_log,
                      const float *Bm, const float *Cm, const float *D,
                      const float *chunk_states, const cpu_ssd_shape_t *sh);
void cpu_gated_rmsnorm_fwd(float *out,     /* [N,C] */
                           float *rstd,    /* [N,G] */
                           const float *y, /* [N,C] */
                           const float *z, /* [N,C] */
                           const float *w, /* [C] */
                           int64_t N, int64_t C, int64_t G, float eps);
void cpu_gated_rmsnorm_bwd(float *dy, float *dz, float *dw, /* or NULL; += */
                           const float *dout, const float *y, const float *z, const float *w,
                           const float *rstd, int64_t N, int64_t C, int64_t G);

/* adamw.c */
void cpu_adamw(float *param,      /* [n] */
               const float *grad, /* [n] */
               float *m,          /* [n] */
               float *v,          /* [n] */
               int64_t n, const adamw_args_t *args);

#endif
