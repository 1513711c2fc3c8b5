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
#include "base/mem.h"
#include "model/model.h"
#include <stdlib.h>

static void bytes_fmt(double b, char *buf, size_t cap) { base_mem_size_fmt(b, buf, cap); }

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
    if (job_validate(&job, err, sizeof err)) goto bad;
    static graph_t g;
    if (graph_build(&job, &g, err, sizeof err)) goto bad;
    graph_print(&g, &job, stdout);
    return mem_print(&job, &g) ? 1 : 0;
bad:
    fprintf(stderr, "baton graph: %s\n", err);
    return 1;
}
