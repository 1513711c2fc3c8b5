/* What a training run tells the person who started it, the same for the
 * single-process run (launch/cmd_run.c) and the driver of a layout
 * (launch/driver.c):
 *   header    run id and directory; model (parameters, layers, hidden,
 *             vocabulary); layout (processes, tp/pp/dp, virtual stages per
 *             rank, schedule, microbatches, ZeRO-1); the transport of each
 *             edge class as resolved; tokens per step; the MFU peak;
 *   progress  every train.log_every steps (and the first, the last, a
 *             skipped one): step, loss, lr, gradient norm, mean step time
 *             and tokens/s over the interval since the last line, MFU over
 *             that interval, the peak resident memory of the largest rank
 *             (which rank), skipped steps so far, ETA;
 *   eval      validation loss and perplexity (long evaluations print their
 *             progress themselves);
 *   summary   wall time, training time, tokens, mean tokens/s and MFU, best
 *             validation loss, peak memory of every rank, and where the
 *             metrics, pictures, TensorBoard events, trace, checkpoints
 *             and export went.
 * Every step also goes to metrics.file (JSON lines) and
 * metrics.tensorboard (launch/tb.h); the pictures (launch/plot.h) are drawn
 * at the end.
 *
 * MFU = model_flops_per_token (model/flops.h, the one documented formula)
 * x tokens/s / peak. The peak: BATON_PEAK_TFLOPS when set; on a CPU run the
 * fp32 product rate measured at the start (kern_cpu_peak_flops, the
 * host's cores: every rank of a local job shares them); on a GPU the
 * matrix rate in the parameters' dtype that the training process (rank 0
 * of a multi-process run) measures on its device before the first step
 * (kern_peak_flops, report_set_peak); until then, or where it cannot be
 * measured, MFU is shown as n/a.
 *
 * Memory: the peak resident size of each rank (base/mem.h) and, on a GPU,
 * the most device memory each rank held (kern_mem_peak: its allocations,
 * stream scratch and library workspaces, not the CUDA context). */
#ifndef BT_LAUNCH_REPORT_H
#define BT_LAUNCH_REPORT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "base/tensor.h"
#include "launch/job.h"
#include "launch/plot.h"
#include "launch/tb.h"
#include "model/config.h"

#define REPORT_MAX_RANKS 1024

typedef struct {
    const job_t *job;
    const char  *run_id, *run_dir;   /* NULL: none */
    bool         quiet;
    int64_t      base_step, last_step; /* resumed from; stop_after or steps */
    int64_t      tokens_before;      /* tokens of the steps before base_step */
    int          n_ranks;
    double       flops_per_token;
    double       peak_flops;         /* 0: unknown */
    char         peak_what[96];
    FILE        *metrics;
    tb_writer_t  tb;
    plot_curve_t loss, val, tput;
    uint64_t     t_start, t_int;     /* ns: run start, interval start */
    int64_t      tokens, tok_int;    /* tokens done; at the interval start */
    int64_t      steps_int;          /* steps in the interval */
    double       step_s_int, train_s;
    double       best_val;
    int64_t      best_val_step;
    uint64_t     mem[REPORT_MAX_RANKS]; /* peak resident bytes of each rank */
    uint64_t     dev_mem[REPORT_MAX_RANKS]; /* peak device bytes of each rank (0: none) */
} report_t;

/* Opens metrics.file (appended to on resume) and metrics.tensorboard,
 * measures or reads the MFU peak. n_ranks: processes that report memory
 * (1 for a single process). BT_ERR_IO (logged, naming the field). */
bt_status_t report_open(report_t *r, const job_t *job, const model_config_t *cfg, int n_ranks,
                        bool resume, bool quiet, const char *run_id, const char *run_dir);
/* The header; what the layout part says comes from the caller (layout: a
 * line without newline, NULL for none; val_tokens -1: not known here). */
void        report_header(report_t *r, const model_config_t *cfg, int64_t n_params,
                          const char *layout, int64_t tokens_per_step, int64_t train_tokens,
                          int64_t val_tokens);

typedef struct {
    int64_t  step, tokens;           /* this step's scored tokens */
    double   loss, lr, grad_norm, step_s;
    bool     skipped;
    int64_t  skipped_total;
    const uint64_t *mem;             /* [n_ranks] peak resident bytes (0: unknown); NULL: none */
    const uint64_t *dev_mem;         /* [n_ranks] peak device bytes (0: none); NULL: none */
    /* routed experts: the step's tokens per expert, load_rows rows of
     * load_cols doubles [layer, expert 0, ..., expert E-1] in layer order
     * (NULL: none), written as "expert_tokens": {"LAYER": [...], ...} */
    const double *load;
    int      load_rows, load_cols;
    /* with a capacity factor (has_dropped): the routed choices the experts'
     * capacity dropped in the step's forwards, over the global batch,
     * written as "moe_dropped": N */
    bool     has_dropped;
    int64_t  moe_dropped;
} report_step_t;

/* The MFU denominator, measured after report_open (a GPU's product rate,
 * kern_peak_flops; what: how it was measured, for the header and the
 * summary). flops <= 0 leaves MFU n/a and says why. BATON_PEAK_TFLOPS,
 * when set, wins. */
void        report_set_peak(report_t *r, double flops, const char *what);
/* report_set_peak with kern_peak_flops(dev, dt), for a process that trains
 * on dev itself. */
void        report_peak_measure(report_t *r, device_t dev, dtype_t dt);
void        report_step(report_t *r, const report_step_t *s);
void        report_eval(report_t *r, int64_t step, double loss);
/* The pictures and the summary (completed: the run reached its last step). */
bt_status_t report_finish(report_t *r, bool completed);
void        report_close(report_t *r);

#endif
