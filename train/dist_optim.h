/* The end of a distributed training step on one rank: gradient reduction
 * over data parallelism (all-reduce, or ZeRO-1 reduce-scatter), the tied
 * embedding's two copies, the global gradient norm, clipping and AdamW.
 *
 * Runs on the compute thread (collectives block). Every rank of the job
 * calls dist_optim_step once per step and issues its collectives in one fixed
 * order: embedding group, then the data-parallel group chunk by chunk, then
 * the world group (norm), then (ZeRO-1) the data-parallel all-gathers chunk
 * by chunk.
 *
 * Equivalence with train/train.h: the stages ran backward with
 * dloss = 1 / (scored positions of the GLOBAL batch), so the SUM of the
 * replicas' gradients is the single-process gradient. The norm counts every
 * unique gradient element once: the tied embedding's copy on the head stage
 * is skipped, data-parallel replicas count on dp rank 0 only (ZeRO-1: each
 * rank counts its shard). Clipping and AdamW are element-wise, so applying
 * them to a shard (ZeRO-1) or to a replica gives the single-process values.
 *
 * Routed experts (model.h MODEL_PARAM_IS_EXPERT) reduce over their own
 * expert-data-parallel group `edp` (launch/graph.h: the ranks of a stage
 * holding the same experts), the other parameters over dp: the gradient
 * block is cut into runs of consecutive parameters of one kind, each
 * all-reduced over its group, in block order. Expert replicas count on
 * edp rank 0 only. When edp is dp (the same ranks) the block is reduced
 * whole, as without experts.
 */
#ifndef BT_TRAIN_DIST_OPTIM_H
#define BT_TRAIN_DIST_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "coll/coll.h"
#include "base/status.h"
#include "train/lr_schedule.h"
#include "model/model.h"
#include "train/optim.h"

#define DIST_OPTIM_MAX_CHUNKS 64

typedef struct {
    model_t       *chunks[DIST_OPTIM_MAX_CHUNKS]; /* this rank's stage models (grads allocated) */
    int            n_chunks;
    int            embed_chunk;    /* chunk holding virtual stage 0 here, or -1 */
    int            head_copy_chunk;/* chunk holding the tied head copy of the embedding, or -1 */
    coll_comm_t   *world;          /* NULL when the job has one rank */
    coll_comm_t   *dp;             /* NULL when dp == 1 */
    coll_comm_t   *emb;            /* NULL unless tied and embedding/head on two ranks */
    coll_comm_t   *edp;            /* the experts' gradient group: dp itself, another, or NULL
                                    * (every replica of this rank's experts is here) */
    bool           zero1;
    optim_config_t optim;
    lr_schedule_t  lr;
    double         clip;
    int            rank;           /* for messages */
} dist_optim_config_t;

typedef struct dist_optim dist_optim_t;

bt_status_t dist_optim_create(const dist_optim_config_t *cfg, dist_optim_t **out);
void        dist_optim_destroy(dist_optim_t *d);

/* Reduce, clip and update for 0-based step `step`. Writes the global norm
 * before clipping and the learning rate used. loss_bad: this rank's share
 * of the loss is not finite; it makes the global norm NaN, so that every
 * rank sees the same verdict. When the norm is not finite no rank updates
 * anything (*skipped, logged per rank with its first non-finite gradient);
 * the caller decides how many such steps in a row it tolerates. Collective
 * failures are returned as is. */
bt_status_t dist_optim_step(dist_optim_t *d, int64_t step, bool loss_bad, double *grad_norm,
                            double *lr, bool *skipped);

/* rows[n_rows][cols] (host f64; column 0 a label, the others counts)
 * summed over the data-parallel group in place, labels kept (the routed
 * experts' load of a step, train/stage_actor.c). Collective over dp. */
bt_status_t dist_optim_load_sum(dist_optim_t *d, double *rows, int n_rows, int cols);

/* This rank's optimizer state as checkpoint items (train/ckpt_state.h):
 * without ZeRO-1 the moments of every parameter, stored by data-parallel
 * rank 0 (dp0; an expert's by edp rank 0); with it this rank's partition,
 * always stored. The tied
 * head copy is never stored (its values are the embedding stage's). */
struct ckpt_items;
bt_status_t dist_optim_ckpt_items(const dist_optim_t *d, struct ckpt_items *it, bool dp0);
/* AdamW updates done (the same on every rank), and setting it on resume. */
int64_t     dist_optim_steps(const dist_optim_t *d);
void        dist_optim_set_steps(dist_optim_t *d, int64_t n);

#endif
