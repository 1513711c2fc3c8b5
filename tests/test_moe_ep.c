/* Expert parallelism and MoE under tensor parallelism at the model level
 * (model/moe.c; the layouts as processes: tests/sh/test_moe_ep.sh). Ranks
 * run as threads over the inproc collectives, each on one communicator that
 * serves as its EP group and, where there is TP, as its TP group too (the
 * same members). Against one process on the whole model (itself checked
 * against transformers in test_moe), for the fixtures qwen2_moe (8 experts,
 * a shared expert, a dense layer) and mixtral (4 experts, the router's
 * load-balancing loss):
 *   ep=2, ep=4      each rank a microbatch of its own (as data-parallel
 *                   ranks hold): its loss is the single process's on that
 *                   microbatch; its experts' gradients are the single
 *                   process's gradients of those experts accumulated over
 *                   every microbatch; the dense gradients summed over the
 *                   ranks are the single process's;
 *   tp=2 x ep=2     one microbatch, each TP rank dispatching half the rows
 *                   to experts spread over the two TP ranks;
 *   tp=2, ep=1      the experts replicated over TP, their gradients summed
 *                   over the TP ranks (the edp group there);
 *   zero tokens     ep=2 with router rows that no token picks on EP rank 1:
 *                   it receives nothing, still takes part in every
 *                   exchange, and every value still matches. */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "ckpt/hf.h"
#include "ckpt/safetensors.h"
#include "coll/coll.h"
#include "model/model.h"
#include "tests/helpers/group.h"
#include "tests/helpers/moe.h"
#include "tests/test.h"

#define FIX "tests/fixtures/"
#define LOSS_RTOL 1e-6
#define GRAD_RTOL 1e-5
#define MB_ROWS 2
#define MB_T 8
#define MAX_MB 4

typedef struct {
    const char *dir;
    int         tp, ep;    /* the comm is both groups: tp is 1 or ep */
    int         n_mb;      /* microbatches: one per token-owning rank */
    bool        zero_rank1; /* make EP rank 1's experts unpicked */
    /* the single-process reference */
    int32_t     ids[MAX_MB][MB_ROWS * MB_T], tg[MAX_MB][MB_ROWS * MB_T];
    double      loss[MAX_MB];
    float       dloss;
    model_t    *ref;
    int64_t     rows_in[8];
    /* per rank: a hash of the loss's and every gradient's bits, and the
     * EP row all-to-alls of its forward and backward (model_t moe_xlog) */
    uint64_t    hash[8];
    int         n_x[8], x_bad[8];
} ep_case_t;

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

static double rel_err(const float *a, const float *b, int64_t n)
{
    double d = 0, nb = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        nb += (double)b[i] * b[i];
    }
    return nb > 0 ? sqrt(d / nb) : sqrt(d);
}

static int reference(ep_case_t *c)
{
    if (ckpt_hf_load(c->dir, NULL, &c->ref) != BT_OK || model_grads_alloc(c->ref)) return 1;
    if (c->zero_rank1 && test_moe_routers_tie(c->ref, c->ep)) return 1;
    uint64_t x = 12345;
    int64_t scored = 0;
    for (int k = 0; k < c->n_mb; k++) {
        for (int i = 0; i < MB_ROWS * MB_T; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            c->ids[k][i] = (int32_t)((x >> 33) % (uint64_t)c->ref->cfg.vocab_size);
        }
        model_targets_from_ids(c->tg[k], c->ids[k], NULL, MB_ROWS, MB_T);
        scored += model_count_scored(c->tg[k], MB_ROWS * MB_T);
    }
    c->dloss = 1.0f / (float)scored;
    model_acts_t *a;
    if (model_acts_create(c->ref, MB_ROWS, MB_T, &a)) return 1;
    int bad = 0;
    for (int k = 0; k < c->n_mb && !bad; k++) {
        model_batch_t mb = {.B = MB_ROWS, .T = MB_T, .ids = c->ids[k], .targets = c->tg[k]};
        model_loss_t l;
        bad = model_forward_backward(c->ref, a, &mb, c->dloss, &l) != BT_OK;
        c->loss[k] = l.loss_sum / (double)l.n_scored;
    }
    model_acts_destroy(a);
    return bad;
}

static int ep_body(coll_comm_t *comm, void *arg)
{
    ep_case_t *c = arg;
    int r = comm->rank, fails = 0;
    model_parallel_t par = {.tp_rank = c->tp > 1 ? r : 0, .tp_size = c->tp,
                            .tp_comm = c->tp > 1 ? comm : NULL,
                            .ep_rank = c->ep > 1 ? r : 0, .ep_size = c->ep,
                            .ep_comm = c->ep > 1 ? comm : NULL,
                            .edp_rank = c->ep > 1 ? 0 : r};
    model_t *m = NULL;
    model_acts_t *a = NULL;
    float *g = NULL, *want = NULL;
    if (ckpt_hf_load_tp(c->dir, NULL, &par, &m) != BT_OK || model_grads_alloc(m) ||
        (c->zero_rank1 && test_moe_routers_tie(m, c->ep)) || model_acts_create(m, MB_ROWS, MB_T, &a))
        return 1;
    int k = c->n_mb > 1 ? r : 0; /* this rank's microbatch */
    model_batch_t mb = {.B = MB_ROWS, .T = MB_T, .ids = c->ids[k], .targets = c->tg[k]};
    model_loss_t l;
    if (model_forward_backward(m, a, &mb, c->dloss, &l) != BT_OK) {
        fails++;
        goto out;
    }
    double loss = l.loss_sum / (double)l.n_scored;
    if (!(fabs(loss - c->loss[k]) <= LOSS_RTOL * fabs(c->loss[k]))) {
        fprintf(stderr, "rank %d: loss %.9g, one process %.9g\n", r, loss, c->loss[k]);
        fails++;
    }
    c->rows_in[r] = m->moe_rows_in;
    /* with EP and no capacity: per sparse layer two chunks, each out and
     * back in the forward and in the backward, in issue order; the time
     * waited is part of the time in flight */
    c->n_x[r] = m->moe_xlog_n;
    for (int i = 0; i < m->moe_xlog_n; i++) {
        const model_moe_x_t *x = &m->moe_xlog[i];
        c->x_bad[r] += x->t1 < x->t0 || x->chunk < 0 || x->chunk > 1;
    }
    c->x_bad[r] += m->moe_a2a_wait_ns > m->moe_a2a_ns || (c->ep > 1 && m->moe_a2a_ns == 0);
    c->hash[r] = fnv(1469598103934665603ull, &l.loss_sum, sizeof l.loss_sum);
    int64_t most = 1;
    for (int i = 0; i < c->ref->n_params; i++)
        if (shard_global_numel(&c->ref->params[i].spec) > most)
            most = shard_global_numel(&c->ref->params[i].spec);
    g = malloc((size_t)most * sizeof *g);
    want = malloc((size_t)most * sizeof *want);
    if (!g || !want) {
        fails++;
        goto out;
    }
    for (int i = 0; i < m->n_params; i++) {
        const model_param_t *p = &m->params[i];
        int j = model_param_find(c->ref, p->name);
        if (j < 0 || model_param_read(c->ref, j, true, want)) {
            fails++;
            continue;
        }
        int64_t n = tensor_numel(&p->t);
        bt_status_t st;
        if (MODEL_PARAM_IS_EXPERT(&p->spec)) {
            /* this rank's experts: rows of the whole gradient; replicated
             * over TP (ep 1), the TP ranks' shares summed */
            st = model_param_read(m, i, true, g);
            if (!st && c->ep == 1 && c->tp > 1) st = coll_all_reduce(comm, g, (size_t)n, DT_F32, COLL_SUM);
            memmove(want, want + p->spec.offset[0] * (n / p->spec.extent[0]), (size_t)n * sizeof *want);
        } else if (c->tp > 1) {
            n = shard_global_numel(&p->spec);
            st = model_param_gather(m, i, true, g); /* collective: every rank, same order */
        } else {
            st = model_param_read(m, i, true, g); /* each rank's tokens: summed like dp */
            if (!st) st = coll_all_reduce(comm, g, (size_t)n, DT_F32, COLL_SUM);
        }
        c->hash[r] = fnv(c->hash[r], g, (size_t)n * sizeof *g);
        double e = st ? INFINITY : rel_err(g, want, n);
        if (!(e <= GRAD_RTOL)) {
            fprintf(stderr, "rank %d: gradient of %s: %.3g from one process's\n", r, p->name, e);
            fails++;
        }
    }
out:
    free(g);
    free(want);
    model_acts_destroy(a);
    model_destroy(m);
    return fails;
}

static void ep_check_into(const char *name, int tp, int ep, bool zero, uint64_t *hash);
static void ep_check(const char *name, int tp, int ep, bool zero) { ep_check_into(name, tp, ep, zero, NULL); }

static void ep_check_into(const char *name, int tp, int ep, bool zero, uint64_t *hash)
{
    ep_case_t *c = calloc(1, sizeof *c);
    REQUIRE(c);
    c->dir = name;
    c->tp = tp;
    c->ep = ep;
    c->zero_rank1 = zero;
    int n = tp > ep ? tp : ep;
    c->n_mb = tp > 1 ? 1 : ep;
    REQUIRE(reference(c) == 0);
    test_group_t g = {.job_id = "moe-ep-test", .comm_id = 7, .kind = XPORT_INPROC, .size = n,
                      .timeout_ms = 20000, .kill_rank = -1};
    int f = test_group_threads(&g, ep_body, c);
    CHECK_MSG(f == 0, "%s tp=%d ep=%d%s: %d failures", name, tp, ep, zero ? " (zero tokens)" : "", f);
    if (ep > 1) {
        int64_t total = 0;
        for (int r = 0; r < n; r++) total += c->rows_in[r];
        CHECK(total > 0);
        if (zero) CHECK_MSG(c->rows_in[1] == 0 && c->rows_in[0] > 0, "rows in: %lld %lld",
                            (long long)c->rows_in[0], (long long)c->rows_in[1]);
        else for (int r = 0; r < n; r++) CHECK_MSG(c->rows_in[r] > 0, "rank %d got no rows", r);
        int want = c->ref->n_moe * 2 * 2 * 2; /* layers x chunks x (out, back) x (fwd, bwd) */
        for (int r = 0; r < n; r++)
            CHECK_MSG(c->n_x[r] == want && c->x_bad[r] == 0, "rank %d: %d row all-to-alls (%d expected), %d bad",
                      r, c->n_x[r], want, c->x_bad[r]);
    }
    if (hash) memcpy(hash, c->hash, sizeof c->hash);
    model_destroy(c->ref);
    free(c);
}

static void test_moe_ep2_qwen(void) { ep_check(FIX "qwen2_moe", 1, 2, false); }
static void test_moe_ep4_qwen(void) { ep_check(FIX "qwen2_moe", 1, 4, false); }
static void test_moe_ep2_mixtral_aux(void) { ep_check(FIX "mixtral", 1, 2, false); }
static void test_moe_ep4_mixtral_aux(void) { ep_check(FIX "mixtral", 1, 4, false); }
static void test_moe_tp2_ep2_qwen(void) { ep_check(FIX "qwen2_moe", 2, 2, false); }
static void test_moe_tp2_ep2_mixtral(void) { ep_check(FIX "mixtral", 2, 2, false); }
static void test_moe_tp2_replicated_qwen(void) { ep_check(FIX "qwen2_moe", 2, 1, false); }
static void test_moe_ep2_zero_tokens(void) { ep_check(FIX "qwen2_moe", 1, 2, true); }
static void test_moe_tp2_ep2_zero_tokens(void) { ep_check(FIX "qwen2_moe", 2, 2, true); }

/* The chunked exchanges overlap compute without changing a bit: the same
 * layout run again (other thread timings), its losses and gradients hash
 * the same on every rank, zero-token ranks included. */
static void test_moe_ep_overlap_same_bits(void)
{
    const struct { int tp, ep; bool zero; } cases[] = {{1, 2, false}, {1, 4, false}, {2, 2, true}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t h[3][8];
        for (int run = 0; run < 3; run++)
            ep_check_into(FIX "qwen2_moe", cases[i].tp, cases[i].ep, cases[i].zero, h[run]);
        for (int run = 1; run < 3; run++)
            CHECK_MSG(!memcmp(h[0], h[run], sizeof h[0]), "tp=%d ep=%d: run %d differs in its bits",
                      cases[i].tp, cases[i].ep, run);
    }
}

/* Bias balancing at the model level: the update is rate * sign(mean -
 * count) per expert, the biases are checkpoint views named beside their
 * router, and a bias large enough on one expert puts every token there
 * (its load is then every row), while the weights stay the probabilities. */
static void test_moe_bias_balance(void)
{
    model_t *m = NULL;
    REQUIRE(ckpt_hf_load(FIX "qwen2_moe", NULL, &m) == BT_OK);
    m->cfg.moe.bias_rate = 0.25;
    int64_t E = m->cfg.moe.n_experts;
    REQUIRE(m->n_moe == 2 && E == 8);
    double load[2 * 9] = {0, 1, 1, 1, 1, 1, 1, 1, 9, 2, 2, 2, 2, 2, 2, 2, 2, 2};
    REQUIRE(model_moe_balance(m, load) == BT_OK); /* layer 0: mean 2; layer 2: even */
    tensor_t v[2];
    char names[2][MODEL_NAME_MAX];
    REQUIRE(model_moe_bias_views(m, v, names) == 2);
    CHECK_MSG(!strcmp(names[0], "model.layers.0.mlp.gate.selection_bias") &&
                  !strcmp(names[1], "model.layers.2.mlp.gate.selection_bias"), "%s %s", names[0], names[1]);
    const float *b0 = v[0].data, *b1 = v[1].data;
    for (int e = 0; e < 7; e++) CHECK(b0[e] == 0.25f);
    CHECK(b0[7] == -0.25f);
    for (int e = 0; e < 8; e++) CHECK(b1[e] == 0.0f);
    /* expert 5 of layer 0 far ahead: every token's first choice */
    ((float *)v[0].data)[5] = 10.0f;
    model_acts_t *a;
    REQUIRE(model_grads_alloc(m) == BT_OK && model_acts_create(m, 1, 8, &a) == BT_OK);
    int32_t ids[8] = {1, 5, 9, 30, 77, 100, 3, 4}, tg[8];
    model_targets_from_ids(tg, ids, NULL, 1, 8);
    model_batch_t mb = {.B = 1, .T = 8, .ids = ids, .targets = tg};
    model_loss_t l;
    double got[2 * 9];
    model_moe_load_take(m, NULL);
    CHECK(model_forward_backward(m, a, &mb, 1.0f / 7, &l) == BT_OK && isfinite(l.loss_sum));
    CHECK(model_moe_load_take(m, got) == 2);
    CHECK_MSG(got[0] == 0 && got[1 + 5] == 8, "layer %g expert 5: %g of 8 tokens", got[0], got[6]);
    model_acts_destroy(a);
    model_destroy(m);
}

/* An HF export carries the selection biases as DeepSeek-V3's router names
 * them ("<router>.e_score_correction_bias", [E] f32) and a reload routes
 * with them: the same biases bit for bit, and the same loss and load as
 * the model that wrote them (a bias that moves every token's choice, so
 * a reload without it would route otherwise). */
static void test_moe_bias_export(void)
{
    model_t *m = NULL, *back = NULL;
    REQUIRE(ckpt_hf_load(FIX "qwen2_moe", NULL, &m) == BT_OK);
    m->cfg.moe.bias_rate = 0.25;
    int64_t E = m->cfg.moe.n_experts;
    tensor_t v[2];
    REQUIRE(model_moe_bias_views(m, v, NULL) == 2);
    for (int k = 0; k < 2; k++)
        for (int64_t e = 0; e < E; e++) ((float *)v[k].data)[e] = (float)(e * (k ? -0.375 : 0.125));
    ((float *)v[0].data)[3] = 10.0f;
    char out[] = "/tmp/baton-moe-bias-XXXXXX", tgt[64], path[96];
    REQUIRE(mkdtemp(out));
    snprintf(tgt, sizeof tgt, "%s/model", out);
    REQUIRE(ckpt_hf_save(m, tgt) == BT_OK);
    snprintf(path, sizeof path, "%s/model.safetensors", tgt);
    ckpt_st_file_t *f = NULL;
    REQUIRE(ckpt_st_open(path, &f) == BT_OK);
    const char *names[2] = {"model.layers.0.mlp.gate.e_score_correction_bias",
                            "model.layers.2.mlp.gate.e_score_correction_bias"};
    for (int k = 0; k < 2; k++) {
        const ckpt_st_tensor_t *t = ckpt_st_find(f, names[k]);
        CHECK_MSG(t && t->ndim == 1 && t->shape[0] == E && !memcmp(t->data, v[k].data, (size_t)E * 4),
                  "%s not exported as the model holds it", names[k]);
    }
    ckpt_st_close(f);
    REQUIRE(ckpt_hf_load(tgt, NULL, &back) == BT_OK);
    CHECK(back->cfg.moe.bias_rate == 0.25);
    tensor_t w[2];
    REQUIRE(model_moe_bias_views(back, w, NULL) == 2);
    for (int k = 0; k < 2; k++) CHECK(!memcmp(w[k].data, v[k].data, (size_t)E * 4));
    int32_t ids[8] = {1, 5, 9, 30, 77, 100, 3, 4}, tg[8];
    model_targets_from_ids(tg, ids, NULL, 1, 8);
    model_batch_t mb = {.B = 1, .T = 8, .ids = ids, .targets = tg};
    double loss[2], load[2][2 * 9];
    model_t *two[2] = {m, back};
    for (int i = 0; i < 2; i++) {
        model_acts_t *a;
        model_loss_t l;
        REQUIRE(model_grads_alloc(two[i]) == BT_OK && model_acts_create(two[i], 1, 8, &a) == BT_OK);
        model_moe_load_take(two[i], NULL);
        CHECK(model_forward_backward(two[i], a, &mb, 1.0f / 7, &l) == BT_OK);
        CHECK(model_moe_load_take(two[i], load[i]) == 2);
        loss[i] = l.loss_sum;
        model_acts_destroy(a);
    }
    CHECK_MSG(loss[0] == loss[1] && !memcmp(load[0], load[1], sizeof load[0]) && load[1][1 + 3] == 8,
              "reloaded: loss %.9g (wrote %.9g), expert 3 of layer 0 %g of 8 tokens", loss[1],
              loss[0], load[1][4]);
    model_destroy(back);
    model_destroy(m);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
    CHECK(system(cmd) == 0);
}

/* Wrong placements are errors naming what is wrong, before anything runs. */
static void test_moe_ep_errors(void)
{
    model_t *m = NULL;
    coll_comm_t fake = {.rank = 0, .size = 3};
    model_parallel_t p3 = {.tp_size = 1, .ep_rank = 0, .ep_size = 3, .ep_comm = &fake};
    CHECK(ckpt_hf_load_tp(FIX "qwen2_moe", NULL, &p3, &m) == BT_ERR_INVALID && !m);
    coll_comm_t two = {.rank = 1, .size = 2};
    model_parallel_t bad = {.tp_size = 1, .ep_rank = 0, .ep_size = 2, .ep_comm = &two};
    CHECK(ckpt_hf_load_tp(FIX "qwen2_moe", NULL, &bad, &m) == BT_ERR_INVALID && !m);
    model_parallel_t dense = {.tp_size = 1, .ep_rank = 0, .ep_size = 2, .ep_comm = &(coll_comm_t){.rank = 0, .size = 2}};
    CHECK(ckpt_hf_load_tp(FIX "llama", NULL, &dense, &m) == BT_ERR_INVALID && !m);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_moe_ep2_qwen, test_moe_ep4_qwen, test_moe_ep2_mixtral_aux,
             test_moe_ep4_mixtral_aux, test_moe_tp2_ep2_qwen, test_moe_tp2_ep2_mixtral,
             test_moe_tp2_replicated_qwen, test_moe_ep2_zero_tokens, test_moe_tp2_ep2_zero_tokens,
             test_moe_ep_overlap_same_bits, test_moe_bias_balance, test_moe_bias_export, test_moe_ep_errors);
}
