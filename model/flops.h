/* Training FLOPs per token, the numerator of model FLOPs utilisation (MFU),
 * counted from the model config alone (docs/PERFORMANCE.md derives it):
 *
 *     flops = 6 * (matmul_params + attn_fma)
 *
 * matmul_params: the weights that multiply every token, one multiply-add per
 * weight per token in the forward pass: each block kind's matrices (its
 * active parameters) and the head's [vocab, hidden] matrix, counted whether
 * or not it is tied to the embedding (the product is computed either way).
 * The embedding lookup is a gather, not a product, and biases and norm
 * weights are additions: none of them count.
 * attn_fma: forward multiply-adds per token between activations, attention's
 * q.k scores and p.v values under the causal mask: query t meets t + 1 keys,
 * T/2 on average, so Hq * D * T per attention layer (half of the full
 * square's 2 * Hq * D * T).
 * 6 = 2 FLOPs per multiply-add times 3: the backward computes two products
 * for every one of the forward (the input's gradient and the weight's, or
 * dq/dk and dp/dv). What an implementation recomputes (a flash backward's
 * scores, a recomputed layer) is not counted: MFU measures the model's
 * arithmetic, not the hardware's. */
#ifndef BT_MODEL_FLOPS_H
#define BT_MODEL_FLOPS_H

#include <stdint.h>

#include "model/config.h"

typedef struct {
    double matmul_params; /* weights multiplying each token, head included */
    double attn_fma;      /* forward activation-activation multiply-adds per token */
    double flops;         /* training FLOPs per token: 6 * (matmul_params + attn_fma) */
} model_flops_t;

/* The counts of config c at sequence length T (every layer's kinds add
 * theirs through model_kind_t.flops; model/kind.h). */
void   model_flops_count(const model_config_t *c, int64_t T, model_flops_t *out);
/* model_flops_count(c, T).flops */
double model_flops_per_token(const model_config_t *c, int64_t T);
/* flops_per_token * tokens_per_s / peak_flops_per_s (a fraction, not a
 * percentage); NaN when the peak is not positive. */
double model_mfu(double flops_per_token, double tokens_per_s, double peak_flops_per_s);

#endif
