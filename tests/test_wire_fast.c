/* The fast envelope decoder and the raw meta codecs against the general
 * (reference) paths:
 *  - every envelope the encoder writes, for every message type with random
 *    field values and extremes (-1 step/mb, 0..16 tensors, 63-byte names,
 *    8 dims, NaNs, integer limits): the fast path accepts it and decodes the
 *    byte-identical env and body the general path decodes; the raw meta
 *    writer writes the bytes the msgpack packer writes;
 *  - mutations of those bytes (bit flips, byte edits, truncation, trailing
 *    bytes, reordered and unknown keys, widened integer encodings, a wrong
 *    payload length, tightened limits): the fast path agrees or defers, and
 *    msg_decode answers what the general path answers (wire_gen_diff_check,
 *    the same property the fuzzer checks). */
#include <msgpack.h>

#include "tests/fuzz/wire_gen.h"
#include "tests/test.h"

/* ---- random messages ------------------------------------------------------ */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static uint64_t rnd_below(uint64_t n) { return n ? rnd() % n : 0; }

/* An unsigned value, often an encoding boundary. */
static uint64_t rnd_u64(void)
{
    static const uint64_t edges[] = {0, 1, 31, 127, 128, 255, 256, 65535, 65536, UINT32_MAX,
                                     (uint64_t)UINT32_MAX + 1, (uint64_t)INT64_MAX, UINT64_MAX};
    return rnd_below(3) ? edges[rnd_below(sizeof edges / sizeof edges[0])] : rnd() >> rnd_below(64);
}

static int64_t rnd_i64(void)
{
    static const int64_t edges[] = {-1, 0, 1, -32, -33, -128, -129, -32768, -32769, INT32_MIN,
                                    (int64_t)INT32_MIN - 1, INT64_MIN, INT64_MAX, 127, 128};
    return rnd_below(3) ? edges[rnd_below(sizeof edges / sizeof edges[0])] : (int64_t)rnd() >> rnd_below(64);
}

static float rnd_f32(void)
{
    static const uint32_t edges[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                     0x7f800001u /* signalling NaN */, 0xffbfffffu, 0x00000001u, 0x3f800000u};
    uint32_t bits = rnd_below(2) ? edges[rnd_below(sizeof edges / sizeof edges[0])] : (uint32_t)rnd();
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static double rnd_f64(void)
{
    static const uint64_t edges[] = {0, 0x8000000000000000ull, 0x7ff0000000000000ull, 0x7ff8000000000000ull,
                                     0x7ff0000000000001ull /* signalling NaN */, 1, 0x3ff0000000000000ull};
    uint64_t bits = rnd_below(2) ? edges[rnd_below(sizeof edges / sizeof edges[0])] : rnd();
    double d;
    memcpy(&d, &bits, 8);
    return d;
}

/* A string of 0..cap-1 bytes (no NUL), often empty or full. */
static void rnd_str(char *dst, size_t cap)
{
    size_t len = rnd_below(3) == 0 ? (rnd_below(2) ? 0 : cap - 1) : rnd_below(cap);
    for (size_t k = 0; k < len; k++) dst[k] = (char)(1 + rnd_below(255));
    dst[len] = '\0';
}

/* A body of `type`; `valid` keeps it inside what the decoders accept. */
static void rnd_body(uint32_t type, msg_body_t *b, bool valid)
{
    memset(b, 0, sizeof *b);
    switch (type) {
    case MSG_PING: case MSG_PONG:
        b->ping.id = rnd_u64();
        b->ping.t_ns = rnd_u64();
        break;
    case MSG_CREDIT:
        b->credit.edge = (uint32_t)rnd_u64();
        b->credit.credits = (uint32_t)rnd_u64();
        if (valid && !b->credit.credits) b->credit.credits = 1;
        break;
    case MSG_HEARTBEAT:
        b->heartbeat.t_ns = rnd_u64();
        b->heartbeat.rank = (uint32_t)rnd_u64();
        b->heartbeat.state = (uint32_t)rnd_u64();
        b->heartbeat.step = rnd_i64();
        if (valid && b->heartbeat.step < -1) b->heartbeat.step = -1;
        break;
    case MSG_STOP:
        b->stop.status = (int32_t)rnd_i64();
        rnd_str(b->stop.why, sizeof b->stop.why);
        break;
    case MSG_ERROR_REPORT:
        b->error_report.status = (int32_t)rnd_i64();
        b->error_report.actor = (actor_addr_t)rnd_u64();
        b->error_report.peer = (uint32_t)rnd_u64();
        rnd_str(b->error_report.where, sizeof b->error_report.where);
        rnd_str(b->error_report.text, sizeof b->error_report.text);
        break;
    case MSG_ACTIVATION:
        b->activation.vstage = (int32_t)rnd_i64();
        b->activation.chunk = (uint32_t)rnd_u64();
        if (valid && b->activation.vstage < 0) b->activation.vstage = 0;
        break;
    case MSG_ACT_GRAD:
        b->act_grad.vstage = (int32_t)rnd_i64();
        b->act_grad.chunk = (uint32_t)rnd_u64();
        b->act_grad.loss_scale = rnd_f32();
        if (valid) {
            if (b->act_grad.vstage < 0) b->act_grad.vstage = 0;
            if (!isfinite(b->act_grad.loss_scale) || b->act_grad.loss_scale <= 0) b->act_grad.loss_scale = 1.0f;
        }
        break;
    case MSG_DATA_BATCH:
        b->data_batch.data_pos = rnd_u64();
        b->data_batch.batch = (uint32_t)rnd_u64();
        b->data_batch.seq_len = (uint32_t)rnd_u64();
        b->data_batch.epoch = (uint32_t)rnd_u64();
        break;
    case MSG_METRICS:
        b->metrics.loss = rnd_f32();
        b->metrics.grad_norm = rnd_f32();
        b->metrics.lr = rnd_f32();
        b->metrics.tokens = rnd_u64();
        b->metrics.t_fwd_ms = rnd_f64();
        b->metrics.t_bwd_ms = rnd_f64();
        b->metrics.t_opt_ms = rnd_f64();
        b->metrics.t_step_ms = rnd_f64();
        break;
    case MSG_CKPT_SHARD: {
        msg_ckpt_shard_t *c = &b->ckpt_shard;
        rnd_str(c->name, sizeof c->name);
        if (valid && !c->name[0]) strcpy(c->name, "w");
        c->ckpt_step = rnd_i64();
        c->shard = (uint32_t)rnd_u64();
        c->ndim = 1 + (uint32_t)rnd_below(TENSOR_MAX_DIMS);
        c->is_optim = (uint32_t)rnd_u64();
        for (uint32_t k = 0; k < c->ndim; k++) {
            c->global_shape[k] = (int64_t)(rnd_u64() >> 1);
            c->start[k] = c->global_shape[k] ? (int64_t)rnd_below((uint64_t)c->global_shape[k]) : 0;
        }
        break;
    }
    case MSG_RELEASE:
        b->release.slot = (uint32_t)rnd_u64();
        b->release.gen = (uint32_t)rnd_u64();
        break;
    case MSG_CKPT_PIECE: {
        msg_ckpt_piece_t *c = &b->ckpt_piece;
        rnd_str(c->name, sizeof c->name);
        c->step = rnd_i64();
        c->index = (uint32_t)rnd_u64();
        c->count = (uint32_t)rnd_u64();
        c->ndim = (uint32_t)rnd_u64();
        int64_t *dims[12] = {&c->glob0, &c->glob1, &c->glob2, &c->glob3, &c->off0, &c->off1,
                             &c->off2, &c->off3, &c->ext0, &c->ext1, &c->ext2, &c->ext3};
        for (int k = 0; k < 12; k++) *dims[k] = rnd_i64();
        c->flat_start = rnd_i64();
        c->flat_len = rnd_i64();
        if (valid) { /* one in-range piece: a 2-D box and a flat range of it */
            if (!c->name[0]) strcpy(c->name, "w");
            c->ndim = 2;
            c->count = 1 + (uint32_t)rnd_below(100);
            c->index = (uint32_t)rnd_below(c->count);
            c->glob0 = 1 + (int64_t)rnd_below(1000);
            c->glob1 = 1 + (int64_t)rnd_below(1000);
            c->glob2 = c->glob3 = c->off2 = c->off3 = c->ext2 = c->ext3 = 0;
            c->off0 = (int64_t)rnd_below((uint64_t)c->glob0);
            c->ext0 = (int64_t)rnd_below((uint64_t)(c->glob0 - c->off0) + 1);
            c->off1 = 0;
            c->ext1 = c->glob1;
            c->flat_start = 0;
            c->flat_len = (int64_t)rnd_below((uint64_t)(c->ext0 * c->ext1) + 1);
        }
        break;
    }
    case MSG_CKPT_FETCH:
        b->ckpt_fetch.req = rnd_u64();
        b->ckpt_fetch.from = (uint32_t)rnd_u64();
        b->ckpt_fetch.phase = (uint32_t)rnd_u64();
        b->ckpt_fetch.step = rnd_i64();
        b->ckpt_fetch.offset = rnd_u64();
        b->ckpt_fetch.length = rnd_u64();
        b->ckpt_fetch.status = (int32_t)rnd_i64();
        rnd_str(b->ckpt_fetch.file, sizeof b->ckpt_fetch.file);
        rnd_str(b->ckpt_fetch.text, sizeof b->ckpt_fetch.text);
        if (valid) {
            if (!b->ckpt_fetch.file[0]) strcpy(b->ckpt_fetch.file, "f");
            b->ckpt_fetch.phase = 1 + (uint32_t)rnd_below(2);
            b->ckpt_fetch.offset >>= 2;
            b->ckpt_fetch.length = rnd_below(CKPT_FETCH_MAX_BYTES + 1);
            if (b->ckpt_fetch.step < 0) b->ckpt_fetch.step = -(b->ckpt_fetch.step + 1);
        }
        break;
    case MSG_CKPT_CTL:
        b->ckpt_ctl.step = rnd_i64();
        b->ckpt_ctl.phase = (uint32_t)rnd_u64();
        b->ckpt_ctl.status = (int32_t)rnd_i64();
        b->ckpt_ctl.rank = (uint32_t)rnd_u64();
        b->ckpt_ctl.count = (uint32_t)rnd_u64();
        rnd_str(b->ckpt_ctl.text, sizeof b->ckpt_ctl.text);
        if (valid) {
            b->ckpt_ctl.phase = CKPT_CTL_BEGIN + (uint32_t)rnd_below(6);
            if (b->ckpt_ctl.step < 0) b->ckpt_ctl.step = -(b->ckpt_ctl.step + 1);
        }
        break;
    case MSG_EXPERT_TOKENS:
    case MSG_EXPERT_DONE:
        b->expert = (msg_expert_t){.call = rnd_u64(), .layer = (int32_t)rnd_i64(),
                                   .phase = (uint32_t)rnd_u64(), .rows = rnd_i64(),
                                   .rows_in = rnd_i64(), .status = (int32_t)rnd_i64()};
        if (valid) {
            b->expert.phase = EXPERT_FWD + (uint32_t)rnd_below(2);
            if (b->expert.layer < 0) b->expert.layer = -(b->expert.layer + 1);
            if (b->expert.rows < 0) b->expert.rows = -(b->expert.rows + 1);
            if (b->expert.rows_in < 0) b->expert.rows_in = -(b->expert.rows_in + 1);
        }
        break;
    case MSG_CP_BLOCK:
        b->cp_block = (msg_cp_block_t){.chunk = (uint32_t)rnd_u64(), .layer = (int32_t)rnd_i64(),
                                       .phase = (uint32_t)rnd_u64(), .ring_step = (uint32_t)rnd_u64(),
                                       .what = (uint32_t)rnd_u64()};
        if (valid) {
            b->cp_block.chunk %= 1024;
            b->cp_block.ring_step %= 1024;
            b->cp_block.phase = CP_BLOCK_FWD + (uint32_t)rnd_below(2);
            b->cp_block.what = CP_BLOCK_K + (uint32_t)rnd_below(4);
            if (b->cp_block.layer < 0) b->cp_block.layer = -(b->cp_block.layer + 1);
        }
        break;
    default:
        break;
    }
}

/* Tensor data is never read by the encoder or the decoder (only lengths
 * travel in the header), so every view points at one small buffer. */
static uint8_t g_data[64];

typedef struct {
    wire_env_t env;
    msg_body_t body;
    tensor_t   ts[WIRE_MAX_TENSORS];
    char       names[WIRE_MAX_TENSORS][WIRE_NAME_MAX];
    const char *name_ptr[WIRE_MAX_TENSORS];
    int        nt;
} rnd_msg_t;

static void rnd_msg(rnd_msg_t *m, uint32_t type, bool valid)
{
    memset(m, 0, sizeof *m);
    m->env.type = type;
    m->env.src = (actor_addr_t)rnd_u64();
    m->env.dst = (actor_addr_t)rnd_u64();
    m->env.seq = rnd_u64();
    m->env.step = rnd_below(3) ? -1 : (int64_t)(rnd_u64() >> 1);
    m->env.mb = rnd_below(3) ? -1 : (int32_t)(rnd_u64() & 0x7fffffff);
    rnd_body(type, &m->body, valid);
    int nt = rnd_below(4) == 0 ? (rnd_below(2) ? 0 : WIRE_MAX_TENSORS) : (int)rnd_below(WIRE_MAX_TENSORS + 1);
    for (int i = 0; i < nt; i++) {
        tensor_t *t = &m->ts[i];
        t->dtype = (dtype_t)rnd_below(DT_COUNT);
        t->ndim = rnd_below(3) ? 1 + (int)rnd_below(TENSOR_MAX_DIMS) : TENSOR_MAX_DIMS;
        /* a few tensors name their device (the descriptor's sixth key) */
        t->device = rnd_below(6) ? DEVICE_CPU : (device_t){DEV_CUDA, (int)rnd_below(16)};
        int zero = -1;
        for (int k = 0; k < t->ndim; k++) {
            /* small dims, or a 0 (no bytes) beside the decoder's largest
             * dim (1 << 40) */
            if (rnd_below(8) == 0) {
                t->shape[k] = 0;
                zero = k;
            } else {
                t->shape[k] = 1 + (int64_t)rnd_below(3);
            }
        }
        if (zero >= 0 && t->ndim > 1 && rnd_below(2)) t->shape[(zero + 1) % t->ndim] = (int64_t)1 << 40;
        uint64_t stride = 1; /* the product may overflow: unsigned */
        for (int k = t->ndim - 1; k >= 0; k--) {
            t->stride[k] = (int64_t)stride;
            stride *= (uint64_t)t->shape[k];
        }
        t->data = g_data;
        /* unique, 1..63 bytes, any byte but NUL */
        size_t len = rnd_below(3) == 0 ? WIRE_NAME_MAX - 1 : 3 + rnd_below(WIRE_NAME_MAX - 3);
        snprintf(m->names[i], sizeof m->names[i], "%02d", i);
        for (size_t k = 2; k < len; k++) m->names[i][k] = (char)(1 + rnd_below(255));
        m->names[i][len] = '\0';
        m->name_ptr[i] = m->names[i];
    }
    m->nt = nt;
}

/* ---- mutations --------------------------------------------------------------- */

/* Repack the msgpack object `o` after shuffling the entries of one of its
 * maps (the root, a tensor descriptor or the meta) or appending an unknown
 * key to it; false when the bytes do not unpack. */
static bool mutate_tree(const uint8_t *in, size_t n, msgpack_sbuffer *out, bool add_key)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    bool ok = msgpack_unpack_next(&u, (const char *)in, n, &off) == MSGPACK_UNPACK_SUCCESS &&
              u.data.type == MSGPACK_OBJECT_MAP;
    msgpack_object_kv *extra = NULL;
    if (ok) {
        msgpack_object *map = &u.data;
        /* pick the root, a tensor map or the meta map */
        uint64_t pick = rnd_below(3);
        for (uint32_t i = 0; i < u.data.via.map.size && pick; i++) {
            msgpack_object_kv *kv = &u.data.via.map.ptr[i];
            if (kv->key.type != MSGPACK_OBJECT_STR) continue;
            if (pick == 1 && kv->key.via.str.size == 7 && !memcmp(kv->key.via.str.ptr, "tensors", 7) &&
                kv->val.type == MSGPACK_OBJECT_ARRAY && kv->val.via.array.size) {
                msgpack_object *t = &kv->val.via.array.ptr[rnd_below(kv->val.via.array.size)];
                if (t->type == MSGPACK_OBJECT_MAP) map = t;
            }
            if (pick == 2 && kv->key.via.str.size == 4 && !memcmp(kv->key.via.str.ptr, "meta", 4) &&
                kv->val.type == MSGPACK_OBJECT_MAP)
                map = &kv->val;
        }
        msgpack_object_map *m = &map->via.map;
        if (add_key) {
            extra = malloc((m->size + 1) * sizeof *extra);
            if (m->size) memcpy(extra, m->ptr, m->size * sizeof *extra);
            uint32_t at = (uint32_t)rnd_below(m->size + 1);
            memmove(extra + at + 1, extra + at, (m->size - at) * sizeof *extra);
            extra[at].key.type = MSGPACK_OBJECT_STR;
            extra[at].key.via.str.ptr = "zz_unknown";
            extra[at].key.via.str.size = 10;
            extra[at].val.type = MSGPACK_OBJECT_POSITIVE_INTEGER;
            extra[at].val.via.u64 = 7;
            m->ptr = extra;
            m->size++;
        } else if (m->size >= 2) {
            uint32_t a = (uint32_t)rnd_below(m->size), b = (uint32_t)rnd_below(m->size);
            msgpack_object_kv t = m->ptr[a];
            m->ptr[a] = m->ptr[b];
            m->ptr[b] = t;
        }
        msgpack_packer pk;
        msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
        ok = msgpack_pack_object(&pk, u.data) == 0;
    }
    free(extra);
    msgpack_unpacked_destroy(&u);
    return ok;
}

/* Re-encode one integer in a wider form (same value): positive fixint ->
 * uint8/16/32/64 or int64, uint8 -> uint16 ... The general path reads every
 * form to the same value; the fast path may take them or defer. */
static size_t mutate_widen(const uint8_t *in, size_t n, uint8_t *out)
{
    for (int tries = 0; tries < 16; tries++) {
        size_t i = rnd_below(n);
        uint8_t t = in[i];
        uint64_t v;
        int from;
        if (t <= 0x7f) { v = t; from = 0; }
        else if (t >= 0xcc && t <= 0xce && i + (1u << (t - 0xcc)) < n) {
            from = 1 << (t - 0xcc);
            v = 0;
            for (int k = 0; k < from; k++) v = v << 8 | in[i + 1 + k];
        } else {
            continue;
        }
        static const uint8_t tags[] = {0xcd, 0xce, 0xcf, 0xd3};
        static const int widths[] = {2, 4, 8, 8};
        int w = (int)rnd_below(4);
        if (widths[w] <= from) continue;
        memcpy(out, in, i);
        size_t o = i;
        out[o++] = tags[w];
        for (int k = widths[w] - 1; k >= 0; k--) out[o++] = (uint8_t)(v >> (8 * k));
        size_t rest = i + 1 + (size_t)from;
        memcpy(out + o, in + rest, n - rest);
        return o + n - rest;
    }
    memcpy(out, in, n);
    return n;
}

/* One random mutation of in[0..n) into out (room for n + 64); returns the
 * new length; *plen may change too. The key edits unpack with msgpack-c,
 * which trusts container counts (a hostile count asks for gigabytes), so
 * they apply only to pristine encoder frames. */
static size_t mutate(const uint8_t *in, size_t n, uint8_t *out, size_t *plen, msgpack_sbuffer *tmp, bool pristine)
{
    static const uint8_t interesting[] = {0x00, 0x01, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1,
                                          0xc2, 0xca, 0xcb, 0xcc, 0xcf, 0xd0, 0xd3, 0xd9, 0xdb, 0xdc, 0xdd,
                                          0xde, 0xdf, 0xe0, 0xff};
    memcpy(out, in, n);
    switch (rnd_below(10)) {
    case 0: /* bit flips */
        for (int k = 0, m = 1 + (int)rnd_below(3); k < m; k++) out[rnd_below(n)] ^= (uint8_t)(1u << rnd_below(8));
        return n;
    case 1: /* a byte set to a msgpack tag or boundary */
        out[rnd_below(n)] = interesting[rnd_below(sizeof interesting)];
        return n;
    case 2: /* truncation */
        return rnd_below(n);
    case 3: { /* trailing bytes */
        size_t k = 1 + rnd_below(8);
        for (size_t i = 0; i < k; i++) out[n + i] = (uint8_t)rnd();
        return n + k;
    }
    case 4: { /* a byte deleted or inserted */
        size_t at = rnd_below(n);
        if (rnd_below(2)) {
            memmove(out + at, out + at + 1, n - at - 1);
            return n - 1;
        }
        memmove(out + at + 1, out + at, n - at);
        out[at] = interesting[rnd_below(sizeof interesting)];
        return n + 1;
    }
    case 5: /* reordered keys */
    case 6: { /* an unknown key */
        if (!pristine) {
            out[rnd_below(n)] ^= 0x01;
            return n;
        }
        msgpack_sbuffer_clear(tmp);
        if (!mutate_tree(in, n, tmp, rnd_below(2) == 0) || tmp->size > n + 64) return n;
        memcpy(out, tmp->data, tmp->size);
        return tmp->size;
    }
    case 7:
        return mutate_widen(in, n, out);
    case 8: /* a payload length that lies */
        *plen = rnd_below(2) ? *plen + 1 + rnd_below(WIRE_ALIGN) : (*plen ? *plen - 1 - rnd_below(*plen) : 1);
        return n;
    default: { /* a random byte */
        out[rnd_below(n)] = (uint8_t)rnd();
        return n;
    }
    }
}

/* Limits tightened at random (or NULL: the defaults). */
static const wire_limits_t *rnd_limits(wire_limits_t *l)
{
    if (rnd_below(4)) return NULL;
    *l = wire_limits_default();
    switch (rnd_below(6)) {
    case 0: l->max_tensors = (uint32_t)rnd_below(WIRE_MAX_TENSORS + 1); break;
    case 1: l->max_name_len = (uint32_t)rnd_below(WIRE_NAME_MAX); break;
    case 2: l->max_dims = (uint32_t)rnd_below(TENSOR_MAX_DIMS + 1); break;
    case 3: l->max_dim = rnd_below(4); break;
    case 4: l->max_payload = rnd_below(4096); break;
    default: l->max_hdr_bytes = rnd_below(4096); break;
    }
    return l;
}

#define MUT_BUF 8192 /* > any header the generator writes (16 tensors of 63-byte names: ~3 KB) */

/* ---- cases ------------------------------------------------------------------ */

/* Every type, random bodies and tensors: the raw meta writer writes the
 * packer's bytes, and the fast path accepts every frame the encoder writes
 * with the general path's env and body (FAST_RAW too, except CKPT_SHARD
 * whose meta always takes the tree); invalid bodies are deferred. */
static void test_wire_fast_encoder_frames(void)
{
    enum { PER_TYPE = 2000 };
    msg_frame_t f;
    msg_frame_init(&f);
    msgpack_sbuffer packed;
    msgpack_sbuffer_init(&packed);
    static rnd_msg_t m;
    int fast = 0, raw = 0, total = 0, invalid = 0;
    for (uint32_t type = 0; type < MSG_TYPE_COUNT; type++) {
        for (int it = 0; it < PER_TYPE; it++) {
            bool valid = it % 8 != 7;
            rnd_msg(&m, type, valid);
            wire_err_t err;
            bt_status_t st = msg_frame_build(&f, &m.env, &m.body, m.ts, m.name_ptr, m.nt, &err);
            if (st != BT_OK) { /* only an unterminated string or bad ckpt ndim refuse */
                CHECK_MSG(false, "type %s: encode failed: %s", msg_type_name(type), err.reason);
                continue;
            }
            msgpack_sbuffer_clear(&packed);
            CHECK(msg_encode_ex(&packed, &f.env, &m.body, false, &err) == BT_OK);
            CHECK_MSG(packed.size == f.hdr.size && !memcmp(packed.data, f.hdr.data, packed.size),
                      "type %s: raw meta writer and packer wrote different bytes", msg_type_name(type));
            bool fast_ok = false;
            const char *bad = wire_gen_diff_check(f.hdr.data, f.hdr.size, f.payload_len, NULL, &fast_ok);
            CHECK_MSG(!bad, "type %s, %d tensors: %s", msg_type_name(type), m.nt, bad);
            wire_gen_dec_t g, r;
            wire_gen_dec_run(f.hdr.data, f.hdr.size, f.payload_len, NULL, WIRE_DECODE_GENERAL, &g);
            wire_gen_dec_run(f.hdr.data, f.hdr.size, f.payload_len, NULL, WIRE_DECODE_FAST_RAW, &r);
            total++;
            if (g.st != BT_OK) {
                invalid++;
                CHECK_MSG(!fast_ok, "type %s: fast accepted a body the general path rejects", msg_type_name(type));
                CHECK_MSG(!valid, "type %s: a valid message rejected: %s", msg_type_name(type), g.err.reason);
                continue;
            }
            CHECK_MSG(fast_ok, "type %s, %d tensors: fast path deferred on an encoder frame", msg_type_name(type),
                      m.nt);
            fast += fast_ok;
            raw += r.st == BT_OK;
            CHECK_MSG((r.st == BT_OK) == (type != MSG_CKPT_SHARD), "type %s: FAST_RAW status %s",
                      msg_type_name(type), bt_status_str(r.st));
            /* and it is the message that was sent */
            CHECK(wire_gen_env_equal(&g.env, &f.env));
            CHECK(msg_body_equal(type, &g.body, &m.body) || type == MSG_ACT_GRAD || type == MSG_METRICS);
        }
    }
    printf("encoder frames: %d, fast accepted %d (raw meta %d), invalid bodies rejected %d\n", total, fast, raw,
           invalid);
    CHECK(fast + invalid == total && invalid > 0);
    msgpack_sbuffer_destroy(&packed);
    msg_frame_fini(&f);
}

/* The one-call frame encoder (msg_frame_build: wire_frame_encode with the
 * raw meta writer) against the reference pair wire_tensors_layout +
 * msg_encode through the msgpack packer, on messages with broken parts too
 * (negative, huge and overflowing dims, duplicate names, strided views,
 * unknown dtypes, step/mb below -1, unterminated strings): same status,
 * and the same bytes, iovec and payload length when accepted. */
static void test_wire_fast_encoder_equivalence(void)
{
    enum { N = 20000 };
    msg_frame_t f;
    msg_frame_init(&f);
    msgpack_sbuffer ref;
    msgpack_sbuffer_init(&ref);
    static rnd_msg_t m;
    static wire_env_t renv;
    struct iovec riov[2 * WIRE_MAX_TENSORS];
    int ok = 0, refused = 0;
    for (int it = 0; it < N; it++) {
        rnd_msg(&m, (uint32_t)rnd_below(MSG_TYPE_COUNT), true);
        if (m.nt > 4 && rnd_below(2)) m.nt = 1 + (int)rnd_below(4);
        switch (rnd_below(10)) {
        case 0: if (m.nt) m.ts[rnd_below((uint64_t)m.nt)].shape[0] = -(int64_t)rnd_below(3) - 1; break;
        case 1: if (m.nt) { /* dims whose product overflows or exceeds the limit */
                    tensor_t *t = &m.ts[rnd_below((uint64_t)m.nt)];
                    for (int k = 0; k < t->ndim; k++) t->shape[k] = ((int64_t)1 << 40) + (int64_t)rnd_below(2) - 1;
                } break;
        case 2: if (m.nt > 1) m.name_ptr[1] = m.name_ptr[0]; break;
        case 3: if (m.nt && m.ts[0].ndim > 1) m.ts[0].stride[0] = (int64_t)((uint64_t)m.ts[0].stride[0] * 2 + 1); break;
        case 4: if (m.nt) m.ts[0].dtype = (dtype_t)DT_COUNT; break;
        case 5: m.env.step = -2; break;
        case 6: m.env.mb = INT32_MIN; break;
        case 7: if (m.env.type == MSG_STOP) memset(m.body.stop.why, 'a', sizeof m.body.stop.why); break;
        default: break;
        }
        wire_err_t err, rerr;
        bt_status_t st = msg_frame_build(&f, &m.env, &m.body, m.ts, m.name_ptr, m.nt, &err);
        memset(&renv, 0, sizeof renv);
        renv.type = m.env.type;
        renv.src = m.env.src;
        renv.dst = m.env.dst;
        renv.seq = m.env.seq;
        renv.step = m.env.step;
        renv.mb = m.env.mb;
        int riovcnt = 0;
        size_t rplen = 0;
        msgpack_sbuffer_clear(&ref);
        bt_status_t rst = wire_tensors_layout(&renv, m.ts, m.name_ptr, m.nt, riov, &riovcnt, &rplen, &rerr);
        if (rst == BT_OK) rst = msg_encode_ex(&ref, &renv, &m.body, false, &rerr);
        CHECK_MSG(st == rst, "type %s: frame build %s (%s), reference %s (%s)", msg_type_name(m.env.type),
                  bt_status_str(st), err.reason, bt_status_str(rst), rerr.reason);
        if (st != BT_OK || rst != BT_OK) {
            refused++;
            CHECK(f.hdr.size == 0);
            continue;
        }
        ok++;
        CHECK(f.hdr.size == ref.size && !memcmp(f.hdr.data, ref.data, ref.size));
        CHECK(f.payload_len == rplen && f.iovcnt == riovcnt);
        for (int i = 0; i < riovcnt && i < f.iovcnt; i++)
            CHECK(f.iov[i].iov_base == riov[i].iov_base && f.iov[i].iov_len == riov[i].iov_len);
    }
    printf("frame encoder vs reference: %d accepted, %d refused by both\n", ok, refused);
    CHECK(ok > N / 3 && refused > N / 10);
    msgpack_sbuffer_destroy(&ref);
    msg_frame_fini(&f);
}

/* Mutations of encoder frames: agree or defer (wire_gen_diff_check). Both
 * outcomes must occur, or the mutations do not reach the fast path. */
static void test_wire_fast_mutations(void)
{
    enum { FRAMES = 5000, MUTS = 12 };
    msg_frame_t f;
    msg_frame_init(&f);
    msgpack_sbuffer tmp;
    msgpack_sbuffer_init(&tmp);
    static rnd_msg_t m;
    int total = 0, fast_ok_n = 0, fails = 0;
    for (int it = 0; it < FRAMES && fails < 10; it++) {
        rnd_msg(&m, (uint32_t)rnd_below(MSG_TYPE_COUNT), true);
        if (rnd_below(2)) m.nt = (int)rnd_below(3); /* small frames mutate more densely */
        wire_err_t err;
        if (msg_frame_build(&f, &m.env, &m.body, m.ts, m.name_ptr, m.nt, &err) != BT_OK) continue;
        REQUIRE(f.hdr.size + 256 < MUT_BUF);
        for (int k = 0; k < MUTS; k++) {
            size_t plen = f.payload_len;
            const uint8_t *src = (const uint8_t *)f.hdr.data;
            size_t n = f.hdr.size;
            /* stack up to three mutations */
            static uint8_t a[MUT_BUF], b[MUT_BUF];
            uint8_t *bufs[2] = {a, b};
            int depth = 1 + (int)rnd_below(3);
            for (int d = 0; d < depth && n + 64 < MUT_BUF - 128; d++) {
                n = mutate(src, n, bufs[d & 1], &plen, &tmp, d == 0);
                src = bufs[d & 1];
                if (!n) break;
            }
            wire_limits_t lim;
            bool fast_ok = false;
            const char *bad = wire_gen_diff_check(src, n, plen, rnd_limits(&lim), &fast_ok);
            total++;
            fast_ok_n += fast_ok;
            if (bad) {
                fails++;
                CHECK_MSG(false, "mutation %d of a %s frame (%zu bytes): %s", k, msg_type_name(m.env.type), n, bad);
            }
        }
    }
    printf("mutated frames: %d, fast path accepted %d, deferred %d\n", total, fast_ok_n, total - fast_ok_n);
    CHECK(fast_ok_n > total / 50 && total - fast_ok_n > total / 4);
    msgpack_sbuffer_destroy(&tmp);
    msg_frame_fini(&f);
}

/* Hand-made non-canonical forms the general path accepts: the fast path
 * must defer on those it does not read (or agree), and msg_decode must
 * still accept them. */
static void test_wire_fast_noncanonical(void)
{
    msg_ping_t ping = {.id = 5, .t_ns = 6};
    wire_env_t env;
    memset(&env, 0, sizeof env);
    env.type = MSG_PING;
    env.src = 1;
    env.dst = 2;
    env.seq = 3;
    env.step = -1;
    env.mb = -1;
    msgpack_sbuffer buf;
    msgpack_sbuffer_init(&buf);
    wire_err_t err;
    REQUIRE(msg_encode(&buf, &env, &ping, &err) == BT_OK);
    /* ver as uint8, a map16 root, the type as int64 */
    static const struct { const char *from; size_t flen; const char *to; size_t tlen; bool fast; } edits[] = {
        {"\x89\xa3ver\x01", 6, "\x89\xa3ver\xcc\x01", 7, false},
        {"\x89\xa3ver\x01", 6, "\xde\x00\x09\xa3ver\x01", 8, false},
        {"\xa4type\x00", 6, "\xa4type\xd3\x00\x00\x00\x00\x00\x00\x00\x00", 14, true},
        {"\xa4step\xff", 6, "\xa4step\xd0\xff", 7, true},
        {"\xa7tensors\x90", 9, "\xa7tensors\xdc\x00\x00", 11, true},
        {"\xa4meta\x82", 6, "\xa4meta\xde\x00\x02", 8, true},
        {"\xa2id\x05", 4, "\xa2id\xcf\x00\x00\x00\x00\x00\x00\x00\x05", 12, true},
        {"\xa2id", 3, "\xd9\x02id", 4, true}, /* the raw meta reader defers, the tree takes it */
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        const char *at = memmem(buf.data, buf.size, edits[i].from, edits[i].flen);
        REQUIRE(at);
        size_t pre = (size_t)(at - buf.data);
        uint8_t out[256];
        memcpy(out, buf.data, pre);
        memcpy(out + pre, edits[i].to, edits[i].tlen);
        memcpy(out + pre + edits[i].tlen, at + edits[i].flen, buf.size - pre - edits[i].flen);
        size_t n = buf.size - edits[i].flen + edits[i].tlen;
        bool fast_ok = false;
        const char *bad = wire_gen_diff_check(out, n, 0, NULL, &fast_ok);
        CHECK_MSG(!bad, "edit %zu: %s", i, bad);
        CHECK_MSG(fast_ok == edits[i].fast, "edit %zu: fast path %s", i, fast_ok ? "accepted" : "deferred");
        wire_env_t got;
        msg_body_t body;
        CHECK_MSG(msg_decode(out, n, 0, NULL, &got, &body, &err) == BT_OK, "edit %zu: %s", i, err.reason);
        CHECK(body.ping.id == 5 && got.seq == 3 && got.step == -1);
    }
    msgpack_sbuffer_destroy(&buf);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_wire_fast_encoder_frames, test_wire_fast_encoder_equivalence, test_wire_fast_mutations,
             test_wire_fast_noncanonical);
}
