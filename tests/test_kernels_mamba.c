/* The Mamba2 mixer's kernels (kernels.h, "Mamba2 mixer"): causal depthwise
 * conv1d with its activation and decode state, dt with bias, softplus and
 * limits, the chunked SSD scan and the gated grouped RMSNorm.
 * Forwards against float64 references written here; the scan's reference is
 * the plain token-by-token recurrence (not chunked), so every chunk size is
 * checked against an independent algorithm. Backwards against central
 * differences of a float64 scalar loss sum(out * R), with gradient buffers
 * pre-filled so that accumulation (+=) is checked too. */
#include "tests/ref_mamba.h"

/* n uniform values in [-1, 1) as doubles (the float draw is freed) */
static double *rand_d(kt_rng_t *rng, int64_t n)
{
    float *f = kt_rand(rng, n, -1, 1);
    double *d = kt_to_d(f, n);
    free(f);
    return d;
}

/* ---- causal conv1d ---------------------------------------------------------------- */

static double conv_loss(void *arg)
{
    const conv_ctx_t *c = arg;
    int64_t n = c->B * c->T * c->C;
    double *o = kt_alloc_d(n), l = 0;
    ref_conv(o, c);
    for (int64_t i = 0; i < n; i++) l += o[i] * c->R[i];
    free(o);
    return l;
}

static void conv_case(kt_rng_t *rng, int64_t B, int64_t T, int64_t C, int64_t K, bool bias,
                      kern_act_t act)
{
    int64_t n = B * T * C;
    float *x = kt_rand(rng, n, -1, 1), *w = kt_rand(rng, C * K, -1, 1);
    float *bs = bias ? kt_rand(rng, C, -0.5, 0.5) : NULL, *out = kt_alloc(n);
    tensor_t X = tensor_3d(x, DT_F32, B, T, C), W = tensor_2d(w, DT_F32, C, K);
    tensor_t Bt = bias ? tensor_1d(bs, DT_F32, C) : (tensor_t){0}, O = tensor_3d(out, DT_F32, B, T, C);
    kern_conv1d_causal_fwd(kern_stream_host(), &O, NULL, &X, &W, bias ? &Bt : NULL, act);
    float *r = kt_rand(rng, n, -1, 1);
    conv_ctx_t c = {.x = kt_to_d(x, n), .w = kt_to_d(w, C * K), .bias = bias ? kt_to_d(bs, C) : NULL,
                    .R = kt_to_d(r, n), .B = B, .T = T, .C = C, .K = K,
                    .act = act};
    double *ref = kt_alloc_d(n);
    ref_conv(ref, &c);
    kt_close("conv1d fwd", out, ref, n, 1e-5);

    /* the decode state: the same sequence in pieces of 1, 2 and the rest
     * gives the same bits as one call */
    float *piece = kt_alloc(n), *state = kt_rand(rng, B * (K - 1) * C, 3, 4);
    memset(state, 0, (size_t)(B * (K - 1) * C) * sizeof *state);
    int64_t cuts[4] = {0, 1, 3, T};
    for (int p = 0; p < 3; p++) {
        int64_t t0 = cuts[p], len = cuts[p + 1] - t0;
        float *xs = kt_alloc(B * len * C), *os = kt_alloc(B * len * C);
        for (int64_t b = 0; b < B; b++)
            memcpy(xs + b * len * C, x + (b * T + t0) * C, (size_t)(len * C) * sizeof *x);
        tensor_t Xs = tensor_3d(xs, DT_F32, B, len, C), Os = tensor_3d(os, DT_F32, B, len, C);
        tensor_t S = tensor_3d(state, DT_F32, B, K - 1, C);
        kern_conv1d_causal_fwd(kern_stream_host(), &Os, &S, &Xs, &W, bias ? &Bt : NULL, act);
        for (int64_t b = 0; b < B; b++)
            memcpy(piece + (b * T + t0) * C, os + b * len * C, (size_t)(len * C) * sizeof *x);
        free(xs), free(os);
    }
    CHECK_MSG(!memcmp(piece, out, (size_t)n * sizeof *out), "conv1d in pieces with state differs");

    /* backward, accumulating into pre-filled buffers */
    float *dout = kt_alloc(n);
    for (int64_t i = 0; i < n; i++) dout[i] = (float)c.R[i];
    for (int64_t i = 0; i < n; i++) c.R[i] = dout[i];
    float *dx0 = kt_rand(rng, n, -1, 1), *dx = kt_dup(dx0, n);
    float *dw0 = kt_rand(rng, C * K, -1, 1), *dw = kt_dup(dw0, C * K);
    float *db0 = kt_rand(rng, C, -1, 1), *db = kt_dup(db0, C);
    tensor_t dO = tensor_3d(dout, DT_F32, B, T, C), dX = tensor_3d(dx, DT_F32, B, T, C);
    tensor_t dW = tensor_2d(dw, DT_F32, C, K), dB = tensor_1d(db, DT_F32, C);
    kern_conv1d_causal_bwd(kern_stream_host(), &dX, &dW, bias ? &dB : NULL, &dO, &X, &W,
                           bias ? &Bt : NULL, act);
    kt_fd_check("conv1d dx", c.x, n, dx, dx0, conv_loss, &c, 60, 1e-4, rng);
    kt_fd_check("conv1d dw", c.w, C * K, dw, dw0, conv_loss, &c, 60, 1e-4, rng);
    if (bias) kt_fd_check("conv1d dbias", c.bias, C, db, db0, conv_loss, &c, 60, 1e-4, rng);
    free(x), free(w), free(bs), free(out), free(piece), free(state), free(dout), free(r);
    free(dx0), free(dx), free(dw0), free(dw), free(db0), free(db), free(ref);
    free(c.x), free(c.w), free(c.bias), free(c.R);
}

static void test_conv1d(void)
{
    kt_rng_t rng = {41};
    conv_case(&rng, 2, 7, 5, 4, true, KERN_ACT_SILU);
    conv_case(&rng, 1, 9, 70, 3, false, KERN_ACT_NONE); /* two channel blocks */
    conv_case(&rng, 3, 5, 3, 1, true, KERN_ACT_SILU);
}

/* ---- dt ------------------------------------------------------------------------- */

typedef struct {
    double *raw, *bias, *R;
    int64_t N, H;
    double lo, hi;
} dt_ctx_t;

static double dt_loss(void *arg)
{
    const dt_ctx_t *c = arg;
    double l = 0;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t h = 0; h < c->H; h++)
            l += c->R[n * c->H + h] * ref_dt(c->raw[n * c->H + h] + c->bias[h], c->lo, c->hi);
    return l;
}

static void test_ssm_dt(void)
{
    kt_rng_t rng = {42};
    const int64_t N = 13, H = 4;
    const float lo = 0.3f, hi = 2.5f;
    float *raw = kt_rand(&rng, N * H, -4, 4), *bias = kt_rand(&rng, H, -1, 1);
    raw[0] = 30.0f - bias[0]; /* above torch's softplus threshold, and above hi */
    /* keep finite differences away from the limits' kinks */
    for (int64_t i = 0; i < N * H; i++) {
        double v = log1p(exp((double)raw[i] + bias[i % H]));
        if (fabs(v - lo) < 0.01 || fabs(v - hi) < 0.01) raw[i] += 0.1f;
    }
    float *dt = kt_alloc(N * H);
    tensor_t Rw = tensor_2d(raw, DT_F32, N, H), Bs = tensor_1d(bias, DT_F32, H);
    tensor_t Dt = tensor_2d(dt, DT_F32, N, H);
    kern_ssm_dt_fwd(kern_stream_host(), &Dt, &Rw, &Bs, lo, hi);
    dt_ctx_t c = {.raw = kt_to_d(raw, N * H), .bias = kt_to_d(bias, H),
                  .R = rand_d(&rng, N * H), .N = N, .H = H, .lo = lo,
                  .hi = hi};
    double *ref = kt_alloc_d(N * H);
    int clamped = 0;
    for (int64_t i = 0; i < N * H; i++) {
        ref[i] = ref_dt(c.raw[i] + c.bias[i % H], lo, hi);
        clamped += ref[i] == lo || ref[i] == hi;
    }
    CHECK_MSG(clamped > 2 && clamped < N * H - 2, "%d of %lld clamped: the case tests too little",
              clamped, (long long)(N * H));
    kt_close("ssm dt fwd", dt, ref, N * H, 1e-6);
    float *ddt = kt_alloc(N * H);
    for (int64_t i = 0; i < N * H; i++) ddt[i] = (float)c.R[i];
    for (int64_t i = 0; i < N * H; i++) c.R[i] = ddt[i];
    float *dr0 = kt_rand(&rng, N * H, -1, 1), *dr = kt_dup(dr0, N * H);
    float *db0 = kt_rand(&rng, H, -1, 1), *db = kt_dup(db0, H);
    tensor_t dDt = tensor_2d(ddt, DT_F32, N, H), dR = tensor_2d(dr, DT_F32, N, H);
    tensor_t dB = tensor_1d(db, DT_F32, H);
    kern_ssm_dt_bwd(kern_stream_host(), &dR, &dB, &dDt, &Rw, &Bs, lo, hi);
    kt_fd_check("ssm dt draw", c.raw, N * H, dr, dr0, dt_loss, &c, 100, 1e-5, &rng);
    kt_fd_check("ssm dt dbias", c.bias, H, db, db0, dt_loss, &c, 100, 1e-5, &rng);
    free(raw), free(bias), free(dt), free(ref), free(ddt), free(dr0), free(dr), free(db0), free(db);
    free(c.raw), free(c.bias), free(c.R);
}

/* ---- the SSD scan ------------------------------------------------------------------ */

static double ssd_loss(void *arg)
{
    const ssd_ctx_t *c = arg;
    int64_t n = c->B * c->T * c->H * c->P;
    double *y = kt_alloc_d(n), l = 0;
    ref_ssd(y, NULL, c);
    for (int64_t i = 0; i < n; i++) l += y[i] * c->R[i];
    free(y);
    return l;
}

typedef struct {
    float *x, *dt, *A_log, *Bm, *Cm, *D;
    int64_t B, T, H, P, G, N;
} ssd_in_t;

static ssd_in_t ssd_inputs(kt_rng_t *rng, int64_t B, int64_t T, int64_t H, int64_t P, int64_t G,
                           int64_t N)
{
    ssd_in_t in = {.B = B, .T = T, .H = H, .P = P, .G = G, .N = N};
    in.x = kt_rand(rng, B * T * H * P, -1, 1);
    in.dt = kt_rand(rng, B * T * H, 0.05, 0.8);
    in.A_log = kt_rand(rng, H, -1, 1);
    in.Bm = kt_rand(rng, B * T * G * N, -1, 1);
    in.Cm = kt_rand(rng, B * T * G * N, -1, 1);
    in.D = kt_rand(rng, H, -1, 1);
    return in;
}

static void ssd_free(ssd_in_t *in)
{
    free(in->x), free(in->dt), free(in->A_log), free(in->Bm), free(in->Cm), free(in->D);
}

typedef struct {
    tensor_t x, dt, A, Bm, Cm, D;
} ssd_t_t;

static ssd_t_t ssd_tensors(const ssd_in_t *in)
{
    return (ssd_t_t){
        .x = tensor_4d(in->x, DT_F32, in->B, in->T, in->H, in->P),
        .dt = tensor_3d(in->dt, DT_F32, in->B, in->T, in->H),
        .A = tensor_1d(in->A_log, DT_F32, in->H),
        .Bm = tensor_4d(in->Bm, DT_F32, in->B, in->T, in->G, in->N),
        .Cm = tensor_4d(in->Cm, DT_F32, in->B, in->T, in->G, in->N),
        .D = tensor_1d(in->D, DT_F32, in->H),
    };
}

static void ssd_case(kt_rng_t *rng, int64_t B, int64_t T, int64_t H, int64_t P, int64_t G,
                     int64_t N, int64_t chunk)
{
    char what[96];
    ssd_in_t in = ssd_inputs(rng, B, T, H, P, G, N);
    ssd_t_t t = ssd_tensors(&in);
    int64_t ny = B * T * H * P, nc = (T + chunk - 1) / chunk, ns = B * H * P * N;
    float *y = kt_alloc(ny), *cst = kt_alloc(nc * ns), *st = kt_alloc(ns);
    tensor_t Y = tensor_4d(y, DT_F32, B, T, H, P), CS = tensor_1d(cst, DT_F32, nc * ns);
    tensor_t ST = tensor_1d(st, DT_F32, ns);
    kern_ssd_scan_fwd(kern_stream_host(), &Y, &CS, &ST, &t.x, &t.dt, &t.A, &t.Bm, &t.Cm, &t.D,
                      chunk);
    float *r = kt_rand(rng, ny, -1, 1);
    ssd_ctx_t c = {.x = kt_to_d(in.x, ny), .dt = kt_to_d(in.dt, B * T * H),
                   .A_log = kt_to_d(in.A_log, H), .Bm = kt_to_d(in.Bm, B * T * G * N),
                   .Cm = kt_to_d(in.Cm, B * T * G * N), .D = kt_to_d(in.D, H),
                   .R = kt_to_d(r, ny), .B = B, .T = T, .H = H, .P = P,
                   .G = G, .N = N};
    double *ref = kt_alloc_d(ny), *ref_st = kt_alloc_d(ns);
    ref_ssd(ref, ref_st, &c);
    snprintf(what, sizeof what, "ssd fwd T=%lld chunk=%lld", (long long)T, (long long)chunk);
    kt_close(what, y, ref, ny, 2e-5);
    snprintf(what, sizeof what, "ssd end state T=%lld chunk=%lld", (long long)T, (long long)chunk);
    kt_close(what, st, ref_st, ns, 2e-5);

    /* backward */
    float *dy = kt_alloc(ny);
    for (int64_t i = 0; i < ny; i++) dy[i] = (float)c.R[i];
    for (int64_t i = 0; i < ny; i++) c.R[i] = dy[i];
    int64_t nb = B * T * G * N;
    float *g0[6], *g[6];
    int64_t gn[6] = {ny, B * T * H, H, nb, nb, H};
    for (int i = 0; i < 6; i++) g[i] = kt_dup(g0[i] = kt_rand(rng, gn[i], -1, 1), gn[i]);
    tensor_t dY = tensor_4d(dy, DT_F32, B, T, H, P);
    tensor_t dX = tensor_4d(g[0], DT_F32, B, T, H, P), dDt = tensor_3d(g[1], DT_F32, B, T, H);
    tensor_t dA = tensor_1d(g[2], DT_F32, H), dB = tensor_4d(g[3], DT_F32, B, T, G, N);
    tensor_t dC = tensor_4d(g[4], DT_F32, B, T, G, N), dD = tensor_1d(g[5], DT_F32, H);
    kern_ssd_scan_bwd(kern_stream_host(), &dX, &dDt, &dA, &dB, &dC, &dD, &dY, &t.x, &t.dt, &t.A,
                      &t.Bm, &t.Cm, &t.D, &CS, chunk);
    double *xs[6] = {c.x, c.dt, c.A_log, c.Bm, c.Cm, c.D};
    const char *names[6] = {"dx", "ddt", "dA_log", "dB", "dC", "dD"};
    for (int i = 0; i < 6; i++) {
        snprintf(what, sizeof what, "ssd %s T=%lld chunk=%lld", names[i], (long long)T,
                 (long long)chunk);
        kt_fd_check(what, xs[i], gn[i], g[i], g0[i], ssd_loss, &c, 40, 1e-4, rng);
    }
    for (int i = 0; i < 6; i++) free(g0[i]), free(g[i]), free(xs[i]);
    free(y), free(cst), free(st), free(dy), free(ref), free(ref_st), free(c.R), free(r);
    ssd_free(&in);
}

static void test_ssd_scan(void)
{
    kt_rng_t rng = {43};
    ssd_case(&rng, 2, 7, 4, 3, 2, 5, 3);  /* last chunk short */
    ssd_case(&rng, 1, 8, 2, 2, 1, 3, 8);  /* one chunk */
    ssd_case(&rng, 1, 5, 3, 2, 3, 2, 1);  /* chunks of one token, a group per head */
    ssd_case(&rng, 2, 6, 4, 2, 1, 4, 16); /* chunk longer than the sequence */
}

/* The decode cache: the scan in pieces (with state carried) matches one
 * call, and the start state is taken from `state`. */
static void test_ssd_scan_state(void)
{
    kt_rng_t rng = {44};
    const int64_t B = 2, T = 9, H = 4, P = 3, G = 2, N = 4, chunk = 4;
    ssd_in_t in = ssd_inputs(&rng, B, T, H, P, G, N);
    int64_t ny = B * T * H * P, ns = B * H * P * N;
    ssd_ctx_t c = {.x = kt_to_d(in.x, ny), .dt = kt_to_d(in.dt, B * T * H),
                   .A_log = kt_to_d(in.A_log, H), .Bm = kt_to_d(in.Bm, B * T * G * N),
                   .Cm = kt_to_d(in.Cm, B * T * G * N), .D = kt_to_d(in.D, H), .B = B, .T = T,
                   .H = H, .P = P, .G = G, .N = N};
    double *ref = kt_alloc_d(ny);
    ref_ssd(ref, NULL, &c);
    float *y = kt_alloc(ny), *st = kt_alloc(ns);
    int64_t cuts[5] = {0, 5, 6, 7, T}; /* a prefill, then single tokens */
    for (int p = 0; p < 4; p++) {
        int64_t t0 = cuts[p], len = cuts[p + 1] - t0;
        float *xs = kt_alloc(B * len * H * P), *dts = kt_alloc(B * len * H);
        float *bs = kt_alloc(B * len * G * N), *cs = kt_alloc(B * len * G * N);
        float *ys = kt_alloc(B * len * H * P);
        for (int64_t b = 0; b < B; b++) {
            memcpy(xs + b * len * H * P, in.x + (b * T + t0) * H * P, (size_t)(len * H * P) * 4);
            memcpy(dts + b * len * H, in.dt + (b * T + t0) * H, (size_t)(len * H) * 4);
            memcpy(bs + b * len * G * N, in.Bm + (b * T + t0) * G * N, (size_t)(len * G * N) * 4);
            memcpy(cs + b * len * G * N, in.Cm + (b * T + t0) * G * N, (size_t)(len * G * N) * 4);
        }
        tensor_t X = tensor_4d(xs, DT_F32, B, len, H, P), Dt = tensor_3d(dts, DT_F32, B, len, H);
        tensor_t Bt = tensor_4d(bs, DT_F32, B, len, G, N), Ct = tensor_4d(cs, DT_F32, B, len, G, N);
        tensor_t A = tensor_1d(in.A_log, DT_F32, H), D = tensor_1d(in.D, DT_F32, H);
        tensor_t Y = tensor_4d(ys, DT_F32, B, len, H, P), S = tensor_1d(st, DT_F32, ns);
        kern_ssd_scan_fwd(kern_stream_host(), &Y, NULL, &S, &X, &Dt, &A, &Bt, &Ct, &D, chunk);
        for (int64_t b = 0; b < B; b++)
            memcpy(y + (b * T + t0) * H * P, ys + b * len * H * P, (size_t)(len * H * P) * 4);
        free(xs), free(dts), free(bs), free(cs), free(ys);
    }
    kt_close("ssd in pieces with state", y, ref, ny, 2e-5);
    free(y), free(st), free(ref);
    free(c.x), free(c.dt), free(c.A_log), free(c.Bm), free(c.Cm), free(c.D);
    ssd_free(&in);
}

/* Bits do not depend on the pool's thread count. */
static void test_mamba_threads(void)
{
    kt_rng_t rng = {45};
    const int64_t B = 3, T = 10, H = 4, P = 3, G = 2, N = 4, chunk = 4, C = 130, K = 4;
    ssd_in_t in = ssd_inputs(&rng, B, T, H, P, G, N);
    ssd_t_t t = ssd_tensors(&in);
    int64_t ny = B * T * H * P, ns = B * H * P * N * 3, nb = B * T * G * N;
    float *dy = kt_rand(&rng, ny, -1, 1), *cx = kt_rand(&rng, B * T * C, -1, 1);
    float *cw = kt_rand(&rng, C * K, -1, 1), *cdo = kt_rand(&rng, B * T * C, -1, 1);
    float *res[3][9];
    int64_t rn[9] = {ny, ns, ny, B * T * H, H, nb, nb, B * T * C, C * K};
    for (int r = 0; r < 3; r++) {
        kern_cpu_set_threads(r + 1);
        for (int i = 0; i < 9; i++) res[r][i] = kt_alloc(rn[i]);
        tensor_t Y = tensor_4d(res[r][0], DT_F32, B, T, H, P), CS = tensor_1d(res[r][1], DT_F32, ns);
        kern_ssd_scan_fwd(kern_stream_host(), &Y, &CS, NULL, &t.x, &t.dt, &t.A, &t.Bm, &t.Cm,
                          &t.D, chunk);
        tensor_t dY = tensor_4d(dy, DT_F32, B, T, H, P), dX = tensor_4d(res[r][2], DT_F32, B, T, H, P);
        tensor_t dDt = tensor_3d(res[r][3], DT_F32, B, T, H), dA = tensor_1d(res[r][4], DT_F32, H);
        tensor_t dB = tensor_4d(res[r][5], DT_F32, B, T, G, N), dC = tensor_4d(res[r][6], DT_F32, B, T, G, N);
        kern_ssd_scan_bwd(kern_stream_host(), &dX, &dDt, &dA, &dB, &dC, NULL, &dY, &t.x, &t.dt,
                          &t.A, &t.Bm, &t.Cm, &t.D, &CS, chunk);
        tensor_t CX = tensor_3d(cx, DT_F32, B, T, C), CW = tensor_2d(cw, DT_F32, C, K);
        tensor_t CO = tensor_3d(cdo, DT_F32, B, T, C);
        tensor_t dCX = tensor_3d(res[r][7], DT_F32, B, T, C), dCW = tensor_2d(res[r][8], DT_F32, C, K);
        kern_conv1d_causal_bwd(kern_stream_host(), &dCX, &dCW, NULL, &CO, &CX, &CW, NULL,
                               KERN_ACT_SILU);
    }
    kern_cpu_set_threads(0);
    for (int r = 1; r < 3; r++)
        for (int i = 0; i < 9; i++)
            CHECK_MSG(!memcmp(res[0][i], res[r][i], (size_t)rn[i] * sizeof(float)),
                      "output %d differs between 1 and %d threads", i, r + 1);
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 9; i++) free(res[r][i]);
    free(dy), free(cx), free(cw), free(cdo);
    ssd_free(&in);
}

/* ---- gated grouped RMSNorm ----------------------------------------------------------- */

static double gn_loss(void *arg)
{
    const gn_ctx_t *c = arg;
    double *o = kt_alloc_d(c->N * c->C), l = 0;
    ref_gnorm(o, c);
    for (int64_t i = 0; i < c->N * c->C; i++) l += o[i] * c->R[i];
    free(o);
    return l;
}

static void test_gated_rmsnorm(void)
{
    kt_rng_t rng = {46};
    const int64_t N = 5, C = 12, G = 3;
    const float eps = 1e-5f;
    float *y = kt_rand(&rng, N * C, -2, 2), *z = kt_rand(&rng, N * C, -3, 3);
    float *w = kt_rand(&rng, C, 0.5, 1.5), *out = kt_alloc(N * C), *rstd = kt_alloc(N * G);
    tensor_t Y = tensor_2d(y, DT_F32, N, C), Z = tensor_2d(z, DT_F32, N, C), W = tensor_1d(w, DT_F32, C);
    tensor_t O = tensor_2d(out, DT_F32, N, C), Rs = tensor_2d(rstd, DT_F32, N, G);
    kern_gated_rmsnorm_fwd(kern_stream_host(), &O, &Rs, &Y, &Z, &W, G, eps);
    gn_ctx_t c = {.y = kt_to_d(y, N * C), .z = kt_to_d(z, N * C), .w = kt_to_d(w, C),
                  .R = rand_d(&rng, N * C), .N = N, .C = C, .G = G,
                  .eps = eps};
    double *ref = kt_alloc_d(N * C);
    ref_gnorm(ref, &c);
    kt_close("gated rmsnorm fwd", out, ref, N * C, 1e-5);
    float *dout = kt_alloc(N * C);
    for (int64_t i = 0; i < N * C; i++) dout[i] = (float)c.R[i];
    for (int64_t i = 0; i < N * C; i++) c.R[i] = dout[i];
    float *dy0 = kt_rand(&rng, N * C, -1, 1), *dy = kt_dup(dy0, N * C);
    float *dz0 = kt_rand(&rng, N * C, -1, 1), *dz = kt_dup(dz0, N * C);
    float *dw0 = kt_rand(&rng, C, -1, 1), *dw = kt_dup(dw0, C);
    tensor_t dO = tensor_2d(dout, DT_F32, N, C), dY = tensor_2d(dy, DT_F32, N, C);
    tensor_t dZ = tensor_2d(dz, DT_F32, N, C), dW = tensor_1d(dw, DT_F32, C);
    kern_gated_rmsnorm_bwd(kern_stream_host(), &dY, &dZ, &dW, &dO, &Y, &Z, &W, &Rs, G);
    kt_fd_check("gated rmsnorm dy", c.y, N * C, dy, dy0, gn_loss, &c, 60, 1e-4, &rng);
    kt_fd_check("gated rmsnorm dz", c.z, N * C, dz, dz0, gn_loss, &c, 60, 1e-4, &rng);
    kt_fd_check("gated rmsnorm dw", c.w, C, dw, dw0, gn_loss, &c, 60, 1e-4, &rng);
    free(y), free(z), free(w), free(out), free(rstd), free(ref), free(dout);
    free(dy0), free(dy), free(dz0), free(dz), free(dw0), free(dw);
    free(c.y), free(c.z), free(c.w), free(c.R);
}

/* ---- the fenced device --------------------------------------------------------------- */

/* a fenced copy of a host tensor */
static tensor_t fen_up(kern_stream_t *fs, const tensor_t *h)
{
    device_t dev = {DEV_FENCED, 0};
    void *p = NULL;
    CHECK(kern_mem_alloc(dev, tensor_nbytes(h), &p) == BT_OK);
    tensor_t t = tensor_make(p, h->dtype, dev, h->ndim, h->shape);
    kern_upload(fs, &t, h->data);
    return t;
}

static void fen_down_free(kern_stream_t *fs, void *host, tensor_t *t)
{
    kern_download(fs, host, t);
    kern_mem_free(t->device, t->data);
}

/* The fenced device runs the same kernels on memory the host cannot touch:
 * same bits as the cpu, and no stray host access (it would be a SIGSEGV). */
static void test_mamba_fenced(void)
{
    kt_rng_t rng = {47};
    const int64_t B = 2, T = 6, H = 4, P = 2, G = 2, N = 3, chunk = 4, C = 8, K = 3;
    kern_stream_t *fs = NULL;
    CHECK(kern_stream_create((device_t){DEV_FENCED, 0}, &fs) == BT_OK);
    if (!fs) return;
    ssd_in_t in = ssd_inputs(&rng, B, T, H, P, G, N);
    ssd_t_t t = ssd_tensors(&in);
    int64_t ny = B * T * H * P, ns = 2 * B * H * P * N;
    float *dy = kt_rand(&rng, ny, -1, 1), *cx = kt_rand(&rng, B * T * C, -1, 1);
    float *cw = kt_rand(&rng, C * K, -1, 1), *z = kt_rand(&rng, B * T * C, -1, 1);
    float *gw = kt_rand(&rng, C, 0.5, 1.5);
    float *res[2][8];
    int64_t rn[8] = {ny, ns, ny, B * T * H, B * T * G * N, B * T * C, B * T * C, B * G * T};
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 8; i++) res[r][i] = kt_alloc(rn[i]);
        tensor_t Y = tensor_4d(res[r][0], DT_F32, B, T, H, P), CS = tensor_1d(res[r][1], DT_F32, ns);
        tensor_t dY = tensor_4d(dy, DT_F32, B, T, H, P), dX = tensor_4d(res[r][2], DT_F32, B, T, H, P);
        tensor_t dDt = tensor_3d(res[r][3], DT_F32, B, T, H);
        tensor_t dB = tensor_4d(res[r][4], DT_F32, B, T, G, N);
        tensor_t CX = tensor_3d(cx, DT_F32, B, T, C), CW = tensor_2d(cw, DT_F32, C, K);
        tensor_t CO = tensor_3d(res[r][5], DT_F32, B, T, C), Z = tensor_3d(z, DT_F32, B, T, C);
        tensor_t GW = tensor_1d(gw, DT_F32, C), GO = tensor_3d(res[r][6], DT_F32, B, T, C);
        tensor_t GR = tensor_2d(res[r][7], DT_F32, B * T, G);
        if (r == 0) {
            kern_stream_t *h = kern_stream_host();
            kern_ssd_scan_fwd(h, &Y, &CS, NULL, &t.x, &t.dt, &t.A, &t.Bm, &t.Cm, &t.D, chunk);
            kern_ssd_scan_bwd(h, &dX, &dDt, NULL, &dB, NULL, NULL, &dY, &t.x, &t.dt, &t.A, &t.Bm,
                              &t.Cm, &t.D, &CS, chunk);
            kern_conv1d_causal_fwd(h, &CO, NULL, &CX, &CW, NULL, KERN_ACT_SILU);
            kern_gated_rmsnorm_fwd(h, &GO, &GR, &CO, &Z, &GW, G, 1e-5f);
            continue;
        }
        tensor_t fx = fen_up(fs, &t.x), fdt = fen_up(fs, &t.dt), fA = fen_up(fs, &t.A);
        tensor_t fB = fen_up(fs, &t.Bm), fC = fen_up(fs, &t.Cm), fD = fen_up(fs, &t.D);
        tensor_t fY = fen_up(fs, &Y), fCS = fen_up(fs, &CS), fdY = fen_up(fs, &dY);
        tensor_t fdX = fen_up(fs, &dX), fdDt = fen_up(fs, &dDt), fdB = fen_up(fs, &dB);
        tensor_t fCX = fen_up(fs, &CX), fCW = fen_up(fs, &CW), fCO = fen_up(fs, &CO);
        tensor_t fZ = fen_up(fs, &Z), fGW = fen_up(fs, &GW), fGO = fen_up(fs, &GO);
        tensor_t fGR = fen_up(fs, &GR);
        kern_ssd_scan_fwd(fs, &fY, &fCS, NULL, &fx, &fdt, &fA, &fB, &fC, &fD, chunk);
        kern_ssd_scan_bwd(fs, &fdX, &fdDt, NULL, &fdB, NULL, NULL, &fdY, &fx, &fdt, &fA, &fB,
                          &fC, &fD, &fCS, chunk);
        kern_conv1d_causal_fwd(fs, &fCO, NULL, &fCX, &fCW, NULL, KERN_ACT_SILU);
        kern_gated_rmsnorm_fwd(fs, &fGO, &fGR, &fCO, &fZ, &fGW, G, 1e-5f);
        fen_down_free(fs, res[r][0], &fY), fen_down_free(fs, res[r][1], &fCS);
        fen_down_free(fs, res[r][2], &fdX), fen_down_free(fs, res[r][3], &fdDt);
        fen_down_free(fs, res[r][4], &fdB), fen_down_free(fs, res[r][5], &fCO);
        fen_down_free(fs, res[r][6], &fGO), fen_down_free(fs, res[r][7], &fGR);
        tensor_t *rest[] = {&fx, &fdt, &fA, &fB, &fC, &fD, &fdY, &fCX, &fCW, &fZ, &fGW};
        for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
            kern_mem_free(rest[i]->device, rest[i]->data);
    }
    CHECK(kern_stream_sync(fs) == BT_OK);
    for (int i = 0; i < 8; i++)
        CHECK_MSG(!memcmp(res[0][i], res[1][i], (size_t)rn[i] * sizeof(float)),
                  "output %d differs between cpu and fenced", i);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 8; i++) free(res[r][i]);
    free(dy), free(cx), free(cw), free(z), free(gw);
    ssd_free(&in);
    kern_stream_destroy(fs);
}

/* ---- misuse ------------------------------------------------------------------------- */

static void groups_not_dividing_heads(void *arg)
{
    float x[24] = {0}, dt[8] = {0}, a[4] = {0}, b[12] = {0}, y[24];
    tensor_t X = tensor_4d(x, DT_F32, 1, 2, 4, 3), Dt = tensor_3d(dt, DT_F32, 1, 2, 4);
    tensor_t A = tensor_1d(a, DT_F32, 4), Bm = tensor_4d(b, DT_F32, 1, 2, 3, 2);
    tensor_t Y = tensor_4d(y, DT_F32, 1, 2, 4, 3);
    kern_ssd_scan_fwd(kern_stream_host(), &Y, NULL, NULL, &X, &Dt, &A, &Bm, &Bm, NULL, 2);
}

static void conv_weight_channels(void *arg)
{
    float x[6] = {0}, w[8] = {0}, o[6];
    tensor_t X = tensor_2d(x, DT_F32, 2, 3), W = tensor_2d(w, DT_F32, 2, 4), O = tensor_2d(o, DT_F32, 2, 3);
    kern_conv1d_causal_fwd(kern_stream_host(), &O, NULL, &X, &W, NULL, KERN_ACT_SILU);
}

static void test_mamba_misuse_panics(void)
{
    CHECK(kt_panics(groups_not_dividing_heads, NULL,
                    "kern_ssd_scan_fwd: Bm f32[1,2,3,2] is not [1,2,G,N] with G dividing 4 heads"));
    CHECK(kt_panics(conv_weight_channels, NULL,
                    "kern_conv1d_causal_fwd: w f32[2,4] is not [3 channels, K >= 1]"));
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_conv1d, test_ssm_dt, test_ssd_scan, test_ssd_scan_state,
             test_mamba_threads, test_gated_rmsnorm, test_mamba_fenced, test_mamba_misuse_panics);
}
