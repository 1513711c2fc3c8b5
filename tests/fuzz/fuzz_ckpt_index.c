/* libFuzzer target for the checkpoint index parser (ckpt_index_parse): any
 * byte string is either refused with a message or parses into an index
 * whose every piece lies inside its tensor and whose files it references
 * exist; the coverage check then runs on it without fault; and an accepted
 * index dumps to text that parses again into the same dump (the index
 * survives a rewrite).
 *
 *   make fuzz && build/fuzz/fuzz_ckpt_index -max_len=8192 -close_fd_mask=2 \
 *       CORPUS tests/fuzz/corpus_ckpt_index
 * (the seeds are indexes written by tests/test_ckpt_native.c's layouts) */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/native.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ckpt_index_t idx;
    char err[256];
    if (ckpt_index_parse((const char *)data, size, "fuzz", &idx, err, sizeof err) != BT_OK) {
        if (!err[0]) abort(); /* a refusal always says why */
        return 0;
    }
    for (int i = 0; i < idx.n_tensors; i++) {
        const ckpt_tensor_t *t = &idx.tensors[i];
        for (int k = 0; k < t->n_pieces; k++) {
            const shard_spec_t *s = &t->pieces[k].spec;
            if (t->pieces[k].file >= (uint32_t)idx.n_files || s->ndim != t->ndim) abort();
            for (int d = 0; d < s->ndim; d++)
                if (s->offset[d] < 0 || s->extent[d] < 0 || s->offset[d] + s->extent[d] > t->shape[d]) abort();
        }
    }
    (void)ckpt_index_check(&idx, err, sizeof err);
    char *t1 = ckpt_index_dump(&idx);
    ckpt_index_t again;
    if (!t1 || ckpt_index_parse(t1, strlen(t1), "dump", &again, err, sizeof err) != BT_OK) abort();
    char *t2 = ckpt_index_dump(&again);
    if (!t2 || strcmp(t1, t2)) abort();
    free(t1);
    free(t2);
    ckpt_index_free(&again);
    ckpt_index_free(&idx);
    return 0;
}
