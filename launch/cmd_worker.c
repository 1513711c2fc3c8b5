/* baton worker --run-dir D --rank R: one rank of a multi-process job.
 * Internal: started by the driver of `baton run` (launch/driver.h). */
#include "launch/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/worker.h"

int cmd_worker(int argc, char **argv)
{
    const char *run_dir = NULL;
    int rank = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: baton worker --run-dir DIR --rank R (started by `baton run`)\n"
                   "  one rank process of a multi-process job; not for use by hand\n");
            return 0;
        }
        if (!strcmp(argv[i], "--run-dir") && i + 1 < argc) run_dir = argv[++i];
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc) rank = atoi(argv[++i]);
        else {
            fprintf(stderr, "baton worker: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!run_dir || rank < 0) {
        fprintf(stderr, "usage: baton worker --run-dir DIR --rank R (started by `baton run`)\n");
        return 2;
    }
    return worker_main(run_dir, rank);
}
