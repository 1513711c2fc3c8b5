/* kernels/cpu/vmath.c: the fast exp against libm's double exp (ulp bound
 * over the whole range, special values), and the vector primitives (AVX2
 * path plus scalar tails) against scalar float64 loops at lengths around the
 * vector width. */
#include "kernels/cpu/cpu.h"
#include "tests/test_kernels_common.h"

#include <float.h>

/* distance in units of the last place of the float nearest to ref */
static double ulps(float got, double ref)
{
    float r = (float)ref;
    double ulp = (double)nextafterf(fabsf(r), INFINITY) - fabs((double)r);
    if (fabs((double)r) < FLT_MIN) ulp = 0x1p-149; /* subnormal spacing */
    return fabs((double)got - ref) / ulp;
}

static void test_expf_fast_accuracy(void)
{
    kt_rng_t rng = {40};
    double worst = 0, worst_x = 0;
    for (int i = 0; i < 2000000; i++) {
        float x = (float)kt_uniform(&rng, -87.0, 88.0);
        if (i % 4 == 0) x = (float)kt_uniform(&rng, -1.0, 1.0);
        double e = ulps(cpu_expf_fast(x), exp((double)x));
        if (e > worst) worst = e, worst_x = x;
    }
    printf("  fast exp (scalar): worst %.2f ulp at x = %.9g\n", worst, worst_x);
    CHECK_MSG(worst <= 2.0, "worst %.2f ulp at %.9g", worst, worst_x);
    /* the vector path (AVX2 where present) over the same kind of inputs */
    int64_t n = 1 << 20;
    float *x = kt_alloc(n), *y = kt_alloc(n);
    for (int64_t i = 0; i < n; i++) x[i] = (float)kt_uniform(&rng, -87.0, 88.0);
    cpu_vexp_sum(y, x, n, 0.0f);
    worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = ulps(y[i], exp((double)x[i]));
        if (e > worst) worst = e, worst_x = x[i];
    }
    printf("  fast exp (vector): worst %.2f ulp at x = %.9g\n", worst, worst_x);
    CHECK_MSG(worst <= 2.0, "worst %.2f ulp at %.9g", worst, worst_x);
    free(x), free(y);
    CHECK(cpu_expf_fast(0.0f) == 1.0f);
    CHECK(cpu_expf_fast(-INFINITY) == 0.0f);
    CHECK(cpu_expf_fast(-1000.0f) == 0.0f);
    CHECK(isnan(cpu_expf_fast(NAN)));
    float big = cpu_expf_fast(1000.0f);
    CHECK(isfinite(big) && big > 1e38f); /* documented saturation at e^88 */
}

static void test_vexp_sum_and_friends(void)
{
    kt_rng_t rng = {41};
    const int64_t lens[] = {0, 1, 7, 8, 9, 15, 16, 17, 33, 1023, 1024, 1025, 5000};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        int64_t n = lens[li];
        float *x = kt_rand(&rng, n, -30, 10), *y = kt_alloc(n);
        if (n > 3) x[3] = -INFINITY, x[1] = 9.5f;
        float shift = 10.0f;
        double sum = cpu_vexp_sum(y, x, n, shift);
        double ref_sum = 0;
        double *ref = kt_alloc_d(n);
        for (int64_t i = 0; i < n; i++) ref_sum += ref[i] = exp((double)x[i] - shift);
        kt_close("vexp", y, ref, n, 1e-6);
        CHECK_NEAR(sum, ref_sum, 1e-6, 1e-300);
        /* in place */
        float *z = kt_dup(x, n);
        cpu_vexp_sum(z, z, n, shift);
        CHECK(n == 0 || !memcmp(z, y, (size_t)n * sizeof *z));

        float m = -INFINITY;
        for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
        CHECK(cpu_vmax(x, n) == m);

        float *a = kt_rand(&rng, n, -1, 1), *w = kt_dup(y, n);
        cpu_vmul_sub(w, a, n, 0.25f);
        for (int64_t i = 0; i < n; i++) ref[i] = (double)y[i] * ((double)a[i] - 0.25);
        kt_close("vmul_sub", w, ref, n, 1e-6);
        cpu_vscale(w, n, -3.0f);
        for (int64_t i = 0; i < n; i++) ref[i] *= -3.0;
        kt_close("vscale", w, ref, n, 1e-6);

        float *g = kt_rand(&rng, n, -20, 20), *u = kt_rand(&rng, n, -2, 2), *o = kt_alloc(n);
        cpu_vsilu_mul(o, g, u, n);
        for (int64_t i = 0; i < n; i++) ref[i] = g[i] / (1 + exp(-(double)g[i])) * u[i];
        kt_close("silu_mul", o, ref, n, 1e-6);
        free(x), free(y), free(ref), free(z), free(a), free(w), free(g), free(u), free(o);
    }
    CHECK(isinf(cpu_vmax(NULL, 0)) && cpu_vmax(NULL, 0) < 0);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_expf_fast_accuracy, test_vexp_sum_and_friends);
}
