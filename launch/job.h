/* Job files: the YAML that describes one training job (docs/JOBS.md).
 *
 * A job is read in three passes:
 *   job_load()      defaults, then the YAML file (libyaml document API); every
 *                   field is typed and range-checked by one schema table, and
 *                   where it was set (file, line, column) is remembered;
 *   job_override()  `--set section.key=value`, typed by the same schema (the
 *                   value is parsed as a YAML flow node, so lists work too);
 *   job_validate()  cross-field rules (tp divides heads, the pipeline split
 *                   sums to the layer count, ...). When model.hf names a
 *                   Hugging Face directory its config.json supplies the
 *                   model dimensions first.
 * Each returns BT_OK or BT_ERR_INVALID with one message in `err` of the form
 *   FILE:LINE:COL: FIELD: what is wrong
 * ("--set" stands in for FILE for an override). Nothing is logged: the caller
 * prints the message once.
 */
#ifndef BT_LAUNCH_JOB_H
#define BT_LAUNCH_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "coll/coll.h"

#define JOB_PATH_MAX   512
#define JOB_MAX_STAGES 256
#define JOB_MAX_HOSTS  64
#define JOB_HOST_MAX   128
#define JOB_MAX_FIELDS 96  /* >= number of schema fields (static-asserted in job.c) */
#define JOB_ERR_MAX    768
/* Input limits: a job file (or one --set value) larger than this, or nested
 * deeper, is refused before libyaml builds it (its time grows with the
 * square of the depth). A job file needs 3 levels and a few KB. */
#define JOB_FILE_MAX_BYTES (1u << 20)
#define JOB_YAML_MAX_DEPTH 32

typedef enum { JOB_XPORT_AUTO = 0, JOB_XPORT_INPROC, JOB_XPORT_TCP, JOB_XPORT_UCX, JOB_XPORT_COUNT } job_xport_t;
typedef enum { JOB_SCHED_1F1B = 0, JOB_SCHED_INTERLEAVED, JOB_SCHED_COUNT } job_schedule_t;
/* parallel.cp_mode: how context-parallel attention moves K and V (docs/PARALLEL.md) */
typedef enum { JOB_CP_ALLGATHER = 0, JOB_CP_RING, JOB_CP_MODE_COUNT } job_cp_mode_t;
/* parallel.cp_exchange: what carries the ring's blocks: auto (messages on
 * the cpu, the collective backend elsewhere), messages between stage
 * actors (train/cp_ring.h), or the CP group's communicator */
typedef enum { JOB_CPX_AUTO = 0, JOB_CPX_MESSAGES, JOB_CPX_COLLECTIVE, JOB_CPX_COUNT } job_cp_exchange_t;
/* Where the linear warmup starts: 0, or min_lr (= lr * min_lr/lr). */
typedef enum { JOB_WARMUP_FROM_ZERO = 0, JOB_WARMUP_FROM_MIN, JOB_WARMUP_FROM_COUNT } job_warmup_from_t;
/* Which parameters get weight decay: matrices (ndim >= 2: linear weights and
 * embeddings; norms and biases none, as common practice), all, or none. */
typedef enum { JOB_DECAY_MATRICES = 0, JOB_DECAY_ALL, JOB_DECAY_NONE, JOB_DECAY_COUNT } job_decay_t;
/* The precision a job computes in: fp32 everywhere, or bf16 weights and
 * activations with f32 gradients and f32 master weights in the optimizer. */
typedef enum { JOB_DTYPE_FP32 = 0, JOB_DTYPE_BF16, JOB_DTYPE_COUNT } job_dtype_t;
/* which CUDA attention kernels run (BATON_CUDA_ATTN, kernels/cuda/cuda.h);
 * default: the environment's choice, else the precise kernels */
typedef enum {
    JOB_ATTN_DEFAULT = 0,
    JOB_ATTN_PRECISE,
    JOB_ATTN_FAST,
    JOB_ATTN_CUDNN,
    JOB_ATTN_SIMT,
    JOB_ATTN_COUNT
} job_attention_t;
/* the BATON_CUDA_ATTN value of a, NULL for JOB_ATTN_DEFAULT */
const char *job_attention_env(job_attention_t a);
#define JOB_DEVICE_MAX 16
/* How pipeline neighbours on one host pass activations: auto (through
 * shared device memory, train/handoff.h, when the device is a GPU), ipc
 * (shared memory on any device that has it, cpu included), off (as message
 * payloads, staged through host memory). */
typedef enum { JOB_HANDOFF_AUTO = 0, JOB_HANDOFF_IPC, JOB_HANDOFF_OFF, JOB_HANDOFF_COUNT } job_handoff_t;
/* Edge classes a transport is chosen for. */
typedef enum { JOB_EDGE_CONTROL = 0, JOB_EDGE_PIPELINE, JOB_EDGE_DATA_PARALLEL,
               JOB_EDGE_TENSOR_PARALLEL, JOB_EDGE_CKPT, JOB_EDGE_COUNT } job_edge_t;

typedef struct {
    char    hf[JOB_PATH_MAX];     /* HF directory (config.json + safetensors); "" = init */
    int64_t layers, hidden, heads, kv_heads, ffn, vocab, seq;
    double  rope_theta, norm_eps, init_std;
    int64_t init_seed;            /* -1: use train.seed */
    bool    tie_embeddings;
    /* from model.hf's config (not a job field): routed experts, and how many */
    bool    has_experts;
    int64_t n_experts;
} job_model_t;

typedef struct {
    char    dir[JOB_PATH_MAX];    /* token shard directory (training stream) */
    char    val_dir[JOB_PATH_MAX];/* separate validation shards; "" = hold out `split` */
    int64_t seq_len;
    double  split;                /* fraction of the token stream held out (its tail) */
} job_data_t;

typedef struct {
    int64_t steps, micro_batch, grad_accum, seed, eval_every, eval_batches, log_every;
    int64_t max_skipped_steps; /* consecutive non-finite steps skipped before the run stops */
    int64_t global_batch;      /* sequences per step over all replicas (0: dp x microbatches x
                                * micro_batch as given); when set, the microbatches of each
                                * replica are derived from it, so that every layout trains the
                                * same tokens per step */
    int64_t global_batch_tokens; /* the same in tokens (a multiple of data.seq_len; sets
                                  * global_batch, which must agree when both are given) */
    int64_t stop_after;        /* stop after this step, as if interrupted (the schedule still
                                * spans `steps`; a checkpoint is saved there); 0: at `steps` */
} job_train_t;

typedef struct {
    double  lr, min_lr;
    int64_t warmup;
    job_warmup_from_t warmup_from;
    double  betas[2];
    double  eps, weight_decay, clip;  /* clip <= 0: no clipping */
    job_decay_t decay;
} job_optim_t;

typedef struct {
    int64_t tp, pp, dp;
    int64_t cp;                       /* context parallelism: each sequence over cp ranks (1: none) */
    job_cp_mode_t cp_mode;            /* parallel.cp_mode: allgather | ring */
    job_cp_exchange_t cp_exchange;    /* parallel.cp_exchange: auto | messages | collective */
    int64_t ep;                       /* expert parallelism: folded over tp x dp (1: none) */
    int64_t split[JOB_MAX_STAGES];    /* layers per pipeline stage (virtual stages included) */
    int     n_split;                  /* 0: even split */
    bool    split_balanced;           /* parallel.split: balanced (launch/split.h fills split) */
    int64_t virtual_stages;
    job_schedule_t schedule;
    int64_t microbatches;             /* pipeline microbatches per step; 0 = train.grad_accum */
    bool    zero1;
    bool    sequence_parallel;        /* Megatron-style sequence parallelism inside TP */
    coll_backend_t collectives;       /* parallel.collectives: auto, host, nccl */
} job_parallel_t;

/* export: the weights as one Hugging Face directory (config.json +
 * model.safetensors, and the tokenizer files), replaced as a whole. */
typedef struct {
    char    dir[JOB_PATH_MAX];
    int64_t every;                    /* steps; 0 = only at the end (when dir is set) */
    char    tokenizer[JOB_PATH_MAX];  /* tokenizer.json (or its directory) copied into dir;
                                       * "": model.hf's when it has one */
} job_export_t;

/* checkpoint: the native format (docs/CHECKPOINTS.md), the state a run
 * resumes from. dir may hold "{rank}" and "{host}", expanded per process,
 * so that every process writes to a folder of its own (node-local disks). */
typedef struct {
    char    dir[JOB_PATH_MAX];        /* root: step-NNNNNNNN/ folders and `latest` */
    int64_t every;                    /* steps; 0 = only at the end (when dir is set) */
    int64_t keep;                     /* newest checkpoints kept; 0 = all */
} job_checkpoint_t;

/* Paths may hold "{run}", the run's own directory (launch/rundir.h); the
 * defaults are all under it. "" turns an output off. */
typedef struct {
    char file[JOB_PATH_MAX];          /* JSON lines, one per step / eval */
    char plot[JOB_PATH_MAX];          /* loss-curve PNG written at the end */
    char throughput_plot[JOB_PATH_MAX]; /* tokens/s per step, PNG */
    char tensorboard[JOB_PATH_MAX];   /* TensorBoard event files (launch/tb.h) */
    bool log_scale;                   /* the loss plot's y axis logarithmic */
} job_metrics_t;

/* Where a field got its value: file and line/column (1-based), or "--set". */
typedef struct {
    bool set;
    int  line, col;
    bool from_override;
    bool as_option;   /* set by job_override_as: value is the option's text */
    char value[128];  /* an override's value text (truncated), for messages */
} job_origin_t;

/* How ranks start on hosts other than `local` (launch/ssh.h), and how the
 * driver supervises them. */
#define JOB_MAX_SSH_OPTS 16
typedef struct {
    char   ssh[JOB_MAX_SSH_OPTS][JOB_HOST_MAX]; /* launch.ssh: extra ssh arguments */
    int    n_ssh;
    char   workdir[JOB_PATH_MAX];  /* launch.workdir: cwd of the ranks ("": the driver's) */
    char   baton[JOB_PATH_MAX];    /* launch.baton: the binary on the hosts ("": this one's path) */
    double heartbeat_timeout;      /* launch.heartbeat_timeout: seconds of silence (5) */
    double heartbeat_interval;     /* launch.heartbeat_interval: seconds between a rank's (1) */
    double step_timeout;           /* launch.step_timeout: seconds for one step (300) */
    double collective_timeout;     /* launch.collective_timeout: seconds a collective may go
                                      without progress before it fails (30) */
} job_launch_t;

typedef struct {
    char             path[JOB_PATH_MAX];   /* the job file */
    job_model_t      model;
    job_data_t       data;
    job_train_t      train;
    job_optim_t      optim;
    job_parallel_t   parallel;
    job_xport_t      transport[JOB_EDGE_COUNT];
    job_handoff_t    handoff;                /* transport.handoff */
    char             device[JOB_DEVICE_MAX]; /* "cpu", "cuda", "cuda:N", "fenced", "auto" */
    job_dtype_t      dtype;
    job_attention_t  attention;
    char             hosts[JOB_MAX_HOSTS][JOB_HOST_MAX];
    int              n_hosts;
    job_launch_t     launch;
    struct {
        int64_t max;  /* restart.max: relaunches after a failure (launch/restart.h); 0: none */
        int64_t host_failures; /* restart.host_failures: failures that leave a host out (2); 0: never */
    } restart;
    job_export_t     export;
    job_checkpoint_t checkpoint;
    char             trace_dir[JOB_PATH_MAX];
    job_metrics_t    metrics;
    char             runs[JOB_PATH_MAX];     /* run directories go under runs/<job name>/ */
    job_origin_t     origin[JOB_MAX_FIELDS];  /* indexed by schema field */
} job_t;

/* Defaults (docs/JOBS.md lists them). */
void job_defaults(job_t *job);

/* Defaults, then the file. */
bt_status_t job_load(const char *path, job_t *job, char *err, size_t errlen);
/* Same from a string (tests); `name` stands for the file name in messages. */
bt_status_t job_load_string(const char *name, const char *yaml, job_t *job,
                            char *err, size_t errlen);
/* Same from len bytes (need not be NUL-terminated: the fuzz target). */
bt_status_t job_load_buffer(const char *name, const char *yaml, size_t len, job_t *job,
                            char *err, size_t errlen);
/* One "section.key=value" override. */
bt_status_t job_override(job_t *job, const char *assignment, char *err, size_t errlen);
/* The same for a job a command builds from its own options (baton eval
 * --layout): every message about the field, now or from job_validate and
 * job_error, begins with `option` (the option as the user gave it, e.g.
 * "--layout tp=3,pp=1,dp=1: parallel.tp: ...") instead of a file position
 * or "--set". */
bt_status_t job_override_as(job_t *job, const char *assignment, const char *option, char *err,
                            size_t errlen);
/* Cross-field checks; reads model.hf's config.json when set. */
bt_status_t job_validate(job_t *job, char *err, size_t errlen);

/* A message about `field` (a schema name) in the form above, placed where
 * the field was set (file:line:col, --set, or the file alone for a
 * default); returns BT_ERR_INVALID. For checks made after validation (the
 * memory estimate, launch/run_mem.h). */
bt_status_t job_error(const job_t *job, const char *field, char *err, size_t errlen,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Layers per pipeline stage (pp * virtual_stages entries): the explicit split
 * or an even one (the first layers % stages stages get one more). */
int job_stage_layers(const job_t *job, int64_t *out, int max);

const char *job_xport_name(job_xport_t x);
const char *job_edge_name(job_edge_t e);
/* The job as YAML, every field with its value (defaults, file and overrides
 * applied): what a run directory records as job.yaml, loadable again. With
 * model.hf the dimensions it decides are written as comments ("# layers: 6
 * (from model.hf)"), so that loading the file reads them from model.hf. */
void        job_write_yaml(const job_t *job, FILE *f);
/* Whether field `name` was set by the job file or an override (not a default). */
bool        job_field_set(const job_t *job, const char *name);
/* Number of schema fields and their dotted names (documentation, tests). */
int         job_field_count(void);
const char *job_field_name(int i);

/* Whether the job's model has routed experts (a validated job). */
static inline bool job_has_experts(const job_t *job) { return job->model.has_experts; }

/* The collective backend the job's groups run on (coll_backend_choose).
 * "Every rank's device is CUDA" means the device field says cuda or cuda:N
 * (device auto keeps the host backend: the driver, which decides, never
 * loads CUDA). Several ranks on a host sharing one GPU (cuda:N, or a bare
 * cuda with fewer GPUs visible than ranks, job_gpus_here) keep auto on host
 * and refuse nccl. The driver and each worker compute the same answer from
 * the same job, on hosts alike. */
bt_status_t job_collectives(const job_t *job, coll_backend_t *out, char *why, size_t why_cap);
/* GPUs on this host as CUDA will number them, read without loading CUDA:
 * the entries of CUDA_VISIBLE_DEVICES when it is set, else the GPUs under
 * /proc/driver/nvidia/gpus; 0 when neither says. */
int job_gpus_here(void);
/* The device a rank runs on: the job's, except that a bare "cuda" gives
 * each of a host's ranks a GPU of its own, cuda:(local % gpus), local being
 * the rank's index among its host's ranks (ranks fill hosts in blocks) and
 * gpus how many the process sees; with fewer GPUs than ranks they share
 * round robin. */
void job_rank_device(const job_t *job, int world, int rank, int gpus, char *out, size_t cap);
#endif
