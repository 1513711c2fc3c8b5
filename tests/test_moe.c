/* Routed experts (model/moe.c) beyond the fixtures' forward and backward
 * (tests/test_model_hf.c): what the HF configs of Mixtral and Qwen2-MoE set,
 * the configs refused (each error names its field), the capacity factor
 * (dropless unless set; drops counted; the gradient still the loss's),
 * export and re-import, pipeline stages, the fenced device, decoding, and
 * training against the PyTorch reference loop (tests/fixtures/train_qwen2_moe,
 * tools/gen_moe_train_fixture.py). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "ckpt/hf.h"
#include "ckpt/safetensors.h"
#include "kernels/kernels.h"
#include "launch/job.h"
#include "launch/run_setup.h"
#include "model/flops.h"
#include "model/kind.h"
#include "model/model.h"
#include "tests/helpers/capture.h"
#include "tests/test.h"
#include "train/train.h"

#define FIX "tests/fixtures/"

/* ---- helpers ----------------------------------------------------------------- */

typedef struct {
    int32_t ids[3][20], tg[3][20];
    int64_t len[3], n_scored;
} seqs_t;

/* the fixture's three sequences (ids.txt) */
static int seqs_load(const char *fixture, seqs_t *s)
{
    char path[256];
    snprintf(path, sizeof path, FIX "%s/ids.txt", fixture);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 3; i++) {
        char line[512];
        if (!fgets(line, sizeof line, f)) break;
        char *p = line, *end;
        while (s->len[i] < 20 && (s->ids[i][s->len[i]] = (int32_t)strtol(p, &end, 10), end != p)) {
            s->len[i]++;
            p = end;
        }
        model_targets_from_ids(s->tg[i], s->ids[i], NULL, 1, s->len[i]);
        s->n_scored += s->len[i] - 1;
    }
    fclose(f);
    return 0;
}

/* The pooled loss of the sequences (forward and, with grads, backward of
 * its mean, the gradients accumulated into m's). */
static double seqs_loss(model_t *m, const seqs_t *s, bool grads)
{
    model_acts_t *a = NULL;
    bt_status_t st = grads ? model_acts_create(m, 1, 20, &a) : model_acts_create_fwd(m, 1, 20, &a);
    if (st != BT_OK) return NAN;
    double sum = 0;
    for (int i = 0; i < 3; i++) {
        model_batch_t b = {.B = 1, .T = s->len[i], .ids = s->ids[i], .targets = s->tg[i]};
        model_loss_t l;
        if (model_forward_backward(m, a, &b, grads ? 1.0f / (float)s->n_scored : 0, &l)) {
            sum = NAN;
            break;
        }
        sum += l.loss_sum;
    }
    model_acts_destroy(a);
    return sum / (double)s->n_scored;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *t = malloc((size_t)n + 1);
    if (t && fread(t, 1, (size_t)n, f) != (size_t)n) {
        free(t);
        t = NULL;
    }
    if (t) t[n] = 0;
    fclose(f);
    return t;
}

/* ---- configs ------------------------------------------------------------------ */

static void test_moe_config_fields(void)
{
    model_config_t c;
    REQUIRE(ckpt_hf_config_load(FIX "mixtral", &c) == BT_OK);
    CHECK(c.arch == MODEL_ARCH_MIXTRAL && !c.attn.qkv_bias && !c.attn.o_bias);
    CHECK(c.moe.n_experts == 4 && c.moe.top_k == 2 && c.moe.expert_ffn == 48);
    CHECK(c.moe.shared_ffn == 0 && c.moe.norm_topk && c.moe.aux_loss_coef == 0.05);
    CHECK(c.moe.capacity_factor == 0 && c.moe.router == MODEL_ROUTER_SOFTMAX_TOPK);
    for (int l = 0; l < 2; l++) CHECK(c.blocks[l].ffn == MODEL_FFN_MOE);
    REQUIRE(ckpt_hf_config_load(FIX "qwen2_moe", &c) == BT_OK);
    CHECK(c.arch == MODEL_ARCH_QWEN2_MOE && c.attn.qkv_bias && !c.attn.o_bias);
    CHECK(c.moe.n_experts == 8 && c.moe.top_k == 2 && c.moe.expert_ffn == 24);
    CHECK(c.moe.shared_ffn == 40 && !c.moe.norm_topk && c.moe.aux_loss_coef == 0);
    CHECK(c.mlp.intermediate_size == 64);
    /* mlp_only_layers [1] */
    CHECK(c.blocks[0].ffn == MODEL_FFN_MOE && c.blocks[1].ffn == MODEL_FFN_DENSE &&
          c.blocks[2].ffn == MODEL_FFN_MOE);
    REQUIRE(ckpt_hf_config_load(FIX "qwen2_moe_norm", &c) == BT_OK);
    CHECK(c.moe.top_k == 3 && c.moe.norm_topk && c.moe.aux_loss_coef == 0.02);
    /* decoder_sparse_step 2: layers 1 and 3 */
    for (int l = 0; l < 4; l++) CHECK(c.blocks[l].ffn == (l % 2 ? MODEL_FFN_MOE : MODEL_FFN_DENSE));
    /* the stacked experts and their per-expert names */
    model_t *m = NULL;
    REQUIRE(ckpt_hf_load(FIX "mixtral", NULL, &m) == BT_OK);
    int i = model_param_find(m, "model.layers.1.block_sparse_moe.experts.*.w2.weight");
    REQUIRE(i >= 0);
    CHECK(m->params[i].spec.ndim == 3 && m->params[i].spec.global[0] == 4 &&
          m->params[i].spec.global[1] == 32 && m->params[i].spec.global[2] == 48);
    char hf[96];
    int64_t e = -1;
    CHECK(model_name_unstack(m->params[i].name, 3, hf, sizeof hf) &&
          !strcmp(hf, "model.layers.1.block_sparse_moe.experts.3.w2.weight"));
    CHECK(model_name_stack_index(m->params[i].name, hf, &e) && e == 3);
    CHECK(!model_name_stack_index(m->params[i].name, "model.layers.1.block_sparse_moe.experts.03.w2.weight", &e));
    CHECK(!model_name_stack_index(m->params[i].name, "model.layers.1.block_sparse_moe.experts..w2.weight", &e));
    CHECK(!model_name_stack_index(m->params[i].name, "model.layers.1.block_sparse_moe.experts.x.w2.weight", &e));
    CHECK(model_param_find(m, "model.layers.0.block_sparse_moe.gate.weight") >= 0);
    model_destroy(m);
}

static const char mixtral_base[] =
    "\"architectures\": [\"MixtralForCausalLM\"], \"vocab_size\": 64, \"hidden_size\": 16, "
    "\"intermediate_size\": 24, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
    "\"num_key_value_heads\": 1, \"num_local_experts\": 4, \"num_experts_per_tok\": 2";
static const char qwen_base[] =
    "\"architectures\": [\"Qwen2MoeForCausalLM\"], \"vocab_size\": 64, \"hidden_size\": 16, "
    "\"intermediate_size\": 24, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
    "\"num_key_value_heads\": 1, \"num_experts\": 4, \"num_experts_per_tok\": 2, "
    "\"moe_intermediate_size\": 8, \"shared_expert_intermediate_size\": 12";

/* {base, extra}: parsed, refused with `want`, and the message holds `needle` */
static void config_refused(const char *base, const char *extra, bt_status_t want, const char *needle)
{
    char text[1024];
    snprintf(text, sizeof text, "{%s%s%s}", base, extra[0] ? ", " : "", extra);
    model_config_t c;
    test_capture_t cap;
    test_capture_begin(&cap);
    bt_status_t st = ckpt_hf_config_parse(text, strlen(text), "moe.json", &c);
    char *msg = test_capture_end(&cap);
    CHECK_MSG(st == want, "%s: %s, expected %s", extra, bt_status_str(st), bt_status_str(want));
    CHECK_MSG(strstr(msg, needle) != NULL, "%s: message '%s' lacks '%s'", extra, msg, needle);
    free(msg);
}

static void test_moe_config_errors(void)
{
    model_config_t c;
    char text[1024];
    snprintf(text, sizeof text, "{%s}", mixtral_base);
    REQUIRE(ckpt_hf_config_parse(text, strlen(text), "moe.json", &c) == BT_OK);
    snprintf(text, sizeof text, "{%s}", qwen_base);
    REQUIRE(ckpt_hf_config_parse(text, strlen(text), "moe.json", &c) == BT_OK);
    CHECK(c.moe.aux_loss_coef == 0); /* output_router_logits defaults to false */
    config_refused(mixtral_base, "\"num_experts_per_tok\": 5", BT_ERR_INVALID,
                   "num_experts_per_tok=5 must be in [1, num_local_experts=4]");
    config_refused(mixtral_base, "\"num_local_experts\": 0", BT_ERR_INVALID,
                   "num_local_experts=0 must be in [1, 4096]");
    config_refused(mixtral_base, "\"num_local_experts\": 5000", BT_ERR_INVALID,
                   "num_local_experts=5000");
    config_refused(qwen_base, "\"num_experts\": -1", BT_ERR_INVALID, "num_experts=-1 must be >= 0");
    config_refused(qwen_base, "\"num_experts\": 4096, \"moe_intermediate_size\": 8192", BT_ERR_INVALID,
                   "num_experts=4096 x moe_intermediate_size=8192 experts' rows exceed 16777216");
    config_refused(qwen_base, "\"num_experts_per_tok\": 0", BT_ERR_INVALID,
                   "num_experts_per_tok=0 must be in [1, num_experts=4]");
    config_refused(qwen_base, "\"moe_intermediate_size\": 0", BT_ERR_INVALID,
                   "moe_intermediate_size=0");
    config_refused(qwen_base, "\"shared_expert_intermediate_size\": 0", BT_ERR_UNSUPPORTED,
                   "shared_expert_intermediate_size=0");
    config_refused(qwen_base, "\"decoder_sparse_step\": 0", BT_ERR_INVALID,
                   "decoder_sparse_step=0 must be >= 1");
    config_refused(qwen_base, "\"mlp_only_layers\": [0, 2]", BT_ERR_INVALID,
                   "mlp_only_layers[1] is not a layer index in [0, num_hidden_layers=2)");
    config_refused(qwen_base, "\"mlp_only_layers\": 1", BT_ERR_INVALID, "mlp_only_layers must be");
    config_refused(mixtral_base, "\"scoring_func\": \"sigmoid\"", BT_ERR_UNSUPPORTED,
                   "scoring_func='sigmoid' is not supported");
    config_refused(qwen_base, "\"topk_method\": \"noaux_tc\"", BT_ERR_UNSUPPORTED,
                   "topk_method='noaux_tc' is not supported");
    config_refused(mixtral_base, "\"capacity_factor\": -1", BT_ERR_INVALID,
                   "capacity_factor=-1 must be a finite number >= 0");
    config_refused(mixtral_base, "\"router_aux_loss_coef\": -0.5, \"output_router_logits\": true",
                   BT_ERR_INVALID, "router_aux_loss_coef=-0.5");
    config_refused(mixtral_base, "\"num_experts_per_tok\": 1.5", BT_ERR_INVALID,
                   "'num_experts_per_tok' must be an integer");
    config_refused(qwen_base, "\"norm_topk_prob\": 1", BT_ERR_INVALID,
                   "'norm_topk_prob' must be true or false");
    /* a router type the kind does not know; TP is fine with and without a
     * capacity (each TP rank dispatches its rows within its share of every
     * expert's budget, model/moe.c moe_caps) */
    snprintf(text, sizeof text, "{%s}", mixtral_base);
    REQUIRE(ckpt_hf_config_parse(text, strlen(text), "moe.json", &c) == BT_OK);
    test_capture_t cap;
    test_capture_begin(&cap);
    c.moe.router = MODEL_ROUTER_COUNT;
    bt_status_t st = model_config_validate(&c);
    c.moe.router = MODEL_ROUTER_SOFTMAX_TOPK;
    c.attn.num_kv_heads = 2; /* attention splits over 2 ranks */
    bt_status_t st_tp_ok = model_config_kinds_validate(&c, 2);
    c.moe.capacity_factor = 1.5;
    bt_status_t st_tp = model_config_kinds_validate(&c, 2);
    char *msg = test_capture_end(&cap);
    CHECK(st == BT_ERR_INVALID && st_tp == BT_OK && st_tp_ok == BT_OK);
    CHECK_MSG(strstr(msg, "unknown router type"), "%s", msg);
    free(msg);
}

/* Qwen3-MoE: transformers reads num_experts as num_local_experts (and
 * saves it so); no shared expert; num_experts 0 (as in Qwen2-MoE) makes
 * every layer dense */
static void test_moe_config_qwen3(void)
{
    model_config_t c;
    REQUIRE(ckpt_hf_config_load(FIX "qwen3_moe", &c) == BT_OK);
    CHECK(c.arch == MODEL_ARCH_QWEN3_MOE && c.attn.qkv_bias && c.attn.o_bias && c.attn.qk_norm);
    CHECK(c.moe.n_experts == 6 && c.moe.top_k == 2 && c.moe.expert_ffn == 20);
    CHECK(c.moe.shared_ffn == 0 && c.moe.norm_topk && c.moe.aux_loss_coef == 0.02);
    CHECK(c.attn.head_dim == 16 && c.mlp.intermediate_size == 56);
    CHECK(c.blocks[0].ffn == MODEL_FFN_MOE && c.blocks[1].ffn == MODEL_FFN_DENSE &&
          c.blocks[2].ffn == MODEL_FFN_MOE);
    static const char base[] =
        "\"architectures\": [\"Qwen3MoeForCausalLM\"], \"vocab_size\": 64, \"hidden_size\": 16, "
        "\"intermediate_size\": 24, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 1, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8";
    char text[1024];
    /* the spelling of Qwen's own configs */
    snprintf(text, sizeof text, "{%s, \"num_experts\": 5}", base);
    REQUIRE(ckpt_hf_config_parse(text, strlen(text), "moe.json", &c) == BT_OK);
    CHECK(c.moe.n_experts == 5 && c.attn.head_dim == 8 && !c.attn.qkv_bias && c.attn.qk_norm);
    CHECK(c.blocks[0].ffn == MODEL_FFN_MOE && c.blocks[1].ffn == MODEL_FFN_MOE);
    snprintf(text, sizeof text, "{%s, \"num_experts\": 5, \"num_local_experts\": 5}", base);
    REQUIRE(ckpt_hf_config_parse(text, strlen(text), "moe.json", &c) == BT_OK);
    CHECK(c.moe.n_experts == 5);
    config_refused(base, "\"num_experts\": 5, \"num_local_experts\": 4", BT_ERR_INVALID,
                   "num_local_experts=4 and num_experts=5 disagree");
    /* transformers' defaults: 128 experts */
    snprintf(text, sizeof text, "{%s}", base);
    REQUIRE(ckpt_hf_config_parse(text, strlen(text), "moe.json", &c) == BT_OK);
    CHECK(c.moe.n_experts == 128);
    snprintf(text, sizeof text, "{%s, \"num_experts\": 0}", base);
    REQUIRE(ckpt_hf_config_parse(text, strlen(text), "moe.json", &c) == BT_OK);
    CHECK(c.blocks[0].ffn == MODEL_FFN_DENSE && c.blocks[1].ffn == MODEL_FFN_DENSE);
    /* a sliding window applies to every layer when used */
    snprintf(text, sizeof text, "{%s, \"use_sliding_window\": true, \"sliding_window\": 32}", base);
    REQUIRE(ckpt_hf_config_parse(text, strlen(text), "moe.json", &c) == BT_OK);
    CHECK(c.attn.sliding_window == 32);
    snprintf(text, sizeof text, "{%s, \"use_sliding_window\": false, \"sliding_window\": 32}", base);
    REQUIRE(ckpt_hf_config_parse(text, strlen(text), "moe.json", &c) == BT_OK);
    CHECK(c.attn.sliding_window == 0);
    /* Mixtral reads num_experts as its num_local_experts too */
    snprintf(text, sizeof text,
             "{\"architectures\": [\"MixtralForCausalLM\"], \"vocab_size\": 64, \"hidden_size\": 16, "
             "\"intermediate_size\": 24, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
             "\"num_experts\": 3, \"num_experts_per_tok\": 2}");
    REQUIRE(ckpt_hf_config_parse(text, strlen(text), "moe.json", &c) == BT_OK);
    CHECK(c.moe.n_experts == 3);
}

/* ---- capacity --------------------------------------------------------------------- */

/* Whether parameter `name` is in the direction of directional_check: the
 * last sparse layer's experts (routed and shared) and the head. Moving them
 * moves no router's input, so no token changes experts (the loss is smooth
 * there: a top-K flip would be a jump). */
static bool after_routing(const char *name)
{
    return strstr(name, "layers.2.mlp.experts.") || strstr(name, "layers.2.mlp.shared_expert.") ||
           !strcmp(name, "lm_head.weight") || !strcmp(name, "model.norm.weight");
}

/* The gradient of the pooled loss against a central difference along
 * itself, restricted to after_routing's parameters: (L(p + h u) - L(p - h u))
 * / 2h with u = g / |g| must be |g|. One direction through all of them
 * checks their whole backward, and the difference (|g| h) stands well above
 * the loss's fp32 rounding. */
static double directional_check(model_t *m, const seqs_t *s, double h)
{
    model_grads_zero(m);
    seqs_loss(m, s, true);
    float **p0 = calloc((size_t)m->n_params, sizeof *p0), **g = calloc((size_t)m->n_params, sizeof *g);
    double norm = 0;
    for (int i = 0; i < m->n_params; i++) {
        int64_t n = tensor_numel(&m->params[i].t);
        p0[i] = malloc((size_t)n * sizeof(float));
        g[i] = calloc((size_t)n, sizeof(float));
        model_param_read(m, i, false, p0[i]);
        if (!after_routing(m->params[i].name)) continue;
        model_param_read(m, i, true, g[i]);
        for (int64_t j = 0; j < n; j++) norm += (double)g[i][j] * g[i][j];
    }
    norm = sqrt(norm);
    double l[2];
    for (int side = 0; side < 2; side++) {
        double step = (side ? -h : h) / norm;
        for (int i = 0; i < m->n_params; i++) {
            int64_t n = tensor_numel(&m->params[i].t);
            float *q = malloc((size_t)n * sizeof *q);
            for (int64_t j = 0; j < n; j++) q[j] = (float)((double)p0[i][j] + step * g[i][j]);
            model_param_write(m, i, q);
            free(q);
        }
        l[side] = seqs_loss(m, s, false);
    }
    for (int i = 0; i < m->n_params; i++) {
        model_param_write(m, i, p0[i]);
        free(p0[i]);
        free(g[i]);
    }
    free(p0);
    free(g);
    double fd = (l[0] - l[1]) / (2 * h);
    return fabs(fd - norm) / norm;
}

static void test_moe_capacity(void)
{
    seqs_t s;
    REQUIRE(seqs_load("qwen2_moe", &s) == 0);
    model_t *m = NULL;
    REQUIRE(ckpt_hf_load(FIX "qwen2_moe", NULL, &m) == BT_OK);
    double dropless = seqs_loss(m, &s, false);
    CHECK(m->moe_dropped == 0);
    /* E / K = 4: the capacity is at least the tokens, and a token picks an
     * expert once, so nothing is dropped and the bits are the dropless ones */
    m->cfg.moe.capacity_factor = 4.0;
    double roomy = seqs_loss(m, &s, false);
    CHECK(roomy == dropless && m->moe_dropped == 0);
    /* tighter: choices past an expert's capacity are dropped and counted */
    m->cfg.moe.capacity_factor = 1.0;
    double tight = seqs_loss(m, &s, false);
    int64_t d1 = m->moe_dropped;
    m->cfg.moe.capacity_factor = 0.5;
    m->moe_dropped = 0;
    double tighter = seqs_loss(m, &s, false);
    int64_t d2 = m->moe_dropped;
    printf("  dropless %.7f, capacity 1.0: %.7f (%lld dropped), 0.5: %.7f (%lld dropped)\n",
           dropless, tight, (long long)d1, tighter, (long long)d2);
    CHECK(d1 > 0 && d2 > d1 && isfinite(tight) && isfinite(tighter));
    CHECK(tight != dropless && tighter != tight);
    /* at most (N*K - E*cap) per layer and forward: 2 sparse layers, 3 sequences */
    int64_t bound = 0;
    for (int i = 0; i < 3; i++) {
        int64_t NK = s.len[i] * 2, cap = (int64_t)ceil(0.5 * (double)NK / 8);
        bound += 2 * (NK - (cap < NK ? cap : NK));
    }
    CHECK(d2 <= bound);
    /* the backward is the gradient of the loss with drops as without */
    double err = directional_check(m, &s, 1e-3);
    printf("  capacity 0.5: directional derivative vs |grad| rel %.2e\n", err);
    CHECK(err < 1e-3);
    m->cfg.moe.capacity_factor = 0;
    err = directional_check(m, &s, 1e-3);
    printf("  dropless: directional derivative vs |grad| rel %.2e\n", err);
    CHECK(err < 1e-3);
    model_destroy(m);
}

/* ---- export, stages, devices, decoding ------------------------------------------------ */

static void test_moe_export_roundtrip(void)
{
    const char *fx[] = {"mixtral", "qwen2_moe_norm", "qwen2_moe"};
    for (int f = 0; f < 3; f++) {
        char dir[256], out[] = "/tmp/baton-moe-export-XXXXXX";
        snprintf(dir, sizeof dir, FIX "%s", fx[f]);
        REQUIRE(mkdtemp(out));
        char tgt[300];
        snprintf(tgt, sizeof tgt, "%s/model", out);
        model_t *m = NULL, *back = NULL;
        REQUIRE(ckpt_hf_load(dir, NULL, &m) == BT_OK);
        REQUIRE(ckpt_hf_save(m, tgt) == BT_OK);
        /* the same tensor names and shapes as transformers wrote */
        char p1[320], p2[320];
        snprintf(p1, sizeof p1, "%s/model.safetensors", dir);
        snprintf(p2, sizeof p2, "%s/model.safetensors", tgt);
        ckpt_st_file_t *a = NULL, *b = NULL;
        REQUIRE(ckpt_st_open(p1, &a) == BT_OK && ckpt_st_open(p2, &b) == BT_OK);
        CHECK_MSG(a->n == b->n, "%s: %d tensors exported, %d in the fixture", fx[f], b->n, a->n);
        for (int i = 0; i < a->n; i++) {
            const ckpt_st_tensor_t *t = ckpt_st_find(b, a->tensors[i].name);
            CHECK_MSG(t && t->numel == a->tensors[i].numel && t->ndim == a->tensors[i].ndim &&
                          !memcmp(t->data, a->tensors[i].data, (size_t)t->numel * 4),
                      "%s: %s not exported as it was read", fx[f], a->tensors[i].name);
        }
        ckpt_st_close(a);
        ckpt_st_close(b);
        /* the config reads back to the same model */
        model_config_t c;
        REQUIRE(ckpt_hf_config_load(tgt, &c) == BT_OK);
        CHECK(c.arch == m->cfg.arch && c.moe.n_experts == m->cfg.moe.n_experts &&
              c.moe.top_k == m->cfg.moe.top_k && c.moe.expert_ffn == m->cfg.moe.expert_ffn &&
              c.moe.shared_ffn == m->cfg.moe.shared_ffn && c.moe.norm_topk == m->cfg.moe.norm_topk &&
              c.moe.aux_loss_coef == m->cfg.moe.aux_loss_coef &&
              c.attn.qkv_bias == m->cfg.attn.qkv_bias &&
              c.mlp.intermediate_size == m->cfg.mlp.intermediate_size);
        for (int64_t l = 0; l < c.num_layers; l++) CHECK(c.blocks[l].ffn == m->cfg.blocks[l].ffn);
        REQUIRE(ckpt_hf_load(tgt, NULL, &back) == BT_OK);
        CHECK(back->n_params == m->n_params && back->param_bytes == m->param_bytes &&
              !memcmp(back->param_mem, m->param_mem, m->param_bytes));
        char cpath[320];
        snprintf(cpath, sizeof cpath, "%s/config.json", tgt);
        char *cfgtext = read_text(cpath);
        CHECK(cfgtext && strstr(cfgtext, f == 0 ? "\"num_local_experts\": 4" : "\"num_experts\""));
        free(cfgtext);
        model_destroy(back);
        model_destroy(m);
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
        CHECK(system(cmd) == 0);
    }
}

/* Two pipeline stages by hand, [0, split) and [split, layers), give the
 * whole model's loss and the same gradients bit for bit: qwen2_moe (no
 * load-balancing loss, nothing travels beside the activations) and mixtral
 * (the loss on: the first stage's sums go forward, the head's gradient per
 * expert back, model_acts_aux). carry false: mixtral's sums are not handed
 * on, and the loss comes out otherwise (the head sees one layer of two). */
static void stages_run(const char *fx, int split, bool carry, bool *same_grads)
{
    seqs_t s;
    *same_grads = false;
    REQUIRE(seqs_load(fx, &s) == 0);
    char dir[256];
    snprintf(dir, sizeof dir, FIX "%s", fx);
    model_t *whole = NULL, *st[2] = {0};
    REQUIRE(ckpt_hf_load(dir, NULL, &whole) == BT_OK);
    double want = seqs_loss(whole, &s, true);
    model_stage_t s0 = {.first_layer = 0, .last_layer = split, .has_embedding = true};
    model_stage_t s1 = {.first_layer = split, .last_layer = (int)whole->cfg.num_layers, .has_head = true};
    REQUIRE(ckpt_hf_load(dir, &s0, &st[0]) == BT_OK);
    REQUIRE(ckpt_hf_load(dir, &s1, &st[1]) == BT_OK);
    int64_t nf = model_aux_len(st[0], false), nb = model_aux_len(st[0], true);
    CHECK(nf == model_aux_len(st[1], false) && nb == model_aux_len(st[1], true));
    model_acts_t *a0 = NULL, *a1 = NULL;
    REQUIRE(model_acts_create(st[0], 1, 20, &a0) == BT_OK);
    REQUIRE(model_acts_create(st[1], 1, 20, &a1) == BT_OK);
    int64_t C = whole->cfg.hidden_size;
    float *x = malloc((size_t)(20 * C) * 4), *dx = malloc((size_t)(20 * C) * 4);
    double sum = 0;
    float dloss = 1.0f / (float)s.n_scored;
    for (int i = 0; i < 3; i++) {
        model_batch_t b = {.B = 1, .T = s.len[i], .ids = s.ids[i], .targets = s.tg[i]};
        model_loss_t l;
        REQUIRE(model_stage_forward_io(st[0], a0, &b, NULL, dloss, x, NULL) == BT_OK);
        if (nf && carry) memcpy(model_acts_aux(a1, false), model_acts_aux(a0, false), (size_t)nf * 8);
        else if (nf) memset(model_acts_aux(a1, false), 0, (size_t)nf * 8);
        REQUIRE(model_stage_forward_io(st[1], a1, &b, x, dloss, NULL, &l) == BT_OK);
        REQUIRE(model_stage_backward_io(st[1], a1, NULL, dx) == BT_OK);
        if (nb) memcpy(model_acts_aux(a0, true), model_acts_aux(a1, true), (size_t)nb * 8);
        REQUIRE(model_stage_backward_io(st[0], a0, dx, NULL) == BT_OK);
        sum += l.loss_sum;
    }
    /* every gradient the same bits as the whole model's */
    int same = 0, n = 0;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < st[k]->n_params; i++, n++) {
            int w = model_param_find(whole, st[k]->params[i].name);
            same += w >= 0 && !memcmp(st[k]->grads[i].t.data, whole->grads[w].t.data,
                                      tensor_nbytes(&st[k]->grads[i].t));
        }
    *same_grads = same == n;
    if (carry) CHECK_MSG(same == n, "%s: %d of %d stage gradients equal the whole model's", fx, same, n);
    double got = sum / (double)s.n_scored;
    printf("  %s in stages [0,%d) [%d,%lld)%s: loss %.9f, whole model %.9f, %d of %d gradients "
           "the same bits\n", fx, split, split, (long long)whole->cfg.num_layers,
           carry ? "" : " (sums not handed on)", got, want, same, n);
    if (carry) CHECK_MSG(got == want, "%s: stages %.9g, whole %.9g", fx, got, want);
    else CHECK_MSG(fabs(got - want) > 1e-6, "%s: without the carry %.9g, whole %.9g", fx, got, want);
    free(x);
    free(dx);
    model_acts_destroy(a0);
    model_acts_destroy(a1);
    model_destroy(st[0]);
    model_destroy(st[1]);
    model_destroy(whole);
}

static void test_moe_stages(void)
{
    bool same;
    stages_run("qwen2_moe", 2, true, &same);
    stages_run("mixtral", 1, true, &same);
    stages_run("mixtral", 1, false, &same);
    CHECK(!same); /* the routers' gradients differ too */
    /* the lengths: nothing without the term, 2E + 2 and E with it */
    model_t *q = NULL, *mx = NULL;
    REQUIRE(ckpt_hf_load(FIX "qwen2_moe", NULL, &q) == BT_OK);
    REQUIRE(ckpt_hf_load(FIX "mixtral", NULL, &mx) == BT_OK);
    CHECK(model_aux_len(q, false) == 0 && model_aux_len(q, true) == 0);
    CHECK(model_aux_len(mx, false) == 10 && model_aux_len(mx, true) == 4);
    model_destroy(q);
    model_destroy(mx);
}

/* On the fenced device (host code never touches device memory) the same
 * loss and gradients, bit for bit, as on the CPU. */
static void test_moe_fenced(void)
{
    const char *fx[] = {"mixtral", "qwen2_moe"};
    for (int f = 0; f < 2; f++) {
        char dir[256];
        snprintf(dir, sizeof dir, FIX "%s", fx[f]);
        seqs_t s;
        REQUIRE(seqs_load(fx[f], &s) == 0);
        model_place_t place = model_place_host();
        place.dev = (device_t){DEV_FENCED, 0};
        model_t *cpu = NULL, *fen = NULL;
        REQUIRE(ckpt_hf_load(dir, NULL, &cpu) == BT_OK);
        REQUIRE(ckpt_hf_load_part(dir, NULL, NULL, &place, &fen) == BT_OK);
        cpu->cfg.moe.capacity_factor = fen->cfg.moe.capacity_factor = 1.0; /* drops too */
        double lc = seqs_loss(cpu, &s, true), lf = seqs_loss(fen, &s, true);
        CHECK_MSG(lc == lf, "%s: cpu %.9g fenced %.9g", fx[f], lc, lf);
        CHECK(cpu->moe_dropped == fen->moe_dropped);
        int same = 0;
        for (int i = 0; i < cpu->n_params; i++) {
            int64_t n = tensor_numel(&cpu->grads[i].t);
            float *g = malloc((size_t)n * sizeof *g);
            REQUIRE(model_param_read(fen, i, true, g) == BT_OK);
            same += !memcmp(g, cpu->grads[i].t.data, (size_t)n * sizeof *g);
            free(g);
        }
        CHECK_MSG(same == cpu->n_params, "%s: %d of %d gradients equal", fx[f], same,
                  cpu->n_params);
        model_destroy(cpu);
        model_destroy(fen);
    }
}

/* Decoding with a KV cache: the logits of chunks and single tokens are those
 * of one forward over the whole sequence (dropless routing is per token). */
static void test_moe_decode(void)
{
    seqs_t s;
    REQUIRE(seqs_load("qwen2_moe_norm", &s) == 0);
    model_t *m = NULL;
    REQUIRE(ckpt_hf_load(FIX "qwen2_moe_norm", NULL, &m) == BT_OK);
    enum { T = 20 };
    int64_t V = m->cfg.vocab_size;
    int32_t tg[T], pos[T];
    for (int i = 0; i < T; i++) tg[i] = MODEL_IGNORE_INDEX, pos[i] = i;
    float *full = malloc((size_t)(T * V) * 4), *one = malloc((size_t)(T * V) * 4);
    model_acts_t *fa = NULL, *da = NULL;
    REQUIRE(model_acts_create_fwd(m, 1, T, &fa) == BT_OK);
    REQUIRE(model_acts_create_decode(m, T, &da) == BT_OK);
    model_loss_t l;
    model_batch_t fb = {.B = 1, .T = T, .ids = s.ids[0], .targets = tg, .logits_out = full};
    REQUIRE(model_forward_backward(m, fa, &fb, 0, &l) == BT_OK);
    const int cuts[] = {0, 6, 7, 8, 13, 14, 20};
    for (int k = 0; k + 1 < (int)(sizeof cuts / sizeof cuts[0]); k++) {
        int a0 = cuts[k], n = cuts[k + 1] - cuts[k];
        model_batch_t b = {.B = 1, .T = n, .ids = s.ids[0] + a0, .targets = tg, .pos = pos + a0,
                           .logits_out = one + (int64_t)a0 * V};
        REQUIRE(model_forward_backward(m, da, &b, 0, &l) == BT_OK);
    }
    double md = 0, mb = 0;
    for (int64_t i = 0; i < T * V; i++) {
        md = fmax(md, fabs((double)one[i] - full[i]));
        mb = fmax(mb, fabs((double)full[i]));
    }
    CHECK_MSG(md <= 1e-5 * mb, "decode logits differ by %.3g of %.3g", md, mb);
    free(full);
    free(one);
    model_acts_destroy(fa);
    model_acts_destroy(da);
    model_destroy(m);
}

/* What the memory estimate says is what is allocated. */
static void test_moe_mem_estimate(void)
{
    const char *fx[] = {"mixtral", "qwen2_moe"};
    for (int f = 0; f < 2; f++) {
        char dir[256];
        snprintf(dir, sizeof dir, FIX "%s", fx[f]);
        model_config_t c;
        REQUIRE(ckpt_hf_config_load(dir, &c) == BT_OK);
        model_t *m = NULL;
        REQUIRE(model_create(&c, NULL, &m) == BT_OK);
        model_mem_t mm;
        model_mem_estimate(&c, NULL, 0, 1, 2, 16, &mm);
        CHECK(mm.params == (double)m->param_bytes);
        CHECK(mm.acts > mm.acts_fwd && mm.acts_fwd > 0);
        int64_t n = model_num_params(&c);
        CHECK(n == (f == 0 ? 59808 : 77280)); /* as transformers counts them */
        model_destroy(m);
    }
}

/* FLOPs count the active parameters (model/flops.h): mixtral's two layers
 * of attention (q, o 32x32; k, v 32x16) and experts (the router 32x4, top-2
 * of 3 matrices 32x48), and the head 256x32. */
static void test_moe_flops(void)
{
    model_config_t c;
    REQUIRE(ckpt_hf_config_load(FIX "mixtral", &c) == BT_OK);
    model_flops_t f;
    model_flops_count(&c, 16, &f);
    double layer = 2 * 32 * 32 + 2 * 32 * 16 + 32 * 4 + 2 * 3 * 32 * 48;
    CHECK_MSG(f.matmul_params == 2 * layer + 256 * 32, "matmul_params %.0f", f.matmul_params);
    CHECK(f.attn_fma == 2 * 32 * 16);
    REQUIRE(ckpt_hf_config_load(FIX "qwen2_moe", &c) == BT_OK);
    model_flops_count(&c, 16, &f);
    /* layers 0, 2 sparse (router 32x8, top-2 of 32x24 x3, shared 32x40 x3 and its
     * gate 32), layer 1 dense (32x64 x3); attention q, o 32x32, k, v 32x16 */
    double attn = 2 * 32 * 32 + 2 * 32 * 16;
    double sparse = 32 * 8 + 2 * 3 * 32 * 24 + 3 * 32 * 40 + 32, dense = 3 * 32 * 64;
    CHECK_MSG(f.matmul_params == 3 * attn + 2 * sparse + dense + 256 * 32, "matmul_params %.0f",
              f.matmul_params);
}

/* ---- training -------------------------------------------------------------------------- */

#define TRAIN FIX "train_qwen2_moe"

static double jnum(json_t *o, const char *key) { return json_number_value(json_object_get(o, key)); }

static void test_moe_train_matches_torch(void)
{
    json_error_t jerr;
    json_t *ex = json_load_file(TRAIN "/expected.json", 0, &jerr);
    REQUIRE(ex);
    json_t *hp = json_object_get(ex, "hyper"), *betas = json_object_get(hp, "betas");
    char yaml[2048], err[JOB_ERR_MAX];
    snprintf(yaml, sizeof yaml,
             "model: {hf: " TRAIN "}\n"
             "data: {dir: " TRAIN ", seq_len: %lld, split: 0}\n"
             "train: {steps: %lld, micro_batch: %lld, grad_accum: %lld, seed: %lld}\n"
             "optim: {lr: %.17g, min_lr: %.17g, warmup: %lld, warmup_from: zero, betas: [%.17g, %.17g],"
             " eps: %.17g, weight_decay: %.17g, clip: %.17g, decay: %s}\n",
             (long long)jnum(hp, "seq_len"), (long long)jnum(hp, "steps"),
             (long long)jnum(hp, "micro_batch"), (long long)jnum(hp, "grad_accum"),
             (long long)jnum(hp, "seed"), jnum(hp, "lr"), jnum(hp, "min_lr"),
             (long long)jnum(hp, "warmup"), json_number_value(json_array_get(betas, 0)),
             json_number_value(json_array_get(betas, 1)), jnum(hp, "eps"), jnum(hp, "weight_decay"),
             jnum(hp, "clip"), json_string_value(json_object_get(hp, "decay")));
    job_t job;
    model_t *m = NULL;
    train_t *t = NULL;
    int32_t *tokens = NULL;
    const int32_t *val;
    int64_t n_train, n_val;
    if (job_load_string("moe.yaml", yaml, &job, err, sizeof err) ||
        job_validate(&job, err, sizeof err) || run_model_create(&job, &m) ||
        run_tokens_load(job.data.dir, 0.0, &tokens, &n_train, &val, &n_val, NULL)) {
        CHECK_MSG(0, "fixture setup: %s", err);
        goto out;
    }
    train_config_t cfg;
    run_train_config(&job, &cfg);
    if (train_create(&cfg, m, tokens, n_train, NULL, 0, &t)) {
        CHECK(!"train_create");
        goto out;
    }
    json_t *steps = json_object_get(ex, "steps");
    REQUIRE(json_array_size(steps) == (size_t)cfg.steps);
    double worst = 0;
    for (int64_t k = 0; k < cfg.steps; k++) {
        train_step_info_t info;
        REQUIRE(train_step(t, &info) == BT_OK);
        json_t *e = json_array_get(steps, (size_t)k);
        double rel = fabs(info.loss - jnum(e, "loss")) / fabs(jnum(e, "loss"));
        worst = rel > worst ? rel : worst;
        CHECK_NEAR(info.loss, jnum(e, "loss"), 1e-5, 0);
        CHECK_NEAR(info.grad_norm, jnum(e, "grad_norm"), 1e-5, 0);
    }
    printf("  worst relative loss difference over %lld steps: %.3e\n", (long long)cfg.steps, worst);
    /* final parameters, expert by expert under the checkpoint's names */
    json_t *final = json_object_get(ex, "final");
    size_t checked = 0;
    for (int i = 0; i < m->n_params; i++) {
        bool stacked = model_name_is_stacked(m->params[i].name);
        int64_t slabs = stacked ? m->params[i].spec.global[0] : 1;
        int64_t per = tensor_numel(&m->params[i].t) / slabs;
        for (int64_t k = 0; k < slabs; k++) {
            char name[128];
            if (stacked) model_name_unstack(m->params[i].name, k, name, sizeof name);
            else snprintf(name, sizeof name, "%s", m->params[i].name);
            json_t *f = json_object_get(final, name);
            CHECK_MSG(f != NULL, "%s not in expected.json", name);
            if (!f) continue;
            checked++;
            const float *d = (const float *)m->params[i].t.data + k * per;
            double sum = 0, sq = 0;
            for (int64_t j = 0; j < per; j++) sum += d[j], sq += (double)d[j] * d[j];
            CHECK_NEAR(sq, jnum(f, "sumsq"), 1e-5, 0);
            CHECK_NEAR(sum, jnum(f, "sum"), 1e-4, 1e-4 * sqrt(jnum(f, "sumsq")));
        }
    }
    CHECK(checked == json_object_size(final));
out:
    train_destroy(t);
    model_destroy(m);
    free(tokens);
    json_decref(ex);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_moe_config_fields, test_moe_config_errors, test_moe_config_qwen3,
             test_moe_capacity,
             test_moe_export_roundtrip, test_moe_stages, test_moe_fenced, test_moe_decode,
             test_moe_mem_estimate, test_moe_flops, test_moe_train_matches_torch);
}
