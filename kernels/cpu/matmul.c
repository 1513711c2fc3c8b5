/* Dense products on the CPU through OpenBLAS (STYLE.md rule 15). */
#include "kernels/cpu/cpu.h"

#include "base/log.h"

#include <cblas.h>
#include <stdlib.h>

void cpu_set_threads(int n)
{
    if (n <= 0) n = openblas_get_num_procs();
    openblas_set_num_threads(n);
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
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N, (blasint)K, alpha, a,
                (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
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
