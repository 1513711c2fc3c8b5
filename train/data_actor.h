/* The data actor of a rank: on each step it sends its stage actor one
 * DATA_BATCH per microbatch (tensors "tokens" and "targets", i32 [B, T],
 * envelope step/mb), taken from the same global sample order as the
 * single-process loop (train/train.h).
 *
 * Data-parallel slice: the global batch of step s is R = dp * M * B rows,
 * samples g = s*R .. s*R + R - 1 of the sampler. Data-parallel rank d,
 * microbatch k, row b takes g = s*R + (d*M + k)*B + b: rank d gets the
 * contiguous block d of M*B rows, and the union over the dp ranks is exactly
 * the single-process global batch of grad_accum = dp * M microbatches.
 *
 * Resumed runs (base_step, base_samples from the checkpoint): step s > base_step
 * starts at sample base_samples + (s - 1 - base_step) * R, so the data goes
 * on where the checkpoint left it even when R changed with the layout.
 *
 * Trigger: a MSG_HEARTBEAT with state DATA_CMD_STEP and the 1-based step
 * (sent by the local stage actor when the driver starts a step).
 *
 * Evaluation (DATA_CMD_EVAL): the evaluation rows (ids and targets, -100 on
 * padding) are cut into microbatches of B rows (the last may be shorter);
 * data-parallel rank d sends global microbatches d, d+dp, ... as its local
 * microbatches 0, 1, ... with envelope step STAGE_EVAL_STEP (-1).
 */
#ifndef BT_TRAIN_DATA_ACTOR_H
#define BT_TRAIN_DATA_ACTOR_H

#include <stdint.h>

#include "actors/actor.h"
#include "train/train.h"

#define DATA_CMD_STEP 0x5354u /* heartbeat state: produce the microbatches of `step` */
#define DATA_CMD_EVAL 0x4556u /* heartbeat state: produce this rank's evaluation microbatches */

typedef struct {
    const int32_t *tokens;   /* training stream (borrowed); NULL: evaluation only */
    int64_t        n_tokens;
    uint64_t       seed;
    int64_t        B, T;     /* micro_batch, seq_len */
    int            M;        /* microbatches per step per replica */
    int            dp, dp_rank;
    /* context parallelism: every row goes out as CP rank cp_rank's chunks
     * (r and 2cp-1-r, model/cp_attn.h), [B, T/cp] ({0 or 1}: whole rows).
     * The targets are cut from the whole row's, so the chunk boundaries
     * lose no target. */
    int            cp, cp_rank;
    int64_t        base_step, base_samples; /* resumed from (0, 0: a fresh run) */
    actor_addr_t   stage;    /* the stage actor fed */
    const int32_t *eval_ids, *eval_targets; /* [eval_rows * T] (borrowed), or NULL */
    int64_t        eval_rows;
    bool           eval_pad;   /* as stage_actor_config_t's: pad to dp rank 0's count */
} data_actor_config_t;

typedef struct {
    actor_t             a;   /* first: the runtime header */
    data_actor_config_t cfg;
    train_sampler_t     sampler;
} data_actor_t;

/* Prepare (sampler) before actor_register with data_actor_class. */
bt_status_t data_actor_init(data_actor_t *d, const data_actor_config_t *cfg);
void        data_actor_fini(data_actor_t *d);
extern const actor_class_t data_actor_class;

#endif
