/* libFuzzer target: the tokenizer loader (data/tokenizer.h, tok_load_json)
 * on an arbitrary tokenizer.json, then encoding and decoding with it.
 *
 * Input: tokenizer.json text, optionally followed by a NUL byte and the
 * text to encode (without one, a fixed sample with letters, digits,
 * contractions, white space, non-ASCII and an invalid UTF-8 byte is used).
 *
 * Properties: the loader refuses the input or returns a tokenizer; then
 * every id tok_encode produces is inside the vocabulary, tok_decode takes
 * them back, and no crash, leak or sanitizer report happens on the way.
 *
 *   make fuzz && build/fuzz/fuzz_tokenizer -max_len=8192 -close_fd_mask=2 \
 *       CORPUS tests/fuzz/corpus_tokenizer
 * (make fuzz-run runs the recorded campaign; docs/DATA.md) */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "data/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char sample[] = "Hello, world! It's 2024: 12345 apples\n\n  don't\tstop "
                                 "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 \xff end";
    const char *json = (const char *)data;
    const char *nul = memchr(json, '\0', size);
    size_t json_len = nul ? (size_t)(nul - json) : size;
    const char *text = nul ? nul + 1 : sample;
    size_t text_len = nul ? size - json_len - 1 : sizeof sample - 1;

    tok_t *tok = NULL;
    if (tok_load_json(json, json_len, &tok) != BT_OK) return 0;
    uint32_t vocab = tok_vocab_size(tok);
    uint32_t *ids = NULL;
    size_t n = 0;
    if (tok_encode(tok, text, text_len, &ids, &n) == BT_OK) {
        for (size_t i = 0; i < n; i++)
            if (ids[i] >= vocab) BT_PANIC("id %u of %zu outside the vocabulary of %u", ids[i], i, vocab);
        char *back = NULL;
        size_t back_len = 0;
        if (tok_decode(tok, ids, n, &back, &back_len) != BT_OK)
            BT_PANIC("the %zu ids the encoder made do not decode", n);
        free(back);
        (void)tok_safe_cut(tok, text, text_len, text_len / 2);
    }
    free(ids);
    tok_free(tok);
    return 0;
}
