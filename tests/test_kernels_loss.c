/* Fused softmax cross-entropy: losses against a float64 log-softmax,
 * dlogits against central differences of dloss * sum(losses), ignore_index
 * rows, and the vocabulary-parallel pieces combined over 2 and 3 simulated
 * shards against the unsharded call. */
#include "tests/test_kernels_common.h"

enum { IGNORE = -100 };

typedef struct {
    double        *x; /* logits [N,V] */
    const int32_t *t;
    int64_t        N, V;
    double         dloss;
} xent_ctx_t;

static double ref_row_loss(const double *x, int64_t V, int32_t t)
{
    double m = -INFINITY, z = 0;
    for (int64_t j = 0; j < V; j++) m = x[j] > m ? x[j] : m;
    for (int64_t j = 0; j < V; j++) z += exp(x[j] - m);
    return m + log(z) - x[t];
}

static double xent_loss(void *p)
{
    xent_ctx_t *c = p;
    double l = 0;
    for (int64_t n = 0; n < c->N; n++)
        if (c->t[n] != IGNORE) l += ref_row_loss(c->x + n * c->V, c->V, c->t[n]);
    return c->dloss * l;
}

static void xent_data(kt_rng_t *rng, int64_t N, int64_t V, float **logits, int32_t **targets,
                      int64_t *scored)
{
    *logits = kt_rand(rng, N * V, -4, 4);
    for (int64_t i = 0; i < N * V; i += 7) (*logits)[i] += 25.0f; /* large values: max matters */
    *targets = calloc((size_t)N, sizeof **targets);
    *scored = 0;
    for (int64_t n = 0; n < N; n++) {
        (*targets)[n] = n % 4 == 1 ? IGNORE : (int32_t)kt_int(rng, V);
        *scored += (*targets)[n] != IGNORE;
    }
}

static void test_xent_fwd_bwd(void)
{
    kt_rng_t rng = {20};
    const int64_t shapes[][2] = {{1, 1}, {3, 7}, {17, 33}, {6, 65}, {5, 1000}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t N = shapes[s][0], V = shapes[s][1], scored;
        float *x;
        int32_t *t;
        xent_data(&rng, N, V, &x, &t, &scored);
        float dloss = scored ? 1.0f / (float)scored : 1.0f;
        float *losses = kt_rand(&rng, N, 5, 6), *dl = kt_rand(&rng, N * V, 5, 6); /* overwritten */
        xent_ctx_t c = {kt_to_d(x, N * V), t, N, V, dloss};
        double *ref = kt_alloc_d(N);
        for (int64_t n = 0; n < N; n++) ref[n] = t[n] == IGNORE ? 0 : ref_row_loss(c.x + n * V, V, t[n]);
        tensor_t L = tensor_1d(losses, DT_F32, N), X = tensor_2d(x, DT_F32, N, V);
        tensor_t Tg = tensor_1d(t, DT_I32, N), DL = tensor_2d(dl, DT_F32, N, V);
        kern_xent_fwd_bwd(kern_stream_host(), &L, &DL, &X, &Tg, dloss, IGNORE);
        kt_close("xent losses", losses, ref, N, 1e-5);
        kt_fd_check("xent dlogits", c.x, N * V, dl, NULL, xent_loss, &c, 400, 1e-4, &rng);
        int bad = 0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < V && t[n] == IGNORE; j++) bad += dl[n * V + j] != 0.0f;
        CHECK_MSG(bad == 0, "ignored rows must have zero dlogits");
        /* without dlogits: same losses */
        float *l2 = kt_alloc(N);
        tensor_t L2 = tensor_1d(l2, DT_F32, N);
        kern_xent_fwd_bwd(kern_stream_host(), &L2, NULL, &X, &Tg, dloss, IGNORE);
        CHECK(!memcmp(l2, losses, (size_t)N * sizeof *l2));
        free(x), free(t), free(losses), free(dl), free(c.x), free(ref), free(l2);
    }
}

/* Runs the three vocabulary-parallel passes over `shards` contiguous shards
 * (the all-reduces done here by hand) and compares with the unsharded call. */
static void xent_vp_case(int64_t N, int64_t V, int shards, uint64_t seed)
{
    kt_rng_t rng = {seed};
    int64_t scored;
    float *x;
    int32_t *t;
    xent_data(&rng, N, V, &x, &t, &scored);
    float dloss = 0.125f;
    float *full_l = kt_alloc(N), *full_d = kt_alloc(N * V);
    tensor_t FL = tensor_1d(full_l, DT_F32, N), FD = tensor_2d(full_d, DT_F32, N, V);
    tensor_t X = tensor_2d(x, DT_F32, N, V), Tg = tensor_1d(t, DT_I32, N);
    kern_xent_fwd_bwd(kern_stream_host(), &FL, &FD, &X, &Tg, dloss, IGNORE);

    int64_t start[4];
    for (int s = 0; s <= shards; s++) start[s] = V * s / shards;
    float **xs = calloc((size_t)shards, sizeof *xs);
    float *gmax = kt_alloc(N), *gsum = kt_alloc(N), *gtgt = kt_alloc(N);
    float *m = kt_alloc(N), *se = kt_alloc(N), *tl = kt_alloc(N), *ls = kt_alloc(N);
    float *sd = kt_alloc(N * V); /* the shards' dlogits, reassembled as [N,V] */
    for (int64_t n = 0; n < N; n++) gmax[n] = -INFINITY;
    for (int s = 0; s < shards; s++) { /* shard s holds columns [start[s], start[s+1]) */
        int64_t Vr = start[s + 1] - start[s];
        xs[s] = kt_alloc(N * Vr);
        for (int64_t n = 0; n < N; n++)
            memcpy(xs[s] + n * Vr, x + n * V + start[s], (size_t)Vr * sizeof *x);
        tensor_t Xs = tensor_2d(xs[s], DT_F32, N, Vr), M = tensor_1d(m, DT_F32, N);
        kern_xent_vp_max(kern_stream_host(), &M, &Xs);
        for (int64_t n = 0; n < N; n++) gmax[n] = m[n] > gmax[n] ? m[n] : gmax[n]; /* MAX */
    }
    tensor_t GM = tensor_1d(gmax, DT_F32, N), SE = tensor_1d(se, DT_F32, N);
    tensor_t TL = tensor_1d(tl, DT_F32, N), GS = tensor_1d(gsum, DT_F32, N);
    tensor_t GT = tensor_1d(gtgt, DT_F32, N), LS = tensor_1d(ls, DT_F32, N);
    for (int s = 0; s < shards; s++) {
        int64_t Vr = start[s + 1] - start[s];
        tensor_t Xs = tensor_2d(xs[s], DT_F32, N, Vr);
        kern_xent_vp_sum(kern_stream_host(), &SE, &TL, &Xs, &GM, &Tg, start[s], IGNORE);
        for (int64_t n = 0; n < N; n++) gsum[n] += se[n], gtgt[n] += tl[n]; /* SUM */
    }
    for (int s = 0; s < shards; s++) {
        int64_t Vr = start[s + 1] - start[s];
        float *d = kt_rand(&rng, N * Vr, 7, 8); /* overwritten */
        tensor_t Xs = tensor_2d(xs[s], DT_F32, N, Vr), D = tensor_2d(d, DT_F32, N, Vr);
        kern_xent_vp_finish(kern_stream_host(), &LS, &D, &Xs, &GM, &GS, &GT, &Tg, start[s], dloss,
                            IGNORE);
        for (int64_t n = 0; n < N; n++) memcpy(sd + n * V + start[s], d + n * Vr, (size_t)Vr * 4);
        double *rl = kt_to_d(full_l, N);
        kt_close("vp losses", ls, rl, N, 1e-5); /* every rank gets the full loss */
        free(rl), free(d);
    }
    double *rd = kt_to_d(full_d, N * V);
    kt_close("vp dlogits", sd, rd, N * V, 1e-5);
    for (int s = 0; s < shards; s++) free(xs[s]);
    free(xs), free(x), free(t), free(full_l), free(full_d), free(gmax), free(gsum), free(gtgt);
    free(m), free(se), free(tl), free(ls), free(sd), free(rd);
}

static void test_xent_vocab_parallel(void)
{
    xent_vp_case(9, 64, 2, 21);
    xent_vp_case(17, 33, 3, 22);
    xent_vp_case(4, 1001, 3, 23);
    xent_vp_case(3, 3, 3, 24); /* one column per shard */
}

static void bad_target(void *arg)
{
    float x[6] = {0}, l[2];
    int32_t t[2] = {1, 3};
    tensor_t X = tensor_2d(x, DT_F32, 2, 3), L = tensor_1d(l, DT_F32, 2), T = tensor_1d(t, DT_I32, 2);
    kern_xent_fwd_bwd(kern_stream_host(), &L, NULL, &X, &T, 1, IGNORE);
}

static void test_xent_target_out_of_vocab_panics(void)
{
    CHECK(kt_panics(bad_target, NULL, "target 3 of row 1 outside the vocabulary [0, 3)"));
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_xent_fwd_bwd, test_xent_vocab_parallel,
             test_xent_target_out_of_vocab_panics);
}
