#include "actors/credit.h"

#include <stdlib.h>

#include "base/log.h"

void actor_credit_tx_init(actor_credit_tx_t *tx, bool enabled)
{
    *tx = (actor_credit_tx_t){.enabled = enabled};
    pthread_mutex_init(&tx->mu, NULL);
    tx->tail = &tx->head;
}

void actor_credit_tx_fini(actor_credit_tx_t *tx)
{
    actor_msg_t *m = actor_credit_tx_drain(tx);
    while (m) {
        actor_msg_t *next = (actor_msg_t *)m->item.next;
        actor_msg_free(m);
        m = next;
    }
    free(tx->waiters);
    tx->waiters = NULL;
    pthread_mutex_destroy(&tx->mu);
}

static void credit_waiter_add(actor_credit_tx_t *tx, actor_t *a)
{
    if (!a) return;
    for (uint32_t i = 0; i < tx->nwaiters; i++)
        if (tx->waiters[i] == a) return;
    if (tx->nwaiters == tx->capwaiters) {
        uint32_t cap = tx->capwaiters ? 2 * tx->capwaiters : 4;
        actor_t **w = realloc(tx->waiters, cap * sizeof *w);
        if (!w) BT_PANIC("out of memory growing a credit waiter list");
        tx->waiters = w;
        tx->capwaiters = cap;
    }
    tx->waiters[tx->nwaiters++] = a;
}

bool actor_credit_tx_take(actor_credit_tx_t *tx, actor_t *sender, actor_msg_t *m)
{
    if (!tx->enabled) return true;
    pthread_mutex_lock(&tx->mu);
    /* Held messages go first: a new one may not overtake them. */
    if (tx->avail > 0 && !tx->head) {
        tx->avail--;
        pthread_mutex_unlock(&tx->mu);
        return true;
    }
    m->item.next = NULL;
    *tx->tail = &m->item;
    tx->tail = &m->item.next;
    tx->npending++;
    tx->held_total++;
    credit_waiter_add(tx, sender);
    pthread_mutex_unlock(&tx->mu);
    return false;
}

actor_msg_t *actor_credit_tx_grant(actor_credit_tx_t *tx, uint32_t n, actor_t ***waiters,
                                   uint32_t *nwaiters)
{
    *waiters = NULL;
    *nwaiters = 0;
    pthread_mutex_lock(&tx->mu);
    tx->avail += n;
    actor_item_t *out = NULL; /* not an actor_msg_t*: the tail pointer writes it as an item */
    actor_item_t **out_tail = &out;
    while (tx->avail > 0 && tx->head) {
        actor_item_t *it = tx->head;
        tx->head = it->next;
        if (!tx->head) tx->tail = &tx->head;
        it->next = NULL;
        *out_tail = it;
        out_tail = &it->next;
        tx->avail--;
        tx->npending--;
    }
    if (!tx->head && tx->nwaiters) {
        *waiters = tx->waiters;
        *nwaiters = tx->nwaiters;
        tx->waiters = NULL;
        tx->nwaiters = tx->capwaiters = 0;
    }
    pthread_mutex_unlock(&tx->mu);
    return (actor_msg_t *)out;
}

actor_msg_t *actor_credit_tx_drain(actor_credit_tx_t *tx)
{
    pthread_mutex_lock(&tx->mu);
    actor_msg_t *out = (actor_msg_t *)tx->head;
    tx->head = NULL;
    tx->tail = &tx->head;
    tx->npending = 0;
    tx->nwaiters = 0;
    pthread_mutex_unlock(&tx->mu);
    return out;
}

void actor_credit_rx_init(actor_credit_rx_t *rx, uint32_t window)
{
    *rx = (actor_credit_rx_t){.window = window};
}

uint32_t actor_credit_rx_release(actor_credit_rx_t *rx)
{
    if (rx->window == 0) return 0;
    uint32_t batch = rx->window / 4 ? rx->window / 4 : 1;
    if (++rx->owed < batch) return 0;
    uint32_t n = rx->owed;
    rx->owed = 0;
    return n;
}
