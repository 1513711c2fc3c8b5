/* Rotary position embedding, Hugging Face "rotate_half" convention: the pair
 * rotated together is (i, i + D/2), not (2i, 2i+1). */
#include "kernels/cpu/cpu.h"

#include "base/log.h"

static const float *cpu_rope_row(const float *table, const int32_t *pos, int64_t t, int64_t half,
                                 int64_t P)
{
    int32_t p = pos[t];
    if (p < 0 || p >= P)
        BT_PANIC("kern_rope: position %d of token %lld outside the table [0, %lld)", p,
                 (long long)t, (long long)P);
    return table + (int64_t)p * half;
}

void cpu_rope_fwd(float *out, const float *x, const float *cos, const float *sin,
                  const int32_t *pos, int64_t BT, int64_t H, int64_t D, int64_t P)
{
    int64_t half = D / 2;
    for (int64_t t = 0; t < BT; t++) {
        const float *c = cpu_rope_row(cos, pos, t, half, P);
        const float *s = cpu_rope_row(sin, pos, t, half, P);
        for (int64_t h = 0; h < H; h++) {
            const float *xi = x + (t * H + h) * D;
            float *o = out + (t * H + h) * D;
            for (int64_t i = 0; i < half; i++) {
                float x1 = xi[i], x2 = xi[i + half]; /* read both first: out may alias x */
                o[i] = x1 * c[i] - x2 * s[i];
                o[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
    }
}

/* The rotation's transpose: rotate by -theta. */
void cpu_rope_bwd(float *dx, const float *dout, const float *cos, const float *sin,
                  const int32_t *pos, int64_t BT, int64_t H, int64_t D, int64_t P)
{
    int64_t half = D / 2;
    for (int64_t t = 0; t < BT; t++) {
        const float *c = cpu_rope_row(cos, pos, t, half, P);
        const float *s = cpu_rope_row(sin, pos, t, half, P);
        for (int64_t h = 0; h < H; h++) {
            const float *g = dout + (t * H + h) * D;
            float *d = dx + (t * H + h) * D;
            for (int64_t i = 0; i < half; i++) {
                float g1 = g[i], g2 = g[i + half];
                d[i] += g1 * c[i] + g2 * s[i];
                d[i + half] += g2 * c[i] - g1 * s[i];
            }
        }
    }
}
