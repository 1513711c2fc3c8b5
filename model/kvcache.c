/* The decode cache every attention kind shares (model/kind.h): K and V of
 * the positions decoded so far, each at its own row width. */
#include "model/kind.h"

double model_kv_cache_bytes(const model_t *m, int64_t T, int64_t k_row, int64_t v_row)
{
    double es = (double)dtype_size(m->place.act_dtype);
    return model_align_d((double)T * (double)k_row * es) +
           model_align_d((double)T * (double)v_row * es);
}

void model_kv_cache_append(model_run_t *r, const tensor_t *k, const tensor_t *v, int64_t H,
                           int64_t Dk, int64_t Dv, tensor_t *k4, tensor_t *v4)
{
    const model_t *m = r->m;
    size_t es = dtype_size(m->place.act_dtype);
    size_t krow = (size_t)(H * Dk) * es, vrow = (size_t)(H * Dv) * es;
    size_t vbase = model_align((size_t)r->T_cap * krow);
    int64_t Tk = r->pos0 + r->T;
    tensor_t kd = model_act_view(m, r->cache, (size_t)r->pos0 * krow, 2, (int64_t[]){r->T, H * Dk});
    tensor_t vd = model_act_view(m, r->cache, vbase + (size_t)r->pos0 * vrow, 2,
                                 (int64_t[]){r->T, H * Dv});
    tensor_t ks = tensor_make(k->data, k->dtype, k->device, 2, (int64_t[]){r->T, H * Dk});
    tensor_t vs = tensor_make(v->data, v->dtype, v->device, 2, (int64_t[]){r->T, H * Dv});
    kern_copy(r->s, &kd, &ks);
    kern_copy(r->s, &vd, &vs);
    *k4 = model_act_view(m, r->cache, 0, 4, (int64_t[]){1, Tk, H, Dk});
    *v4 = model_act_view(m, r->cache, vbase, 4, (int64_t[]){1, Tk, H, Dv});
}
