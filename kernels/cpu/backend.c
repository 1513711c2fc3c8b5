/* The CPU backend: host memory, streams that run every op at once on the
 * calling thread, fp32 compute (all float dtypes for copy and the
 * reductions). The adapters turn the dispatch's checked tensors into the
 * pointers and dimensions of the layer files. */
#include "kernels/cpu/cpu.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"


/* ---- devices, memory, streams --------------------------------------------- */

static bool cpu_usable(int index, char *why, size_t cap)
{
    (void)why, (void)cap;
    return index == 0;
}

static bt_status_t cpu_mem_alloc(int index, size_t nbytes, void **out)
{
    (void)index;
    /* more than x86-64 user space (2^47 bytes) never succeeds: refused here
     * rather than asked of malloc, which a sanitizer's allocator reports as
     * an error of its own (the tests of absurd configs) */
    if (nbytes > ((size_t)1 << 47)) return BT_ERR_NOMEM;
    /* 64-byte aligned rows for the vector code; never NULL for 0 bytes */
    void *p = aligned_alloc(64, (nbytes + 63) / 64 * 64 + (nbytes == 0 ? 64 : 0));
    if (!p) return BT_ERR_NOMEM;
    *out = p;
    return BT_OK;
}

static void cpu_mem_free(int index, void *p)
{
    (void)index;
    free(p);
}

/* Shared memory for another process of this host: a POSIX shared-memory
 * object named "/baton-PID-N-RANDOM" (the handle holds the name, NUL
 * included), its pages reserved up front so that a full /dev/shm is an
 * error here rather than a SIGBUS on first touch. The name is unlinked
 * when the allocator frees it; a process that dies first leaves it in
 * /dev/shm. */
static const char cpu_ipc_prefix[] = "/baton-";

static bt_status_t cpu_ipc_alloc(int index, size_t nbytes, void **out, kern_ipc_handle_t *h)
{
    (void)index;
    static atomic_uint counter;
    if (nbytes == 0) nbytes = 1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char *name = (char *)h->bytes;
    snprintf(name, sizeof h->bytes, "%s%ld-%u-%08lx", cpu_ipc_prefix, (long)getpid(),
             atomic_fetch_add(&counter, 1), (unsigned long)((uint64_t)ts.tv_nsec * 2654435761u) & 0xffffffffUL);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        log_error("cpu: shm_open(%s): %s", name, strerror(errno));
        return BT_ERR_IO;
    }
    int rc = posix_fallocate(fd, 0, (off_t)nbytes);
    if (rc) {
        log_error("cpu: cannot reserve %.1f MB of shared memory for %s: %s (is /dev/shm full?)",
                  (double)nbytes / 1e6, name, strerror(rc));
        close(fd);
        shm_unlink(name);
        return BT_ERR_NOMEM;
    }
    void *p = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        log_error("cpu: mmap of %s: %s", name, strerror(errno));
        shm_unlink(name);
        return BT_ERR_NOMEM;
    }
    *out = p;
    return BT_OK;
}

static void cpu_ipc_free(int index, void *p, size_t nbytes, const kern_ipc_handle_t *h)
{
    (void)index;
    munmap(p, nbytes ? nbytes : 1);
    char name[KERN_IPC_HANDLE_MAX];
    memcpy(name, h->bytes, sizeof name);
    name[sizeof name - 1] = 0;
    shm_unlink(name);
}

static bt_status_t cpu_ipc_open(int index, const kern_ipc_handle_t *h, size_t nbytes, void **out)
{
    (void)index;
    const char *name = (const char *)h->bytes;
    size_t len = strnlen(name, sizeof h->bytes);
    if (len == sizeof h->bytes || strncmp(name, cpu_ipc_prefix, sizeof cpu_ipc_prefix - 1) ||
        strchr(name + 1, '/')) {
        log_error("cpu: shared-memory handle is not a baton object name");
        return BT_ERR_INVALID;
    }
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        log_error("cpu: shm_open(%s): %s", name, strerror(errno));
        return errno == ENOENT ? BT_ERR_NOT_FOUND : BT_ERR_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb) || (uint64_t)sb.st_size < (uint64_t)(nbytes ? nbytes : 1)) {
        log_error("cpu: shared-memory object %s holds %lld bytes, %zu expected", name,
                  (long long)sb.st_size, nbytes);
        close(fd);
        return BT_ERR_CORRUPT;
    }
    void *p = mmap(NULL, nbytes ? nbytes : 1, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        log_error("cpu: mmap of %s: %s", name, strerror(errno));
        return BT_ERR_NOMEM;
    }
    *out = p;
    return BT_OK;
}

static void cpu_ipc_close(int index, void *p, size_t nbytes)
{
    (void)index;
    munmap(p, nbytes ? nbytes : 1);
}

/* ---- streams and events of a backend that works at once (cpu, fenced) ---- */

bt_status_t kern_immediate_stream_create(const kern_backend_t *be, device_t dev, kern_stream_t **out)
{
    kern_stream_t *s = calloc(1, sizeof *s);
    if (!s) return BT_ERR_NOMEM;
    s->be = be;
    s->dev = dev;
    *out = s;
    return BT_OK;
}

void kern_immediate_stream_destroy(kern_stream_t *s) { free(s); }
bt_status_t kern_immediate_stream_sync(kern_stream_t *s) { return s->error; }

bt_status_t kern_immediate_stream_notify(kern_stream_t *s, kern_notify_fn fn, void *arg)
{
    fn(arg, s->error);
    return BT_OK;
}

bt_status_t kern_immediate_stream_reserve(kern_stream_t *s, size_t nbytes)
{
    (void)s, (void)nbytes; /* the layer files allocate their own host scratch */
    return BT_OK;
}

bt_status_t kern_immediate_event_create(const kern_backend_t *be, device_t dev, kern_event_t **out)
{
    kern_event_t *e = calloc(1, sizeof *e);
    if (!e) return BT_ERR_NOMEM;
    e->be = be;
    e->dev = dev;
    *out = e;
    return BT_OK;
}

void kern_immediate_event_destroy(kern_event_t *e) { free(e); }
/* work is done when queued: an event is always complete */
void kern_immediate_event_record(kern_event_t *e, kern_stream_t *s) { (void)e, (void)s; }
void kern_immediate_stream_wait(kern_stream_t *s, kern_event_t *e) { (void)e, (void)s; }

static bt_status_t cpu_stream_create(int index, kern_stream_t **out)
{
    return kern_immediate_stream_create(&kern_cpu_backend, (device_t){DEV_CPU, index}, out);
}

static bt_status_t cpu_event_create(int index, kern_event_t **out)
{
    return kern_immediate_event_create(&kern_cpu_backend, (device_t){DEV_CPU, index}, out);
}

static void cpu_upload(kern_stream_t *s, void *dst, const void *host, size_t n)
{
    (void)s;
    memcpy(dst, host, n);
}

static void cpu_download(kern_stream_t *s, void *host, const void *src, size_t n)
{
    (void)s;
    memcpy(host, src, n);
}

/* ---- compute ------------------------------------------------------------------ */

static void cpu_op_matmul(kern_stream_t *s, tensor_t *c, ct_t *a, ct_t *b, bool ta, bool tb,
                          float alpha, float beta)
{
    int64_t M = tensor_rows(c), N = tensor_cols(c);
    int64_t K = ta ? tensor_rows(a) : tensor_cols(a);
    cpu_matmul(c->data, a->data, b->data, M, N, K, ta, tb, alpha, beta);
}

static void cpu_op_linear_fwd(kern_stream_t *s, tensor_t *out, ct_t *x, ct_t *w, ct_t *bias)
{
    cpu_linear_fwd(out->data, x->data, w->data, bias ? bias->data : NULL, tensor_rows(x),
                   tensor_cols(x), w->shape[0]);
}

/* The _set ops (kernels.h) on the CPU: zero, then the accumulating kernel,
 * so their bits are those of kern_zero followed by the op. */
static void set_zero(tensor_t *t, bool set)
{
    if (set && t) cpu_zero(t->data, tensor_nbytes(t));
}

static void cpu_op_linear_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, tensor_t *dbias,
                              ct_t *dout, ct_t *x, ct_t *w, bool set)
{
    set_zero(dx, set);
    cpu_linear_bwd(dx ? dx->data : NULL, dw ? dw->data : NULL, dbias ? dbias->data : NULL,
                   dout->data, x->data, w->data, tensor_rows(x), tensor_cols(x), w->shape[0]);
}

static void cpu_op_zero(kern_stream_t *s, tensor_t *t) { cpu_zero(t->data, tensor_nbytes(t)); }

static void cpu_op_copy(kern_stream_t *s, tensor_t *dst, ct_t *src)
{
    cpu_copy(dst->data, dst->dtype, src->data, src->dtype, tensor_numel(dst));
}

static void cpu_op_add(kern_stream_t *s, tensor_t *out, ct_t *a, ct_t *b)
{
    cpu_add(out->data, a->data, b->data, tensor_numel(out));
}

static void cpu_op_axpy(kern_stream_t *s, tensor_t *y, float alpha, ct_t *x)
{
    cpu_axpy(y->data, alpha, x->data, tensor_numel(y));
}

static void cpu_op_scale(kern_stream_t *s, tensor_t *t, float f)
{
    cpu_scale(t->data, f, tensor_numel(t));
}

static void cpu_op_copy_cols(kern_stream_t *s, tensor_t *dst, ct_t *src, const kern_cols_t *c)
{
    int64_t rows = tensor_rows(dst), dc = tensor_cols(dst), sc = tensor_cols(src);
    float *d = dst->data;
    const float *x = src->data;
    for (int64_t r = 0; r < rows; r++) {
        float *dr = d + r * dc + c->d0;
        const float *xr = x + (r / c->div) * sc + c->s0;
        for (int64_t j = 0; j < c->n; j++)
            dr[j * c->dstep] = c->acc ? dr[j * c->dstep] + xr[j * c->sstep] : xr[j * c->sstep];
    }
}

static double cpu_op_sumsq(kern_stream_t *s, ct_t *t)
{
    return cpu_sumsq(t->data, t->dtype, tensor_numel(t));
}

static int64_t cpu_op_count_nonfinite(kern_stream_t *s, ct_t *t)
{
    return cpu_count_nonfinite(t->data, t->dtype, tensor_numel(t));
}

static void cpu_op_embedding_fwd(kern_stream_t *s, tensor_t *out, ct_t *table, ct_t *ids,
                                 int64_t vocab_start)
{
    cpu_embedding_fwd(out->data, table->data, ids->data, tensor_rows(out), table->shape[0],
                      table->shape[1], vocab_start);
}

static void cpu_op_embedding_bwd(kern_stream_t *s, tensor_t *dtable, ct_t *dout, ct_t *ids,
                                 int64_t vocab_start)
{
    cpu_embedding_bwd(dtable->data, dout->data, ids->data, tensor_rows(dout), dtable->shape[0],
                      dtable->shape[1], vocab_start);
}

static void cpu_op_rmsnorm_fwd(kern_stream_t *s, tensor_t *out, tensor_t *rstd, ct_t *x, ct_t *w,
                               float eps)
{
    cpu_rmsnorm_fwd(out->data, rstd->data, x->data, w->data, tensor_rows(x), tensor_cols(x), eps);
}

static void cpu_op_rmsnorm_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, ct_t *dout, ct_t *x,
                               ct_t *w, ct_t *rstd)
{
    cpu_rmsnorm_bwd(dx ? dx->data : NULL, dw ? dw->data : NULL, dout->data, x->data, w->data,
                    rstd->data, tensor_rows(x), tensor_cols(x));
}

static void cpu_op_add_rmsnorm_fwd(kern_stream_t *s, tensor_t *xout, tensor_t *ln, tensor_t *rstd,
                                   ct_t *x, ct_t *y, ct_t *w, float eps)
{
    cpu_add_rmsnorm_fwd(xout->data, ln->data, rstd->data, x->data, y->data, w->data,
                        tensor_rows(xout), tensor_cols(xout), eps);
}

/* x as [BT, H, D] */
static void rope_dims(ct_t *x, ct_t *cos, int64_t *BT, int64_t *H, int64_t *D, int64_t *P)
{
    *D = x->shape[x->ndim - 1];
    *H = x->shape[x->ndim - 2];
    *BT = *D * *H > 0 ? tensor_numel(x) / (*D * *H) : 0;
    *P = cos->shape[0];
}

static void cpu_op_rope_fwd(kern_stream_t *s, tensor_t *out, ct_t *x, ct_t *cos, ct_t *sin,
                            ct_t *pos)
{
    int64_t BT, H, D, P;
    rope_dims(x, cos, &BT, &H, &D, &P);
    cpu_rope_fwd(out->data, x->data, cos->data, sin->data, pos->data, BT, H, D, P);
}

static void cpu_op_rope_bwd(kern_stream_t *s, tensor_t *dx, ct_t *dout, ct_t *cos, ct_t *sin,
                            ct_t *pos, bool set)
{
    int64_t BT, H, D, P;
    rope_dims(dout, cos, &BT, &H, &D, &P);
    set_zero(dx, set);
    cpu_rope_bwd(dx->data, dout->data, cos->data, sin->data, pos->data, BT, H, D, P);
}

static void cpu_op_attention_fwd(kern_stream_t *s, tensor_t *out, tensor_t *lse, ct_t *q, ct_t *k,
                                 ct_t *v, const kern_attn_shape_t *sh)
{
    cpu_attention_fwd(out->data, lse->data, q->data, k->data, v->data, sh);
}

static void cpu_op_attention_merge(kern_stream_t *s, tensor_t *out, tensor_t *lse, ct_t *part_out,
                                   ct_t *part_lse)
{
    cpu_attention_merge(out->data, lse->data, part_out->data, part_lse->data, out->shape[0],
                        out->shape[1], out->shape[2], out->shape[3]);
}

static void cpu_op_attention_bwd(kern_stream_t *s, tensor_t *dq, tensor_t *dk, tensor_t *dv,
                                 ct_t *dout, ct_t *q, ct_t *k, ct_t *v, ct_t *out, ct_t *lse,
                                 const kern_attn_shape_t *sh, bool set)
{
    set_zero(dq, set);
    set_zero(dk, set);
    set_zero(dv, set);
    cpu_attention_bwd(dq ? dq->data : NULL, dk ? dk->data : NULL, dv ? dv->data : NULL, dout->data,
                      q->data, k->data, v->data, out->data, lse->data, sh);
}

static void cpu_op_swiglu_fwd(kern_stream_t *s, tensor_t *out, ct_t *gate, ct_t *up)
{
    cpu_swiglu_fwd(out->data, gate->data, up->data, tensor_numel(out));
}

static void cpu_op_swiglu_bwd(kern_stream_t *s, tensor_t *dgate, tensor_t *dup, ct_t *dout,
                              ct_t *gate, ct_t *up, bool set)
{
    set_zero(dgate, set);
    set_zero(dup, set);
    cpu_swiglu_bwd(dgate ? dgate->data : NULL, dup ? dup->data : NULL, dout->data, gate->data,
                   up->data, tensor_numel(dout));
}

static void cpu_op_relu2_fwd(kern_stream_t *s, tensor_t *out, ct_t *x)
{
    (void)s;
    float *o = out->data;
    const float *v = x->data;
    int64_t n = tensor_numel(out);
    for (int64_t i = 0; i < n; i++) {
        float r = v[i] > 0 ? v[i] : 0.0f;
        o[i] = r * r;
    }
}

static void cpu_op_relu2_bwd(kern_stream_t *s, tensor_t *dx, ct_t *dout, ct_t *x, bool set)
{
    (void)s;
    float *d = dx->data;
    const float *g = dout->data, *v = x->data;
    int64_t n = tensor_numel(dx);
    for (int64_t i = 0; i < n; i++) {
        float t = v[i] > 0 ? 2.0f * v[i] * g[i] : 0.0f;
        d[i] = set ? t : d[i] + t;
    }
}

static void cpu_op_xent_fwd_bwd(kern_stream_t *s, tensor_t *losses, tensor_t *dlogits, ct_t *logits,
                                ct_t *targets, float dloss, int32_t ignore_index)
{
    cpu_xent_fwd_bwd(losses->data, dlogits ? dlogits->data : NULL, logits->data, targets->data,
                     tensor_rows(logits), tensor_cols(logits), dloss, ignore_index);
}

static void cpu_op_xent_vp_max(kern_stream_t *s, tensor_t *row_max, ct_t *logits)
{
    cpu_xent_vp_max(row_max->data, logits->data, tensor_rows(logits), tensor_cols(logits));
}

static void cpu_op_xent_vp_sum(kern_stream_t *s, tensor_t *sumexp, tensor_t *tgt_logit,
                               ct_t *logits, ct_t *gmax, ct_t *targets, int64_t vocab_start,
                               int32_t ignore_index)
{
    cpu_xent_vp_sum(sumexp->data, tgt_logit->data, logits->data, gmax->data, targets->data,
                    tensor_rows(logits), tensor_cols(logits), vocab_start, ignore_index);
}

static void cpu_op_xent_vp_finish(kern_stream_t *s, tensor_t *losses, tensor_t *dlogits,
                                  ct_t *logits, ct_t *gmax, ct_t *sumexp, ct_t *tgt_logit,
                                  ct_t *targets, int64_t vocab_start, float dloss,
                                  int32_t ignore_index)
{
    cpu_xent_vp_finish(losses ? losses->data : NULL, dlogits ? dlogits->data : NULL, logits->data,
                       gmax->data, sumexp->data, tgt_logit->data, targets->data,
                       tensor_rows(logits), tensor_cols(logits), vocab_start, dloss, ignore_index);
}

static void cpu_op_adamw(kern_stream_t *s, tensor_t *param, tensor_t *param_copy, ct_t *grad,
                         tensor_t *m, tensor_t *v, const adamw_args_t *args)
{
    int64_t n = tensor_numel(param);
    cpu_adamw(param->data, grad->data, m->data, v->data, n, args);
    if (param_copy) cpu_copy(param_copy->data, param_copy->dtype, param->data, DT_F32, n);
}

static void cpu_op_moe_route_fwd(kern_stream_t *s, tensor_t *weights, tensor_t *experts,
                                 tensor_t *probs, ct_t *logits, bool norm)
{
    cpu_moe_route_fwd(weights->data, experts->data, probs->data, logits->data, logits->shape[0],
                      logits->shape[1], experts->shape[1], norm);
}

static void cpu_op_moe_route_reselect(kern_stream_t *s, tensor_t *weights, tensor_t *experts,
                                      ct_t *probs, ct_t *bias, bool norm)
{
    cpu_moe_route_reselect(weights->data, experts->data, probs->data, bias->data, probs->shape[0],
                           probs->shape[1], experts->shape[1], norm);
}

static void cpu_op_moe_route_bwd(kern_stream_t *s, tensor_t *dlogits, ct_t *dweights, ct_t *dprobs,
                                 ct_t *probs, ct_t *experts, bool norm)
{
    cpu_moe_route_bwd(dlogits->data, dweights ? dweights->data : NULL,
                      dprobs ? dprobs->data : NULL, probs->data, experts->data, probs->shape[0],
                      probs->shape[1], experts->shape[1], norm);
}

static void cpu_op_moe_route_stats(kern_stream_t *s, tensor_t *counts, tensor_t *psum, ct_t *probs,
                                   ct_t *experts)
{
    cpu_moe_route_stats(counts->data, psum->data, probs->data, experts->data, probs->shape[0],
                        probs->shape[1], experts->shape[1]);
}

static void cpu_op_moe_permute_fwd(kern_stream_t *s, tensor_t *xp, tensor_t *slot, tensor_t *sizes,
                                   tensor_t *routed, ct_t *x, ct_t *experts, int64_t capacity,
                                   ct_t *caps)
{
    cpu_moe_permute_fwd(xp->data, slot->data, sizes->data, routed->data, x->data, experts->data,
                        tensor_rows(x), tensor_cols(x), experts->shape[1], tensor_numel(sizes),
                        capacity, caps ? caps->data : NULL);
}

static void cpu_op_moe_permute_bwd(kern_stream_t *s, tensor_t *dx, ct_t *dxp, ct_t *slot)
{
    cpu_moe_permute_bwd(dx->data, dxp->data, slot->data, tensor_rows(dx), tensor_cols(dx),
                        slot->shape[1]);
}

static void cpu_op_moe_combine_fwd(kern_stream_t *s, tensor_t *y, ct_t *yp, ct_t *slot,
                                   ct_t *weights)
{
    cpu_moe_combine_fwd(y->data, yp->data, slot->data, weights->data, tensor_rows(y),
                        tensor_cols(y), slot->shape[1]);
}

static void cpu_op_moe_combine_bwd(kern_stream_t *s, tensor_t *dyp, tensor_t *dweights, ct_t *dy,
                                   ct_t *yp, ct_t *slot, ct_t *weights)
{
    cpu_moe_combine_bwd(dyp ? dyp->data : NULL, dweights ? dweights->data : NULL, dy->data,
                        yp->data, slot->data, weights->data, tensor_rows(dy), tensor_cols(dy),
                        slot->shape[1]);
}

static void cpu_op_sigmoid_gate_fwd(kern_stream_t *s, tensor_t *out, ct_t *gate, ct_t *x)
{
    cpu_sigmoid_gate_fwd(out->data, gate->data, x->data, tensor_rows(x), tensor_cols(x));
}

static void cpu_op_sigmoid_gate_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dgate, ct_t *dout,
                                    ct_t *gate, ct_t *x)
{
    cpu_sigmoid_gate_bwd(dx ? dx->data : NULL, dgate ? dgate->data : NULL, dout->data, gate->data,
                         x->data, tensor_rows(x), tensor_cols(x));
}

static void cpu_op_grouped_linear_fwd(kern_stream_t *s, tensor_t *out, ct_t *x, ct_t *w,
                                      ct_t *sizes)
{
    cpu_grouped_linear_fwd(out->data, x->data, w->data, sizes->data, tensor_rows(x),
                           tensor_cols(x), w->shape[1], w->shape[0]);
}

static void cpu_op_grouped_linear_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, ct_t *dout,
                                      ct_t *x, ct_t *w, ct_t *sizes)
{
    cpu_grouped_linear_bwd(dx ? dx->data : NULL, dw ? dw->data : NULL, dout->data, x->data,
                           w->data, sizes->data, tensor_rows(x), tensor_cols(x), w->shape[1],
                           w->shape[0]);
}

/* ---- Mamba2 mixer ---- */

static const float *opt_data(ct_t *t) { return t ? t->data : NULL; }
static float *opt_out(tensor_t *t) { return t ? t->data : NULL; }

/* x [B,T,C] (or [N,C] as one batch row) */
static void conv_dims(ct_t *x, int64_t *B, int64_t *T)
{
    *B = x->ndim == 3 ? x->shape[0] : 1;
    *T = x->ndim == 3 ? x->shape[1] : tensor_rows(x);
}

static void cpu_op_conv1d_causal_fwd(kern_stream_t *s, tensor_t *out, tensor_t *state, ct_t *x,
                                     ct_t *w, ct_t *bias, kern_act_t act)
{
    int64_t B, T;
    conv_dims(x, &B, &T);
    cpu_conv1d_causal_fwd(out->data, opt_out(state), x->data, w->data, opt_data(bias), B, T,
                          tensor_cols(x), w->shape[1], act);
}

static void cpu_op_conv1d_causal_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, tensor_t *dbias,
                                     ct_t *dout, ct_t *x, ct_t *w, ct_t *bias, kern_act_t act)
{
    int64_t B, T;
    conv_dims(x, &B, &T);
    cpu_conv1d_causal_bwd(opt_out(dx), opt_out(dw), opt_out(dbias), dout->data, x->data, w->data,
                          opt_data(bias), B, T, tensor_cols(x), w->shape[1], act);
}

static void cpu_op_ssm_dt_fwd(kern_stream_t *s, tensor_t *dt, ct_t *raw, ct_t *bias, float lo,
                              float hi)
{
    cpu_ssm_dt_fwd(dt->data, raw->data, bias->data, tensor_rows(raw), tensor_cols(raw), lo, hi);
}

static void cpu_op_ssm_dt_bwd(kern_stream_t *s, tensor_t *draw, tensor_t *dbias, ct_t *ddt,
                              ct_t *raw, ct_t *bias, float lo, float hi)
{
    cpu_ssm_dt_bwd(opt_out(draw), opt_out(dbias), ddt->data, raw->data, bias->data,
                   tensor_rows(raw), tensor_cols(raw), lo, hi);
}

/* x [B,T,H,P], Bm [B,T,G,N] */
static cpu_ssd_shape_t ssd_shape(ct_t *x, ct_t *Bm, int64_t chunk)
{
    return (cpu_ssd_shape_t){.B = x->shape[0], .T = x->shape[1], .H = x->shape[2],
                             .P = x->shape[3], .G = Bm->shape[2], .N = Bm->shape[3],
                             .chunk = chunk};
}

static void cpu_op_ssd_scan_fwd(kern_stream_t *s, tensor_t *y, tensor_t *chunk_states,
                                tensor_t *state, ct_t *x, ct_t *dt, ct_t *A_log, ct_t *Bm,
                                ct_t *Cm, ct_t *D, int64_t chunk)
{
    cpu_ssd_shape_t sh = ssd_shape(x, Bm, chunk);
    cpu_ssd_scan_fwd(y->data, opt_out(chunk_states), opt_out(state), x->data, dt->data,
                     A_log->data, Bm->data, Cm->data, opt_data(D), &sh);
}

static void cpu_op_ssd_scan_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *ddt, tensor_t *dA_log,
                                tensor_t *dB, tensor_t *dC, tensor_t *dD, ct_t *dy, ct_t *x,
                                ct_t *dt, ct_t *A_log, ct_t *Bm, ct_t *Cm, ct_t *D,
                                ct_t *chunk_states, int64_t chunk)
{
    cpu_ssd_shape_t sh = ssd_shape(x, Bm, chunk);
    cpu_ssd_scan_bwd(opt_out(dx), opt_out(ddt), opt_out(dA_log), opt_out(dB), opt_out(dC),
                     opt_out(dD), dy->data, x->data, dt->data, A_log->data, Bm->data, Cm->data,
                     opt_data(D), chunk_states->data, &sh);
}

static void cpu_op_gated_rmsnorm_fwd(kern_stream_t *s, tensor_t *out, tensor_t *rstd, ct_t *y,
                                     ct_t *z, ct_t *w, int64_t groups, float eps)
{
    cpu_gated_rmsnorm_fwd(out->data, rstd->data, y->data, z->data, w->data, tensor_rows(y),
                          tensor_cols(y), groups, eps);
}

static void cpu_op_gated_rmsnorm_bwd(kern_stream_t *s, tensor_t *dy, tensor_t *dz, tensor_t *dw,
                                     ct_t *dout, ct_t *y, ct_t *z, ct_t *w, ct_t *rstd,
                                     int64_t groups)
{
    cpu_gated_rmsnorm_bwd(opt_out(dy), opt_out(dz), opt_out(dw), dout->data, y->data, z->data,
                          w->data, rstd->data, tensor_rows(y), tensor_cols(y), groups);
}

const kern_backend_t kern_cpu_backend = {
    .name = "cpu",
    .kind = DEV_CPU,
    .op_dtypes = KERN_CPU_OP_DTYPES,
    .usable = cpu_usable,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .host_alloc = cpu_mem_alloc,
    .host_free = cpu_mem_free,
    .has_ipc = true,
    .ipc_alloc = cpu_ipc_alloc,
    .ipc_free = cpu_ipc_free,
    .ipc_open = cpu_ipc_open,
    .ipc_close = cpu_ipc_close,
    .stream_create = cpu_stream_create,
    .stream_destroy = kern_immediate_stream_destroy,
    .stream_sync = kern_immediate_stream_sync,
    .stream_notify = kern_immediate_stream_notify,
    .stream_reserve = kern_immediate_stream_reserve,
    .event_create = cpu_event_create,
    .event_destroy = kern_immediate_event_destroy,
    .event_record = kern_immediate_event_record,
    .stream_wait = kern_immediate_stream_wait,
    .upload = cpu_upload,
    .download = cpu_download,
    .matmul = cpu_op_matmul,
    .linear_fwd = cpu_op_linear_fwd,
    .linear_bwd = cpu_op_linear_bwd,
    .zero = cpu_op_zero,
    .copy = cpu_op_copy,
    .add = cpu_op_add,
    .axpy = cpu_op_axpy,
    .scale = cpu_op_scale,
    .copy_cols = cpu_op_copy_cols,
    .sumsq = cpu_op_sumsq,
    .count_nonfinite = cpu_op_count_nonfinite,
    .embedding_fwd = cpu_op_embedding_fwd,
    .embedding_bwd = cpu_op_embedding_bwd,
    .rmsnorm_fwd = cpu_op_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_op_rmsnorm_bwd,
    .add_rmsnorm_fwd = cpu_op_add_rmsnorm_fwd,
    .rope_fwd = cpu_op_rope_fwd,
    .rope_bwd = cpu_op_rope_bwd,
    .attention_fwd = cpu_op_attention_fwd,
    .attention_merge = cpu_op_attention_merge,
    .attention_bwd = cpu_op_attention_bwd,
    .swiglu_fwd = cpu_op_swiglu_fwd,
    .swiglu_bwd = cpu_op_swiglu_bwd,
    .relu2_fwd = cpu_op_relu2_fwd,
    .relu2_bwd = cpu_op_relu2_bwd,
    .xent_fwd_bwd = cpu_op_xent_fwd_bwd,
    .xent_vp_max = cpu_op_xent_vp_max,
    .xent_vp_sum = cpu_op_xent_vp_sum,
    .xent_vp_finish = cpu_op_xent_vp_finish,
    .adamw = cpu_op_adamw,
    .moe_route_fwd = cpu_op_moe_route_fwd,
    .moe_route_reselect = cpu_op_moe_route_reselect,
    .moe_route_bwd = cpu_op_moe_route_bwd,
    .moe_route_stats = cpu_op_moe_route_stats,
    .moe_permute_fwd = cpu_op_moe_permute_fwd,
    .moe_permute_bwd = cpu_op_moe_permute_bwd,
    .moe_combine_fwd = cpu_op_moe_combine_fwd,
    .moe_combine_bwd = cpu_op_moe_combine_bwd,
    .sigmoid_gate_fwd = cpu_op_sigmoid_gate_fwd,
    .sigmoid_gate_bwd = cpu_op_sigmoid_gate_bwd,
    .grouped_linear_fwd = cpu_op_grouped_linear_fwd,
    .grouped_linear_bwd = cpu_op_grouped_linear_bwd,
    .conv1d_causal_fwd = cpu_op_conv1d_causal_fwd,
    .conv1d_causal_bwd = cpu_op_conv1d_causal_bwd,
    .ssm_dt_fwd = cpu_op_ssm_dt_fwd,
    .ssm_dt_bwd = cpu_op_ssm_dt_bwd,
    .ssd_scan_fwd = cpu_op_ssd_scan_fwd,
    .ssd_scan_bwd = cpu_op_ssd_scan_bwd,
    .gated_rmsnorm_fwd = cpu_op_gated_rmsnorm_fwd,
    .gated_rmsnorm_bwd = cpu_op_gated_rmsnorm_bwd,
};
