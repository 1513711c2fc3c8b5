/* Pipeline schedules as per-stage op lists.
 *
 * The driver computes, for every pipeline stage, the ordered list of compute
 * ops it runs in one training step; a stage actor walks its list and waits
 * for the message an op needs (an activation from the previous virtual stage
 * for a forward, an activation gradient from the next for a backward). The
 * sends are implied: a forward's output goes to the next virtual stage, a
 * backward's input gradient to the previous one. Because every stage
 * derives the same lists from the same config, the order of the data-parallel
 * gradient collectives that follow is fixed too.
 *
 * Virtual stages (interleaving): with pp stages and vpp chunks per stage the
 * model is cut into pp*vpp pieces; chunk c of stage s runs virtual stage
 * c*pp + s (as Megatron-LM does), so a microbatch visits stage 0, 1, ...,
 * pp-1, then stage 0 again for its next chunk.
 *
 *   1f1b:        warmup of (pp - s - 1) forwards, then one-forward-one-backward,
 *                then the remaining backwards. Bubble (pp-1)/(m+pp-1).
 *   interleaved: the Megatron-LM interleaved 1F1B: forwards of microbatch
 *                groups of pp, chunk by chunk; warmup 2*(pp-s-1) + (vpp-1)*pp.
 *                Needs m % pp == 0. Bubble about (pp-1)/(vpp*m + pp-1).
 */
#ifndef BT_TRAIN_PIPE_SCHEDULE_H
#define BT_TRAIN_PIPE_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

typedef enum {
    PIPE_SCHED_1F1B = 0,
    PIPE_SCHED_INTERLEAVED,
    PIPE_SCHED_COUNT,
} pipe_sched_kind_t;

typedef enum { PIPE_OP_FWD = 0, PIPE_OP_BWD, PIPE_OP_COUNT } pipe_op_kind_t;

typedef struct {
    pipe_op_kind_t kind;
    int            mb;     /* microbatch 0..m-1 */
    int            chunk;  /* model chunk on this stage 0..vpp-1 */
} pipe_op_t;

typedef struct {
    pipe_sched_kind_t kind;
    int               pp;           /* pipeline stages */
    int               vpp;          /* chunks per stage (1 for plain 1f1b) */
    int               microbatches; /* per step, per data-parallel replica */
} pipe_config_t;

/* Name of a kind ("1f1b", "interleaved"); parse returns -1 when unknown. */
const char *pipe_sched_name(pipe_sched_kind_t k);
int         pipe_sched_parse(const char *name);

/* Checks the combination; writes a reason into why (may be NULL). */
bt_status_t pipe_config_check(const pipe_config_t *cfg, char *why, size_t why_cap);

/* Number of ops every stage runs: 2 * microbatches * vpp. */
int pipe_ops_per_stage(const pipe_config_t *cfg);

/* The op list of `stage`; ops has pipe_ops_per_stage() entries. */
bt_status_t pipe_schedule_build(const pipe_config_t *cfg, int stage, pipe_op_t *ops);

static inline int pipe_virtual_stage(const pipe_config_t *cfg, int stage, int chunk)
{
    return chunk * cfg->pp + stage;
}

/* Theoretical bubble fraction of the schedule: idle / (idle + busy). */
double pipe_bubble_theory(const pipe_config_t *cfg);

typedef struct {
    double makespan;       /* time of the whole step */
    double busy[64];       /* per stage */
    double bubble;         /* mean over stages of idle / makespan */
    int    max_in_flight[64]; /* most microbatch-chunks held between F and B */
} pipe_sim_t;

/* Discrete-event run of the op lists with fixed op costs: checks every
 * dependency (F of a virtual stage after F of the previous one, B after B of
 * the next, B after its own F) and that the lists cannot deadlock.
 * BT_ERR_INVALID (and a log line naming the stuck stages) when they do. */
bt_status_t pipe_schedule_simulate(const pipe_config_t *cfg, double t_fwd, double t_bwd,
                                   pipe_sim_t *out);

#endif
