/* Per-layer costs for pipeline splits (model/cost.h). */
#include "model/cost.h"

#include "model/flops.h"
#include "model/kind.h"

static model_mem_t stage_mem(const model_config_t *cfg, int first, int last, bool embed,
                             bool head, const model_parallel_t *par, int64_t B, int64_t T)
{
    model_stage_t st = {.first_layer = first, .last_layer = last, .has_embedding = embed,
                        .has_head = head};
    model_parallel_t none = {.tp_rank = 0, .tp_size = 1};
    model_mem_t m;
    model_mem_estimate_par(cfg, &st, par ? par : &none, B, T, &m);
    return m;
}

/* An arena's bytes without its scratch region and shared states, which a
 * stage holds once whatever its layers. */
static double acts_own(const model_mem_t *m)
{
    double a = m->acts - m->acts_scratch;
    for (int i = 0; i < m->n_shared; i++) a -= m->acts_shared[i];
    return a;
}

/* Layer l's share: the stage of l and a neighbour less the neighbour's
 * alone (a stage of no layers has regions of zero rows, which an arena
 * still aligns to 64 bytes: it is not the base). */
void model_layer_cost(const model_config_t *cfg, int layer, const model_parallel_t *par,
                      int64_t B, int64_t T, model_cost_t *out)
{
    int L = (int)cfg->num_layers, j = layer + 1 < L ? layer + 1 : layer - 1;
    int a = j < layer ? j : layer;
    model_mem_t with = stage_mem(cfg, a, a + 2, false, false, par, B, T);
    model_mem_t one = stage_mem(cfg, layer, layer + 1, false, false, par, B, T);
    model_mem_t without = j >= 0 ? stage_mem(cfg, j, j + 1, false, false, par, B, T)
                                 : stage_mem(cfg, layer, layer, false, false, par, B, T);
    if (j < 0) with = one;
    model_flops_t f = {0};
    const model_kind_t *k[2] = {model_mixer_kind(cfg->blocks[layer].mixer),
                                model_ffn_kind(cfg->blocks[layer].ffn)};
    for (int i = 0; i < 2; i++)
        if (k[i]) k[i]->flops(cfg, T, &f);
    *out = (model_cost_t){.params = with.params - without.params, .scratch = one.acts_scratch,
                          .acts = acts_own(&with) - acts_own(&without),
                          .flops = 6.0 * (f.matmul_params + f.attn_fma)};
    for (int i = 0; i < one.n_shared && i < 2; i++) {
        out->kind[i] = one.shared_kind[i];
        out->shared[i] = one.acts_shared[i];
    }
}

void model_ends_cost(const model_config_t *cfg, const model_parallel_t *par, int64_t B, int64_t T,
                     model_cost_t *embed, model_cost_t *head, model_cost_t *base)
{
    int L = (int)cfg->num_layers;
    model_mem_t first = stage_mem(cfg, 0, 1, false, false, par, B, T);
    model_mem_t e = stage_mem(cfg, 0, 1, true, false, par, B, T);
    model_mem_t last = stage_mem(cfg, L - 1, L, false, false, par, B, T);
    model_mem_t h = stage_mem(cfg, L - 1, L, false, true, par, B, T);
    *embed = (model_cost_t){.params = e.params - first.params, .acts = e.acts - first.acts};
    /* the head's product with [vocab, hidden] (model/flops.h) */
    *head = (model_cost_t){.params = h.params - last.params, .acts = h.acts - last.acts,
                           .flops = 6.0 * (double)cfg->vocab_size * (double)cfg->hidden_size};
    model_cost_t l0;
    model_layer_cost(cfg, 0, par, B, T, &l0);
    *base = (model_cost_t){.params = first.params - l0.params, .acts = acts_own(&first) - l0.acts};
}
