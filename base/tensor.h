/* A tensor is dtype, shape, strides, device and data: the one tensor type of
 * every layer (kernels, model, messages, checkpoints), with the one dtype
 * table. Tensors do not own memory: a view into an allocation someone else
 * owns (the model's parameter block, an activation arena, a message
 * payload). The data of a tensor whose device is not the host (see
 * device_is_host) is an address on that device: host code may compute
 * offsets from it but never dereferences it; only the device's backend
 * (kernels/device.h) reads or writes it. */
#ifndef BT_BASE_TENSOR_H
#define BT_BASE_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    DT_F32 = 0,
    DT_F16,
    DT_BF16,
    DT_F64,
    DT_I32,
    DT_I64,
    DT_U8,
    DT_COUNT,
} dtype_t;

/* DEV_FENCED is the test device: host memory that the host cannot touch
 * outside the backend's own calls (kernels/fenced/), so that any direct host
 * access to "device" memory crashes the test that makes it. */
typedef enum { DEV_CPU = 0, DEV_CUDA, DEV_FENCED, DEV_COUNT } device_kind_t;

typedef struct {
    device_kind_t kind;
    int           index; /* CUDA ordinal; 0 on CPU */
} device_t;

#define DEVICE_STR_MAX 16
const char *device_kind_name(device_kind_t k); /* "cpu", "cuda", "fenced" */
/* "cpu", "cuda", "cuda:N", "fenced" -> *out; false for anything else. */
bool        device_parse(const char *s, device_t *out);
/* "cpu", "cuda:1", ... into buf[DEVICE_STR_MAX]; returns buf. */
const char *device_str(device_t d, char *buf);
static inline bool device_eq(device_t a, device_t b)
{
    return a.kind == b.kind && a.index == b.index;
}
/* Whether host code may dereference memory of this device. */
static inline bool device_is_host(device_t d) { return d.kind == DEV_CPU; }

#define TENSOR_MAX_DIMS 4

typedef struct tensor {
    dtype_t  dtype;
    int      ndim;
    int64_t  shape[TENSOR_MAX_DIMS];
    int64_t  stride[TENSOR_MAX_DIMS]; /* in elements */
    device_t device;
    void    *data;
} tensor_t;

static const device_t DEVICE_CPU = {DEV_CPU, 0};

size_t      dtype_size(dtype_t dt);
bool        dtype_is_float(dtype_t dt);   /* f32, f16, bf16, f64 */
const char *dtype_name(dtype_t dt);        /* "f32", "bf16", ... */
int         dtype_parse(const char *name); /* -1 when unknown */

/* A contiguous view; ndim in 1..TENSOR_MAX_DIMS. The _1d.._4d forms are on
 * the host (DEVICE_CPU); tensor_on() moves a view's device tag. */
tensor_t tensor_make(void *data, dtype_t dt, device_t dev, int ndim, const int64_t *shape);
static inline tensor_t tensor_on(tensor_t t, device_t dev)
{
    t.device = dev;
    return t;
}
tensor_t tensor_1d(void *data, dtype_t dt, int64_t d0);
tensor_t tensor_2d(void *data, dtype_t dt, int64_t d0, int64_t d1);
tensor_t tensor_3d(void *data, dtype_t dt, int64_t d0, int64_t d1, int64_t d2);
tensor_t tensor_4d(void *data, dtype_t dt, int64_t d0, int64_t d1, int64_t d2, int64_t d3);

int64_t tensor_numel(const tensor_t *t);
size_t  tensor_nbytes(const tensor_t *t);
bool    tensor_is_contiguous(const tensor_t *t);
bool    tensor_same_shape(const tensor_t *a, const tensor_t *b);
/* rows = product of all but the last dim; cols = last dim */
int64_t tensor_rows(const tensor_t *t);
int64_t tensor_cols(const tensor_t *t);

/* Views (added by the kernels helper). Both panic on misuse.
 * tensor_narrow: rows [start, start+len) of dim 0 of a contiguous tensor; the
 *   result is contiguous and shares t's data.
 * tensor_reshape: the same contiguous data seen with another shape of equal
 *   numel (e.g. [B,T,H,D] as [B*T, H*D]). */
tensor_t tensor_narrow(const tensor_t *t, int64_t start, int64_t len);
tensor_t tensor_reshape(const tensor_t *t, int ndim, const int64_t *shape);

/* bf16/f16 <-> f32 scalar conversions (round to nearest even). */
float    bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
float    f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

#endif
