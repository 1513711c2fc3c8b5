/* GGUF reader: header, metadata, tensor infos (see gguf.h for the layout).
 *
 * Parsing is a cursor over the mapped bytes. Every read first checks that
 * the bytes are there; every count is checked against the bytes that remain
 * (each element needs at least its minimum encoded size) before anything is
 * allocated from it, so a hostile count can never ask for more memory than
 * a small multiple of the file size. The first problem is logged once with
 * the file name, what was being read and its byte offset.
 */
#include "ckpt/gguf.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"

/* ---- value types ------------------------------------------------------------ */

static const struct {
    const char *name;
    uint32_t    size;     /* encoded size of a fixed-size value; 0 otherwise */
    uint32_t    min_size; /* fewest bytes one value can take */
} gguf_types[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_U8]     = {"u8", 1, 1},
    [GGUF_TYPE_I8]     = {"i8", 1, 1},
    [GGUF_TYPE_U16]    = {"u16", 2, 2},
    [GGUF_TYPE_I16]    = {"i16", 2, 2},
    [GGUF_TYPE_U32]    = {"u32", 4, 4},
    [GGUF_TYPE_I32]    = {"i32", 4, 4},
    [GGUF_TYPE_F32]    = {"f32", 4, 4},
    [GGUF_TYPE_BOOL]   = {"bool", 1, 1},
    [GGUF_TYPE_STRING] = {"string", 0, 8},      /* u64 length */
    [GGUF_TYPE_ARRAY]  = {"array", 0, 12},      /* u32 type + u64 count */
    [GGUF_TYPE_U64]    = {"u64", 8, 8},
    [GGUF_TYPE_I64]    = {"i64", 8, 8},
    [GGUF_TYPE_F64]    = {"f64", 8, 8},
};
_Static_assert(sizeof gguf_types / sizeof gguf_types[0] == GGUF_TYPE_COUNT, "gguf type table");

const char *gguf_type_name(gguf_type_t t)
{
    return (unsigned)t < GGUF_TYPE_COUNT ? gguf_types[t].name : "unknown";
}

/* ---- cursor ----------------------------------------------------------------- */

typedef struct {
    const uint8_t *base;
    uint64_t       size;
    uint64_t       pos;
    const char    *path;
    char           what[256]; /* what is being read, for messages */
} gguf_cursor_t;

static void cursor_what(gguf_cursor_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cursor_what(gguf_cursor_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->what, sizeof c->what, fmt, ap);
    va_end(ap);
}

static uint64_t cursor_left(const gguf_cursor_t *c) { return c->size - c->pos; }

/* Checks that n bytes remain; logs the truncation otherwise. */
static bt_status_t cursor_need(gguf_cursor_t *c, uint64_t n, const char *field)
{
    if (n <= cursor_left(c)) return BT_OK;
    log_error("gguf: %s: truncated: reading %s%s%s at offset %" PRIu64 " needs %" PRIu64
              " bytes, only %" PRIu64 " remain (file size %" PRIu64 ")",
              c->path, c->what, c->what[0] ? ": " : "", field, c->pos, n, cursor_left(c), c->size);
    return BT_ERR_INVALID;
}

static uint64_t le_get(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static bt_status_t cursor_uint(gguf_cursor_t *c, int n, const char *field, uint64_t *out)
{
    bt_status_t st = cursor_need(c, (uint64_t)n, field);
    if (st != BT_OK) return st;
    *out = le_get(c->base + c->pos, n);
    c->pos += (uint64_t)n;
    return BT_OK;
}

static bt_status_t cursor_u32(gguf_cursor_t *c, const char *field, uint32_t *out)
{
    uint64_t v;
    bt_status_t st = cursor_uint(c, 4, field, &v);
    if (st == BT_OK) *out = (uint32_t)v;
    return st;
}

static bt_status_t cursor_u64(gguf_cursor_t *c, const char *field, uint64_t *out)
{
    return cursor_uint(c, 8, field, out);
}

/* A string: u64 length then bytes, the bytes checked to be in the file. */
static bt_status_t cursor_str(gguf_cursor_t *c, const char *field, uint64_t max_len,
                              gguf_str_t *out)
{
    uint64_t at = c->pos, len;
    bt_status_t st = cursor_u64(c, field, &len);
    if (st != BT_OK) return st;
    if (len > max_len) {
        log_error("gguf: %s: %s%s%s at offset %" PRIu64 ": length %" PRIu64 " exceeds the limit %" PRIu64,
                  c->path, c->what, c->what[0] ? ": " : "", field, at, len, max_len);
        return BT_ERR_INVALID;
    }
    if (len > cursor_left(c)) {
        log_error("gguf: %s: %s%s%s at offset %" PRIu64 ": length %" PRIu64
                  " runs past the end of the file (%" PRIu64 " bytes remain)",
                  c->path, c->what, c->what[0] ? ": " : "", field, at, len, cursor_left(c));
        return BT_ERR_INVALID;
    }
    out->ptr = (const char *)c->base + c->pos;
    out->len = len;
    c->pos += len;
    return BT_OK;
}

/* Rejects a count of elements that cannot fit in the bytes that remain. */
static bt_status_t cursor_count_fits(gguf_cursor_t *c, uint64_t count, uint64_t min_size,
                                     uint64_t at, const char *field)
{
    if (min_size == 0 || count <= cursor_left(c) / min_size) return BT_OK;
    log_error("gguf: %s: %s%s%s at offset %" PRIu64 ": count %" PRIu64
              " cannot fit in the %" PRIu64 " bytes that remain",
              c->path, c->what, c->what[0] ? ": " : "", field, at, count, cursor_left(c));
    return BT_ERR_INVALID;
}

/* ---- values ----------------------------------------------------------------- */

static void value_free(gguf_value_t *v)
{
    if (v->type != GGUF_TYPE_ARRAY || !v->arr.items) return;
    gguf_value_t *items = (gguf_value_t *)v->arr.items;
    if (v->arr.elem_type == GGUF_TYPE_ARRAY)
        for (uint64_t i = 0; i < v->arr.n; i++) value_free(&items[i]);
    free(items);
    v->arr.items = NULL;
}

static bt_status_t value_read(gguf_cursor_t *c, gguf_type_t type, int depth, gguf_value_t *v);

static bt_status_t value_read_array(gguf_cursor_t *c, int depth, gguf_value_t *v)
{
    uint64_t at = c->pos;
    uint32_t et;
    uint64_t n;
    bt_status_t st = cursor_u32(c, "array element type", &et);
    if (st != BT_OK) return st;
    if (et >= GGUF_TYPE_COUNT) {
        log_error("gguf: %s: %s: array element type %u at offset %" PRIu64 " is not a GGUF type",
                  c->path, c->what, et, at);
        return BT_ERR_INVALID;
    }
    if (et == GGUF_TYPE_ARRAY && depth + 1 >= GGUF_MAX_DEPTH) {
        log_error("gguf: %s: %s: arrays nested deeper than %d at offset %" PRIu64,
                  c->path, c->what, GGUF_MAX_DEPTH, at);
        return BT_ERR_INVALID;
    }
    uint64_t count_at = c->pos;
    if ((st = cursor_u64(c, "array length", &n)) != BT_OK) return st;
    if ((st = cursor_count_fits(c, n, gguf_types[et].min_size, count_at, "array length")) != BT_OK)
        return st;
    v->type = GGUF_TYPE_ARRAY;
    v->arr.elem_type = (gguf_type_t)et;
    v->arr.n = n;
    v->arr.raw = c->base + c->pos;
    v->arr.items = NULL;
    if (gguf_types[et].size) { /* fixed-size elements stay packed in the mapping */
        c->pos += n * gguf_types[et].size; /* fits: checked above */
        return BT_OK;
    }
    gguf_value_t *items = calloc(n ? n : 1, sizeof *items);
    if (!items) {
        log_error("gguf: %s: %s: out of memory for %" PRIu64 " array elements", c->path, c->what, n);
        return BT_ERR_NOMEM;
    }
    v->arr.items = items;
    for (uint64_t i = 0; i < n; i++) {
        items[i].type = (gguf_type_t)et; /* so that value_free of a partial array is safe */
        if (et == GGUF_TYPE_STRING)
            st = cursor_str(c, "array string element", UINT64_MAX, &items[i].str);
        else
            st = value_read_array(c, depth + 1, &items[i]);
        if (st != BT_OK) {
            v->arr.n = i + 1; /* only these may own memory */
            value_free(v);
            return st;
        }
    }
    return BT_OK;
}

static bt_status_t value_read(gguf_cursor_t *c, gguf_type_t type, int depth, gguf_value_t *v)
{
    uint64_t u;
    bt_status_t st;
    v->type = type;
    switch (type) {
    case GGUF_TYPE_U8: case GGUF_TYPE_U16: case GGUF_TYPE_U32: case GGUF_TYPE_U64:
        st = cursor_uint(c, (int)gguf_types[type].size, gguf_types[type].name, &v->u64);
        return st;
    case GGUF_TYPE_I8: case GGUF_TYPE_I16: case GGUF_TYPE_I32: case GGUF_TYPE_I64: {
        int n = (int)gguf_types[type].size;
        if ((st = cursor_uint(c, n, gguf_types[type].name, &u)) != BT_OK) return st;
        if (n < 8 && (u >> (8 * n - 1)) & 1) u |= ~0ull << (8 * n); /* sign-extend */
        memcpy(&v->i64, &u, sizeof u);
        return BT_OK;
    }
    case GGUF_TYPE_F32: {
        if ((st = cursor_uint(c, 4, "f32", &u)) != BT_OK) return st;
        uint32_t w = (uint32_t)u;
        float f;
        memcpy(&f, &w, sizeof f);
        v->f64 = f;
        return BT_OK;
    }
    case GGUF_TYPE_F64:
        if ((st = cursor_uint(c, 8, "f64", &u)) != BT_OK) return st;
        memcpy(&v->f64, &u, sizeof u);
        return BT_OK;
    case GGUF_TYPE_BOOL: {
        uint64_t at = c->pos;
        if ((st = cursor_uint(c, 1, "bool", &u)) != BT_OK) return st;
        if (u > 1) {
            log_error("gguf: %s: %s: bool byte %" PRIu64 " at offset %" PRIu64 " is not 0 or 1",
                      c->path, c->what, u, at);
            return BT_ERR_INVALID;
        }
        v->b = u != 0;
        return BT_OK;
    }
    case GGUF_TYPE_STRING:
        return cursor_str(c, "string value", UINT64_MAX, &v->str);
    case GGUF_TYPE_ARRAY:
        return value_read_array(c, depth, v);
    case GGUF_TYPE_COUNT:
        break;
    }
    BT_PANIC("value_read: type %d not checked by the caller", (int)type);
}

/* ---- lookup ----------------------------------------------------------------- */

static int str_cmp(gguf_str_t a, gguf_str_t b)
{
    uint64_t n = a.len < b.len ? a.len : b.len;
    int r = n ? memcmp(a.ptr, b.ptr, (size_t)n) : 0;
    if (r) return r;
    return a.len < b.len ? -1 : a.len > b.len;
}

bool gguf_str_eq(gguf_str_t s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && (n == 0 || !memcmp(s.ptr, c, n));
}

/* Sorted index arrays for lookup by name and for finding duplicates in
 * O(n log n) (a hostile file may hold ~size/14 keys). qsort has no context
 * argument, so this is a small bottom-up merge sort that takes one. */
typedef int (*index_cmp_fn)(const void *ctx, uint64_t a, uint64_t b);

static void index_sort(uint64_t *ix, uint64_t *tmp, uint64_t n, index_cmp_fn cmp, const void *ctx)
{
    for (uint64_t width = 1; width < n; width *= 2) {
        for (uint64_t lo = 0; lo < n; lo += 2 * width) {
            uint64_t mid = lo + width < n ? lo + width : n;
            uint64_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            uint64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = cmp(ctx, ix[i], ix[j]) <= 0 ? ix[i++] : ix[j++];
            while (i < mid) tmp[k++] = ix[i++];
            while (j < hi) tmp[k++] = ix[j++];
        }
        memcpy(ix, tmp, (size_t)n * sizeof *ix);
    }
}

static int kv_cmp(const void *ctx, uint64_t a, uint64_t b)
{
    const gguf_kv_t *kv = ctx;
    return str_cmp(kv[a].key, kv[b].key);
}

static int tensor_cmp(const void *ctx, uint64_t a, uint64_t b)
{
    const gguf_tensor_t *t = ctx;
    return strcmp(t[a].name, t[b].name);
}

/* Sorted index of n items; NULL on allocation failure. */
static uint64_t *index_build(uint64_t n, index_cmp_fn cmp, const void *ctx)
{
    uint64_t *ix = malloc((n ? n : 1) * sizeof *ix);
    uint64_t *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!ix || !tmp) {
        free(ix);
        free(tmp);
        return NULL;
    }
    for (uint64_t i = 0; i < n; i++) ix[i] = i;
    index_sort(ix, tmp, n, cmp, ctx);
    free(tmp);
    return ix;
}

const gguf_kv_t *gguf_kv_find(const gguf_t *g, const char *key)
{
    gguf_str_t k = {key, strlen(key)};
    uint64_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int r = str_cmp(g->kv[g->kv_sorted[mid]].key, k);
        if (r == 0) return &g->kv[g->kv_sorted[mid]];
        if (r < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const gguf_tensor_t *gguf_tensor_find(const gguf_t *g, const char *name)
{
    uint64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int r = strcmp(g->tensors[g->tensor_sorted[mid]].name, name);
        if (r == 0) return &g->tensors[g->tensor_sorted[mid]];
        if (r < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* ---- typed getters ------------------------------------------------------------ */

static bool type_is_uint(gguf_type_t t)
{
    return t == GGUF_TYPE_U8 || t == GGUF_TYPE_U16 || t == GGUF_TYPE_U32 || t == GGUF_TYPE_U64;
}

static bool type_is_sint(gguf_type_t t)
{
    return t == GGUF_TYPE_I8 || t == GGUF_TYPE_I16 || t == GGUF_TYPE_I32 || t == GGUF_TYPE_I64;
}

static bt_status_t get_kv(const gguf_t *g, const char *key, const gguf_kv_t **out)
{
    *out = gguf_kv_find(g, key);
    return *out ? BT_OK : BT_ERR_NOT_FOUND;
}

static bt_status_t wrong_type(const gguf_t *g, const char *key, gguf_type_t have, const char *want)
{
    log_error("gguf: %s: metadata '%s' is %s, expected %s", g->path, key, gguf_type_name(have), want);
    return BT_ERR_INVALID;
}

bt_status_t gguf_get_u64(const gguf_t *g, const char *key, uint64_t *out)
{
    const gguf_kv_t *kv;
    if (get_kv(g, key, &kv) != BT_OK) return BT_ERR_NOT_FOUND;
    const gguf_value_t *v = &kv->value;
    if (type_is_uint(v->type)) { *out = v->u64; return BT_OK; }
    if (type_is_sint(v->type)) {
        if (v->i64 < 0) {
            log_error("gguf: %s: metadata '%s' is negative (%" PRId64 ")", g->path, key, v->i64);
            return BT_ERR_INVALID;
        }
        *out = (uint64_t)v->i64;
        return BT_OK;
    }
    return wrong_type(g, key, v->type, "an integer");
}

bt_status_t gguf_get_i64(const gguf_t *g, const char *key, int64_t *out)
{
    const gguf_kv_t *kv;
    if (get_kv(g, key, &kv) != BT_OK) return BT_ERR_NOT_FOUND;
    const gguf_value_t *v = &kv->value;
    if (type_is_sint(v->type)) { *out = v->i64; return BT_OK; }
    if (type_is_uint(v->type)) {
        if (v->u64 > INT64_MAX) {
            log_error("gguf: %s: metadata '%s' = %" PRIu64 " does not fit in int64", g->path, key, v->u64);
            return BT_ERR_INVALID;
        }
        *out = (int64_t)v->u64;
        return BT_OK;
    }
    return wrong_type(g, key, v->type, "an integer");
}

bt_status_t gguf_get_f64(const gguf_t *g, const char *key, double *out)
{
    const gguf_kv_t *kv;
    if (get_kv(g, key, &kv) != BT_OK) return BT_ERR_NOT_FOUND;
    if (kv->value.type != GGUF_TYPE_F32 && kv->value.type != GGUF_TYPE_F64)
        return wrong_type(g, key, kv->value.type, "f32 or f64");
    *out = kv->value.f64;
    return BT_OK;
}

bt_status_t gguf_get_bool(const gguf_t *g, const char *key, bool *out)
{
    const gguf_kv_t *kv;
    if (get_kv(g, key, &kv) != BT_OK) return BT_ERR_NOT_FOUND;
    if (kv->value.type != GGUF_TYPE_BOOL) return wrong_type(g, key, kv->value.type, "bool");
    *out = kv->value.b;
    return BT_OK;
}

bt_status_t gguf_get_str(const gguf_t *g, const char *key, gguf_str_t *out)
{
    const gguf_kv_t *kv;
    if (get_kv(g, key, &kv) != BT_OK) return BT_ERR_NOT_FOUND;
    if (kv->value.type != GGUF_TYPE_STRING) return wrong_type(g, key, kv->value.type, "string");
    *out = kv->value.str;
    return BT_OK;
}

bt_status_t gguf_get_array(const gguf_t *g, const char *key, gguf_type_t elem_type,
                           const gguf_value_t **out)
{
    const gguf_kv_t *kv;
    if (get_kv(g, key, &kv) != BT_OK) return BT_ERR_NOT_FOUND;
    const gguf_value_t *v = &kv->value;
    if (v->type != GGUF_TYPE_ARRAY) return wrong_type(g, key, v->type, "array");
    if (elem_type != GGUF_TYPE_COUNT && v->arr.elem_type != elem_type) {
        log_error("gguf: %s: metadata '%s' is an array of %s, expected an array of %s", g->path,
                  key, gguf_type_name(v->arr.elem_type), gguf_type_name(elem_type));
        return BT_ERR_INVALID;
    }
    *out = v;
    return BT_OK;
}

bt_status_t gguf_array_i64(const gguf_value_t *arr, uint64_t i, int64_t *out)
{
    assert(arr->type == GGUF_TYPE_ARRAY && i < arr->arr.n);
    gguf_type_t et = arr->arr.elem_type;
    if (!type_is_uint(et) && !type_is_sint(et) && et != GGUF_TYPE_BOOL) return BT_ERR_INVALID;
    int n = (int)gguf_types[et].size;
    uint64_t u = le_get(arr->arr.raw + i * (uint64_t)n, n);
    if (type_is_sint(et)) {
        if (n < 8 && (u >> (8 * n - 1)) & 1) u |= ~0ull << (8 * n);
        memcpy(out, &u, sizeof u);
        return BT_OK;
    }
    if (u > INT64_MAX) return BT_ERR_INVALID;
    *out = (int64_t)u;
    return BT_OK;
}

bt_status_t gguf_array_f64(const gguf_value_t *arr, uint64_t i, double *out)
{
    assert(arr->type == GGUF_TYPE_ARRAY && i < arr->arr.n);
    if (arr->arr.elem_type == GGUF_TYPE_F32) {
        uint32_t w = (uint32_t)le_get(arr->arr.raw + 4 * i, 4);
        float f;
        memcpy(&f, &w, sizeof f);
        *out = f;
        return BT_OK;
    }
    if (arr->arr.elem_type == GGUF_TYPE_F64) {
        uint64_t u = le_get(arr->arr.raw + 8 * i, 8);
        memcpy(out, &u, sizeof u);
        return BT_OK;
    }
    return BT_ERR_INVALID;
}

bt_status_t gguf_array_str(const gguf_value_t *arr, uint64_t i, gguf_str_t *out)
{
    assert(arr->type == GGUF_TYPE_ARRAY && i < arr->arr.n);
    if (arr->arr.elem_type != GGUF_TYPE_STRING) return BT_ERR_INVALID;
    *out = arr->arr.items[i].str;
    return BT_OK;
}

/* ---- open ------------------------------------------------------------------------ */

static bt_status_t parse_kvs(gguf_t *g, gguf_cursor_t *c, uint64_t n_kv)
{
    bt_status_t st;
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    if (!g->kv) {
        log_error("gguf: %s: out of memory for %" PRIu64 " metadata entries", g->path, n_kv);
        return BT_ERR_NOMEM;
    }
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv_t *kv = &g->kv[i];
        cursor_what(c, "metadata entry %" PRIu64, i);
        if ((st = cursor_str(c, "key", GGUF_MAX_NAME, &kv->key)) != BT_OK) return st;
        cursor_what(c, "metadata entry %" PRIu64 " '%.*s'", i, (int)kv->key.len, kv->key.ptr);
        uint64_t at = c->pos;
        uint32_t type;
        if ((st = cursor_u32(c, "value type", &type)) != BT_OK) return st;
        if (type >= GGUF_TYPE_COUNT) {
            log_error("gguf: %s: %s: value type %u at offset %" PRIu64 " is not a GGUF type",
                      g->path, c->what, type, at);
            return BT_ERR_INVALID;
        }
        if ((st = value_read(c, (gguf_type_t)type, 0, &kv->value)) != BT_OK) {
            kv->value.type = GGUF_TYPE_U8; /* a failed array has freed itself */
            return st;
        }
        g->n_kv = i + 1; /* entries [0, n_kv) own their memory */
    }
    g->kv_sorted = index_build(n_kv, kv_cmp, g->kv);
    if (!g->kv_sorted) {
        log_error("gguf: %s: out of memory for the metadata index", g->path);
        return BT_ERR_NOMEM;
    }
    for (uint64_t i = 1; i < n_kv; i++) {
        const gguf_kv_t *a = &g->kv[g->kv_sorted[i - 1]], *b = &g->kv[g->kv_sorted[i]];
        if (str_cmp(a->key, b->key) == 0) {
            log_error("gguf: %s: metadata key '%.*s' appears twice", g->path, (int)b->key.len, b->key.ptr);
            return BT_ERR_INVALID;
        }
    }
    return BT_OK;
}

static bt_status_t parse_alignment(gguf_t *g)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv_t *kv = gguf_kv_find(g, "general.alignment");
    if (!kv) return BT_OK;
    if (kv->value.type != GGUF_TYPE_U32)
        return wrong_type(g, "general.alignment", kv->value.type, "u32");
    uint64_t a = kv->value.u64;
    if (a == 0 || (a & (a - 1)) != 0) {
        log_error("gguf: %s: general.alignment = %" PRIu64 " is not a power of two", g->path, a);
        return BT_ERR_INVALID;
    }
    g->alignment = a;
    return BT_OK;
}

static bt_status_t parse_tensor_infos(gguf_t *g, gguf_cursor_t *c, uint64_t n_tensors)
{
    bt_status_t st;
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    gguf_str_t *names = calloc(n_tensors ? n_tensors : 1, sizeof *names);
    if (!g->tensors || !names) {
        free(names);
        log_error("gguf: %s: out of memory for %" PRIu64 " tensor infos", g->path, n_tensors);
        return BT_ERR_NOMEM;
    }
    uint64_t names_bytes = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor_t *t = &g->tensors[i];
        cursor_what(c, "tensor info %" PRIu64, i);
        if ((st = cursor_str(c, "name", GGUF_MAX_NAME, &names[i])) != BT_OK) goto fail_names;
        if (memchr(names[i].ptr, '\0', (size_t)names[i].len)) {
            log_error("gguf: %s: tensor info %" PRIu64 " at offset %" PRIu64 ": name holds a NUL byte",
                      g->path, i, c->pos - names[i].len);
            st = BT_ERR_INVALID;
            goto fail_names;
        }
        names_bytes += names[i].len + 1;
        cursor_what(c, "tensor info %" PRIu64 " '%.*s'", i, (int)names[i].len, names[i].ptr);
        uint64_t at = c->pos;
        if ((st = cursor_u32(c, "n_dims", &t->n_dims)) != BT_OK) goto fail_names;
        if (t->n_dims > GGUF_MAX_DIMS) {
            log_error("gguf: %s: %s: n_dims %u at offset %" PRIu64 " exceeds %d", g->path, c->what,
                      t->n_dims, at, GGUF_MAX_DIMS);
            st = BT_ERR_INVALID;
            goto fail_names;
        }
        int64_t n_elems = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t ne;
            at = c->pos;
            if ((st = cursor_u64(c, "dimension", &ne)) != BT_OK) goto fail_names;
            if (ne == 0 || ne > (uint64_t)INT64_MAX || (uint64_t)n_elems > (uint64_t)INT64_MAX / ne) {
                log_error("gguf: %s: %s: dimension %u = %" PRIu64 " at offset %" PRIu64
                          " is zero or makes the element count overflow", g->path, c->what, d, ne, at);
                st = BT_ERR_INVALID;
                goto fail_names;
            }
            t->ne[d] = (int64_t)ne;
            n_elems *= (int64_t)ne;
        }
        t->n_elems = n_elems;
        at = c->pos;
        if ((st = cursor_u32(c, "ggml type", &t->type)) != BT_OK) goto fail_names;
        const dequant_type_info_t *ti = dequant_type_info(t->type);
        if (ti->block == 0) {
            log_error("gguf: %s: %s: unknown ggml type %u at offset %" PRIu64, g->path, c->what,
                      t->type, at);
            st = BT_ERR_UNSUPPORTED;
            goto fail_names;
        }
        uint64_t row_bytes;
        if (dequant_row_bytes(t->type, t->ne[0], &row_bytes) != BT_OK ||
            (uint64_t)(n_elems / t->ne[0]) > UINT64_MAX / row_bytes) {
            log_error("gguf: %s: %s: innermost dimension %" PRId64 " is not a multiple of the %s block size %u",
                      g->path, c->what, t->ne[0], ti->name, ti->block);
            st = BT_ERR_INVALID;
            goto fail_names;
        }
        t->nbytes = row_bytes * (uint64_t)(n_elems / t->ne[0]);
        at = c->pos;
        if ((st = cursor_u64(c, "data offset", &t->offset)) != BT_OK) goto fail_names;
        if (t->offset % g->alignment != 0) {
            log_error("gguf: %s: %s: data offset %" PRIu64 " (at offset %" PRIu64
                      ") is not a multiple of the alignment %" PRIu64,
                      g->path, c->what, t->offset, at, g->alignment);
            st = BT_ERR_INVALID;
            goto fail_names;
        }
    }
    c->what[0] = '\0';

    /* Names as NUL-terminated strings in one block; names_bytes is at most
     * the file size plus one byte per tensor. */
    g->names = malloc(names_bytes ? names_bytes : 1);
    if (!g->names) {
        log_error("gguf: %s: out of memory for tensor names", g->path);
        st = BT_ERR_NOMEM;
        goto fail_names;
    }
    char *p = g->names;
    for (uint64_t i = 0; i < n_tensors; i++) {
        memcpy(p, names[i].ptr, (size_t)names[i].len);
        p[names[i].len] = '\0';
        g->tensors[i].name = p;
        p += names[i].len + 1;
    }
    free(names);
    g->n_tensors = n_tensors;
    g->tensor_sorted = index_build(n_tensors, tensor_cmp, g->tensors);
    if (!g->tensor_sorted) {
        log_error("gguf: %s: out of memory for the tensor index", g->path);
        return BT_ERR_NOMEM;
    }
    for (uint64_t i = 1; i < n_tensors; i++) {
        const char *a = g->tensors[g->tensor_sorted[i - 1]].name;
        const char *b = g->tensors[g->tensor_sorted[i]].name;
        if (!strcmp(a, b)) {
            log_error("gguf: %s: tensor '%s' appears twice", g->path, b);
            return BT_ERR_INVALID;
        }
    }
    return BT_OK;

fail_names:
    free(names);
    return st;
}

static bt_status_t place_tensors(gguf_t *g, uint64_t infos_end)
{
    /* The data section starts at the next multiple of the alignment. */
    uint64_t pad = (g->alignment - infos_end % g->alignment) % g->alignment;
    g->data_offset = infos_end + pad;
    if (g->data_offset > g->size) {
        if (g->n_tensors == 0) { /* nothing to place: a file may end right after its metadata */
            g->data_offset = g->size;
            return BT_OK;
        }
        log_error("gguf: %s: truncated: the data section would start at offset %" PRIu64
                  " (tensor infos end at %" PRIu64 ", alignment %" PRIu64 ") but the file has %" PRIu64 " bytes",
                  g->path, g->data_offset, infos_end, g->alignment, g->size);
        return BT_ERR_INVALID;
    }
    uint64_t data_size = g->size - g->data_offset;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor_t *t = &g->tensors[i];
        if (t->offset > data_size || t->nbytes > data_size - t->offset) {
            log_error("gguf: %s: tensor '%s' (%s, %" PRIu64 " bytes at data offset %" PRIu64
                      ", file offset %" PRIu64 ") runs past the end of the file (%" PRIu64 " bytes)",
                      g->path, t->name, dequant_type_info(t->type)->name, t->nbytes, t->offset,
                      g->data_offset + t->offset, g->size);
            return BT_ERR_INVALID;
        }
        t->data = g->base + g->data_offset + t->offset;
    }
    return BT_OK;
}

static bt_status_t gguf_parse(gguf_t *g)
{
    gguf_cursor_t c = {.base = g->base, .size = g->size, .pos = 0, .path = g->path};
    bt_status_t st;
    uint32_t magic, version;
    uint64_t n_tensors, n_kv;

    cursor_what(&c, "header");
    if ((st = cursor_u32(&c, "magic", &magic)) != BT_OK) return st;
    if (magic != GGUF_MAGIC) {
        log_error("gguf: %s: not a GGUF file: magic at offset 0 is %02x %02x %02x %02x, expected \"GGUF\"",
                  g->path, g->base[0], g->base[1], g->base[2], g->base[3]);
        return BT_ERR_INVALID;
    }
    if ((st = cursor_u32(&c, "version", &version)) != BT_OK) return st;
    if (version != 2 && version != 3) {
        /* A big-endian file reads its version byte-swapped here. */
        if ((version & 0xffff) == 0 && version != 0)
            log_error("gguf: %s: version field at offset 4 reads %u: a big-endian GGUF, not supported",
                      g->path, version);
        else
            log_error("gguf: %s: GGUF version %u at offset 4 is not supported (2 and 3 are)", g->path, version);
        return BT_ERR_UNSUPPORTED;
    }
    g->version = version;
    if ((st = cursor_u64(&c, "tensor count", &n_tensors)) != BT_OK) return st;
    if ((st = cursor_u64(&c, "metadata count", &n_kv)) != BT_OK) return st;
    /* a key/value takes at least 8 (key length) + 4 (type) + 1 (a u8), a
     * tensor info 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) */
    if ((st = cursor_count_fits(&c, n_kv, 13, 16, "metadata count")) != BT_OK) return st;
    if ((st = cursor_count_fits(&c, n_tensors, 24, 8, "tensor count")) != BT_OK) return st;

    if ((st = parse_kvs(g, &c, n_kv)) != BT_OK) return st;
    if ((st = parse_alignment(g)) != BT_OK) return st;
    if ((st = parse_tensor_infos(g, &c, n_tensors)) != BT_OK) return st;
    return place_tensors(g, c.pos);
}

void gguf_close(gguf_t *g)
{
    if (!g) return;
    for (uint64_t i = 0; i < g->n_kv; i++) value_free(&g->kv[i].value);
    free(g->kv);
    free(g->kv_sorted);
    free(g->tensors);
    free(g->tensor_sorted);
    free(g->names);
    if (g->map) munmap(g->map, (size_t)g->size);
    free(g->path);
    free(g);
}

static bt_status_t gguf_new(const char *name, gguf_t **out)
{
    gguf_t *g = calloc(1, sizeof *g);
    char *path = strdup(name);
    if (!g || !path) {
        free(g);
        free(path);
        log_error("gguf: %s: out of memory", name);
        return BT_ERR_NOMEM;
    }
    g->path = path;
    *out = g;
    return BT_OK;
}

bt_status_t gguf_open_mem(const void *buf, size_t size, const char *name, gguf_t **out)
{
    gguf_t *g;
    bt_status_t st = gguf_new(name ? name : "(memory)", &g);
    if (st != BT_OK) return st;
    g->base = buf;
    g->size = size;
    if ((st = gguf_parse(g)) != BT_OK) {
        gguf_close(g);
        return st;
    }
    *out = g;
    return BT_OK;
}

bt_status_t gguf_open(const char *path, gguf_t **out)
{
    gguf_t *g;
    bt_status_t st = gguf_new(path, &g);
    if (st != BT_OK) return st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        log_error("gguf: %s: cannot open: %s", path, strerror(errno));
        st = BT_ERR_IO;
        goto fail_g;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        log_error("gguf: %s: cannot stat: %s", path, strerror(errno));
        st = BT_ERR_IO;
        goto fail_fd;
    }
    if (!S_ISREG(sb.st_mode)) {
        log_error("gguf: %s: not a regular file", path);
        st = BT_ERR_INVALID;
        goto fail_fd;
    }
    if (sb.st_size == 0) {
        log_error("gguf: %s: truncated: the file is empty (a GGUF header needs 24 bytes)", path);
        st = BT_ERR_INVALID;
        goto fail_fd;
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        log_error("gguf: %s: cannot map %lld bytes: %s", path, (long long)sb.st_size, strerror(errno));
        st = BT_ERR_IO;
        goto fail_fd;
    }
    close(fd);
    g->map = map;
    g->base = map;
    g->size = (uint64_t)sb.st_size;
    if ((st = gguf_parse(g)) != BT_OK) goto fail_g;
    *out = g;
    return BT_OK;

fail_fd:
    close(fd);
fail_g:
    gguf_close(g);
    return st;
}

bt_status_t gguf_tensor_to_f32(const gguf_t *g, const gguf_tensor_t *t, float *out)
{
    bt_status_t st = dequant_row_f32(t->type, t->data, t->n_elems, out);
    if (st == BT_ERR_UNSUPPORTED)
        log_error("gguf: %s: tensor '%s': cannot dequantize ggml type %s", g->path, t->name,
                  dequant_type_info(t->type)->name);
    else if (st != BT_OK)
        BT_PANIC("tensor '%s' passed validation but dequant says %s", t->name, bt_status_str(st));
    return st;
}
