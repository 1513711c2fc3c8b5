/* Single-process training loop: data order, microbatch accumulation, global
 * norm clipping, AdamW with a warmup+cosine schedule, NaN/Inf checks,
 * validation loss (docs/JOBS.md describes the conventions).
 *
 * Data order (layout-independent, reproducible from the seed):
 *   The training token stream is cut into windows of T+1 tokens at stride T
 *   (window w = tokens[w*T, w*T + T]; the first T are inputs, the last T the
 *   next-token targets, all T positions scored). W = (n_tokens - 1) / T.
 *   Epoch e visits the windows in the order of a Fisher-Yates shuffle driven
 *   by xoshiro256** seeded through splitmix64 (train_sampler_*). Sample g of
 *   the run (g = 0, 1, 2, ...) is window perm_{g / W}[g % W]; step s,
 *   microbatch k, row b uses g = (s * grad_accum + k) * micro_batch + b. A
 *   data-parallel layout later splits the same global samples among ranks.
 *
 * Accumulation convention: the gradient after all microbatches of a step is
 * the gradient of the MEAN loss over every scored position of the global
 * batch (all microbatches): each microbatch runs backward with
 * dloss = 1 / (scored positions in the whole global batch), and the reported
 * step loss is (sum of per-position NLL) / (scored positions).
 */
#ifndef BT_TRAIN_TRAIN_H
#define BT_TRAIN_TRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "train/lr_schedule.h"
#include "model/model.h"
#include "train/optim.h"

/* ---- deterministic PRNG and sampler --------------------------------------- */

/* splitmix64: advances *state, returns the next output (Vigna's constants). */
uint64_t train_splitmix64(uint64_t *state);

typedef struct { uint64_t s[4]; } train_rng_t;
/* Seed xoshiro256** with four splitmix64 outputs from `seed`. */
void     train_rng_seed(train_rng_t *r, uint64_t seed);
uint64_t train_rng_next(train_rng_t *r);            /* xoshiro256** */
/* Uniform-ish integer in [0, bound): (next * bound) >> 64 (bound > 0). */
uint64_t train_rng_below(train_rng_t *r, uint64_t bound);

typedef struct {
    uint64_t seed;
    int64_t  n_windows;
    int64_t  epoch;    /* epoch whose permutation `perm` holds; -1 none */
    int64_t *perm;     /* [n_windows] */
} train_sampler_t;

bt_status_t train_sampler_init(train_sampler_t *s, uint64_t seed, int64_t n_windows);
void        train_sampler_free(train_sampler_t *s);
/* Window index of global sample g. Epoch e's permutation: identity shuffled
 * by Fisher-Yates (i = W-1 down to 1: swap(i, below(i+1))) with the rng seeded
 * by seed ^ (e * 0x9E3779B97F4A7C15). */
int64_t     train_sampler_window(train_sampler_t *s, int64_t g);

/* ---- the loop ------------------------------------------------------------- */

typedef struct {
    int64_t steps, micro_batch, grad_accum, seq_len;
    uint64_t seed;
    int64_t eval_batches;      /* validation microbatches per evaluation; 0 = all */
    lr_schedule_t lr;
    optim_config_t optim;
    double clip;               /* max global grad norm; <= 0: no clipping */
    int64_t max_skipped_steps; /* consecutive non-finite steps skipped before an error */
} train_config_t;

typedef struct {
    int64_t step;              /* 1-based number of the step just done */
    double  loss;              /* mean NLL over the global batch (before the update) */
    double  lr;                /* learning rate used by this update */
    double  grad_norm;         /* global norm before clipping */
    int64_t tokens;            /* scored tokens this step */
    double  seconds;           /* wall time of this step */
    bool    skipped;           /* loss or gradient norm not finite: no update */
    int64_t skipped_total;     /* steps skipped so far in this run */
} train_step_info_t;

typedef struct train train_t;

/* Borrows m (whole model; gradients are allocated here) and the token arrays
 * (train stream, validation stream; val may be NULL/0). */
bt_status_t train_create(const train_config_t *cfg, model_t *m, const int32_t *train_tokens,
                         int64_t n_train, const int32_t *val_tokens, int64_t n_val,
                         train_t **out);
void        train_destroy(train_t *t);

/* One optimizer step (grad_accum microbatches). BT_ERR_NUMERIC, with an error
 * naming the step, when the loss or the gradient norm is NaN/Inf; the
 * parameters are then left as they were before the step. */
bt_status_t train_step(train_t *t, train_step_info_t *info);

/* Mean validation NLL over the first eval_batches (0: all) microbatches of
 * consecutive val windows (fixed, not shuffled); ppl = exp(loss).
 * BT_ERR_INVALID when there is no validation window. */
bt_status_t train_eval(train_t *t, double *loss, double *ppl);

int64_t     train_steps_done(const train_t *t);

/* Where a run stands, for a checkpoint: steps done (skipped ones included),
 * global samples consumed (the data position: the next step starts at
 * sample `samples` of the sampler's order, whatever the batch size was
 * before), non-finite steps (in all; in a row just now) and the
 * optimizer's update count (AdamW's bias correction). */
typedef struct {
    int64_t step, samples, skipped, skip_run, optim_steps;
} train_position_t;

void        train_position(const train_t *t, train_position_t *p);
int64_t     train_samples_done(const train_t *t);
/* Continue from p (the parameters and optimizer state restored already):
 * the next step is p->step + 1, its first sample p->samples. */
void        train_resume(train_t *t, const train_position_t *p);
optim_t    *train_optimizer(train_t *t);

#endif
