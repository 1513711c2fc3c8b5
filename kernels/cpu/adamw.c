/* AdamW, computed element by element the way torch.optim.AdamW's
 * single-tensor path (foreach=False, fused=False) does in float32:
 *
 *   param.mul_(1 - lr*wd)                      scalar formed in double, applied as float
 *   exp_avg.lerp_(grad, 1 - beta1)             m + w*(g - m), fused multiply-add
 *   exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
 *   denom = (exp_avg_sq.sqrt() / sqrt(1 - beta2^t)).add_(eps)
 *   param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1^t))
 *
 * Python scalars are doubles; every scalar is formed in double and rounded
 * to float once, as torch does when it applies a Python number to a float
 * tensor. The order matters for bit-level agreement over many steps. */
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

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

    float decay = (float)(1.0 - lr * wd);
    float w1 = (float)(1.0 - beta1);
    float b2 = (float)beta2;
    float w2 = (float)(1.0 - beta2);
    float bc2s = (float)bias_correction2_sqrt;
    float epsf = (float)eps;
    float neg_step = (float)(-step_size);
    bool decays = wd != 0.0;

    for (int64_t i = 0; i < n; i++) {
        float p = param[i], g = grad[i];
        if (decays) p = p * decay;
        float mi = fmaf(w1, g - m[i], m[i]);
        float vi = v[i] * b2;
        vi = vi + w2 * g * g;
        float denom = sqrtf(vi) / bc2s + epsf;
        p = p + neg_step * mi / denom;
        m[i] = mi;
        v[i] = vi;
        param[i] = p;
    }
}
