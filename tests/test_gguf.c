/* GGUF reader, dequantizers, llama -> HF mapping and tokenizer.json.
 *
 * References (tests/fixtures/gguf, written by tools/gen_gguf_fixtures.py):
 * the `gguf` Python package (its writer, reader and dequantize) and
 * transformers' own GGUF loader (config, un-permuted q/k, tokenizer.json),
 * on synthetic files and on excerpts of the real SmolLM2-135M GGUF. */
#include <fcntl.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "ckpt/dequant.h"
#include "ckpt/gguf.h"
#include "tests/helpers/capture.h"
#include "tests/test.h"

#define FIX "tests/fixtures/gguf/"

/* ---- helpers ---------------------------------------------------------------- */

static void *file_read(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rbe");
    if (!f) {
        fprintf(stderr, "cannot open fixture %s (run from the repository root)\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

static float *f32_read(const char *path, size_t *n)
{
    size_t bytes;
    float *v = file_read(path, &bytes);
    *n = bytes / sizeof(float);
    return v;
}

/* Bitwise equality, NaN == NaN; counts and reports the first mismatches. */
static int f32_compare(const char *what, const float *got, const float *want, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &got[i], 4);
        memcpy(&b, &want[i], 4);
        bool same = a == b || (isnan(got[i]) && isnan(want[i]));
        if (!same && bad++ < 5)
            fprintf(stderr, "%s[%zu]: got %.9g (0x%08x), want %.9g (0x%08x)\n", what, i, got[i], a,
                    want[i], b);
    }
    return bad;
}


/* Opens a memory image, expecting failure `want`; returns the message. */
static char *open_mem_expect_fail(const void *buf, size_t size, const char *name, bt_status_t want)
{
    test_capture_t cap;
    gguf_t *g = NULL;
    test_capture_begin(&cap);
    bt_status_t st = gguf_open_mem(buf, size, name, &g);
    char *msg = test_capture_end(&cap);
    CHECK_MSG(st == want, "%s: status %s, want %s", name, bt_status_str(st), bt_status_str(want));
    if (st == BT_OK) gguf_close(g);
    CHECK_MSG(strstr(msg, name) != NULL, "%s: message does not name the file: %s", name, msg);
    return msg;
}

static void put_u32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put_u64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }

/* Position just after the length-prefixed string s (key or tensor name) in
 * buf, searching from `from`. */
static size_t find_after_str(const uint8_t *buf, size_t size, size_t from, const char *s)
{
    size_t n = strlen(s);
    for (size_t i = from; i + 8 + n <= size; i++) {
        uint64_t len = 0;
        for (int k = 7; k >= 0; k--) len = (len << 8) | buf[i + (size_t)k];
        if (len == n && !memcmp(buf + i + 8, s, n)) return i + 8 + n;
    }
    return 0;
}

/* A tiny GGUF builder for hand-made corner cases. */
typedef struct {
    uint8_t b[4096];
    size_t n;
} builder_t;

static void b_u32(builder_t *b, uint32_t v) { put_u32(b->b + b->n, v); b->n += 4; }
static void b_u64(builder_t *b, uint64_t v) { put_u64(b->b + b->n, v); b->n += 8; }
static void b_str(builder_t *b, const char *s)
{
    b_u64(b, strlen(s));
    memcpy(b->b + b->n, s, strlen(s));
    b->n += strlen(s);
}
static void b_header(builder_t *b, uint64_t n_tensors, uint64_t n_kv)
{
    b->n = 0;
    b_u32(b, GGUF_MAGIC);
    b_u32(b, 3);
    b_u64(b, n_tensors);
    b_u64(b, n_kv);
}
static void b_pad(builder_t *b, size_t align) { while (b->n % align) b->b[b->n++] = 0; }

static json_t *json_load_fixture(const char *path)
{
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j) fprintf(stderr, "%s:%d: %s\n", path, err.line, err.text);
    return j;
}

/* ---- metadata ------------------------------------------------------------------ */

/* Compares a parsed value with its JSON description (types: outer..inner). */
static bool value_matches(const gguf_value_t *v, json_t *types, size_t level, json_t *want)
{
    gguf_type_t t = (gguf_type_t)json_integer_value(json_array_get(types, level));
    if (v->type != t) {
        fprintf(stderr, "type %s, want %s\n", gguf_type_name(v->type), gguf_type_name(t));
        return false;
    }
    switch (t) {
    case GGUF_TYPE_U8: case GGUF_TYPE_U16: case GGUF_TYPE_U32: case GGUF_TYPE_U64:
        /* values above INT64_MAX are written as decimal strings (jansson
         * holds integers as int64) */
        if (json_is_string(want)) return v->u64 == strtoull(json_string_value(want), NULL, 10);
        return json_is_integer(want) && (json_int_t)v->u64 == json_integer_value(want);
    case GGUF_TYPE_I8: case GGUF_TYPE_I16: case GGUF_TYPE_I32: case GGUF_TYPE_I64:
        return v->i64 == json_integer_value(want);
    case GGUF_TYPE_F32: case GGUF_TYPE_F64:
        return v->f64 == json_number_value(want);
    case GGUF_TYPE_BOOL:
        return v->b == json_is_true(want);
    case GGUF_TYPE_STRING:
        return v->str.len == json_string_length(want) &&
               !memcmp(v->str.ptr, json_string_value(want), v->str.len);
    case GGUF_TYPE_ARRAY: {
        gguf_type_t et = (gguf_type_t)json_integer_value(json_array_get(types, level + 1));
        if (v->arr.elem_type != et || v->arr.n != json_array_size(want)) return false;
        for (uint64_t i = 0; i < v->arr.n; i++) {
            json_t *w = json_array_get(want, i);
            if (et == GGUF_TYPE_STRING) {
                gguf_str_t s;
                if (gguf_array_str(v, i, &s) != BT_OK || s.len != json_string_length(w) ||
                    memcmp(s.ptr, json_string_value(w), s.len))
                    return false;
            } else if (et == GGUF_TYPE_ARRAY) {
                if (!value_matches(&v->arr.items[i], types, level + 1, w)) return false;
            } else if (et == GGUF_TYPE_F32 || et == GGUF_TYPE_F64) {
                double d;
                if (gguf_array_f64(v, i, &d) != BT_OK || d != json_number_value(w)) return false;
            } else {
                int64_t x;
                if (gguf_array_i64(v, i, &x) != BT_OK) return false;
                if (et == GGUF_TYPE_BOOL ? (x != 0) != json_is_true(w) : x != json_integer_value(w))
                    return false;
            }
        }
        return true;
    }
    default:
        return false;
    }
}

static void check_metadata(const gguf_t *g, json_t *meta)
{
    const char *key;
    json_t *want;
    size_t n = 0;
    json_object_foreach(meta, key, want) {
        const gguf_kv_t *kv = gguf_kv_find(g, key);
        CHECK_MSG(kv != NULL, "key %s missing", key);
        if (!kv) continue;
        json_t *types = json_object_get(want, "types");
        CHECK_MSG(value_matches(&kv->value, types, 0, json_object_get(want, "value")), "key %s differs", key);
        n++;
    }
    CHECK(n == g->n_kv);
}

static void test_gguf_metadata_all_types(void)
{
    json_t *j = json_load_fixture(FIX "tiny_meta.json");
    REQUIRE(j);
    gguf_t *g;
    REQUIRE(gguf_open(FIX "tiny_meta.gguf", &g) == BT_OK);
    check_metadata(g, json_object_get(j, "metadata"));
    CHECK(g->version == 3);
    CHECK(g->alignment == 64);

    /* typed getters: conversions that fit, refusals that do not */
    uint64_t u;
    int64_t i;
    double d;
    bool b;
    gguf_str_t s;
    const gguf_value_t *arr;
    CHECK(gguf_get_u64(g, "test.u64", &u) == BT_OK && u == 18000000000000000000ull);
    CHECK(gguf_get_i64(g, "test.i8", &i) == BT_OK && i == -100);
    CHECK(gguf_get_i64(g, "test.u32", &i) == BT_OK && i == 4000000000ll);
    CHECK(gguf_get_f64(g, "test.f32", &d) == BT_OK && d == (double)0.1f);
    CHECK(gguf_get_bool(g, "test.bool", &b) == BT_OK && b);
    CHECK(gguf_get_str(g, "test.string", &s) == BT_OK && gguf_str_eq(s, "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c"));
    CHECK(gguf_get_array(g, "test.nested", GGUF_TYPE_ARRAY, &arr) == BT_OK && arr->arr.n == 2);
    CHECK(gguf_get_u64(g, "no.such.key", &u) == BT_ERR_NOT_FOUND);
    test_capture_t cap;
    test_capture_begin(&cap);
    bt_status_t s1 = gguf_get_u64(g, "test.i8", &u);         /* negative */
    bt_status_t s2 = gguf_get_i64(g, "test.u64", &i);        /* > INT64_MAX */
    bt_status_t s3 = gguf_get_str(g, "test.u8", &s);         /* wrong type */
    bt_status_t s4 = gguf_get_array(g, "test.arr_i16", GGUF_TYPE_STRING, &arr);
    bt_status_t s5 = gguf_get_f64(g, "test.i32", &d);
    char *msg = test_capture_end(&cap);
    CHECK(s1 == BT_ERR_INVALID && s2 == BT_ERR_INVALID && s3 == BT_ERR_INVALID);
    CHECK(s4 == BT_ERR_INVALID && s5 == BT_ERR_INVALID);
    CHECK(strstr(msg, "test.u8") && strstr(msg, "expected string"));
    free(msg);

    /* two F32 tensors placed by alignment 64 */
    json_t *tens = json_object_get(j, "tensors");
    const char *names[] = {"a", "b"};
    for (int k = 0; k < 2; k++) {
        const gguf_tensor_t *t = gguf_tensor_find(g, names[k]);
        REQUIRE(t);
        json_t *w = json_object_get(tens, names[k]);
        CHECK((json_int_t)(t->data - g->base) == json_integer_value(json_object_get(w, "file_offset")));
        CHECK((json_int_t)t->nbytes == json_integer_value(json_object_get(w, "nbytes")));
        CHECK(t->offset % 64 == 0);
    }
    float a[5];
    REQUIRE(gguf_tensor_to_f32(g, gguf_tensor_find(g, "a"), a) == BT_OK);
    for (int k = 0; k < 5; k++) CHECK(a[k] == (float)k);
    gguf_close(g);
    json_decref(j);
}

/* Every tensor of the synthetic llama file: info and dequantized values. */
static void test_gguf_tiny_tensors(void)
{
    json_t *j = json_load_fixture(FIX "tiny_llama.json");
    REQUIRE(j);
    size_t n_expect;
    float *expect = f32_read(FIX "tiny_llama.f32", &n_expect);
    REQUIRE(expect);
    gguf_t *g;
    REQUIRE(gguf_open(FIX "tiny_llama.gguf", &g) == BT_OK);
    check_metadata(g, json_object_get(j, "metadata"));
    json_t *tens = json_object_get(j, "tensors");
    CHECK(g->n_tensors == json_array_size(tens));
    size_t idx;
    json_t *w;
    json_array_foreach(tens, idx, w) {
        const char *name = json_string_value(json_object_get(w, "name"));
        const gguf_tensor_t *t = gguf_tensor_find(g, name);
        CHECK_MSG(t != NULL, "tensor %s missing", name);
        if (!t) continue;
        CHECK(t == &g->tensors[idx]); /* file order kept */
        CHECK(t->type == (uint32_t)json_integer_value(json_object_get(w, "type")));
        json_t *ne = json_object_get(w, "ne");
        CHECK(t->n_dims == json_array_size(ne));
        for (size_t d = 0; d < json_array_size(ne); d++)
            CHECK(t->ne[d] == json_integer_value(json_array_get(ne, d)));
        CHECK(t->n_elems == json_integer_value(json_object_get(w, "n_elems")));
        CHECK((json_int_t)t->nbytes == json_integer_value(json_object_get(w, "nbytes")));
        CHECK((json_int_t)t->offset == json_integer_value(json_object_get(w, "offset")));
        CHECK((json_int_t)(t->data - g->base) == json_integer_value(json_object_get(w, "file_offset")));
        float *out = malloc((size_t)t->n_elems * sizeof *out);
        REQUIRE(out);
        CHECK(gguf_tensor_to_f32(g, t, out) == BT_OK);
        size_t off = (size_t)json_integer_value(json_object_get(w, "expect_offset"));
        REQUIRE(off + (size_t)t->n_elems <= n_expect);
        CHECK_MSG(f32_compare(name, out, expect + off, (size_t)t->n_elems) == 0, "%s values", name);
        free(out);
    }
    CHECK(gguf_tensor_find(g, "no.such.tensor") == NULL);
    gguf_close(g);
    free(expect);
    json_decref(j);
}

/* The same file as version 2 (identical layout for little-endian files). */
static void test_gguf_version2(void)
{
    size_t size;
    uint8_t *buf = file_read(FIX "tiny_llama.gguf", &size);
    REQUIRE(buf);
    put_u32(buf + 4, 2);
    gguf_t *g;
    REQUIRE(gguf_open_mem(buf, size, "v2", &g) == BT_OK);
    CHECK(g->version == 2);
    CHECK(g->n_tensors == 15);
    CHECK(gguf_tensor_find(g, "output.weight") != NULL);
    gguf_close(g);
    free(buf);
}

/* ---- dequantizers ----------------------------------------------------------------- */

static void check_type_fixture(const char *name, uint32_t type)
{
    char p1[256], p2[256];
    snprintf(p1, sizeof p1, FIX "types/%s.bin", name);
    snprintf(p2, sizeof p2, FIX "types/%s.f32", name);
    size_t nbytes, n;
    uint8_t *raw = file_read(p1, &nbytes);
    float *want = f32_read(p2, &n);
    CHECK_MSG(raw && want, "fixture %s", name);
    if (!raw || !want) goto done;
    uint64_t need;
    CHECK(dequant_row_bytes(type, (int64_t)n, &need) == BT_OK && need == nbytes);
    float *got = malloc(n * sizeof *got);
    CHECK(dequant_row_f32(type, raw, (int64_t)n, got) == BT_OK);
    CHECK_MSG(f32_compare(name, got, want, n) == 0, "%s: values differ from gguf.quants.dequantize", name);
    /* unaligned source: blocks are read byte by byte */
    uint8_t *shifted = malloc(nbytes + 1);
    memcpy(shifted + 1, raw, nbytes);
    CHECK(dequant_row_f32(type, shifted + 1, (int64_t)n, got) == BT_OK);
    CHECK(f32_compare(name, got, want, n) == 0);
    free(shifted);
    free(got);
done:
    free(raw);
    free(want);
}

static void test_gguf_dequant_types(void)
{
    check_type_fixture("F32", DEQUANT_F32);
    check_type_fixture("F16", DEQUANT_F16);
    check_type_fixture("BF16", DEQUANT_BF16);
    check_type_fixture("Q4_0", DEQUANT_Q4_0);
    check_type_fixture("Q4_1", DEQUANT_Q4_1);
    check_type_fixture("Q8_0", DEQUANT_Q8_0);
    check_type_fixture("Q4_K", DEQUANT_Q4_K);
    check_type_fixture("Q5_K", DEQUANT_Q5_K);
    check_type_fixture("Q6_K", DEQUANT_Q6_K);
}

/* Real SmolLM2 blocks (the types that file holds). */
static void test_gguf_dequant_real(void)
{
    check_type_fixture("real_Q4_1", DEQUANT_Q4_1);
    check_type_fixture("real_Q8_0", DEQUANT_Q8_0);
    check_type_fixture("real_F32", DEQUANT_F32);
}

/* All 65536 binary16 patterns against the arithmetic definition. */
static void test_gguf_f16_all_patterns(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
        double want;
        if (e == 31) want = m ? NAN : INFINITY;
        else if (e == 0) want = ldexp((double)m, -24);
        else want = ldexp(1.0 + m / 1024.0, e - 15);
        if (sign) want = -want;
        float got = dequant_f16_to_f32((uint16_t)h);
        bool ok = isnan(want) ? isnan(got) : (got == (float)want && !!signbit(got) == !!signbit(want));
        if (!ok && bad++ < 5) fprintf(stderr, "f16 0x%04x: got %g want %g\n", h, got, want);
    }
    CHECK(bad == 0);
    CHECK(dequant_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(dequant_bf16_to_f32(0xc040) == -3.0f);
}

static void test_gguf_dequant_errors(void)
{
    uint8_t blk[256] = {0};
    float out[64];
    uint64_t nb;
    CHECK(dequant_row_f32(DEQUANT_Q8_0, blk, 33, out) == BT_ERR_INVALID);   /* not whole blocks */
    CHECK(dequant_row_f32(DEQUANT_Q5_0, blk, 32, out) == BT_ERR_UNSUPPORTED); /* known, no decoder */
    CHECK(dequant_row_f32(99, blk, 32, out) == BT_ERR_UNSUPPORTED);
    CHECK(dequant_row_f32(4, blk, 32, out) == BT_ERR_UNSUPPORTED);          /* removed id */
    CHECK(dequant_row_bytes(DEQUANT_Q4_K, 512, &nb) == BT_OK && nb == 288);
    CHECK(dequant_row_bytes(DEQUANT_Q4_K, 100, &nb) == BT_ERR_INVALID);
    CHECK(dequant_row_bytes(DEQUANT_F32, INT64_MAX, &nb) == BT_ERR_INVALID); /* overflow */
    CHECK(dequant_type_info(200)->name == NULL);
    CHECK(!strcmp(dequant_type_info(DEQUANT_Q6_K)->name, "Q6_K"));
}

/* ---- llama -> HF ------------------------------------------------------------------- */

static void test_gguf_llama_config(void)
{
    json_t *j = json_load_fixture(FIX "tiny_llama.json");
    REQUIRE(j);
    json_t *c = json_object_get(j, "config");
    gguf_t *g;
    REQUIRE(gguf_open(FIX "tiny_llama.gguf", &g) == BT_OK);
    gguf_llama_config_t cfg;
    REQUIRE(gguf_llama_config(g, &cfg) == BT_OK);
#define CFG_INT(f) CHECK_MSG(cfg.f == json_integer_value(json_object_get(c, #f)), #f " %lld", (long long)cfg.f)
    CFG_INT(vocab_size);
    CFG_INT(hidden_size);
    CFG_INT(intermediate_size);
    CFG_INT(num_hidden_layers);
    CFG_INT(num_attention_heads);
    CFG_INT(num_key_value_heads);
    CFG_INT(head_dim);
    CFG_INT(max_position_embeddings);
    CFG_INT(bos_token_id);
    CFG_INT(eos_token_id);
    CFG_INT(pad_token_id);
#undef CFG_INT
    CHECK(cfg.rope_theta == json_real_value(json_object_get(c, "rope_theta")));
    CHECK(cfg.rms_norm_eps == json_real_value(json_object_get(c, "rms_norm_eps")));
    CHECK(cfg.tie_word_embeddings == json_is_true(json_object_get(c, "tie_word_embeddings")));
    CHECK(cfg.rope_linear_factor == 0);
    CHECK(cfg.unk_token_id == 0);

    /* config.json text: every field we write that transformers also writes
     * has its value; the two legacy RoPE fields are extra */
    char *text;
    REQUIRE(gguf_llama_config_json(&cfg, &text) == BT_OK);
    json_error_t jerr;
    json_t *mine = json_loads(text, 0, &jerr), *theirs = json_object_get(j, "config_json");
    free(text);
    REQUIRE(mine && theirs);
    const char *key;
    json_t *v;
    size_t n_same = 0;
    json_object_foreach(mine, key, v) {
        json_t *t = json_object_get(theirs, key);
        if (!t) {
            CHECK_MSG(!strcmp(key, "rope_theta") || !strcmp(key, "rope_scaling"), "extra key %s", key);
            continue;
        }
        bool same = json_is_number(v) && json_is_number(t) ? json_number_value(v) == json_number_value(t)
                                                           : json_equal(v, t);
        if (json_is_object(v)) { /* rope_parameters: numbers inside */
            const char *k2;
            json_t *v2;
            same = json_object_size(v) == json_object_size(t);
            json_object_foreach(v, k2, v2) {
                json_t *t2 = json_object_get(t, k2);
                same &= t2 && (json_is_number(v2) ? json_number_value(v2) == json_number_value(t2)
                                                  : json_equal(v2, t2));
            }
        }
        CHECK_MSG(same, "config.json '%s' differs from transformers'", key);
        n_same++;
    }
    CHECK(n_same >= 20);
    json_decref(mine);

    /* every tensor maps to exactly the HF names transformers loaded */
    json_t *keys = json_object_get(j, "hf_keys");
    size_t mapped = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        char hf[128];
        gguf_permute_t perm;
        bt_status_t st = gguf_llama_tensor_name(g->tensors[i].name, hf, sizeof hf, &perm);
        if (!strncmp(g->tensors[i].name, "extra.", 6)) {
            CHECK(st == BT_ERR_NOT_FOUND);
            continue;
        }
        CHECK_MSG(st == BT_OK, "%s unmapped", g->tensors[i].name);
        bool found = false;
        for (size_t k = 0; k < json_array_size(keys); k++)
            found |= !strcmp(hf, json_string_value(json_array_get(keys, k)));
        CHECK_MSG(found, "%s -> %s is not a transformers key", g->tensors[i].name, hf);
        mapped++;
    }
    CHECK(mapped == json_array_size(keys));
    gguf_close(g);
    json_decref(j);
}

/* Opens a patched copy of tiny_llama.gguf and runs the llama config (or the
 * tokenizer writer), expecting `want` and a message containing `needle`. */
static void check_llama_patch(const char *name, const char *key, ptrdiff_t value_off, const void *bytes,
                              size_t n, bool tokenizer, bt_status_t want, const char *needle)
{
    size_t size;
    uint8_t *buf = file_read(FIX "tiny_llama.gguf", &size);
    REQUIRE(buf);
    size_t p = find_after_str(buf, size, 24, key);
    REQUIRE(p);
    memcpy(buf + (ptrdiff_t)p + value_off, bytes, n);
    gguf_t *g;
    REQUIRE(gguf_open_mem(buf, size, name, &g) == BT_OK);
    test_capture_t cap;
    test_capture_begin(&cap);
    gguf_llama_config_t cfg;
    bt_status_t st = tokenizer ? gguf_tokenizer_write_json(g, "/tmp/baton_gguf_never_written.json")
                               : gguf_llama_config(g, &cfg);
    char *msg = test_capture_end(&cap);
    CHECK_MSG(st == want, "%s: %s", name, bt_status_str(st));
    CHECK_MSG(strstr(msg, name) && strstr(msg, needle), "%s: message '%s'", name, msg);
    free(msg);
    gguf_close(g);
    free(buf);
}

static void test_gguf_llama_config_errors(void)
{
    uint8_t u32[4];
    /* string values: u32 type | u64 length | bytes, so the bytes start at +12 */
    check_llama_patch("arch", "general.architecture", 12, "llamb", 5, false, BT_ERR_UNSUPPORTED, "llamb");
    check_llama_patch("missing", "llama.block_count", -5, "cxunt", 5, false, BT_ERR_INVALID,
                      "'llama.block_count' is missing");
    put_u32(u32, 3);
    check_llama_patch("kvheads", "llama.attention.head_count_kv", 4, u32, 4, false, BT_ERR_INVALID,
                      "head_count_kv 3");
    put_u32(u32, 8);
    check_llama_patch("rotary", "llama.rope.dimension_count", 4, u32, 4, false, BT_ERR_UNSUPPORTED,
                      "partial rotary");
    put_u32(u32, GGUF_TYPE_U32); /* rms epsilon read as an integer: wrong type */
    check_llama_patch("epstype", "llama.attention.layer_norm_rms_epsilon", 0, u32, 4, false,
                      BT_ERR_INVALID, "expected f32 or f64");
    check_llama_patch("pre", "tokenizer.ggml.pre", 12, "gpt3", 4, true, BT_ERR_UNSUPPORTED, "gpt3");
    check_llama_patch("tokmodel", "tokenizer.ggml.model", 12, "bert", 4, true, BT_ERR_UNSUPPORTED, "bert");
    check_llama_patch("merge", "tokenizer.ggml.merges", 24, "a_b", 3, true, BT_ERR_INVALID,
                      "not two tokens");
}

static void test_gguf_llama_names(void)
{
    static const struct { const char *gguf, *hf; gguf_permute_t perm; } cases[] = {
        {"token_embd.weight", "model.embed_tokens.weight", GGUF_PERMUTE_NONE},
        {"output_norm.weight", "model.norm.weight", GGUF_PERMUTE_NONE},
        {"output.weight", "lm_head.weight", GGUF_PERMUTE_NONE},
        {"blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight", GGUF_PERMUTE_NONE},
        {"blk.12.attn_q.weight", "model.layers.12.self_attn.q_proj.weight", GGUF_PERMUTE_Q},
        {"blk.29.attn_k.weight", "model.layers.29.self_attn.k_proj.weight", GGUF_PERMUTE_K},
        {"blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight", GGUF_PERMUTE_NONE},
        {"blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight", GGUF_PERMUTE_NONE},
        {"blk.3.attn_q.bias", "model.layers.3.self_attn.q_proj.bias", GGUF_PERMUTE_Q},
        {"blk.3.attn_k.bias", "model.layers.3.self_attn.k_proj.bias", GGUF_PERMUTE_K},
        {"blk.7.ffn_norm.weight", "model.layers.7.post_attention_layernorm.weight", GGUF_PERMUTE_NONE},
        {"blk.7.ffn_gate.weight", "model.layers.7.mlp.gate_proj.weight", GGUF_PERMUTE_NONE},
        {"blk.7.ffn_up.weight", "model.layers.7.mlp.up_proj.weight", GGUF_PERMUTE_NONE},
        {"blk.7.ffn_down.weight", "model.layers.7.mlp.down_proj.weight", GGUF_PERMUTE_NONE},
    };
    char hf[128];
    gguf_permute_t perm;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_MSG(gguf_llama_tensor_name(cases[i].gguf, hf, sizeof hf, &perm) == BT_OK, "%s", cases[i].gguf);
        CHECK_MSG(!strcmp(hf, cases[i].hf), "%s -> %s", cases[i].gguf, hf);
        CHECK(perm == cases[i].perm);
    }
    const char *unmapped[] = {"rope_freqs.weight", "blk.x.attn_q.weight", "blk.01.attn_q.weight",
                              "blk..attn_q.weight", "blk.1.attn_q", "blk.1.attn_q.weight.x",
                              "blk.99999999999999999999.attn_q.weight", "token_embd", ""};
    for (size_t i = 0; i < sizeof unmapped / sizeof unmapped[0]; i++)
        CHECK_MSG(gguf_llama_tensor_name(unmapped[i], hf, sizeof hf, &perm) == BT_ERR_NOT_FOUND, "%s",
                  unmapped[i]);
    CHECK(gguf_llama_tensor_name("blk.1.attn_q.weight", hf, 10, &perm) == BT_ERR_INVALID);
}

/* Q/K un-permutation against transformers on the synthetic file. */
static void test_gguf_unpermute_tiny(void)
{
    size_t n;
    float *want = f32_read(FIX "tiny_llama_hf.f32", &n);
    REQUIRE(want);
    gguf_t *g;
    REQUIRE(gguf_open(FIX "tiny_llama.gguf", &g) == BT_OK);
    gguf_llama_config_t cfg;
    REQUIRE(gguf_llama_config(g, &cfg) == BT_OK);
    const gguf_tensor_t *q = gguf_tensor_find(g, "blk.0.attn_q.weight");
    const gguf_tensor_t *k = gguf_tensor_find(g, "blk.0.attn_k.weight");
    REQUIRE(q && k && (size_t)(q->n_elems + k->n_elems) == n);
    float *out = malloc(n * sizeof *out);
    CHECK(gguf_llama_tensor_to_hf_f32(g, &cfg, q, out) == BT_OK);
    CHECK(gguf_llama_tensor_to_hf_f32(g, &cfg, k, out + q->n_elems) == BT_OK);
    CHECK(f32_compare("q/k", out, want, n) == 0);
    /* and the permutation matters: the plain dequantized rows differ */
    CHECK(gguf_tensor_to_f32(g, q, out) == BT_OK);
    CHECK(memcmp(out, want, (size_t)q->n_elems * sizeof *out) != 0);
    free(out);
    gguf_close(g);
    free(want);
}

/* Real SmolLM2 excerpts against what transformers loaded from the full file. */
static void test_gguf_smollm2_excerpt(void)
{
    gguf_t *g;
    REQUIRE(gguf_open(FIX "smollm2_excerpt.gguf", &g) == BT_OK);
    gguf_llama_config_t cfg = {0};
    /* The excerpt keeps the real llama metadata but only slices of the
     * tensors, so the head geometry is read key by key here. */
    REQUIRE(gguf_get_i64(g, "llama.attention.head_count", &cfg.num_attention_heads) == BT_OK);
    REQUIRE(gguf_get_i64(g, "llama.attention.head_count_kv", &cfg.num_key_value_heads) == BT_OK);
    REQUIRE(gguf_get_i64(g, "llama.embedding_length", &cfg.hidden_size) == BT_OK);
    CHECK(cfg.num_attention_heads == 9 && cfg.num_key_value_heads == 3 && cfg.hidden_size == 576);
    cfg.head_dim = cfg.hidden_size / cfg.num_attention_heads;
    double theta;
    CHECK(gguf_get_f64(g, "llama.rope.freq_base", &theta) == BT_OK && theta == 100000.0);
    int n_checked = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor_t *t = &g->tensors[i];
        char hf[128], path[256];
        gguf_permute_t perm;
        REQUIRE(gguf_llama_tensor_name(t->name, hf, sizeof hf, &perm) == BT_OK);
        snprintf(path, sizeof path, FIX "smollm2_hf/%s.f32", hf);
        size_t n;
        float *want = f32_read(path, &n);
        REQUIRE(want);
        CHECK((int64_t)n == t->n_elems);
        float *out = malloc(n * sizeof *out);
        CHECK(gguf_llama_tensor_to_hf_f32(g, &cfg, t, out) == BT_OK);
        CHECK_MSG(f32_compare(hf, out, want, n) == 0, "%s differs from transformers", hf);
        free(out);
        free(want);
        n_checked++;
    }
    CHECK(n_checked == 5);
    CHECK(gguf_tensor_find(g, "blk.0.attn_q.weight")->type == DEQUANT_Q4_1);
    CHECK(gguf_tensor_find(g, "token_embd.weight")->type == DEQUANT_Q8_0);
    gguf_close(g);
}

/* ---- tokenizer.json ------------------------------------------------------------------ */

static void check_tokenizer(const char *gguf_path, const char *want_path)
{
    char out[] = "/tmp/baton_gguf_tok_XXXXXX";
    int fd = mkostemp(out, O_CLOEXEC);
    REQUIRE(fd >= 0);
    close(fd);
    gguf_t *g;
    REQUIRE(gguf_open(gguf_path, &g) == BT_OK);
    CHECK(gguf_tokenizer_write_json(g, out) == BT_OK);
    gguf_close(g);
    json_t *got = json_load_fixture(out), *want = json_load_fixture(want_path);
    unlink(out);
    REQUIRE(got && want);
    const char *key;
    json_t *w;
    json_object_foreach(want, key, w) {
        json_t *gv = json_object_get(got, key);
        if (!json_equal(gv, w)) {
            char *a = json_dumps(gv, JSON_COMPACT), *b = json_dumps(w, JSON_COMPACT);
            CHECK_MSG(0, "%s: '%s' differs:\n got  %.300s\n want %.300s", gguf_path, key, a ? a : "(null)", b);
            free(a);
            free(b);
        }
    }
    CHECK(json_object_size(got) == json_object_size(want));
    json_decref(got);
    json_decref(want);
}

static void test_gguf_tokenizer_matches_transformers(void)
{
    check_tokenizer(FIX "tiny_llama.gguf", FIX "tiny_tokenizer.json");
}

static void test_gguf_tokenizer_smollm_pre(void)
{
    check_tokenizer(FIX "tiny_smollm_tok.gguf", FIX "tiny_smollm_tok.json");
}

/* ---- malformed files ------------------------------------------------------------------- */

static void test_gguf_truncated_everywhere(void)
{
    size_t size;
    uint8_t *buf = file_read(FIX "tiny_llama.gguf", &size);
    REQUIRE(buf);
    gguf_t *g;
    REQUIRE(gguf_open_mem(buf, size, "full", &g) == BT_OK);
    size_t data_start = (size_t)g->data_offset;
    gguf_close(g);
    int fails = 0, opened = 0, unnamed = 0;
    /* every cut inside the header, metadata and tensor infos, then every
     * 97th byte of the data section */
    for (size_t cut = 0; cut < size; cut += cut < data_start + 64 ? 1 : 97) {
        uint8_t *copy = malloc(cut ? cut : 1); /* exact size: ASan sees any over-read */
        memcpy(copy, buf, cut);
        test_capture_t cap;
        test_capture_begin(&cap);
        bt_status_t st = gguf_open_mem(copy, cut, "cut.gguf", &g);
        char *msg = test_capture_end(&cap);
        if (st == BT_OK) {
            opened++;
            gguf_close(g);
        } else {
            fails += st == BT_ERR_INVALID;
            unnamed += !strstr(msg, "cut.gguf") || !strstr(msg, "offset");
        }
        free(msg);
        free(copy);
    }
    CHECK_MSG(opened == 0, "%d truncated images opened", opened);
    CHECK(fails > (int)data_start);
    CHECK_MSG(unnamed == 0, "%d errors without file name and offset", unnamed);

    /* through the file path too: the message names the file */
    char path[] = "/tmp/baton_gguf_cut_XXXXXX";
    int fd = mkostemp(path, O_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, buf, 100) == 100);
    close(fd);
    test_capture_t cap;
    test_capture_begin(&cap);
    bt_status_t st = gguf_open(path, &g);
    char *msg = test_capture_end(&cap);
    CHECK(st == BT_ERR_INVALID);
    CHECK(strstr(msg, path) && strstr(msg, "offset"));
    free(msg);
    unlink(path);
    free(buf);
}

static void test_gguf_bad_header(void)
{
    size_t size;
    uint8_t *buf = file_read(FIX "tiny_llama.gguf", &size);
    REQUIRE(buf);
    uint8_t *b = malloc(size);
    char *msg;

    memcpy(b, buf, size);
    memcpy(b, "GGUG", 4);
    msg = open_mem_expect_fail(b, size, "magic.gguf", BT_ERR_INVALID);
    CHECK(strstr(msg, "not a GGUF file"));
    free(msg);

    const uint32_t versions[] = {0, 1, 4, 0x03000000u};
    for (int i = 0; i < 4; i++) {
        memcpy(b, buf, size);
        put_u32(b + 4, versions[i]);
        msg = open_mem_expect_fail(b, size, "version.gguf", BT_ERR_UNSUPPORTED);
        CHECK(strstr(msg, "version") || strstr(msg, "big-endian"));
        free(msg);
    }

    memcpy(b, buf, size);
    put_u64(b + 8, UINT64_MAX); /* tensor count */
    msg = open_mem_expect_fail(b, size, "ntensors.gguf", BT_ERR_INVALID);
    CHECK(strstr(msg, "cannot fit"));
    free(msg);
    memcpy(b, buf, size);
    put_u64(b + 16, 1ull << 60); /* metadata count */
    msg = open_mem_expect_fail(b, size, "nkv.gguf", BT_ERR_INVALID);
    CHECK(strstr(msg, "cannot fit"));
    free(msg);
    memcpy(b, buf, size);
    put_u64(b + 16, 1000); /* more entries than there are: runs into the tensor infos */
    msg = open_mem_expect_fail(b, size, "nkv2.gguf", BT_ERR_INVALID);
    free(msg);

    /* a string value whose length runs past the end */
    memcpy(b, buf, size);
    size_t p = find_after_str(b, size, 24, "general.name");
    REQUIRE(p);
    put_u64(b + p + 4, (uint64_t)size); /* after the u32 value type */
    msg = open_mem_expect_fail(b, size, "strlen.gguf", BT_ERR_INVALID);
    CHECK(strstr(msg, "runs past the end") && strstr(msg, "general.name"));
    free(msg);
    /* a key longer than the limit */
    memcpy(b, buf, size);
    put_u64(b + 24, 1ull << 40);
    msg = open_mem_expect_fail(b, size, "keylen.gguf", BT_ERR_INVALID);
    CHECK(strstr(msg, "exceeds the limit") && strstr(msg, "offset 24"));
    free(msg);
    /* the token array count made huge */
    memcpy(b, buf, size);
    p = find_after_str(b, size, 24, "tokenizer.ggml.tokens");
    REQUIRE(p);
    put_u64(b + p + 8, 1ull << 62);
    msg = open_mem_expect_fail(b, size, "arrlen.gguf", BT_ERR_INVALID);
    CHECK(strstr(msg, "array length") && strstr(msg, "tokenizer.ggml.tokens"));
    free(msg);
    /* a value type and an array element type that do not exist */
    memcpy(b, buf, size);
    put_u32(b + p, 13);
    msg = open_mem_expect_fail(b, size, "vtype.gguf", BT_ERR_INVALID);
    CHECK(strstr(msg, "not a GGUF type"));
    free(msg);
    memcpy(b, buf, size);
    put_u32(b + p + 4, 77);
    msg = open_mem_expect_fail(b, size, "etype.gguf", BT_ERR_INVALID);
    CHECK(strstr(msg, "array element type 77"));
    free(msg);
    /* a bool that is neither 0 nor 1 */
    memcpy(b, buf, size);
    p = find_after_str(b, size, 24, "tokenizer.ggml.add_bos_token");
    REQUIRE(p);
    b[p + 4] = 2;
    msg = open_mem_expect_fail(b, size, "bool.gguf", BT_ERR_INVALID);
    CHECK(strstr(msg, "bool"));
    free(msg);
    free(b);
    free(buf);
}

static void test_gguf_bad_tensor_infos(void)
{
    size_t size;
    uint8_t *buf = file_read(FIX "tiny_llama.gguf", &size);
    REQUIRE(buf);
    uint8_t *b = malloc(size);
    char *msg;
    /* extra.f32_3d: u32 n_dims | u64 ne[3] | u32 type | u64 offset */
    size_t p = find_after_str(buf, size, 24, "extra.f32_3d");
    size_t q8 = find_after_str(buf, size, 24, "output.weight"); /* Q8_0 [64, 16] */
    REQUIRE(p && q8);

    memcpy(b, buf, size);
    put_u64(b + p + 4 + 24 + 4, 1ull << 40); /* offset beyond the file (aligned) */
    msg = open_mem_expect_fail(b, size, "toff.gguf", BT_ERR_INVALID);
    CHECK(strstr(msg, "extra.f32_3d") && strstr(msg, "runs past the end"));
    free(msg);
    memcpy(b, buf, size);
    put_u64(b + p + 4 + 24 + 4, UINT64_MAX - 31); /* offset + size overflows */
    free(open_mem_expect_fail(b, size, "toff2.gguf", BT_ERR_INVALID));
    memcpy(b, buf, size);
    put_u64(b + p + 4 + 24 + 4, 4); /* unaligned */
    msg = open_mem_expect_fail(b, size, "talign.gguf", BT_ERR_INVALID);
    CHECK(strstr(msg, "alignment"));
    free(msg);

    const uint32_t bad_types[] = {99, 4, 36, 0xffffffffu};
    for (int i = 0; i < 4; i++) {
        memcpy(b, buf, size);
        put_u32(b + p + 4 + 24, bad_types[i]);
        msg = open_mem_expect_fail(b, size, "ttype.gguf", BT_ERR_UNSUPPORTED);
        CHECK(strstr(msg, "unknown ggml type"));
        free(msg);
    }
    memcpy(b, buf, size);
    put_u32(b + p, 5); /* n_dims */
    msg = open_mem_expect_fail(b, size, "ndims.gguf", BT_ERR_INVALID);
    CHECK(strstr(msg, "n_dims"));
    free(msg);
    memcpy(b, buf, size);
    put_u64(b + p + 4, 0); /* a zero dimension */
    free(open_mem_expect_fail(b, size, "dim0.gguf", BT_ERR_INVALID));
    memcpy(b, buf, size);
    put_u64(b + p + 4, 1ull << 40);
    put_u64(b + p + 12, 1ull << 40); /* element count overflows */
    msg = open_mem_expect_fail(b, size, "dimov.gguf", BT_ERR_INVALID);
    CHECK(strstr(msg, "overflow"));
    free(msg);
    memcpy(b, buf, size);
    put_u64(b + q8 + 4, 33); /* Q8_0 row not a whole number of blocks */
    msg = open_mem_expect_fail(b, size, "block.gguf", BT_ERR_INVALID);
    CHECK(strstr(msg, "block size"));
    free(msg);
    free(b);
    free(buf);
}

/* Corner cases built by hand. */
static void test_gguf_handmade(void)
{
    builder_t b;
    gguf_t *g;
    char *msg;

    /* smallest valid file: no metadata, no tensors, no padding */
    b_header(&b, 0, 0);
    REQUIRE(gguf_open_mem(b.b, b.n, "empty", &g) == BT_OK);
    CHECK(g->n_kv == 0 && g->n_tensors == 0 && g->alignment == GGUF_DEFAULT_ALIGNMENT);
    gguf_close(g);

    /* empty arrays, a scalar tensor (n_dims 0), an unknown-but-sized type */
    b_header(&b, 2, 2);
    b_str(&b, "e.strs"); b_u32(&b, GGUF_TYPE_ARRAY); b_u32(&b, GGUF_TYPE_STRING); b_u64(&b, 0);
    b_str(&b, "e.arrs"); b_u32(&b, GGUF_TYPE_ARRAY); b_u32(&b, GGUF_TYPE_ARRAY); b_u64(&b, 0);
    b_str(&b, "s"); b_u32(&b, 0); b_u32(&b, DEQUANT_F32); b_u64(&b, 0);
    b_str(&b, "iq"); b_u32(&b, 1); b_u64(&b, 256); b_u32(&b, DEQUANT_IQ2_XXS); b_u64(&b, 32);
    b_pad(&b, 32);
    float one = 1.5f;
    memcpy(b.b + b.n, &one, 4);
    b.n += 32 + 66;
    REQUIRE(gguf_open_mem(b.b, b.n, "corner", &g) == BT_OK);
    const gguf_value_t *arr;
    CHECK(gguf_get_array(g, "e.strs", GGUF_TYPE_STRING, &arr) == BT_OK && arr->arr.n == 0);
    const gguf_tensor_t *t = gguf_tensor_find(g, "s");
    REQUIRE(t);
    CHECK(t->n_dims == 0 && t->n_elems == 1 && t->nbytes == 4);
    float v = 0;
    CHECK(gguf_tensor_to_f32(g, t, &v) == BT_OK && v == 1.5f);
    t = gguf_tensor_find(g, "iq");
    REQUIRE(t);
    CHECK(t->nbytes == 66);
    float big[256];
    test_capture_t cap;
    test_capture_begin(&cap);
    bt_status_t st = gguf_tensor_to_f32(g, t, big);
    msg = test_capture_end(&cap);
    CHECK(st == BT_ERR_UNSUPPORTED && strstr(msg, "IQ2_XXS"));
    free(msg);
    gguf_close(g);

    /* duplicate key, duplicate tensor */
    b_header(&b, 0, 2);
    b_str(&b, "k"); b_u32(&b, GGUF_TYPE_U8); b.b[b.n++] = 1;
    b_str(&b, "k"); b_u32(&b, GGUF_TYPE_U8); b.b[b.n++] = 2;
    msg = open_mem_expect_fail(b.b, b.n, "dupkey", BT_ERR_INVALID);
    CHECK(strstr(msg, "appears twice"));
    free(msg);
    b_header(&b, 2, 0);
    b_str(&b, "t"); b_u32(&b, 1); b_u64(&b, 1); b_u32(&b, DEQUANT_F32); b_u64(&b, 0);
    b_str(&b, "t"); b_u32(&b, 1); b_u64(&b, 1); b_u32(&b, DEQUANT_F32); b_u64(&b, 32);
    b_pad(&b, 32);
    b.n += 64;
    msg = open_mem_expect_fail(b.b, b.n, "duptensor", BT_ERR_INVALID);
    CHECK(strstr(msg, "appears twice"));
    free(msg);

    /* alignment: not a power of two, zero, wrong type */
    const uint32_t aligns[] = {0, 3, 48};
    for (int i = 0; i < 3; i++) {
        b_header(&b, 0, 1);
        b_str(&b, "general.alignment"); b_u32(&b, GGUF_TYPE_U32); b_u32(&b, aligns[i]);
        msg = open_mem_expect_fail(b.b, b.n, "align", BT_ERR_INVALID);
        CHECK(strstr(msg, "power of two"));
        free(msg);
    }
    b_header(&b, 0, 1);
    b_str(&b, "general.alignment"); b_u32(&b, GGUF_TYPE_U64); b_u64(&b, 64);
    free(open_mem_expect_fail(b.b, b.n, "align64", BT_ERR_INVALID));

    /* arrays nested deeper than the limit */
    b_header(&b, 0, 1);
    b_str(&b, "deep"); b_u32(&b, GGUF_TYPE_ARRAY);
    for (int d = 0; d < GGUF_MAX_DEPTH + 1; d++) { b_u32(&b, GGUF_TYPE_ARRAY); b_u64(&b, 1); }
    msg = open_mem_expect_fail(b.b, b.n, "deep", BT_ERR_INVALID);
    CHECK(strstr(msg, "nested"));
    free(msg);

    /* a tensor name with a NUL inside, a data section that does not exist */
    b_header(&b, 1, 0);
    b_u64(&b, 3); memcpy(b.b + b.n, "a\0b", 3); b.n += 3;
    b_u32(&b, 1); b_u64(&b, 1); b_u32(&b, DEQUANT_F32); b_u64(&b, 0);
    free(open_mem_expect_fail(b.b, b.n, "nulname", BT_ERR_INVALID));
    b_header(&b, 1, 0);
    b_str(&b, "t"); b_u32(&b, 1); b_u64(&b, 1); b_u32(&b, DEQUANT_F32); b_u64(&b, 0);
    msg = open_mem_expect_fail(b.b, b.n, "nodata", BT_ERR_INVALID);
    CHECK(strstr(msg, "data section"));
    free(msg);

    /* files: missing, a directory, empty */
    test_capture_begin(&cap);
    CHECK(gguf_open("/nonexistent/x.gguf", &g) == BT_ERR_IO);
    CHECK(gguf_open("tests", &g) == BT_ERR_INVALID);
    char path[] = "/tmp/baton_gguf_empty_XXXXXX";
    int fd = mkostemp(path, O_CLOEXEC);
    close(fd);
    CHECK(gguf_open(path, &g) == BT_ERR_INVALID);
    unlink(path);
    msg = test_capture_end(&cap);
    CHECK(strstr(msg, "/nonexistent/x.gguf") && strstr(msg, "empty"));
    free(msg);
}

/* A mixture-of-experts llama GGUF (Mixtral: llama.expert_count, the router
 * blk.N.ffn_gate_inp) is refused by name, not read as a dense llama. */
static void test_gguf_llama_moe_refused(void)
{
    builder_t b;
    for (int with_count = 0; with_count < 2; with_count++) {
        b_header(&b, with_count ? 0 : 1, with_count ? 2 : 1);
        b_str(&b, "general.architecture"); b_u32(&b, GGUF_TYPE_STRING); b_str(&b, "llama");
        if (with_count) {
            b_str(&b, "llama.expert_count"); b_u32(&b, GGUF_TYPE_U32); b_u32(&b, 8);
        } else { /* no count, but the router's tensor */
            b_str(&b, "blk.0.ffn_gate_inp.weight"); b_u32(&b, 2); b_u64(&b, 4); b_u64(&b, 2);
            b_u32(&b, DEQUANT_F32); b_u64(&b, 0);
            b_pad(&b, 32);
            b.n += 32;
        }
        gguf_t *g;
        REQUIRE(gguf_open_mem(b.b, b.n, "moe.gguf", &g) == BT_OK);
        test_capture_t cap;
        test_capture_begin(&cap);
        gguf_llama_config_t cfg;
        bt_status_t st = gguf_llama_config(g, &cfg);
        char *msg = test_capture_end(&cap);
        CHECK(st == BT_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(msg, "moe.gguf") && strstr(msg, with_count ? "llama.expert_count=8"
                                                                    : "ffn_gate_inp.weight present") &&
                      strstr(msg, "mixture-of-experts"),
                  "message '%s'", msg);
        free(msg);
        gguf_close(g);
    }
    /* Qwen2-MoE's own architecture (llama.cpp's "qwen2moe"): refused naming it */
    b_header(&b, 0, 1);
    b_str(&b, "general.architecture"); b_u32(&b, GGUF_TYPE_STRING); b_str(&b, "qwen2moe");
    gguf_t *g;
    REQUIRE(gguf_open_mem(b.b, b.n, "qmoe.gguf", &g) == BT_OK);
    test_capture_t cap;
    test_capture_begin(&cap);
    gguf_llama_config_t cfg;
    bt_status_t st = gguf_llama_config(g, &cfg);
    char *msg = test_capture_end(&cap);
    CHECK(st == BT_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(msg, "qmoe.gguf") && strstr(msg, "architecture 'qwen2moe' is not supported") &&
                  strstr(msg, "Hugging Face directory"),
              "message '%s'", msg);
    free(msg);
    gguf_close(g);
}

/* Random byte corruption of the metadata and tensor infos: never a crash or
 * a sanitizer report, and a file that still opens has sane tensors. */
static void test_gguf_corruption(void)
{
    size_t size;
    uint8_t *buf = file_read(FIX "tiny_llama.gguf", &size);
    REQUIRE(buf);
    uint8_t *b = malloc(size);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int opened = 0, failed = 0;
    test_capture_t cap;
    test_capture_begin(&cap);
    for (int it = 0; it < 3000; it++) {
        memcpy(b, buf, size);
        int flips = 1 + it % 4;
        for (int f = 0; f < flips; f++) {
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
            size_t pos = (size_t)(rng % 2144); /* header, metadata, tensor infos */
            b[pos] = (uint8_t)(rng >> 32);
        }
        gguf_t *g;
        if (gguf_open_mem(b, size, "flip", &g) == BT_OK) {
            opened++;
            for (uint64_t i = 0; i < g->n_tensors; i++) {
                const gguf_tensor_t *t = &g->tensors[i];
                if (t->data < g->base || t->data + t->nbytes > g->base + g->size) failed++;
            }
            gguf_close(g);
        }
    }
    free(test_capture_end(&cap));
    CHECK(failed == 0);
    CHECK(opened > 0); /* flips inside string bytes leave valid files */
    free(b);
    free(buf);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_gguf_metadata_all_types, test_gguf_tiny_tensors, test_gguf_version2,
             test_gguf_dequant_types, test_gguf_dequant_real, test_gguf_f16_all_patterns,
             test_gguf_dequant_errors, test_gguf_llama_config, test_gguf_llama_config_errors,
             test_gguf_llama_moe_refused,
             test_gguf_llama_names,
             test_gguf_unpermute_tiny, test_gguf_smollm2_excerpt,
             test_gguf_tokenizer_matches_transformers, test_gguf_tokenizer_smollm_pre,
             test_gguf_truncated_everywhere, test_gguf_bad_header, test_gguf_bad_tensor_infos,
             test_gguf_handmade, test_gguf_corruption);
}
