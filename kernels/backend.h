/* The backend interface behind kernels/device.h and kernels/kernels.h
 * (internal to kernels/).
 *
 * kernels.c checks every call (shapes, contiguity, dtypes, devices: all on
 * the stream's device) and then calls the ops table of the stream's device
 * with the tensors themselves, so a backend never re-validates: it reads
 * data, dtype and shape, which it may trust. A compute op is only called
 * for a dtype its op_dtypes entry lists.
 *
 * Streams: every backend's stream struct starts with kern_stream_t (below);
 * a backend records the first failure of queued work in it (kern_stream_fail).
 *
 * Adding a backend: fill a kern_backend_t with designated initializers in
 * its own file, give it a device kind (base/tensor.h) and return it from
 * backend_of() (kernels/device.c), linked in or loaded as a shared object
 * as the CUDA one is. Model code does not change. Every entry is required; an op
 * the device lacks has a zero op_dtypes entry (and its function may panic).
 *
 * Layouts and conventions are those of kernels.h: row-major contiguous,
 * backward entries accumulate (+=) and skip NULL gradient outputs. The four
 * with a `set` argument write the outputs kernels.h names for their _set
 * twins (=) when it is true; a backend that does not overwrite zeroes them
 * first and accumulates (cpu, fenced: the bits of kern_zero + the op).
 */
#ifndef BT_KERNELS_BACKEND_H
#define BT_KERNELS_BACKEND_H

#include "kernels/kernels.h"

typedef struct kern_backend kern_backend_t;

/* The public head of every backend's stream. */
struct kern_stream {
    const kern_backend_t *be;
    device_t dev;
    bt_status_t error; /* first failure of queued work, BT_OK if none */
    char error_op[48];
};

/* The public head of every backend's event. */
struct kern_event {
    const kern_backend_t *be;
    device_t dev;
};

/* Records the first failure on s (later ones are dropped); logs it once. */
void kern_stream_fail(kern_stream_t *s, const char *op, const char *detail);

/* What the CPU kernels compute in, as an op_dtypes initializer: the cpu
 * backend's, and the fenced one's, which runs the same kernels. */
#define KERN_CPU_OP_DTYPES                                                                        \
    {                                                                                             \
        [KERN_OP_MATMUL] = 1u << DT_F32, [KERN_OP_LINEAR] = 1u << DT_F32,                         \
        [KERN_OP_ELEMENTWISE] = 1u << DT_F32,                                                     \
        [KERN_OP_REDUCE] = (1u << DT_F32) | (1u << DT_BF16) | (1u << DT_F16) | (1u << DT_F64),    \
        [KERN_OP_EMBEDDING] = 1u << DT_F32, [KERN_OP_RMSNORM] = 1u << DT_F32,                     \
        [KERN_OP_ROPE] = 1u << DT_F32, [KERN_OP_ATTENTION] = 1u << DT_F32,                        \
        [KERN_OP_SWIGLU] = 1u << DT_F32, [KERN_OP_XENT] = 1u << DT_F32,                           \
        [KERN_OP_ADAMW] = 1u << DT_F32, [KERN_OP_MOE_ROUTE] = 1u << DT_F32,                       \
        [KERN_OP_MOE_PERMUTE] = 1u << DT_F32, [KERN_OP_MOE_COMBINE] = 1u << DT_F32,               \
        [KERN_OP_GROUPED_LINEAR] = 1u << DT_F32, [KERN_OP_MOE_RESELECT] = 1u << DT_F32,           \
        [KERN_OP_MAMBA] = 1u << DT_F32, [KERN_OP_RELU2] = 1u << DT_F32,                           \
    }

/* Streams and events of a backend whose work is done before each call
 * returns (cpu, fenced; kernels/cpu/backend.c): sync and notify report the
 * stream's recorded failure, every event is complete. */
bt_status_t kern_immediate_stream_create(const kern_backend_t *be, device_t dev, kern_stream_t **out);
void        kern_immediate_stream_destroy(kern_stream_t *s);
bt_status_t kern_immediate_stream_sync(kern_stream_t *s);
bt_status_t kern_immediate_stream_notify(kern_stream_t *s, kern_notify_fn fn, void *arg);
bt_status_t kern_immediate_stream_reserve(kern_stream_t *s, size_t nbytes);
bt_status_t kern_immediate_event_create(const kern_backend_t *be, device_t dev, kern_event_t **out);
void        kern_immediate_event_destroy(kern_event_t *e);
void        kern_immediate_event_record(kern_event_t *e, kern_stream_t *s);
void        kern_immediate_stream_wait(kern_stream_t *s, kern_event_t *e);

/* Shape of one attention call: q[B,Tq,Hq,D] k[B,Tk,Hkv,D] v[B,Tk,Hkv,Dv]. */
typedef struct {
    int64_t B, Tq, Tk, Hq, Hkv, D, Dv;
    float scale;
    bool causal;
    int64_t q_offset;
    /* sliding window (causal only): query i (absolute q_offset + i) sees
     * keys j with q_offset + i - window < j <= q_offset + i; 0: no window */
    int64_t window;
} kern_attn_shape_t;

typedef const tensor_t ct_t; /* shorthand for the input tensors below */

struct kern_backend {
    const char *name;
    device_kind_t kind;
    uint32_t op_dtypes[KERN_OP_COUNT]; /* bit (1u << dtype) per compute dtype */

    /* devices and memory */
    bool (*usable)(int index, char *why, size_t why_cap);
    bt_status_t (*mem_alloc)(int index, size_t nbytes, void **out);
    void (*mem_free)(int index, void *p);
    bt_status_t (*host_alloc)(int index, size_t nbytes, void **out);
    void (*host_free)(int index, void *p);
    /* the most device memory this process held at once through mem_alloc,
     * stream scratch and library workspaces (kern_mem_peak); NULL where
     * device memory is host memory and the resident size says it */
    size_t (*mem_peak)(int index);
    /* sets that peak back to max(peak, what is held now): a measurement's
     * own buffers do not count (kern_peak_flops) */
    void (*mem_peak_restore)(int index, size_t peak);
    /* whether attention_fwd/bwd take a sliding window that cuts keys, at
     * this dtype; false with the reason in why[]. NULL where they always do. */
    bool (*attention_window)(dtype_t dt, char *why, size_t cap);
    /* memory another process of this host can map (kernels/device.h,
     * kern_ipc_*): has_ipc false and functions that answer
     * BT_ERR_UNSUPPORTED where the device has none */
    bool has_ipc;
    bt_status_t (*ipc_alloc)(int index, size_t nbytes, void **out, kern_ipc_handle_t *h);
    void (*ipc_free)(int index, void *p, size_t nbytes, const kern_ipc_handle_t *h);
    bt_status_t (*ipc_open)(int index, const kern_ipc_handle_t *h, size_t nbytes, void **out);
    void (*ipc_close)(int index, void *p, size_t nbytes);

    /* streams and events */
    bt_status_t (*stream_create)(int index, kern_stream_t **out);
    void (*stream_destroy)(kern_stream_t *s);
    bt_status_t (*stream_sync)(kern_stream_t *s);
    bt_status_t (*stream_notify)(kern_stream_t *s, kern_notify_fn fn, void *arg);
    bt_status_t (*stream_reserve)(kern_stream_t *s, size_t nbytes);
    bt_status_t (*event_create)(int index, kern_event_t **out);
    void (*event_destroy)(kern_event_t *e);
    void (*event_record)(kern_event_t *e, kern_stream_t *s);
    void (*stream_wait)(kern_stream_t *s, kern_event_t *e);
    void *(*stream_native)(kern_stream_t *s); /* optional: kern_stream_native */

    /* copies: nbytes between host memory and the device (upload, download) */
    void (*upload)(kern_stream_t *s, void *dst, const void *host, size_t nbytes);
    void (*download)(kern_stream_t *s, void *host, const void *src, size_t nbytes);

    /* compute: c[M,N] = alpha op(a) op(b) + beta c */
    void (*matmul)(kern_stream_t *s, tensor_t *c, ct_t *a, ct_t *b, bool trans_a, bool trans_b,
                   float alpha, float beta);
    void (*linear_fwd)(kern_stream_t *s, tensor_t *out, ct_t *x, ct_t *w, ct_t *bias);
    void (*linear_bwd)(kern_stream_t *s, tensor_t *dx, tensor_t *dw, tensor_t *dbias, ct_t *dout,
                       ct_t *x, ct_t *w, bool set); /* set: dx overwritten */

    void (*zero)(kern_stream_t *s, tensor_t *t);
    void (*copy)(kern_stream_t *s, tensor_t *dst, ct_t *src); /* dtype conversion */
    void (*add)(kern_stream_t *s, tensor_t *out, ct_t *a, ct_t *b);
    void (*axpy)(kern_stream_t *s, tensor_t *y, float alpha, ct_t *x);
    void (*scale)(kern_stream_t *s, tensor_t *t, float f);
    void (*copy_cols)(kern_stream_t *s, tensor_t *dst, ct_t *src, const kern_cols_t *c);
    double (*sumsq)(kern_stream_t *s, ct_t *t);            /* waits for the stream */
    int64_t (*count_nonfinite)(kern_stream_t *s, ct_t *t); /* waits for the stream */

    void (*embedding_fwd)(kern_stream_t *s, tensor_t *out, ct_t *table, ct_t *ids,
                          int64_t vocab_start);
    void (*embedding_bwd)(kern_stream_t *s, tensor_t *dtable, ct_t *dout, ct_t *ids,
                          int64_t vocab_start);

    void (*rmsnorm_fwd)(kern_stream_t *s, tensor_t *out, tensor_t *rstd, ct_t *x, ct_t *w,
                        float eps);
    void (*rmsnorm_bwd)(kern_stream_t *s, tensor_t *dx, tensor_t *dw, ct_t *dout, ct_t *x, ct_t *w,
                        ct_t *rstd);
    void (*add_rmsnorm_fwd)(kern_stream_t *s, tensor_t *xout, tensor_t *ln, tensor_t *rstd, ct_t *x,
                            ct_t *y, ct_t *w, float eps);

    /* x, out as [BT, H, D]; tables [P, D/2] */
    void (*rope_fwd)(kern_stream_t *s, tensor_t *out, ct_t *x, ct_t *cos, ct_t *sin, ct_t *pos);
    void (*rope_bwd)(kern_stream_t *s, tensor_t *dx, ct_t *dout, ct_t *cos, ct_t *sin, ct_t *pos,
                     bool set);

    void (*attention_fwd)(kern_stream_t *s, tensor_t *out, tensor_t *lse, ct_t *q, ct_t *k, ct_t *v,
                          const kern_attn_shape_t *sh);
    /* out [B,Tq,Hq,Dv] as [rows = B*Tq, Hq, Dv]; lse [B,Hq,Tq] */
    void (*attention_merge)(kern_stream_t *s, tensor_t *out, tensor_t *lse, ct_t *part_out,
                            ct_t *part_lse);
    void (*attention_bwd)(kern_stream_t *s, tensor_t *dq, tensor_t *dk, tensor_t *dv, ct_t *dout,
                          ct_t *q, ct_t *k, ct_t *v, ct_t *out, ct_t *lse,
                          const kern_attn_shape_t *sh, bool set);

    void (*swiglu_fwd)(kern_stream_t *s, tensor_t *out, ct_t *gate, ct_t *up);
    void (*swiglu_bwd)(kern_stream_t *s, tensor_t *dgate, tensor_t *dup, ct_t *dout, ct_t *gate,
                       ct_t *up, bool set);

    void (*relu2_fwd)(kern_stream_t *s, tensor_t *out, ct_t *x);
    void (*relu2_bwd)(kern_stream_t *s, tensor_t *dx, ct_t *dout, ct_t *x, bool set);

    void (*xent_fwd_bwd)(kern_stream_t *s, tensor_t *losses, tensor_t *dlogits, ct_t *logits,
                         ct_t *targets, float dloss, int32_t ignore_index);
    void (*xent_vp_max)(kern_stream_t *s, tensor_t *row_max, ct_t *logits);
    void (*xent_vp_sum)(kern_stream_t *s, tensor_t *sumexp, tensor_t *tgt_logit, ct_t *logits,
                        ct_t *gmax, ct_t *targets, int64_t vocab_start, int32_t ignore_index);
    void (*xent_vp_finish)(kern_stream_t *s, tensor_t *losses, tensor_t *dlogits, ct_t *logits,
                           ct_t *gmax, ct_t *sumexp, ct_t *tgt_logit, ct_t *targets,
                           int64_t vocab_start, float dloss, int32_t ignore_index);

    void (*adamw)(kern_stream_t *s, tensor_t *param, tensor_t *param_copy, ct_t *grad, tensor_t *m,
                  tensor_t *v, const adamw_args_t *args);

    /* mixture of experts (kernels.h); dweights, dprobs, dyp, dx, dw may be NULL */
    void (*moe_route_fwd)(kern_stream_t *s, tensor_t *weights, tensor_t *experts, tensor_t *probs,
                          ct_t *logits, bool norm);
    void (*moe_route_bwd)(kern_stream_t *s, tensor_t *dlogits, ct_t *dweights, ct_t *dprobs,
                          ct_t *probs, ct_t *experts, bool norm);
    void (*moe_route_stats)(kern_stream_t *s, tensor_t *counts, tensor_t *psum, ct_t *probs,
                            ct_t *experts);
    void (*moe_route_reselect)(kern_stream_t *s, tensor_t *weights, tensor_t *experts,
                               ct_t *probs, ct_t *bias, bool norm);
    /* caps NULL: the one capacity (< 0: none); else caps[E] i32 per expert */
    void (*moe_permute_fwd)(kern_stream_t *s, tensor_t *xp, tensor_t *slot, tensor_t *sizes,
                            tensor_t *routed, ct_t *x, ct_t *experts, int64_t capacity,
                            ct_t *caps);
    void (*moe_permute_bwd)(kern_stream_t *s, tensor_t *dx, ct_t *dxp, ct_t *slot);
    void (*moe_combine_fwd)(kern_stream_t *s, tensor_t *y, ct_t *yp, ct_t *slot, ct_t *weights);
    void (*moe_combine_bwd)(kern_stream_t *s, tensor_t *dyp, tensor_t *dweights, ct_t *dy, ct_t *yp,
                            ct_t *slot, ct_t *weights);
    void (*sigmoid_gate_fwd)(kern_stream_t *s, tensor_t *out, ct_t *gate, ct_t *x);
    void (*sigmoid_gate_bwd)(kern_stream_t *s, tensor_t *dx, tensor_t *dgate, ct_t *dout,
                             ct_t *gate, ct_t *x);
    void (*grouped_linear_fwd)(kern_stream_t *s, tensor_t *out, ct_t *x, ct_t *w, ct_t *sizes);
    void (*grouped_linear_bwd)(kern_stream_t *s, tensor_t *dx, tensor_t *dw, ct_t *dout, ct_t *x,
                               ct_t *w, ct_t *sizes);

    /* Mamba2 mixer (kernels.h); state, chunk_states, bias, D and every gradient may be NULL */
    void (*conv1d_causal_fwd)(kern_stream_t *s, tensor_t *out, tensor_t *state, ct_t *x, ct_t *w,
                              ct_t *bias, kern_act_t act);
    void (*conv1d_causal_bwd)(kern_stream_t *s, tensor_t *dx, tensor_t *dw, tensor_t *dbias,
                              ct_t *dout, ct_t *x, ct_t *w, ct_t *bias, kern_act_t act);
    void (*ssm_dt_fwd)(kern_stream_t *s, tensor_t *dt, ct_t *raw, ct_t *bias, float lo, float hi);
    void (*ssm_dt_bwd)(kern_stream_t *s, tensor_t *draw, tensor_t *dbias, ct_t *ddt, ct_t *raw,
                       ct_t *bias, float lo, float hi);
    void (*ssd_scan_fwd)(kern_stream_t *s, tensor_t *y, tensor_t *chunk_states, tensor_t *state,
                         ct_t *x, ct_t *dt, ct_t *A_log, ct_t *Bm, ct_t *Cm, ct_t *D,
                         int64_t chunk);
    void (*ssd_scan_bwd)(kern_stream_t *s, tensor_t *dx, tensor_t *ddt, tensor_t *dA_log,
                         tensor_t *dB, tensor_t *dC, tensor_t *dD, ct_t *dy, ct_t *x, ct_t *dt,
                         ct_t *A_log, ct_t *Bm, ct_t *Cm, ct_t *D, ct_t *chunk_states,
                         int64_t chunk);
    void (*gated_rmsnorm_fwd)(kern_stream_t *s, tensor_t *out, tensor_t *rstd, ct_t *y, ct_t *z,
                              ct_t *w, int64_t groups, float eps);
    void (*gated_rmsnorm_bwd)(kern_stream_t *s, tensor_t *dy, tensor_t *dz, tensor_t *dw,
                              ct_t *dout, ct_t *y, ct_t *z, ct_t *w, ct_t *rstd, int64_t groups);
};

extern const kern_backend_t kern_cpu_backend;
extern const kern_backend_t kern_fenced_backend;
/* Defined in libbaton_cuda.so (kernels/cuda/backend.c), which
 * kernels/device.c loads on first use of a CUDA device. */
extern const kern_backend_t kern_cuda_backend;

#endif
