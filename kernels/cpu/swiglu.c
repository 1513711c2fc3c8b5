/* SwiGLU gating of the Llama MLP: out = silu(gate) * up, with torch's
 * silu(x) = x / (1 + exp(-x)). The loops live in vmath.c (vectorized exp). */
#include "kernels/cpu/cpu.h"

void cpu_swiglu_fwd(float *out, const float *gate, const float *up, int64_t n)
{
    cpu_vsilu_mul(out, gate, up, n);
}

/* d silu(g)/dg = s (1 + g (1 - s)), s = sigmoid(g) */
void cpu_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate,
                    const float *up, int64_t n)
{
    cpu_vsilu_mul_bwd(dgate, dup, dout, gate, up, n);
}
