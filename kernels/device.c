/* Devices, memory, streams and copies (kernels/device.h): each call finds
 * the backend of its device and passes on. */
#include "kernels/device.h"

#include "base/log.h"
#include "kernels/backend.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The CUDA backend lives in a shared object, libbaton_cuda.so, that is
 * loaded the first time a CUDA device is asked for. A process that never
 * touches a GPU (every CPU run, every test here) then never maps cudart and
 * cuBLASLt, which cost about 150 MB of resident memory per process merely
 * by being linked. The object calls back into the executable (tensor,
 * dtype, log and stream helpers), which is linked -rdynamic for it.
 *
 * Where it is looked for, first found wins: $BATON_CUDA_LIB (a path), then
 * libbaton_cuda.so beside the executable, then one folder up (the test
 * binaries live in build/tests/, the library in build/). A BATON_CUDA_LIB
 * that names nothing is an error, not a reason to look elsewhere. */
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static const kern_backend_t *cuda_backend;
static char cuda_why[512];

static void cuda_load(void)
{
    char cands[3][PATH_MAX + 32];
    int n = 0;
    const char *env = getenv("BATON_CUDA_LIB");
    if (env && *env) snprintf(cands[n++], sizeof cands[0], "%s", env);
    char exe[PATH_MAX];
    ssize_t len = n ? -1 : readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(cands[n++], sizeof cands[0], "%s/libbaton_cuda.so", exe);
            snprintf(cands[n++], sizeof cands[0], "%s/../libbaton_cuda.so", exe);
        }
    }
    size_t off = 0;
    cuda_why[0] = 0;
    for (int i = 0; i < n; i++) {
        if (access(cands[i], F_OK) != 0) {
            if (env && *env)
                off += (size_t)snprintf(cuda_why, sizeof cuda_why, "BATON_CUDA_LIB=%s: %s", env,
                                        strerror(errno));
            continue;
        }
        void *h = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            off += (size_t)snprintf(cuda_why + off, off < sizeof cuda_why ? sizeof cuda_why - off : 0,
                                    "%s%s", off ? "; " : "", dlerror());
            continue;
        }
        const kern_backend_t *be = dlsym(h, "kern_cuda_backend");
        if (be) {
            cuda_backend = be;
            return; /* never closed: the backend's memory and streams outlive any caller */
        }
        off += (size_t)snprintf(cuda_why + off, off < sizeof cuda_why ? sizeof cuda_why - off : 0,
                                "%s%s has no kern_cuda_backend", off ? "; " : "", cands[i]);
        dlclose(h);
    }
    if (!cuda_why[0])
        snprintf(cuda_why, sizeof cuda_why,
                 "no libbaton_cuda.so beside the executable (it is built where nvcc is on PATH; "
                 "BATON_CUDA_LIB names another)");
}

/* The backend of a device kind; NULL for one this process does not have
 * (or a value that is no device kind). */
static const kern_backend_t *backend_of(device_kind_t kind)
{
    switch (kind) {
    case DEV_CPU: return &kern_cpu_backend;
    case DEV_FENCED: return &kern_fenced_backend;
    case DEV_CUDA: pthread_once(&cuda_once, cuda_load); return cuda_backend;
    default: return NULL;
    }
}

static const char *const kern_op_names[] = {
    [KERN_OP_MATMUL] = "matmul",
    [KERN_OP_LINEAR] = "linear",
    [KERN_OP_ELEMENTWISE] = "elementwise",
    [KERN_OP_REDUCE] = "reduce",
    [KERN_OP_EMBEDDING] = "embedding",
    [KERN_OP_RMSNORM] = "rmsnorm",
    [KERN_OP_ROPE] = "rope",
    [KERN_OP_ATTENTION] = "attention",
    [KERN_OP_SWIGLU] = "swiglu",
    [KERN_OP_XENT] = "cross_entropy",
    [KERN_OP_ADAMW] = "adamw",
    [KERN_OP_MOE_ROUTE] = "moe_route",
    [KERN_OP_MOE_RESELECT] = "moe_route_reselect",
    [KERN_OP_MOE_PERMUTE] = "moe_permute",
    [KERN_OP_MOE_COMBINE] = "moe_combine",
    [KERN_OP_GROUPED_LINEAR] = "grouped_linear",
    [KERN_OP_MAMBA] = "mamba",
    [KERN_OP_RELU2] = "relu2",
};
_Static_assert(sizeof kern_op_names / sizeof kern_op_names[0] == KERN_OP_COUNT, "one name per op");

const char *kern_op_name(kern_op_t op)
{
    return (unsigned)op < KERN_OP_COUNT ? kern_op_names[op] : "invalid";
}

/* The backend of dev; panics on a device kind that is not there (callers
 * check kern_device_usable first: using such a device is a bug). */
static const kern_backend_t *kern_be(device_t dev, const char *what)
{
    if ((unsigned)dev.kind >= DEV_COUNT) BT_PANIC("%s: invalid device kind %d", what, dev.kind);
    const kern_backend_t *be = backend_of(dev.kind);
    if (!be) BT_PANIC("%s: no %s backend: %s", what, device_kind_name(dev.kind), cuda_why);
    return be;
}

bool kern_device_usable(device_t dev, char *why, size_t why_cap)
{
    const kern_backend_t *be = backend_of(dev.kind);
    if (!be) {
        snprintf(why, why_cap, "no %s backend in this process: %s", device_kind_name(dev.kind),
                 dev.kind == DEV_CUDA ? cuda_why : "unknown device kind");
        return false;
    }
    return be->usable(dev.index, why, why_cap);
}

int kern_device_count(device_kind_t kind)
{
    char why[768];
    int n = 0;
    while (n < 256 && kern_device_usable((device_t){kind, n}, why, sizeof why)) n++;
    return n;
}

bool kern_supports(device_t dev, kern_op_t op, dtype_t dt)
{
    if ((unsigned)dev.kind >= DEV_COUNT || (unsigned)op >= KERN_OP_COUNT || (unsigned)dt >= DT_COUNT)
        return false;
    const kern_backend_t *be = backend_of(dev.kind);
    return be && (be->op_dtypes[op] & (1u << dt)) != 0;
}

bt_status_t kern_mem_alloc(device_t dev, size_t nbytes, void **out)
{
    bt_status_t st = kern_be(dev, "kern_mem_alloc")->mem_alloc(dev.index, nbytes, out);
    if (st != BT_OK) {
        char d[DEVICE_STR_MAX];
        log_error("%s: cannot allocate %.1f MB of device memory", device_str(dev, d),
                  (double)nbytes / 1e6);
    }
    return st;
}

void kern_mem_free(device_t dev, void *p)
{
    if (p) kern_be(dev, "kern_mem_free")->mem_free(dev.index, p);
}

bt_status_t kern_host_alloc(device_t dev, size_t nbytes, void **out)
{
    bt_status_t st = kern_be(dev, "kern_host_alloc")->host_alloc(dev.index, nbytes, out);
    if (st != BT_OK) {
        char d[DEVICE_STR_MAX];
        log_error("%s: cannot allocate %.1f MB of staging host memory", device_str(dev, d),
                  (double)nbytes / 1e6);
    }
    return st;
}

void kern_host_free(device_t dev, void *p)
{
    if (p) kern_be(dev, "kern_host_free")->host_free(dev.index, p);
}

uint64_t kern_mem_peak(device_t dev)
{
    const kern_backend_t *be = backend_of(dev.kind);
    return be && be->mem_peak ? (uint64_t)be->mem_peak(dev.index) : 0;
}

void kern_mem_peak_restore(device_t dev, uint64_t peak)
{
    const kern_backend_t *be = backend_of(dev.kind);
    if (be && be->mem_peak_restore) be->mem_peak_restore(dev.index, (size_t)peak);
}

bool kern_ipc_supported(device_t dev)
{
    const kern_backend_t *be = backend_of(dev.kind);
    return be && be->has_ipc;
}

bool kern_attention_window_supported(device_t dev, dtype_t dt, char *why, size_t cap)
{
    const kern_backend_t *be = backend_of(dev.kind);
    if (!be) {
        snprintf(why, cap, "no backend for the device");
        return false;
    }
    return !be->attention_window || be->attention_window(dt, why, cap);
}

bt_status_t kern_ipc_alloc(device_t dev, size_t nbytes, void **out, kern_ipc_handle_t *h)
{
    memset(h, 0, sizeof *h);
    bt_status_t st = kern_be(dev, "kern_ipc_alloc")->ipc_alloc(dev.index, nbytes, out, h);
    if (st != BT_OK) {
        char d[DEVICE_STR_MAX];
        log_error("%s: cannot allocate %.1f MB of memory to share with another process (%s)",
                  device_str(dev, d), (double)nbytes / 1e6, bt_status_str(st));
    }
    return st;
}

void kern_ipc_free(device_t dev, void *p, size_t nbytes, const kern_ipc_handle_t *h)
{
    if (p) kern_be(dev, "kern_ipc_free")->ipc_free(dev.index, p, nbytes, h);
}

bt_status_t kern_ipc_open(device_t dev, const kern_ipc_handle_t *h, size_t nbytes, void **out)
{
    return kern_be(dev, "kern_ipc_open")->ipc_open(dev.index, h, nbytes, out);
}

void kern_ipc_close(device_t dev, void *p, size_t nbytes)
{
    if (p) kern_be(dev, "kern_ipc_close")->ipc_close(dev.index, p, nbytes);
}

void *kern_stream_native(kern_stream_t *s)
{
    return s->be->stream_native ? s->be->stream_native(s) : NULL;
}

bt_status_t kern_stream_create(device_t dev, kern_stream_t **out)
{
    return kern_be(dev, "kern_stream_create")->stream_create(dev.index, out);
}

void kern_stream_destroy(kern_stream_t *s)
{
    if (s) s->be->stream_destroy(s);
}

device_t kern_stream_device(const kern_stream_t *s) { return s->dev; }

bt_status_t kern_stream_sync(kern_stream_t *s) { return s->be->stream_sync(s); }

bt_status_t kern_stream_notify(kern_stream_t *s, kern_notify_fn fn, void *arg)
{
    return s->be->stream_notify(s, fn, arg);
}

bt_status_t kern_stream_reserve(kern_stream_t *s, size_t nbytes)
{
    return s->be->stream_reserve(s, nbytes);
}

void kern_stream_fail(kern_stream_t *s, const char *op, const char *detail)
{
    if (s->error != BT_OK) return;
    s->error = BT_ERR_DEVICE;
    snprintf(s->error_op, sizeof s->error_op, "%s", op);
    char d[DEVICE_STR_MAX];
    log_error("%s: %s failed: %s", device_str(s->dev, d), op, detail);
}

static kern_stream_t *host_stream;
static pthread_once_t host_stream_once = PTHREAD_ONCE_INIT;

static void host_stream_init(void)
{
    if (kern_stream_create(DEVICE_CPU, &host_stream) != BT_OK)
        BT_PANIC("kern_stream_host: cannot create the host stream");
}

kern_stream_t *kern_stream_host(void)
{
    pthread_once(&host_stream_once, host_stream_init);
    return host_stream;
}

bt_status_t kern_event_create(device_t dev, kern_event_t **out)
{
    return kern_be(dev, "kern_event_create")->event_create(dev.index, out);
}

void kern_event_destroy(kern_event_t *e)
{
    if (e) e->be->event_destroy(e);
}

void kern_event_record(kern_event_t *e, kern_stream_t *s) { s->be->event_record(e, s); }

void kern_stream_wait(kern_stream_t *s, kern_event_t *e) { s->be->stream_wait(s, e); }

void kern_upload(kern_stream_t *s, tensor_t *dst, const void *host)
{
    if (!device_eq(dst->device, s->dev)) {
        char a[DEVICE_STR_MAX], b[DEVICE_STR_MAX];
        BT_PANIC("kern_upload: dst is on %s but the stream on %s", device_str(dst->device, a),
                 device_str(s->dev, b));
    }
    size_t n = tensor_nbytes(dst);
    if (n == 0) return;
    if (!dst->data || !host) BT_PANIC("kern_upload: NULL buffer for %zu bytes", n);
    if (!tensor_is_contiguous(dst)) BT_PANIC("kern_upload: dst is not contiguous");
    s->be->upload(s, dst->data, host, n);
}

void kern_download(kern_stream_t *s, void *host, const tensor_t *src)
{
    if (!device_eq(src->device, s->dev)) {
        char a[DEVICE_STR_MAX], b[DEVICE_STR_MAX];
        BT_PANIC("kern_download: src is on %s but the stream on %s", device_str(src->device, a),
                 device_str(s->dev, b));
    }
    size_t n = tensor_nbytes(src);
    if (n == 0) return;
    if (!src->data || !host) BT_PANIC("kern_download: NULL buffer for %zu bytes", n);
    if (!tensor_is_contiguous(src)) BT_PANIC("kern_download: src is not contiguous");
    s->be->download(s, host, src->data, n);
}
