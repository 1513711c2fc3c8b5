/* The wire envelope: encoder and hostile-input decoder (contract in wire.h).
 *
 * Decoding runs in stages so that no byte is trusted before it is checked:
 *   1. wire_mp_scan walks the raw msgpack bytes without allocating and checks
 *      that they form exactly one object, nested at most WIRE_MAX_DEPTH deep,
 *      whose every container announces no more elements than bytes remain.
 *      msgpack-c allocates count * sizeof(msgpack_object) when it meets an
 *      array header, so without this a 5-byte header claiming 4 billion
 *      elements would ask for ~100 GB.
 *   2. wire_mp_build builds the msgpack_object tree into an arena of at most
 *      header-length objects (a per-thread one for ordinary headers), so a
 *      frame is decoded without allocating. It enforces the same limits as
 *      stage 1 (bounds, depth, arena size), so stage 1 runs only when stage 2
 *      failed, to name the reason: an accepted frame is walked once.
 *   3. wire_env_read checks every object's type and every value's range, then
 *      the tensor layout against the payload length.
 */
#include "wire/wire.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WIRE_MAX_DEPTH 16

static const char *const wire_dtype_names[DT_COUNT] = {
    [DT_F32] = "f32", [DT_F16] = "f16", [DT_BF16] = "bf16", [DT_F64] = "f64",
    [DT_I32] = "i32", [DT_I64] = "i64", [DT_U8] = "u8",
};
static const uint8_t wire_dtype_sizes[DT_COUNT] = {
    [DT_F32] = 4, [DT_F16] = 2, [DT_BF16] = 2, [DT_F64] = 8,
    [DT_I32] = 4, [DT_I64] = 8, [DT_U8] = 1,
};
_Static_assert(sizeof wire_dtype_names / sizeof wire_dtype_names[0] == DT_COUNT, "dtype names");
_Static_assert(sizeof wire_dtype_sizes / sizeof wire_dtype_sizes[0] == DT_COUNT, "dtype sizes");
/* The names again as little-endian 32-bit words (NUL padded) and their
 * lengths, for the fast paths. */
#define WIRE_W4(a, b, c, d) ((uint32_t)(uint8_t)(a) | (uint32_t)(uint8_t)(b) << 8 | \
                             (uint32_t)(uint8_t)(c) << 16 | (uint32_t)(uint8_t)(d) << 24)
static const uint32_t wire_dtype_words[DT_COUNT] = {
    [DT_F32] = WIRE_W4('f', '3', '2', 0), [DT_F16] = WIRE_W4('f', '1', '6', 0),
    [DT_BF16] = WIRE_W4('b', 'f', '1', '6'), [DT_F64] = WIRE_W4('f', '6', '4', 0),
    [DT_I32] = WIRE_W4('i', '3', '2', 0), [DT_I64] = WIRE_W4('i', '6', '4', 0),
    [DT_U8] = WIRE_W4('u', '8', 0, 0),
};
static const uint8_t wire_dtype_lens[DT_COUNT] = {
    [DT_F32] = 3, [DT_F16] = 3, [DT_BF16] = 4, [DT_F64] = 3, [DT_I32] = 3, [DT_I64] = 3, [DT_U8] = 2,
};
_Static_assert(sizeof wire_dtype_words / sizeof wire_dtype_words[0] == DT_COUNT, "dtype words");
_Static_assert(sizeof wire_dtype_lens / sizeof wire_dtype_lens[0] == DT_COUNT, "dtype name lengths");

size_t wire_dtype_size(dtype_t dt)
{
    return (unsigned)dt < DT_COUNT ? wire_dtype_sizes[dt] : 0;
}

const char *wire_dtype_name(dtype_t dt)
{
    return (unsigned)dt < DT_COUNT ? wire_dtype_names[dt] : NULL;
}

/* dtype from a wire name of len bytes (not NUL-terminated); -1 when unknown. */
static int wire_dtype_lookup(const char *s, size_t len)
{
    for (int i = 0; i < DT_COUNT; i++)
        if (strlen(wire_dtype_names[i]) == len && !memcmp(wire_dtype_names[i], s, len)) return i;
    return -1;
}

wire_limits_t wire_limits_default(void)
{
    return (wire_limits_t){
        .max_hdr_bytes = 64u << 10,
        .max_tensors = WIRE_MAX_TENSORS,
        .max_dims = TENSOR_MAX_DIMS,
        .max_name_len = WIRE_NAME_MAX - 1,
        .max_payload = 1ull << 30,
        .max_dim = 1ull << 40,
    };
}

bt_status_t wire_err_set(wire_err_t *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->reason, sizeof err->reason, fmt, ap);
        va_end(ap);
    }
    return BT_ERR_PEER_PROTO;
}

/* ---- stage 1: bounded scan of raw msgpack -------------------------------- */

static uint64_t wire_be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* Check that p[0..n) is exactly one msgpack object within the depth limit
 * and that no container claims more elements than bytes remain. */
static bt_status_t wire_mp_scan(const uint8_t *p, size_t n, wire_err_t *err)
{
    uint64_t pending[WIRE_MAX_DEPTH + 1]; /* objects still owed at each depth */
    int depth = 0;
    size_t i = 0;
    pending[0] = 1;
    while (depth >= 0) {
        if (pending[depth] == 0) { depth--; continue; }
        pending[depth]--;
        if (i >= n) return wire_err_set(err, "envelope: truncated msgpack at byte %zu", i);
        uint8_t b = p[i++];
        uint64_t skip = 0, count = 0;
        int lenbytes = 0, container = 0; /* 1 array, 2 map */
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
            /* fixint, nil, bool: nothing more */
        } else if (b >= 0x80 && b <= 0x8f) { container = 2; count = b & 0x0f; }
        else if (b >= 0x90 && b <= 0x9f) { container = 1; count = b & 0x0f; }
        else if (b >= 0xa0 && b <= 0xbf) { skip = b & 0x1f; }
        else {
            switch (b) {
            case 0xc4: case 0xd9: lenbytes = 1; break;           /* bin8, str8 */
            case 0xc5: case 0xda: lenbytes = 2; break;           /* bin16, str16 */
            case 0xc6: case 0xdb: lenbytes = 4; break;           /* bin32, str32 */
            case 0xc7: lenbytes = 1; skip = 1; break;            /* ext8: len, type */
            case 0xc8: lenbytes = 2; skip = 1; break;
            case 0xc9: lenbytes = 4; skip = 1; break;
            case 0xca: skip = 4; break;
            case 0xcb: skip = 8; break;
            case 0xcc: case 0xd0: skip = 1; break;
            case 0xcd: case 0xd1: skip = 2; break;
            case 0xce: case 0xd2: skip = 4; break;
            case 0xcf: case 0xd3: skip = 8; break;
            case 0xd4: skip = 2; break;                          /* fixext1..16: type + data */
            case 0xd5: skip = 3; break;
            case 0xd6: skip = 5; break;
            case 0xd7: skip = 9; break;
            case 0xd8: skip = 17; break;
            case 0xdc: container = 1; lenbytes = 2; break;
            case 0xdd: container = 1; lenbytes = 4; break;
            case 0xde: container = 2; lenbytes = 2; break;
            case 0xdf: container = 2; lenbytes = 4; break;
            default:
                return wire_err_set(err, "envelope: invalid msgpack byte 0x%02x at %zu", b, i - 1);
            }
            if (lenbytes) {
                if ((size_t)lenbytes > n - i)
                    return wire_err_set(err, "envelope: truncated msgpack length at byte %zu", i);
                uint64_t len = wire_be(p + i, lenbytes);
                i += (size_t)lenbytes;
                if (container) count = len; else skip += len;
            }
        }
        if (skip > n - i)
            return wire_err_set(err, "envelope: msgpack value of %llu bytes at %zu overruns the %zu-byte header",
                                (unsigned long long)skip, i, n);
        i += (size_t)skip;
        if (container) {
            uint64_t objs = container == 2 ? count * 2 : count; /* count < 2^32: no overflow */
            if (objs > n - i)
                return wire_err_set(err, "envelope: msgpack %s of %llu entries at %zu overruns the %zu-byte header",
                                    container == 2 ? "map" : "array", (unsigned long long)count, i, n);
            if (objs) {
                if (depth == WIRE_MAX_DEPTH)
                    return wire_err_set(err, "envelope: msgpack nested deeper than %d", WIRE_MAX_DEPTH);
                pending[++depth] = objs;
            }
        }
    }
    if (i != n) return wire_err_set(err, "envelope: %zu trailing bytes after the envelope", n - i);
    return BT_OK;
}

/* ---- stage 2: object tree without msgpack_unpack ------------------------- */

/* Stage 2 builds the same msgpack_object tree msgpack_unpack would (strings,
 * bin and ext point into the header), but into a caller-provided arena sized
 * from the header length, so decoding a frame allocates nothing. It runs
 * only on bytes stage 1 accepted; it still checks every bound it relies on. */
#define WIRE_ARENA_OBJS 1024u /* 24 KiB per thread: headers up to ~1 KiB */
static _Thread_local msgpack_object wire_arena_tls[WIRE_ARENA_OBJS];

typedef struct {
    const uint8_t  *p;
    size_t          n, i;
    msgpack_object *arena;
    size_t          cap, used;
} wire_builder_t;

static msgpack_object *wire_builder_take(wire_builder_t *b, uint64_t nobj)
{
    if (nobj > b->cap - b->used) return NULL;
    msgpack_object *o = b->arena + b->used;
    b->used += (size_t)nobj;
    return o;
}

static bool wire_builder_bytes(wire_builder_t *b, uint64_t len, const char **ptr)
{
    if (len > b->n - b->i) return false;
    *ptr = (const char *)b->p + b->i;
    b->i += (size_t)len;
    return true;
}

static bool wire_builder_uint(wire_builder_t *b, int nbytes, uint64_t *v)
{
    if ((size_t)nbytes > b->n - b->i) return false;
    *v = wire_be(b->p + b->i, nbytes);
    b->i += (size_t)nbytes;
    return true;
}

static void wire_obj_int(msgpack_object *o, int64_t v)
{
    if (v < 0) {
        o->type = MSGPACK_OBJECT_NEGATIVE_INTEGER;
        o->via.i64 = v;
    } else {
        o->type = MSGPACK_OBJECT_POSITIVE_INTEGER;
        o->via.u64 = (uint64_t)v;
    }
}

static bool wire_mp_build(wire_builder_t *b, msgpack_object *o, int depth)
{
    if (b->i >= b->n || depth > WIRE_MAX_DEPTH) return false;
    uint8_t t = b->p[b->i++];
    uint64_t len = 0, u = 0;
    const char *ptr;
    if (t <= 0x7f) { o->type = MSGPACK_OBJECT_POSITIVE_INTEGER; o->via.u64 = t; return true; }
    if (t >= 0xe0) { wire_obj_int(o, (int8_t)t); return true; }
    if (t >= 0xa0 && t <= 0xbf) { len = t & 0x1f; goto str; }
    if (t >= 0x90 && t <= 0x9f) { len = t & 0x0f; goto array; }
    if (t >= 0x80 && t <= 0x8f) { len = t & 0x0f; goto map; }
    switch (t) {
    case 0xc0: o->type = MSGPACK_OBJECT_NIL; return true;
    case 0xc2: case 0xc3: o->type = MSGPACK_OBJECT_BOOLEAN; o->via.boolean = t == 0xc3; return true;
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
        if (!wire_builder_uint(b, 1 << (t - 0xcc), &u)) return false;
        o->type = MSGPACK_OBJECT_POSITIVE_INTEGER;
        o->via.u64 = u;
        return true;
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        int nb = 1 << (t - 0xd0);
        if (!wire_builder_uint(b, nb, &u)) return false;
        int64_t v = nb == 8 ? (int64_t)u : (int64_t)(u << (64 - 8 * nb)) >> (64 - 8 * nb);
        wire_obj_int(o, v);
        return true;
    }
    case 0xca: {
        if (!wire_builder_uint(b, 4, &u)) return false;
        uint32_t bits = (uint32_t)u;
        float f;
        memcpy(&f, &bits, 4);
        o->type = MSGPACK_OBJECT_FLOAT32;
        o->via.f64 = f;
        return true;
    }
    case 0xcb: {
        if (!wire_builder_uint(b, 8, &u)) return false;
        double d;
        memcpy(&d, &u, 8);
        o->type = MSGPACK_OBJECT_FLOAT64;
        o->via.f64 = d;
        return true;
    }
    case 0xd9: case 0xda: case 0xdb:
        if (!wire_builder_uint(b, 1 << (t - 0xd9), &len)) return false;
        goto str;
    case 0xc4: case 0xc5: case 0xc6:
        if (!wire_builder_uint(b, 1 << (t - 0xc4), &len) || !wire_builder_bytes(b, len, &ptr)) return false;
        o->type = MSGPACK_OBJECT_BIN;
        o->via.bin.ptr = ptr;
        o->via.bin.size = (uint32_t)len;
        return true;
    case 0xc7: case 0xc8: case 0xc9:
        if (!wire_builder_uint(b, 1 << (t - 0xc7), &len)) return false;
        goto ext;
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
        len = 1u << (t - 0xd4);
        goto ext;
    case 0xdc: case 0xdd:
        if (!wire_builder_uint(b, t == 0xdc ? 2 : 4, &len)) return false;
        goto array;
    case 0xde: case 0xdf:
        if (!wire_builder_uint(b, t == 0xde ? 2 : 4, &len)) return false;
        goto map;
    default:
        return false;
    }
str:
    if (!wire_builder_bytes(b, len, &ptr)) return false;
    o->type = MSGPACK_OBJECT_STR;
    o->via.str.ptr = ptr;
    o->via.str.size = (uint32_t)len;
    return true;
ext: {
    if (!wire_builder_uint(b, 1, &u) || !wire_builder_bytes(b, len, &ptr)) return false;
    o->type = MSGPACK_OBJECT_EXT;
    o->via.ext.type = (int8_t)(uint8_t)u;
    o->via.ext.ptr = ptr;
    o->via.ext.size = (uint32_t)len;
    return true;
}
array: {
    msgpack_object *items = len ? wire_builder_take(b, len) : NULL;
    if (len && !items) return false;
    o->type = MSGPACK_OBJECT_ARRAY;
    o->via.array.size = (uint32_t)len;
    o->via.array.ptr = items;
    for (uint64_t k = 0; k < len; k++)
        if (!wire_mp_build(b, &items[k], depth + 1)) return false;
    return true;
}
map: {
    _Static_assert(sizeof(msgpack_object_kv) == 2 * sizeof(msgpack_object), "kv is two objects");
    msgpack_object_kv *kv = len ? (msgpack_object_kv *)wire_builder_take(b, 2 * len) : NULL;
    if (len && !kv) return false;
    o->type = MSGPACK_OBJECT_MAP;
    o->via.map.size = (uint32_t)len;
    o->via.map.ptr = kv;
    for (uint64_t k = 0; k < len; k++)
        if (!wire_mp_build(b, &kv[k].key, depth + 1) || !wire_mp_build(b, &kv[k].val, depth + 1)) return false;
    return true;
}
}

/* ---- stage 3: typed reading ---------------------------------------------- */

/* "what", "tensor 'x' what" or "tensor 'x' what N": built only on error,
 * so the accepting path does no formatting. */
static const char *wire_label(char *buf, size_t cap, const char *tname, const char *what, int idx)
{
    if (!tname) return what;
    if (idx < 0) snprintf(buf, cap, "tensor '%s' %s", tname, what);
    else snprintf(buf, cap, "tensor '%s' %s %d", tname, what, idx);
    return buf;
}

static bt_status_t wire_get_u64(const msgpack_object *o, const char *tname, const char *what, int idx,
                                uint64_t max, uint64_t *out, wire_err_t *err)
{
    char buf[WIRE_NAME_MAX + 32];
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return wire_err_set(err, "envelope: %s is not an unsigned integer (msgpack type %d)",
                            wire_label(buf, sizeof buf, tname, what, idx), (int)o->type);
    if (o->via.u64 > max)
        return wire_err_set(err, "envelope: %s %llu exceeds %llu", wire_label(buf, sizeof buf, tname, what, idx),
                            (unsigned long long)o->via.u64, (unsigned long long)max);
    *out = o->via.u64;
    return BT_OK;
}

static bt_status_t wire_get_i64(const msgpack_object *o, const char *what, int64_t min, int64_t max,
                                int64_t *out, wire_err_t *err)
{
    int64_t v;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)INT64_MAX)
            return wire_err_set(err, "envelope: %s %llu out of range", what, (unsigned long long)o->via.u64);
        v = (int64_t)o->via.u64;
    } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        v = o->via.i64;
    } else {
        return wire_err_set(err, "envelope: %s is not an integer (msgpack type %d)", what, (int)o->type);
    }
    if (v < min || v > max)
        return wire_err_set(err, "envelope: %s %lld out of range [%lld, %lld]", what, (long long)v,
                            (long long)min, (long long)max);
    *out = v;
    return BT_OK;
}

/* Copy a name string: 1..max bytes, no NUL inside. */
static bt_status_t wire_get_name(const msgpack_object *o, uint32_t max, char *out, wire_err_t *err)
{
    if (o->type != MSGPACK_OBJECT_STR)
        return wire_err_set(err, "envelope: tensor name is not a string (msgpack type %d)", (int)o->type);
    uint32_t len = o->via.str.size;
    if (len == 0) return wire_err_set(err, "envelope: empty tensor name");
    if (len > max) return wire_err_set(err, "envelope: tensor name of %u bytes exceeds %u", len, max);
    if (memchr(o->via.str.ptr, '\0', len)) return wire_err_set(err, "envelope: tensor name contains NUL");
    memcpy(out, o->via.str.ptr, len);
    out[len] = '\0';
    return BT_OK;
}

typedef struct {
    const char *s;
    uint32_t    len;
} wire_key_t;
#define WIRE_KEY(x) {x, sizeof(x) - 1}

/* Index of `key` in keys[], -1 when unknown, -2 when not a string. The
 * encoder writes keys in table order, so position `hint` is tried first. */
static int wire_key_find(const msgpack_object *key, const wire_key_t *keys, int n, uint32_t hint)
{
    if (key->type != MSGPACK_OBJECT_STR) return -2;
    uint32_t sz = key->via.str.size;
    const char *p = key->via.str.ptr;
    if (hint < (uint32_t)n && keys[hint].len == sz && !memcmp(keys[hint].s, p, sz)) return (int)hint;
    for (int k = 0; k < n; k++)
        if (keys[k].len == sz && !memcmp(keys[k].s, p, sz)) return k;
    return -1;
}

/* TK_DEV is optional (absent: the host); the others are required. */
enum { TK_NAME, TK_DTYPE, TK_SHAPE, TK_OFFSET, TK_NBYTES, TK_DEV, TK_COUNT };
static const wire_key_t wire_tensor_keys[TK_COUNT] = {
    [TK_NAME] = WIRE_KEY("name"), [TK_DTYPE] = WIRE_KEY("dtype"), [TK_SHAPE] = WIRE_KEY("shape"),
    [TK_OFFSET] = WIRE_KEY("offset"), [TK_NBYTES] = WIRE_KEY("nbytes"), [TK_DEV] = WIRE_KEY("dev"),
};

/* "cpu", "cuda:3", ... of at most DEVICE_STR_MAX - 1 bytes; false otherwise. */
static bool wire_device_parse(const char *s, uint32_t len, device_t *out)
{
    char buf[DEVICE_STR_MAX];
    if (len == 0 || len >= sizeof buf || memchr(s, '\0', len)) return false;
    memcpy(buf, s, len);
    buf[len] = '\0';
    return device_parse(buf, out);
}
_Static_assert(sizeof wire_tensor_keys / sizeof wire_tensor_keys[0] == TK_COUNT, "tensor keys");

static bt_status_t wire_tensor_read(const msgpack_object *o, uint32_t idx, const wire_limits_t *lim,
                                    wire_tensor_desc_t *d, wire_err_t *err)
{
    if (o->type != MSGPACK_OBJECT_MAP)
        return wire_err_set(err, "envelope: tensor #%u is not a map (msgpack type %d)", idx, (int)o->type);
    const msgpack_object *val[TK_COUNT] = {0};
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        int k = wire_key_find(&kv->key, wire_tensor_keys, TK_COUNT, i);
        if (k == -2) return wire_err_set(err, "envelope: tensor #%u key #%u is not a string", idx, i);
        if (k < 0) continue; /* unknown keys are skipped */
        if (val[k]) return wire_err_set(err, "envelope: tensor #%u duplicate key '%s'", idx, wire_tensor_keys[k].s);
        val[k] = &kv->val;
    }
    for (int k = 0; k < TK_DEV; k++)
        if (!val[k]) return wire_err_set(err, "envelope: tensor #%u missing key '%s'", idx, wire_tensor_keys[k].s);

    bt_status_t st = wire_get_name(val[TK_NAME], lim->max_name_len, d->name, err);
    if (st != BT_OK) return st;
    const msgpack_object *dt = val[TK_DTYPE];
    int dtype = dt->type == MSGPACK_OBJECT_STR ? wire_dtype_lookup(dt->via.str.ptr, dt->via.str.size) : -1;
    if (dtype < 0) return wire_err_set(err, "envelope: tensor '%s' has an unknown dtype", d->name);
    d->dtype = (dtype_t)dtype;
    const msgpack_object *sh = val[TK_SHAPE];
    if (sh->type != MSGPACK_OBJECT_ARRAY)
        return wire_err_set(err, "envelope: tensor '%s' shape is not an array", d->name);
    if (sh->via.array.size < 1 || sh->via.array.size > lim->max_dims)
        return wire_err_set(err, "envelope: tensor '%s' has %u dims (1..%u allowed)", d->name,
                            sh->via.array.size, lim->max_dims);
    d->ndim = (int)sh->via.array.size;
    for (int i = 0; i < d->ndim; i++) {
        uint64_t v = 0;
        if ((st = wire_get_u64(&sh->via.array.ptr[i], d->name, "dim", i, lim->max_dim, &v, err)) != BT_OK) return st;
        d->shape[i] = (int64_t)v;
    }
    for (int i = d->ndim; i < TENSOR_MAX_DIMS; i++) d->shape[i] = 1;
    if ((st = wire_get_u64(val[TK_OFFSET], d->name, "offset", -1, UINT64_MAX, &d->offset, err)) != BT_OK) return st;
    if ((st = wire_get_u64(val[TK_NBYTES], d->name, "nbytes", -1, UINT64_MAX, &d->nbytes, err)) != BT_OK) return st;
    d->device = DEVICE_CPU;
    const msgpack_object *dv = val[TK_DEV];
    if (dv && (dv->type != MSGPACK_OBJECT_STR ||
               !wire_device_parse(dv->via.str.ptr, dv->via.str.size, &d->device)))
        return wire_err_set(err, "envelope: tensor '%s' names an unknown device", d->name);
    return BT_OK;
}

/* "3x2" into buf, for reasons. */
static void wire_shape_str(const wire_tensor_desc_t *d, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < d->ndim && n < cap; i++) {
        int w = snprintf(buf + n, cap - n, i ? "x%lld" : "%lld", (long long)d->shape[i]);
        if (w < 0) break;
        n += (size_t)w;
    }
}

/* The tensor descriptors against each other and the payload: dtype, sizes
 * (with overflow checks), unique names, canonical layout, exact payload size. */
static bt_status_t wire_tensors_check(const wire_env_t *env, uint64_t payload_len,
                                      const wire_limits_t *lim, wire_err_t *err)
{
    if (payload_len > lim->max_payload)
        return wire_err_set(err, "envelope: payload of %llu bytes exceeds the limit %llu",
                            (unsigned long long)payload_len, (unsigned long long)lim->max_payload);
    if (env->ntensors > lim->max_tensors || env->ntensors > WIRE_MAX_TENSORS)
        return wire_err_set(err, "envelope: %u tensors exceed the limit %u", env->ntensors, lim->max_tensors);
    uint64_t end = 0;
    for (uint32_t i = 0; i < env->ntensors; i++) {
        const wire_tensor_desc_t *d = &env->tensors[i];
        size_t esize = wire_dtype_size(d->dtype);
        if (!esize) return wire_err_set(err, "envelope: tensor #%u has an unknown dtype", i);
        if (d->ndim < 1 || d->ndim > (int)lim->max_dims || d->ndim > TENSOR_MAX_DIMS)
            return wire_err_set(err, "envelope: tensor '%s' has %d dims", d->name, d->ndim);
        for (uint32_t j = 0; j < i; j++)
            if (!strcmp(env->tensors[j].name, d->name))
                return wire_err_set(err, "envelope: duplicate tensor name '%s'", d->name);
        uint64_t numel = 1;
        bool overflow = false;
        for (int k = 0; k < d->ndim; k++) {
            if (d->shape[k] < 0 || (uint64_t)d->shape[k] > lim->max_dim)
                return wire_err_set(err, "envelope: tensor '%s' dim %d = %lld out of range", d->name, k,
                                    (long long)d->shape[k]);
            overflow |= __builtin_mul_overflow(numel, (uint64_t)d->shape[k], &numel);
        }
        uint64_t want;
        overflow |= __builtin_mul_overflow(numel, (uint64_t)esize, &want);
        if (overflow || d->nbytes != want) {
            char shape[96];
            wire_shape_str(d, shape, sizeof shape);
            if (overflow)
                return wire_err_set(err, "envelope: tensor '%s' shape %s %s overflows", d->name, shape,
                                    wire_dtype_name(d->dtype));
            return wire_err_set(err, "envelope: tensor '%s' nbytes %llu != %s %s", d->name,
                                (unsigned long long)d->nbytes, shape, wire_dtype_name(d->dtype));
        }
        uint64_t expect = i == 0 ? 0 : wire_align_up(end);
        if (d->offset != expect)
            return wire_err_set(err, "envelope: tensor '%s' offset %llu, expected %llu (%u-aligned, back to back)",
                                d->name, (unsigned long long)d->offset, (unsigned long long)expect, WIRE_ALIGN);
        /* offset <= payload_len is checked through end below; both are < 2^63 here */
        if (d->offset > payload_len || d->nbytes > payload_len - d->offset)
            return wire_err_set(err, "envelope: tensor '%s' [%llu, +%llu) lies beyond the %llu-byte payload",
                                d->name, (unsigned long long)d->offset, (unsigned long long)d->nbytes,
                                (unsigned long long)payload_len);
        end = d->offset + d->nbytes;
    }
    if (end != payload_len)
        return wire_err_set(err, "envelope: payload is %llu bytes but the tensors cover %llu",
                            (unsigned long long)payload_len, (unsigned long long)end);
    return BT_OK;
}

enum { EK_VER, EK_TYPE, EK_SRC, EK_DST, EK_SEQ, EK_STEP, EK_MB, EK_TENSORS, EK_META, EK_COUNT };
static const wire_key_t wire_env_keys[EK_COUNT] = {
    [EK_VER] = WIRE_KEY("ver"), [EK_TYPE] = WIRE_KEY("type"), [EK_SRC] = WIRE_KEY("src"),
    [EK_DST] = WIRE_KEY("dst"), [EK_SEQ] = WIRE_KEY("seq"), [EK_STEP] = WIRE_KEY("step"),
    [EK_MB] = WIRE_KEY("mb"), [EK_TENSORS] = WIRE_KEY("tensors"), [EK_META] = WIRE_KEY("meta"),
};
_Static_assert(sizeof wire_env_keys / sizeof wire_env_keys[0] == EK_COUNT, "envelope keys");

static bt_status_t wire_env_read(const msgpack_object *root, size_t payload_len, const wire_limits_t *lim,
                                 wire_env_t *env, const msgpack_object **meta, wire_err_t *err)
{
    if (root->type != MSGPACK_OBJECT_MAP)
        return wire_err_set(err, "envelope: not a msgpack map (msgpack type %d)", (int)root->type);
    const msgpack_object_map *m = &root->via.map;
    /* "ver" first: the format's magic. Anything else is not our frame. */
    if (m->size == 0 || wire_key_find(&m->ptr[0].key, wire_env_keys, 1, 0) != EK_VER)
        return wire_err_set(err, "envelope: first key is not 'ver' (not a baton envelope)");
    const msgpack_object *ver = &m->ptr[0].val;
    if (ver->type != MSGPACK_OBJECT_POSITIVE_INTEGER || ver->via.u64 != WIRE_VERSION)
        return wire_err_set(err, "envelope: version %lld, expected %u",
                            ver->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (long long)ver->via.u64 : -1LL,
                            WIRE_VERSION);

    const msgpack_object *val[EK_COUNT] = {0};
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object_kv *kv = &m->ptr[i];
        int k = wire_key_find(&kv->key, wire_env_keys, EK_COUNT, i);
        if (k == -2)
            return wire_err_set(err, "envelope: key #%u is not a string (msgpack type %d)", i, (int)kv->key.type);
        if (k < 0) continue; /* unknown keys are skipped: the format grows by appending */
        if (val[k]) return wire_err_set(err, "envelope: duplicate key '%s'", wire_env_keys[k].s);
        val[k] = &kv->val;
    }
    for (int k = 0; k < EK_COUNT; k++)
        if (!val[k]) return wire_err_set(err, "envelope: missing key '%s'", wire_env_keys[k].s);

    uint64_t u = 0;
    int64_t s;
    bt_status_t st;
    env->ver = WIRE_VERSION;
    if ((st = wire_get_u64(val[EK_TYPE], NULL, "type", -1, UINT32_MAX, &u, err)) != BT_OK) return st;
    env->type = (uint32_t)u;
    if ((st = wire_get_u64(val[EK_SRC], NULL, "src", -1, UINT32_MAX, &u, err)) != BT_OK) return st;
    env->src = (actor_addr_t)u;
    if ((st = wire_get_u64(val[EK_DST], NULL, "dst", -1, UINT32_MAX, &u, err)) != BT_OK) return st;
    env->dst = (actor_addr_t)u;
    if ((st = wire_get_u64(val[EK_SEQ], NULL, "seq", -1, UINT64_MAX, &env->seq, err)) != BT_OK) return st;
    if ((st = wire_get_i64(val[EK_STEP], "step", -1, INT64_MAX, &env->step, err)) != BT_OK) return st;
    if ((st = wire_get_i64(val[EK_MB], "mb", -1, INT32_MAX, &s, err)) != BT_OK) return st;
    env->mb = (int32_t)s;

    const msgpack_object *ts = val[EK_TENSORS];
    if (ts->type != MSGPACK_OBJECT_ARRAY)
        return wire_err_set(err, "envelope: tensors is not an array (msgpack type %d)", (int)ts->type);
    uint32_t cap = lim->max_tensors < WIRE_MAX_TENSORS ? lim->max_tensors : WIRE_MAX_TENSORS;
    if (ts->via.array.size > cap)
        return wire_err_set(err, "envelope: %u tensors exceed the limit %u", ts->via.array.size, cap);
    env->ntensors = ts->via.array.size;
    for (uint32_t i = 0; i < env->ntensors; i++)
        if ((st = wire_tensor_read(&ts->via.array.ptr[i], i, lim, &env->tensors[i], err)) != BT_OK) return st;
    if ((st = wire_tensors_check(env, payload_len, lim, err)) != BT_OK) return st;
    *meta = val[EK_META];
    return BT_OK;
}

/* Limits as given, with the hard caps of the fixed-size structs applied. */
static wire_limits_t wire_limits_clamp(const wire_limits_t *lim)
{
    wire_limits_t l = lim ? *lim : wire_limits_default();
    if (l.max_tensors > WIRE_MAX_TENSORS) l.max_tensors = WIRE_MAX_TENSORS;
    if (l.max_dims > TENSOR_MAX_DIMS) l.max_dims = TENSOR_MAX_DIMS;
    if (l.max_name_len > WIRE_NAME_MAX - 1) l.max_name_len = WIRE_NAME_MAX - 1;
    return l;
}

/* The general path: object tree, then typed reading (stages 2 and 3, and
 * stage 1 on failure). Accepts any key order and unknown keys. */
static bt_status_t wire_env_decode_general(const uint8_t *hdr, size_t hdr_len, size_t payload_len,
                                           const wire_limits_t *lim, wire_env_t *env,
                                           const wire_meta_dec_t *md, wire_err_t *err)
{
    bt_status_t st;
    /* A scanned header of n bytes holds at most n objects (each takes a
     * byte at least; a map entry is two), so n + 1 objects always fit.
     * Ordinary envelopes use a per-thread arena: no allocation per frame. */
    size_t need = hdr_len + 1;
    msgpack_object *arena = wire_arena_tls;
    msgpack_object *heap = NULL;
    if (need > WIRE_ARENA_OBJS) {
        heap = malloc(need * sizeof *heap);
        if (!heap) {
            wire_err_set(err, "envelope: out of memory unpacking %zu bytes", hdr_len);
            return BT_ERR_NOMEM;
        }
        arena = heap;
    }
    wire_builder_t b = {.p = hdr, .n = hdr_len, .arena = arena, .cap = need};
    msgpack_object root;
    if (!wire_mp_build(&b, &root, 0) || b.i != hdr_len) {
        /* The scan names what is wrong; it accepts what the builder accepts. */
        st = wire_mp_scan(hdr, hdr_len, err);
        if (st == BT_OK) st = wire_err_set(err, "envelope: msgpack parse error at byte %zu", b.i);
        goto out_arena;
    }
    const msgpack_object *meta = NULL;
    if ((st = wire_env_read(&root, payload_len, lim, env, &meta, err)) != BT_OK) goto out_arena;
    if (md && md->tree) st = md->tree(md->arg, env, meta, err);
out_arena:
    free(heap);
    return st;
}

/* ---- the fast path ---------------------------------------------------------- */

/* dtype from its wire name; -1 when unknown: wire_dtype_lookup's answer
 * (the differential tests compare them), with the names as 32-bit words. */
static int wire_dtype_lookup_fast(const char *s, uint32_t len)
{
    if (len < 2 || len > 4) return -1;
    uint32_t w = 0;
    for (uint32_t i = 0; i < len; i++) {
        if (s[i] == '\0') return -1; /* a NUL would alias the padding */
        w |= (uint32_t)(uint8_t)s[i] << (8 * i);
    }
    for (int i = 0; i < DT_COUNT; i++)
        if (wire_dtype_words[i] == w) return i;
    return -1;
}

/* One tensor descriptor exactly as the encoder writes it. */
static bool wire_tensor_fast(wire_rd_t *r, const wire_limits_t *lim, wire_tensor_desc_t *d)
{
    const char *s;
    uint32_t len, ndim;
    /* five keys, or six with "dev" last */
    bool has_dev = WIRE_RD_LIT(r, "\x86\xa4" "name");
    if ((!has_dev && !WIRE_RD_LIT(r, "\x85\xa4" "name")) || !wire_rd_str(r, &s, &len)) return false;
    if (len == 0 || len > lim->max_name_len) return false;
    for (uint32_t k = 0; k < len; k++)
        if (s[k] == '\0') return false;
    memcpy(d->name, s, len);
    d->name[len] = '\0';
    if (!WIRE_RD_LIT(r, "\xa5" "dtype") || !wire_rd_str(r, &s, &len)) return false;
    int dt = wire_dtype_lookup_fast(s, len);
    if (dt < 0) return false;
    d->dtype = (dtype_t)dt;
    if (!WIRE_RD_LIT(r, "\xa5" "shape") || !wire_rd_array(r, &ndim)) return false;
    if (ndim < 1 || ndim > lim->max_dims) return false;
    d->ndim = (int)ndim;
    for (uint32_t k = 0; k < ndim; k++) {
        uint64_t v;
        if (!wire_rd_uint(r, lim->max_dim, &v)) return false;
        d->shape[k] = (int64_t)v;
    }
    for (int k = (int)ndim; k < TENSOR_MAX_DIMS; k++) d->shape[k] = 1;
    if (!(WIRE_RD_LIT(r, "\xa6" "offset") && wire_rd_uint(r, UINT64_MAX, &d->offset) &&
          WIRE_RD_LIT(r, "\xa6" "nbytes") && wire_rd_uint(r, UINT64_MAX, &d->nbytes)))
        return false;
    d->device = DEVICE_CPU;
    if (!has_dev) return true;
    /* a host device written out is valid, but not what the encoder writes */
    return WIRE_RD_LIT(r, "\xa3" "dev") && wire_rd_str(r, &s, &len) &&
           wire_device_parse(s, len, &d->device) && !device_is_host(d->device);
}

/* A signed envelope field in [-1, max]. */
static inline __attribute__((always_inline)) bool wire_rd_signed(wire_rd_t *r, uint64_t max, int64_t *out)
{
    bool neg;
    uint64_t v;
    if (!wire_rd_int(r, &neg, &v)) return false;
    if (neg ? v != (uint64_t)-1 : v > max) return false;
    *out = (int64_t)v;
    return true;
}

/* The canonical envelope in one pass over its bytes: the keys the encoder
 * writes, in its order, each matched as exact bytes, values read straight
 * into env. True when it accepted (and the meta was decoded), false to defer
 * to the general path. The checks are the general path's (wire_env_read,
 * wire_tensor_read, wire_tensors_check is shared), so what this accepts
 * the general path accepts too, with the same env. */
static bool wire_env_decode_fast(const uint8_t *hdr, size_t hdr_len, size_t payload_len,
                                 const wire_limits_t *lim, wire_env_t *env, const wire_meta_dec_t *md,
                                 bool raw_only)
{
    wire_rd_t r = {hdr, hdr + hdr_len};
    uint64_t u;
    int64_t s;
    uint32_t n;
    /* {"ver": 1, "type": ... */
    if (!WIRE_RD_LIT(&r, "\x89\xa3" "ver" "\x01") || !WIRE_RD_LIT(&r, "\xa4" "type") || !wire_rd_uint(&r, UINT32_MAX, &u)) return false;
    env->ver = WIRE_VERSION;
    env->type = (uint32_t)u;
    if (!WIRE_RD_LIT(&r, "\xa3" "src") || !wire_rd_uint(&r, UINT32_MAX, &u)) return false;
    env->src = (actor_addr_t)u;
    if (!WIRE_RD_LIT(&r, "\xa3" "dst") || !wire_rd_uint(&r, UINT32_MAX, &u)) return false;
    env->dst = (actor_addr_t)u;
    if (!WIRE_RD_LIT(&r, "\xa3" "seq") || !wire_rd_uint(&r, UINT64_MAX, &env->seq)) return false;
    if (!WIRE_RD_LIT(&r, "\xa4" "step") || !wire_rd_signed(&r, INT64_MAX, &env->step)) return false;
    if (!WIRE_RD_LIT(&r, "\xa2" "mb") || !wire_rd_signed(&r, INT32_MAX, &s)) return false;
    env->mb = (int32_t)s;
    if (!WIRE_RD_LIT(&r, "\xa7" "tensors") || !wire_rd_array(&r, &n) || n > lim->max_tensors) return false;
    env->ntensors = n;
    for (uint32_t i = 0; i < n; i++)
        if (!wire_tensor_fast(&r, lim, &env->tensors[i])) return false;
    if (!WIRE_RD_LIT(&r, "\xa4" "meta")) return false;
    if (wire_tensors_check(env, payload_len, lim, NULL) != BT_OK) return false;

    /* The meta value spans the rest of the header. */
    size_t meta_len = (size_t)(r.end - r.p);
    if (md && md->raw && md->raw(md->arg, env, r.p, meta_len)) return true;
    if (raw_only) return false;
    /* Its object tree alone (depth 1, as inside the envelope's map). */
    if (meta_len + 1 > WIRE_ARENA_OBJS) return false;
    wire_builder_t b = {.p = r.p, .n = meta_len, .arena = wire_arena_tls, .cap = meta_len + 1};
    msgpack_object meta;
    if (!wire_mp_build(&b, &meta, 1) || b.i != meta_len) return false;
    if (md && md->tree) {
        wire_err_t err;
        if (md->tree(md->arg, env, &meta, &err) != BT_OK) return false;
    }
    return true;
}

bt_status_t wire_env_decode_ex(const void *hdr, size_t hdr_len, size_t payload_len,
                               const wire_limits_t *lim_in, wire_env_t *env, const wire_meta_dec_t *meta,
                               wire_decode_path_t path, wire_err_t *err)
{
    wire_limits_t lim = wire_limits_clamp(lim_in);
    err->reason[0] = '\0';
    if (hdr_len == 0 || !hdr) {
        if (path == WIRE_DECODE_FAST || path == WIRE_DECODE_FAST_RAW) return BT_ERR_UNSUPPORTED;
        return wire_err_set(err, "envelope: empty header");
    }
    if (hdr_len > lim.max_hdr_bytes) {
        if (path == WIRE_DECODE_FAST || path == WIRE_DECODE_FAST_RAW) return BT_ERR_UNSUPPORTED;
        return wire_err_set(err, "envelope: header of %zu bytes exceeds the limit %zu", hdr_len, lim.max_hdr_bytes);
    }
    if (path != WIRE_DECODE_GENERAL) {
        if (wire_env_decode_fast(hdr, hdr_len, payload_len, &lim, env, meta, path == WIRE_DECODE_FAST_RAW))
            return BT_OK;
        if (path != WIRE_DECODE_AUTO) return BT_ERR_UNSUPPORTED;
    }
    return wire_env_decode_general(hdr, hdr_len, payload_len, &lim, env, meta, err);
}

bt_status_t wire_env_decode(const void *hdr, size_t hdr_len, size_t payload_len,
                            const wire_limits_t *lim, wire_env_t *env,
                            wire_meta_decode_fn meta_fn, void *meta_arg, wire_err_t *err)
{
    wire_meta_dec_t md = {.tree = meta_fn, .arg = meta_arg};
    return wire_env_decode_ex(hdr, hdr_len, payload_len, lim, env, &md, WIRE_DECODE_AUTO, err);
}

/* ---- encoding ------------------------------------------------------------- */

/* The envelope is written straight into the buffer's reserved tail (the
 * wire_out_* writers of wire.h): a msgpack_packer calls its write callback
 * (with a capacity check and a memcpy) for every token, which cost more
 * than the rest of a send. The bytes are the smallest msgpack forms, as
 * msgpack-c's packer writes them. */

/* Upper bounds of the bytes written above: a key <= 8 bytes, an integer <= 9,
 * a name <= 2 + 63, a dtype <= 5, a container header <= 3, a device name
 * <= 1 + DEVICE_STR_MAX. */
#define WIRE_ENC_FIXED_MAX  (3 + EK_COUNT * 8 + 7 * 9 + 3)
#define WIRE_ENC_TENSOR_MAX                                                                        \
    (3 + TK_COUNT * 8 + 65 + 5 + 3 + TENSOR_MAX_DIMS * 9 + 2 * 9 + 1 + DEVICE_STR_MAX)

static bt_status_t wire_env_emit(msgpack_sbuffer *buf, const wire_env_t *env, const size_t *name_len,
                                 const wire_meta_enc_t *meta, wire_err_t *err);

bt_status_t wire_env_encode(msgpack_sbuffer *buf, const wire_env_t *env,
                            wire_meta_encode_fn meta_fn, const void *body, wire_err_t *err)
{
    wire_meta_enc_t me = {.pack = meta_fn, .body = body};
    return wire_env_encode_ex(buf, env, &me, err);
}

bt_status_t wire_env_encode_ex(msgpack_sbuffer *buf, const wire_env_t *env, const wire_meta_enc_t *meta,
                               wire_err_t *err)
{
    wire_err_t local;
    if (!err) err = &local;
    err->reason[0] = '\0';
    if (env->ntensors > WIRE_MAX_TENSORS) {
        wire_err_set(err, "envelope: %u tensors exceed %d", env->ntensors, WIRE_MAX_TENSORS);
        return BT_ERR_INVALID;
    }
    if (env->step < -1 || env->mb < -1) {
        wire_err_set(err, "envelope: step %lld / mb %d below -1", (long long)env->step, (int)env->mb);
        return BT_ERR_INVALID;
    }
    uint64_t payload_len = 0;
    if (env->ntensors) {
        const wire_tensor_desc_t *last = &env->tensors[env->ntensors - 1];
        payload_len = last->offset + last->nbytes;
    }
    wire_limits_t lim = wire_limits_default();
    lim.max_payload = UINT64_MAX;
    size_t name_len[WIRE_MAX_TENSORS];
    for (uint32_t i = 0; i < env->ntensors; i++) {
        size_t len = strnlen(env->tensors[i].name, WIRE_NAME_MAX);
        if (len == 0 || len >= WIRE_NAME_MAX) {
            wire_err_set(err, "envelope: tensor #%u name is empty or longer than %d bytes", i, WIRE_NAME_MAX - 1);
            return BT_ERR_INVALID;
        }
        name_len[i] = len;
    }
    if (wire_tensors_check(env, payload_len, &lim, err) != BT_OK) return BT_ERR_INVALID;
    return wire_env_emit(buf, env, name_len, meta, err);
}

/* Write a validated envelope (name_len[i] = strlen of tensor i's name). */
static bt_status_t wire_env_emit(msgpack_sbuffer *buf, const wire_env_t *env, const size_t *name_len,
                                 const wire_meta_enc_t *meta, wire_err_t *err)
{
    size_t need = WIRE_ENC_FIXED_MAX + (size_t)env->ntensors * WIRE_ENC_TENSOR_MAX;
    if (meta && meta->write) need += WIRE_META_WRITE_MAX;
    if (buf->alloc - buf->size < need) {
        size_t cap = buf->alloc ? buf->alloc : 256;
        while (cap - buf->size < need) cap *= 2;
        char *data = realloc(buf->data, cap);
        if (!data) return BT_ERR_NOMEM;
        buf->data = data;
        buf->alloc = cap;
    }
    wire_out_t o = {.p = (uint8_t *)buf->data + buf->size};
    uint8_t *start = o.p;
    /* Keys as literals written by word stores (the bounds above allot 8
     * bytes to each key, so the 8-byte stores stay inside `need`); the
     * literals are the key tables' entries as encoded. */
    _Static_assert(EK_COUNT == 9 && TK_COUNT == 6 && WIRE_VERSION == 1, "literal map sizes and version");
    WIRE_OUT_LIT(&o, "\x89\xa3" "ver" "\x01");
    WIRE_OUT_LIT(&o, "\xa4" "type");
    wire_out_uint(&o, env->type);
    WIRE_OUT_LIT(&o, "\xa3" "src");
    wire_out_uint(&o, env->src);
    WIRE_OUT_LIT(&o, "\xa3" "dst");
    wire_out_uint(&o, env->dst);
    WIRE_OUT_LIT(&o, "\xa3" "seq");
    wire_out_uint(&o, env->seq);
    WIRE_OUT_LIT(&o, "\xa4" "step");
    wire_out_int(&o, env->step);
    WIRE_OUT_LIT(&o, "\xa2" "mb");
    wire_out_int(&o, env->mb);
    WIRE_OUT_LIT(&o, "\xa7" "tensors");
    wire_out_array(&o, env->ntensors);
    for (uint32_t i = 0; i < env->ntensors; i++) {
        const wire_tensor_desc_t *d = &env->tensors[i];
        bool dev = !device_is_host(d->device);
        if (dev) WIRE_OUT_LIT(&o, "\x86\xa4" "name");
        else WIRE_OUT_LIT(&o, "\x85\xa4" "name");
        wire_out_str(&o, d->name, name_len[i]);
        WIRE_OUT_LIT(&o, "\xa5" "dtype");
        /* the dtype name (validated above) as one word store; the buffer
         * has room for the 4 bytes */
        uint8_t dl = wire_dtype_lens[d->dtype];
        *o.p++ = (uint8_t)(0xa0 | dl);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(o.p, &wire_dtype_words[d->dtype], 4);
#else
        memcpy(o.p, wire_dtype_names[d->dtype], dl);
#endif
        o.p += dl;
        WIRE_OUT_LIT(&o, "\xa5" "shape");
        wire_out_array(&o, (uint32_t)d->ndim);
        for (int k = 0; k < d->ndim; k++) wire_out_uint(&o, (uint64_t)d->shape[k]);
        WIRE_OUT_LIT(&o, "\xa6" "offset");
        wire_out_uint(&o, d->offset);
        WIRE_OUT_LIT(&o, "\xa6" "nbytes");
        wire_out_uint(&o, d->nbytes);
        if (dev) {
            char ds[DEVICE_STR_MAX];
            device_str(d->device, ds);
            WIRE_OUT_LIT(&o, "\xa3" "dev");
            wire_out_str(&o, ds, strlen(ds));
        }
    }
    WIRE_OUT_LIT(&o, "\xa4" "meta");
    size_t meta_len = meta && meta->write ? meta->write(o.p, env, meta->body) : 0;
    assert(meta_len <= WIRE_META_WRITE_MAX);
    o.p += meta_len;
    assert((size_t)(o.p - start) <= need);
    buf->size += (size_t)(o.p - start);
    if (meta_len) return BT_OK;

    msgpack_packer pk;
    msgpack_packer_init(&pk, buf, msgpack_sbuffer_write);
    if (meta && meta->pack) {
        bt_status_t st = meta->pack(&pk, meta->body);
        if (st != BT_OK) {
            wire_err_set(err, "envelope: meta encoder failed: %s", bt_status_str(st));
            return st;
        }
    } else if (msgpack_pack_map(&pk, 0) != 0) {
        return BT_ERR_NOMEM;
    }
    return BT_OK;
}

/* Contiguity of a view: strides (in elements) are the row-major ones. */
static bool wire_tensor_contiguous(const tensor_t *t)
{
    uint64_t expect = 1; /* unsigned: hostile shapes may overflow the product */
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && (uint64_t)t->stride[i] != expect) return false;
        expect *= (uint64_t)t->shape[i];
    }
    return true;
}

/* Padding source for the payload iovec; the transport only reads it. */
static const uint8_t wire_zeros[WIRE_ALIGN];

static bt_status_t wire_layout(wire_env_t *env, const tensor_t *ts, const char *const *names, int n,
                               struct iovec *iov, int *iovcnt, size_t *payload_len, size_t *name_len,
                               wire_err_t *err);

bt_status_t wire_tensors_layout(wire_env_t *env, const tensor_t *ts, const char *const *names,
                                int n, struct iovec *iov, int *iovcnt, size_t *payload_len,
                                wire_err_t *err)
{
    size_t name_len[WIRE_MAX_TENSORS];
    wire_err_t local;
    return wire_layout(env, ts, names, n, iov, iovcnt, payload_len, name_len, err ? err : &local);
}

/* The descriptors laid out by wire_layout pass wire_tensors_check (as the
 * encoder runs it: default limits, no payload limit) when every dim is in
 * range, no size overflows or comes near 2^62, and the names are unique:
 * then offsets and sizes are canonical by construction. False sends the
 * caller to the reference check, which decides and names the reason. */
static bool wire_layout_plainly_valid(const wire_env_t *env)
{
    const uint64_t max_dim = wire_limits_default().max_dim;
    for (uint32_t i = 0; i < env->ntensors; i++) {
        const wire_tensor_desc_t *d = &env->tensors[i];
        uint64_t numel = wire_dtype_size(d->dtype);
        for (int k = 0; k < d->ndim; k++) {
            if (d->shape[k] < 0 || (uint64_t)d->shape[k] > max_dim) return false;
            if (__builtin_mul_overflow(numel, (uint64_t)d->shape[k], &numel)) return false;
        }
        uint64_t end;
        if (numel != d->nbytes || __builtin_add_overflow(d->offset, d->nbytes, &end) || end >= (1ull << 62))
            return false;
        for (uint32_t j = 0; j < i; j++)
            if (!strcmp(env->tensors[j].name, d->name)) return false;
    }
    return true;
}

bt_status_t wire_frame_encode(msgpack_sbuffer *buf, wire_env_t *env, const tensor_t *ts,
                              const char *const *names, int n, struct iovec *iov, int *iovcnt,
                              size_t *payload_len, const wire_meta_enc_t *meta, wire_err_t *err)
{
    wire_err_t local;
    if (!err) err = &local;
    err->reason[0] = '\0';
    size_t name_len[WIRE_MAX_TENSORS];
    bt_status_t st = wire_layout(env, ts, names, n, iov, iovcnt, payload_len, name_len, err);
    if (st != BT_OK) return st;
    if (env->step < -1 || env->mb < -1) {
        wire_err_set(err, "envelope: step %lld / mb %d below -1", (long long)env->step, (int)env->mb);
        return BT_ERR_INVALID;
    }
    if (!wire_layout_plainly_valid(env)) {
        wire_limits_t lim = wire_limits_default();
        lim.max_payload = UINT64_MAX;
        if (wire_tensors_check(env, *payload_len, &lim, err) != BT_OK) return BT_ERR_INVALID;
    }
    return wire_env_emit(buf, env, name_len, meta, err);
}

static bt_status_t wire_layout(wire_env_t *env, const tensor_t *ts, const char *const *names, int n,
                               struct iovec *iov, int *iovcnt, size_t *payload_len, size_t *name_len,
                               wire_err_t *err)
{
    if (n < 0 || n > WIRE_MAX_TENSORS) {
        wire_err_set(err, "envelope: %d tensors (0..%d allowed)", n, WIRE_MAX_TENSORS);
        return BT_ERR_INVALID;
    }
    uint64_t end = 0;
    int nio = 0;
    for (int i = 0; i < n; i++) {
        const tensor_t *t = &ts[i];
        wire_tensor_desc_t *d = &env->tensors[i];
        size_t len = names[i] ? strlen(names[i]) : 0;
        if (len == 0 || len >= WIRE_NAME_MAX) {
            wire_err_set(err, "envelope: tensor #%d name is empty or longer than %d bytes", i, WIRE_NAME_MAX - 1);
            return BT_ERR_INVALID;
        }
        size_t esize = wire_dtype_size(t->dtype);
        if (!esize || t->ndim < 1 || t->ndim > TENSOR_MAX_DIMS || !wire_tensor_contiguous(t)) {
            wire_err_set(err, "envelope: tensor '%s' is not a contiguous 1..%d-d view of a known dtype",
                         names[i], TENSOR_MAX_DIMS);
            return BT_ERR_INVALID;
        }
        memcpy(d->name, names[i], len + 1);
        name_len[i] = len;
        d->dtype = t->dtype;
        d->ndim = t->ndim;
        uint64_t numel = 1;
        for (int k = 0; k < TENSOR_MAX_DIMS; k++) {
            d->shape[k] = k < t->ndim ? t->shape[k] : 1;
            if (k < t->ndim) numel *= (uint64_t)t->shape[k];
        }
        d->nbytes = numel * esize;
        d->device = t->device; /* the view's bytes are host memory; its device is the home */
        d->offset = i == 0 ? 0 : wire_align_up(end);
        if (d->offset > end) {
            iov[nio].iov_base = (void *)wire_zeros;
            iov[nio++].iov_len = (size_t)(d->offset - end);
        }
        if (d->nbytes) {
            iov[nio].iov_base = t->data;
            iov[nio++].iov_len = (size_t)d->nbytes;
        }
        end = d->offset + d->nbytes;
    }
    env->ntensors = (uint32_t)n;
    *iovcnt = nio;
    *payload_len = (size_t)end;
    return BT_OK;
}

tensor_t wire_tensor_view(const wire_env_t *env, uint32_t i, void *payload)
{
    assert(i < env->ntensors);
    const wire_tensor_desc_t *d = &env->tensors[i];
    tensor_t t;
    memset(&t, 0, sizeof t);
    t.dtype = d->dtype;
    t.ndim = d->ndim;
    t.device = d->device; /* the home; the data is the payload's bytes, host memory */
    /* Unsigned: dims of up to max_dim beside a zero dim are a valid (empty)
     * tensor whose stride product overflows int64. */
    uint64_t stride = 1;
    for (int k = TENSOR_MAX_DIMS - 1; k >= 0; k--) {
        t.shape[k] = k < d->ndim ? d->shape[k] : 1;
        t.stride[k] = (int64_t)stride;
        stride *= (uint64_t)t.shape[k];
    }
    t.data = payload ? (uint8_t *)payload + d->offset : NULL;
    return t;
}

bt_status_t wire_tensor_find(const wire_env_t *env, const char *name, void *payload, tensor_t *out)
{
    for (uint32_t i = 0; i < env->ntensors; i++) {
        if (strcmp(env->tensors[i].name, name)) continue;
        *out = wire_tensor_view(env, i, payload);
        return BT_OK;
    }
    return BT_ERR_NOT_FOUND;
}
