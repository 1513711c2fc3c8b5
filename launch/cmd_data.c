#include "launch/cli.h"

#include <stdio.h>

/* Placeholder until the issue that owns this command lands it. */
int cmd_data(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "baton data: not built yet\n");
    return 2;
}
