#include "ckpt/native.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/file.h"
#include "base/log.h"
#include "base/save.h"
#include "ckpt/safetensors.h"

static bt_status_t errf(char *err, size_t cap, bt_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bt_status_t errf(char *err, size_t cap, bt_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && cap) vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return st;
}

/* ---- the index in memory ---------------------------------------------------- */

void ckpt_index_free(ckpt_index_t *idx)
{
    if (!idx) return;
    for (int i = 0; i < idx->n_tensors; i++) free(idx->tensors[i].pieces);
    free(idx->tensors);
    free(idx->files);
    free(idx->meta);
    memset(idx, 0, sizeof *idx);
}

const ckpt_tensor_t *ckpt_index_find(const ckpt_index_t *idx, const char *tensor)
{
    for (int i = 0; i < idx->n_tensors; i++)
        if (!strcmp(idx->tensors[i].name, tensor)) return &idx->tensors[i];
    return NULL;
}

bt_status_t ckpt_index_set_meta(ckpt_index_t *idx, const char *json_object)
{
    json_error_t je;
    json_t *o = json_loads(json_object, JSON_REJECT_DUPLICATES, &je);
    bool ok = json_is_object(o);
    json_decref(o);
    if (!ok) return BT_ERR_INVALID;
    char *m = strdup(json_object);
    if (!m) return BT_ERR_NOMEM;
    free(idx->meta);
    idx->meta = m;
    return BT_OK;
}

/* Whether pieces of dtype dt and global shape[ndim] belong to tensor t. */
static bool tensor_matches(const ckpt_tensor_t *t, dtype_t dt, int ndim, const int64_t *shape)
{
    bool same = t->dtype == dt && t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    return same;
}

/* The tensor `name` of idx, added (with dtype and shape) when new. */
static bt_status_t tensor_get(ckpt_index_t *idx, const char *name, dtype_t dt, int ndim,
                              const int64_t *shape, ckpt_tensor_t **out, char *err, size_t cap)
{
    for (int i = 0; i < idx->n_tensors; i++) {
        ckpt_tensor_t *t = &idx->tensors[i];
        if (strcmp(t->name, name)) continue;
        if (!tensor_matches(t, dt, ndim, shape)) return errf(err, cap, BT_ERR_INVALID, "tensor %s: pieces of two dtypes or global shapes", name);
        *out = t;
        return BT_OK;
    }
    if (strlen(name) >= CKPT_NAME_MAX) return errf(err, cap, BT_ERR_INVALID, "tensor name %.40s... too long", name);
    ckpt_tensor_t *ts = realloc(idx->tensors, (size_t)(idx->n_tensors + 1) * sizeof *ts);
    if (!ts) return BT_ERR_NOMEM;
    idx->tensors = ts;
    ckpt_tensor_t *t = &ts[idx->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt;
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    *out = t;
    return BT_OK;
}

static bt_status_t piece_add(ckpt_tensor_t *t, const ckpt_piece_t *p)
{
    ckpt_piece_t *ps = realloc(t->pieces, (size_t)(t->n_pieces + 1) * sizeof *ps);
    if (!ps) return BT_ERR_NOMEM;
    t->pieces = ps;
    ps[t->n_pieces++] = *p;
    return BT_OK;
}

static int file_find(const ckpt_index_t *idx, const char *name)
{
    for (int i = 0; i < idx->n_files; i++)
        if (!strcmp(idx->files[i].name, name)) return i;
    return -1;
}

static bt_status_t file_add(ckpt_index_t *idx, const ckpt_file_t *f, uint32_t *at, char *err, size_t cap)
{
    if (file_find(idx, f->name) >= 0) return errf(err, cap, BT_ERR_INVALID, "shard file %s twice", f->name);
    ckpt_file_t *fs = realloc(idx->files, (size_t)(idx->n_files + 1) * sizeof *fs);
    if (!fs) return BT_ERR_NOMEM;
    idx->files = fs;
    fs[idx->n_files] = *f;
    *at = (uint32_t)idx->n_files++;
    return BT_OK;
}

/* A plain name in the step directory: no path, nothing hidden. */
static bool plain_file_name(const char *s)
{
    size_t n = strlen(s);
    return n > 0 && n < CKPT_FILE_MAX && s[0] != '.' && !strchr(s, '/');
}

/* ---- mapping a shard file ------------------------------------------------------ */

/* A shard file mapped read-only once: its bytes are hashed and its
 * safetensors header parsed from the same mapping. */
typedef struct {
    void           *map;
    size_t          size;
    ckpt_st_file_t *st;   /* parsed from map */
} shard_map_t;

static void shard_unmap(shard_map_t *m)
{
    ckpt_st_close(m->st);
    if (m->map) munmap(m->map, m->size);
    memset(m, 0, sizeof *m);
}

/* Maps path; with want (a reader), its size and hash must be the index's
 * before the header is parsed; without (the writer), info gets them. */
#define SHARD_RELEASE_BYTES ((size_t)8 << 20)

static bt_status_t shard_map(const char *path, const ckpt_file_t *want, ckpt_file_t *info, shard_map_t *m,
                             char *err, size_t cap)
{
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb)) {
        bt_status_t st = errf(err, cap, errno == ENOENT ? BT_ERR_NOT_FOUND : BT_ERR_IO, "%s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return st;
    }
    if (want && (uint64_t)sb.st_size != want->bytes) {
        close(fd);
        return errf(err, cap, BT_ERR_CORRUPT, "%s: %lld bytes, the index says %llu (truncated or replaced)", path,
                    (long long)sb.st_size, (unsigned long long)want->bytes);
    }
    m->size = (size_t)sb.st_size;
    m->map = m->size ? mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    close(fd);
    if (m->map == MAP_FAILED) {
        m->map = NULL;
        return errf(err, cap, BT_ERR_CORRUPT, "%s: cannot map %zu bytes (empty?)", path, m->size);
    }
    /* hashed in 8 MB steps, each given back to the kernel once hashed (the
     * pages stay in the page cache): checking a file of any size keeps a few
     * MB of it resident, not the whole file */
    XXH3_state_t *xs = XXH3_createState();
    if (!xs) {
        shard_unmap(m);
        return errf(err, cap, BT_ERR_NOMEM, "%s: out of memory", path);
    }
    XXH3_64bits_reset(xs);
    for (size_t at = 0; at < m->size; at += SHARD_RELEASE_BYTES) {
        size_t n = m->size - at < SHARD_RELEASE_BYTES ? m->size - at : SHARD_RELEASE_BYTES;
        XXH3_64bits_update(xs, (const uint8_t *)m->map + at, n);
        base_pages_release((const uint8_t *)m->map + at, n);
    }
    uint64_t hash = XXH3_64bits_digest(xs);
    XXH3_freeState(xs);
    if (want && hash != want->xxh3) {
        shard_unmap(m);
        return errf(err, cap, BT_ERR_CORRUPT, "%s: checksum %016llx, the index says %016llx (the file is damaged)", path,
                    (unsigned long long)hash, (unsigned long long)want->xxh3);
    }
    if (info) {
        info->bytes = m->size;
        info->xxh3 = hash;
    }
    bt_status_t st = ckpt_st_parse(m->map, m->size, path, &m->st);
    if (st) {
        shard_unmap(m);
        return errf(err, cap, st, "%s: not a readable safetensors file", path);
    }
    return BT_OK;
}

/* Byte offset of tensor t's data in the mapped file. */
static uint64_t shard_offset(const shard_map_t *m, const ckpt_st_tensor_t *t)
{
    return (uint64_t)((const uint8_t *)t->data - (const uint8_t *)m->map);
}

/* ---- writing ------------------------------------------------------------------ */

bt_status_t ckpt_shard_write(ckpt_index_t *idx, const char *dir, const char *file,
                             const ckpt_put_t *puts, int n, char *err, size_t errlen)
{
    return ckpt_shard_write_fill(idx, dir, file, puts, n, NULL, NULL, err, errlen);
}

bt_status_t ckpt_shard_write_fill(ckpt_index_t *idx, const char *dir, const char *file,
                                  const ckpt_put_t *puts, int n, ckpt_st_fill_fn fill, void *arg,
                                  char *err, size_t errlen)
{
    if (!plain_file_name(file)) return errf(err, errlen, BT_ERR_INVALID, "shard file name '%s'", file);
    if (file_find(idx, file) >= 0) return errf(err, errlen, BT_ERR_INVALID, "shard file %s twice", file);
    /* refused puts are refused before anything is written */
    for (int i = 0; i < n; i++) {
        const ckpt_put_t *p = &puts[i];
        const ckpt_tensor_t *t = ckpt_index_find(idx, p->tensor);
        for (int k = 0; k < i && !t; k++)
            if (!strcmp(puts[k].tensor, p->tensor)) { /* an earlier put of this call */
                bool same = puts[k].dtype == p->dtype && shard_same_global(&puts[k].spec, &p->spec);
                if (!same)
                    return errf(err, errlen, BT_ERR_INVALID, "tensor %s: pieces of two dtypes or global shapes", p->tensor);
                break;
            }
        if (t && !tensor_matches(t, p->dtype, p->spec.ndim, p->spec.global))
            return errf(err, errlen, BT_ERR_INVALID, "tensor %s: pieces of two dtypes or global shapes", p->tensor);
        if (strlen(p->tensor) >= CKPT_NAME_MAX - 12)
            return errf(err, errlen, BT_ERR_INVALID, "tensor name %.40s... too long", p->tensor);
    }
    ckpt_st_entry_t *ents = calloc((size_t)n + 1, sizeof *ents);
    char (*keys)[CKPT_NAME_MAX + 16] = calloc((size_t)n + 1, sizeof *keys);
    bt_status_t st = ents && keys ? BT_OK : BT_ERR_NOMEM;
    for (int i = 0; i < n && !st; i++) {
        const ckpt_put_t *p = &puts[i];
        if (!ckpt_st_dtype_name(p->dtype)) st = errf(err, errlen, BT_ERR_UNSUPPORTED, "tensor %s: dtype %s", p->tensor, dtype_name(p->dtype));
        int64_t shape[SHARD_MAX_DIMS];
        int nd = shard_local_shape(&p->spec, shape);
        snprintf(keys[i], sizeof keys[i], "%s#%d", p->tensor, i);
        ents[i] = (ckpt_st_entry_t){.name = keys[i],
                                    .t = tensor_make((void *)p->data, p->dtype, DEVICE_CPU, nd, shape)};
    }
    char path[BASE_SAVE_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    const char *meta[] = {"format", CKPT_MAGIC};
    /* the file's size, hash and the pieces' offsets come from the bytes as
     * they are written: nothing is read back */
    uint64_t *offs = calloc((size_t)n + 1, sizeof *offs);
    ckpt_st_written_t wr = {.offsets = offs};
    if (!st && !offs) st = BT_ERR_NOMEM;
    if (!st && (st = ckpt_st_write_fill(path, ents, n, meta, 1, fill, arg, &wr)))
        errf(err, errlen, st, "%s: cannot write the shard file (%s)", path, bt_status_str(st));
    ckpt_file_t info = {.bytes = wr.bytes, .xxh3 = wr.xxh3};
    snprintf(info.name, sizeof info.name, "%s", file);
    uint32_t fi = 0;
    if (!st) st = file_add(idx, &info, &fi, err, errlen);
    for (int i = 0; i < n && !st; i++) {
        const ckpt_put_t *p = &puts[i];
        ckpt_tensor_t *ct;
        st = tensor_get(idx, p->tensor, p->dtype, p->spec.ndim, p->spec.global, &ct, err, errlen);
        ckpt_piece_t pc = {.file = fi, .offset = offs[i], .spec = p->spec};
        snprintf(pc.key, sizeof pc.key, "%s", keys[i]);
        if (!st) st = piece_add(ct, &pc);
    }
    free(offs);
    free(ents);
    free(keys);
    return st;
}

bt_status_t ckpt_index_merge(ckpt_index_t *into, const ckpt_index_t *from, char *err, size_t errlen)
{
    uint32_t *map = calloc((size_t)from->n_files + 1, sizeof *map);
    if (!map) return BT_ERR_NOMEM;
    bt_status_t st = BT_OK;
    for (int i = 0; i < from->n_files && !st; i++) st = file_add(into, &from->files[i], &map[i], err, errlen);
    for (int i = 0; i < from->n_tensors && !st; i++) {
        const ckpt_tensor_t *t = &from->tensors[i];
        ckpt_tensor_t *ct;
        st = tensor_get(into, t->name, t->dtype, t->ndim, t->shape, &ct, err, errlen);
        for (int k = 0; k < t->n_pieces && !st; k++) {
            ckpt_piece_t p = t->pieces[k];
            p.file = map[p.file];
            st = piece_add(ct, &p);
        }
    }
    free(map);
    return st;
}

static json_t *ints(const int64_t *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

char *ckpt_index_dump(const ckpt_index_t *idx)
{
    json_t *root = json_object(), *files = json_array(), *tensors = json_object();
    json_object_set_new(root, "magic", json_string(CKPT_MAGIC));
    json_object_set_new(root, "version", json_integer(CKPT_VERSION));
    json_error_t je;
    json_t *meta = json_loads(idx->meta ? idx->meta : "{}", JSON_REJECT_DUPLICATES, &je);
    json_object_set_new(root, "meta", meta ? meta : json_object());
    for (int i = 0; i < idx->n_files; i++) {
        const ckpt_file_t *f = &idx->files[i];
        char h[17];
        snprintf(h, sizeof h, "%016llx", (unsigned long long)f->xxh3);
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(f->name));
        json_object_set_new(o, "bytes", json_integer((json_int_t)f->bytes));
        json_object_set_new(o, "xxh3", json_string(h));
        json_array_append_new(files, o);
    }
    for (int i = 0; i < idx->n_tensors; i++) {
        const ckpt_tensor_t *t = &idx->tensors[i];
        json_t *o = json_object(), *ps = json_array();
        json_object_set_new(o, "dtype", json_string(ckpt_st_dtype_name(t->dtype)));
        json_object_set_new(o, "shape", ints(t->shape, t->ndim));
        for (int k = 0; k < t->n_pieces; k++) {
            const ckpt_piece_t *p = &t->pieces[k];
            json_t *po = json_object();
            json_object_set_new(po, "file", json_integer(p->file));
            json_object_set_new(po, "key", json_string(p->key));
            json_object_set_new(po, "offset", json_integer((json_int_t)p->offset));
            json_object_set_new(po, "start", ints(p->spec.offset, p->spec.ndim));
            json_object_set_new(po, "extent", ints(p->spec.extent, p->spec.ndim));
            if (p->spec.flat_len >= 0)
                json_object_set_new(po, "flat", ints((int64_t[]){p->spec.flat_start, p->spec.flat_len}, 2));
            json_array_append_new(ps, po);
        }
        json_object_set_new(o, "pieces", ps);
        json_object_set_new(tensors, t->name, o);
    }
    json_object_set_new(root, "files", files);
    json_object_set_new(root, "tensors", tensors);
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return text;
}

bt_status_t ckpt_index_write(const ckpt_index_t *idx, const char *dir)
{
    char *text = ckpt_index_dump(idx);
    if (!text) return BT_ERR_NOMEM;
    char path[BASE_SAVE_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_INDEX_FILE);
    bt_status_t st = base_save_file(path, text, strlen(text), 0644);
    free(text);
    return st;
}

/* ---- parsing ------------------------------------------------------------------ */

#define DIM_MAX (((int64_t)1) << 40)

/* n integers in [lo, DIM_MAX] from a JSON array of exactly n. */
static bool int_array(json_t *a, int64_t *out, int n, int64_t lo)
{
    if (!json_is_array(a) || (int)json_array_size(a) != n) return false;
    for (int i = 0; i < n; i++) {
        json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > DIM_MAX) return false;
        out[i] = json_integer_value(v);
    }
    return true;
}

static bt_status_t parse_piece(json_t *po, const ckpt_tensor_t *t, int k, const ckpt_index_t *idx,
                               const char *what, ckpt_piece_t *p, char *err, size_t cap)
{
    json_t *jf = json_object_get(po, "file"), *jk = json_object_get(po, "key"),
           *jo = json_object_get(po, "offset"), *jfl = json_object_get(po, "flat");
    if (!json_is_object(po) || !json_is_integer(jf) || !json_is_string(jk) || !json_is_integer(jo))
        return errf(err, cap, BT_ERR_CORRUPT, "%s: tensor %s piece %d: needs integer 'file', string 'key', integer 'offset'",
                    what, t->name, k);
    if (json_integer_value(jf) < 0 || json_integer_value(jf) >= idx->n_files)
        return errf(err, cap, BT_ERR_CORRUPT, "%s: tensor %s piece %d: file %lld is not in 'files'", what, t->name, k,
                    (long long)json_integer_value(jf));
    if (json_integer_value(jo) < 0)
        return errf(err, cap, BT_ERR_CORRUPT, "%s: tensor %s piece %d: negative offset", what, t->name, k);
    const char *key = json_string_value(jk);
    if (!key[0] || strlen(key) >= CKPT_NAME_MAX)
        return errf(err, cap, BT_ERR_CORRUPT, "%s: tensor %s piece %d: key empty or too long", what, t->name, k);
    memset(p, 0, sizeof *p);
    p->file = (uint32_t)json_integer_value(jf);
    p->offset = (uint64_t)json_integer_value(jo);
    snprintf(p->key, sizeof p->key, "%s", key);
    p->spec = shard_whole(t->ndim, t->shape);
    if (!int_array(json_object_get(po, "start"), p->spec.offset, t->ndim, 0) ||
        !int_array(json_object_get(po, "extent"), p->spec.extent, t->ndim, 0))
        return errf(err, cap, BT_ERR_CORRUPT, "%s: tensor %s piece %d: 'start' and 'extent' must be %d non-negative integers",
                    what, t->name, k, t->ndim);
    int64_t box = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (p->spec.offset[d] + p->spec.extent[d] > t->shape[d])
            return errf(err, cap, BT_ERR_CORRUPT, "%s: tensor %s piece %d: dim %d [%lld, +%lld) beyond the global %lld",
                        what, t->name, k, d, (long long)p->spec.offset[d], (long long)p->spec.extent[d],
                        (long long)t->shape[d]);
        box *= p->spec.extent[d]; /* <= the global numel, checked below int64 */
    }
    if (jfl) {
        int64_t fl[2];
        if (!int_array(jfl, fl, 2, 0) || fl[0] + fl[1] > box)
            return errf(err, cap, BT_ERR_CORRUPT, "%s: tensor %s piece %d: 'flat' must be [start, len] inside its box of %lld",
                        what, t->name, k, (long long)box);
        p->spec.flat_start = fl[0];
        p->spec.flat_len = fl[1];
    }
    return BT_OK;
}

bt_status_t ckpt_index_parse(const char *text, size_t len, const char *what, ckpt_index_t *idx,
                             char *err, size_t cap)
{
    memset(idx, 0, sizeof *idx);
    if (len > CKPT_INDEX_MAX_BYTES) return errf(err, cap, BT_ERR_CORRUPT, "%s: %zu bytes, more than an index may hold", what, len);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return errf(err, cap, BT_ERR_CORRUPT, "%s: not JSON (line %d: %s)", what, je.line, je.text);
    bt_status_t st = BT_OK;
    json_t *jm = json_object_get(root, "magic"), *jv = json_object_get(root, "version"),
           *jmeta = json_object_get(root, "meta"), *jfiles = json_object_get(root, "files"),
           *jts = json_object_get(root, "tensors");
    if (!json_is_object(root) || !json_is_string(jm) || strcmp(json_string_value(jm), CKPT_MAGIC)) {
        st = errf(err, cap, BT_ERR_CORRUPT, "%s: not a baton checkpoint index (magic)", what);
        goto out;
    }
    if (!json_is_integer(jv) || json_integer_value(jv) < 1) {
        st = errf(err, cap, BT_ERR_CORRUPT, "%s: 'version' is not a positive integer", what);
        goto out;
    }
    if (json_integer_value(jv) > CKPT_VERSION) {
        st = errf(err, cap, BT_ERR_UNSUPPORTED, "%s: index version %lld is newer than this build reads (%d)", what,
                  (long long)json_integer_value(jv), CKPT_VERSION);
        goto out;
    }
    idx->version = (int)json_integer_value(jv);
    if (!json_is_object(jmeta) || !json_is_array(jfiles) || !json_is_object(jts)) {
        st = errf(err, cap, BT_ERR_CORRUPT, "%s: needs object 'meta', array 'files', object 'tensors'", what);
        goto out;
    }
    if (!(idx->meta = json_dumps(jmeta, JSON_COMPACT))) {
        st = BT_ERR_NOMEM;
        goto out;
    }
    size_t nf = json_array_size(jfiles);
    if (nf > 1u << 20 || !(idx->files = calloc(nf + 1, sizeof *idx->files))) {
        st = nf > 1u << 20 ? errf(err, cap, BT_ERR_CORRUPT, "%s: %zu files", what, nf) : BT_ERR_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < nf; i++) {
        json_t *fo = json_array_get(jfiles, i), *jn = json_object_get(fo, "name"),
               *jb = json_object_get(fo, "bytes"), *jh = json_object_get(fo, "xxh3");
        const char *h = json_string_value(jh);
        unsigned long long hv = 0;
        int used = 0;
        if (!json_is_object(fo) || !json_is_string(jn) || !plain_file_name(json_string_value(jn)) ||
            !json_is_integer(jb) || json_integer_value(jb) < 0 || !h || strlen(h) != 16 ||
            sscanf(h, "%16llx%n", &hv, &used) != 1 || used != 16) {
            st = errf(err, cap, BT_ERR_CORRUPT, "%s: files[%zu]: needs a plain 'name', integer 'bytes', 16 hex digits 'xxh3'",
                      what, i);
            goto out;
        }
        ckpt_file_t *f = &idx->files[i];
        snprintf(f->name, sizeof f->name, "%s", json_string_value(jn));
        f->bytes = (uint64_t)json_integer_value(jb);
        f->xxh3 = hv;
        if (file_find(idx, f->name) >= 0) {
            st = errf(err, cap, BT_ERR_CORRUPT, "%s: file %s listed twice", what, f->name);
            goto out;
        }
        idx->n_files++;
    }
    size_t nt = json_object_size(jts);
    if (!(idx->tensors = calloc(nt + 1, sizeof *idx->tensors))) {
        st = BT_ERR_NOMEM;
        goto out;
    }
    const char *name;
    json_t *to;
    json_object_foreach(jts, name, to) {
        ckpt_tensor_t *t = &idx->tensors[idx->n_tensors];
        json_t *jd = json_object_get(to, "dtype"), *js = json_object_get(to, "shape"),
               *jp = json_object_get(to, "pieces");
        if (!name[0] || strlen(name) >= CKPT_NAME_MAX) {
            st = errf(err, cap, BT_ERR_CORRUPT, "%s: a tensor name is empty or too long", what);
            goto out;
        }
        snprintf(t->name, sizeof t->name, "%s", name);
        if (!json_is_object(to) || !json_is_string(jd) || !ckpt_st_dtype_from_name(json_string_value(jd), &t->dtype)) {
            st = errf(err, cap, BT_ERR_CORRUPT, "%s: tensor %s: no known 'dtype'", what, name);
            goto out;
        }
        size_t nd = json_array_size(js);
        int64_t numel = 1;
        if (!json_is_array(js) || nd < 1 || nd > SHARD_MAX_DIMS || !int_array(js, t->shape, (int)nd, 0)) {
            st = errf(err, cap, BT_ERR_CORRUPT, "%s: tensor %s: 'shape' must be 1..%d integers in [0, 2^40]", what, name,
                      SHARD_MAX_DIMS);
            goto out;
        }
        t->ndim = (int)nd;
        for (size_t d = 0; d < nd; d++) {
            if (t->shape[d] && numel > (((int64_t)1) << 50) / t->shape[d]) {
                st = errf(err, cap, BT_ERR_CORRUPT, "%s: tensor %s: more than 2^50 elements", what, name);
                goto out;
            }
            numel *= t->shape[d];
        }
        size_t np = json_array_size(jp);
        if (!json_is_array(jp) || np > 1u << 20 || !(t->pieces = calloc(np + 1, sizeof *t->pieces))) {
            st = json_is_array(jp) && np <= 1u << 20 ? BT_ERR_NOMEM
                 : errf(err, cap, BT_ERR_CORRUPT, "%s: tensor %s: 'pieces' is not an array", what, name);
            goto out;
        }
        idx->n_tensors++;
        for (size_t k = 0; k < np; k++) {
            if ((st = parse_piece(json_array_get(jp, k), t, (int)k, idx, what, &t->pieces[k], err, cap))) goto out;
            t->n_pieces++;
        }
    }
out:
    json_decref(root);
    if (st) ckpt_index_free(idx);
    return st;
}

bt_status_t ckpt_index_read(const char *dir, ckpt_index_t *idx, char *err, size_t cap)
{
    char path[BASE_SAVE_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_INDEX_FILE);
    char *text = NULL;
    size_t len = 0;
    bt_status_t st = base_file_read(path, CKPT_INDEX_MAX_BYTES, &text, &len);
    if (st) {
        memset(idx, 0, sizeof *idx);
        return errf(err, cap, st, "%s: cannot read (%s)", path, bt_status_str(st));
    }
    st = ckpt_index_parse(text, len, path, idx, err, cap);
    free(text);
    return st;
}

/* ---- coverage --------------------------------------------------------------- */

typedef struct {
    int64_t start, n;
    int     piece;
} grun_t;

typedef struct {
    grun_t *runs;
    size_t  n, cap;
    int     piece;
    bool    nomem;
} grun_list_t;

static void grun_add(void *arg, int64_t src_off, int64_t dst_off, int64_t n)
{
    (void)src_off;
    grun_list_t *l = arg;
    if (l->n == l->cap) {
        size_t c = l->cap ? l->cap * 2 : 64;
        grun_t *r = realloc(l->runs, c * sizeof *r);
        if (!r) {
            l->nomem = true;
            return;
        }
        l->runs = r;
        l->cap = c;
    }
    l->runs[l->n++] = (grun_t){dst_off, n, l->piece};
}

static int grun_cmp(const void *a, const void *b)
{
    const grun_t *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

bt_status_t ckpt_index_check(const ckpt_index_t *idx, char *err, size_t cap)
{
    for (int i = 0; i < idx->n_tensors; i++) {
        const ckpt_tensor_t *t = &idx->tensors[i];
        shard_spec_t whole = shard_whole(t->ndim, t->shape);
        int64_t numel = shard_global_numel(&whole);
        grun_list_t l = {0};
        for (int k = 0; k < t->n_pieces && !l.nomem; k++) {
            l.piece = k;
            shard_runs(&whole, &t->pieces[k].spec, grun_add, &l);
        }
        if (l.nomem) {
            free(l.runs);
            return BT_ERR_NOMEM;
        }
        if (l.n) qsort(l.runs, l.n, sizeof *l.runs, grun_cmp);
        int64_t at = 0;
        bt_status_t st = BT_OK;
        for (size_t r = 0; r < l.n && !st; r++) {
            const grun_t *g = &l.runs[r];
            if (g->start > at)
                st = errf(err, cap, BT_ERR_CORRUPT, "tensor %s: elements [%lld, %lld) are in no piece", t->name,
                          (long long)at, (long long)g->start);
            else if (g->start < at)
                st = errf(err, cap, BT_ERR_CORRUPT, "tensor %s: elements from %lld are in two pieces (%s and %s)",
                          t->name, (long long)g->start, t->pieces[l.runs[r - 1].piece].key, t->pieces[g->piece].key);
            at = g->start + g->n;
        }
        if (!st && at != numel)
            st = errf(err, cap, BT_ERR_CORRUPT, "tensor %s: elements [%lld, %lld) are in no piece", t->name,
                      (long long)at, (long long)numel);
        free(l.runs);
        if (st) return st;
    }
    return BT_OK;
}

/* ---- the reader --------------------------------------------------------------- */

struct ckpt_reader {
    ckpt_index_t     idx;
    char           **dirs;
    int              n_dirs;
    shard_map_t     *open;   /* [n_files], mapped and checked on first use */
    bool            *remote; /* [n_files] in none of the directories: fetched */
    ckpt_fetch_fn    fetch;
    void            *fetch_arg;
    uint64_t         fetched; /* bytes fetched so far */
};

void ckpt_reader_set_fetch(ckpt_reader_t *r, ckpt_fetch_fn fn, void *arg)
{
    r->fetch = fn;
    r->fetch_arg = arg;
}

uint64_t ckpt_reader_fetched(const ckpt_reader_t *r) { return r->fetched; }

const ckpt_index_t *ckpt_reader_index(const ckpt_reader_t *r) { return &r->idx; }

void ckpt_reader_close(ckpt_reader_t *r)
{
    if (!r) return;
    for (int i = 0; i < r->idx.n_files && r->open; i++) shard_unmap(&r->open[i]);
    for (int i = 0; i < r->n_dirs; i++) free(r->dirs[i]);
    free(r->dirs);
    free(r->open);
    free(r->remote);
    ckpt_index_free(&r->idx);
    free(r);
}

bt_status_t ckpt_reader_open(const char *const *dirs, int n, ckpt_reader_t **out, char *err, size_t cap)
{
    *out = NULL;
    ckpt_reader_t *r = calloc(1, sizeof *r);
    if (!r || !(r->dirs = calloc((size_t)n + 1, sizeof *r->dirs))) {
        free(r);
        return BT_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++) {
        if (!(r->dirs[i] = strdup(dirs[i]))) {
            ckpt_reader_close(r);
            return BT_ERR_NOMEM;
        }
        r->n_dirs++;
    }
    bt_status_t st = BT_ERR_NOT_FOUND;
    for (int i = 0; i < n && st == BT_ERR_NOT_FOUND; i++) {
        char path[BASE_SAVE_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dirs[i], CKPT_INDEX_FILE);
        if (access(path, F_OK)) continue;
        st = ckpt_index_read(dirs[i], &r->idx, err, cap);
    }
    if (st == BT_ERR_NOT_FOUND) errf(err, cap, st, "no %s in %s%s", CKPT_INDEX_FILE, n ? dirs[0] : "(no directory)",
                                     n > 1 ? " or the other directories" : "");
    if (!st) st = ckpt_index_check(&r->idx, err, cap);
    if (!st && (!(r->open = calloc((size_t)r->idx.n_files + 1, sizeof *r->open)) ||
                !(r->remote = calloc((size_t)r->idx.n_files + 1, sizeof *r->remote))))
        st = BT_ERR_NOMEM;
    if (st) {
        ckpt_reader_close(r);
        return st;
    }
    *out = r;
    return BT_OK;
}

/* The shard file i, found in the first directory that has it, its size
 * and hash checked against the index before anything of it is used. */
static bt_status_t reader_file(ckpt_reader_t *r, uint32_t i, const shard_map_t **out, char *err, size_t cap)
{
    if (!r->open[i].st) {
        const ckpt_file_t *f = &r->idx.files[i];
        char path[BASE_SAVE_PATH_MAX];
        int d = 0;
        for (; d < r->n_dirs; d++) {
            snprintf(path, sizeof path, "%s/%s", r->dirs[d], f->name);
            if (!access(path, F_OK)) break;
        }
        if (d == r->n_dirs)
            return errf(err, cap, BT_ERR_NOT_FOUND, "shard file %s is in none of the %d checkpoint directories",
                        f->name, r->n_dirs);
        bt_status_t st = shard_map(path, f, NULL, &r->open[i], err, cap);
        if (st) return st;
    }
    *out = &r->open[i];
    return BT_OK;
}

/* A piece of a file no directory has: its bytes from whoever has it (the
 * fetch hook), in requests of at most CKPT_FETCH_CHUNK, then copied where
 * they go. The server checked the file's size and hash before serving. */
#define CKPT_FETCH_CHUNK ((uint64_t)8 << 20)
static bt_status_t read_remote(ckpt_reader_t *r, const ckpt_piece_t *p, const shard_spec_t *want,
                               void *dst, size_t elem, char *err, size_t cap)
{
    uint64_t bytes = (uint64_t)shard_numel(&p->spec) * elem;
    const ckpt_file_t *f = &r->idx.files[p->file];
    if (p->offset > f->bytes || bytes > f->bytes - p->offset)
        return errf(err, cap, BT_ERR_CORRUPT, "%s: piece %s lies past the file's %llu bytes", f->name,
                    p->key, (unsigned long long)f->bytes);
    uint8_t *buf = malloc(bytes ? bytes : 1);
    if (!buf) return BT_ERR_NOMEM;
    bt_status_t st = BT_OK;
    for (uint64_t at = 0; at < bytes && !st; at += CKPT_FETCH_CHUNK) {
        uint64_t n = bytes - at < CKPT_FETCH_CHUNK ? bytes - at : CKPT_FETCH_CHUNK;
        st = r->fetch(r->fetch_arg, f->name, p->offset + at, n, buf + at, err, cap);
    }
    if (!st) {
        shard_copy(want, dst, &p->spec, buf, elem);
        r->fetched += bytes;
    }
    free(buf);
    return st;
}

bt_status_t ckpt_file_bytes(ckpt_reader_t *r, const char *file, uint64_t offset, uint64_t len,
                            void *dst, char *err, size_t cap)
{
    int i = file_find(&r->idx, file);
    if (i < 0) return errf(err, cap, BT_ERR_NOT_FOUND, "%s is not a file of this checkpoint", file);
    const shard_map_t *f;
    bt_status_t st = reader_file(r, (uint32_t)i, &f, err, cap);
    if (st) return st;
    if (offset > f->size || len > f->size - offset)
        return errf(err, cap, BT_ERR_INVALID, "%s: bytes [%llu, +%llu) past its %zu bytes", file,
                    (unsigned long long)offset, (unsigned long long)len, f->size);
    memcpy(dst, (const uint8_t *)f->map + offset, len);
    base_pages_release((const uint8_t *)f->map + offset, len);
    return BT_OK;
}

bt_status_t ckpt_read(ckpt_reader_t *r, const char *tensor, const shard_spec_t *want, void *dst,
                      char *err, size_t cap)
{
    const ckpt_tensor_t *t = ckpt_index_find(&r->idx, tensor);
    if (!t) return errf(err, cap, BT_ERR_NOT_FOUND, "tensor %s is not in the checkpoint", tensor);
    bool same = want->ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = want->global[d] == t->shape[d];
    if (!same) return errf(err, cap, BT_ERR_INVALID, "tensor %s: asked for a piece of another global shape", tensor);
    size_t elem = dtype_size(t->dtype);
    for (int k = 0; k < t->n_pieces; k++) {
        const ckpt_piece_t *p = &t->pieces[k];
        if (!shard_overlap(want, &p->spec, NULL)) continue;
        if (r->fetch && !r->open[p->file].st && !r->remote[p->file]) { /* where is it? */
            bool here = false;
            for (int d = 0; d < r->n_dirs && !here; d++) {
                char path[BASE_SAVE_PATH_MAX + CKPT_FILE_MAX + 2];
                snprintf(path, sizeof path, "%s/%s", r->dirs[d], r->idx.files[p->file].name);
                here = access(path, F_OK) == 0;
            }
            r->remote[p->file] = !here;
        }
        if (r->remote[p->file]) {
            bt_status_t st = read_remote(r, p, want, dst, elem, err, cap);
            if (st) return st;
            continue;
        }
        const shard_map_t *f;
        bt_status_t st = reader_file(r, p->file, &f, err, cap);
        if (st) return st;
        const ckpt_st_tensor_t *st_t = ckpt_st_find(f->st, p->key);
        if (!st_t || st_t->dtype != t->dtype || st_t->numel != shard_numel(&p->spec) ||
            shard_offset(f, st_t) != p->offset)
            return errf(err, cap, BT_ERR_CORRUPT, "%s: %s does not match the index (missing, or another dtype, size or place)",
                        f->st->path, p->key);
        shard_copy(want, dst, &p->spec, st_t->data, elem);
        /* pages of a piece read are not kept resident (a resharding read
         * may touch only part of a piece: the rest was never faulted in) */
        base_pages_release(st_t->data, (size_t)st_t->numel * elem);
    }
    return BT_OK;
}
