/* Training FLOPs per token (model/flops.h; docs/PERFORMANCE.md). */
#include "model/flops.h"

#include <math.h>

#include "model/kind.h"

void model_flops_count(const model_config_t *c, int64_t T, model_flops_t *out)
{
    model_flops_t f = {0};
    /* the head: the logits are a product with a [vocab, hidden] matrix,
     * tied or not */
    f.matmul_params = (double)c->vocab_size * (double)c->hidden_size;
    for (int64_t l = 0; l < c->num_layers; l++) {
        const model_kind_t *k[2] = {model_mixer_kind(c->blocks[l].mixer),
                                    model_ffn_kind(c->blocks[l].ffn)};
        for (int i = 0; i < 2; i++)
            if (k[i]) k[i]->flops(c, T, &f);
    }
    f.flops = 6.0 * (f.matmul_params + f.attn_fma);
    *out = f;
}

double model_flops_per_token(const model_config_t *c, int64_t T)
{
    model_flops_t f;
    model_flops_count(c, T, &f);
    return f.flops;
}

double model_mfu(double flops_per_token, double tokens_per_s, double peak_flops_per_s)
{
    if (!(peak_flops_per_s > 0)) return NAN;
    return flops_per_token * tokens_per_s / peak_flops_per_s;
}
