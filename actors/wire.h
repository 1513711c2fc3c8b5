/* The wire envelope: what every actor message looks like on a transport.
 *
 * A frame is a header and a payload (transport/xport.h). The header is a
 * msgpack map, the envelope:
 *
 *   {ver, type, src, dst, seq, step, mb,
 *    tensors: [{name, dtype, shape, offset, nbytes}, ...],
 *    meta: <type-specific body, see actors/msg.h>}
 *
 * "ver" is always the first key and acts as the format's magic + version:
 * a frame whose first key is not "ver" = WIRE_VERSION is not ours. The
 * format grows only by appending keys; a decoder skips keys it does not know.
 *
 * The payload holds the tensors back to back in envelope order, each starting
 * at a multiple of WIRE_ALIGN bytes (the canonical layout: offset[0] = 0,
 * offset[i] = align_up(offset[i-1] + nbytes[i-1]), payload length = end of the
 * last tensor). The decoder accepts exactly that layout, so a lying offset or
 * length can never make a view point outside the payload or into another
 * tensor.
 *
 * The decoder treats every byte as hostile: it never reads out of bounds,
 * never allocates more than a small multiple of the header size, and rejects
 * anything malformed with BT_ERR_PEER_PROTO and a reason naming what is wrong
 * ("envelope: tensor 'x' nbytes 12 != 3x2 f32"), which the caller logs before
 * closing the connection.
 */
#ifndef BT_ACTORS_WIRE_H
#define BT_ACTORS_WIRE_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "base/status.h"
#include "kernels/tensor.h"

/* An actor's address: (process rank << 16) | local actor slot. */
typedef uint32_t actor_addr_t;
#define ACTOR_ADDR(rank, slot) ((actor_addr_t)(((uint32_t)(rank) << 16) | ((uint32_t)(slot) & 0xffffu)))
static inline uint32_t actor_addr_rank(actor_addr_t a) { return a >> 16; }
static inline uint32_t actor_addr_slot(actor_addr_t a) { return a & 0xffffu; }

#define WIRE_VERSION     1u
#define WIRE_ALIGN       64u  /* payload alignment of every tensor */
#define WIRE_MAX_TENSORS 16   /* hard cap: wire_env_t holds this many descriptors */
#define WIRE_NAME_MAX    64   /* tensor name buffer, NUL included (names <= 63 bytes) */

/* Decoder limits; every one is checked before the value is used.
 * wire_limits_default() gives the values below; callers may tighten them. */
typedef struct {
    size_t   max_hdr_bytes;  /* 64 KiB */
    uint32_t max_tensors;    /* WIRE_MAX_TENSORS (cannot be raised above it) */
    uint32_t max_dims;       /* TENSOR_MAX_DIMS (cannot be raised above it) */
    uint32_t max_name_len;   /* 63 (cannot be raised above WIRE_NAME_MAX-1) */
    uint64_t max_payload;    /* 1 GiB */
    uint64_t max_dim;        /* largest single dimension: 1<<40 */
} wire_limits_t;

wire_limits_t wire_limits_default(void);

/* Why a frame was rejected (or an encode refused); always NUL-terminated. */
typedef struct {
    char reason[192];
} wire_err_t;

typedef struct {
    char     name[WIRE_NAME_MAX];
    dtype_t  dtype;
    int      ndim;
    int64_t  shape[TENSOR_MAX_DIMS];
    uint64_t offset;  /* from the start of the payload */
    uint64_t nbytes;
} wire_tensor_desc_t;

/* The decoded envelope minus its meta body (which actors/msg.h decodes). */
typedef struct {
    uint32_t           ver;
    uint32_t           type;   /* msg_type_t */
    actor_addr_t       src, dst;
    uint64_t           seq;    /* per-sender sequence number; (src, dst, seq) is a flow id */
    int64_t            step;   /* training step, -1 when not applicable */
    int32_t            mb;     /* microbatch, -1 when not applicable */
    uint32_t           ntensors;
    wire_tensor_desc_t tensors[WIRE_MAX_TENSORS];
} wire_env_t;

/* ---- encoding ----------------------------------------------------------- */

/* Writes the type-specific meta value (exactly one msgpack object). */
typedef bt_status_t (*wire_meta_encode_fn)(msgpack_packer *pk, const void *body);

/* Append the envelope `env` (ver is forced to WIRE_VERSION; ntensors
 * descriptors must already be laid out canonically, e.g. by
 * wire_tensors_layout) with meta written by meta_fn(body) to `buf`.
 * BT_ERR_NOMEM when the buffer cannot grow, BT_ERR_INVALID (reason in err,
 * may be NULL) for an envelope the decoder would reject. On error `buf` may
 * hold a partial envelope: clear it before reuse. */
bt_status_t wire_env_encode(msgpack_sbuffer *buf, const wire_env_t *env,
                            wire_meta_encode_fn meta_fn, const void *body, wire_err_t *err);

/* Describe `n` contiguous tensors (names[i] <= 63 bytes, unique, non-empty)
 * in env->tensors with the canonical layout, and point iov at their data with
 * zero padding in between. iov needs room for 2*n entries; *iovcnt and
 * *payload_len are set on success. The tensors' memory must stay valid until
 * the transport's send completes. */
bt_status_t wire_tensors_layout(wire_env_t *env, const tensor_t *ts, const char *const *names,
                                int n, struct iovec *iov, int *iovcnt, size_t *payload_len,
                                wire_err_t *err);

/* ---- decoding ----------------------------------------------------------- */

/* Called by wire_env_decode with the envelope's meta object while it is
 * still alive (the object lives in a zone freed when decode returns). It
 * decodes the body for env->type, or rejects it (unknown type, bad meta). */
typedef bt_status_t (*wire_meta_decode_fn)(void *arg, const wire_env_t *env,
                                           const msgpack_object *meta, wire_err_t *err);

/* Decode and validate an envelope from hostile bytes. payload_len is the
 * length of the payload that came with the header (checked against the
 * tensor descriptors). lim NULL means wire_limits_default(). meta_fn may be
 * NULL (meta is then only checked to be present). Returns BT_OK, or
 * BT_ERR_PEER_PROTO with err->reason set (err must not be NULL), or
 * BT_ERR_NOMEM. *env is written even on failure (partially): do not use it. */
bt_status_t wire_env_decode(const void *hdr, size_t hdr_len, size_t payload_len,
                            const wire_limits_t *lim, wire_env_t *env,
                            wire_meta_decode_fn meta_fn, void *meta_arg, wire_err_t *err);

/* A view of tensor i of a validated envelope over its received payload
 * (device CPU). The view borrows the payload: it is valid until the frame is
 * released. */
tensor_t wire_tensor_view(const wire_env_t *env, uint32_t i, void *payload);

/* The view of the tensor named `name`; BT_ERR_NOT_FOUND when absent. */
bt_status_t wire_tensor_find(const wire_env_t *env, const char *name, void *payload,
                             tensor_t *out);

/* ---- helpers shared with actors/msg.c ------------------------------------ */

/* Bytes per element / wire name of a dtype; 0 / NULL when unknown. The wire
 * names ("f32", "bf16", ...) are part of the format and never change. */
size_t      wire_dtype_size(dtype_t dt);
const char *wire_dtype_name(dtype_t dt);
/* Round up to WIRE_ALIGN. */
static inline uint64_t wire_align_up(uint64_t x) { return (x + (WIRE_ALIGN - 1)) & ~(uint64_t)(WIRE_ALIGN - 1); }

/* Printf into err->reason (err may be NULL); returns BT_ERR_PEER_PROTO. */
bt_status_t wire_err_set(wire_err_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
