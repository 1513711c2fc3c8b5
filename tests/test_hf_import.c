/* HF import: config.json fields (accepted kinds parsed right, unsupported
 * values rejected), weight-set errors (missing, extra, wrongly shaped, wrong
 * dtype, bad index) and the export -> import round trip. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/hf.h"
#include "ckpt/safetensors.h"
#include "model/model.h"
#include "tests/test.h"

#define FIX "tests/fixtures/"

static json_t *cfg_base(const char *fixture)
{
    char path[256];
    snprintf(path, sizeof path, FIX "%s/config.json", fixture);
    return json_load_file(path, 0, NULL);
}

static bt_status_t cfg_parse(json_t *j, model_config_t *out)
{
    char *text = json_dumps(j, 0);
    bt_status_t st = ckpt_hf_config_parse(text, strlen(text), "test config.json", out);
    free(text);
    json_decref(j);
    return st;
}

/* One field of `fixture`'s config set to `value` (JSON text; NULL deletes). */
static bt_status_t cfg_with(const char *fixture, const char *key, const char *value,
                            model_config_t *out)
{
    json_t *j = cfg_base(fixture);
    if (!j) return BT_ERR_IO;
    if (value) json_object_set_new(j, key, json_loads(value, JSON_DECODE_ANY, NULL));
    else json_object_del(j, key);
    return cfg_parse(j, out);
}

/* `fixture`'s config with use_sliding_window on, sliding_window 16 and
 * layer_types `types` (a JSON list, taken) */
static bt_status_t cfg_window16(const char *fixture, json_t *types, model_config_t *out)
{
    json_t *j = cfg_base(fixture);
    json_object_set_new(j, "use_sliding_window", json_true());
    json_object_set_new(j, "sliding_window", json_integer(16));
    json_object_set_new(j, "layer_types", types);
    return cfg_parse(j, out);
}

static void test_hf_config_fields(void)
{
    model_config_t c;
    REQUIRE(ckpt_hf_config_load(FIX "llama", &c) == BT_OK);
    CHECK(c.arch == MODEL_ARCH_LLAMA && c.vocab_size == 256 && c.hidden_size == 64);
    CHECK(c.attn.num_heads == 4 && c.attn.num_kv_heads == 2 && c.attn.head_dim == 16 && c.num_layers == 2);
    CHECK(!c.tie_word_embeddings && !c.attn.qkv_bias && c.attn.rope.kind == MODEL_ROPE_DEFAULT);
    REQUIRE(ckpt_hf_config_load(FIX "llama_tied_llama3", &c) == BT_OK);
    CHECK(c.tie_word_embeddings && c.attn.qkv_bias && c.attn.o_bias && c.mlp.bias);
    CHECK(c.attn.rope.kind == MODEL_ROPE_LLAMA3 && c.attn.rope.factor == 8 &&
          c.attn.rope.original_max_position == 16);
    REQUIRE(ckpt_hf_config_load(FIX "mistral", &c) == BT_OK);
    CHECK(c.arch == MODEL_ARCH_MISTRAL && c.attn.head_dim == 16 && c.attn.sliding_window == 32);
    CHECK(c.attn.rope.theta == 1e6);
    REQUIRE(ckpt_hf_config_load(FIX "qwen2", &c) == BT_OK);
    CHECK(c.arch == MODEL_ARCH_QWEN2 && c.attn.qkv_bias && !c.attn.o_bias && c.attn.sliding_window == 0);
    CHECK(c.attn.num_heads == 6 && c.attn.num_kv_heads == 2 && c.rms_norm_eps == 1e-5);

    /* Qwen3: per-head q/k norms, no biases unless attention_bias (then q/k/v/o);
     * head_dim absent is Qwen3Config's 128, not hidden / heads */
    REQUIRE(ckpt_hf_config_load(FIX "qwen3", &c) == BT_OK);
    CHECK(c.arch == MODEL_ARCH_QWEN3 && c.attn.qk_norm && !c.attn.qkv_bias && !c.attn.o_bias);
    CHECK(c.attn.head_dim == 16 && c.hidden_size == 48 && c.tie_word_embeddings);
    REQUIRE(cfg_with("qwen3", "attention_bias", "true", &c) == BT_OK);
    CHECK(c.attn.qkv_bias && c.attn.o_bias);
    REQUIRE(cfg_with("qwen3", "head_dim", NULL, &c) == BT_OK);
    CHECK(c.attn.head_dim == 128);
    REQUIRE(ckpt_hf_config_load(FIX "qwen2", &c) == BT_OK);
    CHECK(!c.attn.qk_norm);
    REQUIRE(cfg_window16(
                "qwen3", json_pack("[sss]", "full_attention", "sliding_attention", "full_attention"),
                &c) == BT_OK);
    CHECK(c.attn.sliding_window == 16);

    /* Phi-3: the fused tensors are row parts of the model's q/k/v and gate/up */
    REQUIRE(ckpt_hf_config_load(FIX "phi3", &c) == BT_OK);
    CHECK(c.arch == MODEL_ARCH_PHI3 && c.attn.sliding_window == 47 && !c.attn.qkv_bias);
    model_t *phi = NULL;
    REQUIRE(ckpt_hf_load(FIX "phi3", NULL, &phi) == BT_OK);
    CHECK(model_param_find(phi, "model.layers.0.self_attn.qkv_proj.weight#2") >= 0 &&
          model_param_find(phi, "model.layers.1.mlp.gate_up_proj.weight#1") >= 0 &&
          model_param_find(phi, "model.layers.0.self_attn.q_proj.weight") < 0);
    model_destroy(phi);
    /* its longrope (the 128k models) is refused by name */
    REQUIRE(cfg_with("phi3", "rope_parameters",
                     "{\"rope_type\": \"longrope\", \"rope_theta\": 10000.0, \"short_factor\": [1.0], "
                     "\"long_factor\": [1.0]}",
                     &c) == BT_ERR_UNSUPPORTED);

    /* legacy spellings: rope_theta + rope_scaling with "type" */
    json_t *j = cfg_base("llama");
    json_object_del(j, "rope_parameters");
    json_object_set_new(j, "rope_theta", json_real(500000.0));
    json_object_set_new(j, "rope_scaling", json_pack("{s:s,s:f}", "type", "linear", "factor", 4.0));
    REQUIRE(cfg_parse(j, &c) == BT_OK);
    CHECK(c.attn.rope.kind == MODEL_ROPE_LINEAR && c.attn.rope.factor == 4 && c.attn.rope.theta == 500000);
    j = cfg_base("llama");
    json_object_del(j, "rope_parameters");
    json_object_set_new(j, "rope_scaling", json_null());
    REQUIRE(cfg_parse(j, &c) == BT_OK);
    CHECK(c.attn.rope.kind == MODEL_ROPE_DEFAULT && c.attn.rope.theta == 10000);
    /* llama3 through rope_scaling with "rope_type", original length defaulted */
    j = cfg_base("llama");
    json_object_del(j, "rope_parameters");
    json_object_set_new(j, "rope_scaling",
                        json_pack("{s:s,s:f,s:f,s:f}", "rope_type", "llama3", "factor", 8.0,
                                  "low_freq_factor", 1.0, "high_freq_factor", 4.0));
    REQUIRE(cfg_parse(j, &c) == BT_OK);
    CHECK(c.attn.rope.kind == MODEL_ROPE_LLAMA3 && c.attn.rope.original_max_position == 64);
    /* head_dim absent -> hidden / heads; num_key_value_heads absent -> heads */
    REQUIRE(cfg_with("mistral", "head_dim", NULL, &c) == BT_OK);
    CHECK(c.attn.head_dim == 8);
    REQUIRE(cfg_with("llama", "num_key_value_heads", NULL, &c) == BT_OK);
    CHECK(c.attn.num_kv_heads == 4);
    /* architectures absent: model_type decides */
    REQUIRE(cfg_with("qwen2", "architectures", NULL, &c) == BT_OK);
    CHECK(c.arch == MODEL_ARCH_QWEN2);
    /* Qwen2 sliding window only when used */
    REQUIRE(cfg_window16(
                "qwen2", json_pack("[sss]", "full_attention", "full_attention", "sliding_attention"),
                &c) == BT_OK);
    CHECK(c.attn.sliding_window == 16);
}

static void test_hf_config_rejects(void)
{
    model_config_t c;
    CHECK(cfg_with("llama", "hidden_act", "\"gelu\"", &c) == BT_ERR_UNSUPPORTED);
    CHECK(cfg_with("llama", "architectures", "[\"GPT2LMHeadModel\"]", &c) == BT_ERR_UNSUPPORTED);
    CHECK(cfg_with("llama", "rope_parameters",
                   "{\"rope_type\": \"yarn\", \"factor\": 4.0, \"rope_theta\": 10000.0}", &c) ==
          BT_ERR_UNSUPPORTED);
    CHECK(cfg_with("llama", "rope_parameters", "{\"rope_type\": \"dynamic\", \"factor\": 2.0}",
                   &c) == BT_ERR_UNSUPPORTED);
    CHECK(cfg_with("llama", "rope_parameters", "{\"type\": \"weird\"}", &c) == BT_ERR_UNSUPPORTED);
    CHECK(cfg_with("llama", "rope_parameters", "{\"rope_type\": \"linear\"}", &c) ==
          BT_ERR_INVALID); /* factor missing */
    CHECK(cfg_with("llama", "partial_rotary_factor", "0.5", &c) == BT_ERR_UNSUPPORTED);
    CHECK(cfg_with("llama", "num_key_value_heads", "3", &c) == BT_ERR_INVALID);
    CHECK(cfg_with("llama", "vocab_size", NULL, &c) == BT_ERR_INVALID);
    CHECK(cfg_with("llama", "hidden_size", "\"64\"", &c) == BT_ERR_INVALID);
    CHECK(cfg_with("llama", "tie_word_embeddings", "1", &c) == BT_ERR_INVALID);
    CHECK(cfg_with("llama", "head_dim", "15", &c) == BT_ERR_INVALID);
    CHECK(cfg_with("llama", "rms_norm_eps", "-1", &c) == BT_ERR_INVALID);
    const char *bad = "{\"architectures\": [\"LlamaForCausalLM\"], ";
    CHECK(ckpt_hf_config_parse(bad, strlen(bad), "bad", &c) == BT_ERR_INVALID);
    CHECK(ckpt_hf_config_load(FIX "no_such_model", &c) == BT_ERR_NOT_FOUND);
}

static char tmpdir[64];

/* Writes `fixture`'s weights to tmpdir/model.safetensors (plus its config),
 * with `drop` left out, `extra` added, `reshape` given a wrong shape. */
static void write_variant(const char *fixture, const char *drop, const char *extra,
                          const char *reshape, const char *as_int)
{
    char src[256], dst[256];
    model_t *m = NULL;
    snprintf(src, sizeof src, FIX "%s", fixture);
    if (ckpt_hf_load(src, NULL, &m) != BT_OK) abort();
    ckpt_st_entry_t *e = calloc((size_t)m->n_params + 1, sizeof *e);
    int n = 0;
    static float junk[8];
    for (int i = 0; i < m->n_params; i++) {
        if (drop && !strcmp(m->params[i].name, drop)) continue;
        e[n].name = m->params[i].name;
        e[n].t = m->params[i].t;
        if (reshape && !strcmp(m->params[i].name, reshape)) {
            int64_t r = e[n].t.shape[0], cc = e[n].t.shape[1];
            e[n].t = tensor_2d(e[n].t.data, DT_F32, cc, r);
        }
        if (as_int && !strcmp(m->params[i].name, as_int)) e[n].t.dtype = DT_I32;
        n++;
    }
    if (extra) e[n++] = (ckpt_st_entry_t){extra, tensor_1d(junk, DT_F32, 8)};
    snprintf(dst, sizeof dst, "%s/model.safetensors", tmpdir);
    if (ckpt_st_write(dst, e, n, NULL, 0) != BT_OK) abort();
    free(e);
    model_destroy(m);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cp %s/config.json %s/ && rm -f %s/model.safetensors.index.json", src,
             tmpdir, tmpdir);
    if (system(cmd) != 0) abort();
}

static void test_hf_weight_errors(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/bt_hf_XXXXXX");
    REQUIRE(mkdtemp(tmpdir) != NULL);
    model_t *m = NULL;
    write_variant("llama", NULL, NULL, NULL, NULL);
    REQUIRE(ckpt_hf_load(tmpdir, NULL, &m) == BT_OK); /* the control: unchanged loads */
    model_destroy(m);
    m = NULL;
    write_variant("llama", "model.layers.1.mlp.up_proj.weight", NULL, NULL, NULL);
    CHECK(ckpt_hf_load(tmpdir, NULL, &m) == BT_ERR_NOT_FOUND);
    write_variant("llama", NULL, "model.layers.7.self_attn.q_proj.weight", NULL, NULL);
    CHECK(ckpt_hf_load(tmpdir, NULL, &m) == BT_ERR_INVALID);
    write_variant("llama", NULL, "model.layers.0.self_attn.rotary_emb.inv_freq", NULL, NULL);
    CHECK(ckpt_hf_load(tmpdir, NULL, &m) == BT_OK); /* old checkpoints' buffer: ignored */
    model_destroy(m);
    m = NULL;
    write_variant("llama", NULL, NULL, "model.layers.0.self_attn.k_proj.weight", NULL);
    CHECK(ckpt_hf_load(tmpdir, NULL, &m) == BT_ERR_INVALID);
    write_variant("llama", NULL, NULL, NULL, "model.norm.weight");
    CHECK(ckpt_hf_load(tmpdir, NULL, &m) == BT_ERR_UNSUPPORTED);
    /* a stage model ignores other layers' tensors but still needs its own */
    write_variant("llama", "model.layers.0.mlp.up_proj.weight", NULL, NULL, NULL);
    model_stage_t s1 = {.first_layer = 1, .last_layer = 2, .has_head = true};
    CHECK(ckpt_hf_load(tmpdir, &s1, &m) == BT_OK);
    model_destroy(m);
    m = NULL;
    model_stage_t s0 = {.first_layer = 0, .last_layer = 1, .has_embedding = true};
    CHECK(ckpt_hf_load(tmpdir, &s0, &m) == BT_ERR_NOT_FOUND);

    /* sharded index problems */
    char path[256];
    write_variant("llama", NULL, NULL, NULL, NULL);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmpdir);
    FILE *f = fopen(path, "we");
    REQUIRE(f != NULL);
    fprintf(f, "{\"weight_map\": {\"lm_head.weight\": \"../model.safetensors\"}}");
    fclose(f);
    CHECK(ckpt_hf_load(tmpdir, NULL, &m) == BT_ERR_INVALID);
    f = fopen(path, "we");
    fprintf(f, "{\"weight_map\": {\"lm_head.weight\": \"model-2.safetensors\"}}");
    fclose(f);
    CHECK(ckpt_hf_load(tmpdir, NULL, &m) == BT_ERR_NOT_FOUND);
    f = fopen(path, "we");
    fprintf(f, "{\"weight_map\": {\"model.layers.9.x\": \"model.safetensors\"}}");
    fclose(f);
    CHECK(ckpt_hf_load(tmpdir, NULL, &m) == BT_ERR_CORRUPT);
    f = fopen(path, "we");
    fprintf(f, "{\"weight_map\": {\"lm_head.weight\": \"model.safetensors\"}}");
    fclose(f);
    CHECK(ckpt_hf_load(tmpdir, NULL, &m) == BT_ERR_NOT_FOUND); /* others unmapped */
    f = fopen(path, "we");
    fprintf(f, "{\"weight_map\": ");
    fclose(f);
    CHECK(ckpt_hf_load(tmpdir, NULL, &m) == BT_ERR_INVALID);
    unlink(path);
    /* a truncated weight file is named, not crashed on */
    snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
    REQUIRE(truncate(path, 5000) == 0);
    CHECK(ckpt_hf_load(tmpdir, NULL, &m) == BT_ERR_CORRUPT);
    unlink(path);
    CHECK(ckpt_hf_load(tmpdir, NULL, &m) == BT_ERR_NOT_FOUND);
    snprintf(path, sizeof path, "%s/config.json", tmpdir);
    unlink(path);
    rmdir(tmpdir);
}

/* export -> import gives back the same config and bit-identical parameters */
static void roundtrip(const char *fixture)
{
    char src[256], dir[64];
    snprintf(src, sizeof src, FIX "%s", fixture);
    snprintf(dir, sizeof dir, "/tmp/bt_hfx_XXXXXX");
    REQUIRE(mkdtemp(dir) != NULL);
    model_t *a = NULL, *b = NULL;
    REQUIRE(ckpt_hf_load(src, NULL, &a) == BT_OK);
    REQUIRE(ckpt_hf_save(a, dir) == BT_OK);
    REQUIRE(ckpt_hf_load(dir, NULL, &b) == BT_OK);
    CHECK(memcmp(&a->cfg, &b->cfg, sizeof a->cfg) == 0);
    CHECK(a->n_params == b->n_params && a->param_bytes == b->param_bytes);
    CHECK(memcmp(a->param_mem, b->param_mem, a->param_bytes) == 0);
    model_destroy(a);
    model_destroy(b);
    char p[128];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

static void test_hf_export_roundtrip(void)
{
    roundtrip("llama_tied_llama3");
    roundtrip("mistral");
    roundtrip("qwen2_bf16");
    roundtrip("qwen3");
    roundtrip("qwen3_moe");
    roundtrip("phi3");
    roundtrip("qwen2_window");
    roundtrip("mistral_window");
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_hf_config_fields, test_hf_config_rejects, test_hf_weight_errors,
             test_hf_export_roundtrip);
}
