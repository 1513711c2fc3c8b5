/* ckpt/model_source.h: the tiny GGUF model (tests/fixtures/gguf_model,
 * tools/gen_gguf_model_fixture.py) loads into the same parameters as its
 * Hugging Face twin written by transformers' GGUF loader, whole and as
 * pipeline stages; its tokenizer gives the twin's ids and special tokens;
 * kind detection and missing/extra tensors are clear errors. */
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include "ckpt/gguf.h"
#include "ckpt/model_source.h"
#include "model/model.h"
#include "tests/test.h"

#define FIX "tests/fixtures/gguf_model/"

/* Largest |a - b| / (1 + |b|) over the parameters of a found by name in b. */
static double params_maxdiff(const model_t *a, const model_t *b, int *compared)
{
    double worst = 0;
    *compared = 0;
    for (int i = 0; i < a->n_params; i++) {
        int j = model_param_find(b, a->params[i].name);
        if (j < 0) continue;
        const float *x = a->params[i].t.data, *y = b->params[j].t.data;
        size_t n = 1;
        for (int d = 0; d < a->params[i].t.ndim; d++) n *= (size_t)a->params[i].t.shape[d];
        for (size_t k = 0; k < n; k++) {
            double e = fabs((double)x[k] - y[k]) / (1 + fabs((double)y[k]));
            if (e > worst) worst = e;
        }
        (*compared)++;
    }
    return worst;
}

static void test_kind(void)
{
    ckpt_source_kind_t k;
    CHECK(ckpt_source_kind(FIX "hf", &k) == BT_OK && k == CKPT_SOURCE_HF_DIR);
    CHECK(ckpt_source_kind(FIX "tiny.gguf", &k) == BT_OK && k == CKPT_SOURCE_GGUF);
    CHECK(ckpt_source_kind(FIX "text.txt", &k) == BT_ERR_INVALID);
    CHECK(ckpt_source_kind(FIX "missing.gguf", &k) == BT_ERR_NOT_FOUND);
    CHECK(!strcmp(ckpt_source_kind_name(CKPT_SOURCE_GGUF), "GGUF file"));
}

static void test_config_matches_twin(void)
{
    model_config_t g, h;
    REQUIRE(ckpt_source_config(FIX "tiny.gguf", &g) == BT_OK);
    REQUIRE(ckpt_source_config(FIX "hf", &h) == BT_OK);
    CHECK(g.arch == h.arch && g.vocab_size == h.vocab_size && g.hidden_size == h.hidden_size);
    CHECK(g.mlp.intermediate_size == h.mlp.intermediate_size && g.num_layers == h.num_layers);
    CHECK(g.attn.num_heads == h.attn.num_heads && g.attn.num_kv_heads == h.attn.num_kv_heads && g.attn.head_dim == h.attn.head_dim);
    CHECK(g.max_position_embeddings == h.max_position_embeddings);
    CHECK(g.tie_word_embeddings == h.tie_word_embeddings && !g.tie_word_embeddings);
    CHECK_NEAR(g.attn.rope.theta, h.attn.rope.theta, 1e-12, 0);
    CHECK_NEAR(g.rms_norm_eps, h.rms_norm_eps, 1e-6, 0);
    CHECK(g.num_layers == 3 && g.hidden_size == 32 && g.attn.num_kv_heads == 2 && g.vocab_size == 320);
}

static void test_weights_match_twin(void)
{
    model_t *g = NULL, *h = NULL;
    REQUIRE(ckpt_source_load(FIX "tiny.gguf", NULL, &g) == BT_OK);
    if (ckpt_source_load(FIX "hf", NULL, &h) != BT_OK) {
        model_destroy(g);
        REQUIRE(0);
    }
    int n;
    double d = params_maxdiff(g, h, &n);
    CHECK_MSG(n == h->n_params && n == g->n_params, "%d of %d/%d compared", n, g->n_params, h->n_params);
    /* both are f32 dequantizations of the same blocks */
    CHECK_MSG(d <= 1e-6, "max relative difference %g", d);
    fprintf(stderr, "GGUF vs HF twin: %d tensors, max relative difference %g\n", n, d);
    model_destroy(g);
    model_destroy(h);
}

/* Two pipeline stages loaded from the GGUF hold exactly the whole model's values. */
static void test_stages(void)
{
    model_t *whole = NULL, *s0 = NULL, *s1 = NULL;
    model_stage_t a = {.first_layer = 0, .last_layer = 2, .has_embedding = true, .has_head = false};
    model_stage_t b = {.first_layer = 2, .last_layer = 3, .has_embedding = false, .has_head = true};
    REQUIRE(ckpt_source_load(FIX "tiny.gguf", NULL, &whole) == BT_OK);
    CHECK(ckpt_source_load(FIX "tiny.gguf", &a, &s0) == BT_OK);
    CHECK(ckpt_source_load(FIX "tiny.gguf", &b, &s1) == BT_OK);
    if (s0 && s1) {
        int n0, n1;
        CHECK(params_maxdiff(s0, whole, &n0) == 0 && n0 == s0->n_params);
        CHECK(params_maxdiff(s1, whole, &n1) == 0 && n1 == s1->n_params);
        CHECK(n0 + n1 == whole->n_params);
        CHECK(model_param_find(s0, "lm_head.weight") < 0 && model_param_find(s1, "lm_head.weight") >= 0);
        CHECK(model_param_find(s1, "model.layers.0.self_attn.q_proj.weight") < 0);
    }
    model_destroy(s0);
    model_destroy(s1);
    model_destroy(whole);
}

static void test_tokenizer_matches_twin(void)
{
    tok_t *tg = NULL, *th = NULL;
    ckpt_source_special_t sg, sh;
    REQUIRE(ckpt_source_tokenizer(FIX "tiny.gguf", &tg, &sg) == BT_OK);
    if (ckpt_source_tokenizer(FIX "hf", &th, &sh) != BT_OK) {
        tok_free(tg);
        REQUIRE(0);
    }
    CHECK(sg.bos == 1 && sg.n_eos == 1 && sg.eos[0] == 2);
    CHECK(sh.bos == 1 && sh.n_eos == 1 && sh.eos[0] == 2);
    CHECK(tok_vocab_size(tg) == tok_vocab_size(th) && tok_vocab_size(tg) == 320);
    FILE *f = fopen(FIX "text.txt", "rbe");
    char buf[4096];
    size_t len = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    CHECK(len > 500);
    uint32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    CHECK(tok_encode(tg, buf, len, &a, &na) == BT_OK);
    CHECK(tok_encode(th, buf, len, &b, &nb) == BT_OK);
    CHECK(na == nb && na > 0 && !memcmp(a, b, na * sizeof *a));
    /* and the first ids are those HF `tokenizers` gave (ids200.txt) */
    FILE *fi = fopen(FIX "ids200.txt", "re");
    int ok = fi != NULL;
    for (size_t i = 0; ok && i < 200; i++) {
        unsigned v;
        ok = fscanf(fi, "%u", &v) == 1 && i < na && a[i] == v;
    }
    if (fi) fclose(fi);
    CHECK(ok);
    free(a);
    free(b);
    tok_free(tg);
    tok_free(th);
}

/* A GGUF whose tensors do not match the config: a missing tensor and a
 * wrongly shaped one, made by renaming bytes of a copy of the file. */
static void test_bad_tensors(void)
{
    FILE *f = fopen(FIX "tiny.gguf", "rbe");
    REQUIRE(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n);
    REQUIRE(buf && fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    /* rename "output_norm.weight" to "output_norX.weight": no final norm */
    const char *name = "output_norm.weight";
    unsigned char *p = memmem(buf, (size_t)n, name, strlen(name));
    REQUIRE(p);
    p[10] = 'X';
    char path[] = "/tmp/baton-test-src-XXXXXX";
    int fd = mkostemp(path, O_CLOEXEC);
    REQUIRE(fd >= 0);
    CHECK(write(fd, buf, (size_t)n) == n);
    close(fd);
    model_t *m = NULL;
    CHECK(ckpt_source_load(path, NULL, &m) != BT_OK && m == NULL); /* warns, then: no final norm */
    p[10] = 'm';
    /* "blk.2.ffn_down" -> "blk.9.ffn_down": a layer the config does not have */
    p = memmem(buf, (size_t)n, "blk.2.ffn_down", 14);
    REQUIRE(p);
    p[4] = '9';
    fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
    CHECK(fd >= 0 && write(fd, buf, (size_t)n) == n);
    if (fd >= 0) close(fd);
    CHECK(ckpt_source_load(path, NULL, &m) == BT_ERR_INVALID && m == NULL);
    unlink(path);
    free(buf);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_kind, test_config_matches_twin, test_weights_match_twin, test_stages,
             test_tokenizer_matches_twin, test_bad_tensors);
}
