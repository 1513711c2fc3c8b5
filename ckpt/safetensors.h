/* safetensors files: read (memory-mapped, header validated as hostile
 * input) and write.
 *
 * Format (https://huggingface.co/docs/safetensors): u64 little-endian header
 * length N, N bytes of JSON {"name": {"dtype", "shape", "data_offsets":
 * [begin, end]}, ..., "__metadata__": {str: str}}, then the data section;
 * offsets are relative to the data section. The format's own magic is that
 * JSON header (the format predates baton; we keep it as is so that any
 * safetensors reader opens our checkpoints).
 *
 * The parser rejects, with an error naming the file and the tensor: a header
 * length past the end of the file, non-JSON or non-object headers, unknown or
 * unsupported dtypes, bad shapes, offsets out of range or not matching the
 * shape, and tensors that overlap. */
#ifndef BT_CKPT_SAFETENSORS_H
#define BT_CKPT_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/tensor.h"
#include "base/shard_spec.h"

#define CKPT_ST_MAX_DIMS 8
#define CKPT_ST_MAX_HEADER (100u << 20) /* as the reference implementation */

typedef struct {
    char       *name;
    dtype_t     dtype;
    int         ndim;
    int64_t     shape[CKPT_ST_MAX_DIMS];
    int64_t     numel;
    uint64_t    begin, end;  /* byte offsets in the data section */
    const void *data;        /* begin of the bytes (maybe unaligned) */
} ckpt_st_tensor_t;

typedef struct {
    char             *path;     /* for messages */
    void             *map;      /* mmap of the whole file (NULL: parsed from a buffer) */
    size_t            map_size;
    const uint8_t    *data;     /* data section */
    uint64_t          data_size;
    int               n;
    ckpt_st_tensor_t *tensors;  /* sorted by begin offset */
} ckpt_st_file_t;

/* Parses a complete file image buf[size]; `what` names it in errors. The
 * tensors point into buf, which must outlive the result. */
bt_status_t ckpt_st_parse(const uint8_t *buf, size_t size, const char *what,
                          ckpt_st_file_t **out);
/* Opens and memory-maps path, then parses it. */
bt_status_t ckpt_st_open(const char *path, ckpt_st_file_t **out);
void        ckpt_st_close(ckpt_st_file_t *f);
const ckpt_st_tensor_t *ckpt_st_find(const ckpt_st_file_t *f, const char *name);

/* Copies tensor t into dst[numel] f32, converting F32/F16/BF16/F64.
 * BT_ERR_UNSUPPORTED (logged, naming file and tensor) for other dtypes. */
bt_status_t ckpt_st_read_f32(const ckpt_st_file_t *f, const ckpt_st_tensor_t *t, float *dst);
/* The same for elements [first, first + n) of t in row-major order (a slice
 * of a tensor-parallel shard: only these bytes of the mapping are touched). */
bt_status_t ckpt_st_read_f32_range(const ckpt_st_file_t *f, const ckpt_st_tensor_t *t,
                                   int64_t first, int64_t n, float *dst);

/* The elements of `piece` (a shard spec of t's global shape) read from t
 * into dst[shard_numel(piece)] f32, one range per contiguous run; the pages
 * read are released from the process as the read passes them (madvise,
 * every 8 MB), so that loading a piece of a large file keeps only the piece
 * and a few MB of the file resident. */
bt_status_t ckpt_st_read_piece(const ckpt_st_file_t *f, const ckpt_st_tensor_t *t,
                               const shard_spec_t *piece, float *dst);

/* "F32" etc. for a dtype_t; NULL when safetensors has no name for it. */
const char *ckpt_st_dtype_name(dtype_t dt);
/* The dtype_t of a safetensors dtype name; false when there is none. */
bool        ckpt_st_dtype_from_name(const char *name, dtype_t *out);

typedef struct {
    const char *name;
    tensor_t    t;    /* contiguous, CPU */
} ckpt_st_entry_t;

/* Writes entries[n] (and optional metadata pairs meta[2*i] = key,
 * meta[2*i+1] = value, n_meta pairs) to path atomically (base/save.h: a
 * temporary sibling, fsync, rename, fsync of the directory; dead writers'
 * temporaries of path are removed first). */
bt_status_t ckpt_st_write(const char *path, const ckpt_st_entry_t *entries, int n,
                          const char *const *meta, int n_meta);
/* The same, streaming: entries give names, dtypes and shapes (data unused);
 * fill(arg, i, buf, bytes) writes tensor i's bytes into buf (one buffer of
 * the largest tensor's size, reused), so that a file of any size is written
 * holding one tensor at a time. A fill error aborts the file. */
typedef bt_status_t (*ckpt_st_fill_fn)(void *arg, int i, void *buf, size_t bytes);
/* What was written (out, may be NULL): the file's size and XXH3-64 hash,
 * computed from the bytes as they went out, and (offsets non-NULL, n of
 * them) the byte offset of each entry's data in the file. */
typedef struct {
    uint64_t  bytes, xxh3;
    uint64_t *offsets;
} ckpt_st_written_t;
bt_status_t ckpt_st_write_fill(const char *path, const ckpt_st_entry_t *entries, int n,
                               const char *const *meta, int n_meta, ckpt_st_fill_fn fill, void *arg,
                               ckpt_st_written_t *out);

#endif
