/* Tensor-parallel bookkeeping: validating a TP placement, how extents split
 * over the group, counting replicated gradients once, and assembling
 * HF-shaped tensors from the shards (docs/PARALLEL.md). The forward/backward
 * collectives live in model/llama.c. */
#include <stdlib.h>
#include <string.h>

#include "actors/coll.h"
#include "base/log.h"
#include "kernels/kernels.h"
#include "model/model.h"

void model_tp_split(int64_t extent, int tp_size, int tp_rank, int64_t *start, int64_t *count)
{
    int64_t base = extent / tp_size, extra = extent % tp_size;
    *count = base + (tp_rank < extra ? 1 : 0);
    *start = base * tp_rank + (tp_rank < extra ? tp_rank : extra);
}

bt_status_t model_parallel_validate(const model_config_t *c, const model_parallel_t *par)
{
#define TP_REQUIRE(cond, ...) do { if (!(cond)) { log_error(__VA_ARGS__); \
    return BT_ERR_INVALID; } } while (0)
    if (!par) return BT_OK;
    int tp = par->tp_size;
    TP_REQUIRE(tp >= 1 && par->tp_rank >= 0 && par->tp_rank < tp,
               "model: tensor-parallel tp_rank=%d outside tp_size=%d", par->tp_rank, tp);
    if (tp == 1) return BT_OK;
    TP_REQUIRE(par->tp_comm != NULL, "model: tp_size=%d needs a tp_comm (NULL given)", tp);
    TP_REQUIRE(par->tp_comm->size == tp && par->tp_comm->rank == par->tp_rank,
               "model: tp_comm is rank %d of %d, but the model is TP rank %d of tp_size=%d",
               par->tp_comm->rank, par->tp_comm->size, par->tp_rank, tp);
    TP_REQUIRE(c->num_heads % tp == 0,
               "model: tp_size=%d does not divide num_attention_heads=%lld", tp,
               (long long)c->num_heads);
    TP_REQUIRE(c->num_kv_heads % tp == 0,
               "model: tp_size=%d does not divide num_key_value_heads=%lld (each TP rank must "
               "hold whole KV-head groups; KV-head replication is not implemented)", tp,
               (long long)c->num_kv_heads);
    TP_REQUIRE(c->intermediate_size % tp == 0,
               "model: tp_size=%d does not divide intermediate_size=%lld", tp,
               (long long)c->intermediate_size);
    TP_REQUIRE(c->vocab_size >= tp, "model: tp_size=%d exceeds vocab_size=%lld", tp,
               (long long)c->vocab_size);
    return BT_OK;
#undef TP_REQUIRE
}

double model_grads_sumsq_unique(const model_t *m)
{
    if (!m->grad_mem) return 0.0;
    double s = 0.0;
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].shard_dim != MODEL_SHARD_NONE || m->par.tp_rank == 0)
            s += kern_sumsq(kern_stream_host(), &m->grads[i].t);
    return s;
}

bt_status_t model_param_gather(const model_t *m, int i, bool grad, float *full)
{
    const model_param_t *p = &m->params[i];
    if (grad && !m->grad_mem) {
        log_error("model: gathering the gradient of %s, but gradients are not allocated",
                  p->name);
        return BT_ERR_INVALID;
    }
    const float *src = grad ? m->grads[i].t.data : p->t.data;
    int tp = m->par.tp_size;
    int64_t numel = tensor_numel(&p->t);
    if (tp == 1 || p->shard_dim == MODEL_SHARD_NONE) {
        memcpy(full, src, (size_t)numel * sizeof(float));
        return BT_OK;
    }
    int64_t rows = p->full_shape[0], cols = p->t.ndim > 1 ? p->full_shape[1] : 1;
    size_t *counts = malloc((size_t)tp * sizeof *counts);
    float *tmp = NULL;
    if (!counts) return BT_ERR_NOMEM;
    for (int r = 0; r < tp; r++) {
        int64_t start, n;
        model_tp_split(p->full_shape[p->shard_dim], tp, r, &start, &n);
        counts[r] = (size_t)(p->shard_dim == MODEL_SHARD_ROWS ? n * cols : rows * n);
    }
    bt_status_t st;
    if (p->shard_dim == MODEL_SHARD_ROWS) {
        /* rank-major concatenation of row blocks is the tensor itself */
        st = coll_all_gather(m->par.tp_comm, full, src, counts, DT_F32);
    } else {
        tmp = malloc((size_t)(rows * cols) * sizeof *tmp);
        if (!tmp) {
            st = BT_ERR_NOMEM;
            goto free_counts;
        }
        st = coll_all_gather(m->par.tp_comm, tmp, src, counts, DT_F32);
        if (st == BT_OK) {
            const float *blk = tmp;
            for (int r = 0; r < tp; r++) {
                int64_t start, n;
                model_tp_split(cols, tp, r, &start, &n);
                for (int64_t row = 0; row < rows; row++)
                    memcpy(full + row * cols + start, blk + row * n, (size_t)n * sizeof(float));
                blk += rows * n;
            }
        }
    }
    if (st != BT_OK)
        log_error("model: TP all-gather of %s%s failed: %s", grad ? "the gradient of " : "",
                  p->name, bt_status_str(st));
    free(tmp);
free_counts:
    free(counts);
    return st;
}

bt_status_t model_tp_gather(const model_t *m, bool grads, model_t *full)
{
    int64_t most = 0;
    for (int i = 0; i < m->n_params; i++) {
        const model_param_t *p = &m->params[i];
        int64_t n = p->full_shape[0] * (p->t.ndim > 1 ? p->full_shape[1] : 1);
        if (n > most) most = n;
        if (!full) continue;
        int j = model_param_find(full, p->name);
        if (j < 0 || full->params[j].t.ndim != p->t.ndim ||
            full->params[j].t.shape[0] != p->full_shape[0] ||
            (p->t.ndim > 1 && full->params[j].t.shape[1] != p->full_shape[1]) ||
            full->par.tp_size != 1) {
            log_error("model: gather target has no whole %s (it must be a tp_size-1 model of the "
                      "same config and stage)", p->name);
            return BT_ERR_INVALID;
        }
        if (grads && !full->grad_mem) {
            log_error("model: gather target has no gradients allocated (model_grads_alloc)");
            return BT_ERR_INVALID;
        }
    }
    float *scratch = NULL;
    if (!full && !(scratch = malloc((size_t)(most ? most : 1) * sizeof *scratch)))
        return BT_ERR_NOMEM;
    bt_status_t st = BT_OK;
    for (int i = 0; i < m->n_params && st == BT_OK; i++) {
        float *dst = scratch;
        if (full) {
            int j = model_param_find(full, m->params[i].name);
            dst = grads ? full->grads[j].t.data : full->params[j].t.data;
        }
        st = model_param_gather(m, i, grads, dst);
    }
    free(scratch);
    return st;
}
