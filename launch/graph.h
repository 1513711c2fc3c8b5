/* The actor graph of a job: ranks, their coordinates, the actors each rank
 * hosts, the pipeline edges between stage actors and the collective groups.
 * The driver, every worker and `baton graph` derive it from the same
 * validated job, so they agree on every address without exchanging it.
 *
 * Rank order tp-cp-ep-dp-pp with tp fastest (ep folds into the others,
 * below, so it adds no factor to the dense grid):
 *   rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
 * The driver is rank `world` (one past the last worker).
 *
 * Context parallelism: the cp ranks of one (tp, dp, pp) hold the chunks of
 * the same sequences (model/cp_attn.h) and form a CP group (K/V exchanges
 * of the attention); the dense gradients reduce over dp x cp (the DP group
 * spans both, cp fastest, as Megatron's dp-cp group), while the data and
 * the evaluation microbatches follow dp alone.
 *
 * The expert grid (etp, ep, edp, pp) folds over the dense grid (tp, cp, dp,
 * pp): the same pipeline stages, and within a stage the same tp x cp x dp
 * ranks renumbered i = tp_rank + tp * (cp_rank + cp * dp_rank), with
 * ep_rank = i % ep and edp_rank = i / ep (etp = 1: an expert is never
 * split). An EP group is ep consecutive i (it may span TP and CP ranks: EP
 * may exceed DP), an edp group the ranks of one stage with the same ep_rank
 * (they hold the same experts and sum those gradients; the dense ones sum
 * over dp x cp).
 *
 * Virtual stages: the model is cut into pp * vpp pieces; virtual stage v runs
 * on pipeline stage v % pp as its chunk v / pp (train/pipe_schedule.h).
 *
 * Actor slots on a worker rank: GRAPH_SLOT_STAGE (one stage actor holding
 * the rank's vpp chunks), GRAPH_SLOT_DATA (data actor, on ranks that hold
 * virtual stage 0 or the last one), GRAPH_SLOT_EXPERTS (the expert group:
 * the experts this EP rank owns in the sparse layers of its chunks, fed by
 * the stage, train/expert_actor.h; models with routed experts).
 * Driver rank: GRAPH_SLOT_DRIVER.
 */
#ifndef BT_LAUNCH_GRAPH_H
#define BT_LAUNCH_GRAPH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "launch/job.h"
#include "model/model.h"
#include "train/pipe_schedule.h"

#define GRAPH_SLOT_STAGE  1u
#define GRAPH_SLOT_DATA   2u
#define GRAPH_SLOT_CKPT   3u  /* the checkpoint writer (when checkpoint.dir is set) */
#define GRAPH_SLOT_EXPERTS 4u /* the expert group (a model with routed experts) */
#define GRAPH_SLOT_DRIVER 1u
#define GRAPH_MAX_VSTAGES 256
#define GRAPH_MAX_WORLD   1024

/* Collective groups a rank may belong to. The order of this enum is the
 * order in which every rank connects its groups (it has to be the same
 * everywhere: a connect blocks until every member is connecting too). */
typedef enum {
    GRAPH_GROUP_WORLD = 0, /* all ranks: grad-norm reduction */
    GRAPH_GROUP_TP,        /* same (dp, pp) */
    GRAPH_GROUP_DP,        /* same (tp, pp), every (cp, dp): gradient reduction / ZeRO-1 */
    GRAPH_GROUP_EMB,       /* first and last pipeline stage of one (tp, cp, dp): tied embedding */
    GRAPH_GROUP_EP,        /* routed experts: one stage's ranks with the same edp_rank */
    GRAPH_GROUP_EDP,       /* routed experts: one stage's ranks with the same ep_rank */
    GRAPH_GROUP_CP,        /* context parallelism: same (tp, dp, pp) */
    GRAPH_GROUP_COUNT,
} graph_group_t;

typedef struct {
    int tp, pp, dp, vpp;
    int cp;                                /* context parallelism (1: none) */
    bool cp_ring;                          /* parallel.cp_mode ring (else all-gather) */
    int ep, edp;                           /* the expert grid: ep x edp = tp x cp x dp */
    bool moe;                              /* the model has routed experts (EP/EDP groups) */
    int world;
    int n_vstages;                         /* pp * vpp */
    int first_layer[GRAPH_MAX_VSTAGES + 1]; /* virtual stage v: [first[v], first[v+1]) */
    int microbatches;                      /* per step, per data-parallel replica */
    int64_t micro_batch, seq_len;          /* rows per microbatch, tokens per row */
    bool tied;                             /* tied embeddings */
    bool zero1;
    bool sp;                               /* parallel.sequence_parallel (inside TP) */
    pipe_config_t pipe;
} graph_t;

typedef struct {
    int tp, cp, dp, pp;
    int ep, edp; /* the rank's place in the expert grid of its stage */
} graph_coord_t;

/* From a validated job. BT_ERR_INVALID with a message in err for a layout
 * this runtime cannot run (e.g. more ranks than it supports). */
bt_status_t graph_build(const job_t *job, graph_t *g, char *err, size_t errlen);

static inline int graph_rank(const graph_t *g, int tp, int cp, int dp, int pp)
{
    return tp + g->tp * (cp + g->cp * (dp + g->dp * pp));
}
graph_coord_t graph_coord(const graph_t *g, int rank);

/* Rank and chunk of virtual stage v for the (tp, cp, dp) replica of `rank`. */
int  graph_vstage_rank(const graph_t *g, int v, int rank);
static inline int graph_vstage_chunk(const graph_t *g, int v) { return v / g->pp; }
static inline int graph_chunk_vstage(const graph_t *g, int pp_rank, int chunk)
{
    return chunk * g->pp + pp_rank;
}
/* The model stage (layers, embedding, head) of virtual stage v. */
model_stage_t graph_vstage_stage(const graph_t *g, int v, int n_layers);

/* Whether `rank` needs token data (holds virtual stage 0 or the last). */
bool graph_rank_needs_data(const graph_t *g, int rank);

/* Members of `kind`'s group that `rank` belongs to, in group-rank order;
 * returns the group size (0 when the rank is in no group of that kind, or
 * the group would have a single member) and this rank's index in *me. */
int  graph_group_members(const graph_t *g, graph_group_t kind, int rank, int *members, int *me);
const char *graph_group_name(graph_group_t kind);

/* The transport an edge class of the job really uses between processes
 * ("tcp" or "ucx"; auto resolved as the runtime resolves it). */
const char *graph_edge_xport(const job_t *job, job_edge_t e);

/* The group that reduces the routed experts' gradients of `rank`: EDP,
 * or DP where the two are the same ranks (ep = tp = 1), so that no second
 * communicator doubles the dp one. */
graph_group_t graph_expert_dp_group(const graph_t *g);

/* Human-readable graph (actors, placement, edges, groups) of the job. */
void graph_print(const graph_t *g, const job_t *job, FILE *f);

#endif
