#include "train/lr_schedule.h"

#include <math.h>

double lr_schedule_at(const lr_schedule_t *s, int64_t step)
{
    if (step < 0) step = 0;
    if (step < s->warmup) {
        double lr0 = s->warmup_from_min ? s->min_lr : 0.0;
        return lr0 + (s->lr - lr0) * (double)(step + 1) / (double)s->warmup;
    }
    if (step >= s->total) return s->min_lr;
    double p = (double)(step - s->warmup + 1) / (double)(s->total - s->warmup);
    return s->min_lr + 0.5 * (s->lr - s->min_lr) * (1.0 + cos(M_PI * p));
}
