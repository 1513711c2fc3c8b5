/* Hugging Face model directories: config.json + model.safetensors, or a
 * sharded model.safetensors.index.json with its shard files.
 *
 * Import maps HF tensors onto the model's named parameter views by name
 * (weights memory-mapped, F32/F16/BF16/F64 widened to f32). Every problem is
 * an error naming the file and the field or tensor: unsupported architecture
 * or config value, missing, unexpected or wrongly shaped tensors, corrupt
 * safetensors files. Export writes a directory transformers can load. */
#ifndef BT_CKPT_HF_H
#define BT_CKPT_HF_H

#include <stddef.h>

#include "base/status.h"
#include "model/model.h"

/* Parses config.json text; `what` names the file in errors. */
bt_status_t ckpt_hf_config_parse(const char *text, size_t len, const char *what,
                                 model_config_t *out);
/* The config.json an export writes for c (malloc'd JSON text, compact;
 * ckpt_hf_config_parse reads it back), or NULL when out of memory. */
char       *ckpt_hf_config_text(const model_config_t *c);
/* Reads DIR/config.json. */
bt_status_t ckpt_hf_config_load(const char *dir, model_config_t *out);

/* Fills m's parameters (m may hold one stage and be one tensor-parallel
 * rank's share) from the safetensors in dir. A TP share reads only its
 * slices of the memory-mapped tensors (model_param_t shard fields); shapes
 * are checked against the whole HF shape. */
bt_status_t ckpt_hf_weights_load(model_t *m, const char *dir);

/* config + model_create(stage; NULL = whole model) + weights. */
bt_status_t ckpt_hf_load(const char *dir, const model_stage_t *stage, model_t **out);
/* The same for one tensor-parallel rank (model_create_tp; par NULL: no TP). */
bt_status_t ckpt_hf_load_tp(const char *dir, const model_stage_t *stage,
                            const model_parallel_t *par, model_t **out);
/* ... on any device (place NULL: the host, f32). */
bt_status_t ckpt_hf_load_part(const char *dir, const model_stage_t *stage,
                              const model_parallel_t *par, const model_place_t *place,
                              model_t **out);

/* Writes the directory dir with config.json and model.safetensors (f32) for
 * a whole model, atomically as a whole (base/save.h): a reader or a crash
 * sees the previous export or the new one, each complete. dir's parent must
 * exist; files in a previous dir that are not an export's own (tokenizer
 * files, say) are kept. A TP share is refused: model_tp_gather into a
 * tp_size-1 model first. */
bt_status_t ckpt_hf_save(const model_t *m, const char *dir);
/* Collective over m's TP group: gathers the whole tensors and TP rank 0
 * writes them as ckpt_hf_save does (m a whole-model stage; the others only
 * take part in the gather). Same as ckpt_hf_save at tp_size 1. */
bt_status_t ckpt_hf_save_tp(const model_t *m, const char *dir);

/* The tokenizer files (tokenizer.json, and tokenizer_config.json and
 * special_tokens_map.json when present) of src, a tokenizer.json or a
 * directory holding one, copied into the directory dst, each file replaced
 * atomically. BT_ERR_NOT_FOUND / BT_ERR_IO with err naming src (and what
 * is missing) or the file. */
bt_status_t ckpt_hf_tokenizer_copy(const char *src, const char *dst, char *err, size_t errlen);
/* The names ckpt_hf_tokenizer_copy may write (NULL-terminated). */
extern const char *const ckpt_hf_tokenizer_files[];

#endif
