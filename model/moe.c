/* Routed experts (MODEL_FFN_MOE): Mixtral, Qwen2-MoE.
 *
 *   logits = ln Wr^T                               [N, E]    the router
 *   probs, experts, weights = route(logits)                  softmax, top-K (renormalised)
 *   xp = permute(ln, experts)                      [N*K, C]  each token once per chosen
 *                                                            expert, grouped by expert
 *   yp = grouped(silu(grouped(xp, Wg)) * grouped(xp, Wu), Wd)  one product per expert
 *   y  = combine(yp, weights)                      [N, C]    the weighted sum back
 *      (+ sigmoid(ln Wsg^T) * mlp_shared(ln)                 Qwen2-MoE's shared expert)
 *
 * The steps are separate kernel ops with their buffers in the saved region,
 * so that expert parallelism can put its all-to-all between permute and the
 * experts and between the experts and combine: xp's rows are expert-major,
 * so a rank that owns a contiguous range of experts owns a contiguous range
 * of rows (and the counts per expert, `sizes`, are what it exchanges first).
 *
 * Parameters: the router [E, C], the experts' projections stacked [E, F, C]
 * (gate, up) and [E, C, F] (down) under the per-expert HF names with the
 * expert index as MODEL_STACK_MARK (model/model.h), the shared expert's
 * three projections and its gate [1, C].
 *
 * Dropless by default: every choice reaches its expert. With
 * capacity_factor > 0 an expert keeps at most ceil(factor * N * K / E) of
 * one forward's choices (the first in token order; N the microbatch's
 * tokens, every CP rank's); the dropped ones add nothing (the token keeps
 * its other experts and its residual) and are counted in m->moe_dropped,
 * each rank its own. A rank that dispatches only part of the microbatch
 * (TP, CP) gets each expert's share of that budget in token order first
 * (moe_caps).
 *
 * The router's load-balancing loss (aux_loss_coef > 0) is transformers'
 * load_balancing_loss_func over the router logits of every sparse layer of
 * the forward, concatenated: with R = sparse layers x N rows, c_e the rows
 * whose top-K holds expert e and P_e the sum of its probabilities over all
 * of them, aux = E * sum_e (c_e / R) (P_e / R). The counts carry no gradient
 * (a top-K mask), so d aux / d probs[row, e] = E c_e / R^2 on every row of
 * every sparse layer. Each stage keeps its layers' sums (c_e, P_e) apart,
 * sums each over the CP group (a CP rank routes only its chunks of every
 * sequence) and adds them, in layer order, to what the previous stage sent
 * (model_moe_aux_end; under TP every rank routes every row, so nothing is
 * summed there); the stage with the head forms the loss from the model's
 * sums and the gradient vector, which goes back with the activation
 * gradient and which every stage's routers add (model_moe_aux_grad, then
 * kern_moe_route_bwd's dprobs). One path for every layout: with pp = 1 and
 * cp = 1 there is nothing to receive or sum.
 *
 * Expert parallelism (model.h model_parallel_t, docs/PARALLEL.md): this
 * rank holds experts [ep_rank * El, (ep_rank + 1) * El), El = E / ep. After
 * the permute its rows are grouped by global expert, so the rows for EP
 * rank j are one contiguous run; the forward sends the per-expert counts
 * first (an all-to-all of El counts to each rank), then the rows
 * (all-to-all(v)), runs its experts over what arrived (one grouped product
 * per source rank's block, whose sizes are that rank's counts) and sends
 * the results back the same way; the backward sends the output gradients
 * there and the input gradients back. A rank may receive no rows at all:
 * it still takes part in every exchange, with zero counts, and computes
 * nothing. Under TP the router runs on every row on every TP rank (its
 * weights and their gradients stay replicated), each TP rank dispatches
 * only its near-even share of the rows (so the EP group's members all hold
 * different tokens), and the combined rows, the input gradients of the
 * routed path and the routing-weight gradients are all-gathered over the
 * TP group; the shared expert runs replicated on every row. */
#include "model/kind.h"

#include "base/clock.h"
#include "base/log.h"
#include "model/arch.h"
#include "model/model_int.h"
#include "model/require.h"

#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { X_ROUTER = 0, X_GATE, X_UP, X_DOWN, X_SGATE, X_SUP, X_SDOWN, X_SHGATE, X_SLOTS };
_Static_assert(X_SLOTS <= MODEL_SUB_SLOTS, "moe slots fit a sublayer");

/* ---- config ------------------------------------------------------------------------ */

/* The config.json field of each sub-config value, by architecture. */
static const char *moe_field(const model_config_t *c, int which)
{
    bool mixtral = c->arch == MODEL_ARCH_MIXTRAL, deepseek = c->arch == MODEL_ARCH_DEEPSEEK_V2;
    switch (which) {
    case 0: return mixtral ? "num_local_experts" : deepseek ? "n_routed_experts" : "num_experts";
    case 1: return mixtral ? "intermediate_size" : "moe_intermediate_size";
    default: return "?";
    }
}

static bt_status_t moe_validate(const model_config_t *c, int tp)
{
    const model_moe_config_t *e = &c->moe;
    MODEL_REQUIRE(e->n_experts >= 1 && e->n_experts <= MODEL_MAX_EXPERTS,
                  "model config: %s=%lld must be in [1, %d]", moe_field(c, 0),
                  (long long)e->n_experts, MODEL_MAX_EXPERTS);
    MODEL_REQUIRE(e->top_k >= 1 && e->top_k <= e->n_experts,
                  "model config: num_experts_per_tok=%lld must be in [1, %s=%lld]",
                  (long long)e->top_k, moe_field(c, 0), (long long)e->n_experts);
    MODEL_REQUIRE(e->expert_ffn >= 1 && e->expert_ffn <= MODEL_MAX_FFN,
                  "model config: %s=%lld (the experts' width) must be in [1, %d]", moe_field(c, 1),
                  (long long)e->expert_ffn, MODEL_MAX_FFN);
    /* every expert's matrices together: [E * F, C] stays far inside int64
     * (2^44 elements) as the dense bounds keep [F, C] */
    MODEL_REQUIRE((double)e->n_experts * (double)e->expert_ffn <= (double)MODEL_MAX_FFN * 4,
                  "model config: %s=%lld x %s=%lld experts' rows exceed %d", moe_field(c, 0),
                  (long long)e->n_experts, moe_field(c, 1), (long long)e->expert_ffn,
                  MODEL_MAX_FFN * 4);
    MODEL_REQUIRE(e->shared_ffn >= 0 && e->shared_ffn <= MODEL_MAX_FFN,
                  "model config: %s=%lld must be in [0, %d]",
                  c->arch == MODEL_ARCH_DEEPSEEK_V2 ? "n_shared_experts x moe_intermediate_size"
                                                     : "shared_expert_intermediate_size",
                  (long long)e->shared_ffn, MODEL_MAX_FFN);
    MODEL_REQUIRE(isfinite(e->routed_scale) && e->routed_scale >= 0,
                  "model config: routed_scaling_factor=%g must be a finite number > 0",
                  e->routed_scale);
    if (e->router == MODEL_ROUTER_SOFTMAX_GROUP_TOPK) {
        MODEL_REQUIRE(e->n_group >= 1 && e->n_experts % e->n_group == 0,
                      "model config: n_group=%lld must divide %s=%lld (topk_method "
                      "group_limited_greedy)", (long long)e->n_group, moe_field(c, 0),
                      (long long)e->n_experts);
        MODEL_REQUIRE(e->topk_group >= 1 && e->topk_group <= e->n_group,
                      "model config: topk_group=%lld must be in [1, n_group=%lld]",
                      (long long)e->topk_group, (long long)e->n_group);
        MODEL_REQUIRE(e->top_k <= e->topk_group * (e->n_experts / e->n_group),
                      "model config: num_experts_per_tok=%lld exceeds the %lld experts of "
                      "topk_group=%lld groups",
                      (long long)e->top_k,
                      (long long)(e->topk_group * (e->n_experts / e->n_group)),
                      (long long)e->topk_group);
        MODEL_REQUIRE(e->bias_rate == 0,
                      "model config: router_bias_update_rate=%g with topk_method "
                      "group_limited_greedy is not supported (the selection bias applies to greedy "
                      "top-k only)", e->bias_rate);
    }
    MODEL_REQUIRE((unsigned)e->router < MODEL_ROUTER_COUNT,
                  "model config: unknown router type %d (known: softmax top-k)", (int)e->router);
    MODEL_REQUIRE(isfinite(e->aux_loss_coef) && e->aux_loss_coef >= 0,
                  "model config: router_aux_loss_coef=%g must be a finite number >= 0",
                  e->aux_loss_coef);
    MODEL_REQUIRE(isfinite(e->bias_rate) && e->bias_rate >= 0,
                  "model config: router_bias_update_rate=%g must be a finite number >= 0 (0: off)",
                  e->bias_rate);
    MODEL_REQUIRE(isfinite(e->capacity_factor) && e->capacity_factor >= 0,
                  "model config: capacity_factor=%g must be a finite number >= 0 (0: dropless)",
                  e->capacity_factor);
    return BT_OK;
}

static void moe_layout(model_layout_t *lb, const model_config_t *c, const char *prefix,
                       model_sub_t *sub)
{
    const model_arch_info_t *a = model_arch_info(c->arch);
    const model_moe_config_t *e = &c->moe;
    int64_t C = c->hidden_size, E = e->n_experts, F = e->expert_ffn, Fs = e->shared_ffn;
    if (!a->moe_router) BT_PANIC("moe_layout: %s has no routed experts", a->hf_class);
    char n[MODEL_NAME_MAX];
#define ADD(slot, ndim, shape, ...)                                                                \
    do {                                                                                           \
        snprintf(n, sizeof n, __VA_ARGS__);                                                        \
        sub->ix[slot] = model_layout_add_nd(lb, n, ndim, shape, -1, 1);                            \
    } while (0)
    ADD(X_ROUTER, 2, ((int64_t[]){E, C}), "%s.%s.weight", prefix, a->moe_router);
#define ADD_EXPERTS(slot, shape, proj)                                                             \
    do {                                                                                           \
        snprintf(n, sizeof n, "%s.experts.%c.%s.weight", prefix, MODEL_STACK_MARK, proj);         \
        sub->ix[slot] = model_layout_add_experts(lb, n, 3, shape);                                 \
    } while (0)
    ADD_EXPERTS(X_GATE, ((int64_t[]){E, F, C}), a->expert_proj[0]);
    ADD_EXPERTS(X_UP, ((int64_t[]){E, F, C}), a->expert_proj[1]);
    ADD_EXPERTS(X_DOWN, ((int64_t[]){E, C, F}), a->expert_proj[2]);
#undef ADD_EXPERTS
    if (Fs > 0) {
        if (!a->shared_expert) BT_PANIC("moe_layout: %s has no shared expert", a->hf_class);
        ADD(X_SGATE, 2, ((int64_t[]){Fs, C}), "%s.%s.gate_proj.weight", prefix, a->shared_expert);
        ADD(X_SUP, 2, ((int64_t[]){Fs, C}), "%s.%s.up_proj.weight", prefix, a->shared_expert);
        ADD(X_SDOWN, 2, ((int64_t[]){C, Fs}), "%s.%s.down_proj.weight", prefix, a->shared_expert);
        if (a->shared_expert_gate)
            ADD(X_SHGATE, 2, ((int64_t[]){1, C}), "%s.%s.weight", prefix, a->shared_expert_gate);
    }
#undef ADD
}

/* ---- regions ------------------------------------------------------------------------- */

/* saved: what the backward reads (R_XP: the dispatched rows without EP;
 * R_RSIZES, R_XR: with EP, the counts and rows that arrived) */
enum { R_PROBS = 0, R_WEIGHTS, R_EXPERTS, R_SLOT, R_SIZES, R_ROUTED, R_RSIZES, R_XP, R_XR, R_G,
       R_U, R_H, R_YP, R_SG, R_SU, R_SH, R_SO, R_SGL, R_COUNT };
/* scratch: the forward's logits and shared-expert product, the backward's
 * gradients (S_XP, S_YR, S_DYR, S_DXR: the EP exchanges' other ends;
 * S_DEXP: under TP, the routed path's input gradient before its gather) */
enum { S_LOGITS = 0, S_TMP, S_XP, S_YR, S_DYP, S_DYR, S_DH, S_DG, S_DU, S_DXR, S_DXP, S_DW,
       S_DLOGITS, S_DEXP, S_DSO, S_DSH, S_DSG, S_DSU, S_DSGL, S_CAPS, S_COUNT };

typedef struct {
    dtype_t dt;         /* DT_COUNT: the activation dtype */
    double  rows, cols; /* doubles: an absurd config's sizes never wrap */
} region_t;

/* With expert parallelism, a forward dispatches this rank's rows in
 * MOE_CHUNKS chunks of tokens, each exchanged by all-to-alls of its own
 * (counts, rows out, results back), started without waiting: the rows of
 * one chunk travel (on the collective's thread) while the experts compute
 * the other's, and the first chunk's results travel back while the second
 * computes; the backward does the same with the gradients. The number is
 * fixed, the same on every rank (every EP member issues the same
 * collectives in the same order, zero-row chunks included) and does not
 * depend on timing, so the results are the same bits on every run. One
 * chunk without EP, and with a capacity factor (whose first-choices rule
 * spans every row of the forward). */
#define MOE_CHUNKS 2
static int moe_chunks(const model_t *m)
{
    return m->par.ep_size > 1 && m->cfg.moe.capacity_factor == 0 ? MOE_CHUNKS : 1;
}

/* For a microbatch of N rows in an arena of Ncap (>= N): with EP the rows
 * that may arrive are counted from Ncap, since another member's microbatch
 * may be larger than this one's (an evaluation pass pads with one-row
 * microbatches). */
static void moe_regions(const model_t *m, double N, double Ncap, region_t *saved, region_t *scratch)
{
    const model_moe_config_t *e = &m->cfg.moe;
    double C = (double)m->cfg.hidden_size, E = (double)e->n_experts, K = (double)e->top_k;
    double F = (double)e->expert_ffn, Fs = (double)e->shared_ffn;
    double Ns = Fs > 0 ? N : 0; /* the shared expert's rows: none without it */
    double tp = m->par.tp_size > 1 ? m->par.tp_size : 1, ep = m->par.ep_size > 1 ? m->par.ep_size : 1;
    double El = E / ep, Q = moe_chunks(m);
    /* this rank's rows (its TP share, rounded up) and their choices; with EP
     * the most rows that can arrive: every member's choices of this rank's
     * experts, at most min(K, El) per token */
    double n = ceil(N / tp), M = n * K;
    double X = ep > 1 ? ep * ceil(Ncap / tp) * (K < El ? K : El) : 0, Rx = ep > 1 ? X : M;
    double Np = tp > 1 ? N : 0;
    const dtype_t A = DT_COUNT;
    if (saved) {
        saved[R_PROBS] = (region_t){DT_F32, N, E};
        saved[R_WEIGHTS] = (region_t){DT_F32, N, K};
        saved[R_EXPERTS] = (region_t){DT_I32, N, K};
        saved[R_SLOT] = (region_t){DT_I32, N, K};
        saved[R_SIZES] = (region_t){DT_I32, Q, E};
        saved[R_ROUTED] = (region_t){DT_I32, Q, E};
        saved[R_RSIZES] = (region_t){DT_I32, ep > 1 ? Q * ep : 0, El};
        saved[R_XP] = (region_t){A, ep > 1 ? 0 : M, C};
        saved[R_XR] = (region_t){A, X, C};
        saved[R_G] = (region_t){A, Rx, F};
        saved[R_U] = (region_t){A, Rx, F};
        saved[R_H] = (region_t){A, Rx, F};
        saved[R_YP] = (region_t){A, M, C};
        saved[R_SG] = (region_t){A, Ns, Fs};
        saved[R_SU] = (region_t){A, Ns, Fs};
        saved[R_SH] = (region_t){A, Ns, Fs};
        saved[R_SO] = (region_t){A, Ns, C};
        saved[R_SGL] = (region_t){A, Ns, 1};
    }
    if (scratch) {
        scratch[S_LOGITS] = (region_t){A, N, E};
        scratch[S_TMP] = (region_t){A, Ns, C};
        scratch[S_XP] = (region_t){A, ep > 1 ? M : 0, C};
        scratch[S_YR] = (region_t){A, X, C};
        scratch[S_DYP] = (region_t){A, M, C};
        scratch[S_DYR] = (region_t){A, X, C};
        scratch[S_DH] = (region_t){A, Rx, F};
        scratch[S_DG] = (region_t){A, Rx, F};
        scratch[S_DU] = (region_t){A, Rx, F};
        scratch[S_DXR] = (region_t){A, X, C};
        scratch[S_DXP] = (region_t){A, M, C};
        scratch[S_DW] = (region_t){DT_F32, N, K};
        scratch[S_DLOGITS] = (region_t){A, N, E};
        scratch[S_DEXP] = (region_t){A, Np, C};
        scratch[S_DSO] = (region_t){A, Ns, C};
        scratch[S_DSH] = (region_t){A, Ns, Fs};
        scratch[S_DSG] = (region_t){A, Ns, Fs};
        scratch[S_DSU] = (region_t){A, Ns, Fs};
        scratch[S_DSGL] = (region_t){A, Ns, 1};
        /* a capacity over rows this rank dispatches only part of: each
         * expert's budget for them (moe_caps) */
        bool split = m->par.tp_size > 1 || m->par.cp_size > 1;
        scratch[S_CAPS] = (region_t){DT_I32, e->capacity_factor > 0 && split ? 1 : 0, E};
    }
}

static size_t region_es(const model_t *m, const region_t *r)
{
    return dtype_size(r->dt == DT_COUNT ? m->place.act_dtype : r->dt);
}

/* Bytes of the regions carved in order, each 64-byte aligned. */
static double regions_bytes(const model_t *m, double N, bool saved)
{
    region_t reg[(int)R_COUNT > (int)S_COUNT ? (int)R_COUNT : (int)S_COUNT];
    int n = saved ? R_COUNT : S_COUNT;
    moe_regions(m, N, N, saved ? reg : NULL, saved ? NULL : reg);
    double total = 0;
    for (int i = 0; i < n; i++)
        total += model_align_d(reg[i].rows * reg[i].cols * (double)region_es(m, &reg[i]));
    return total;
}

static double moe_saved_bytes(const model_t *m, int64_t B, int64_t T)
{
    return regions_bytes(m, (double)B * (double)T, true);
}

static double moe_scratch_bytes(const model_t *m, int64_t B, int64_t T)
{
    return regions_bytes(m, (double)B * (double)T, false);
}

/* Views of n regions carved from base in order (as regions_bytes counts
 * them), for the batch at hand (the arena was sized for at least as many
 * rows). */
static void regions_view(const model_t *m, void *base, const region_t *r, int n, tensor_t *out)
{
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        dtype_t dt = r[i].dt == DT_COUNT ? m->place.act_dtype : r[i].dt;
        int64_t rows = (int64_t)r[i].rows, cols = (int64_t)r[i].cols;
        out[i] = tensor_make((char *)base + off, dt, m->place.dev, 2, (int64_t[]){rows, cols});
        off += model_align((size_t)(rows * cols) * dtype_size(dt));
    }
}

static void saved_views(const model_run_t *r, void *saved, tensor_t *v)
{
    region_t reg[R_COUNT];
    moe_regions(r->m, (double)r->N, (double)r->N_cap, reg, NULL);
    regions_view(r->m, saved, reg, R_COUNT, v);
}

static void scratch_views(const model_run_t *r, tensor_t *v)
{
    region_t reg[S_COUNT];
    moe_regions(r->m, (double)r->N, (double)r->N_cap, NULL, reg);
    regions_view(r->m, r->scratch, reg, S_COUNT, v);
}

/* shared per arena: the load-balancing statistics of one forward, for each
 * of the stage's L sparse layers its counts[E] and psum[E] (f32), then
 * aux_grad[E], the gradient the routers' backward adds to every row's
 * probabilities. The state is sized for the whole model's sparse layers M
 * (2M + 1 vectors of E, aux_grad at 2M), not the stage's: the cost model
 * (model/cost.c) takes a kind's shared state as one per stage, whatever the
 * stage holds, and a few E-vectors more per stage keep it exact. */
static int moe_sparse_layers(const model_config_t *c);

static int moe_grad_vec(const model_t *m) { return 2 * moe_sparse_layers(&m->cfg); }

static double moe_shared_bytes(const model_t *m, int64_t T)
{
    (void)T;
    return (moe_grad_vec(m) + 1.0) * model_align_d((double)m->cfg.moe.n_experts * 4);
}

/* vector i of the shared state: layer l's counts at 2l, its psum at 2l + 1,
 * the gradient at 2M (moe_grad_vec) */
static tensor_t shared_vec(const model_t *m, void *shared, int i)
{
    int64_t E = m->cfg.moe.n_experts;
    return tensor_make((char *)shared + (size_t)i * model_align((size_t)E * 4), DT_F32,
                       m->place.dev, 1, &E);
}

static int moe_sparse_layers(const model_config_t *c)
{
    int n = 0;
    for (int64_t l = 0; l < c->num_layers; l++) n += c->blocks[l].ffn == MODEL_FFN_MOE;
    return n;
}

static int moe_stage_subs(const model_t *m)
{
    int n = 0;
    for (int s = 0; s < m->n_subs; s++) n += m->subs[s].kind == &model_kind_moe;
    return n;
}

static bt_status_t moe_shared_init(const model_t *m, int64_t T, void *shared)
{
    (void)T;
    for (int i = 0; i <= moe_grad_vec(m); i++) {
        tensor_t v = shared_vec(m, shared, i);
        kern_zero(m->stream, &v);
    }
    return kern_stream_sync(m->stream);
}

/* ---- the load-balancing loss over stages and CP ranks -------------------------------- */

int64_t model_aux_len(const model_t *m, bool grad)
{
    if (m->cfg.moe.aux_loss_coef <= 0 || moe_sparse_layers(&m->cfg) == 0) return 0;
    return grad ? m->cfg.moe.n_experts : 2 * m->cfg.moe.n_experts + 2;
}

bt_status_t model_moe_aux_begin(model_run_t *r)
{
    if (!r->shared) return BT_OK;
    for (int i = 0; i < 2 * moe_stage_subs(r->m); i++) {
        tensor_t v = shared_vec(r->m, r->shared, i);
        kern_zero(r->s, &v);
    }
    return BT_OK;
}

/* v[n] summed over the CP group: directly where the collective takes host
 * memory, else through a device buffer (NCCL) */
static bt_status_t cp_sum(model_t *m, double *v, int64_t n)
{
    coll_comm_t *c = m->par.cp_comm;
    bt_status_t st;
    if (c->mem_devices & (1u << DEV_CPU)) {
        st = coll_all_reduce(c, v, (size_t)n, DT_F64, COLL_SUM);
    } else {
        void *d = NULL;
        if ((st = kern_mem_alloc(m->place.dev, (size_t)n * sizeof *v, &d)) != BT_OK) return st;
        tensor_t t = tensor_make(d, DT_F64, m->place.dev, 1, &n);
        kern_upload(m->stream, &t, v);
        if ((st = kern_stream_sync(m->stream)) == BT_OK &&
            (st = coll_all_reduce(c, d, (size_t)n, DT_F64, COLL_SUM)) == BT_OK) {
            kern_download(m->stream, v, &t);
            st = kern_stream_sync(m->stream);
        }
        kern_mem_free(m->place.dev, d);
    }
    if (st != BT_OK)
        log_error("model: CP all-reduce of the router's load-balancing sums failed (CP rank %d of "
                  "%d): %s", m->par.cp_rank, m->par.cp_size, bt_status_str(st));
    return st;
}

/* carry[2E + 2] = (counts[E], psum[E], rows, scored) summed over every
 * sparse layer up to this stage's last and over the CP group: the previous
 * stage's (none on the first) plus this stage's layers in order, each
 * layer's sums over the CP group first. With the head: aux = E sum_e (c_e /
 * R)(P_e / R) with R = rows (sparse layers x the microbatch's tokens), and
 * grad[e] = dloss * S * coef * E c_e / R^2 with S the microbatch's scored
 * positions (the weight of the term in the loss the caller sums). */
bt_status_t model_moe_aux_end(model_run_t *r, double *carry, double *grad, float dloss,
                              int64_t scored, double *value)
{
    model_t *m = r->m;
    const model_moe_config_t *e = &m->cfg.moe;
    int64_t E = e->n_experts;
    int L = r->shared ? moe_stage_subs(m) : 0;
    int64_t n = 2 * (int64_t)L * E + 2;
    *value = 0;
    float *h = malloc((size_t)(n > 1 ? n : 1) * sizeof *h);
    double *loc = calloc((size_t)n, sizeof *loc);
    bt_status_t st = h && loc ? BT_OK : BT_ERR_NOMEM;
    for (int i = 0; st == BT_OK && i < 2 * L; i++) {
        tensor_t v = shared_vec(m, r->shared, i);
        kern_download(r->s, h + (size_t)i * (size_t)E, &v);
    }
    if (st == BT_OK && L > 0) st = kern_stream_sync(r->s);
    if (st == BT_OK) {
        for (int64_t i = 0; i < 2 * L * E; i++) loc[i] = h[i];
        loc[n - 2] = (double)L * (double)r->N;
        loc[n - 1] = (double)scored;
        if (m->par.cp_size > 1 && (L > 0 || m->stage.has_head)) st = cp_sum(m, loc, n);
    }
    if (st == BT_OK) {
        if (m->stage.has_embedding) memset(carry, 0, (size_t)(2 * E + 2) * sizeof *carry);
        for (int l = 0; l < L; l++)
            for (int64_t i = 0; i < 2 * E; i++) carry[i] += loc[2 * l * E + i];
        carry[2 * E] += loc[n - 2];
        carry[2 * E + 1] += loc[n - 1];
    }
    if (st == BT_OK && m->stage.has_head) {
        double R = carry[2 * E], S = carry[2 * E + 1], aux = 0;
        if (!(R > 0)) {
            log_error("model: the router's load-balancing loss reached the head with no routed "
                      "rows (stage [%d,%d)): the previous stage sent no sums",
                      m->stage.first_layer, m->stage.last_layer);
            st = BT_ERR_INVALID;
        } else {
            for (int64_t i = 0; i < E; i++) aux += (carry[i] / R) * (carry[E + i] / R);
            *value = e->aux_loss_coef * (double)E * aux;
            for (int64_t i = 0; i < E; i++)
                grad[i] = (double)dloss * S * e->aux_loss_coef * (double)E * carry[i] / (R * R);
        }
    }
    free(h);
    free(loc);
    return st;
}

bt_status_t model_moe_aux_grad(model_run_t *r, const double *grad)
{
    if (!r->shared) return BT_OK;
    const model_t *m = r->m;
    int64_t E = m->cfg.moe.n_experts;
    float *h = malloc((size_t)E * sizeof *h);
    if (!h) return BT_ERR_NOMEM;
    for (int64_t i = 0; i < E; i++) h[i] = (float)grad[i];
    tensor_t v = shared_vec(m, r->shared, moe_grad_vec(m));
    kern_upload(r->s, &v, h);
    bt_status_t st = kern_stream_sync(r->s);
    free(h);
    return st;
}

/* rows [r0, r0 + n) of the 2-D tensor t */
static tensor_t rows_of(const tensor_t *t, int64_t r0, int64_t n)
{
    size_t row = (size_t)t->shape[1] * dtype_size(t->dtype);
    return tensor_make((char *)t->data + (size_t)r0 * row, t->dtype, t->device, 2,
                       (int64_t[]){n, t->shape[1]});
}

/* This TP rank's rows [*n0, *n0 + *n) of the N (all of them without TP). */
static void my_rows(const model_t *m, int64_t N, int64_t *n0, int64_t *n)
{
    *n0 = 0;
    *n = N;
    if (m->par.tp_size > 1) model_vocab_split(N, m->par.tp_size, m->par.tp_rank, n0, n);
}

static void layer_fail(const model_t *m, const char *coll, const char *what, int layer,
                       bt_status_t st)
{
    bool ep = !strcmp(coll, "EP all-to-all");
    log_error("model: %s of %s in layer %d failed (%s rank %d of %d): %s", coll, what, layer,
              ep ? "EP" : "TP", ep ? m->par.ep_rank : m->par.tp_rank,
              ep ? m->par.ep_size : m->par.tp_size, bt_status_str(st));
}

/* t[N, cols]: every TP rank's rows (my_rows) gathered into place over the
 * TP group, staged through host memory when the collective cannot take
 * the device's. */
static bt_status_t tp_gather_rows(model_t *m, tensor_t *t, const char *what, int layer)
{
    int tp = m->par.tp_size;
    int64_t N = t->shape[0], cols = t->shape[1], n0, n;
    size_t es = dtype_size(t->dtype), *counts = malloc((size_t)tp * sizeof *counts);
    if (!counts) return BT_ERR_NOMEM;
    for (int r = 0; r < tp; r++) {
        int64_t a, c;
        model_vocab_split(N, tp, r, &a, &c);
        counts[r] = (size_t)(c * cols);
    }
    my_rows(m, N, &n0, &n);
    coll_comm_t *comm = m->par.tp_comm;
    bt_status_t st = kern_stream_sync(m->stream);
    if (st == BT_OK && model_coll_direct(m, comm)) {
        st = coll_all_gather(comm, t->data, (char *)t->data + (size_t)(n0 * cols) * es, counts,
                             t->dtype);
    } else if (st == BT_OK) {
        char *h;
        if ((st = model_host_buf(m, tensor_nbytes(t), (void **)&h)) == BT_OK) {
            tensor_t mine = rows_of(t, n0, n);
            if (n > 0) kern_download(m->stream, h + (size_t)(n0 * cols) * es, &mine);
            if ((st = kern_stream_sync(m->stream)) == BT_OK &&
                (st = coll_all_gather(comm, h, h + (size_t)(n0 * cols) * es, counts, t->dtype)) ==
                    BT_OK) {
                kern_upload(m->stream, t, h);
                st = kern_stream_sync(m->stream);
            }
        }
    }
    free(counts);
    if (st != BT_OK) layer_fail(m, "TP all-gather", what, layer, st);
    return st;
}

/* With EP: the per-expert counts of the dispatch (sizes[E], this rank's
 * rows for every global expert) and what the other members send this
 * rank's experts (rsizes[ep, El]); in rows, send[j] for EP rank j and
 * recv[j] from it. exchange: the forward's count all-to-all, which writes
 * rsizes; else (the backward) both are read back as the forward left them. */
static bt_status_t ep_counts(model_t *m, const tensor_t *sizes, tensor_t *rsizes, bool exchange,
                             int64_t *send, int64_t *recv, int layer)
{
    uint64_t t0 = clock_now_ns();
    int ep = m->par.ep_size;
    int64_t E = m->cfg.moe.n_experts, El = E / ep;
    int32_t *h = malloc((size_t)(2 * E) * sizeof *h);
    size_t *cnt = malloc((size_t)ep * sizeof *cnt);
    bt_status_t st = BT_ERR_NOMEM;
    if (!h || !cnt) goto out;
    kern_download(m->stream, h, sizes);
    if (!exchange) kern_download(m->stream, h + E, rsizes);
    if ((st = kern_stream_sync(m->stream)) != BT_OK) goto out;
    if (exchange) {
        for (int j = 0; j < ep; j++) cnt[j] = (size_t)El;
        if ((st = coll_all_to_all(m->par.ep_comm, h + E, cnt, h, cnt, DT_I32)) != BT_OK) {
            layer_fail(m, "EP all-to-all", "the token counts", layer, st);
            goto out;
        }
        kern_upload(m->stream, rsizes, h + E);
        if ((st = kern_stream_sync(m->stream)) != BT_OK) goto out;
    }
    for (int j = 0; j < ep; j++) {
        send[j] = recv[j] = 0;
        for (int64_t k = 0; k < El; k++) {
            send[j] += h[j * El + k];
            recv[j] += h[E + j * El + k];
        }
    }
out:
    free(cnt);
    free(h);
    m->moe_exchange_ns += clock_now_ns() - t0;
    return st;
}

/* One row all-to-all(v) in flight (ep_start .. ep_finish, on the compute
 * thread): dst's rows from every EP rank (recv[j] rows from rank j, in rank
 * order) = what each sends of its src (send[j] of its rows to rank j, in
 * rank order), staged through a host buffer of its own when the collective
 * cannot take the device's memory. src and dst belong to the collective
 * until ep_finish. */
typedef struct {
    model_t           *m;
    coll_req_t        *req;      /* non-NULL: started, not finished */
    char              *host;     /* staging (send rows, then from sb the received) */
    size_t             sb;
    tensor_t           dst;      /* the received rows (staged: uploaded by ep_finish) */
    _Atomic uint64_t   t_done;   /* completion, on the collective's thread (0: not yet) */
    model_moe_x_t      log;
    const char        *what;
} ep_x_t;

static void ep_x_done(void *arg, bt_status_t st)
{
    (void)st; /* coll_wait returns it */
    atomic_store(&((ep_x_t *)arg)->t_done, clock_now_ns());
}

static bt_status_t ep_start(model_t *m, const tensor_t *src, const int64_t *send, tensor_t *dst,
                            const int64_t *recv, int what, int chunk, int layer,
                            const char *desc, ep_x_t *x)
{
    uint64_t t0 = clock_now_ns();
    int ep = m->par.ep_size;
    int64_t C = src->shape[1], ns = 0, nr = 0;
    size_t es = dtype_size(src->dtype), sc[MODEL_MAX_EP], rc[MODEL_MAX_EP];
    for (int j = 0; j < ep; j++) {
        sc[j] = (size_t)(send[j] * C);
        rc[j] = (size_t)(recv[j] * C);
        ns += send[j];
        nr += recv[j];
    }
    memset(x, 0, sizeof *x);
    x->m = m;
    x->what = desc;
    x->dst = rows_of(dst, 0, nr);
    x->log = (model_moe_x_t){.layer = layer, .what = what, .chunk = chunk,
                             .bytes = (uint64_t)((ns + nr) * C) * es};
    coll_comm_t *comm = m->par.ep_comm;
    const void *sendp = src->data;
    void *recvp = dst->data;
    bt_status_t st = kern_stream_sync(m->stream);
    if (st == BT_OK && !model_coll_direct(m, comm)) {
        x->sb = model_align((size_t)(ns * C) * es);
        if (!(x->host = malloc(x->sb + (size_t)(nr * C) * es + 1))) {
            st = BT_ERR_NOMEM;
        } else {
            tensor_t a = rows_of(src, 0, ns);
            if (ns > 0) kern_download(m->stream, x->host, &a);
            st = kern_stream_sync(m->stream);
            sendp = x->host;
            recvp = x->host + x->sb;
        }
    }
    if (st == BT_OK) {
        coll_call_t call = {.kind = COLL_KIND_ALL_TO_ALL, .recv = recvp, .send = sendp,
                            .send_counts = sc, .recv_counts = rc, .dt = src->dtype};
        x->log.t0 = clock_now_ns();
        st = coll_start(comm, &call, ep_x_done, x, &x->req);
        if (st == BT_IN_PROGRESS) st = BT_OK;
        else x->req = NULL;
    }
    if (st != BT_OK) {
        free(x->host);
        x->host = NULL;
        layer_fail(m, "EP all-to-all", desc, layer, st);
    }
    m->moe_exchange_ns += clock_now_ns() - t0;
    return st;
}

/* Waits for x (nothing when it never started) and logs it. */
static bt_status_t ep_finish(ep_x_t *x)
{
    if (!x->req) return BT_OK;
    model_t *m = x->m;
    uint64_t t0 = clock_now_ns();
    bt_status_t st = coll_wait(m->par.ep_comm, x->req);
    uint64_t now = clock_now_ns(), t1 = atomic_load(&x->t_done);
    x->req = NULL;
    if (t1 == 0 || t1 > now) t1 = now; /* the callback may come after the wait returns */
    if (t1 < x->log.t0) t1 = x->log.t0;
    m->moe_a2a_ns += t1 - x->log.t0;
    m->moe_a2a_wait_ns += t1 > t0 ? t1 - t0 : 0;
    x->log.t1 = t1;
    if (m->moe_xlog_n < MODEL_MOE_XLOG) m->moe_xlog[m->moe_xlog_n++] = x->log;
    else m->moe_xlog_lost++;
    if (st == BT_OK && x->host && x->dst.shape[0] > 0) {
        kern_upload(m->stream, &x->dst, x->host + x->sb);
        st = kern_stream_sync(m->stream);
    }
    free(x->host);
    x->host = NULL;
    if (st != BT_OK) layer_fail(m, "EP all-to-all", x->what, x->log.layer, st);
    m->moe_exchange_ns += clock_now_ns() - t0;
    return st;
}

/* After a failure: the exchanges still in flight own their buffers, so
 * they are waited for (their status is the communicator's, already
 * reported). */
static void ep_drain(ep_x_t *x, int n)
{
    for (int i = 0; i < n; i++)
        if (x[i].req) {
            coll_wait(x[i].m->par.ep_comm, x[i].req);
            x[i].req = NULL;
            free(x[i].host);
            x[i].host = NULL;
        }
}

/* The rows the experts run on, in blocks that each hold whole groups: one
 * block of this rank's dispatch (sizes[E]) without EP; with EP one block
 * per source rank, its rows grouped by this rank's El experts with that
 * rank's counts (a row of rsizes). */
#define MOE_MAX_BLOCKS MODEL_MAX_EP
typedef struct {
    int      n;
    int64_t  rows[MOE_MAX_BLOCKS];
    tensor_t sizes[MOE_MAX_BLOCKS];
} blocks_t;

static int64_t blocks_make(const model_t *m, const tensor_t *sizes, const tensor_t *rsizes,
                           const int64_t *recv, int64_t own, blocks_t *b)
{
    int ep = m->par.ep_size;
    if (ep <= 1) {
        b->n = 1;
        b->rows[0] = own;
        b->sizes[0] = *sizes;
        return own;
    }
    int64_t El = m->cfg.moe.n_experts / ep, total = 0;
    b->n = ep;
    for (int j = 0; j < ep; j++) {
        b->rows[j] = recv[j];
        b->sizes[j] = tensor_make((int32_t *)rsizes->data + j * El, DT_I32, rsizes->device, 1, &El);
        total += recv[j];
    }
    return total;
}

/* One chunk of this rank's dispatch (moe_chunks): token rows [r0, r0 + n)
 * of the layer's N, dispatched rows [x0, x0 + n K) of this rank's n K
 * (slots relative to x0), its counts (sizes[E], routed[E]; with EP the
 * counts that arrived, rsizes[ep, El], and in rows send[j] / recv[j]), and
 * the rows its experts run on, [R0, R0 + R) of all that arrived. */
typedef struct {
    int64_t  r0, n, x0, R0, R;
    tensor_t sizes, routed, rsizes, slot;
    int64_t  send[MODEL_MAX_EP], recv[MODEL_MAX_EP];
    blocks_t b;
} chunk_t;

/* This rank's n rows from n0 in q chunks, on the saved regions v. */
static void chunks_make(const model_t *m, const tensor_t *v, int64_t n0, int64_t n, int q,
                        chunk_t *c)
{
    int64_t E = m->cfg.moe.n_experts, K = m->cfg.moe.top_k;
    int ep = m->par.ep_size;
    for (int i = 0; i < q; i++) {
        int64_t a, k;
        model_vocab_split(n, q, i, &a, &k);
        c[i].r0 = n0 + a;
        c[i].n = k;
        c[i].x0 = a * K;
        c[i].sizes = tensor_make((int32_t *)v[R_SIZES].data + i * E, DT_I32, m->place.dev, 1, &E);
        c[i].routed = tensor_make((int32_t *)v[R_ROUTED].data + i * E, DT_I32, m->place.dev, 1, &E);
        c[i].rsizes = ep > 1 ? rows_of(&v[R_RSIZES], (int64_t)i * ep, ep) : (tensor_t){0};
        c[i].slot = rows_of(&v[R_SLOT], c[i].r0, k);
    }
}

/* Each chunk's blocks (blocks_make) and place among the rows that arrived;
 * their total. */
static int64_t chunks_blocks(const model_t *m, chunk_t *c, int q)
{
    int64_t K = m->cfg.moe.top_k, R = 0;
    for (int i = 0; i < q; i++) {
        c[i].R0 = R;
        c[i].R = blocks_make(m, &c[i].sizes, &c[i].rsizes, c[i].recv, c[i].n * K, &c[i].b);
        R += c[i].R;
    }
    return R;
}

/* routed_scaling_factor (0 in a config built by hand: 1) */
static float moe_routed_scale(const model_moe_config_t *e)
{
    return e->routed_scale > 0 ? (float)e->routed_scale : 1.0f;
}

/* DeepSeek-V2's group_limited_greedy, over the probabilities the route
 * kernel wrote (transformers' order of operations): each group of E/G
 * consecutive experts scored by its most probable one, the topk_group best
 * groups kept, the K most probable experts among theirs chosen (the most
 * probable first, ties the lower index), their probabilities the weights
 * (divided by their sum when norm_topk). On the host: the rows' N x E
 * probabilities come back, the choices go out. */
static bt_status_t group_reselect(model_t *m, tensor_t *weights, tensor_t *experts,
                                  const tensor_t *probs)
{
    const model_moe_config_t *e = &m->cfg.moe;
    int64_t N = probs->shape[0], E = e->n_experts, K = e->top_k, G = e->n_group;
    int64_t per = E / G, TG = e->topk_group;
    float *p = malloc((size_t)(N * E) * sizeof *p), *w = malloc((size_t)(N * K) * sizeof *w);
    float *gs = malloc((size_t)G * sizeof *gs);
    int32_t *x = malloc((size_t)(N * K) * sizeof *x);
    bool *keep = malloc((size_t)(G + E) * sizeof *keep);
    bt_status_t st = BT_ERR_NOMEM;
    if (!p || !w || !gs || !x || !keep) goto out;
    kern_download(m->stream, p, probs);
    if ((st = kern_stream_sync(m->stream)) != BT_OK) goto out;
    for (int64_t n = 0; n < N; n++) {
        const float *pn = p + n * E;
        bool *gk = keep, *ek = keep + G;
        for (int64_t g = 0; g < G; g++) {
            gs[g] = pn[g * per];
            for (int64_t i = 1; i < per; i++)
                if (pn[g * per + i] > gs[g]) gs[g] = pn[g * per + i];
            gk[g] = false;
        }
        for (int64_t t = 0; t < TG; t++) {
            int64_t best = -1;
            for (int64_t g = 0; g < G; g++)
                if (!gk[g] && (best < 0 || gs[g] > gs[best])) best = g;
            gk[best] = true;
        }
        for (int64_t i = 0; i < E; i++) ek[i] = false;
        double sum = 0;
        for (int64_t k = 0; k < K; k++) {
            int64_t best = -1;
            for (int64_t i = 0; i < E; i++)
                if (gk[i / per] && !ek[i] && (best < 0 || pn[i] > pn[best])) best = i;
            ek[best] = true;
            x[n * K + k] = (int32_t)best;
            w[n * K + k] = pn[best];
            sum += pn[best];
        }
        if (e->norm_topk)
            for (int64_t k = 0; k < K; k++) w[n * K + k] = (float)(w[n * K + k] / sum);
    }
    kern_upload(m->stream, experts, x);
    kern_upload(m->stream, weights, w);
    st = kern_stream_sync(m->stream);
out:
    free(p);
    free(w);
    free(gs);
    free(x);
    free(keep);
    return st;
}

static void experts_fwd(model_run_t *r, const model_sub_t *sub, const blocks_t *b,
                        const tensor_t *x, tensor_t *g, tensor_t *u, tensor_t *h, tensor_t *y)
{
    model_t *m = r->m;
    const tensor_t *wg = model_sub_param(m, sub, X_GATE), *wu = model_sub_param(m, sub, X_UP),
                   *wd = model_sub_param(m, sub, X_DOWN);
    int64_t at = 0;
    for (int j = 0; j < b->n; at += b->rows[j], j++) {
        if (!b->rows[j]) continue;
        tensor_t xj = rows_of(x, at, b->rows[j]), gj = rows_of(g, at, b->rows[j]),
                 uj = rows_of(u, at, b->rows[j]);
        kern_grouped_linear_fwd(r->s, &gj, &xj, wg, &b->sizes[j]);
        kern_grouped_linear_fwd(r->s, &uj, &xj, wu, &b->sizes[j]);
    }
    if (at == 0) return;
    kern_swiglu_fwd(r->s, h, g, u);
    at = 0;
    for (int j = 0; j < b->n; at += b->rows[j], j++) {
        if (!b->rows[j]) continue;
        tensor_t hj = rows_of(h, at, b->rows[j]), yj = rows_of(y, at, b->rows[j]);
        kern_grouped_linear_fwd(r->s, &yj, &hj, wd, &b->sizes[j]);
    }
}

/* dx (overwritten) from dy through the experts; their weights' gradients accumulate. */
static void experts_bwd(model_run_t *r, const model_sub_t *sub, const blocks_t *b,
                        const tensor_t *x, const tensor_t *g, const tensor_t *u, const tensor_t *h,
                        const tensor_t *dy, tensor_t *dh, tensor_t *dg, tensor_t *du, tensor_t *dx)
{
    model_t *m = r->m;
    kern_stream_t *s = r->s;
    int64_t total = 0;
    for (int j = 0; j < b->n; j++) total += b->rows[j];
    if (total == 0) return;
    kern_zero(s, dh);
    int64_t at = 0;
    for (int j = 0; j < b->n; at += b->rows[j], j++) {
        if (!b->rows[j]) continue;
        tensor_t dyj = rows_of(dy, at, b->rows[j]), hj = rows_of(h, at, b->rows[j]),
                 dhj = rows_of(dh, at, b->rows[j]);
        kern_grouped_linear_bwd(s, &dhj, model_sub_grad(m, sub, X_DOWN), &dyj, &hj,
                                model_sub_param(m, sub, X_DOWN), &b->sizes[j]);
    }
    kern_zero(s, dg);
    kern_zero(s, du);
    kern_swiglu_bwd(s, dg, du, dh, g, u);
    kern_zero(s, dx);
    at = 0;
    for (int j = 0; j < b->n; at += b->rows[j], j++) {
        if (!b->rows[j]) continue;
        tensor_t dgj = rows_of(dg, at, b->rows[j]), duj = rows_of(du, at, b->rows[j]),
                 xj = rows_of(x, at, b->rows[j]), dxj = rows_of(dx, at, b->rows[j]);
        kern_grouped_linear_bwd(s, &dxj, model_sub_grad(m, sub, X_GATE), &dgj, &xj,
                                model_sub_param(m, sub, X_GATE), &b->sizes[j]);
        kern_grouped_linear_bwd(s, &dxj, model_sub_grad(m, sub, X_UP), &duj, &xj,
                                model_sub_param(m, sub, X_UP), &b->sizes[j]);
    }
}

/* One sparse layer's expert part in flight (model_moe_job_t first): what
 * moe_forward / moe_backward set up for it and read back after. */
typedef struct {
    model_moe_job_t    job;
    model_run_t       *r;
    const model_sub_t *sub;
    tensor_t          *v, *sc;         /* the layer's saved and scratch views */
    chunk_t           *c;              /* [Q] this rank's chunks of the dispatch */
    int                Q;
    const tensor_t    *xp;             /* forward: the dispatched rows */
    tensor_t          *yp;             /* forward [Q]: the experts' results, back here */
    tensor_t          *dyp, *dxp;      /* backward [Q]: their gradients, out and back */
} moe_part_t;

/* The forward's expert part: counts first (EP), then each chunk's rows out
 * to its experts' ranks and their results back into yp. */
static bt_status_t fwd_experts(model_moe_job_t *job)
{
    moe_part_t *p = (moe_part_t *)job;
    model_run_t *r = p->r;
    model_t *m = r->m;
    kern_stream_t *s = r->s;
    const model_sub_t *sub = p->sub;
    tensor_t *v = p->v, *sc = p->sc, *yp = p->yp, xp = *p->xp;
    chunk_t *c = p->c;
    int Q = p->Q, ep = m->par.ep_size;
    int64_t K = m->cfg.moe.top_k;
    bt_status_t st;
    /* the experts: on this rank's rows, or (EP) on what the group sent here,
     * counts first, then each chunk's rows out and its results back */
    for (int q = 0; ep > 1 && q < Q; q++)
        if ((st = ep_counts(m, &c[q].sizes, &c[q].rsizes, true, c[q].send, c[q].recv, sub->layer)))
            return st;
    int64_t R = chunks_blocks(m, c, Q);
    if (R > v[R_G].shape[0]) BT_PANIC("moe_forward: %lld rows arrived, room for %lld",
                                      (long long)R, (long long)v[R_G].shape[0]);
    if (ep > 1) m->moe_rows_in += R;
    ep_x_t xd[MOE_CHUNKS] = {0}, xc[MOE_CHUNKS] = {0};
    tensor_t xin[MOE_CHUNKS], yout[MOE_CHUNKS];
    for (int q = 0; q < Q; q++) {
        xin[q] = ep > 1 ? rows_of(&v[R_XR], c[q].R0, c[q].R) : xp;
        yout[q] = ep > 1 ? rows_of(&sc[S_YR], c[q].R0, c[q].R) : yp[q];
        tensor_t xq = rows_of(&xp, c[q].x0, c[q].n * K);
        if (ep > 1 && (st = ep_start(m, &xq, c[q].send, &xin[q], c[q].recv, MODEL_MOE_X_DISPATCH, q,
                                     sub->layer, "the routed tokens", &xd[q])))
            goto drain;
        if (m->moe_serial && (st = ep_finish(&xd[q]))) goto drain;
    }
    for (int q = 0; q < Q; q++) {
        if ((st = ep_finish(&xd[q]))) goto drain;
        tensor_t g = rows_of(&v[R_G], c[q].R0, c[q].R), u = rows_of(&v[R_U], c[q].R0, c[q].R),
                 h = rows_of(&v[R_H], c[q].R0, c[q].R);
        uint64_t t0 = clock_now_ns();
        experts_fwd(r, sub, &c[q].b, &xin[q], &g, &u, &h, &yout[q]);
        if (m->moe_time_sync && (st = kern_stream_sync(s))) goto drain;
        m->moe_expert_ns += clock_now_ns() - t0;
        if (ep > 1 && (st = ep_start(m, &yout[q], c[q].recv, &yp[q], c[q].send, MODEL_MOE_X_COMBINE,
                                     q, sub->layer, "the experts' outputs", &xc[q])))
            goto drain;
        if (m->moe_serial && (st = ep_finish(&xc[q]))) goto drain;
    }
    for (int q = 0; q < Q; q++)
        if ((st = ep_finish(&xc[q]))) goto drain;
    job->rows_in = R;
    return BT_OK;
drain:
    ep_drain(xd, Q);
    ep_drain(xc, Q);
    return st;
}

/* v[n] of every CP rank, rank order, into all[cp * n]: directly where the
 * collective takes host memory, else through a device buffer */
static bt_status_t cp_gather(model_t *m, double *all, const double *v, int64_t n)
{
    coll_comm_t *c = m->par.cp_comm;
    int cp = m->par.cp_size;
    size_t *counts = malloc((size_t)cp * sizeof *counts);
    if (!counts) return BT_ERR_NOMEM;
    for (int i = 0; i < cp; i++) counts[i] = (size_t)n;
    bt_status_t st;
    if (c->mem_devices & (1u << DEV_CPU)) {
        st = coll_all_gather(c, all, v, counts, DT_F64);
    } else {
        void *d = NULL;
        int64_t tot = (int64_t)cp * n;
        if ((st = kern_mem_alloc(m->place.dev, (size_t)(tot + n) * sizeof *v, &d)) == BT_OK) {
            tensor_t t = tensor_make(d, DT_F64, m->place.dev, 1, &tot);
            tensor_t mine = tensor_make((double *)d + tot, DT_F64, m->place.dev, 1, &n);
            kern_upload(m->stream, &mine, v);
            if ((st = kern_stream_sync(m->stream)) == BT_OK &&
                (st = coll_all_gather(c, t.data, mine.data, counts, DT_F64)) == BT_OK) {
                kern_download(m->stream, all, &t);
                st = kern_stream_sync(m->stream);
            }
            kern_mem_free(m->place.dev, d);
        }
    }
    free(counts);
    return st;
}

/* A capacity keeps each expert's first cap choices in token order over the
 * whole microbatch, but this rank dispatches only some of its rows: its TP
 * share [n0, ...) of the rows it holds, and under CP those are chunks r and
 * 2cp-1-r of every sequence. Since the rank's rows keep the global order
 * among themselves, the choices of expert e it keeps are the first ones of
 * its own in that order, as many as caps[e]:
 *  - the rows this CP rank holds keep, of expert e, kept_e = the sum over
 *    its segments (one chunk of one sequence, in order) of clamp(cap -
 *    before, 0, count), with before the choices of e in every segment of
 *    the microbatch ahead of it (every CP rank's counts per segment,
 *    all-gathered); without CP kept_e = min(cap, count_e);
 *  - this TP rank's rows start after prefix_e choices of e (every TP rank
 *    routed every row), so caps[e] = max(0, kept_e - prefix_e).
 * experts: the [N, K] choices of the rows this rank holds. */
static bt_status_t moe_caps(model_run_t *r, const tensor_t *experts, int64_t cap, int64_t n0,
                            tensor_t *caps, int layer)
{
    model_t *m = r->m;
    int64_t N = r->N, K = m->cfg.moe.top_k, E = m->cfg.moe.n_experts;
    int cp = m->par.cp_size > 1 ? m->par.cp_size : 1, me = cp > 1 ? m->par.cp_rank : 0;
    int64_t segs = cp > 1 ? 2 * r->B : 1, seg_rows = N / segs; /* a chunk of one sequence */
    int32_t *ex = malloc((size_t)(N * K) * sizeof *ex), *hc = malloc((size_t)E * sizeof *hc);
    double *cnt = calloc((size_t)(segs * E), sizeof *cnt);
    double *all = cp > 1 ? malloc((size_t)(cp * segs * E) * sizeof *all) : cnt;
    int64_t *kept = calloc((size_t)(2 * E), sizeof *kept), *prefix = kept ? kept + E : NULL;
    bt_status_t st = ex && hc && cnt && all && kept ? BT_OK : BT_ERR_NOMEM;
    if (st == BT_OK && N > 0) {
        kern_download(r->s, ex, experts);
        st = kern_stream_sync(r->s);
    }
    for (int64_t i = 0; st == BT_OK && i < N * K; i++) {
        int32_t x = ex[i];
        if (x < 0 || x >= E) continue; /* the kernels drop an invalid choice */
        cnt[(i / K) / seg_rows * E + x] += 1;
        if (i / K < n0) prefix[x]++;
    }
    if (st == BT_OK && cp > 1) st = cp_gather(m, all, cnt, segs * E);
    if (st != BT_OK) {
        log_error("model: the capacity's counts of layer %d could not be gathered (CP rank %d of "
                  "%d): %s", layer, me, cp, bt_status_str(st));
    } else {
        /* segment (rank q, s): sequence s / 2, chunk q (s even) or 2cp-1-q
         * (s odd); its place in the microbatch's token order */
        for (int64_t s = 0; s < segs; s++) {
            int64_t key = cp > 1 ? (s / 2) * 2 * cp + (s % 2 ? 2 * cp - 1 - me : me) : 0;
            for (int64_t x = 0; x < E; x++) {
                double before = 0;
                for (int q = 0; q < cp; q++)
                    for (int64_t t = 0; t < segs; t++) {
                        int64_t kt = cp > 1 ? (t / 2) * 2 * cp + (t % 2 ? 2 * cp - 1 - q : q) : 0;
                        if (kt < key) before += all[((int64_t)q * segs + t) * E + x];
                    }
                double left = (double)cap - before, c = cnt[s * E + x];
                kept[x] += (int64_t)(left <= 0 ? 0 : left < c ? left : c);
            }
        }
        for (int64_t x = 0; x < E; x++) {
            int64_t c = kept[x] - prefix[x];
            hc[x] = (int32_t)(c > 0 ? c : 0);
        }
        kern_upload(r->s, caps, hc);
        st = kern_stream_sync(r->s);
    }
    free(ex);
    free(hc);
    if (all != cnt) free(all);
    free(cnt);
    free(kept);
    return st;
}

static bt_status_t moe_forward(model_run_t *r, const model_sub_t *sub, void *saved,
                               const tensor_t *ln, tensor_t *y)
{
    model_t *m = r->m;
    kern_stream_t *s = r->s;
    const model_moe_config_t *e = &m->cfg.moe;
    int64_t N = r->N, K = e->top_k, E = e->n_experts;
    int ep = m->par.ep_size;
    bt_status_t st;
    if ((double)N * (double)K > (double)INT32_MAX) {
        log_error("model: layer %d routes %lld tokens x %lld experts, more choices than an i32 "
                  "slot holds; use smaller microbatches", sub->layer, (long long)N, (long long)K);
        return BT_ERR_UNSUPPORTED;
    }
    tensor_t v[R_COUNT], sc[S_COUNT];
    saved_views(r, saved, v);
    scratch_views(r, sc);
    /* route: every row, on every TP rank alike */
    kern_linear_fwd(s, &sc[S_LOGITS], ln, model_sub_param(m, sub, X_ROUTER), NULL);
    kern_moe_route_fwd(s, &v[R_WEIGHTS], &v[R_EXPERTS], &v[R_PROBS], &sc[S_LOGITS], e->norm_topk);
    int k = 0; /* this layer's place among the stage's sparse layers: its load and bias */
    while (k < m->n_subs && &m->subs[k] != sub) k++;
    int li = 0;
    for (int i = 0; i < k; i++) li += m->subs[i].kind == &model_kind_moe;
    if (k == m->n_subs || li >= m->n_moe) BT_PANIC("moe_forward: layer %d is no sparse layer of its stage", sub->layer);
    if (e->bias_rate > 0) { /* the selection bias: other experts, the same weights' rule */
        tensor_t bias = model_moe_load_view(m, li, 2);
        kern_moe_route_reselect(s, &v[R_WEIGHTS], &v[R_EXPERTS], &v[R_PROBS], &bias, e->norm_topk);
    }
    if (e->router == MODEL_ROUTER_SOFTMAX_GROUP_TOPK &&
        (st = group_reselect(m, &v[R_WEIGHTS], &v[R_EXPERTS], &v[R_PROBS])) != BT_OK)
        return st;
    if (moe_routed_scale(e) != 1.0f) kern_scale(s, &v[R_WEIGHTS], moe_routed_scale(e));
    if (e->aux_loss_coef > 0) { /* this layer's sums for the load-balancing loss */
        tensor_t cnt = shared_vec(m, r->shared, 2 * li), psum = shared_vec(m, r->shared, 2 * li + 1);
        kern_moe_route_stats(s, &cnt, &psum, &v[R_PROBS], &v[R_EXPERTS]);
    }
    if (r->training) {
        tensor_t load = model_moe_load_view(m, li, 0), scratch = model_moe_load_view(m, li, 1);
        kern_moe_route_stats(s, &load, &scratch, &v[R_PROBS], &v[R_EXPERTS]);
    }
    /* dispatch this rank's rows, in chunks (moe_chunks) */
    int64_t n0, n;
    my_rows(m, N, &n0, &n);
    int64_t cap = -1;
    bool split = m->par.tp_size > 1 || m->par.cp_size > 1;
    if (e->capacity_factor > 0) { /* over the whole microbatch: every CP rank's rows */
        double Ng = (double)N * (double)(m->par.cp_size > 1 ? m->par.cp_size : 1);
        double c = ceil(e->capacity_factor * Ng * (double)K / (double)E);
        cap = c < Ng * (double)K ? (int64_t)c : (int64_t)(Ng * (double)K);
    }
    if (cap >= 0 && split && (st = moe_caps(r, &v[R_EXPERTS], cap, n0, &sc[S_CAPS], sub->layer)))
        return st;
    int Q = moe_chunks(m);
    chunk_t c[MOE_CHUNKS];
    chunks_make(m, v, n0, n, Q, c);
    tensor_t xp = rows_of(ep > 1 ? &sc[S_XP] : &v[R_XP], 0, n * K);
    for (int q = 0; q < Q; q++) {
        if (c[q].n > 0) {
            tensor_t lnr = rows_of(ln, c[q].r0, c[q].n), ex = rows_of(&v[R_EXPERTS], c[q].r0, c[q].n);
            tensor_t xq = rows_of(&xp, c[q].x0, c[q].n * K);
            if (cap >= 0 && split)
                kern_moe_permute_fwd_caps(s, &xq, &c[q].slot, &c[q].sizes, &c[q].routed, &lnr, &ex,
                                          &sc[S_CAPS]);
            else
                kern_moe_permute_fwd(s, &xq, &c[q].slot, &c[q].sizes, &c[q].routed, &lnr, &ex, cap);
        } else {
            kern_zero(s, &c[q].sizes);
            kern_zero(s, &c[q].routed);
        }
    }
    if (cap >= 0) { /* count what the capacity dropped (one chunk) */
        int32_t *h = malloc((size_t)(2 * E) * sizeof *h);
        if (!h) return BT_ERR_NOMEM;
        kern_download(s, h, &c[0].sizes);
        kern_download(s, h + E, &c[0].routed);
        st = kern_stream_sync(s);
        int64_t d = 0;
        for (int64_t i = 0; st == BT_OK && i < E; i++) d += h[E + i] - h[i];
        m->moe_dropped += d;
        if (r->training) m->moe_dropped_train += d;
        free(h);
        if (st != BT_OK) return st;
    }
    /* the experts: on this rank's rows, or (EP) on what the group sent here
     * (fwd_experts), run by the layer's expert group where there is one */
    tensor_t yp[MOE_CHUNKS];
    for (int q = 0; q < Q; q++) yp[q] = rows_of(&v[R_YP], c[q].x0, c[q].n * K);
    moe_part_t part = {.job = {.run = fwd_experts, .model = m, .layer = sub->layer, .rows_out = n * K},
                       .r = r, .sub = sub, .v = v, .sc = sc, .c = c, .Q = Q, .xp = &xp, .yp = yp};
    if ((st = m->moe_group ? m->moe_group(m->moe_group_arg, &part.job) : fwd_experts(&part.job)))
        return st;
    /* combine */
    for (int q = 0; q < Q; q++) {
        if (c[q].n == 0) continue;
        tensor_t yr = rows_of(y, c[q].r0, c[q].n), w = rows_of(&v[R_WEIGHTS], c[q].r0, c[q].n);
        kern_moe_combine_fwd(s, &yr, &yp[q], &c[q].slot, &w);
    }
    if (m->par.tp_size > 1 && (st = tp_gather_rows(m, y, "the experts' output", sub->layer)))
        return st;
    if (e->shared_ffn > 0) {
        kern_linear_fwd(s, &v[R_SG], ln, model_sub_param(m, sub, X_SGATE), NULL);
        kern_linear_fwd(s, &v[R_SU], ln, model_sub_param(m, sub, X_SUP), NULL);
        kern_swiglu_fwd(s, &v[R_SH], &v[R_SG], &v[R_SU]);
        kern_linear_fwd(s, &v[R_SO], &v[R_SH], model_sub_param(m, sub, X_SDOWN), NULL);
        if (model_sub_param(m, sub, X_SHGATE)) { /* Qwen2-MoE: sigmoid-gated */
            kern_linear_fwd(s, &v[R_SGL], ln, model_sub_param(m, sub, X_SHGATE), NULL);
            kern_sigmoid_gate_fwd(s, &sc[S_TMP], &v[R_SGL], &v[R_SO]);
            kern_add(s, y, y, &sc[S_TMP]);
        } else { /* DeepSeek-V2: added as it is */
            kern_add(s, y, y, &v[R_SO]);
        }
    }
    return BT_OK;
}

/* The backward's expert part: the output gradients out to the experts'
 * ranks (dyp), the experts' backward, the input gradients back (dxp). */
static bt_status_t bwd_experts(model_moe_job_t *job)
{
    moe_part_t *p = (moe_part_t *)job;
    model_run_t *r = p->r;
    model_t *m = r->m;
    const model_sub_t *sub = p->sub;
    tensor_t *v = p->v, *d = p->sc, *dyp = p->dyp, *dxp = p->dxp;
    chunk_t *c = p->c;
    int Q = p->Q, ep = m->par.ep_size;
    kern_stream_t *s = r->s;
    bt_status_t st;
    /* the experts, where the forward ran them */
    for (int q = 0; ep > 1 && q < Q; q++)
        if ((st = ep_counts(m, &c[q].sizes, &c[q].rsizes, false, c[q].send, c[q].recv, sub->layer)))
            return st;
    chunks_blocks(m, c, Q);
    ep_x_t xd[MOE_CHUNKS] = {0}, xc[MOE_CHUNKS] = {0};
    tensor_t xin[MOE_CHUNKS], dyin[MOE_CHUNKS], dxin[MOE_CHUNKS];
    for (int q = 0; q < Q; q++) {
        xin[q] = ep > 1 ? rows_of(&v[R_XR], c[q].R0, c[q].R) : rows_of(&v[R_XP], 0, c[q].R);
        dyin[q] = ep > 1 ? rows_of(&d[S_DYR], c[q].R0, c[q].R) : dyp[q];
        dxin[q] = ep > 1 ? rows_of(&d[S_DXR], c[q].R0, c[q].R) : dxp[q];
        if (ep > 1 && (st = ep_start(m, &dyp[q], c[q].send, &dyin[q], c[q].recv,
                                     MODEL_MOE_X_DISPATCH_GRAD, q, sub->layer,
                                     "the experts' output gradients", &xd[q])))
            goto drain;
        if (m->moe_serial && (st = ep_finish(&xd[q]))) goto drain;
    }
    for (int q = 0; q < Q; q++) {
        if ((st = ep_finish(&xd[q]))) goto drain;
        int64_t R0 = c[q].R0, R = c[q].R;
        tensor_t g = rows_of(&v[R_G], R0, R), u = rows_of(&v[R_U], R0, R),
                 h = rows_of(&v[R_H], R0, R), dh = rows_of(&d[S_DH], R0, R),
                 dg = rows_of(&d[S_DG], R0, R), du = rows_of(&d[S_DU], R0, R);
        uint64_t t0 = clock_now_ns();
        experts_bwd(r, sub, &c[q].b, &xin[q], &g, &u, &h, &dyin[q], &dh, &dg, &du, &dxin[q]);
        if (m->moe_time_sync && (st = kern_stream_sync(s))) goto drain;
        m->moe_expert_ns += clock_now_ns() - t0;
        if (ep > 1 && (st = ep_start(m, &dxin[q], c[q].recv, &dxp[q], c[q].send,
                                     MODEL_MOE_X_COMBINE_GRAD, q, sub->layer,
                                     "the routed tokens' gradients", &xc[q])))
            goto drain;
        if (m->moe_serial && (st = ep_finish(&xc[q]))) goto drain;
    }
    for (int q = 0; q < Q; q++)
        if ((st = ep_finish(&xc[q]))) goto drain;
    int64_t R = 0;
    for (int q = 0; q < Q; q++) R += c[q].R;
    job->rows_in = R;
    return BT_OK;
drain:
    ep_drain(xd, Q);
    ep_drain(xc, Q);
    return st;
}

static bt_status_t moe_backward(model_run_t *r, const model_sub_t *sub, void *saved,
                                const tensor_t *ln, const tensor_t *dy, tensor_t *dln)
{
    model_t *m = r->m;
    kern_stream_t *s = r->s;
    const model_moe_config_t *e = &m->cfg.moe;
    int64_t K = e->top_k;
    bool tp = m->par.tp_size > 1;
    bt_status_t st;
    tensor_t v[R_COUNT], d[S_COUNT];
    saved_views(r, saved, v);
    scratch_views(r, d);
    kern_zero(s, dln);
    if (e->shared_ffn > 0) {
        bool gated = model_sub_param(m, sub, X_SHGATE) != NULL;
        if (gated) {
            kern_zero(s, &d[S_DSO]);
            kern_zero(s, &d[S_DSGL]);
            kern_sigmoid_gate_bwd(s, &d[S_DSO], &d[S_DSGL], dy, &v[R_SGL], &v[R_SO]);
        }
        kern_zero(s, &d[S_DSH]);
        kern_linear_bwd(s, &d[S_DSH], model_sub_grad(m, sub, X_SDOWN), NULL,
                        gated ? &d[S_DSO] : dy, &v[R_SH], model_sub_param(m, sub, X_SDOWN));
        kern_zero(s, &d[S_DSG]);
        kern_zero(s, &d[S_DSU]);
        kern_swiglu_bwd(s, &d[S_DSG], &d[S_DSU], &d[S_DSH], &v[R_SG], &v[R_SU]);
        kern_linear_bwd(s, dln, model_sub_grad(m, sub, X_SGATE), NULL, &d[S_DSG], ln,
                        model_sub_param(m, sub, X_SGATE));
        kern_linear_bwd(s, dln, model_sub_grad(m, sub, X_SUP), NULL, &d[S_DSU], ln,
                        model_sub_param(m, sub, X_SUP));
        if (gated)
            kern_linear_bwd(s, dln, model_sub_grad(m, sub, X_SHGATE), NULL, &d[S_DSGL], ln,
                            model_sub_param(m, sub, X_SHGATE));
    }
    /* combine, on this rank's rows, chunk by chunk as the forward dispatched them */
    int64_t n0, n;
    my_rows(m, r->N, &n0, &n);
    int Q = moe_chunks(m);
    chunk_t c[MOE_CHUNKS];
    chunks_make(m, v, n0, n, Q, c);
    tensor_t yp[MOE_CHUNKS], dyp[MOE_CHUNKS], dxp[MOE_CHUNKS];
    kern_zero(s, &d[S_DW]);
    for (int q = 0; q < Q; q++) {
        yp[q] = rows_of(&v[R_YP], c[q].x0, c[q].n * K);
        dyp[q] = rows_of(&d[S_DYP], c[q].x0, c[q].n * K);
        dxp[q] = rows_of(&d[S_DXP], c[q].x0, c[q].n * K);
        if (c[q].n == 0) continue;
        tensor_t dyr = rows_of(dy, c[q].r0, c[q].n), w = rows_of(&v[R_WEIGHTS], c[q].r0, c[q].n),
                 dw = rows_of(&d[S_DW], c[q].r0, c[q].n);
        kern_zero(s, &dyp[q]);
        kern_moe_combine_bwd(s, &dyp[q], &dw, &dyr, &yp[q], &c[q].slot, &w);
    }
    /* the experts, where the forward ran them (bwd_experts) */
    moe_part_t part = {.job = {.run = bwd_experts, .model = m, .layer = sub->layer, .backward = true, .rows_out = n * K},
                       .r = r, .sub = sub, .v = v, .sc = d, .c = c, .Q = Q, .dyp = dyp, .dxp = dxp};
    if ((st = m->moe_group ? m->moe_group(m->moe_group_arg, &part.job) : bwd_experts(&part.job)))
        return st;
    /* dispatch: back to this rank's rows, then (TP) to every row */
    for (int q = 0; q < Q; q++) {
        if (c[q].n == 0) continue;
        tensor_t mine = rows_of(tp ? &d[S_DEXP] : dln, c[q].r0, c[q].n);
        if (tp) kern_zero(s, &mine);
        kern_moe_permute_bwd(s, &mine, &dxp[q], &c[q].slot);
    }
    if (tp) {
        tensor_t dw = d[S_DW];
        if ((st = tp_gather_rows(m, &d[S_DEXP], "the routed input gradient", sub->layer)) ||
            (st = tp_gather_rows(m, &dw, "the routing weights' gradient", sub->layer)))
            return st;
        kern_add(s, dln, dln, &d[S_DEXP]);
    }
    /* the router: its weights' gradient and the load-balancing loss's */
    tensor_t aux_grad = {0};
    if (e->aux_loss_coef > 0) aux_grad = shared_vec(m, r->shared, moe_grad_vec(m));
    if (moe_routed_scale(e) != 1.0f) kern_scale(s, &d[S_DW], moe_routed_scale(e));
    kern_zero(s, &d[S_DLOGITS]);
    kern_moe_route_bwd(s, &d[S_DLOGITS], &d[S_DW], e->aux_loss_coef > 0 ? &aux_grad : NULL,
                       &v[R_PROBS], &v[R_EXPERTS], e->norm_topk);
    kern_linear_bwd(s, dln, model_sub_grad(m, sub, X_ROUTER), NULL, &d[S_DLOGITS], ln,
                    model_sub_param(m, sub, X_ROUTER));
    return BT_OK;
}

/* the active parameters only: the router's, top_k experts', the shared
 * expert's and its gate's */
static void moe_flops(const model_config_t *c, int64_t T, model_flops_t *f)
{
    (void)T;
    const model_moe_config_t *e = &c->moe;
    double C = (double)c->hidden_size;
    f->matmul_params += C * (double)e->n_experts + (double)e->top_k * 3.0 * C * (double)e->expert_ffn;
    if (e->shared_ffn > 0)
        f->matmul_params += 3.0 * C * (double)e->shared_ffn +
                            (model_arch_info(c->arch)->shared_expert_gate ? C : 0);
}

static const kern_op_t moe_ops[] = {KERN_OP_LINEAR,      KERN_OP_SWIGLU,         KERN_OP_MATMUL,
                                    KERN_OP_ELEMENTWISE, KERN_OP_MOE_ROUTE,      KERN_OP_MOE_PERMUTE,
                                    KERN_OP_MOE_COMBINE, KERN_OP_GROUPED_LINEAR};

const model_kind_t model_kind_moe = {
    .name = "moe",
    .validate = moe_validate,
    .layout = moe_layout,
    .saved_bytes = moe_saved_bytes,
    .scratch_bytes = moe_scratch_bytes,
    .shared_bytes = moe_shared_bytes,
    .shared_init = moe_shared_init,
    .cache_bytes = NULL,
    .forward = moe_forward,
    .backward = moe_backward,
    .flops = moe_flops,
    .ops = moe_ops,
    .n_ops = (int)(sizeof moe_ops / sizeof moe_ops[0]),
};
