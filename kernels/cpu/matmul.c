/* Dense products on the CPU through OpenBLAS, single-threaded per call; a
 * large product is cut into tiles that the pool (pool.c) runs in parallel.
 *
 * Determinism: the tiles depend on M, N and K only, never on the thread
 * count, and each tile is one sgemm on its own block of C, so a product's
 * bits are the same whatever number of threads computes it (OpenBLAS's own
 * threading does not give that). */
#include "kernels/cpu/cpu.h"

#include "base/clock.h"
#include "base/log.h"

#include <cblas.h>
#include <stdlib.h>


/* Below this many multiply-adds a product is one call: a tile hand-off
 * costs a few microseconds, 2^18 FMAs take ~20 us on one core. */
#define MM_SPLIT_FMAS (1ll << 18)
#define MM_TILE_MIN   64   /* rows or columns per tile, a multiple of every */
#define MM_TILES_MAX  16   /* micro-kernel's unroll; at most this many tiles */

typedef struct {
    float       *c;
    const float *a, *b;
    int64_t      M, N, K, lda, ldb, ldc;
    bool         trans_a, trans_b, split_rows;
    float        alpha, beta;
    int64_t      tile; /* rows (split_rows) or columns per tile */
} mm_job_t;

static void mm_sgemm(float *c, const float *a, const float *b, int64_t M, int64_t N, int64_t K,
                     int64_t lda, int64_t ldb, int64_t ldc, bool trans_a, bool trans_b,
                     float alpha, float beta)
{
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N, (blasint)K, alpha, a,
                (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

/* Tile i: rows [i*tile, ...) of C (the matching rows of op(A), all of B) or
 * columns (all of A, the matching columns of op(B)). */
static void mm_tile(void *arg, int64_t i)
{
    const mm_job_t *j = arg;
    int64_t lo = i * j->tile, dim = j->split_rows ? j->M : j->N;
    int64_t n = dim - lo < j->tile ? dim - lo : j->tile;
    if (j->split_rows)
        mm_sgemm(j->c + lo * j->ldc, j->trans_a ? j->a + lo : j->a + lo * j->lda, j->b, n, j->N,
                 j->K, j->lda, j->ldb, j->ldc, j->trans_a, j->trans_b, j->alpha, j->beta);
    else
        mm_sgemm(j->c + lo, j->a, j->trans_b ? j->b + lo * j->ldb : j->b + lo, j->M, n, j->K,
                 j->lda, j->ldb, j->ldc, j->trans_a, j->trans_b, j->alpha, j->beta);
}

void cpu_matmul_ld(float *c, const float *a, const float *b, int64_t M, int64_t N, int64_t K,
                   int64_t lda, int64_t ldb, int64_t ldc, bool trans_a, bool trans_b, float alpha,
                   float beta)
{
    if (M == 0 || N == 0) return;
    if (K == 0) {
        /* nothing to multiply; beta == 0 must still overwrite (and clear NaNs) */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++)
                c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
        return;
    }
    mm_job_t j = {.c = c, .a = a, .b = b, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb,
                  .ldc = ldc, .trans_a = trans_a, .trans_b = trans_b, .alpha = alpha,
                  .beta = beta, .split_rows = M >= N};
    int64_t dim = j.split_rows ? M : N;
    if (M * N * K < MM_SPLIT_FMAS || dim < 2 * MM_TILE_MIN) {
        mm_sgemm(c, a, b, M, N, K, lda, ldb, ldc, trans_a, trans_b, alpha, beta);
        return;
    }
    /* the smallest multiple of MM_TILE_MIN that makes at most MM_TILES_MAX tiles */
    int64_t per = (dim + MM_TILES_MAX - 1) / MM_TILES_MAX;
    j.tile = (per + MM_TILE_MIN - 1) / MM_TILE_MIN * MM_TILE_MIN;
    cpu_pool_run((dim + j.tile - 1) / j.tile, mm_tile, &j);
}

void cpu_matmul(float *c, const float *a, const float *b, int64_t M, int64_t N, int64_t K,
                bool trans_a, bool trans_b, float alpha, float beta)
{
    cpu_matmul_ld(c, a, b, M, N, K, trans_a ? M : K, trans_b ? K : N, N, trans_a, trans_b, alpha,
                  beta);
}

/* Like torch's addmm: the bias is copied into every row, then the product
 * is added with beta = 1. */
void cpu_linear_fwd(float *out, const float *x, const float *w, const float *bias, int64_t N,
                    int64_t IC, int64_t OC)
{
    if (bias)
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < OC; o++) out[n * OC + o] = bias[o];
    cpu_matmul(out, x, w, N, OC, IC, false, true, 1.0f, bias ? 1.0f : 0.0f);
}

void cpu_linear_bwd(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                    const float *w, int64_t N, int64_t IC, int64_t OC)
{
    if (dx) cpu_matmul(dx, dout, w, N, IC, OC, false, false, 1.0f, 1.0f);
    if (dw) cpu_matmul(dw, dout, x, OC, IC, N, true, false, 1.0f, 1.0f);
    if (dbias) {
        /* column sums in double: N can be thousands of tokens */
        double *acc = calloc((size_t)OC, sizeof *acc);
        if (!acc) BT_PANIC("cpu_linear_bwd: out of memory for %lld sums", (long long)OC);
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < OC; o++) acc[o] += dout[n * OC + o];
        for (int64_t o = 0; o < OC; o++) dbias[o] += (float)acc[o];
        free(acc);
    }
}

/* Group g's rows [r, r + sizes[g]) of x; a size that runs past M is a
 * caller bug (sizes come from kern_moe_permute_fwd). */
static int64_t grouped_rows(const int32_t *sizes, int64_t g, int64_t r, int64_t M, const char *op)
{
    if (sizes[g] < 0 || r + sizes[g] > M)
        BT_PANIC("%s: group %lld has %d rows from row %lld, past the %lld rows of x", op,
                 (long long)g, sizes[g], (long long)r, (long long)M);
    return sizes[g];
}

void cpu_grouped_linear_fwd(float *out, const float *x, const float *w, const int32_t *sizes,
                            int64_t M, int64_t IC, int64_t OC, int64_t G)
{
    int64_t r = 0;
    for (int64_t g = 0; g < G; g++) {
        int64_t n = grouped_rows(sizes, g, r, M, "kern_grouped_linear_fwd");
        cpu_matmul(out + r * OC, x + r * IC, w + g * OC * IC, n, OC, IC, false, true, 1.0f, 0.0f);
        r += n;
    }
    for (int64_t i = r * OC; i < M * OC; i++) out[i] = 0.0f;
}

void cpu_grouped_linear_bwd(float *dx, float *dw, const float *dout, const float *x,
                            const float *w, const int32_t *sizes, int64_t M, int64_t IC,
                            int64_t OC, int64_t G)
{
    int64_t r = 0;
    for (int64_t g = 0; g < G; g++) {
        int64_t n = grouped_rows(sizes, g, r, M, "kern_grouped_linear_bwd");
        if (dx) cpu_matmul(dx + r * IC, dout + r * OC, w + g * OC * IC, n, IC, OC, false, false,
                           1.0f, 1.0f);
        if (dw) cpu_matmul(dw + g * OC * IC, dout + r * OC, x + r * IC, OC, IC, n, true, false,
                           1.0f, 1.0f);
        r += n;
    }
}

/* one thread's share of kern_cpu_peak_flops: its own 512-cubed products,
 * one BLAS call at a time, for about 30 ms */
enum { PEAK_N = 512 };
typedef struct {
    float *buf;     /* 3 x PEAK_N^2 per task */
    int64_t *calls; /* per task */
} peak_job_t;

static void peak_task(void *arg, int64_t task)
{
    peak_job_t *j = arg;
    float *a = j->buf + (size_t)task * 3 * PEAK_N * PEAK_N, *b = a + PEAK_N * PEAK_N,
          *c = b + PEAK_N * PEAK_N;
    uint64_t t0 = clock_now_ns();
    int64_t calls = 0;
    do {
        mm_sgemm(c, a, b, PEAK_N, PEAK_N, PEAK_N, PEAK_N, PEAK_N, PEAK_N, false, false, 1.0f, 0.0f);
        calls++;
    } while (clock_now_ns() - t0 < 30000000ull);
    j->calls[task] = calls;
}

double kern_cpu_peak_flops(void)
{
    /* The rate of the whole pool: every thread kern_cpu_set_threads allows
     * runs its own products at once (what training's tiles add up to; one
     * product split over the threads would add the split's waits, and a
     * 2-core host measured 131 GFLOP/s that way against 200 this way while
     * its training reached 152). Total products over the wall time, best of
     * four rounds. */
    int T = cpu_pool_threads();
    peak_job_t j = {.buf = malloc(sizeof(float) * 3 * PEAK_N * PEAK_N * (size_t)T),
                    .calls = calloc((size_t)T, sizeof(int64_t))};
    double best = 0;
    if (j.buf && j.calls) {
        for (size_t i = 0; i < (size_t)3 * PEAK_N * PEAK_N * (size_t)T; i++)
            j.buf[i] = (float)(i % 7) * 0.25f;
        for (int round = 0; round < 4; round++) {
            uint64_t t0 = clock_now_ns();
            cpu_pool_run(T, peak_task, &j);
            double secs = (double)(clock_now_ns() - t0) * 1e-9, calls = 0;
            for (int t = 0; t < T; t++) calls += (double)j.calls[t];
            double rate = 2.0 * PEAK_N * PEAK_N * PEAK_N * calls / secs;
            if (rate > best) best = rate;
        }
    }
    free(j.buf);
    free(j.calls);
    return best;
}
