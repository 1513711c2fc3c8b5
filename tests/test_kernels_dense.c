/* Dense algebra, elementwise ops, conversions, reductions and the dispatch's
 * argument checks, against float64 references. */
#include "tests/test_kernels_common.h"

#include <pthread.h>

/* ---- matmul ---------------------------------------------------------------- */

static void ref_matmul(double *c, const double *a, const double *b, int64_t M, int64_t N,
                       int64_t K, bool ta, bool tb, double alpha, double beta)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++)
                s += (ta ? a[k * M + i] : a[i * K + k]) * (tb ? b[j * K + k] : b[k * N + j]);
            c[i * N + j] = alpha * s + beta * c[i * N + j];
        }
}

static void test_matmul_shapes_transposes_beta(void)
{
    kt_rng_t rng = {1};
    const int64_t shapes[][3] = {{1, 1, 1}, {3, 7, 17}, {17, 33, 7}, {65, 1, 33}, {1, 65, 3},
                                 {33, 17, 65}, {128, 96, 80},
                                 /* large enough to be tiled over the pool */
                                 {300, 200, 50}, {70, 520, 40}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            float alpha = t == 3 ? -0.5f : 1.0f, beta = (float)(t % 3) * 0.75f;
            float *a = kt_rand(&rng, M * K, -1, 1), *b = kt_rand(&rng, K * N, -1, 1);
            float *c = kt_rand(&rng, M * N, -1, 1);
            if (beta == 0.0f) c[0] = NAN; /* beta 0 must overwrite, not scale */
            double *ad = kt_to_d(a, M * K), *bd = kt_to_d(b, K * N), *cd = kt_to_d(c, M * N);
            if (beta == 0.0f) cd[0] = 0;
            ref_matmul(cd, ad, bd, M, N, K, ta, tb, alpha, beta);
            tensor_t A = ta ? tensor_2d(a, DT_F32, K, M) : tensor_2d(a, DT_F32, M, K);
            tensor_t B = tb ? tensor_2d(b, DT_F32, N, K) : tensor_2d(b, DT_F32, K, N);
            tensor_t C = tensor_2d(c, DT_F32, M, N);
            kern_matmul(kern_stream_host(), &C, &A, &B, ta, tb, alpha, beta);
            char what[64];
            snprintf(what, sizeof what, "matmul %lldx%lldx%lld t%d", (long long)M, (long long)N,
                     (long long)K, t);
            kt_close(what, c, cd, M * N, 1e-5);
            free(a), free(b), free(c), free(ad), free(bd), free(cd);
        }
    }
    /* a 3-D operand is flattened to rows x cols */
    float a[2 * 3 * 4], b[4 * 5], c[6 * 5];
    for (int i = 0; i < 24; i++) a[i] = (float)(i % 7) - 3;
    for (int i = 0; i < 20; i++) b[i] = (float)(i % 5) - 2;
    double ad[24], bd[20], cd[30] = {0};
    for (int i = 0; i < 24; i++) ad[i] = a[i];
    for (int i = 0; i < 20; i++) bd[i] = b[i];
    ref_matmul(cd, ad, bd, 6, 5, 4, false, false, 1, 0);
    tensor_t A = tensor_3d(a, DT_F32, 2, 3, 4), B = tensor_2d(b, DT_F32, 4, 5);
    tensor_t C = tensor_3d(c, DT_F32, 2, 3, 5);
    kern_matmul(kern_stream_host(), &C, &A, &B, false, false, 1, 0);
    kt_close("matmul 3-D", c, cd, 30, 1e-6);
}

/* The CPU backend's products are bit-identical for every thread count
 * (kernels/cpu/pool.c): OpenBLAS's own threading is not (with 0.3.21 on an
 * AMD EPYC 3 600 of 24 576 elements of a 128x192x64 product differed between
 * 1 and 2 threads), and a run's result then depended on how many processes
 * shared the host. */
static void mm_run(float *c, const float *a, const float *b, int64_t M, int64_t N, int64_t K,
                   int t)
{
    bool ta = t & 1, tb = t & 2;
    tensor_t A = ta ? tensor_2d((float *)a, DT_F32, K, M) : tensor_2d((float *)a, DT_F32, M, K);
    tensor_t B = tb ? tensor_2d((float *)b, DT_F32, N, K) : tensor_2d((float *)b, DT_F32, K, N);
    tensor_t C = tensor_2d(c, DT_F32, M, N);
    kern_matmul(kern_stream_host(), &C, &A, &B, ta, tb, 1.0f, t == 3 ? 0.5f : 0.0f);
}

static const int64_t mm_det_shapes[][3] = {{128, 192, 64}, {37, 384, 1024}, {1024, 384, 64},
                                           {256, 1030, 96}, {130, 129, 300}, {16, 96, 32}};
#define MM_DET_N ((int)(sizeof mm_det_shapes / sizeof mm_det_shapes[0]))

static void test_matmul_bits_independent_of_threads(void)
{
    kt_rng_t rng = {5};
    const int threads[] = {1, 2, 3, 8};
    for (int s = 0; s < MM_DET_N; s++) {
        int64_t M = mm_det_shapes[s][0], N = mm_det_shapes[s][1], K = mm_det_shapes[s][2];
        float *a = kt_rand(&rng, M * K, -1, 1), *b = kt_rand(&rng, K * N, -1, 1);
        float *c0 = kt_rand(&rng, M * N, -1, 1), *c = malloc((size_t)(M * N) * sizeof *c);
        float *ref = malloc((size_t)(M * N) * sizeof *ref);
        for (int t = 0; t < 4; t++) {
            for (int h = 0; h < 4; h++) {
                kern_cpu_set_threads(threads[h]);
                memcpy(c, c0, (size_t)(M * N) * sizeof *c);
                mm_run(c, a, b, M, N, K, t);
                if (h == 0) memcpy(ref, c, (size_t)(M * N) * sizeof *c);
                int64_t diff = 0;
                for (int64_t i = 0; i < M * N; i++) diff += memcmp(&c[i], &ref[i], sizeof *c) != 0;
                CHECK_MSG(diff == 0, "%lldx%lldx%lld t%d: %lld elements differ at %d threads",
                          (long long)M, (long long)N, (long long)K, t, (long long)diff,
                          threads[h]);
            }
        }
        free(a), free(b), free(c0), free(c), free(ref);
    }
    kern_cpu_set_threads(2);
}

/* Two compute threads of one process multiply at once: the one that finds
 * the pool busy runs its tiles itself, with the same bits. */
typedef struct {
    const float *a, *b;
    float       *c;
    int64_t      M, N, K;
    int          rounds;
} mm_conc_t;

static void *mm_conc_thread(void *arg)
{
    mm_conc_t *m = arg;
    for (int r = 0; r < m->rounds; r++) mm_run(m->c + r * m->M * m->N, m->a, m->b, m->M, m->N, m->K, 0);
    return NULL;
}

static void test_matmul_concurrent_callers(void)
{
    kt_rng_t rng = {6};
    int64_t M = 256, N = 200, K = 64;
    enum { ROUNDS = 20 };
    float *a = kt_rand(&rng, M * K, -1, 1), *b = kt_rand(&rng, K * N, -1, 1);
    float *ref = calloc((size_t)(M * N), sizeof *ref);
    mm_run(ref, a, b, M, N, K, 0);
    mm_conc_t m[2];
    pthread_t tid[2];
    for (int i = 0; i < 2; i++) {
        m[i] = (mm_conc_t){.a = a, .b = b, .M = M, .N = N, .K = K, .rounds = ROUNDS,
                           .c = calloc((size_t)(ROUNDS * M * N), sizeof(float))};
        REQUIRE(pthread_create(&tid[i], NULL, mm_conc_thread, &m[i]) == 0);
    }
    for (int i = 0; i < 2; i++) pthread_join(tid[i], NULL);
    int64_t diff = 0;
    for (int i = 0; i < 2; i++) {
        for (int r = 0; r < ROUNDS; r++)
            diff += memcmp(m[i].c + r * M * N, ref, (size_t)(M * N) * sizeof *ref) != 0;
        free(m[i].c);
    }
    CHECK_MSG(diff == 0, "%lld of %d concurrent products differ from the serial one",
              (long long)diff, 2 * ROUNDS);
    free(a), free(b), free(ref);
}

/* ---- linear ---------------------------------------------------------------- */

typedef struct {
    double *x, *w, *b, *R; /* R: weights of the scalar loss sum(out * R) */
    int64_t N, IC, OC;
} linear_ctx_t;

static void ref_linear(double *out, const linear_ctx_t *c)
{
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t o = 0; o < c->OC; o++) {
            double s = c->b ? c->b[o] : 0;
            for (int64_t i = 0; i < c->IC; i++) s += c->x[n * c->IC + i] * c->w[o * c->IC + i];
            out[n * c->OC + o] = s;
        }
}

static double linear_loss(void *p)
{
    linear_ctx_t *c = p;
    double *out = kt_alloc_d(c->N * c->OC), l = 0;
    ref_linear(out, c);
    for (int64_t i = 0; i < c->N * c->OC; i++) l += out[i] * c->R[i];
    free(out);
    return l;
}

static void test_linear_fwd_bwd(void)
{
    kt_rng_t rng = {2};
    const int64_t shapes[][3] = {{1, 1, 1}, {3, 7, 5}, {17, 33, 7}, {7, 17, 65}, {64, 48, 40}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            float *x = kt_rand(&rng, N * IC, -1, 1), *w = kt_rand(&rng, OC * IC, -1, 1);
            float *b = kt_rand(&rng, OC, -1, 1), *out = kt_rand(&rng, N * OC, -9, 9);
            float *dout = kt_rand(&rng, N * OC, -1, 1);
            /* gradients start non-zero: backward must add */
            float *dx0 = kt_rand(&rng, N * IC, -1, 1), *dw0 = kt_rand(&rng, OC * IC, -1, 1);
            float *db0 = kt_rand(&rng, OC, -1, 1);
            float *dx = kt_dup(dx0, N * IC), *dw = kt_dup(dw0, OC * IC), *db = kt_dup(db0, OC);
            linear_ctx_t c = {kt_to_d(x, N * IC), kt_to_d(w, OC * IC),
                              with_bias ? kt_to_d(b, OC) : NULL, kt_to_d(dout, N * OC), N, IC, OC};
            double *ref = kt_alloc_d(N * OC);
            ref_linear(ref, &c);
            tensor_t X = tensor_2d(x, DT_F32, N, IC), W = tensor_2d(w, DT_F32, OC, IC);
            tensor_t Bt = tensor_1d(b, DT_F32, OC), O = tensor_2d(out, DT_F32, N, OC);
            tensor_t dO = tensor_2d(dout, DT_F32, N, OC), dX = tensor_2d(dx, DT_F32, N, IC);
            tensor_t dW = tensor_2d(dw, DT_F32, OC, IC), dB = tensor_1d(db, DT_F32, OC);
            kern_linear_fwd(kern_stream_host(), &O, &X, &W, with_bias ? &Bt : NULL);
            kt_close("linear fwd", out, ref, N * OC, 1e-5);
            kern_linear_bwd(kern_stream_host(), &dX, &dW, with_bias ? &dB : NULL, &dO, &X, &W);
            kt_fd_check("linear dx", c.x, N * IC, dx, dx0, linear_loss, &c, 200, 1e-4, &rng);
            kt_fd_check("linear dw", c.w, OC * IC, dw, dw0, linear_loss, &c, 200, 1e-4, &rng);
            if (with_bias)
                kt_fd_check("linear db", c.b, OC, db, db0, linear_loss, &c, 200, 1e-4, &rng);
            else
                CHECK(!memcmp(db, db0, (size_t)OC * sizeof *db)); /* NULL dbias: untouched */
            /* NULL dx and dw are skipped */
            float *dw2 = kt_dup(dw0, OC * IC);
            tensor_t dW2 = tensor_2d(dw2, DT_F32, OC, IC);
            kern_linear_bwd(kern_stream_host(), NULL, &dW2, NULL, &dO, &X, &W);
            CHECK(!memcmp(dw2, dw, (size_t)(OC * IC) * sizeof *dw));
            free(x), free(w), free(b), free(out), free(dout), free(dx0), free(dw0), free(db0);
            free(dx), free(dw), free(db), free(dw2), free(ref);
            free(c.x), free(c.w), free(c.b), free(c.R);
        }
    }
}

/* ---- elementwise ----------------------------------------------------------- */

static void test_elementwise_ops(void)
{
    kt_rng_t rng = {3};
    int64_t n = 1001;
    float *a = kt_rand(&rng, n, -2, 2), *b = kt_rand(&rng, n, -2, 2), *o = kt_alloc(n);
    double *ref = kt_alloc_d(n);
    tensor_t A = tensor_1d(a, DT_F32, n), B = tensor_1d(b, DT_F32, n), O = tensor_1d(o, DT_F32, n);
    kern_add(kern_stream_host(), &O, &A, &B);
    for (int64_t i = 0; i < n; i++) ref[i] = (double)a[i] + b[i];
    kt_close("add", o, ref, n, 1e-7);
    float *a2 = kt_dup(a, n);
    tensor_t A2 = tensor_2d(a2, DT_F32, 7, 143);
    tensor_t B2 = tensor_2d(b, DT_F32, 7, 143);
    kern_add(kern_stream_host(), &A2, &A2, &B2); /* out aliases a */
    kt_close("add in place", a2, ref, n, 1e-7);

    float *y = kt_dup(a, n);
    tensor_t Y = tensor_1d(y, DT_F32, n);
    kern_axpy(kern_stream_host(), &Y, -0.375f, &B);
    for (int64_t i = 0; i < n; i++) ref[i] = (double)a[i] - 0.375 * b[i];
    kt_close("axpy", y, ref, n, 1e-6);
    kern_scale(kern_stream_host(), &Y, 3.0f);
    for (int64_t i = 0; i < n; i++) ref[i] *= 3.0;
    kt_close("scale", y, ref, n, 1e-6);
    kern_zero(kern_stream_host(), &Y);
    int nz = 0;
    for (int64_t i = 0; i < n; i++) nz += y[i] != 0.0f;
    CHECK(nz == 0);

    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)a[i] * a[i];
    CHECK_NEAR(kern_sumsq(kern_stream_host(), &A), ss, 1e-12, 0);
    CHECK(kern_count_nonfinite(kern_stream_host(), &A) == 0);
    a[5] = NAN, a[17] = INFINITY, a[1000] = -INFINITY;
    CHECK(kern_count_nonfinite(kern_stream_host(), &A) == 3);
    free(a), free(b), free(o), free(ref), free(a2), free(y);
}

static void test_copy_conversions(void)
{
    kt_rng_t rng = {4};
    int64_t n = 333;
    float *f = kt_rand(&rng, n, -100, 100);
    f[0] = NAN, f[1] = INFINITY, f[2] = -0.0f, f[3] = 1e-30f;
    uint16_t *bf = calloc((size_t)n, 2), *hf = calloc((size_t)n, 2);
    double *d = kt_alloc_d(n);
    float *back = kt_alloc(n);
    tensor_t F = tensor_1d(f, DT_F32, n), BF = tensor_1d(bf, DT_BF16, n);
    tensor_t HF = tensor_2d(hf, DT_F16, 3, 111), D = tensor_1d(d, DT_F64, n);
    tensor_t BK = tensor_1d(back, DT_F32, n);
    kern_copy(kern_stream_host(), &BF, &F);
    kern_copy(kern_stream_host(), &HF, &F);
    kern_copy(kern_stream_host(), &D, &F);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        bad += bf[i] != f32_to_bf16(f[i]);
        bad += hf[i] != f32_to_f16(f[i]);
        bad += !(d[i] == (double)f[i] || (isnan(d[i]) && isnan(f[i])));
    }
    CHECK_MSG(bad == 0, "%d converted elements differ", bad);
    kern_copy(kern_stream_host(), &BK, &BF);
    for (int64_t i = 0; i < n; i++) bad += !(back[i] == bf16_to_f32(bf[i]) || isnan(back[i]));
    kern_copy(kern_stream_host(), &BK, &HF);
    for (int64_t i = 0; i < n; i++) bad += !(back[i] == f16_to_f32(hf[i]) || isnan(back[i]));
    kern_copy(kern_stream_host(), &BK, &D);
    for (int64_t i = 0; i < n; i++) bad += !(back[i] == f[i] || (isnan(back[i]) && isnan(f[i])));
    CHECK_MSG(bad == 0, "%d round-tripped elements differ", bad);
    /* bf16 -> f16 goes through f32 */
    uint16_t *h2 = calloc((size_t)n, 2);
    tensor_t H2 = tensor_1d(h2, DT_F16, n);
    kern_copy(kern_stream_host(), &H2, &BF);
    for (int64_t i = 4; i < n; i++) bad += h2[i] != f32_to_f16(bf16_to_f32(bf[i]));
    CHECK(bad == 0);
    /* reductions over other float dtypes */
    double ss = 0;
    for (int64_t i = 4; i < n; i++) ss += (double)bf16_to_f32(bf[i]) * bf16_to_f32(bf[i]);
    tensor_t BFtail = tensor_1d(bf + 4, DT_BF16, n - 4);
    CHECK_NEAR(kern_sumsq(kern_stream_host(), &BFtail), ss, 1e-12, 0);
    CHECK(kern_count_nonfinite(kern_stream_host(), &BF) == 2 && kern_count_nonfinite(kern_stream_host(), &HF) == 2);
    CHECK(kern_count_nonfinite(kern_stream_host(), &D) == 2);
    /* same-dtype copy of integers */
    int32_t ia[5] = {1, -2, 3, 1 << 30, 5}, ib[5] = {0};
    tensor_t IA = tensor_1d(ia, DT_I32, 5), IB = tensor_1d(ib, DT_I32, 5);
    kern_copy(kern_stream_host(), &IB, &IA);
    CHECK(!memcmp(ia, ib, sizeof ia));
    free(f), free(bf), free(hf), free(d), free(back), free(h2);
}

/* Empty tensors (NULL data) are valid no-ops, not aliasing or OOM panics. */
static void test_empty_tensors(void)
{
    float w[12], b[3], dw[12], q[16];
    for (int i = 0; i < 12; i++) w[i] = (float)i, dw[i] = 1.0f;
    tensor_t X = tensor_2d(NULL, DT_F32, 0, 4), W = tensor_2d(w, DT_F32, 3, 4);
    tensor_t O = tensor_2d(NULL, DT_F32, 0, 3), Bt = tensor_1d(b, DT_F32, 3);
    tensor_t dW = tensor_2d(dw, DT_F32, 3, 4), dX = tensor_2d(NULL, DT_F32, 0, 4);
    kern_linear_fwd(kern_stream_host(), &O, &X, &W, &Bt);
    kern_linear_bwd(kern_stream_host(), &dX, &dW, NULL, &O, &X, &W);
    int bad = 0;
    for (int i = 0; i < 12; i++) bad += dw[i] != 1.0f; /* += of an empty sum */
    CHECK(bad == 0);
    tensor_t A = tensor_2d(NULL, DT_F32, 0, 5), Bm = tensor_2d(NULL, DT_F32, 5, 0);
    tensor_t C = tensor_2d(NULL, DT_F32, 0, 0);
    kern_matmul(kern_stream_host(), &C, &A, &Bm, false, false, 1, 0);
    tensor_t Q = tensor_4d(NULL, DT_F32, 1, 0, 2, 4), K = tensor_4d(q, DT_F32, 1, 2, 2, 4);
    tensor_t Oa = tensor_4d(NULL, DT_F32, 1, 0, 2, 4), L = tensor_3d(NULL, DT_F32, 1, 2, 0);
    kern_attention_fwd(kern_stream_host(), &Oa, &L, &Q, &K, &K, 0.5f, true, 2);
    kern_attention_bwd(kern_stream_host(), NULL, NULL, NULL, &Oa, &Q, &K, &K, &Oa, &L, 0.5f, true, 2);
    tensor_t Lg = tensor_2d(NULL, DT_F32, 0, 7), Tg = tensor_1d(NULL, DT_I32, 0);
    tensor_t Ls = tensor_1d(NULL, DT_F32, 0);
    kern_xent_fwd_bwd(kern_stream_host(), &Ls, NULL, &Lg, &Tg, 1, -100);
    CHECK(kern_sumsq(kern_stream_host(), &X) == 0.0 && kern_count_nonfinite(kern_stream_host(), &X) == 0);
}

/* ---- dispatch argument checks ---------------------------------------------- */

static void bad_matmul_inner(void *arg)
{
    float buf[64];
    tensor_t a = tensor_2d(buf, DT_F32, 3, 4), b = tensor_2d(buf, DT_F32, 5, 2);
    tensor_t c = tensor_2d(buf + 32, DT_F32, 3, 2);
    kern_matmul(kern_stream_host(), &c, &a, &b, false, false, 1, 0);
}

static void bad_linear_dtype(void *arg)
{
    float buf[64];
    tensor_t x = tensor_2d(buf, DT_F32, 2, 4), w = tensor_2d(buf, DT_BF16, 3, 4);
    tensor_t o = tensor_2d(buf + 32, DT_F32, 2, 3);
    kern_linear_fwd(kern_stream_host(), &o, &x, &w, NULL);
}

static void bad_noncontig(void *arg)
{
    float buf[64];
    tensor_t a = tensor_2d(buf, DT_F32, 4, 4);
    a.stride[0] = 1, a.stride[1] = 4;
    kern_scale(kern_stream_host(), &a, 2);
}

static void bad_cuda(void *arg)
{
    float buf[4];
    tensor_t a = tensor_1d(buf, DT_F32, 4);
    a.device.kind = DEV_CUDA;
    kern_scale(kern_stream_host(), &a, 2);
}

static void bad_fenced_on_host(void *arg)
{
    float buf[4];
    tensor_t a = tensor_on(tensor_1d(buf, DT_F32, 4), (device_t){DEV_FENCED, 0});
    kern_scale(kern_stream_host(), &a, 2);
}

static void bad_bf16_compute(void *arg)
{
    uint16_t buf[4];
    tensor_t a = tensor_1d(buf, DT_BF16, 4);
    kern_scale(kern_stream_host(), &a, 2);
}

static void bad_gqa(void *arg)
{
    float buf[256];
    tensor_t q = tensor_4d(buf, DT_F32, 1, 2, 3, 4), k = tensor_4d(buf, DT_F32, 1, 2, 2, 4);
    tensor_t o = tensor_4d(buf, DT_F32, 1, 2, 3, 4), l = tensor_3d(buf, DT_F32, 1, 3, 2);
    kern_attention_fwd(kern_stream_host(), &o, &l, &q, &k, &k, 1, true, 0);
}

static void bad_device_mix(void *arg)
{
    float buf[8];
    tensor_t a = tensor_1d(buf, DT_F32, 4), b = tensor_1d(buf + 4, DT_F32, 4);
    b.device.index = 1;
    kern_axpy(kern_stream_host(), &a, 1, &b);
}

static void test_dispatch_misuse_panics(void)
{
    CHECK(kt_panics(bad_matmul_inner, NULL, "kern_matmul: inner dims differ"));
    CHECK(kt_panics(bad_linear_dtype, NULL, "kern_linear_fwd: w is bf16, expected f32"));
    CHECK(kt_panics(bad_noncontig, NULL, "kern_scale: t f32[4,4] is not contiguous"));
    CHECK(kt_panics(bad_cuda, NULL, "kern_scale: t is on cuda:0 but the call runs on cpu"));
    CHECK(kt_panics(bad_fenced_on_host, NULL, "kern_scale: t is on fenced but the call runs on cpu"));
    CHECK(kt_panics(bad_bf16_compute, NULL, "kern_scale: the cpu backend has no bf16 kernel"));
    CHECK(kt_panics(bad_gqa, NULL, "3 query heads are not a multiple of 2 kv heads"));
    CHECK(kt_panics(bad_device_mix, NULL, "kern_axpy: x is on cpu:1 but the call runs on cpu"));
}

int main(int argc, char **argv)
{
    kern_cpu_set_threads(2);
    TEST_RUN(argc, argv, test_matmul_shapes_transposes_beta, test_matmul_bits_independent_of_threads,
             test_matmul_concurrent_callers, test_linear_fwd_bwd,
             test_elementwise_ops, test_copy_conversions, test_empty_tensors,
             test_dispatch_misuse_panics);
}
