/* baton graph JOB.yaml [--set k=v ...]: validate the job and print its actor
 * graph (actors and their placement, edges, collective groups) without
 * starting anything. */
#include "launch/cli.h"

#include <stdio.h>
#include <string.h>

#include "launch/graph.h"
#include "launch/job.h"

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
    return 0;
bad:
    fprintf(stderr, "baton graph: %s\n", err);
    return 1;
}
