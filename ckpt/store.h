/* Checkpoint roots: step directories, their atomic commit, the `latest`
 * pointer and retention (docs/CHECKPOINTS.md, "A root").
 *
 *   ROOT/step-00000006/         a committed checkpoint (index.json + shards)
 *   ROOT/.step-00000006.tmp/    one being written: never read
 *   ROOT/latest                 "step-00000006\n", replaced atomically
 *
 * A save writes its shard files into the temporary directory (each fsynced
 * with its directory, ckpt_shard_write), then ckpt_commit writes the index
 * there, fsyncs, renames the directory to its final name, fsyncs the root,
 * replaces `latest` and removes what retention no longer keeps. A crash at
 * any instant leaves either the previous checkpoint as the newest complete
 * one or the new one complete: a step directory exists only with its index,
 * which is written last. Several writers may share a root (one directory
 * for all ranks) or each have their own (node-local disks); then every
 * root commits its own copy of the index, listing every rank's files.
 *
 * File-system steps go through base_save_step (BATON_FAULT_SAVE_STEP). */
#ifndef BT_CKPT_STORE_H
#define BT_CKPT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "ckpt/native.h"

#define CKPT_LATEST_FILE "latest"
#define CKPT_PATH_MAX    4096

/* "step-00000006" */
void        ckpt_step_name(int64_t step, char *buf, size_t cap);
/* ROOT/step-N and ROOT/.step-N.tmp */
void        ckpt_step_dir(const char *root, int64_t step, char *buf, size_t cap);
void        ckpt_step_tmp(const char *root, int64_t step, char *buf, size_t cap);
/* Creates root (and its parents) and the temporary directory of `step`
 * (present already: kept, another writer of the same root made it). */
bt_status_t ckpt_stage_begin(const char *root, int64_t step, char *err, size_t errlen);
/* Commits the temporary directory of `step` with idx as its index: files
 * in it that idx does not list are removed first, temporaries of other
 * steps too (a save that died); keep > 0: only the newest `keep` committed
 * steps stay. A committed directory of that step already there is an
 * error (nothing is overwritten). */
bt_status_t ckpt_commit(const char *root, int64_t step, const ckpt_index_t *idx, int64_t keep,
                        char *err, size_t errlen);
/* Committed steps of root (directories step-N holding an index), ascending,
 * at most max of the newest; returns how many (0: none or no root). */
int         ckpt_list_steps(const char *root, int64_t *steps, int max);
/* A checkpoint named by the user: a step directory (with index.json), or a
 * root, meaning its newest committed step (which `latest` names too, except
 * after a crash between a commit's rename and its update of `latest`: the
 * directories are the truth, the pointer is for people and tools). */
bt_status_t ckpt_resolve(const char *path, char *dir, size_t cap, char *err, size_t errlen);

#endif
