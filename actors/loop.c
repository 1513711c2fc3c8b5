#include "actors/loop.h"

#include <assert.h>
#include <ev.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"

#define LOOP_MAX_POLLERS 8
/* How long one busy-poll round spins before handing control back to libev
 * (so that timers, fds and the inbox get their turn). */
#define LOOP_SPIN_ROUND_NS 50000ull
/* Empty polls between two clock reads, and between two sched_yield() calls
 * (a multiple of the former), while spinning. */
#define LOOP_SPIN_CLOCK_EVERY 16u
#define LOOP_SPIN_YIELD_EVERY 64u
/* ... but only once the loop has been idle this long: a sched_yield is a
 * pass through the scheduler even when nothing else is runnable (~1 us on
 * our VM, perf: __schedule + do_sched_yield were ~35% of an inproc
 * ping-pong), so a loop whose peer answers within microseconds must not pay
 * it, while one whose peer waits for this core still gives it up soon. */
#define LOOP_SPIN_YIELD_AFTER_NS 20000ull
_Static_assert(LOOP_SPIN_YIELD_EVERY % LOOP_SPIN_CLOCK_EVERY == 0, "yield on a clock read");

typedef struct {
    actor_loop_poll_fn fn;
    void              *arg;
} loop_poller_t;

struct actor_loop {
    char            name[32];
    struct ev_loop *ev;
    ev_async        wake;    /* other threads posted to the inbox */
    ev_prepare      drain;   /* runs the local queue before the loop blocks */
    ev_idle         spin;    /* keeps the loop from blocking: busy poll or backlog */

    pthread_t       thread;
    bool            has_thread;

    /* cross-thread inbox, guarded by mu */
    pthread_mutex_t mu;
    actor_item_t   *in_head, **in_tail;
    bool            closed;     /* stop ran: new posts are canceled */

    /* loop-thread-only state */
    actor_item_t   *lq_head, **lq_tail;
    bool            stopping;
    uint32_t        busy_us;
    uint64_t        busy_until_ns;
    bool            spinning;   /* inside loop_spin_cb's poll loop */
    bool            armed;      /* busy_arm ran while spinning: refresh busy_until_ns */
    loop_poller_t   pollers[LOOP_MAX_POLLERS];
    int             npollers;

    _Atomic uint64_t n_posted, n_local, n_wakeups, n_spins;
};

static _Thread_local actor_loop_t *tls_loop;

/* A counter written by one thread only (read by others for stats): a
 * relaxed load and store, without the locked read-modify-write. */
static inline void loop_count(_Atomic uint64_t *c, uint64_t n)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n, memory_order_relaxed);
}

actor_loop_t *actor_loop_current(void) { return tls_loop; }
struct ev_loop *actor_loop_ev(actor_loop_t *l) { return l->ev; }
const char *actor_loop_name(const actor_loop_t *l) { return l->name; }

static void loop_items_cancel(actor_item_t *it)
{
    while (it) {
        actor_item_t *next = it->next;
        it->next = NULL;
        if (it->cancel) it->cancel(it);
        it = next;
    }
}

/* Run a chain of items; returns how many ran. */
static uint64_t loop_items_run(actor_item_t *it)
{
    uint64_t n = 0;
    while (it) {
        actor_item_t *next = it->next;
        it->next = NULL;
        it->run(it);
        it = next;
        n++;
    }
    return n;
}

static actor_item_t *loop_inbox_take(actor_loop_t *l)
{
    pthread_mutex_lock(&l->mu);
    actor_item_t *head = l->in_head;
    __atomic_store_n(&l->in_head, NULL, __ATOMIC_RELAXED);
    l->in_tail = &l->in_head;
    pthread_mutex_unlock(&l->mu);
    return head;
}

static actor_item_t *loop_local_take(actor_loop_t *l)
{
    actor_item_t *head = l->lq_head;
    l->lq_head = NULL;
    l->lq_tail = &l->lq_head;
    return head;
}

/* Local items posted while a batch runs go to the next batch, so a pair of
 * actors ping-ponging on one loop cannot starve fds and timers: the idle
 * watcher keeps the loop from blocking while a backlog remains. */
static void loop_local_drain(actor_loop_t *l)
{
    actor_item_t *batch = loop_local_take(l);
    if (batch) loop_count(&l->n_local, loop_items_run(batch));
    if (l->lq_head && !ev_is_active(&l->spin)) ev_idle_start(l->ev, &l->spin);
}

static void loop_finish_if_stopping(actor_loop_t *l)
{
    if (!l->stopping) return;
    /* Drain everything that reached us before the inbox closed, including
     * local items those produce, then leave ev_run. */
    for (;;) {
        actor_item_t *a = loop_inbox_take(l);
        actor_item_t *b = loop_local_take(l);
        if (!a && !b) break;
        loop_items_run(a);
        loop_items_run(b);
    }
    ev_break(l->ev, EVBREAK_ALL);
}

static void loop_wake_cb(struct ev_loop *ev, ev_async *w, int revents)
{
    (void)ev; (void)revents;
    actor_loop_t *l = w->data;
    loop_count(&l->n_wakeups, 1);
    actor_item_t *batch = loop_inbox_take(l);
    loop_count(&l->n_posted, loop_items_run(batch));
    loop_finish_if_stopping(l);
}

/* The prepare watcher is active only while the local queue may hold items
 * (actor_loop_post starts it): an idle loop then pays no prepare round per
 * iteration. */
static void loop_drain_cb(struct ev_loop *ev, ev_prepare *w, int revents)
{
    (void)revents;
    actor_loop_t *l = w->data;
    loop_local_drain(l);
    loop_finish_if_stopping(l);
    if (!l->lq_head && !l->stopping) ev_prepare_stop(ev, w);
}

static void loop_spin_cb(struct ev_loop *ev, ev_idle *w, int revents)
{
    (void)revents;
    actor_loop_t *l = w->data;
    if (l->npollers > 0 && l->busy_us > 0) {
        uint64_t now = clock_now_ns();
        uint64_t round_end = now + LOOP_SPIN_ROUND_NS;
        /* Events handled here (the pollers run the receive callbacks and the
         * handlers inline) cost no epoll round; control goes back to libev
         * once per round so that timers and other fds get their turn. The
         * clock is read after an event and every LOOP_SPIN_CLOCK_EVERY empty
         * polls only: on a VM a clock read costs more than an empty poll. */
        unsigned idle = 0;
        uint64_t idle_since = now;
        while (now < l->busy_until_ns) {
            int got = 0;
            /* busy_arm called from the pollers' callbacks only flags the
             * loop: the window is refreshed below with one clock read per
             * poll round instead of one per receive and per send (it starts
             * a little later, so it is never shorter). */
            l->spinning = true;
            for (int i = 0; i < l->npollers; i++) got += l->pollers[i].fn(l->pollers[i].arg);
            loop_count(&l->n_spins, 1);
            if (l->lq_head) loop_local_drain(l);
            l->spinning = false;
            if (got > 0 || l->armed) {
                l->armed = false;
                now = clock_now_ns();
                l->busy_until_ns = now + (uint64_t)l->busy_us * 1000u;
                idle = 0;
                idle_since = now;
            } else if (++idle % LOOP_SPIN_CLOCK_EVERY == 0) {
                now = clock_now_ns();
                /* With more runnable threads than cores the peer we wait
                 * for may need this core; on an idle core this returns at
                 * once. */
                if (idle % LOOP_SPIN_YIELD_EVERY == 0 && now - idle_since >= LOOP_SPIN_YIELD_AFTER_NS)
                    sched_yield();
            }
            if (now >= round_end || l->stopping) return;
            /* A post from another thread would otherwise wait for epoll. */
            if (__atomic_load_n(&l->in_head, __ATOMIC_RELAXED))
                return;
        }
    }
    if (!l->lq_head && clock_now_ns() >= l->busy_until_ns) ev_idle_stop(ev, w);
}

bt_status_t actor_loop_create(const char *name, actor_loop_t **out)
{
    actor_loop_t *l = calloc(1, sizeof *l);
    if (!l) return BT_ERR_NOMEM;
    snprintf(l->name, sizeof l->name, "%s", name ? name : "loop");
    l->ev = ev_loop_new(EVFLAG_AUTO | EVFLAG_NOSIGMASK);
    if (!l->ev) {
        log_error("loop %s: ev_loop_new failed", l->name);
        free(l);
        return BT_ERR_IO;
    }
    pthread_mutex_init(&l->mu, NULL);
    l->in_tail = &l->in_head;
    l->lq_tail = &l->lq_head;

    ev_async_init(&l->wake, loop_wake_cb);
    l->wake.data = l;
    ev_async_start(l->ev, &l->wake);
    ev_prepare_init(&l->drain, loop_drain_cb);
    l->drain.data = l;
    ev_idle_init(&l->spin, loop_spin_cb);
    l->spin.data = l;
    *out = l;
    return BT_OK;
}

void actor_loop_run(actor_loop_t *l)
{
    actor_loop_t *prev = tls_loop;
    tls_loop = l;
    ev_run(l->ev, 0);
    tls_loop = prev;
}

static void *loop_thread_main(void *arg)
{
    actor_loop_run(arg);
    return NULL;
}

bt_status_t actor_loop_start(actor_loop_t *l)
{
    assert(!l->has_thread);
    int rc = pthread_create(&l->thread, NULL, loop_thread_main, l);
    if (rc != 0) {
        log_error("loop %s: pthread_create: %s", l->name, strerror(rc));
        return BT_ERR_IO;
    }
    l->has_thread = true;
    return BT_OK;
}

static void loop_stop_run(actor_item_t *it)
{
    actor_loop_t *l = tls_loop;
    free(it);
    pthread_mutex_lock(&l->mu);
    l->closed = true;
    pthread_mutex_unlock(&l->mu);
    l->stopping = true;
    /* drained and broken out of by loop_finish_if_stopping */
}

void actor_loop_stop(actor_loop_t *l)
{
    actor_item_t *it = calloc(1, sizeof *it);
    if (!it) BT_PANIC("out of memory stopping loop %s", l->name);
    it->run = loop_stop_run;
    it->cancel = (void (*)(actor_item_t *))free;
    actor_loop_post(l, it);
}

void actor_loop_join(actor_loop_t *l)
{
    if (!l->has_thread) return;
    pthread_join(l->thread, NULL);
    l->has_thread = false;
}

void actor_loop_destroy(actor_loop_t *l)
{
    if (!l) return;
    assert(!l->has_thread);
    pthread_mutex_lock(&l->mu);
    l->closed = true;
    actor_item_t *in = l->in_head;
    l->in_head = NULL;
    l->in_tail = &l->in_head;
    pthread_mutex_unlock(&l->mu);
    loop_items_cancel(in);
    loop_items_cancel(loop_local_take(l));
    ev_async_stop(l->ev, &l->wake);
    ev_prepare_stop(l->ev, &l->drain);
    ev_idle_stop(l->ev, &l->spin);
    ev_loop_destroy(l->ev);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

bt_status_t actor_loop_post(actor_loop_t *l, actor_item_t *it)
{
    it->next = NULL;
    if (tls_loop == l && !l->stopping) {
        *l->lq_tail = it;
        l->lq_tail = &it->next;
        if (!ev_is_active(&l->drain)) ev_prepare_start(l->ev, &l->drain);
        return BT_OK;
    }
    pthread_mutex_lock(&l->mu);
    if (l->closed) {
        pthread_mutex_unlock(&l->mu);
        if (it->cancel) it->cancel(it);
        return BT_ERR_CANCELED;
    }
    bool was_empty = l->in_head == NULL;
    if (was_empty) __atomic_store_n(&l->in_head, it, __ATOMIC_RELAXED);
    else *l->in_tail = it;
    l->in_tail = &it->next;
    pthread_mutex_unlock(&l->mu);
    /* One wake-up per burst: the loop takes the whole inbox at once. */
    if (was_empty || tls_loop == l) ev_async_send(l->ev, &l->wake);
    return BT_OK;
}

typedef struct {
    actor_item_t  item;
    actor_loop_fn fn;
    void         *arg;
} loop_fn_item_t;

static void loop_fn_run(actor_item_t *it)
{
    loop_fn_item_t *f = (loop_fn_item_t *)it;
    actor_loop_fn fn = f->fn;
    void *arg = f->arg;
    free(f);
    fn(arg);
}

bt_status_t actor_loop_post_fn(actor_loop_t *l, actor_loop_fn fn, void *arg)
{
    loop_fn_item_t *f = calloc(1, sizeof *f);
    if (!f) return BT_ERR_NOMEM;
    f->item.run = loop_fn_run;
    f->item.cancel = (void (*)(actor_item_t *))free;
    f->fn = fn;
    f->arg = arg;
    return actor_loop_post(l, &f->item);
}

typedef struct {
    actor_item_t    item;
    actor_loop_fn   fn;
    void           *arg;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    bool            done, canceled;
} loop_call_t;

static void loop_call_finish(loop_call_t *c, bool canceled)
{
    pthread_mutex_lock(&c->mu);
    c->done = true;
    c->canceled = canceled;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void loop_call_run(actor_item_t *it)
{
    loop_call_t *c = (loop_call_t *)it;
    c->fn(c->arg);
    loop_call_finish(c, false);
}

static void loop_call_cancel(actor_item_t *it) { loop_call_finish((loop_call_t *)it, true); }

bt_status_t actor_loop_call(actor_loop_t *l, actor_loop_fn fn, void *arg)
{
    assert(tls_loop != l);
    loop_call_t c = {.item = {.run = loop_call_run, .cancel = loop_call_cancel}, .fn = fn, .arg = arg};
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    actor_loop_post(l, &c.item);
    pthread_mutex_lock(&c.mu);
    while (!c.done) pthread_cond_wait(&c.cv, &c.mu);
    pthread_mutex_unlock(&c.mu);
    pthread_cond_destroy(&c.cv);
    pthread_mutex_destroy(&c.mu);
    return c.canceled ? BT_ERR_CANCELED : BT_OK;
}

void actor_loop_busy_config(actor_loop_t *l, uint32_t busy_us) { l->busy_us = busy_us; }

void actor_loop_poller_add(actor_loop_t *l, actor_loop_poll_fn fn, void *arg)
{
    if (l->npollers == LOOP_MAX_POLLERS) BT_PANIC("loop %s: more than %d pollers", l->name, LOOP_MAX_POLLERS);
    l->pollers[l->npollers++] = (loop_poller_t){fn, arg};
}

void actor_loop_poller_remove(actor_loop_t *l, actor_loop_poll_fn fn, void *arg)
{
    for (int i = 0; i < l->npollers; i++) {
        if (l->pollers[i].fn == fn && l->pollers[i].arg == arg) {
            l->pollers[i] = l->pollers[--l->npollers];
            return;
        }
    }
}

void actor_loop_busy_arm(actor_loop_t *l)
{
    if (l->busy_us == 0 || l->npollers == 0) return;
    if (l->spinning) { /* loop_spin_cb refreshes the window after this round */
        l->armed = true;
        return;
    }
    l->busy_until_ns = clock_now_ns() + (uint64_t)l->busy_us * 1000u;
    if (!ev_is_active(&l->spin)) ev_idle_start(l->ev, &l->spin);
}

/* The spin is an idle watcher: while it is active libev polls with a zero
 * timeout. (Queued local work is not enough: the loop's own prepare may
 * drain it before the poll.) */
bool actor_loop_spinning(const actor_loop_t *l) { return ev_is_active(&l->spin); }

void actor_loop_stats(const actor_loop_t *l, actor_loop_stats_t *out)
{
    out->posted = atomic_load(&l->n_posted);
    out->local = atomic_load(&l->n_local);
    out->wakeups = atomic_load(&l->n_wakeups);
    out->spins = atomic_load(&l->n_spins);
}
