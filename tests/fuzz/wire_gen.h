/* Shared by tests/fuzz/fuzz_wire.c and tests/test_wire.c: the fuzz input
 * format and the round-trip properties checked on every input.
 *
 * Fuzz input: [u32 little-endian payload_len][envelope header bytes].
 * The same bytes also seed a random message (type, envelope fields, body,
 * up to 3 tensors) for the property decode(encode(x)) == x.
 */
#ifndef BT_TESTS_FUZZ_WIRE_GEN_H
#define BT_TESTS_FUZZ_WIRE_GEN_H

#include <math.h>
#include <string.h>

#include "wire/msg.h"

/* Little byte reader that returns zeros past the end. */
typedef struct { const uint8_t *p; size_t n, i; } wire_gen_src_t;

static inline void wire_gen_take(wire_gen_src_t *s, void *out, size_t len)
{
    uint8_t *o = out;
    for (size_t k = 0; k < len; k++) o[k] = s->i < s->n ? s->p[s->i++] : 0;
}

static inline uint64_t wire_gen_u64(wire_gen_src_t *s)
{
    uint64_t v;
    wire_gen_take(s, &v, sizeof v);
    return v;
}

static inline void wire_gen_str(wire_gen_src_t *s, char *dst, size_t cap)
{
    size_t len = (size_t)(wire_gen_u64(s) % cap); /* < cap: room for NUL */
    for (size_t k = 0; k < len; k++) {
        uint8_t c = 0;
        wire_gen_take(s, &c, 1);
        dst[k] = (char)(c ? c : 'z');
    }
    dst[len] = '\0';
}

static inline float wire_gen_f32(wire_gen_src_t *s)
{
    float f;
    wire_gen_take(s, &f, sizeof f);
    return isnan(f) ? NAN : f; /* float->double->float quiets signalling NaNs */
}

/* A valid message built from the bytes: env (with tensors laid out over a
 * caller buffer `data` of cap bytes, filled from the input), type, body. */
static inline void wire_gen_message(const uint8_t *in, size_t n, wire_env_t *env, msg_body_t *body,
                                    tensor_t *ts, const char **names, char name_buf[][WIRE_NAME_MAX],
                                    int *nt, uint8_t *data, size_t cap)
{
    wire_gen_src_t s = {in, n, 0};
    memset(env, 0, sizeof *env);
    memset(body, 0, sizeof *body);
    env->type = (uint32_t)(wire_gen_u64(&s) % MSG_TYPE_COUNT);
    env->src = (actor_addr_t)wire_gen_u64(&s);
    env->dst = (actor_addr_t)wire_gen_u64(&s);
    env->seq = wire_gen_u64(&s);
    env->step = (int64_t)(wire_gen_u64(&s) >> 1) - 1;
    env->mb = (int32_t)(wire_gen_u64(&s) & 0x7fffffff) - 1;
    if (env->step < -1) env->step = -1;
    if (env->mb < -1) env->mb = -1;
    switch (env->type) {
    case MSG_PING: case MSG_PONG:
        body->ping.id = wire_gen_u64(&s);
        body->ping.t_ns = wire_gen_u64(&s);
        break;
    case MSG_CREDIT:
        body->credit.edge = (uint32_t)wire_gen_u64(&s);
        body->credit.credits = (uint32_t)wire_gen_u64(&s) | 1;
        break;
    case MSG_HEARTBEAT:
        body->heartbeat.t_ns = wire_gen_u64(&s);
        body->heartbeat.rank = (uint32_t)wire_gen_u64(&s);
        body->heartbeat.state = (uint32_t)wire_gen_u64(&s);
        body->heartbeat.step = (int64_t)(wire_gen_u64(&s) >> 1) - 1;
        break;
    case MSG_STOP:
        body->stop.status = (int32_t)wire_gen_u64(&s);
        wire_gen_str(&s, body->stop.why, sizeof body->stop.why);
        break;
    case MSG_ERROR_REPORT:
        body->error_report.status = (int32_t)wire_gen_u64(&s);
        body->error_report.actor = (actor_addr_t)wire_gen_u64(&s);
        body->error_report.peer = (uint32_t)wire_gen_u64(&s);
        wire_gen_str(&s, body->error_report.where, sizeof body->error_report.where);
        wire_gen_str(&s, body->error_report.text, sizeof body->error_report.text);
        break;
    case MSG_ACTIVATION:
        body->activation.vstage = (int32_t)(wire_gen_u64(&s) & 0x7fffffff);
        body->activation.chunk = (uint32_t)wire_gen_u64(&s);
        break;
    case MSG_ACT_GRAD: {
        body->act_grad.vstage = (int32_t)(wire_gen_u64(&s) & 0x7fffffff);
        body->act_grad.chunk = (uint32_t)wire_gen_u64(&s);
        float f = fabsf(wire_gen_f32(&s));
        body->act_grad.loss_scale = isfinite(f) && f > 0 ? f : 1.0f;
        break;
    }
    case MSG_DATA_BATCH:
        body->data_batch.data_pos = wire_gen_u64(&s);
        body->data_batch.batch = (uint32_t)wire_gen_u64(&s);
        body->data_batch.seq_len = (uint32_t)wire_gen_u64(&s);
        body->data_batch.epoch = (uint32_t)wire_gen_u64(&s);
        break;
    case MSG_METRICS:
        body->metrics.loss = wire_gen_f32(&s);
        body->metrics.grad_norm = wire_gen_f32(&s);
        body->metrics.lr = wire_gen_f32(&s);
        body->metrics.tokens = wire_gen_u64(&s);
        wire_gen_take(&s, &body->metrics.t_fwd_ms, 8);
        wire_gen_take(&s, &body->metrics.t_bwd_ms, 8);
        wire_gen_take(&s, &body->metrics.t_opt_ms, 8);
        wire_gen_take(&s, &body->metrics.t_step_ms, 8);
        break;
    case MSG_CKPT_SHARD: {
        msg_ckpt_shard_t *c = &body->ckpt_shard;
        wire_gen_str(&s, c->name, sizeof c->name);
        if (!c->name[0]) strcpy(c->name, "w");
        c->ckpt_step = (int64_t)wire_gen_u64(&s);
        c->shard = (uint32_t)wire_gen_u64(&s);
        c->ndim = 1 + (uint32_t)(wire_gen_u64(&s) % TENSOR_MAX_DIMS);
        c->is_optim = (uint32_t)wire_gen_u64(&s);
        for (uint32_t k = 0; k < c->ndim; k++) {
            c->global_shape[k] = (int64_t)(wire_gen_u64(&s) >> 2);
            c->start[k] = c->global_shape[k] ? (int64_t)(wire_gen_u64(&s) % (uint64_t)c->global_shape[k]) : 0;
        }
        break;
    }
    case MSG_CKPT_PIECE: { /* an n-D box inside its tensor, optionally a flat range of it */
        msg_ckpt_piece_t *c = &body->ckpt_piece;
        wire_gen_str(&s, c->name, sizeof c->name);
        if (!c->name[0]) strcpy(c->name, "w");
        c->step = (int64_t)(wire_gen_u64(&s) >> 1);
        c->count = 1 + (uint32_t)(wire_gen_u64(&s) % 1000);
        c->index = (uint32_t)(wire_gen_u64(&s) % c->count);
        c->ndim = 1 + (uint32_t)(wire_gen_u64(&s) % 4);
        int64_t *g[4] = {&c->glob0, &c->glob1, &c->glob2, &c->glob3};
        int64_t *o[4] = {&c->off0, &c->off1, &c->off2, &c->off3};
        int64_t *e[4] = {&c->ext0, &c->ext1, &c->ext2, &c->ext3};
        int64_t box = 1;
        for (uint32_t k = 0; k < c->ndim; k++) {
            *g[k] = (int64_t)(wire_gen_u64(&s) % 4096);
            *o[k] = (int64_t)(wire_gen_u64(&s) % (uint64_t)(*g[k] + 1));
            *e[k] = (int64_t)(wire_gen_u64(&s) % (uint64_t)(*g[k] - *o[k] + 1));
            box *= *e[k];
        }
        c->flat_len = -1;
        if (wire_gen_u64(&s) & 1) {
            c->flat_start = (int64_t)(wire_gen_u64(&s) % (uint64_t)(box + 1));
            c->flat_len = (int64_t)(wire_gen_u64(&s) % (uint64_t)(box - c->flat_start + 1));
        }
        break;
    }
    case MSG_CKPT_FETCH:
        body->ckpt_fetch.req = wire_gen_u64(&s);
        body->ckpt_fetch.from = (uint32_t)wire_gen_u64(&s);
        body->ckpt_fetch.phase = 1 + (uint32_t)(wire_gen_u64(&s) % 2);
        body->ckpt_fetch.step = (int64_t)(wire_gen_u64(&s) >> 1);
        body->ckpt_fetch.offset = wire_gen_u64(&s) >> 2;
        body->ckpt_fetch.length = wire_gen_u64(&s) % (CKPT_FETCH_MAX_BYTES + 1);
        body->ckpt_fetch.status = (int32_t)wire_gen_u64(&s);
        wire_gen_str(&s, body->ckpt_fetch.file, sizeof body->ckpt_fetch.file);
        if (!body->ckpt_fetch.file[0]) strcpy(body->ckpt_fetch.file, "f");
        wire_gen_str(&s, body->ckpt_fetch.text, sizeof body->ckpt_fetch.text);
        break;
    case MSG_CKPT_CTL:
        body->ckpt_ctl.step = (int64_t)(wire_gen_u64(&s) >> 1);
        body->ckpt_ctl.phase = CKPT_CTL_BEGIN + (uint32_t)(wire_gen_u64(&s) % 6);
        body->ckpt_ctl.status = (int32_t)wire_gen_u64(&s);
        body->ckpt_ctl.rank = (uint32_t)wire_gen_u64(&s);
        body->ckpt_ctl.count = (uint32_t)wire_gen_u64(&s);
        wire_gen_str(&s, body->ckpt_ctl.text, sizeof body->ckpt_ctl.text);
        break;
    case MSG_EXPERT_TOKENS:
    case MSG_EXPERT_DONE:
        body->expert.call = wire_gen_u64(&s);
        body->expert.layer = (int32_t)(wire_gen_u64(&s) >> 33);
        body->expert.phase = EXPERT_FWD + (uint32_t)(wire_gen_u64(&s) % 2);
        body->expert.rows = (int64_t)(wire_gen_u64(&s) >> 1);
        body->expert.rows_in = (int64_t)(wire_gen_u64(&s) >> 1);
        body->expert.status = (int32_t)wire_gen_u64(&s);
        break;
    case MSG_CP_BLOCK:
        body->cp_block.chunk = (uint32_t)(wire_gen_u64(&s) % 1024);
        body->cp_block.layer = (int32_t)(wire_gen_u64(&s) >> 33);
        body->cp_block.phase = CP_BLOCK_FWD + (uint32_t)(wire_gen_u64(&s) % 2);
        body->cp_block.ring_step = (uint32_t)(wire_gen_u64(&s) % 1024);
        body->cp_block.what = CP_BLOCK_K + (uint32_t)(wire_gen_u64(&s) % 4);
        break;
    default:
        break;
    }
    /* Up to 3 small tensors over `data` (sizes kept inside cap). */
    *nt = (int)(wire_gen_u64(&s) % 4);
    size_t used = 0;
    for (int i = 0; i < *nt; i++) {
        dtype_t dt = (dtype_t)(wire_gen_u64(&s) % DT_COUNT);
        int ndim = 1 + (int)(wire_gen_u64(&s) % TENSOR_MAX_DIMS);
        int64_t shape[TENSOR_MAX_DIMS];
        int64_t numel = 1;
        for (int k = 0; k < ndim; k++) {
            shape[k] = (int64_t)(wire_gen_u64(&s) % 5); /* zero-size dims included */
            numel *= shape[k];
        }
        size_t nb = (size_t)numel * wire_dtype_size(dt);
        if (used + nb > cap) { shape[0] = 0; nb = 0; }
        memset(&ts[i], 0, sizeof ts[i]);
        ts[i].dtype = dt;
        ts[i].ndim = ndim;
        /* mostly host tensors; some name a device (the sixth "dev" key) */
        uint64_t dv = wire_gen_u64(&s) % 8;
        ts[i].device = dv < 6 ? DEVICE_CPU
                              : (device_t){dv == 6 ? DEV_CUDA : DEV_FENCED, (int)(dv == 6 ? i : 0)};
        int64_t stride = 1;
        for (int k = ndim - 1; k >= 0; k--) {
            ts[i].shape[k] = shape[k];
            ts[i].stride[k] = stride;
            stride *= shape[k];
        }
        ts[i].data = data + used;
        wire_gen_take(&s, data + used, nb);
        used += nb;
        snprintf(name_buf[i], WIRE_NAME_MAX, "t%d_%02x", i, (unsigned)(wire_gen_u64(&s) & 0xff));
        names[i] = name_buf[i];
    }
}

/* Gather an iovec into one buffer (what a transport delivers). */
static inline size_t wire_gen_gather(const struct iovec *iov, int n, uint8_t *out)
{
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        memcpy(out + off, iov[i].iov_base, iov[i].iov_len);
        off += iov[i].iov_len;
    }
    return off;
}

static inline bool wire_gen_env_equal(const wire_env_t *a, const wire_env_t *b)
{
    if (a->type != b->type || a->src != b->src || a->dst != b->dst || a->seq != b->seq ||
        a->step != b->step || a->mb != b->mb || a->ntensors != b->ntensors)
        return false;
    for (uint32_t i = 0; i < a->ntensors; i++) {
        const wire_tensor_desc_t *x = &a->tensors[i], *y = &b->tensors[i];
        if (strcmp(x->name, y->name) || x->dtype != y->dtype || x->ndim != y->ndim ||
            x->offset != y->offset || x->nbytes != y->nbytes || !device_eq(x->device, y->device))
            return false;
        for (int k = 0; k < x->ndim; k++)
            if (x->shape[k] != y->shape[k]) return false;
    }
    return true;
}

/* Invariants of a successful decode: every tensor lies inside the payload,
 * aligned, non-overlapping, with nbytes = numel * dtype size. Returns a
 * description of the first violation or NULL. */
static inline const char *wire_gen_check_decoded(const wire_env_t *env, size_t payload_len)
{
    uint64_t end = 0;
    for (uint32_t i = 0; i < env->ntensors; i++) {
        const wire_tensor_desc_t *d = &env->tensors[i];
        if (d->offset % WIRE_ALIGN) return "misaligned";
        if (i && d->offset < end) return "overlap";
        if (d->offset + d->nbytes > payload_len || d->offset + d->nbytes < d->offset) return "beyond payload";
        uint64_t numel = 1;
        for (int k = 0; k < d->ndim; k++) numel *= (uint64_t)d->shape[k];
        if (numel * wire_dtype_size(d->dtype) != d->nbytes) return "nbytes";
        end = d->offset + d->nbytes;
    }
    if (env->type >= MSG_TYPE_COUNT) return "type";
    return NULL;
}

/* ---- differential property: fast decoder vs general decoder --------------
 *
 * On any bytes: the fast path (WIRE_DECODE_FAST, FAST_RAW) returns BT_OK or
 * defers (BT_ERR_UNSUPPORTED), never anything else; when it accepts, the
 * general path accepts too, with a byte-identical wire_env_t and body (both
 * start from the same fill pattern, so a field one of them forgets to write
 * shows). AUTO (what msg_decode does) returns the general path's status, and
 * its reason when it rejects. Returns a description of the first violation
 * or NULL; *fast_ok (may be NULL) tells whether FAST accepted. */
typedef struct {
    bt_status_t st;
    wire_env_t  env;
    msg_body_t  body;
    wire_err_t  err;
} wire_gen_dec_t;

static inline void wire_gen_dec_run(const void *hdr, size_t len, size_t plen, const wire_limits_t *lim,
                                    wire_decode_path_t path, wire_gen_dec_t *d)
{
    memset(d, 0xa5, sizeof *d);
    d->st = msg_decode_ex(hdr, len, plen, lim, &d->env, &d->body, path, &d->err);
}

static inline const char *wire_gen_diff_check(const void *hdr, size_t len, size_t plen, const wire_limits_t *lim,
                                              bool *fast_ok)
{
    static _Thread_local wire_gen_dec_t g, f, fr, a;
    wire_gen_dec_run(hdr, len, plen, lim, WIRE_DECODE_GENERAL, &g);
    wire_gen_dec_run(hdr, len, plen, lim, WIRE_DECODE_FAST, &f);
    wire_gen_dec_run(hdr, len, plen, lim, WIRE_DECODE_FAST_RAW, &fr);
    wire_gen_dec_run(hdr, len, plen, lim, WIRE_DECODE_AUTO, &a);
    if (fast_ok) *fast_ok = f.st == BT_OK;
    if (g.st != BT_OK && g.st != BT_ERR_PEER_PROTO && g.st != BT_ERR_NOMEM) return "general: unexpected status";
    if (g.st == BT_ERR_PEER_PROTO && g.err.reason[0] == '\0') return "general: rejection without a reason";
    const wire_gen_dec_t *fast[2] = {&f, &fr};
    for (int i = 0; i < 2; i++) {
        const wire_gen_dec_t *x = fast[i];
        if (x->st != BT_OK && x->st != BT_ERR_UNSUPPORTED) return "fast: neither accepted nor deferred";
        if (x->st != BT_OK) continue;
        if (g.st != BT_OK) return "fast accepted what the general path rejects";
        if (memcmp(&x->env, &g.env, sizeof g.env)) return "fast: envelope differs from the general path's";
        if (memcmp(&x->body, &g.body, sizeof g.body)) return "fast: body differs from the general path's";
    }
    if (fr.st == BT_OK && f.st != BT_OK) return "FAST_RAW accepted what FAST deferred";
    if (a.st != g.st) return "auto: status differs from the general path's";
    if (a.st != BT_OK && strcmp(a.err.reason, g.err.reason)) return "auto: reason differs from the general path's";
    if (a.st == BT_OK && (!wire_gen_env_equal(&a.env, &g.env) || !msg_body_equal(a.env.type, &a.body, &g.body)))
        return "auto: decoded message differs from the general path's";
    return NULL;
}

#endif
