/* The stage actor of a rank: it holds the rank's model chunks (one per
 * virtual stage it runs), walks the pipeline schedule's op list of each step
 * (train/pipe_schedule.h) and runs every op on the compute worker, never on
 * its loop.
 *
 *   F(mb, chunk): needs the DATA_BATCH of mb when the chunk is virtual stage
 *                 0 (ids) or the last one (targets), and otherwise the
 *                 ACTIVATION of mb from the previous virtual stage. Its
 *                 output goes to the next virtual stage as an ACTIVATION
 *                 (tensor "x" [B,T,C]); the last virtual stage computes the
 *                 loss and prepares its backward instead.
 *   B(mb, chunk): needs the ACT_GRAD of mb from the next virtual stage
 *                 (tensor "dx"), except on the last virtual stage. Its input
 *                 gradient goes to the previous virtual stage.
 * Handoff (train/handoff.h): where the config says so for an edge, the
 * ACTIVATION / ACT_GRAD carries "x.ho" / "dx.ho" instead of the bytes, a
 * descriptor of a buffer this rank shares with the neighbour on its host;
 * the receiver copies it on its device after its op and answers RELEASE.
 * A stage accepts either form on any edge.
 * Messages that arrive before their op is due are kept (ACTOR_KEPT) until it
 * is. After the last op the end-of-step job (train/dist_optim.h) runs on the
 * worker; its completion sends METRICS to the driver: grad_norm, lr and a
 * tensor "loss" f64 [2] = {sum of NLL, scored positions} of this rank's
 * microbatches (zeros unless it holds the last virtual stage).
 *
 * Control protocol with the driver (over MSG_HEARTBEAT's state field until
 * the wire format has dedicated types):
 *   driver -> stage  STAGE_CMD_STEP (step = n, 1-based): run step n
 *   driver -> stage  STAGE_CMD_EVAL: one forward-only pass over the evaluation
 *                    rows (config eval_rows; the data actor has them): ops
 *                    F(j, chunk) for every local microbatch j, chunk by
 *                    chunk; data-parallel rank d takes the global eval
 *                    microbatches d, d+dp, ...; messages carry step
 *                    STAGE_EVAL_STEP; METRICS as for a step (grad_norm NaN)
 *   driver -> stage  STAGE_CMD_EXPORT: send parameters (CKPT_SHARD) if this
 *                    rank exports, then STAGE_ST_EXPORTED
 *   driver -> stage  STAGE_CMD_SAVE (step = n, between steps): the compute
 *                    thread copies the rank's checkpoint items (the state
 *                    after step n) to the host, and the stage hands them to
 *                    its writer (train/ckpt_writer.h) as CKPT_CTL BEGIN +
 *                    CKPT_PIECE messages; the next step starts as soon as
 *                    the copy is done, while the writer writes
 *   stage -> driver  STAGE_ST_READY once, STAGE_ST_ALIVE every heartbeat;
 *                    an ALIVE carries the text "wait": what the rank waits
 *                    in (lines "pipe TYPE STEP MB VSTAGE FROM SINCE_MS",
 *                    "busy STEP SINCE_MS" while a compute job runs, the
 *                    collectives of coll_watch_describe, and "sent"/"recv"
 *                    TYPE PEER STEP MB AGO_MS: actor_last_msgs)
 *   STOP             stop this process (status says whether it is a failure)
 * Peer failures reported by the router (MSG_ERROR_REPORT) are forwarded to
 * the driver, which decides; losing the driver stops the process.
 */
#ifndef BT_TRAIN_STAGE_ACTOR_H
#define BT_TRAIN_STAGE_ACTOR_H

#include <stdbool.h>
#include <stdint.h>

#include "actors/router.h"
#include "actors/worker.h"
#include "train/cp_ring.h"
#include "train/handoff.h"
#include "train/dist_optim.h"
#include "model/model.h"
#include "train/pipe_schedule.h"

enum {
    STAGE_ST_ALIVE    = 1,
    STAGE_ST_READY    = 2,
    STAGE_ST_EXPORTED = 3,
    STAGE_ST_QUIESCED = 4, /* answered a STOP with status IN_PROGRESS (job ending) */
    STAGE_CMD_STEP    = 0x5354,
    STAGE_CMD_EXPORT  = 0x4558,
    STAGE_CMD_EVAL    = 0x4556,
    STAGE_CMD_SAVE    = 0x5341, /* step n: hand the state after step n to the writer */
};

/* Envelope step of every message of an evaluation pass (training steps are >= 1). */
#define STAGE_EVAL_STEP (-1)

#define STAGE_MAX_CHUNKS DIST_OPTIM_MAX_CHUNKS

typedef struct {
    int             rank, pp_rank;
    pipe_config_t   pipe;
    int             n_vstages;                /* pp * vpp */
    model_t        *chunks[STAGE_MAX_CHUNKS];  /* chunk k runs virtual stage k*pp + pp_rank */
    actor_addr_t    next[STAGE_MAX_CHUNKS];    /* stage actor of virtual stage v+1 (unused on the last) */
    actor_addr_t    prev[STAGE_MAX_CHUNKS];    /* ... of v-1 (unused on virtual stage 0) */
    bool            handoff_next[STAGE_MAX_CHUNKS]; /* hand activations to next[k] off (handoff.h) */
    bool            handoff_prev[STAGE_MAX_CHUNKS]; /* ... and input gradients to prev[k] */
    actor_addr_t    driver;
    actor_addr_t    data;                      /* local data actor; 0 when none */
    int             tp_rank, tp_size;
    int             dp_rank, dp_size;
    /* context parallelism: this rank holds chunks cp_rank and
     * 2*cp_size-1-cp_rank of every row, T (below) tokens of the job's
     * T * cp_size; the data actor sends them, the stage gives the model
     * their positions ({0 or 1}: none) */
    int             cp_rank, cp_size;
    /* ring mode over messages (train/cp_ring.h): the chunks' ring blocks
     * go to the stage actor cp_next and come from cp_prev as CP_BLOCK
     * messages; cp_ranks [cp_size] names the group in errors; a wait
     * longer than cp_timeout_s fails. false: the model's own exchange */
    bool            cp_msgs;
    actor_addr_t    cp_next, cp_prev;
    const int      *cp_ranks;
    double          cp_timeout_s;
    int64_t         eval_rows;                 /* rows of the evaluation set (0: none) */
    bool            eval_pad;                  /* every dp rank runs as many evaluation
                                                * microbatches as dp rank 0, the missing
                                                * ones one row with nothing scored (the
                                                * EP group exchanges in every forward) */
    bool            exporter;                  /* sends its parameters on STAGE_CMD_EXPORT
                                                * (every TP rank of its replica takes part
                                                * in gathering them) */
    int64_t         B, T;
    bool            eval_only;                 /* evaluation only (no opt): one forward-only
                                                * arena per chunk; a training step is refused */
    float           dloss;                     /* 1 / scored positions of the global batch */
    dist_optim_t   *opt;
    actor_addr_t    writer;                    /* checkpoint writer (0: none) */
    actor_addr_t    experts;                   /* the rank's expert group (train/expert_actor.h;
                                                * 0: none, the layers run their experts inline) */
    int64_t         first_step;                /* resumed: the step the checkpoint is of (0) */
    const struct ckpt_items *ckpt;             /* what this rank's checkpoints hold */
    actor_worker_t *worker;
    actor_router_t *rt;
    double          heartbeat_s;
} stage_actor_config_t;

typedef struct stage_job stage_job_t;
typedef struct stage_snap stage_snap_t;
typedef struct stage_staging stage_staging_t;

/* One kind of pass: its op list and the kept inputs of its microbatches. */
typedef struct {
    pipe_op_t    *ops;
    int           n_ops, n_mb;
    bool          eval;
    actor_msg_t **data_in;  /* [n_mb] */
    actor_msg_t **act_in;   /* [n_mb * vpp] */
    actor_msg_t **grad_in;  /* [n_mb * vpp] */
} stage_pass_t;

typedef struct {
    actor_t              a; /* first: the runtime header */
    stage_actor_config_t cfg;
    stage_pass_t         train, eval;
    stage_pass_t        *cur;           /* the pass running (or last run) */
    int                  pc;
    bool                 busy, ending, running;
    int64_t              step;          /* step being run (1-based), 0 before the first */
    int64_t              done_step;
    model_acts_t       **acts;          /* [M * vpp] */
    double               loss_sum;
    int64_t              n_scored;
    int32_t             *cp_pos;        /* [B*T] positions of the CP rank's chunks, or NULL */
    /* rank 0 on a GPU: the device's matrix rate measured at init
     * (kern_peak_flops, the driver's MFU denominator), sent with the first
     * METRICS; 0: not measured or already sent */
    double               peak_flops;
    /* the last training step's routed-expert load of this rank's chunks
     * (model_moe_load_take), rows of [layer, tokens of expert 0..E-1]:
     * n_load rows of load_cols doubles, sent with its METRICS */
    double              *load;
    int                  n_load, load_cols;
    /* with a capacity factor: the choices this rank's chunks dropped in the
     * last training step (model_moe_dropped_take), sent with its METRICS;
     * -1: dropless */
    int64_t              dropped;
    stage_job_t         *job;
    actor_timer_t        hb;
    float              **export_buf[STAGE_MAX_CHUNKS]; /* per chunk, per parameter: the whole
                                                     * tensor between gather and send */
    uint64_t             t_step0;
    /* staged outputs (not handed off): the compute thread queues the copy
     * of an op's output into a host buffer from `staging` (pinned on cuda)
     * on `copy` and goes on with the next op; the message leaves when the
     * copy is done (JOB_STAGED). An op on an arena whose copy may still
     * run waits for ev_copied[arena] on its own stream first (before any
     * copy from it, a wait for nothing). */
    kern_stream_t       *copy;
    kern_event_t        *ev_compute;
    kern_event_t       **ev_copied;     /* [M * vpp] */
    stage_staging_t     *staging;
    bool                 ho_on;         /* some edge hands off: ho_pool is set up */
    handoff_pool_t       ho_pool;       /* buffers this rank hands to its neighbours */
    handoff_map_t        ho_map;        /* the neighbours' buffers mapped here (compute thread) */
    _Atomic(stage_snap_t *) snap_spare; /* the last checkpoint's host block, for the next */
    struct expert_call  *exp_call;      /* a sparse layer's rows with the expert group */
    bool                 cp_ring_on;    /* cfg.cp_msgs: cp_ring is set up */
    cp_ring_t            cp_ring;       /* the CP ring's mailbox (train/cp_ring.h) */
    /* what the op walk waits for (hang reports: each heartbeat says it):
     * the input message of the op due, set when advance() stops for it */
    uint32_t             wait_type;     /* MSG_DATA_BATCH / ACTIVATION / ACT_GRAD; 0: none */
    int                  wait_mb, wait_vstage;
    uint32_t             wait_from;     /* the rank it comes from */
    uint64_t             wait_t0, busy_t0; /* since when it waits / the job in flight runs */
} stage_actor_t;

/* Op lists, activation arenas; then actor_register with stage_actor_class. */
bt_status_t stage_actor_init(stage_actor_t *s, const stage_actor_config_t *cfg);
void        stage_actor_fini(stage_actor_t *s);
extern const actor_class_t stage_actor_class;

#endif
