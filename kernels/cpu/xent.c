/* Fused softmax cross-entropy, whole-vocabulary and vocabulary-parallel.
 * Both paths compute loss = log(sum exp(x - max)) + max - x[target] with the
 * same operation order, so that the sharded loss equals the unsharded one up
 * to the order of the cross-shard sums. */
#include "kernels/cpu/cpu.h"

#include "base/log.h"

#include <math.h>
#include <string.h>

static float cpu_row_max(const float *x, int64_t V)
{
    float m = -INFINITY;
    for (int64_t j = 0; j < V; j++) m = x[j] > m ? x[j] : m;
    return m;
}

static double cpu_row_sumexp(const float *x, float max, int64_t V)
{
    double s = 0.0;
    for (int64_t j = 0; j < V; j++) s += expf(x[j] - max);
    return s;
}

/* d[j] = dloss * exp(x[j] - max) / sumexp, minus dloss at column tcol (if in range). */
static void cpu_row_dlogits(float *d, const float *x, float max, float sumexp, int64_t tcol,
                            int64_t V, float dloss)
{
    float inv = 1.0f / sumexp;
    for (int64_t j = 0; j < V; j++) d[j] = dloss * (expf(x[j] - max) * inv);
    if (tcol >= 0 && tcol < V) d[tcol] -= dloss;
}

int64_t cpu_xent_fwd_bwd(float *losses, float *dlogits, const float *logits,
                         const int32_t *targets, int64_t N, int64_t V, float dloss,
                         int32_t ignore_index)
{
    int64_t scored = 0;
    for (int64_t n = 0; n < N; n++) {
        const float *x = logits + n * V;
        int32_t t = targets[n];
        if (t == ignore_index) {
            losses[n] = 0.0f;
            if (dlogits) memset(dlogits + n * V, 0, (size_t)V * sizeof *dlogits);
            continue;
        }
        if (t < 0 || t >= V)
            BT_PANIC("kern_xent_fwd_bwd: target %d of row %lld outside the vocabulary [0, %lld)",
                     t, (long long)n, (long long)V);
        float max = cpu_row_max(x, V);
        float sumexp = (float)cpu_row_sumexp(x, max, V);
        losses[n] = logf(sumexp) + max - x[t];
        if (dlogits) cpu_row_dlogits(dlogits + n * V, x, max, sumexp, t, V, dloss);
        scored++;
    }
    return scored;
}

void cpu_xent_vp_max(float *row_max, const float *logits, int64_t N, int64_t V)
{
    for (int64_t n = 0; n < N; n++) row_max[n] = cpu_row_max(logits + n * V, V);
}

void cpu_xent_vp_sum(float *sumexp, float *tgt_logit, const float *logits, const float *gmax,
                     const int32_t *targets, int64_t N, int64_t V, int64_t vocab_start,
                     int32_t ignore_index)
{
    for (int64_t n = 0; n < N; n++) {
        const float *x = logits + n * V;
        sumexp[n] = (float)cpu_row_sumexp(x, gmax[n], V);
        int64_t tcol = (int64_t)targets[n] - vocab_start;
        bool mine = targets[n] != ignore_index && tcol >= 0 && tcol < V;
        tgt_logit[n] = mine ? x[tcol] : 0.0f;
    }
}

int64_t cpu_xent_vp_finish(float *losses, float *dlogits, const float *logits, const float *gmax,
                           const float *sumexp, const float *tgt_logit, const int32_t *targets,
                           int64_t N, int64_t V, int64_t vocab_start, float dloss,
                           int32_t ignore_index)
{
    int64_t scored = 0;
    for (int64_t n = 0; n < N; n++) {
        int32_t t = targets[n];
        if (t == ignore_index) {
            if (losses) losses[n] = 0.0f;
            if (dlogits) memset(dlogits + n * V, 0, (size_t)V * sizeof *dlogits);
            continue;
        }
        if (t < 0)
            BT_PANIC("kern_xent_vp_finish: negative target %d in row %lld (ignore_index %d)", t,
                     (long long)n, ignore_index);
        if (losses) losses[n] = logf(sumexp[n]) + gmax[n] - tgt_logit[n];
        if (dlogits)
            cpu_row_dlogits(dlogits + n * V, logits + n * V, gmax[n], sumexp[n],
                            (int64_t)t - vocab_start, V, dloss);
        scored++;
    }
    return scored;
}
