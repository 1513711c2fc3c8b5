/* ggml tensor element types and their dequantization to f32.
 *
 * The numeric values of dequant_type_t are the ggml type ids stored in GGUF
 * tensor infos (they are a file format, so they never change). Every type
 * is stored in blocks: `block` elements packed into `block_bytes` bytes;
 * a row of n elements (n a multiple of `block`) takes n / block *
 * block_bytes bytes, blocks back to back, little-endian.
 *
 * dequant_type_info() knows the block geometry of more types than we can
 * dequantize, so that a GGUF file holding, say, an IQ2 tensor still opens
 * and its other tensors stay readable; dequant_row_f32() on such a type
 * answers BT_ERR_UNSUPPORTED.
 *
 * The block layouts of the types we dequantize are documented in dequant.c
 * next to their decoders.
 */
#ifndef BT_CKPT_DEQUANT_H
#define BT_CKPT_DEQUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef enum {
    DEQUANT_F32     = 0,
    DEQUANT_F16     = 1,
    DEQUANT_Q4_0    = 2,
    DEQUANT_Q4_1    = 3,
    /* 4, 5: Q4_2, Q4_3, removed from ggml long ago */
    DEQUANT_Q5_0    = 6,
    DEQUANT_Q5_1    = 7,
    DEQUANT_Q8_0    = 8,
    DEQUANT_Q8_1    = 9,
    DEQUANT_Q2_K    = 10,
    DEQUANT_Q3_K    = 11,
    DEQUANT_Q4_K    = 12,
    DEQUANT_Q5_K    = 13,
    DEQUANT_Q6_K    = 14,
    DEQUANT_Q8_K    = 15,
    DEQUANT_IQ2_XXS = 16,
    DEQUANT_IQ2_XS  = 17,
    DEQUANT_IQ3_XXS = 18,
    DEQUANT_IQ1_S   = 19,
    DEQUANT_IQ4_NL  = 20,
    DEQUANT_IQ3_S   = 21,
    DEQUANT_IQ2_S   = 22,
    DEQUANT_IQ4_XS  = 23,
    DEQUANT_I8      = 24,
    DEQUANT_I16     = 25,
    DEQUANT_I32     = 26,
    DEQUANT_I64     = 27,
    DEQUANT_F64     = 28,
    DEQUANT_IQ1_M   = 29,
    DEQUANT_BF16    = 30,
    /* 31..33: Q4_0_4_4 etc., removed from ggml */
    DEQUANT_TQ1_0   = 34,
    DEQUANT_TQ2_0   = 35,
    DEQUANT_TYPE_COUNT = 36, /* ids >= this are unknown to us */
} dequant_type_t;

typedef struct {
    const char *name;        /* "Q4_K"; NULL for an id that is not a type */
    uint32_t    block;       /* elements per block (0: not a type) */
    uint32_t    block_bytes; /* bytes per block */
    bool        can_dequant; /* dequant_row_f32 handles it */
} dequant_type_info_t;

/* Block geometry of ggml type id `type` (any uint32). For an id we do not
 * know, the result has name NULL and block 0. Never NULL. */
const dequant_type_info_t *dequant_type_info(uint32_t type);

/* Bytes a row of n elements of `type` takes; BT_ERR_INVALID when n is not a
 * multiple of the block size or the size overflows, BT_ERR_UNSUPPORTED for an
 * unknown type. Logs nothing (the caller knows the context). */
bt_status_t dequant_row_bytes(uint32_t type, int64_t n, uint64_t *out_bytes);

/* Decodes n elements (a multiple of the block size) of `type` from src
 * (dequant_row_bytes(type, n) bytes, any alignment) into out[n].
 * BT_ERR_UNSUPPORTED for a type we cannot dequantize, BT_ERR_INVALID for a
 * bad n. Logs nothing. */
bt_status_t dequant_row_f32(uint32_t type, const void *src, int64_t n, float *out);

/* IEEE binary16 and bfloat16 bit patterns to f32, exact (subnormals, inf and
 * NaN included). */
float dequant_f16_to_f32(uint16_t h);
float dequant_bf16_to_f32(uint16_t h);

#endif
