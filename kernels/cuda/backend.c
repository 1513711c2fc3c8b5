/* The CUDA backend: device memory (cudaMalloc), pinned staging
 * (cudaMallocHost), streams (non-blocking cudaStream_t, each with its
 * cuBLASLt plans, a 32 MiB cuBLASLt workspace, a scratch buffer and a small
 * block of mapped host memory), events, copies (cudaMemcpyAsync), and the
 * ops, which hand device pointers to the launchers of kernels/cuda/cuda.h.
 *
 * Errors. Every launch and library call is checked; a failure becomes the
 * stream's sticky error through kern_stream_fail(s, "<kern op>", "<CUDA or
 * cuBLASLt message>"), reported by kern_stream_sync / kern_stream_notify as
 * BT_ERR_DEVICE. Errors that only show when queued work runs (a kernel
 * fault) are reported by the next sync, naming the last op queued.
 * Data-dependent errors set a word of the stream's mapped flags
 * (kernels/cuda/cuda.h) and are reported the same way. Nothing here exits.
 *
 * Notifications use cudaStreamAddCallback rather than cudaLaunchHostFunc:
 * a host function is skipped once the context has failed, and a
 * notification that never comes would hang its owner; a callback always
 * runs, once, and is told the failure.
 *
 * Scratch. Ops that need device scratch (reductions, column sums, the
 * embedding sort, attention's backward) use the stream's scratch buffer,
 * grown stream-ordered (cudaFreeAsync + cudaMallocAsync) when an op needs
 * more than kern_stream_reserve set aside. */
#ifdef BT_HAVE_CUDA

#include "kernels/cuda/cuda.h"

#include "base/log.h"

#include <cublasLt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CUDA_LT_WORKSPACE ((size_t)32 << 20) /* what cuBLASLt asks for on Hopper */
#define CUDA_MIN_MAJOR 9                     /* the kernels are built for sm_90 */

/* Host memory mapped into the device, one block per stream. */
typedef struct {
    unsigned flags[8]; /* CUDA_FLAG_* words, set to 1 by kernels */
    double sumsq;
    int64_t count;
} cuda_mapped_t;

typedef struct {
    kern_stream_t base;
    cudaStream_t st;
    cuda_lt_t *lt;
    void *ws; /* cuBLASLt workspace, CUDA_LT_WORKSPACE bytes */
    void *scratch;
    size_t scratch_bytes;
    cuda_mapped_t *host; /* host view of the mapped block */
    cuda_mapped_t *dev;  /* its device address */
    unsigned flags_seen; /* flag words already reported */
    const char *last_op; /* the op queued last, to name asynchronous failures */
    cuda_dnn_t *dnn;     /* cuDNN attention (BATON_CUDA_ATTN=cudnn), made on first use */
    bool dnn_tried;
} cuda_stream_t;

typedef struct {
    kern_event_t base;
    cudaEvent_t ev;
} cuda_event_t;

static cuda_stream_t *cs_of(kern_stream_t *s) { return (cuda_stream_t *)s; }

/* ---- checks -------------------------------------------------------------------------- */

static const char *volatile cuda_inject_op; /* test hook, see cuda.h */

void cuda_test_inject_failure(const char *op) { cuda_inject_op = op; }

static bool cuda_injected(const char *op)
{
    const char *inj = cuda_inject_op;
    if (!inj || strcmp(inj, op)) return false;
    cuda_inject_op = NULL;
    return true;
}

/* true when e is success; otherwise the stream's error names op and e */
static bool cs_check(cuda_stream_t *cs, const char *op, cudaError_t e)
{
    cs->last_op = op;
    if (cuda_injected(op)) {
        kern_stream_fail(&cs->base, op, "injected failure (cuda_test_inject_failure)");
        return false;
    }
    if (e == cudaSuccess) return true;
    char d[192];
    snprintf(d, sizeof d, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    kern_stream_fail(&cs->base, op, d);
    return false;
}

/* Makes the stream's device current on this thread (the current device is
 * per thread; a launch into another device's stream fails). */
static bool cs_enter(cuda_stream_t *cs, const char *op)
{
    return cs_check(cs, op, cudaSetDevice(cs->base.dev.index));
}

/* The stream's scratch, at least n bytes; NULL (and the stream failed) when
 * it cannot grow. */
static void *cs_scratch(cuda_stream_t *cs, const char *op, size_t n)
{
    if (n <= cs->scratch_bytes && (cs->scratch || n == 0)) return cs->scratch;
    if (cs->scratch) cudaFreeAsync(cs->scratch, cs->st);
    cuda_held_remove(cs->scratch);
    cs->scratch = NULL;
    cs->scratch_bytes = 0;
    size_t want = (n + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
    void *p = NULL;
    char inj[64];
    snprintf(inj, sizeof inj, "%s scratch", op);
    cudaError_t e = cuda_injected(inj) ? cudaErrorMemoryAllocation : cudaMallocAsync(&p, want, cs->st);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure must not be blamed on the next launch */
        char d[192];
        snprintf(d, sizeof d, "cannot allocate %zu bytes of scratch: %s", want,
                 cudaGetErrorString(e));
        cs->last_op = op;
        kern_stream_fail(&cs->base, op, d);
        return NULL;
    }
    cs->scratch = p;
    cs->scratch_bytes = want;
    cuda_held_add(p, want);
    return p;
}

static const struct {
    const char *op, *what;
} cuda_flag_info[CUDA_FLAG_COUNT] = {
    [CUDA_FLAG_XENT_TARGET] = {"kern_xent_fwd_bwd", "a target outside the vocabulary [0, V)"},
    [CUDA_FLAG_VP_TARGET] = {"kern_xent_vp_finish", "a negative target other than ignore_index"},
    [CUDA_FLAG_ROPE_POS] = {"kern_rope", "a position outside the cos/sin table [0, P)"},
};

/* After the stream has drained: data errors the kernels flagged. */
static void cs_check_flags(cuda_stream_t *cs)
{
    for (unsigned i = 0; i < CUDA_FLAG_COUNT; i++) {
        if (!((volatile unsigned *)cs->host->flags)[i] || (cs->flags_seen & (1u << i))) continue;
        cs->flags_seen |= 1u << i;
        kern_stream_fail(&cs->base, cuda_flag_info[i].op, cuda_flag_info[i].what);
    }
}

static bt_status_t cuda_alloc_status(cudaError_t e)
{
    cudaGetLastError();
    return e == cudaErrorMemoryAllocation ? BT_ERR_NOMEM : BT_ERR_DEVICE;
}

/* ---- devices ------------------------------------------------------------------------- */

static bool cuda_usable(int index, char *why, size_t cap)
{
    int drv = 0, rt = 0, n = 0;
    cudaError_t e = cudaDriverGetVersion(&drv);
    if (e != cudaSuccess || drv == 0) {
        snprintf(why, cap, "no CUDA driver is installed (libcuda.so.1 not found)");
        return false;
    }
    cudaRuntimeGetVersion(&rt);
    if (drv < rt) {
        snprintf(why, cap,
                 "the CUDA driver supports CUDA %d.%d, older than the runtime %d.%d this binary "
                 "loaded",
                 drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
        return false;
    }
    e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(why, cap, "no CUDA device: %s", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        cudaGetLastError();
        return false;
    }
    if (index < 0 || index >= n) {
        snprintf(why, cap, "cuda:%d does not exist (%d device%s)", index, n, n == 1 ? "" : "s");
        return false;
    }
    int major = 0, minor = 0, pools = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index);
    cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, index);
    if (major < CUDA_MIN_MAJOR) {
        snprintf(why, cap, "cuda:%d is sm_%d%d; this build's kernels need sm_90 or newer", index,
                 major, minor);
        return false;
    }
    if (!pools) {
        snprintf(why, cap, "cuda:%d has no stream-ordered memory pools (cudaMallocAsync)", index);
        return false;
    }
    size_t lt = cuda_lt_version();
    if (lt / 10000 != CUBLAS_VER_MAJOR) {
        snprintf(why, cap, "the loaded cuBLASLt is %zu.%zu.%zu; this binary needs major version %d",
                 lt / 10000, lt / 100 % 100, lt % 100, CUBLAS_VER_MAJOR);
        return false;
    }
    return true;
}

void cuda_versions_str(char *buf, size_t cap)
{
    int drv = 0, rt = 0, n = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    size_t lt = cuda_lt_version();
    int len = snprintf(buf, cap, "driver %d.%d, runtime %d.%d, cublasLt %zu.%zu.%zu (built with %d.%d.%d)",
                       drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10, lt / 10000,
                       lt / 100 % 100, lt % 100, CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR,
                       CUBLAS_VER_PATCH);
    if (drv == 0 || cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        n = 0;
    }
    for (int i = 0; i < n && len > 0 && (size_t)len < cap; i++) {
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) break;
        len += snprintf(buf + len, cap - (size_t)len, "; cuda:%d %s sm_%d%d %.1f GiB", i, p.name,
                        p.major, p.minor, (double)p.totalGlobalMem / (1 << 30));
    }
}

/* ---- memory -------------------------------------------------------------------------- */

static bt_status_t cuda_mem_alloc(int index, size_t nbytes, void **out)
{
    cudaError_t e = cudaSetDevice(index);
    if (e == cudaSuccess) e = cudaMalloc(out, nbytes ? nbytes : 1);
    if (e != cudaSuccess) return cuda_alloc_status(e);
    cuda_held_add(*out, nbytes ? nbytes : 1);
    return BT_OK;
}

static void cuda_mem_free(int index, void *p)
{
    cuda_held_remove(p);
    if (cudaSetDevice(index) != cudaSuccess || cudaFree(p) != cudaSuccess) {
        log_error("cuda:%d: cudaFree(%p): %s", index, p, cudaGetErrorString(cudaGetLastError()));
    }
}

static bt_status_t cuda_host_alloc(int index, size_t nbytes, void **out)
{
    cudaError_t e = cudaSetDevice(index);
    if (e == cudaSuccess) e = cudaMallocHost(out, nbytes ? nbytes : 1);
    return e == cudaSuccess ? BT_OK : cuda_alloc_status(e);
}

static void cuda_host_free(int index, void *p)
{
    (void)index;
    if (cudaFreeHost(p) != cudaSuccess)
        log_error("cudaFreeHost(%p): %s", p, cudaGetErrorString(cudaGetLastError()));
}

/* Memory for a pipeline neighbour in another process: a cudaMalloc
 * allocation of its own (IPC handles cover whole allocations; the stream
 * pools' memory has none) and its cudaIpcMemHandle_t. */
_Static_assert(sizeof(cudaIpcMemHandle_t) <= KERN_IPC_HANDLE_MAX, "kern_ipc_handle_t is too small");

static bt_status_t cuda_ipc_alloc(int index, size_t nbytes, void **out, kern_ipc_handle_t *h)
{
    cudaError_t e = cudaSetDevice(index);
    if (e == cudaSuccess) e = cudaMalloc(out, nbytes ? nbytes : 1);
    if (e != cudaSuccess) return cuda_alloc_status(e);
    cudaIpcMemHandle_t ih;
    if ((e = cudaIpcGetMemHandle(&ih, *out)) != cudaSuccess) {
        log_error("cuda:%d: cudaIpcGetMemHandle: %s", index, cudaGetErrorString(e));
        cudaFree(*out);
        *out = NULL;
        return BT_ERR_DEVICE;
    }
    memcpy(h->bytes, &ih, sizeof ih);
    cuda_held_add(*out, nbytes ? nbytes : 1);
    return BT_OK;
}

static void cuda_ipc_free(int index, void *p, size_t nbytes, const kern_ipc_handle_t *h)
{
    (void)nbytes, (void)h;
    cuda_mem_free(index, p);
}

static bt_status_t cuda_ipc_open(int index, const kern_ipc_handle_t *h, size_t nbytes, void **out)
{
    (void)nbytes; /* the handle names a whole allocation, its size not checkable here */
    cudaIpcMemHandle_t ih;
    memcpy(&ih, h->bytes, sizeof ih);
    cudaError_t e = cudaSetDevice(index);
    if (e == cudaSuccess) e = cudaIpcOpenMemHandle(out, ih, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        log_error("cuda:%d: cudaIpcOpenMemHandle: %s", index, cudaGetErrorString(e));
        cudaGetLastError();
        return BT_ERR_DEVICE;
    }
    return BT_OK;
}

static void cuda_ipc_close(int index, void *p, size_t nbytes)
{
    (void)nbytes;
    cudaError_t e = cudaSetDevice(index);
    if (e == cudaSuccess) e = cudaIpcCloseMemHandle(p);
    if (e != cudaSuccess) log_error("cuda:%d: cudaIpcCloseMemHandle(%p): %s", index, p, cudaGetErrorString(e));
}

/* ---- streams and events ----------------------------------------------------------------- */

static bt_status_t cuda_stream_create(int index, kern_stream_t **out)
{
    bt_status_t rc = BT_ERR_DEVICE;
    char why[160] = "";
    cudaError_t e;
    cuda_stream_t *cs = calloc(1, sizeof *cs);
    if (!cs) return BT_ERR_NOMEM;
    cs->base.be = &kern_cuda_backend;
    cs->base.dev = (device_t){DEV_CUDA, index};
    if ((e = cudaSetDevice(index)) != cudaSuccess) goto fail_free;
    if ((e = cudaStreamCreateWithFlags(&cs->st, cudaStreamNonBlocking)) != cudaSuccess)
        goto fail_free;
    if ((e = cuda_lt_create(&cs->lt, why, sizeof why)) != cudaSuccess) goto fail_stream;
    if ((e = cudaMalloc(&cs->ws, CUDA_LT_WORKSPACE)) != cudaSuccess) goto fail_lt;
    if ((e = cudaHostAlloc((void **)&cs->host, sizeof *cs->host, cudaHostAllocMapped)) !=
        cudaSuccess)
        goto fail_ws;
    memset(cs->host, 0, sizeof *cs->host);
    if ((e = cudaHostGetDevicePointer((void **)&cs->dev, cs->host, 0)) != cudaSuccess)
        goto fail_host;
    cuda_held_add(cs->ws, CUDA_LT_WORKSPACE);
    *out = &cs->base;
    return BT_OK;

fail_host:
    cudaFreeHost(cs->host);
fail_ws:
    cudaFree(cs->ws);
fail_lt:
    cuda_lt_destroy(cs->lt);
fail_stream:
    cudaStreamDestroy(cs->st);
fail_free:
    rc = cuda_alloc_status(e);
    log_error("cuda:%d: cannot create a stream: %s", index, why[0] ? why : cudaGetErrorString(e));
    free(cs);
    return rc;
}

static void cuda_stream_destroy(kern_stream_t *s)
{
    cuda_stream_t *cs = cs_of(s);
    cudaSetDevice(s->dev.index);
    cudaStreamSynchronize(cs->st);
    cuda_dnn_destroy(cs->dnn);
    cuda_held_remove(cs->scratch);
    cuda_held_remove(cs->ws);
    if (cs->scratch) cudaFree(cs->scratch);
    cudaFreeHost(cs->host);
    cudaFree(cs->ws);
    cuda_lt_destroy(cs->lt);
    cudaStreamDestroy(cs->st);
    cudaGetLastError();
    free(cs);
}

static bt_status_t cuda_stream_sync(kern_stream_t *s)
{
    cuda_stream_t *cs = cs_of(s);
    cudaError_t e = cudaSetDevice(s->dev.index);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cs->st);
    if (e != cudaSuccess) {
        char d[224];
        snprintf(d, sizeof d, "%s (%s), while running the work queued up to this op",
                 cudaGetErrorString(e), cudaGetErrorName(e));
        cudaGetLastError();
        kern_stream_fail(s, cs->last_op ? cs->last_op : "queued work", d);
    }
    cs_check_flags(cs);
    return s->error;
}

typedef struct {
    kern_notify_fn fn;
    void *arg;
    bt_status_t status; /* the stream's error when the notification was queued */
    const volatile unsigned *flags;
} cuda_note_t;

/* On a CUDA thread, once the work before it is done (or the context failed). */
static void CUDART_CB cuda_note_cb(cudaStream_t st, cudaError_t e, void *p)
{
    (void)st;
    cuda_note_t *n = p;
    bt_status_t status = n->status;
    if (status == BT_OK && e != cudaSuccess) status = BT_ERR_DEVICE;
    for (int i = 0; i < CUDA_FLAG_COUNT && status == BT_OK; i++)
        if (n->flags[i]) status = BT_ERR_DEVICE;
    n->fn(n->arg, status);
    free(n);
}

static void *cuda_stream_native(kern_stream_t *s) { return cs_of(s)->st; }

static bt_status_t cuda_stream_notify(kern_stream_t *s, kern_notify_fn fn, void *arg)
{
    cuda_stream_t *cs = cs_of(s);
    cuda_note_t *n = malloc(sizeof *n);
    if (!n) return BT_ERR_NOMEM;
    *n = (cuda_note_t){.fn = fn, .arg = arg, .status = s->error, .flags = cs->host->flags};
    if (!cs_enter(cs, "kern_stream_notify") ||
        !cs_check(cs, "kern_stream_notify", cudaStreamAddCallback(cs->st, cuda_note_cb, n, 0))) {
        free(n);
        return s->error;
    }
    return BT_OK;
}

static bt_status_t cuda_stream_reserve(kern_stream_t *s, size_t nbytes)
{
    cuda_stream_t *cs = cs_of(s);
    if (nbytes <= cs->scratch_bytes) return BT_OK;
    if (cudaSetDevice(s->dev.index) != cudaSuccess) return cuda_alloc_status(cudaErrorInvalidDevice);
    void *p = NULL;
    cudaError_t e = cudaMallocAsync(&p, nbytes, cs->st);
    if (e != cudaSuccess) return cuda_alloc_status(e);
    cuda_held_add(p, nbytes); /* before the old one goes: both exist for a moment */
    if (cs->scratch) cudaFreeAsync(cs->scratch, cs->st);
    cuda_held_remove(cs->scratch);
    cs->scratch = p;
    cs->scratch_bytes = nbytes;
    return BT_OK;
}

static bt_status_t cuda_event_create(int index, kern_event_t **out)
{
    cuda_event_t *ev = calloc(1, sizeof *ev);
    if (!ev) return BT_ERR_NOMEM;
    ev->base.be = &kern_cuda_backend;
    ev->base.dev = (device_t){DEV_CUDA, index};
    cudaError_t e = cudaSetDevice(index);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        log_error("cuda:%d: cannot create an event: %s", index, cudaGetErrorString(e));
        free(ev);
        return cuda_alloc_status(e);
    }
    *out = &ev->base;
    return BT_OK;
}

static void cuda_event_destroy(kern_event_t *e)
{
    cuda_event_t *ev = (cuda_event_t *)e;
    cudaSetDevice(e->dev.index);
    cudaEventDestroy(ev->ev);
    free(ev);
}

static void cuda_event_record(kern_event_t *e, kern_stream_t *s)
{
    cuda_stream_t *cs = cs_of(s);
    if (cs_enter(cs, "kern_event_record"))
        cs_check(cs, "kern_event_record", cudaEventRecord(((cuda_event_t *)e)->ev, cs->st));
}

static void cuda_stream_wait(kern_stream_t *s, kern_event_t *e)
{
    cuda_stream_t *cs = cs_of(s);
    if (cs_enter(cs, "kern_stream_wait"))
        cs_check(cs, "kern_stream_wait", cudaStreamWaitEvent(cs->st, ((cuda_event_t *)e)->ev, 0));
}

/* ---- copies ---------------------------------------------------------------------------- */

static void cuda_upload(kern_stream_t *s, void *dst, const void *host, size_t n)
{
    cuda_stream_t *cs = cs_of(s);
    if (cs_enter(cs, "kern_upload"))
        cs_check(cs, "kern_upload", cudaMemcpyAsync(dst, host, n, cudaMemcpyHostToDevice, cs->st));
}

static void cuda_download(kern_stream_t *s, void *host, const void *src, size_t n)
{
    cuda_stream_t *cs = cs_of(s);
    if (cs_enter(cs, "kern_download"))
        cs_check(cs, "kern_download", cudaMemcpyAsync(host, src, n, cudaMemcpyDeviceToHost, cs->st));
}

/* ---- dense algebra --------------------------------------------------------------------- */

/* One product; true when queued. cuBLASLt computes it, or, when cuBLASLt
 * declines the problem (no algorithm for that shape, dtype, alignment or
 * epilogue), the plain kernel of gemm.cu. */
static bool cs_gemm(cuda_stream_t *cs, const char *op, cuda_gemm_t g)
{
    if (g.M == 0 || g.N == 0) return true;
    if (g.K == 0) {
        /* no product: c = bias, or beta c (beta == 0 overwrites, clearing NaNs) */
        if (g.bias)
            return cs_check(cs, op, cuda_bias_rows(cs->st, g.c, g.bias, g.c_dt, g.M, g.N));
        if (g.beta == 1.0f) return true;
        if (g.beta == 0.0f)
            return cs_check(cs, op, cudaMemsetAsync(g.c, 0, (size_t)(g.M * g.N) * dtype_size(g.c_dt), cs->st));
        return cs_check(cs, op, cuda_scale(cs->st, g.c, g.beta, g.c_dt, g.M * g.N));
    }
    char why[256];
    bool no_algo = false;
    cs->last_op = op;
    if (cuda_injected(op)) {
        kern_stream_fail(&cs->base, op, "injected failure (cuda_test_inject_failure)");
        return false;
    }
    if (cuda_lt_gemm(cs->lt, cs->st, cs->ws, CUDA_LT_WORKSPACE, &g, &no_algo, why, sizeof why))
        return true;
    if (no_algo) return cs_check(cs, op, cuda_gemm_fallback(cs->st, &g));
    cudaGetLastError();
    kern_stream_fail(&cs->base, op, why);
    return false;
}

static void cuda_op_matmul(kern_stream_t *s, tensor_t *c, ct_t *a, ct_t *b, bool ta, bool tb,
                           float alpha, float beta)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_matmul";
    if (!cs_enter(cs, op)) return;
    cs_gemm(cs, op,
            (cuda_gemm_t){.c = c->data, .a = a->data, .b = b->data, .ab_dt = a->dtype,
                          .c_dt = c->dtype, .M = tensor_rows(c), .N = tensor_cols(c),
                          .K = ta ? tensor_rows(a) : tensor_cols(a), .trans_a = ta, .trans_b = tb,
                          .alpha = alpha, .beta = beta});
}

static void cuda_op_linear_fwd(kern_stream_t *s, tensor_t *out, ct_t *x, ct_t *w, ct_t *bias)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_linear_fwd";
    if (!cs_enter(cs, op)) return;
    cs_gemm(cs, op,
            (cuda_gemm_t){.c = out->data, .a = x->data, .b = w->data,
                          .bias = bias ? bias->data : NULL, .ab_dt = x->dtype, .c_dt = out->dtype,
                          .M = tensor_rows(x), .N = w->shape[0], .K = tensor_cols(x),
                          .trans_b = true, .alpha = 1.0f, .beta = 0.0f});
}

static void cuda_op_linear_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, tensor_t *dbias,
                               ct_t *dout, ct_t *x, ct_t *w, bool set)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_linear_bwd";
    if (!cs_enter(cs, op)) return;
    int64_t N = tensor_rows(x), IC = tensor_cols(x), OC = w->shape[0];
    /* dx[N,IC] += dout[N,OC] w[OC,IC] (=, beta 0, when set: C is not read) */
    if (dx && !cs_gemm(cs, op,
                       (cuda_gemm_t){.c = dx->data, .a = dout->data, .b = w->data,
                                     .ab_dt = dout->dtype, .c_dt = dx->dtype, .M = N, .N = IC,
                                     .K = OC, .alpha = 1.0f, .beta = set ? 0.0f : 1.0f}))
        return;
    /* dw[OC,IC] += dout^T x, in f32 when dw is f32 under bf16 data */
    if (dw && !cs_gemm(cs, op,
                       (cuda_gemm_t){.c = dw->data, .a = dout->data, .b = x->data,
                                     .ab_dt = dout->dtype, .c_dt = dw->dtype, .M = OC, .N = IC,
                                     .K = N, .trans_a = true, .alpha = 1.0f, .beta = 1.0f}))
        return;
    if (dbias && N > 0 && OC > 0) {
        void *scr = cs_scratch(cs, op, cuda_colsum_scratch(N, OC));
        if (scr)
            cs_check(cs, op,
                     cuda_colsum(cs->st, dbias->data, dbias->dtype, dout->data, dout->dtype, N, OC,
                                 scr));
    }
}

/* ---- elementwise ------------------------------------------------------------------------ */

static void cuda_op_zero(kern_stream_t *s, tensor_t *t)
{
    cuda_stream_t *cs = cs_of(s);
    size_t n = tensor_nbytes(t);
    if (n && cs_enter(cs, "kern_zero"))
        cs_check(cs, "kern_zero", cudaMemsetAsync(t->data, 0, n, cs->st));
}

static void cuda_op_copy(kern_stream_t *s, tensor_t *dst, ct_t *src)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_copy";
    int64_t n = tensor_numel(dst);
    if (dst->dtype == src->dtype) {
        if (n && dst->data != src->data && cs_enter(cs, op))
            cs_check(cs, op,
                     cudaMemcpyAsync(dst->data, src->data, tensor_nbytes(dst),
                                     cudaMemcpyDeviceToDevice, cs->st));
        return;
    }
    if (!dtype_is_float(dst->dtype) || !dtype_is_float(src->dtype))
        BT_PANIC("kern_copy: no conversion %s -> %s", dtype_name(src->dtype),
                 dtype_name(dst->dtype));
    if (cs_enter(cs, op))
        cs_check(cs, op, cuda_convert(cs->st, dst->data, dst->dtype, src->data, src->dtype, n));
}

static void cuda_op_add(kern_stream_t *s, tensor_t *out, ct_t *a, ct_t *b)
{
    cuda_stream_t *cs = cs_of(s);
    if (cs_enter(cs, "kern_add"))
        cs_check(cs, "kern_add",
                 cuda_add(cs->st, out->data, a->data, b->data, out->dtype, tensor_numel(out)));
}

static void cuda_op_axpy(kern_stream_t *s, tensor_t *y, float alpha, ct_t *x)
{
    cuda_stream_t *cs = cs_of(s);
    if (cs_enter(cs, "kern_axpy"))
        cs_check(cs, "kern_axpy", cuda_axpy(cs->st, y->data, alpha, x->data, y->dtype, tensor_numel(y)));
}

static void cuda_op_scale(kern_stream_t *s, tensor_t *t, float f)
{
    cuda_stream_t *cs = cs_of(s);
    if (cs_enter(cs, "kern_scale"))
        cs_check(cs, "kern_scale", cuda_scale(cs->st, t->data, f, t->dtype, tensor_numel(t)));
}

static void cuda_op_copy_cols(kern_stream_t *s, tensor_t *dst, ct_t *src, const kern_cols_t *c)
{
    cuda_stream_t *cs = cs_of(s);
    if (cs_enter(cs, "kern_copy_cols"))
        cs_check(cs, "kern_copy_cols",
                 cuda_copy_cols(cs->st, dst->data, src->data, dst->dtype, tensor_rows(dst),
                                tensor_cols(dst), tensor_cols(src), c->d0, c->dstep, c->s0,
                                c->sstep, c->n, c->div, c->acc));
}

/* Queues a reduction into the mapped block and waits for it. */
static bool cs_reduce(cuda_stream_t *cs, const char *op, ct_t *t, bool count)
{
    if (!dtype_is_float(t->dtype)) BT_PANIC("%s: %s is not a float dtype", op, dtype_name(t->dtype));
    if (!cs_enter(cs, op)) return false;
    int64_t n = tensor_numel(t);
    void *scr = cs_scratch(cs, op, cuda_reduce_scratch(n));
    if (!scr) return false;
    cudaError_t e = count ? cuda_count_nonfinite(cs->st, &cs->dev->count, t->data, t->dtype, n, scr)
                          : cuda_sumsq(cs->st, &cs->dev->sumsq, t->data, t->dtype, n, scr);
    if (!cs_check(cs, op, e)) return false;
    return kern_stream_sync(&cs->base) == BT_OK;
}

/* On a failed stream: NaN, so that a norm built from it is never trusted. */
static double cuda_op_sumsq(kern_stream_t *s, ct_t *t)
{
    cuda_stream_t *cs = cs_of(s);
    if (!cs_reduce(cs, "kern_sumsq", t, false)) return NAN;
    return *(volatile double *)&cs->host->sumsq;
}

/* On a failed stream: every element counts as non-finite. */
static int64_t cuda_op_count_nonfinite(kern_stream_t *s, ct_t *t)
{
    cuda_stream_t *cs = cs_of(s);
    if (!cs_reduce(cs, "kern_count_nonfinite", t, true)) return tensor_numel(t);
    return *(volatile int64_t *)&cs->host->count;
}

/* ---- layers ------------------------------------------------------------------------------ */

static void cuda_op_embedding_fwd(kern_stream_t *s, tensor_t *out, ct_t *table, ct_t *ids,
                                  int64_t vocab_start)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_embedding_fwd";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_embedding_fwd(cs->st, out->data, table->data, ids->data, out->dtype,
                                    tensor_rows(out), table->shape[0], table->shape[1],
                                    vocab_start));
}

static void cuda_op_embedding_bwd(kern_stream_t *s, tensor_t *dtable, ct_t *dout, ct_t *ids,
                                  int64_t vocab_start)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_embedding_bwd";
    int64_t N = tensor_rows(dout), V = dtable->shape[0], C = dtable->shape[1];
    if (N == 0 || C == 0 || !cs_enter(cs, op)) return;
    size_t need = cuda_embedding_bwd_scratch(N, V);
    void *scr = cs_scratch(cs, op, need);
    if (scr)
        cs_check(cs, op,
                 cuda_embedding_bwd(cs->st, dtable->data, dtable->dtype, dout->data, dout->dtype,
                                    ids->data, N, V, C, vocab_start, scr, cs->scratch_bytes));
}

static void cuda_op_rmsnorm_fwd(kern_stream_t *s, tensor_t *out, tensor_t *rstd, ct_t *x, ct_t *w,
                                float eps)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_rmsnorm_fwd";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_rmsnorm_fwd(cs->st, out->data, rstd->data, x->data, w->data, x->dtype,
                                  tensor_rows(x), tensor_cols(x), eps));
}

static void cuda_op_add_rmsnorm_fwd(kern_stream_t *s, tensor_t *xout, tensor_t *ln, tensor_t *rstd,
                                    ct_t *x, ct_t *y, ct_t *w, float eps)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_add_rmsnorm_fwd";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_add_rmsnorm_fwd(cs->st, xout->data, ln->data, rstd->data, x->data, y->data,
                                      w->data, xout->dtype, tensor_rows(xout), tensor_cols(xout),
                                      eps));
}

static void cuda_op_rmsnorm_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, ct_t *dout, ct_t *x,
                                ct_t *w, ct_t *rstd)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_rmsnorm_bwd";
    int64_t N = tensor_rows(x), C = tensor_cols(x);
    if ((!dx && !dw) || N == 0 || !cs_enter(cs, op)) return;
    void *scr = NULL;
    if (dw && !(scr = cs_scratch(cs, op, cuda_rmsnorm_bwd_scratch(N, C)))) return;
    cs_check(cs, op,
             cuda_rmsnorm_bwd(cs->st, dx ? dx->data : NULL, dw ? dw->data : NULL,
                              dw ? dw->dtype : DT_F32, dout->data, x->data, w->data, rstd->data,
                              x->dtype, N, C, scr));
}

/* bwd: 0 forward, 1 backward accumulating, 2 backward overwriting */
static void cuda_rope_run(kern_stream_t *s, const char *op, tensor_t *out, ct_t *x, ct_t *cos,
                          ct_t *sin, ct_t *pos, int bwd)
{
    cuda_stream_t *cs = cs_of(s);
    int64_t D = x->shape[x->ndim - 1], H = x->shape[x->ndim - 2];
    int64_t BT = D * H > 0 ? tensor_numel(x) / (D * H) : 0;
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_rope(cs->st, out->data, x->data, cos->data, sin->data, pos->data, x->dtype,
                           BT, H, D, cos->shape[0], bwd, cs->dev->flags));
}

static void cuda_op_rope_fwd(kern_stream_t *s, tensor_t *out, ct_t *x, ct_t *cos, ct_t *sin,
                             ct_t *pos)
{
    cuda_rope_run(s, "kern_rope_fwd", out, x, cos, sin, pos, 0);
}

static void cuda_op_rope_bwd(kern_stream_t *s, tensor_t *dx, ct_t *dout, ct_t *cos, ct_t *sin,
                             ct_t *pos, bool set)
{
    cuda_rope_run(s, set ? "kern_rope_bwd_set" : "kern_rope_bwd", dx, dout, cos, sin, pos,
                  set ? 2 : 1);
}

/* baton's kernels take no sliding window: one that cuts some query's keys
 * (Tk > window) runs through cuDNN only; where cuDNN declined it, the
 * stream fails naming the op (model/attention.c asks
 * kern_attention_window_supported before it runs such a layer). */
static bool cuda_attn_no_window(cuda_stream_t *cs, const char *op, const kern_attn_shape_t *sh,
                                const char *dnn_why)
{
    if (sh->window <= 0 || sh->Tk <= sh->window) return true;
    char d[384];
    snprintf(d, sizeof d, "a sliding window of %lld over %lld keys runs through cuDNN only (%s)",
             (long long)sh->window, (long long)sh->Tk,
             dnn_why && dnn_why[0] ? dnn_why : "BATON_CUDA_ATTN=cudnn is not set");
    cs->last_op = op;
    kern_stream_fail(&cs->base, op, d);
    return false;
}

static bool cuda_attention_window(dtype_t dt, char *why, size_t cap)
{
    if (cuda_attn_get_path() != CUDA_ATTN_CUDNN) {
        snprintf(why, cap, "baton's CUDA attention kernels take no window; cuDNN's do "
                           "(BATON_CUDA_ATTN=cudnn)");
        return false;
    }
    if (dt != DT_BF16 && dt != DT_F16) {
        snprintf(why, cap, "cuDNN's attention takes bf16 or f16, not %s", dtype_name(dt));
        return false;
    }
    return cuda_dnn_usable(why, cap);
}

typedef struct {
    cuda_stream_t *cs;
    const char *op;
} cuda_dnn_ctx_t;

static void *cuda_dnn_ws(void *ctx, size_t n)
{
    cuda_dnn_ctx_t *c = ctx;
    return cs_scratch(c->cs, c->op, n);
}

/* The stream's cuDNN attention when BATON_CUDA_ATTN=cudnn asks for it and
 * cuDNN can be used; NULL otherwise (said once per stream). */
static cuda_dnn_t *cs_dnn(cuda_stream_t *cs)
{
    if (cuda_attn_get_path() != CUDA_ATTN_CUDNN) return NULL;
    if (!cs->dnn_tried) {
        cs->dnn_tried = true;
        char why[256] = "";
        if (!cuda_dnn_create(&cs->dnn, why, sizeof why))
            log_warn("cuda:%d: BATON_CUDA_ATTN=cudnn, but %s; baton's attention kernels run",
                     cs->base.dev.index, why);
    }
    return cs->dnn;
}

/* true when cuDNN ran the call (or failed it, the stream's error set);
 * false when the caller's kernels are to run it */
static bool cuda_dnn_took(cuda_stream_t *cs, const char *op, int rc, const char *why)
{
    if (rc == CUDA_DNN_DONE) {
        cs->last_op = op;
        return true;
    }
    if (rc == CUDA_DNN_FAILED) {
        cs->last_op = op;
        kern_stream_fail(&cs->base, op, why);
        return true;
    }
    return false;
}

static void cuda_op_attention_fwd(kern_stream_t *s, tensor_t *out, tensor_t *lse, ct_t *q, ct_t *k,
                                  ct_t *v, const kern_attn_shape_t *sh)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_attention_fwd";
    if (!cs_enter(cs, op)) return;
    cuda_dnn_t *dnn = cs_dnn(cs);
    char why[256] = "";
    if (dnn) {
        cuda_dnn_ctx_t c = {cs, op};
        if (cuda_dnn_took(cs, op,
                          cuda_dnn_attn_fwd(dnn, cs->st, out->data, lse->data, q->data, k->data,
                                            v->data, q->dtype, sh, cuda_dnn_ws, &c, why,
                                            sizeof why),
                          why))
            return;
    }
    if (!cuda_attn_no_window(cs, op, sh, why)) return;
    cs_check(cs, op,
             cuda_attn_fwd(cs->st, out->data, lse->data, q->data, k->data, v->data, q->dtype, sh));
}

static void cuda_op_attention_merge(kern_stream_t *s, tensor_t *out, tensor_t *lse,
                                    ct_t *part_out, ct_t *part_lse)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_attention_merge";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_attn_merge(cs->st, out->data, lse->data, part_out->data, part_lse->data,
                                 out->dtype, out->shape[0], out->shape[1], out->shape[2],
                                 out->shape[3]));
}

static void cuda_op_attention_bwd(kern_stream_t *s, tensor_t *dq, tensor_t *dk, tensor_t *dv,
                                  ct_t *dout, ct_t *q, ct_t *k, ct_t *v, ct_t *out, ct_t *lse,
                                  const kern_attn_shape_t *sh, bool set)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_attention_bwd";
    if ((!dq && !dk && !dv) || !cs_enter(cs, op)) return;
    cuda_dnn_t *dnn = set ? cs_dnn(cs) : NULL; /* cuDNN writes; it does not accumulate */
    char why[256] = "";
    if (dnn) {
        cuda_dnn_ctx_t c = {cs, op};
        if (cuda_dnn_took(cs, op,
                          cuda_dnn_attn_bwd(dnn, cs->st, dq ? dq->data : NULL,
                                            dk ? dk->data : NULL, dv ? dv->data : NULL,
                                            dout->data, q->data, k->data, v->data, out->data,
                                            lse->data, q->dtype, sh, cuda_dnn_ws, &c, why,
                                            sizeof why),
                          why))
            return;
    }
    if (!cuda_attn_no_window(cs, op, sh, why)) return;
    void *scr = cs_scratch(cs, op, cuda_attn_bwd_scratch(sh));
    if (scr)
        cs_check(cs, op,
                 cuda_attn_bwd(cs->st, dq ? dq->data : NULL, dk ? dk->data : NULL,
                               dv ? dv->data : NULL, dout->data, q->data, k->data, v->data,
                               out->data, lse->data, q->dtype, sh, scr, set));
}

static void cuda_op_swiglu_fwd(kern_stream_t *s, tensor_t *out, ct_t *gate, ct_t *up)
{
    cuda_stream_t *cs = cs_of(s);
    if (cs_enter(cs, "kern_swiglu_fwd"))
        cs_check(cs, "kern_swiglu_fwd",
                 cuda_swiglu_fwd(cs->st, out->data, gate->data, up->data, out->dtype,
                                 tensor_numel(out)));
}

static void cuda_op_swiglu_bwd(kern_stream_t *s, tensor_t *dgate, tensor_t *dup, ct_t *dout,
                               ct_t *gate, ct_t *up, bool set)
{
    cuda_stream_t *cs = cs_of(s);
    if (cs_enter(cs, "kern_swiglu_bwd"))
        cs_check(cs, "kern_swiglu_bwd",
                 cuda_swiglu_bwd(cs->st, dgate ? dgate->data : NULL, dup ? dup->data : NULL,
                                 dout->data, gate->data, up->data, dout->dtype,
                                 tensor_numel(dout), set));
}

static void cuda_op_relu2_fwd(kern_stream_t *s, tensor_t *out, ct_t *x)
{
    cuda_stream_t *cs = cs_of(s);
    if (cs_enter(cs, "kern_relu2_fwd"))
        cs_check(cs, "kern_relu2_fwd",
                 cuda_relu2_fwd(cs->st, out->data, x->data, out->dtype, tensor_numel(out)));
}

static void cuda_op_relu2_bwd(kern_stream_t *s, tensor_t *dx, ct_t *dout, ct_t *x, bool set)
{
    cuda_stream_t *cs = cs_of(s);
    if (cs_enter(cs, "kern_relu2_bwd"))
        cs_check(cs, "kern_relu2_bwd",
                 cuda_relu2_bwd(cs->st, dx->data, dout->data, x->data, dx->dtype,
                                tensor_numel(dx), set));
}

static void cuda_op_xent_fwd_bwd(kern_stream_t *s, tensor_t *losses, tensor_t *dlogits,
                                 ct_t *logits, ct_t *targets, float dloss, int32_t ignore_index)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_xent_fwd_bwd";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_xent_fwd_bwd(cs->st, losses->data, dlogits ? dlogits->data : NULL,
                                   logits->data, logits->dtype, targets->data,
                                   tensor_rows(logits), tensor_cols(logits), dloss, ignore_index,
                                   cs->dev->flags));
}

static void cuda_op_xent_vp_max(kern_stream_t *s, tensor_t *row_max, ct_t *logits)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_xent_vp_max";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_xent_vp_max(cs->st, row_max->data, logits->data, logits->dtype,
                                  tensor_rows(logits), tensor_cols(logits)));
}

static void cuda_op_xent_vp_sum(kern_stream_t *s, tensor_t *sumexp, tensor_t *tgt_logit,
                                ct_t *logits, ct_t *gmax, ct_t *targets, int64_t vocab_start,
                                int32_t ignore_index)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_xent_vp_sum";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_xent_vp_sum(cs->st, sumexp->data, tgt_logit->data, logits->data,
                                  logits->dtype, gmax->data, targets->data, tensor_rows(logits),
                                  tensor_cols(logits), vocab_start, ignore_index));
}

static void cuda_op_xent_vp_finish(kern_stream_t *s, tensor_t *losses, tensor_t *dlogits,
                                   ct_t *logits, ct_t *gmax, ct_t *sumexp, ct_t *tgt_logit,
                                   ct_t *targets, int64_t vocab_start, float dloss,
                                   int32_t ignore_index)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_xent_vp_finish";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_xent_vp_finish(cs->st, losses ? losses->data : NULL,
                                     dlogits ? dlogits->data : NULL, logits->data, logits->dtype,
                                     gmax->data, sumexp->data, tgt_logit->data, targets->data,
                                     tensor_rows(logits), tensor_cols(logits), vocab_start, dloss,
                                     ignore_index, cs->dev->flags));
}

/* The shortest decimal that rounds to f, read as a double: the value the
 * config wrote (0.9, 0.999), as torch sees it (kernels/cpu/adamw.c). */
static double cuda_adamw_hparam(float f)
{
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        double d = strtod(buf, NULL);
        if ((float)d == f) return d;
    }
    return (double)f;
}

static void cuda_op_adamw(kern_stream_t *s, tensor_t *param, tensor_t *param_copy, ct_t *grad,
                          tensor_t *m, tensor_t *v, const adamw_args_t *a)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_adamw";
    double lr = cuda_adamw_hparam(a->lr), wd = cuda_adamw_hparam(a->weight_decay);
    double beta1 = cuda_adamw_hparam(a->beta1), beta2 = cuda_adamw_hparam(a->beta2);
    double eps = cuda_adamw_hparam(a->eps), step = (double)a->step;
    double bc1 = 1.0 - pow(beta1, step), bc2 = 1.0 - pow(beta2, step);
    cuda_adamw_k_t k = {
        .decay = (float)(1.0 - lr * wd),
        .w1 = (float)(1.0 - beta1),
        .b2 = (float)beta2,
        .w2 = (float)(1.0 - beta2),
        .bc2s = (float)sqrt(bc2),
        .eps = (float)eps,
        .neg_step = (float)(-(lr / bc1)),
        .decays = wd != 0.0,
    };
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_adamw(cs->st, param->data, param->dtype,
                            param_copy ? param_copy->data : NULL,
                            param_copy ? param_copy->dtype : DT_F32, grad->data, grad->dtype,
                            m->data, v->data, tensor_numel(param), &k));
}

/* ---- routed experts --------------------------------------------------------------------- */

static void cuda_op_moe_route_fwd(kern_stream_t *s, tensor_t *weights, tensor_t *experts,
                                  tensor_t *probs, ct_t *logits, bool norm)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_moe_route_fwd";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_moe_route_fwd(cs->st, weights->data, experts->data, probs->data,
                                    logits->data, logits->dtype, logits->shape[0],
                                    logits->shape[1], experts->shape[1], norm));
}

static void cuda_op_moe_route_reselect(kern_stream_t *s, tensor_t *weights, tensor_t *experts,
                                       ct_t *probs, ct_t *bias, bool norm)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_moe_route_reselect";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_moe_route_reselect(cs->st, weights->data, experts->data, probs->data,
                                         bias->data, probs->shape[0], probs->shape[1],
                                         experts->shape[1], norm));
}

static void cuda_op_moe_route_bwd(kern_stream_t *s, tensor_t *dlogits, ct_t *dweights,
                                  ct_t *dprobs, ct_t *probs, ct_t *experts, bool norm)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_moe_route_bwd";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_moe_route_bwd(cs->st, dlogits->data, dlogits->dtype,
                                    dweights ? dweights->data : NULL,
                                    dprobs ? dprobs->data : NULL, probs->data, experts->data,
                                    probs->shape[0], probs->shape[1], experts->shape[1], norm));
}

static void cuda_op_moe_route_stats(kern_stream_t *s, tensor_t *counts, tensor_t *psum,
                                    ct_t *probs, ct_t *experts)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_moe_route_stats";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_moe_route_stats(cs->st, counts->data, psum->data, probs->data,
                                      experts->data, probs->shape[0], probs->shape[1],
                                      experts->shape[1]));
}

static void cuda_op_moe_permute_fwd(kern_stream_t *s, tensor_t *xp, tensor_t *slot,
                                    tensor_t *sizes, tensor_t *routed, ct_t *x, ct_t *experts,
                                    int64_t capacity, ct_t *caps)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_moe_permute_fwd";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_moe_permute_fwd(cs->st, xp->data, slot->data, sizes->data, routed->data,
                                      x->data, experts->data, x->dtype, tensor_rows(x),
                                      tensor_cols(x), experts->shape[1], tensor_numel(sizes),
                                      capacity, caps ? (const int32_t *)caps->data : NULL));
}

static void cuda_op_moe_permute_bwd(kern_stream_t *s, tensor_t *dx, ct_t *dxp, ct_t *slot)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_moe_permute_bwd";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_moe_permute_bwd(cs->st, dx->data, dxp->data, slot->data, dx->dtype,
                                      tensor_rows(dx), tensor_cols(dx), slot->shape[1]));
}

static void cuda_op_moe_combine_fwd(kern_stream_t *s, tensor_t *y, ct_t *yp, ct_t *slot,
                                    ct_t *weights)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_moe_combine_fwd";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_moe_combine_fwd(cs->st, y->data, yp->data, slot->data, weights->data,
                                      y->dtype, tensor_rows(y), tensor_cols(y), slot->shape[1]));
}

static void cuda_op_moe_combine_bwd(kern_stream_t *s, tensor_t *dyp, tensor_t *dweights, ct_t *dy,
                                    ct_t *yp, ct_t *slot, ct_t *weights)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_moe_combine_bwd";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_moe_combine_bwd(cs->st, dyp ? dyp->data : NULL,
                                      dweights ? dweights->data : NULL, dy->data, yp->data,
                                      slot->data, weights->data, dy->dtype, tensor_rows(dy),
                                      tensor_cols(dy), slot->shape[1]));
}

static void cuda_op_sigmoid_gate_fwd(kern_stream_t *s, tensor_t *out, ct_t *gate, ct_t *x)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_sigmoid_gate_fwd";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_sigmoid_gate_fwd(cs->st, out->data, gate->data, x->data, x->dtype,
                                       tensor_rows(x), tensor_cols(x)));
}

static void cuda_op_sigmoid_gate_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dgate, ct_t *dout,
                                     ct_t *gate, ct_t *x)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_sigmoid_gate_bwd";
    if (cs_enter(cs, op))
        cs_check(cs, op,
                 cuda_sigmoid_gate_bwd(cs->st, dx ? dx->data : NULL, dgate ? dgate->data : NULL,
                                       dout->data, gate->data, x->data, x->dtype, tensor_rows(x),
                                       tensor_cols(x)));
}

/* The group sizes on the host: the products are one cuBLASLt call per group
 * for now, so the call waits for the stream to read them (a grouped GEMM
 * kernel reading sizes on the device is the later step). NULL (the stream
 * failed) when they cannot be read or do not fit the M rows of x. */
static int32_t *cs_group_sizes(cuda_stream_t *cs, const char *op, ct_t *sizes, int64_t M)
{
    int64_t G = tensor_numel(sizes);
    int32_t *h = malloc((size_t)(G > 0 ? G : 1) * sizeof *h);
    if (!h) {
        kern_stream_fail(&cs->base, op, "out of host memory for the group sizes");
        return NULL;
    }
    if (!cs_check(cs, op,
                  cudaMemcpyAsync(h, sizes->data, (size_t)G * sizeof *h, cudaMemcpyDeviceToHost,
                                  cs->st)) ||
        !cs_check(cs, op, cudaStreamSynchronize(cs->st))) {
        free(h);
        return NULL;
    }
    int64_t sum = 0;
    for (int64_t g = 0; g < G; g++) {
        if (h[g] < 0 || (sum += h[g]) > M) {
            kern_stream_fail(&cs->base, op, "group sizes negative or past the rows of x");
            free(h);
            return NULL;
        }
    }
    return h;
}

static void cuda_op_grouped_linear_fwd(kern_stream_t *s, tensor_t *out, ct_t *x, ct_t *w,
                                       ct_t *sizes)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_grouped_linear_fwd";
    int64_t M = tensor_rows(x), IC = tensor_cols(x), OC = w->shape[1], G = w->shape[0];
    if (!cs_enter(cs, op)) return;
    int32_t *h = cs_group_sizes(cs, op, sizes, M);
    if (!h) return;
    size_t xs = dtype_size(x->dtype);
    int64_t r = 0;
    bool ok = true;
    for (int64_t g = 0; g < G && ok; r += h[g], g++)
        ok = cs_gemm(cs, op,
                     (cuda_gemm_t){.c = (char *)out->data + (size_t)(r * OC) * xs,
                                   .a = (const char *)x->data + (size_t)(r * IC) * xs,
                                   .b = (const char *)w->data + (size_t)(g * OC * IC) * xs,
                                   .ab_dt = x->dtype, .c_dt = out->dtype, .M = h[g], .N = OC,
                                   .K = IC, .trans_b = true, .alpha = 1.0f, .beta = 0.0f});
    if (ok && r < M)
        cs_check(cs, op,
                 cudaMemsetAsync((char *)out->data + (size_t)(r * OC) * xs, 0,
                                 (size_t)((M - r) * OC) * xs, cs->st));
    free(h);
}

static void cuda_op_grouped_linear_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, ct_t *dout,
                                       ct_t *x, ct_t *w, ct_t *sizes)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_grouped_linear_bwd";
    int64_t M = tensor_rows(x), IC = tensor_cols(x), OC = w->shape[1], G = w->shape[0];
    if ((!dx && !dw) || !cs_enter(cs, op)) return;
    int32_t *h = cs_group_sizes(cs, op, sizes, M);
    if (!h) return;
    size_t xs = dtype_size(x->dtype), ws = dw ? dtype_size(dw->dtype) : 0;
    int64_t r = 0;
    bool ok = true;
    for (int64_t g = 0; g < G && ok; r += h[g], g++) {
        const char *dout_g = (const char *)dout->data + (size_t)(r * OC) * xs;
        if (dx)
            ok = cs_gemm(cs, op,
                         (cuda_gemm_t){.c = (char *)dx->data + (size_t)(r * IC) * xs, .a = dout_g,
                                       .b = (const char *)w->data + (size_t)(g * OC * IC) * xs,
                                       .ab_dt = x->dtype, .c_dt = dx->dtype, .M = h[g], .N = IC,
                                       .K = OC, .alpha = 1.0f, .beta = 1.0f});
        if (ok && dw)
            ok = cs_gemm(cs, op,
                         (cuda_gemm_t){.c = (char *)dw->data + (size_t)(g * OC * IC) * ws,
                                       .a = dout_g,
                                       .b = (const char *)x->data + (size_t)(r * IC) * xs,
                                       .ab_dt = x->dtype, .c_dt = dw->dtype, .M = OC, .N = IC,
                                       .K = h[g], .trans_a = true, .alpha = 1.0f, .beta = 1.0f});
    }
    free(h);
}

#define F32 (1u << DT_F32)
#define BF16 (1u << DT_BF16)

/* ---- Mamba2 mixer (mamba.cu) ---- */

/* The sequence kernels of mamba.cu are the f32 units of kernels/mamba_seq.h.
 * A bf16 operand goes through an f32 copy in the stream's scratch ("staging"):
 * converted to f32 before the kernel when the kernel reads it (inputs, the
 * outputs it accumulates into, the conv history it reads and replaces), and
 * converted back to bf16 after it when the kernel writes it, so every sum is
 * the kernels' own (f32 data, double sums) and each bf16 output is rounded
 * once. f32 operands (the scan's chunk and decode states, the norm's rstd,
 * f32 gradients, the parameters a bf16 model keeps in f32: dt's bias,
 * A_log, D, the norm's weight) are used in place. The kernel's own scratch comes first in
 * the same allocation. */
#define MB_STAGE_MAX 16

typedef struct {
    int    n;
    size_t bytes; /* the staged copies' bytes, each rounded up to 256 */
    struct mb_staged {
        const tensor_t *t;
        const float   **r; /* the argument to point at the copy: read-only ... */
        float         **w; /* ... or written */
        bool            load, store;
        size_t          off;
    } e[MB_STAGE_MAX];
} mb_stage_t;

/* t (NULL: absent) as the kernel argument *r or *w; its f32 data is used
 * in place. load: the kernel reads it; store: the kernel writes it. */
static void mb_stage(mb_stage_t *g, const tensor_t *t, const float **r, float **w, bool load,
                     bool store)
{
    if (!t || t->dtype == DT_F32) return;
    if (t->dtype != DT_BF16 || g->n == MB_STAGE_MAX)
        BT_PANIC("mamba staging: a %s operand (%d staged)", dtype_name(t->dtype), g->n);
    g->e[g->n] = (struct mb_staged){.t = t, .r = r, .w = w, .load = load, .store = store,
                                    .off = g->bytes};
    g->n++;
    g->bytes += ((size_t)tensor_numel(t) * sizeof(float) + 255) & ~(size_t)255;
}

static void mb_in(mb_stage_t *g, const tensor_t *t, const float **r) { mb_stage(g, t, r, NULL, true, false); }
static void mb_out(mb_stage_t *g, tensor_t *t, float **w) { mb_stage(g, t, NULL, w, false, true); }
static void mb_inout(mb_stage_t *g, tensor_t *t, float **w) { mb_stage(g, t, NULL, w, true, true); }

/* Scratch for the kernel's own kbytes and the staged copies (NULL when
 * both are 0, or the stream failed); points the arguments at the copies and
 * converts the loaded ones. *kscr: the kernel's part. */
static bool mb_stage_begin(cuda_stream_t *cs, const char *op, mb_stage_t *g, size_t kbytes,
                           void **kscr)
{
    size_t k = (kbytes + 255) & ~(size_t)255;
    *kscr = NULL;
    if (k + g->bytes == 0) return true;
    char *scr = cs_scratch(cs, op, k + g->bytes);
    if (!scr) return false;
    *kscr = kbytes ? scr : NULL;
    for (int i = 0; i < g->n; i++) {
        float *p = (float *)(scr + k + g->e[i].off);
        if (g->e[i].r) *g->e[i].r = p;
        if (g->e[i].w) *g->e[i].w = p;
        if (g->e[i].load &&
            !cs_check(cs, op, cuda_convert(cs->st, p, DT_F32, g->e[i].t->data, DT_BF16,
                                           tensor_numel(g->e[i].t))))
            return false;
    }
    return true;
}

/* the kernel's result (st) checked, then the written copies back to bf16 */
static void mb_stage_end(cuda_stream_t *cs, const char *op, mb_stage_t *g, cudaError_t st)
{
    if (!cs_check(cs, op, st)) return;
    for (int i = 0; i < g->n; i++)
        if (g->e[i].store &&
            !cs_check(cs, op, cuda_convert(cs->st, g->e[i].t->data, DT_BF16, *g->e[i].w, DT_F32,
                                           tensor_numel(g->e[i].t))))
            return;
}

static const float *cuda_opt(ct_t *t) { return t ? t->data : NULL; }
static float *cuda_opt_out(tensor_t *t) { return t ? t->data : NULL; }

static mb_conv_t cuda_conv_args(mb_stage_t *g, ct_t *x, ct_t *w, ct_t *bias, kern_act_t act)
{
    mb_conv_t a = {.x = x->data, .w = w->data, .bias = cuda_opt(bias),
                   .B = x->ndim == 3 ? x->shape[0] : 1,
                   .T = x->ndim == 3 ? x->shape[1] : tensor_rows(x), .C = tensor_cols(x),
                   .K = w->shape[1], .act = act};
    *g = (mb_stage_t){0};
    return a;
}

static void cuda_op_conv1d_causal_fwd(kern_stream_t *s, tensor_t *out, tensor_t *state, ct_t *x,
                                      ct_t *w, ct_t *bias, kern_act_t act)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_conv1d_causal_fwd";
    mb_stage_t g;
    mb_conv_t a = cuda_conv_args(&g, x, w, bias, act);
    a.out = out->data;
    a.state = cuda_opt_out(state);
    mb_in(&g, x, &a.x), mb_in(&g, w, &a.w), mb_in(&g, bias, &a.bias);
    mb_out(&g, out, &a.out), mb_inout(&g, state, &a.state);
    void *k;
    if (cs_enter(cs, op) && mb_stage_begin(cs, op, &g, 0, &k))
        mb_stage_end(cs, op, &g, cuda_conv1d_causal_fwd(cs->st, &a));
}

static void cuda_op_conv1d_causal_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw,
                                      tensor_t *dbias, ct_t *dout, ct_t *x, ct_t *w, ct_t *bias,
                                      kern_act_t act)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_conv1d_causal_bwd";
    mb_stage_t g;
    mb_conv_t a = cuda_conv_args(&g, x, w, bias, act);
    a.dx = cuda_opt_out(dx), a.dw = cuda_opt_out(dw), a.dbias = cuda_opt_out(dbias);
    a.dout = dout->data;
    if ((!dx && !dw && !dbias) || !cs_enter(cs, op)) return;
    mb_in(&g, x, &a.x), mb_in(&g, w, &a.w), mb_in(&g, bias, &a.bias), mb_in(&g, dout, &a.dout);
    mb_inout(&g, dx, &a.dx), mb_inout(&g, dw, &a.dw), mb_inout(&g, dbias, &a.dbias);
    void *scr;
    if (mb_stage_begin(cs, op, &g, cuda_conv1d_bwd_scratch(&a), &scr) && scr)
        mb_stage_end(cs, op, &g, cuda_conv1d_causal_bwd(cs->st, &a, scr));
}

static void cuda_op_ssm_dt_fwd(kern_stream_t *s, tensor_t *dt, ct_t *raw, ct_t *bias, float lo,
                               float hi)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_ssm_dt_fwd";
    mb_stage_t g = {0};
    float *o = dt->data;
    const float *r = raw->data, *b = bias->data;
    mb_out(&g, dt, &o), mb_in(&g, raw, &r), mb_in(&g, bias, &b);
    void *k;
    if (cs_enter(cs, op) && mb_stage_begin(cs, op, &g, 0, &k))
        mb_stage_end(cs, op, &g,
                     cuda_ssm_dt_fwd(cs->st, o, r, b, tensor_rows(raw), tensor_cols(raw), lo, hi));
}

static void cuda_op_ssm_dt_bwd(kern_stream_t *s, tensor_t *draw, tensor_t *dbias, ct_t *ddt,
                               ct_t *raw, ct_t *bias, float lo, float hi)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_ssm_dt_bwd";
    mb_stage_t g = {0};
    float *dr = cuda_opt_out(draw), *db = cuda_opt_out(dbias);
    const float *dd = ddt->data, *r = raw->data, *b = bias->data;
    mb_inout(&g, draw, &dr), mb_inout(&g, dbias, &db);
    mb_in(&g, ddt, &dd), mb_in(&g, raw, &r), mb_in(&g, bias, &b);
    void *k;
    if (cs_enter(cs, op) && mb_stage_begin(cs, op, &g, 0, &k))
        mb_stage_end(cs, op, &g,
                     cuda_ssm_dt_bwd(cs->st, dr, db, dd, r, b, tensor_rows(raw), tensor_cols(raw),
                                     lo, hi));
}

static mb_ssd_t cuda_ssd_args(mb_stage_t *g, ct_t *x, ct_t *dt, ct_t *A_log, ct_t *Bm, ct_t *Cm,
                              ct_t *D, int64_t chunk)
{
    *g = (mb_stage_t){0};
    return (mb_ssd_t){.B = x->shape[0], .T = x->shape[1], .H = x->shape[2], .P = x->shape[3],
                      .G = Bm->shape[2], .N = Bm->shape[3], .chunk = chunk, .x = x->data,
                      .dt = dt->data, .A_log = A_log->data, .Bm = Bm->data, .Cm = Cm->data,
                      .D = cuda_opt(D)};
}

/* the scan's inputs, staged into a (after a's fields are set) */
static void cuda_ssd_stage_in(mb_stage_t *g, mb_ssd_t *a, ct_t *x, ct_t *dt, ct_t *A_log, ct_t *Bm,
                              ct_t *Cm, ct_t *D)
{
    mb_in(g, x, &a->x), mb_in(g, dt, &a->dt), mb_in(g, A_log, &a->A_log);
    mb_in(g, Bm, &a->Bm), mb_in(g, Cm, &a->Cm), mb_in(g, D, &a->D);
}

static void cuda_op_ssd_scan_fwd(kern_stream_t *s, tensor_t *y, tensor_t *chunk_states,
                                 tensor_t *state, ct_t *x, ct_t *dt, ct_t *A_log, ct_t *Bm,
                                 ct_t *Cm, ct_t *D, int64_t chunk)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_ssd_scan_fwd";
    mb_stage_t g;
    mb_ssd_t a = cuda_ssd_args(&g, x, dt, A_log, Bm, Cm, D, chunk);
    a.y = y->data, a.chunk_states = cuda_opt_out(chunk_states), a.state = cuda_opt_out(state);
    if (a.T == 0 || !cs_enter(cs, op)) return;
    cuda_ssd_stage_in(&g, &a, x, dt, A_log, Bm, Cm, D);
    mb_out(&g, y, &a.y); /* the states are f32 (kern_ssd_scan_fwd) */
    void *scr;
    if (mb_stage_begin(cs, op, &g, cuda_ssd_fwd_scratch(&a), &scr) && scr)
        mb_stage_end(cs, op, &g, cuda_ssd_scan_fwd(cs->st, &a, scr));
}

static void cuda_op_ssd_scan_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *ddt, tensor_t *dA_log,
                                 tensor_t *dB, tensor_t *dC, tensor_t *dD, ct_t *dy, ct_t *x,
                                 ct_t *dt, ct_t *A_log, ct_t *Bm, ct_t *Cm, ct_t *D,
                                 ct_t *chunk_states, int64_t chunk)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_ssd_scan_bwd";
    mb_stage_t g;
    mb_ssd_t a = cuda_ssd_args(&g, x, dt, A_log, Bm, Cm, D, chunk);
    a.dx = cuda_opt_out(dx), a.ddt = cuda_opt_out(ddt), a.dB = cuda_opt_out(dB);
    a.dC = cuda_opt_out(dC), a.dy = dy->data, a.cstates = chunk_states->data;
    float *da = cuda_opt_out(dA_log), *dd = cuda_opt_out(dD);
    if (a.T == 0 || !cs_enter(cs, op)) return;
    cuda_ssd_stage_in(&g, &a, x, dt, A_log, Bm, Cm, D);
    mb_in(&g, dy, &a.dy);
    mb_inout(&g, dx, &a.dx), mb_inout(&g, ddt, &a.ddt), mb_inout(&g, dB, &a.dB);
    mb_inout(&g, dC, &a.dC), mb_inout(&g, dA_log, &da), mb_inout(&g, dD, &dd);
    void *scr;
    if (mb_stage_begin(cs, op, &g, cuda_ssd_bwd_scratch(&a), &scr) && scr)
        mb_stage_end(cs, op, &g, cuda_ssd_scan_bwd(cs->st, &a, da, dd, scr));
}

static void cuda_op_gated_rmsnorm_fwd(kern_stream_t *s, tensor_t *out, tensor_t *rstd, ct_t *y,
                                      ct_t *z, ct_t *w, int64_t groups, float eps)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_gated_rmsnorm_fwd";
    mb_gnorm_t a = {.out = out->data, .rstd = rstd->data, .y = y->data, .z = z->data,
                    .w = w->data, .N = tensor_rows(y), .C = tensor_cols(y), .G = groups,
                    .eps = eps};
    mb_stage_t g = {0};
    mb_in(&g, y, &a.y), mb_in(&g, z, &a.z), mb_in(&g, w, &a.w), mb_out(&g, out, &a.out);
    void *k;
    if (cs_enter(cs, op) && mb_stage_begin(cs, op, &g, 0, &k))
        mb_stage_end(cs, op, &g, cuda_gated_rmsnorm_fwd(cs->st, &a));
}

static void cuda_op_gated_rmsnorm_bwd(kern_stream_t *s, tensor_t *dy, tensor_t *dz, tensor_t *dw,
                                      ct_t *dout, ct_t *y, ct_t *z, ct_t *w, ct_t *rstd,
                                      int64_t groups)
{
    cuda_stream_t *cs = cs_of(s);
    const char *op = "kern_gated_rmsnorm_bwd";
    mb_gnorm_t a = {.dy = cuda_opt_out(dy), .dz = cuda_opt_out(dz), .dw = cuda_opt_out(dw),
                    .dout = dout->data, .y = y->data, .z = z->data, .w = w->data,
                    .rs = rstd->data, .N = tensor_rows(y), .C = tensor_cols(y), .G = groups};
    mb_stage_t g = {0};
    mb_in(&g, y, &a.y), mb_in(&g, z, &a.z), mb_in(&g, w, &a.w), mb_in(&g, dout, &a.dout);
    mb_inout(&g, dy, &a.dy), mb_inout(&g, dz, &a.dz), mb_inout(&g, dw, &a.dw);
    void *k;
    if (cs_enter(cs, op) && mb_stage_begin(cs, op, &g, 0, &k))
        mb_stage_end(cs, op, &g, cuda_gated_rmsnorm_bwd(cs->st, &a));
}

const kern_backend_t kern_cuda_backend = {
    .name = "cuda",
    .kind = DEV_CUDA,
    .op_dtypes =
        {
            [KERN_OP_MATMUL] = F32 | BF16,
            [KERN_OP_LINEAR] = F32 | BF16,
            [KERN_OP_ELEMENTWISE] = F32 | BF16,
            [KERN_OP_REDUCE] = F32 | BF16 | (1u << DT_F16) | (1u << DT_F64),
            [KERN_OP_EMBEDDING] = F32 | BF16,
            [KERN_OP_RMSNORM] = F32 | BF16,
            [KERN_OP_ROPE] = F32 | BF16,
            [KERN_OP_ATTENTION] = F32 | BF16,
            [KERN_OP_SWIGLU] = F32 | BF16,
            [KERN_OP_XENT] = F32 | BF16,
            [KERN_OP_ADAMW] = F32 | BF16,
            [KERN_OP_MOE_ROUTE] = F32 | BF16,
            [KERN_OP_MOE_PERMUTE] = F32 | BF16,
            [KERN_OP_MOE_COMBINE] = F32 | BF16,
            [KERN_OP_GROUPED_LINEAR] = F32 | BF16,
            [KERN_OP_MOE_RESELECT] = F32,
            [KERN_OP_MAMBA] = F32 | BF16,
            [KERN_OP_RELU2] = F32 | BF16,
        },
    .usable = cuda_usable,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .mem_peak = cuda_held_peak,
    .mem_peak_restore = cuda_held_peak_restore,
    .attention_window = cuda_attention_window,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .has_ipc = true,
    .ipc_alloc = cuda_ipc_alloc,
    .ipc_free = cuda_ipc_free,
    .ipc_open = cuda_ipc_open,
    .ipc_close = cuda_ipc_close,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .stream_notify = cuda_stream_notify,
    .stream_native = cuda_stream_native,
    .stream_reserve = cuda_stream_reserve,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait = cuda_stream_wait,
    .upload = cuda_upload,
    .download = cuda_download,
    .matmul = cuda_op_matmul,
    .linear_fwd = cuda_op_linear_fwd,
    .linear_bwd = cuda_op_linear_bwd,
    .zero = cuda_op_zero,
    .copy = cuda_op_copy,
    .add = cuda_op_add,
    .axpy = cuda_op_axpy,
    .scale = cuda_op_scale,
    .copy_cols = cuda_op_copy_cols,
    .sumsq = cuda_op_sumsq,
    .count_nonfinite = cuda_op_count_nonfinite,
    .embedding_fwd = cuda_op_embedding_fwd,
    .embedding_bwd = cuda_op_embedding_bwd,
    .rmsnorm_fwd = cuda_op_rmsnorm_fwd,
    .rmsnorm_bwd = cuda_op_rmsnorm_bwd,
    .add_rmsnorm_fwd = cuda_op_add_rmsnorm_fwd,
    .rope_fwd = cuda_op_rope_fwd,
    .rope_bwd = cuda_op_rope_bwd,
    .attention_fwd = cuda_op_attention_fwd,
    .attention_merge = cuda_op_attention_merge,
    .attention_bwd = cuda_op_attention_bwd,
    .swiglu_fwd = cuda_op_swiglu_fwd,
    .swiglu_bwd = cuda_op_swiglu_bwd,
    .relu2_fwd = cuda_op_relu2_fwd,
    .relu2_bwd = cuda_op_relu2_bwd,
    .xent_fwd_bwd = cuda_op_xent_fwd_bwd,
    .xent_vp_max = cuda_op_xent_vp_max,
    .xent_vp_sum = cuda_op_xent_vp_sum,
    .xent_vp_finish = cuda_op_xent_vp_finish,
    .adamw = cuda_op_adamw,
    .moe_route_fwd = cuda_op_moe_route_fwd,
    .moe_route_bwd = cuda_op_moe_route_bwd,
    .moe_route_reselect = cuda_op_moe_route_reselect,
    .moe_route_stats = cuda_op_moe_route_stats,
    .moe_permute_fwd = cuda_op_moe_permute_fwd,
    .moe_permute_bwd = cuda_op_moe_permute_bwd,
    .moe_combine_fwd = cuda_op_moe_combine_fwd,
    .moe_combine_bwd = cuda_op_moe_combine_bwd,
    .sigmoid_gate_fwd = cuda_op_sigmoid_gate_fwd,
    .sigmoid_gate_bwd = cuda_op_sigmoid_gate_bwd,
    .grouped_linear_fwd = cuda_op_grouped_linear_fwd,
    .grouped_linear_bwd = cuda_op_grouped_linear_bwd,
    .conv1d_causal_fwd = cuda_op_conv1d_causal_fwd,
    .conv1d_causal_bwd = cuda_op_conv1d_causal_bwd,
    .ssm_dt_fwd = cuda_op_ssm_dt_fwd,
    .ssm_dt_bwd = cuda_op_ssm_dt_bwd,
    .ssd_scan_fwd = cuda_op_ssd_scan_fwd,
    .ssd_scan_bwd = cuda_op_ssd_scan_bwd,
    .gated_rmsnorm_fwd = cuda_op_gated_rmsnorm_fwd,
    .gated_rmsnorm_bwd = cuda_op_gated_rmsnorm_bwd,
};

#endif /* BT_HAVE_CUDA */
