#include "train/handoff.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/le.h"
#include "base/log.h"

/* Descriptor layout, little-endian, HANDOFF_DESC_BYTES in all:
 *   0 "BTHO"  4 version u32  8 slot u32  12 gen u32  16 kind u32  20 dtype u32
 *  24 ndim u32  28 shape i64[4]  60 capacity u64  68 handle[64] */
#define DESC_VERSION 1u
_Static_assert(68 + KERN_IPC_HANDLE_MAX == HANDOFF_DESC_BYTES, "descriptor layout");
_Static_assert(TENSOR_MAX_DIMS == 4, "descriptor holds four dims");

void handoff_desc_write(const handoff_desc_t *d, uint8_t *out)
{
    memset(out, 0, HANDOFF_DESC_BYTES);
    memcpy(out, "BTHO", 4);
    le_put32(out + 4, DESC_VERSION);
    le_put32(out + 8, d->slot);
    le_put32(out + 12, d->gen);
    le_put32(out + 16, (uint32_t)d->kind);
    le_put32(out + 20, (uint32_t)d->dtype);
    le_put32(out + 24, (uint32_t)d->ndim);
    for (int i = 0; i < d->ndim; i++) le_put64(out + 28 + 8 * i, (uint64_t)d->shape[i]);
    le_put64(out + 60, d->capacity);
    memcpy(out + 68, d->handle.bytes, KERN_IPC_HANDLE_MAX);
}

bt_status_t handoff_desc_read(const tensor_t *t, handoff_desc_t *d, char *err, size_t errlen)
{
    if (t->dtype != DT_U8 || t->ndim != 1 || t->shape[0] != HANDOFF_DESC_BYTES) {
        snprintf(err, errlen, "handoff descriptor is not u8 [%d]", HANDOFF_DESC_BYTES);
        return BT_ERR_PEER_PROTO;
    }
    const uint8_t *p = t->data;
    memset(d, 0, sizeof *d);
    if (memcmp(p, "BTHO", 4) || le_get32(p + 4) != DESC_VERSION) {
        snprintf(err, errlen, "handoff descriptor has bad magic or version %u", le_get32(p + 4));
        return BT_ERR_PEER_PROTO;
    }
    d->slot = le_get32(p + 8);
    d->gen = le_get32(p + 12);
    uint32_t kind = le_get32(p + 16), dt = le_get32(p + 20), nd = le_get32(p + 24);
    if (kind >= DEV_COUNT || dt >= DT_COUNT || nd < 1 || nd > TENSOR_MAX_DIMS ||
        d->slot >= HANDOFF_MAX_SLOTS) {
        snprintf(err, errlen, "handoff descriptor: device kind %u, dtype %u, ndim %u, slot %u out of range",
                 kind, dt, nd, d->slot);
        return BT_ERR_PEER_PROTO;
    }
    d->kind = (device_kind_t)kind;
    d->dtype = (dtype_t)dt;
    d->ndim = (int)nd;
    d->capacity = le_get64(p + 60);
    uint64_t bytes = dtype_size(d->dtype);
    for (int i = 0; i < d->ndim; i++) {
        uint64_t n = le_get64(p + 28 + 8 * i);
        if (n == 0 || n > (1ull << 40) || bytes > (1ull << 62) / n) {
            snprintf(err, errlen, "handoff descriptor: dim %d is %llu", i, (unsigned long long)n);
            return BT_ERR_PEER_PROTO;
        }
        d->shape[i] = (int64_t)n;
        bytes *= n;
    }
    if (bytes > d->capacity) {
        snprintf(err, errlen, "handoff descriptor: %llu bytes of tensor in a buffer of %llu",
                 (unsigned long long)bytes, (unsigned long long)d->capacity);
        return BT_ERR_PEER_PROTO;
    }
    memcpy(d->handle.bytes, p + 68, KERN_IPC_HANDLE_MAX);
    return BT_OK;
}

static size_t shape_bytes(dtype_t dt, int ndim, const int64_t *shape)
{
    size_t n = dtype_size(dt);
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    return n;
}

bt_status_t handoff_pool_init(handoff_pool_t *p, device_t dev)
{
    memset(p, 0, sizeof *p);
    p->dev = dev;
    if (!kern_ipc_supported(dev)) {
        char d[DEVICE_STR_MAX];
        log_error("handoff: %s has no memory to share with another process", device_str(dev, d));
        return BT_ERR_UNSUPPORTED;
    }
    return pthread_mutex_init(&p->mu, NULL) ? BT_ERR_NOMEM : BT_OK;
}

void handoff_pool_fini(handoff_pool_t *p)
{
    if (!kern_ipc_supported(p->dev)) return;
    for (int i = 0; i < p->n_slots; i++)
        kern_ipc_free(p->dev, p->slots[i].p, p->slots[i].cap, &p->slots[i].handle);
    pthread_mutex_destroy(&p->mu);
    memset(p, 0, sizeof *p);
}

bt_status_t handoff_take(handoff_pool_t *p, dtype_t dtype, int ndim, const int64_t *shape,
                         tensor_t *view, handoff_desc_t *d)
{
    size_t need = shape_bytes(dtype, ndim, shape);
    pthread_mutex_lock(&p->mu);
    int pick = -1;
    for (int i = 0; i < p->n_slots; i++) /* the smallest free one that fits */
        if (!p->slots[i].busy && p->slots[i].cap >= need &&
            (pick < 0 || p->slots[i].cap < p->slots[pick].cap))
            pick = i;
    bt_status_t st = BT_OK;
    if (pick < 0) {
        if (p->n_slots == HANDOFF_MAX_SLOTS) {
            log_error("handoff: all %d shared buffers are in flight", HANDOFF_MAX_SLOTS);
            st = BT_ERR_BUSY;
        } else {
            handoff_slot_t *s = &p->slots[p->n_slots];
            memset(s, 0, sizeof *s);
            st = kern_ipc_alloc(p->dev, need, &s->p, &s->handle);
            if (st == BT_OK) {
                s->cap = need;
                pick = p->n_slots++;
            }
        }
    }
    if (st == BT_OK) {
        handoff_slot_t *s = &p->slots[pick];
        s->busy = true;
        s->gen++;
        p->handed++;
        *view = tensor_make(s->p, dtype, p->dev, ndim, shape);
        *d = (handoff_desc_t){.slot = (uint32_t)pick, .gen = s->gen, .kind = p->dev.kind,
                              .dtype = dtype, .ndim = ndim, .capacity = s->cap, .handle = s->handle};
        memcpy(d->shape, shape, (size_t)ndim * sizeof *shape);
    }
    pthread_mutex_unlock(&p->mu);
    return st;
}

bt_status_t handoff_attach(actor_msg_t *m, const char *name, const handoff_desc_t *d)
{
    char tname[64];
    snprintf(tname, sizeof tname, "%s%s", name, HANDOFF_SUFFIX);
    int64_t n = HANDOFF_DESC_BYTES;
    tensor_t *t = actor_msg_tensor_new(m, tname, DT_U8, 1, &n);
    if (!t) return BT_ERR_NOMEM;
    handoff_desc_write(d, t->data);
    /* fault injection for tests/sh/test_handoff.sh: a descriptor the
     * receiver must refuse, naming what is wrong */
    const char *inj = getenv("BATON_TEST_HANDOFF");
    if (inj && !strcmp(inj, "corrupt")) ((uint8_t *)t->data)[0] ^= 0x20;
    if (inj && !strcmp(inj, "oversize")) le_put64((uint8_t *)t->data + 28, (uint64_t)d->shape[0] * 1000);
    return BT_OK;
}

bt_status_t handoff_release(handoff_pool_t *p, uint32_t slot, uint32_t gen)
{
    pthread_mutex_lock(&p->mu);
    bt_status_t st = BT_ERR_INVALID;
    if (slot < (uint32_t)p->n_slots && p->slots[slot].busy && p->slots[slot].gen == gen) {
        p->slots[slot].busy = false;
        p->released++;
        st = BT_OK;
    }
    pthread_mutex_unlock(&p->mu);
    return st;
}

void handoff_pool_usage(handoff_pool_t *p, int *n_slots, size_t *bytes)
{
    pthread_mutex_lock(&p->mu);
    *n_slots = p->n_slots;
    *bytes = 0;
    for (int i = 0; i < p->n_slots; i++) *bytes += p->slots[i].cap;
    pthread_mutex_unlock(&p->mu);
}

void handoff_map_init(handoff_map_t *m, device_t dev)
{
    memset(m, 0, sizeof *m);
    m->dev = dev;
}

void handoff_map_fini(handoff_map_t *m)
{
    for (int i = 0; i < m->n; i++) kern_ipc_close(m->dev, m->ent[i].p, m->ent[i].cap);
    m->n = 0;
}

bt_status_t handoff_map_view(handoff_map_t *m, const handoff_desc_t *d, tensor_t *view)
{
    char dv[DEVICE_STR_MAX];
    if (d->kind != m->dev.kind) {
        log_error("handoff: a %s buffer handed to %s", device_kind_name(d->kind), device_str(m->dev, dv));
        return BT_ERR_PEER_PROTO;
    }
    handoff_mapped_t *e = NULL;
    for (int i = 0; i < m->n && !e; i++)
        if (!memcmp(m->ent[i].handle.bytes, d->handle.bytes, KERN_IPC_HANDLE_MAX)) e = &m->ent[i];
    if (e && e->cap < d->capacity) {
        log_error("handoff: a buffer mapped with %zu bytes is now said to hold %llu", e->cap,
                  (unsigned long long)d->capacity);
        return BT_ERR_PEER_PROTO;
    }
    if (!e) {
        if (m->n == (int)(sizeof m->ent / sizeof m->ent[0])) {
            log_error("handoff: more than %d shared buffers from the neighbours", m->n);
            return BT_ERR_PEER_PROTO;
        }
        e = &m->ent[m->n];
        bt_status_t st = kern_ipc_open(m->dev, &d->handle, (size_t)d->capacity, &e->p);
        if (st) {
            log_error("handoff: cannot map a neighbour's buffer on %s (%s)", device_str(m->dev, dv),
                      bt_status_str(st));
            return st;
        }
        e->handle = d->handle;
        e->cap = (size_t)d->capacity;
        m->n++;
    }
    *view = tensor_make(e->p, d->dtype, m->dev, d->ndim, d->shape);
    return BT_OK;
}

tensor_t *handoff_msg_tensor(actor_msg_t *m, const char *name, bool *handed)
{
    tensor_t *t = actor_msg_tensor(m, name);
    *handed = false;
    if (t) return t;
    char tname[64];
    snprintf(tname, sizeof tname, "%s%s", name, HANDOFF_SUFFIX);
    t = actor_msg_tensor(m, tname);
    *handed = t != NULL;
    return t;
}
