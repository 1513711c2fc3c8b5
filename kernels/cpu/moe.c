/* Routed experts on the CPU: routing (softmax, top-K, renormalisation and
 * the load-balancing statistics), dispatch (each row copied once per chosen
 * expert, the copies grouped by expert) and combine (the weighted sum back,
 * and a shared expert's sigmoid gate), each beside its backward. The experts' products are matmul.c's grouped
 * products. Semantics and shapes: kernels/kernels.h.
 *
 * Numerics follow transformers' Mixtral / Qwen2-MoE routers: the softmax in
 * fp32 semantics (here accumulated in double and rounded once), top-K on the
 * probabilities, the K weights divided by their sum when renormalised. */
#include "kernels/cpu/cpu.h"

#include "base/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- routing ---------------------------------------------------------------- */

/* One row's top-K by selection on p[e] (+ bias[e] when bias): the largest
 * remaining score, the lower index first on ties (strict >); the weights
 * are the probabilities themselves (renormalised when norm). */
static void topk_row(float *w, int32_t *ex, const float *p, const float *bias, int64_t E,
                     int64_t K, bool norm)
{
    double top = 0;
    for (int64_t k = 0; k < K; k++) {
        int64_t best = -1;
        float bs = 0;
        for (int64_t e = 0; e < E; e++) {
            bool taken = false;
            for (int64_t j = 0; j < k && !taken; j++) taken = ex[j] == e;
            float sc = bias ? p[e] + bias[e] : p[e];
            if (!taken && (best < 0 || sc > bs)) {
                best = e;
                bs = sc;
            }
        }
        ex[k] = (int32_t)best;
        w[k] = p[best];
        top += (double)p[best];
    }
    if (norm)
        for (int64_t k = 0; k < K; k++) w[k] = (float)((double)w[k] / top);
}

void cpu_moe_route_fwd(float *weights, int32_t *experts, float *probs, const float *logits,
                       int64_t N, int64_t E, int64_t K, bool norm)
{
    for (int64_t n = 0; n < N; n++) {
        const float *l = logits + n * E;
        float *p = probs + n * E;
        float mx = -INFINITY;
        for (int64_t e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        double sum = 0;
        for (int64_t e = 0; e < E; e++) sum += exp((double)l[e] - (double)mx);
        for (int64_t e = 0; e < E; e++) p[e] = (float)(exp((double)l[e] - (double)mx) / sum);
        topk_row(weights + n * K, experts + n * K, p, NULL, E, K, norm);
    }
}

void cpu_moe_route_reselect(float *weights, int32_t *experts, const float *probs,
                            const float *bias, int64_t N, int64_t E, int64_t K, bool norm)
{
    for (int64_t n = 0; n < N; n++)
        topk_row(weights + n * K, experts + n * K, probs + n * E, bias, E, K, norm);
}

static void route_check_expert(int32_t e, int64_t E, const char *op)
{
    if (e < 0 || e >= E) BT_PANIC("%s: expert id %d outside [0, %lld)", op, e, (long long)E);
}

/* Per row, with p the probabilities and the chosen set {e_k}:
 *   w_k = p_{e_k} / S (norm, S = sum_k p_{e_k}) or p_{e_k}
 *   dp_e = dprobs[e] + (norm ? (dw_k - sum_j dw_j w_j) / S : dw_k) for e = e_k
 *   dlogit_e = p_e (dp_e - sum_e' p_e' dp_e')                       (softmax) */
void cpu_moe_route_bwd(float *dlogits, const float *dweights, const float *dprobs,
                       const float *probs, const int32_t *experts, int64_t N, int64_t E, int64_t K,
                       bool norm)
{
    double *dp = malloc((size_t)E * sizeof *dp);
    if (!dp) BT_PANIC("kern_moe_route_bwd: out of memory for %lld experts", (long long)E);
    for (int64_t n = 0; n < N; n++) {
        const float *p = probs + n * E;
        const int32_t *ex = experts + n * K;
        for (int64_t e = 0; e < E; e++) dp[e] = dprobs ? (double)dprobs[e] : 0.0;
        if (dweights) {
            const float *dw = dweights + n * K;
            double S = 0, dot = 0;
            for (int64_t k = 0; k < K; k++) {
                route_check_expert(ex[k], E, "kern_moe_route_bwd");
                S += (double)p[ex[k]];
            }
            if (norm)
                for (int64_t k = 0; k < K; k++) dot += (double)dw[k] * (double)p[ex[k]] / S;
            for (int64_t k = 0; k < K; k++)
                dp[ex[k]] += norm ? ((double)dw[k] - dot) / S : (double)dw[k];
        }
        double pdp = 0;
        for (int64_t e = 0; e < E; e++) pdp += (double)p[e] * dp[e];
        float *dl = dlogits + n * E;
        for (int64_t e = 0; e < E; e++) dl[e] += (float)((double)p[e] * (dp[e] - pdp));
    }
    free(dp);
}

void cpu_moe_route_stats(float *counts, float *psum, const float *probs, const int32_t *experts,
                         int64_t N, int64_t E, int64_t K)
{
    double *acc = calloc((size_t)(2 * E), sizeof *acc);
    if (!acc) BT_PANIC("kern_moe_route_stats: out of memory for %lld experts", (long long)E);
    for (int64_t n = 0; n < N; n++) {
        for (int64_t k = 0; k < K; k++) {
            int32_t e = experts[n * K + k];
            route_check_expert(e, E, "kern_moe_route_stats");
            acc[e] += 1;
        }
        for (int64_t e = 0; e < E; e++) acc[E + e] += (double)probs[n * E + e];
    }
    for (int64_t e = 0; e < E; e++) {
        counts[e] += (float)acc[e];
        psum[e] += (float)acc[E + e];
    }
    free(acc);
}

/* ---- dispatch ------------------------------------------------------------------ */

void cpu_moe_permute_fwd(float *xp, int32_t *slot, int32_t *sizes, int32_t *routed,
                         const float *x, const int32_t *experts, int64_t N, int64_t C, int64_t K,
                         int64_t E, int64_t capacity, const int32_t *caps)
{
    /* off[e]: expert e's first row; fill[e]: its choices seen so far */
    int64_t *off = calloc((size_t)(2 * E), sizeof *off), *fill = off + E;
    if (!off) BT_PANIC("kern_moe_permute_fwd: out of memory for %lld experts", (long long)E);
    for (int64_t e = 0; e < E; e++) routed[e] = 0;
    for (int64_t i = 0; i < N * K; i++) {
        route_check_expert(experts[i], E, "kern_moe_permute_fwd");
        routed[experts[i]]++;
    }
    int64_t total = 0;
    for (int64_t e = 0; e < E; e++) {
        int64_t cap = caps ? caps[e] : capacity;
        if (caps && cap < 0) BT_PANIC("kern_moe_permute_fwd: caps[%lld] = %lld < 0", (long long)e, (long long)cap);
        sizes[e] = cap >= 0 && routed[e] > cap ? (int32_t)cap : routed[e];
        off[e] = total;
        total += sizes[e];
    }
    for (int64_t i = 0; i < N * K; i++) {
        int32_t e = experts[i];
        int64_t j = fill[e]++;
        if (j >= sizes[e]) {
            slot[i] = -1;
            continue;
        }
        slot[i] = (int32_t)(off[e] + j);
        memcpy(xp + (off[e] + j) * C, x + (i / K) * C, (size_t)C * sizeof *xp);
    }
    if (total < N * K) memset(xp + total * C, 0, (size_t)((N * K - total) * C) * sizeof *xp);
    free(off);
}

void cpu_moe_permute_bwd(float *dx, const float *dxp, const int32_t *slot, int64_t N, int64_t C,
                         int64_t K)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            int32_t r = slot[n * K + k];
            if (r < 0) continue;
            const float *g = dxp + (int64_t)r * C;
            for (int64_t c = 0; c < C; c++) dx[n * C + c] += g[c];
        }
}

/* ---- combine -------------------------------------------------------------------- */

void cpu_moe_combine_fwd(float *y, const float *yp, const int32_t *slot, const float *weights,
                         int64_t N, int64_t C, int64_t K)
{
    memset(y, 0, (size_t)(N * C) * sizeof *y);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            int32_t r = slot[n * K + k];
            if (r < 0) continue;
            float w = weights[n * K + k];
            const float *src = yp + (int64_t)r * C;
            for (int64_t c = 0; c < C; c++) y[n * C + c] += w * src[c];
        }
}

void cpu_moe_combine_bwd(float *dyp, float *dweights, const float *dy, const float *yp,
                         const int32_t *slot, const float *weights, int64_t N, int64_t C,
                         int64_t K)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            int32_t r = slot[n * K + k];
            if (r < 0) continue;
            const float *g = dy + n * C;
            if (dyp) {
                float w = weights[n * K + k];
                float *d = dyp + (int64_t)r * C;
                for (int64_t c = 0; c < C; c++) d[c] += w * g[c];
            }
            if (dweights) {
                const float *v = yp + (int64_t)r * C;
                double dot = 0;
                for (int64_t c = 0; c < C; c++) dot += (double)g[c] * (double)v[c];
                dweights[n * K + k] += (float)dot;
            }
        }
}

/* sigmoid as torch computes it, 1 / (1 + exp(-g)) (here in double, rounded once) */
static double sigmoid(float g) { return 1.0 / (1.0 + exp(-(double)g)); }

void cpu_sigmoid_gate_fwd(float *out, const float *gate, const float *x, int64_t N, int64_t C)
{
    for (int64_t n = 0; n < N; n++) {
        float sg = (float)sigmoid(gate[n]);
        for (int64_t c = 0; c < C; c++) out[n * C + c] = sg * x[n * C + c];
    }
}

void cpu_sigmoid_gate_bwd(float *dx, float *dgate, const float *dout, const float *gate,
                          const float *x, int64_t N, int64_t C)
{
    for (int64_t n = 0; n < N; n++) {
        double sg = sigmoid(gate[n]);
        if (dx)
            for (int64_t c = 0; c < C; c++) dx[n * C + c] += (float)sg * dout[n * C + c];
        if (dgate) {
            double dot = 0;
            for (int64_t c = 0; c < C; c++) dot += (double)dout[n * C + c] * (double)x[n * C + c];
            dgate[n] += (float)(sg * (1.0 - sg) * dot);
        }
    }
}
