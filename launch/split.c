/* Pipeline splits from the per-layer cost model (launch/split.h). */
#include "launch/split.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "launch/run_setup.h"
#include "model/cost.h"

typedef struct {
    int           L;
    model_cost_t *layer; /* [L] */
    model_cost_t *pre;   /* [L + 1]: sums of layers [0, l) */
    model_cost_t  embed, head, base;
    int           nk;     /* kinds with a state shared per arena */
    const model_kind_t *kinds[8];
    double       *shared; /* [L][nk]: layer l's state of kind k (0: none) */
    double        state;  /* bytes per parameter byte: itself, its gradient, the moments */
    double        arenas; /* training arenas a stage keeps */
} costs_t;

static bt_status_t costs_build(const job_t *job, const model_config_t *cfg, costs_t *c)
{
    const job_parallel_t *p = &job->parallel;
    /* under CP a rank's rows hold seq_len / cp tokens (launch/run_mem.c) */
    int64_t cp = p->cp > 1 ? p->cp : 1, B = job->train.micro_batch, T = job->data.seq_len / cp;
    model_parallel_t par = {.tp_rank = 0, .tp_size = (int)p->tp,
                            .ep_size = p->ep > 1 ? (int)p->ep : 1, .cp_size = (int)cp,
                            .cp_ring = job->parallel.cp_mode == JOB_CP_RING};
    c->L = (int)cfg->num_layers;
    c->layer = calloc(2 * ((size_t)c->L + 1), sizeof *c->layer);
    if (!c->layer) return BT_ERR_NOMEM;
    c->pre = c->layer + c->L + 1;
    for (int l = 0; l < c->L; l++) {
        model_cost_t *x = &c->layer[l], *s = &c->pre[l + 1];
        model_layer_cost(cfg, l, &par, B, T, x);
        *s = (model_cost_t){.params = c->pre[l].params + x->params,
                            .acts = c->pre[l].acts + x->acts, .flops = c->pre[l].flops + x->flops};
    }
    model_ends_cost(cfg, &par, B, T, &c->embed, &c->head, &c->base);
    for (int l = 0; l < c->L; l++)
        for (int i = 0; i < 2; i++) {
            const model_kind_t *k = c->layer[l].kind[i];
            bool have = !k;
            for (int j = 0; j < c->nk; j++) have |= c->kinds[j] == k;
            if (!have && c->nk < 8) c->kinds[c->nk++] = k;
        }
    c->shared = calloc((size_t)c->L * (size_t)c->nk + 1, sizeof *c->shared);
    if (!c->shared) return BT_ERR_NOMEM;
    for (int l = 0; l < c->L; l++)
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < c->nk; j++)
                if (c->layer[l].kind[i] && c->layer[l].kind[i] == c->kinds[j])
                    c->shared[(size_t)l * (size_t)c->nk + (size_t)j] = c->layer[l].shared[i];
    c->state = 2.0 + 2.0 / (p->zero1 ? (double)(p->dp * cp) : 1.0);
    c->arenas = (double)(p->microbatches ? p->microbatches : job->train.grad_accum);
    return BT_OK;
}

static double stage_mem(const costs_t *c, const model_cost_t *sum)
{
    return c->state * sum->params + c->arenas * sum->acts;
}

/* The largest scratch and each kind's shared state over layers [a, b): the
 * running maxima as a layer joins. */
typedef struct {
    double scratch, shared[8];
} region_max_t;

static void region_add(const costs_t *c, region_max_t *r, int l)
{
    if (c->layer[l].scratch > r->scratch) r->scratch = c->layer[l].scratch;
    for (int j = 0; j < c->nk; j++)
        if (c->shared[(size_t)l * (size_t)c->nk + (size_t)j] > r->shared[j])
            r->shared[j] = c->shared[(size_t)l * (size_t)c->nk + (size_t)j];
}

/* The sums of stage s of n over layers [a, b), whose arena's one scratch
 * region and shared states r gives. */
static model_cost_t stage_sum(const costs_t *c, int s, int n, int a, int b, const region_max_t *r)
{
    model_cost_t t = c->base;
    double scratch = r->scratch;
    for (int j = 0; j < c->nk; j++) t.acts += r->shared[j];
    if (scratch > t.scratch) t.scratch = scratch;
    const model_cost_t *add[2] = {s == 0 ? &c->embed : NULL, s == n - 1 ? &c->head : NULL};
    for (int i = 0; i < 2; i++)
        if (add[i]) {
            t.params += add[i]->params;
            t.acts += add[i]->acts;
            t.flops += add[i]->flops;
        }
    t.params += c->pre[b].params - c->pre[a].params;
    t.acts += c->pre[b].acts - c->pre[a].acts;
    t.flops += c->pre[b].flops - c->pre[a].flops;
    t.acts += t.scratch;
    return t;
}

bt_status_t run_split_costs(const job_t *job, const model_config_t *cfg, const int64_t *layers,
                            int n, run_split_stage_t *out)
{
    costs_t c = {0};
    bt_status_t st = costs_build(job, cfg, &c);
    int at = 0;
    for (int s = 0; s < n && st == BT_OK; s++) {
        int b = at + (int)layers[s];
        if (layers[s] < 0 || b > c.L) {
            st = BT_ERR_INVALID;
            break;
        }
        region_max_t r = {0};
        for (int l = at; l < b; l++) region_add(&c, &r, l);
        model_cost_t t = stage_sum(&c, s, n, at, b, &r);
        out[s] = (run_split_stage_t){.first = at, .last = b, .params = t.params, .acts = t.acts,
                                     .mem = stage_mem(&c, &t), .flops = t.flops};
        at = b;
    }
    if (st == BT_OK && at != c.L) st = BT_ERR_INVALID;
    free(c.layer);
    free(c.shared);
    return st;
}

/* Least over splits of [0, L) into n stages of the largest stage value
 * (memory when flops is false, else FLOPs among the stages whose memory is
 * at most cap); the split into layers[n]. best[s][b]: the least largest
 * value of stages 0..s-1 over layers [0, b); from[s][b] their last cut. */
static double split_dp(const costs_t *c, int n, bool flops, double cap, int64_t *layers)
{
    int L = c->L;
    double *best = malloc(sizeof *best * (size_t)(n + 1) * (size_t)(L + 1));
    int *from = malloc(sizeof *from * (size_t)(n + 1) * (size_t)(L + 1));
    if (!best || !from) {
        free(best);
        free(from);
        return NAN;
    }
#define BEST(s, b) best[(size_t)(s) * (size_t)(L + 1) + (size_t)(b)]
#define FROM(s, b) from[(size_t)(s) * (size_t)(L + 1) + (size_t)(b)]
    for (size_t i = 0; i < (size_t)(n + 1) * (size_t)(L + 1); i++) best[i] = INFINITY;
    BEST(0, 0) = 0;
    for (int s = 1; s <= n; s++)
        for (int b = s; b <= L - (n - s); b++) {
            region_max_t r = {0};
            for (int a = b - 1; a >= s - 1; a--) {
                region_add(c, &r, a);
                if (!isfinite(BEST(s - 1, a))) continue;
                model_cost_t t = stage_sum(c, s - 1, n, a, b, &r);
                double mem = stage_mem(c, &t);
                if (flops && mem > cap) continue;
                double v = flops ? t.flops : mem;
                if (BEST(s - 1, a) > v) v = BEST(s - 1, a);
                if (v <= BEST(s, b)) { /* the earliest cut wins a tie */
                    BEST(s, b) = v;
                    FROM(s, b) = a;
                }
            }
        }
    double v = BEST(n, L);
    if (isfinite(v))
        for (int s = n, b = L; s > 0; s--) {
            int a = FROM(s, b);
            layers[s - 1] = b - a;
            b = a;
        }
#undef BEST
#undef FROM
    free(best);
    free(from);
    return v;
}

bt_status_t run_split_balanced(const job_t *job, const model_config_t *cfg, int n, int64_t *layers)
{
    if (n < 1 || n > cfg->num_layers) return BT_ERR_INVALID;
    costs_t c = {0};
    bt_status_t st = costs_build(job, cfg, &c);
    if (st != BT_OK) {
        free(c.layer);
        free(c.shared);
        return st;
    }
    double mem = split_dp(&c, n, false, 0, layers);
    if (!isfinite(mem) || !isfinite(split_dp(&c, n, true, mem, layers))) st = BT_ERR_NOMEM;
    free(c.layer);
    free(c.shared);
    return st;
}

bt_status_t run_split_resolve(job_t *job, char *err, size_t errlen)
{
    job_parallel_t *p = &job->parallel;
    if (!p->split_balanced) return BT_OK;
    if (p->virtual_stages > 1) {
        snprintf(err, errlen, "parallel.split: balanced places one stage per rank; with "
                              "virtual_stages %lld give the layers per stage as a list",
                 (long long)p->virtual_stages);
        return BT_ERR_INVALID;
    }
    if (!job->model.hf[0] && job->model.vocab == 0) {
        snprintf(err, errlen, "parallel.split: balanced costs the head by its vocabulary: set "
                              "model.vocab");
        return BT_ERR_INVALID;
    }
    model_config_t cfg;
    if (run_model_config(job, &cfg)) {
        snprintf(err, errlen, "parallel.split: balanced: the model config of %s does not load",
                 job->model.hf[0] ? job->model.hf : "model.*");
        return BT_ERR_INVALID;
    }
    int n = (int)p->pp;
    if (run_split_balanced(job, &cfg, n, p->split)) {
        snprintf(err, errlen, "parallel.split: balanced: no split of %lld layers into %d stages",
                 (long long)cfg.num_layers, n);
        return BT_ERR_INVALID;
    }
    p->n_split = n;
    return BT_OK;
}
