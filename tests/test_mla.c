/* DeepSeek-V2 (multi-head latent attention, model/mla.c, and DeepSeek's
 * experts in model/moe.c) beyond the fixtures' forward and backward against
 * transformers (tests/test_model_hf.c) and TP by heads (test_model_tp.c):
 * what the HF configs set, the configs refused (each error names its
 * field), the strided column copy MLA is built on (against a plain loop,
 * and the fenced device's bits), the fenced device, decoding with the KV
 * cache (chunked logits = one forward; greedy ids = transformers'
 * generate()), and export and re-import. Fixtures: tests/fixtures/
 * deepseek_v2_lite and deepseek_v2 (tools/gen_deepseek_fixtures.py). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "ckpt/hf.h"
#include "ckpt/safetensors.h"
#include "kernels/kernels.h"
#include "model/kind.h"
#include "model/model.h"
#include "tests/helpers/capture.h"
#include "tests/test.h"

#define FIX "tests/fixtures/"

typedef struct {
    int32_t ids[3][20], tg[3][20];
    int64_t len[3], n_scored;
} seqs_t;

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

static double seqs_loss(model_t *m, const seqs_t *s)
{
    model_acts_t *a = NULL;
    if (model_acts_create(m, 1, 20, &a) != BT_OK) return NAN;
    double sum = 0;
    for (int i = 0; i < 3; i++) {
        model_batch_t b = {.B = 1, .T = s->len[i], .ids = s->ids[i], .targets = s->tg[i]};
        model_loss_t l;
        if (model_forward_backward(m, a, &b, 1.0f / (float)s->n_scored, &l)) {
            sum = NAN;
            break;
        }
        sum += l.loss_sum;
    }
    model_acts_destroy(a);
    return sum / (double)s->n_scored;
}

/* ---- configs ------------------------------------------------------------------ */

static void test_mla_config_fields(void)
{
    model_config_t c;
    REQUIRE(ckpt_hf_config_load(FIX "deepseek_v2_lite", &c) == BT_OK);
    CHECK(c.arch == MODEL_ARCH_DEEPSEEK_V2);
    CHECK(c.mla.num_heads == 4 && c.mla.q_lora_rank == 0 && c.mla.kv_lora_rank == 16);
    CHECK(c.mla.qk_nope_dim == 8 && c.mla.qk_rope_dim == 4 && c.mla.v_head_dim == 6);
    CHECK(c.mla.rope.kind == MODEL_ROPE_DEFAULT && c.mla.rope.theta == 10000.0);
    CHECK(c.moe.n_experts == 6 && c.moe.top_k == 2 && c.moe.expert_ffn == 12);
    CHECK(c.moe.shared_ffn == 24 && !c.moe.norm_topk && c.moe.aux_loss_coef == 0);
    CHECK(c.moe.router == MODEL_ROUTER_SOFTMAX_TOPK && c.moe.routed_scale == 1.0);
    CHECK(c.mlp.intermediate_size == 40);
    for (int l = 0; l < 3; l++)
        CHECK(c.blocks[l].mixer == MODEL_MIXER_MLA &&
              c.blocks[l].ffn == (l == 0 ? MODEL_FFN_DENSE : MODEL_FFN_MOE));
    REQUIRE(ckpt_hf_config_load(FIX "deepseek_v2", &c) == BT_OK);
    CHECK(c.mla.q_lora_rank == 12 && c.moe.shared_ffn == 12 && c.moe.top_k == 3);
    CHECK(c.moe.router == MODEL_ROUTER_SOFTMAX_GROUP_TOPK && c.moe.n_group == 4 &&
          c.moe.topk_group == 2 && c.moe.routed_scale == 2.5);
    const model_rope_t *r = &c.mla.rope;
    CHECK(r->kind == MODEL_ROPE_YARN && r->factor == 4.0 && r->original_max_position == 16 &&
          r->mscale == 0.707 && r->mscale_all_dim == 1.0 && r->beta_fast == 32 &&
          r->beta_slow == 1 && r->truncate && r->attention_factor == 0);
    /* the tensors under their HF names: q_a/q_b and the latent path */
    model_t *m = NULL;
    REQUIRE(ckpt_hf_load(FIX "deepseek_v2", NULL, &m) == BT_OK);
    const char *names[] = {"model.layers.0.self_attn.q_a_proj.weight",
                           "model.layers.0.self_attn.q_a_layernorm.weight",
                           "model.layers.0.self_attn.q_b_proj.weight",
                           "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                           "model.layers.0.self_attn.kv_a_layernorm.weight",
                           "model.layers.0.self_attn.kv_b_proj.weight",
                           "model.layers.0.self_attn.o_proj.weight",
                           "model.layers.0.mlp.gate_proj.weight",
                           "model.layers.1.mlp.gate.weight",
                           "model.layers.1.mlp.shared_experts.down_proj.weight"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        CHECK_MSG(model_param_find(m, names[i]) >= 0, "%s missing", names[i]);
    CHECK(model_param_find(m, "model.layers.0.self_attn.q_proj.weight") < 0);
    CHECK(model_param_find(m, "model.layers.1.mlp.shared_expert_gate.weight") < 0);
    int i = model_param_find(m, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight");
    CHECK(m->params[i].spec.global[0] == 16 + 4 && m->params[i].spec.global[1] == 32);
    i = model_param_find(m, "model.layers.0.self_attn.kv_b_proj.weight");
    CHECK(m->params[i].spec.global[0] == 4 * (8 + 6) && m->params[i].spec.global[1] == 16);
    model_destroy(m);
}

static const char ds_base[] =
    "\"architectures\": [\"DeepseekV2ForCausalLM\"], \"vocab_size\": 64, \"hidden_size\": 16, "
    "\"intermediate_size\": 24, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
    "\"q_lora_rank\": null, \"kv_lora_rank\": 8, \"qk_nope_head_dim\": 4, "
    "\"qk_rope_head_dim\": 2, \"v_head_dim\": 3, \"n_routed_experts\": 4, "
    "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, \"n_shared_experts\": 1, "
    "\"first_k_dense_replace\": 1";

static void config_refused(const char *extra, bt_status_t want, const char *needle)
{
    char text[2048];
    snprintf(text, sizeof text, "{%s%s%s}", ds_base, extra[0] ? ", " : "", extra);
    model_config_t c;
    test_capture_t cap;
    test_capture_begin(&cap);
    bt_status_t st = ckpt_hf_config_parse(text, strlen(text), "ds.json", &c);
    char *msg = test_capture_end(&cap);
    CHECK_MSG(st == want, "%s: %s, expected %s", extra, bt_status_str(st), bt_status_str(want));
    CHECK_MSG(strstr(msg, needle) != NULL, "%s: message '%s' lacks '%s'", extra, msg, needle);
    free(msg);
}

static void test_mla_config_errors(void)
{
    model_config_t c;
    char text[2048];
    snprintf(text, sizeof text, "{%s}", ds_base);
    REQUIRE(ckpt_hf_config_parse(text, strlen(text), "ds.json", &c) == BT_OK);
    CHECK(c.blocks[0].ffn == MODEL_FFN_DENSE && c.blocks[1].ffn == MODEL_FFN_MOE);
    config_refused("\"moe_layer_freq\": 2", BT_ERR_UNSUPPORTED, "moe_layer_freq=2 is not supported");
    config_refused("\"n_shared_experts\": null", BT_ERR_UNSUPPORTED, "n_shared_experts=null");
    config_refused("\"n_shared_experts\": 0", BT_ERR_UNSUPPORTED, "n_shared_experts=0");
    config_refused("\"topk_method\": \"noaux_tc\"", BT_ERR_UNSUPPORTED,
                   "topk_method='noaux_tc' is not supported");
    config_refused("\"scoring_func\": \"sigmoid\"", BT_ERR_UNSUPPORTED,
                   "scoring_func='sigmoid' is not supported");
    config_refused("\"topk_method\": \"group_limited_greedy\", \"topk_group\": 1", BT_ERR_INVALID,
                   "required field 'n_group' is missing");
    config_refused("\"topk_method\": \"group_limited_greedy\", \"n_group\": 3, \"topk_group\": 1",
                   BT_ERR_INVALID, "n_group=3 must divide n_routed_experts=4");
    config_refused("\"topk_method\": \"group_limited_greedy\", \"n_group\": 2, \"topk_group\": 3",
                   BT_ERR_INVALID, "topk_group=3 must be in [1, n_group=2]");
    config_refused("\"topk_method\": \"group_limited_greedy\", \"n_group\": 4, \"topk_group\": 1",
                   BT_ERR_INVALID, "num_experts_per_tok=2 exceeds the 1 experts of topk_group=1");
    config_refused("\"routed_scaling_factor\": 0", BT_ERR_INVALID,
                   "routed_scaling_factor=0 must be > 0");
    config_refused("\"first_k_dense_replace\": 3", BT_ERR_INVALID,
                   "first_k_dense_replace=3 must be in [0, num_hidden_layers=2]");
    config_refused("\"attention_bias\": true", BT_ERR_UNSUPPORTED, "attention_bias=true");
    config_refused("\"mlp_bias\": true", BT_ERR_UNSUPPORTED, "mlp_bias=true");
    config_refused("\"num_key_value_heads\": 1", BT_ERR_UNSUPPORTED,
                   "num_key_value_heads=1 must equal num_attention_heads=2");
    config_refused("\"qk_rope_head_dim\": 3", BT_ERR_INVALID, "qk_rope_head_dim=3 must be even");
    config_refused("\"qk_nope_head_dim\": 0", BT_ERR_INVALID, "qk_nope_head_dim=0");
    config_refused("\"v_head_dim\": 0", BT_ERR_INVALID, "v_head_dim=0");
    config_refused("\"kv_lora_rank\": 0", BT_ERR_INVALID, "kv_lora_rank=0");
    config_refused("\"num_experts_per_tok\": null", BT_ERR_INVALID,
                   "required field 'num_experts_per_tok' is missing");
    config_refused("\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2}", BT_ERR_UNSUPPORTED,
                   "rope_scaling.type='dynamic' is not supported");
    config_refused("\"rope_scaling\": {\"type\": \"yarn\"}", BT_ERR_INVALID,
                   "required field 'factor' is missing");
    config_refused("\"router_bias_update_rate\": 0.01, \"topk_method\": \"group_limited_greedy\", "
                   "\"n_group\": 2, \"topk_group\": 2", BT_ERR_INVALID,
                   "router_bias_update_rate=0.01 with topk_method group_limited_greedy");
    /* yarn belongs to DeepseekV2 here: a Llama config with it is refused */
    const char llama[] = "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 64, "
                         "\"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 1, "
                         "\"num_attention_heads\": 2, \"rope_scaling\": {\"type\": \"yarn\", "
                         "\"factor\": 2}}";
    test_capture_t cap;
    test_capture_begin(&cap);
    bt_status_t st = ckpt_hf_config_parse(llama, strlen(llama), "llama.json", &c);
    char *msg = test_capture_end(&cap);
    CHECK(st == BT_ERR_UNSUPPORTED && strstr(msg, "yarn for DeepseekV2 only"));
    free(msg);
    /* norm_topk_prob is ignored, as transformers' DeepseekV2 ignores it */
    snprintf(text, sizeof text, "{%s, \"norm_topk_prob\": true}", ds_base);
    test_capture_begin(&cap);
    st = ckpt_hf_config_parse(text, strlen(text), "ds.json", &c);
    msg = test_capture_end(&cap);
    CHECK(st == BT_OK && !c.moe.norm_topk && strstr(msg, "norm_topk_prob=true is ignored"));
    free(msg);
    /* a TP size that does not divide the heads */
    snprintf(text, sizeof text, "{%s}", ds_base);
    REQUIRE(ckpt_hf_config_parse(text, strlen(text), "ds.json", &c) == BT_OK);
    test_capture_begin(&cap);
    st = model_config_kinds_validate(&c, 4);
    msg = test_capture_end(&cap);
    CHECK(st == BT_ERR_INVALID && strstr(msg, "tp_size=4 does not divide num_attention_heads=2"));
    free(msg);
}

/* ---- the strided column copy -------------------------------------------------------- */

static void test_mla_copy_cols(void)
{
    enum { R = 6, SC = 11, DIV = 3, DC = 9 };
    float src[R * SC], dst[R * DIV * DC], want[R * DIV * DC];
    for (int i = 0; i < R * SC; i++) src[i] = (float)(i * 7 % 13) - 6.5f;
    const kern_cols_t cases[] = {
        {.d0 = 0, .dstep = 1, .s0 = 0, .sstep = 1, .n = 4, .div = 1},
        {.d0 = 2, .dstep = 2, .s0 = 1, .sstep = 3, .n = 3, .div = 1, .acc = true},
        {.d0 = 5, .dstep = 1, .s0 = 7, .sstep = 2, .n = 2, .div = DIV},
        {.d0 = 1, .dstep = 4, .s0 = 0, .sstep = 5, .n = 2, .div = DIV, .acc = true},
    };
    kern_stream_t *s = kern_stream_host();
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const kern_cols_t *c = &cases[k];
        int64_t rows = R * c->div, dc = DC;
        for (int i = 0; i < rows * dc; i++) dst[i] = want[i] = (float)i * 0.25f;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < c->n; j++) {
                float *d = &want[r * dc + c->d0 + j * c->dstep];
                float x = src[(r / c->div) * SC + c->s0 + j * c->sstep];
                *d = c->acc ? *d + x : x;
            }
        tensor_t ts = tensor_make(src, DT_F32, (device_t){DEV_CPU, 0}, 2, (int64_t[]){R, SC});
        tensor_t td = tensor_make(dst, DT_F32, (device_t){DEV_CPU, 0}, 2, (int64_t[]){rows, dc});
        kern_copy_cols(s, &td, &ts, c);
        CHECK_MSG(!memcmp(dst, want, (size_t)(rows * dc) * sizeof *dst), "case %zu differs", k);
        /* the fenced device: the same bits */
        kern_stream_t *fs = NULL;
        REQUIRE(kern_stream_create((device_t){DEV_FENCED, 0}, &fs) == BT_OK);
        device_t fd = {DEV_FENCED, 0};
        void *ps = NULL, *pd = NULL;
        REQUIRE(kern_mem_alloc(fd, sizeof src, &ps) == BT_OK);
        REQUIRE(kern_mem_alloc(fd, (size_t)(rows * dc) * sizeof(float), &pd) == BT_OK);
        tensor_t fsrc = tensor_make(ps, DT_F32, fd, 2, (int64_t[]){R, SC});
        tensor_t fdst = tensor_make(pd, DT_F32, fd, 2, (int64_t[]){rows, dc});
        float init[R * DIV * DC], got[R * DIV * DC];
        for (int i = 0; i < rows * dc; i++) init[i] = (float)i * 0.25f;
        kern_upload(fs, &fsrc, src);
        kern_upload(fs, &fdst, init);
        kern_copy_cols(fs, &fdst, &fsrc, c);
        kern_download(fs, got, &fdst);
        REQUIRE(kern_stream_sync(fs) == BT_OK);
        CHECK_MSG(!memcmp(got, want, (size_t)(rows * dc) * sizeof *got), "fenced case %zu", k);
        kern_mem_free(fd, ps);
        kern_mem_free(fd, pd);
        kern_stream_destroy(fs);
    }
}

/* ---- devices, decoding, export --------------------------------------------------------- */

/* On the fenced device the same loss and gradients, bit for bit, as on the CPU. */
static void test_mla_fenced(void)
{
    const char *fx[] = {"deepseek_v2_lite", "deepseek_v2"};
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
        double lc = seqs_loss(cpu, &s), lf = seqs_loss(fen, &s);
        CHECK_MSG(lc == lf && isfinite(lc), "%s: cpu %.9g fenced %.9g", fx[f], lc, lf);
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

static int argmax(const float *x, int64_t n)
{
    int b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = (int)i;
    return b;
}

/* Decoding with the KV cache (K [.., H, qk_nope + qk_rope] and V [.., H,
 * v_head_dim] at their own widths): the logits of chunks and single tokens
 * are those of one forward; greedy decoding of the fixture's prompt gives
 * transformers' generate() ids. */
static void test_mla_decode(void)
{
    const char *fx[] = {"deepseek_v2_lite", "deepseek_v2"};
    for (int f = 0; f < 2; f++) {
        char dir[256], path[300];
        snprintf(dir, sizeof dir, FIX "%s", fx[f]);
        seqs_t s;
        REQUIRE(seqs_load(fx[f], &s) == 0);
        model_t *m = NULL;
        REQUIRE(ckpt_hf_load(dir, NULL, &m) == BT_OK);
        enum { T = 25 };
        int64_t V = m->cfg.vocab_size;
        int32_t tg[T], pos[T];
        for (int i = 0; i < T; i++) tg[i] = MODEL_IGNORE_INDEX, pos[i] = i;
        float *full = malloc((size_t)(T * V) * 4), *one = malloc((size_t)(T * V) * 4);
        model_acts_t *fa = NULL, *da = NULL;
        REQUIRE(model_acts_create_fwd(m, 1, T, &fa) == BT_OK);
        REQUIRE(model_acts_create_decode(m, T, &da) == BT_OK);
        model_loss_t l;
        model_batch_t fb = {.B = 1, .T = 20, .ids = s.ids[0], .targets = tg, .logits_out = full};
        REQUIRE(model_forward_backward(m, fa, &fb, 0, &l) == BT_OK);
        const int cuts[] = {0, 6, 7, 8, 13, 14, 20};
        for (int k = 0; k + 1 < (int)(sizeof cuts / sizeof cuts[0]); k++) {
            int a0 = cuts[k], n = cuts[k + 1] - cuts[k];
            model_batch_t b = {.B = 1, .T = n, .ids = s.ids[0] + a0, .targets = tg,
                               .pos = pos + a0, .logits_out = one + (int64_t)a0 * V};
            REQUIRE(model_forward_backward(m, da, &b, 0, &l) == BT_OK);
        }
        double md = 0, mb = 0;
        for (int64_t i = 0; i < 20 * V; i++) {
            md = fmax(md, fabs((double)one[i] - full[i]));
            mb = fmax(mb, fabs((double)full[i]));
        }
        CHECK_MSG(md <= 1e-5 * mb, "%s: decode logits differ by %.3g of %.3g", fx[f], md, mb);
        model_acts_destroy(da);

        /* greedy: the prompt in one chunk, then one token at a time */
        snprintf(path, sizeof path, "%s/generate.json", dir);
        json_error_t jerr;
        json_t *g = json_load_file(path, 0, &jerr);
        REQUIRE(g);
        json_t *pj = json_object_get(g, "prompt_ids"), *ij = json_object_get(g, "ids");
        int P = (int)json_array_size(pj), G = (int)json_array_size(ij);
        REQUIRE(P + G <= T + 1 && G == 20);
        int32_t seq[T + 1];
        for (int i = 0; i < P; i++) seq[i] = (int32_t)json_integer_value(json_array_get(pj, (size_t)i));
        REQUIRE(model_acts_create_decode(m, T, &da) == BT_OK);
        int at = 0, n = P, same = 0;
        for (int k = 0; k < G; k++) {
            model_batch_t b = {.B = 1, .T = n, .ids = seq + at, .targets = tg, .pos = pos + at,
                               .logits_out = one};
            REQUIRE(model_forward_backward(m, da, &b, 0, &l) == BT_OK);
            at += n;
            n = 1;
            seq[at] = argmax(one + (int64_t)(b.T - 1) * V, V);
            same += seq[at] == (int32_t)json_integer_value(json_array_get(ij, (size_t)k));
        }
        CHECK_MSG(same == G, "%s: %d of %d greedy ids are transformers'", fx[f], same, G);
        json_decref(g);
        free(full);
        free(one);
        model_acts_destroy(fa);
        model_acts_destroy(da);
        model_destroy(m);
    }
}

/* Export: the tensors transformers wrote, byte for byte, and a config.json
 * that reads back to the same model (and that transformers loads:
 * tools/gen_deepseek_fixtures.py --check-export). */
static void test_mla_export_roundtrip(void)
{
    const char *fx[] = {"deepseek_v2_lite", "deepseek_v2"};
    for (int f = 0; f < 2; f++) {
        char dir[256], out[] = "/tmp/baton-mla-export-XXXXXX", tgt[300];
        snprintf(dir, sizeof dir, FIX "%s", fx[f]);
        REQUIRE(mkdtemp(out));
        snprintf(tgt, sizeof tgt, "%s/model", out);
        model_t *m = NULL, *back = NULL;
        REQUIRE(ckpt_hf_load(dir, NULL, &m) == BT_OK);
        REQUIRE(ckpt_hf_save(m, tgt) == BT_OK);
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
        model_config_t c;
        REQUIRE(ckpt_hf_config_load(tgt, &c) == BT_OK);
        CHECK(!memcmp(&c.mla, &m->cfg.mla, sizeof c.mla));
        CHECK(c.moe.n_experts == m->cfg.moe.n_experts && c.moe.top_k == m->cfg.moe.top_k &&
              c.moe.expert_ffn == m->cfg.moe.expert_ffn &&
              c.moe.shared_ffn == m->cfg.moe.shared_ffn && c.moe.router == m->cfg.moe.router &&
              c.moe.n_group == m->cfg.moe.n_group && c.moe.topk_group == m->cfg.moe.topk_group &&
              c.moe.routed_scale == m->cfg.moe.routed_scale &&
              c.mlp.intermediate_size == m->cfg.mlp.intermediate_size);
        for (int64_t l = 0; l < c.num_layers; l++)
            CHECK(c.blocks[l].mixer == m->cfg.blocks[l].mixer &&
                  c.blocks[l].ffn == m->cfg.blocks[l].ffn);
        REQUIRE(ckpt_hf_load(tgt, NULL, &back) == BT_OK);
        CHECK(back->n_params == m->n_params && back->param_bytes == m->param_bytes &&
              !memcmp(back->param_mem, m->param_mem, m->param_bytes));
        model_destroy(back);
        model_destroy(m);
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
        CHECK(system(cmd) == 0);
    }
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_mla_config_fields, test_mla_config_errors, test_mla_copy_cols,
             test_mla_fenced, test_mla_decode, test_mla_export_roundtrip);
}
