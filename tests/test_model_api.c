/* Model API contracts: the one parameter block and its named views, the
 * gradient twin, stage layouts, deterministic init, explicit positions, and
 * caller errors reported rather than crashed on. */
#include <signal.h>
#include <malloc.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/hf.h"
#include "model/kind.h"
#include "model/model.h"
#include "tests/test.h"

static model_config_t cfg_small(void)
{
    model_config_t c = {
        .arch = MODEL_ARCH_LLAMA, .vocab_size = 64, .hidden_size = 16, .mlp.intermediate_size = 24,
        .num_layers = 3, .attn.num_heads = 4, .attn.num_kv_heads = 2, .attn.head_dim = 4,
        .max_position_embeddings = 32, .rms_norm_eps = 1e-6,
        .attn.rope = {.kind = MODEL_ROPE_DEFAULT, .theta = 10000.0},
        .attn.qkv_bias = true, .mlp.bias = true,
    };
    model_config_blocks_uniform(&c, MODEL_MIXER_ATTENTION, MODEL_FFN_DENSE);
    return c;
}

static void test_model_block_layout(void)
{
    model_config_t c = cfg_small();
    model_t *m = NULL;
    REQUIRE(model_create(&c, NULL, &m) == BT_OK);
    REQUIRE(model_grads_alloc(m) == BT_OK);
    CHECK(m->n_params == model_layout(&c, NULL, NULL));
    int64_t total = 0;
    for (int i = 0; i < m->n_params; i++) {
        const tensor_t *t = &m->params[i].t;
        float *p = t->data;
        int64_t n = tensor_numel(t);
        total += n;
        CHECK((char *)p >= (char *)m->param_mem &&
              (char *)(p + n) <= (char *)m->param_mem + m->param_bytes);
        CHECK((uintptr_t)p % 64 == 0);
        CHECK(tensor_is_contiguous(t) && t->dtype == DT_F32);
        /* views do not overlap: each ends before the next begins */
        if (i + 1 < m->n_params) CHECK(p + n <= (float *)m->params[i + 1].t.data);
        /* the gradient twin sits at the same offset with the same name and shape */
        CHECK((char *)m->grads[i].t.data - (char *)m->grad_mem ==
              (char *)p - (char *)m->param_mem);
        CHECK(!strcmp(m->grads[i].name, m->params[i].name));
        CHECK(tensor_same_shape(&m->grads[i].t, t));
        CHECK(model_param_find(m, m->params[i].name) == i);
    }
    CHECK(total == model_num_params(&c));
    CHECK(!strcmp(m->params[0].name, "model.embed_tokens.weight"));
    CHECK(!strcmp(m->params[m->n_params - 1].name, "lm_head.weight"));
    int q = model_param_find(m, "model.layers.2.self_attn.q_proj.bias");
    CHECK(q >= 0 && m->params[q].t.shape[0] == 16);
    int k = model_param_find(m, "model.layers.1.self_attn.k_proj.weight");
    CHECK(k >= 0 && m->params[k].t.shape[0] == 8 && m->params[k].t.shape[1] == 16);
    CHECK(model_param_find(m, "model.layers.3.self_attn.q_proj.weight") < 0);
    CHECK(model_param_find(m, "model.layers.0.self_attn.o_proj.bias") < 0);
    model_destroy(m);

    /* HF parameter counts of the fixtures (printed by tools/gen_fixtures.py) */
    model_config_t f;
    REQUIRE(ckpt_hf_config_load("tests/fixtures/llama", &f) == BT_OK);
    CHECK(model_num_params(&f) == 106816);
    REQUIRE(ckpt_hf_config_load("tests/fixtures/llama_tied_llama3", &f) == BT_OK);
    CHECK(model_num_params(&f) == 32512);
    REQUIRE(ckpt_hf_config_load("tests/fixtures/qwen2", &f) == BT_OK);
    CHECK(model_num_params(&f) == 71232);
}

static void test_model_stage_init(void)
{
    model_config_t c = cfg_small();
    model_t *full = NULL, *mid = NULL;
    model_stage_t s = {.first_layer = 1, .last_layer = 2};
    REQUIRE(model_create(&c, NULL, &full) == BT_OK);
    REQUIRE(model_create(&c, &s, &mid) == BT_OK);
    CHECK(mid->embed < 0 && mid->lm_head < 0 && mid->final_norm < 0);
    CHECK(mid->n_params * 3 == full->n_params - 3); /* embed, norm, lm_head */
    model_init_random(full, 42, 0.02f);
    model_init_random(mid, 42, 0.02f);
    for (int i = 0; i < mid->n_params; i++) {
        int j = model_param_find(full, mid->params[i].name);
        REQUIRE(j >= 0);
        CHECK(memcmp(mid->params[i].t.data, full->params[j].t.data,
                     tensor_nbytes(&mid->params[i].t)) == 0);
    }
    /* norms start at 1, biases at 0, matrices ~ N(0, 0.02) */
    int n = model_param_find(full, "model.norm.weight");
    CHECK(((float *)full->params[n].t.data)[3] == 1.0f);
    int b = model_param_find(full, "model.layers.0.mlp.up_proj.bias");
    CHECK(((float *)full->params[b].t.data)[5] == 0.0f);
    int e = full->embed;
    double ss = 0;
    int64_t ne = tensor_numel(&full->params[e].t);
    for (int64_t i = 0; i < ne; i++) ss += pow(((float *)full->params[e].t.data)[i], 2);
    CHECK_NEAR(sqrt(ss / (double)ne), 0.02, 0.1, 0);
    model_destroy(mid);
    model_destroy(full);

    model_stage_t bad = {.first_layer = 2, .last_layer = 4};
    model_t *m = NULL;
    CHECK(model_create(&c, &bad, &m) == BT_ERR_INVALID);
    c.attn.num_kv_heads = 3;
    CHECK(model_create(&c, NULL, &m) == BT_ERR_INVALID);
}

/* the random init runs in pieces on the host pool: a tensor of several
 * pieces (vocab 3000 x 64 = 3 pieces of 65536 draws) gets the same bits on
 * one thread and on three */
static void test_model_init_threads(void)
{
    model_config_t c = cfg_small();
    c.vocab_size = 3000;
    c.hidden_size = 64;
    c.attn.head_dim = 16;
    model_t *a = NULL, *b = NULL;
    REQUIRE(model_create(&c, NULL, &a) == BT_OK);
    REQUIRE(model_create(&c, NULL, &b) == BT_OK);
    kern_cpu_set_threads(1);
    REQUIRE(model_init_random(a, 11, 0.02f) == BT_OK);
    kern_cpu_set_threads(3);
    REQUIRE(model_init_random(b, 11, 0.02f) == BT_OK);
    kern_cpu_set_threads(0);
    int e = a->embed;
    CHECK(tensor_numel(&a->params[e].t) > 2 * 65536);
    for (int i = 0; i < a->n_params; i++)
        CHECK(memcmp(a->params[i].t.data, b->params[i].t.data, tensor_nbytes(&a->params[i].t)) == 0);
    /* not all one value: the pieces past the first were drawn */
    const float *w = a->params[e].t.data;
    int64_t ne = tensor_numel(&a->params[e].t);
    CHECK(w[ne - 1] != 0.0f && w[ne - 1] != w[ne - 2] && w[70000] != w[0]);
    model_destroy(a);
    model_destroy(b);
}

static void test_model_positions_and_errors(void)
{
    model_config_t c = cfg_small();
    model_t *m = NULL;
    REQUIRE(model_create(&c, NULL, &m) == BT_OK);
    model_init_random(m, 7, 0.1f);
    model_acts_t *a = NULL;
    REQUIRE(model_acts_create(m, 2, 8, &a) == BT_OK);
    int32_t ids[16], tg[16], pos[16];
    for (int i = 0; i < 16; i++) {
        ids[i] = (i * 37 + 5) % 64;
        pos[i] = i % 8;
    }
    model_targets_from_ids(tg, ids, NULL, 2, 8);
    CHECK(tg[7] == MODEL_IGNORE_INDEX && tg[6] == ids[7] && tg[8] == ids[9]);
    model_batch_t b = {.B = 2, .T = 8, .ids = ids, .targets = tg};
    model_loss_t l1, l2;
    REQUIRE(model_forward_backward(m, a, &b, 0, &l1) == BT_OK);
    b.pos = pos;
    REQUIRE(model_forward_backward(m, a, &b, 0, &l2) == BT_OK);
    CHECK(l1.n_scored == 14 && l2.n_scored == 14);
    CHECK(l1.loss_sum == l2.loss_sum);
    /* shifting every position changes RoPE angles but not relative ones:
     * attention scores, hence the loss, stay the same up to rounding */
    for (int i = 0; i < 16; i++) pos[i] = i % 8 + 5;
    model_acts_t *a2 = NULL;
    REQUIRE(model_acts_create(m, 2, 16, &a2) == BT_OK);
    REQUIRE(model_forward_backward(m, a2, &b, 0, &l2) == BT_OK);
    CHECK_NEAR(l2.loss_sum, l1.loss_sum, 1e-5, 0);
    model_acts_destroy(a2);
    pos[3] = 8; /* outside the 8-position rope table of a */
    CHECK(model_forward_backward(m, a, &b, 0, &l2) == BT_ERR_INVALID);
    b.pos = NULL;
    ids[4] = 64;
    CHECK(model_forward_backward(m, a, &b, 0, &l2) == BT_ERR_INVALID);
    ids[4] = 3;
    tg[2] = 99;
    CHECK(model_forward_backward(m, a, &b, 0, &l2) == BT_ERR_INVALID);
    tg[2] = 1;
    b.T = 9; /* larger than the arena */
    CHECK(model_forward_backward(m, a, &b, 0, &l2) == BT_ERR_INVALID);
    b.T = 8;
    CHECK(model_stage_backward(m, a) == BT_ERR_INVALID); /* no forward with dloss */
    CHECK(model_acts_create(m, 0, 8, &a2) == BT_ERR_INVALID);
    model_acts_destroy(a);
    model_destroy(m);
}

/* A large vocabulary makes the head run in several row chunks (4M logits
 * each): a padded batch (rows 0-58, 59-117 and 118-119, the last chunk all
 * padding and skipped) must give the loss and gradients of the sequences run one by one
 * (one chunk each). */
static void test_model_head_chunks(void)
{
    model_config_t c = cfg_small();
    c.vocab_size = 70000; /* 4M / 70000 = 59 rows per chunk */
    c.num_layers = 1;
    c.attn.qkv_bias = c.mlp.bias = false;
    model_t *m = NULL;
    REQUIRE(model_create(&c, NULL, &m) == BT_OK);
    model_init_random(m, 3, 0.05f);
    int64_t B = 4, T = 30, lens[4] = {30, 25, 28, 2};
    int32_t ids[120], tg[120], tg1[30];
    for (int i = 0; i < 120; i++) ids[i] = (int32_t)((i * 7919 + 11) % 70000);
    model_targets_from_ids(tg, ids, lens, B, T);
    int64_t total = model_count_scored(tg, B * T);
    CHECK(total == 29 + 24 + 27 + 1);
    float dloss = 1.0f / (float)total;

    model_acts_t *a = NULL;
    REQUIRE(model_acts_create(m, B, T, &a) == BT_OK);
    model_batch_t b = {.B = B, .T = T, .ids = ids, .targets = tg};
    model_loss_t lb;
    REQUIRE(model_forward_backward(m, a, &b, dloss, &lb) == BT_OK);
    size_t n_el = m->grad_bytes / sizeof(float);
    const float *gm = m->grad_mem;
    float *g_batch = malloc(m->grad_bytes);
    memcpy(g_batch, m->grad_mem, m->grad_bytes);
    model_acts_destroy(a);

    model_grads_zero(m);
    REQUIRE(model_acts_create(m, 1, T, &a) == BT_OK);
    double sum = 0;
    for (int64_t s = 0; s < B; s++) {
        model_targets_from_ids(tg1, ids + s * T, NULL, 1, lens[s]);
        model_batch_t b1 = {.B = 1, .T = lens[s], .ids = ids + s * T, .targets = tg1};
        model_loss_t l;
        REQUIRE(model_forward_backward(m, a, &b1, dloss, &l) == BT_OK);
        sum += l.loss_sum;
    }
    CHECK(lb.n_scored == total);
    CHECK_NEAR(lb.loss_sum, sum, 1e-6, 0);
    double md = 0, mg = 0;
    for (size_t i = 0; i < n_el; i++) {
        md = fmax(md, fabs((double)g_batch[i] - (double)gm[i]));
        mg = fmax(mg, fabs((double)gm[i]));
    }
    CHECK_MSG(mg > 0 && md / mg <= 1e-5, "chunked head gradients differ: %.3g", md / mg);
    free(g_batch);
    model_acts_destroy(a);
    model_destroy(m);
}

/* Blocks as kinds: a stack whose layers are a lone attention then a lone
 * MLP computes exactly what one Llama layer (attention, then MLP) computes
 * with the same weights: the same loss and the same gradients, bit for bit.
 * Its layout has no MLP tensors in layer 0 and no attention tensors in
 * layer 1, and a pipeline stage can hold either layer. */
static void test_model_hybrid_blocks(void)
{
    model_config_t one = cfg_small(), hyb = cfg_small();
    one.num_layers = 1;
    hyb.num_layers = 2;
    hyb.blocks[0] = (model_block_t){.mixer = MODEL_MIXER_ATTENTION, .ffn = MODEL_FFN_NONE};
    hyb.blocks[1] = (model_block_t){.mixer = MODEL_MIXER_NONE, .ffn = MODEL_FFN_DENSE};
    model_t *a = NULL, *b = NULL;
    REQUIRE(model_create(&one, NULL, &a) == BT_OK && model_create(&hyb, NULL, &b) == BT_OK);
    REQUIRE(model_init_random(a, 9, 0.1f) == BT_OK);
    CHECK(a->n_params == b->n_params && a->n_subs == 2 && b->n_subs == 2);
    CHECK(model_param_find(b, "model.layers.0.mlp.up_proj.weight") < 0);
    CHECK(model_param_find(b, "model.layers.1.self_attn.q_proj.weight") < 0);
    CHECK(model_param_find(b, "model.layers.1.post_attention_layernorm.weight") >= 0);
    /* b's tensors are a's, with the MLP's under layer 1 */
    for (int i = 0; i < b->n_params; i++) {
        char name[MODEL_NAME_MAX];
        snprintf(name, sizeof name, "%s", b->params[i].name);
        char *l1 = strstr(name, "layers.1.");
        if (l1) l1[7] = '0';
        int j = model_param_find(a, name);
        REQUIRE(j >= 0);
        memcpy(b->params[i].t.data, a->params[j].t.data, tensor_nbytes(&a->params[j].t));
    }
    int32_t ids[16], tg[16];
    for (int i = 0; i < 16; i++) ids[i] = (i * 11 + 3) % 64;
    model_targets_from_ids(tg, ids, NULL, 2, 8);
    model_batch_t batch = {.B = 2, .T = 8, .ids = ids, .targets = tg};
    model_acts_t *aa = NULL, *ab = NULL;
    REQUIRE(model_acts_create(a, 2, 8, &aa) == BT_OK && model_acts_create(b, 2, 8, &ab) == BT_OK);
    model_loss_t la, lb;
    REQUIRE(model_forward_backward(a, aa, &batch, 0.1f, &la) == BT_OK);
    REQUIRE(model_forward_backward(b, ab, &batch, 0.1f, &lb) == BT_OK);
    CHECK(la.loss_sum == lb.loss_sum && la.n_scored == lb.n_scored);
    int differ = 0;
    for (int i = 0; i < b->n_params; i++) {
        char name[MODEL_NAME_MAX];
        snprintf(name, sizeof name, "%s", b->params[i].name);
        char *l1 = strstr(name, "layers.1.");
        if (l1) l1[7] = '0';
        int j = model_param_find(a, name);
        differ += memcmp(b->grads[i].t.data, a->grads[j].t.data, tensor_nbytes(&a->grads[j].t)) != 0;
    }
    CHECK_MSG(differ == 0, "%d gradients differ between the hybrid stack and the Llama layer", differ);
    /* a stage of just the MLP layer */
    model_stage_t s1 = {.first_layer = 1, .last_layer = 2, .has_head = true};
    model_t *st = NULL;
    REQUIRE(model_create(&hyb, &s1, &st) == BT_OK);
    CHECK(st->n_subs == 1 && st->subs[0].kind == &model_kind_mlp && st->subs[0].layer == 1);
    model_destroy(st);
    model_acts_destroy(aa);
    model_acts_destroy(ab);
    model_destroy(a);
    model_destroy(b);
    /* a layer with neither is refused by name */
    hyb.blocks[1] = (model_block_t){0};
    CHECK(model_create(&hyb, NULL, &b) == BT_ERR_INVALID);
}

/* A forward-only arena (evaluation, generation) gives the training arena's
 * loss bit for bit, on a Llama stack and on a hybrid one (a kind with
 * shared state, RoPE, beside one without), whole and as a middle stage;
 * it is smaller, does not grow with depth, refuses a forward with
 * gradients, and model_mem_estimate knows its size. */
static void test_model_forward_only_arena(void)
{
    model_config_t deep = cfg_small(), hyb = cfg_small();
    deep.num_layers = 6;
    hyb.num_layers = 3;
    hyb.blocks[0] = (model_block_t){.mixer = MODEL_MIXER_ATTENTION, .ffn = MODEL_FFN_NONE};
    hyb.blocks[1] = (model_block_t){.mixer = MODEL_MIXER_NONE, .ffn = MODEL_FFN_DENSE};
    hyb.blocks[2] = (model_block_t){.mixer = MODEL_MIXER_ATTENTION, .ffn = MODEL_FFN_DENSE};
    const model_config_t *cfgs[] = {&deep, &hyb};
    int32_t ids[24], tg[24];
    for (int i = 0; i < 24; i++) ids[i] = (i * 29 + 7) % 64;
    model_targets_from_ids(tg, ids, NULL, 2, 12);
    model_batch_t batch = {.B = 2, .T = 12, .ids = ids, .targets = tg};
    for (int ci = 0; ci < 2; ci++) {
        model_t *m = NULL;
        REQUIRE(model_create(cfgs[ci], NULL, &m) == BT_OK);
        REQUIRE(model_init_random(m, 21 + (uint64_t)ci, 0.2f) == BT_OK);
        model_acts_t *tr = NULL, *fw = NULL;
        REQUIRE(model_acts_create(m, 2, 12, &tr) == BT_OK);
        REQUIRE(model_acts_create_fwd(m, 2, 12, &fw) == BT_OK);
        model_loss_t lt, lf;
        REQUIRE(model_forward_backward(m, tr, &batch, 0, &lt) == BT_OK);
        REQUIRE(model_forward_backward(m, fw, &batch, 0, &lf) == BT_OK);
        CHECK_MSG(lt.loss_sum == lf.loss_sum && lt.n_scored == lf.n_scored,
                  "config %d: training arena %.17g, forward-only %.17g", ci, lt.loss_sum,
                  lf.loss_sum);
        CHECK(lt.loss_sum > 0);
        CHECK(model_forward_backward(m, fw, &batch, 0.1f, &lf) == BT_ERR_INVALID);
        model_mem_t mm;
        model_mem_estimate(cfgs[ci], NULL, 0, 1, 2, 12, &mm);
        CHECK(mm.acts_fwd < mm.acts);
        if (ci == 0) { /* 6 layers: the training arena keeps 12 sublayers' state */
            CHECK_MSG(mm.acts_fwd < 0.5 * mm.acts, "forward-only %.0f, training %.0f",
                      mm.acts_fwd, mm.acts);
            model_config_t twice = deep;
            twice.num_layers = 12;
            model_mem_t m2;
            model_mem_estimate(&twice, NULL, 0, 1, 2, 12, &m2);
            CHECK(m2.acts_fwd == mm.acts_fwd && m2.acts > 1.5 * mm.acts);
        }
        /* a middle stage (hidden states in and out) gives the same output */
        model_stage_t mid = {.first_layer = 1, .last_layer = cfgs[ci]->num_layers - 1};
        model_t *ms = NULL;
        REQUIRE(model_create(cfgs[ci], &mid, &ms) == BT_OK);
        REQUIRE(model_init_random(ms, 5, 0.2f) == BT_OK);
        model_acts_t *mt = NULL, *mf = NULL;
        REQUIRE(model_acts_create(ms, 2, 12, &mt) == BT_OK);
        REQUIRE(model_acts_create_fwd(ms, 2, 12, &mf) == BT_OK);
        int64_t n = 2 * 12 * cfgs[ci]->hidden_size;
        float *xin = malloc((size_t)n * sizeof *xin), *o1 = malloc((size_t)n * sizeof *o1),
              *o2 = malloc((size_t)n * sizeof *o2);
        REQUIRE(xin && o1 && o2);
        for (int64_t i = 0; i < n; i++) xin[i] = (float)((i * 7919) % 201 - 100) / 100.0f;
        model_batch_t hb = {.B = 2, .T = 12};
        REQUIRE(model_stage_forward_io(ms, mt, &hb, xin, 0, o1, NULL) == BT_OK);
        REQUIRE(model_stage_forward_io(ms, mf, &hb, xin, 0, o2, NULL) == BT_OK);
        CHECK_MSG(memcmp(o1, o2, (size_t)n * sizeof *o1) == 0, "config %d: middle stage differs", ci);
        free(xin), free(o1), free(o2);
        model_acts_destroy(mt);
        model_acts_destroy(mf);
        model_destroy(ms);
        model_acts_destroy(tr);
        model_acts_destroy(fw);
        model_destroy(m);
    }
}

/* max |a - b| over max |b|: logits near zero make element-wise ratios noise */
static double max_rel_diff(const float *a, const float *b, int64_t n)
{
    double d = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs((double)a[i] - b[i]) > d) d = fabs((double)a[i] - b[i]);
        if (fabs((double)b[i]) > scale) scale = fabs((double)b[i]);
    }
    return d / scale;
}

/* A decode arena: the logits of each position, computed a few tokens at a
 * time against the K/V cache (a prefill of 5, then single tokens, then a
 * chunk of 3), match a full forward's to rounding; positions that leave a
 * gap, two rows, or gradients are refused; a re-decode from an earlier
 * position overwrites the cache from there. */
static void test_model_decode_arena(void)
{
    model_config_t c = cfg_small();
    c.num_layers = 3;
    model_t *m = NULL;
    REQUIRE(model_create(&c, NULL, &m) == BT_OK);
    REQUIRE(model_init_random(m, 77, 0.3f) == BT_OK);
    enum { T = 14 };
    int64_t V = c.vocab_size;
    int32_t ids[T], tg[T], pos[T];
    for (int i = 0; i < T; i++) ids[i] = (i * 13 + 1) % (int32_t)V, tg[i] = MODEL_IGNORE_INDEX, pos[i] = i;
    float *full = malloc((size_t)(T * V) * sizeof *full), *one = malloc((size_t)(T * V) * sizeof *one);
    REQUIRE(full && one);
    model_acts_t *fa = NULL, *da = NULL;
    REQUIRE(model_acts_create_fwd(m, 1, T, &fa) == BT_OK);
    REQUIRE(model_acts_create_decode(m, T, &da) == BT_OK);
    model_loss_t l;
    model_batch_t fb = {.B = 1, .T = T, .ids = ids, .targets = tg, .logits_out = full};
    REQUIRE(model_forward_backward(m, fa, &fb, 0, &l) == BT_OK);
    const int cuts[] = {0, 5, 6, 7, 8, 11, 12, 13, 14};
    double worst = 0;
    for (int k = 0; k + 1 < (int)(sizeof cuts / sizeof cuts[0]); k++) {
        int a0 = cuts[k], n = cuts[k + 1] - cuts[k];
        model_batch_t b = {.B = 1, .T = n, .ids = ids + a0, .targets = tg, .pos = pos + a0,
                           .logits_out = one + (int64_t)a0 * V};
        REQUIRE(model_forward_backward(m, da, &b, 0, &l) == BT_OK);
    }
    worst = max_rel_diff(one, full, T * V);
    CHECK_MSG(worst < 1e-5, "decode logits differ from the full forward's by %.3g (relative)", worst);
    /* logits_from: only the last row is copied, to logits_out[0] */
    model_batch_t lb = {.B = 1, .T = T, .ids = ids, .targets = tg, .logits_out = one,
                        .logits_from = T - 1};
    REQUIRE(model_forward_backward(m, fa, &lb, 0, &l) == BT_OK);
    CHECK(memcmp(one, full + (T - 1) * V, (size_t)V * sizeof *one) == 0);
    /* refusals */
    model_batch_t gap = {.B = 1, .T = 1, .ids = ids, .targets = tg, .pos = pos + 13};
    model_acts_t *d2 = NULL;
    REQUIRE(model_acts_create_decode(m, T, &d2) == BT_OK);
    CHECK(model_forward_backward(m, d2, &gap, 0, &l) == BT_ERR_INVALID);
    int32_t two[4] = {0, 1, 0, 1};
    model_batch_t rows2 = {.B = 2, .T = 2, .ids = ids, .targets = tg, .pos = two};
    CHECK(model_forward_backward(m, d2, &rows2, 0, &l) == BT_ERR_INVALID);
    model_batch_t grad = {.B = 1, .T = 2, .ids = ids, .targets = tg, .pos = pos};
    CHECK(model_forward_backward(m, d2, &grad, 0.5f, &l) == BT_ERR_INVALID);
    /* rewinding: decode 0..6, then again from 3 with other tokens; the logits
     * at 3..6 are those of a full forward of the new sequence */
    model_batch_t p7 = {.B = 1, .T = 7, .ids = ids, .targets = tg, .pos = pos};
    REQUIRE(model_forward_backward(m, d2, &p7, 0, &l) == BT_OK);
    int32_t alt[T];
    memcpy(alt, ids, sizeof alt);
    for (int i = 3; i < 7; i++) alt[i] = (alt[i] + 7) % (int32_t)V;
    model_batch_t re = {.B = 1, .T = 4, .ids = alt + 3, .targets = tg, .pos = pos + 3,
                        .logits_out = one};
    REQUIRE(model_forward_backward(m, d2, &re, 0, &l) == BT_OK);
    model_batch_t fb2 = {.B = 1, .T = 7, .ids = alt, .targets = tg, .logits_out = full};
    REQUIRE(model_forward_backward(m, fa, &fb2, 0, &l) == BT_OK);
    worst = max_rel_diff(one, full + 3 * V, 4 * V);
    CHECK_MSG(worst < 1e-5, "re-decoded logits differ by %.3g", worst);
    model_mem_t mm;
    model_mem_estimate(&c, NULL, 0, 1, 1, T, &mm);
    CHECK(mm.acts_decode > mm.acts_fwd);
    free(full), free(one);
    model_acts_destroy(fa);
    model_acts_destroy(da);
    model_acts_destroy(d2);
    model_destroy(m);
}

/* The fenced device catches host code that touches device memory: a model
 * there runs through the backend (a forward pass, reading a parameter back),
 * but a direct read of its parameter block dies of SIGSEGV. */
static int fenced_child(bool touch)
{
    model_config_t c = cfg_small();
    model_place_t place = model_place_host();
    place.dev = (device_t){DEV_FENCED, 0};
    model_t *m = NULL;
    if (model_create_on(&c, NULL, NULL, &place, &m) != BT_OK) return 2;
    if (model_init_random(m, 1, 0.02f) != BT_OK) return 3;
    model_acts_t *a = NULL;
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tg[8];
    model_targets_from_ids(tg, ids, NULL, 1, 8);
    model_batch_t b = {.B = 1, .T = 8, .ids = ids, .targets = tg};
    model_loss_t l;
    if (model_acts_create(m, 1, 8, &a) != BT_OK || model_forward_backward(m, a, &b, 0.1f, &l))
        return 4;
    float first;
    int e = m->embed;
    float *row = malloc((size_t)tensor_numel(&m->params[e].t) * sizeof *row);
    if (!row || model_param_read(m, e, false, row) != BT_OK) return 5;
    first = row[0];
    free(row);
    if (touch) {
        volatile float x = ((float *)m->params[e].t.data)[0]; /* the stray access */
        return x == first ? 0 : 6;
    }
    model_acts_destroy(a);
    model_destroy(m);
    return 0;
}

static void test_model_fenced_device_catches_host_access(void)
{
    for (int touch = 0; touch < 2; touch++) {
        fflush(NULL);
        pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            signal(SIGSEGV, SIG_DFL); /* no library's handler in between */
            _exit(fenced_child(touch));
        }
        int ws = 0;
        REQUIRE(waitpid(pid, &ws, 0) == pid);
        if (touch)
            CHECK_MSG(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGSEGV,
                      "a host read of fenced memory did not fault (status %#x)", ws);
        else
            CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
                      "the model did not run on the fenced device (status %#x)", ws);
    }
}

/* Bytes the heap handed out (arena in use + mmapped chunks); 0 when the
 * allocator is not glibc's (sanitizers replace it). */
static double heap_in_use(void)
{
#if defined(__SANITIZE_ADDRESS__)
    return 0;
#else
    struct mallinfo2 mi = mallinfo2();
    return (double)mi.uordblks + (double)mi.hblkhd;
#endif
}

/* model_mem_estimate is what model_create_tp and model_acts_create really
 * take: the parameter block exactly (views aligned as the model aligns
 * them), for whole models, stages and TP shares; the activation arena as
 * the heap sees it (glibc: within its chunk and page rounding). */
static void test_model_mem_estimate(void)
{
    model_config_t c = cfg_small();
    c.vocab_size = 70001; /* uneven vocabulary split, several head chunks */
    model_stage_t stages[3] = {
        {.first_layer = 0, .last_layer = 3, .has_embedding = true, .has_head = true},
        {.first_layer = 0, .last_layer = 1, .has_embedding = true, .has_head = false},
        {.first_layer = 1, .last_layer = 3, .has_embedding = false, .has_head = true},
    };
    for (int tied = 0; tied < 2; tied++)
        for (int si = 0; si < 3; si++)
            for (int tp = 1; tp <= 2; tp++)
                for (int r = 0; r < tp; r++) {
                    c.tie_word_embeddings = tied;
                    model_parallel_t par = {.tp_rank = r, .tp_size = tp};
                    int n = model_layout_tp(&c, &stages[si], &par, NULL);
                    model_param_t *ps = calloc((size_t)n, sizeof *ps);
                    REQUIRE(ps);
                    model_layout_tp(&c, &stages[si], &par, ps);
                    double elems = 0, vocab = 0;
                    for (int i = 0; i < n; i++) {
                        elems = ceil(elems / 16) * 16 + (double)tensor_numel(&ps[i].t);
                        if (ps[i].spec.global[0] == c.vocab_size) vocab += (double)tensor_numel(&ps[i].t);
                    }
                    elems = ceil(elems / 16) * 16; /* the block ends aligned too */
                    free(ps);
                    model_mem_t mm;
                    model_mem_estimate(&c, &stages[si], r, tp, 0, 0, &mm);
                    CHECK_MSG(mm.params == 4 * elems && mm.vocab_params == 4 * vocab,
                              "tied %d stage %d tp %d/%d: %.0f vs %.0f", tied, si, r, tp, mm.params,
                              4 * elems);
                    CHECK(mm.acts == 0);
                }
    c.tie_word_embeddings = false;
    model_t *m = NULL;
    REQUIRE(model_create(&c, &stages[2], &m) == BT_OK);
    model_mem_t mm;
    model_mem_estimate(&c, &stages[2], 0, 1, 3, 20, &mm);
    CHECK(mm.params == (double)m->param_bytes);
    double before = heap_in_use();
    model_acts_t *a = NULL;
    REQUIRE(model_acts_create(m, 3, 20, &a) == BT_OK);
    double used = heap_in_use() - before;
    /* 70001-row head chunks: 59 rows of logits and their gradient dominate */
    CHECK(mm.acts > 2.0 * 59 * 70001 * 4);
    if (before > 0)
        CHECK_MSG(fabs(used - mm.acts) <= 0.001 * mm.acts + 16384, "heap %.0f, estimate %.0f", used,
                  mm.acts);
    model_acts_destroy(a);
    model_destroy(m);

    /* absurd shapes give absurd numbers, not wrapped ones, and are refused */
    c = cfg_small();
    c.vocab_size = INT32_MAX;
    c.hidden_size = MODEL_MAX_HIDDEN;
    c.attn.num_heads = 1 << 12;
    c.attn.num_kv_heads = 1 << 12;
    c.attn.head_dim = 256;
    c.mlp.intermediate_size = MODEL_MAX_FFN;
    c.num_layers = MODEL_MAX_LAYERS;
    model_mem_estimate(&c, NULL, 0, 1, 1 << 20, 1 << 24, &mm);
    CHECK_MSG(mm.params > 1e16 && mm.acts > 1e23, "params %.3g acts %.3g", mm.params, mm.acts);
    CHECK(model_create(&c, NULL, &m) == BT_ERR_NOMEM);
    c.hidden_size = MODEL_MAX_HIDDEN + 1;
    CHECK(model_config_validate(&c) == BT_ERR_INVALID);
}

/* The parameters a bf16 model keeps in f32 (model.h keep_f32): on the
 * NemotronH fixture exactly each Mamba2 mixer's dt_bias, A_log, D and gated
 * norm weight (3 Mamba2 layers: 12), whole or as a TP share, and only those
 * change dtype under bf16; an f32 model on the host carves every view f32
 * with no masters. */
static bool keeps_f32_name(const char *n)
{
    static const char *suffix[] = {".mixer.dt_bias", ".mixer.A_log", ".mixer.D",
                                   ".mixer.norm.weight"};
    size_t len = strlen(n);
    for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++) {
        size_t k = strlen(suffix[i]);
        if (len > k && !strcmp(n + len - k, suffix[i])) return true;
    }
    return false;
}

static void test_model_keep_f32(void)
{
    model_config_t c;
    REQUIRE(ckpt_hf_config_load("tests/fixtures/nemotronh", &c) == BT_OK);
    for (int tp = 1; tp <= 2; tp++) {
        model_parallel_t par = {.tp_rank = tp - 1, .tp_size = tp};
        int n = model_layout_tp(&c, NULL, &par, NULL);
        model_param_t *ps = calloc((size_t)n, sizeof *ps);
        REQUIRE(ps && model_layout_tp(&c, NULL, &par, ps) == n);
        int kept = 0, wrong = 0;
        for (int i = 0; i < n; i++) {
            bool want = keeps_f32_name(ps[i].name);
            kept += ps[i].keep_f32;
            wrong += ps[i].keep_f32 != want;
            wrong += model_param_dtype(&ps[i], DT_BF16) != (want ? DT_F32 : DT_BF16);
            wrong += model_param_dtype(&ps[i], DT_F32) != DT_F32;
            CHECK_MSG(ps[i].keep_f32 == want, "tp %d: %s keep_f32 %d", tp, ps[i].name,
                      (int)ps[i].keep_f32);
        }
        CHECK_MSG(kept == 12 && wrong == 0, "tp %d: %d kept in f32 (want 12), %d wrong", tp, kept,
                  wrong);
        free(ps);
    }
    model_t *m = NULL;
    REQUIRE(model_create(&c, NULL, &m) == BT_OK);
    int kept = 0;
    for (int i = 0; i < m->n_params; i++) {
        kept += m->params[i].keep_f32;
        CHECK(m->params[i].t.dtype == DT_F32);
    }
    CHECK(kept == 12 && !m->masters && !m->master_mem);
    model_destroy(m);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_model_block_layout, test_model_stage_init, test_model_init_threads,
             test_model_positions_and_errors, test_model_head_chunks,
             test_model_hybrid_blocks, test_model_forward_only_arena, test_model_decode_arena,
             test_model_fenced_device_catches_host_access,
             test_model_mem_estimate, test_model_keep_f32);
}
