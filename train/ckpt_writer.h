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

typedef struct {
    actor_t              a; /* first: the runtime header */
    ckpt_writer_config_t cfg;
    int64_t              step;     /* save being received or written; -1: none */
    uint32_t             count, got;
    actor_msg_t        **pieces;   /* [count] kept until written */
    bool                 busy;     /* a job runs on io */
    ckpt_writer_job_t   *job;
} ckpt_writer_t;

bt_status_t ckpt_writer_init(ckpt_writer_t *w, const ckpt_writer_config_t *cfg);
void        ckpt_writer_fini(ckpt_writer_t *w);
extern const actor_class_t ckpt_writer_class;

#endif
