/* From a validated job to the pieces of a single-process training run:
 * the model (HF directory or random init) and the token streams.
 * HF directories go through ckpt/hf.h. */
#ifndef BT_LAUNCH_RUN_SETUP_H
#define BT_LAUNCH_RUN_SETUP_H

#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "launch/job.h"
#include "model/model.h"
#include "train/train.h"

/* model_config_t for the job's model (model.hf: its config.json). */
bt_status_t run_model_config(const job_t *job, model_config_t *cfg);
/* Whole model: HF weights, or model_init_random(init_seed, init_std). */
bt_status_t run_model_create(const job_t *job, model_t **out);
/* The device and precisions of a validated job ("auto": cuda:0 when usable,
 * else the host); an unusable device is an error saying why. */
bt_status_t run_model_place(const job_t *job, model_place_t *out);
/* The same from a command line's --device and --dtype (NULL: cpu, fp32). */
bt_status_t run_place_parse(const char *device, const char *dtype, model_place_t *out);
/* Only `stage` (NULL: whole) of TP rank par (NULL: none) on place (NULL: the
 * host): each rank builds and loads exactly its own pieces. */
bt_status_t run_model_create_part(const job_t *job, const model_stage_t *stage,
                                  const model_parallel_t *par, const model_place_t *place,
                                  model_t **out);

/* Token stream of a data directory, as int32 ids. Formats accepted:
 *   DIR/index.json   a shard set (data/shard.h, `baton data prepare`)
 *   DIR/tokens.txt   ids separated by white space (fixtures, small tests)
 * *vocab: the shard set's vocabulary size (0 for tokens.txt). */
bt_status_t run_stream_load(const char *dir, int32_t **tokens, int64_t *n, uint32_t *vocab);
/* run_stream_load, then the tail fraction `split` becomes the validation stream (*val points into
 * the same allocation, which *tokens owns; free(*tokens) frees both). */
bt_status_t run_tokens_load(const char *dir, double split, int32_t **tokens, int64_t *n_train,
                            const int32_t **val, int64_t *n_val, uint32_t *vocab);

/* After run_stream_load of the job's `field` (data.dir or data.val_dir)
 * failed: "baton CMD: FILE:LINE:COL: FIELD: cannot read ..." on stderr, so
 * that the message names the line of the job file to change. */
void run_data_error(const char *cmd, const job_t *job, const char *field);

/* train_config_t of the job. */
void run_train_config(const job_t *job, train_config_t *out);

/* The validation line {"step", "val_loss", "val_ppl"} (ppl = exp(loss)). */
void run_eval_metrics_write(FILE *f, int64_t step, double loss);
/* A JSON number printed with fmt ("%.7g"), or null when v is NaN or
 * infinite: JSON has neither, and every JSON line the CLI writes must stay
 * parseable (a diverged run's metrics say null where the loss was NaN). */
void run_json_num(FILE *f, const char *fmt, double v);
/* A JSON string of text[0..len): quotes, backslashes and control bytes
 * escaped; bytes that are not valid UTF-8 (a token may hold part of a
 * character) become U+FFFD, as HF's decode() does. */
void run_json_str(FILE *f, const char *text, size_t len);

/* export.dir: the model as a Hugging Face directory (ckpt_hf_save, replaced
 * as a whole) with the tokenizer files of export.tokenizer, or of model.hf
 * when that has a tokenizer.json. Errors are logged naming the field. */
bt_status_t run_model_export(const model_t *m, const job_t *job);
/* Where run_model_export takes the tokenizer from ("" when nowhere). */
const char *run_export_tokenizer(const job_t *job);

/* mkdir -p DIR; the directory part of an output PATH (trailing slashes do
 * not count), created when missing. BT_ERR_IO (logged) when a level cannot
 * be created. */
bt_status_t run_dir_make(const char *dir);
bt_status_t run_parent_make(const char *path);

#endif
