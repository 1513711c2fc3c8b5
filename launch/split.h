/* Pipeline splits from the per-layer cost model (model/cost.h).
 *
 * A stage of layers [a, b) on one rank is estimated as a worker holds it
 * (launch/run_mem.h): parameters, gradients and the two AdamW moments
 * (divided by dp under ZeRO-1) of its layers, the embedding on the first
 * stage, the head on the last, plus `microbatches` training arenas of
 * micro_batch x seq_len, each the stage's layers' activations and what every
 * arena holds. Its time is its training FLOPs per token.
 *
 * `parallel.split: balanced` asks for the split into pp stages (of at least
 * one layer each) whose largest memory estimate is least, and among those
 * the one whose largest FLOPs are least; ties go to the split that puts
 * layers earlier. It is computed from the model config alone, so the driver
 * and every worker compute the same one. */
#ifndef BT_LAUNCH_SPLIT_H
#define BT_LAUNCH_SPLIT_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "launch/job.h"
#include "model/config.h"

typedef struct {
    int    first, last; /* layers [first, last) */
    double params;      /* parameter bytes (f32, one TP rank) */
    double acts;        /* one training arena's bytes */
    double mem;         /* the estimate the split balances */
    double flops;       /* training FLOPs per token of the stage's layers (and head) */
} run_split_stage_t;

/* The stages of split layers[n] (layers per stage, summing to the model's). */
bt_status_t run_split_costs(const job_t *job, const model_config_t *cfg, const int64_t *layers,
                            int n, run_split_stage_t *out);
/* The balanced split of cfg's layers into n stages: layers[n]. */
bt_status_t run_split_balanced(const job_t *job, const model_config_t *cfg, int n,
                               int64_t *layers);
/* parallel.split: balanced: fills job->parallel.split with the balanced
 * split (nothing for any other split). Refuses, naming the field, a
 * balanced split with virtual stages or without a vocabulary to cost the
 * head with (a model without model.hf needs model.vocab). */
bt_status_t run_split_resolve(job_t *job, char *err, size_t errlen);

#endif
