/* AdamW, computed element by element the way torch.optim.AdamW's
 * single-tensor path (foreach=False, fused=False) does in float32:
 *
 *   param.mul_(1 - lr*wd)                      scalar formed in double, applied as float
 *   exp_avg.lerp_(grad, 1 - beta1)             fma(w, g - m, m)
 *   exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
 *                                              fma((1 - beta2) * g, g, v * beta2)
 *   denom = (exp_avg_sq.sqrt() / sqrt(1 - beta2^t)).add_(eps)
 *   param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1^t))
 *
 * The two fused multiply-adds are those of torch's vectorized CPU kernels
 * (lerp and addcmul use Vectorized fmadd); they were confirmed bit for bit
 * against torch 2.x on x86-64 with tools/gen_kernel_fixtures.py.
 * Python scalars are doubles; every scalar is formed in double and rounded
 * to float once, as torch does when it applies a Python number to a float
 * tensor. The order matters for bit-level agreement over many steps. */
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CPU_ADAMW_X86 1
#endif

/* The per-element update, scalars already rounded to float. */
typedef struct {
    float decay, w1, b2, w2, bc2s, eps, neg_step;
    bool  decays;
} cpu_adamw_scalars_t;

#ifdef CPU_ADAMW_X86
/* Eight lanes of exactly the scalar loop's operations (fma, correctly
 * rounded sqrt and div), so both paths give identical bits. Returns the
 * number of elements done. */
__attribute__((target("avx2,fma"))) static int64_t cpu_adamw_avx2(float *param, const float *grad,
                                                                  float *m, float *v, int64_t n,
                                                                  const cpu_adamw_scalars_t *k)
{
    __m256 decay = _mm256_set1_ps(k->decay), w1 = _mm256_set1_ps(k->w1);
    __m256 b2 = _mm256_set1_ps(k->b2), w2 = _mm256_set1_ps(k->w2);
    __m256 bc2s = _mm256_set1_ps(k->bc2s), eps = _mm256_set1_ps(k->eps);
    __m256 neg_step = _mm256_set1_ps(k->neg_step);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 p = _mm256_loadu_ps(param + i), g = _mm256_loadu_ps(grad + i);
        __m256 mi = _mm256_loadu_ps(m + i), vi = _mm256_loadu_ps(v + i);
        if (k->decays) p = _mm256_mul_ps(p, decay);
        mi = _mm256_fmadd_ps(w1, _mm256_sub_ps(g, mi), mi);
        vi = _mm256_fmadd_ps(_mm256_mul_ps(w2, g), g, _mm256_mul_ps(vi, b2));
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2s), eps);
        p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(neg_step, mi), denom));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(param + i, p);
    }
    return i;
}
#endif

/* The hyper-parameters arrive as floats but were written as decimals in a
 * config (0.9, 0.999, 1e-3); torch sees those decimals as doubles. Recover
 * the shortest decimal that rounds to this float, then read it as a double,
 * so that e.g. 1 - 0.9f^t becomes 1 - 0.9^t exactly as in torch. */
static double cpu_adamw_hparam(float f)
{
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        double d = strtod(buf, NULL);
        if ((float)d == f) return d;
    }
    return (double)f;
}

void cpu_adamw(float *param, const float *grad, float *m, float *v, int64_t n,
               const adamw_args_t *args)
{
    double lr = cpu_adamw_hparam(args->lr), wd = cpu_adamw_hparam(args->weight_decay);
    double beta1 = cpu_adamw_hparam(args->beta1), beta2 = cpu_adamw_hparam(args->beta2);
    double eps = cpu_adamw_hparam(args->eps);
    double step = (double)args->step;

    double bias_correction1 = 1.0 - pow(beta1, step);
    double bias_correction2 = 1.0 - pow(beta2, step);
    double step_size = lr / bias_correction1;
    double bias_correction2_sqrt = sqrt(bias_correction2);

    cpu_adamw_scalars_t k = {
        .decay = (float)(1.0 - lr * wd),
        .w1 = (float)(1.0 - beta1),
        .b2 = (float)beta2,
        .w2 = (float)(1.0 - beta2),
        .bc2s = (float)bias_correction2_sqrt,
        .eps = (float)eps,
        .neg_step = (float)(-step_size),
        .decays = wd != 0.0,
    };

    int64_t i = 0;
#ifdef CPU_ADAMW_X86
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        i = cpu_adamw_avx2(param, grad, m, v, n, &k);
#endif
    for (; i < n; i++) {
        float p = param[i], g = grad[i];
        if (k.decays) p = p * k.decay;
        float mi = fmaf(k.w1, g - m[i], m[i]);
        float vi = fmaf(k.w2 * g, g, v[i] * k.b2);
        float denom = sqrtf(vi) / k.bc2s + k.eps;
        p = p + k.neg_step * mi / denom;
        m[i] = mi;
        v[i] = vi;
        param[i] = p;
    }
}
