#include "model/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kernels/kernels.h"
#include "model/model.h"

struct optim {
    optim_config_t cfg;
    int            n;
    optim_param_t *params;  /* copies of the borrowed views */
    bool          *decay;   /* [n] */
    float         *moments; /* 2 * total floats: m then v for every parameter */
    tensor_t      *m, *v;   /* [n] views into moments */
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

bt_status_t optim_create(const optim_config_t *cfg, const optim_param_t *params, int n,
                         optim_t **out)
{
    optim_t *o = calloc(1, sizeof *o);
    if (!o) return BT_ERR_NOMEM;
    o->cfg = *cfg;
    o->n = n;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (params[i].param.dtype != DT_F32 || !tensor_same_shape(&params[i].param, &params[i].grad)) {
            log_error("optimizer: parameter %s: needs an f32 tensor and a gradient of the same shape",
                      params[i].name);
            free(o);
            return BT_ERR_INVALID;
        }
        total += (size_t)tensor_numel(&params[i].param);
    }
    o->params = calloc((size_t)n + 1, sizeof *o->params);
    o->decay = calloc((size_t)n + 1, sizeof *o->decay);
    o->m = calloc((size_t)n + 1, sizeof *o->m);
    o->v = calloc((size_t)n + 1, sizeof *o->v);
    o->moments = calloc(2 * total + 1, sizeof *o->moments);
    if (!o->params || !o->decay || !o->m || !o->v || !o->moments) {
        optim_destroy(o);
        return BT_ERR_NOMEM;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const tensor_t *p = &params[i].param;
        o->params[i] = params[i];
        o->decay[i] = decays(cfg->decay, p);
        o->m[i] = tensor_make(o->moments + off, DT_F32, p->device, p->ndim, p->shape);
        o->v[i] = tensor_make(o->moments + total + off, DT_F32, p->device, p->ndim, p->shape);
        off += (size_t)tensor_numel(p);
    }
    *out = o;
    return BT_OK;
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
                                .grad = m->grads[i].t};
    bt_status_t st = optim_create(cfg, ps, m->n_params, out);
    free(ps);
    return st;
}

void optim_destroy(optim_t *o)
{
    if (!o) return;
    free(o->moments);
    free(o->v);
    free(o->m);
    free(o->decay);
    free(o->params);
    free(o);
}

bool optim_param_decays(const optim_t *o, int i) { return o->decay[i]; }
int optim_param_count(const optim_t *o) { return o->n; }
int64_t optim_step_count(const optim_t *o) { return o->step; }
tensor_t optim_moment1(const optim_t *o, int i) { return o->m[i]; }
tensor_t optim_moment2(const optim_t *o, int i) { return o->v[i]; }

double optim_grad_norm(const optim_t *o)
{
    double sum = 0.0;
    for (int i = 0; i < o->n; i++) sum += kern_sumsq(kern_stream_host(), &o->params[i].grad);
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
        if (kern_count_nonfinite(kern_stream_host(), &o->params[i].grad)) return o->params[i].name;
    return NULL;
}

void optim_step(optim_t *o, double lr, double clip_coef)
{
    o->step++;
    for (int i = 0; i < o->n; i++) {
        if (clip_coef < 1.0) kern_scale(kern_stream_host(), &o->params[i].grad, (float)clip_coef);
        adamw_args_t args = {
            .lr = (float)lr, .beta1 = (float)o->cfg.beta1, .beta2 = (float)o->cfg.beta2,
            .eps = (float)o->cfg.eps, .weight_decay = o->decay[i] ? (float)o->cfg.weight_decay : 0.0f,
            .step = o->step,
        };
        kern_adamw(kern_stream_host(), &o->params[i].param, NULL, &o->params[i].grad, &o->m[i], &o->v[i], &args);
    }
}
