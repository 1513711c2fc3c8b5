/* Tensor-parallel bookkeeping (docs/PARALLEL.md): validating a TP
 * placement, the vocabulary split, the reductions the model and its kinds
 * issue (staged through host memory when the collective cannot take device
 * memory), counting replicated gradients once, and assembling HF-shaped
 * tensors from the pieces with their shard specs. */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "coll/coll.h"
#include "kernels/kernels.h"
#include "model/kind.h"
#include "model/model_int.h"

void model_vocab_split(int64_t extent, int tp_size, int tp_rank, int64_t *start, int64_t *count)
{
    int64_t base = extent / tp_size, extra = extent % tp_size;
    *count = base + (tp_rank < extra ? 1 : 0);
    *start = base * tp_rank + (tp_rank < extra ? tp_rank : extra);
}

bt_status_t model_parallel_validate(const model_config_t *c, const model_parallel_t *par)
{
    if (!par) return BT_OK;
    int tp = par->tp_size;
    if (tp < 1 || par->tp_rank < 0 || par->tp_rank >= tp) {
        log_error("model: tensor-parallel tp_rank=%d outside tp_size=%d", par->tp_rank, tp);
        return BT_ERR_INVALID;
    }
    int ep = par->ep_size > 1 ? par->ep_size : 1;
    if (ep > 1) {
        bool moe = false;
        for (int64_t l = 0; l < c->num_layers && !moe; l++) moe = c->blocks[l].ffn == MODEL_FFN_MOE;
        if (!moe) {
            log_error("model: ep_size=%d, but the model has no routed experts to split", ep);
            return BT_ERR_INVALID;
        }
        if (c->moe.n_experts % ep) {
            log_error("model: ep_size=%d does not divide the %lld routed experts", ep,
                      (long long)c->moe.n_experts);
            return BT_ERR_INVALID;
        }
        if (ep > MODEL_MAX_EP) {
            log_error("model: ep_size=%d; at most %d", ep, MODEL_MAX_EP);
            return BT_ERR_INVALID;
        }
        if (par->ep_rank < 0 || par->ep_rank >= ep || !par->ep_comm ||
            par->ep_comm->size != ep || par->ep_comm->rank != par->ep_rank) {
            log_error("model: expert-parallel rank %d of ep_size=%d needs an ep_comm of that rank "
                      "and size (%s)", par->ep_rank, ep, par->ep_comm ? "mismatched" : "NULL given");
            return BT_ERR_INVALID;
        }
    }
    int cp = par->cp_size > 1 ? par->cp_size : 1;
    if (cp > 1) {
        if (par->cp_rank < 0 || par->cp_rank >= cp || !par->cp_comm ||
            par->cp_comm->size != cp || par->cp_comm->rank != par->cp_rank) {
            log_error("model: context-parallel rank %d of cp_size=%d needs a cp_comm of that rank "
                      "and size (%s)", par->cp_rank, cp, par->cp_comm ? "mismatched" : "NULL given");
            return BT_ERR_INVALID;
        }
        for (int64_t l = 0; l < c->num_layers; l++)
            if (c->blocks[l].mixer != MODEL_MIXER_ATTENTION && c->blocks[l].mixer != MODEL_MIXER_MLA &&
                c->blocks[l].mixer != MODEL_MIXER_NONE) {
                log_error("model: cp_size=%d, but layer %lld mixes with a kind that has no "
                          "context-parallel path (only attention and MLA have one)", cp,
                          (long long)l);
                return BT_ERR_INVALID;
            }
    }
    if (tp == 1) return BT_OK;
    if (!par->tp_comm) {
        log_error("model: tp_size=%d needs a tp_comm (NULL given)", tp);
        return BT_ERR_INVALID;
    }
    if (par->tp_comm->size != tp || par->tp_comm->rank != par->tp_rank) {
        log_error("model: tp_comm is rank %d of %d, but the model is TP rank %d of tp_size=%d",
                  par->tp_comm->rank, par->tp_comm->size, par->tp_rank, tp);
        return BT_ERR_INVALID;
    }
    if (c->vocab_size < tp) {
        log_error("model: tp_size=%d exceeds vocab_size=%lld", tp, (long long)c->vocab_size);
        return BT_ERR_INVALID;
    }
    return model_config_kinds_validate(c, tp);
}

bool model_coll_direct(const model_t *m, const coll_comm_t *c)
{
    return (c->mem_devices & (1u << m->place.dev.kind)) != 0;
}

bt_status_t model_tp_reduce(model_t *m, tensor_t *t, coll_op_t op, const char *what, int layer)
{
    if (m->par.tp_size == 1) return BT_OK;
    coll_comm_t *comm = m->par.tp_comm;
    size_t n = (size_t)tensor_numel(t);
    bt_status_t st;
    if (model_coll_direct(m, comm)) {
        /* the kernels queued before must be done with t */
        if ((st = kern_stream_sync(m->stream)) == BT_OK)
            st = coll_all_reduce(comm, t->data, n, t->dtype, op);
    } else {
        void *h;
        if ((st = model_host_buf(m, tensor_nbytes(t), &h)) != BT_OK) return st;
        kern_download(m->stream, h, t);
        if ((st = kern_stream_sync(m->stream)) == BT_OK &&
            (st = coll_all_reduce(comm, h, n, t->dtype, op)) == BT_OK) {
            kern_upload(m->stream, t, h);
            st = kern_stream_sync(m->stream); /* h is reused by the next reduction */
        }
    }
    if (st != BT_OK) {
        char where[32] = "";
        if (layer >= 0) snprintf(where, sizeof where, " in layer %d", layer);
        log_error("model: TP all-reduce of %s%s failed (TP rank %d of %d): %s", what, where,
                  m->par.tp_rank, m->par.tp_size, bt_status_str(st));
    }
    return st;
}

bt_status_t model_tp_sum(model_t *m, tensor_t *t, const char *what, int layer)
{
    return model_tp_reduce(m, t, COLL_SUM, what, layer);
}

/* ---- sequence parallelism --------------------------------------------------------- */

void model_sp_rows(const model_t *m, int64_t N, int64_t *r0, int64_t *n)
{
    *r0 = 0;
    *n = N;
    if (m->par.tp_size > 1) model_vocab_split(N, m->par.tp_size, m->par.tp_rank, r0, n);
}

static tensor_t sp_rows_of(const tensor_t *t, int64_t r0, int64_t n)
{
    size_t row = (size_t)t->shape[1] * dtype_size(t->dtype);
    return tensor_make((char *)t->data + (size_t)r0 * row, t->dtype, t->device, 2,
                       (int64_t[]){n, t->shape[1]});
}

/* gather: every rank's rows into place; else reduce-scatter (sum) into this
 * rank's rows. In place on t (the collectives take a slice of their own
 * buffer), staged through host memory when the communicator cannot take t's. */
static bt_status_t sp_xchg(model_t *m, tensor_t *t, const tensor_t *src, bool gather,
                           const char *what, int layer)
{
    int tp = m->par.tp_size;
    if (tp == 1) return BT_OK;
    if (t->ndim != 2 || tp > 4096)
        BT_PANIC("model_sp: %s is not [N, cols] (tp %d)", kern_shape_str(t).s, tp);
    coll_comm_t *comm = m->par.tp_comm;
    int64_t N = t->shape[0], cols = t->shape[1], r0, n;
    size_t es = dtype_size(t->dtype), counts[4096];
    for (int r = 0; r < tp; r++) {
        int64_t a, c;
        model_vocab_split(N, tp, r, &a, &c);
        counts[r] = (size_t)(c * cols);
    }
    model_sp_rows(m, N, &r0, &n);
    size_t at = (size_t)(r0 * cols) * es;
    if (src && (src->dtype != t->dtype || tensor_numel(src) != n * cols))
        BT_PANIC("model_sp_gather_from: %s is not this rank's %lld rows of %s", kern_shape_str(src).s,
                 (long long)n, kern_shape_str(t).s);
    bt_status_t st = kern_stream_sync(m->stream); /* t is written by queued kernels */
    if (st == BT_OK && model_coll_direct(m, comm)) {
        st = gather ? coll_all_gather(comm, t->data, src ? src->data : (char *)t->data + at, counts,
                                      t->dtype)
                    : coll_reduce_scatter(comm, (char *)t->data + at, t->data, counts, t->dtype,
                                          COLL_SUM);
    } else if (st == BT_OK) {
        char *h;
        if ((st = model_host_buf(m, tensor_nbytes(t), (void **)&h)) != BT_OK) return st;
        tensor_t mine = sp_rows_of(t, r0, n);
        if (gather && n > 0) kern_download(m->stream, h + at, src ? src : &mine);
        if (!gather) kern_download(m->stream, h, t);
        if ((st = kern_stream_sync(m->stream)) == BT_OK)
            st = gather ? coll_all_gather(comm, h, h + at, counts, t->dtype)
                        : coll_reduce_scatter(comm, h + at, h, counts, t->dtype, COLL_SUM);
        if (st == BT_OK) {
            if (gather) kern_upload(m->stream, t, h);
            else if (n > 0) kern_upload(m->stream, &mine, h + at);
            st = kern_stream_sync(m->stream); /* h is reused by the next exchange */
        }
    }
    if (st != BT_OK) {
        char where[32] = "";
        if (layer >= 0) snprintf(where, sizeof where, " in layer %d", layer);
        log_error("model: sequence-parallel %s of %s%s failed (TP rank %d of %d): %s",
                  gather ? "all-gather" : "reduce-scatter", what, where, m->par.tp_rank, tp,
                  bt_status_str(st));
    }
    return st;
}

bt_status_t model_sp_gather(model_t *m, tensor_t *t, const char *what, int layer)
{
    return sp_xchg(m, t, NULL, true, what, layer);
}

bt_status_t model_sp_gather_from(model_t *m, tensor_t *t, const tensor_t *mine, const char *what,
                                 int layer)
{
    return sp_xchg(m, t, mine, true, what, layer);
}

bt_status_t model_sp_scatter_sum(model_t *m, tensor_t *t, const char *what, int layer)
{
    return sp_xchg(m, t, NULL, false, what, layer);
}

bt_status_t model_tp_input_sum(model_run_t *r, tensor_t *dln, const char *what, int layer)
{
    return r->sp ? model_sp_scatter_sum(r->m, dln, what, layer) : model_tp_sum(r->m, dln, what, layer);
}

bt_status_t model_row_parallel_fwd(model_run_t *r, tensor_t *out, const tensor_t *x,
                                   const tensor_t *w, const tensor_t *bias, const char *what,
                                   int layer)
{
    model_t *m = r->m;
    if (m->par.tp_size == 1) {
        kern_linear_fwd(r->s, out, x, w, bias);
        return BT_OK;
    }
    kern_linear_fwd(r->s, out, x, w, NULL);
    bt_status_t st = r->sp ? model_sp_scatter_sum(m, out, what, layer) : model_tp_sum(m, out, what, layer);
    if (st != BT_OK || !bias) return st;
    /* the replicated bias once, as the rank-1 update ones[N,1] @ bias[1,C]
     * (under SP on this rank's rows only) */
    int64_t C = out->shape[1], r0 = 0, n = out->shape[0];
    if (r->sp) model_sp_rows(m, out->shape[0], &r0, &n);
    if (n == 0) return BT_OK;
    tensor_t b = tensor_make(bias->data, bias->dtype, bias->device, 2, (int64_t[]){1, C});
    tensor_t o = sp_rows_of(out, r0, n);
    tensor_t ones = tensor_make(r->ones->data, r->ones->dtype, r->ones->device, 2, (int64_t[]){n, 1});
    kern_matmul(r->s, &o, &ones, &b, false, false, 1.0f, 1.0f);
    return BT_OK;
}

double model_grads_sumsq_unique(const model_t *m)
{
    if (!m->grad_mem) return 0.0;
    double s = 0.0;
    for (int i = 0; i < m->n_params; i++)
        if (model_param_counted(m, i)) s += kern_sumsq(m->stream, &m->grads[i].t);
    return s;
}

bool model_param_counted(const model_t *m, int i)
{
    const shard_spec_t *sp = &m->params[i].spec;
    if (MODEL_PARAM_IS_EXPERT(sp)) return m->par.edp_rank == 0;
    return sp->group != SHARD_GROUP_NONE || m->par.tp_rank == 0;
}

bt_status_t model_param_gather(const model_t *m, int i, bool grad, float *full)
{
    const model_param_t *p = &m->params[i];
    bool expert = MODEL_PARAM_IS_EXPERT(&p->spec);
    int tp = expert ? m->par.ep_size : m->par.tp_size;
    coll_comm_t *comm = expert ? m->par.ep_comm : m->par.tp_comm;
    shard_group_t group = expert ? SHARD_GROUP_EP : SHARD_GROUP_TP;
    int64_t n = tensor_numel(&p->t);
    if (tp == 1 || p->spec.group == SHARD_GROUP_NONE) return model_param_read(m, i, grad, full);
    float *mine = malloc((size_t)n * sizeof *mine);
    float *all = malloc((size_t)shard_global_numel(&p->spec) * sizeof *all);
    size_t *counts = malloc((size_t)tp * sizeof *counts);
    bt_status_t st = BT_ERR_NOMEM;
    if (!mine || !all || !counts) goto out;
    if ((st = model_param_read(m, i, grad, mine)) != BT_OK) goto out;
    shard_spec_t whole = shard_whole(p->spec.ndim, p->spec.global), piece[64];
    if (tp > 64) BT_PANIC("model_param_gather: tp_size %d > 64", tp);
    for (int r = 0; r < tp; r++) {
        piece[r] = shard_split(&whole, p->spec.split_dim, group, r, tp, p->spec.unit);
        counts[r] = (size_t)shard_numel(&piece[r]);
    }
    st = coll_all_gather(comm, all, mine, counts, DT_F32);
    if (st != BT_OK) {
        log_error("model: %s all-gather of %s%s failed: %s", expert ? "EP" : "TP",
                  grad ? "the gradient of " : "", p->name, bt_status_str(st));
        goto out;
    }
    const float *blk = all;
    for (int r = 0; r < tp; r++) {
        shard_copy(&whole, full, &piece[r], blk, sizeof(float));
        blk += counts[r];
    }
out:
    free(counts);
    free(all);
    free(mine);
    return st;
}

bt_status_t model_tp_gather(const model_t *m, bool grads, model_t *full)
{
    int64_t most = 0;
    for (int i = 0; i < m->n_params; i++) {
        const model_param_t *p = &m->params[i];
        int64_t n = shard_global_numel(&p->spec);
        if (n > most) most = n;
        if (!full) continue;
        int j = model_param_find(full, p->name);
        if (j < 0 || !shard_same_global(&full->params[j].spec, &p->spec) ||
            full->par.tp_size != 1) {
            log_error("model: gather target has no whole %s (it must be a tp_size-1 model of the "
                      "same config and stage)",
                      p->name);
            return BT_ERR_INVALID;
        }
        if (grads && !full->grad_mem) {
            log_error("model: gather target has no gradients allocated (model_grads_alloc)");
            return BT_ERR_INVALID;
        }
    }
    float *buf = malloc((size_t)(most ? most : 1) * sizeof *buf);
    if (!buf) return BT_ERR_NOMEM;
    bt_status_t st = BT_OK;
    for (int i = 0; i < m->n_params && st == BT_OK; i++) {
        st = model_param_gather(m, i, grads, buf);
        if (st != BT_OK || !full) continue;
        int j = model_param_find(full, m->params[i].name);
        st = model_tensor_write_f32(full, grads ? &full->grads[j].t : &full->params[j].t, buf);
    }
    free(buf);
    return st;
}
