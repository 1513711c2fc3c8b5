#include "launch/cli.h"

#include <stdio.h>

/* Placeholder until the issue that owns this command lands it. */
int cmd_worker(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "baton worker: not built yet\n");
    return 2;
}
