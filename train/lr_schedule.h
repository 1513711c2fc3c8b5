/* Learning-rate schedule: linear warmup, then cosine decay to min_lr.
 *
 * s is the 0-based index of the optimizer step (s = 0 is the first update),
 * W = warmup steps, S = total steps, lr0 = warmup start (0, or min_lr):
 *
 *   s <  W:       lr(s) = lr0 + (lr - lr0) * (s + 1) / W
 *   W <= s < S:   p = (s - W + 1) / (S - W)                  (0 < p <= 1)
 *                 lr(s) = min_lr + 0.5 * (lr - min_lr) * (1 + cos(pi * p))
 *   s >= S:       lr(s) = min_lr
 *
 * So warmup reaches lr exactly on its last step, the first decay step is just
 * below lr, and the last step (s = S - 1) runs at min_lr. No step runs at
 * lr = 0. tools/train_torch_ref.py implements the same formula (docs/JOBS.md).
 * Computed in double, returned as float as the optimizer uses it. */
#ifndef BT_TRAIN_LR_SCHEDULE_H
#define BT_TRAIN_LR_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    double  lr, min_lr;
    int64_t warmup, total;
    bool    warmup_from_min; /* start warmup at min_lr instead of 0 */
} lr_schedule_t;

double lr_schedule_at(const lr_schedule_t *s, int64_t step);

#endif
