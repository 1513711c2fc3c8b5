#include "train/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kernels/kernels.h"
#include "model/model.h"

struct optim {
    optim_config_t cfg;
    kern_stream_t *s;
    device_t       dev;
    int            n;
    optim_param_t *params;  /* copies of the borrowed views */
    bool          *decay;   /* [n] */
    void          *state;   /* device: m, v for every parameter, then the f32 masters */
    tensor_t      *m, *v;   /* [n] views into state */
    tensor_t      *master;  /* [n] f32 master of a non-f32 parameter, else .data NULL */
    tensor_t       grads;   /* on a GPU, the model's whole gradient block (1-D), else .data NULL */
    int64_t        step;
};

static bool decays(optim_decay_t policy, const tensor_t *t)
{
    switch (policy) {
    case OPTIM_DECAY_MATRICES: return t->ndim >= 2;
    case OPTIM_DECAY_ALL: return true;
    case OPTIM_DECAY_NONE: return false;
    default: BT_PANIC("decay policy %d", (int)policy);
    }
}

static size_t align64(size_t n) { return (n + 63) / 64 * 64; }

bt_status_t optim_create(const optim_config_t *cfg, const optim_param_t *params, int n,
                         kern_stream_t *s, optim_t **out)
{
    optim_t *o = calloc(1, sizeof *o);
    if (!o) return BT_ERR_NOMEM;
    o->cfg = *cfg;
    o->s = s;
    o->dev = kern_stream_device(s);
    o->n = n;
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        const optim_param_t *p = &params[i];
        if (!dtype_is_float(p->param.dtype) || !tensor_same_shape(&p->param, &p->grad) ||
            !device_eq(p->param.device, o->dev) || !device_eq(p->grad.device, o->dev)) {
            log_error("optimizer: parameter %s: needs a float tensor and a gradient of the same "
                      "shape on the optimizer's device",
                      p->name);
            free(o);
            return BT_ERR_INVALID;
        }
        size_t one = align64((size_t)tensor_numel(&p->param) * sizeof(float));
        bytes += 2 * one + (p->param.dtype != DT_F32 && !p->master.data ? one : 0);
    }
    o->params = calloc((size_t)n + 1, sizeof *o->params);
    o->decay = calloc((size_t)n + 1, sizeof *o->decay);
    o->m = calloc((size_t)n + 1, sizeof *o->m);
    o->v = calloc((size_t)n + 1, sizeof *o->v);
    o->master = calloc((size_t)n + 1, sizeof *o->master);
    bt_status_t st = BT_ERR_NOMEM;
    if (!o->params || !o->decay || !o->m || !o->v || !o->master) goto fail;
    if ((st = kern_mem_alloc(o->dev, bytes ? bytes : 64, &o->state)) != BT_OK) {
        log_error("optimizer: cannot allocate %zu bytes of AdamW state", bytes);
        goto fail;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const tensor_t *p = &params[i].param;
        size_t one = align64((size_t)tensor_numel(p) * sizeof(float));
        o->params[i] = params[i];
        o->decay[i] = decays(cfg->decay, p);
        o->m[i] = tensor_make((char *)o->state + off, DT_F32, o->dev, p->ndim, p->shape);
        o->v[i] = tensor_make((char *)o->state + off + one, DT_F32, o->dev, p->ndim, p->shape);
        kern_zero(s, &o->m[i]);
        kern_zero(s, &o->v[i]);
        off += 2 * one;
        if (p->dtype != DT_F32 && params[i].master.data) {
            o->master[i] = params[i].master; /* the model's exact f32 values */
        } else if (p->dtype != DT_F32) {
            /* no master given: it starts as the copy widened */
            o->master[i] = tensor_make((char *)o->state + off, DT_F32, o->dev, p->ndim, p->shape);
            kern_copy(s, &o->master[i], p);
            off += one;
        }
    }
    if ((st = kern_stream_sync(s)) != BT_OK) goto fail;
    *out = o;
    return BT_OK;
fail:
    optim_destroy(o);
    return st;
}

bt_status_t optim_create_for_model(const optim_config_t *cfg, model_t *m, optim_t **out)
{
    if (!m->grad_mem) {
        log_error("optimizer: the model has no gradient buffers (model_grads_alloc first)");
        return BT_ERR_INVALID;
    }
    optim_param_t *ps = calloc((size_t)m->n_params + 1, sizeof *ps);
    if (!ps) return BT_ERR_NOMEM;
    for (int i = 0; i < m->n_params; i++)
        ps[i] = (optim_param_t){.name = m->params[i].name, .param = m->params[i].t,
                                .grad = m->grads[i].t,
                                .master = m->masters ? m->masters[i].t : (tensor_t){0}};
    bt_status_t st = optim_create(cfg, ps, m->n_params, m->stream, out);
    free(ps);
    /* On a GPU the norm is one reduction over the gradient block (its padding
     * between views is zero: model_grads_zero clears the block and no kernel
     * writes outside a view): one wait for the stream instead of one per
     * tensor (111 for a 12-layer Llama). On cpu and fenced the per-tensor sums
     * stay, whose order the layouts' bit-identity tests pin. */
    if (st == BT_OK && m->place.dev.kind == DEV_CUDA) {
        int64_t n = (int64_t)(m->grad_bytes / dtype_size(m->place.grad_dtype));
        (*out)->grads = tensor_make(m->grad_mem, m->place.grad_dtype, m->place.dev, 1, &n);
    }
    return st;
}

void optim_destroy(optim_t *o)
{
    if (!o) return;
    if (o->state) kern_mem_free(o->dev, o->state);
    free(o->master);
    free(o->v);
    free(o->m);
    free(o->decay);
    free(o->params);
    free(o);
}

bool optim_param_decays(const optim_t *o, int i) { return o->decay[i]; }
int optim_param_count(const optim_t *o) { return o->n; }
int64_t optim_step_count(const optim_t *o) { return o->step; }
void optim_set_step_count(optim_t *o, int64_t n) { o->step = n; }
const optim_param_t *optim_param(const optim_t *o, int i) { return &o->params[i]; }
tensor_t optim_moment1(const optim_t *o, int i) { return o->m[i]; }
tensor_t optim_moment2(const optim_t *o, int i) { return o->v[i]; }

double optim_grad_norm(const optim_t *o)
{
    if (o->grads.data) return sqrt(kern_sumsq(o->s, &o->grads));
    double sum = 0.0;
    for (int i = 0; i < o->n; i++) sum += kern_sumsq(o->s, &o->params[i].grad);
    return sqrt(sum);
}

double optim_clip_coef(double total_norm, double max_norm)
{
    if (max_norm <= 0.0) return 1.0;
    double coef = max_norm / (total_norm + 1e-6);
    return coef < 1.0 ? coef : 1.0;
}

const char *optim_find_nonfinite_grad(const optim_t *o)
{
    for (int i = 0; i < o->n; i++)
        if (kern_count_nonfinite(o->s, &o->params[i].grad)) return o->params[i].name;
    return NULL;
}

bool optim_test_poison(int64_t step, int rank)
{
    const char *e = getenv("BATON_TEST_NONFINITE");
    if (!e || !*e) return false;
    char *end;
    long long from = strtoll(e, &end, 10);
    bool onward = *end == '+';
    if (onward) end++;
    long long at_rank = *end == '@' ? strtoll(end + 1, NULL, 10) : 0;
    return rank == at_rank && (onward ? step >= from : step == from);
}

void optim_step(optim_t *o, double lr, double clip_coef)
{
    o->step++;
    /* on a GPU one scale of the whole block (the same products element by
     * element) instead of one launch per tensor */
    bool block = o->grads.data && clip_coef < 1.0;
    if (block) kern_scale(o->s, &o->grads, (float)clip_coef);
    for (int i = 0; i < o->n; i++) {
        if (clip_coef < 1.0 && !block) kern_scale(o->s, &o->params[i].grad, (float)clip_coef);
        adamw_args_t args = {
            .lr = (float)lr,
            .beta1 = (float)o->cfg.beta1,
            .beta2 = (float)o->cfg.beta2,
            .eps = (float)o->cfg.eps,
            .weight_decay = o->decay[i] ? (float)o->cfg.weight_decay : 0.0f,
            .step = o->step,
        };
        bool copy = o->master[i].data != NULL;
        kern_adamw(o->s, copy ? &o->master[i] : &o->params[i].param,
                   copy ? &o->params[i].param : NULL, &o->params[i].grad, &o->m[i], &o->v[i],
                   &args);
    }
}
