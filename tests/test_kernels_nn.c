/* Embedding, RMSNorm (and the fused residual add + RMSNorm), RoPE, SwiGLU and squared ReLU: forward against float64 references,
 * backward against central differences of a float64 scalar loss
 * sum(out * R), with gradient buffers pre-filled so that accumulation (+=) is
 * checked too. */
#include "tests/test_kernels_common.h"

/* ---- embedding ------------------------------------------------------------- */

static void test_embedding_fwd_bwd_shards(void)
{
    kt_rng_t rng = {10};
    const int64_t Vtot = 23, C = 7, N = 33;
    float *table = kt_rand(&rng, Vtot * C, -1, 1);
    int32_t ids[33];
    for (int64_t n = 0; n < N; n++) ids[n] = (int32_t)kt_int(&rng, Vtot);
    ids[0] = ids[1] = 5; /* repeated ids accumulate */
    float *out = kt_alloc(N * C), *dout = kt_rand(&rng, N * C, -1, 1);
    tensor_t T = tensor_2d(table, DT_F32, Vtot, C), I = tensor_1d(ids, DT_I32, N);
    tensor_t O = tensor_2d(out, DT_F32, N, C), dO = tensor_2d(dout, DT_F32, N, C);
    kern_embedding_fwd(kern_stream_host(), &O, &T, &I, 0);
    int bad = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) bad += out[n * C + c] != table[ids[n] * C + c];
    CHECK_MSG(bad == 0, "%d gathered values differ", bad);

    /* backward: the loss is linear in the table, so the gradient is exact */
    float *d0 = kt_rand(&rng, Vtot * C, -1, 1), *dt = kt_dup(d0, Vtot * C);
    tensor_t DT = tensor_2d(dt, DT_F32, Vtot, C);
    kern_embedding_bwd(kern_stream_host(), &DT, &dO, &I, 0);
    double *ref = kt_alloc_d(Vtot * C);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) ref[ids[n] * C + c] += dout[n * C + c];
    kt_close_base("embedding bwd", dt, d0, ref, Vtot * C, 1e-6);

    /* three vocabulary shards [0,8) [8,16) [16,23): outputs sum to the full one
     * (rows outside a shard are zero) and the gradients tile the full one */
    const int64_t starts[4] = {0, 8, 16, 23};
    float *sum = kt_alloc(N * C), *part = kt_rand(&rng, N * C, 5, 6);
    for (int s = 0; s < 3; s++) {
        int64_t V = starts[s + 1] - starts[s];
        tensor_t Ts = tensor_2d(table + starts[s] * C, DT_F32, V, C);
        tensor_t P = tensor_2d(part, DT_F32, N, C);
        kern_embedding_fwd(kern_stream_host(), &P, &Ts, &I, starts[s]);
        for (int64_t n = 0; n < N; n++) {
            bool mine = ids[n] >= starts[s] && ids[n] < starts[s + 1];
            for (int64_t c = 0; c < C; c++) {
                bad += !mine && part[n * C + c] != 0.0f;
                sum[n * C + c] += part[n * C + c];
            }
        }
        float *ds = kt_dup(d0 + starts[s] * C, V * C);
        tensor_t DS = tensor_2d(ds, DT_F32, V, C);
        kern_embedding_bwd(kern_stream_host(), &DS, &dO, &I, starts[s]);
        bad += memcmp(ds, dt + starts[s] * C, (size_t)(V * C) * sizeof *ds) != 0;
        free(ds);
    }
    bad += memcmp(sum, out, (size_t)(N * C) * sizeof *out) != 0;
    CHECK_MSG(bad == 0, "sharded embedding differs from the unsharded one (%d)", bad);
    free(table), free(out), free(dout), free(d0), free(dt), free(ref), free(sum), free(part);
}

/* ---- RMSNorm --------------------------------------------------------------- */

typedef struct {
    double *x, *w, *R;
    int64_t N, C;
    double  eps;
} rms_ctx_t;

static void ref_rmsnorm(double *out, double *rstd, const rms_ctx_t *c)
{
    for (int64_t n = 0; n < c->N; n++) {
        double ss = 0;
        for (int64_t i = 0; i < c->C; i++) ss += c->x[n * c->C + i] * c->x[n * c->C + i];
        double r = 1.0 / sqrt(ss / (double)c->C + c->eps);
        if (rstd) rstd[n] = r;
        for (int64_t i = 0; i < c->C; i++) out[n * c->C + i] = c->w[i] * c->x[n * c->C + i] * r;
    }
}

static double rms_loss(void *p)
{
    rms_ctx_t *c = p;
    double *out = kt_alloc_d(c->N * c->C), l = 0;
    ref_rmsnorm(out, NULL, c);
    for (int64_t i = 0; i < c->N * c->C; i++) l += out[i] * c->R[i];
    free(out);
    return l;
}

static void test_rmsnorm_fwd_bwd(void)
{
    kt_rng_t rng = {11};
    /* C = 1 is left out: y = w sign(x) there and dx cancels to ~eps, below fp32 resolution */
    const int64_t shapes[][2] = {{1, 2}, {3, 7}, {17, 33}, {5, 65}, {2, 512}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t N = shapes[s][0], C = shapes[s][1];
        float eps = s % 2 ? 1e-5f : 1e-6f;
        float *x = kt_rand(&rng, N * C, -2, 2), *w = kt_rand(&rng, C, 0.5, 1.5);
        float *out = kt_alloc(N * C), *rstd = kt_alloc(N), *dout = kt_rand(&rng, N * C, -1, 1);
        float *dx0 = kt_rand(&rng, N * C, -1, 1), *dw0 = kt_rand(&rng, C, -1, 1);
        float *dx = kt_dup(dx0, N * C), *dw = kt_dup(dw0, C);
        rms_ctx_t c = {kt_to_d(x, N * C), kt_to_d(w, C), kt_to_d(dout, N * C), N, C, eps};
        double *ref = kt_alloc_d(N * C), *rref = kt_alloc_d(N);
        ref_rmsnorm(ref, rref, &c);
        tensor_t X = tensor_2d(x, DT_F32, N, C), W = tensor_1d(w, DT_F32, C);
        tensor_t O = tensor_2d(out, DT_F32, N, C), Rs = tensor_1d(rstd, DT_F32, N);
        tensor_t dO = tensor_2d(dout, DT_F32, N, C), dX = tensor_2d(dx, DT_F32, N, C);
        tensor_t dW = tensor_1d(dw, DT_F32, C);
        kern_rmsnorm_fwd(kern_stream_host(), &O, &Rs, &X, &W, eps);
        kt_close("rmsnorm out", out, ref, N * C, 1e-6);
        kt_close("rmsnorm rstd", rstd, rref, N, 1e-6);
        kern_rmsnorm_bwd(kern_stream_host(), &dX, &dW, &dO, &X, &W, &Rs);
        kt_fd_check("rmsnorm dx", c.x, N * C, dx, dx0, rms_loss, &c, 300, 1e-4, &rng);
        kt_fd_check("rmsnorm dw", c.w, C, dw, dw0, rms_loss, &c, 300, 1e-4, &rng);
        free(x), free(w), free(out), free(rstd), free(dout), free(dx0), free(dw0), free(dx);
        free(dw), free(ref), free(rref), free(c.x), free(c.w), free(c.R);
    }
    /* a tiny-magnitude row (x ~ 1e-4, so mean(x^2) ~ eps) still matches */
    float x[4] = {1e-4f, -2e-4f, 3e-4f, 0}, w[4] = {1, 1, 1, 1}, o[4], r[1];
    rms_ctx_t c = {kt_to_d(x, 4), kt_to_d(w, 4), NULL, 1, 4, 1e-6};
    double ref[4];
    ref_rmsnorm(ref, NULL, &c);
    tensor_t X = tensor_2d(x, DT_F32, 1, 4), W = tensor_1d(w, DT_F32, 4);
    tensor_t O = tensor_2d(o, DT_F32, 1, 4), R = tensor_1d(r, DT_F32, 1);
    kern_rmsnorm_fwd(kern_stream_host(), &O, &R, &X, &W, 1e-6f);
    kt_close("rmsnorm small", o, ref, 4, 1e-5);
    free(c.x), free(c.w);
}

/* The fused residual add + norm: the bits of kern_add then kern_rmsnorm_fwd
 * (also with xout in place over x and over y), and both against a float64
 * reference of the sum and its norm. */
static void test_add_rmsnorm_fwd(void)
{
    kt_rng_t rng = {12};
    const int64_t shapes[][2] = {{1, 1}, {3, 7}, {17, 33}, {4, 768}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t N = shapes[s][0], C = shapes[s][1], n = N * C;
        float eps = 1e-5f;
        float *x = kt_rand(&rng, n, -2, 2), *y = kt_rand(&rng, n, -2, 2);
        float *w = kt_rand(&rng, C, 0.5, 1.5);
        float *xa = kt_alloc(n), *la = kt_alloc(n), *ra = kt_alloc(N);
        float *xb = kt_alloc(n), *lb = kt_alloc(n), *rb = kt_alloc(N);
        tensor_t X = tensor_2d(x, DT_F32, N, C), Y = tensor_2d(y, DT_F32, N, C);
        tensor_t W = tensor_1d(w, DT_F32, C);
        tensor_t XA = tensor_2d(xa, DT_F32, N, C), LA = tensor_2d(la, DT_F32, N, C);
        tensor_t RA = tensor_1d(ra, DT_F32, N);
        tensor_t XB = tensor_2d(xb, DT_F32, N, C), LB = tensor_2d(lb, DT_F32, N, C);
        tensor_t RB = tensor_1d(rb, DT_F32, N);
        kern_add(kern_stream_host(), &XA, &X, &Y);
        kern_rmsnorm_fwd(kern_stream_host(), &LA, &RA, &XA, &W, eps);
        kern_add_rmsnorm_fwd(kern_stream_host(), &XB, &LB, &RB, &X, &Y, &W, eps);
        size_t nb = (size_t)n * sizeof(float);
        CHECK_MSG(memcmp(xa, xb, nb) == 0, "add_rmsnorm xout differs from kern_add (N%lld C%lld)",
                  (long long)N, (long long)C);
        CHECK_MSG(memcmp(la, lb, nb) == 0, "add_rmsnorm ln differs from add + rmsnorm (N%lld C%lld)",
                  (long long)N, (long long)C);
        CHECK_MSG(memcmp(ra, rb, (size_t)N * sizeof(float)) == 0,
                  "add_rmsnorm rstd differs from add + rmsnorm (N%lld C%lld)", (long long)N,
                  (long long)C);
        /* in place: xout over x, then over y */
        float *xi = kt_dup(x, n), *yi = kt_dup(y, n);
        tensor_t XI = tensor_2d(xi, DT_F32, N, C), YI = tensor_2d(yi, DT_F32, N, C);
        kern_add_rmsnorm_fwd(kern_stream_host(), &XI, &LB, &RB, &XI, &Y, &W, eps);
        CHECK_MSG(memcmp(xi, xa, nb) == 0 && memcmp(lb, la, nb) == 0,
                  "add_rmsnorm in place over x differs (N%lld C%lld)", (long long)N, (long long)C);
        kern_add_rmsnorm_fwd(kern_stream_host(), &YI, &LB, &RB, &X, &YI, &W, eps);
        CHECK_MSG(memcmp(yi, xa, nb) == 0 && memcmp(lb, la, nb) == 0,
                  "add_rmsnorm in place over y differs (N%lld C%lld)", (long long)N, (long long)C);
        /* float64: the exact sum, and the norm of the exact sum */
        double *sum = kt_alloc_d(n), *ref = kt_alloc_d(n), *rref = kt_alloc_d(N);
        for (int64_t i = 0; i < n; i++) sum[i] = (double)x[i] + (double)y[i];
        rms_ctx_t c = {sum, kt_to_d(w, C), NULL, N, C, eps};
        ref_rmsnorm(ref, rref, &c);
        kt_close("add_rmsnorm xout", xb, sum, n, 1e-7);
        kt_close("add_rmsnorm ln", la, ref, n, 1e-6);
        kt_close("add_rmsnorm rstd", ra, rref, N, 1e-6);
        free(x), free(y), free(w), free(xa), free(la), free(ra), free(xb), free(lb), free(rb);
        free(xi), free(yi), free(sum), free(ref), free(rref), free(c.w);
    }
}

/* ---- RoPE ------------------------------------------------------------------ */

typedef struct {
    double       *x, *R;
    const double *cos, *sin; /* [P, D/2] */
    const int32_t *pos;
    int64_t       BT, H, D;
} rope_ctx_t;

static void ref_rope(double *out, const rope_ctx_t *c)
{
    int64_t half = c->D / 2;
    for (int64_t t = 0; t < c->BT; t++)
        for (int64_t h = 0; h < c->H; h++)
            for (int64_t i = 0; i < half; i++) {
                const double *xi = c->x + (t * c->H + h) * c->D;
                double cs = c->cos[c->pos[t] * half + i], sn = c->sin[c->pos[t] * half + i];
                out[(t * c->H + h) * c->D + i] = xi[i] * cs - xi[i + half] * sn;
                out[(t * c->H + h) * c->D + i + half] = xi[i + half] * cs + xi[i] * sn;
            }
}

static double rope_loss(void *p)
{
    rope_ctx_t *c = p;
    int64_t n = c->BT * c->H * c->D;
    double *out = kt_alloc_d(n), l = 0;
    ref_rope(out, c);
    for (int64_t i = 0; i < n; i++) l += out[i] * c->R[i];
    free(out);
    return l;
}

static void test_rope_fwd_bwd(void)
{
    kt_rng_t rng = {12};
    const int64_t P = 64;
    const int64_t shapes[][4] = {{1, 1, 1, 2}, {2, 3, 3, 8}, {1, 17, 4, 16}, {3, 7, 2, 6}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t B = shapes[s][0], T = shapes[s][1], H = shapes[s][2], D = shapes[s][3];
        int64_t half = D / 2, n = B * T * H * D;
        float *cosf_ = kt_alloc(P * half), *sinf_ = kt_alloc(P * half);
        for (int64_t p = 0; p < P; p++)
            for (int64_t i = 0; i < half; i++) {
                double ang = (double)p * pow(10000.0, -2.0 * (double)i / (double)D);
                cosf_[p * half + i] = (float)cos(ang);
                sinf_[p * half + i] = (float)sin(ang);
            }
        int32_t *pos = calloc((size_t)(B * T), sizeof *pos);
        for (int64_t t = 0; t < B * T; t++) pos[t] = (int32_t)kt_int(&rng, P);
        float *x = kt_rand(&rng, n, -1, 1), *out = kt_alloc(n), *dout = kt_rand(&rng, n, -1, 1);
        float *dx0 = kt_rand(&rng, n, -1, 1), *dx = kt_dup(dx0, n);
        double *cd = kt_to_d(cosf_, P * half), *sd = kt_to_d(sinf_, P * half);
        rope_ctx_t c = {kt_to_d(x, n), kt_to_d(dout, n), cd, sd, pos, B * T, H, D};
        double *ref = kt_alloc_d(n);
        ref_rope(ref, &c);
        tensor_t X = tensor_4d(x, DT_F32, B, T, H, D), O = tensor_4d(out, DT_F32, B, T, H, D);
        tensor_t Cs = tensor_2d(cosf_, DT_F32, P, half), Sn = tensor_2d(sinf_, DT_F32, P, half);
        tensor_t Ps = tensor_1d(pos, DT_I32, B * T), dO = tensor_4d(dout, DT_F32, B, T, H, D);
        tensor_t dX = tensor_4d(dx, DT_F32, B, T, H, D);
        kern_rope_fwd(kern_stream_host(), &O, &X, &Cs, &Sn, &Ps);
        kt_close("rope fwd", out, ref, n, 1e-6);
        float *xi = kt_dup(x, n); /* in place: out aliases x */
        tensor_t Xi = tensor_4d(xi, DT_F32, B, T, H, D);
        kern_rope_fwd(kern_stream_host(), &Xi, &Xi, &Cs, &Sn, &Ps);
        CHECK(!memcmp(xi, out, (size_t)n * sizeof *xi));
        kern_rope_bwd(kern_stream_host(), &dX, &dO, &Cs, &Sn, &Ps);
        kt_fd_check("rope dx", c.x, n, dx, dx0, rope_loss, &c, 300, 1e-5, &rng);
        free(cosf_), free(sinf_), free(pos), free(x), free(out), free(dout), free(dx0), free(dx);
        free(cd), free(sd), free(c.x), free(c.R), free(ref), free(xi);
    }
}

static void bad_rope_pos(void *arg)
{
    float x[8] = {0}, t[4] = {0};
    int32_t pos[2] = {0, 2};
    tensor_t X = tensor_4d(x, DT_F32, 1, 2, 1, 4), C = tensor_2d(t, DT_F32, 2, 2);
    tensor_t P = tensor_1d(pos, DT_I32, 2);
    kern_rope_fwd(kern_stream_host(), &X, &X, &C, &C, &P);
}

static void test_rope_position_out_of_table_panics(void)
{
    CHECK(kt_panics(bad_rope_pos, NULL, "position 2 of token 1 outside the table [0, 2)"));
}

/* ---- SwiGLU ---------------------------------------------------------------- */

typedef struct {
    double *g, *u, *R;
    int64_t n;
} swiglu_ctx_t;

static double swiglu_loss(void *p)
{
    swiglu_ctx_t *c = p;
    double l = 0;
    for (int64_t i = 0; i < c->n; i++) l += c->g[i] / (1 + exp(-c->g[i])) * c->u[i] * c->R[i];
    return l;
}

static void test_swiglu_fwd_bwd(void)
{
    kt_rng_t rng = {13};
    const int64_t sizes[] = {1, 7, 65, 1001};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        float *g = kt_rand(&rng, n, -8, 8), *u = kt_rand(&rng, n, -2, 2), *o = kt_alloc(n);
        float *dout = kt_rand(&rng, n, -1, 1), *dg0 = kt_rand(&rng, n, -1, 1);
        float *du0 = kt_rand(&rng, n, -1, 1), *dg = kt_dup(dg0, n), *du = kt_dup(du0, n);
        swiglu_ctx_t c = {kt_to_d(g, n), kt_to_d(u, n), kt_to_d(dout, n), n};
        double *ref = kt_alloc_d(n);
        for (int64_t i = 0; i < n; i++) ref[i] = c.g[i] / (1 + exp(-c.g[i])) * c.u[i];
        tensor_t G = tensor_1d(g, DT_F32, n), U = tensor_1d(u, DT_F32, n);
        tensor_t O = tensor_1d(o, DT_F32, n), dO = tensor_1d(dout, DT_F32, n);
        tensor_t dG = tensor_1d(dg, DT_F32, n), dU = tensor_1d(du, DT_F32, n);
        kern_swiglu_fwd(kern_stream_host(), &O, &G, &U);
        kt_close("swiglu fwd", o, ref, n, 1e-6);
        kern_swiglu_bwd(kern_stream_host(), &dG, &dU, &dO, &G, &U);
        kt_fd_check("swiglu dgate", c.g, n, dg, dg0, swiglu_loss, &c, 300, 1e-5, &rng);
        kt_fd_check("swiglu dup", c.u, n, du, du0, swiglu_loss, &c, 300, 1e-5, &rng);
        float *du2 = kt_dup(du0, n);
        tensor_t dU2 = tensor_1d(du2, DT_F32, n);
        kern_swiglu_bwd(kern_stream_host(), NULL, &dU2, &dO, &G, &U);
        CHECK(!memcmp(du2, du, (size_t)n * sizeof *du));
        free(g), free(u), free(o), free(dout), free(dg0), free(du0), free(dg), free(du);
        free(du2), free(c.g), free(c.u), free(c.R), free(ref);
    }
}

/* ---- squared ReLU ------------------------------------------------------------ */

/* forward and both backwards (+= onto random values, and =) against float64
 * max(x,0)^2 and 2 max(x,0) dout; x straddles 0 (exact zeros included) */
static void test_relu2_fwd_bwd(void)
{
    kt_rng_t rng = {29};
    const int64_t sizes[] = {1, 7, 65, 1001};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        float *x = kt_rand(&rng, n, -3, 3), *o = kt_alloc(n), *dout = kt_rand(&rng, n, -1, 1);
        float *dx0 = kt_rand(&rng, n, -1, 1), *dx = kt_dup(dx0, n), *dxs = kt_dup(dx0, n);
        if (n > 3) x[3] = 0.0f;
        double *ref = kt_alloc_d(n), *dref = kt_alloc_d(n), *sref = kt_alloc_d(n);
        for (int64_t i = 0; i < n; i++) {
            double r = x[i] > 0 ? (double)x[i] : 0.0;
            ref[i] = r * r;
            sref[i] = 2.0 * r * (double)dout[i];
            dref[i] = (double)dx0[i] + sref[i];
        }
        tensor_t X = tensor_1d(x, DT_F32, n), O = tensor_1d(o, DT_F32, n);
        tensor_t dO = tensor_1d(dout, DT_F32, n), dX = tensor_1d(dx, DT_F32, n);
        tensor_t dXs = tensor_1d(dxs, DT_F32, n);
        kern_relu2_fwd(kern_stream_host(), &O, &X);
        kt_close("relu2 fwd", o, ref, n, 1e-6);
        kern_relu2_bwd(kern_stream_host(), &dX, &dO, &X);
        kt_close("relu2 bwd (+=)", dx, dref, n, 1e-6);
        kern_relu2_bwd_set(kern_stream_host(), &dXs, &dO, &X);
        kt_close("relu2 bwd (=)", dxs, sref, n, 1e-6);
        free(x), free(o), free(dout), free(dx0), free(dx), free(dxs), free(ref), free(dref);
        free(sref);
    }
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_embedding_fwd_bwd_shards, test_rmsnorm_fwd_bwd, test_add_rmsnorm_fwd,
             test_rope_fwd_bwd,
             test_rope_position_out_of_table_panics, test_swiglu_fwd_bwd, test_relu2_fwd_bwd);
}
