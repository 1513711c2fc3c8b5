/* libFuzzer target for the safetensors header parser (ckpt_st_parse): any
 * byte string must either parse into tensors that lie inside the buffer and
 * do not overlap, or be rejected; never crash, leak or read out of bounds.
 *
 *   make fuzz && build/fuzz/fuzz_safetensors -max_len=4096 -close_fd_mask=2 \
 *       CORPUS tests/fuzz/corpus_safetensors
 * (-close_fd_mask=2: every rejection is logged to stderr. The seeds, from
 * tests/fuzz/gen_seeds.py, are up to 3.6 KB: a real fixture header is
 * 2136 bytes, so a max_len below that shrinks the corpus to nothing useful.
 * make fuzz-run runs the recorded campaign; docs/MODELS.md) */
#include <stdint.h>
#include <stdlib.h>

#include "ckpt/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ckpt_st_file_t *f = NULL;
    if (ckpt_st_parse(data, size, "fuzz", &f) != BT_OK) return 0;
    uint64_t prev_end = 0;
    for (int i = 0; i < f->n; i++) {
        const ckpt_st_tensor_t *t = &f->tensors[i];
        if (t->end > f->data_size || t->begin > t->end || t->begin < prev_end) abort();
        if ((const uint8_t *)t->data < data || (const uint8_t *)t->data + (t->end - t->begin) >
                                                   data + size)
            abort();
        prev_end = t->end;
        /* touch the bytes: ASan catches any out-of-range view */
        volatile uint8_t sink = 0;
        for (uint64_t k = 0; k < t->end - t->begin; k += 64) sink ^= ((const uint8_t *)t->data)[k];
        (void)sink;
    }
    ckpt_st_close(f);
    return 0;
}
