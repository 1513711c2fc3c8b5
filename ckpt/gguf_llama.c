/* GGUF llama files seen as Hugging Face checkpoints: config fields, tensor
 * names, the Q/K row permutation, and the tokenizer as tokenizer.json.
 *
 * The mapping follows what transformers' own GGUF loader produces for the
 * same file (the reference the tests compare against, see
 * tools/gen_gguf_fixtures.py and docs/GGUF.md).
 */
#include "ckpt/gguf.h"

#include <assert.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

/* ---- config ------------------------------------------------------------------ */

static const struct {
    const char *name; /* general.architecture, and the prefix of its keys */
    gguf_arch_t arch;
} gguf_archs[] = {
    {"llama", GGUF_ARCH_LLAMA},
    {"qwen2", GGUF_ARCH_QWEN2},
    {"qwen3", GGUF_ARCH_QWEN3},
};

static const char *arch_name(gguf_arch_t a)
{
    for (size_t i = 0; i < sizeof gguf_archs / sizeof gguf_archs[0]; i++)
        if (gguf_archs[i].arch == a) return gguf_archs[i].name;
    return "?";
}

/* "<arch>.<suffix>" in buf */
static const char *akey(char *buf, size_t cap, gguf_arch_t a, const char *suffix)
{
    snprintf(buf, cap, "%s.%s", arch_name(a), suffix);
    return buf;
}

static bt_status_t need_i64(const gguf_t *g, gguf_arch_t a, const char *suffix, int64_t min,
                            int64_t *out)
{
    char key[96];
    bt_status_t st = gguf_get_i64(g, akey(key, sizeof key, a, suffix), out);
    if (st == BT_ERR_NOT_FOUND) {
        log_error("gguf: %s: metadata '%s' is missing", g->path, key);
        return BT_ERR_INVALID;
    }
    if (st != BT_OK) return st;
    if (*out < min) {
        log_error("gguf: %s: metadata '%s' = %" PRId64 " is below %" PRId64, g->path, key, *out, min);
        return BT_ERR_INVALID;
    }
    return BT_OK;
}

/* An optional integer key: *out keeps dflt when absent. */
static bt_status_t opt_i64(const gguf_t *g, const char *key, int64_t dflt, int64_t *out)
{
    bt_status_t st = gguf_get_i64(g, key, out);
    if (st == BT_ERR_NOT_FOUND) {
        *out = dflt;
        return BT_OK;
    }
    return st;
}

/* the same, for "<arch>.<suffix>" */
static bt_status_t opt_ai64(const gguf_t *g, gguf_arch_t a, const char *suffix, int64_t dflt,
                            int64_t *out)
{
    char key[96];
    return opt_i64(g, akey(key, sizeof key, a, suffix), dflt, out);
}

bt_status_t gguf_llama_config(const gguf_t *g, gguf_llama_config_t *cfg)
{
    gguf_llama_config_t c = {0};
    bt_status_t st;
    gguf_str_t arch;
    if ((st = gguf_get_str(g, "general.architecture", &arch)) != BT_OK) {
        if (st == BT_ERR_NOT_FOUND) log_error("gguf: %s: general.architecture is missing", g->path);
        return BT_ERR_INVALID;
    }
    bool known = false;
    for (size_t i = 0; i < sizeof gguf_archs / sizeof gguf_archs[0] && !known; i++)
        if (gguf_str_eq(arch, gguf_archs[i].name)) c.arch = gguf_archs[i].arch, known = true;
    if (!known) {
        log_error("gguf: %s: architecture '%.*s' is not supported (llama, qwen2, qwen3; a "
                  "qwen2moe, qwen3moe or mixtral model loads from its Hugging Face directory)",
                  g->path, (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
        return BT_ERR_UNSUPPORTED;
    }
    const gguf_arch_t a = c.arch;
    char key[96];
    /* Mixtral is a llama GGUF with experts: blk.N.ffn_gate_inp (the router) and
     * the stacked blk.N.ffn_{gate,up,down}_exps. Not read yet: refused by name
     * rather than loaded as a dense model whose MLP tensors are missing. */
    int64_t experts = 0;
    if ((st = opt_ai64(g, a, "expert_count", 0, &experts)) != BT_OK) return st;
    if (experts > 0 || gguf_tensor_find(g, "blk.0.ffn_gate_inp.weight")) {
        log_error("gguf: %s: %s=%" PRId64 " (tensor blk.0.ffn_gate_inp.weight %s): "
                  "mixture-of-experts GGUF files (Mixtral) are not supported yet; load the model "
                  "from its Hugging Face directory", g->path, akey(key, sizeof key, a, "expert_count"),
                  experts, gguf_tensor_find(g, "blk.0.ffn_gate_inp.weight") ? "present" : "absent");
        return BT_ERR_UNSUPPORTED;
    }
    if ((st = need_i64(g, a, "block_count", 1, &c.num_hidden_layers)) != BT_OK) return st;
    if ((st = need_i64(g, a, "embedding_length", 1, &c.hidden_size)) != BT_OK) return st;
    if ((st = need_i64(g, a, "feed_forward_length", 1, &c.intermediate_size)) != BT_OK) return st;
    if ((st = need_i64(g, a, "attention.head_count", 1, &c.num_attention_heads)) != BT_OK) return st;
    if ((st = need_i64(g, a, "context_length", 1, &c.max_position_embeddings)) != BT_OK) return st;
    if ((st = opt_ai64(g, a, "attention.head_count_kv", c.num_attention_heads,
                       &c.num_key_value_heads)) != BT_OK)
        return st;
    if (c.num_key_value_heads < 1 || c.num_attention_heads % c.num_key_value_heads != 0) {
        log_error("gguf: %s: head_count %" PRId64 " is not a multiple of head_count_kv %" PRId64,
                  g->path, c.num_attention_heads, c.num_key_value_heads);
        return BT_ERR_INVALID;
    }
    /* without attention.key_length: hidden / heads, or Qwen3Config's own 128
     * (as transformers reads such a file) */
    if (a != GGUF_ARCH_QWEN3 && c.hidden_size % c.num_attention_heads != 0 &&
        gguf_kv_find(g, akey(key, sizeof key, a, "attention.key_length")) == NULL) {
        log_error("gguf: %s: embedding_length %" PRId64 " is not a multiple of head_count %" PRId64,
                  g->path, c.hidden_size, c.num_attention_heads);
        return BT_ERR_INVALID;
    }
    if ((st = opt_ai64(g, a, "attention.key_length",
                       a == GGUF_ARCH_QWEN3 ? 128 : c.hidden_size / c.num_attention_heads,
                       &c.head_dim)) != BT_OK)
        return st;
    int64_t v_len;
    if ((st = opt_ai64(g, a, "attention.value_length", c.head_dim, &v_len)) != BT_OK) return st;
    if (c.head_dim < 2 || c.head_dim % 2 != 0 || v_len != c.head_dim) {
        log_error("gguf: %s: head dimension %" PRId64 " (value %" PRId64 ") is not even or K/V differ",
                  g->path, c.head_dim, v_len);
        return BT_ERR_INVALID;
    }

    int64_t rot;
    if ((st = opt_ai64(g, a, "rope.dimension_count", c.head_dim, &rot)) != BT_OK) return st;
    if (rot != c.head_dim) {
        log_error("gguf: %s: %s %" PRId64 " != head dimension %" PRId64
                  " (partial rotary embeddings are not supported)", g->path,
                  akey(key, sizeof key, a, "rope.dimension_count"), rot, c.head_dim);
        return BT_ERR_UNSUPPORTED;
    }

    st = gguf_get_f64(g, akey(key, sizeof key, a, "attention.layer_norm_rms_epsilon"), &c.rms_norm_eps);
    if (st == BT_ERR_NOT_FOUND) log_error("gguf: %s: metadata '%s' is missing", g->path, key);
    if (st != BT_OK) return BT_ERR_INVALID;
    c.rope_theta = 10000.0;
    st = gguf_get_f64(g, akey(key, sizeof key, a, "rope.freq_base"), &c.rope_theta);
    if (st != BT_OK && st != BT_ERR_NOT_FOUND) return st;

    gguf_str_t scaling;
    st = gguf_get_str(g, akey(key, sizeof key, a, "rope.scaling.type"), &scaling);
    if (st != BT_OK && st != BT_ERR_NOT_FOUND) return st;
    if (st == BT_OK && !gguf_str_eq(scaling, "none")) {
        if (!gguf_str_eq(scaling, "linear")) {
            log_error("gguf: %s: RoPE scaling '%.*s' is not supported (none, linear)", g->path,
                      (int)(scaling.len > 64 ? 64 : scaling.len), scaling.ptr);
            return BT_ERR_UNSUPPORTED;
        }
        if (gguf_get_f64(g, akey(key, sizeof key, a, "rope.scaling.factor"), &c.rope_linear_factor) !=
                BT_OK ||
            !(c.rope_linear_factor > 0)) {
            log_error("gguf: %s: linear RoPE scaling without a positive %s", g->path, key);
            return BT_ERR_INVALID;
        }
    }
    if (gguf_tensor_find(g, "rope_freqs.weight")) {
        log_error("gguf: %s: per-frequency RoPE factors (rope_freqs.weight, Llama 3.1 scaling) are not supported",
                  g->path);
        return BT_ERR_UNSUPPORTED;
    }

    /* vocab: the token list is what the embedding rows index */
    const gguf_value_t *tokens;
    st = gguf_get_array(g, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &tokens);
    if (st == BT_OK) {
        c.vocab_size = (int64_t)tokens->arr.n;
    } else if (st == BT_ERR_NOT_FOUND) {
        if ((st = need_i64(g, a, "vocab_size", 1, &c.vocab_size)) != BT_OK) return st;
    } else {
        return st;
    }
    const gguf_tensor_t *embd = gguf_tensor_find(g, "token_embd.weight");
    if (embd && (embd->n_dims != 2 || embd->ne[0] != c.hidden_size || embd->ne[1] != c.vocab_size)) {
        log_error("gguf: %s: token_embd.weight is [%" PRId64 ", %" PRId64 "] (ne), expected [%" PRId64
                  ", %" PRId64 "] from embedding_length and the vocabulary",
                  g->path, embd->ne[0], embd->ne[1], c.hidden_size, c.vocab_size);
        return BT_ERR_INVALID;
    }
    c.tie_word_embeddings = gguf_tensor_find(g, "output.weight") == NULL;
    c.attention_bias = gguf_tensor_find(g, "blk.0.attn_q.bias") != NULL;
    if (a == GGUF_ARCH_QWEN2 && !c.attention_bias) {
        log_error("gguf: %s: a qwen2 file without blk.0.attn_q.bias (Qwen2's q/k/v projections "
                  "always have biases)", g->path);
        return BT_ERR_INVALID;
    }

    if ((st = opt_i64(g, "tokenizer.ggml.bos_token_id", -1, &c.bos_token_id)) != BT_OK) return st;
    if ((st = opt_i64(g, "tokenizer.ggml.eos_token_id", -1, &c.eos_token_id)) != BT_OK) return st;
    if ((st = opt_i64(g, "tokenizer.ggml.padding_token_id", -1, &c.pad_token_id)) != BT_OK) return st;
    if ((st = opt_i64(g, "tokenizer.ggml.unknown_token_id", -1, &c.unk_token_id)) != BT_OK) return st;
    *cfg = c;
    return BT_OK;
}

static json_t *token_id_json(int64_t id) { return id < 0 ? json_null() : json_integer((json_int_t)id); }

bt_status_t gguf_llama_config_json(const gguf_llama_config_t *c, char **out_text)
{
    json_t *rope = c->rope_linear_factor > 0
        ? json_pack("{s:f, s:s, s:f}", "rope_theta", c->rope_theta, "rope_type", "linear", "factor",
                    c->rope_linear_factor)
        : json_pack("{s:f, s:s}", "rope_theta", c->rope_theta, "rope_type", "default");
    json_t *scaling = c->rope_linear_factor > 0
        ? json_pack("{s:s, s:f}", "rope_type", "linear", "factor", c->rope_linear_factor)
        : json_null();
    static const char *const hf_class[] = {[GGUF_ARCH_LLAMA] = "LlamaForCausalLM",
                                           [GGUF_ARCH_QWEN2] = "Qwen2ForCausalLM",
                                           [GGUF_ARCH_QWEN3] = "Qwen3ForCausalLM"};
    /* Qwen2's biases are implied by its model type (its config has no attention_bias) */
    bool attn_bias = c->arch != GGUF_ARCH_QWEN2 && c->attention_bias;
    json_t *j = json_pack(
        "{s:[s], s:s, s:b, s:f, s:o, s:o, s:I, s:s, s:I, s:I, s:I, s:b, s:I, s:I, s:I,"
        " s:o, s:f, s:o, s:f, s:o, s:b, s:o, s:I}",
        "architectures", hf_class[c->arch], "model_type", arch_name(c->arch), "attention_bias", attn_bias,
        "attention_dropout", 0.0, "bos_token_id", token_id_json(c->bos_token_id), "eos_token_id",
        token_id_json(c->eos_token_id), "head_dim", (json_int_t)c->head_dim, "hidden_act", "silu",
        "hidden_size", (json_int_t)c->hidden_size, "intermediate_size", (json_int_t)c->intermediate_size,
        "max_position_embeddings", (json_int_t)c->max_position_embeddings, "mlp_bias", 0,
        "num_attention_heads", (json_int_t)c->num_attention_heads, "num_hidden_layers",
        (json_int_t)c->num_hidden_layers, "num_key_value_heads", (json_int_t)c->num_key_value_heads,
        "pad_token_id", token_id_json(c->pad_token_id), "rms_norm_eps", c->rms_norm_eps,
        "rope_parameters", rope, "rope_theta", c->rope_theta, "rope_scaling", scaling,
        "tie_word_embeddings", c->tie_word_embeddings, "unk_token_id", token_id_json(c->unk_token_id),
        "vocab_size", (json_int_t)c->vocab_size);
    if (j && c->arch != GGUF_ARCH_LLAMA) { /* GGUF keeps no sliding window for these */
        json_object_set_new(j, "use_sliding_window", json_false());
        json_object_set_new(j, "sliding_window", json_null());
        json_object_set_new(j, "max_window_layers", json_integer((json_int_t)c->num_hidden_layers));
    }
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(j);
    if (!text) {
        log_error("gguf: out of memory writing config.json");
        return BT_ERR_NOMEM;
    }
    *out_text = text;
    return BT_OK;
}

/* ---- tensor names ------------------------------------------------------------- */

static const struct {
    const char    *gguf;  /* suffix after "blk.N." */
    const char    *hf;    /* suffix after "model.layers.N." */
    gguf_permute_t permute;
} llama_layer_names[] = {
    {"attn_norm.weight",   "input_layernorm.weight",          GGUF_PERMUTE_NONE},
    {"attn_q.weight",      "self_attn.q_proj.weight",         GGUF_PERMUTE_Q},
    {"attn_k.weight",      "self_attn.k_proj.weight",         GGUF_PERMUTE_K},
    {"attn_v.weight",      "self_attn.v_proj.weight",         GGUF_PERMUTE_NONE},
    {"attn_output.weight", "self_attn.o_proj.weight",         GGUF_PERMUTE_NONE},
    {"attn_q.bias",        "self_attn.q_proj.bias",           GGUF_PERMUTE_Q},
    {"attn_k.bias",        "self_attn.k_proj.bias",           GGUF_PERMUTE_K},
    {"attn_v.bias",        "self_attn.v_proj.bias",           GGUF_PERMUTE_NONE},
    {"attn_output.bias",   "self_attn.o_proj.bias",           GGUF_PERMUTE_NONE},
    {"ffn_norm.weight",    "post_attention_layernorm.weight", GGUF_PERMUTE_NONE},
    {"ffn_gate.weight",    "mlp.gate_proj.weight",            GGUF_PERMUTE_NONE},
    {"ffn_up.weight",      "mlp.up_proj.weight",              GGUF_PERMUTE_NONE},
    {"ffn_down.weight",    "mlp.down_proj.weight",            GGUF_PERMUTE_NONE},
    {"attn_q_norm.weight", "self_attn.q_norm.weight",         GGUF_PERMUTE_NONE},
    {"attn_k_norm.weight", "self_attn.k_norm.weight",         GGUF_PERMUTE_NONE},
};

static const struct {
    const char *gguf;
    const char *hf;
} llama_global_names[] = {
    {"token_embd.weight",  "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight",      "lm_head.weight"},
};

static bt_status_t name_put(char *dst, size_t size, const char *src)
{
    size_t n = strlen(src);
    if (n >= size) return BT_ERR_INVALID;
    memcpy(dst, src, n + 1);
    return BT_OK;
}

bt_status_t gguf_llama_tensor_name(const char *gguf_name, char *hf_name, size_t hf_size,
                                   gguf_permute_t *permute)
{
    *permute = GGUF_PERMUTE_NONE;
    for (size_t i = 0; i < sizeof llama_global_names / sizeof llama_global_names[0]; i++)
        if (!strcmp(gguf_name, llama_global_names[i].gguf))
            return name_put(hf_name, hf_size, llama_global_names[i].hf);
    if (strncmp(gguf_name, "blk.", 4) != 0) return BT_ERR_NOT_FOUND;
    const char *p = gguf_name + 4;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] != '.')) return BT_ERR_NOT_FOUND;
    uint64_t layer = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        layer = layer * 10 + (uint64_t)(*p - '0');
        if (layer > 1000000) return BT_ERR_NOT_FOUND;
    }
    if (*p++ != '.') return BT_ERR_NOT_FOUND;
    for (size_t i = 0; i < sizeof llama_layer_names / sizeof llama_layer_names[0]; i++) {
        if (strcmp(p, llama_layer_names[i].gguf) != 0) continue;
        int n = snprintf(hf_name, hf_size, "model.layers.%" PRIu64 ".%s", layer, llama_layer_names[i].hf);
        if (n < 0 || (size_t)n >= hf_size) return BT_ERR_INVALID;
        *permute = llama_layer_names[i].permute;
        return BT_OK;
    }
    return BT_ERR_NOT_FOUND;
}

/* llama.cpp's converter reorders each head's D rows as (D/2, 2) -> (2, D/2)
 * transposed, i.e. HF row i*D/2 + j goes to GGUF row 2j + i, so that its
 * RoPE can rotate adjacent pairs. Here the inverse. */
void gguf_llama_unpermute_rows(float *dst, const float *src, int64_t rows, int64_t cols,
                               int64_t n_head)
{
    assert(n_head > 0 && rows % (2 * n_head) == 0);
    int64_t d = rows / n_head, half = d / 2;
    for (int64_t h = 0; h < n_head; h++)
        for (int64_t i = 0; i < 2; i++)
            for (int64_t j = 0; j < half; j++)
                memcpy(dst + (h * d + i * half + j) * cols, src + (h * d + 2 * j + i) * cols,
                       (size_t)cols * sizeof *dst);
}

bt_status_t gguf_llama_tensor_to_hf_f32(const gguf_t *g, const gguf_llama_config_t *cfg,
                                        const gguf_tensor_t *t, float *out)
{
    char hf[256];
    gguf_permute_t perm;
    bt_status_t st = gguf_llama_tensor_name(t->name, hf, sizeof hf, &perm);
    /* llama.cpp permutes Q/K rows for its llama architecture only; qwen2 and
     * qwen3 rotate halves as HF does and keep HF's rows */
    if (st != BT_OK || perm == GGUF_PERMUTE_NONE || cfg->arch != GGUF_ARCH_LLAMA)
        return gguf_tensor_to_f32(g, t, out);

    int64_t n_head = perm == GGUF_PERMUTE_Q ? cfg->num_attention_heads : cfg->num_key_value_heads;
    int64_t rows = t->n_dims >= 2 ? t->ne[1] : t->ne[0];
    int64_t cols = t->n_dims >= 2 ? t->ne[0] : 1;
    if (t->n_dims > 2 || rows != n_head * cfg->head_dim) {
        log_error("gguf: %s: tensor '%s' has %" PRId64 " rows, expected %" PRId64 " heads x %" PRId64,
                  g->path, t->name, rows, n_head, cfg->head_dim);
        return BT_ERR_INVALID;
    }
    float *tmp = malloc((size_t)t->n_elems * sizeof *tmp);
    if (!tmp) {
        log_error("gguf: %s: out of memory dequantizing '%s'", g->path, t->name);
        return BT_ERR_NOMEM;
    }
    if ((st = gguf_tensor_to_f32(g, t, tmp)) == BT_OK)
        gguf_llama_unpermute_rows(out, tmp, rows, cols, n_head);
    free(tmp);
    return st;
}

/* ---- tokenizer.json ---------------------------------------------------------------
 *
 * Byte-level BPE spells every byte as one printable code point (GPT-2's
 * bytes_to_unicode): the bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for
 * themselves, the other 68 bytes map in order to U+0100..U+0143. GGUF gpt2
 * vocabularies are stored already spelled this way; a token that is not
 * (e.g. "hello world" with a plain space) is respelled from its UTF-8 bytes,
 * which is what transformers' converter does. */

static uint32_t byte_to_cp[256];
static void byte_map_init(void)
{
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        bool self = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
        byte_to_cp[b] = self ? (uint32_t)b : next++;
    }
}

static bool cp_in_alphabet(uint32_t cp)
{
    return (cp >= '!' && cp <= '~') || (cp >= 0xa1 && cp <= 0xac) || (cp >= 0xae && cp <= 0x143);
}

/* Decodes one UTF-8 code point; 0 bytes consumed when invalid. */
static int utf8_decode(const uint8_t *s, uint64_t n, uint32_t *cp)
{
    if (n == 0) return 0;
    if (s[0] < 0x80) { *cp = s[0]; return 1; }
    int len = (s[0] & 0xe0) == 0xc0 ? 2 : (s[0] & 0xf0) == 0xe0 ? 3 : (s[0] & 0xf8) == 0xf0 ? 4 : 0;
    if (len == 0 || (uint64_t)len > n) return 0;
    uint32_t v = s[0] & (0x7f >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min_cp[len] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    *cp = v;
    return len;
}

static int utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    out[0] = (char)(0xe0 | (cp >> 12)); /* the alphabet stops at U+0143 */
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
}

static bool str_in_alphabet(gguf_str_t s)
{
    const uint8_t *p = (const uint8_t *)s.ptr;
    uint64_t left = s.len;
    while (left) {
        uint32_t cp;
        int n = utf8_decode(p, left, &cp);
        if (n == 0 || !cp_in_alphabet(cp)) return false;
        p += n;
        left -= (uint64_t)n;
    }
    return true;
}

/* The vocabulary key for a token: itself when already byte-level spelled,
 * else its bytes respelled. NULL on allocation failure. */
static json_t *token_key(gguf_str_t s)
{
    if (str_in_alphabet(s)) return json_stringn(s.ptr, (size_t)s.len);
    char *buf = malloc((size_t)s.len * 2 + 1); /* each byte -> at most 2 UTF-8 bytes */
    if (!buf) return NULL;
    size_t n = 0;
    for (uint64_t i = 0; i < s.len; i++) n += (size_t)utf8_encode(byte_to_cp[(uint8_t)s.ptr[i]], buf + n);
    json_t *j = json_stringn(buf, n);
    free(buf);
    return j;
}

static json_t *byte_level_json(bool add_prefix_space)
{
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", add_prefix_space,
                     "trim_offsets", 1, "use_regex", 1);
}

/* llama.cpp pre-tokenizer names (tokenizer.ggml.pre) we can express. Those
 * of the first list split text into single digits (regex "\p{N}") before the
 * GPT-2 regex, which in tokenizers terms is Digits(individual) then
 * ByteLevel; those of the second use the GPT-2 regex alone. */
static const char *const pre_digits_then_gpt2[] = {
    "smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b",
};
static const char *const pre_gpt2[] = {"default", "gpt2", "gpt-2", "mpt", "olmo", "jais"};
/* Those that split by a regex of their own first (a Split, isolated), then
 * spell bytes (ByteLevel without its regex), as transformers' GGUF loader
 * builds them: Llama 3's (digits in runs of up to three) and Qwen2's (single
 * digits). The patterns are those of the models' own tokenizer.json. */
static const char pre_llama3_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char pre_qwen2_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const pre_llama3[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
                                         "pixtral", "midm-2.0", "lfm2", "dbrx", "smaug-bpe"};
static const char *const pre_qwen2[] = {"qwen2", "deepseek-r1-qwen", "megrez"};

static bool pre_in(gguf_str_t pre, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (gguf_str_eq(pre, list[i])) return true;
    return false;
}

static json_t *pre_tokenizer_json(const gguf_t *g, bt_status_t *st)
{
    gguf_str_t pre = {"default", 7};
    *st = gguf_get_str(g, "tokenizer.ggml.pre", &pre);
    if (*st != BT_OK && *st != BT_ERR_NOT_FOUND) return NULL;
    *st = BT_OK;
    if (pre_in(pre, pre_gpt2, sizeof pre_gpt2 / sizeof pre_gpt2[0]))
        return byte_level_json(false);
    if (pre_in(pre, pre_digits_then_gpt2, sizeof pre_digits_then_gpt2 / sizeof pre_digits_then_gpt2[0]))
        return json_pack("{s:s, s:[{s:s, s:b}, o]}", "type", "Sequence", "pretokenizers", "type",
                         "Digits", "individual_digits", 1, byte_level_json(false));
    const char *re = pre_in(pre, pre_llama3, sizeof pre_llama3 / sizeof pre_llama3[0]) ? pre_llama3_regex
                     : pre_in(pre, pre_qwen2, sizeof pre_qwen2 / sizeof pre_qwen2[0])   ? pre_qwen2_regex
                                                                                        : NULL;
    if (re)
        return json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type",
                         "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex", re,
                         "behavior", "Isolated", "invert", 0, "type", "ByteLevel",
                         "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0);
    log_error("gguf: %s: tokenizer.ggml.pre '%.*s' is not supported (see docs/GGUF.md for the list)",
              g->path, (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
    *st = BT_ERR_UNSUPPORTED;
    return NULL;
}

static json_t *added_token_json(int64_t id, gguf_str_t content, bool special)
{
    return json_pack("{s:I, s:s%, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)id, "content",
                     content.ptr, (size_t)content.len, "single_word", 0, "lstrip", 0, "rstrip", 0,
                     "normalized", 0, "special", special);
}

/* TemplateProcessing that adds BOS in front when the file asks for it. */
static json_t *post_processor_json(json_t *vocab_keys, int64_t bos, bool add_bos)
{
    json_t *seq_a = json_pack("{s:{s:s, s:i}}", "Sequence", "id", "A", "type_id", 0);
    json_t *seq_b = json_pack("{s:{s:s, s:i}}", "Sequence", "id", "B", "type_id", 1);
    if (!add_bos || bos < 0)
        return json_pack("{s:s, s:[o], s:[o, o], s:{}}", "type", "TemplateProcessing", "single", seq_a,
                         "pair", json_deep_copy(seq_a), seq_b, "special_tokens");
    const char *bos_str = json_string_value(json_array_get(vocab_keys, (size_t)bos));
    if (!bos_str) {
        json_decref(seq_a);
        json_decref(seq_b);
        return NULL;
    }
    json_t *bos0 = json_pack("{s:{s:s, s:i}}", "SpecialToken", "id", bos_str, "type_id", 0);
    json_t *bos1 = json_pack("{s:{s:s, s:i}}", "SpecialToken", "id", bos_str, "type_id", 1);
    json_t *special = json_pack("{s:{s:s, s:[I], s:[s]}}", bos_str, "id", bos_str, "ids",
                                (json_int_t)bos, "tokens", bos_str);
    return json_pack("{s:s, s:[o, o], s:[o, o, o, o], s:o}", "type", "TemplateProcessing", "single",
                     bos0, seq_a, "pair", json_deep_copy(bos0), json_deep_copy(seq_a), bos1, seq_b,
                     "special_tokens", special);
}

bt_status_t gguf_tokenizer_write_json(const gguf_t *g, const char *path)
{
    bt_status_t st;
    gguf_str_t model;
    if ((st = gguf_get_str(g, "tokenizer.ggml.model", &model)) != BT_OK) {
        if (st == BT_ERR_NOT_FOUND) log_error("gguf: %s: tokenizer.ggml.model is missing", g->path);
        return BT_ERR_INVALID;
    }
    if (!gguf_str_eq(model, "gpt2")) {
        log_error("gguf: %s: tokenizer model '%.*s' is not supported (only gpt2 byte-level BPE)", g->path,
                  (int)(model.len > 64 ? 64 : model.len), model.ptr);
        return BT_ERR_UNSUPPORTED;
    }
    const gguf_value_t *tokens, *merges, *types = NULL;
    if ((st = gguf_get_array(g, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &tokens)) != BT_OK ||
        (st = gguf_get_array(g, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &merges)) != BT_OK) {
        if (st == BT_ERR_NOT_FOUND)
            log_error("gguf: %s: tokenizer.ggml.tokens or tokenizer.ggml.merges is missing", g->path);
        return BT_ERR_INVALID;
    }
    st = gguf_get_array(g, "tokenizer.ggml.token_type", GGUF_TYPE_COUNT, &types);
    if (st == BT_ERR_NOT_FOUND) types = NULL;
    else if (st != BT_OK) return st;
    if (types && (types->arr.n != tokens->arr.n || types->arr.items)) {
        log_error("gguf: %s: tokenizer.ggml.token_type has %" PRIu64 " entries (integers expected) for %"
                  PRIu64 " tokens", g->path, types->arr.n, tokens->arr.n);
        return BT_ERR_INVALID;
    }
    int64_t bos = -1;
    bool add_bos = false;
    if ((st = gguf_get_i64(g, "tokenizer.ggml.bos_token_id", &bos)) != BT_OK && st != BT_ERR_NOT_FOUND)
        return st;
    if ((st = gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos)) != BT_OK && st != BT_ERR_NOT_FOUND)
        return st;
    if (bos >= (int64_t)tokens->arr.n) {
        log_error("gguf: %s: bos_token_id %" PRId64 " is outside the %" PRIu64 "-token vocabulary",
                  g->path, bos, tokens->arr.n);
        return BT_ERR_INVALID;
    }

    byte_map_init();
    st = BT_ERR_NOMEM;
    json_t *root = json_object(), *vocab = json_object(), *keys = json_array();
    json_t *added = json_array(), *merge_list = json_array();
    if (!root || !vocab || !keys || !added || !merge_list) goto fail_json;

    for (uint64_t i = 0; i < tokens->arr.n; i++) {
        gguf_str_t tok = tokens->arr.items[i].str;
        json_t *key = token_key(tok);
        if (!key) {
            log_error("gguf: %s: token %" PRIu64 " cannot be written as JSON", g->path, i);
            goto fail_json;
        }
        if (json_object_set_new(vocab, json_string_value(key), json_integer((json_int_t)i)) != 0 ||
            json_array_append_new(keys, key) != 0)
            goto fail_json;
        int64_t type = 1;
        if (types && gguf_array_i64(types, i, &type) != BT_OK) type = 1;
        /* CONTROL tokens become special added tokens, USER_DEFINED ones plain
         * added tokens; a token outside the byte alphabet marked CONTROL is a
         * mislabel that transformers skips, and so do we. */
        if ((type == 3 || type == 4) && str_in_alphabet(tok)) {
            json_t *a = added_token_json((int64_t)i, tok, type == 3);
            if (!a || json_array_append_new(added, a) != 0) goto fail_json;
        }
    }
    for (uint64_t i = 0; i < merges->arr.n; i++) {
        gguf_str_t m = merges->arr.items[i].str;
        const char *sp = memchr(m.ptr, ' ', (size_t)m.len);
        if (!sp || sp == m.ptr || memchr(sp + 1, ' ', (size_t)(m.len - (uint64_t)(sp + 1 - m.ptr))) ||
            sp + 1 == m.ptr + m.len) {
            log_error("gguf: %s: merge %" PRIu64 " '%.*s' is not two tokens separated by one space", g->path,
                      i, (int)(m.len > 64 ? 64 : m.len), m.ptr);
            st = BT_ERR_INVALID;
            goto fail_json;
        }
        json_t *pair = json_pack("[s%, s%]", m.ptr, (size_t)(sp - m.ptr), sp + 1,
                                 (size_t)(m.len - (uint64_t)(sp + 1 - m.ptr)));
        if (!pair) {
            log_error("gguf: %s: merge %" PRIu64 " is not valid UTF-8", g->path, i);
            st = BT_ERR_INVALID;
            goto fail_json;
        }
        if (json_array_append_new(merge_list, pair) != 0) goto fail_json;
    }

    bt_status_t pst;
    json_t *pre = pre_tokenizer_json(g, &pst);
    if (!pre) {
        st = pst != BT_OK ? pst : BT_ERR_NOMEM;
        goto fail_json;
    }
    json_t *post = post_processor_json(keys, bos, add_bos);
    json_t *model_json = json_pack(
        "{s:s, s:n, s:n, s:s, s:s, s:b, s:b, s:b, s:O, s:O}", "type", "BPE", "dropout", "unk_token",
        "continuing_subword_prefix", "", "end_of_word_suffix", "", "fuse_unk", 0, "byte_fallback", 0,
        "ignore_merges", 0, "vocab", vocab, "merges", merge_list);
    if (!post || !model_json) {
        json_decref(pre);
        json_decref(post);
        json_decref(model_json);
        goto fail_json;
    }
    if (json_object_set_new(root, "version", json_string("1.0")) ||
        json_object_set_new(root, "truncation", json_null()) ||
        json_object_set_new(root, "padding", json_null()) ||
        json_object_set(root, "added_tokens", added) ||
        json_object_set_new(root, "normalizer", json_null()) ||
        json_object_set_new(root, "pre_tokenizer", pre) ||
        json_object_set_new(root, "post_processor", post) ||
        json_object_set_new(root, "decoder", byte_level_json(true)) ||
        json_object_set_new(root, "model", model_json)) {
        goto fail_json;
    }
    if (json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0) {
        log_error("gguf: %s: cannot write %s", g->path, path);
        st = BT_ERR_IO;
        goto fail_json;
    }
    st = BT_OK;

fail_json:
    if (st == BT_ERR_NOMEM) log_error("gguf: %s: out of memory building %s", g->path, path);
    json_decref(root);
    json_decref(vocab);
    json_decref(keys);
    json_decref(added);
    json_decref(merge_list);
    return st;
}
