/* baton agent --run-dir D --first R --count N --host H --peer ADDR: the
 * ranks of one host of a job launched over ssh. Internal: started by
 * `baton run` through ssh (launch/ssh.h, launch/agent.h); the job secret
 * comes on stdin. With --slurm (started through srun, launch/slurm.h) the
 * first rank and host come from SLURM_PROCID / SLURMD_NODENAME and the
 * secret from the environment. */
#include "launch/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/agent.h"

#define AGENT_USAGE "usage: baton agent --run-dir DIR --first R --count N --host NAME --peer ADDR " \
                    "(started by `baton run` over ssh), or --slurm --run-dir DIR --count N --peer ADDR " \
                    "(through srun)\n"

int cmd_agent(int argc, char **argv)
{
    const char *run_dir = NULL, *host = NULL, *peer = NULL;
    int first = -1, count = 0;
    bool slurm = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf(AGENT_USAGE "  the rank processes of one host of a multi-host job, their output\n"
                   "  prefixed [NAME rR]; the job secret is read from stdin; not for use by hand\n");
            return 0;
        }
        if (!strcmp(argv[i], "--run-dir") && i + 1 < argc) run_dir = argv[++i];
        else if (!strcmp(argv[i], "--first") && i + 1 < argc) first = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--count") && i + 1 < argc) count = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--host") && i + 1 < argc) host = argv[++i];
        else if (!strcmp(argv[i], "--peer") && i + 1 < argc) peer = argv[++i];
        else if (!strcmp(argv[i], "--slurm")) slurm = true, first = first < 0 ? 0 : first, host = host ? host : "slurm";
        else {
            fprintf(stderr, "baton agent: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!run_dir || !host || !peer || first < 0 || count < 1) {
        fprintf(stderr, AGENT_USAGE);
        return 2;
    }
    return agent_main(run_dir, first, count, host, peer, slurm);
}
