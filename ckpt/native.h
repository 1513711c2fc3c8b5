/* baton's own checkpoint format (docs/CHECKPOINTS.md): one directory per
 * step holding shard files and an index.
 *
 *   STEP_DIR/index.json               what is stored and where
 *   STEP_DIR/<file>.safetensors       pieces, any safetensors reader opens them
 *
 * A tensor (a parameter, or an optimizer state of one: "optim.exp_avg/NAME")
 * has a global shape and dtype; it is stored as pieces, each the data of a
 * shard spec (base/shard_spec.h: a box of the global tensor, optionally a
 * flat range of that box) in one shard file under its own key. The index
 * records, per piece, the file, the key, the byte offset of its data in the
 * file and the box and flat range; per file its size and XXH3-64 hash; and
 * a free-form metadata object (the model config, the layout, the step and
 * data position, the resolved job: the writer's business).
 *
 * Reading any shard spec of a tensor assembles it from every stored piece
 * that overlaps it (shard_runs), so a checkpoint written under one layout
 * loads under any other: resharding is the normal path, not a mode. A
 * tensor's pieces must tile it exactly: ckpt_index_check finds the elements
 * no piece holds, or two pieces hold, and names the tensor and the range.
 *
 * Everything read is hostile input: the index parser checks every field
 * (magic, version, types, ranges, references) and says which; a shard file
 * is checked against its size and hash before its first byte is used, and
 * each piece against the file's own header. Errors go to err[] naming the
 * file and the tensor. */
#ifndef BT_CKPT_NATIVE_H
#define BT_CKPT_NATIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/shard_spec.h"
#include "base/status.h"
#include "base/tensor.h"
#include "ckpt/safetensors.h"

#define CKPT_MAGIC        "baton-checkpoint"
#define CKPT_VERSION      1
#define CKPT_INDEX_FILE   "index.json"
#define CKPT_NAME_MAX     192
#define CKPT_FILE_MAX     96
#define CKPT_INDEX_MAX_BYTES (256u << 20)

typedef struct {
    uint32_t     file;             /* index into ckpt_index_t.files */
    char         key[CKPT_NAME_MAX]; /* its tensor in that safetensors file */
    uint64_t     offset;           /* byte offset of its data in the file */
    shard_spec_t spec;             /* what of the global tensor it holds */
} ckpt_piece_t;

typedef struct {
    char          name[CKPT_NAME_MAX];
    dtype_t       dtype;
    int           ndim;
    int64_t       shape[SHARD_MAX_DIMS];
    int           n_pieces;
    ckpt_piece_t *pieces;
} ckpt_tensor_t;

typedef struct {
    char     name[CKPT_FILE_MAX];  /* a plain file name in the step directory */
    uint64_t bytes;
    uint64_t xxh3;                 /* XXH3-64 of the whole file */
} ckpt_file_t;

typedef struct {
    int            version;
    char          *meta;           /* JSON object text (malloc'd; "{}" when none) */
    int            n_files;
    ckpt_file_t   *files;
    int            n_tensors;
    ckpt_tensor_t *tensors;
} ckpt_index_t;

/* ---- writing ------------------------------------------------------------- */

/* One piece to store: n = shard_numel(spec) elements of dtype at data
 * (host memory), row-major over the box (or the flat range of it). */
typedef struct {
    const char  *tensor;
    dtype_t      dtype;
    shard_spec_t spec;
    const void  *data;
} ckpt_put_t;

/* Writes puts[n] as the shard file DIR/FILE (atomically, fsynced: base/save.h),
 * then adds the file and its pieces to idx (its size, hash and the pieces'
 * offsets taken from the bytes as they were written).
 * A tensor met before must have the same dtype and global shape. */
bt_status_t ckpt_shard_write(ckpt_index_t *idx, const char *dir, const char *file,
                             const ckpt_put_t *puts, int n, char *err, size_t errlen);
/* The same, streaming: puts[i].data is unused and fill(arg, i, buf, bytes)
 * produces piece i's bytes when its turn comes (ckpt_st_write_fill), so
 * that a converter holds one tensor at a time. */
bt_status_t ckpt_shard_write_fill(ckpt_index_t *idx, const char *dir, const char *file,
                                  const ckpt_put_t *puts, int n, ckpt_st_fill_fn fill, void *arg,
                                  char *err, size_t errlen);
/* Adds a shard file written elsewhere (another rank) with its pieces: what
 * its writer reported (ckpt_index_t fragments merge). */
bt_status_t ckpt_index_merge(ckpt_index_t *into, const ckpt_index_t *from, char *err, size_t errlen);
/* Sets the metadata object (JSON text of an object). */
bt_status_t ckpt_index_set_meta(ckpt_index_t *idx, const char *json_object);
/* The index as JSON (malloc'd text). */
char       *ckpt_index_dump(const ckpt_index_t *idx);
/* Writes DIR/index.json atomically. */
bt_status_t ckpt_index_write(const ckpt_index_t *idx, const char *dir);

/* ---- reading ------------------------------------------------------------- */

/* Parses index text[len] (`what` names it in errors) into idx, checking
 * every field. BT_ERR_CORRUPT, BT_ERR_UNSUPPORTED (a newer version). */
bt_status_t ckpt_index_parse(const char *text, size_t len, const char *what, ckpt_index_t *idx,
                             char *err, size_t errlen);
bt_status_t ckpt_index_read(const char *dir, ckpt_index_t *idx, char *err, size_t errlen);
/* Every tensor's pieces tile it: no element missing, none twice. */
bt_status_t ckpt_index_check(const ckpt_index_t *idx, char *err, size_t errlen);
void        ckpt_index_free(ckpt_index_t *idx);
const ckpt_tensor_t *ckpt_index_find(const ckpt_index_t *idx, const char *tensor);

typedef struct ckpt_reader ckpt_reader_t;

/* Opens a checkpoint: its index from the first of dirs[n] that has one
 * (parsed and checked), its shard files looked up in dirs in order (a node
 * may hold some locally and find the rest elsewhere). */
bt_status_t ckpt_reader_open(const char *const *dirs, int n, ckpt_reader_t **out, char *err,
                             size_t errlen);
const ckpt_index_t *ckpt_reader_index(const ckpt_reader_t *r);
/* dst (laid out as `want`, a spec of the tensor's global shape; the
 * tensor's dtype) receives every element of want, from the pieces that
 * overlap it; files are opened, size- and hash-checked on first use.
 * BT_ERR_NOT_FOUND: no such tensor, or a file in no directory. */
bt_status_t ckpt_read(ckpt_reader_t *r, const char *tensor, const shard_spec_t *want, void *dst,
                      char *err, size_t errlen);
void        ckpt_reader_close(ckpt_reader_t *r);
/* Files in none of the reader's directories are fetched through fn
 * (bytes [offset, offset + len) of file into dst; err says why not), piece
 * by piece, from whoever holds them (the resume's peer fetch). */
typedef bt_status_t (*ckpt_fetch_fn)(void *arg, const char *file, uint64_t offset, uint64_t len,
                                     void *dst, char *err, size_t errlen);
void        ckpt_reader_set_fetch(ckpt_reader_t *r, ckpt_fetch_fn fn, void *arg);
uint64_t    ckpt_reader_fetched(const ckpt_reader_t *r); /* bytes fetched so far */
/* Raw bytes of one of the checkpoint's files (found in the directories,
 * size- and hash-checked on first use): what a server of fetches sends. */
bt_status_t ckpt_file_bytes(ckpt_reader_t *r, const char *file, uint64_t offset, uint64_t len,
                            void *dst, char *err, size_t errlen);

#endif
