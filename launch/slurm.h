/* Launching a job's ranks inside a Slurm allocation (docs/PARALLEL.md:
 * multi-node with Slurm).
 *
 * When: the job's hosts are `[slurm]`, or `baton run` runs inside an
 * allocation of two nodes or more (SLURM_JOB_ID and SLURM_JOB_NUM_NODES set)
 * and the job names no ssh hosts (hosts left at `[local]`);
 * BATON_LAUNCH=local in the environment keeps such a job on this machine.
 *
 * How: one `srun --nodes=N --ntasks=N --ntasks-per-node=1 --input=all
 * --kill-on-bad-exit=1 BATON agent --slurm ...` for the whole job: one agent
 * per node (launch/agent.h), task K (SLURM_PROCID) running ranks K*k ..
 * K*k+k-1 (k = world / N). The job secret goes to the agents in srun's
 * environment (BATON_AGENT_SECRET, hex; srun exports the environment of its
 * caller to the tasks): on no command line and in no file; each agent
 * removes it from its environment at once, and its ranks get it through a
 * pipe as on one host. srun's stdin stays open as the agents' lifeline, as
 * ssh's does. The driver listens on its address toward the first node's
 * NodeAddr (sinfo). The hosts share the run directory as ssh hosts do. */
#ifndef BT_LAUNCH_SLURM_H
#define BT_LAUNCH_SLURM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "launch/job.h"
#include "launch/spawn.h"

/* Whether this job launches through srun; *nodes gets the allocation's
 * node count (0 when the job wants Slurm but no allocation is there: the
 * caller reports it). */
bool slurm_job_wanted(const job_t *job, int *nodes);
/* The address of this machine toward the allocation's first node. */
bt_status_t slurm_driver_addr(char *out, size_t cap);
/* Starts the agents of world ranks over nodes nodes; out gets one entry per
 * rank, all sharing the srun process (same_as), host = the node's name. */
bt_status_t slurm_start(const job_t *job, const char *run_dir, const uint8_t *secret, size_t secret_len,
                        int world, int nodes, const char *peer, spawn_group_t *out);
/* In the agent: its first rank, its node's name and the secret from the
 * environment (removed from it). */
bt_status_t slurm_agent_env(int count, int *first, char *host, size_t host_cap, uint8_t *secret,
                            size_t secret_len);

#endif
