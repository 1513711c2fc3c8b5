/* Elementwise ops, dtype conversion and reductions on the CPU. */
#include "kernels/cpu/cpu.h"

#include "base/log.h"

#include <math.h>
#include <string.h>

void cpu_zero(void *p, size_t nbytes)
{
    if (nbytes) memset(p, 0, nbytes);
}

/* One element of a float dtype as f32 (f64 narrows with rounding). */
static float cpu_load(const void *p, dtype_t dt, int64_t i)
{
    switch (dt) {
    case DT_F32: return ((const float *)p)[i];
    case DT_F64: return (float)((const double *)p)[i];
    case DT_BF16: return bf16_to_f32(((const uint16_t *)p)[i]);
    case DT_F16: return f16_to_f32(((const uint16_t *)p)[i]);
    default: BT_PANIC("cpu_load: %s is not a float dtype", dtype_name(dt));
    }
}

static double cpu_load_f64(const void *p, dtype_t dt, int64_t i)
{
    return dt == DT_F64 ? ((const double *)p)[i] : (double)cpu_load(p, dt, i);
}

static bool cpu_dtype_is_float(dtype_t dt)
{
    return dt == DT_F32 || dt == DT_F64 || dt == DT_BF16 || dt == DT_F16;
}

void cpu_copy(void *dst, dtype_t dst_dt, const void *src, dtype_t src_dt, int64_t n)
{
    if (dst_dt == src_dt) {
        if (n && dst != src) memmove(dst, src, (size_t)n * dtype_size(dst_dt));
        return;
    }
    if (!cpu_dtype_is_float(dst_dt) || !cpu_dtype_is_float(src_dt))
        BT_PANIC("kern_copy: no conversion %s -> %s", dtype_name(src_dt), dtype_name(dst_dt));
    switch (dst_dt) {
    case DT_F32: {
        float *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = cpu_load(src, src_dt, i);
        break;
    }
    case DT_F64: {
        double *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = cpu_load_f64(src, src_dt, i);
        break;
    }
    case DT_BF16: {
        /* f64 -> bf16 goes through f32: double rounding, accepted (f64 is a
         * test/reference dtype, not a training one) */
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16(cpu_load(src, src_dt, i));
        break;
    }
    case DT_F16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = f32_to_f16(cpu_load(src, src_dt, i));
        break;
    }
    default: BT_PANIC("kern_copy: unreachable dtype %s", dtype_name(dst_dt));
    }
}

void cpu_add(float *out, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void cpu_axpy(float *y, float alpha, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

void cpu_scale(float *p, float s, int64_t n)
{
    for (int64_t i = 0; i < n; i++) p[i] *= s;
}

double cpu_sumsq(const void *p, dtype_t dt, int64_t n)
{
    if (!cpu_dtype_is_float(dt)) BT_PANIC("kern_sumsq: %s is not a float dtype", dtype_name(dt));
    double s = 0.0;
    if (dt == DT_F32) {
        const float *f = p;
        for (int64_t i = 0; i < n; i++) s += (double)f[i] * (double)f[i];
    } else {
        for (int64_t i = 0; i < n; i++) {
            double x = cpu_load_f64(p, dt, i);
            s += x * x;
        }
    }
    return s;
}

int64_t cpu_count_nonfinite(const void *p, dtype_t dt, int64_t n)
{
    if (!cpu_dtype_is_float(dt))
        BT_PANIC("kern_count_nonfinite: %s is not a float dtype", dtype_name(dt));
    int64_t bad = 0;
    if (dt == DT_F32) {
        /* exponent all ones <=> Inf or NaN; bit test stays correct under
         * any floating-point flags */
        const uint32_t *u = p;
        for (int64_t i = 0; i < n; i++) bad += (u[i] & 0x7f800000u) == 0x7f800000u;
    } else {
        for (int64_t i = 0; i < n; i++) bad += !isfinite(cpu_load_f64(p, dt, i));
    }
    return bad;
}
