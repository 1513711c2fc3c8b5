/* Token shards: the tokenized corpus on disk (format in docs/DATA.md).
 *
 * A shard set is a directory with shard_NNNNN.bin files and index.json.
 * Each shard file: a 64-byte little-endian header
 *     0  magic "BATONTOK"        8  u32 version (1)     12 u32 header_bytes (64)
 *     16 u32 token_bytes (2|4)   20 u32 vocab_size      24 u64 token count
 *     32 u64 XXH64 of payload    40 u64 tokenizer hash  48 16 bytes reserved (0)
 * then the tokens (u16 when vocab_size <= 65536, else u32). Later versions
 * grow the header by appending fields and raising header_bytes; a reader
 * skips header bytes it does not know.
 *
 * Readers mmap every shard and validate header, size and checksum when the
 * set is opened; a bad file is refused with an error naming it and what is
 * wrong (truncated, bad magic, version, checksum mismatch, index mismatch).
 * An open set is read-only: any number of threads may call shard_set_tokens
 * at once. A writer belongs to one thread. */
#ifndef BT_DATA_SHARD_H
#define BT_DATA_SHARD_H

#include "base/status.h"

#include <stddef.h>
#include <stdint.h>

#define SHARD_MAGIC "BATONTOK"
#define SHARD_VERSION 1u
#define SHARD_HEADER_BYTES 64u

typedef struct shard_set shard_set_t;
typedef struct shard_writer shard_writer_t;

/* ---- writing ---- */

/* Starts a shard set in dir (created if missing); shards hold at most
 * shard_tokens tokens each. bos/eos (-1 = none) are recorded in the index. */
bt_status_t shard_writer_open(const char *dir, uint32_t vocab_size, uint64_t tokenizer_hash,
                              int64_t bos, int64_t eos, uint64_t shard_tokens,
                              shard_writer_t **out);
bt_status_t shard_writer_append(shard_writer_t *w, const uint32_t *ids, size_t n);
/* Records one input document in the index: its name, byte size and the
 * tokens appended for it since the previous call (or since open). */
bt_status_t shard_writer_mark_input(shard_writer_t *w, const char *name, uint64_t bytes);
/* Flushes the last shard and writes index.json (last, by rename); frees w
 * whatever the result. */
bt_status_t shard_writer_close(shard_writer_t *w);
/* Frees w without writing the index (an interrupted prepare leaves no index). */
void shard_writer_abort(shard_writer_t *w);

/* ---- reading ---- */

bt_status_t shard_set_open(const char *dir, shard_set_t **out);
void shard_set_close(shard_set_t *set);
uint64_t shard_set_count(const shard_set_t *set);
uint32_t shard_set_vocab_size(const shard_set_t *set);
uint64_t shard_set_tokenizer_hash(const shard_set_t *set);
/* Copies tokens [start, start+n) of the whole set (across shard boundaries)
 * into out. BT_ERR_INVALID when the range passes the end. */
bt_status_t shard_set_tokens(const shard_set_t *set, uint64_t start, size_t n, uint32_t *out);

/* One shard file alone, validated as shard_set_open does. */
typedef struct {
    void *map;
    size_t map_len;
    const uint8_t *payload;
    uint64_t n_tokens;
    uint32_t token_bytes;
    uint32_t vocab_size;
    uint64_t tokenizer_hash;
    uint64_t checksum;
} shard_file_t;

bt_status_t shard_file_open(const char *path, shard_file_t *out);
void shard_file_close(shard_file_t *f);
/* Writes one shard file at path (via path.tmp + rename). */
bt_status_t shard_file_write(const char *path, const uint32_t *ids, uint64_t n,
                             uint32_t vocab_size, uint64_t tokenizer_hash);

#endif
