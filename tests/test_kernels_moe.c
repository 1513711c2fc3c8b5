/* Routed-expert kernels (kernels.h, "mixture of experts"): routing, its
 * load-balancing statistics, dispatch, combine, the grouped products and
 * the shared expert's sigmoid gate.
 * Forwards against float64 references computed here; backwards against
 * central differences of a float64 scalar loss sum(out * R) (plus, for the
 * router, a term linear in the probabilities' column sums, as the
 * load-balancing loss is), with gradient buffers pre-filled so that
 * accumulation (+=) is checked too. */
#include "tests/test_kernels_common.h"

/* ---- routing ----------------------------------------------------------------- */

typedef struct {
    double *l;       /* logits [N,E] */
    double *R;       /* weight of each routing weight in the loss [N,K] */
    double *D;       /* weight of each column sum of probs [E] (NULL: none) */
    int32_t *ex;     /* the selection, fixed (the loss is smooth around it) */
    int64_t N, E, K;
    bool    norm;
} route_ctx_t;

static void ref_softmax(double *p, const double *l, int64_t E)
{
    double mx = -INFINITY, s = 0;
    for (int64_t e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
    for (int64_t e = 0; e < E; e++) s += exp(l[e] - mx);
    for (int64_t e = 0; e < E; e++) p[e] = exp(l[e] - mx) / s;
}

/* the K largest of p (distinct values), largest first */
static void ref_topk(int32_t *ex, const double *p, int64_t E, int64_t K)
{
    for (int64_t k = 0; k < K; k++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            bool taken = false;
            for (int64_t j = 0; j < k; j++) taken |= ex[j] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        ex[k] = (int32_t)best;
    }
}

static double route_loss(void *arg)
{
    const route_ctx_t *c = arg;
    double *p = kt_alloc_d(c->E), loss = 0;
    for (int64_t n = 0; n < c->N; n++) {
        ref_softmax(p, c->l + n * c->E, c->E);
        const int32_t *ex = c->ex + n * c->K;
        double S = 0;
        for (int64_t k = 0; k < c->K; k++) S += p[ex[k]];
        for (int64_t k = 0; k < c->K; k++)
            loss += c->R[n * c->K + k] * p[ex[k]] / (c->norm ? S : 1.0);
        if (c->D)
            for (int64_t e = 0; e < c->E; e++) loss += c->D[e] * p[e];
    }
    free(p);
    return loss;
}

static void route_case(kt_rng_t *rng, int64_t N, int64_t E, int64_t K, bool norm, bool aux)
{
    char what[96];
    float *logits = kt_rand(rng, N * E, -3, 3);
    float *probs = kt_alloc(N * E), *w = kt_alloc(N * K);
    int32_t *ex = calloc((size_t)(N * K), sizeof *ex), *ref_ex = calloc((size_t)(N * K), sizeof *ex);
    tensor_t L = tensor_2d(logits, DT_F32, N, E), P = tensor_2d(probs, DT_F32, N, E);
    tensor_t W = tensor_2d(w, DT_F32, N, K), X = tensor_2d(ex, DT_I32, N, K);
    kern_moe_route_fwd(kern_stream_host(), &W, &X, &P, &L, norm);

    double *ld = kt_to_d(logits, N * E), *pref = kt_alloc_d(N * E), *wref = kt_alloc_d(N * K);
    for (int64_t n = 0; n < N; n++) {
        ref_softmax(pref + n * E, ld + n * E, E);
        ref_topk(ref_ex + n * K, pref + n * E, E, K);
        double S = 0;
        for (int64_t k = 0; k < K; k++) S += pref[n * E + ref_ex[n * K + k]];
        for (int64_t k = 0; k < K; k++)
            wref[n * K + k] = pref[n * E + ref_ex[n * K + k]] / (norm ? S : 1.0);
    }
    snprintf(what, sizeof what, "route fwd N=%lld E=%lld K=%lld norm=%d probs", (long long)N,
             (long long)E, (long long)K, norm);
    kt_close(what, probs, pref, N * E, 1e-6);
    CHECK_MSG(!memcmp(ex, ref_ex, (size_t)(N * K) * sizeof *ex), "%s: other experts chosen", what);
    snprintf(what, sizeof what, "route fwd N=%lld E=%lld K=%lld norm=%d weights", (long long)N,
             (long long)E, (long long)K, norm);
    kt_close(what, w, wref, N * K, 1e-6);

    /* backward: dweights = R, dprobs = D */
    float *R = kt_rand(rng, N * K, -1, 1), *D = aux ? kt_rand(rng, E, -1, 1) : NULL;
    float *dl0 = kt_rand(rng, N * E, -1, 1), *dl = kt_dup(dl0, N * E);
    tensor_t dW = tensor_2d(R, DT_F32, N, K), dL = tensor_2d(dl, DT_F32, N, E);
    tensor_t dP = aux ? tensor_1d(D, DT_F32, E) : (tensor_t){0};
    kern_moe_route_bwd(kern_stream_host(), &dL, &dW, aux ? &dP : NULL, &P, &X, norm);
    route_ctx_t c = {.l = ld, .R = kt_to_d(R, N * K), .D = aux ? kt_to_d(D, E) : NULL, .ex = ex,
                     .N = N, .E = E, .K = K, .norm = norm};
    snprintf(what, sizeof what, "route bwd N=%lld E=%lld K=%lld norm=%d aux=%d", (long long)N,
             (long long)E, (long long)K, norm, aux);
    kt_fd_check(what, ld, N * E, dl, dl0, route_loss, &c, 400, 1e-5, rng);
    if (aux) { /* the aux term alone (no dweights) */
        float *dl2 = kt_dup(dl0, N * E);
        tensor_t dL2 = tensor_2d(dl2, DT_F32, N, E);
        kern_moe_route_bwd(kern_stream_host(), &dL2, NULL, &dP, &P, &X, norm);
        double *Rz = kt_alloc_d(N * K);
        route_ctx_t c2 = c;
        c2.R = Rz;
        snprintf(what, sizeof what, "route bwd aux only E=%lld", (long long)E);
        kt_fd_check(what, ld, N * E, dl2, dl0, route_loss, &c2, 400, 1e-5, rng);
        free(dl2), free(Rz);
    }
    free(logits), free(probs), free(w), free(ex), free(ref_ex), free(ld), free(pref), free(wref);
    free(R), free(D), free(dl0), free(dl), free(c.R), free(c.D);
}

static void test_moe_route_fwd_bwd(void)
{
    kt_rng_t rng = {21};
    route_case(&rng, 1, 4, 1, false, false);
    route_case(&rng, 13, 4, 2, true, false);
    route_case(&rng, 13, 4, 2, true, true);
    route_case(&rng, 17, 8, 2, false, true);
    route_case(&rng, 9, 6, 3, true, true);
    route_case(&rng, 5, 5, 5, true, false); /* every expert chosen */
    route_case(&rng, 33, 64, 8, false, true);
}

/* equal logits: the lower index first, on every row */
static void test_moe_route_ties(void)
{
    float logits[2 * 4] = {1, 2, 2, 1, 0, 0, 0, 0}, probs[8], w[4];
    int32_t ex[4];
    tensor_t L = tensor_2d(logits, DT_F32, 2, 4), P = tensor_2d(probs, DT_F32, 2, 4);
    tensor_t W = tensor_2d(w, DT_F32, 2, 2), X = tensor_2d(ex, DT_I32, 2, 2);
    kern_moe_route_fwd(kern_stream_host(), &W, &X, &P, &L, true);
    CHECK(ex[0] == 1 && ex[1] == 2 && ex[2] == 0 && ex[3] == 1);
    CHECK(w[0] == 0.5f && w[1] == 0.5f && w[2] == 0.5f && w[3] == 0.5f);
}

/* A selection bias: the top-K of probs + bias, weighted by the unbiased
 * probabilities (renormalised or not), against a float64 reference; a bias
 * of zero selects what kern_moe_route_fwd did. */
static void test_moe_route_reselect(void)
{
    kt_rng_t rng = {33};
    enum { N = 11, E = 6, K = 2 };
    float logits[N * E], probs[N * E], w[N * K], w0[N * K], bias[E] = {0};
    int32_t ex[N * K], ex0[N * K];
    for (int i = 0; i < N * E; i++) logits[i] = (float)kt_uniform(&rng, -2, 2);
    tensor_t L = tensor_2d(logits, DT_F32, N, E), P = tensor_2d(probs, DT_F32, N, E);
    tensor_t W = tensor_2d(w, DT_F32, N, K), X = tensor_2d(ex, DT_I32, N, K);
    tensor_t W0 = tensor_2d(w0, DT_F32, N, K), X0 = tensor_2d(ex0, DT_I32, N, K);
    tensor_t Bv = tensor_make(bias, DT_F32, DEVICE_CPU, 1, (int64_t[]){E});
    for (int norm = 0; norm < 2; norm++) {
        kern_moe_route_fwd(kern_stream_host(), &W0, &X0, &P, &L, norm);
        for (int e = 0; e < E; e++) bias[e] = 0;
        kern_moe_route_reselect(kern_stream_host(), &W, &X, &P, &Bv, norm);
        CHECK(!memcmp(ex, ex0, sizeof ex) && !memcmp(w, w0, sizeof w));
        for (int e = 0; e < E; e++) bias[e] = (float)kt_uniform(&rng, -0.3, 0.3);
        bias[3] = 1.0f; /* expert 3 always first */
        kern_moe_route_reselect(kern_stream_host(), &W, &X, &P, &Bv, norm);
        for (int n = 0; n < N; n++) {
            double sc[E];
            for (int e = 0; e < E; e++) sc[e] = (double)probs[n * E + e] + (double)bias[e];
            int32_t want[K];
            ref_topk(want, sc, E, K);
            double top = 0;
            for (int k = 0; k < K; k++) top += probs[n * E + want[k]];
            CHECK(want[0] == 3);
            for (int k = 0; k < K; k++) {
                CHECK(ex[n * K + k] == want[k]);
                double ww = probs[n * E + want[k]] / (norm ? top : 1.0);
                CHECK_NEAR(w[n * K + k], ww, 1e-6, 0);
            }
        }
    }
}

static void test_moe_route_stats(void)
{
    kt_rng_t rng = {22};
    const int64_t N = 19, E = 5, K = 2;
    float *logits = kt_rand(&rng, N * E, -2, 2), *probs = kt_alloc(N * E), *w = kt_alloc(N * K);
    int32_t ex[19 * 2];
    tensor_t L = tensor_2d(logits, DT_F32, N, E), P = tensor_2d(probs, DT_F32, N, E);
    tensor_t W = tensor_2d(w, DT_F32, N, K), X = tensor_2d(ex, DT_I32, N, K);
    kern_moe_route_fwd(kern_stream_host(), &W, &X, &P, &L, false);
    float counts[5] = {1, 2, 3, 4, 5}, psum[5] = {0.5f, 0, 0, 0, -1};
    double cref[5] = {0}, pref[5] = {0};
    for (int64_t n = 0; n < N; n++) {
        for (int64_t k = 0; k < K; k++) cref[ex[n * K + k]] += 1;
        for (int64_t e = 0; e < E; e++) pref[e] += probs[n * E + e];
    }
    float c0[5], p0[5];
    memcpy(c0, counts, sizeof c0);
    memcpy(p0, psum, sizeof p0);
    tensor_t Cn = tensor_1d(counts, DT_F32, E), Ps = tensor_1d(psum, DT_F32, E);
    kern_moe_route_stats(kern_stream_host(), &Cn, &Ps, &P, &X);
    double total = 0;
    for (int64_t e = 0; e < E; e++) {
        CHECK(counts[e] - c0[e] == (float)cref[e]);
        total += counts[e] - c0[e];
    }
    CHECK(total == (double)(N * K));
    kt_close_base("route stats psum", psum, p0, pref, E, 1e-6);
    free(logits), free(probs), free(w);
}

/* ---- dispatch ---------------------------------------------------------------- */

typedef struct {
    double *x, *R; /* x [N,C]; R weights each element of xp [N*K,C] in the loss */
    const int32_t *slot;
    int64_t N, C, K;
} permute_ctx_t;

static double permute_loss(void *arg)
{
    const permute_ctx_t *c = arg;
    double loss = 0;
    for (int64_t i = 0; i < c->N * c->K; i++) {
        if (c->slot[i] < 0) continue;
        for (int64_t j = 0; j < c->C; j++)
            loss += c->R[(int64_t)c->slot[i] * c->C + j] * c->x[(i / c->K) * c->C + j];
    }
    return loss;
}

/* The permutation's reference: experts in order, each expert's choices in
 * row order, expert e keeping its first caps[e] (caps NULL: capacity, < 0
 * for all); the count of slots, permuted rows, sizes and routed counts that
 * differ from it (rows past the kept ones must be zero), and the drops. */
static int64_t permute_ref_bad(const int32_t *ex, const int32_t *slot, const int32_t *sizes,
                               const int32_t *routed, const float *xp, const float *x, int64_t M,
                               int64_t C, int64_t K, int64_t E, const int32_t *caps,
                               int64_t capacity, int64_t *dropped)
{
    int64_t row = 0, bad = 0;
    for (int64_t e = 0; e < E; e++) {
        int64_t cap = caps ? caps[e] : capacity, seen = 0;
        for (int64_t i = 0; i < M; i++) {
            if (ex[i] != e) continue;
            bool keep = cap < 0 || seen < cap;
            seen++;
            if (!keep) {
                bad += slot[i] != -1;
                (*dropped)++;
                continue;
            }
            bad += slot[i] != row;
            bad += memcmp(xp + row * C, x + (i / K) * C, (size_t)C * sizeof *x) != 0;
            row++;
        }
        bad += routed[e] != seen;
        bad += sizes[e] != (cap >= 0 && seen > cap ? cap : seen);
    }
    for (int64_t i = row * C; i < M * C; i++) bad += xp[i] != 0.0f;
    return bad;
}

static void permute_case(kt_rng_t *rng, int64_t N, int64_t C, int64_t K, int64_t E,
                         int64_t capacity)
{
    char what[96];
    snprintf(what, sizeof what, "permute N=%lld K=%lld E=%lld cap=%lld", (long long)N,
             (long long)K, (long long)E, (long long)capacity);
    int64_t M = N * K;
    int32_t *ex = calloc((size_t)M, sizeof *ex), *slot = calloc((size_t)M, sizeof *slot);
    for (int64_t n = 0; n < N; n++) /* K distinct experts per row, skewed towards expert 0 */
        for (int64_t k = 0; k < K; k++) {
            int32_t e;
            bool dup;
            do {
                e = (int32_t)(kt_int(rng, 3) == 0 ? 0 : kt_int(rng, E));
                dup = false;
                for (int64_t j = 0; j < k; j++) dup |= ex[n * K + j] == e;
            } while (dup);
            ex[n * K + k] = e;
        }
    float *x = kt_rand(rng, N * C, -1, 1), *xp = kt_rand(rng, M * C, 5, 6); /* poisoned */
    int32_t *sizes = calloc((size_t)E, sizeof *sizes), *routed = calloc((size_t)E, sizeof *routed);
    tensor_t X = tensor_2d(x, DT_F32, N, C), XP = tensor_2d(xp, DT_F32, M, C);
    tensor_t Ex = tensor_2d(ex, DT_I32, N, K), S = tensor_2d(slot, DT_I32, N, K);
    tensor_t Sz = tensor_1d(sizes, DT_I32, E), Rt = tensor_1d(routed, DT_I32, E);
    kern_moe_permute_fwd(kern_stream_host(), &XP, &S, &Sz, &Rt, &X, &Ex, capacity);

    int64_t dropped = 0;
    int64_t bad = permute_ref_bad(ex, slot, sizes, routed, xp, x, M, C, K, E, NULL, capacity,
                                  &dropped);
    CHECK_MSG(bad == 0, "%s: %lld slots, rows or counts differ from the reference", what,
              (long long)bad);
    CHECK_MSG(capacity >= 0 || dropped == 0, "%s: dropless dropped %lld", what, (long long)dropped);

    /* backward */
    float *dxp = kt_rand(rng, M * C, -1, 1), *dx0 = kt_rand(rng, N * C, -1, 1);
    float *dx = kt_dup(dx0, N * C);
    tensor_t dXP = tensor_2d(dxp, DT_F32, M, C), dX = tensor_2d(dx, DT_F32, N, C);
    kern_moe_permute_bwd(kern_stream_host(), &dX, &dXP, &S);
    permute_ctx_t c = {kt_to_d(x, N * C), kt_to_d(dxp, M * C), slot, N, C, K};
    kt_fd_check(what, c.x, N * C, dx, dx0, permute_loss, &c, 300, 1e-6, rng);
    free(ex), free(slot), free(x), free(xp), free(sizes), free(routed), free(dxp);
    free(dx0), free(dx), free(c.x), free(c.R);
}

/* A capacity per expert (kern_moe_permute_fwd_caps): expert e keeps its
 * first caps[e] choices in row order, as the reference walks them; with
 * every cap equal it is the one-capacity call, bit for bit. */
static void test_moe_permute_caps(void)
{
    kt_rng_t rng = {29};
    enum { N = 23, C = 5, K = 2, E = 4, M = N * K };
    int32_t ex[M], slot[M], slot1[M], sizes[E], routed[E], sizes1[E], routed1[E];
    for (int64_t n = 0; n < N; n++) { /* two distinct experts per row */
        ex[n * K] = (int32_t)kt_int(&rng, E);
        ex[n * K + 1] = (int32_t)((ex[n * K] + 1 + kt_int(&rng, E - 1)) % E);
    }
    float *x = kt_rand(&rng, N * C, -1, 1), *xp = kt_rand(&rng, M * C, 5, 6), *xp1 = kt_dup(xp, M * C);
    int32_t caps[E] = {0, 3, 1000, 7};
    tensor_t X = tensor_2d(x, DT_F32, N, C), XP = tensor_2d(xp, DT_F32, M, C);
    tensor_t Ex = tensor_2d(ex, DT_I32, N, K), S = tensor_2d(slot, DT_I32, N, K);
    tensor_t Sz = tensor_1d(sizes, DT_I32, E), Rt = tensor_1d(routed, DT_I32, E);
    tensor_t Cp = tensor_1d(caps, DT_I32, E);
    kern_moe_permute_fwd_caps(kern_stream_host(), &XP, &S, &Sz, &Rt, &X, &Ex, &Cp);
    int64_t dropped = 0;
    int64_t bad = permute_ref_bad(ex, slot, sizes, routed, xp, x, M, C, K, E, caps, -1, &dropped);
    CHECK_MSG(bad == 0, "per-expert caps: %lld slots, rows or counts differ", (long long)bad);
    CHECK_MSG(routed[0] > 0 && dropped >= routed[0], "expert 0 (cap 0) among %lld dropped of %d",
              (long long)dropped, routed[0]);
    /* all caps 3: the same bits as capacity 3 */
    for (int e = 0; e < E; e++) caps[e] = 3;
    tensor_t XP1 = tensor_2d(xp1, DT_F32, M, C), S1 = tensor_2d(slot1, DT_I32, N, K);
    tensor_t Sz1 = tensor_1d(sizes1, DT_I32, E), Rt1 = tensor_1d(routed1, DT_I32, E);
    kern_moe_permute_fwd_caps(kern_stream_host(), &XP, &S, &Sz, &Rt, &X, &Ex, &Cp);
    kern_moe_permute_fwd(kern_stream_host(), &XP1, &S1, &Sz1, &Rt1, &X, &Ex, 3);
    CHECK(!memcmp(xp, xp1, sizeof(float) * M * C) && !memcmp(slot, slot1, sizeof slot) &&
          !memcmp(sizes, sizes1, sizeof sizes) && !memcmp(routed, routed1, sizeof routed));
    free(x), free(xp), free(xp1);
}

static void test_moe_permute(void)
{
    kt_rng_t rng = {23};
    permute_case(&rng, 1, 3, 1, 2, -1);
    permute_case(&rng, 23, 7, 2, 4, -1);
    permute_case(&rng, 23, 7, 2, 4, 3);  /* expert 0 over capacity: drops */
    permute_case(&rng, 40, 5, 3, 6, 0);  /* capacity 0: every choice dropped */
    permute_case(&rng, 31, 9, 2, 8, 5);
    permute_case(&rng, 10, 4, 4, 4, -1); /* every expert on every row */
}

/* ---- combine ------------------------------------------------------------------ */

typedef struct {
    double *yp, *w, *R; /* yp [M,C], w [N,K], R [N,C] */
    const int32_t *slot;
    int64_t N, C, K;
} combine_ctx_t;

static void ref_combine(double *y, const combine_ctx_t *c)
{
    memset(y, 0, (size_t)(c->N * c->C) * sizeof *y);
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t k = 0; k < c->K; k++) {
            int32_t r = c->slot[n * c->K + k];
            if (r < 0) continue;
            for (int64_t j = 0; j < c->C; j++)
                y[n * c->C + j] += c->w[n * c->K + k] * c->yp[(int64_t)r * c->C + j];
        }
}

static double combine_loss(void *arg)
{
    const combine_ctx_t *c = arg;
    double *y = kt_alloc_d(c->N * c->C), loss = 0;
    ref_combine(y, c);
    for (int64_t i = 0; i < c->N * c->C; i++) loss += y[i] * c->R[i];
    free(y);
    return loss;
}

static void test_moe_combine(void)
{
    kt_rng_t rng = {24};
    const int64_t N = 21, C = 6, K = 3, M = N * K;
    /* a permutation of the slots with some dropped */
    int32_t *slot = calloc((size_t)M, sizeof *slot);
    for (int64_t i = 0; i < M; i++) slot[i] = (int32_t)i;
    for (int64_t i = M - 1; i > 0; i--) {
        int64_t j = kt_int(&rng, i + 1);
        int32_t t = slot[i];
        slot[i] = slot[j];
        slot[j] = t;
    }
    for (int64_t i = 0; i < M; i += 5) slot[i] = -1;
    slot[3 * K] = slot[3 * K + 1] = slot[3 * K + 2] = -1; /* row 3: all dropped */
    float *yp = kt_rand(&rng, M * C, -1, 1), *w = kt_rand(&rng, N * K, 0, 1);
    float *y = kt_rand(&rng, N * C, 5, 6);
    tensor_t YP = tensor_2d(yp, DT_F32, M, C), W = tensor_2d(w, DT_F32, N, K);
    tensor_t Y = tensor_2d(y, DT_F32, N, C), S = tensor_2d(slot, DT_I32, N, K);
    kern_moe_combine_fwd(kern_stream_host(), &Y, &YP, &S, &W);
    combine_ctx_t c = {kt_to_d(yp, M * C), kt_to_d(w, N * K), NULL, slot, N, C, K};
    double *ref = kt_alloc_d(N * C);
    ref_combine(ref, &c);
    kt_close("combine fwd", y, ref, N * C, 1e-6);
    for (int64_t j = 0; j < C; j++) CHECK(y[3 * C + j] == 0.0f);

    float *dy = kt_rand(&rng, N * C, -1, 1), *dyp0 = kt_rand(&rng, M * C, -1, 1);
    float *dw0 = kt_rand(&rng, N * K, -1, 1), *dyp = kt_dup(dyp0, M * C), *dw = kt_dup(dw0, N * K);
    tensor_t dY = tensor_2d(dy, DT_F32, N, C), dYP = tensor_2d(dyp, DT_F32, M, C);
    tensor_t dW = tensor_2d(dw, DT_F32, N, K);
    kern_moe_combine_bwd(kern_stream_host(), &dYP, &dW, &dY, &YP, &S, &W);
    c.R = kt_to_d(dy, N * C);
    kt_fd_check("combine dyp", c.yp, M * C, dyp, dyp0, combine_loss, &c, 400, 1e-6, &rng);
    kt_fd_check("combine dweights", c.w, N * K, dw, dw0, combine_loss, &c, 400, 1e-6, &rng);
    /* either output alone gives the same */
    float *dw2 = kt_dup(dw0, N * K);
    tensor_t dW2 = tensor_2d(dw2, DT_F32, N, K);
    kern_moe_combine_bwd(kern_stream_host(), NULL, &dW2, &dY, &YP, &S, &W);
    CHECK(!memcmp(dw2, dw, (size_t)(N * K) * sizeof *dw));
    free(slot), free(yp), free(w), free(y), free(c.yp), free(c.w), free(c.R), free(ref), free(dy);
    free(dyp0), free(dw0), free(dyp), free(dw), free(dw2);
}

/* ---- the shared expert's sigmoid gate ------------------------------------------- */

typedef struct {
    double *g, *x, *R; /* gate [N], x [N,C], R [N,C] */
    int64_t N, C;
} gate_ctx_t;

static double gate_loss(void *arg)
{
    const gate_ctx_t *c = arg;
    double loss = 0;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t j = 0; j < c->C; j++)
            loss += c->R[n * c->C + j] * c->x[n * c->C + j] / (1 + exp(-c->g[n]));
    return loss;
}

static void test_moe_sigmoid_gate(void)
{
    kt_rng_t rng = {27};
    const int64_t N = 17, C = 9;
    float *g = kt_rand(&rng, N, -6, 6), *x = kt_rand(&rng, N * C, -1, 1);
    float *out = kt_rand(&rng, N * C, 5, 6);
    tensor_t G = tensor_2d(g, DT_F32, N, 1), X = tensor_2d(x, DT_F32, N, C);
    tensor_t O = tensor_2d(out, DT_F32, N, C);
    kern_sigmoid_gate_fwd(kern_stream_host(), &O, &G, &X);
    gate_ctx_t c = {kt_to_d(g, N), kt_to_d(x, N * C), NULL, N, C};
    double *ref = kt_alloc_d(N * C);
    for (int64_t i = 0; i < N * C; i++) ref[i] = c.x[i] / (1 + exp(-c.g[i / C]));
    kt_close("sigmoid gate fwd", out, ref, N * C, 1e-6);
    float *dout = kt_rand(&rng, N * C, -1, 1), *dx0 = kt_rand(&rng, N * C, -1, 1);
    float *dg0 = kt_rand(&rng, N, -1, 1), *dx = kt_dup(dx0, N * C), *dg = kt_dup(dg0, N);
    tensor_t dO = tensor_2d(dout, DT_F32, N, C), dX = tensor_2d(dx, DT_F32, N, C);
    tensor_t dG = tensor_2d(dg, DT_F32, N, 1);
    kern_sigmoid_gate_bwd(kern_stream_host(), &dX, &dG, &dO, &G, &X);
    c.R = kt_to_d(dout, N * C);
    kt_fd_check("sigmoid gate dx", c.x, N * C, dx, dx0, gate_loss, &c, 300, 1e-6, &rng);
    kt_fd_check("sigmoid gate dgate", c.g, N, dg, dg0, gate_loss, &c, 300, 1e-5, &rng);
    free(g), free(x), free(out), free(c.g), free(c.x), free(c.R), free(ref), free(dout);
    free(dx0), free(dg0), free(dx), free(dg);
}

/* ---- grouped products ----------------------------------------------------------- */

typedef struct {
    double *x, *w, *R; /* x [M,IC], w [G,OC,IC], R [M,OC] */
    const int32_t *sizes;
    int64_t M, IC, OC, G;
} grouped_ctx_t;

static void ref_grouped(double *out, const grouped_ctx_t *c)
{
    memset(out, 0, (size_t)(c->M * c->OC) * sizeof *out);
    int64_t r = 0;
    for (int64_t g = 0; g < c->G; g++)
        for (int64_t i = 0; i < c->sizes[g]; i++, r++)
            for (int64_t o = 0; o < c->OC; o++) {
                double s = 0;
                for (int64_t j = 0; j < c->IC; j++)
                    s += c->x[r * c->IC + j] * c->w[(g * c->OC + o) * c->IC + j];
                out[r * c->OC + o] = s;
            }
}

static double grouped_loss(void *arg)
{
    const grouped_ctx_t *c = arg;
    double *out = kt_alloc_d(c->M * c->OC), loss = 0;
    ref_grouped(out, c);
    for (int64_t i = 0; i < c->M * c->OC; i++) loss += out[i] * c->R[i];
    free(out);
    return loss;
}

static void grouped_case(kt_rng_t *rng, int64_t M, int64_t IC, int64_t OC, int64_t G,
                         const int32_t *sizes, double rtol, int64_t fd_coords)
{
    char what[96];
    snprintf(what, sizeof what, "grouped M=%lld IC=%lld OC=%lld G=%lld", (long long)M,
             (long long)IC, (long long)OC, (long long)G);
    float *x = kt_rand(rng, M * IC, -1, 1), *w = kt_rand(rng, G * OC * IC, -1, 1);
    float *out = kt_rand(rng, M * OC, 5, 6); /* poisoned: the tail must be zeroed */
    int32_t *sz = calloc((size_t)G, sizeof *sz);
    memcpy(sz, sizes, (size_t)G * sizeof *sz);
    tensor_t X = tensor_2d(x, DT_F32, M, IC), W = tensor_3d(w, DT_F32, G, OC, IC);
    tensor_t O = tensor_2d(out, DT_F32, M, OC), S = tensor_1d(sz, DT_I32, G);
    kern_grouped_linear_fwd(kern_stream_host(), &O, &X, &W, &S);
    grouped_ctx_t c = {kt_to_d(x, M * IC), kt_to_d(w, G * OC * IC), NULL, sz, M, IC, OC, G};
    double *ref = kt_alloc_d(M * OC);
    ref_grouped(ref, &c);
    kt_close(what, out, ref, M * OC, rtol);

    float *dout = kt_rand(rng, M * OC, -1, 1), *dx0 = kt_rand(rng, M * IC, -1, 1);
    float *dw0 = kt_rand(rng, G * OC * IC, -1, 1), *dx = kt_dup(dx0, M * IC);
    float *dw = kt_dup(dw0, G * OC * IC);
    tensor_t dO = tensor_2d(dout, DT_F32, M, OC), dX = tensor_2d(dx, DT_F32, M, IC);
    tensor_t dW = tensor_3d(dw, DT_F32, G, OC, IC);
    kern_grouped_linear_bwd(kern_stream_host(), &dX, &dW, &dO, &X, &W, &S);
    c.R = kt_to_d(dout, M * OC);
    kt_fd_check(what, c.x, M * IC, dx, dx0, grouped_loss, &c, fd_coords, rtol, rng);
    kt_fd_check(what, c.w, G * OC * IC, dw, dw0, grouped_loss, &c, fd_coords, rtol, rng);
    free(x), free(w), free(out), free(sz), free(c.x), free(c.w), free(c.R), free(ref), free(dout);
    free(dx0), free(dw0), free(dx), free(dw);
}

static void test_grouped_linear(void)
{
    kt_rng_t rng = {25};
    grouped_case(&rng, 5, 3, 4, 1, (int32_t[]){5}, 1e-5, 300);
    grouped_case(&rng, 24, 16, 12, 4, (int32_t[]){7, 0, 13, 4}, 1e-5, 300); /* an empty group */
    grouped_case(&rng, 30, 8, 6, 3, (int32_t[]){2, 9, 11}, 1e-5, 300); /* 8 rows past the groups */
    grouped_case(&rng, 12, 5, 5, 3, (int32_t[]){0, 0, 0}, 1e-5, 300);  /* nothing routed */
    /* products large enough for the pool's tiles (2^18 multiply-adds and more) */
    grouped_case(&rng, 600, 64, 256, 2, (int32_t[]){280, 320}, 2e-5, 12);
}

/* the pool's tiles never change the bits: 1, 2 and 3 threads agree */
static void test_grouped_linear_threads(void)
{
    kt_rng_t rng = {26};
    const int64_t M = 700, IC = 96, OC = 384, G = 3;
    int32_t sizes[3] = {300, 0, 390};
    float *x = kt_rand(&rng, M * IC, -1, 1), *w = kt_rand(&rng, G * OC * IC, -1, 1);
    float *out[3];
    tensor_t X = tensor_2d(x, DT_F32, M, IC), W = tensor_3d(w, DT_F32, G, OC, IC);
    tensor_t S = tensor_1d(sizes, DT_I32, G);
    for (int t = 0; t < 3; t++) {
        kern_cpu_set_threads(t + 1);
        out[t] = kt_alloc(M * OC);
        tensor_t O = tensor_2d(out[t], DT_F32, M, OC);
        kern_grouped_linear_fwd(kern_stream_host(), &O, &X, &W, &S);
    }
    kern_cpu_set_threads(0);
    CHECK(!memcmp(out[0], out[1], (size_t)(M * OC) * sizeof(float)));
    CHECK(!memcmp(out[0], out[2], (size_t)(M * OC) * sizeof(float)));
    free(x), free(w), free(out[0]), free(out[1]), free(out[2]);
}

/* ---- misuse -------------------------------------------------------------------- */

static void topk_past_experts(void *arg)
{
    float l[2] = {0}, p[2], w[3];
    int32_t ex[3];
    tensor_t L = tensor_2d(l, DT_F32, 1, 2), P = tensor_2d(p, DT_F32, 1, 2);
    tensor_t W = tensor_2d(w, DT_F32, 1, 3), X = tensor_2d(ex, DT_I32, 1, 3);
    kern_moe_route_fwd(kern_stream_host(), &W, &X, &P, &L, false);
}

static void groups_past_rows(void *arg)
{
    float x[8] = {0}, w[8] = {0}, out[8];
    int32_t sizes[2] = {3, 2};
    tensor_t X = tensor_2d(x, DT_F32, 4, 2), W = tensor_3d(w, DT_F32, 2, 2, 2);
    tensor_t O = tensor_2d(out, DT_F32, 4, 2), S = tensor_1d(sizes, DT_I32, 2);
    kern_grouped_linear_fwd(kern_stream_host(), &O, &X, &W, &S);
}

static void expert_id_outside(void *arg)
{
    float x[4] = {0}, xp[4];
    int32_t ex[2] = {0, 3}, slot[2], sizes[2], routed[2];
    tensor_t X = tensor_2d(x, DT_F32, 2, 2), XP = tensor_2d(xp, DT_F32, 2, 2);
    tensor_t Ex = tensor_2d(ex, DT_I32, 2, 1), S = tensor_2d(slot, DT_I32, 2, 1);
    tensor_t Sz = tensor_1d(sizes, DT_I32, 2), Rt = tensor_1d(routed, DT_I32, 2);
    kern_moe_permute_fwd(kern_stream_host(), &XP, &S, &Sz, &Rt, &X, &Ex, -1);
}

static void test_moe_misuse_panics(void)
{
    CHECK(kt_panics(topk_past_experts, NULL, "kern_moe_route_fwd: top-3 of 2 experts"));
    CHECK(kt_panics(groups_past_rows, NULL, "kern_grouped_linear_fwd: group 1 has 2 rows from row 3"));
    CHECK(kt_panics(expert_id_outside, NULL, "kern_moe_permute_fwd: expert id 3 outside [0, 2)"));
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_moe_route_fwd_bwd, test_moe_route_ties, test_moe_route_reselect,
             test_moe_route_stats,
             test_moe_permute, test_moe_permute_caps, test_moe_combine, test_moe_sigmoid_gate, test_grouped_linear, test_grouped_linear_threads,
             test_moe_misuse_panics);
}
