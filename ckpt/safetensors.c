#include "ckpt/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/save.h"

typedef struct {
    const char *name;
    dtype_t     dtype;
    size_t      size;
} st_dtype_t;

/* The safetensors dtypes baton can hold. Others (BOOL, I8, F8_*, ...) are
 * rejected as unsupported, naming the tensor. */
static const st_dtype_t st_dtypes[] = {
    {"F32", DT_F32, 4}, {"F16", DT_F16, 2}, {"BF16", DT_BF16, 2}, {"F64", DT_F64, 8},
    {"I32", DT_I32, 4}, {"I64", DT_I64, 8}, {"U8", DT_U8, 1},
};

static const st_dtype_t *st_dtype_lookup(const char *name)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (!strcmp(st_dtypes[i].name, name)) return &st_dtypes[i];
    return NULL;
}

static size_t st_dtype_size(dtype_t dt)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (st_dtypes[i].dtype == dt) return st_dtypes[i].size;
    return 0;
}

const char *ckpt_st_dtype_name(dtype_t dt)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (st_dtypes[i].dtype == dt) return st_dtypes[i].name;
    return NULL;
}

bool ckpt_st_dtype_from_name(const char *name, dtype_t *out)
{
    const st_dtype_t *d = st_dtype_lookup(name);
    if (d) *out = d->dtype;
    return d != NULL;
}

static void st_file_free(ckpt_st_file_t *f)
{
    if (!f) return;
    for (int i = 0; i < f->n; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    free(f);
}

static int st_tensor_cmp(const void *a, const void *b)
{
    const ckpt_st_tensor_t *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* One header entry -> t. Errors are logged here. */
static bt_status_t st_entry_parse(const char *what, const char *name, json_t *v,
                                  uint64_t data_size, ckpt_st_tensor_t *t)
{
    if (!json_is_object(v)) {
        log_error("%s: tensor '%s': header entry is not an object", what, name);
        return BT_ERR_CORRUPT;
    }
    json_t *jdt = json_object_get(v, "dtype");
    json_t *jshape = json_object_get(v, "shape");
    json_t *joff = json_object_get(v, "data_offsets");
    if (!json_is_string(jdt) || !json_is_array(jshape) || !json_is_array(joff) ||
        json_array_size(joff) != 2) {
        log_error("%s: tensor '%s': needs string 'dtype', array 'shape' and "
                  "'data_offsets' [begin, end]", what, name);
        return BT_ERR_CORRUPT;
    }
    const st_dtype_t *dt = st_dtype_lookup(json_string_value(jdt));
    if (!dt) {
        log_error("%s: tensor '%s': unknown or unsupported dtype '%s'", what, name,
                  json_string_value(jdt));
        return BT_ERR_UNSUPPORTED;
    }
    size_t nd = json_array_size(jshape);
    if (nd > CKPT_ST_MAX_DIMS) {
        log_error("%s: tensor '%s': %zu dimensions (at most %d)", what, name, nd,
                  CKPT_ST_MAX_DIMS);
        return BT_ERR_UNSUPPORTED;
    }
    uint64_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(jshape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0) {
            log_error("%s: tensor '%s': shape[%zu] is not a non-negative integer", what, name, i);
            return BT_ERR_CORRUPT;
        }
        uint64_t di = (uint64_t)json_integer_value(d);
        if (di != 0 && numel > UINT64_MAX / di / 8) {
            log_error("%s: tensor '%s': shape too large", what, name);
            return BT_ERR_CORRUPT;
        }
        numel *= di;
        t->shape[i] = (int64_t)di;
    }
    json_t *jb = json_array_get(joff, 0), *je = json_array_get(joff, 1);
    if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 ||
        json_integer_value(je) < json_integer_value(jb)) {
        log_error("%s: tensor '%s': data_offsets must be integers 0 <= begin <= end", what, name);
        return BT_ERR_CORRUPT;
    }
    uint64_t begin = (uint64_t)json_integer_value(jb), end = (uint64_t)json_integer_value(je);
    if (end > data_size) {
        log_error("%s: tensor '%s': data_offsets [%llu, %llu] past the end of the data "
                  "(%llu bytes; file truncated?)", what, name, (unsigned long long)begin,
                  (unsigned long long)end, (unsigned long long)data_size);
        return BT_ERR_CORRUPT;
    }
    if (end - begin != numel * dt->size) {
        log_error("%s: tensor '%s': %llu bytes for %llu elements of %s", what, name,
                  (unsigned long long)(end - begin), (unsigned long long)numel, dt->name);
        return BT_ERR_CORRUPT;
    }
    t->dtype = dt->dtype;
    t->ndim = (int)nd;
    t->numel = (int64_t)numel;
    t->begin = begin;
    t->end = end;
    return BT_OK;
}

bt_status_t ckpt_st_parse(const uint8_t *buf, size_t size, const char *what,
                          ckpt_st_file_t **out)
{
    if (size < 8) {
        log_error("%s: %zu bytes, too short for a safetensors header", what, size);
        return BT_ERR_CORRUPT;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > size - 8 || hlen > CKPT_ST_MAX_HEADER) {
        log_error("%s: header length %llu does not fit the file (%zu bytes)", what,
                  (unsigned long long)hlen, size);
        return BT_ERR_CORRUPT;
    }
    bt_status_t st = BT_ERR_CORRUPT;
    ckpt_st_file_t *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(what))) {
        free(f);
        return BT_ERR_NOMEM;
    }
    f->data = buf + 8 + hlen;
    f->data_size = size - 8 - hlen;

    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        log_error("%s: header is not valid JSON: %s (at byte %d)", what, jerr.text,
                  jerr.position);
        goto fail_file;
    }
    if (!json_is_object(root)) {
        log_error("%s: header is not a JSON object", what);
        goto fail_root;
    }
    size_t cap = json_object_size(root);
    f->tensors = calloc(cap ? cap : 1, sizeof *f->tensors);
    if (!f->tensors) {
        st = BT_ERR_NOMEM;
        goto fail_root;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(val)) {
                log_error("%s: __metadata__ is not an object", what);
                goto fail_root;
            }
            continue;
        }
        ckpt_st_tensor_t *t = &f->tensors[f->n];
        if ((st = st_entry_parse(what, key, val, f->data_size, t)) != BT_OK) goto fail_root;
        if (!(t->name = strdup(key))) {
            st = BT_ERR_NOMEM;
            goto fail_root;
        }
        t->data = f->data + t->begin;
        f->n++;
    }
    qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, st_tensor_cmp);
    for (int i = 1; i < f->n; i++) {
        const ckpt_st_tensor_t *a = &f->tensors[i - 1], *b = &f->tensors[i];
        if (b->begin < a->end) {
            log_error("%s: tensors '%s' and '%s' overlap in the data section", what, a->name,
                      b->name);
            st = BT_ERR_CORRUPT;
            goto fail_root;
        }
    }
    json_decref(root);
    *out = f;
    return BT_OK;

fail_root:
    json_decref(root);
fail_file:
    st_file_free(f);
    return st;
}

bt_status_t ckpt_st_open(const char *path, ckpt_st_file_t **out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        log_error("%s: cannot open: %s", path, strerror(errno));
        return errno == ENOENT ? BT_ERR_NOT_FOUND : BT_ERR_IO;
    }
    bt_status_t st = BT_ERR_IO;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        log_error("%s: stat: %s", path, strerror(errno));
        goto close_fd;
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        log_error("%s: %zu bytes, too short for a safetensors header (truncated?)", path, size);
        st = BT_ERR_CORRUPT;
        goto close_fd;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        log_error("%s: mmap: %s", path, strerror(errno));
        goto close_fd;
    }
    ckpt_st_file_t *f;
    if ((st = ckpt_st_parse(map, size, path, &f)) != BT_OK) {
        munmap(map, size);
        goto close_fd;
    }
    f->map = map;
    f->map_size = size;
    close(fd);
    *out = f;
    return BT_OK;

close_fd:
    close(fd);
    return st;
}

void ckpt_st_close(ckpt_st_file_t *f)
{
    if (!f) return;
    if (f->map) munmap(f->map, f->map_size);
    st_file_free(f);
}

const ckpt_st_tensor_t *ckpt_st_find(const ckpt_st_file_t *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

bt_status_t ckpt_st_read_f32(const ckpt_st_file_t *f, const ckpt_st_tensor_t *t, float *dst)
{
    return ckpt_st_read_f32_range(f, t, 0, t->numel, dst);
}

bt_status_t ckpt_st_read_f32_range(const ckpt_st_file_t *f, const ckpt_st_tensor_t *t,
                                   int64_t first, int64_t n, float *dst)
{
    if (first < 0 || n < 0 || first > t->numel || n > t->numel - first) {
        log_error("%s: tensor '%s': elements [%lld, %lld) outside its %lld", f->path, t->name,
                  (long long)first, (long long)(first + n), (long long)t->numel);
        return BT_ERR_INVALID;
    }
    size_t es = dtype_size(t->dtype);
    const uint8_t *src = (const uint8_t *)t->data + (size_t)first * es;
    switch (t->dtype) {
    case DT_F32:
        memcpy(dst, src, (size_t)n * 4);
        return BT_OK;
    case DT_F16:
    case DT_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = t->dtype == DT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
        }
        return BT_OK;
    case DT_F64:
        for (int64_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, src + 8 * i, 8);
            dst[i] = (float)d;
        }
        return BT_OK;
    default:
        log_error("%s: tensor '%s' has dtype %s; a floating-point tensor is expected",
                  f->path, t->name, ckpt_st_dtype_name(t->dtype));
        return BT_ERR_UNSUPPORTED;
    }
}

typedef struct {
    const ckpt_st_file_t   *f;
    const ckpt_st_tensor_t *t;
    float                  *dst;
    uintptr_t               released; /* mapped bytes below this are given back */
    bt_status_t             st;
} st_piece_t;

/* Mapped file pages a piece read has passed are given back to the kernel
 * every this many bytes (they stay in the page cache): a rank's resident
 * memory then holds its pieces and at most this much of the file, not the
 * whole tensor it reads from. */
#define ST_RELEASE_BYTES ((size_t)8 << 20)

static void st_release(st_piece_t *p, uintptr_t upto)
{
    if (!p->f->map) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = p->released / page * page, hi = upto / page * page;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
    if (upto > p->released) p->released = upto;
}

static void st_piece_run(void *arg, int64_t src_off, int64_t dst_off, int64_t n)
{
    st_piece_t *p = arg;
    size_t es = dtype_size(p->t->dtype);
    int64_t chunk = (int64_t)(ST_RELEASE_BYTES / (es ? es : 1));
    for (int64_t done = 0; done < n && p->st == BT_OK; done += chunk) {
        int64_t k = n - done < chunk ? n - done : chunk;
        p->st = ckpt_st_read_f32_range(p->f, p->t, src_off + done, k, p->dst + dst_off + done);
        uintptr_t end = (uintptr_t)p->t->data + (uintptr_t)(src_off + done + k) * es;
        if (end - p->released >= ST_RELEASE_BYTES) st_release(p, end);
    }
}

bt_status_t ckpt_st_read_piece(const ckpt_st_file_t *f, const ckpt_st_tensor_t *t,
                               const shard_spec_t *piece, float *dst)
{
    bool same = t->ndim == piece->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == piece->global[d];
    if (!same) {
        log_error("%s: tensor '%s' does not have the shape of the piece asked for", f->path,
                  t->name);
        return BT_ERR_INVALID;
    }
    shard_spec_t whole = shard_whole(piece->ndim, piece->global);
    st_piece_t p = {.f = f, .t = t, .dst = dst, .released = (uintptr_t)t->data, .st = BT_OK};
    /* runs come in increasing file order (row-major over the piece), so the
     * pages behind the latest run are done with */
    shard_runs(piece, &whole, st_piece_run, &p);
    if (t->end > t->begin) {
        long page = sysconf(_SC_PAGESIZE);
        st_release(&p, ((uintptr_t)t->data + (uintptr_t)(t->end - t->begin) + (uintptr_t)page - 1) /
                           (uintptr_t)page * (uintptr_t)page);
    }
    return p.st;
}

/* The header JSON for entries, with data laid out back to back in order. */
static char *st_header_build(const ckpt_st_entry_t *entries, int n, const char *const *meta,
                             int n_meta, size_t *len_out)
{
    json_t *root = json_object();
    if (!root) return NULL;
    char *text = NULL;
    if (n_meta > 0) {
        json_t *m = json_object();
        for (int i = 0; i < n_meta; i++)
            json_object_set_new(m, meta[2 * i], json_string(meta[2 * i + 1]));
        json_object_set_new(root, "__metadata__", m);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const tensor_t *t = &entries[i].t;
        const char *dn = ckpt_st_dtype_name(t->dtype);
        if (!dn) BT_PANIC("safetensors: no dtype name for %d", (int)t->dtype);
        uint64_t nbytes = (uint64_t)tensor_numel(t) * st_dtype_size(t->dtype);
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_t *e = json_object();
        json_object_set_new(e, "dtype", json_string(dn));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets",
                            json_pack("[II]", (json_int_t)off, (json_int_t)(off + nbytes)));
        json_object_set_new(root, entries[i].name, e);
        off += nbytes;
    }
    text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (text) *len_out = strlen(text);
    return text;
}

bt_status_t ckpt_st_write_fill(const char *path, const ckpt_st_entry_t *entries, int n,
                               const char *const *meta, int n_meta, ckpt_st_fill_fn fill, void *arg,
                               ckpt_st_written_t *out)
{
    size_t largest = 0;
    for (int i = 0; i < n; i++) {
        const tensor_t *t = &entries[i].t;
        if (!tensor_is_contiguous(t) || t->device.kind != DEV_CPU || !ckpt_st_dtype_name(t->dtype))
            BT_PANIC("safetensors write: tensor '%s' must be contiguous CPU with a "
                     "safetensors dtype", entries[i].name);
        for (int j = 0; j < i; j++)
            if (!strcmp(entries[j].name, entries[i].name))
                BT_PANIC("safetensors write: duplicate tensor '%s'", entries[i].name);
        size_t b = (size_t)tensor_numel(t) * st_dtype_size(t->dtype);
        if (b > largest) largest = b;
    }
    size_t hlen;
    char *header = st_header_build(entries, n, meta, n_meta, &hlen);
    if (!header) return BT_ERR_NOMEM;
    /* Pad the header with spaces so that the data section is 8-aligned;
     * length, header and padding go out in one write. */
    size_t padded = (hlen + 7) & ~(size_t)7;
    uint8_t *head = malloc(8 + padded);
    uint8_t *buf = fill ? malloc(largest + 1) : NULL;
    if (!head || (fill && !buf)) {
        free(header);
        free(head);
        free(buf);
        return BT_ERR_NOMEM;
    }
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(head + 8, header, hlen);
    memset(head + 8 + hlen, ' ', padded - hlen);
    free(header);

    XXH3_state_t *xs = out ? XXH3_createState() : NULL;
    if (out && !xs) {
        free(head);
        free(buf);
        return BT_ERR_NOMEM;
    }
    if (xs) XXH3_64bits_reset(xs);
    uint64_t at = 8 + padded;
    base_save_file_t f;
    bt_status_t st = base_save_file_begin(&f, path, 0644);
    if (st == BT_OK) st = base_save_file_write(&f, head, 8 + padded);
    if (xs) XXH3_64bits_update(xs, head, 8 + padded);
    for (int i = 0; i < n && st == BT_OK; i++) {
        const tensor_t *t = &entries[i].t;
        size_t bytes = (size_t)tensor_numel(t) * st_dtype_size(t->dtype);
        const void *data = t->data;
        if (fill) {
            st = fill(arg, i, buf, bytes);
            data = buf;
        }
        if (st == BT_OK) st = base_save_file_write(&f, data, bytes);
        if (xs) XXH3_64bits_update(xs, data, bytes);
        if (out && out->offsets) out->offsets[i] = at;
        at += bytes;
    }
    free(head);
    free(buf);
    if (out) {
        out->bytes = at;
        out->xxh3 = XXH3_64bits_digest(xs);
        XXH3_freeState(xs);
    }
    if (st == BT_OK) return base_save_file_commit(&f);
    base_save_file_abort(&f);
    return st;
}

bt_status_t ckpt_st_write(const char *path, const ckpt_st_entry_t *entries, int n,
                          const char *const *meta, int n_meta)
{
    return ckpt_st_write_fill(path, entries, n, meta, n_meta, NULL, NULL, NULL);
}
