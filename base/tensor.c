/* Tensor views and scalar dtype conversions (base/tensor.h). */
#include "base/tensor.h"

#include "base/log.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    size_t      size;
} dtype_info_t;

static const dtype_info_t dtype_infos[] = {
    [DT_F32] = {"f32", 4}, [DT_F16] = {"f16", 2}, [DT_BF16] = {"bf16", 2}, [DT_F64] = {"f64", 8},
    [DT_I32] = {"i32", 4}, [DT_I64] = {"i64", 8}, [DT_U8] = {"u8", 1},
};
_Static_assert(sizeof dtype_infos / sizeof dtype_infos[0] == DT_COUNT, "one entry per dtype");

static bool dtype_valid(dtype_t dt) { return (unsigned)dt < (unsigned)DT_COUNT; }

bool dtype_is_float(dtype_t dt)
{
    return dt == DT_F32 || dt == DT_F16 || dt == DT_BF16 || dt == DT_F64;
}

static const char *const device_kind_names[] = {
    [DEV_CPU] = "cpu", [DEV_CUDA] = "cuda", [DEV_FENCED] = "fenced",
};
_Static_assert(sizeof device_kind_names / sizeof device_kind_names[0] == DEV_COUNT,
               "one name per device kind");

const char *device_kind_name(device_kind_t k)
{
    return (unsigned)k < (unsigned)DEV_COUNT ? device_kind_names[k] : "invalid";
}

bool device_parse(const char *s, device_t *out)
{
    if (!s) return false;
    for (int k = 0; k < DEV_COUNT; k++) {
        size_t n = strlen(device_kind_names[k]);
        if (strncmp(s, device_kind_names[k], n)) continue;
        if (!s[n]) {
            *out = (device_t){(device_kind_t)k, 0};
            return true;
        }
        /* only cuda has ordinals: "cuda:N" with N in [0, 1023] */
        if (k != DEV_CUDA || s[n] != ':' || !s[n + 1]) return false;
        int idx = 0;
        for (const char *p = s + n + 1; *p; p++) {
            if (*p < '0' || *p > '9' || idx > 102) return false;
            idx = idx * 10 + (*p - '0');
        }
        if (idx > 1023) return false;
        *out = (device_t){DEV_CUDA, idx};
        return true;
    }
    return false;
}

const char *device_str(device_t d, char *buf)
{
    if (d.kind == DEV_CUDA || d.index != 0)
        snprintf(buf, DEVICE_STR_MAX, "%s:%d", device_kind_name(d.kind), d.index);
    else snprintf(buf, DEVICE_STR_MAX, "%s", device_kind_name(d.kind));
    return buf;
}

size_t dtype_size(dtype_t dt)
{
    if (!dtype_valid(dt)) BT_PANIC("dtype_size: invalid dtype %d", (int)dt);
    return dtype_infos[dt].size;
}

const char *dtype_name(dtype_t dt)
{
    return dtype_valid(dt) ? dtype_infos[dt].name : "invalid";
}

int dtype_parse(const char *name)
{
    if (!name) return -1;
    for (int i = 0; i < DT_COUNT; i++)
        if (!strcmp(name, dtype_infos[i].name)) return i;
    return -1;
}

/* ---- views ---------------------------------------------------------------- */

tensor_t tensor_make(void *data, dtype_t dt, device_t dev, int ndim, const int64_t *shape)
{
    if (!dtype_valid(dt)) BT_PANIC("tensor_make: invalid dtype %d", (int)dt);
    if (ndim < 1 || ndim > TENSOR_MAX_DIMS)
        BT_PANIC("tensor_make: ndim %d outside 1..%d", ndim, TENSOR_MAX_DIMS);
    tensor_t t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = ndim;
    t.device = dev;
    t.data = data;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (shape[i] < 0) BT_PANIC("tensor_make: negative size %lld in dim %d", (long long)shape[i], i);
        t.shape[i] = shape[i];
        t.stride[i] = stride;
        stride *= shape[i];
    }
    return t;
}

tensor_t tensor_1d(void *data, dtype_t dt, int64_t d0)
{
    int64_t s[1] = {d0};
    return tensor_make(data, dt, DEVICE_CPU, 1, s);
}

tensor_t tensor_2d(void *data, dtype_t dt, int64_t d0, int64_t d1)
{
    int64_t s[2] = {d0, d1};
    return tensor_make(data, dt, DEVICE_CPU, 2, s);
}

tensor_t tensor_3d(void *data, dtype_t dt, int64_t d0, int64_t d1, int64_t d2)
{
    int64_t s[3] = {d0, d1, d2};
    return tensor_make(data, dt, DEVICE_CPU, 3, s);
}

tensor_t tensor_4d(void *data, dtype_t dt, int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    int64_t s[4] = {d0, d1, d2, d3};
    return tensor_make(data, dt, DEVICE_CPU, 4, s);
}

int64_t tensor_numel(const tensor_t *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t tensor_nbytes(const tensor_t *t)
{
    return (size_t)tensor_numel(t) * dtype_size(t->dtype);
}

/* Dims of size 1 may carry any stride: they never move the address. */
bool tensor_is_contiguous(const tensor_t *t)
{
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != expect) return false;
        expect *= t->shape[i];
    }
    return true;
}

bool tensor_same_shape(const tensor_t *a, const tensor_t *b)
{
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

int64_t tensor_rows(const tensor_t *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim - 1; i++) n *= t->shape[i];
    return n;
}

int64_t tensor_cols(const tensor_t *t)
{
    return t->ndim > 0 ? t->shape[t->ndim - 1] : 1;
}

tensor_t tensor_narrow(const tensor_t *t, int64_t start, int64_t len)
{
    if (!tensor_is_contiguous(t)) BT_PANIC("tensor_narrow: source is not contiguous");
    if (start < 0 || len < 0 || start + len > t->shape[0])
        BT_PANIC("tensor_narrow: rows [%lld, %lld) outside dim 0 of size %lld", (long long)start,
                 (long long)(start + len), (long long)t->shape[0]);
    int64_t shape[TENSOR_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[0] = len;
    int64_t row = 1;
    for (int i = 1; i < t->ndim; i++) row *= t->shape[i];
    char *base = (char *)t->data;
    void *data = base ? base + (size_t)(start * row) * dtype_size(t->dtype) : NULL;
    return tensor_make(data, t->dtype, t->device, t->ndim, shape);
}

tensor_t tensor_reshape(const tensor_t *t, int ndim, const int64_t *shape)
{
    if (!tensor_is_contiguous(t)) BT_PANIC("tensor_reshape: source is not contiguous");
    tensor_t r = tensor_make(t->data, t->dtype, t->device, ndim, shape);
    if (tensor_numel(&r) != tensor_numel(t))
        BT_PANIC("tensor_reshape: numel %lld != source numel %lld", (long long)tensor_numel(&r),
                 (long long)tensor_numel(t));
    return r;
}

/* ---- scalar conversions --------------------------------------------------- */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    /* NaN: keep sign and the top payload bits, force quiet so the truncated
     * payload can never collapse into an infinity. */
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    /* round to nearest even: add 0x7fff plus the lowest kept bit; overflow
     * correctly carries into the exponent (up to infinity). */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (man << 13)); /* inf / NaN */
    if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
    if (man == 0) return f32_from_bits(sign);
    /* subnormal half: man * 2^-24, exact in f32 */
    float v = (float)man * 0x1p-24f;
    return sign ? -v : v;
}

uint16_t f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x1ffu)); /* quiet NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {
        /* result is subnormal (or zero): value / 2^-24 rounded to nearest even integer */
        if (a < 0x33000000u) return sign; /* below half the smallest subnormal: +-0 */
        uint32_t exp = a >> 23;
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - exp; /* value = man * 2^(exp-150); / 2^-24 -> man >> (126-exp) */
        uint32_t q = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q); /* q == 0x400 becomes the smallest normal: still right */
    }
    /* normal: rebias exponent, round mantissa 23 -> 10 bits to nearest even */
    uint32_t r = a - 0x38000000u; /* exponent bias 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}
