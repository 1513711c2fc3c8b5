/* SwiGLU gating of the Llama MLP: out = silu(gate) * up. */
#include "kernels/cpu/cpu.h"

#include <math.h>

void cpu_swiglu_fwd(float *out, const float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i]; /* torch's silu: x / (1 + exp(-x)) */
    }
}

/* d silu(g)/dg = s (1 + g (1 - s)), s = sigmoid(g) */
void cpu_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate,
                    const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        float s = 1.0f / (1.0f + expf(-g));
        if (dgate) dgate[i] += dout[i] * up[i] * (s * (1.0f + g * (1.0f - s)));
        if (dup) dup[i] += dout[i] * (g * s);
    }
}
