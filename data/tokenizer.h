/* BPE tokenizer loaded from a Hugging Face tokenizer.json: byte-level
 * (GPT-2, Llama-3, Qwen2) or SentencePiece-style (Llama-2, Mistral: "\u2581"
 * for spaces, byte fallback to "<0xXX>" tokens).
 *
 * Produces the ids that HF `tokenizers` produces for
 * `tok.encode(text, add_special_tokens=False)` (no BOS/EOS is added; callers
 * that want them use tok_special()). Supported (docs/DATA.md has the matrix):
 *   model          BPE with vocab + merges ("a b" strings or [a, b] lists),
 *                  ignore_merges, unk_token/fuse_unk, byte_fallback (with a
 *                  SentencePiece-style decoder); not dropout,
 *                  continuing_subword_prefix, end_of_word_suffix
 *   added tokens   matched before pre-tokenization, leftmost-longest: those
 *                  with normalized=false on the raw text, the others on the
 *                  normalized text; lstrip/rstrip honoured, single_word refused
 *   normalizer     none, NFC, Prepend, Replace of a String (also in a Sequence)
 *   pre-tokenizer  ByteLevel (add_prefix_space, use_regex with the GPT-2
 *                  pattern), Split (Isolated, not inverted) with a Regex made
 *                  of the branches used by GPT-2 / Llama-3 / Qwen2 patterns or
 *                  a String, Digits, Metaspace, Sequence of these
 *   decoder        ByteLevel (or none); Metaspace, or a Sequence of Replace
 *                  (to a space), ByteFallback, Fuse, Strip
 * Anything else is refused at load time with an error naming it.
 *
 * Text is UTF-8; invalid bytes are not an error: each such byte is a piece
 * character of its own that is neither letter, number nor space, so
 * decode(encode(x)) == x holds for every byte string (byte-level without
 * NFC or a prefix space; SentencePiece style with a ByteFallback decoder,
 * for text without "\u2581" and no added token but at its end).
 *
 * A tok_t is not thread-safe: tok_encode updates a word cache. Use one per
 * thread (loading is cheap next to training). */
#ifndef BT_DATA_TOKENIZER_H
#define BT_DATA_TOKENIZER_H

#include "base/status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct tok tok_t;

/* Special ids; -1 when the tokenizer has none. How they are found is in
 * docs/DATA.md (tokenizer_config.json beside the file, then the
 * post-processor template, then well-known added-token names). */
typedef struct {
    int64_t bos;
    int64_t eos;
} tok_special_t;

/* path: a tokenizer.json file or a directory holding one. */
bt_status_t tok_load(const char *path, tok_t **out);
/* The same from the JSON text in memory (no tokenizer_config.json lookup). */
bt_status_t tok_load_json(const char *json, size_t len, tok_t **out);
void tok_free(tok_t *tok);

/* Encodes text[0..len) into a malloc'd array *ids of *n ids (caller frees;
 * *ids is non-NULL even when *n == 0). */
bt_status_t tok_encode(tok_t *tok, const char *text, size_t len, uint32_t **ids, size_t *n);

/* Concatenates the bytes of ids into a malloc'd, NUL-terminated *text of
 * *len bytes (special tokens included as their text). The bytes may end in a
 * partial UTF-8 sequence when ids is a prefix of an encoding.
 * BT_ERR_INVALID for an id outside the vocabulary. */
bt_status_t tok_decode(const tok_t *tok, const uint32_t *ids, size_t n, char **text, size_t *len);

/* The bytes of one token (not NUL-terminated); NULL for an unused id. */
const uint8_t *tok_token_bytes(const tok_t *tok, uint32_t id, size_t *len);

/* A byte offset in [want, len] at which text can be cut so that encoding the
 * two parts separately gives the ids of the whole: just after a "\n" that
 * follows a printable ASCII character and precedes an ASCII letter, and only
 * for tokenizers whose pre-tokenizer always splits there (docs/DATA.md).
 * Returns len when there is no such place. Lets long inputs be encoded in
 * chunks. */
size_t tok_safe_cut(const tok_t *tok, const char *text, size_t len, size_t want);

tok_special_t tok_special(const tok_t *tok);
/* One more than the largest id (the embedding table needs this many rows). */
uint32_t tok_vocab_size(const tok_t *tok);
/* XXH64 (seed 0) of the tokenizer.json bytes; names the tokenizer in shard indexes. */
uint64_t tok_hash(const tok_t *tok);

#endif
