/* The overwriting (_set) twins of the backward ops (kernels.h): on the CPU
 * their outputs, written into buffers full of NaN, are bit for bit those of
 * kern_zero followed by the accumulating op, and parameter gradients (dw,
 * dbias) still accumulate; an overwritten output that aliases an input
 * panics. (The CUDA backend's overwrite is checked against float64 by
 * tests/device/test_cuda_ops.c, rows "..._set".) */
#include "tests/test_kernels_common.h"

static float *nans(int64_t n)
{
    float *p = kt_alloc(n);
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

static bool same(const float *a, const float *b, int64_t n)
{
    return !memcmp(a, b, (size_t)n * sizeof *a);
}

static void test_linear_bwd_set(void)
{
    kt_rng_t r = {41};
    /* 300 x 257 x 130 is past the CPU backend's panel threshold: the tiled path */
    const int64_t shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {300, 130, 257}};
    for (int si = 0; si < 3; si++) {
        int64_t N = shapes[si][0], IC = shapes[si][1], OC = shapes[si][2];
        float *x = kt_rand(&r, N * IC, -1, 1), *w = kt_rand(&r, OC * IC, -1, 1);
        float *dout = kt_rand(&r, N * OC, -1, 1), *dw0 = kt_rand(&r, OC * IC, -1, 1);
        float *db0 = kt_rand(&r, OC, -1, 1);
        float *dxa = nans(N * IC), *dxb = kt_rand(&r, N * IC, 3, 4);
        float *dwa = kt_dup(dw0, OC * IC), *dwb = kt_dup(dw0, OC * IC);
        float *dba = kt_dup(db0, OC), *dbb = kt_dup(db0, OC);
        tensor_t X = tensor_2d(x, DT_F32, N, IC), W = tensor_2d(w, DT_F32, OC, IC);
        tensor_t dO = tensor_2d(dout, DT_F32, N, OC);
        tensor_t dXa = tensor_2d(dxa, DT_F32, N, IC), dXb = tensor_2d(dxb, DT_F32, N, IC);
        tensor_t dWa = tensor_2d(dwa, DT_F32, OC, IC), dWb = tensor_2d(dwb, DT_F32, OC, IC);
        tensor_t dBa = tensor_1d(dba, DT_F32, OC), dBb = tensor_1d(dbb, DT_F32, OC);
        kern_linear_bwd_set(kern_stream_host(), &dXa, &dWa, &dBa, &dO, &X, &W);
        kern_zero(kern_stream_host(), &dXb);
        kern_linear_bwd(kern_stream_host(), &dXb, &dWb, &dBb, &dO, &X, &W);
        CHECK_MSG(same(dxa, dxb, N * IC), "linear_bwd_set dx, shape %d", si);
        CHECK_MSG(same(dwa, dwb, OC * IC), "linear_bwd_set dw (accumulates), shape %d", si);
        CHECK_MSG(same(dba, dbb, OC), "linear_bwd_set dbias (accumulates), shape %d", si);
        /* dw accumulated onto dw0, not overwritten */
        CHECK(OC * IC < 2 || !same(dwa, dw0, OC * IC));
        free(x), free(w), free(dout), free(dw0), free(db0), free(dxa), free(dxb), free(dwa);
        free(dwb), free(dba), free(dbb);
    }
}

static void test_rope_swiglu_bwd_set(void)
{
    kt_rng_t r = {42};
    const int64_t BT = 12, H = 3, D = 8, P = 16, n = BT * H * D, half = D / 2;
    float *x = kt_rand(&r, n, -2, 2), *cs = kt_rand(&r, P * half, -1, 1);
    float *sn = kt_rand(&r, P * half, -1, 1);
    int32_t pos[12];
    for (int64_t t = 0; t < BT; t++) pos[t] = (int32_t)kt_int(&r, P);
    float *a = nans(n), *b = kt_rand(&r, n, 3, 4);
    int64_t sh[3] = {BT, H, D};
    tensor_t X = tensor_make(x, DT_F32, DEVICE_CPU, 3, sh);
    tensor_t A = tensor_make(a, DT_F32, DEVICE_CPU, 3, sh), B = tensor_make(b, DT_F32, DEVICE_CPU, 3, sh);
    tensor_t C = tensor_2d(cs, DT_F32, P, half), S = tensor_2d(sn, DT_F32, P, half);
    tensor_t Pp = tensor_1d(pos, DT_I32, BT);
    kern_rope_bwd_set(kern_stream_host(), &A, &X, &C, &S, &Pp);
    kern_zero(kern_stream_host(), &B);
    kern_rope_bwd(kern_stream_host(), &B, &X, &C, &S, &Pp);
    CHECK_MSG(same(a, b, n), "rope_bwd_set");
    free(x), free(cs), free(sn), free(a), free(b);

    const int64_t m = 1001;
    float *g = kt_rand(&r, m, -6, 6), *u = kt_rand(&r, m, -2, 2), *d = kt_rand(&r, m, -1, 1);
    float *ga = nans(m), *ua = nans(m), *gb = kt_rand(&r, m, 3, 4), *ub = kt_rand(&r, m, 3, 4);
    tensor_t G = tensor_1d(g, DT_F32, m), U = tensor_1d(u, DT_F32, m), dO = tensor_1d(d, DT_F32, m);
    tensor_t Ga = tensor_1d(ga, DT_F32, m), Ua = tensor_1d(ua, DT_F32, m);
    tensor_t Gb = tensor_1d(gb, DT_F32, m), Ub = tensor_1d(ub, DT_F32, m);
    kern_swiglu_bwd_set(kern_stream_host(), &Ga, &Ua, &dO, &G, &U);
    kern_zero(kern_stream_host(), &Gb);
    kern_zero(kern_stream_host(), &Ub);
    kern_swiglu_bwd(kern_stream_host(), &Gb, &Ub, &dO, &G, &U);
    CHECK_MSG(same(ga, gb, m), "swiglu_bwd_set dgate");
    CHECK_MSG(same(ua, ub, m), "swiglu_bwd_set dup");
    free(g), free(u), free(d), free(ga), free(ua), free(gb), free(ub);
}

static void test_attention_bwd_set(void)
{
    kt_rng_t r = {43};
    /* GQA 4/2, causal, Tq = Tk = 70 (two of the CPU kernel's 64-row blocks) */
    const int64_t B = 2, T = 70, Hq = 4, Hkv = 2, Dh = 16;
    int64_t nq = B * T * Hq * Dh, nk = B * T * Hkv * Dh, nl = B * Hq * T;
    float *q = kt_rand(&r, nq, -1.5, 1.5), *k = kt_rand(&r, nk, -1.5, 1.5);
    float *v = kt_rand(&r, nk, -1, 1), *dout = kt_rand(&r, nq, -1, 1);
    float *out = kt_alloc(nq), *lse = kt_alloc(nl);
    int64_t qs[4] = {B, T, Hq, Dh}, ks[4] = {B, T, Hkv, Dh};
    tensor_t Q = tensor_make(q, DT_F32, DEVICE_CPU, 4, qs), K = tensor_make(k, DT_F32, DEVICE_CPU, 4, ks);
    tensor_t V = tensor_make(v, DT_F32, DEVICE_CPU, 4, ks), O = tensor_make(out, DT_F32, DEVICE_CPU, 4, qs);
    tensor_t dO = tensor_make(dout, DT_F32, DEVICE_CPU, 4, qs), L = tensor_1d(lse, DT_F32, nl);
    float scale = 0.25f;
    kern_attention_fwd(kern_stream_host(), &O, &L, &Q, &K, &V, scale, true, 0);
    float *qa = nans(nq), *ka = nans(nk), *va = nans(nk);
    float *qb = kt_rand(&r, nq, 3, 4), *kb = kt_rand(&r, nk, 3, 4), *vb = kt_rand(&r, nk, 3, 4);
    tensor_t Qa = tensor_make(qa, DT_F32, DEVICE_CPU, 4, qs), Ka = tensor_make(ka, DT_F32, DEVICE_CPU, 4, ks);
    tensor_t Va = tensor_make(va, DT_F32, DEVICE_CPU, 4, ks), Qb = tensor_make(qb, DT_F32, DEVICE_CPU, 4, qs);
    tensor_t Kb = tensor_make(kb, DT_F32, DEVICE_CPU, 4, ks), Vb = tensor_make(vb, DT_F32, DEVICE_CPU, 4, ks);
    kern_attention_bwd_set(kern_stream_host(), &Qa, &Ka, &Va, &dO, &Q, &K, &V, &O, &L, scale, true,
                           0);
    kern_zero(kern_stream_host(), &Qb);
    kern_zero(kern_stream_host(), &Kb);
    kern_zero(kern_stream_host(), &Vb);
    kern_attention_bwd(kern_stream_host(), &Qb, &Kb, &Vb, &dO, &Q, &K, &V, &O, &L, scale, true, 0);
    CHECK_MSG(same(qa, qb, nq), "attention_bwd_set dq");
    CHECK_MSG(same(ka, kb, nk), "attention_bwd_set dk");
    CHECK_MSG(same(va, vb, nk), "attention_bwd_set dv");
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(qa), free(ka), free(va);
    free(qb), free(kb), free(vb);
}

static void set_dx_aliases_dout(void *arg)
{
    (void)arg;
    float buf[6] = {0}, w[4] = {0};
    tensor_t D = tensor_2d(buf, DT_F32, 3, 2), W = tensor_2d(w, DT_F32, 2, 2);
    kern_linear_bwd_set(kern_stream_host(), &D, NULL, NULL, &D, &D, &W);
}

static void set_rope_in_place(void *arg)
{
    (void)arg;
    float x[4] = {0}, c[2] = {1, 1}, s[2] = {0, 0};
    int32_t pos[1] = {0};
    int64_t sh[3] = {1, 1, 4};
    tensor_t X = tensor_make(x, DT_F32, DEVICE_CPU, 3, sh);
    tensor_t C = tensor_2d(c, DT_F32, 1, 2), S = tensor_2d(s, DT_F32, 1, 2);
    tensor_t Pp = tensor_1d(pos, DT_I32, 1);
    kern_rope_bwd_set(kern_stream_host(), &X, &X, &C, &S, &Pp);
}

static void test_set_alias_panics(void)
{
    CHECK(kt_panics(set_dx_aliases_dout, NULL, "kern_linear_bwd_set: dx aliases an input"));
    CHECK(kt_panics(set_rope_in_place, NULL, "kern_rope_bwd_set: dx aliases an input"));
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_linear_bwd_set, test_rope_swiglu_bwd_set, test_attention_bwd_set,
             test_set_alias_panics);
}
