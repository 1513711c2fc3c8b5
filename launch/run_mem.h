/* Memory a command will need, estimated before it allocates, and the refusal
 * of what cannot fit (base/mem.h says where the limit comes from).
 *
 * Per process, from the model config and the layout (model_mem_estimate
 * gives the exact size of each model instance and activation arena):
 *   single-process training  parameters + gradients + AdamW moments (2x
 *                            parameters) + one activation arena of
 *                            micro_batch x seq_len;
 *   a worker rank            its chunks' parameters (under expert parallelism
 *                            E/ep experts of each sparse layer) and gradients, the AdamW
 *                            moments of them (divided by dp under ZeRO-1),
 *                            `microbatches` activation arenas per chunk (the
 *                            stage actor keeps one per microbatch), the
 *                            tp-1 copy of its stages that the exporting
 *                            replica keeps when tp > 1, and, while it starts,
 *                            the whole model it slices its share from: the
 *                            peak is the larger of the two phases;
 *   the driver               the whole model when it assembles checkpoints;
 *   eval / generate          parameters (+ gradients with --grad-norm), one
 *                            arena for the longest window, generate's logits.
 * Token streams, code and the allocator's own overhead are not counted. A
 * 103 M-parameter job (vocab 400 000, hidden 128): 1.57 GiB estimated, 1.59
 * GiB peak resident as one process; as pp=2 the larger rank 855 MiB
 * estimated, 847 MiB measured. All processes of a job run on this host, so
 * their sum must fit. */
#ifndef BT_LAUNCH_RUN_MEM_H
#define BT_LAUNCH_RUN_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "launch/job.h"
#include "model/model.h"

typedef struct {
    double params, grads, optim, acts;
    double start;   /* a worker's whole model, held only while it starts */
    double copies;  /* model copies kept for export (worker, driver) */
    double peak;    /* the most it holds at once */
} run_mem_proc_t;

typedef enum {
    RUN_MEM_VOCAB = 0, /* the vocabulary-sized tensors (embedding, lm_head) and their state */
    RUN_MEM_LAYERS,    /* the transformer layers' tensors and their state */
    RUN_MEM_ACTS,      /* activation arenas */
    RUN_MEM_PART_COUNT,
} run_mem_part_t;

typedef struct {
    int            n_procs;
    run_mem_proc_t largest;      /* the process with the largest peak */
    int            largest_rank; /* its rank; -1 for a single process or the driver */
    double         total;        /* all processes together */
    double         part[RUN_MEM_PART_COUNT]; /* total split by what it is for */
} run_mem_plan_t;

/* A validated job's training run: one process (tp = pp = dp = 1) or the
 * workers of its layout plus the driver. cfg: the job's model config
 * (run_model_config; the vocabulary resolved). */
bt_status_t run_mem_plan_job(const job_t *job, const model_config_t *cfg, run_mem_plan_t *out,
                             char *err, size_t errlen);
/* The same, and every process's share into procs[cap] (zeroed first): rank
 * order, procs[0] for a single process; the driver's (when it keeps a copy
 * for export) at procs[world]. What `baton graph` prints. */
bt_status_t run_mem_plan_procs(const job_t *job, const model_config_t *cfg, run_mem_plan_t *out,
                               run_mem_proc_t *procs, int cap, char *err, size_t errlen);
/* One process holding the whole model: a training arena of B x T and
 * gradients when `grads`, else a forward-only arena (a decode arena for
 * B = 1 when `decode`), and `extra` more bytes (generate's logits). */
void run_mem_plan_single(const model_config_t *cfg, int64_t B, int64_t T, bool grads,
                         bool decode, double extra, run_mem_plan_t *out);

/* The part that dominates the total. */
run_mem_part_t run_mem_plan_main_part(const run_mem_plan_t *p);

/* BT_OK when the plan fits the limit. Otherwise BT_ERR_NOMEM and, in msg,
 * one sentence with the estimate, its split, the limit and its source, e.g.
 * "needs about 8.3 GiB of memory (...), more than the 3.9 GiB available
 * (MemAvailable in /proc/meminfo; BATON_MEM_LIMIT sets another)".
 * BT_ERR_INVALID (msg says why) when BATON_MEM_LIMIT is malformed. */
bt_status_t run_mem_check(const run_mem_plan_t *p, char *msg, size_t cap);

/* The job fields to change for `part`, as text ("model.vocab", or
 * "vocab_size in model.hf's config.json"), and the field the message is
 * placed at (job_error). */
const char *run_mem_part_field(const job_t *job, run_mem_part_t part, char *hint, size_t cap);

/* All of it for a validated job whose vocabulary is known: BT_OK when it
 * fits; BT_ERR_NOMEM (too big) or BT_ERR_INVALID (bad BATON_MEM_LIMIT, no
 * config) with one message in err, placed at the field that dominates
 * ("jobs/x.yaml:4:10: model.vocab: the job needs about ..."). */
bt_status_t run_mem_job_check(const job_t *job, char *err, size_t errlen);

/* The same for a command that takes a model source (eval, generate): the
 * message starts with `source` (the model path) and names the config
 * fields, or acts_hint ("the longest window, 4096 tokens (--window)") when
 * the activations dominate. */
bt_status_t run_mem_source_check(const char *source, const model_config_t *cfg,
                                 const run_mem_plan_t *plan, const char *acts_hint, char *err,
                                 size_t errlen);

#endif
