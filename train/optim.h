/* AdamW over a set of named parameter tensors, with global-norm clipping.
 *
 * The optimizer borrows the parameter and gradient views (a model's, or one
 * pipeline stage's / ZeRO shard's) and owns the f32 moment buffers m and v,
 * on the parameters' device (one allocation, through kernels/device.h), and
 * runs on the stream it is given. When a parameter's dtype is not f32 (a
 * bf16 compute copy) the optimizer keeps an f32 master of it and writes the
 * copy in the same AdamW pass.
 * Per-step use:
 *   double norm = optim_grad_norm(o);               sqrt(sum of squares)
 *   double coef = optim_clip_coef(norm, max_norm);  torch clip_grad_norm_
 *   optim_step(o, lr, coef);                        grads *= coef, AdamW
 * Semantics are torch.optim.AdamW's single-tensor path (foreach=False) via
 * kern_adamw; clipping is torch.nn.utils.clip_grad_norm_'s:
 *   total_norm = || (||g_1||, ..., ||g_n||) ||_2,
 *   coef = min(1, max_norm / (total_norm + 1e-6)).
 */
#ifndef BT_TRAIN_OPTIM_H
#define BT_TRAIN_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "base/tensor.h"
#include "kernels/device.h"

struct model;

/* Which tensors get weight decay. MATRICES: ndim >= 2 (linear weights,
 * embeddings); 1-D tensors (norm weights, biases) get none: common practice
 * and what tools/train_torch_ref.py does with p.dim() >= 2. */
typedef enum { OPTIM_DECAY_MATRICES = 0, OPTIM_DECAY_ALL, OPTIM_DECAY_NONE, OPTIM_DECAY_COUNT } optim_decay_t;

typedef struct {
    double beta1, beta2, eps, weight_decay;
    optim_decay_t decay;
} optim_config_t;

typedef struct {
    const char *name;   /* borrowed; for messages */
    tensor_t    param;  /* borrowed; f32, or a lower-precision copy (see above) */
    tensor_t    grad;   /* same shape, borrowed; f32 or param's dtype */
    tensor_t    master; /* borrowed f32 master of a lower-precision param (a model's
                         * masters); .data NULL: the optimizer makes its own */
} optim_param_t;

typedef struct optim optim_t;

/* Every parameter on the device of stream s. */
bt_status_t optim_create(const optim_config_t *cfg, const optim_param_t *params, int n,
                         kern_stream_t *s, optim_t **out);
/* All parameters of a model (its params/grads views; grads must exist). */
bt_status_t optim_create_for_model(const optim_config_t *cfg, struct model *m, optim_t **out);
void        optim_destroy(optim_t *o);

/* Whether parameter i gets weight decay under the configured policy. */
bool        optim_param_decays(const optim_t *o, int i);
int         optim_param_count(const optim_t *o);
int64_t     optim_step_count(const optim_t *o); /* updates done so far */
/* Resume: the count of updates done (AdamW's bias correction uses it). */
void        optim_set_step_count(optim_t *o, int64_t n);
/* Parameter i's view as given to optim_create (its name and tensor). */
const optim_param_t *optim_param(const optim_t *o, int i);

double      optim_grad_norm(const optim_t *o);
double      optim_clip_coef(double total_norm, double max_norm); /* max_norm <= 0: 1 */
/* Name of a parameter whose gradient holds a NaN/Inf, or NULL. */
const char *optim_find_nonfinite_grad(const optim_t *o);

/* Fault injection for the tests of skipped steps: whether rank `rank`
 * should poison a gradient (make it NaN) at 1-based step `step`, from
 * BATON_TEST_NONFINITE="STEP" (that step), "STEP+" (that step and every
 * later one), optionally "@RANK" (default rank 0). Unset: never. */
bool optim_test_poison(int64_t step, int rank);

/* grads *= clip_coef (when < 1), then one AdamW update with learning rate lr. */
void        optim_step(optim_t *o, double lr, double clip_coef);

/* Moment buffers of parameter i (checkpointing, tests), on the device. */
tensor_t    optim_moment1(const optim_t *o, int i);
tensor_t    optim_moment2(const optim_t *o, int i);

#endif
