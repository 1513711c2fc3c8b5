/* The driver of a multi-process job (`baton run` with tp*pp*dp > 1).
 *
 * It validates the job and builds its graph (launch/graph.h), creates a
 * private run directory (0700, launch/jobdir.h) holding the job file and
 * its --set overrides, starts one `baton worker` process per rank
 * (launch/spawn.h; the job secret goes to them through pipes) and runs the
 * driver actor:
 *   rendezvous  each worker writes run-dir/rank.R (its router card and the
 *               listen address of each collective group it is in); when all
 *               are there the driver writes run-dir/book (all of them), the
 *               workers connect their pipeline edges and collective groups
 *               and report READY over their control edge;
 *   steps       STEP(n) to every stage actor; every rank answers METRICS at
 *               the end of its step; the driver prints the progress line and
 *               appends the metrics JSON line, then starts step n+1;
 *   export      every export.every steps and after the last, the ranks
 *               of data-parallel and tensor-parallel replica 0 send their
 *               parameters (CKPT_SHARD); the driver assembles the whole model
 *               and its saver thread writes export.dir in HF format
 *               (atomically, ckpt_hf_save) before the next step starts;
 *   stop        STOP to all; children are reaped (SIGKILL after a grace time).
 * Supervision: heartbeats (a rank silent for BATON_HEARTBEAT_TIMEOUT seconds,
 * default 5), transport error reports of every edge, child exits (waitpid)
 * and a step watchdog (BATON_STEP_TIMEOUT seconds, default 300) fail the
 * job with one message naming the rank, its pid, host and coordinates; every
 * process is then stopped. A timeout without a dead process adds a hang
 * report (launch/hang.h) from what each rank's heartbeats said it waits in.
 */
#ifndef BT_LAUNCH_DRIVER_H
#define BT_LAUNCH_DRIVER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

#include "launch/job.h"
#include "launch/rundir.h"

/* Run a validated job with tp*pp*dp > 1. sets: the --set overrides already
 * applied to job (forwarded to the workers). resume: NULL, or what
 * `--resume` names ("latest", a step directory or a root). rd: the run's
 * directory (its {run} paths already in job). Returns the exit status. */
int driver_run(job_t *job, const char *const *sets, int n_sets, bool quiet, const char *resume,
               const rundir_t *rd);

/* Whether the last driver_run of this process ended in a job failure (a
 * rank died, hung or reported one, or a signal: BT_ERR_CANCELED), with its
 * status and the "job failed" text; false when it finished, or stopped
 * before any rank started (bad input). For restarts (launch/restart.h). */
bool driver_last_failure(bt_status_t *status, char *text, size_t cap);
/* Whom the last driver_run blamed: *rank the rank of its job failure (the
 * dead process, or the rank that reported the failure or went silent; -1:
 * none; for a step past its timeout, the first rank the hang report names
 * missing when all it names share a host), *host the index in hosts of a host
 * it could not start on over ssh (-1: none; then text gets the error). */
void driver_last_blame(int *rank, int *host, char *text, size_t cap);
/* Also write the failure verdict and hang report of the coming runs to f
 * (NULL: no more). */
void driver_attempt_log(FILE *f);

/* One forward-only evaluation of the HF model in model_dir over `rows` rows
 * of T tokens (ids; targets -100 where not scored) in the layout
 * "tp=N,pp=N,dp=N" (missing keys: 1), as processes. Writes the mean NLL
 * over scored positions and their count. Returns the exit status. */
int driver_eval(const char *model_dir, const char *layout, const char *device, const char *dtype,
                const int32_t *ids, const int32_t *targets, int64_t rows, int64_t T, double *loss,
                int64_t *tokens);

#endif
