/* RMSNorm as Hugging Face's LlamaRMSNorm computes it in fp32:
 * out = w * (x * rsqrt(mean(x^2) + eps)). */
#include "kernels/cpu/cpu.h"

#include "base/log.h"

#include <math.h>
#include <stdlib.h>

void cpu_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int64_t N,
                     int64_t C, float eps)
{
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C;
        float *o = out + n * C;
        /* torch reduces with a cascade of float partial sums; a double sum
         * rounded once is at least as close to the exact mean */
        double ss = 0.0;
        for (int64_t c = 0; c < C; c++) ss += (double)xr[c] * (double)xr[c];
        float var = (float)(ss / (double)C);
        float r = 1.0f / sqrtf(var + eps);
        rstd[n] = r;
        for (int64_t c = 0; c < C; c++) o[c] = w[c] * (xr[c] * r);
    }
}

/* cpu_add_rmsnorm_fwd: the sum is formed and stored first, then read back
 * by the norm row by row exactly as cpu_rmsnorm_fwd reads its input, so the bits are
 * those of cpu_add followed by cpu_rmsnorm_fwd (xout may alias x or y: each
 * element is read before it is written). */
void cpu_add_rmsnorm_fwd(float *xout, float *out, float *rstd, const float *x, const float *y,
                         const float *w, int64_t N, int64_t C, float eps)
{
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C, *yr = y + n * C;
        float *xo = xout + n * C;
        for (int64_t c = 0; c < C; c++) xo[c] = xr[c] + yr[c];
        cpu_rmsnorm_fwd(out + n * C, rstd + n, xo, w, 1, C, eps); /* the row still in cache */
    }
}

/* y_c = w_c x_c r with r = (mean(x^2)+eps)^-1/2, so
 * dx_c = r w_c dy_c - (r^3 / C) x_c sum_j(w_j dy_j x_j);  dw_c = sum_n dy_c x_c r. */
void cpu_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w,
                     const float *rstd, int64_t N, int64_t C)
{
    double *dw_acc = NULL;
    if (dw) {
        dw_acc = calloc((size_t)C, sizeof *dw_acc);
        if (!dw_acc) BT_PANIC("cpu_rmsnorm_bwd: out of memory for %lld sums", (long long)C);
    }
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C;
        const float *g = dout + n * C;
        float r = rstd[n];
        if (dw_acc)
            for (int64_t c = 0; c < C; c++) dw_acc[c] += (double)(g[c] * xr[c] * r);
        if (dx) {
            double dot = 0.0;
            for (int64_t c = 0; c < C; c++) dot += (double)w[c] * g[c] * xr[c];
            float k = (float)(dot * (double)r * r * r / (double)C);
            float *d = dx + n * C;
            for (int64_t c = 0; c < C; c++) d[c] += r * w[c] * g[c] - k * xr[c];
        }
    }
    if (dw) {
        for (int64_t c = 0; c < C; c++) dw[c] += (float)dw_acc[c];
        free(dw_acc);
    }
}
