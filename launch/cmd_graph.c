/* baton graph JOB.yaml [--set k=v ...]: validate the job and print its actor
 * graph (actors and their placement, edges, collective groups) without
 * starting anything. */
#include "launch/cli.h"

#include <stdio.h>
#include <string.h>

#include "launch/graph.h"
#include "launch/job.h"
#include "launch/run_mem.h"
#include "launch/run_setup.h"
#include "launch/split.h"
#include "base/mem.h"
#include "model/model.h"
#include <stdlib.h>

static void bytes_fmt(double b, char *buf, size_t cap) { base_mem_size_fmt(b, buf, cap); }

/* What layers [a, b) of stage s of n are, in runs of equal blocks: "the
 * embedding, 1 mla+mlp, 13 mla+moe" (the head on the last stage). */
static void stage_contents(const model_config_t *mc, int s, int n, int a, int b, char *buf,
                           size_t cap)
{
    static const char *const mixer[] = {[MODEL_MIXER_NONE] = "",
                                        [MODEL_MIXER_ATTENTION] = "attention",
                                        [MODEL_MIXER_MAMBA2] = "mamba2",
                                        [MODEL_MIXER_MLA] = "mla"};
    static const char *const ffn[] = {
        [MODEL_FFN_NONE] = "", [MODEL_FFN_DENSE] = "mlp", [MODEL_FFN_MOE] = "moe"};
    _Static_assert(sizeof mixer / sizeof mixer[0] == MODEL_MIXER_COUNT, "a name per mixer kind");
    _Static_assert(sizeof ffn / sizeof ffn[0] == MODEL_FFN_COUNT, "a name per ffn kind");
    size_t k = 0;
    buf[0] = 0;
#define ADD(...)                                                                                   \
    (k += (size_t)snprintf(buf + k, k < cap ? cap - k : 0, __VA_ARGS__), k = k < cap ? k : cap)
    if (s == 0) ADD("the embedding");
    for (int l = a; l < b;) {
        int e = l;
        while (e < b && mc->blocks[e].mixer == mc->blocks[l].mixer &&
               mc->blocks[e].ffn == mc->blocks[l].ffn)
            e++;
        const model_block_t *bl = &mc->blocks[l];
        bool both = bl->mixer != MODEL_MIXER_NONE && bl->ffn != MODEL_FFN_NONE;
        ADD("%s%d %s%s%s", k ? ", " : "", e - l, mixer[bl->mixer], both ? "+" : "", ffn[bl->ffn]);
        l = e;
    }
    if (s == n - 1) ADD("%sthe head", k ? ", " : "");
#undef ADD
}

/* The job's pipeline split and the balanced one, stage by stage, by the
 * per-layer cost model (launch/split.h); then, for the job's split, each
 * split that moves one layer across one of its cuts, so that a neighbour
 * split's largest stage shows why it is not taken. */
static void split_print(const job_t *job, const model_config_t *mc)
{
    const job_parallel_t *p = &job->parallel;
    int n = (int)(p->pp * p->virtual_stages);
    if (p->pp < 2) return;
    static int64_t mine[JOB_MAX_STAGES], bal[JOB_MAX_STAGES];
    static run_split_stage_t st[JOB_MAX_STAGES];
    if (job_stage_layers(job, mine, JOB_MAX_STAGES) != n) return;
    bool have_bal = p->virtual_stages == 1 && run_split_balanced(job, mc, n, bal) == BT_OK;
    double arenas = (double)(p->microbatches ? p->microbatches : job->train.grad_accum);
    printf("pipeline split by the cost model (launch/split.h): per stage its parameters, one "
           "training arena, the estimate (parameters x %g + %lld arenas) and training FLOPs per "
           "token\n",
           2.0 + 2.0 / (p->zero1 ? (double)(p->dp * (p->cp > 1 ? p->cp : 1)) : 1.0),
           (long long)(p->microbatches ? p->microbatches : job->train.grad_accum));
    for (int k = 0; k < 2; k++) {
        const int64_t *split = k ? bal : mine;
        if (k && !have_bal) break;
        if (run_split_costs(job, mc, split, n, st)) return;
        double most = 0;
        for (int s = 0; s < n; s++)
            if (st[s].mem > most) most = st[s].mem;
        char big[32];
        bytes_fmt(most, big, sizeof big);
        printf("  %s split [", k ? "balanced" : p->split_balanced ? "this job's (balanced)"
                                 : p->n_split ? "this job's" : "this job's (even)");
        for (int s = 0; s < n; s++) printf("%s%lld", s ? ", " : "", (long long)split[s]);
        printf("]: largest stage %s (%.0f bytes)\n", big, most);
        for (int s = 0; s < n; s++) {
            char pa[32], ac[32], me[32], what[256], all[32];
            bytes_fmt(st[s].params, pa, sizeof pa);
            bytes_fmt(st[s].acts, ac, sizeof ac);
            bytes_fmt(st[s].mem, me, sizeof me);
            bytes_fmt(arenas * st[s].acts, all, sizeof all);
            stage_contents(mc, s, n, st[s].first, st[s].last, what, sizeof what);
            printf("    stage %d layers [%d, %d): parameters %s, arena %s, estimate %s, %.4g "
                   "GFLOP/token\n", s, st[s].first, st[s].last, pa, ac, me, st[s].flops * 1e-9);
            printf("      holds %s; activations %s (%.0f arenas)\n", what, all, arenas);
        }
    }
    /* the neighbours of the job's split: one layer across one cut */
    if (run_split_costs(job, mc, mine, n, st)) return;
    double base = 0;
    for (int s = 0; s < n; s++)
        if (st[s].mem > base) base = st[s].mem;
    static int64_t nb[JOB_MAX_STAGES];
    static run_split_stage_t nst[JOB_MAX_STAGES];
    bool head = false;
    for (int c = 0; c + 1 < n; c++)
        for (int dir = -1; dir <= 1; dir += 2) {
            /* dir -1: stage c gives its last layer to c + 1; +1: takes c + 1's first */
            if ((dir < 0 && mine[c] < 2) || (dir > 0 && mine[c + 1] < 2)) continue;
            for (int s = 0; s < n; s++) nb[s] = mine[s];
            nb[c] += dir;
            nb[c + 1] -= dir;
            if (run_split_costs(job, mc, nb, n, nst)) return;
            int worst = 0;
            for (int s = 1; s < n; s++)
                if (nst[s].mem > nst[worst].mem) worst = s;
            if (!head) {
                printf("  one layer moved across a cut of this job's split (the largest stage "
                       "against this split's largest):\n");
                head = true;
            }
            int moved = dir < 0 ? st[c].last - 1 : st[c + 1].first;
            char big[32], what[256];
            bytes_fmt(nst[worst].mem, big, sizeof big);
            stage_contents(mc, 1, 3, moved, moved + 1, what, sizeof what); /* the layer alone */
            printf("    [");
            for (int s = 0; s < n; s++) printf("%s%lld", s ? ", " : "", (long long)nb[s]);
            printf("] (layer %d, %s, to stage %d): largest stage %d, %s (%+.1f%%)\n", moved, what,
                   dir < 0 ? c + 1 : c, worst, big, 100.0 * (nst[worst].mem / base - 1));
        }
}

/* The parameter count and what every process will hold (launch/run_mem.h):
 * the same estimate `baton run` checks against the memory limit. */
static bt_status_t mem_print(job_t *job, const graph_t *g)
{
    if (!job->model.hf[0] && job->model.vocab == 0) { /* the vocabulary of the data */
        int32_t *tokens = NULL;
        int64_t n = 0;
        uint32_t vocab = 0;
        if (run_stream_load(job->data.dir, &tokens, &n, &vocab)) {
            run_data_error("graph", job, "data.dir");
            return BT_ERR_INVALID;
        }
        free(tokens);
        if (vocab == 0) {
            printf("memory: model.vocab is not set and the data does not state it: no estimate\n");
            return BT_OK;
        }
        job->model.vocab = vocab;
    }
    model_config_t mc;
    if (run_model_config(job, &mc)) return BT_ERR_INVALID;
    char err[JOB_ERR_MAX];
    static run_mem_proc_t procs[GRAPH_MAX_WORLD + 1];
    run_mem_plan_t plan;
    if (run_mem_plan_procs(job, &mc, &plan, procs, GRAPH_MAX_WORLD + 1, err, sizeof err)) {
        fprintf(stderr, "baton graph: %s\n", err);
        return BT_ERR_INVALID;
    }
    split_print(job, &mc);
    int64_t np = model_num_params(&mc);
    printf("parameters: %lld (%.2f M), vocab %lld, %lld layers\n", (long long)np, (double)np * 1e-6,
           (long long)mc.vocab_size, (long long)mc.num_layers);
    printf("memory estimate per process (launch/run_mem.h; code and libraries not counted):\n");
    bool single = g->world == 1 || job->parallel.tp * job->parallel.cp * job->parallel.pp * job->parallel.dp == 1;
    int n = single ? 1 : g->world + (job->export.dir[0] ? 1 : 0);
    for (int r = 0; r < n; r++) {
        const run_mem_proc_t *p = &procs[r];
        char pa[32], gr[32], op[32], ac[32], pk[32], cp[32];
        bytes_fmt(p->params, pa, sizeof pa);
        bytes_fmt(p->grads, gr, sizeof gr);
        bytes_fmt(p->optim, op, sizeof op);
        bytes_fmt(p->acts, ac, sizeof ac);
        bytes_fmt(p->peak, pk, sizeof pk);
        bytes_fmt(p->copies, cp, sizeof cp);
        if (single) printf("  process:");
        else if (r == g->world) printf("  driver:");
        else printf("  rank %d:", r);
        if (r < g->world || single)
            printf(" parameters %s, gradients %s, optimizer %s, activations %s", pa, gr, op, ac);
        if (p->copies > 0) printf("%s export copy %s", r < g->world || single ? "," : "", cp);
        printf(" -> peak %s\n", pk);
    }
    char tot[32];
    bytes_fmt(plan.total, tot, sizeof tot);
    printf("  all processes: %s\n", tot);
    return BT_OK;
}

static const char usage[] = "usage: baton graph JOB.yaml [--set section.key=value ...]\n";

int cmd_graph(int argc, char **argv)
{
    const char *path = NULL;
    static job_t job;
    const char *sets[256];
    int n_sets = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("%s  validates the job and prints its actor graph (ranks, actors, edges and their\n"
                   "  transports, collective groups), its parameters and the memory each process\n"
                   "  will hold, without starting anything\n", usage);
            return 0;
        }
        if (!strcmp(argv[i], "--set") && i + 1 < argc && n_sets < 256) sets[n_sets++] = argv[++i];
        else if (!strncmp(argv[i], "--set=", 6) && n_sets < 256) sets[n_sets++] = argv[i] + 6;
        else if (argv[i][0] != '-' && !path) path = argv[i];
        else {
            fprintf(stderr, "%s", usage);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "%s", usage);
        return 2;
    }
    char err[JOB_ERR_MAX];
    if (job_load(path, &job, err, sizeof err)) goto bad;
    for (int i = 0; i < n_sets; i++)
        if (job_override(&job, sets[i], err, sizeof err)) goto bad;
    if (job_validate(&job, err, sizeof err) || run_split_resolve(&job, err, sizeof err)) goto bad;
    static graph_t g;
    if (graph_build(&job, &g, err, sizeof err)) goto bad;
    graph_print(&g, &job, stdout);
    return mem_print(&job, &g) ? 1 : 0;
bad:
    fprintf(stderr, "baton graph: %s\n", err);
    return 1;
}
