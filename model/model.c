/* Model lifetime: the named parameter layout the kinds build, the one
 * parameter block on the model's device and its gradient twin, and moving
 * tensors between the device and the host. Forward/backward: model/run.c;
 * TP bookkeeping: model/tp.c. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kernels/kernels.h"
#include "model/arch.h"
#include "model/kind.h"
#include "model/model_int.h"

/* Views start on 64-byte boundaries so that kernels see aligned rows. */
#define MODEL_VIEW_ALIGN 64

model_place_t model_place_host(void)
{
    return (model_place_t){.dev = DEVICE_CPU, .param_dtype = DT_F32, .act_dtype = DT_F32,
                           .grad_dtype = DT_F32};
}

model_stage_t model_stage_full(const model_config_t *cfg)
{
    return (model_stage_t){.first_layer = 0, .last_layer = (int)cfg->num_layers,
                           .has_embedding = true, .has_head = true};
}

int model_layout_add(model_layout_t *lb, const char *name, int ndim, int64_t d0, int64_t d1,
                     int split_dim, int64_t unit)
{
    return model_layout_add_nd(lb, name, ndim, (int64_t[]){d0, d1}, split_dim, unit);
}

int model_layout_add_nd(model_layout_t *lb, const char *name, int ndim, const int64_t *shape,
                        int split_dim, int64_t unit)
{
    if (ndim < 1 || ndim > SHARD_MAX_DIMS) BT_PANIC("model_layout_add_nd: %s has ndim %d", name, ndim);
    if (lb->out) {
        model_param_t *p = &lb->out[lb->n];
        memset(p, 0, sizeof *p);
        snprintf(p->name, sizeof p->name, "%s", name);
        p->spec = shard_whole(ndim, shape);
        if (split_dim >= 0)
            p->spec = shard_split(&p->spec, split_dim, SHARD_GROUP_TP, lb->tp_rank, lb->tp_size,
                                  unit);
        int64_t local[SHARD_MAX_DIMS];
        int nd = shard_local_shape(&p->spec, local);
        p->t = tensor_make(NULL, DT_F32, DEVICE_CPU, nd, local);
    }
    return lb->n++;
}

void model_layout_keep_f32(model_layout_t *lb, int ix)
{
    if (lb->out) lb->out[ix].keep_f32 = true;
}

void model_layout_proj_name(char *out, size_t cap, const char *fused, int part, const char *own,
                            const char *what)
{
    if (fused) snprintf(out, cap, "%s.%s%c%d", fused, what, MODEL_PART_MARK, part);
    else snprintf(out, cap, "%s.%s", own, what);
}

void model_layout_grad_tp_partial(model_layout_t *lb, int ix)
{
    if (!lb->out) return;
    if (lb->out[ix].spec.group != SHARD_GROUP_NONE)
        BT_PANIC("model_layout_grad_tp_partial: %s is split, not replicated", lb->out[ix].name);
    lb->out[ix].grad_tp_partial = true;
}

dtype_t model_param_dtype(const model_param_t *p, dtype_t compute)
{
    return p->keep_f32 ? DT_F32 : compute;
}

int model_layout_add_experts(model_layout_t *lb, const char *name, int ndim,
                             const int64_t *shape)
{
    int i = model_layout_add_nd(lb, name, ndim, shape, -1, 1);
    if (lb->out) {
        model_param_t *p = &lb->out[i];
        p->spec = shard_split(&p->spec, 0, SHARD_GROUP_EP, lb->ep_rank, lb->ep_size, 1);
        int64_t local[SHARD_MAX_DIMS];
        int nd = shard_local_shape(&p->spec, local);
        p->t = tensor_make(NULL, DT_F32, DEVICE_CPU, nd, local);
    }
    return i;
}

/* The layout of stage st for one TP rank: embedding, each layer's
 * sublayers (pre-norm weight, then the kind's tensors), final norm, head.
 * subs (when non-NULL) receives the sublayers; returns the tensor count. */
static int layout_build(const model_config_t *c, const model_stage_t *st,
                        const model_parallel_t *par, model_param_t *out, model_sub_t *subs,
                        int *n_subs, int *embed, int *final_norm, int *lm_head)
{
    const model_arch_info_t *arch = model_arch_info(c->arch);
    model_layout_t lb = {.out = out, .tp_rank = par ? par->tp_rank : 0,
                         .tp_size = par ? par->tp_size : 1, .ep_rank = par ? par->ep_rank : 0,
                         .ep_size = par && par->ep_size > 1 ? par->ep_size : 1};
    int64_t C = c->hidden_size, V = c->vocab_size;
    int e = -1, fn = -1, lh = -1, ns = 0;
    if (st->has_embedding || (st->has_head && c->tie_word_embeddings))
        e = model_layout_add(&lb, arch->embed, 2, V, C, 0, 1);
    for (int l = st->first_layer; l < st->last_layer; l++) {
        const model_kind_t *kinds[2] = {model_mixer_kind(c->blocks[l].mixer),
                                        model_ffn_kind(c->blocks[l].ffn)};
        const char *norms[2] = {arch->mixer_norm, arch->ffn_norm};
        const char *prefixes[2] = {arch->mixer_prefix, arch->ffn_prefix};
        for (int k = 0; k < 2; k++) {
            if (!kinds[k]) continue;
            char layer[MODEL_NAME_MAX], name[MODEL_NAME_MAX + 40], prefix[MODEL_NAME_MAX + 40];
            snprintf(layer, sizeof layer, arch->layer_prefix, l);
            snprintf(name, sizeof name, "%s.%s.weight", layer, norms[k]);
            snprintf(prefix, sizeof prefix, "%s.%s", layer, prefixes[k]);
            model_sub_t sub;
            memset(&sub, 0, sizeof sub);
            for (int i = 0; i < MODEL_SUB_SLOTS; i++) sub.ix[i] = -1;
            sub.kind = kinds[k];
            sub.layer = l;
            sub.norm = model_layout_add(&lb, name, 1, C, 0, -1, 1);
            kinds[k]->layout(&lb, c, prefix, &sub);
            if (subs) subs[ns] = sub;
            ns++;
        }
    }
    if (st->has_head) {
        fn = model_layout_add(&lb, arch->final_norm, 1, C, 0, -1, 1);
        lh = c->tie_word_embeddings ? e : model_layout_add(&lb, arch->lm_head, 2, V, C, 0, 1);
    }
    if (n_subs) *n_subs = ns;
    if (embed) *embed = st->has_embedding ? e : -1;
    if (final_norm) *final_norm = fn;
    if (lm_head) *lm_head = lh;
    return lb.n;
}

int model_layout(const model_config_t *cfg, const model_stage_t *stage, model_param_t *out)
{
    return model_layout_tp(cfg, stage, NULL, out);
}

int model_layout_tp(const model_config_t *cfg, const model_stage_t *stage,
                    const model_parallel_t *par, model_param_t *out)
{
    model_stage_t full = model_stage_full(cfg);
    return layout_build(cfg, stage ? stage : &full, par, out, NULL, NULL, NULL, NULL, NULL);
}

bt_status_t model_create(const model_config_t *cfg, const model_stage_t *stage, model_t **out)
{
    return model_create_tp(cfg, stage, NULL, out);
}

bt_status_t model_create_tp(const model_config_t *cfg, const model_stage_t *stage,
                            const model_parallel_t *par, model_t **out)
{
    model_place_t host = model_place_host();
    return model_create_on(cfg, stage, par, &host, out);
}

/* Every kernel op the stage needs, in the dtypes it needs them. */
static bt_status_t place_check(const model_t *m)
{
    const model_place_t *p = &m->place;
    char why[160], d[DEVICE_STR_MAX];
    if (!kern_device_usable(p->dev, why, sizeof why)) {
        log_error("model: device %s cannot be used: %s", device_str(p->dev, d), why);
        return BT_ERR_UNSUPPORTED;
    }
    if (p->param_dtype != p->act_dtype) {
        log_error("model: parameters in %s with activations in %s: the kernels take one "
                  "compute dtype",
                  dtype_name(p->param_dtype), dtype_name(p->act_dtype));
        return BT_ERR_UNSUPPORTED;
    }
    if (p->grad_dtype != p->param_dtype && p->grad_dtype != DT_F32) {
        log_error("model: gradients in %s: they are f32 or the parameter dtype",
                  dtype_name(p->grad_dtype));
        return BT_ERR_UNSUPPORTED;
    }
    static const kern_op_t common[] = {KERN_OP_EMBEDDING, KERN_OP_RMSNORM, KERN_OP_LINEAR,
                                       KERN_OP_XENT, KERN_OP_ELEMENTWISE, KERN_OP_MATMUL};
    for (size_t i = 0; i < sizeof common / sizeof common[0]; i++)
        if (!kern_supports(p->dev, common[i], p->act_dtype)) {
            log_error("model: the %s backend has no %s kernel for %s", device_str(p->dev, d),
                      kern_op_name(common[i]), dtype_name(p->act_dtype));
            return BT_ERR_UNSUPPORTED;
        }
    if (!kern_supports(p->dev, KERN_OP_REDUCE, p->grad_dtype)) {
        log_error("model: the %s backend cannot reduce %s gradients", device_str(p->dev, d),
                  dtype_name(p->grad_dtype));
        return BT_ERR_UNSUPPORTED;
    }
    for (int s = 0; s < m->n_subs; s++) {
        const model_kind_t *k = m->subs[s].kind;
        for (int i = 0; i < k->n_ops; i++)
            if (!kern_supports(p->dev, k->ops[i], p->act_dtype)) {
                log_error("model: the %s backend has no %s kernel for %s (needed by the %s "
                          "block of layer %d)",
                          device_str(p->dev, d), kern_op_name(k->ops[i]),
                          dtype_name(p->act_dtype), k->name, m->subs[s].layer);
                return BT_ERR_UNSUPPORTED;
            }
    }
    return BT_OK;
}

/* Bytes of a block carving views of dtype dt for every parameter (in
 * doubles: an absurd config gives an absurd size, never a wrapped one);
 * per_param: each view in model_param_dtype(view, dt) instead. */
static double carve_bytes(const model_param_t *views, int n, dtype_t dt, bool per_param)
{
    double off = 0;
    for (int i = 0; i < n; i++) {
        off = ceil(off / MODEL_VIEW_ALIGN) * MODEL_VIEW_ALIGN;
        double es = (double)dtype_size(per_param ? model_param_dtype(&views[i], dt) : dt);
        double numel = 1;
        for (int d = 0; d < views[i].t.ndim; d++) numel *= (double)views[i].t.shape[d];
        off += numel * es;
    }
    return ceil(off / MODEL_VIEW_ALIGN) * MODEL_VIEW_ALIGN;
}

/* Carves views of dtype dt (per_param: carve_bytes) out of base for every
 * parameter; returns bytes (the caller checked carve_bytes fits). */
static size_t carve(model_param_t *views, int n, void *base, dtype_t dt, bool per_param,
                    device_t dev)
{
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        off = (off + MODEL_VIEW_ALIGN - 1) / MODEL_VIEW_ALIGN * MODEL_VIEW_ALIGN;
        tensor_t *t = &views[i].t;
        dtype_t vdt = per_param ? model_param_dtype(&views[i], dt) : dt;
        *t = tensor_make(base ? (char *)base + off : NULL, vdt, dev, t->ndim, t->shape);
        off += tensor_nbytes(t);
    }
    return (off + MODEL_VIEW_ALIGN - 1) / MODEL_VIEW_ALIGN * MODEL_VIEW_ALIGN;
}

/* 2^62: no allocation of more can succeed anywhere */
#define MODEL_BYTES_MAX 4611686018427387904.0

/* the whole of [p, p + bytes) on dev, as a byte tensor */
static tensor_t bytes_view(void *p, size_t bytes, device_t dev)
{
    int64_t n = (int64_t)bytes;
    return tensor_make(p, DT_U8, dev, 1, &n);
}

bt_status_t model_create_on(const model_config_t *cfg, const model_stage_t *stage,
                            const model_parallel_t *par, const model_place_t *place,
                            model_t **out)
{
    bt_status_t st = model_config_validate(cfg);
    if (st != BT_OK) return st;
    model_parallel_t solo = {.tp_rank = 0, .tp_size = 1, .tp_comm = NULL};
    if (!par) par = &solo;
    if ((st = model_parallel_validate(cfg, par)) != BT_OK) return st;
    model_stage_t full = model_stage_full(cfg);
    const model_stage_t *s = stage ? stage : &full;
    if (s->first_layer < 0 || s->last_layer < s->first_layer || s->last_layer > cfg->num_layers) {
        log_error("model: stage layers [%d, %d) outside the model's %lld layers", s->first_layer,
                  s->last_layer, (long long)cfg->num_layers);
        return BT_ERR_INVALID;
    }
    model_t *m = calloc(1, sizeof *m);
    if (!m) return BT_ERR_NOMEM;
    m->cfg = *cfg;
    m->stage = *s;
    m->par = *par;
    if (m->par.ep_size < 1) m->par.ep_size = 1;
    if (m->par.cp_size < 1) m->par.cp_size = 1;
    m->place = *place;
    model_vocab_split(cfg->vocab_size, par->tp_size, par->tp_rank, &m->vocab_start, &m->vocab);
    int ns = 0;
    int n = layout_build(cfg, s, par, NULL, NULL, &ns, NULL, NULL, NULL);
    m->params = calloc((size_t)n + 1, sizeof *m->params);
    m->grads = calloc((size_t)n + 1, sizeof *m->grads);
    m->subs = calloc((size_t)ns + 1, sizeof *m->subs);
    if (!m->params || !m->grads || !m->subs) {
        st = BT_ERR_NOMEM;
        goto fail;
    }
    m->n_params = layout_build(cfg, s, par, m->params, m->subs, &m->n_subs, &m->embed,
                               &m->final_norm, &m->lm_head);
    if ((st = place_check(m)) != BT_OK) goto fail;
    if ((st = kern_stream_create(place->dev, &m->stream)) != BT_OK) goto fail;
    double want = carve_bytes(m->params, m->n_params, place->param_dtype, true);
    if (want >= MODEL_BYTES_MAX) {
        log_error("model: %.3g bytes of parameters cannot be allocated", want);
        st = BT_ERR_NOMEM;
        goto fail;
    }
    m->param_bytes = carve(m->params, m->n_params, NULL, place->param_dtype, true, place->dev);
    if ((st = kern_mem_alloc(place->dev, m->param_bytes, &m->param_mem)) != BT_OK) {
        log_error("model: cannot allocate %zu bytes of parameters", m->param_bytes);
        goto fail;
    }
    carve(m->params, m->n_params, m->param_mem, place->param_dtype, true, place->dev);
    tensor_t all = bytes_view(m->param_mem, m->param_bytes, place->dev);
    kern_zero(m->stream, &all);
    if (place->param_dtype != DT_F32) {
        m->masters = calloc((size_t)m->n_params + 1, sizeof *m->masters);
        if (!m->masters) {
            st = BT_ERR_NOMEM;
            goto fail;
        }
        memcpy(m->masters, m->params, (size_t)m->n_params * sizeof *m->masters);
        m->master_bytes = carve(m->masters, m->n_params, NULL, DT_F32, false, place->dev);
        if ((st = kern_mem_alloc(place->dev, m->master_bytes, &m->master_mem)) != BT_OK) goto fail;
        carve(m->masters, m->n_params, m->master_mem, DT_F32, false, place->dev);
        tensor_t mall = bytes_view(m->master_mem, m->master_bytes, place->dev);
        kern_zero(m->stream, &mall);
        /* an f32 parameter is its own master: the optimizer updates it in
         * place (no copy to write) and checkpoints read it, so a second
         * f32 view would go stale (its few bytes in master_mem stay unused) */
        for (int i = 0; i < m->n_params; i++)
            if (m->params[i].t.dtype == DT_F32) m->masters[i].t = m->params[i].t;
    }
    for (int i = 0; i < m->n_params; i++) {
        m->grads[i] = m->params[i];
        m->grads[i].t = tensor_make(NULL, place->grad_dtype, place->dev, m->params[i].t.ndim,
                                    m->params[i].t.shape);
    }
    for (int i = 0; i < m->n_subs; i++) m->n_moe += m->subs[i].kind == &model_kind_moe;
    if (m->n_moe) {
        if (cfg->moe.bias_rate > 0 && !kern_supports(place->dev, KERN_OP_MOE_RESELECT, DT_F32)) {
            char d[DEVICE_STR_MAX];
            log_error("model: router_bias_update_rate=%g needs the moe_route_reselect kernel, "
                      "which the %s backend does not have (cpu, fenced and cuda do)",
                      cfg->moe.bias_rate, device_str(place->dev, d));
            st = BT_ERR_UNSUPPORTED;
            goto fail;
        }
        size_t bytes = (size_t)m->n_moe * 3 * model_align((size_t)cfg->moe.n_experts * 4);
        if ((st = kern_mem_alloc(place->dev, bytes, &m->moe_load_mem)) != BT_OK) goto fail;
        tensor_t lall = bytes_view(m->moe_load_mem, bytes, place->dev);
        kern_zero(m->stream, &lall);
    }
    if ((st = kern_stream_sync(m->stream)) != BT_OK) goto fail;
    *out = m;
    return BT_OK;

fail:
    model_destroy(m);
    return st;
}

tensor_t model_moe_load_view(const model_t *m, int k, int which)
{
    int64_t E = m->cfg.moe.n_experts;
    size_t one = model_align((size_t)E * 4);
    return tensor_make((char *)m->moe_load_mem + ((size_t)k * 3 + (size_t)which) * one, DT_F32,
                       m->place.dev, 1, &E);
}

bt_status_t model_moe_balance(model_t *m, const double *load)
{
    double rate = m->cfg.moe.bias_rate;
    int64_t E = m->cfg.moe.n_experts;
    if (rate <= 0 || !m->n_moe) return BT_OK;
    float *b = malloc((size_t)E * sizeof *b);
    if (!b) return BT_ERR_NOMEM;
    bt_status_t st = BT_OK;
    for (int k = 0; k < m->n_moe && st == BT_OK; k++) {
        const double *row = load + (size_t)k * (size_t)(E + 1) + 1;
        double mean = 0;
        for (int64_t e = 0; e < E; e++) mean += row[e];
        mean /= (double)E;
        tensor_t t = model_moe_load_view(m, k, 2);
        kern_download(m->stream, b, &t);
        if ((st = kern_stream_sync(m->stream)) != BT_OK) break;
        for (int64_t e = 0; e < E; e++)
            b[e] = (float)((double)b[e] + rate * (double)((mean > row[e]) - (mean < row[e])));
        kern_upload(m->stream, &t, b);
        st = kern_stream_sync(m->stream);
    }
    free(b);
    return st;
}

int model_moe_bias_views(const model_t *m, tensor_t *views, char (*names)[MODEL_NAME_MAX])
{
    if (m->cfg.moe.bias_rate <= 0) return 0;
    int k = 0;
    for (int i = 0; i < m->n_subs; i++) {
        if (m->subs[i].kind != &model_kind_moe) continue;
        if (views) views[k] = model_moe_load_view(m, k, 2);
        if (names) {
            /* beside the router: "...mlp.gate.weight" -> "...mlp.gate.selection_bias" */
            const char *rn = m->params[m->subs[i].ix[0]].name;
            size_t n = strlen(rn);
            if (n > 7 && !strcmp(rn + n - 7, ".weight")) n -= 7;
            snprintf(names[k], MODEL_NAME_MAX, "%.*s.selection_bias", (int)n, rn);
        }
        k++;
    }
    return k;
}

int model_moe_load_take(model_t *m, double *out)
{
    int64_t E = m->cfg.moe.n_experts;
    float *h = m->n_moe ? malloc((size_t)E * sizeof *h) : NULL;
    int k = 0;
    for (int i = 0; i < m->n_subs && (!m->n_moe || h); i++) {
        if (m->subs[i].kind != &model_kind_moe) continue;
        tensor_t t = model_moe_load_view(m, k, 0);
        kern_download(m->stream, h, &t);
        kern_zero(m->stream, &t);
        bool ok = kern_stream_sync(m->stream) == BT_OK;
        double *row = out ? out + (size_t)k * (size_t)(E + 1) : NULL;
        if (row) row[0] = m->subs[i].layer;
        for (int64_t e = 0; row && e < E; e++) row[1 + e] = ok ? (double)h[e] : NAN;
        k++;
    }
    free(h);
    return k;
}

int64_t model_moe_dropped_take(model_t *m)
{
    if (!m->n_moe || !(m->cfg.moe.capacity_factor > 0)) return -1;
    int64_t d = m->moe_dropped_train;
    m->moe_dropped_train = 0;
    return d;
}

void model_destroy(model_t *m)
{
    if (!m) return;
    if (m->stream) kern_stream_sync(m->stream);
    kern_mem_free(m->place.dev, m->moe_load_mem);
    kern_mem_free(m->place.dev, m->grad_mem);
    kern_mem_free(m->place.dev, m->master_mem);
    kern_mem_free(m->place.dev, m->param_mem);
    free(m->masters);
    kern_host_free(m->place.dev, m->host_buf);
    kern_stream_destroy(m->stream);
    free(m->subs);
    free(m->grads);
    free(m->params);
    free(m);
}

void model_mem_estimate(const model_config_t *cfg, const model_stage_t *stage, int tp_rank,
                        int tp_size, int64_t B, int64_t T, model_mem_t *out)
{
    model_parallel_t par = {.tp_rank = tp_rank, .tp_size = tp_size};
    model_mem_estimate_par(cfg, stage, &par, B, T, out);
}

void model_mem_estimate_par(const model_config_t *cfg, const model_stage_t *stage,
                            const model_parallel_t *par, int64_t B, int64_t T, model_mem_t *out)
{
    memset(out, 0, sizeof *out);
    int tp_rank = par->tp_rank, tp_size = par->tp_size;
    model_stage_t full = model_stage_full(cfg);
    /* a shell of the instance model_create_tp would build: its layout and
     * sublayers, no memory */
    model_t m;
    memset(&m, 0, sizeof m);
    m.cfg = *cfg;
    m.stage = stage ? *stage : full;
    m.par = (model_parallel_t){.tp_rank = tp_rank, .tp_size = tp_size > 0 ? tp_size : 1,
                               .ep_rank = par->ep_size > 1 ? par->ep_rank : 0,
                               .ep_size = par->ep_size > 1 ? par->ep_size : 1,
                               .cp_rank = par->cp_size > 1 ? par->cp_rank : 0,
                               .cp_size = par->cp_size > 1 ? par->cp_size : 1,
                               .cp_ring = par->cp_ring, .sp = par->sp};
    m.place = model_place_host();
    model_vocab_split(cfg->vocab_size, m.par.tp_size, tp_rank, &m.vocab_start, &m.vocab);
    int ns = 0, n = layout_build(cfg, &m.stage, &m.par, NULL, NULL, &ns, NULL, NULL, NULL);
    m.params = calloc((size_t)n + 1, sizeof *m.params);
    m.subs = calloc((size_t)ns + 1, sizeof *m.subs);
    if (!m.params || !m.subs) {
        out->params = out->acts = INFINITY; /* what cannot be computed cannot be allocated */
        goto out;
    }
    m.n_params = layout_build(cfg, &m.stage, &m.par, m.params, m.subs, &m.n_subs, &m.embed,
                              &m.final_norm, &m.lm_head);
    out->params = carve_bytes(m.params, m.n_params, DT_F32, false);
    for (int i = 0; i < m.n_params; i++) {
        double local = 1, whole = 1;
        for (int d = 0; d < m.params[i].spec.ndim; d++) {
            local *= (double)m.params[i].spec.extent[d];
            whole *= (double)m.params[i].spec.global[d];
        }
        if (i == m.embed || i == m.lm_head) out->vocab_params += 4 * local;
        if (MODEL_PARAM_IS_EXPERT(&m.params[i].spec)) out->expert_params += 4 * local;
        if (4 * whole > out->largest) out->largest = 4 * whole;
    }
    if (B > 0 && T > 0) {
        out->acts = model_acts_plan_bytes(&m, B, T, MODEL_ACTS_TRAIN);
        double sc = 0;
        for (int s = 0; s < m.n_subs; s++) {
            double b = m.subs[s].kind->scratch_bytes(&m, B, T);
            if (b > sc) sc = b;
        }
        out->acts_scratch = model_align_d(sc > 0 ? sc : 1);
        for (int s = 0; s < m.n_subs; s++) {
            const model_kind_t *k = m.subs[s].kind;
            bool have = !k->shared_bytes;
            for (int i = 0; i < out->n_shared; i++) have |= out->shared_kind[i] == k;
            if (have || out->n_shared == 8) continue;
            out->shared_kind[out->n_shared] = k;
            out->acts_shared[out->n_shared++] = model_align_d(k->shared_bytes(&m, T));
        }
        out->acts_fwd = model_acts_plan_bytes(&m, B, T, MODEL_ACTS_FWD);
        out->acts_decode = model_acts_plan_bytes(&m, 1, T, MODEL_ACTS_DECODE);
    }
out:
    free(m.subs);
    free(m.params);
}

bool model_name_is_stacked(const char *name)
{
    const char *p = strchr(name, MODEL_STACK_MARK);
    return p && !strchr(p + 1, MODEL_STACK_MARK);
}

bool model_name_unstack(const char *name, int64_t i, char *out, size_t cap)
{
    if (!model_name_is_stacked(name) || i < 0) return false;
    const char *p = strchr(name, MODEL_STACK_MARK);
    int n = snprintf(out, cap, "%.*s%lld%s", (int)(p - name), name, (long long)i, p + 1);
    return n >= 0 && (size_t)n < cap;
}

bool model_name_stack_index(const char *stacked, const char *hf, int64_t *i)
{
    if (!model_name_is_stacked(stacked)) return false;
    const char *p = strchr(stacked, MODEL_STACK_MARK);
    size_t pre = (size_t)(p - stacked), post = strlen(p + 1), n = strlen(hf);
    if (n < pre + post + 1 || strncmp(hf, stacked, pre) || strcmp(hf + n - post, p + 1)) return false;
    const char *d = hf + pre, *end = hf + n - post;
    if (end - d > 1 && *d == '0') return false; /* "07": not a name the index gives */
    int64_t v = 0;
    for (; d < end; d++) {
        if (*d < '0' || *d > '9' || v > (INT64_MAX - 9) / 10) return false;
        v = v * 10 + (*d - '0');
    }
    *i = v;
    return true;
}

bool model_name_part(const char *name, char *base, size_t cap, int *k)
{
    const char *p = strrchr(name, MODEL_PART_MARK);
    if (!p || !p[1] || p == name) return false;
    int v = 0;
    for (const char *d = p + 1; *d; d++) {
        if (*d < '0' || *d > '9' || v > 100000) return false;
        v = v * 10 + (*d - '0');
    }
    if ((size_t)(p - name) >= cap) return false;
    memcpy(base, name, (size_t)(p - name));
    base[p - name] = '\0';
    *k = v;
    return true;
}

bool model_part_rows(const model_param_t *ps, int n, int i, int64_t *row0, int64_t *rows)
{
    char base[MODEL_NAME_MAX], other[MODEL_NAME_MAX];
    int k, j_k;
    if (!model_name_part(ps[i].name, base, sizeof base, &k)) return false;
    *row0 = *rows = 0;
    for (int j = 0; j < n; j++) {
        if (!model_name_part(ps[j].name, other, sizeof other, &j_k) || strcmp(other, base)) continue;
        if (j_k < k) *row0 += ps[j].spec.global[0];
        *rows += ps[j].spec.global[0];
    }
    return true;
}

int model_param_find(const model_t *m, const char *name)
{
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) return i;
    return -1;
}

bt_status_t model_host_buf(model_t *m, size_t bytes, void **out)
{
    if (bytes > m->host_buf_bytes) {
        kern_host_free(m->place.dev, m->host_buf);
        m->host_buf = NULL;
        m->host_buf_bytes = 0;
        bt_status_t st = kern_host_alloc(m->place.dev, bytes, &m->host_buf);
        if (st != BT_OK) return st;
        m->host_buf_bytes = bytes;
    }
    *out = m->host_buf;
    return BT_OK;
}

/* host f32 <-> a tensor t of m's device in t's dtype */
bt_status_t model_tensor_read_f32(const model_t *m, const tensor_t *t, float *host)
{
    if (t->dtype == DT_F32) {
        kern_download(m->stream, host, t);
        return kern_stream_sync(m->stream);
    }
    void *raw = malloc(tensor_nbytes(t) + 1);
    if (!raw) return BT_ERR_NOMEM;
    kern_download(m->stream, raw, t);
    bt_status_t st = kern_stream_sync(m->stream);
    if (st == BT_OK) {
        tensor_t src = tensor_on(*t, DEVICE_CPU), dst = tensor_on(*t, DEVICE_CPU);
        src.data = raw;
        dst.dtype = DT_F32;
        dst.data = host;
        kern_copy(kern_stream_host(), &dst, &src);
    }
    free(raw);
    return st;
}

bt_status_t model_tensor_write_f32(model_t *m, tensor_t *t, const float *host)
{
    if (t->dtype == DT_F32) {
        kern_upload(m->stream, t, host);
        return kern_stream_sync(m->stream);
    }
    void *raw = malloc(tensor_nbytes(t) + 1);
    if (!raw) return BT_ERR_NOMEM;
    tensor_t src = tensor_on(*t, DEVICE_CPU), dst = tensor_on(*t, DEVICE_CPU);
    src.dtype = DT_F32;
    src.data = (void *)host;
    dst.data = raw;
    kern_copy(kern_stream_host(), &dst, &src);
    kern_upload(m->stream, t, raw);
    bt_status_t st = kern_stream_sync(m->stream);
    free(raw);
    return st;
}

float *model_param_host_f32(model_t *m, int i)
{
    tensor_t *t = &m->params[i].t;
    if (m->masters || t->dtype != DT_F32 || t->device.kind != DEV_CPU || !tensor_is_contiguous(t))
        return NULL;
    return t->data;
}

const char *model_first_nonfinite_param(const model_t *m)
{
    for (int i = 0; i < m->n_params; i++)
        if (kern_count_nonfinite(m->stream, &m->params[i].t) ||
            (m->masters && kern_count_nonfinite(m->stream, &m->masters[i].t)))
            return m->params[i].name;
    return NULL;
}

bt_status_t model_param_read(const model_t *m, int i, bool grad, float *host)
{
    if (grad && !m->grad_mem) {
        log_error("model: reading the gradient of %s, but gradients are not allocated",
                  m->params[i].name);
        return BT_ERR_INVALID;
    }
    const tensor_t *t = grad ? &m->grads[i].t : m->masters ? &m->masters[i].t : &m->params[i].t;
    return model_tensor_read_f32(m, t, host);
}

bt_status_t model_param_write(model_t *m, int i, const float *host)
{
    bt_status_t st = model_tensor_write_f32(m, &m->params[i].t, host);
    if (st == BT_OK && m->masters) st = model_tensor_write_f32(m, &m->masters[i].t, host);
    return st;
}

bt_status_t model_grads_alloc(model_t *m)
{
    if (m->grad_mem) return BT_OK;
    m->grad_bytes = carve(m->grads, m->n_params, NULL, m->place.grad_dtype, false, m->place.dev);
    if (kern_mem_alloc(m->place.dev, m->grad_bytes, &m->grad_mem) != BT_OK) {
        log_error("model: cannot allocate gradients for %d tensors (%zu bytes)", m->n_params,
                  m->grad_bytes);
        return BT_ERR_NOMEM;
    }
    carve(m->grads, m->n_params, m->grad_mem, m->place.grad_dtype, false, m->place.dev);
    model_grads_zero(m);
    return kern_stream_sync(m->stream);
}

void model_grads_zero(model_t *m)
{
    if (!m->grad_mem) return;
    tensor_t all = bytes_view(m->grad_mem, m->grad_bytes, m->place.dev);
    kern_zero(m->stream, &all);
}

double model_grads_sumsq(const model_t *m)
{
    if (!m->grad_mem) return 0.0;
    double s = 0.0;
    for (int i = 0; i < m->n_params; i++) s += kern_sumsq(m->stream, &m->grads[i].t);
    return s;
}

/* splitmix64, addressed by draw number: draw k (0-based) from seed s. Being
 * counter-based lets any piece of a tensor draw exactly its elements'. */
static uint64_t model_rng_at(uint64_t s, uint64_t k)
{
    uint64_t z = s + (k + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double model_rng_uniform(uint64_t s, uint64_t k)
{
    return ((double)(model_rng_at(s, k) >> 11) + 0.5) / 9007199254740992.0;
}

/* one tensor's normal draws, in pieces of INIT_PIECE elements on the host
 * pool: element k's value depends on (seed, its global index) only */
enum { INIT_PIECE = 1 << 16 };
typedef struct {
    float *h;
    const shard_spec_t *spec;
    uint64_t s;
    int64_t n;
    float std;
} init_job_t;

static void init_piece(void *arg, int64_t piece)
{
    const init_job_t *j = arg;
    int64_t k0 = piece * INIT_PIECE, k1 = k0 + INIT_PIECE < j->n ? k0 + INIT_PIECE : j->n;
    for (int64_t k = k0; k < k1; k++) {
        uint64_t g = (uint64_t)shard_global_index(j->spec, k);
        double u1 = model_rng_uniform(j->s, 2 * g), u2 = model_rng_uniform(j->s, 2 * g + 1);
        j->h[k] = (float)(j->std * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
}

bt_status_t model_init_random(model_t *m, uint64_t seed, float std)
{
    for (int i = 0; i < m->n_params; i++) {
        model_param_t *p = &m->params[i];
        int64_t n = tensor_numel(&p->t);
        float *h = malloc((size_t)(n ? n : 1) * sizeof *h);
        if (!h) return BT_ERR_NOMEM;
        size_t len = strlen(p->name);
        bool is_norm = len > 11 && strstr(p->name, "norm.weight") != NULL;
        bool is_bias = len > 5 && !strcmp(p->name + len - 5, ".bias");
        /* Seed per tensor by name so that a stage initializes its layers
         * exactly as the whole model would; element j of the HF tensor uses
         * draws 2j and 2j+1, so a TP piece gets its slice of the same values.
         * A 1.1B model is 2.2G draws with a log and a cos each: a minute on
         * one core, hence the pool. */
        uint64_t s = seed;
        for (size_t k = 0; k < len; k++) s = (s ^ (uint8_t)p->name[k]) * 0x100000001b3ull;
        if (is_norm || is_bias) {
            for (int64_t k = 0; k < n; k++) h[k] = is_norm ? 1.0f : 0.0f;
        } else {
            init_job_t j = {.h = h, .spec = &p->spec, .s = s, .n = n, .std = std};
            kern_host_parallel((n + INIT_PIECE - 1) / INIT_PIECE, init_piece, &j);
        }
        bt_status_t st = model_param_write(m, i, h);
        free(h);
        if (st != BT_OK) return st;
    }
    return BT_OK;
}

void model_targets_from_ids(int32_t *targets, const int32_t *ids, const int64_t *len, int64_t B,
                            int64_t T)
{
    for (int64_t b = 0; b < B; b++) {
        int64_t n = len ? len[b] : T;
        for (int64_t t = 0; t < T; t++)
            targets[b * T + t] = t + 1 < n ? ids[b * T + t + 1] : MODEL_IGNORE_INDEX;
    }
}

int64_t model_count_scored(const int32_t *targets, int64_t n)
{
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += targets[i] != MODEL_IGNORE_INDEX;
    return k;
}

int64_t model_num_params(const model_config_t *cfg)
{
    int n = model_layout(cfg, NULL, NULL);
    model_param_t *p = calloc((size_t)n + 1, sizeof *p);
    if (!p) return -1;
    model_layout(cfg, NULL, p);
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += tensor_numel(&p[i].t);
    free(p);
    return total;
}
