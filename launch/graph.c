#include "launch/graph.h"

#include <string.h>

#include "base/log.h"

static const char *const group_names[] = {"world", "tp", "dp", "emb", "ep", "edp", "cp"};
_Static_assert(sizeof group_names / sizeof group_names[0] == GRAPH_GROUP_COUNT, "group names");

const char *graph_group_name(graph_group_t kind) { return group_names[kind]; }

bt_status_t graph_build(const job_t *job, graph_t *g, char *err, size_t errlen)
{
    const job_parallel_t *p = &job->parallel;
    memset(g, 0, sizeof *g);
    g->tp = (int)p->tp;
    g->pp = (int)p->pp;
    g->dp = (int)p->dp;
    g->cp = (int)p->cp;
    g->cp_ring = p->cp_mode == JOB_CP_RING;
    g->vpp = (int)p->virtual_stages;
    g->n_vstages = g->pp * g->vpp;
    g->microbatches = (int)(p->microbatches ? p->microbatches : job->train.grad_accum);
    g->micro_batch = job->train.micro_batch;
    g->seq_len = job->data.seq_len;
    g->tied = job->model.tie_embeddings;
    g->zero1 = p->zero1;
    g->sp = p->sequence_parallel && p->tp > 1;
    g->ep = (int)p->ep;
    g->moe = job_has_experts(job);
    if (g->cp < 1) g->cp = 1;
    int64_t dense = p->tp * g->cp * p->dp; /* ranks of one pipeline stage */
    if (g->ep < 1 || dense % g->ep) {
        snprintf(err, errlen, "parallel.ep: %d must divide tp x cp x dp = %lld", g->ep,
                 (long long)dense);
        return BT_ERR_INVALID;
    }
    g->edp = (int)dense / g->ep;
    if (dense * p->pp > GRAPH_MAX_WORLD) {
        snprintf(err, errlen, "parallel: tp x cp x pp x dp = %lld ranks; this runtime supports up "
                 "to %d", (long long)(dense * p->pp), GRAPH_MAX_WORLD);
        return BT_ERR_INVALID;
    }
    g->world = (int)dense * g->pp;
    for (int e = 0; e < JOB_EDGE_COUNT; e++)
        if (g->world > 1 && job->transport[e] == JOB_XPORT_INPROC) {
            snprintf(err, errlen, "transport.%s: inproc links threads of one process, but every "
                     "rank is a process of its own (use tcp, ucx or auto)", job_edge_name((job_edge_t)e));
            return BT_ERR_INVALID;
        }
    if (g->n_vstages > GRAPH_MAX_VSTAGES) {
        snprintf(err, errlen, "parallel: %d virtual stages; at most %d", g->n_vstages,
                 GRAPH_MAX_VSTAGES);
        return BT_ERR_INVALID;
    }
    int64_t layers[GRAPH_MAX_VSTAGES];
    if (job_stage_layers(job, layers, GRAPH_MAX_VSTAGES) != g->n_vstages) {
        snprintf(err, errlen, "parallel: cannot split %lld layers into %d stages",
                 (long long)job->model.layers, g->n_vstages);
        return BT_ERR_INVALID;
    }
    int at = 0;
    for (int v = 0; v < g->n_vstages; v++) {
        if (layers[v] < 1) {
            snprintf(err, errlen, "parallel.split: virtual stage %d has no layer", v);
            return BT_ERR_INVALID;
        }
        g->first_layer[v] = at;
        at += (int)layers[v];
    }
    g->first_layer[g->n_vstages] = at;
    g->pipe = (pipe_config_t){.kind = p->schedule == JOB_SCHED_INTERLEAVED ? PIPE_SCHED_INTERLEAVED
                                                                           : PIPE_SCHED_1F1B,
                              .pp = g->pp, .vpp = g->vpp, .microbatches = g->microbatches};
    char why[256];
    if (pipe_config_check(&g->pipe, why, sizeof why)) {
        snprintf(err, errlen, "parallel: %s", why);
        return BT_ERR_INVALID;
    }
    return BT_OK;
}

graph_coord_t graph_coord(const graph_t *g, int rank)
{
    int cp = g->cp > 0 ? g->cp : 1;
    graph_coord_t c = {.tp = rank % g->tp, .cp = rank / g->tp % cp,
                       .dp = rank / (g->tp * cp) % g->dp, .pp = rank / (g->tp * cp * g->dp)};
    int i = rank % (g->tp * cp * g->dp), ep = g->ep > 0 ? g->ep : 1;
    c.ep = i % ep;
    c.edp = i / ep;
    return c;
}

/* The rank of stage-local index i (tp fastest) of pipeline stage pp. */
static int stage_local_rank(const graph_t *g, int i, int pp)
{
    return i + g->tp * g->cp * g->dp * pp;
}

graph_group_t graph_expert_dp_group(const graph_t *g)
{
    return g->ep == 1 && g->tp == 1 ? GRAPH_GROUP_DP : GRAPH_GROUP_EDP;
}

int graph_vstage_rank(const graph_t *g, int v, int rank)
{
    graph_coord_t c = graph_coord(g, rank);
    return graph_rank(g, c.tp, c.cp, c.dp, v % g->pp);
}

model_stage_t graph_vstage_stage(const graph_t *g, int v, int n_layers)
{
    (void)n_layers;
    return (model_stage_t){.first_layer = g->first_layer[v], .last_layer = g->first_layer[v + 1],
                           .has_embedding = v == 0, .has_head = v == g->n_vstages - 1};
}

bool graph_rank_needs_data(const graph_t *g, int rank)
{
    graph_coord_t c = graph_coord(g, rank);
    return c.pp == 0 || c.pp == (g->n_vstages - 1) % g->pp;
}

int graph_group_members(const graph_t *g, graph_group_t kind, int rank, int *members, int *me)
{
    graph_coord_t c = graph_coord(g, rank);
    int n = 0;
    *me = -1;
    switch (kind) {
    case GRAPH_GROUP_WORLD:
        for (int r = 0; r < g->world; r++) members[n++] = r;
        break;
    case GRAPH_GROUP_TP:
        for (int t = 0; t < g->tp; t++) members[n++] = graph_rank(g, t, c.cp, c.dp, c.pp);
        break;
    case GRAPH_GROUP_DP: /* dense gradients: every (cp, dp), cp fastest */
        for (int d = 0; d < g->dp; d++)
            for (int k = 0; k < g->cp; k++) members[n++] = graph_rank(g, c.tp, k, d, c.pp);
        break;
    case GRAPH_GROUP_CP:
        for (int k = 0; k < g->cp; k++) members[n++] = graph_rank(g, c.tp, k, c.dp, c.pp);
        break;
    case GRAPH_GROUP_EMB: {
        /* Only when the embedding and the head live on different ranks. */
        int last_pp = (g->n_vstages - 1) % g->pp;
        if (!g->tied || last_pp == 0 || (c.pp != 0 && c.pp != last_pp)) return 0;
        members[n++] = graph_rank(g, c.tp, c.cp, c.dp, 0);
        members[n++] = graph_rank(g, c.tp, c.cp, c.dp, last_pp);
        break;
    }
    case GRAPH_GROUP_EP:
        if (!g->moe) return 0;
        for (int j = 0; j < g->ep; j++) members[n++] = stage_local_rank(g, c.edp * g->ep + j, c.pp);
        break;
    case GRAPH_GROUP_EDP:
        if (!g->moe || graph_expert_dp_group(g) != GRAPH_GROUP_EDP) return 0;
        for (int k = 0; k < g->edp; k++) members[n++] = stage_local_rank(g, c.ep + g->ep * k, c.pp);
        break;
    default: BT_PANIC("group kind %d", (int)kind);
    }
    if (n < 2) return 0;
    for (int i = 0; i < n; i++)
        if (members[i] == rank) *me = i;
    return n;
}

const char *graph_edge_xport(const job_t *job, job_edge_t e)
{
    /* auto: tcp between processes unless some edge of the job asks for ucx
     * (only then do the ranks listen on ucx, and auto prefers it) */
    if (job->transport[e] != JOB_XPORT_AUTO) return job_xport_name(job->transport[e]);
    if (e == JOB_EDGE_DATA_PARALLEL || e == JOB_EDGE_TENSOR_PARALLEL) return "tcp";
    for (int k = 0; k < JOB_EDGE_COUNT; k++)
        if (job->transport[k] == JOB_XPORT_UCX) return "ucx";
    return "tcp";
}

void graph_print(const graph_t *g, const job_t *job, FILE *f)
{
    const char *host = job->n_hosts ? job->hosts[0] : "local";
    fprintf(f, "graph %s: tp=%d pp=%d dp=%d cp=%d virtual_stages=%d schedule=%s microbatches=%d "
               "zero1=%s world=%d\n",
            job->path, g->tp, g->pp, g->dp, g->cp, g->vpp, pipe_sched_name(g->pipe.kind),
            g->microbatches, g->zero1 ? "on" : "off", g->world);
    if (g->cp > 1)
        fprintf(f, "context parallel: cp=%d mode=%s; rank order tp-cp-ep-dp-pp; every sequence of "
                   "%lld tokens in %d chunks of %lld, CP rank r holds chunks r and %d-r (%lld tokens); "
                   "dense gradients reduce over dp x cp = %d ranks\n",
                g->cp, g->cp_ring ? "ring" : "allgather", (long long)g->seq_len, 2 * g->cp,
                (long long)(g->seq_len / (2 * g->cp)), 2 * g->cp - 1,
                (long long)(g->seq_len / g->cp), g->dp * g->cp);
    if (g->sp)
        fprintf(f, "sequence parallel: each TP rank keeps a near-even share of a microbatch's "
                   "%lld tokens through the norms and residuals; all-gather before the "
                   "column-parallel products, reduce-scatter after the row-parallel ones\n",
                (long long)(g->micro_batch * (g->seq_len / g->cp)));
    fprintf(f, "global batch: dp %d x microbatches %d x micro_batch %lld = %lld rows of %lld tokens\n",
            g->dp, g->microbatches, (long long)g->micro_batch,
            (long long)(g->dp * g->microbatches * g->micro_batch), (long long)g->seq_len);
    if (g->moe)
        fprintf(f, "dense grid: tp=%d cp=%d dp=%d pp=%d; expert grid: etp=1 ep=%d edp=%d pp=%d "
                   "(folded over tp x cp x dp = %d ranks per stage; %lld experts, %lld per EP rank; "
                   "expert gradients reduce over %s, dense over dp x cp)\n",
                g->tp, g->cp, g->dp, g->pp, g->ep, g->edp, g->pp, g->tp * g->cp * g->dp,
                (long long)job->model.n_experts, (long long)(job->model.n_experts / g->ep),
                graph_group_name(graph_expert_dp_group(g)));
    fprintf(f, "virtual stages:\n");
    for (int v = 0; v < g->n_vstages; v++)
        fprintf(f, "  v%d: layers [%d, %d)%s%s -> stage %d chunk %d\n", v, g->first_layer[v],
                g->first_layer[v + 1], v == 0 ? " +embedding" : "",
                v == g->n_vstages - 1 ? " +head+loss" : "", v % g->pp, v / g->pp);
    fprintf(f, "actors:\n");
    fprintf(f, "  driver rank %d slot %u host %s (%s)\n", g->world, GRAPH_SLOT_DRIVER, host,
            graph_edge_xport(job, JOB_EDGE_CONTROL));
    for (int r = 0; r < g->world; r++) {
        graph_coord_t c = graph_coord(g, r);
        char experts[96] = "";
        if (g->moe)
            snprintf(experts, sizeof experts, " ep=%d edp=%d experts [%lld, %lld)", c.ep, c.edp,
                     (long long)(c.ep * (job->model.n_experts / g->ep)),
                     (long long)((c.ep + 1) * (job->model.n_experts / g->ep)));
        char cpc[48] = "";
        if (g->cp > 1)
            snprintf(cpc, sizeof cpc, " cp=%d chunks %d,%d", c.cp, c.cp, 2 * g->cp - 1 - c.cp);
        fprintf(f, "  rank %d host %s (tp=%d%s dp=%d pp=%d%s): stage slot %u [", r, host, c.tp, cpc,
                c.dp, c.pp, experts, GRAPH_SLOT_STAGE);
        for (int k = 0; k < g->vpp; k++)
            fprintf(f, "%sv%d", k ? " " : "", graph_chunk_vstage(g, c.pp, k));
        fprintf(f, "]");
        if (graph_rank_needs_data(g, r)) fprintf(f, ", data slot %u", GRAPH_SLOT_DATA);
        if (g->moe) fprintf(f, ", experts slot %u", GRAPH_SLOT_EXPERTS);
        fprintf(f, "\n");
    }
    fprintf(f, "edges:\n");
    for (int r = 0; r < g->world; r++)
        fprintf(f, "  control: rank %d <-> driver (heartbeat, step, metrics, stop)\n", r);
    for (int r = 0; r < g->world; r++) {
        graph_coord_t c = graph_coord(g, r);
        for (int k = 0; k < g->vpp; k++) {
            int v = graph_chunk_vstage(g, c.pp, k);
            if (v + 1 >= g->n_vstages) continue;
            fprintf(f, "  pipeline (%s): v%d rank %d -> v%d rank %d ACTIVATION, back ACT_GRAD\n",
                    graph_edge_xport(job, JOB_EDGE_PIPELINE), v, r, v + 1,
                    graph_vstage_rank(g, v + 1, r));
        }
        if (graph_rank_needs_data(g, r))
            fprintf(f, "  data: rank %d data -> rank %d stage DATA_BATCH (local)\n", r, r);
        if (g->moe) {
            int mem[GRAPH_MAX_WORLD], me;
            int n = graph_group_members(g, GRAPH_GROUP_EP, r, mem, &me);
            fprintf(f, "  experts: rank %d stage -> rank %d experts EXPERT_TOKENS, back EXPERT_DONE "
                       "(local, per sparse layer", r, r);
            if (n) fprintf(f, "; rows all-to-all over the ep group, ranks");
            for (int i = 0; i < n; i++) fprintf(f, " %d", mem[i]);
            fprintf(f, ")\n");
        }
    }
    fprintf(f, "collective groups:\n");
    for (int k = 0; k < GRAPH_GROUP_COUNT; k++) {
        for (int r = 0; r < g->world; r++) {
            int mem[GRAPH_MAX_WORLD], me;
            int n = graph_group_members(g, (graph_group_t)k, r, mem, &me);
            if (n == 0 || me != 0) continue; /* print each group once, from its first member */
            fprintf(f, "  %s (%s)%s: ranks", graph_group_name((graph_group_t)k),
                    graph_edge_xport(job, k == GRAPH_GROUP_TP || k == GRAPH_GROUP_CP
                                              ? JOB_EDGE_TENSOR_PARALLEL : JOB_EDGE_DATA_PARALLEL),
                    k == GRAPH_GROUP_EP    ? " token all-to-all"
                    : k == GRAPH_GROUP_EDP ? " expert gradients"
                    : k == GRAPH_GROUP_CP  ? (g->cp_ring ? " K/V ring" : " K/V all-gather")
                    : k == GRAPH_GROUP_DP && g->cp > 1 ? " dense gradients over dp x cp"
                    : k == GRAPH_GROUP_TP && g->sp ? " sequence parallel: all-gather, reduce-scatter"
                                           : "");
            for (int i = 0; i < n; i++) fprintf(f, " %d", mem[i]);
            fprintf(f, "\n");
        }
    }
}
