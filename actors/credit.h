/* Credit-based flow control for one edge (one pair of ranks).
 *
 * The receiver grants the sender `window` message buffers (an MSG_CREDIT
 * frame). The sender spends one credit per data message; with none left it
 * holds messages locally, in order, and remembers which actors it held
 * (they are told when credit returns, so they stop producing meanwhile).
 * The receiver counts buffers its actors released and returns them in
 * batches of a quarter window, so memory on both sides stays bounded by
 * window * message size whatever the speed difference.
 *
 * Why batches cannot deadlock: at most batch-1 released credits sit unreturned,
 * and batch <= window, so the sender always gets credit back once the
 * receiver's actors release what they got.
 *
 * Sender side: any thread (locked). Receiver side: the I/O loop only.
 */
#ifndef BT_ACTORS_CREDIT_H
#define BT_ACTORS_CREDIT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "actors/actor.h"

typedef struct {
    pthread_mutex_t mu;
    bool            enabled;  /* false: every message goes at once */
    uint32_t        avail;    /* credits held */
    actor_item_t   *head, **tail; /* held messages (actor_msg_t), FIFO */
    uint32_t        npending;
    actor_t       **waiters;  /* actors held since credit ran out (no duplicates) */
    uint32_t        nwaiters, capwaiters;
    uint64_t        held_total;
} actor_credit_tx_t;

void actor_credit_tx_init(actor_credit_tx_t *tx, bool enabled);
/* Frees held messages and the waiter list. */
void actor_credit_tx_fini(actor_credit_tx_t *tx);
/* true: m may be sent now (a credit was spent). false: m is held and
 * `sender` (may be NULL) is noted as a waiter. */
bool actor_credit_tx_take(actor_credit_tx_t *tx, actor_t *sender, actor_msg_t *m);
/* n credits arrived. Returns the held messages that may go now (a chain
 * linked through item.next, in order). When no message stays held, the
 * waiters are handed to the caller (*waiters, *nwaiters; free() the array). */
actor_msg_t *actor_credit_tx_grant(actor_credit_tx_t *tx, uint32_t n, actor_t ***waiters,
                                   uint32_t *nwaiters);
/* Remove every held message (chain) and forget the waiters: the edge failed. */
actor_msg_t *actor_credit_tx_drain(actor_credit_tx_t *tx);

typedef struct {
    uint32_t window; /* granted at connect; 0 = flow control off */
    uint32_t owed;   /* released buffers not yet returned */
} actor_credit_rx_t;

void     actor_credit_rx_init(actor_credit_rx_t *rx, uint32_t window);
/* One received buffer was released. Returns how many credits to send back
 * now (0: keep batching). */
uint32_t actor_credit_rx_release(actor_credit_rx_t *rx);

#endif
