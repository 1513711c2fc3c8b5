/* Vectorized row primitives shared by the softmax-shaped layers (attention,
 * cross-entropy, SwiGLU).
 *
 * Why this file exists: the project builds with plain -O2 for generic
 * x86-64, where GCC neither vectorizes loops of unknown length nor inlines
 * a vector expf, and glibc's scalar expf made up a third of attention and
 * almost all of the loss. These functions carry an AVX2+FMA path chosen at
 * run time (target attribute + __builtin_cpu_supports) and a portable scalar
 * path with the same algorithm for other CPUs and loop tails.
 *
 * exp: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, and the
 * degree-7 Cephes expf polynomial; within 2 ulp of the exact value on
 * [-87.3, 88]. Inputs below ln(FLT_MIN) give 0 (no subnormals), inputs
 * above 88 saturate at e^88 ~ 1.65e38 (softmax-shaped callers only
 * exponentiate x - max <= 0 or -g), NaN stays NaN. */
#include "kernels/cpu/cpu.h"

#include <stdatomic.h>
#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CPU_HAVE_X86 1
#endif

#define EXP_HI    88.0f
#define EXP_LO    (-87.33654f) /* ln(FLT_MIN) */
#define EXP_LOG2E 1.44269504088896341f
#define EXP_C1    0.693359375f /* ln2 split: C1 + C2 = ln2, C1 exact in 9 bits */
#define EXP_C2    (-2.12194440e-4f)
#define EXP_P0    1.9875691500e-4f
#define EXP_P1    1.3981999507e-3f
#define EXP_P2    8.3334519073e-3f
#define EXP_P3    4.1665795894e-2f
#define EXP_P4    1.6666665459e-1f
#define EXP_P5    5.0000001201e-1f

float cpu_expf_fast(float x)
{
    if (isnan(x)) return x;
    if (x < EXP_LO) return 0.0f;
    if (x > EXP_HI) x = EXP_HI;
    /* round to nearest even through the 1.5 * 2^23 trick (exact for |v| < 2^22) */
    float n = (x * EXP_LOG2E + 0x1.8p23f) - 0x1.8p23f;
    float r = x - n * EXP_C1;
    r = r - n * EXP_C2;
    float p = EXP_P0;
    p = p * r + EXP_P1;
    p = p * r + EXP_P2;
    p = p * r + EXP_P3;
    p = p * r + EXP_P4;
    p = p * r + EXP_P5;
    float y = p * (r * r) + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

#ifdef CPU_HAVE_X86

__attribute__((target("avx2,fma"))) static inline __m256 cpu_exp8(__m256 x)
{
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO), _CMP_LT_OQ); /* false for NaN */
    /* min/max return their second operand when either is NaN: NaN survives */
    x = _mm256_min_ps(_mm256_set1_ps(EXP_HI), x);
    x = _mm256_max_ps(_mm256_set1_ps(EXP_LO), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_C1), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_C2), r);
    __m256 p = _mm256_set1_ps(EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P5));
    __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

/* float lanes summed over at most this many elements before going to double */
enum { CPU_SUM_CHUNK = 1024 };

__attribute__((target("avx2,fma"))) static double cpu_hsum8(__m256 v)
{
    float lanes[8];
    _mm256_storeu_ps(lanes, v);
    double s = 0;
    for (int i = 0; i < 8; i++) s += lanes[i];
    return s;
}

__attribute__((target("avx2,fma"))) static double cpu_exp_sum_avx2(float *y, const float *x,
                                                                    int64_t n, float shift,
                                                                    int64_t *done)
{
    __m256 sh = _mm256_set1_ps(shift);
    double total = 0;
    int64_t i = 0;
    while (i + 8 <= n) {
        __m256 acc = _mm256_setzero_ps();
        int64_t end = i + CPU_SUM_CHUNK < n ? i + CPU_SUM_CHUNK : n;
        for (; i + 8 <= end; i += 8) {
            __m256 e = cpu_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
            _mm256_storeu_ps(y + i, e);
            acc = _mm256_add_ps(acc, e);
        }
        total += cpu_hsum8(acc);
    }
    *done = i;
    return total;
}

__attribute__((target("avx2,fma"))) static float cpu_max_avx2(const float *x, int64_t n,
                                                               int64_t *done)
{
    __m256 m = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    float lanes[8], r = -INFINITY;
    _mm256_storeu_ps(lanes, m);
    for (int k = 0; k < 8; k++) r = lanes[k] > r ? lanes[k] : r;
    *done = i;
    return r;
}

__attribute__((target("avx2,fma"))) static int64_t cpu_scale_avx2(float *y, int64_t n, float s)
{
    __m256 sv = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), sv));
    return i;
}

__attribute__((target("avx2,fma"))) static int64_t cpu_mul_sub_avx2(float *y, const float *a,
                                                                     int64_t n, float c)
{
    __m256 cv = _mm256_set1_ps(c);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i),
                                              _mm256_sub_ps(_mm256_loadu_ps(a + i), cv)));
    return i;
}

/* out = g / (1 + exp(-g)) * u */
__attribute__((target("avx2,fma"))) static int64_t cpu_silu_mul_avx2(float *out, const float *g,
                                                                      const float *u, int64_t n)
{
    __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = cpu_exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
    }
    return i;
}

/* dgate += dout * u * s (1 + g (1 - s)), dup += dout * g s, s = sigmoid(g) */
__attribute__((target("avx2,fma"))) static int64_t cpu_silu_mul_bwd_avx2(
    float *dgate, float *dup, const float *dout, const float *g, const float *u, int64_t n)
{
    __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i), dv = _mm256_loadu_ps(dout + i);
        __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, cpu_exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
        if (dgate) {
            __m256 ds = _mm256_mul_ps(s, _mm256_add_ps(one, _mm256_mul_ps(gv, _mm256_sub_ps(one, s))));
            __m256 t = _mm256_mul_ps(_mm256_mul_ps(dv, _mm256_loadu_ps(u + i)), ds);
            _mm256_storeu_ps(dgate + i, _mm256_add_ps(_mm256_loadu_ps(dgate + i), t));
        }
        if (dup) {
            __m256 t = _mm256_mul_ps(dv, _mm256_mul_ps(gv, s));
            _mm256_storeu_ps(dup + i, _mm256_add_ps(_mm256_loadu_ps(dup + i), t));
        }
    }
    return i;
}

/* 0 unknown, 1 yes, -1 no. Threads that race to fill it compute the same
 * answer; the atomic makes that race defined (and quiet under TSan). */
static _Atomic int cpu_avx2_state;

static bool cpu_avx2(void)
{
    int st = atomic_load_explicit(&cpu_avx2_state, memory_order_relaxed);
    if (!st) {
        __builtin_cpu_init();
        st = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : -1;
        atomic_store_explicit(&cpu_avx2_state, st, memory_order_relaxed);
    }
    return st > 0;
}

#endif /* CPU_HAVE_X86 */

double cpu_vexp_sum(float *y, const float *x, int64_t n, float shift)
{
    int64_t i = 0;
    double total = 0;
#ifdef CPU_HAVE_X86
    if (cpu_avx2()) total = cpu_exp_sum_avx2(y, x, n, shift, &i);
#endif
    for (; i < n; i++) {
        y[i] = cpu_expf_fast(x[i] - shift);
        total += y[i];
    }
    return total;
}

float cpu_vmax(const float *x, int64_t n)
{
    int64_t i = 0;
    float m = -INFINITY;
#ifdef CPU_HAVE_X86
    if (cpu_avx2()) m = cpu_max_avx2(x, n, &i);
#endif
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

void cpu_vscale(float *y, int64_t n, float s)
{
    int64_t i = 0;
#ifdef CPU_HAVE_X86
    if (cpu_avx2()) i = cpu_scale_avx2(y, n, s);
#endif
    for (; i < n; i++) y[i] *= s;
}

void cpu_vmul_sub(float *y, const float *a, int64_t n, float c)
{
    int64_t i = 0;
#ifdef CPU_HAVE_X86
    if (cpu_avx2()) i = cpu_mul_sub_avx2(y, a, n, c);
#endif
    for (; i < n; i++) y[i] = y[i] * (a[i] - c);
}

void cpu_vsilu_mul(float *out, const float *g, const float *u, int64_t n)
{
    int64_t i = 0;
#ifdef CPU_HAVE_X86
    if (cpu_avx2()) i = cpu_silu_mul_avx2(out, g, u, n);
#endif
    for (; i < n; i++) out[i] = g[i] / (1.0f + cpu_expf_fast(-g[i])) * u[i];
}

void cpu_vsilu_mul_bwd(float *dgate, float *dup, const float *dout, const float *g,
                       const float *u, int64_t n)
{
    int64_t i = 0;
#ifdef CPU_HAVE_X86
    if (cpu_avx2()) i = cpu_silu_mul_bwd_avx2(dgate, dup, dout, g, u, n);
#endif
    for (; i < n; i++) {
        float s = 1.0f / (1.0f + cpu_expf_fast(-g[i]));
        if (dgate) dgate[i] += dout[i] * u[i] * (s * (1.0f + g[i] * (1.0f - s)));
        if (dup) dup[i] += dout[i] * (g[i] * s);
    }
}
