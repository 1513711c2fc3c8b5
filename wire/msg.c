/* Typed message bodies (contract in msg.h).
 *
 * Each body is described by a field table (meta key, kind, offset in the
 * struct); one generic encoder/decoder walks it, so the per-type functions
 * only add the checks and fields a table cannot express. Keys are written in
 * table order; the decoder accepts any order, skips unknown keys and rejects
 * duplicates, missing fields, wrong msgpack types and out-of-range values.
 */
#include "wire/msg.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#define MSG_META_MAX_KEYS 64 /* bounds the duplicate-key check (quadratic) */

typedef enum { MF_U32, MF_U64, MF_I32, MF_I64, MF_F32, MF_F64, MF_STR } msg_field_kind_t;

typedef struct {
    const char      *key;
    uint32_t         key_len;
    msg_field_kind_t kind;
    size_t           off;
    size_t           size;  /* MF_STR: capacity of the char array */
    uint64_t         kw[2]; /* the key as encoded (fixstr header + bytes), as two
                             * little-endian words, for keys of <= 15 bytes */
} msg_field_t;

/* Byte j of the encoded key `s` (0: the fixstr header), folded at compile time. */
#define MF_KC_(s, j)                                                                             \
    ((j) == 0 ? (uint64_t)(0xa0 | (sizeof(s) - 1))                                               \
     : (j) <= sizeof(s) - 1 ? (uint64_t)(uint8_t)(s)[(j) >= 1 && (j) <= sizeof(s) - 1 ? (j) - 1 : 0] \
                            : 0)
#define MF_KW_(s, b)                                                                                       \
    (MF_KC_(s, (b) + 0) | MF_KC_(s, (b) + 1) << 8 | MF_KC_(s, (b) + 2) << 16 | MF_KC_(s, (b) + 3) << 24 |   \
     MF_KC_(s, (b) + 4) << 32 | MF_KC_(s, (b) + 5) << 40 | MF_KC_(s, (b) + 6) << 48 | MF_KC_(s, (b) + 7) << 56)
#define MF(type, field, kind)                                                                       \
    {#field, sizeof(#field) - 1, kind, offsetof(type, field), sizeof(((type *)0)->field),           \
     {MF_KW_(#field, 0), MF_KW_(#field, 8)}}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define MSG_KEY_WORDS 1 /* kw[] usable: keys as two word loads/stores */
#else
#define MSG_KEY_WORDS 0
#endif

/* Mask of the first n (1..8) bytes of a little-endian word. */
static inline uint64_t msg_mask(uint32_t n) { return n >= 8 ? ~0ull : (1ull << (8 * n)) - 1; }

/* Whether the encoded key of f is at r->p (and consumed). */
static inline bool msg_key_read(wire_rd_t *r, const msg_field_t *f)
{
    uint32_t kl = f->key_len, el = kl + 1;
    size_t avail = (size_t)(r->end - r->p);
    if (avail < el) return false;
    if (MSG_KEY_WORDS && el <= 8 && avail >= 8) {
        uint64_t w0;
        memcpy(&w0, r->p, 8);
        if ((w0 & msg_mask(el)) != f->kw[0]) return false;
    } else if (MSG_KEY_WORDS && el <= 16 && avail >= 16) {
        uint64_t w0, w1;
        memcpy(&w0, r->p, 8);
        memcpy(&w1, r->p + 8, 8);
        if (w0 != f->kw[0] || (w1 & msg_mask(el - 8)) != f->kw[1]) return false;
    } else {
        /* near the end of the header: byte by byte */
        if (kl >= 32 || r->p[0] != (0xa0 | kl)) return false;
        for (uint32_t j = 0; j < kl; j++)
            if (r->p[1 + j] != (uint8_t)f->key[j]) return false;
    }
    r->p += el;
    return true;
}

/* Write the encoded key of f; out has room for 32 bytes past it. */
static inline void msg_key_write(wire_out_t *o, const msg_field_t *f)
{
    if (MSG_KEY_WORDS && f->key_len < 16) {
        memcpy(o->p, &f->kw[0], 8);
        memcpy(o->p + 8, &f->kw[1], 8);
        o->p += f->key_len + 1;
        return;
    }
    wire_out_str(o, f->key, f->key_len);
}

static int msg_pack_key(msgpack_packer *pk, const char *s)
{
    size_t len = strlen(s);
    return msgpack_pack_str(pk, len) | msgpack_pack_str_body(pk, s, len);
}

static bt_status_t msg_fields_pack(msgpack_packer *pk, const void *body, const msg_field_t *f, int n)
{
    const uint8_t *b = body;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const void *p = b + f[i].off;
        rc |= msg_pack_key(pk, f[i].key);
        switch (f[i].kind) {
        case MF_U32: { uint32_t v; memcpy(&v, p, 4); rc |= msgpack_pack_uint32(pk, v); break; }
        case MF_U64: { uint64_t v; memcpy(&v, p, 8); rc |= msgpack_pack_uint64(pk, v); break; }
        case MF_I32: { int32_t v; memcpy(&v, p, 4); rc |= msgpack_pack_int32(pk, v); break; }
        case MF_I64: { int64_t v; memcpy(&v, p, 8); rc |= msgpack_pack_int64(pk, v); break; }
        case MF_F32: { float v; memcpy(&v, p, 4); rc |= msgpack_pack_float(pk, v); break; }
        case MF_F64: { double v; memcpy(&v, p, 8); rc |= msgpack_pack_double(pk, v); break; }
        case MF_STR: {
            size_t len = strnlen(p, f[i].size);
            if (len == f[i].size) return BT_ERR_INVALID; /* not terminated */
            rc |= msgpack_pack_str(pk, len) | msgpack_pack_str_body(pk, p, len);
            break;
        }
        }
    }
    return rc ? BT_ERR_NOMEM : BT_OK;
}

bt_status_t msg_meta_check(const msgpack_object *meta, const char *what, wire_err_t *err)
{
    if (meta->type != MSGPACK_OBJECT_MAP)
        return wire_err_set(err, "%s: meta is not a map (msgpack type %d)", what, (int)meta->type);
    const msgpack_object_map *m = &meta->via.map;
    if (m->size > MSG_META_MAX_KEYS)
        return wire_err_set(err, "%s: meta has %u keys (at most %d)", what, m->size, MSG_META_MAX_KEYS);
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object *k = &m->ptr[i].key;
        if (k->type != MSGPACK_OBJECT_STR)
            return wire_err_set(err, "%s: meta key #%u is not a string", what, i);
        for (uint32_t j = 0; j < i; j++) {
            const msgpack_object *o = &m->ptr[j].key;
            if (o->via.str.size == k->via.str.size && !memcmp(o->via.str.ptr, k->via.str.ptr, k->via.str.size))
                return wire_err_set(err, "%s: duplicate meta key '%.*s'", what, (int)(k->via.str.size > 40 ? 40 : k->via.str.size),
                                    k->via.str.ptr);
        }
    }
    return BT_OK;
}

const msgpack_object *msg_meta_get(const msgpack_object *map, const char *key)
{
    size_t len = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == len && !memcmp(k->via.str.ptr, key, len))
            return &map->via.map.ptr[i].val;
    }
    return NULL;
}

/* Integer object in [min, max] (as signed 128-bit-safe comparisons). */
static bool msg_int_get(const msgpack_object *o, int64_t min, uint64_t max, bool *neg, uint64_t *mag)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *neg = false;
        *mag = o->via.u64;
        return o->via.u64 <= max;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *neg = true;
        *mag = (uint64_t)o->via.i64;
        return o->via.i64 >= min;
    }
    return false;
}

static bt_status_t msg_fields_read(const msgpack_object *meta, void *body, const msg_field_t *f, int n,
                                   const char *what, wire_err_t *err)
{
    bt_status_t st = msg_meta_check(meta, what, err);
    if (st != BT_OK) return st;
    uint8_t *b = body;
    for (int i = 0; i < n; i++) {
        const msgpack_object *o = msg_meta_get(meta, f[i].key);
        if (!o) return wire_err_set(err, "%s: missing meta key '%s'", what, f[i].key);
        void *p = b + f[i].off;
        bool neg;
        uint64_t mag;
        switch (f[i].kind) {
        case MF_U32:
            if (!msg_int_get(o, 0, UINT32_MAX, &neg, &mag) || neg) goto bad_int;
            { uint32_t v = (uint32_t)mag; memcpy(p, &v, 4); }
            break;
        case MF_U64:
            if (!msg_int_get(o, 0, UINT64_MAX, &neg, &mag) || neg) goto bad_int;
            memcpy(p, &mag, 8);
            break;
        case MF_I32:
            if (!msg_int_get(o, INT32_MIN, INT32_MAX, &neg, &mag)) goto bad_int;
            { int32_t v = (int32_t)mag; memcpy(p, &v, 4); }
            break;
        case MF_I64:
            if (!msg_int_get(o, INT64_MIN, INT64_MAX, &neg, &mag)) goto bad_int;
            { int64_t v = (int64_t)mag; memcpy(p, &v, 8); }
            break;
        case MF_F32:
        case MF_F64: {
            if (o->type != MSGPACK_OBJECT_FLOAT32 && o->type != MSGPACK_OBJECT_FLOAT64)
                return wire_err_set(err, "%s: meta '%s' is not a float (msgpack type %d)", what, f[i].key, (int)o->type);
            if (f[i].kind == MF_F64) {
                memcpy(p, &o->via.f64, 8);
            } else {
                float v = (float)o->via.f64;
                memcpy(p, &v, 4);
            }
            break;
        }
        case MF_STR:
            if (o->type != MSGPACK_OBJECT_STR)
                return wire_err_set(err, "%s: meta '%s' is not a string (msgpack type %d)", what, f[i].key, (int)o->type);
            if (o->via.str.size >= f[i].size)
                return wire_err_set(err, "%s: meta '%s' string of %u bytes exceeds %zu", what, f[i].key,
                                    o->via.str.size, f[i].size - 1);
            if (memchr(o->via.str.ptr, '\0', o->via.str.size))
                return wire_err_set(err, "%s: meta '%s' contains NUL", what, f[i].key);
            memcpy(p, o->via.str.ptr, o->via.str.size);
            ((char *)p)[o->via.str.size] = '\0';
            break;
        }
        continue;
    bad_int:
        return wire_err_set(err, "%s: meta '%s' is not an integer in range (msgpack type %d)", what, f[i].key,
                            (int)o->type);
    }
    return BT_OK;
}

/* The fast twin of msg_fields_read: the meta map exactly as
 * msg_fields_pack writes it (its keys, in table order, as exact bytes; no
 * other key), read straight from the bytes. False defers to
 * msg_fields_read, which names what is wrong. Values are converted the way
 * msg_fields_read converts the object tree's, so the body is identical. */
static bool msg_fields_read_raw(wire_rd_t *r, void *body, const msg_field_t *f, int n)
{
    uint32_t cnt;
    if (!wire_rd_map(r, &cnt) || cnt != (uint32_t)n) return false;
    uint8_t *b = body;
    for (int i = 0; i < n; i++) {
        if (!msg_key_read(r, &f[i])) return false;
        void *p = b + f[i].off;
        bool neg, is32;
        uint64_t v;
        double d;
        switch (f[i].kind) {
        case MF_U32:
            if (!wire_rd_uint(r, UINT32_MAX, &v)) return false;
            { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); }
            break;
        case MF_U64:
            if (!wire_rd_uint(r, UINT64_MAX, &v)) return false;
            memcpy(p, &v, 8);
            break;
        case MF_I32:
            if (!wire_rd_int(r, &neg, &v) || (neg ? (int64_t)v < INT32_MIN : v > INT32_MAX)) return false;
            { int32_t x = (int32_t)v; memcpy(p, &x, 4); }
            break;
        case MF_I64:
            if (!wire_rd_int(r, &neg, &v) || (!neg && v > INT64_MAX)) return false;
            memcpy(p, &v, 8);
            break;
        case MF_F64:
            if (!wire_rd_float(r, &is32, &d)) return false;
            memcpy(p, &d, 8);
            break;
        case MF_F32: {
            if (!wire_rd_float(r, &is32, &d)) return false;
            float x = (float)d;
            /* The tree path widens a float32 to double and narrows it back,
             * which quiets a signalling NaN; the compiler may fold that
             * round trip here, so quiet it explicitly. */
            if (isnan(x)) {
                uint32_t bits;
                memcpy(&bits, &x, 4);
                bits |= 0x00400000u;
                memcpy(&x, &bits, 4);
            }
            memcpy(p, &x, 4);
            break;
        }
        case MF_STR: {
            const char *sp;
            uint32_t len;
            if (!wire_rd_str(r, &sp, &len) || len >= f[i].size || memchr(sp, '\0', len)) return false;
            memcpy(p, sp, len);
            ((char *)p)[len] = '\0';
            break;
        }
        }
    }
    return true;
}

/* Field-wise equality (floats bitwise, so NaN == NaN; strings up to NUL). */
static bool msg_fields_equal(const void *a, const void *b, const msg_field_t *f, int n)
{
    const uint8_t *x = a, *y = b;
    for (int i = 0; i < n; i++) {
        const void *p = x + f[i].off, *q = y + f[i].off;
        if (f[i].kind == MF_STR) {
            if (strncmp(p, q, f[i].size)) return false;
        } else if (memcmp(p, q, f[i].size)) {
            return false;
        }
    }
    return true;
}

/* ---- per-type tables and functions ---------------------------------------- */

static const msg_field_t ping_fields[] = {
    MF(msg_ping_t, id, MF_U64), MF(msg_ping_t, t_ns, MF_U64),
};
static const msg_field_t credit_fields[] = {
    MF(msg_credit_t, edge, MF_U32), MF(msg_credit_t, credits, MF_U32),
};
static const msg_field_t heartbeat_fields[] = {
    MF(msg_heartbeat_t, t_ns, MF_U64), MF(msg_heartbeat_t, rank, MF_U32),
    MF(msg_heartbeat_t, state, MF_U32), MF(msg_heartbeat_t, step, MF_I64),
};
static const msg_field_t stop_fields[] = {
    MF(msg_stop_t, status, MF_I32), MF(msg_stop_t, why, MF_STR),
};
static const msg_field_t error_report_fields[] = {
    MF(msg_error_report_t, status, MF_I32), MF(msg_error_report_t, actor, MF_U32),
    MF(msg_error_report_t, peer, MF_U32), MF(msg_error_report_t, where, MF_STR),
    MF(msg_error_report_t, text, MF_STR),
};
static const msg_field_t activation_fields[] = {
    MF(msg_activation_t, vstage, MF_I32), MF(msg_activation_t, chunk, MF_U32),
};
static const msg_field_t act_grad_fields[] = {
    MF(msg_act_grad_t, vstage, MF_I32), MF(msg_act_grad_t, chunk, MF_U32),
    MF(msg_act_grad_t, loss_scale, MF_F32),
};
static const msg_field_t data_batch_fields[] = {
    MF(msg_data_batch_t, data_pos, MF_U64), MF(msg_data_batch_t, batch, MF_U32),
    MF(msg_data_batch_t, seq_len, MF_U32), MF(msg_data_batch_t, epoch, MF_U32),
};
static const msg_field_t metrics_fields[] = {
    MF(msg_metrics_t, loss, MF_F32), MF(msg_metrics_t, grad_norm, MF_F32),
    MF(msg_metrics_t, lr, MF_F32), MF(msg_metrics_t, tokens, MF_U64),
    MF(msg_metrics_t, t_fwd_ms, MF_F64), MF(msg_metrics_t, t_bwd_ms, MF_F64),
    MF(msg_metrics_t, t_opt_ms, MF_F64), MF(msg_metrics_t, t_step_ms, MF_F64),
};
static const msg_field_t release_fields[] = {
    MF(msg_release_t, slot, MF_U32), MF(msg_release_t, gen, MF_U32),
};
#define PIECE_I64(f) MF(msg_ckpt_piece_t, f, MF_I64)
static const msg_field_t ckpt_piece_fields[] = {
    MF(msg_ckpt_piece_t, name, MF_STR), PIECE_I64(step),
    MF(msg_ckpt_piece_t, index, MF_U32), MF(msg_ckpt_piece_t, count, MF_U32),
    MF(msg_ckpt_piece_t, ndim, MF_U32),
    PIECE_I64(glob0), PIECE_I64(glob1), PIECE_I64(glob2), PIECE_I64(glob3),
    PIECE_I64(off0), PIECE_I64(off1), PIECE_I64(off2), PIECE_I64(off3),
    PIECE_I64(ext0), PIECE_I64(ext1), PIECE_I64(ext2), PIECE_I64(ext3),
    PIECE_I64(flat_start), PIECE_I64(flat_len),
};
static const msg_field_t ckpt_ctl_fields[] = {
    MF(msg_ckpt_ctl_t, step, MF_I64), MF(msg_ckpt_ctl_t, phase, MF_U32),
    MF(msg_ckpt_ctl_t, status, MF_I32), MF(msg_ckpt_ctl_t, rank, MF_U32),
    MF(msg_ckpt_ctl_t, count, MF_U32), MF(msg_ckpt_ctl_t, text, MF_STR),
};
static const msg_field_t ckpt_fetch_fields[] = {
    MF(msg_ckpt_fetch_t, req, MF_U64), MF(msg_ckpt_fetch_t, from, MF_U32),
    MF(msg_ckpt_fetch_t, phase, MF_U32), MF(msg_ckpt_fetch_t, step, MF_I64),
    MF(msg_ckpt_fetch_t, offset, MF_U64), MF(msg_ckpt_fetch_t, length, MF_U64),
    MF(msg_ckpt_fetch_t, status, MF_I32), MF(msg_ckpt_fetch_t, file, MF_STR),
    MF(msg_ckpt_fetch_t, text, MF_STR),
};
static const msg_field_t expert_fields[] = {
    MF(msg_expert_t, call, MF_U64), MF(msg_expert_t, layer, MF_I32),
    MF(msg_expert_t, phase, MF_U32), MF(msg_expert_t, rows, MF_I64),
    MF(msg_expert_t, rows_in, MF_I64), MF(msg_expert_t, status, MF_I32),
};
static const msg_field_t cp_block_fields[] = {
    MF(msg_cp_block_t, chunk, MF_U32), MF(msg_cp_block_t, layer, MF_I32),
    MF(msg_cp_block_t, phase, MF_U32), MF(msg_cp_block_t, ring_step, MF_U32),
    MF(msg_cp_block_t, what, MF_U32),
};
/* global_shape and start are arrays of ndim entries, handled by hand below */
static const msg_field_t ckpt_shard_fields[] = {
    MF(msg_ckpt_shard_t, name, MF_STR), MF(msg_ckpt_shard_t, ckpt_step, MF_I64),
    MF(msg_ckpt_shard_t, shard, MF_U32), MF(msg_ckpt_shard_t, ndim, MF_U32),
    MF(msg_ckpt_shard_t, is_optim, MF_U32),
};

#define NF(t) ((int)(sizeof t / sizeof t[0]))

/* Types whose body is exactly their field table. */
#define MSG_SIMPLE_CODEC(name, fields, extra)                                                 \
    static bt_status_t msg_##name##_encode(msgpack_packer *pk, const void *body)              \
    {                                                                                         \
        if (msgpack_pack_map(pk, (size_t)NF(fields) + (extra)) != 0) return BT_ERR_NOMEM;     \
        return msg_fields_pack(pk, body, fields, NF(fields));                                 \
    }

MSG_SIMPLE_CODEC(ping, ping_fields, 0)
MSG_SIMPLE_CODEC(credit, credit_fields, 0)
MSG_SIMPLE_CODEC(heartbeat, heartbeat_fields, 0)
MSG_SIMPLE_CODEC(stop, stop_fields, 0)
MSG_SIMPLE_CODEC(error_report, error_report_fields, 0)
MSG_SIMPLE_CODEC(activation, activation_fields, 0)
MSG_SIMPLE_CODEC(act_grad, act_grad_fields, 0)
MSG_SIMPLE_CODEC(data_batch, data_batch_fields, 0)
MSG_SIMPLE_CODEC(metrics, metrics_fields, 0)
MSG_SIMPLE_CODEC(release, release_fields, 0)
MSG_SIMPLE_CODEC(ckpt_piece, ckpt_piece_fields, 0)
MSG_SIMPLE_CODEC(ckpt_ctl, ckpt_ctl_fields, 0)
MSG_SIMPLE_CODEC(ckpt_fetch, ckpt_fetch_fields, 0)
MSG_SIMPLE_CODEC(expert, expert_fields, 0)
MSG_SIMPLE_CODEC(cp_block, cp_block_fields, 0)

/* The checks beyond the field table, shared by the tree decoders and the
 * raw ones (err may be NULL). */
typedef bt_status_t (*msg_check_fn)(const void *body, wire_err_t *err);

static bt_status_t msg_credit_check(const void *body, wire_err_t *err)
{
    if (((const msg_credit_t *)body)->credits == 0) return wire_err_set(err, "CREDIT: grant of 0 credits");
    return BT_OK;
}

static bt_status_t msg_heartbeat_check(const void *body, wire_err_t *err)
{
    const msg_heartbeat_t *h = body;
    if (h->step < -1) return wire_err_set(err, "HEARTBEAT: step %lld below -1", (long long)h->step);
    return BT_OK;
}

static bt_status_t msg_activation_check(const void *body, wire_err_t *err)
{
    const msg_activation_t *a = body;
    if (a->vstage < 0) return wire_err_set(err, "ACTIVATION: negative vstage %d", (int)a->vstage);
    return BT_OK;
}

static bt_status_t msg_act_grad_check(const void *body, wire_err_t *err)
{
    const msg_act_grad_t *g = body;
    if (g->vstage < 0) return wire_err_set(err, "ACT_GRAD: negative vstage %d", (int)g->vstage);
    if (!isfinite(g->loss_scale) || g->loss_scale <= 0)
        return wire_err_set(err, "ACT_GRAD: loss_scale %g is not a positive finite number", (double)g->loss_scale);
    return BT_OK;
}

/* A piece's box lies inside its tensor and its flat range inside the box;
 * the dims past ndim are zero (the checkpoint writer checks the rest). */
static bt_status_t msg_ckpt_piece_check(const void *body, wire_err_t *err)
{
    const msg_ckpt_piece_t *p = body;
    if (p->name[0] == 0) return wire_err_set(err, "CKPT_PIECE: empty tensor name");
    if (p->ndim < 1 || p->ndim > 4) return wire_err_set(err, "CKPT_PIECE: ndim %u (1..4)", p->ndim);
    if (p->count == 0 || p->index >= p->count)
        return wire_err_set(err, "CKPT_PIECE: piece %u of %u", p->index, p->count);
    const int64_t g[4] = {p->glob0, p->glob1, p->glob2, p->glob3};
    const int64_t o[4] = {p->off0, p->off1, p->off2, p->off3};
    const int64_t e[4] = {p->ext0, p->ext1, p->ext2, p->ext3};
    int64_t box = 1;
    for (uint32_t d = 0; d < 4; d++) {
        bool used = d < p->ndim;
        if (!used && (g[d] || o[d] || e[d]))
            return wire_err_set(err, "CKPT_PIECE: %s: dim %u set past ndim %u", p->name, d, p->ndim);
        if (used && (g[d] < 0 || g[d] > ((int64_t)1 << 40) || o[d] < 0 || e[d] < 0 || o[d] > g[d] ||
                     e[d] > g[d] - o[d]))
            return wire_err_set(err, "CKPT_PIECE: %s: dim %u: [%lld, +%lld) outside %lld", p->name, d,
                                (long long)o[d], (long long)e[d], (long long)g[d]);
        if (used) box = e[d] && box > ((int64_t)1 << 50) / e[d] ? -1 : box * e[d];
        if (box < 0) return wire_err_set(err, "CKPT_PIECE: %s: box too large", p->name);
    }
    if (p->flat_len < -1 || (p->flat_len >= 0 && (p->flat_start < 0 || p->flat_start > box ||
                                                  p->flat_len > box - p->flat_start)))
        return wire_err_set(err, "CKPT_PIECE: %s: flat range [%lld, +%lld) outside the box of %lld",
                            p->name, (long long)p->flat_start, (long long)p->flat_len, (long long)box);
    return BT_OK;
}

static bt_status_t msg_ckpt_ctl_check(const void *body, wire_err_t *err)
{
    const msg_ckpt_ctl_t *c = body;
    if (c->phase < CKPT_CTL_BEGIN || c->phase > CKPT_CTL_UP)
        return wire_err_set(err, "CKPT_CTL: unknown phase %u", c->phase);
    if (c->step < 0) return wire_err_set(err, "CKPT_CTL: step %lld", (long long)c->step);
    return BT_OK;
}

static bt_status_t msg_ckpt_fetch_check(const void *body, wire_err_t *err)
{
    const msg_ckpt_fetch_t *f = body;
    if (f->phase != CKPT_FETCH_REQUEST && f->phase != CKPT_FETCH_REPLY)
        return wire_err_set(err, "CKPT_FETCH: unknown phase %u", f->phase);
    if (f->file[0] == 0) return wire_err_set(err, "CKPT_FETCH: empty file name");
    if (f->length > CKPT_FETCH_MAX_BYTES || f->offset > (UINT64_MAX >> 1))
        return wire_err_set(err, "CKPT_FETCH: %llu bytes at %llu (at most %u per request)",
                            (unsigned long long)f->length, (unsigned long long)f->offset,
                            CKPT_FETCH_MAX_BYTES);
    if (f->step < 0) return wire_err_set(err, "CKPT_FETCH: step %lld", (long long)f->step);
    return BT_OK;
}

static bt_status_t msg_expert_check(const void *body, wire_err_t *err)
{
    const msg_expert_t *x = body;
    if (x->phase != EXPERT_FWD && x->phase != EXPERT_BWD)
        return wire_err_set(err, "EXPERT: unknown phase %u", x->phase);
    if (x->layer < 0 || x->rows < 0 || x->rows_in < 0)
        return wire_err_set(err, "EXPERT: layer %d, rows %lld, rows_in %lld (none may be negative)",
                            (int)x->layer, (long long)x->rows, (long long)x->rows_in);
    return BT_OK;
}

static bt_status_t msg_cp_block_check(const void *body, wire_err_t *err)
{
    const msg_cp_block_t *b = body;
    if (b->what < CP_BLOCK_K || b->what > CP_BLOCK_DV)
        return wire_err_set(err, "CP_BLOCK: unknown tensor %u", b->what);
    if (b->phase != CP_BLOCK_FWD && b->phase != CP_BLOCK_BWD)
        return wire_err_set(err, "CP_BLOCK: unknown phase %u", b->phase);
    if (b->layer < 0 || b->ring_step >= 1024 || b->chunk >= 1024)
        return wire_err_set(err, "CP_BLOCK: layer %d, ring step %u, chunk %u out of range",
                            (int)b->layer, b->ring_step, b->chunk);
    return BT_OK;
}

/* Types whose body is exactly their field table (+ an optional check). */
#define MSG_TABLE_DECODE(name, fields, NAME, check)                                            \
    static bt_status_t msg_##name##_decode(const msgpack_object *meta, void *body, wire_err_t *err) \
    {                                                                                           \
        bt_status_t st = msg_fields_read(meta, body, fields, NF(fields), NAME, err);            \
        msg_check_fn chk = check;                                                               \
        if (st == BT_OK && chk) st = chk(body, err);                                            \
        return st;                                                                              \
    }

MSG_TABLE_DECODE(ping, ping_fields, "PING", NULL)
#define msg_pong_encode msg_ping_encode
MSG_TABLE_DECODE(pong, ping_fields, "PONG", NULL)
MSG_TABLE_DECODE(credit, credit_fields, "CREDIT", msg_credit_check)
MSG_TABLE_DECODE(heartbeat, heartbeat_fields, "HEARTBEAT", msg_heartbeat_check)
MSG_TABLE_DECODE(stop, stop_fields, "STOP", NULL)
MSG_TABLE_DECODE(error_report, error_report_fields, "ERROR_REPORT", NULL)
MSG_TABLE_DECODE(activation, activation_fields, "ACTIVATION", msg_activation_check)
MSG_TABLE_DECODE(act_grad, act_grad_fields, "ACT_GRAD", msg_act_grad_check)
MSG_TABLE_DECODE(data_batch, data_batch_fields, "DATA_BATCH", NULL)
MSG_TABLE_DECODE(metrics, metrics_fields, "METRICS", NULL)
MSG_TABLE_DECODE(release, release_fields, "RELEASE", NULL)
MSG_TABLE_DECODE(ckpt_piece, ckpt_piece_fields, "CKPT_PIECE", msg_ckpt_piece_check)
MSG_TABLE_DECODE(ckpt_ctl, ckpt_ctl_fields, "CKPT_CTL", msg_ckpt_ctl_check)
MSG_TABLE_DECODE(ckpt_fetch, ckpt_fetch_fields, "CKPT_FETCH", msg_ckpt_fetch_check)
MSG_TABLE_DECODE(expert_tokens, expert_fields, "EXPERT_TOKENS", msg_expert_check)
MSG_TABLE_DECODE(expert_done, expert_fields, "EXPERT_DONE", msg_expert_check)
MSG_TABLE_DECODE(cp_block, cp_block_fields, "CP_BLOCK", msg_cp_block_check)
#define msg_expert_tokens_encode msg_expert_encode
#define msg_expert_done_encode msg_expert_encode

static bt_status_t msg_ckpt_shard_encode(msgpack_packer *pk, const void *body)
{
    const msg_ckpt_shard_t *c = body;
    if (c->ndim < 1 || c->ndim > TENSOR_MAX_DIMS) return BT_ERR_INVALID;
    int rc = msgpack_pack_map(pk, (size_t)NF(ckpt_shard_fields) + 2);
    if (rc) return BT_ERR_NOMEM;
    bt_status_t st = msg_fields_pack(pk, body, ckpt_shard_fields, NF(ckpt_shard_fields));
    if (st != BT_OK) return st;
    rc |= msg_pack_key(pk, "global_shape") | msgpack_pack_array(pk, c->ndim);
    for (uint32_t i = 0; i < c->ndim; i++) rc |= msgpack_pack_int64(pk, c->global_shape[i]);
    rc |= msg_pack_key(pk, "start") | msgpack_pack_array(pk, c->ndim);
    for (uint32_t i = 0; i < c->ndim; i++) rc |= msgpack_pack_int64(pk, c->start[i]);
    return rc ? BT_ERR_NOMEM : BT_OK;
}

static bt_status_t msg_ckpt_dims_read(const msgpack_object *meta, const char *key, uint32_t ndim,
                                      int64_t *out, wire_err_t *err)
{
    const msgpack_object *a = msg_meta_get(meta, key);
    if (!a) return wire_err_set(err, "CKPT_SHARD: missing meta key '%s'", key);
    if (a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size != ndim)
        return wire_err_set(err, "CKPT_SHARD: '%s' is not an array of ndim=%u integers", key, ndim);
    for (uint32_t i = 0; i < ndim; i++) {
        const msgpack_object *o = &a->via.array.ptr[i];
        if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > (uint64_t)INT64_MAX)
            return wire_err_set(err, "CKPT_SHARD: '%s'[%u] is not a non-negative integer", key, i);
        out[i] = (int64_t)o->via.u64;
    }
    for (uint32_t i = ndim; i < TENSOR_MAX_DIMS; i++) out[i] = 0;
    return BT_OK;
}

static bt_status_t msg_ckpt_shard_decode(const msgpack_object *meta, void *body, wire_err_t *err)
{
    msg_ckpt_shard_t *c = body;
    bt_status_t st = msg_fields_read(meta, body, ckpt_shard_fields, NF(ckpt_shard_fields), "CKPT_SHARD", err);
    if (st != BT_OK) return st;
    if (c->ndim < 1 || c->ndim > TENSOR_MAX_DIMS)
        return wire_err_set(err, "CKPT_SHARD: ndim %u (1..%d allowed)", c->ndim, TENSOR_MAX_DIMS);
    if (c->name[0] == '\0') return wire_err_set(err, "CKPT_SHARD: empty parameter name");
    if ((st = msg_ckpt_dims_read(meta, "global_shape", c->ndim, c->global_shape, err)) != BT_OK) return st;
    if ((st = msg_ckpt_dims_read(meta, "start", c->ndim, c->start, err)) != BT_OK) return st;
    for (uint32_t i = 0; i < c->ndim; i++)
        if (c->start[i] > c->global_shape[i])
            return wire_err_set(err, "CKPT_SHARD: '%s' start[%u]=%lld beyond global dim %lld", c->name, i,
                                (long long)c->start[i], (long long)c->global_shape[i]);
    return BT_OK;
}

#define MSG_INFO(NAME, name, type) \
    [MSG_##NAME] = {#NAME, msg_##name##_encode, msg_##name##_decode, sizeof(type)}

const msg_type_info_t msg_types[MSG_TYPE_COUNT] = {
    MSG_INFO(PING, ping, msg_ping_t),
    MSG_INFO(PONG, pong, msg_pong_t),
    MSG_INFO(CREDIT, credit, msg_credit_t),
    MSG_INFO(HEARTBEAT, heartbeat, msg_heartbeat_t),
    MSG_INFO(STOP, stop, msg_stop_t),
    MSG_INFO(ERROR_REPORT, error_report, msg_error_report_t),
    MSG_INFO(ACTIVATION, activation, msg_activation_t),
    MSG_INFO(ACT_GRAD, act_grad, msg_act_grad_t),
    MSG_INFO(DATA_BATCH, data_batch, msg_data_batch_t),
    MSG_INFO(METRICS, metrics, msg_metrics_t),
    MSG_INFO(CKPT_SHARD, ckpt_shard, msg_ckpt_shard_t),
    MSG_INFO(RELEASE, release, msg_release_t),
    MSG_INFO(CKPT_PIECE, ckpt_piece, msg_ckpt_piece_t),
    MSG_INFO(CKPT_CTL, ckpt_ctl, msg_ckpt_ctl_t),
    MSG_INFO(CKPT_FETCH, ckpt_fetch, msg_ckpt_fetch_t),
    MSG_INFO(EXPERT_TOKENS, expert_tokens, msg_expert_t),
    MSG_INFO(EXPERT_DONE, expert_done, msg_expert_t),
    MSG_INFO(CP_BLOCK, cp_block, msg_cp_block_t),
};
_Static_assert(sizeof msg_types / sizeof msg_types[0] == MSG_TYPE_COUNT, "one msg_types entry per msg_type_t");

/* Field tables by type, for msg_body_equal and the raw codecs. `simple`:
 * the body is exactly the table (+ check), so the raw codecs handle it;
 * CKPT_SHARD has two arrays besides and always takes the msgpack path. */
typedef struct {
    const msg_field_t *f;
    int                n;
    bool               simple;
    msg_check_fn       check;
} msg_field_table_t;
static const msg_field_table_t msg_field_tables[MSG_TYPE_COUNT] = {
    [MSG_PING] = {ping_fields, NF(ping_fields), true, NULL},
    [MSG_PONG] = {ping_fields, NF(ping_fields), true, NULL},
    [MSG_CREDIT] = {credit_fields, NF(credit_fields), true, msg_credit_check},
    [MSG_HEARTBEAT] = {heartbeat_fields, NF(heartbeat_fields), true, msg_heartbeat_check},
    [MSG_STOP] = {stop_fields, NF(stop_fields), true, NULL},
    [MSG_ERROR_REPORT] = {error_report_fields, NF(error_report_fields), true, NULL},
    [MSG_ACTIVATION] = {activation_fields, NF(activation_fields), true, msg_activation_check},
    [MSG_ACT_GRAD] = {act_grad_fields, NF(act_grad_fields), true, msg_act_grad_check},
    [MSG_DATA_BATCH] = {data_batch_fields, NF(data_batch_fields), true, NULL},
    [MSG_METRICS] = {metrics_fields, NF(metrics_fields), true, NULL},
    [MSG_CKPT_SHARD] = {ckpt_shard_fields, NF(ckpt_shard_fields), false, NULL},
    [MSG_RELEASE] = {release_fields, NF(release_fields), true, NULL},
    [MSG_CKPT_PIECE] = {ckpt_piece_fields, NF(ckpt_piece_fields), true, msg_ckpt_piece_check},
    [MSG_CKPT_CTL] = {ckpt_ctl_fields, NF(ckpt_ctl_fields), true, msg_ckpt_ctl_check},
    [MSG_CKPT_FETCH] = {ckpt_fetch_fields, NF(ckpt_fetch_fields), true, msg_ckpt_fetch_check},
    [MSG_EXPERT_TOKENS] = {expert_fields, NF(expert_fields), true, msg_expert_check},
    [MSG_EXPERT_DONE] = {expert_fields, NF(expert_fields), true, msg_expert_check},
    [MSG_CP_BLOCK] = {cp_block_fields, NF(cp_block_fields), true, msg_cp_block_check},
};
_Static_assert(sizeof msg_field_tables / sizeof msg_field_tables[0] == MSG_TYPE_COUNT, "field tables");

bool msg_body_equal(uint32_t type, const void *a, const void *b)
{
    if (type >= MSG_TYPE_COUNT) return false;
    const msg_field_table_t *t = &msg_field_tables[type];
    if (!msg_fields_equal(a, b, t->f, t->n)) return false;
    if (type == MSG_CKPT_SHARD) {
        const msg_ckpt_shard_t *x = a, *y = b;
        for (uint32_t i = 0; i < x->ndim && i < TENSOR_MAX_DIMS; i++)
            if (x->global_shape[i] != y->global_shape[i] || x->start[i] != y->start[i]) return false;
    }
    return true;
}

const char *msg_type_name(uint32_t type)
{
    return type < MSG_TYPE_COUNT ? msg_types[type].name : "?";
}

/* The raw twin of the table-driven encoders (wire_meta_write_fn): the bytes
 * msg_fields_pack writes through a msgpack_packer (smallest forms, keys in
 * table order), without a callback per token. A field's key is <= 31 bytes
 * and its value <= its C size + 5 bytes (strings: length + 3), so a body
 * takes at most 3 + 37 * fields + sizeof(body) bytes. */
#define MSG_META_WRITE_FIELDS 8
_Static_assert(3 + 37 * MSG_META_WRITE_FIELDS + sizeof(msg_body_t) <= WIRE_META_WRITE_MAX, "meta bound");

static size_t msg_meta_write(uint8_t *out, const wire_env_t *env, const void *body)
{
    if (env->type >= MSG_TYPE_COUNT) return 0;
    const msg_field_table_t *t = &msg_field_tables[env->type];
    if (!t->simple || t->n > MSG_META_WRITE_FIELDS) return 0;
    const uint8_t *b = body;
    wire_out_t o = {out};
    wire_out_map(&o, (uint32_t)t->n);
    for (int i = 0; i < t->n; i++) {
        const msg_field_t *f = &t->f[i];
        const void *p = b + f->off;
        if (f->key_len >= 32) return 0;
        msg_key_write(&o, f);
        switch (f->kind) {
        case MF_U32: { uint32_t v; memcpy(&v, p, 4); wire_out_uint(&o, v); break; }
        case MF_U64: { uint64_t v; memcpy(&v, p, 8); wire_out_uint(&o, v); break; }
        case MF_I32: { int32_t v; memcpy(&v, p, 4); wire_out_int(&o, v); break; }
        case MF_I64: { int64_t v; memcpy(&v, p, 8); wire_out_int(&o, v); break; }
        case MF_F32: { float v; memcpy(&v, p, 4); wire_out_f32(&o, v); break; }
        case MF_F64: { double v; memcpy(&v, p, 8); wire_out_f64(&o, v); break; }
        case MF_STR: {
            size_t len = strnlen(p, f->size);
            if (len == f->size) return 0; /* not terminated: the packer path refuses it */
            wire_out_str(&o, p, len);
            break;
        }
        }
    }
    return (size_t)(o.p - out);
}

bt_status_t msg_encode_ex(msgpack_sbuffer *buf, const wire_env_t *env, const void *body, bool raw,
                          wire_err_t *err)
{
    if (env->type >= MSG_TYPE_COUNT) {
        wire_err_set(err, "msg: unknown type %u", env->type);
        return BT_ERR_INVALID;
    }
    wire_meta_enc_t me = {.pack = msg_types[env->type].encode, .write = raw ? msg_meta_write : NULL, .body = body};
    return wire_env_encode_ex(buf, env, &me, err);
}

bt_status_t msg_encode(msgpack_sbuffer *buf, const wire_env_t *env, const void *body, wire_err_t *err)
{
    return msg_encode_ex(buf, env, body, true, err);
}

static bt_status_t msg_meta_decode(void *arg, const wire_env_t *env, const msgpack_object *meta, wire_err_t *err)
{
    if (env->type >= MSG_TYPE_COUNT) return wire_err_set(err, "envelope: unknown message type %u", env->type);
    memset(arg, 0, msg_types[env->type].size);
    return msg_types[env->type].decode(meta, arg, err);
}

/* The raw twin of msg_meta_decode for the simple types (wire_meta_raw_fn). */
static bool msg_meta_decode_raw(void *arg, const wire_env_t *env, const uint8_t *meta, size_t len)
{
    if (env->type >= MSG_TYPE_COUNT) return false;
    const msg_field_table_t *t = &msg_field_tables[env->type];
    if (!t->simple) return false;
    memset(arg, 0, msg_types[env->type].size);
    wire_rd_t r = {meta, meta + len};
    if (!msg_fields_read_raw(&r, arg, t->f, t->n) || r.p != r.end) return false;
    return !t->check || t->check(arg, NULL) == BT_OK;
}

bt_status_t msg_decode_ex(const void *hdr, size_t hdr_len, size_t payload_len, const wire_limits_t *lim,
                          wire_env_t *env, msg_body_t *body, wire_decode_path_t path, wire_err_t *err)
{
    wire_meta_dec_t md = {.tree = msg_meta_decode, .raw = msg_meta_decode_raw, .arg = body};
    return wire_env_decode_ex(hdr, hdr_len, payload_len, lim, env, &md, path, err);
}

bt_status_t msg_decode(const void *hdr, size_t hdr_len, size_t payload_len, const wire_limits_t *lim,
                       wire_env_t *env, msg_body_t *body, wire_err_t *err)
{
    return msg_decode_ex(hdr, hdr_len, payload_len, lim, env, body, WIRE_DECODE_AUTO, err);
}

void msg_frame_init(msg_frame_t *f)
{
    memset(f, 0, sizeof *f);
    msgpack_sbuffer_init(&f->hdr);
}

void msg_frame_fini(msg_frame_t *f)
{
    msgpack_sbuffer_destroy(&f->hdr);
}

bt_status_t msg_frame_build(msg_frame_t *f, const wire_env_t *env, const void *body, const tensor_t *ts,
                            const char *const *names, int n, wire_err_t *err)
{
    msgpack_sbuffer_clear(&f->hdr);
    /* the scalar fields only: the descriptors are filled by the layout */
    f->env.ver = WIRE_VERSION;
    f->env.type = env->type;
    f->env.src = env->src;
    f->env.dst = env->dst;
    f->env.seq = env->seq;
    f->env.step = env->step;
    f->env.mb = env->mb;
    f->iovcnt = 0;
    f->payload_len = 0;
    if (env->type >= MSG_TYPE_COUNT) {
        wire_err_set(err, "msg: unknown type %u", env->type);
        return BT_ERR_INVALID;
    }
    wire_meta_enc_t me = {.pack = msg_types[env->type].encode, .write = msg_meta_write, .body = body};
    bt_status_t st = wire_frame_encode(&f->hdr, &f->env, ts, names, n, f->iov, &f->iovcnt, &f->payload_len, &me, err);
    if (st != BT_OK) msgpack_sbuffer_clear(&f->hdr);
    return st;
}
