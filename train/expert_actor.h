/* The expert group of a rank as an actor: the routed experts that one EP
 * rank owns (in every sparse layer of the rank's chunks) and their side
 * of the token exchange (docs/PARALLEL.md "Expert parallelism").
 *
 * The stage's forward or backward reaches a sparse layer; the layer routes
 * its tokens and packs them by expert (model/moe.c), and its expert part
 * (model_moe_job_t: counts, rows out, the experts' products, rows back) is
 * handed to this actor:
 *
 *   compute thread  the model calls model_t moe_group (expert_group_run),
 *                   which registers the job here and tells the stage
 *                   (a completion, EXPERT_JOB_ROUTED), then yields the
 *                   compute worker (actor_worker_yield_until) until the
 *                   stage hears back;
 *   stage  -> group EXPERT_TOKENS {call, layer, phase, rows} (the routed
 *                   rows are in the layer's dispatch buffers);
 *   group           submits the expert part to the compute worker it
 *                   shares with the stage: the waiting thread runs it
 *                   (dispatch all-to-all, the experts, combine all-to-all
 *                   on the collective backend, exactly as the model would
 *                   inline: the same stream, thread and order, so the
 *                   same bits), and its row all-to-alls become this
 *                   actor's comm spans in the trace;
 *   group  -> stage EXPERT_DONE {call, layer, phase, rows_in, status};
 *   stage           releases the waiting thread (expert_actor_done), and
 *                   the layer goes on with combine.
 *
 * The buffers the rows travel in belong to the stage's activation arena:
 * the messages carry the hand-over, not the bytes (they never leave the
 * process). Only one call is in flight: the stage runs one op at a time,
 * and a layer waits for its experts.
 */
#ifndef BT_TRAIN_EXPERT_ACTOR_H
#define BT_TRAIN_EXPERT_ACTOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "actors/router.h"
#include "actors/worker.h"
#include "model/model.h"

#define EXPERT_MAX_CHUNKS 16

/* The completion tag the stage receives when a layer's rows are routed
 * (m->sys.work.arg: the expert_call_t to pass to expert_actor_tokens_send). */
#define EXPERT_JOB_ROUTED 0x4558u

typedef struct {
    int             rank, ep_rank, ep_size, edp_rank;
    actor_t        *stage;     /* the rank's stage actor (same loop) */
    actor_worker_t *worker;    /* the compute worker it shares with the stage */
    model_t        *chunks[EXPERT_MAX_CHUNKS];
    int             n_chunks;
} expert_actor_config_t;

/* One hand-over in flight (on the waiting compute thread's stack). */
typedef struct expert_call {
    model_moe_job_t *job;
    uint64_t         call;
    struct expert_actor *x;
    _Atomic bool     done;
    bt_status_t      status;
} expert_call_t;

typedef struct expert_actor {
    actor_t               a; /* first: the runtime header */
    expert_actor_config_t cfg;
    expert_call_t        *_Atomic pending; /* registered by expert_group_run */
    expert_call_t        *running;         /* submitted to the worker (loop thread; the
                                            * job reads it, after the submission) */
    int64_t               run_step;        /* its envelope step and microbatch */
    int32_t               run_mb;
    uint64_t              calls;           /* hand-overs so far (compute thread) */
    uint64_t              rows_in;         /* rows its experts ran on (loop thread) */
} expert_actor_t;

/* Installs the group as the runner of every chunk's expert parts
 * (model_t moe_group); then actor_register with expert_actor_class. */
bt_status_t expert_actor_init(expert_actor_t *x, const expert_actor_config_t *cfg);
/* Uninstalls it from the chunks. */
void        expert_actor_fini(expert_actor_t *x);
extern const actor_class_t expert_actor_class;

/* The stage's side, on its loop: EXPERT_TOKENS for the routed call (from
 * the EXPERT_JOB_ROUTED completion) with the op's step and microbatch; the
 * answer EXPERT_DONE for it releases the waiting compute thread
 * (expert_actor_done: true when m answers the call in flight, else false
 * after logging why). */
bt_status_t expert_actor_tokens_send(actor_t *stage, actor_addr_t to, expert_call_t *call,
                                     int64_t step, int32_t mb, expert_call_t **in_flight);
bool        expert_actor_done(expert_call_t **in_flight, actor_msg_t *m);

#endif
