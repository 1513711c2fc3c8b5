/* The context-parallel ring over actor messages (docs/PARALLEL.md, "Ring
 * mode"): the K/V blocks and the backward's dK/dV accumulators of every
 * attention layer pass from the stage actor of CP rank r to that of CP
 * rank r + 1 as CP_BLOCK messages (wire/msg.h), one per tensor, each with
 * its own shape (K and V of different head sizes are never concatenated).
 *
 *   compute thread  model_cp_ring_start (model/cp_xchg.c) calls
 *                   cp_ring_ops.send: the block is copied into a new
 *                   CP_BLOCK message, which is handed to the stage's loop
 *                   (actor_complete with CP_RING_JOB_SEND): no wait for
 *                   the wire; then the attention of the block in hand runs
 *                   while the message travels;
 *   stage loop      cp_ring_send (from the stage's completion handler)
 *                   actor_send()s it to CP rank r + 1's stage actor;
 *   peer's loop     cp_ring_on_block (the stage's CP_BLOCK handler) keeps
 *                   the message in this mailbox under its tag (step,
 *                   microbatch, chunk, layer, pass, ring step, tensor) and
 *                   wakes the compute thread; never blocks;
 *   compute thread  model_cp_ring_wait calls cp_ring_ops.recv: waits on
 *                   the mailbox (condition variable, launch.step_timeout)
 *                   for its tag, copies the payload into the ring buffer
 *                   and frees the message (the transport gets its buffer
 *                   back).
 *
 * Flow: at most CP_RING_WINDOW blocks per peer are handed over and not yet
 * written to the transport; the compute thread waits (same timeout) before
 * handing over another. Failures: a peer of the ring the router reports
 * (cp_ring_fail from the stage's ERROR_REPORT handler), the stage stopping,
 * or the timeout end the wait with an error that names the CP group, the
 * layer, the pass and ring step, the tensor and the peer's CP rank and rank.
 */
#ifndef BT_TRAIN_CP_RING_H
#define BT_TRAIN_CP_RING_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "actors/actor.h"
#include "model/cp_xchg.h"

#define CP_RING_JOB_SEND 0x4350u /* completion tag: m->sys.work.arg is a CP_BLOCK to send */
#define CP_RING_WINDOW   8u      /* blocks per peer handed over, not yet on the wire */
#define CP_RING_MAX      1024

typedef struct {
    actor_t     *stage;             /* the stage actor (its loop sends) */
    int          rank, cp_rank, cp_size;
    const int   *cp_ranks;          /* [cp_size]: the group's ranks in CP order (copied) */
    actor_addr_t next, prev;        /* stage actors of CP ranks r + 1 and r - 1 */
    double       timeout_s;         /* a wait longer than this fails (launch.step_timeout) */
} cp_ring_config_t;

typedef struct cp_ring {
    cp_ring_config_t cfg;
    int              ranks[CP_RING_MAX];
    char             group[96];     /* "CP group of ranks 0 2" */
    pthread_mutex_t  mu;
    pthread_cond_t   cv;
    actor_item_t    *head;          /* received blocks not taken yet (actor_msg_t, FIFO) */
    uint32_t         held;
    uint32_t         in_flight;     /* handed over, not yet written out */
    bt_status_t      failed;        /* BT_OK, or why every wait fails from now on */
    char             why[200];
    /* the op the compute thread runs (set by it before each op) */
    int64_t          step;
    int32_t          mb;
    uint32_t         chunk;
    /* counters (compute thread) */
    uint64_t         sent, received;
    /* BATON_TEST_CP_KILL=RANK:STEP:LAYER: that rank kills itself before
     * sending its first forward K block of that layer in that step */
    int              kill_rank, kill_layer;
    int64_t          kill_step;
} cp_ring_t;

extern const model_cp_msg_ops_t cp_ring_ops;

bt_status_t cp_ring_init(cp_ring_t *r, const cp_ring_config_t *cfg);
/* Frees the blocks still kept. */
void        cp_ring_fini(cp_ring_t *r);
/* Compute thread, before an op: the tag's step (STAGE_EVAL_STEP for an
 * evaluation), microbatch and model chunk. */
void        cp_ring_context(cp_ring_t *r, int64_t step, int32_t mb, uint32_t chunk);
/* Stage loop: send the block of a CP_RING_JOB_SEND completion. */
void        cp_ring_send(cp_ring_t *r, actor_msg_t *m);
/* Stage loop: a CP_BLOCK arrived. ACTOR_KEPT when it went into the mailbox. */
actor_ret_t cp_ring_on_block(cp_ring_t *r, actor_msg_t *m);
/* Any thread: every wait from now on fails with status, saying why. The
 * first failure wins. */
void        cp_ring_fail(cp_ring_t *r, bt_status_t status, const char *why);
/* Whether rank is a neighbour of this one in the ring. */
bool        cp_ring_is_peer(const cp_ring_t *r, int rank);

#endif
