/* Handing activations to a pipeline neighbour on the same host without
 * staging them through host memory.
 *
 * The sender copies a stage's output (or input gradient) on its device into
 * a buffer it shares with the host's other processes (kern_ipc_alloc: a
 * CUDA IPC allocation, or POSIX shared memory on cpu) and sends, in place of
 * the tensor's bytes, a descriptor of that buffer: the tensor "NAME.ho", u8
 * [HANDOFF_DESC_BYTES]. The receiver maps the buffer once (kern_ipc_open,
 * cached per handle), copies the bytes into its arena on its device, and
 * answers RELEASE (slot, generation): only then may the sender reuse it.
 *
 * Sender: a pool of buffers that grows to the number of messages in flight
 * on the stage's edges and never shrinks during a run; a buffer is busy from
 * handoff_take until its RELEASE. The pool's lock makes take (compute
 * thread) and release (loop thread) safe together.
 * Receiver: a map of opened buffers, used from one thread (the compute
 * thread).
 *
 * A descriptor comes from a peer: handoff_desc_read checks everything it
 * holds (size, magic, version, device kind, dtype, shape, that the shape
 * fits the capacity) before anything is mapped, and says what is wrong.
 */
#ifndef BT_TRAIN_HANDOFF_H
#define BT_TRAIN_HANDOFF_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "actors/actor.h"
#include "kernels/device.h"

#define HANDOFF_DESC_BYTES 132
#define HANDOFF_MAX_SLOTS  64
#define HANDOFF_SUFFIX     ".ho"

typedef struct {
    uint32_t          slot, gen;
    device_kind_t     kind;      /* the sender's device kind */
    dtype_t           dtype;
    int               ndim;
    int64_t           shape[TENSOR_MAX_DIMS];
    uint64_t          capacity;  /* bytes of the shared buffer */
    kern_ipc_handle_t handle;
} handoff_desc_t;

/* Encodes d into out[HANDOFF_DESC_BYTES]. */
void handoff_desc_write(const handoff_desc_t *d, uint8_t *out);
/* Decodes and checks a received descriptor tensor; BT_ERR_PEER_PROTO with
 * what is wrong in err otherwise. */
bt_status_t handoff_desc_read(const tensor_t *t, handoff_desc_t *d, char *err, size_t errlen);

typedef struct {
    void             *p;
    size_t            cap;
    kern_ipc_handle_t handle;
    uint32_t          gen;
    bool              busy;
} handoff_slot_t;

typedef struct {
    device_t        dev;
    pthread_mutex_t mu;
    handoff_slot_t  slots[HANDOFF_MAX_SLOTS];
    int             n_slots;
    uint64_t        handed;    /* handoffs so far */
    uint64_t        released;  /* RELEASEs accepted */
} handoff_pool_t;

bt_status_t handoff_pool_init(handoff_pool_t *p, device_t dev);
void        handoff_pool_fini(handoff_pool_t *p);
/* A free buffer of at least the bytes of [ndim, shape] in dtype (a new one
 * when none is free), busy from now: *view is a device tensor over it, *d
 * its descriptor. BT_ERR_BUSY when HANDOFF_MAX_SLOTS are all in flight. */
bt_status_t handoff_take(handoff_pool_t *p, dtype_t dtype, int ndim, const int64_t *shape,
                         tensor_t *view, handoff_desc_t *d);
/* Adds the descriptor to m as tensor NAME.ho. (BATON_TEST_HANDOFF=corrupt
 * spoils its magic, =oversize its first dim, for the tests of the
 * receiver's checks.) */
bt_status_t handoff_attach(actor_msg_t *m, const char *name, const handoff_desc_t *d);
/* A RELEASE for (slot, gen): BT_ERR_INVALID when that buffer is not busy
 * with that generation (a stale or forged release; nothing changes). */
bt_status_t handoff_release(handoff_pool_t *p, uint32_t slot, uint32_t gen);
/* Buffers and bytes held, for the log. */
void        handoff_pool_usage(handoff_pool_t *p, int *n_slots, size_t *bytes);

typedef struct {
    kern_ipc_handle_t handle;
    void             *p;
    size_t            cap;
} handoff_mapped_t;

typedef struct {
    device_t         dev;
    handoff_mapped_t ent[HANDOFF_MAX_SLOTS * 2];
    int              n;
} handoff_map_t;

void        handoff_map_init(handoff_map_t *m, device_t dev);
void        handoff_map_fini(handoff_map_t *m);
/* A device tensor over the buffer d describes, mapped on first use. */
bt_status_t handoff_map_view(handoff_map_t *m, const handoff_desc_t *d, tensor_t *view);

/* The message's tensor NAME or its handed-off descriptor NAME.ho: whichever
 * it carries (NULL when neither); *handed says which. */
tensor_t *handoff_msg_tensor(actor_msg_t *m, const char *name, bool *handed);

#endif
