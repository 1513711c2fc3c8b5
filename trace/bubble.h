/* Pipeline bubble of a traced run (`baton trace DIR --summary`).
 *
 * Input: the compute spans "fwd" / "bwd" that the stage actors record
 * (train/stage_actor.c: one span per microbatch op, step >= 1 for training)
 * and the stage track names written by the workers (launch/worker.c:
 * "stage r<rank> pp<stage> dp<replica> tp<rank> v<virtual stages>").
 *
 * Definition (docs/PARALLEL.md, "Pipeline bubble"): a replica is the
 * pipeline of one (dp, tp) coordinate. For each training step of a replica
 * the window is [first F start on any of its stages, last B end on any of
 * its stages]. Per stage: busy = union of its F/B spans of that step,
 * idle = window - busy, bubble = sum idle / sum window over the steps after
 * the first (step 1 pays for warm-up: first allocations, page faults). The
 * optimizer span and the DP gradient reduction lie after the last B and
 * are outside the window: they are not part of the pipeline schedule.
 * Theory for 1F1B with p equal stages and m microbatches: (p-1)/(m+p-1);
 * interleaved with v virtual stages per rank: (p-1)/(v*m+p-1).
 *
 * "replay": the same bubble computed on a replay of the executed op order
 * (per stage, from the trace) with every op lasting its stage's median F or
 * B compute time and messages taking no time. Compute time is the CPU time
 * of the compute thread in the op (trace_span_cpu), so a preempted op does
 * not count longer; spans without it fall back to wall time. The replay
 * keeps what the schedule and the stage balance decide and drops what a
 * loaded machine adds (preemption, wake-up and message latency): the number
 * a test can compare with the theory on a shared machine. vpp = 1 only.
 *
 * order_1f1b: every counted step of the stage ran exactly the 1F1B order
 * (p-1-s warm-up forwards, then one F one B, then the cool-down backwards). */
#ifndef BT_TRACE_BUBBLE_H
#define BT_TRACE_BUBBLE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "trace/read.h"

typedef struct {
    char     name[64];
    int      pp, dp, tp;
    int64_t  steps;        /* steps counted (after the first) */
    int      m;            /* forward ops per step */
    double   window_ms, busy_ms, idle_ms; /* summed over counted steps */
    double   bubble;       /* idle / window */
    double   replay;       /* bubble of the replayed schedule; NAN when not replayed */
    double   fwd_ms, bwd_ms; /* median op compute (CPU) time */
    bool     wall_only;    /* some op had no CPU time: wall time used for it */
    bool     order_1f1b;
} trace_stage_stat_t;

typedef struct {
    trace_stage_stat_t *stages;
    size_t              nstages;
    int                 p, m, vpp;
    double              theory;  /* NAN when p or m is unknown */
    double              bubble;  /* mean over stages */
    double              replay;  /* mean over stages; NAN when not replayed */
    bool                order_1f1b; /* every stage */
} trace_bubble_t;

/* BT_ERR_NOT_FOUND (reason in err) when the trace has no stage with two
 * training steps of F/B spans; BT_ERR_NOMEM. */
bt_status_t trace_bubble_compute(const trace_set_t *set, trace_bubble_t *out, char *err, size_t err_cap);
void        trace_bubble_print(const trace_bubble_t *b, FILE *out);
void        trace_bubble_free(trace_bubble_t *b);

#endif
