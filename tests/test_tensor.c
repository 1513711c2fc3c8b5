/* kernels/tensor.c: dtypes, views, bf16/f16 conversions. The conversion
 * references are built from first principles (ldexp decoding, nearest
 * representable by exhaustive neighbour search), not from the code tested. */
#include "base/tensor.h"
#include "tests/test_kernels_common.h"

#include <float.h>

static void test_dtype_table(void)
{
    CHECK(dtype_size(DT_F32) == 4 && dtype_size(DT_F16) == 2 && dtype_size(DT_BF16) == 2);
    CHECK(dtype_size(DT_F64) == 8 && dtype_size(DT_I32) == 4 && dtype_size(DT_I64) == 8);
    CHECK(dtype_size(DT_U8) == 1);
    for (int d = 0; d < DT_COUNT; d++) CHECK(dtype_parse(dtype_name((dtype_t)d)) == d);
    CHECK(dtype_parse("bf16") == DT_BF16);
    CHECK(dtype_parse("float32") == -1);
    CHECK(dtype_parse("") == -1);
    CHECK(dtype_parse(NULL) == -1);
    CHECK(!strcmp(dtype_name((dtype_t)99), "invalid"));
}

static void test_tensor_views(void)
{
    float buf[2 * 3 * 4 * 5];
    tensor_t t = tensor_4d(buf, DT_F32, 2, 3, 4, 5);
    CHECK(t.ndim == 4 && t.stride[3] == 1 && t.stride[2] == 5 && t.stride[1] == 20 &&
          t.stride[0] == 60);
    CHECK(tensor_numel(&t) == 120 && tensor_nbytes(&t) == 480);
    CHECK(tensor_rows(&t) == 24 && tensor_cols(&t) == 5);
    CHECK(tensor_is_contiguous(&t));
    CHECK(t.device.kind == DEV_CPU);

    tensor_t n = tensor_narrow(&t, 1, 1);
    CHECK(n.shape[0] == 1 && n.data == buf + 60 && tensor_is_contiguous(&n));
    int64_t shp[2] = {6, 20};
    tensor_t r = tensor_reshape(&t, 2, shp);
    CHECK(r.ndim == 2 && r.shape[0] == 6 && r.stride[0] == 20 && r.data == buf);
    CHECK(!tensor_same_shape(&r, &t));
    tensor_t r2 = tensor_2d(buf, DT_F32, 6, 20);
    CHECK(tensor_same_shape(&r, &r2));

    tensor_t s = t; /* a transposed view is not contiguous */
    s.shape[2] = 5;
    s.shape[3] = 4;
    s.stride[2] = 1;
    s.stride[3] = 5;
    CHECK(!tensor_is_contiguous(&s));
    tensor_t one = tensor_3d(buf, DT_F32, 4, 1, 5); /* size-1 dims may carry any stride */
    one.stride[1] = 12345;
    CHECK(tensor_is_contiguous(&one));
    tensor_t i = tensor_1d(buf, DT_I64, 7);
    CHECK(tensor_nbytes(&i) == 56 && tensor_rows(&i) == 1 && tensor_cols(&i) == 7);
}

static void narrow_bad(void *arg)
{
    tensor_t *t = arg;
    (void)tensor_narrow(t, 2, 2);
}

static void reshape_bad(void *arg)
{
    tensor_t *t = arg;
    int64_t s[2] = {5, 5};
    (void)tensor_reshape(t, 2, s);
}

static void test_tensor_view_misuse_panics(void)
{
    float buf[12];
    tensor_t t = tensor_2d(buf, DT_F32, 3, 4);
    CHECK(kt_panics(narrow_bad, &t, "tensor_narrow"));
    CHECK(kt_panics(reshape_bad, &t, "tensor_reshape: numel 25"));
}

/* Decoding from the bit fields with ldexp: independent of the code tested. */
static double ref_f16_decode(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp(m, -24);
    else v = ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static double ref_bf16_decode(uint16_t h)
{
    int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v;
    if (e == 255) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp(m, -133);
    else v = ldexp(128 + m, e - 134);
    return s ? -v : v;
}

static void test_half_decode_exhaustive(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        double want = ref_f16_decode((uint16_t)h);
        double got = f16_to_f32((uint16_t)h);
        if (isnan(want) ? !isnan(got) : (got != want || signbit(got) != signbit(want))) bad++;
        want = ref_bf16_decode((uint16_t)h);
        got = bf16_to_f32((uint16_t)h);
        if (isnan(want) ? !isnan(got) : (got != want || signbit(got) != signbit(want))) bad++;
    }
    CHECK_MSG(bad == 0, "%d decodes differ", bad);
}

/* Reference encoder: the nearest finite code by search over the ordered
 * positive codes (ties to even mantissa); overflow past max + half ulp is inf. */
static uint16_t ref_encode(float f, double (*decode)(uint16_t), uint16_t inf_code)
{
    double a = fabs((double)f);
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    uint16_t lo = 0, hi = inf_code; /* codes 0..inf_code-1 are finite, increasing */
    while (hi - lo > 1) {
        uint16_t mid = (uint16_t)((lo + hi) / 2);
        if (decode(mid) <= a) lo = mid;
        else hi = mid;
    }
    /* decode(lo) <= a < decode(lo+1) (lo+1 may be inf_code) */
    double below = decode(lo);
    double above = lo + 1 < inf_code ? decode((uint16_t)(lo + 1))
                                     : decode((uint16_t)(inf_code - 1)) * 2 - decode((uint16_t)(inf_code - 2));
    uint16_t code;
    if (a - below < above - a) code = lo;
    else if (a - below > above - a) code = (uint16_t)(lo + 1);
    else code = (lo & 1) ? (uint16_t)(lo + 1) : lo;
    return sign | code;
}

static void test_half_encode_rounding(void)
{
    kt_rng_t rng = {42};
    int bad16 = 0, badbf = 0;
    for (int i = 0; i < 200000; i++) {
        float f;
        switch (i % 4) {
        case 0: f = (float)kt_uniform(&rng, -70000, 70000); break;                  /* overflow edge */
        case 1: f = (float)ldexp(kt_uniform(&rng, -1, 1), (int)kt_int(&rng, 40) - 30); break; /* subnormals */
        case 2: { /* exact ties and near ties of f16 */
            uint16_t h = (uint16_t)kt_int(&rng, 0x7bff);
            double mid = (ref_f16_decode(h) + ref_f16_decode((uint16_t)(h + 1))) / 2;
            f = (float)mid;
            if (kt_int(&rng, 3) == 0) f = nextafterf(f, 0);
            if (kt_int(&rng, 3) == 0) f = nextafterf(f, INFINITY);
            break;
        }
        default: { /* random bit patterns: every exponent, incl. bf16 ties */
            uint32_t u = (uint32_t)kt_next(&rng);
            if (kt_int(&rng, 2)) u = (u & 0xffff0000u) | 0x8000u;
            memcpy(&f, &u, 4);
            if (isnan(f)) f = 1.0f;
            break;
        }
        }
        if (f32_to_f16(f) != ref_encode(f, ref_f16_decode, 0x7c00)) {
            if (bad16++ < 5)
                fprintf(stderr, "  f16(%a): got %04x want %04x\n", (double)f, f32_to_f16(f),
                        ref_encode(f, ref_f16_decode, 0x7c00));
        }
        if (f32_to_bf16(f) != ref_encode(f, ref_bf16_decode, 0x7f80)) {
            if (badbf++ < 5)
                fprintf(stderr, "  bf16(%a): got %04x want %04x\n", (double)f, f32_to_bf16(f),
                        ref_encode(f, ref_bf16_decode, 0x7f80));
        }
    }
    CHECK_MSG(bad16 == 0, "%d f16 encodes differ", bad16);
    CHECK_MSG(badbf == 0, "%d bf16 encodes differ", badbf);
    /* hand-picked edges */
    CHECK(f32_to_f16(65504.0f) == 0x7bff);
    CHECK(f32_to_f16(65519.99f) == 0x7bff);
    CHECK(f32_to_f16(65520.0f) == 0x7c00);
    CHECK(f32_to_f16(INFINITY) == 0x7c00 && f32_to_f16(-INFINITY) == 0xfc00);
    CHECK(f32_to_f16(0x1p-25f) == 0x0000);           /* tie to even: 0 */
    CHECK(f32_to_f16(nextafterf(0x1p-25f, 1)) == 0x0001);
    CHECK(f32_to_f16(0x1.8p-24f) == 0x0002);         /* 1.5 ulp ties to 2 */
    CHECK(f32_to_f16(-0.0f) == 0x8000);
    CHECK(f32_to_bf16(FLT_MAX) == 0x7f80);          /* rounds up past the max bf16 */
    CHECK(f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);   /* tie, even stays */
    CHECK(f32_to_bf16(1.0f + 0x3p-8f) == 0x3f82);   /* tie, odd rounds up */
}

static void test_half_nan_roundtrip(void)
{
    uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7f810000u, 0xff800001u, 0x7fffffffu};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        float f;
        memcpy(&f, &nans[i], 4);
        uint16_t b = f32_to_bf16(f), h = f32_to_f16(f);
        CHECK_MSG(isnan(bf16_to_f32(b)), "bf16 of NaN %08x gave %04x", nans[i], b);
        CHECK_MSG(isnan(f16_to_f32(h)), "f16 of NaN %08x gave %04x", nans[i], h);
        CHECK((b >> 15) == (nans[i] >> 31) && (h >> 15) == (nans[i] >> 31)); /* sign kept */
    }
    /* every half value survives a round trip through f32 */
    int bad = 0;
    for (uint32_t c = 0; c < 65536; c++) {
        uint16_t h = (uint16_t)c;
        bool is_nan16 = ((h >> 10) & 31) == 31 && (h & 1023);
        bool is_nanbf = ((h >> 7) & 255) == 255 && (h & 127);
        if (!is_nan16 && f32_to_f16(f16_to_f32(h)) != h) bad++;
        if (!is_nanbf && f32_to_bf16(bf16_to_f32(h)) != h) bad++;
    }
    CHECK_MSG(bad == 0, "%d round trips differ", bad);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_dtype_table, test_tensor_views, test_tensor_view_misuse_panics,
             test_half_decode_exhaustive, test_half_encode_rounding, test_half_nan_roundtrip);
}
