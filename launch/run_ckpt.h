/* Native checkpoints of a training run (docs/CHECKPOINTS.md): the
 * metadata a run writes into the index, the roots of checkpoint.dir, and
 * the checks a resume makes before any state is touched.
 *
 * meta (index.json "meta"):
 *   {"step": 6, "samples": 48, "rows_per_step": 8, "skipped": 0, "skip_run": 0,
 *    "optim_steps": 6, "seed": 1234,
 *    "layout": {"tp": 2, "pp": 2, "dp": 1, "virtual_stages": 1, "zero1": true,
 *               "microbatches": 4, "micro_batch": 1, "split": [4, 3]},
 *    "lr": {"lr": 3e-3, "min_lr": 3e-4, "warmup": 8, "steps": 72},
 *    "model": {... config.json ...},
 *    "job": {"file": "jobs/x.yaml", "sets": ["train.steps=6"], "text": "..."}}
 * The RNG state of the run is its seed and the data position: the sampler
 * is a pure function of (seed, sample index), and there is no other
 * randomness after initialisation. */
#ifndef BT_LAUNCH_RUN_CKPT_H
#define BT_LAUNCH_RUN_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "ckpt/native.h"
#include "launch/job.h"
#include "model/config.h"
#include "train/train.h"

typedef struct {
    train_position_t pos;
    int64_t          rows_per_step;
    uint64_t         seed;
    int64_t          tp, pp, dp, vpp;
    bool             zero1;
} run_ckpt_meta_t;

/* The metadata object (malloc'd JSON text). */
char       *run_ckpt_meta_json(const job_t *job, const char *const *sets, int n_sets,
                               const model_config_t *cfg, const train_position_t *pos,
                               int64_t rows_per_step);
/* Reads what a resume needs from idx's meta and checks it against the job:
 * the same model (config.json text equal), step within train.steps. A
 * different seed or global batch is allowed and said (warning). `dir`
 * names the checkpoint in errors. */
bt_status_t run_ckpt_meta_check(const ckpt_index_t *idx, const char *dir, const job_t *job,
                                const model_config_t *cfg, run_ckpt_meta_t *out, char *err,
                                size_t errlen);

/* checkpoint.dir of `rank` ({rank} and {host} expanded). */
bt_status_t run_ckpt_root(const job_t *job, int rank, char *out, size_t cap);
/* The file a rank's writer writes: "shard-r00003.safetensors". */
void        run_ckpt_shard_name(int rank, char *buf, size_t cap);

/* The checkpoint `--resume WHAT` names for a process whose root is `root`:
 * "latest" (or NULL) is root's newest, anything else a step directory or a
 * root (ckpt_resolve). */
bt_status_t run_ckpt_find(const char *what, const char *root, char *dir, size_t cap, char *err,
                          size_t errlen);

/* One writer's whole save: puts as `file` of root's step directory, with
 * meta, committed (ckpt/store.h), retention `keep`. */
bt_status_t run_ckpt_save_one(const char *root, int64_t step, const char *file,
                              const ckpt_put_t *puts, int n, const char *meta, int64_t keep,
                              char *err, size_t errlen);

/* A resume's reading, the same for one process and for each rank: the
 * checkpoint over dirs[n] (files in none of them through fetch when it is
 * non-NULL), its metadata checked against the job (run_ckpt_meta_check),
 * save_root (when non-empty) refused when it holds a newer step
 * (run_ckpt_newer_check), then every item restored. *fetched: bytes that
 * came through fetch. err names what failed. */
struct ckpt_items;
bt_status_t run_ckpt_restore(const char *const *dirs, int n, ckpt_fetch_fn fetch, void *fetch_arg,
                             const job_t *job, const model_config_t *cfg, const char *save_root,
                             const struct ckpt_items *items, run_ckpt_meta_t *meta,
                             uint64_t *fetched, char *err, size_t errlen);

/* A resumed run saves into root: refused up front when root holds a
 * committed step newer than `step` (nothing is overwritten). */
bt_status_t run_ckpt_newer_check(const char *root, int64_t step, char *err, size_t errlen);

/* The metrics file of a resumed run: lines of steps after `step` (a run
 * that went on past its last checkpoint) are dropped, atomically; *tokens
 * is the token count of the last kept step line (0: none). A missing file
 * is no error. */
bt_status_t run_metrics_trim(const char *path, int64_t step, int64_t *tokens);

#endif
