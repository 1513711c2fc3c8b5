/* The directory of one run, runs/<job>/<run id>/ (job field `runs`, default
 * "runs"; <job> is the job file's name without .yaml), and the
 * runs/<job>/latest link to the newest. A run never writes into another
 * run's directory: the id is the start time (YYYYMMDD-HHMMSS, local),
 * with -2, -3, ... when that second's directory exists already, and the
 * directory is created with mkdir, which fails when it exists.
 *
 * Output paths of the job (metrics.*, trace.dir, export.dir,
 * checkpoint.dir) may hold "{run}"; rundir_create replaces it with the
 * run's directory (the metrics defaults are under it). The directory
 * records what ran:
 *   job.yaml   the resolved job: every field, overrides applied (loadable)
 *   run.json   run id, command line, --set overrides, baton release and
 *              source revision, start time, working directory, host list
 *              and layout (tp, pp, dp, virtual stages, schedule,
 *              microbatches, ZeRO-1, layers per stage, processes)
 * Evaluation-only jobs (baton eval --layout) have no run directory. */
#ifndef BT_LAUNCH_RUNDIR_H
#define BT_LAUNCH_RUNDIR_H

#include "base/status.h"
#include "launch/job.h"

#define RUNDIR_MAX_SETS 8

typedef struct {
    char id[64];
    char path[JOB_PATH_MAX];
    /* "field=\"value\"" for every field whose {run} was replaced, for the
     * processes that read the job file again (launch/driver.h) */
    char sets[RUNDIR_MAX_SETS][JOB_PATH_MAX + 64];
    int  n_sets;
} rundir_t;

/* Creates the directory, replaces {run} in job's paths, writes job.yaml and
 * run.json, points `latest` at it. argv: the command line as given (for
 * run.json); sets: the --set overrides. BT_ERR_IO / BT_ERR_INVALID with
 * the reason in err (naming the field or the folder). */
bt_status_t rundir_create(job_t *job, int argc, char **argv, const char *const *sets, int n_sets,
                          rundir_t *rd, char *err, size_t errlen);

#endif
