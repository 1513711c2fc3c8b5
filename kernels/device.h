/* Devices: memory, copies, streams, events and what each backend supports.
 *
 * Every byte of device memory is allocated, copied and freed through these
 * calls; host code holds device addresses (tensor_t.data) but never
 * dereferences them (base/tensor.h). Backends: cpu (host memory, ops run at
 * once on the calling thread), fenced (the test device: host memory kept
 * inaccessible except while one of its own calls runs, kernels/fenced/),
 * cuda (kernels/cuda/, when built with nvcc).
 *
 * Streams. Every op and copy runs on a stream: an ordered queue of work on
 * one device. On cpu and fenced the work is done before the call returns;
 * on cuda it is queued and runs later, in order. A failure inside queued
 * work (a CUDA launch or library error) is sticky on its stream: the first
 * one is kept with the name of the op that hit it, and kern_stream_sync /
 * kern_stream_notify report it (BT_ERR_DEVICE, logged once naming the op).
 * Misuse (shapes, dtypes, devices that do not match) is a caller bug and
 * panics with the op's name before anything is queued.
 *
 * Host buffers given to a copy must stay valid, and a download's buffer
 * untouched, until the stream has passed the copy (kern_stream_sync, or the
 * notification). Copies from or into memory from kern_host_alloc can
 * overlap with compute on cuda; other host memory is staged.
 *
 * Threads: a stream belongs to one thread at a time. Allocation and the
 * queries may be called from any thread.
 */
#ifndef BT_KERNELS_DEVICE_H
#define BT_KERNELS_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/tensor.h"

typedef struct kern_stream kern_stream_t;
typedef struct kern_event kern_event_t;

/* The ops a backend may or may not have, for kern_supports(). */
typedef enum {
    KERN_OP_MATMUL = 0,
    KERN_OP_LINEAR,      /* linear_fwd, linear_bwd */
    KERN_OP_ELEMENTWISE, /* add, axpy, scale */
    KERN_OP_REDUCE,      /* sumsq, count_nonfinite */
    KERN_OP_EMBEDDING,
    KERN_OP_RMSNORM,
    KERN_OP_ROPE,
    KERN_OP_ATTENTION,
    KERN_OP_SWIGLU,
    KERN_OP_XENT, /* xent_fwd_bwd and the vocabulary-parallel passes */
    KERN_OP_ADAMW,
    KERN_OP_MOE_ROUTE,      /* moe_route_fwd, moe_route_bwd, moe_route_stats */
    KERN_OP_MOE_PERMUTE,    /* moe_permute_fwd, moe_permute_bwd */
    KERN_OP_MOE_COMBINE,    /* moe_combine_fwd/bwd, sigmoid_gate_fwd/bwd */
    KERN_OP_GROUPED_LINEAR, /* grouped_linear_fwd, grouped_linear_bwd */
    KERN_OP_MOE_RESELECT,   /* moe_route_reselect (a selection bias; f32 on every backend) */
    KERN_OP_MAMBA,          /* conv1d_causal, ssm_dt, ssd_scan, gated_rmsnorm (fwd, bwd) */
    KERN_OP_RELU2,          /* relu2_fwd, relu2_bwd (squared ReLU) */
    KERN_OP_COUNT,
} kern_op_t;

const char *kern_op_name(kern_op_t op); /* "attention", ... */

/* ---- devices ----------------------------------------------------------- */

/* Whether dev can be used here: its backend is built in and the device
 * exists (and, for cuda, its libraries are recent enough). When not, why[]
 * says what is missing. */
bool kern_device_usable(device_t dev, char *why, size_t why_cap);
/* How many devices of `kind` this process can use (indices 0 .. n-1). */
int kern_device_count(device_kind_t kind);
/* Whether the backend of dev computes `op` in dtype dt. The model checks
 * every op its blocks need when it is built, so that a missing op is a
 * clear error then, never a panic in the middle of a step. */
bool kern_supports(device_t dev, kern_op_t op, dtype_t dt);

/* ---- memory ------------------------------------------------------------ */

/* nbytes of device memory (contents undefined; kern_zero clears it).
 * BT_ERR_NOMEM with a log line naming the device and the size. */
bt_status_t kern_mem_alloc(device_t dev, size_t nbytes, void **out);
void kern_mem_free(device_t dev, void *p);
/* Host memory the backend copies to and from fastest (pinned on cuda,
 * plain on cpu). The host may always touch it. */
bt_status_t kern_host_alloc(device_t dev, size_t nbytes, void **out);
void kern_host_free(device_t dev, void *p);
/* The most device memory this process has held at once on dev's backend
 * (allocations, stream scratch, library workspaces; not the driver's own
 * context), in bytes; 0 where device memory is host memory (cpu, fenced:
 * the resident size, base/mem.h, counts it). */
uint64_t kern_mem_peak(device_t dev);
/* Sets that peak back to max(peak, what is held now), so that a
 * measurement's own buffers do not count (kern_peak_flops). */
void kern_mem_peak_restore(device_t dev, uint64_t peak);

/* ---- memory shared with other processes of this host ------------------- */

/* Device memory one process allocates and another process on the same host
 * maps, so that a pipeline neighbour reads it with a device-to-device copy
 * (train/handoff.h): on cuda a cudaMalloc allocation and its CUDA IPC
 * handle (cudaIpcGetMemHandle / cudaIpcOpenMemHandle; the neighbour may sit
 * on another GPU of the host), on cpu a POSIX shared-memory object whose
 * name is the handle. The fenced test device has none. The handle is
 * opaque bytes that travel in a message; kern_ipc_open checks what it can
 * (on cpu: the name's form and the object's size) and says what failed.
 * A process cannot open its own cuda handles. */
#define KERN_IPC_HANDLE_MAX 64
typedef struct {
    uint8_t bytes[KERN_IPC_HANDLE_MAX];
} kern_ipc_handle_t;

bool        kern_ipc_supported(device_t dev);
/* Whether dev's attention takes a sliding window that cuts some query's keys
 * at dtype dt (the CPU backends always; CUDA through cuDNN only, under
 * BATON_CUDA_ATTN=cudnn); false with the reason in why[]. */
bool        kern_attention_window_supported(device_t dev, dtype_t dt, char *why, size_t cap);
bt_status_t kern_ipc_alloc(device_t dev, size_t nbytes, void **out, kern_ipc_handle_t *h);
void        kern_ipc_free(device_t dev, void *p, size_t nbytes, const kern_ipc_handle_t *h);
/* Maps another process's allocation of at least nbytes. */
bt_status_t kern_ipc_open(device_t dev, const kern_ipc_handle_t *h, size_t nbytes, void **out);
void        kern_ipc_close(device_t dev, void *p, size_t nbytes);

/* ---- streams and events ------------------------------------------------ */

bt_status_t kern_stream_create(device_t dev, kern_stream_t **out);
void kern_stream_destroy(kern_stream_t *s);
device_t kern_stream_device(const kern_stream_t *s);
/* Waits until everything queued so far is done; the stream's first error. */
bt_status_t kern_stream_sync(kern_stream_t *s);
/* fn(arg, status) runs once everything queued so far is done, with the
 * stream's first error (or BT_OK): on the calling thread before this
 * returns (cpu, fenced) or on a backend thread later (cuda); it must only
 * hand the completion to its owner (e.g. post a message to an actor loop). */
typedef void (*kern_notify_fn)(void *arg, bt_status_t status);
bt_status_t kern_stream_notify(kern_stream_t *s, kern_notify_fn fn, void *arg);
/* Makes sure ops on s have `nbytes` of scratch without allocating later
 * (the model reserves what its largest op needs when it is built). */
bt_status_t kern_stream_reserve(kern_stream_t *s, size_t nbytes);
/* The backend's own handle of s (cudaStream_t on cuda; NULL on cpu and
 * fenced), for libraries that queue work of their own on it in order with
 * the kernels: the nccl collectives (coll_call_t.stream). */
void *kern_stream_native(kern_stream_t *s);
/* A CPU stream for host-side code and tests (process-wide, never destroyed). */
kern_stream_t *kern_stream_host(void);

bt_status_t kern_event_create(device_t dev, kern_event_t **out);
void kern_event_destroy(kern_event_t *e);
/* e completes when the work queued on s so far is done ... */
void kern_event_record(kern_event_t *e, kern_stream_t *s);
/* ... and work queued on s after this waits for it (an event never
 * recorded is complete: waiting for it waits for nothing). */
void kern_stream_wait(kern_stream_t *s, kern_event_t *e);

/* ---- copies ------------------------------------------------------------ */

/* dst (any device) = host[tensor_nbytes(dst)] */
void kern_upload(kern_stream_t *s, tensor_t *dst, const void *host);
/* host[tensor_nbytes(src)] = src (any device) */
void kern_download(kern_stream_t *s, void *host, const tensor_t *src);
/* Copies within a device (and dtype conversions) are kern_copy (kernels.h). */

#endif
