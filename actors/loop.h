/* One libev loop per thread.
 *
 * An actor_loop_t owns an ev_loop, the thread that runs it, an ev_async and
 * a locked MPSC inbox. Other threads reach a loop only by posting an item to
 * it (actor_loop_post); the loop thread runs posted items in the order each
 * poster posted them. The loop thread itself may also post: its items go to a
 * local queue drained before the loop next blocks (no syscall, no lock).
 *
 * Busy polling: a transport whose completions arrive faster than an epoll
 * wake-up (UCX shared memory) registers a poller. While busy polling is armed
 * (actor_loop_busy_arm, done by the router on every send and receive) the loop
 * spins on its pollers instead of sleeping in epoll, for at most busy_us
 * microseconds after the last event; then it falls back to epoll.
 *
 * Lifecycle: create -> start (own thread) or run (caller's thread) ->
 * stop (any thread) -> join -> destroy. stop lets the loop finish the items
 * posted before it, then the loop exits; items posted after stop are
 * released without running (their cancel hook runs). */
#ifndef BT_ACTORS_LOOP_H
#define BT_ACTORS_LOOP_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

struct ev_loop;

/* An intrusive queue item. run() executes it on the loop thread; cancel()
 * (optional) releases it when the loop was stopped before it could run. Both
 * are responsible for freeing the item if it is heap-allocated. */
typedef struct actor_item {
    struct actor_item *next;
    void (*run)(struct actor_item *it);
    void (*cancel)(struct actor_item *it);
} actor_item_t;

typedef struct actor_loop actor_loop_t;

typedef void (*actor_loop_fn)(void *arg);
/* A busy-poll hook: make progress without waiting, return events handled. */
typedef int (*actor_loop_poll_fn)(void *arg);

bt_status_t actor_loop_create(const char *name, actor_loop_t **out);
/* Spawn the loop's own thread. */
bt_status_t actor_loop_start(actor_loop_t *l);
/* Run the loop on the calling thread until actor_loop_stop. */
void        actor_loop_run(actor_loop_t *l);
/* Ask the loop to exit after the items already posted (any thread). */
void        actor_loop_stop(actor_loop_t *l);
/* Wait for the loop's own thread (no-op for a loop run by actor_loop_run). */
void        actor_loop_join(actor_loop_t *l);
/* Free the loop; cancels items still queued. The loop must not be running. */
void        actor_loop_destroy(actor_loop_t *l);

/* Post an item from any thread. Order is preserved per posting thread.
 * Returns BT_ERR_CANCELED (after calling it->cancel) when the loop stopped. */
bt_status_t actor_loop_post(actor_loop_t *l, actor_item_t *it);
/* Post fn(arg) (allocates a small item). */
bt_status_t actor_loop_post_fn(actor_loop_t *l, actor_loop_fn fn, void *arg);
/* Post fn(arg) and wait until it ran. Must not be called on l's own thread. */
bt_status_t actor_loop_call(actor_loop_t *l, actor_loop_fn fn, void *arg);

struct ev_loop *actor_loop_ev(actor_loop_t *l);
const char     *actor_loop_name(const actor_loop_t *l);
/* The loop whose thread is the calling thread (NULL on other threads). */
actor_loop_t   *actor_loop_current(void);
static inline bool actor_loop_is_current(actor_loop_t *l) { return actor_loop_current() == l; }

/* Busy polling (loop thread only). busy_us = 0 disables it (the default). */
void actor_loop_busy_config(actor_loop_t *l, uint32_t busy_us);
void actor_loop_poller_add(actor_loop_t *l, actor_loop_poll_fn fn, void *arg);
void actor_loop_poller_remove(actor_loop_t *l, actor_loop_poll_fn fn, void *arg);
/* Something happened: keep spinning for busy_us more. Cheap; loop thread only. */
void actor_loop_busy_arm(actor_loop_t *l);
/* The loop's next poll will not block: it is spinning on its pollers. Meant
 * for ev_prepare callbacks (a transport need not arm for readiness then);
 * loop thread only. */
bool actor_loop_spinning(const actor_loop_t *l);

/* Counters for tests and benchmarks. */
typedef struct {
    uint64_t posted;    /* items run from the cross-thread inbox */
    uint64_t local;     /* items run from the local queue */
    uint64_t wakeups;   /* ev_async callbacks */
    uint64_t spins;     /* busy-poll rounds */
} actor_loop_stats_t;
void actor_loop_stats(const actor_loop_t *l, actor_loop_stats_t *out);

#endif
