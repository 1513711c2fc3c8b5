/* What each layer of a model costs, for placing layers on pipeline stages
 * (launch/split.c, `baton graph`): per layer, and for the embedding and the
 * head, the parameter bytes (f32, one TP rank's share), the bytes a
 * training arena keeps for it per microbatch of B x T (its sublayers' saved
 * regions, residual inputs, norm outputs and rstd, as the arena lays them
 * out), and its training FLOPs per token (model/flops.h, the kinds' own
 * counts: Mamba2 in_proj/out_proj and conv/scan, attention's projections and
 * causal scores, the MLP's matrices, a MoE layer's router and active
 * experts).
 *
 * Each figure is the difference of two exact estimates (model_mem_estimate
 * of a stage with the layer and of the same stage without it), so it uses
 * the kinds' own layout, saved_bytes and scratch_bytes. An arena shares one
 * scratch region among its sublayers, the largest one's, and one state per
 * kind among that kind's sublayers (attention's RoPE tables): acts leaves
 * both out and scratch and shared give them, so that a stage's arena is
 * base.acts + the sum of its layers' acts (+ the ends') + the largest of
 * their scratch + each kind's shared state once. */
#ifndef BT_MODEL_COST_H
#define BT_MODEL_COST_H

#include <stdint.h>

#include "model/model.h"

typedef struct {
    double params; /* bytes of parameters (f32) on one rank of par */
    double acts;   /* bytes of one training arena of B x T spent on it, its scratch aside */
    double scratch; /* the scratch region it needs (shared with the stage's other layers) */
    const model_kind_t *kind[2]; /* kinds of its with state shared per arena (NULL: none) */
    double shared[2];            /* their shared state's bytes */
    double flops;  /* training FLOPs per token, 6 x (matmul weights + activation products) */
} model_cost_t;

/* Layer `layer` of cfg on the place par gives (NULL: no TP/EP). */
void model_layer_cost(const model_config_t *cfg, int layer, const model_parallel_t *par,
                      int64_t B, int64_t T, model_cost_t *out);
/* The first stage's embedding, the last stage's final norm, head and loss,
 * and what any stage's arena holds whatever its layers (token ids,
 * positions, the residual input and its gradient). */
void model_ends_cost(const model_config_t *cfg, const model_parallel_t *par, int64_t B, int64_t T,
                     model_cost_t *embed, model_cost_t *head, model_cost_t *base);

#endif
