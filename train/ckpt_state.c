#include "train/ckpt_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

static ckpt_item_t *item_add(ckpt_items_t *it)
{
    if (it->n == it->cap) {
        int cap = it->cap ? 2 * it->cap : 64;
        ckpt_item_t *v = realloc(it->v, (size_t)cap * sizeof *v);
        if (!v) return NULL;
        it->v = v;
        it->cap = cap;
    }
    ckpt_item_t *e = &it->v[it->n++];
    memset(e, 0, sizeof *e);
    e->param = -1;
    return e;
}

/* A piece held alike by every TP rank is stored by TP rank 0. */
static bool tp_stores(const model_t *m, const shard_spec_t *spec)
{
    return spec->group != SHARD_GROUP_NONE || m->par.tp_rank == 0;
}

/* Whether this rank stores a whole piece of a replica: dense pieces on the
 * data-parallel replica the caller names (dp0) as above, an expert's on
 * edp rank 0 (its replicas are the edp group, which may span TP and dp). */
static bool replica_stores(const model_t *m, const shard_spec_t *spec, bool dp0)
{
    if (MODEL_PARAM_IS_EXPERT(spec)) return m->par.edp_rank == 0;
    return dp0 && tp_stores(m, spec);
}

static bt_status_t named(ckpt_item_t *e, const char *prefix, const char *name)
{
    int n = snprintf(e->name, sizeof e->name, "%s%s", prefix, name);
    if (n < 0 || (size_t)n >= sizeof e->name) {
        log_error("checkpoint: tensor name %s%s is longer than %d bytes", prefix, name,
                  CKPT_NAME_MAX - 1);
        return BT_ERR_INVALID;
    }
    return BT_OK;
}

bt_status_t ckpt_items_params(ckpt_items_t *it, model_t *m, bool store, int skip)
{
    for (int i = 0; i < m->n_params; i++) {
        ckpt_item_t *e = item_add(it);
        if (!e) return BT_ERR_NOMEM;
        bt_status_t st = named(e, "", m->params[i].name);
        if (st) return st;
        e->spec = m->params[i].spec;
        e->t = m->masters ? m->masters[i].t : m->params[i].t;
        if (e->t.dtype != DT_F32) {
            log_error("checkpoint: parameter %s is %s with no f32 master", m->params[i].name,
                      dtype_name(e->t.dtype));
            return BT_ERR_UNSUPPORTED;
        }
        e->s = m->stream;
        e->m = m;
        e->param = i;
        e->store = i != skip && replica_stores(m, &e->spec, store);
    }
    /* the routed experts' selection biases (bias balancing): the same on
     * every rank, stored by the dense rule's replica */
    int nb = model_moe_bias_views(m, NULL, NULL);
    if (!nb) return BT_OK;
    tensor_t *views = calloc((size_t)nb, sizeof *views);
    char (*names)[MODEL_NAME_MAX] = calloc((size_t)nb, sizeof *names);
    bt_status_t st = views && names ? BT_OK : BT_ERR_NOMEM;
    if (!st) model_moe_bias_views(m, views, names);
    for (int k = 0; k < nb && !st; k++) {
        ckpt_item_t *e = item_add(it);
        if (!e) {
            st = BT_ERR_NOMEM;
            break;
        }
        if ((st = named(e, "", names[k]))) break;
        e->spec = shard_whole(1, views[k].shape);
        e->t = views[k];
        e->s = m->stream;
        e->store = store && m->par.tp_rank == 0;
    }
    free(views);
    free(names);
    return st;
}

bt_status_t ckpt_items_optim(ckpt_items_t *it, model_t *m, const optim_t *o, bool store, int skip)
{
    if (optim_param_count(o) != m->n_params) {
        log_error("checkpoint: the optimizer holds %d tensors, the model %d",
                  optim_param_count(o), m->n_params);
        return BT_ERR_INVALID;
    }
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < m->n_params; i++) {
            ckpt_item_t *e = item_add(it);
            if (!e) return BT_ERR_NOMEM;
            bt_status_t st = named(e, k ? CKPT_EXP_AVG_SQ : CKPT_EXP_AVG, m->params[i].name);
            if (st) return st;
            e->spec = m->params[i].spec;
            e->t = k ? optim_moment2(o, i) : optim_moment1(o, i);
            e->s = m->stream;
            e->store = i != skip && replica_stores(m, &e->spec, store);
        }
    return BT_OK;
}

bt_status_t ckpt_items_optim_ranges(ckpt_items_t *it, model_t *m, const optim_t *o, bool store)
{
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < optim_param_count(o); j++) {
            const optim_param_t *p = optim_param(o, j);
            int i = model_param_find(m, p->name);
            const char *base = i >= 0 ? (const char *)m->params[i].t.data : NULL;
            const char *at = (const char *)p->param.data;
            int64_t n = tensor_numel(&p->param), whole = i >= 0 ? tensor_numel(&m->params[i].t) : 0;
            if (i < 0 || at < base || (at - base) % (ptrdiff_t)sizeof(float) ||
                (at - base) / (ptrdiff_t)sizeof(float) + n > whole) {
                log_error("checkpoint: optimizer range %d (%s) is no part of a parameter", j, p->name);
                return BT_ERR_INVALID;
            }
            ckpt_item_t *e = item_add(it);
            if (!e) return BT_ERR_NOMEM;
            bt_status_t st = named(e, k ? CKPT_EXP_AVG_SQ : CKPT_EXP_AVG, p->name);
            if (st) return st;
            const shard_spec_t *ps = &m->params[i].spec;
            e->spec = shard_flat(ps, SHARD_GROUP_DP, 0, 1, (at - base) / (ptrdiff_t)sizeof(float), n);
            e->t = k ? optim_moment2(o, j) : optim_moment1(o, j);
            e->s = m->stream;
            e->store = store && tp_stores(m, ps);
        }
    return BT_OK;
}

void ckpt_items_free(ckpt_items_t *it)
{
    free(it->v);
    memset(it, 0, sizeof *it);
}

bt_status_t ckpt_snapshot_take(const ckpt_items_t *it, ckpt_snapshot_t *out)
{
    void *keep = out->block;
    size_t keep_cap = out->cap;
    free(out->puts);
    memset(out, 0, sizeof *out);
    size_t bytes = 0;
    int n = 0;
    for (int i = 0; i < it->n; i++)
        if (it->v[i].store) {
            bytes += (size_t)tensor_numel(&it->v[i].t) * sizeof(float);
            n++;
        }
    out->puts = calloc((size_t)n + 1, sizeof *out->puts);
    if (keep && keep_cap >= bytes) {
        out->block = keep;
        out->cap = keep_cap;
    } else {
        free(keep);
        out->block = malloc(bytes + 1);
        out->cap = bytes + 1;
    }
    if (!out->puts || !out->block) {
        ckpt_snapshot_free(out);
        return BT_ERR_NOMEM;
    }
    out->bytes = bytes;
    char *at = out->block;
    kern_stream_t *last = NULL;
    for (int i = 0; i < it->n; i++) {
        const ckpt_item_t *e = &it->v[i];
        if (!e->store) continue;
        if (tensor_numel(&e->t) != shard_numel(&e->spec)) {
            log_error("checkpoint: %s holds %lld values, its spec %lld", e->name,
                      (long long)tensor_numel(&e->t), (long long)shard_numel(&e->spec));
            ckpt_snapshot_free(out);
            return BT_ERR_INVALID;
        }
        if (last && last != e->s) kern_stream_sync(last);
        kern_download(e->s, at, &e->t);
        last = e->s;
        out->puts[out->n++] = (ckpt_put_t){.tensor = e->name, .dtype = DT_F32, .spec = e->spec,
                                           .data = at};
        at += (size_t)tensor_numel(&e->t) * sizeof(float);
    }
    bt_status_t st = last ? kern_stream_sync(last) : BT_OK;
    if (st) {
        log_error("checkpoint: copying the state to the host failed (%s)", bt_status_str(st));
        ckpt_snapshot_free(out);
    }
    return st;
}

void ckpt_snapshot_free(ckpt_snapshot_t *s)
{
    free(s->puts);
    free(s->block);
    memset(s, 0, sizeof *s);
}

static const char *dims_str(int ndim, const int64_t *d, char *buf, size_t cap)
{
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < ndim && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "[", (long long)d[i]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
    return buf;
}

bt_status_t ckpt_items_restore(const ckpt_items_t *it, ckpt_reader_t *r, char *err, size_t errlen)
{
    const ckpt_index_t *idx = ckpt_reader_index(r);
    float *buf = NULL;
    int64_t cap = 0;
    bt_status_t st = BT_OK;
    for (int i = 0; i < it->n && !st; i++) {
        const ckpt_item_t *e = &it->v[i];
        const ckpt_tensor_t *t = ckpt_index_find(idx, e->name);
        if (!t) {
            snprintf(err, errlen, "tensor %s is not in the checkpoint (another model, or a run "
                     "without this state)", e->name);
            st = BT_ERR_NOT_FOUND;
            break;
        }
        bool same = t->ndim == e->spec.ndim && t->dtype == DT_F32;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == e->spec.global[d];
        if (!same) {
            char have[96], need[96];
            snprintf(err, errlen, "tensor %s: the checkpoint holds %s %s, this run needs F32 %s "
                     "(a checkpoint of another model)", e->name, dtype_name(t->dtype),
                     dims_str(t->ndim, t->shape, have, sizeof have),
                     dims_str(e->spec.ndim, e->spec.global, need, sizeof need));
            st = BT_ERR_INVALID;
            break;
        }
        int64_t n = shard_numel(&e->spec);
        if (n > cap) {
            free(buf);
            cap = n;
            if (!(buf = malloc((size_t)cap * sizeof *buf + 1))) {
                st = BT_ERR_NOMEM;
                break;
            }
        }
        if ((st = ckpt_read(r, e->name, &e->spec, buf, err, errlen))) break;
        if (e->param >= 0) {
            st = model_param_write(e->m, e->param, buf);
        } else {
            tensor_t dst = e->t;
            kern_upload(e->s, &dst, buf);
            st = kern_stream_sync(e->s);
        }
        if (st) snprintf(err, errlen, "tensor %s: writing it to the device failed (%s)", e->name,
                         bt_status_str(st));
    }
    free(buf);
    return st;
}
