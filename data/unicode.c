#include "data/unicode.h"

#include <stdlib.h>
#include <string.h>

uint32_t uni_utf8_decode(const uint8_t *s, size_t n, size_t *len)
{
    uint8_t b = s[0];
    *len = 1;
    if (b < 0x80) return b;
    size_t need;
    uint32_t cp, min;
    if (b >= 0xC2 && b <= 0xDF) { need = 1; cp = b & 0x1F; min = 0x80; }
    else if (b >= 0xE0 && b <= 0xEF) { need = 2; cp = b & 0x0F; min = 0x800; }
    else if (b >= 0xF0 && b <= 0xF4) { need = 3; cp = b & 0x07; min = 0x10000; }
    else return UNI_INVALID_BYTE;
    if (n < need + 1) return UNI_INVALID_BYTE;
    for (size_t i = 1; i <= need; i++) {
        if ((s[i] & 0xC0) != 0x80) return UNI_INVALID_BYTE;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return UNI_INVALID_BYTE;
    *len = need + 1;
    return cp;
}

size_t uni_utf8_encode(uint32_t cp, uint8_t *out)
{
    if (cp < 0x80) { out[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

static int uni_range_find(const uni_range_t *r, size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid].lo) hi = mid;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return 1;
    }
    return 0;
}

int uni_is_letter(uint32_t cp)
{
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    return cp != UNI_INVALID_BYTE && uni_range_find(uni_letter, uni_letter_len, cp);
}

int uni_is_number(uint32_t cp)
{
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return cp != UNI_INVALID_BYTE && uni_range_find(uni_number, uni_number_len, cp);
}

int uni_is_space(uint32_t cp)
{
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
    return cp != UNI_INVALID_BYTE && uni_range_find(uni_space, uni_space_len, cp);
}

int uni_is_numeric(uint32_t cp)
{
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return cp != UNI_INVALID_BYTE && uni_range_find(uni_numeric, uni_numeric_len, cp);
}

/* ---- NFC ---- */

enum { HANGUL_SBASE = 0xAC00, HANGUL_LBASE = 0x1100, HANGUL_VBASE = 0x1161,
       HANGUL_TBASE = 0x11A7, HANGUL_LCOUNT = 19, HANGUL_VCOUNT = 21, HANGUL_TCOUNT = 28,
       HANGUL_NCOUNT = HANGUL_VCOUNT * HANGUL_TCOUNT,
       HANGUL_SCOUNT = HANGUL_LCOUNT * HANGUL_NCOUNT };

/* Invalid input bytes travel through NFC tagged with this bit: never combining,
 * never composing, written back as the byte itself. */
#define NFC_RAW_BYTE 0x80000000u

static uint8_t uni_ccc_of(uint32_t cp)
{
    if (cp < 0x300 || (cp & NFC_RAW_BYTE)) return 0;
    size_t lo = 0, hi = uni_ccc_len;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < uni_ccc[mid].lo) hi = mid;
        else if (cp > uni_ccc[mid].hi) lo = mid + 1;
        else return uni_ccc[mid].ccc;
    }
    return 0;
}

static const uni_decomp_t *uni_decomp_find(uint32_t cp)
{
    size_t lo = 0, hi = uni_decomp_len;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < uni_decomp[mid].cp) hi = mid;
        else if (cp > uni_decomp[mid].cp) lo = mid + 1;
        else return &uni_decomp[mid];
    }
    return NULL;
}

static uint32_t uni_compose_pair(uint32_t a, uint32_t b)
{
    if (a >= HANGUL_LBASE && a < HANGUL_LBASE + HANGUL_LCOUNT &&
        b >= HANGUL_VBASE && b < HANGUL_VBASE + HANGUL_VCOUNT)
        return HANGUL_SBASE + ((a - HANGUL_LBASE) * HANGUL_VCOUNT + (b - HANGUL_VBASE)) * HANGUL_TCOUNT;
    if (a >= HANGUL_SBASE && a < HANGUL_SBASE + HANGUL_SCOUNT &&
        (a - HANGUL_SBASE) % HANGUL_TCOUNT == 0 &&
        b > HANGUL_TBASE && b < HANGUL_TBASE + HANGUL_TCOUNT)
        return a + (b - HANGUL_TBASE);
    size_t lo = 0, hi = uni_comp_len;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uni_comp_t *c = &uni_comp[mid];
        if (a < c->first || (a == c->first && b < c->second)) hi = mid;
        else if (a > c->first || b > c->second) lo = mid + 1;
        else return c->composite;
    }
    return 0;
}

int uni_nfc(const uint8_t *s, size_t n, uint8_t **out, size_t *out_len)
{
    /* Fast path: below U+0300 nothing decomposes or combines (the table
     * generator asserts it), and 0xCC is the first lead byte at or above it. */
    size_t i = 0;
    while (i < n && s[i] < 0xCC) i++;
    if (i == n) {
        uint8_t *copy = malloc(n ? n : 1);
        if (!copy) return -1;
        memcpy(copy, s, n);
        *out = copy;
        *out_len = n;
        return 0;
    }
    /* A full decomposition is at most 4 code points per input byte (U+1D160
     * etc. decompose to 3 from 4 bytes; Hangul to 3 from 3). */
    uint32_t *cps = malloc((n * 4 + 1) * sizeof *cps);
    if (!cps) return -1;
    size_t m = 0;
    for (i = 0; i < n;) {
        size_t len;
        uint32_t cp = uni_utf8_decode(s + i, n - i, &len);
        if (cp == UNI_INVALID_BYTE) {
            cps[m++] = NFC_RAW_BYTE | s[i];
        } else if (cp >= HANGUL_SBASE && cp < HANGUL_SBASE + HANGUL_SCOUNT) {
            uint32_t si = cp - HANGUL_SBASE;
            cps[m++] = HANGUL_LBASE + si / HANGUL_NCOUNT;
            cps[m++] = HANGUL_VBASE + (si % HANGUL_NCOUNT) / HANGUL_TCOUNT;
            if (si % HANGUL_TCOUNT) cps[m++] = HANGUL_TBASE + si % HANGUL_TCOUNT;
        } else {
            const uni_decomp_t *d = cp >= 0xC0 ? uni_decomp_find(cp) : NULL;
            if (d) {
                memcpy(cps + m, uni_decomp_pool + d->off, d->len * sizeof *cps);
                m += d->len;
            } else {
                cps[m++] = cp;
            }
        }
        i += len;
    }
    /* canonical ordering: stable sort of each run of non-starters by class */
    for (size_t k = 1; k < m; k++) {
        uint8_t c = uni_ccc_of(cps[k]);
        if (!c) continue;
        size_t j = k;
        uint32_t v = cps[k];
        while (j > 0 && uni_ccc_of(cps[j - 1]) > c) {
            cps[j] = cps[j - 1];
            j--;
        }
        cps[j] = v;
    }
    /* canonical composition */
    size_t w = 0;
    long starter = -1;
    int last_ccc = -1; /* class of the last char kept after the starter; -1: none */
    for (size_t k = 0; k < m; k++) {
        uint32_t c = cps[k];
        int cc = uni_ccc_of(c);
        if (starter >= 0 && !(c & NFC_RAW_BYTE) && !(cps[starter] & NFC_RAW_BYTE) &&
            (last_ccc == -1 || last_ccc < cc)) {
            uint32_t comp = uni_compose_pair(cps[starter], c);
            if (comp) {
                cps[starter] = comp;
                continue;
            }
        }
        if (cc == 0) {
            starter = (long)w;
            last_ccc = -1;
        } else {
            last_ccc = cc;
        }
        cps[w++] = c;
    }
    uint8_t *res = malloc(w * 4 + 1);
    if (!res) {
        free(cps);
        return -1;
    }
    size_t o = 0;
    for (size_t k = 0; k < w; k++) {
        if (cps[k] & NFC_RAW_BYTE) res[o++] = (uint8_t)(cps[k] & 0xFF);
        else o += uni_utf8_encode(cps[k], res + o);
    }
    free(cps);
    *out = res;
    *out_len = o;
    return 0;
}
