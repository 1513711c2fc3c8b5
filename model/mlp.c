/* The dense MLP (MODEL_FFN_DENSE): Llama, Mistral, Qwen2 (gated SiLU), and
 * NemotronH (squared ReLU, no gate):
 *
 *   swiglu: y = (silu(ln Wg^T (+bg)) * (ln Wu^T (+bu))) Wd^T (+bd)
 *   relu2:  y = relu(ln Wu^T (+bu))^2 Wd^T (+bd)
 *
 * TP (Megatron): gate/up (and their biases) column-parallel, down
 * row-parallel with its bias replicated and added once after the
 * all-reduce; the input gradient is all-reduced here. */
#include "model/kind.h"

#include "base/log.h"
#include "model/arch.h"

#include <stdio.h>

enum { M_GATE = 0, M_UP, M_DOWN, M_GB, M_UB, M_DB, M_SLOTS };
_Static_assert(M_SLOTS <= MODEL_SUB_SLOTS, "mlp slots fit a sublayer");

static int64_t mlp_ffn(const model_t *m) { return m->cfg.mlp.intermediate_size / m->par.tp_size; }

static bt_status_t mlp_validate(const model_config_t *c, int tp)
{
    if (c->mlp.intermediate_size <= 0 || c->mlp.intermediate_size > MODEL_MAX_FFN) {
        log_error("model config: intermediate_size=%lld must be in [1, %d]",
                  (long long)c->mlp.intermediate_size, MODEL_MAX_FFN);
        return BT_ERR_INVALID;
    }
    if ((unsigned)c->mlp.act >= MODEL_MLP_ACT_COUNT) {
        log_error("model config: unknown MLP activation %d", (int)c->mlp.act);
        return BT_ERR_INVALID;
    }
    if (tp > 1 && c->mlp.intermediate_size % tp) {
        log_error("model: tp_size=%d does not divide intermediate_size=%lld", tp,
                  (long long)c->mlp.intermediate_size);
        return BT_ERR_INVALID;
    }
    return BT_OK;
}

static void mlp_layout(model_layout_t *lb, const model_config_t *c, const char *prefix,
                       model_sub_t *sub)
{
    int64_t C = c->hidden_size, F = c->mlp.intermediate_size;
    bool b = c->mlp.bias;
    char n[MODEL_NAME_MAX];
#define ADD(slot, suffix, ndim, d0, d1, dim)                                                       \
    do {                                                                                           \
        snprintf(n, sizeof n, "%s.%s", prefix, suffix);                                            \
        sub->ix[slot] = model_layout_add(lb, n, ndim, d0, d1, dim, 1);                             \
    } while (0)
    /* gate and up of their own, or row parts 0, 1 of the architecture's
     * fused tensor (Phi-3's gate_up_proj: model.h MODEL_PART_MARK) */
    const char *fused = c->mlp.act == MODEL_MLP_SWIGLU ? model_arch_info(c->arch)->fused_gate_up
                                                       : NULL;
    char w[2][64], bn[2][64];
    for (int i = 0; i < 2; i++) {
        const char *own = i ? "up_proj" : "gate_proj";
        model_layout_proj_name(w[i], sizeof w[i], fused, i, own, "weight");
        model_layout_proj_name(bn[i], sizeof bn[i], fused, i, own, "bias");
    }
    if (c->mlp.act == MODEL_MLP_SWIGLU) {
        ADD(M_GATE, w[0], 2, F, C, 0);
        if (b) ADD(M_GB, bn[0], 1, F, 0, 0);
    }
    ADD(M_UP, w[1], 2, F, C, 0);
    if (b) ADD(M_UB, bn[1], 1, F, 0, 0);
    ADD(M_DOWN, "down_proj.weight", 2, C, F, 1);
    if (b) ADD(M_DB, "down_proj.bias", 1, C, 0, -1);
#undef ADD
}

/* saved: gate, up, h [N, F]; scratch: dh, dgate, dup [N, F]. relu2 has no
 * gate: no gate region and no dgate one (v[1] and d[1] there are the only
 * views of their first region, v[0] and d[0] alias nothing they use). */
static int mlp_regions(const model_t *m) { return m->cfg.mlp.act == MODEL_MLP_RELU2 ? 2 : 3; }

static double mlp_three(const model_t *m, int64_t B, int64_t T)
{
    return mlp_regions(m) * model_align_d((double)B * (double)T * (double)mlp_ffn(m) *
                                          (double)dtype_size(m->place.act_dtype));
}

static void mlp_views(const model_run_t *r, void *base, tensor_t v[3])
{
    int64_t F = mlp_ffn(r->m);
    size_t one = model_align((size_t)(r->N * F) * dtype_size(r->m->place.act_dtype));
    int skip = 3 - mlp_regions(r->m); /* relu2: [0] and [1] share the first region */
    for (int i = 0; i < 3; i++) {
        int at = i - skip < 0 ? 0 : i - skip;
        v[i] = model_act_view(r->m, base, (size_t)at * one, 2, (int64_t[]){r->N, F});
    }
}

static bt_status_t mlp_forward(model_run_t *r, const model_sub_t *sub, void *saved,
                               const tensor_t *ln, tensor_t *y)
{
    model_t *m = r->m;
    kern_stream_t *s = r->s;
    tensor_t v[3]; /* gate, up, h */
    mlp_views(r, saved, v);
    kern_linear_fwd(s, &v[1], ln, model_sub_param(m, sub, M_UP), model_sub_param(m, sub, M_UB));
    if (m->cfg.mlp.act == MODEL_MLP_RELU2) {
        kern_relu2_fwd(s, &v[2], &v[1]);
    } else {
        kern_linear_fwd(s, &v[0], ln, model_sub_param(m, sub, M_GATE),
                        model_sub_param(m, sub, M_GB));
        kern_swiglu_fwd(s, &v[2], &v[0], &v[1]);
    }
    return model_row_parallel_fwd(r, y, &v[2], model_sub_param(m, sub, M_DOWN),
                                  model_sub_param(m, sub, M_DB), "down_proj output", sub->layer);
}

static bt_status_t mlp_backward(model_run_t *r, const model_sub_t *sub, void *saved,
                                const tensor_t *ln, const tensor_t *dy, tensor_t *dln)
{
    model_t *m = r->m;
    kern_stream_t *s = r->s;
    tensor_t v[3], d[3]; /* gate, up, h; dh, dgate, dup */
    mlp_views(r, saved, v);
    mlp_views(r, r->scratch, d);
    /* dh, dgate, dup and dln are written by their first producer (_set:
     * on the CPU the bits of zero + accumulate) */
    kern_linear_bwd_set(s, &d[0], model_sub_grad(m, sub, M_DOWN), model_sub_grad(m, sub, M_DB), dy,
                        &v[2], model_sub_param(m, sub, M_DOWN));
    if (m->cfg.mlp.act == MODEL_MLP_RELU2) {
        kern_relu2_bwd_set(s, &d[2], &d[0], &v[1]);
        kern_linear_bwd_set(s, dln, model_sub_grad(m, sub, M_UP), model_sub_grad(m, sub, M_UB),
                            &d[2], ln, model_sub_param(m, sub, M_UP));
    } else {
        kern_swiglu_bwd_set(s, &d[1], &d[2], &d[0], &v[0], &v[1]);
        kern_linear_bwd_set(s, dln, model_sub_grad(m, sub, M_GATE), model_sub_grad(m, sub, M_GB),
                            &d[1], ln, model_sub_param(m, sub, M_GATE));
        kern_linear_bwd(s, dln, model_sub_grad(m, sub, M_UP), model_sub_grad(m, sub, M_UB), &d[2],
                        ln, model_sub_param(m, sub, M_UP));
    }
    return model_tp_input_sum(r, dln, "the MLP input gradient", sub->layer);
}

/* gate (swiglu only), up, down: C x F each */
static void mlp_flops(const model_config_t *c, int64_t T, model_flops_t *f)
{
    (void)T;
    double mats = c->mlp.act == MODEL_MLP_RELU2 ? 2.0 : 3.0;
    f->matmul_params += mats * (double)c->hidden_size * (double)c->mlp.intermediate_size;
}

static const kern_op_t mlp_ops[] = {KERN_OP_LINEAR, KERN_OP_SWIGLU, KERN_OP_RELU2,
                                    KERN_OP_MATMUL, KERN_OP_ELEMENTWISE};

const model_kind_t model_kind_mlp = {
    .name = "mlp",
    .validate = mlp_validate,
    .layout = mlp_layout,
    .saved_bytes = mlp_three,
    .scratch_bytes = mlp_three,
    .shared_bytes = NULL,
    .shared_init = NULL,
    .forward = mlp_forward,
    .backward = mlp_backward,
    .flops = mlp_flops,
    .ops = mlp_ops,
    .n_ops = (int)(sizeof mlp_ops / sizeof mlp_ops[0]),
};
