/* libFuzzer target: gguf_open_mem on arbitrary bytes. The reader must
 * either refuse the input or produce tensors that lie inside the buffer;
 * metadata lookups, the llama helpers and the tokenizer.json writer (to
 * /dev/null) must then run without a fault.
 *
 *   make fuzz && build/fuzz/fuzz_gguf -max_len=4096 -close_fd_mask=2 CORPUS tests/fuzz/corpus_gguf
 * (seeds: tests/fuzz/gen_seeds.py; make fuzz-run runs the recorded
 * campaign; docs/GGUF.md) */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "ckpt/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_t *g;
    if (gguf_open_mem(data, size, "fuzz", &g) != BT_OK) return 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor_t *t = &g->tensors[i];
        if (t->data < data || t->nbytes > size || t->data + t->nbytes > data + size)
            BT_PANIC("tensor %s outside the buffer", t->name);
        /* dequantize small tensors: exercises every decoder on hostile bytes */
        if (t->n_elems <= 4096 && dequant_type_info(t->type)->can_dequant) {
            float *out = malloc((size_t)t->n_elems * sizeof *out);
            if (out) {
                gguf_tensor_to_f32(g, t, out);
                free(out);
            }
        }
        if (gguf_tensor_find(g, t->name) == NULL) BT_PANIC("tensor %s not found by name", t->name);
    }
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_value_t *v = &g->kv[i].value;
        if (v->type == GGUF_TYPE_ARRAY && v->arr.n > 0) {
            int64_t x;
            double d;
            gguf_str_t s;
            (void)gguf_array_i64(v, v->arr.n - 1, &x);
            (void)gguf_array_f64(v, v->arr.n - 1, &d);
            (void)gguf_array_str(v, v->arr.n - 1, &s);
        }
    }
    gguf_llama_config_t cfg;
    if (gguf_llama_config(g, &cfg) == BT_OK) {
        const gguf_tensor_t *q = gguf_tensor_find(g, "blk.0.attn_q.weight");
        if (q && q->n_elems <= 65536) {
            float *out = malloc((size_t)q->n_elems * sizeof *out);
            if (out) {
                gguf_llama_tensor_to_hf_f32(g, &cfg, q, out);
                free(out);
            }
        }
    }
    /* the tokenizer writer walks hostile token and merge strings */
    if (gguf_kv_find(g, "tokenizer.ggml.model")) gguf_tokenizer_write_json(g, "/dev/null");
    gguf_close(g);
    return 0;
}
