/* Where a model comes from: one entry point for every command that takes
 * --model (baton eval, generate, run's model.hf).
 *
 *   PATH is a directory  -> a Hugging Face directory (ckpt/hf.h): config.json,
 *                           safetensors, tokenizer.json
 *   PATH is a file whose first 4 bytes are "GGUF"
 *                        -> a llama GGUF file (ckpt/gguf.h): config from its
 *                           llama.* metadata, tensors dequantized to f32 and
 *                           un-permuted to the HF layout on load, tokenizer
 *                           from tokenizer.ggml.* (gguf_tokenizer_write_json)
 * Anything else is an error that names the path and says what was expected.
 * A baton checkpoint is meant to become a third kind here.
 *
 *   model_t *m;  tok_t *tok;  ckpt_source_special_t sp;
 *   if (ckpt_source_load(path, NULL, &m)) return ...;
 *   if (ckpt_source_tokenizer(path, &tok, &sp)) return ...;
 */
#ifndef BT_CKPT_MODEL_SOURCE_H
#define BT_CKPT_MODEL_SOURCE_H

#include <stdint.h>

#include "base/status.h"
#include "data/tokenizer.h"
#include "model/model.h"

typedef enum {
    CKPT_SOURCE_HF_DIR = 0,
    CKPT_SOURCE_GGUF,
    CKPT_SOURCE_COUNT,
} ckpt_source_kind_t;

#define CKPT_SOURCE_MAX_EOS 8

/* Special ids for generation; -1 / 0 entries when the source names none. */
typedef struct {
    int64_t bos;
    int64_t eos[CKPT_SOURCE_MAX_EOS]; /* any of them ends a generation */
    int     n_eos;
} ckpt_source_special_t;

/* Which kind path is (logged error when neither). */
bt_status_t ckpt_source_kind(const char *path, ckpt_source_kind_t *out);
const char *ckpt_source_kind_name(ckpt_source_kind_t k); /* "Hugging Face directory", "GGUF file" */

/* The model configuration only (job validation reads dimensions from it). */
bt_status_t ckpt_source_config(const char *path, model_config_t *out);

/* Config + model_create(stage; NULL = whole model) + weights in f32. For a
 * GGUF file every tensor of the stage must be present with the shape the
 * config implies; tensors of other stages are skipped, tensors no parameter
 * of the whole model has are an error (rope_freqs.weight, which llama.cpp
 * stores for Llama-3 RoPE and HF computes, is skipped). */
bt_status_t ckpt_source_load(const char *path, const model_stage_t *stage, model_t **out);
/* The same for one TP rank's share (par NULL: none) on a device (place
 * NULL: the host in f32): every tensor is read piece by piece, so a rank
 * holds only what it owns. */
bt_status_t ckpt_source_load_part(const char *path, const model_stage_t *stage,
                                  const model_parallel_t *par, const model_place_t *place,
                                  model_t **out);

/* The source's tokenizer and special ids. HF directory: DIR/tokenizer.json,
 * EOS from generation_config.json, else config.json, else the tokenizer's;
 * BOS likewise. GGUF: the tokenizer.json gguf_tokenizer_write_json writes
 * (through a temporary file that is removed again), BOS/EOS from
 * tokenizer.ggml.*_token_id. special may be NULL. */
bt_status_t ckpt_source_tokenizer(const char *path, tok_t **out, ckpt_source_special_t *special);

/* The GGUF part on its own (ckpt_source_load dispatches to it). */
bt_status_t ckpt_gguf_load(const char *path, const model_stage_t *stage, model_t **out);
bt_status_t ckpt_gguf_load_part(const char *path, const model_stage_t *stage,
                                const model_parallel_t *par, const model_place_t *place,
                                model_t **out);
bt_status_t ckpt_gguf_config(const char *path, model_config_t *out);

#endif
