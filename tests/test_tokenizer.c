/* Tokenizer against Hugging Face `tokenizers` ids.
 *
 * Fixtures (tools/gen_tok_fixtures.py): small byte-level BPEs trained on
 * the Austen corpus in GPT-2, Llama-3, Qwen2 and StarCoder (digits, prefix
 * space) styles, two SentencePiece-style BPEs (llama2: Prepend + Replace
 * normalizer, no pre-tokenizer, byte fallback, the Replace / ByteFallback /
 * Fuse / Strip decoder; metaspace: the Metaspace pre-tokenizer prepending
 * at the input's start only, and its decoder), and the ids HF
 * gives for tests/fixtures/tok/sample.txt (our own text: digits, unicode,
 * CRLF, tabs, emoji, special tokens), for the first 200 kB of the held-out
 * Austen text, and SHA-256 digests of the ids of the whole train and val
 * splits. The corpus cases fetch the corpus with tools/fetch_austen.sh and
 * fail (not skip) when it cannot be had. */
#include "data/tokenizer.h"
#include "data/unicode.h"
#include "base/clock.h"
#include "tests/test.h"

#include <jansson.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const styles[] = {"gpt2", "llama3", "qwen2", "digits_prefix", "llama2",
                                     "metaspace"};
/* SentencePiece-style BPEs (byte fallback, the replacement for spaces) */
static int style_sp(const char *style)
{
    return !strcmp(style, "llama2") || !strcmp(style, "metaspace");
}
/* styles whose decode(encode(x)) is x: no NFC, no prefix space */
static int style_roundtrips(const char *style)
{
    return !strcmp(style, "gpt2") || !strcmp(style, "llama3");
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rbe");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    size_t got = fread(b, 1, (size_t)n, f);
    fclose(f);
    b[got] = '\0';
    *len = got;
    return b;
}

static uint32_t *read_ids_u16(const char *path, size_t *n)
{
    size_t len;
    char *raw = read_all(path, &len);
    if (!raw) return NULL;
    *n = len / 2;
    uint32_t *ids = malloc((*n + 1) * sizeof *ids);
    for (size_t i = 0; i < *n; i++)
        ids[i] = (uint32_t)(uint8_t)raw[2 * i] | (uint32_t)(uint8_t)raw[2 * i + 1] << 8;
    free(raw);
    return ids;
}

/* Prints the first mismatch with the tokens around it; returns 1 if equal. */
static int ids_compare(const tok_t *tok, const char *what, const uint32_t *got, size_t n_got,
                       const uint32_t *want, size_t n_want)
{
    size_t i = 0;
    while (i < n_got && i < n_want && got[i] == want[i]) i++;
    if (i == n_got && i == n_want) return 1;
    fprintf(stderr, "%s: first mismatch at token %zu (got %zu tokens, HF %zu)\n", what, i, n_got,
            n_want);
    size_t lo = i > 5 ? i - 5 : 0;
    for (int side = 0; side < 2; side++) {
        const uint32_t *v = side ? want : got;
        size_t n = side ? n_want : n_got;
        fprintf(stderr, "  %-4s", side ? "HF" : "C");
        for (size_t k = lo; k < i + 6 && k < n; k++) {
            size_t bl = 0;
            const uint8_t *b = tok_token_bytes(tok, v[k], &bl);
            fprintf(stderr, " %s%u'", k == i ? ">>" : "", v[k]);
            for (size_t c = 0; b && c < bl; c++)
                fprintf(stderr, b[c] >= 0x20 && b[c] < 0x7f ? "%c" : "\\x%02x", b[c]);
            fprintf(stderr, "'");
        }
        fprintf(stderr, "\n");
    }
    return 0;
}

static void check_text(const char *style, const char *text, size_t len, const char *ids_path,
                       const char *what)
{
    char path[512];
    snprintf(path, sizeof path, "tests/fixtures/tok/%s/tokenizer.json", style);
    tok_t *tok = NULL;
    REQUIRE(tok_load(path, &tok) == BT_OK);
    size_t n_want = 0;
    uint32_t *want = read_ids_u16(ids_path, &n_want);
    uint32_t *got = NULL;
    size_t n_got = 0;
    CHECK(want != NULL);
    CHECK(tok_encode(tok, text, len, &got, &n_got) == BT_OK);
    if (want && got) CHECK_MSG(ids_compare(tok, what, got, n_got, want, n_want), "%s", what);
    char *back = NULL;
    size_t blen = 0;
    CHECK(got && tok_decode(tok, got, n_got, &back, &blen) == BT_OK);
    /* decode(encode(x)) == x except where NFC or a prefix space changed the text */
    if (back && style_roundtrips(style)) CHECK(blen == len && !memcmp(back, text, len));
    /* the SentencePiece decoders: what HF decodes the sample's ids to */
    if (back && style_sp(style) && strstr(ids_path, "/sample.ids")) {
        char dp[256];
        snprintf(dp, sizeof dp, "tests/fixtures/tok/%s/sample.decoded.txt", style);
        size_t dl;
        char *want_text = read_all(dp, &dl);
        CHECK_MSG(want_text && dl == blen && !memcmp(want_text, back, dl),
                  "%s: decode differs from HF's (%zu vs %zu bytes)", what, blen, dl);
        free(want_text);
    }
    free(back);
    free(got);
    free(want);
    tok_free(tok);
}

static void check_sample(const char *style)
{
    static const char *const names[] = {"sample", "unicode"};
    for (int k = 0; k < 2; k++) {
        size_t len;
        char path[256], ids[256], what[64];
        snprintf(path, sizeof path, "tests/fixtures/tok/%s.txt", names[k]);
        char *text = read_all(path, &len);
        REQUIRE(text != NULL);
        snprintf(ids, sizeof ids, "tests/fixtures/tok/%s/%s.ids", style, names[k]);
        snprintf(what, sizeof what, "%s %s.txt", style, names[k]);
        check_text(style, text, len, ids, what);
        free(text);
    }
}

static void test_sample_gpt2(void) { check_sample("gpt2"); }
static void test_sample_llama3(void) { check_sample("llama3"); }
static void test_sample_qwen2(void) { check_sample("qwen2"); }
static void test_sample_digits_prefix(void) { check_sample("digits_prefix"); }
static void test_sample_llama2(void) { check_sample("llama2"); }
static void test_sample_metaspace(void) { check_sample("metaspace"); }

static int corpus_ready(void)
{
    int rc = system("tools/fetch_austen.sh >/dev/null");
    if (rc != 0) fprintf(stderr, "tools/fetch_austen.sh failed (status %d)\n", rc);
    return rc == 0;
}

static void sha256_ids(const uint32_t *ids, size_t n, char hex[65])
{
    uint8_t *le = malloc(n * 4 + 1);
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) le[4 * i + (size_t)b] = (uint8_t)(ids[i] >> (8 * b));
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_Digest(le, n * 4, md, &mdlen, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++) sprintf(hex + 2 * i, "%02x", md[i]);
    free(le);
}

static void check_corpus(const char *style)
{
    REQUIRE(corpus_ready());
    char path[512];
    snprintf(path, sizeof path, "tests/fixtures/tok/%s/corpus.json", style);
    json_t *ref = json_load_file(path, 0, NULL);
    REQUIRE(ref != NULL);
    size_t vlen;
    char *val = read_all("data/austen/val.txt", &vlen);
    REQUIRE(val != NULL);
    size_t head = (size_t)json_integer_value(json_object_get(ref, "val_head_bytes"));
    CHECK(head > 0 && head <= vlen);
    char ids[256], what[64];
    snprintf(ids, sizeof ids, "tests/fixtures/tok/%s/val_head.ids", style);
    snprintf(what, sizeof what, "%s val.txt[0:%zu]", style, head);
    if (head <= vlen) check_text(style, val, head, ids, what);
    free(val);

    snprintf(path, sizeof path, "tests/fixtures/tok/%s/tokenizer.json", style);
    tok_t *tok = NULL;
    REQUIRE(tok_load(path, &tok) == BT_OK);
    static const char *const parts[] = {"train", "val"};
    for (int p = 0; p < 2; p++) {
        char file[256];
        snprintf(file, sizeof file, "data/austen/%s.txt", parts[p]);
        size_t len;
        char *text = read_all(file, &len);
        CHECK(text != NULL);
        if (!text) continue;
        uint32_t *got = NULL;
        size_t n = 0;
        uint64_t t0 = clock_now_ns();
        CHECK(tok_encode(tok, text, len, &got, &n) == BT_OK);
        double s = (double)(clock_now_ns() - t0) / 1e9;
        json_t *r = json_object_get(ref, parts[p]);
        size_t want_n = (size_t)json_integer_value(json_object_get(r, "tokens"));
        const char *want_sha = json_string_value(json_object_get(r, "sha256_u32le"));
        char hex[65];
        sha256_ids(got, n, hex);
        CHECK_MSG(n == want_n, "%s %s: %zu tokens, HF %zu", style, file, n, want_n);
        CHECK_MSG(want_sha && !strcmp(hex, want_sha), "%s %s: ids digest differs from HF", style,
                  file);
        printf("  %s %s: %zu bytes -> %zu tokens in %.3f s (%.2f M tokens/s, %.1f MB/s)\n", style,
               file, len, n, s, (double)n / s / 1e6, (double)len / s / 1e6);
        free(got);
        free(text);
    }
    tok_free(tok);
    json_decref(ref);
}

static void test_corpus_gpt2(void) { check_corpus("gpt2"); }
static void test_corpus_llama3(void) { check_corpus("llama3"); }
static void test_corpus_qwen2(void) { check_corpus("qwen2"); }
static void test_corpus_digits_prefix(void) { check_corpus("digits_prefix"); }
static void test_corpus_llama2(void) { check_corpus("llama2"); }
static void test_corpus_metaspace(void) { check_corpus("metaspace"); }

/* Bytes that are not UTF-8 still round-trip (each is its own character). */
static void test_invalid_utf8_roundtrip(void)
{
    for (size_t s = 0; s < sizeof styles / sizeof styles[0]; s++) {
        if (!style_roundtrips(styles[s])) continue;
        char path[256];
        snprintf(path, sizeof path, "tests/fixtures/tok/%s", styles[s]);
        tok_t *tok = NULL;
        REQUIRE(tok_load(path, &tok) == BT_OK);
        static const char text[] = "ok \xff\xfe bad \xc3 half \xed\xa0\x80 surrogate \xe2\x82 end\x80";
        uint32_t *ids = NULL;
        size_t n = 0;
        CHECK(tok_encode(tok, text, sizeof text - 1, &ids, &n) == BT_OK);
        char *back = NULL;
        size_t blen = 0;
        CHECK(ids && tok_decode(tok, ids, n, &back, &blen) == BT_OK);
        CHECK(back && blen == sizeof text - 1 && !memcmp(back, text, blen));
        uint32_t bad = tok_vocab_size(tok);
        char *x = NULL;
        size_t xl;
        CHECK(tok_decode(tok, &bad, 1, &x, &xl) == BT_ERR_INVALID);
        free(back);
        free(ids);
        tok_free(tok);
    }
}

/* Encoding in pieces cut by tok_safe_cut gives the ids of the whole text. */
static void test_safe_cut_equivalence(void)
{
    size_t slen;
    char *sample = read_all("tests/fixtures/tok/sample.txt", &slen);
    REQUIRE(sample != NULL);
    for (size_t s = 0; s < sizeof styles / sizeof styles[0]; s++) {
        char path[256];
        snprintf(path, sizeof path, "tests/fixtures/tok/%s", styles[s]);
        tok_t *tok = NULL;
        REQUIRE(tok_load(path, &tok) == BT_OK);
        uint32_t *whole = NULL, *part = NULL;
        size_t n_whole = 0, n_cat = 0, cuts = 0;
        CHECK(tok_encode(tok, sample, slen, &whole, &n_whole) == BT_OK);
        uint32_t *cat = malloc((n_whole + 1) * 2 * sizeof *cat);
        for (size_t pos = 0; pos < slen;) {
            size_t end = pos + tok_safe_cut(tok, sample + pos, slen - pos, 97);
            size_t n = 0;
            CHECK(tok_encode(tok, sample + pos, end - pos, &part, &n) == BT_OK);
            if (n_cat + n <= 2 * (n_whole + 1)) memcpy(cat + n_cat, part, n * sizeof *part);
            n_cat += n;
            free(part);
            pos = end;
            cuts++;
        }
        /* add_prefix_space would put a space before every piece: no cuts there */
        /* no safe cut: a prefix space (digits_prefix) or a prepended
         * replacement (SentencePiece) starts every piece */
        if (strcmp(styles[s], "digits_prefix") && !style_sp(styles[s]))
            CHECK_MSG(cuts > 20, "%s: only %zu pieces", styles[s], cuts);
        else CHECK_MSG(cuts == 1, "%s: cut into %zu pieces", styles[s], cuts);
        CHECK(n_cat <= 2 * (n_whole + 1) && ids_compare(tok, styles[s], cat, n_cat, whole, n_whole));
        free(cat);
        free(whole);
        tok_free(tok);
    }
    free(sample);
}

/* Random byte strings (biased to the characters the patterns care about)
 * decode back to themselves. */
static void test_random_bytes_roundtrip(void)
{
    static const char alphabet[] = " \t\r\n'sSdDlLaZ09!.<|>\xc3\xa9\xe2\x80\xa8\xf0\x9f\x98\x80\xff\x85";
    uint64_t x = 88172645463325252ull;
    for (size_t s = 0; s < 2; s++) {
        char path[256];
        snprintf(path, sizeof path, "tests/fixtures/tok/%s", styles[s]);
        tok_t *tok = NULL;
        REQUIRE(tok_load(path, &tok) == BT_OK);
        for (int it = 0; it < 300; it++) {
            char buf[256];
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            size_t n = x % sizeof buf;
            for (size_t i = 0; i < n; i++) {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                buf[i] = (x >> 60) ? alphabet[(x >> 8) % (sizeof alphabet - 1)] : (char)(x >> 16);
            }
            uint32_t *ids = NULL;
            size_t ni = 0, bl = 0;
            char *back = NULL;
            CHECK(tok_encode(tok, buf, n, &ids, &ni) == BT_OK);
            CHECK(ids && tok_decode(tok, ids, ni, &back, &bl) == BT_OK);
            CHECK_MSG(back && bl == n && !memcmp(back, buf, n), "%s iteration %d", styles[s], it);
            free(back);
            free(ids);
        }
        tok_free(tok);
    }
}

/* Special ids are those the tokenizer.json names. */
static void test_special_ids(void)
{
    static const struct { const char *style, *bos, *eos; } want[] = {
        {"gpt2", NULL, "<|endoftext|>"},
        {"llama3", "<|begin_of_text|>", "<|end_of_text|>"},
        {"qwen2", NULL, "<|endoftext|>"},
        {"digits_prefix", "<s>", "<|endoftext|>"},
    };
    for (size_t s = 0; s < sizeof want / sizeof want[0]; s++) {
        char path[256];
        snprintf(path, sizeof path, "tests/fixtures/tok/%s/tokenizer.json", want[s].style);
        tok_t *tok = NULL;
        REQUIRE(tok_load(path, &tok) == BT_OK);
        json_t *root = json_load_file(path, 0, NULL);
        REQUIRE(root != NULL);
        int64_t bos = -1, eos = -1;
        size_t i;
        json_t *a;
        json_array_foreach(json_object_get(root, "added_tokens"), i, a) {
            const char *c = json_string_value(json_object_get(a, "content"));
            int64_t id = json_integer_value(json_object_get(a, "id"));
            if (want[s].bos && !strcmp(c, want[s].bos)) bos = id;
            if (!strcmp(c, want[s].eos)) eos = id;
        }
        tok_special_t sp = tok_special(tok);
        CHECK_MSG(sp.bos == bos && sp.eos == eos, "%s: bos %ld eos %ld, want %ld %ld",
                  want[s].style, (long)sp.bos, (long)sp.eos, (long)bos, (long)eos);
        CHECK(eos >= 0);
        json_decref(root);
        tok_free(tok);
    }
}

static int64_t added_id(json_t *root, const char *content)
{
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(root, "added_tokens"), i, a)
        if (!strcmp(json_string_value(json_object_get(a, "content")), content))
            return json_integer_value(json_object_get(a, "id"));
    return -1;
}

/* BOS/EOS from a post-processor template (inside a Sequence, as Llama-3.1
 * has it) and from tokenizer_config.json, which wins over names. */
static void test_special_sources(void)
{
    json_t *root = json_load_file("tests/fixtures/tok/llama3/tokenizer.json", 0, NULL);
    REQUIRE(root != NULL);
    json_t *pp = json_pack("{s:s, s:[{s:s}, {s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:[], s:{}}]}",
                           "type", "Sequence", "processors", "type", "ByteLevel",
                           "type", "TemplateProcessing", "single",
                           "SpecialToken", "id", "<|start_header_id|>", "type_id", 0,
                           "Sequence", "id", "A", "type_id", 0, "pair", "special_tokens");
    REQUIRE(pp != NULL);
    json_object_set_new(root, "post_processor", pp);
    mkdir("build/test_tok_pp", 0755);
    REQUIRE(json_dump_file(root, "build/test_tok_pp/tokenizer.json", 0) == 0);
    tok_t *tok = NULL;
    REQUIRE(tok_load("build/test_tok_pp", &tok) == BT_OK);
    CHECK(tok_special(tok).bos == added_id(root, "<|start_header_id|>"));
    CHECK(tok_special(tok).eos == added_id(root, "<|end_of_text|>"));
    tok_free(tok);
    FILE *f = fopen("build/test_tok_pp/tokenizer_config.json", "we");
    REQUIRE(f != NULL);
    fputs("{\"bos_token\": {\"content\": \"<|begin_of_text|>\"}, \"eos_token\": \"<|eot_id|>\"}", f);
    fclose(f);
    REQUIRE(tok_load("build/test_tok_pp/tokenizer.json", &tok) == BT_OK);
    CHECK(tok_special(tok).bos == added_id(root, "<|begin_of_text|>"));
    CHECK(tok_special(tok).eos == added_id(root, "<|eot_id|>"));
    CHECK(tok_special(tok).eos >= 0 && tok_special(tok).bos >= 0);
    tok_free(tok);
    remove("build/test_tok_pp/tokenizer_config.json");
    remove("build/test_tok_pp/tokenizer.json");
    rmdir("build/test_tok_pp");
    json_decref(root);
}

/* Reference NFC results from the Unicode standard's own examples. */
static void test_nfc(void)
{
    static const struct { const char *in, *out; } cases[] = {
        {"e\xcc\x81", "\xc3\xa9"},                              /* e + acute -> é */
        {"\xe2\x84\xab", "\xc3\x85"},                           /* angstrom sign -> Å */
        {"A\xcc\x8a", "\xc3\x85"},                              /* A + ring -> Å */
        {"\xe1\xba\x9b\xcc\xa3", "\xe1\xba\x9b\xcc\xa3"},       /* ẛ̣ stays (UAX #15) */
        {"q\xcc\x87\xcc\xa3", "q\xcc\xa3\xcc\x87"},             /* reorder by class */
        {"\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81"}, /* jamo -> 각 */
        {"\xea\xb0\x80\xe1\x86\xa8", "\xea\xb0\x81"},           /* 가 + jamo T -> 각 */
        {"plain ascii", "plain ascii"},
        {"\xef\xac\x81", "\xef\xac\x81"},                       /* ligature: compatibility only */
        {"a\xff\xcc\x81", "a\xff\xcc\x81"},                     /* invalid byte blocks */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t *out = NULL;
        size_t n = 0;
        REQUIRE(uni_nfc((const uint8_t *)cases[i].in, strlen(cases[i].in), &out, &n) == 0);
        CHECK_MSG(n == strlen(cases[i].out) && !memcmp(out, cases[i].out, n), "case %zu", i);
        free(out);
    }
}

static int load_json_text(const char *json, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "build/test_tok_%s.json", name);
    FILE *f = fopen(path, "we");
    if (!f) return -99;
    fputs(json, f);
    fclose(f);
    tok_t *tok = NULL;
    bt_status_t st = tok_load(path, &tok);
    tok_free(tok);
    remove(path);
    return st;
}

/* Unsupported or malformed tokenizer.json files are refused with an error. */
static void test_load_errors(void)
{
    static const char base[] =
        "{\"added_tokens\":[],\"normalizer\":%s,\"pre_tokenizer\":%s,\"decoder\":null,"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[%s]}}";
    char buf[1024];
    snprintf(buf, sizeof buf, base, "null", "null", "\"a b\"");
    CHECK(load_json_text(buf, "ok") == BT_OK);
    snprintf(buf, sizeof buf, base, "null", "null", "[\"a\",\"b\"]");
    CHECK(load_json_text(buf, "oklist") == BT_OK);
    snprintf(buf, sizeof buf, base, "{\"type\":\"Lowercase\"}", "null", "\"a b\"");
    CHECK(load_json_text(buf, "norm") == BT_ERR_UNSUPPORTED);
    snprintf(buf, sizeof buf, base, "null",
             "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\w+|[0-9]\"},\"behavior\":\"Isolated\","
             "\"invert\":false}", "\"a b\"");
    CHECK(load_json_text(buf, "regex") == BT_ERR_UNSUPPORTED);
    snprintf(buf, sizeof buf, base, "null", "{\"type\":\"Metaspace\"}", "\"a b\"");
    CHECK(load_json_text(buf, "meta") == BT_ERR_UNSUPPORTED);
    snprintf(buf, sizeof buf, base, "null", "null", "\"a c\"");
    CHECK(load_json_text(buf, "merge") == BT_ERR_INVALID);
    CHECK(load_json_text("{\"model\": {", "trunc") == BT_ERR_INVALID);
    /* found by fuzz_tokenizer: a few tokens with a huge id sized the id
     * tables by it (2.9 GB for 188 tokens); ids must be nearly dense */
    CHECK(load_json_text("{\"added_tokens\":[{\"id\":120113197,\"content\":\"<x>\"}],"
                         "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]}}",
                         "sparse") == BT_ERR_INVALID);
    CHECK(load_json_text("{\"added_tokens\":[{\"id\":1027,\"content\":\"<x>\"}],"
                         "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]}}",
                         "holes") == BT_OK);
    /* a merge listed twice keeps its last rank: HF tokenizers 0.23 encodes
     * "abc" with merges [a b, b c, a b] as [a, bc] */
    FILE *f = fopen("build/test_tok_dup.json", "we");
    REQUIRE(f != NULL);
    fputs("{\"added_tokens\":[],\"normalizer\":null,\"pre_tokenizer\":null,\"decoder\":null,"
          "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"bc\":4},"
          "\"merges\":[\"a b\",\"b c\",\"a b\"]}}", f);
    fclose(f);
    tok_t *dup = NULL;
    REQUIRE(tok_load("build/test_tok_dup.json", &dup) == BT_OK);
    uint32_t *ids = NULL;
    size_t n = 0;
    CHECK(tok_encode(dup, "abc", 3, &ids, &n) == BT_OK);
    CHECK(n == 2 && ids[0] == 0 && ids[1] == 4);
    free(ids);
    tok_free(dup);
    remove("build/test_tok_dup.json");
    tok_t *tok = NULL;
    CHECK(tok_load("tests/fixtures/tok/no-such-dir", &tok) == BT_ERR_NOT_FOUND);
}

/* A small tokenizer.json with every supported stage gives HF's ids (checked
 * with HF tokenizers 0.23: lstrip, unk, ignore_merges, NFC, Digits); damaged
 * copies of it (bytes changed, cut short) are refused or load and encode
 * without crashing (run it under SAN=address,undefined). */
static void test_load_mutated(void)
{
    static const char good[] =
        "{\"added_tokens\":[{\"id\":5,\"content\":\"<|e|>\",\"special\":true,\"lstrip\":true}],"
        "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"}]},"
        "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
        "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|"
        "\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
        "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"Digits\"},"
        "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
        "\"decoder\":{\"type\":\"ByteLevel\"},"
        "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"unk_token\":\"a\","
        "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\u0120\":3,\"\u0120ab\":4},"
        "\"merges\":[\"a b\",\"\u0120 ab\"]}}";
    tok_t *tok = NULL;
    REQUIRE(tok_load_json(good, strlen(good), &tok) == BT_OK);
    uint32_t *ids = NULL;
    size_t n = 0;
    CHECK(tok_encode(tok, "ab ab <|e|>", 11, &ids, &n) == BT_OK);
    CHECK(n == 3 && ids[0] == 2 && ids[1] == 4 && ids[2] == 5);
    free(ids);
    /* HF tokenizers 0.23 on this file: bytes without a token become unk */
    static const uint32_t hf[] = {2, 4, 0, 0, 0, 3, 0, 0, 5, 0};
    CHECK(tok_encode(tok, "ab ab\n12 's <|e|>x", 18, &ids, &n) == BT_OK);
    CHECK(n == 10 && !memcmp(ids, hf, sizeof hf));
    free(ids);
    tok_free(tok);
    uint64_t x = 0x2545F4914F6CDD1Dull;
    char buf[sizeof good];
    int loaded = 0, iters = getenv("TOK_MUTATIONS") ? atoi(getenv("TOK_MUTATIONS")) : 3000;
    for (int it = 0; it < iters; it++) {
        memcpy(buf, good, sizeof good);
        size_t len = sizeof good - 1;
        int edits = 1 + it % 4;
        for (int k = 0; k < edits && len > 0; k++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            size_t at = (size_t)(x % len);
            switch ((x >> 32) % 4) {
            case 0: buf[at] = (char)(x >> 40); break;           /* any byte */
            case 1: buf[at] = "0123456789\"[]{}:,-tnu"[(x >> 40) % 21]; break;
            case 2: len = at; break;                            /* cut short */
            default: buf[at] = ' '; break;
            }
        }
        if (tok_load_json(buf, len, &tok) == BT_OK) {
            loaded++;
            CHECK(tok_encode(tok, "ab ab\n12 's <|e|>x", 18, &ids, &n) == BT_OK);
            free(ids);
            tok_free(tok);
        }
    }
    printf("  %d of %d damaged files still loaded\n", loaded, iters);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_nfc, test_load_errors, test_load_mutated, test_special_ids, test_special_sources,
             test_invalid_utf8_roundtrip,
             test_random_bytes_roundtrip, test_safe_cut_equivalence,
             test_sample_gpt2, test_sample_llama3, test_sample_qwen2, test_sample_digits_prefix,
             test_corpus_gpt2, test_corpus_llama3, test_corpus_qwen2, test_corpus_digits_prefix,
             test_sample_llama2, test_sample_metaspace, test_corpus_llama2,
             test_corpus_metaspace);
}
