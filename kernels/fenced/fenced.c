/* The fenced test device: the CPU backend's kernels on host memory that the
 * host cannot touch outside this backend's own calls.
 *
 * Why: model, optimizer, pipeline stage and messages must reach device
 * memory only through the backend (kernels/device.h). On a GPU a stray host
 * access is a crash or silent garbage at best; here it is a SIGSEGV at the
 * faulting instruction, on any machine. Every allocation is its own mmap,
 * kept PROT_NONE; each backend call opens the fence (every allocation
 * readable and writable), runs the CPU kernel, and closes it again. The
 * results are the CPU backend's, bit for bit.
 *
 * The fence is process-wide and counted: calls from several threads nest,
 * and it closes when the last one returns. A host access racing with a
 * backend call on another thread is therefore not caught; every
 * single-threaded stray access is.
 *
 * Cost: two mprotect calls per allocation per op; meant for the fixture
 * models of the test suite, not for speed. */
#include "kernels/backend.h"

#include "base/log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct fence_region {
    void *p;
    size_t len; /* mapped bytes, a multiple of the page size */
    struct fence_region *next;
} fence_region_t;

static struct {
    pthread_mutex_t mu;
    fence_region_t *regions;
    int open; /* calls inside the fence */
} fence = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void fence_protect_all(int prot)
{
    for (fence_region_t *r = fence.regions; r; r = r->next)
        if (mprotect(r->p, r->len, prot) != 0)
            BT_PANIC("fenced device: mprotect of %zu bytes failed", r->len);
}

static void fence_open(void)
{
    pthread_mutex_lock(&fence.mu);
    if (fence.open++ == 0) fence_protect_all(PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&fence.mu);
}

static void fence_close(void)
{
    pthread_mutex_lock(&fence.mu);
    if (--fence.open == 0) fence_protect_all(PROT_NONE);
    pthread_mutex_unlock(&fence.mu);
}

#define FENCED(call)                                                                               \
    do {                                                                                           \
        fence_open();                                                                              \
        call;                                                                                      \
        fence_close();                                                                             \
    } while (0)

static bool fenced_usable(int index, char *why, size_t cap)
{
    (void)why, (void)cap;
    return index == 0;
}

static bt_status_t fenced_mem_alloc(int index, size_t nbytes, void **out)
{
    (void)index;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = (nbytes + page - 1) / page * page;
    if (len == 0) len = page;
    fence_region_t *r = malloc(sizeof *r);
    if (!r) return BT_ERR_NOMEM;
    pthread_mutex_lock(&fence.mu);
    int prot = fence.open ? PROT_READ | PROT_WRITE : PROT_NONE;
    void *p = mmap(NULL, len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        pthread_mutex_unlock(&fence.mu);
        free(r);
        return BT_ERR_NOMEM;
    }
    *r = (fence_region_t){.p = p, .len = len, .next = fence.regions};
    fence.regions = r;
    pthread_mutex_unlock(&fence.mu);
    *out = p;
    return BT_OK;
}

static void fenced_mem_free(int index, void *p)
{
    (void)index;
    pthread_mutex_lock(&fence.mu);
    for (fence_region_t **rp = &fence.regions; *rp; rp = &(*rp)->next) {
        if ((*rp)->p != p) continue;
        fence_region_t *r = *rp;
        *rp = r->next;
        munmap(r->p, r->len);
        free(r);
        pthread_mutex_unlock(&fence.mu);
        return;
    }
    pthread_mutex_unlock(&fence.mu);
    BT_PANIC("fenced device: free of %p, which it did not allocate", p);
}

static bt_status_t fenced_host_alloc(int index, size_t nbytes, void **out)
{
    return kern_cpu_backend.host_alloc(index, nbytes, out);
}

static void fenced_host_free(int index, void *p) { kern_cpu_backend.host_free(index, p); }

/* No memory shared between processes: the fence is per process. */
static bt_status_t fenced_ipc_alloc(int index, size_t nbytes, void **out, kern_ipc_handle_t *h)
{
    (void)index, (void)nbytes, (void)out, (void)h;
    return BT_ERR_UNSUPPORTED;
}
static void fenced_ipc_free(int index, void *p, size_t nbytes, const kern_ipc_handle_t *h)
{
    (void)index, (void)p, (void)nbytes, (void)h;
}
static bt_status_t fenced_ipc_open(int index, const kern_ipc_handle_t *h, size_t nbytes, void **out)
{
    (void)index, (void)h, (void)nbytes, (void)out;
    return BT_ERR_UNSUPPORTED;
}
static void fenced_ipc_close(int index, void *p, size_t nbytes) { (void)index, (void)p, (void)nbytes; }

/* Streams and events: the CPU backend's (work is done at once), under this
 * backend's name. */
static bt_status_t fenced_stream_create(int index, kern_stream_t **out)
{
    return kern_immediate_stream_create(&kern_fenced_backend, (device_t){DEV_FENCED, index}, out);
}

static bt_status_t fenced_event_create(int index, kern_event_t **out)
{
    return kern_immediate_event_create(&kern_fenced_backend, (device_t){DEV_FENCED, index}, out);
}

static void fenced_upload(kern_stream_t *s, void *dst, const void *host, size_t n)
{
    FENCED(memcpy(dst, host, n));
}

static void fenced_download(kern_stream_t *s, void *host, const void *src, size_t n)
{
    FENCED(memcpy(host, src, n));
}

/* ---- compute: the CPU kernels inside the fence --------------------------- */

static const kern_backend_t *const cpu = &kern_cpu_backend;

static void f_matmul(kern_stream_t *s, tensor_t *c, ct_t *a, ct_t *b, bool ta, bool tb, float al,
                     float be)
{
    FENCED(cpu->matmul(s, c, a, b, ta, tb, al, be));
}
static void f_linear_fwd(kern_stream_t *s, tensor_t *out, ct_t *x, ct_t *w, ct_t *bias)
{
    FENCED(cpu->linear_fwd(s, out, x, w, bias));
}
static void f_linear_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, tensor_t *dbias, ct_t *dout,
                         ct_t *x, ct_t *w, bool set)
{
    FENCED(cpu->linear_bwd(s, dx, dw, dbias, dout, x, w, set));
}
static void f_zero(kern_stream_t *s, tensor_t *t) { FENCED(cpu->zero(s, t)); }
static void f_copy(kern_stream_t *s, tensor_t *dst, ct_t *src) { FENCED(cpu->copy(s, dst, src)); }
static void f_add(kern_stream_t *s, tensor_t *out, ct_t *a, ct_t *b)
{
    FENCED(cpu->add(s, out, a, b));
}
static void f_axpy(kern_stream_t *s, tensor_t *y, float alpha, ct_t *x)
{
    FENCED(cpu->axpy(s, y, alpha, x));
}
static void f_scale(kern_stream_t *s, tensor_t *t, float f) { FENCED(cpu->scale(s, t, f)); }
static void f_copy_cols(kern_stream_t *s, tensor_t *dst, ct_t *src, const kern_cols_t *c)
{
    FENCED(cpu->copy_cols(s, dst, src, c));
}
static double f_sumsq(kern_stream_t *s, ct_t *t)
{
    double r;
    FENCED(r = cpu->sumsq(s, t));
    return r;
}
static int64_t f_count_nonfinite(kern_stream_t *s, ct_t *t)
{
    int64_t r;
    FENCED(r = cpu->count_nonfinite(s, t));
    return r;
}
static void f_embedding_fwd(kern_stream_t *s, tensor_t *out, ct_t *table, ct_t *ids, int64_t v0)
{
    FENCED(cpu->embedding_fwd(s, out, table, ids, v0));
}
static void f_embedding_bwd(kern_stream_t *s, tensor_t *dtable, ct_t *dout, ct_t *ids, int64_t v0)
{
    FENCED(cpu->embedding_bwd(s, dtable, dout, ids, v0));
}
static void f_rmsnorm_fwd(kern_stream_t *s, tensor_t *out, tensor_t *rstd, ct_t *x, ct_t *w,
                          float eps)
{
    FENCED(cpu->rmsnorm_fwd(s, out, rstd, x, w, eps));
}
static void f_rmsnorm_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, ct_t *dout, ct_t *x,
                          ct_t *w, ct_t *rstd)
{
    FENCED(cpu->rmsnorm_bwd(s, dx, dw, dout, x, w, rstd));
}
static void f_add_rmsnorm_fwd(kern_stream_t *s, tensor_t *xout, tensor_t *ln, tensor_t *rstd,
                              ct_t *x, ct_t *y, ct_t *w, float eps)
{
    FENCED(cpu->add_rmsnorm_fwd(s, xout, ln, rstd, x, y, w, eps));
}
static void f_rope_fwd(kern_stream_t *s, tensor_t *out, ct_t *x, ct_t *cos, ct_t *sin, ct_t *pos)
{
    FENCED(cpu->rope_fwd(s, out, x, cos, sin, pos));
}
static void f_rope_bwd(kern_stream_t *s, tensor_t *dx, ct_t *dout, ct_t *cos, ct_t *sin, ct_t *pos,
                       bool set)
{
    FENCED(cpu->rope_bwd(s, dx, dout, cos, sin, pos, set));
}
static void f_attention_fwd(kern_stream_t *s, tensor_t *out, tensor_t *lse, ct_t *q, ct_t *k,
                            ct_t *v, const kern_attn_shape_t *sh)
{
    FENCED(cpu->attention_fwd(s, out, lse, q, k, v, sh));
}
static void f_attention_merge(kern_stream_t *s, tensor_t *out, tensor_t *lse, ct_t *part_out,
                              ct_t *part_lse)
{
    FENCED(cpu->attention_merge(s, out, lse, part_out, part_lse));
}
static void f_attention_bwd(kern_stream_t *s, tensor_t *dq, tensor_t *dk, tensor_t *dv, ct_t *dout,
                            ct_t *q, ct_t *k, ct_t *v, ct_t *out, ct_t *lse,
                            const kern_attn_shape_t *sh, bool set)
{
    FENCED(cpu->attention_bwd(s, dq, dk, dv, dout, q, k, v, out, lse, sh, set));
}
static void f_swiglu_fwd(kern_stream_t *s, tensor_t *out, ct_t *gate, ct_t *up)
{
    FENCED(cpu->swiglu_fwd(s, out, gate, up));
}
static void f_swiglu_bwd(kern_stream_t *s, tensor_t *dgate, tensor_t *dup, ct_t *dout, ct_t *gate,
                         ct_t *up, bool set)
{
    FENCED(cpu->swiglu_bwd(s, dgate, dup, dout, gate, up, set));
}
static void f_relu2_fwd(kern_stream_t *s, tensor_t *out, ct_t *x)
{
    FENCED(cpu->relu2_fwd(s, out, x));
}
static void f_relu2_bwd(kern_stream_t *s, tensor_t *dx, ct_t *dout, ct_t *x, bool set)
{
    FENCED(cpu->relu2_bwd(s, dx, dout, x, set));
}
static void f_xent_fwd_bwd(kern_stream_t *s, tensor_t *losses, tensor_t *dlogits, ct_t *logits,
                           ct_t *targets, float dloss, int32_t ii)
{
    FENCED(cpu->xent_fwd_bwd(s, losses, dlogits, logits, targets, dloss, ii));
}
static void f_xent_vp_max(kern_stream_t *s, tensor_t *row_max, ct_t *logits)
{
    FENCED(cpu->xent_vp_max(s, row_max, logits));
}
static void f_xent_vp_sum(kern_stream_t *s, tensor_t *sumexp, tensor_t *tgt, ct_t *logits,
                          ct_t *gmax, ct_t *targets, int64_t v0, int32_t ii)
{
    FENCED(cpu->xent_vp_sum(s, sumexp, tgt, logits, gmax, targets, v0, ii));
}
static void f_xent_vp_finish(kern_stream_t *s, tensor_t *losses, tensor_t *dlogits, ct_t *logits,
                             ct_t *gmax, ct_t *sumexp, ct_t *tgt, ct_t *targets, int64_t v0,
                             float dloss, int32_t ii)
{
    FENCED(
        cpu->xent_vp_finish(s, losses, dlogits, logits, gmax, sumexp, tgt, targets, v0, dloss, ii));
}
static void f_adamw(kern_stream_t *s, tensor_t *param, tensor_t *param_copy, ct_t *grad,
                    tensor_t *m, tensor_t *v, const adamw_args_t *args)
{
    FENCED(cpu->adamw(s, param, param_copy, grad, m, v, args));
}

static void f_moe_route_fwd(kern_stream_t *s, tensor_t *weights, tensor_t *experts, tensor_t *probs,
                            ct_t *logits, bool norm)
{
    FENCED(cpu->moe_route_fwd(s, weights, experts, probs, logits, norm));
}
static void f_moe_route_reselect(kern_stream_t *s, tensor_t *weights, tensor_t *experts,
                                 ct_t *probs, ct_t *bias, bool norm)
{
    FENCED(cpu->moe_route_reselect(s, weights, experts, probs, bias, norm));
}
static void f_moe_route_bwd(kern_stream_t *s, tensor_t *dlogits, ct_t *dweights, ct_t *dprobs,
                            ct_t *probs, ct_t *experts, bool norm)
{
    FENCED(cpu->moe_route_bwd(s, dlogits, dweights, dprobs, probs, experts, norm));
}
static void f_moe_route_stats(kern_stream_t *s, tensor_t *counts, tensor_t *psum, ct_t *probs,
                              ct_t *experts)
{
    FENCED(cpu->moe_route_stats(s, counts, psum, probs, experts));
}
static void f_moe_permute_fwd(kern_stream_t *s, tensor_t *xp, tensor_t *slot, tensor_t *sizes,
                              tensor_t *routed, ct_t *x, ct_t *experts, int64_t capacity, ct_t *caps)
{
    FENCED(cpu->moe_permute_fwd(s, xp, slot, sizes, routed, x, experts, capacity, caps));
}
static void f_moe_permute_bwd(kern_stream_t *s, tensor_t *dx, ct_t *dxp, ct_t *slot)
{
    FENCED(cpu->moe_permute_bwd(s, dx, dxp, slot));
}
static void f_moe_combine_fwd(kern_stream_t *s, tensor_t *y, ct_t *yp, ct_t *slot, ct_t *weights)
{
    FENCED(cpu->moe_combine_fwd(s, y, yp, slot, weights));
}
static void f_moe_combine_bwd(kern_stream_t *s, tensor_t *dyp, tensor_t *dweights, ct_t *dy,
                              ct_t *yp, ct_t *slot, ct_t *weights)
{
    FENCED(cpu->moe_combine_bwd(s, dyp, dweights, dy, yp, slot, weights));
}
static void f_sigmoid_gate_fwd(kern_stream_t *s, tensor_t *out, ct_t *gate, ct_t *x)
{
    FENCED(cpu->sigmoid_gate_fwd(s, out, gate, x));
}
static void f_sigmoid_gate_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dgate, ct_t *dout,
                               ct_t *gate, ct_t *x)
{
    FENCED(cpu->sigmoid_gate_bwd(s, dx, dgate, dout, gate, x));
}
static void f_grouped_linear_fwd(kern_stream_t *s, tensor_t *out, ct_t *x, ct_t *w, ct_t *sizes)
{
    FENCED(cpu->grouped_linear_fwd(s, out, x, w, sizes));
}
static void f_grouped_linear_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, ct_t *dout, ct_t *x,
                                 ct_t *w, ct_t *sizes)
{
    FENCED(cpu->grouped_linear_bwd(s, dx, dw, dout, x, w, sizes));
}


static void f_conv1d_causal_fwd(kern_stream_t *s, tensor_t *out, tensor_t *state, ct_t *x, ct_t *w,
                                ct_t *bias, kern_act_t act)
{
    FENCED(cpu->conv1d_causal_fwd(s, out, state, x, w, bias, act));
}
static void f_conv1d_causal_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, tensor_t *dbias,
                                ct_t *dout, ct_t *x, ct_t *w, ct_t *bias, kern_act_t act)
{
    FENCED(cpu->conv1d_causal_bwd(s, dx, dw, dbias, dout, x, w, bias, act));
}
static void f_ssm_dt_fwd(kern_stream_t *s, tensor_t *dt, ct_t *raw, ct_t *bias, float lo, float hi)
{
    FENCED(cpu->ssm_dt_fwd(s, dt, raw, bias, lo, hi));
}
static void f_ssm_dt_bwd(kern_stream_t *s, tensor_t *draw, tensor_t *dbias, ct_t *ddt, ct_t *raw,
                         ct_t *bias, float lo, float hi)
{
    FENCED(cpu->ssm_dt_bwd(s, draw, dbias, ddt, raw, bias, lo, hi));
}
static void f_ssd_scan_fwd(kern_stream_t *s, tensor_t *y, tensor_t *chunk_states, tensor_t *state,
                           ct_t *x, ct_t *dt, ct_t *A_log, ct_t *Bm, ct_t *Cm, ct_t *D,
                           int64_t chunk)
{
    FENCED(cpu->ssd_scan_fwd(s, y, chunk_states, state, x, dt, A_log, Bm, Cm, D, chunk));
}
static void f_ssd_scan_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *ddt, tensor_t *dA_log,
                           tensor_t *dB, tensor_t *dC, tensor_t *dD, ct_t *dy, ct_t *x, ct_t *dt,
                           ct_t *A_log, ct_t *Bm, ct_t *Cm, ct_t *D, ct_t *chunk_states,
                           int64_t chunk)
{
    FENCED(cpu->ssd_scan_bwd(s, dx, ddt, dA_log, dB, dC, dD, dy, x, dt, A_log, Bm, Cm, D,
                             chunk_states, chunk));
}
static void f_gated_rmsnorm_fwd(kern_stream_t *s, tensor_t *out, tensor_t *rstd, ct_t *y, ct_t *z,
                                ct_t *w, int64_t groups, float eps)
{
    FENCED(cpu->gated_rmsnorm_fwd(s, out, rstd, y, z, w, groups, eps));
}
static void f_gated_rmsnorm_bwd(kern_stream_t *s, tensor_t *dy, tensor_t *dz, tensor_t *dw,
                                ct_t *dout, ct_t *y, ct_t *z, ct_t *w, ct_t *rstd, int64_t groups)
{
    FENCED(cpu->gated_rmsnorm_bwd(s, dy, dz, dw, dout, y, z, w, rstd, groups));
}

const kern_backend_t kern_fenced_backend = {
    .name = "fenced",
    .kind = DEV_FENCED,
    .op_dtypes = KERN_CPU_OP_DTYPES,
    .usable = fenced_usable,
    .mem_alloc = fenced_mem_alloc,
    .mem_free = fenced_mem_free,
    .host_alloc = fenced_host_alloc,
    .host_free = fenced_host_free,
    .has_ipc = false,
    .ipc_alloc = fenced_ipc_alloc,
    .ipc_free = fenced_ipc_free,
    .ipc_open = fenced_ipc_open,
    .ipc_close = fenced_ipc_close,
    .stream_create = fenced_stream_create,
    .stream_destroy = kern_immediate_stream_destroy,
    .stream_sync = kern_immediate_stream_sync,
    .stream_notify = kern_immediate_stream_notify,
    .stream_reserve = kern_immediate_stream_reserve,
    .event_create = fenced_event_create,
    .event_destroy = kern_immediate_event_destroy,
    .event_record = kern_immediate_event_record,
    .stream_wait = kern_immediate_stream_wait,
    .upload = fenced_upload,
    .download = fenced_download,
    .matmul = f_matmul,
    .linear_fwd = f_linear_fwd,
    .linear_bwd = f_linear_bwd,
    .zero = f_zero,
    .copy = f_copy,
    .add = f_add,
    .axpy = f_axpy,
    .scale = f_scale,
    .copy_cols = f_copy_cols,
    .sumsq = f_sumsq,
    .count_nonfinite = f_count_nonfinite,
    .embedding_fwd = f_embedding_fwd,
    .embedding_bwd = f_embedding_bwd,
    .rmsnorm_fwd = f_rmsnorm_fwd,
    .rmsnorm_bwd = f_rmsnorm_bwd,
    .add_rmsnorm_fwd = f_add_rmsnorm_fwd,
    .rope_fwd = f_rope_fwd,
    .rope_bwd = f_rope_bwd,
    .attention_fwd = f_attention_fwd,
    .attention_merge = f_attention_merge,
    .attention_bwd = f_attention_bwd,
    .swiglu_fwd = f_swiglu_fwd,
    .swiglu_bwd = f_swiglu_bwd,
    .relu2_fwd = f_relu2_fwd,
    .relu2_bwd = f_relu2_bwd,
    .xent_fwd_bwd = f_xent_fwd_bwd,
    .xent_vp_max = f_xent_vp_max,
    .xent_vp_sum = f_xent_vp_sum,
    .xent_vp_finish = f_xent_vp_finish,
    .adamw = f_adamw,
    .moe_route_fwd = f_moe_route_fwd,
    .moe_route_reselect = f_moe_route_reselect,
    .moe_route_bwd = f_moe_route_bwd,
    .moe_route_stats = f_moe_route_stats,
    .moe_permute_fwd = f_moe_permute_fwd,
    .moe_permute_bwd = f_moe_permute_bwd,
    .moe_combine_fwd = f_moe_combine_fwd,
    .moe_combine_bwd = f_moe_combine_bwd,
    .sigmoid_gate_fwd = f_sigmoid_gate_fwd,
    .sigmoid_gate_bwd = f_sigmoid_gate_bwd,
    .grouped_linear_fwd = f_grouped_linear_fwd,
    .grouped_linear_bwd = f_grouped_linear_bwd,
    .conv1d_causal_fwd = f_conv1d_causal_fwd,
    .conv1d_causal_bwd = f_conv1d_causal_bwd,
    .ssm_dt_fwd = f_ssm_dt_fwd,
    .ssm_dt_bwd = f_ssm_dt_bwd,
    .ssd_scan_fwd = f_ssd_scan_fwd,
    .ssd_scan_bwd = f_ssd_scan_bwd,
    .gated_rmsnorm_fwd = f_gated_rmsnorm_fwd,
    .gated_rmsnorm_bwd = f_gated_rmsnorm_bwd,
};
