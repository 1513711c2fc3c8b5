/* The checkpoint-writer actor of a rank (docs/CHECKPOINTS.md, "Saving
 * from a distributed run"). It runs on a loop of its own and does its
 * file I/O on a worker of its own, so that neither the stage's loop nor its
 * compute thread ever waits for a disk.
 *
 * One save, step n:
 *   stage  -> writer  CKPT_CTL BEGIN {step n, count k}, then k CKPT_PIECE
 *                     (each a piece with its shard spec and tensor "data";
 *                     the stage's host snapshot, freed with the message)
 *   writer            writes them as one shard file into ROOT/.step-n.tmp
 *                     (ckpt_shard_write: fsynced, read back, hashed)
 *   writer -> driver  CKPT_CTL WRITTEN {step n, rank} + tensor "index" (the
 *                     file's fragment of index.json) and "root" (ROOT)
 *   driver -> writer  CKPT_CTL COMMIT {step n} + tensor "index" (the whole
 *                     index), to one writer per distinct root
 *   writer            ckpt_commit (index, rename, latest, retention)
 *   writer -> driver  CKPT_CTL COMMITTED, or FAILED {status, text}
 * Resume: the writer also serves the fetches of other ranks (CKPT_FETCH
 * requests the driver forwards: bytes of a file of its root, size- and
 * hash-checked first) and carries its own rank's (ckpt_writer_fetch).
 * k may be 0 (a rank that holds nothing another rank does not store): the
 * writer then writes no file and reports an empty fragment. Everything
 * that arrives is checked (step, count, specs, names) and a mismatch is a
 * FAILED report naming what, never a crash. */
#ifndef BT_TRAIN_CKPT_WRITER_H
#define BT_TRAIN_CKPT_WRITER_H

#include <stdbool.h>
#include <stdint.h>

#include "actors/actor.h"
#include "actors/worker.h"
#include "ckpt/native.h"

#define CKPT_WRITER_ROOT_MAX 4096

typedef struct {
    int             rank;
    char            root[CKPT_WRITER_ROOT_MAX]; /* this rank's checkpoint root */
    char            file[CKPT_FILE_MAX];        /* its shard file's name */
    int64_t         keep;                       /* retention (0: all) */
    actor_addr_t    driver;
    actor_worker_t *io;                         /* its own worker thread */
} ckpt_writer_config_t;

typedef struct ckpt_writer_job ckpt_writer_job_t;
typedef struct ckpt_fetch_req ckpt_fetch_req_t;

typedef struct {
    actor_t              a; /* first: the runtime header */
    ckpt_writer_config_t cfg;
    int64_t              step;     /* save being received or written; -1: none */
    uint32_t             count, got;
    actor_msg_t        **pieces;   /* [count] kept until written */
    bool                 busy;     /* a job runs on io */
    ckpt_writer_job_t   *job;
    /* resume (docs/CHECKPOINTS.md, "No shared storage"): fetches this
     * rank's restore asked for, waiting for their replies (loop thread) */
    ckpt_fetch_req_t    *pending;
    uint64_t             next_req;
    /* serving other ranks' fetches from this root: the reader of step
     * serve_step (io thread) */
    ckpt_reader_t       *serve;
    int64_t              serve_step;
} ckpt_writer_t;

bt_status_t ckpt_writer_init(ckpt_writer_t *w, const ckpt_writer_config_t *cfg);
/* From any thread but the writer's loop (a rank's restore): bytes
 * [offset, offset + len) of `file` of the checkpoint of `step`, asked of
 * the driver (CKPT_FETCH), which forwards to the rank that wrote the file
 * or serves it. Waits up to timeout_s. A ckpt_fetch_fn with arg = the
 * fetch context (ckpt_writer_fetch_ctx_t). */
typedef struct {
    ckpt_writer_t *w;
    int64_t        step;
    double         timeout_s;
} ckpt_writer_fetch_ctx_t;
bt_status_t ckpt_writer_fetch(void *ctx, const char *file, uint64_t offset, uint64_t len,
                              void *dst, char *err, size_t errlen);
void        ckpt_writer_fini(ckpt_writer_t *w);
extern const actor_class_t ckpt_writer_class;

#endif
