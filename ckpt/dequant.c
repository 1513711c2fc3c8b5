/* Dequantization of ggml block formats to f32.
 *
 * Each decoder below starts with the byte layout of one block, written from
 * the format's definition. All multi-byte fields are little-endian and
 * blocks have no padding; fields are read byte by byte, so src needs no
 * alignment. The arithmetic is done in f32 in the same order ggml and the
 * `gguf` Python package use (scale products first, then times the quant,
 * then the offset), so results match those references bit for bit; the
 * file is compiled in ISO C mode, where GCC does not contract a*b+c into an
 * FMA, which would change the rounding.
 */
#include "ckpt/dequant.h"

#include <string.h>

#include "base/log.h"

static const dequant_type_info_t dequant_types[DEQUANT_TYPE_COUNT] = {
    [DEQUANT_F32]     = {.name = "F32",     .block = 1,   .block_bytes = 4,   .can_dequant = true},
    [DEQUANT_F16]     = {.name = "F16",     .block = 1,   .block_bytes = 2,   .can_dequant = true},
    [DEQUANT_Q4_0]    = {.name = "Q4_0",    .block = 32,  .block_bytes = 18,  .can_dequant = true},
    [DEQUANT_Q4_1]    = {.name = "Q4_1",    .block = 32,  .block_bytes = 20,  .can_dequant = true},
    [DEQUANT_Q5_0]    = {.name = "Q5_0",    .block = 32,  .block_bytes = 22},
    [DEQUANT_Q5_1]    = {.name = "Q5_1",    .block = 32,  .block_bytes = 24},
    [DEQUANT_Q8_0]    = {.name = "Q8_0",    .block = 32,  .block_bytes = 34,  .can_dequant = true},
    [DEQUANT_Q8_1]    = {.name = "Q8_1",    .block = 32,  .block_bytes = 40},
    [DEQUANT_Q2_K]    = {.name = "Q2_K",    .block = 256, .block_bytes = 84},
    [DEQUANT_Q3_K]    = {.name = "Q3_K",    .block = 256, .block_bytes = 110},
    [DEQUANT_Q4_K]    = {.name = "Q4_K",    .block = 256, .block_bytes = 144, .can_dequant = true},
    [DEQUANT_Q5_K]    = {.name = "Q5_K",    .block = 256, .block_bytes = 176, .can_dequant = true},
    [DEQUANT_Q6_K]    = {.name = "Q6_K",    .block = 256, .block_bytes = 210, .can_dequant = true},
    [DEQUANT_Q8_K]    = {.name = "Q8_K",    .block = 256, .block_bytes = 292},
    [DEQUANT_IQ2_XXS] = {.name = "IQ2_XXS", .block = 256, .block_bytes = 66},
    [DEQUANT_IQ2_XS]  = {.name = "IQ2_XS",  .block = 256, .block_bytes = 74},
    [DEQUANT_IQ3_XXS] = {.name = "IQ3_XXS", .block = 256, .block_bytes = 98},
    [DEQUANT_IQ1_S]   = {.name = "IQ1_S",   .block = 256, .block_bytes = 50},
    [DEQUANT_IQ4_NL]  = {.name = "IQ4_NL",  .block = 32,  .block_bytes = 18},
    [DEQUANT_IQ3_S]   = {.name = "IQ3_S",   .block = 256, .block_bytes = 110},
    [DEQUANT_IQ2_S]   = {.name = "IQ2_S",   .block = 256, .block_bytes = 82},
    [DEQUANT_IQ4_XS]  = {.name = "IQ4_XS",  .block = 256, .block_bytes = 136},
    [DEQUANT_I8]      = {.name = "I8",      .block = 1,   .block_bytes = 1},
    [DEQUANT_I16]     = {.name = "I16",     .block = 1,   .block_bytes = 2},
    [DEQUANT_I32]     = {.name = "I32",     .block = 1,   .block_bytes = 4},
    [DEQUANT_I64]     = {.name = "I64",     .block = 1,   .block_bytes = 8},
    [DEQUANT_F64]     = {.name = "F64",     .block = 1,   .block_bytes = 8},
    [DEQUANT_IQ1_M]   = {.name = "IQ1_M",   .block = 256, .block_bytes = 56},
    [DEQUANT_BF16]    = {.name = "BF16",    .block = 1,   .block_bytes = 2,   .can_dequant = true},
    [DEQUANT_TQ1_0]   = {.name = "TQ1_0",   .block = 256, .block_bytes = 54},
    [DEQUANT_TQ2_0]   = {.name = "TQ2_0",   .block = 256, .block_bytes = 66},
};
_Static_assert(sizeof dequant_types / sizeof dequant_types[0] == DEQUANT_TYPE_COUNT,
               "dequant type table");

static const dequant_type_info_t dequant_type_unknown = {.name = NULL, .block = 0};

const dequant_type_info_t *dequant_type_info(uint32_t type)
{
    if (type >= DEQUANT_TYPE_COUNT || dequant_types[type].block == 0)
        return &dequant_type_unknown;
    return &dequant_types[type];
}

bt_status_t dequant_row_bytes(uint32_t type, int64_t n, uint64_t *out_bytes)
{
    const dequant_type_info_t *ti = dequant_type_info(type);
    if (ti->block == 0) return BT_ERR_UNSUPPORTED;
    if (n < 0 || (uint64_t)n % ti->block != 0) return BT_ERR_INVALID;
    uint64_t blocks = (uint64_t)n / ti->block;
    if (blocks > UINT64_MAX / ti->block_bytes) return BT_ERR_INVALID;
    *out_bytes = blocks * ti->block_bytes;
    return BT_OK;
}

/* ---- scalars ----------------------------------------------------------- */

static inline uint16_t rd_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
float dequant_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) /* inf / NaN: keep the payload */
        return f32_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp != 0)    /* normal: rebias 15 -> 127 */
        return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
    if (man == 0)
        return f32_from_bits(sign);
    /* subnormal: man * 2^-24, normal in f32. Shift the leading one up to
     * bit 10 and lower the exponent by the same count. */
    int e = -14;
    while (!(man & 0x400)) {
        man <<= 1;
        e--;
    }
    man &= 0x3ff;
    return f32_from_bits(sign | ((uint32_t)(e + 127) << 23) | (man << 13));
}

/* bfloat16 is the upper half of an f32. */
float dequant_bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

static inline float rd_f16(const uint8_t *p) { return dequant_f16_to_f32(rd_u16(p)); }

/* ---- 32-element blocks ----------------------------------------------------
 *
 * Q4_0, 18 bytes:  f16 d | u8 qs[16]
 *   element j      (j < 16) = ((qs[j] & 0xF) - 8) * d
 *   element j + 16 (j < 16) = ((qs[j] >> 4)  - 8) * d
 * (the low nibbles hold the first half of the block, the high nibbles the
 * second half, not interleaved neighbours.)
 */
static void dequant_q4_0(const uint8_t *b, int64_t nb, float *y)
{
    for (int64_t i = 0; i < nb; i++, b += 18, y += 32) {
        float d = rd_f16(b);
        const uint8_t *qs = b + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((int)(qs[j] & 0x0f) - 8);
            y[j + 16] = d * (float)((int)(qs[j] >> 4) - 8);
        }
    }
}

/* Q4_1, 20 bytes:  f16 d | f16 m | u8 qs[16]
 *   element j      = (qs[j] & 0xF) * d + m
 *   element j + 16 = (qs[j] >> 4)  * d + m          (unsigned quants, offset m)
 */
static void dequant_q4_1(const uint8_t *b, int64_t nb, float *y)
{
    for (int64_t i = 0; i < nb; i++, b += 20, y += 32) {
        float d = rd_f16(b), m = rd_f16(b + 2);
        const uint8_t *qs = b + 4;
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(qs[j] & 0x0f) + m;
            y[j + 16] = d * (float)(qs[j] >> 4) + m;
        }
    }
}

/* Q8_0, 34 bytes:  f16 d | i8 qs[32]
 *   element j = qs[j] * d
 */
static void dequant_q8_0(const uint8_t *b, int64_t nb, float *y)
{
    for (int64_t i = 0; i < nb; i++, b += 34, y += 32) {
        float d = rd_f16(b);
        for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)b[2 + j];
    }
}

/* ---- K-quants: 256-element super-blocks ------------------------------------
 *
 * Q4_K and Q5_K split a super-block into 8 sub-blocks of 32 elements, each
 * with its own 6-bit scale sc[s] and 6-bit min mn[s]; the super-block holds
 * f16 d and dmin, and element value = (d * sc[s]) * q - (dmin * mn[s]).
 *
 * The 16 six-bit numbers are packed into 12 bytes `scales`:
 *   bytes 0..3  : low 6 bits = sc[0..3];  top 2 bits = bits 4..5 of sc[4..7]
 *   bytes 4..7  : low 6 bits = mn[0..3];  top 2 bits = bits 4..5 of mn[4..7]
 *   bytes 8..11 : low nibble = bits 0..3 of sc[4..7],
 *                 high nibble = bits 0..3 of mn[4..7]
 */
static void kquant_scale_min(const uint8_t *scales, int s, uint8_t *sc, uint8_t *mn)
{
    if (s < 4) {
        *sc = scales[s] & 63;
        *mn = scales[s + 4] & 63;
    } else {
        *sc = (uint8_t)((scales[s + 4] & 0x0f) | ((scales[s - 4] >> 6) << 4));
        *mn = (uint8_t)((scales[s + 4] >> 4) | ((scales[s] >> 6) << 4));
    }
}

/* Q4_K, 144 bytes:  f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
 *   qs holds 4 groups of 32 bytes; group g (elements 64g .. 64g+63) stores
 *   sub-block 2g in the low nibbles and sub-block 2g+1 in the high nibbles:
 *   element 64g + l      = low  nibble of qs[32g + l]   (sub-block 2g)
 *   element 64g + 32 + l = high nibble of qs[32g + l]   (sub-block 2g+1)
 */
static void dequant_q4_k(const uint8_t *b, int64_t nb, float *y)
{
    for (int64_t i = 0; i < nb; i++, b += 144) {
        float d = rd_f16(b), dmin = rd_f16(b + 2);
        const uint8_t *scales = b + 4, *qs = b + 16;
        for (int g = 0; g < 4; g++, qs += 32, y += 64) {
            uint8_t sc, mn;
            kquant_scale_min(scales, 2 * g, &sc, &mn);
            float d1 = d * (float)sc, m1 = dmin * (float)mn;
            kquant_scale_min(scales, 2 * g + 1, &sc, &mn);
            float d2 = d * (float)sc, m2 = dmin * (float)mn;
            for (int l = 0; l < 32; l++) {
                y[l] = d1 * (float)(qs[l] & 0x0f) - m1;
                y[l + 32] = d2 * (float)(qs[l] >> 4) - m2;
            }
        }
    }
}

/* Q5_K, 176 bytes:  f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
 *   Like Q4_K with a fifth bit per element: element l of sub-block s
 *   (l < 32) takes bit s of qh[l] as bit 4 of its quant:
 *   q = nibble (as in Q4_K) | (((qh[l] >> s) & 1) << 4), 0..31.
 */
static void dequant_q5_k(const uint8_t *b, int64_t nb, float *y)
{
    for (int64_t i = 0; i < nb; i++, b += 176) {
        float d = rd_f16(b), dmin = rd_f16(b + 2);
        const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + 48;
        for (int g = 0; g < 4; g++, qs += 32, y += 64) {
            uint8_t sc, mn;
            kquant_scale_min(scales, 2 * g, &sc, &mn);
            float d1 = d * (float)sc, m1 = dmin * (float)mn;
            kquant_scale_min(scales, 2 * g + 1, &sc, &mn);
            float d2 = d * (float)sc, m2 = dmin * (float)mn;
            int s1 = 2 * g, s2 = 2 * g + 1;
            for (int l = 0; l < 32; l++) {
                int q1 = (qs[l] & 0x0f) | (((qh[l] >> s1) & 1) << 4);
                int q2 = (qs[l] >> 4) | (((qh[l] >> s2) & 1) << 4);
                y[l] = d1 * (float)q1 - m1;
                y[l + 32] = d2 * (float)q2 - m2;
            }
        }
    }
}

/* Q6_K, 210 bytes:  u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d
 *   16 sub-blocks of 16 elements, each with a signed 8-bit scale; quants
 *   are 6 bits (low 4 in ql, high 2 in qh) minus 32, so -32..31:
 *   value = (d * scales[s]) * q.
 *   The super-block is two halves of 128 elements; half h uses ql[64h ..],
 *   qh[32h ..], scales[8h ..]. Within a half, for l < 32:
 *     element l      : ql[l]      low  nibble, qh[l] bits 0..1
 *     element l + 32 : ql[l + 32] low  nibble, qh[l] bits 2..3
 *     element l + 64 : ql[l]      high nibble, qh[l] bits 4..5
 *     element l + 96 : ql[l + 32] high nibble, qh[l] bits 6..7
 *   and element e of the half (0..127) uses scale scales[8h + e / 16].
 */
static void dequant_q6_k(const uint8_t *b, int64_t nb, float *y)
{
    for (int64_t i = 0; i < nb; i++, b += 210) {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *scales = (const int8_t *)(b + 192);
        float d = rd_f16(b + 208);
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, scales += 8, y += 128) {
            for (int l = 0; l < 32; l++) {
                int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                int s = l / 16;
                y[l] = (d * (float)scales[s]) * (float)q1;
                y[l + 32] = (d * (float)scales[s + 2]) * (float)q2;
                y[l + 64] = (d * (float)scales[s + 4]) * (float)q3;
                y[l + 96] = (d * (float)scales[s + 6]) * (float)q4;
            }
        }
    }
}

bt_status_t dequant_row_f32(uint32_t type, const void *src, int64_t n, float *out)
{
    const dequant_type_info_t *ti = dequant_type_info(type);
    if (ti->block == 0 || !ti->can_dequant) return BT_ERR_UNSUPPORTED;
    if (n < 0 || (uint64_t)n % ti->block != 0) return BT_ERR_INVALID;
    const uint8_t *b = src;
    int64_t nb = n / ti->block;
    switch ((dequant_type_t)type) {
    case DEQUANT_F32:
        memcpy(out, b, (size_t)n * sizeof(float));
        break;
    case DEQUANT_F16:
        for (int64_t i = 0; i < n; i++) out[i] = rd_f16(b + 2 * i);
        break;
    case DEQUANT_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = dequant_bf16_to_f32(rd_u16(b + 2 * i));
        break;
    case DEQUANT_Q4_0: dequant_q4_0(b, nb, out); break;
    case DEQUANT_Q4_1: dequant_q4_1(b, nb, out); break;
    case DEQUANT_Q8_0: dequant_q8_0(b, nb, out); break;
    case DEQUANT_Q4_K: dequant_q4_k(b, nb, out); break;
    case DEQUANT_Q5_K: dequant_q5_k(b, nb, out); break;
    case DEQUANT_Q6_K: dequant_q6_k(b, nb, out); break;
    default:
        BT_PANIC("dequant type %u marked can_dequant without a decoder", type);
    }
    return BT_OK;
}
