/* The wire envelope: what every actor message looks like on a transport.
 *
 * A frame is a header and a payload (transport/xport.h). The header is a
 * msgpack map, the envelope:
 *
 *   {ver, type, src, dst, seq, step, mb,
 *    tensors: [{name, dtype, shape, offset, nbytes}, ...],
 *    meta: <type-specific body, see wire/msg.h>}
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
#ifndef BT_WIRE_WIRE_H
#define BT_WIRE_WIRE_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#include "base/status.h"
#include "base/tensor.h"

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
    /* The tensor's home: the device the sender keeps it on, and where the
     * receiver puts it. The bytes themselves are in the payload, host memory
     * (staged there by the sender), whatever the home. Encoded as the key
     * "dev" ("cuda:0") after nbytes, only for a home that is not the host: a
     * host tensor's descriptor keeps its five keys, and a descriptor without
     * "dev" is at home on the host. */
    device_t device;
} wire_tensor_desc_t;

/* The decoded envelope minus its meta body (which wire/msg.h decodes). */
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

/* Optional fast meta writer: writes the meta value of `body` for env->type
 * straight into out (room for WIRE_META_WRITE_MAX bytes), byte for byte
 * what the wire_meta_encode_fn would write, and returns the bytes written;
 * 0 when it does not handle this body (the packer then runs). */
#define WIRE_META_WRITE_MAX 1024u
typedef size_t (*wire_meta_write_fn)(uint8_t *out, const wire_env_t *env, const void *body);

typedef struct {
    wire_meta_encode_fn pack;  /* NULL: an empty map */
    wire_meta_write_fn  write; /* may be NULL */
    const void         *body;
} wire_meta_enc_t;

/* Append the envelope `env` (ver is forced to WIRE_VERSION; ntensors
 * descriptors must already be laid out canonically, e.g. by
 * wire_tensors_layout) with meta written by meta_fn(body) to `buf`.
 * BT_ERR_NOMEM when the buffer cannot grow, BT_ERR_INVALID (reason in err,
 * may be NULL) for an envelope the decoder would reject. On error `buf` may
 * hold a partial envelope: clear it before reuse. */
bt_status_t wire_env_encode(msgpack_sbuffer *buf, const wire_env_t *env,
                            wire_meta_encode_fn meta_fn, const void *body, wire_err_t *err);
/* The same with an optional fast meta writer (meta may be NULL: empty map). */
bt_status_t wire_env_encode_ex(msgpack_sbuffer *buf, const wire_env_t *env, const wire_meta_enc_t *meta,
                               wire_err_t *err);

/* Describe `n` contiguous tensors (names[i] <= 63 bytes, unique, non-empty)
 * in env->tensors with the canonical layout, and point iov at their data with
 * zero padding in between. iov needs room for 2*n entries; *iovcnt and
 * *payload_len are set on success. The tensors' memory must stay valid until
 * the transport's send completes. */
/* (The views' data must be host memory; a view's device field, when not the
 * host, is written as the tensor's home.) */
bt_status_t wire_tensors_layout(wire_env_t *env, const tensor_t *ts, const char *const *names,
                                int n, struct iovec *iov, int *iovcnt, size_t *payload_len,
                                wire_err_t *err);

/* wire_tensors_layout, then wire_env_encode_ex of the result, in one call:
 * what the layout established is not checked again (sizes and names that
 * are out of the ordinary still go through the encoder's full check), so
 * it accepts and writes exactly what the two calls would. */
bt_status_t wire_frame_encode(msgpack_sbuffer *buf, wire_env_t *env, const tensor_t *ts,
                              const char *const *names, int n, struct iovec *iov, int *iovcnt,
                              size_t *payload_len, const wire_meta_enc_t *meta, wire_err_t *err);

/* ---- decoding ----------------------------------------------------------- */

/* Called by wire_env_decode with the envelope's meta object while it is
 * still alive (the object lives in a zone freed when decode returns). It
 * decodes the body for env->type, or rejects it (unknown type, bad meta). */
typedef bt_status_t (*wire_meta_decode_fn)(void *arg, const wire_env_t *env,
                                           const msgpack_object *meta, wire_err_t *err);

/* Optional fast meta reader: decodes the meta value straight from its len
 * raw bytes (the rest of the header: exactly one msgpack object must span
 * them). Returns true when it accepted and wrote the body; false defers to
 * the wire_meta_decode_fn on the object tree. It must accept only what the
 * tree decoder accepts, writing the identical body. */
typedef bool (*wire_meta_raw_fn)(void *arg, const wire_env_t *env, const uint8_t *meta, size_t len);

typedef struct {
    wire_meta_decode_fn tree; /* NULL: the meta is only checked to be one object */
    wire_meta_raw_fn    raw;  /* may be NULL */
    void               *arg;
} wire_meta_dec_t;

/* Which decoder runs. AUTO (what wire_env_decode does): the fast path reads
 * the canonical envelope the encoder writes (keys in encoder order, known
 * keys only) in one pass without an object tree; any other input defers to
 * the general path, which accepts reordered and unknown keys and names the
 * reason of a rejection. The fast path accepts a subset of what the general
 * path accepts and produces the identical wire_env_t and body. The other
 * values exist for the differential tests and the fuzzer:
 *   GENERAL   the general path only;
 *   FAST      the fast path only: BT_OK, or BT_ERR_UNSUPPORTED when it
 *             defers (it never rejects by itself); the meta through raw
 *             when raw accepts, else through tree;
 *   FAST_RAW  as FAST, but the meta must be accepted by raw too. */
typedef enum {
    WIRE_DECODE_AUTO = 0,
    WIRE_DECODE_GENERAL,
    WIRE_DECODE_FAST,
    WIRE_DECODE_FAST_RAW,
} wire_decode_path_t;

/* Decode and validate an envelope from hostile bytes. payload_len is the
 * length of the payload that came with the header (checked against the
 * tensor descriptors). lim NULL means wire_limits_default(). meta_fn may be
 * NULL (meta is then only checked to be present). Returns BT_OK, or
 * BT_ERR_PEER_PROTO with err->reason set (err must not be NULL), or
 * BT_ERR_NOMEM. *env is written even on failure (partially): do not use it. */
bt_status_t wire_env_decode(const void *hdr, size_t hdr_len, size_t payload_len,
                            const wire_limits_t *lim, wire_env_t *env,
                            wire_meta_decode_fn meta_fn, void *meta_arg, wire_err_t *err);

/* wire_env_decode with a choice of path (see wire_decode_path_t) and an
 * optional raw meta reader; meta may be NULL (meta only checked). */
bt_status_t wire_env_decode_ex(const void *hdr, size_t hdr_len, size_t payload_len,
                               const wire_limits_t *lim, wire_env_t *env, const wire_meta_dec_t *meta,
                               wire_decode_path_t path, wire_err_t *err);

/* A view of tensor i of a validated envelope over its received payload. Its
 * data is host memory (the payload) whatever its device field, which is the
 * tensor's home (wire_tensor_desc_t.device). The view borrows the payload:
 * it is valid until the frame is released. */
tensor_t wire_tensor_view(const wire_env_t *env, uint32_t i, void *payload);

/* The view of the tensor named `name`; BT_ERR_NOT_FOUND when absent. */
bt_status_t wire_tensor_find(const wire_env_t *env, const char *name, void *payload,
                             tensor_t *out);

/* ---- helpers shared with wire/msg.c ------------------------------------ */

/* Bytes per element / wire name of a dtype; 0 / NULL when unknown. The wire
 * names ("f32", "bf16", ...) are part of the format and never change. */
size_t      wire_dtype_size(dtype_t dt);
const char *wire_dtype_name(dtype_t dt);
/* Round up to WIRE_ALIGN. */
static inline uint64_t wire_align_up(uint64_t x) { return (x + (WIRE_ALIGN - 1)) & ~(uint64_t)(WIRE_ALIGN - 1); }

/* ---- raw msgpack reading and writing (wire.c's fast paths, msg.c's meta) --
 *
 * A reader is a cursor over hostile bytes: every read checks its bounds and
 * returns false when the bytes are not in an expected form; the caller then
 * defers to the general decoder, which names what is wrong. Values read the
 * same as the general decoder's object tree reads them. */
typedef struct {
    const uint8_t *p, *end;
} wire_rd_t;

/* Big-endian value of n = 1, 2, 4 or 8 bytes. */
static inline __attribute__((always_inline)) uint64_t wire_rd_be(const uint8_t *p, int n)
{
    uint16_t v2;
    uint32_t v4;
    uint64_t v8;
    switch (n) {
    case 1: return p[0];
    case 2: memcpy(&v2, p, 2); return __builtin_bswap16(v2);
    case 4: memcpy(&v4, p, 4); return __builtin_bswap32(v4);
    default: memcpy(&v8, p, 8); return __builtin_bswap64(v8);
    }
}

/* Exact bytes (an encoded key). WIRE_RD_LIT takes a string literal whose
 * first 8 bytes it also folds into a little-endian word at compile time, so
 * that a key of <= 8 bytes costs one load and one compare. */
static inline __attribute__((always_inline)) bool wire_rd_lit(wire_rd_t *r, const char *bytes, size_t n,
                                                             uint64_t word)
{
    size_t avail = (size_t)(r->end - r->p);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (n <= 8 && avail >= 8) {
        uint64_t w, mask = n == 8 ? ~0ull : (1ull << (8 * n)) - 1;
        memcpy(&w, r->p, 8);
        if ((w & mask) != word) return false;
        r->p += n;
        return true;
    }
#endif
    if (avail < n) return false;
    for (size_t i = 0; i < n; i++)
        if (r->p[i] != (uint8_t)bytes[i]) return false;
    r->p += n;
    return true;
}
#define WIRE_LIT_B_(lit, i) \
    ((i) < sizeof(lit) - 1 ? (uint64_t)(uint8_t)(lit)[(i) < sizeof(lit) - 1 ? (i) : 0] << (8 * (i)) : 0)
#define WIRE_LIT_WORD_(lit)                                                                 \
    (WIRE_LIT_B_(lit, 0) | WIRE_LIT_B_(lit, 1) | WIRE_LIT_B_(lit, 2) | WIRE_LIT_B_(lit, 3) | \
     WIRE_LIT_B_(lit, 4) | WIRE_LIT_B_(lit, 5) | WIRE_LIT_B_(lit, 6) | WIRE_LIT_B_(lit, 7))
#define WIRE_RD_LIT(r, lit) wire_rd_lit((r), (lit), sizeof(lit) - 1, WIRE_LIT_WORD_(lit))

/* An integer in any msgpack integer form: *neg for a negative value, whose
 * int64 bits are then in *v. */
static inline __attribute__((always_inline)) bool wire_rd_int(wire_rd_t *r, bool *neg, uint64_t *v)
{
    if (r->p >= r->end) return false;
    uint8_t t = *r->p;
    if (t <= 0x7f || t >= 0xe0) {
        r->p++;
        *neg = t >= 0xe0;
        *v = (uint64_t)(int64_t)(int8_t)t;
        return true;
    }
    int nb;
    if (t >= 0xcc && t <= 0xcf) nb = 1 << (t - 0xcc);
    else if (t >= 0xd0 && t <= 0xd3) nb = 1 << (t - 0xd0);
    else return false;
    if (r->end - r->p - 1 < nb) return false;
    uint64_t u = wire_rd_be(r->p + 1, nb);
    r->p += 1 + nb;
    if (t <= 0xcf) {
        *neg = false;
        *v = u;
        return true;
    }
    int64_t s = nb == 8 ? (int64_t)u : (int64_t)(u << (64 - 8 * nb)) >> (64 - 8 * nb);
    *neg = s < 0;
    *v = (uint64_t)s;
    return true;
}

/* A non-negative integer <= max. */
static inline __attribute__((always_inline)) bool wire_rd_uint(wire_rd_t *r, uint64_t max, uint64_t *v)
{
    bool neg;
    return wire_rd_int(r, &neg, v) && !neg && *v <= max;
}

/* A string (any str form): pointer into the bytes and length. */
static inline __attribute__((always_inline)) bool wire_rd_str(wire_rd_t *r, const char **s, uint32_t *len)
{
    if (r->p >= r->end) return false;
    uint8_t t = *r->p;
    uint64_t n;
    int hb;
    if (t >= 0xa0 && t <= 0xbf) { n = t & 0x1f; hb = 0; }
    else if (t >= 0xd9 && t <= 0xdb) { hb = 1 << (t - 0xd9); if (r->end - r->p - 1 < hb) return false; n = wire_rd_be(r->p + 1, hb); }
    else return false;
    if ((uint64_t)(r->end - r->p - 1 - hb) < n) return false;
    *s = (const char *)r->p + 1 + hb;
    *len = (uint32_t)n;
    r->p += 1 + hb + n;
    return true;
}

/* A map or array header (fix or 16-bit form) of n entries. */
static inline __attribute__((always_inline)) bool wire_rd_container(wire_rd_t *r, uint8_t fix, uint8_t tag16, uint32_t *n)
{
    if (r->p >= r->end) return false;
    uint8_t t = *r->p;
    if ((t & 0xf0) == fix) {
        *n = t & 0x0f;
        r->p++;
        return true;
    }
    if (t != tag16 || r->end - r->p < 3) return false;
    *n = (uint32_t)wire_rd_be(r->p + 1, 2);
    r->p += 3;
    return true;
}
static inline bool wire_rd_map(wire_rd_t *r, uint32_t *n) { return wire_rd_container(r, 0x80, 0xde, n); }
static inline bool wire_rd_array(wire_rd_t *r, uint32_t *n) { return wire_rd_container(r, 0x90, 0xdc, n); }

/* A float32 or float64 value, as the general decoder holds it (a double). */
static inline bool wire_rd_float(wire_rd_t *r, bool *is32, double *d)
{
    if (r->p >= r->end) return false;
    uint8_t t = *r->p;
    if ((t != 0xca && t != 0xcb) || r->end - r->p - 1 < (t == 0xca ? 4 : 8)) return false;
    if (t == 0xca) {
        uint32_t bits = (uint32_t)wire_rd_be(r->p + 1, 4);
        float f;
        memcpy(&f, &bits, 4);
        *d = f;
        r->p += 5;
    } else {
        uint64_t bits = wire_rd_be(r->p + 1, 8);
        memcpy(d, &bits, 8);
        r->p += 9;
    }
    *is32 = t == 0xca;
    return true;
}

/* A writer appends the smallest msgpack forms (as msgpack-c's packer writes
 * them) to memory the caller made large enough. */
typedef struct {
    uint8_t *p;
} wire_out_t;

static inline void wire_out_be(wire_out_t *o, uint8_t tag, uint64_t v, int nbytes)
{
    *o->p++ = tag;
    for (int i = nbytes - 1; i >= 0; i--) *o->p++ = (uint8_t)(v >> (8 * i));
}

static inline void wire_out_uint(wire_out_t *o, uint64_t v)
{
    if (v < 128) *o->p++ = (uint8_t)v;
    else if (v <= UINT8_MAX) wire_out_be(o, 0xcc, v, 1);
    else if (v <= UINT16_MAX) wire_out_be(o, 0xcd, v, 2);
    else if (v <= UINT32_MAX) wire_out_be(o, 0xce, v, 4);
    else wire_out_be(o, 0xcf, v, 8);
}

static inline void wire_out_int(wire_out_t *o, int64_t v)
{
    if (v >= 0) wire_out_uint(o, (uint64_t)v);
    else if (v >= -32) *o->p++ = (uint8_t)(int8_t)v;
    else if (v >= INT8_MIN) wire_out_be(o, 0xd0, (uint64_t)v, 1);
    else if (v >= INT16_MIN) wire_out_be(o, 0xd1, (uint64_t)v, 2);
    else if (v >= INT32_MIN) wire_out_be(o, 0xd2, (uint64_t)v, 4);
    else wire_out_be(o, 0xd3, (uint64_t)v, 8);
}

/* Exact bytes from a string literal (an encoded key): one 8-byte store of
 * the word folded at compile time when the literal is <= 8 bytes, so the
 * caller must have 8 writable bytes at o->p. */
static inline __attribute__((always_inline)) void wire_out_lit(wire_out_t *o, size_t n, uint64_t word,
                                                              const char *bytes)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (n <= 8) {
        memcpy(o->p, &word, 8);
        o->p += n;
        return;
    }
#endif
    (void)word;
    memcpy(o->p, bytes, n);
    o->p += n;
}
#define WIRE_OUT_LIT(o, lit) wire_out_lit((o), sizeof(lit) - 1, WIRE_LIT_WORD_(lit), (lit))

/* Containers here are short (< 2^16 entries). */
static inline void wire_out_map(wire_out_t *o, uint32_t n)
{
    if (n < 16) *o->p++ = (uint8_t)(0x80 | n);
    else wire_out_be(o, 0xde, n, 2);
}

static inline void wire_out_array(wire_out_t *o, uint32_t n)
{
    if (n < 16) *o->p++ = (uint8_t)(0x90 | n);
    else wire_out_be(o, 0xdc, n, 2);
}

/* Strings of < 2^16 bytes; WIRE_STR_OUT_MAX(len) bounds what is written. */
#define WIRE_STR_OUT_MAX(len) ((size_t)(len) + 3)
static inline void wire_out_str(wire_out_t *o, const char *s, size_t len)
{
    if (len < 32) *o->p++ = (uint8_t)(0xa0 | len);
    else if (len <= UINT8_MAX) wire_out_be(o, 0xd9, len, 1);
    else wire_out_be(o, 0xda, len, 2);
    memcpy(o->p, s, len);
    o->p += len;
}

static inline void wire_out_f32(wire_out_t *o, float f)
{
    uint32_t bits;
    memcpy(&bits, &f, 4);
    wire_out_be(o, 0xca, bits, 4);
}

static inline void wire_out_f64(wire_out_t *o, double d)
{
    uint64_t bits;
    memcpy(&bits, &d, 8);
    wire_out_be(o, 0xcb, bits, 8);
}

/* Printf into err->reason (err may be NULL); returns BT_ERR_PEER_PROTO. */
bt_status_t wire_err_set(wire_err_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
