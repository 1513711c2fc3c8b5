#include "launch/cli.h"

#include <stdio.h>

/* Placeholder until the benchmarks land. */
int cmd_bench(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "baton bench: not built yet\n");
    return 2;
}
