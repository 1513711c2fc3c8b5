/* Unicode properties and NFC for the tokenizer's pre-tokenizer and normalizer.
 *
 * Tables come from tools/gen_unicode_tables.py (Python's unicodedata, with
 * the class membership of characters newer than its Unicode 14 measured from
 * HF tokenizers' own regex engine and Rust std); the generated
 * data/unicode_tables.c is committed. Invalid UTF-8 is never an
 * error here: uni_utf8_decode() returns one byte as the code point
 * UNI_INVALID_BYTE, which has no letter/number/space property, so that byte
 * runs still split and round-trip byte for byte. */
#ifndef BT_DATA_UNICODE_H
#define BT_DATA_UNICODE_H

#include <stddef.h>
#include <stdint.h>

#define UNI_INVALID_BYTE 0xFFFFFFFFu

typedef struct { uint32_t lo, hi; } uni_range_t;
typedef struct { uint32_t lo, hi; uint8_t ccc; } uni_ccc_range_t;
typedef struct { uint32_t cp; uint32_t off; uint32_t len; } uni_decomp_t;
typedef struct { uint32_t first, second, composite; } uni_comp_t;

extern const char uni_table_version[];
extern const uni_range_t uni_letter[], uni_number[], uni_space[], uni_numeric[];
extern const size_t uni_letter_len, uni_number_len, uni_space_len, uni_numeric_len;
extern const uni_ccc_range_t uni_ccc[];
extern const size_t uni_ccc_len;
extern const uint32_t uni_decomp_pool[];
extern const uni_decomp_t uni_decomp[];
extern const size_t uni_decomp_len;
extern const uni_comp_t uni_comp[];
extern const size_t uni_comp_len;

/* Decodes one code point at s[0..n) (n >= 1); stores its byte length. */
uint32_t uni_utf8_decode(const uint8_t *s, size_t n, size_t *len);
/* Encodes cp into out (4 bytes room); returns the byte count. */
size_t uni_utf8_encode(uint32_t cp, uint8_t *out);

int uni_is_letter(uint32_t cp);  /* \p{L} */
int uni_is_number(uint32_t cp);  /* \p{N} */
int uni_is_space(uint32_t cp);   /* \s (White_Space) */
int uni_is_numeric(uint32_t cp); /* Rust's char::is_numeric (HF's Digits) */

/* NFC of s[0..n) into a malloc'd buffer *out of *out_len bytes (not
 * NUL-terminated). Returns 0, or -1 when out of memory. */
int uni_nfc(const uint8_t *s, size_t n, uint8_t **out, size_t *out_len);

#endif
