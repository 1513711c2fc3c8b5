/* baton bench: benchmarks. */
#include "launch/cli.h"

#include <stdio.h>
#include <string.h>

#include "bench/bench.h"

int cmd_bench(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fprintf(argc < 2 ? stderr : stdout,
                "usage: baton bench transport [--transport inproc|tcp|ucx] [--json] [--iters N] "
                "[--sizes ...]\n       (run `baton bench transport --help` for all options)\n");
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "transport")) return bench_transport_main(argc - 1, argv + 1);
    fprintf(stderr, "baton bench: unknown benchmark '%s' (known: transport)\n", argv[1]);
    return 2;
}
