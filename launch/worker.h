/* One rank of a multi-process job (`baton worker --run-dir D --rank R`,
 * started by the driver, launch/driver.h).
 *
 * Threads: the router's I/O loop, one actor loop ("main") hosting the stage
 * actor and the data actor, and one compute worker (actors/worker.h) that
 * runs forward/backward and every collective. The worker builds its model
 * chunks from the whole model (same initialization or HF weights on every
 * rank), copying its layers by name.
 *
 * Exit: 0 after a normal STOP; 1 after a failure STOP or a lost driver (the
 * process then exits at once, without waiting for a compute job that may
 * be blocked on a dead peer). */
#ifndef BT_LAUNCH_WORKER_H
#define BT_LAUNCH_WORKER_H

/* Name of the run-directory files shared by driver and workers. */
#define RUN_FILE_JOB    "job.yaml"
#define RUN_FILE_SETS   "sets"
#define RUN_FILE_DRIVER "driver.card"
#define RUN_FILE_BOOK   "book"
#define RUN_FILE_EVAL   "eval.bin"
#define RUN_FILE_RUN_ID "run_id"   /* the run's id (launch/rundir.h), for the trace files */
#define RUN_FILE_MODE   "mode"     /* "eval": one evaluation pass, no training data */
#define RUN_FILE_RESUME "resume"   /* --resume: "step N", then lines "dir PATH", the step
                                    * directories (one per root holding it) */
#define RUN_DIR_RESUME_INDEX "resume-index" /* --resume: a copy of the checkpoint's index.json */
#define RUN_SECRET_LEN  32 /* bytes of the job secret (launch/spawn.h passes it) */

/* Evaluation rows file (driver -> workers): magic "BTEV", version 1, then
 * int64 rows, int64 T, int32 ids[rows*T], int32 targets[rows*T] (-100 on
 * positions not scored), little-endian host layout. */
#define RUN_EVAL_MAGIC   0x56455442u /* "BTEV" */
#define RUN_EVAL_VERSION 1u

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "launch/job.h"

int worker_main(const char *run_dir, int rank);

/* Write / read the evaluation rows file. read: *ids and *targets are
 * allocated (NULL when want_data is false: only *rows and *T are read). */
bt_status_t run_eval_write(const char *path, const int32_t *ids, const int32_t *targets,
                           int64_t rows, int64_t T);
bt_status_t run_eval_read(const char *path, bool want_data, int32_t **ids, int32_t **targets,
                          int64_t *rows, int64_t *T);

/* The job's training token stream as the single-process run cuts it
 * (data.val_dir, or the head of data.dir before the held-out split); *vocab
 * the data's vocabulary (0 when unknown). free(*tokens) when done. */
bt_status_t worker_train_stream(const job_t *job, int32_t **tokens, int64_t *n, uint32_t *vocab);

#endif
