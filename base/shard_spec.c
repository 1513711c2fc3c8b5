/* Shard specs (base/shard_spec.h): boxes with an optional flat range, and the
 * one routine that walks what two pieces have in common. */
#include "base/shard_spec.h"

#include "base/log.h"

#include <stdio.h>
#include <string.h>

static const char *const shard_group_names[] = {
    [SHARD_GROUP_NONE] = "whole", [SHARD_GROUP_TP] = "tp", [SHARD_GROUP_EP] = "ep",
    [SHARD_GROUP_CP] = "cp",       [SHARD_GROUP_DP] = "dp",
};
_Static_assert(sizeof shard_group_names / sizeof shard_group_names[0] == SHARD_GROUP_COUNT,
               "one name per group");

const char *shard_group_name(shard_group_t g)
{
    return (unsigned)g < SHARD_GROUP_COUNT ? shard_group_names[g] : "invalid";
}

shard_spec_t shard_whole(int ndim, const int64_t *shape)
{
    if (ndim < 1 || ndim > SHARD_MAX_DIMS) BT_PANIC("shard_whole: ndim %d", ndim);
    shard_spec_t s;
    memset(&s, 0, sizeof s);
    s.ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) BT_PANIC("shard_whole: negative extent in dim %d", d);
        s.global[d] = s.extent[d] = shape[d];
    }
    s.flat_len = -1;
    s.split_dim = -1;
    s.unit = 1;
    s.size = 1;
    return s;
}

shard_spec_t shard_split(const shard_spec_t *of, int dim, shard_group_t group, int r, int size,
                         int64_t unit)
{
    if (dim < 0 || dim >= of->ndim) BT_PANIC("shard_split: dim %d of a %d-D tensor", dim, of->ndim);
    if (size < 1 || r < 0 || r >= size) BT_PANIC("shard_split: rank %d of %d", r, size);
    if (of->flat_len >= 0) BT_PANIC("shard_split: cannot cut a flat range along a dimension");
    if (unit < 1 || of->extent[dim] % unit)
        BT_PANIC("shard_split: extent %lld is not a multiple of the unit %lld",
                 (long long)of->extent[dim], (long long)unit);
    int64_t units = of->extent[dim] / unit, base = units / size, extra = units % size;
    int64_t first = base * r + (r < extra ? r : extra), n = base + (r < extra ? 1 : 0);
    shard_spec_t s = *of;
    s.offset[dim] = of->offset[dim] + first * unit;
    s.extent[dim] = n * unit;
    s.group = group;
    s.split_dim = dim;
    s.unit = unit;
    s.rank = r;
    s.size = size;
    return s;
}

static int64_t box_numel(const shard_spec_t *s)
{
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->extent[d];
    return n;
}

shard_spec_t shard_flat(const shard_spec_t *of, shard_group_t group, int r, int size,
                        int64_t start, int64_t len)
{
    int64_t n = box_numel(of);
    int64_t base = of->flat_len >= 0 ? of->flat_start : 0;
    int64_t have = of->flat_len >= 0 ? of->flat_len : n;
    if (start < 0 || len < 0 || start + len > have)
        BT_PANIC("shard_flat: [%lld, %lld) outside the %lld elements of the piece",
                 (long long)start, (long long)(start + len), (long long)have);
    shard_spec_t s = *of;
    s.flat_start = base + start;
    s.flat_len = len;
    s.group = group;
    s.rank = r;
    s.size = size;
    return s;
}

int64_t shard_numel(const shard_spec_t *s) { return s->flat_len >= 0 ? s->flat_len : box_numel(s); }

int64_t shard_global_numel(const shard_spec_t *s)
{
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->global[d];
    return n;
}

int shard_local_shape(const shard_spec_t *s, int64_t *shape)
{
    if (s->flat_len >= 0) {
        shape[0] = s->flat_len;
        return 1;
    }
    for (int d = 0; d < s->ndim; d++) shape[d] = s->extent[d];
    return s->ndim;
}

bool shard_same_global(const shard_spec_t *a, const shard_spec_t *b)
{
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->global[d] != b->global[d]) return false;
    return true;
}

bool shard_is_whole(const shard_spec_t *s)
{
    for (int d = 0; d < s->ndim; d++)
        if (s->offset[d] != 0 || s->extent[d] != s->global[d]) return false;
    return s->flat_len < 0 || (s->flat_start == 0 && s->flat_len == box_numel(s));
}

bool shard_overlap(const shard_spec_t *a, const shard_spec_t *b, shard_spec_t *out)
{
    if (!shard_same_global(a, b)) return false;
    shard_spec_t r = *a;
    r.flat_len = -1;
    for (int d = 0; d < a->ndim; d++) {
        int64_t lo = a->offset[d] > b->offset[d] ? a->offset[d] : b->offset[d];
        int64_t ha = a->offset[d] + a->extent[d], hb = b->offset[d] + b->extent[d];
        int64_t hi = ha < hb ? ha : hb;
        if (hi <= lo) return false;
        r.offset[d] = lo;
        r.extent[d] = hi - lo;
    }
    if (out) *out = r;
    return true;
}

int64_t shard_global_index(const shard_spec_t *s, int64_t k)
{
    int64_t box_k = s->flat_len >= 0 ? s->flat_start + k : k, g[SHARD_MAX_DIMS];
    for (int d = s->ndim - 1; d >= 0; d--) {
        g[d] = s->offset[d] + box_k % s->extent[d];
        box_k /= s->extent[d];
    }
    int64_t ix = 0;
    for (int d = 0; d < s->ndim; d++) ix = ix * s->global[d] + g[d];
    return ix;
}

/* Row-major flat index, inside box s, of global coordinates g. */
static int64_t box_index(const shard_spec_t *s, const int64_t *g)
{
    int64_t ix = 0;
    for (int d = 0; d < s->ndim; d++) ix = ix * s->extent[d] + (g[d] - s->offset[d]);
    return ix;
}

/* [lo, lo + n) of box-flat indices clipped to s's flat range; returns the
 * clipped count and moves *lo (and *other by the same amount). */
static int64_t clip_flat(const shard_spec_t *s, int64_t *lo, int64_t *other, int64_t n)
{
    if (s->flat_len < 0) return n;
    int64_t a = *lo, b = *lo + n, fa = s->flat_start, fb = s->flat_start + s->flat_len;
    if (a < fa) a = fa;
    if (b > fb) b = fb;
    if (b <= a) return 0;
    *other += a - *lo;
    *lo = a;
    return b - a;
}

typedef struct {
    shard_run_fn fn;
    void        *arg;
    int64_t      src, dst, n; /* pending run */
} run_merge_t;

static void run_emit(run_merge_t *m, int64_t src, int64_t dst, int64_t n)
{
    if (n <= 0) return;
    if (m->n > 0 && m->src + m->n == src && m->dst + m->n == dst) {
        m->n += n;
        return;
    }
    if (m->n > 0) m->fn(m->arg, m->src, m->dst, m->n);
    m->src = src, m->dst = dst, m->n = n;
}

int64_t shard_runs(const shard_spec_t *dst, const shard_spec_t *src, shard_run_fn fn, void *arg)
{
    if (!shard_same_global(dst, src)) BT_PANIC("shard_runs: pieces of different tensors");
    shard_spec_t box;
    if (!shard_overlap(dst, src, &box)) return 0;
    int nd = box.ndim;
    int64_t g[SHARD_MAX_DIMS], rows = 1, len = box.extent[nd - 1], total = 0;
    for (int d = 0; d < nd - 1; d++) rows *= box.extent[d];
    for (int d = 0; d < nd; d++) g[d] = box.offset[d];
    run_merge_t m = {.fn = fn, .arg = arg};
    for (int64_t r = 0; r < rows; r++) {
        int64_t s0 = box_index(src, g), d0 = box_index(dst, g), n = len;
        n = clip_flat(src, &s0, &d0, n);
        if (n > 0) n = clip_flat(dst, &d0, &s0, n);
        if (n > 0) {
            int64_t so = src->flat_len >= 0 ? s0 - src->flat_start : s0;
            int64_t dof = dst->flat_len >= 0 ? d0 - dst->flat_start : d0;
            run_emit(&m, so, dof, n);
            total += n;
        }
        for (int d = nd - 2; d >= 0; d--) { /* next row of the intersection */
            if (++g[d] < box.offset[d] + box.extent[d]) break;
            g[d] = box.offset[d];
        }
    }
    if (m.n > 0) fn(arg, m.src, m.dst, m.n);
    return total;
}

typedef struct {
    char       *dst;
    const char *src;
    size_t      elem;
} copy_ctx_t;

static void copy_run(void *arg, int64_t so, int64_t dof, int64_t n)
{
    copy_ctx_t *c = arg;
    memcpy(c->dst + (size_t)dof * c->elem, c->src + (size_t)so * c->elem, (size_t)n * c->elem);
}

int64_t shard_copy(const shard_spec_t *dst, void *dst_data, const shard_spec_t *src,
                   const void *src_data, size_t elem)
{
    copy_ctx_t c = {.dst = dst_data, .src = src_data, .elem = elem};
    return shard_runs(dst, src, copy_run, &c);
}

const char *shard_str(const shard_spec_t *s, char *buf)
{
    int n = 0, cap = SHARD_STR_MAX;
    if (s->split_dim >= 0 || s->group != SHARD_GROUP_NONE)
        n += snprintf(buf + n, (size_t)(cap - n), "%s %d/%d ", shard_group_name(s->group), s->rank,
                      s->size);
    n += snprintf(buf + n, (size_t)(cap - n), "[");
    for (int d = 0; d < s->ndim && n < cap; d++)
        n += snprintf(buf + n, (size_t)(cap - n), "%s%lld:%lld", d ? ", " : "",
                      (long long)s->offset[d], (long long)(s->offset[d] + s->extent[d]));
    if (n < cap) n += snprintf(buf + n, (size_t)(cap - n), "]");
    if (s->flat_len >= 0 && n < cap)
        n += snprintf(buf + n, (size_t)(cap - n), " flat %lld:%lld", (long long)s->flat_start,
                      (long long)(s->flat_start + s->flat_len));
    if (n < cap) n += snprintf(buf + n, (size_t)(cap - n), " of [");
    for (int d = 0; d < s->ndim && n < cap; d++)
        n += snprintf(buf + n, (size_t)(cap - n), "%s%lld", d ? ", " : "", (long long)s->global[d]);
    if (n < cap) snprintf(buf + n, (size_t)(cap - n), "]");
    return buf;
}
