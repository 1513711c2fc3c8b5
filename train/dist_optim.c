#include "train/dist_optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kernels/kernels.h"
#include "train/ckpt_state.h"

/* Per chunk: the non-ZeRO optimizer over the whole stage, or (ZeRO-1) two
 * optimizers over this rank's shard of the flat parameter block, cut at
 * parameter boundaries into 1-D pieces: one set with weight decay, one
 * without (the policy is decided on the whole tensor's shape, which a 1-D
 * piece no longer shows). Offsets are in elements of the f32 blocks; ZeRO-1
 * needs parameters and gradients in f32 (carved alike). */
typedef struct {
    optim_t *full;
    optim_t *decay, *no_decay;
    size_t   counts[1024], offs[1024]; /* ZeRO-1 shard of every dp rank (elements) */
    size_t   lo, hi;                   /* this rank's shard [lo, hi) */
    size_t   n;                        /* elements in the gradient block */
    /* runs of the block, each of dense or of expert parameters only:
     * [run_lo[r], run_lo[r + 1]) with run_lo[n_runs] = n */
    int      n_runs;
    size_t  *run_lo;
    bool    *run_expert;
} chunk_opt_t;

struct dist_optim {
    dist_optim_config_t cfg;
    chunk_opt_t         c[DIST_OPTIM_MAX_CHUNKS];
    void               *host;          /* staging for collectives on host memory */
    size_t              host_bytes;
};

static bool policy_decays(optim_decay_t policy, const tensor_t *t)
{
    switch (policy) {
    case OPTIM_DECAY_MATRICES: return t->ndim >= 2;
    case OPTIM_DECAY_ALL: return true;
    case OPTIM_DECAY_NONE: return false;
    default: BT_PANIC("decay policy %d", (int)policy);
    }
}

/* element offset of parameter i in the parameter (and gradient) block */
static size_t param_offset(const model_t *m, int i)
{
    return (size_t)((const char *)m->params[i].t.data - (const char *)m->param_mem) /
           sizeof(float);
}

/* [lo, lo + n) of an f32 block on m's device */
static tensor_t range(const model_t *m, void *block, size_t lo, size_t n)
{
    int64_t len = (int64_t)n;
    return tensor_make((char *)block + lo * sizeof(float), DT_F32, m->place.dev, 1, &len);
}

static bt_status_t shard_optims_create(dist_optim_t *d, model_t *m, chunk_opt_t *co)
{
    coll_comm_t *dp = d->cfg.dp;
    if (m->place.param_dtype != DT_F32 || m->place.grad_dtype != DT_F32) {
        log_error("ZeRO-1: parameters and gradients must be f32 (got %s, %s)",
                  dtype_name(m->place.param_dtype), dtype_name(m->place.grad_dtype));
        return BT_ERR_UNSUPPORTED;
    }
    coll_counts_even(co->n, dp->size, co->counts);
    size_t at = 0;
    for (int r = 0; r < dp->size; r++) {
        co->offs[r] = at;
        at += co->counts[r];
    }
    co->lo = co->offs[dp->rank];
    co->hi = co->lo + co->counts[dp->rank];
    optim_param_t *dec = calloc((size_t)m->n_params + 1, sizeof *dec);
    optim_param_t *nodec = calloc((size_t)m->n_params + 1, sizeof *nodec);
    bt_status_t st = BT_ERR_NOMEM;
    if (!dec || !nodec) goto free_lists;
    int nd = 0, nn = 0;
    for (int i = 0; i < m->n_params; i++) {
        size_t p0 = param_offset(m, i), p1 = p0 + (size_t)tensor_numel(&m->params[i].t);
        size_t a = p0 > co->lo ? p0 : co->lo, b = p1 < co->hi ? p1 : co->hi;
        if (a >= b) continue;
        optim_param_t piece = {
            .name = m->params[i].name,
            .param = range(m, m->param_mem, a, b - a),
            .grad = range(m, m->grad_mem, a, b - a),
        };
        if (policy_decays(d->cfg.optim.decay, &m->params[i].t)) dec[nd++] = piece;
        else nodec[nn++] = piece;
    }
    optim_config_t all = d->cfg.optim, none = d->cfg.optim;
    all.decay = OPTIM_DECAY_ALL;
    none.decay = OPTIM_DECAY_NONE;
    if ((st = optim_create(&all, dec, nd, m->stream, &co->decay))) goto free_lists;
    st = optim_create(&none, nodec, nn, m->stream, &co->no_decay);
free_lists:
    free(dec);
    free(nodec);
    return st;
}

/* The block's runs of one kind (dense, expert), padding with the run before it. */
static bt_status_t runs_build(const model_t *m, chunk_opt_t *co)
{
    co->run_lo = calloc((size_t)m->n_params + 1, sizeof *co->run_lo);
    co->run_expert = calloc((size_t)m->n_params + 1, sizeof *co->run_expert);
    if (!co->run_lo || !co->run_expert) return BT_ERR_NOMEM;
    co->n_runs = 0;
    for (int i = 0; i < m->n_params; i++) {
        bool ex = MODEL_PARAM_IS_EXPERT(&m->params[i].spec);
        if (co->n_runs && co->run_expert[co->n_runs - 1] == ex) continue;
        /* in elements of the gradient block (its dtype may not be f32) */
        size_t at = (size_t)((const char *)m->grads[i].t.data - (const char *)m->grad_mem) /
                    dtype_size(m->place.grad_dtype);
        co->run_lo[co->n_runs] = co->n_runs ? at : 0;
        co->run_expert[co->n_runs++] = ex;
    }
    co->run_lo[co->n_runs] = co->n;
    return BT_OK;
}

bt_status_t dist_optim_create(const dist_optim_config_t *cfg, dist_optim_t **out)
{
    dist_optim_t *d = calloc(1, sizeof *d);
    if (!d) return BT_ERR_NOMEM;
    d->cfg = *cfg;
    if (cfg->zero1 && cfg->dp && cfg->dp->size > 1024) {
        log_error("ZeRO-1: %d data-parallel ranks; at most 1024", cfg->dp->size);
        free(d);
        return BT_ERR_UNSUPPORTED;
    }
    bt_status_t st = BT_OK;
    for (int c = 0; c < cfg->n_chunks && !st; c++) {
        model_t *m = cfg->chunks[c];
        d->c[c].n = m->grad_bytes / dtype_size(m->place.grad_dtype);
        st = runs_build(m, &d->c[c]);
        if (st) break;
        if (cfg->zero1 && cfg->dp) st = shard_optims_create(d, m, &d->c[c]);
        else st = optim_create_for_model(&cfg->optim, m, &d->c[c].full);
    }
    if (st) {
        dist_optim_destroy(d);
        return st;
    }
    *out = d;
    return BT_OK;
}

void dist_optim_destroy(dist_optim_t *d)
{
    if (!d) return;
    for (int c = 0; c < d->cfg.n_chunks; c++) {
        optim_destroy(d->c[c].full);
        optim_destroy(d->c[c].decay);
        optim_destroy(d->c[c].no_decay);
        free(d->c[c].run_lo);
        free(d->c[c].run_expert);
    }
    if (d->host && d->cfg.n_chunks) kern_host_free(d->cfg.chunks[0]->place.dev, d->host);
    free(d);
}

/* The collectives of the step on device blocks: direct when the
 * communicator takes the device's memory, else staged through host memory
 * (download, collective, upload). */
typedef enum { DC_ALL_REDUCE, DC_REDUCE_SCATTER, DC_ALL_GATHER } dc_kind_t;

static bt_status_t dev_coll(dist_optim_t *d, coll_comm_t *comm, dc_kind_t kind, model_t *m,
                            void *block, dtype_t dt, size_t n, const size_t *counts, size_t lo,
                            size_t hi)
{
    size_t es = dtype_size(dt);
    bt_status_t st = kern_stream_sync(m->stream);
    if (st != BT_OK) return st;
    bool direct = (comm->mem_devices & (1u << m->place.dev.kind)) != 0;
    char *buf = block;
    if (!direct) {
        if (n * es > d->host_bytes) {
            kern_host_free(m->place.dev, d->host);
            d->host = NULL;
            d->host_bytes = 0;
            if ((st = kern_host_alloc(m->place.dev, n * es, &d->host)) != BT_OK) return st;
            d->host_bytes = n * es;
        }
        buf = d->host;
        int64_t all = (int64_t)n, mine = (int64_t)(hi - lo);
        tensor_t src = kind == DC_ALL_GATHER
                           ? tensor_make((char *)block + lo * es, dt, m->place.dev, 1, &mine)
                           : tensor_make(block, dt, m->place.dev, 1, &all);
        kern_download(m->stream, kind == DC_ALL_GATHER ? buf + lo * es : buf, &src);
        if ((st = kern_stream_sync(m->stream)) != BT_OK) return st;
    }
    switch (kind) {
    case DC_ALL_REDUCE: st = coll_all_reduce(comm, buf, n, dt, COLL_SUM); break;
    case DC_REDUCE_SCATTER:
        st = coll_reduce_scatter(comm, buf + lo * es, buf, counts, dt, COLL_SUM);
        break;
    case DC_ALL_GATHER: st = coll_all_gather(comm, buf, buf + lo * es, counts, dt); break;
    }
    if (st != BT_OK || direct) return st;
    int64_t all = (int64_t)n, mine = (int64_t)(hi - lo);
    tensor_t dst = kind == DC_REDUCE_SCATTER
                       ? tensor_make((char *)block + lo * es, dt, m->place.dev, 1, &mine)
                       : tensor_make(block, dt, m->place.dev, 1, &all);
    kern_upload(m->stream, &dst, kind == DC_REDUCE_SCATTER ? buf + lo * es : buf);
    return kern_stream_sync(m->stream);
}

/* Sum of squares of m's gradient elements in [lo, hi) that this rank counts
 * (the tied head copy of the embedding is never counted: its twin on the
 * embedding stage is). replicas: the block is a data-parallel replica's,
 * whose dense elements count only when dense (dp rank 0) and whose
 * experts' only on edp rank 0; else (ZeRO-1) it is this rank's shard. */
static double chunk_sumsq(const dist_optim_t *d, int c, size_t lo, size_t hi, bool replicas,
                          bool dense)
{
    const model_t *m = d->cfg.chunks[c];
    double s = 0.0;
    for (int i = 0; i < m->n_params; i++) {
        if (c == d->cfg.head_copy_chunk && !strcmp(m->params[i].name, "model.embed_tokens.weight"))
            continue;
        if (replicas && !MODEL_PARAM_IS_EXPERT(&m->params[i].spec) && !dense) continue;
        /* replicated over TP: identical on every TP rank, counted on rank 0;
         * an expert's replicas on edp rank 0 */
        if (replicas ? !model_param_counted(m, i)
                     : m->par.tp_rank != 0 && m->params[i].spec.group == SHARD_GROUP_NONE)
            continue;
        size_t p0 = param_offset(m, i), p1 = p0 + (size_t)tensor_numel(&m->params[i].t);
        size_t a = p0 > lo ? p0 : lo, b = p1 < hi ? p1 : hi;
        if (a >= b) continue;
        tensor_t g = range(m, m->grad_mem, a, b - a);
        s += kern_sumsq(m->stream, &g);
    }
    return s;
}

static tensor_t *embed_grad(model_t *m)
{
    int i = model_param_find(m, "model.embed_tokens.weight");
    return i < 0 ? NULL : &m->grads[i].t;
}

/* Both copies of a tied embedding get the sum of the two gradients. */
static bt_status_t tied_reduce(dist_optim_t *d)
{
    const dist_optim_config_t *c = &d->cfg;
    if (c->embed_chunk >= 0 && c->head_copy_chunk >= 0) { /* both here: a local sum */
        model_t *m = c->chunks[c->embed_chunk];
        tensor_t *a = embed_grad(m), *b = embed_grad(c->chunks[c->head_copy_chunk]);
        kern_add(m->stream, a, a, b);
        kern_copy(m->stream, b, a);
        return kern_stream_sync(m->stream);
    }
    if (!c->emb) return BT_OK;
    int k = c->embed_chunk >= 0 ? c->embed_chunk : c->head_copy_chunk;
    if (k < 0) BT_PANIC("rank %d is in an embedding group without an embedding", c->rank);
    model_t *m = c->chunks[k];
    tensor_t *g = embed_grad(m);
    size_t n = (size_t)tensor_numel(g);
    return dev_coll(d, c->emb, DC_ALL_REDUCE, m, g->data, g->dtype, n, NULL, 0, n);
}

/* Before any reduction: the first of this rank's gradient tensors that is
 * not finite (NULL: all are), and in *chunk which chunk holds it. One scan
 * of each chunk's gradient block per step (the cost of reading the
 * gradients once); the tensors are looked at one by one only when it finds
 * something. */
static const char *local_nonfinite(const dist_optim_t *d, int *chunk)
{
    const dist_optim_config_t *c = &d->cfg;
    for (int k = 0; k < c->n_chunks; k++) {
        model_t *m = c->chunks[k];
        tensor_t all = tensor_make(m->grad_mem, m->place.grad_dtype, m->place.dev, 1,
                                   (int64_t[]){d->c[k].n});
        if (!kern_count_nonfinite(m->stream, &all)) continue;
        *chunk = k;
        for (int i = 0; i < m->n_params; i++)
            if (kern_count_nonfinite(m->stream, &m->grads[i].t)) return m->grads[i].name;
        return "the padding between tensors";
    }
    return NULL;
}

/* This rank's part of a skipped step's report: whether the cause was here,
 * and where its gradients first stopped being finite before the reduction. */
static void skip_report(const dist_optim_t *d, int64_t step, const char *bad, int bad_chunk,
                        bool loss_bad, double norm)
{
    const dist_optim_config_t *c = &d->cfg;
    const char *what = isnan(norm) ? "NaN" : "Inf";
    if (bad) {
        const model_stage_t *s = &c->chunks[bad_chunk]->stage;
        log_warn("step %lld, rank %d: skipped, no update: gradient norm is %s; here (layers "
                 "[%d, %d)) the first non-finite gradient before reduction is %s%s",
                 (long long)step + 1, c->rank, what, s->first_layer, s->last_layer, bad,
                 loss_bad ? ", and this rank's loss is not finite" : "");
    } else {
        log_warn("step %lld, rank %d: skipped, no update: gradient norm is %s; %s",
                 (long long)step + 1, c->rank, what,
                 loss_bad ? "this rank's gradients are finite, its loss is not"
                          : "this rank's gradients were finite (the cause is on another rank)");
    }
}

/* A replica's gradient block summed over its groups: whole over dp, or
 * (experts reducing elsewhere) run by run, dense runs over dp and expert
 * runs over edp. */
static bt_status_t replica_reduce(dist_optim_t *d, model_t *m, const chunk_opt_t *co)
{
    const dist_optim_config_t *c = &d->cfg;
    dtype_t dt = m->place.grad_dtype;
    bool split = co->n_runs > 1 && c->edp != c->dp;
    if (!split)
        return c->dp ? dev_coll(d, c->dp, DC_ALL_REDUCE, m, m->grad_mem, dt, co->n, NULL, 0, co->n)
                     : BT_OK;
    for (int r = 0; r < co->n_runs; r++) {
        coll_comm_t *comm = co->run_expert[r] ? c->edp : c->dp;
        size_t lo = co->run_lo[r], n = co->run_lo[r + 1] - lo;
        if (!comm || !n) continue;
        bt_status_t st = dev_coll(d, comm, DC_ALL_REDUCE, m, (char *)m->grad_mem + lo * dtype_size(dt),
                                  dt, n, NULL, 0, n);
        if (st) return st;
    }
    return BT_OK;
}

bt_status_t dist_optim_step(dist_optim_t *d, int64_t step, bool loss_bad, double *grad_norm,
                            double *lr_out, bool *skipped)
{
    const dist_optim_config_t *c = &d->cfg;
    bool zero = c->zero1 && c->dp;
    bt_status_t st;
    *skipped = false;
    if (optim_test_poison(step + 1, c->rank))
        kern_scale(c->chunks[0]->stream, &c->chunks[0]->grads[0].t, NAN);
    int bad_chunk = -1;
    const char *bad = local_nonfinite(d, &bad_chunk);
    if ((st = tied_reduce(d))) return st;

    double sumsq = loss_bad ? NAN : 0.0;
    for (int k = 0; k < c->n_chunks; k++) {
        model_t *m = c->chunks[k];
        chunk_opt_t *co = &d->c[k];
        if (zero) {
            st = dev_coll(d, c->dp, DC_REDUCE_SCATTER, m, m->grad_mem, DT_F32, co->n, co->counts,
                          co->lo, co->hi);
            if (st) return st;
            sumsq += chunk_sumsq(d, k, co->lo, co->hi, false, true);
        } else {
            if ((st = replica_reduce(d, m, co))) return st;
            sumsq += chunk_sumsq(d, k, 0, co->n, true, !c->dp || c->dp->rank == 0);
        }
    }
    if (c->world && (st = coll_all_reduce(c->world, &sumsq, 1, DT_F64, COLL_SUM))) return st;
    double norm = sqrt(sumsq);
    *grad_norm = norm;
    double lr = lr_schedule_at(&c->lr, step);
    *lr_out = lr;
    if (!isfinite(norm)) { /* the same verdict on every rank: the norm is global */
        skip_report(d, step, bad, bad_chunk, loss_bad, norm);
        for (int k = 0; k < c->n_chunks; k++) {
            const char *bp = model_first_nonfinite_param(c->chunks[k]);
            if (bp) {
                log_error("step %lld, rank %d: parameter %s is not finite: no update can repair "
                          "that (check the model or lower optim.lr)",
                          (long long)step + 1, c->rank, bp);
                return BT_ERR_NUMERIC;
            }
        }
        *skipped = true;
        return BT_OK;
    }
    double coef = optim_clip_coef(norm, c->clip);
    for (int k = 0; k < c->n_chunks; k++) {
        chunk_opt_t *co = &d->c[k];
        model_t *m = c->chunks[k];
        if (!zero) {
            optim_step(co->full, lr, coef);
            if ((st = kern_stream_sync(m->stream))) return st;
            continue;
        }
        optim_step(co->decay, lr, coef);
        optim_step(co->no_decay, lr, coef);
        st = dev_coll(d, c->dp, DC_ALL_GATHER, m, m->param_mem, DT_F32, co->n, co->counts, co->lo,
                      co->hi);
        if (st) return st;
    }
    return BT_OK;
}

bt_status_t dist_optim_load_sum(dist_optim_t *d, double *rows, int n_rows, int cols)
{
    if (!d->cfg.dp || n_rows == 0) return BT_OK;
    size_t n = (size_t)n_rows * (size_t)cols;
    double *label = malloc((size_t)n_rows * sizeof *label);
    if (!label) return BT_ERR_NOMEM;
    for (int i = 0; i < n_rows; i++) label[i] = rows[(size_t)i * (size_t)cols];
    bt_status_t st = coll_all_reduce(d->cfg.dp, rows, n, DT_F64, COLL_SUM);
    for (int i = 0; i < n_rows; i++) rows[(size_t)i * (size_t)cols] = label[i];
    free(label);
    if (st) log_error("rank %d: all-reduce of the routed experts' load failed: %s", d->cfg.rank,
                      bt_status_str(st));
    return st;
}

/* The tied head copy's index in chunk c, or -1. */
static int head_copy_param(const dist_optim_t *d, int c)
{
    return c == d->cfg.head_copy_chunk ? model_param_find(d->cfg.chunks[c], "model.embed_tokens.weight")
                                       : -1;
}

bt_status_t dist_optim_ckpt_items(const dist_optim_t *d, struct ckpt_items *it, bool dp0)
{
    bt_status_t st = BT_OK;
    for (int c = 0; c < d->cfg.n_chunks && !st; c++) {
        const chunk_opt_t *co = &d->c[c];
        model_t *m = d->cfg.chunks[c];
        if (co->full) {
            st = ckpt_items_optim(it, m, co->full, dp0, head_copy_param(d, c));
            continue;
        }
        /* ZeRO-1: the tied copy's partition is stored from the embedding
         * stage's block instead, which holds the same values */
        int first = it->n;
        if (!st && co->decay) st = ckpt_items_optim_ranges(it, m, co->decay, true);
        if (!st && co->no_decay) st = ckpt_items_optim_ranges(it, m, co->no_decay, true);
        if (c == d->cfg.head_copy_chunk)
            for (int i = first; i < it->n; i++) {
                const char *slash = strchr(it->v[i].name, '/');
                if (slash && !strcmp(slash + 1, "model.embed_tokens.weight")) it->v[i].store = false;
            }
    }
    return st;
}

int64_t dist_optim_steps(const dist_optim_t *d)
{
    const chunk_opt_t *co = &d->c[0];
    return co->full ? optim_step_count(co->full) : optim_step_count(co->decay);
}

void dist_optim_set_steps(dist_optim_t *d, int64_t n)
{
    for (int c = 0; c < d->cfg.n_chunks; c++) {
        chunk_opt_t *co = &d->c[c];
        if (co->full) optim_set_step_count(co->full, n);
        if (co->decay) optim_set_step_count(co->decay, n);
        if (co->no_decay) optim_set_step_count(co->no_decay, n);
    }
}
