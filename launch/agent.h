/* The host agent of a job launched over ssh (`baton agent`, started by
 * launch/ssh.h on every host that is not `local`).
 *
 * Contract with the driver: the first RUN_SECRET_LEN bytes of stdin are the
 * job secret (ssh carries them; they are on no command line and in no
 * file); stdin then stays open as the driver's lifeline: its end (the
 * driver or its ssh died, the link broke) makes the agent SIGKILL its ranks
 * and exit 1. The agent finds the address its host reaches the driver by
 * (--peer, the driver's own address) and hands it to its ranks as
 * BATON_LISTEN_HOST, so their listeners are reachable from the other hosts.
 * It starts ranks first..first+count-1 as `baton worker` processes (the
 * secret through a pipe each, launch/spawn.h) and copies their output to its
 * stderr line by line, each line prefixed with "[HOST rR] ". It exits when
 * every rank has: 0 when all exited 0, else the first failure's status. */
#ifndef BT_LAUNCH_AGENT_H
#define BT_LAUNCH_AGENT_H

#include <stdbool.h>

/* slurm: started by srun (launch/slurm.h): first and host come from
 * SLURM_PROCID and SLURMD_NODENAME, the secret from BATON_AGENT_SECRET. */
int agent_main(const char *run_dir, int first, int count, const char *host, const char *peer, bool slurm);

#endif
