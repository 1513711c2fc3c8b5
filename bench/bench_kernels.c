/* Kernel micro-benchmarks; see bench/bench_kernels.h. Each runs for a fixed
 * number of repetitions after one warm-up call and reports the median wall
 * time, and the process CPU time of that repetition (all threads): on a
 * shared, oversubscribed host the CPU time is the stabler number. */
#include "bench/bench_kernels.h"

#include "base/clock.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { BENCH_REPS = 5 };

static float *bench_fill(int64_t n, uint32_t seed)
{
    float *p = malloc((size_t)n * sizeof *p);
    if (!p) return NULL;
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)((seed >> 8) * 0x1p-24 - 0.5);
    }
    return p;
}

static int bench_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef void (*bench_body_fn)(void *ctx);

static double bench_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
    double wall, cpu; /* seconds: median wall time, median process CPU time */
} bench_result_t;

static bench_result_t bench_time(bench_body_fn body, void *ctx)
{
    double w[BENCH_REPS], c[BENCH_REPS];
    body(ctx);
    for (int r = 0; r < BENCH_REPS; r++) {
        double c0 = bench_cpu_s();
        uint64_t t0 = clock_now_ns();
        body(ctx);
        w[r] = (double)(clock_now_ns() - t0) * 1e-9;
        c[r] = bench_cpu_s() - c0;
    }
    qsort(w, BENCH_REPS, sizeof w[0], bench_cmp);
    qsort(c, BENCH_REPS, sizeof c[0], bench_cmp);
    return (bench_result_t){w[BENCH_REPS / 2], c[BENCH_REPS / 2]};
}

/* ---- sgemm ---------------------------------------------------------------- */

typedef struct {
    tensor_t a, b, c;
} bench_gemm_t;

static void bench_gemm_body(void *p)
{
    bench_gemm_t *g = p;
    kern_matmul(kern_stream_host(), &g->c, &g->a, &g->b, false, true, 1.0f, 0.0f);
}

static void bench_gemm(FILE *out, int64_t M, int64_t N, int64_t K)
{
    float *a = bench_fill(M * K, 1), *b = bench_fill(N * K, 2), *c = bench_fill(M * N, 3);
    if (a && b && c) {
        bench_gemm_t g = {tensor_2d(a, DT_F32, M, K), tensor_2d(b, DT_F32, N, K),
                          tensor_2d(c, DT_F32, M, N)};
        bench_result_t r = bench_time(bench_gemm_body, &g);
        double flop = 2.0 * (double)M * N * K;
        fprintf(out, "sgemm %lldx%lldx%lld (A B^T): wall %.3f ms (%.1f GFLOP/s), cpu %.3f ms "
                "(%.1f GFLOP/cpu-s)\n", (long long)M, (long long)N, (long long)K, r.wall * 1e3,
                flop / r.wall * 1e-9, r.cpu * 1e3, flop / r.cpu * 1e-9);
    }
    free(a), free(b), free(c);
}

/* ---- attention ------------------------------------------------------------ */

typedef struct {
    tensor_t q, k, v, o, lse, dout, dq, dk, dv;
    float    scale;
} bench_attn_t;

static void bench_attn_fwd_body(void *p)
{
    bench_attn_t *a = p;
    kern_attention_fwd(kern_stream_host(), &a->o, &a->lse, &a->q, &a->k, &a->v, a->scale, true, 0);
}

static void bench_attn_bwd_body(void *p)
{
    bench_attn_t *a = p;
    kern_attention_bwd(kern_stream_host(), &a->dq, &a->dk, &a->dv, &a->dout, &a->q, &a->k, &a->v, &a->o, &a->lse,
                       a->scale, true, 0);
}

static void bench_attention(FILE *out, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D)
{
    int64_t nq = B * T * Hq * D, nk = B * T * Hkv * D;
    float *q = bench_fill(nq, 4), *k = bench_fill(nk, 5), *v = bench_fill(nk, 6);
    float *o = bench_fill(nq, 7), *l = bench_fill(B * Hq * T, 8), *dout = bench_fill(nq, 9);
    float *dq = bench_fill(nq, 10), *dk = bench_fill(nk, 11), *dv = bench_fill(nk, 12);
    if (q && k && v && o && l && dout && dq && dk && dv) {
        bench_attn_t a = {
            .q = tensor_4d(q, DT_F32, B, T, Hq, D), .k = tensor_4d(k, DT_F32, B, T, Hkv, D),
            .v = tensor_4d(v, DT_F32, B, T, Hkv, D), .o = tensor_4d(o, DT_F32, B, T, Hq, D),
            .lse = tensor_3d(l, DT_F32, B, Hq, T), .dout = tensor_4d(dout, DT_F32, B, T, Hq, D),
            .dq = tensor_4d(dq, DT_F32, B, T, Hq, D), .dk = tensor_4d(dk, DT_F32, B, T, Hkv, D),
            .dv = tensor_4d(dv, DT_F32, B, T, Hkv, D), .scale = 1.0f / sqrtf((float)D),
        };
        bench_result_t f = bench_time(bench_attn_fwd_body, &a);
        bench_result_t b = bench_time(bench_attn_bwd_body, &a);
        fprintf(out,
                "attention B=%lld T=%lld Hq=%lld Hkv=%lld D=%lld causal: wall fwd %.3f bwd %.3f "
                "ms; cpu fwd %.3f bwd %.3f fwd+bwd %.3f ms\n",
                (long long)B, (long long)T, (long long)Hq, (long long)Hkv, (long long)D,
                f.wall * 1e3, b.wall * 1e3, f.cpu * 1e3, b.cpu * 1e3, (f.cpu + b.cpu) * 1e3);
    }
    free(q), free(k), free(v), free(o), free(l), free(dout), free(dq), free(dk), free(dv);
}

/* ---- elementwise layers --------------------------------------------------- */

typedef struct {
    tensor_t x, w, out, rstd, gate, up, logits, losses, dlogits, targets;
} bench_rows_t;

static void bench_rmsnorm_body(void *p)
{
    bench_rows_t *r = p;
    kern_rmsnorm_fwd(kern_stream_host(), &r->out, &r->rstd, &r->x, &r->w, 1e-5f);
}

static void bench_swiglu_body(void *p)
{
    bench_rows_t *r = p;
    kern_swiglu_fwd(kern_stream_host(), &r->out, &r->gate, &r->up);
}

static void bench_xent_body(void *p)
{
    bench_rows_t *r = p;
    kern_xent_fwd_bwd(kern_stream_host(), &r->losses, &r->dlogits, &r->logits, &r->targets, 1.0f, -100);
}

static void bench_rows(FILE *out, const char *filter)
{
    const int64_t N = 1024, C = 768, V = 32000;
    float *x = bench_fill(N * C, 13), *w = bench_fill(C, 14), *o = bench_fill(N * C, 15);
    float *rs = bench_fill(N, 16), *g = bench_fill(N * C, 17), *u = bench_fill(N * C, 18);
    float *lg = bench_fill(N * V, 19), *ls = bench_fill(N, 20), *dl = bench_fill(N * V, 21);
    int32_t *t = malloc((size_t)N * sizeof *t);
    if (x && w && o && rs && g && u && lg && ls && dl && t) {
        for (int64_t i = 0; i < N; i++) t[i] = (int32_t)((i * 7919) % V);
        bench_rows_t r = {
            .x = tensor_2d(x, DT_F32, N, C), .w = tensor_1d(w, DT_F32, C),
            .out = tensor_2d(o, DT_F32, N, C), .rstd = tensor_1d(rs, DT_F32, N),
            .gate = tensor_2d(g, DT_F32, N, C), .up = tensor_2d(u, DT_F32, N, C),
            .logits = tensor_2d(lg, DT_F32, N, V), .losses = tensor_1d(ls, DT_F32, N),
            .dlogits = tensor_2d(dl, DT_F32, N, V), .targets = tensor_1d(t, DT_I32, N),
        };
        bench_result_t tm;
        if (!filter || strstr("rmsnorm", filter)) {
            tm = bench_time(bench_rmsnorm_body, &r);
            fprintf(out, "rmsnorm fwd N=%lld C=%lld: wall %.3f ms, cpu %.3f ms\n", (long long)N,
                    (long long)C, tm.wall * 1e3, tm.cpu * 1e3);
        }
        if (!filter || strstr("swiglu", filter)) {
            tm = bench_time(bench_swiglu_body, &r);
            fprintf(out, "swiglu fwd N=%lld F=%lld: wall %.3f ms, cpu %.3f ms\n", (long long)N,
                    (long long)C, tm.wall * 1e3, tm.cpu * 1e3);
        }
        if (!filter || strstr("xent", filter)) {
            tm = bench_time(bench_xent_body, &r);
            fprintf(out, "xent fwd+bwd N=%lld V=%lld: wall %.3f ms, cpu %.3f ms\n", (long long)N,
                    (long long)V, tm.wall * 1e3, tm.cpu * 1e3);
        }
    }
    free(x), free(w), free(o), free(rs), free(g), free(u), free(lg), free(ls), free(dl), free(t);
}

int bench_kernels_run(FILE *out, const char *filter, int threads)
{
    kern_cpu_set_threads(threads);
    if (!filter || strstr("sgemm", filter)) {
        bench_gemm(out, 1024, 1024, 1024);
        bench_gemm(out, 1024, 2048, 768);
    }
    if (!filter || strstr("attention", filter)) {
        bench_attention(out, 1, 256, 4, 4, 64);
        bench_attention(out, 1, 1024, 12, 4, 64);
    }
    bench_rows(out, filter);
    return 0;
}
