/* The MFU numerator (model/flops.h) against counts made by hand for the
 * rows of issue 13's table: every product written out per layer, nothing
 * taken from the code under test. docs/PERFORMANCE.md has the derivation. */
#include "kernels/kernels.h"
#include "model/flops.h"
#include "model/model.h"
#include "tests/test.h"

static model_config_t cfg;

static void llama(int64_t vocab, int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads,
                  int64_t ffn, int64_t T, bool tied)
{
    model_config_llama(&cfg, &(model_llama_dims_t){.vocab = vocab, .hidden = hidden,
                                                   .layers = layers, .heads = heads,
                                                   .kv_heads = kv_heads, .ffn = ffn,
                                                   .max_position = T, .norm_eps = 1e-5,
                                                   .rope_theta = 10000.0,
                                                   .tie_embeddings = tied});
    REQUIRE(model_config_validate(&cfg) == BT_OK);
}

/* Llama-style 134M: hidden 768, 12 layers, 12 heads (kv 12, head dim 64),
 * FFN 2048, vocab 32000, T 1024, untied head. */
static void test_flops_llama_134m(void)
{
    llama(32000, 768, 12, 12, 12, 2048, 1024, false);
    /* per layer: q 768x768, k 768x768 (kv dim 12*64), v 768x768, o 768x768 */
    double attn_w = 768.0 * 768 + 768.0 * 768 + 768.0 * 768 + 768.0 * 768; /* 2 359 296 */
    /* gate 768x2048, up 768x2048, down 2048x768 */
    double mlp_w = 768.0 * 2048 + 768.0 * 2048 + 2048.0 * 768; /* 4 718 592 */
    double head = 32000.0 * 768;                                /* 24 576 000, untied */
    double matmul = 12 * (attn_w + mlp_w) + head;               /* 109 510 656 */
    CHECK(matmul == 109510656.0);
    /* causal scores + values: per layer 2 products x T/2 keys x 768 (12 x 64) */
    double attn = 12 * (2 * (1024 / 2) * 768.0); /* 9 437 184 */
    model_flops_t f;
    model_flops_count(&cfg, 1024, &f);
    CHECK(f.matmul_params == matmul);
    CHECK(f.attn_fma == attn);
    CHECK(f.flops == 6 * (matmul + attn)); /* 713 687 040 */
    CHECK(f.flops == 713687040.0);
    CHECK(model_flops_per_token(&cfg, 1024) == f.flops);
    /* the parameters the name counts: the products' weights plus the
     * embedding table 32000x768 and 25 norm vectors of 768 */
    CHECK(model_num_params(&cfg) == (int64_t)(matmul + 32000.0 * 768 + 25 * 768.0));
    CHECK(model_num_params(&cfg) == 134105856);
    /* about 450k tokens/s of the torch reference on a 790 TFLOP/s card */
    CHECK_NEAR(model_mfu(f.flops, 450000, 790e12), 713687040.0 * 450000 / 790e12, 1e-15, 0);
    CHECK_NEAR(model_mfu(f.flops, 450000, 790e12), 0.4065, 1e-3, 0);
}

/* Llama 1.1B (TinyLlama's shape): hidden 2048, 22 layers, 32 query / 4 KV
 * heads (head dim 64, kv dim 256), FFN 5632, vocab 32000, T 2048, untied. */
static void test_flops_llama_1b(void)
{
    llama(32000, 2048, 22, 32, 4, 5632, 2048, false);
    /* per layer: q 2048x2048, k 2048x256, v 2048x256, o 2048x2048 */
    double attn_w = 2048.0 * 2048 + 2048.0 * 256 + 2048.0 * 256 + 2048.0 * 2048; /* 9 437 184 */
    /* gate 2048x5632, up 2048x5632, down 5632x2048 */
    double mlp_w = 2048.0 * 5632 + 2048.0 * 5632 + 5632.0 * 2048; /* 34 603 008 */
    double head = 32000.0 * 2048;                                 /* 65 536 000 */
    double matmul = 22 * (attn_w + mlp_w) + head;                 /* 1 034 420 224 */
    CHECK(matmul == 1034420224.0);
    /* GQA shares k and v but every one of the 32 query heads scores: d = 32 x 64 */
    double attn = 22 * (2 * (2048 / 2) * 2048.0); /* 92 274 688 */
    model_flops_t f;
    model_flops_count(&cfg, 2048, &f);
    CHECK(f.matmul_params == matmul);
    CHECK(f.attn_fma == attn);
    CHECK(f.flops == 6 * (matmul + attn));
    CHECK(f.flops == 6760169472.0);
    CHECK(model_num_params(&cfg) == (int64_t)(matmul + 32000.0 * 2048 + 45 * 2048.0));
    CHECK(model_num_params(&cfg) == 1100048384);
    /* the "58.6k tokens/s, 50% MFU" on a card of about 790 TFLOP/s */
    CHECK_NEAR(model_mfu(f.flops, 58600, 790e12), 0.5014, 1e-3, 0);
}

/* SmolLM2-135M: hidden 576, 30 layers, 9 query / 3 KV heads (head dim 64),
 * FFN 1536, vocab 49152, tied embeddings, T 2048. The tied head still
 * multiplies every token by its 49152x576 matrix: it counts. */
static void test_flops_smollm2_tied_head(void)
{
    llama(49152, 576, 30, 9, 3, 1536, 2048, true);
    double attn_w = 576.0 * 576 + 576.0 * 192 + 576.0 * 192 + 576.0 * 576; /* 884 736 */
    double mlp_w = 576.0 * 1536 + 576.0 * 1536 + 1536.0 * 576;             /* 2 654 208 */
    double head = 49152.0 * 576;                                           /* 28 311 552 */
    double matmul = 30 * (attn_w + mlp_w) + head;                          /* 134 479 872 */
    double attn = 30 * (2 * (2048 / 2) * 576.0);                           /* 35 389 440 */
    model_flops_t f;
    model_flops_count(&cfg, 2048, &f);
    CHECK(f.matmul_params == matmul);
    CHECK(f.attn_fma == attn);
    CHECK(f.flops == 6 * (matmul + attn));
    CHECK(f.flops == 1019215872.0);
    /* tied: the table is stored once, so the parameter count holds it once */
    CHECK(model_num_params(&cfg) == (int64_t)(30 * (attn_w + mlp_w) + head + 61 * 576.0));
    CHECK(model_num_params(&cfg) == 134515008);
    /* the untied twin computes the same products */
    llama(49152, 576, 30, 9, 3, 1536, 2048, false);
    CHECK(model_flops_per_token(&cfg, 2048) == f.flops);
}

/* Attention's share grows with T and nothing else does; biases add no
 * products; a layer without a mixer has no attention term. */
static void test_flops_shape_rules(void)
{
    llama(1000, 64, 2, 4, 2, 128, 256, false);
    model_flops_t a, b;
    model_flops_count(&cfg, 128, &a);
    model_flops_count(&cfg, 256, &b);
    CHECK(a.matmul_params == b.matmul_params);
    CHECK(b.attn_fma == 2 * a.attn_fma);
    CHECK(a.attn_fma == 2 * (2 * (128 / 2) * 64.0));
    cfg.attn.qkv_bias = cfg.attn.o_bias = cfg.mlp.bias = true;
    model_flops_count(&cfg, 256, &a);
    CHECK(a.matmul_params == b.matmul_params && a.flops == b.flops);
    cfg.blocks[1].mixer = MODEL_MIXER_NONE; /* layer 1: MLP only */
    model_flops_count(&cfg, 256, &a);
    CHECK(a.attn_fma == b.attn_fma / 2);
    /* q 64x64, k 64x32, v 64x32, o 64x64 left out */
    CHECK(a.matmul_params == b.matmul_params - (64.0 * 64 + 64.0 * 32 + 64.0 * 32 + 64.0 * 64));
    CHECK(isnan(model_mfu(1e9, 1e5, 0)));
}

/* the CPU peak MFU divides by: measured with one thread and with three
 * (three tasks on however many cores there are), a positive finite rate
 * each time; its size is the host's, so nothing more is asserted */
static void test_flops_cpu_peak(void)
{
    for (int t = 1; t <= 3; t += 2) {
        kern_cpu_set_threads(t);
        double p = kern_cpu_peak_flops();
        CHECK(p > 1e8 && p < 1e15);
    }
    kern_cpu_set_threads(0);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_flops_cpu_peak, test_flops_llama_134m, test_flops_llama_1b,
             test_flops_smollm2_tied_head, test_flops_shape_rules);
}
