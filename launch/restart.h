/* Automatic restart of a multi-process run (job field restart.max,
 * docs/JOBS.md): after a job failure (a rank died, hung or reported one;
 * not an interrupt, not bad input) the run is launched again, up to
 * restart.max times, from the newest committed checkpoint under
 * checkpoint.dir (from the start when there is none), in the same run
 * directory, with the same layout. Attempt N (1 first) writes where it
 * started, its failure verdict, hang report and exit status to
 * RUN_DIR/attempt-N.log; run.json gets "restarts" (how many happened) and
 * "attempts" (each one's number, start point "start" or what it resumed
 * from, exit status and failure). When the budget is spent the run fails
 * with one error listing every attempt's failure. The workers see
 * BATON_ATTEMPT=N (test hooks, train/stage_actor.c, coll/coll.h).
 *
 * Each failure is blamed on a host (driver_last_blame: the rank's host, the
 * ranks filling hosts in blocks; for a hang the host of its missing ranks,
 * hang_missing, when they share one; in a later attempt also a host ssh
 * cannot start on). When one host has failed restart.host_failures times the next
 * attempt runs without it: the same layout when the other hosts hold it in
 * equal blocks (with a cuda device, no more ranks per host than the first
 * attempt gave each), else the largest smaller parallel.dp that fits and
 * divides the global batch (each replica's microbatches derived); nothing
 * fitting keeps the host, with a warning. The change goes to the driver
 * and the workers as --set assignments after the user's (hosts=[...],
 * parallel.dp, train.global_batch, and grad_accum or microbatches when
 * the job gives them); run.json's attempts record each one's hosts, dp and
 * blamed host. */
#ifndef BT_LAUNCH_RESTART_H
#define BT_LAUNCH_RESTART_H

#include <stdbool.h>

#include "launch/job.h"
#include "launch/rundir.h"

/* driver_run with restarts (job->restart.max of them); the exit status. */
int restart_run(job_t *job, const char *const *sets, int n_sets, bool quiet, const char *resume,
                const rundir_t *rd);

#endif
