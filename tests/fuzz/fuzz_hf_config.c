/* libFuzzer target: Hugging Face config.json parsing (ckpt_hf_config_parse)
 * on arbitrary bytes, then what the launcher derives from an accepted
 * config without allocating the model: the parameter layout (whole model
 * and a two-stage, two-way tensor-parallel share when the heads allow it),
 * the parameter count and the memory estimate.
 *
 * Properties: a refusal is BT_ERR_INVALID or BT_ERR_UNSUPPORTED; an
 * accepted config passes model_config_validate, has a layout whose tensors
 * all have positive sizes, and an estimate that is positive and finite
 * (the bounds of model_config_validate keep every shape product inside
 * int64: UBSan reports any overflow).
 *
 *   make fuzz && build/fuzz/fuzz_hf_config -max_len=4096 -close_fd_mask=2 \
 *       CORPUS tests/fuzz/corpus_hf_config
 * (make fuzz-run runs the recorded campaign; docs/MODELS.md) */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/log.h"
#include "ckpt/hf.h"
#include "model/kind.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_layout_check(const model_config_t *c, const model_stage_t *st, int tp_rank,
                              int tp_size)
{
    model_parallel_t par = {.tp_rank = tp_rank, .tp_size = tp_size};
    int n = model_layout_tp(c, st, &par, NULL);
    if (n <= 0) BT_PANIC("layout of %d tensors", n);
    model_param_t *ps = calloc((size_t)n, sizeof *ps);
    if (!ps) return;
    model_layout_tp(c, st, &par, ps);
    for (int i = 0; i < n; i++)
        if (tensor_numel(&ps[i].t) <= 0) BT_PANIC("tensor %s has %lld elements", ps[i].name,
                                                  (long long)tensor_numel(&ps[i].t));
    free(ps);
    model_mem_t mm;
    model_mem_estimate(c, st, tp_rank, tp_size, 1, 8, &mm);
    if (!(mm.params > 0) || !isfinite(mm.params) || !(mm.acts > 0) || !isfinite(mm.acts) ||
        mm.vocab_params > mm.params)
        BT_PANIC("estimate params %g acts %g vocab %g", mm.params, mm.acts, mm.vocab_params);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool quiet;
    if (!quiet) {
        log_set_level(LOG_ERROR); /* warnings about ignored fields are expected */
        quiet = true;
    }
    model_config_t c;
    bt_status_t st = ckpt_hf_config_parse((const char *)data, size, "fuzz/config.json", &c);
    if (st != BT_OK) {
        if (st != BT_ERR_INVALID && st != BT_ERR_UNSUPPORTED) BT_PANIC("status %d", (int)st);
        return 0;
    }
    if (model_config_validate(&c) != BT_OK) BT_PANIC("an accepted config does not validate");
    /* layouts with tens of thousands of layers cost milliseconds each: the
     * per-layer code is the same, so keep the inputs fast */
    if (c.num_layers > 64) return 0;
    fuzz_layout_check(&c, NULL, 0, 1);
    if (model_num_params(&c) <= 0) BT_PANIC("no parameters");
    /* the two-way TP share only where every block kind accepts tp 2 (a
     * NemotronH config of one Mamba2 group, n_groups=1, is refused at tp 2:
     * its B and C parts would be empty on one rank) */
    bool tp_ok = c.num_layers >= 2 && model_config_kinds_validate(&c, 2) == BT_OK;
    if (tp_ok && c.attn.num_heads % 2 == 0 && c.attn.num_kv_heads % 2 == 0 &&
        c.mlp.intermediate_size % 2 == 0 && c.vocab_size >= 2) {
        int half = (int)(c.num_layers / 2);
        model_stage_t first = {.first_layer = 0, .last_layer = half, .has_embedding = true};
        model_stage_t last = {.first_layer = half, .last_layer = (int)c.num_layers, .has_head = true};
        for (int r = 0; r < 2; r++) {
            fuzz_layout_check(&c, &first, r, 2);
            fuzz_layout_check(&c, &last, r, 2);
        }
    }
    return 0;
}
