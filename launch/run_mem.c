#include "launch/run_mem.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/mem.h"
#include "launch/graph.h"
#include "launch/run_setup.h"

/* One process's holdings, with the vocabulary-sized share of each. */
typedef struct {
    run_mem_proc_t p;
    double vocab_steady, vocab_start; /* vocabulary bytes of the two phases' totals */
    bool start_peak;                  /* the start phase is the peak */
} proc_acc_t;

static void proc_finish(proc_acc_t *a)
{
    run_mem_proc_t *p = &a->p;
    double start = p->start + p->params + p->grads + p->copies;
    double steady = p->params + p->grads + p->optim + p->acts + p->copies;
    a->start_peak = start > steady;
    p->peak = a->start_peak ? start : steady;
}

static void plan_add(run_mem_plan_t *out, const proc_acc_t *a, int rank)
{
    const run_mem_proc_t *p = &a->p;
    out->n_procs++;
    out->total += p->peak;
    double vocab = a->start_peak ? a->vocab_start : a->vocab_steady;
    double acts = a->start_peak ? 0 : p->acts;
    out->part[RUN_MEM_VOCAB] += vocab;
    out->part[RUN_MEM_ACTS] += acts;
    out->part[RUN_MEM_LAYERS] += p->peak - vocab - acts;
    if (out->n_procs == 1 || p->peak > out->largest.peak) {
        out->largest = *p;
        out->largest_rank = rank;
    }
}

void run_mem_plan_single(const model_config_t *cfg, int64_t B, int64_t T, bool grads,
                         bool decode, double extra, run_mem_plan_t *out)
{
    memset(out, 0, sizeof *out);
    model_mem_t mm;
    model_mem_estimate(cfg, NULL, 0, 1, B, T, &mm);
    proc_acc_t a = {.p = {.params = mm.params, .grads = grads ? mm.params : 0,
                          .acts = (grads ? mm.acts : decode ? mm.acts_decode : mm.acts_fwd) +
                                  extra}};
    a.vocab_steady = mm.vocab_params * (grads ? 2 : 1);
    proc_finish(&a);
    plan_add(out, &a, -1);
}

/* The plan, and each process's holdings into procs[cap] when given (rank
 * order, the driver last). */
static bt_status_t plan_build(const job_t *job, const model_config_t *cfg, run_mem_plan_t *out,
                              run_mem_proc_t *procs, int cap, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    const job_parallel_t *par = &job->parallel;
    int64_t B = job->train.micro_batch, T = job->data.seq_len;
    if (par->tp * par->cp * par->pp * par->dp == 1) {
        model_mem_t mm;
        model_mem_estimate(cfg, NULL, 0, 1, B, T, &mm);
        /* train/train.c: gradients, AdamW m and v for every parameter */
        proc_acc_t a = {.p = {.params = mm.params, .grads = mm.params, .optim = 2 * mm.params,
                              .acts = mm.acts}};
        a.vocab_steady = 4 * mm.vocab_params;
        proc_finish(&a);
        plan_add(out, &a, -1);
        if (procs && cap > 0) procs[0] = a.p;
        return BT_OK;
    }
    static graph_t g; /* large; callers are single-threaded */
    if (graph_build(job, &g, err, errlen)) return BT_ERR_INVALID;
    model_mem_t whole;
    model_mem_estimate(cfg, NULL, 0, 1, 0, 0, &whole);
    /* Ranks differ by pipeline stage and TP rank (the vocabulary split may
     * be uneven), and by dp rank only in who gathers the export. A rank
     * builds only its share (launch/worker.c): while it loads, it holds its
     * parameters and one tensor's piece read from the file. */
    bool exports = job->export.dir[0] != '\0';
    for (int r = 0; r < g.world; r++) {
        graph_coord_t c = graph_coord(&g, r);
        proc_acc_t a = {0};
        double vocab_params = 0, largest = 0, stage_whole = 0;
        for (int k = 0; k < g.vpp; k++) {
            int v = graph_chunk_vstage(&g, c.pp, k);
            model_stage_t st = graph_vstage_stage(&g, v, (int)cfg->num_layers);
            model_mem_t mm, full;
            /* the rank's E / ep experts (EP folds over tp x dp: graph.h) */
            /* under CP the rank's T / cp tokens a row, and its K/V exchange scratch */
            model_parallel_t mp = {.tp_rank = c.tp, .tp_size = g.tp,
                                   .ep_rank = g.moe ? c.ep : 0, .ep_size = g.moe ? g.ep : 1,
                                   .cp_rank = c.cp, .cp_size = g.cp, .cp_ring = g.cp_ring,
                                   .sp = g.sp};
            model_mem_estimate_par(cfg, &st, &mp, B, T / g.cp, &mm);
            model_mem_estimate(cfg, &st, 0, 1, 0, 0, &full);
            a.p.params += mm.params;
            a.p.acts += (double)g.microbatches * mm.acts;
            vocab_params += mm.vocab_params;
            if (full.largest > largest) largest = full.largest;
            stage_whole += full.params;
        }
        a.p.start = largest; /* a tensor's piece on its way from the file */
        if (exports && c.dp == 0 && c.cp == 0) /* train/stage_actor.c: the export's host copies */
            a.p.copies = c.tp == 0 ? stage_whole : largest;
        a.p.grads = a.p.params;
        /* ZeRO-1 (refused where the experts reduce over a group of their own,
         * launch/job.c) shards every moment over dp */
        double shard = g.zero1 ? (double)(g.dp * g.cp) : 1.0;
        a.p.optim = 2 * a.p.params / shard;
        a.vocab_steady = vocab_params * (2 + 2 / shard);
        a.vocab_start = vocab_params * 2;
        proc_finish(&a);
        plan_add(out, &a, r);
        if (procs && r < cap) procs[r] = a.p;
    }
    if (job->export.dir[0]) { /* the driver assembles the whole model */
        proc_acc_t d = {.p = {.copies = whole.params}, .vocab_steady = whole.vocab_params};
        proc_finish(&d);
        plan_add(out, &d, -1);
        if (procs && g.world < cap) procs[g.world] = d.p;
    }
    return BT_OK;
}

bt_status_t run_mem_plan_job(const job_t *job, const model_config_t *cfg, run_mem_plan_t *out,
                             char *err, size_t errlen)
{
    return plan_build(job, cfg, out, NULL, 0, err, errlen);
}

bt_status_t run_mem_plan_procs(const job_t *job, const model_config_t *cfg, run_mem_plan_t *out,
                               run_mem_proc_t *procs, int cap, char *err, size_t errlen)
{
    for (int i = 0; i < cap; i++) procs[i] = (run_mem_proc_t){0};
    return plan_build(job, cfg, out, procs, cap, err, errlen);
}

run_mem_part_t run_mem_plan_main_part(const run_mem_plan_t *p)
{
    run_mem_part_t best = RUN_MEM_VOCAB;
    for (int i = 1; i < RUN_MEM_PART_COUNT; i++)
        if (p->part[i] > p->part[best]) best = (run_mem_part_t)i;
    return best;
}

/* Appends printf output at msg + *n, never past cap. */
static void msg_add(char *msg, size_t cap, int *n, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void msg_add(char *msg, size_t cap, int *n, const char *fmt, ...)
{
    if (*n < 0 || (size_t)*n >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(msg + *n, cap - (size_t)*n, fmt, ap);
    va_end(ap);
    *n = k < 0 ? -1 : *n + k;
}

bt_status_t run_mem_check(const run_mem_plan_t *p, char *msg, size_t cap)
{
    base_mem_limit_t lim;
    if (base_mem_limit_get(&lim, msg, cap)) return BT_ERR_INVALID;
    if (p->total <= lim.bytes) return BT_OK;
    const run_mem_proc_t *l = &p->largest;
    char buf[32];
    int n = 0;
    base_mem_size_fmt(p->total, buf, sizeof buf);
    msg_add(msg, cap, &n, "needs about %s of memory", buf);
    base_mem_size_fmt(l->peak, buf, sizeof buf);
    if (p->n_procs > 1 && p->largest_rank >= 0)
        msg_add(msg, cap, &n, " in %d processes (the largest, rank %d, %s:", p->n_procs,
                p->largest_rank, buf);
    else if (p->n_procs > 1)
        msg_add(msg, cap, &n, " in %d processes (the largest, the driver, %s:", p->n_procs, buf);
    else
        msg_add(msg, cap, &n, " (");
    const struct { const char *what; double v; } parts[] = {
        {"parameters", l->params}, {"gradients", l->grads}, {"optimizer state", l->optim},
        {"activations", l->acts}, {"the whole model while it starts", l->start},
        {"copies for export", l->copies},
    };
    bool first = true;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (parts[i].v <= 0) continue;
        base_mem_size_fmt(parts[i].v, buf, sizeof buf);
        msg_add(msg, cap, &n, "%s%s %s", first && p->n_procs == 1 ? "" : first ? " " : ", ",
                parts[i].what, buf);
        first = false;
    }
    base_mem_size_fmt(lim.bytes, buf, sizeof buf);
    bool env = !strncmp(lim.source, "BATON_MEM_LIMIT", 15);
    msg_add(msg, cap, &n, "), more than the %s available (%s%s)", buf, lim.source,
            env ? "" : "; BATON_MEM_LIMIT sets another");
    return BT_ERR_NOMEM;
}

const char *run_mem_part_field(const job_t *job, run_mem_part_t part, char *hint, size_t cap)
{
    bool hf = job->model.hf[0] != '\0';
    const job_model_t *m = &job->model;
    switch (part) {
    case RUN_MEM_VOCAB:
        if (hf) snprintf(hint, cap, "vocab_size %lld x hidden_size %lld in model.hf's config",
                         (long long)m->vocab, (long long)m->hidden);
        else snprintf(hint, cap, "model.vocab %lld x model.hidden %lld", (long long)m->vocab,
                      (long long)m->hidden);
        return hf ? "model.hf" : "model.vocab";
    case RUN_MEM_LAYERS:
        if (hf) snprintf(hint, cap, "num_hidden_layers %lld, hidden_size %lld, intermediate_size "
                         "%lld in model.hf's config", (long long)m->layers, (long long)m->hidden,
                         (long long)m->ffn);
        else snprintf(hint, cap, "model.layers %lld, model.hidden %lld, model.ffn %lld",
                      (long long)m->layers, (long long)m->hidden, (long long)m->ffn);
        return hf ? "model.hf" : "model.layers";
    default:
        if (job->parallel.tp * job->parallel.cp * job->parallel.pp * job->parallel.dp == 1)
            snprintf(hint, cap, "activations of train.micro_batch %lld x data.seq_len %lld",
                     (long long)job->train.micro_batch, (long long)job->data.seq_len);
        else
            snprintf(hint, cap, "activations of train.micro_batch %lld x data.seq_len %lld, one "
                     "per microbatch (%lld)", (long long)job->train.micro_batch,
                     (long long)job->data.seq_len,
                     (long long)(job->parallel.microbatches ? job->parallel.microbatches
                                                            : job->train.grad_accum));
        return "train.micro_batch";
    }
}

bt_status_t run_mem_job_check(const job_t *job, char *err, size_t errlen)
{
    model_config_t cfg;
    if (run_model_config(job, &cfg)) {
        snprintf(err, errlen, "%s: cannot read the model's config (the error above says why)",
                 job->path);
        return BT_ERR_INVALID;
    }
    run_mem_plan_t plan;
    if (run_mem_plan_job(job, &cfg, &plan, err, errlen)) return BT_ERR_INVALID;
    char msg[640];
    bt_status_t st = run_mem_check(&plan, msg, sizeof msg);
    if (st == BT_ERR_INVALID) snprintf(err, errlen, "%s", msg);
    if (st != BT_ERR_NOMEM) return st;
    char hint[192];
    run_mem_part_t part = run_mem_plan_main_part(&plan);
    const char *field = run_mem_part_field(job, part, hint, sizeof hint);
    job_error(job, field, err, errlen, "the job %s; %.0f%% of it is for %s", msg,
              100.0 * plan.part[part] / plan.total, hint);
    return BT_ERR_NOMEM;
}

bt_status_t run_mem_source_check(const char *source, const model_config_t *cfg,
                                 const run_mem_plan_t *plan, const char *acts_hint, char *err,
                                 size_t errlen)
{
    char msg[640];
    bt_status_t st = run_mem_check(plan, msg, sizeof msg);
    if (st == BT_ERR_INVALID) snprintf(err, errlen, "%s", msg);
    if (st != BT_ERR_NOMEM) return st;
    run_mem_part_t part = run_mem_plan_main_part(plan);
    char hint[192];
    if (part == RUN_MEM_VOCAB)
        snprintf(hint, sizeof hint, "the vocabulary-sized tensors (vocab_size %lld x hidden_size %lld)",
                 (long long)cfg->vocab_size, (long long)cfg->hidden_size);
    else if (part == RUN_MEM_LAYERS)
        snprintf(hint, sizeof hint, "the layers (num_hidden_layers %lld, hidden_size %lld, "
                 "intermediate_size %lld)", (long long)cfg->num_layers,
                 (long long)cfg->hidden_size, (long long)cfg->mlp.intermediate_size);
    else
        snprintf(hint, sizeof hint, "%s", acts_hint);
    snprintf(err, errlen, "%s: the model %s; %.0f%% of it is for %s", source, msg,
             100.0 * plan->part[part] / plan->total, hint);
    return BT_ERR_NOMEM;
}
