/* baton bench: benchmarks. Each compares against a reference measured in the
 * same run and reports ratios (bench/RESULTS.md records them). */
#include "launch/cli.h"

#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/bench_kernels.h"
#include "bench/bench_train.h"

static int bench_kernels_cmd(int argc, char **argv)
{
    const char *filter = argc > 1 ? argv[1] : NULL;
    return bench_kernels_run(stdout, filter, 0) == 0 ? 0 : 1;
}

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} bench_cmd_t;

static const bench_cmd_t benches[] = {
    {"transport", bench_transport_main,
     "[--transport inproc|tcp|ucx] [--json] [--iters N] [--sizes ...]  actor-path ping-pong"},
    {"train", bench_train_main, "[--json]  CPU training tokens/s vs PyTorch eager"},
    {"kernels", bench_kernels_cmd, "[FILTER]  CPU kernel timings"},
    {"ckpt", bench_ckpt_main, "--dir DIR [--mb N] [--tensors K] [--json]  one checkpoint save + load"},
};

int cmd_bench(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "usage: baton bench BENCHMARK [ARGS]\n");
        for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
            fprintf(f, "  %-9s %s\n", benches[i].name, benches[i].help);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        if (!strcmp(argv[1], benches[i].name)) return benches[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "baton bench: unknown benchmark '%s' (known: transport, train, kernels, ckpt)\n",
            argv[1]);
    return 2;
}
