/* Token shard files and shard sets; contract and layout in data/shard.h. */
#include "base/le.h"
#include "data/shard.h"

#include "base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

enum {
    OFF_MAGIC = 0, OFF_VERSION = 8, OFF_HEADER_BYTES = 12, OFF_TOKEN_BYTES = 16,
    OFF_VOCAB = 20, OFF_COUNT = 24, OFF_CHECKSUM = 32, OFF_TOK_HASH = 40,
};
_Static_assert(OFF_TOK_HASH + 8 + 16 == SHARD_HEADER_BYTES, "shard header layout");

static uint32_t shard_token_bytes(uint32_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

static bt_status_t write_all(int fd, const void *buf, size_t n, const char *path)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            log_error("%s: write failed: %s", path, strerror(errno));
            return BT_ERR_IO;
        }
        p += w;
        n -= (size_t)w;
    }
    return BT_OK;
}

bt_status_t shard_file_write(const char *path, const uint32_t *ids, uint64_t n,
                             uint32_t vocab_size, uint64_t tokenizer_hash)
{
    uint32_t tb = shard_token_bytes(vocab_size);
    size_t payload_len = (size_t)n * tb;
    uint8_t *payload = malloc(payload_len ? payload_len : 1);
    if (!payload) return BT_ERR_NOMEM;
    for (uint64_t i = 0; i < n; i++) {
        if (ids[i] >= vocab_size) {
            log_error("%s: token %" PRIu64 " is id %u, outside the vocabulary (%u)", path, i,
                      ids[i], vocab_size);
            free(payload);
            return BT_ERR_INVALID;
        }
        if (tb == 2) {
            payload[2 * i] = (uint8_t)ids[i];
            payload[2 * i + 1] = (uint8_t)(ids[i] >> 8);
        } else {
            le_put32(payload + 4 * i, ids[i]);
        }
    }
    uint8_t hdr[SHARD_HEADER_BYTES] = {0};
    memcpy(hdr + OFF_MAGIC, SHARD_MAGIC, 8);
    le_put32(hdr + OFF_VERSION, SHARD_VERSION);
    le_put32(hdr + OFF_HEADER_BYTES, SHARD_HEADER_BYTES);
    le_put32(hdr + OFF_TOKEN_BYTES, tb);
    le_put32(hdr + OFF_VOCAB, vocab_size);
    le_put64(hdr + OFF_COUNT, n);
    le_put64(hdr + OFF_CHECKSUM, XXH64(payload, payload_len, 0));
    le_put64(hdr + OFF_TOK_HASH, tokenizer_hash);

    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    bt_status_t st = BT_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        log_error("%s: cannot create: %s", tmp, strerror(errno));
        st = BT_ERR_IO;
        goto out_payload;
    }
    st = write_all(fd, hdr, sizeof hdr, tmp);
    if (st == BT_OK) st = write_all(fd, payload, payload_len, tmp);
    if (close(fd) && st == BT_OK) {
        log_error("%s: close failed: %s", tmp, strerror(errno));
        st = BT_ERR_IO;
    }
    if (st == BT_OK && rename(tmp, path)) {
        log_error("%s: rename to %s failed: %s", tmp, path, strerror(errno));
        st = BT_ERR_IO;
    }
    if (st != BT_OK) unlink(tmp);
out_payload:
    free(payload);
    return st;
}

bt_status_t shard_file_open(const char *path, shard_file_t *out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        log_error("%s: cannot open shard: %s", path, strerror(errno));
        return errno == ENOENT ? BT_ERR_NOT_FOUND : BT_ERR_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb)) {
        log_error("%s: stat failed: %s", path, strerror(errno));
        close(fd);
        return BT_ERR_IO;
    }
    size_t size = (size_t)sb.st_size;
    if (size < SHARD_HEADER_BYTES) {
        log_error("%s: truncated shard: %zu bytes, less than the %u-byte header", path, size,
                  SHARD_HEADER_BYTES);
        close(fd);
        return BT_ERR_CORRUPT;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        log_error("%s: mmap failed: %s", path, strerror(errno));
        return BT_ERR_IO;
    }
    const uint8_t *h = map;
    bt_status_t st = BT_ERR_CORRUPT;
    uint32_t version = le_get32(h + OFF_VERSION), hb = le_get32(h + OFF_HEADER_BYTES);
    uint32_t tb = le_get32(h + OFF_TOKEN_BYTES);
    uint64_t n = le_get64(h + OFF_COUNT);
    if (memcmp(h + OFF_MAGIC, SHARD_MAGIC, 8)) {
        log_error("%s: not a token shard (bad magic)", path);
        goto fail_map;
    }
    if (version != SHARD_VERSION) {
        log_error("%s: shard version %u is not supported (this build reads version %u)", path,
                  version, SHARD_VERSION);
        st = BT_ERR_UNSUPPORTED;
        goto fail_map;
    }
    if (hb < SHARD_HEADER_BYTES || hb > size) {
        log_error("%s: bad header size %u (file %zu bytes)", path, hb, size);
        goto fail_map;
    }
    if (tb != 2 && tb != 4) {
        log_error("%s: bad token width %u bytes (want 2 or 4)", path, tb);
        goto fail_map;
    }
    if (n > (size - hb) / tb || (size - hb) != n * tb) {
        log_error("%s: %s: header says %" PRIu64 " tokens (%" PRIu64 " bytes), file has %zu "
                  "payload bytes", path, (size - hb) < n * tb ? "truncated" : "trailing bytes",
                  n, n * tb, size - hb);
        goto fail_map;
    }
    uint64_t sum = XXH64(h + hb, (size_t)(n * tb), 0);
    if (sum != le_get64(h + OFF_CHECKSUM)) {
        log_error("%s: checksum mismatch: payload XXH64 %016" PRIx64 ", header says %016" PRIx64,
                  path, sum, le_get64(h + OFF_CHECKSUM));
        goto fail_map;
    }
    *out = (shard_file_t){.map = map, .map_len = size, .payload = h + hb, .n_tokens = n,
                          .token_bytes = tb, .vocab_size = le_get32(h + OFF_VOCAB),
                          .tokenizer_hash = le_get64(h + OFF_TOK_HASH), .checksum = sum};
    return BT_OK;

fail_map:
    munmap(map, size);
    return st;
}

void shard_file_close(shard_file_t *f)
{
    if (f->map) munmap(f->map, f->map_len);
    memset(f, 0, sizeof *f);
}

/* ---------- writer ---------- */

struct shard_writer {
    char *dir;
    uint32_t vocab_size;
    uint64_t tokenizer_hash;
    uint64_t shard_tokens;
    uint32_t *buf;
    size_t n, cap;
    uint64_t total;
    uint64_t input_start; /* total at the previous mark */
    json_t *shards, *inputs, *index;
};

bt_status_t shard_writer_open(const char *dir, uint32_t vocab_size, uint64_t tokenizer_hash,
                              int64_t bos, int64_t eos, uint64_t shard_tokens,
                              shard_writer_t **out)
{
    if (mkdir(dir, 0755) && errno != EEXIST) {
        log_error("%s: cannot create directory: %s", dir, strerror(errno));
        return BT_ERR_IO;
    }
    /* an index from an earlier run goes first: until this run's index is
     * written, the directory must not open as a (stale) shard set */
    char old_index[4096];
    snprintf(old_index, sizeof old_index, "%s/index.json", dir);
    if (unlink(old_index) && errno != ENOENT) {
        log_error("%s: cannot remove the previous index: %s", old_index, strerror(errno));
        return BT_ERR_IO;
    }
    shard_writer_t *w = calloc(1, sizeof *w);
    if (!w) return BT_ERR_NOMEM;
    w->dir = strdup(dir);
    w->vocab_size = vocab_size;
    w->tokenizer_hash = tokenizer_hash;
    w->shard_tokens = shard_tokens ? shard_tokens : 1;
    w->shards = json_array();
    w->inputs = json_array();
    w->index = json_object();
    if (!w->dir || !w->shards || !w->inputs || !w->index) {
        shard_writer_abort(w);
        return BT_ERR_NOMEM;
    }
    char hex[32];
    snprintf(hex, sizeof hex, "%016" PRIx64, tokenizer_hash);
    json_object_set_new(w->index, "format", json_string("baton-token-shards"));
    json_object_set_new(w->index, "version", json_integer(SHARD_VERSION));
    json_object_set_new(w->index, "tokenizer_xxh64", json_string(hex));
    json_object_set_new(w->index, "vocab_size", json_integer(vocab_size));
    json_object_set_new(w->index, "dtype", json_string(shard_token_bytes(vocab_size) == 2 ? "u16" : "u32"));
    json_object_set_new(w->index, "bos", json_integer(bos));
    json_object_set_new(w->index, "eos", json_integer(eos));
    *out = w;
    return BT_OK;
}

static bt_status_t shard_writer_flush(shard_writer_t *w)
{
    if (!w->n) return BT_OK;
    char name[64], path[4096];
    snprintf(name, sizeof name, "shard_%05zu.bin", json_array_size(w->shards));
    snprintf(path, sizeof path, "%s/%s", w->dir, name);
    bt_status_t st = shard_file_write(path, w->buf, w->n, w->vocab_size, w->tokenizer_hash);
    if (st != BT_OK) return st;
    /* the checksum the file carries, recomputed from what we wrote */
    shard_file_t f;
    st = shard_file_open(path, &f);
    if (st != BT_OK) return st;
    char hex[32];
    snprintf(hex, sizeof hex, "%016" PRIx64, f.checksum);
    shard_file_close(&f);
    json_t *e = json_object();
    json_object_set_new(e, "file", json_string(name));
    json_object_set_new(e, "tokens", json_integer((json_int_t)w->n));
    json_object_set_new(e, "xxh64", json_string(hex));
    json_array_append_new(w->shards, e);
    w->n = 0;
    return BT_OK;
}

bt_status_t shard_writer_append(shard_writer_t *w, const uint32_t *ids, size_t n)
{
    while (n) {
        if (w->n == w->cap) {
            size_t cap = w->cap ? w->cap * 2 : 1 << 16;
            if (cap > w->shard_tokens) cap = (size_t)w->shard_tokens;
            uint32_t *b = realloc(w->buf, cap * sizeof *b);
            if (!b) return BT_ERR_NOMEM;
            w->buf = b;
            w->cap = cap;
        }
        size_t take = w->cap - w->n;
        if (take > n) take = n;
        memcpy(w->buf + w->n, ids, take * sizeof *ids);
        w->n += take;
        w->total += take;
        ids += take;
        n -= take;
        if (w->n == w->shard_tokens) {
            bt_status_t st = shard_writer_flush(w);
            if (st != BT_OK) return st;
        }
    }
    return BT_OK;
}

bt_status_t shard_writer_mark_input(shard_writer_t *w, const char *name, uint64_t bytes)
{
    json_t *e = json_object();
    if (!e) return BT_ERR_NOMEM;
    json_object_set_new(e, "file", json_string(name));
    json_object_set_new(e, "bytes", json_integer((json_int_t)bytes));
    json_object_set_new(e, "first_token", json_integer((json_int_t)w->input_start));
    json_object_set_new(e, "tokens", json_integer((json_int_t)(w->total - w->input_start)));
    json_array_append_new(w->inputs, e);
    w->input_start = w->total;
    return BT_OK;
}

void shard_writer_abort(shard_writer_t *w)
{
    if (!w) return;
    json_decref(w->shards);
    json_decref(w->inputs);
    json_decref(w->index);
    free(w->buf);
    free(w->dir);
    free(w);
}

bt_status_t shard_writer_close(shard_writer_t *w)
{
    bt_status_t st = shard_writer_flush(w);
    if (st != BT_OK) goto out;
    json_object_set_new(w->index, "total_tokens", json_integer((json_int_t)w->total));
    json_object_set(w->index, "shards", w->shards);
    json_object_set(w->index, "inputs", w->inputs);
    char path[4096], tmp[4100];
    snprintf(path, sizeof path, "%s/index.json", w->dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (json_dump_file(w->index, tmp, JSON_INDENT(1) | JSON_PRESERVE_ORDER)) {
        log_error("%s: cannot write", tmp);
        st = BT_ERR_IO;
        goto out;
    }
    if (rename(tmp, path)) {
        log_error("%s: rename failed: %s", tmp, strerror(errno));
        st = BT_ERR_IO;
        goto out;
    }
    /* shards of an earlier, longer run would only confuse a reader */
    for (size_t k = json_array_size(w->shards);; k++) {
        char stale[4096];
        snprintf(stale, sizeof stale, "%s/shard_%05zu.bin", w->dir, k);
        if (unlink(stale)) break;
    }
out:
    shard_writer_abort(w);
    return st;
}

/* ---------- reader ---------- */

struct shard_set {
    shard_file_t *files;
    uint64_t *first; /* first global token of each shard; first[n_files] = total */
    size_t n_files;
    uint32_t vocab_size;
    uint64_t tokenizer_hash;
};

void shard_set_close(shard_set_t *set)
{
    if (!set) return;
    for (size_t i = 0; i < set->n_files; i++) shard_file_close(&set->files[i]);
    free(set->files);
    free(set->first);
    free(set);
}

static int parse_hex64(const char *s, uint64_t *v)
{
    if (!s || strlen(s) != 16) return 0;
    char *end;
    errno = 0;
    *v = strtoull(s, &end, 16);
    return !errno && *end == '\0';
}

bt_status_t shard_set_open(const char *dir, shard_set_t **out)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/index.json", dir);
    if (access(path, F_OK)) {
        log_error("%s: no shard index (%s); run `baton data prepare` first", path, strerror(errno));
        return BT_ERR_NOT_FOUND;
    }
    json_error_t jerr;
    json_t *idx = json_load_file(path, 0, &jerr);
    if (!idx) {
        log_error("%s: cannot read index: %s (line %d)", path, jerr.text, jerr.line);
        return BT_ERR_CORRUPT;
    }
    bt_status_t st = BT_ERR_CORRUPT;
    shard_set_t *set = calloc(1, sizeof *set);
    json_t *shards = json_object_get(idx, "shards");
    size_t n = json_array_size(shards);
    const char *fmt = json_string_value(json_object_get(idx, "format"));
    if (!set) {
        st = BT_ERR_NOMEM;
        goto fail_idx;
    }
    if (!fmt || strcmp(fmt, "baton-token-shards") || !json_is_array(shards) ||
        !parse_hex64(json_string_value(json_object_get(idx, "tokenizer_xxh64")),
                     &set->tokenizer_hash)) {
        log_error("%s: not a baton shard index (format, shards or tokenizer_xxh64 missing)", path);
        goto fail_set;
    }
    if (json_integer_value(json_object_get(idx, "version")) != SHARD_VERSION) {
        log_error("%s: index version %" JSON_INTEGER_FORMAT " is not supported", path,
                  json_integer_value(json_object_get(idx, "version")));
        st = BT_ERR_UNSUPPORTED;
        goto fail_set;
    }
    set->vocab_size = (uint32_t)json_integer_value(json_object_get(idx, "vocab_size"));
    set->files = calloc(n ? n : 1, sizeof *set->files);
    set->first = calloc(n + 1, sizeof *set->first);
    if (!set->files || !set->first) {
        st = BT_ERR_NOMEM;
        goto fail_set;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(shards, i);
        const char *file = json_string_value(json_object_get(e, "file"));
        uint64_t want_sum;
        if (!file || strchr(file, '/') ||
            !parse_hex64(json_string_value(json_object_get(e, "xxh64")), &want_sum)) {
            log_error("%s: shard entry %zu lacks a plain file name or xxh64", path, i);
            goto fail_set;
        }
        char fpath[4096];
        snprintf(fpath, sizeof fpath, "%s/%s", dir, file);
        st = shard_file_open(fpath, &set->files[i]);
        if (st != BT_OK) goto fail_set;
        set->n_files++;
        st = BT_ERR_CORRUPT;
        const shard_file_t *f = &set->files[i];
        if ((json_int_t)f->n_tokens != json_integer_value(json_object_get(e, "tokens")) ||
            f->checksum != want_sum) {
            log_error("%s: does not match %s (index: %" JSON_INTEGER_FORMAT " tokens, xxh64 %s; "
                      "file: %" PRIu64 " tokens, xxh64 %016" PRIx64 ")", fpath, path,
                      json_integer_value(json_object_get(e, "tokens")),
                      json_string_value(json_object_get(e, "xxh64")), f->n_tokens, f->checksum);
            goto fail_set;
        }
        if (f->tokenizer_hash != set->tokenizer_hash || f->vocab_size != set->vocab_size) {
            log_error("%s: made with another tokenizer than %s says (hash %016" PRIx64
                      " vs %016" PRIx64 ", vocab %u vs %u)", fpath, path, f->tokenizer_hash,
                      set->tokenizer_hash, f->vocab_size, set->vocab_size);
            goto fail_set;
        }
        set->first[i + 1] = set->first[i] + f->n_tokens;
    }
    if ((json_int_t)set->first[n] != json_integer_value(json_object_get(idx, "total_tokens"))) {
        log_error("%s: total_tokens %" JSON_INTEGER_FORMAT " but the shards hold %" PRIu64, path,
                  json_integer_value(json_object_get(idx, "total_tokens")), set->first[n]);
        goto fail_set;
    }
    json_decref(idx);
    *out = set;
    return BT_OK;

fail_set:
    shard_set_close(set);
fail_idx:
    json_decref(idx);
    return st;
}

uint64_t shard_set_count(const shard_set_t *set) { return set->first[set->n_files]; }
uint32_t shard_set_vocab_size(const shard_set_t *set) { return set->vocab_size; }
uint64_t shard_set_tokenizer_hash(const shard_set_t *set) { return set->tokenizer_hash; }

bt_status_t shard_set_tokens(const shard_set_t *set, uint64_t start, size_t n, uint32_t *out)
{
    uint64_t total = shard_set_count(set);
    if (start > total || n > total - start) {
        log_error("shard set: tokens [%" PRIu64 ", %" PRIu64 ") requested, the set has %" PRIu64,
                  start, start + n, total);
        return BT_ERR_INVALID;
    }
    /* last shard whose first token is <= start */
    size_t lo = 0, hi = set->n_files;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (set->first[mid] <= start) lo = mid;
        else hi = mid;
    }
    size_t k = lo;
    while (n) {
        while (k < set->n_files && start >= set->first[k + 1]) k++;
        const shard_file_t *f = &set->files[k];
        uint64_t off = start - set->first[k];
        size_t take = (size_t)(f->n_tokens - off);
        if (take > n) take = n;
        const uint8_t *p = f->payload + off * f->token_bytes;
        if (f->token_bytes == 2)
            for (size_t i = 0; i < take; i++) out[i] = (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
        else
            for (size_t i = 0; i < take; i++) out[i] = le_get32(p + 4 * i);
        out += take;
        start += take;
        n -= take;
    }
    return BT_OK;
}
