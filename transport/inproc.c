/* In-process transport: xports of one process, on the same or different
 * loops/threads, reached by name ("inproc:<name>") through a process-global
 * registry.
 *
 * Each xport owns a box: a locked queue of items plus an ev_async on the
 * xport's loop. Everything another thread wants from this xport (accept a
 * connection, deliver a frame, report a release, report a close) is an item
 * posted to its box; the loop thread drains the box and acts. So an endpoint
 * is only ever touched by its own loop thread.
 *
 * A connection is a link shared by its two endpoints (side 0: connector,
 * side 1: listener). Frames are zero-copy when the sender gave one iovec: the
 * receiver's rx points into the sender's buffer and the sender's done()
 * fires when the receiver releases the rx (a RELEASED item travels back).
 * With several iovecs the receiver gathers them into a cbs.alloc buffer and
 * the sender completes at once.
 *
 * shut[s] (under box[s]'s lock) says side s takes no more frames: a send to a
 * shut side fails at once, and the side shutting returns the frames still
 * queued for it, so the sender sees pending sends complete with an error
 * before the CLOSED item that follows them.
 *
 * No handshake (no bytes leave the process) but the job id must match.
 */
#include "transport/xport.h"

#include "base/freelist.h"
#include "base/log.h"

#include <ev.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define INPROC_PREFIX "inproc:"
#define INPROC_DEFAULT_MAX_FRAME (1ull << 30)

typedef struct inproc_xport inproc_xport_t;
typedef struct inproc_box inproc_box_t;
typedef struct inproc_link inproc_link_t;
typedef struct inproc_ep inproc_ep_t;

typedef enum { IT_ACCEPT, IT_CONNECTED, IT_FRAME, IT_RELEASED, IT_CLOSED } inproc_item_kind_t;

typedef struct inproc_item {
    struct inproc_item *next;
    inproc_item_kind_t  kind;
    inproc_link_t      *link;    /* holds a link reference (NULL for RELEASED) */
    int                 side;    /* the link side this item is for */
    bt_status_t         status;  /* CONNECTED, RELEASED */
    uint32_t            peer_id; /* ACCEPT, CONNECTED */
    /* FRAME / RELEASED */
    xport_send_done_fn  done;
    void               *arg;
    inproc_box_t       *reply;   /* sender's box, for the RELEASED item (ref held) */
    xport_rx_t          rx;
    inproc_xport_t     *rx_x;    /* receiver, for cbs.free of a gathered payload */
    bool                gathered;
    bool                small;   /* INPROC_ITEM_SMALL bytes: reusable */
    int                 iovcnt;
    struct iovec       *iov;     /* points into the tail of this allocation */
    size_t              payload_len;
    size_t              hdr_len;
    uint8_t             hdr[];   /* copy of the header, then the iovec array */
} inproc_item_t;

struct inproc_box {
    pthread_mutex_t  mu;
    atomic_int       refs;
    inproc_xport_t  *x;          /* NULL once the xport is destroyed */
    inproc_item_t   *head, *tail;  /* under mu; head is also read without it
                                  * (inproc_drain), so every store to it is atomic */
    char             name[XPORT_ADDR_MAX];
    char            *job_id;
    uint32_t         self_id;
    inproc_box_t    *reg_next;   /* registry list (under the registry lock) */
    bool             registered;
};

struct inproc_link {
    atomic_int    refs;
    inproc_box_t *box[2];        /* references held */
    inproc_ep_t  *ep[2];         /* ep[s] used only by side s's thread */
    bool          shut[2];       /* under box[s]->mu */
};

struct inproc_ep {
    xport_ep_t      base;        /* first */
    inproc_xport_t *x;
    inproc_link_t  *link;
    int             side;
    int             refs;
    bool            dead;
    bool            open;        /* accept/connected reported */
    inproc_ep_t    *prev, *next;
};

struct inproc_xport {
    xport_t         base;        /* first */
    xport_config_t  cfg;
    char           *job_id;
    inproc_box_t   *box;
    ev_async        async;
    inproc_ep_t    *eps;
    inproc_item_t  *batch;       /* items being processed (close scans them too) */
    unsigned        events;
};

static pthread_mutex_t inproc_registry_mu = PTHREAD_MUTEX_INITIALIZER;
static inproc_box_t   *inproc_registry;
static atomic_uint     inproc_name_seq;

/* ---- boxes and links -------------------------------------------------- */

/* Box references are counted without the box lock: every frame takes and
 * drops one (its reply box), and the lock was taken twice per frame for it. */
static void inproc_box_ref(inproc_box_t *b) { atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed); }

static void inproc_box_unref(inproc_box_t *b)
{
    if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1) return;
    pthread_mutex_destroy(&b->mu);
    free(b->job_id);
    free(b);
}

static void inproc_link_ref(inproc_link_t *l) { atomic_fetch_add(&l->refs, 1); }

static void inproc_link_unref(inproc_link_t *l)
{
    if (atomic_fetch_sub(&l->refs, 1) != 1) return;
    inproc_box_unref(l->box[0]);
    inproc_box_unref(l->box[1]);
    free(l);
}

/* Items of up to INPROC_ITEM_SMALL bytes (every control item, and a frame
 * whose header and iovec fit) are kept per thread for reuse: a frame item
 * goes back to the sender's thread as its RELEASED item and is freed there,
 * so in a ping-pong each thread reuses its own items and a frame costs no
 * malloc/free pair. Bounded, and released when its thread exits. */
#define INPROC_ITEM_SMALL     512u
#define INPROC_ITEM_CACHE_MAX 64u

static _Thread_local base_freelist_t inproc_item_cache = {.max = INPROC_ITEM_CACHE_MAX};

/* Raw storage for an item of `size` bytes (contents undefined). */
static inproc_item_t *inproc_item_alloc(size_t size)
{
    inproc_item_t *it = size <= INPROC_ITEM_SMALL ? base_freelist_pop(&inproc_item_cache) : NULL;
    return it ? it : malloc(size <= INPROC_ITEM_SMALL ? INPROC_ITEM_SMALL : size);
}

/* Storage back (an item whose references were dropped). */
static void inproc_item_release(inproc_item_t *it)
{
    base_freelist_free_at_exit(&inproc_item_cache);
    if (!it->small || !base_freelist_push(&inproc_item_cache, it)) free(it);
}

static void inproc_item_free(inproc_item_t *it)
{
    if (it->link) inproc_link_unref(it->link);
    if (it->reply) inproc_box_unref(it->reply);
    inproc_item_release(it);
}

/* Append to a box and wake its loop. False when the box's xport is gone (the
 * item is not consumed) or, for a frame, when the receiving side is shut. */
static bool inproc_box_post(inproc_box_t *b, inproc_item_t *it, int frame_side)
{
    pthread_mutex_lock(&b->mu);
    if (!b->x || (frame_side >= 0 && it->link->shut[frame_side])) {
        pthread_mutex_unlock(&b->mu);
        return false;
    }
    it->next = NULL;
    /* One wake-up per burst: a box that is not empty was signalled by the
     * post that filled it, and its drain (which takes the whole list under
     * this lock) has not run yet. */
    bool was_empty = !b->head;
    if (b->tail) b->tail->next = it;
    else __atomic_store_n(&b->head, it, __ATOMIC_RELEASE); /* see inproc_drain */
    b->tail = it;
    if (was_empty) ev_async_send(b->x->cfg.loop, &b->x->async);
    pthread_mutex_unlock(&b->mu);
    return true;
}

static inproc_item_t *inproc_item_new(inproc_item_kind_t kind, inproc_link_t *link, size_t extra)
{
    inproc_item_t *it = inproc_item_alloc(sizeof *it + extra);
    if (!it) return NULL;
    memset(it, 0, sizeof *it); /* the tail (header, iovec) is written by the sender */
    it->small = sizeof *it + extra <= INPROC_ITEM_SMALL;
    it->kind = kind;
    if (link) {
        inproc_link_ref(link);
        it->link = link;
    }
    return it;
}

/* A frame is done with (released, refused or returned): send the sender
 * its completion. The item itself travels back as the RELEASED item. */
static void inproc_frame_complete(inproc_item_t *it, bt_status_t status)
{
    if (!it->reply) { /* already completed (gathered frame) */
        inproc_item_free(it);
        return;
    }
    if (it->link) {
        inproc_link_unref(it->link);
        it->link = NULL;
    }
    it->kind = IT_RELEASED;
    it->status = status;
    inproc_box_t *reply = it->reply;
    it->reply = NULL;
    if (!inproc_box_post(reply, it, -1)) inproc_item_release(it); /* the sender is gone */
    inproc_box_unref(reply);
}

/* ---- endpoints -------------------------------------------------------- */

static void inproc_ep_hold(inproc_ep_t *ep) { ep->refs++; }

static void inproc_ep_unref(inproc_ep_t *ep)
{
    if (--ep->refs > 0) return;
    free(ep);
}

static void inproc_ep_unlink(inproc_ep_t *ep)
{
    inproc_xport_t *x = ep->x;
    if (ep->prev) ep->prev->next = ep->next;
    else if (x->eps == ep) x->eps = ep->next;
    if (ep->next) ep->next->prev = ep->prev;
    ep->prev = ep->next = NULL;
}

static void inproc_ep_link_in(inproc_ep_t *ep)
{
    inproc_xport_t *x = ep->x;
    ep->next = x->eps;
    if (x->eps) x->eps->prev = ep;
    x->eps = ep;
}

static bool inproc_item_is_frame_of(const inproc_item_t *it, const inproc_link_t *l, int side)
{
    return it->kind == IT_FRAME && it->link == l && it->side == side;
}

/* Move the frames of link l for `side` from the list at *head (tail pointer
 * *tailp, may be NULL) onto the list at **out. *head may be a box's head,
 * which its owner's inproc_drain reads without the lock while another
 * thread takes its frames back from it (inproc_ep_shutdown): the unlinking
 * stores are atomic for that (relaxed: the reader takes the lock before it
 * follows the pointer). */
static void inproc_frames_take(inproc_item_t **head, inproc_item_t **tailp, const inproc_link_t *l,
                               int side, inproc_item_t ***out)
{
    inproc_item_t *last = NULL;
    for (inproc_item_t **pp = head; *pp;) {
        inproc_item_t *it = *pp;
        if (inproc_item_is_frame_of(it, l, side)) {
            __atomic_store_n(pp, it->next, __ATOMIC_RELAXED);
            it->next = NULL;
            **out = it;
            *out = &it->next;
        } else {
            last = it;
            pp = &it->next;
        }
    }
    if (tailp) *tailp = last;
}

/* Shut our side of the link: refuse further frames, return the frames still
 * queued for us to the peer with `status`, take back our own frames the peer
 * has not picked up yet (they complete with BT_ERR_CANCELED, so their buffers
 * are free again), then tell the peer we are gone. Frames the peer's thread
 * already took keep going: they complete when the peer releases them. */
static void inproc_ep_shutdown(inproc_ep_t *ep, bt_status_t status)
{
    inproc_xport_t *x = ep->x;
    inproc_link_t *l = ep->link;
    int s = ep->side;
    inproc_item_t *back = NULL, **tail = &back;
    inproc_item_t *mine = NULL, **mine_tail = &mine;

    pthread_mutex_lock(&x->box->mu);
    l->shut[s] = true;
    inproc_frames_take(&x->box->head, &x->box->tail, l, s, &tail);
    pthread_mutex_unlock(&x->box->mu);
    inproc_frames_take(&x->batch, NULL, l, s, &tail);

    inproc_box_t *peer = l->box[1 - s];
    pthread_mutex_lock(&peer->mu);
    inproc_frames_take(&peer->head, &peer->tail, l, 1 - s, &mine_tail);
    pthread_mutex_unlock(&peer->mu);

    while (back) {
        inproc_item_t *it = back;
        back = it->next;
        inproc_frame_complete(it, status);
    }
    while (mine) {
        inproc_item_t *it = mine;
        mine = it->next;
        inproc_frame_complete(it, BT_ERR_CANCELED);
    }
    inproc_item_t *closed = inproc_item_new(IT_CLOSED, l, 0);
    if (closed) closed->side = 1 - s;
    if (closed && !inproc_box_post(l->box[1 - s], closed, -1)) inproc_item_free(closed);
    l->ep[s] = NULL;
}

static void inproc_ep_detach(inproc_ep_t *ep)
{
    inproc_link_t *l = ep->link;
    ep->dead = true;
    inproc_ep_unlink(ep);
    ep->link = NULL;
    inproc_link_unref(l);
}

static void inproc_close(xport_ep_t *base)
{
    inproc_ep_t *ep = (inproc_ep_t *)base;
    if (ep->dead) return;
    inproc_ep_shutdown(ep, BT_ERR_PEER_CLOSED);
    inproc_ep_detach(ep);
    inproc_ep_unref(ep);
}

/* The peer went away or broke the protocol: report once, then free. */
static void inproc_ep_fail(inproc_ep_t *ep, bt_status_t status, const char *why)
{
    if (ep->dead) return;
    inproc_xport_t *x = ep->x;
    bool was_open = ep->open;
    if (status == BT_ERR_PEER_CLOSED) log_debug("inproc: peer %s closed", ep->base.peer_addr);
    else log_error("inproc: dropping peer %s: %s [%s]", ep->base.peer_addr, why, bt_status_str(status));
    inproc_ep_hold(ep);
    inproc_ep_shutdown(ep, status);
    ep->dead = true;
    if (was_open) {
        if (x->cfg.cbs.error) x->cfg.cbs.error(x->cfg.cbs.arg, &ep->base, status);
    } else if (ep->side == 0) {
        if (x->cfg.cbs.connected) x->cfg.cbs.connected(x->cfg.cbs.arg, &ep->base, status);
    }
    inproc_ep_detach(ep);
    ep->refs--;            /* the list's reference; ours keeps ep alive */
    inproc_ep_unref(ep);
}

/* ---- receive ---------------------------------------------------------- */

static void inproc_rx_release(xport_rx_t *rx)
{
    inproc_item_t *it = rx->priv;
    if (it->gathered) {
        inproc_xport_t *x = it->rx_x;
        if (rx->payload) {
            if (x->cfg.cbs.free) x->cfg.cbs.free(x->cfg.cbs.arg, rx->payload, rx->payload_len);
            else free(rx->payload);
        }
        inproc_item_free(it);
        return;
    }
    inproc_frame_complete(it, BT_OK);
}

static void inproc_frame_deliver(inproc_xport_t *x, inproc_ep_t *ep, inproc_item_t *it)
{
    /* the sender checked its own limit; ours may be smaller */
    if (it->hdr_len > x->cfg.max_frame || it->payload_len > x->cfg.max_frame - it->hdr_len) {
        char why[128];
        snprintf(why, sizeof why, "frame of %zu+%zu bytes exceeds our limit of %zu", it->hdr_len,
                 it->payload_len, x->cfg.max_frame);
        inproc_frame_complete(it, BT_ERR_PEER_PROTO);
        inproc_ep_fail(ep, BT_ERR_PEER_PROTO, why);
        return;
    }
    it->rx = (xport_rx_t){
        .hdr = it->hdr_len ? it->hdr : NULL, .hdr_len = it->hdr_len,
        .payload = NULL, .payload_len = it->payload_len,
        .release = inproc_rx_release, .priv = it,
    };
    if (it->iovcnt == 1) {
        it->rx.payload = it->iov[0].iov_base; /* zero-copy */
    } else if (it->payload_len > 0) {
        void *p = x->cfg.cbs.alloc
            ? x->cfg.cbs.alloc(x->cfg.cbs.arg, &ep->base, it->rx.hdr, it->hdr_len, it->payload_len)
            : malloc(it->payload_len);
        if (ep->dead || !p) {
            if (p) {
                if (x->cfg.cbs.free) x->cfg.cbs.free(x->cfg.cbs.arg, p, it->payload_len);
                else free(p);
            }
            inproc_frame_complete(it, BT_ERR_PEER_PROTO);
            if (!ep->dead) inproc_ep_fail(ep, BT_ERR_PEER_PROTO, "receiver refused a payload");
            return;
        }
        size_t off = 0;
        for (int i = 0; i < it->iovcnt; i++) {
            memcpy((uint8_t *)p + off, it->iov[i].iov_base, it->iov[i].iov_len);
            off += it->iov[i].iov_len;
        }
        it->rx.payload = p;
        it->gathered = true;
        it->rx_x = x;
        /* the sender's buffers are free again: complete it now */
        inproc_item_t *rel = inproc_item_new(IT_RELEASED, NULL, 0);
        if (rel) {
            rel->done = it->done;
            rel->arg = it->arg;
            rel->status = BT_OK;
            if (!inproc_box_post(it->reply, rel, -1)) inproc_item_release(rel);
        }
        inproc_box_unref(it->reply);
        it->reply = NULL;
    }
    x->events++;
    if (x->cfg.cbs.recv) x->cfg.cbs.recv(x->cfg.cbs.arg, &ep->base, &it->rx);
    else inproc_rx_release(&it->rx);
}

static void inproc_item_handle(inproc_xport_t *x, inproc_item_t *it)
{
    inproc_ep_t *ep = it->link ? it->link->ep[it->side] : NULL;
    switch (it->kind) {
    case IT_RELEASED:
        if (it->done) it->done(it->arg, it->status);
        x->events++;
        inproc_item_free(it);
        return;
    case IT_ACCEPT:
        /* ep was built by the connecting thread; it becomes ours now */
        ep->open = true;
        inproc_ep_link_in(ep);
        {
            inproc_item_t *c = inproc_item_new(IT_CONNECTED, it->link, 0);
            if (c) {
                c->side = 0;
                c->status = BT_OK;
                c->peer_id = x->cfg.self_id;
                if (!inproc_box_post(it->link->box[0], c, -1)) inproc_item_free(c);
            }
        }
        x->events++;
        inproc_ep_hold(ep);
        if (x->cfg.cbs.accept) x->cfg.cbs.accept(x->cfg.cbs.arg, &ep->base, ep->base.peer_id);
        inproc_ep_unref(ep);
        inproc_item_free(it);
        return;
    case IT_CONNECTED:
        if (ep && !ep->dead) {
            if (it->status == BT_OK) {
                ep->open = true;
                ep->base.peer_id = it->peer_id;
                inproc_ep_hold(ep);
                if (x->cfg.cbs.connected) x->cfg.cbs.connected(x->cfg.cbs.arg, &ep->base, BT_OK);
                inproc_ep_unref(ep);
            } else {
                inproc_ep_fail(ep, it->status, it->status == BT_ERR_PEER_AUTH
                               ? "job id does not match the listener's" : "listener went away");
            }
        }
        inproc_item_free(it);
        return;
    case IT_FRAME:
        if (!ep || ep->dead) {
            inproc_frame_complete(it, BT_ERR_PEER_CLOSED);
            return;
        }
        inproc_ep_hold(ep);
        inproc_frame_deliver(x, ep, it);
        inproc_ep_unref(ep);
        return;
    case IT_CLOSED:
        if (ep && !ep->dead) inproc_ep_fail(ep, BT_ERR_PEER_CLOSED, "peer closed");
        inproc_item_free(it);
        return;
    }
}

static int inproc_drain(inproc_xport_t *x)
{
    unsigned before = x->events;
    for (;;) {
        /* A busy-polling loop calls this in a spin: an empty box is seen
         * without the lock, so the spinner does not fight the sender for it
         * (the contended mutex cost futex syscalls on both sides). */
        if (!__atomic_load_n(&x->box->head, __ATOMIC_ACQUIRE)) break;
        pthread_mutex_lock(&x->box->mu);
        inproc_item_t *list = x->box->head;
        __atomic_store_n(&x->box->head, NULL, __ATOMIC_RELAXED);
        x->box->tail = NULL;
        pthread_mutex_unlock(&x->box->mu);
        if (!list) break;
        /* nested drains (a callback calling progress) append behind us */
        if (x->batch) {
            inproc_item_t *t = x->batch;
            while (t->next) t = t->next;
            t->next = list;
        } else {
            x->batch = list;
        }
        while (x->batch) {
            inproc_item_t *it = x->batch;
            x->batch = it->next;
            it->next = NULL;
            inproc_item_handle(x, it);
        }
    }
    return (int)(x->events - before);
}

static void inproc_async_cb(struct ev_loop *loop, ev_async *w, int revents)
{
    inproc_drain(w->data);
}

/* ---- ops -------------------------------------------------------------- */

static bt_status_t inproc_create(const xport_config_t *cfg, xport_t **out)
{
    if (!cfg || !cfg->loop || !cfg->job_id) {
        log_error("inproc: create needs a loop and a job id");
        return BT_ERR_INVALID;
    }
    inproc_xport_t *x = calloc(1, sizeof *x);
    inproc_box_t *b = calloc(1, sizeof *b);
    char *job = strdup(cfg->job_id);
    char *job2 = strdup(cfg->job_id);
    if (!x || !b || !job || !job2) {
        free(x); free(b); free(job); free(job2);
        return BT_ERR_NOMEM;
    }
    /* adaptive: the critical sections are a few list operations, and a
     * spinning receiver takes the lock right after the sender posts; a
     * plain mutex then sleeps in the kernel (futex) and wakes late */
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(&b->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    atomic_init(&b->refs, 1);
    b->x = x;
    b->job_id = job2;
    b->self_id = cfg->self_id;
    x->base.ops = &xport_inproc_ops;
    x->base.caps = xport_inproc_ops.caps;
    x->cfg = *cfg;
    x->job_id = job;
    x->cfg.job_id = job;
    x->cfg.secret = NULL; /* not needed in-process */
    x->cfg.secret_len = 0;
    if (!x->cfg.max_frame) x->cfg.max_frame = INPROC_DEFAULT_MAX_FRAME;
    x->box = b;
    ev_async_init(&x->async, inproc_async_cb);
    x->async.data = x;
    ev_async_start(cfg->loop, &x->async);
    if (cfg->listen_addr) {
        const char *n = cfg->listen_addr;
        if (!strncmp(n, INPROC_PREFIX, strlen(INPROC_PREFIX))) n += strlen(INPROC_PREFIX);
        snprintf(b->name, sizeof b->name, "%s%s", INPROC_PREFIX, n);
    } else {
        snprintf(b->name, sizeof b->name, "%sx%d.%u", INPROC_PREFIX, (int)getpid(),
                 atomic_fetch_add(&inproc_name_seq, 1));
    }
    *out = &x->base;
    return BT_OK;
}

static void inproc_unregister(inproc_box_t *b)
{
    pthread_mutex_lock(&inproc_registry_mu);
    if (b->registered) {
        for (inproc_box_t **pp = &inproc_registry; *pp; pp = &(*pp)->reg_next) {
            if (*pp == b) {
                *pp = b->reg_next;
                break;
            }
        }
        b->registered = false;
    }
    pthread_mutex_unlock(&inproc_registry_mu);
}

static void inproc_destroy(xport_t *base)
{
    inproc_xport_t *x = (inproc_xport_t *)base;
    while (x->eps) inproc_close(&x->eps->base);
    inproc_unregister(x->box);
    pthread_mutex_lock(&x->box->mu);
    x->box->x = NULL;
    inproc_item_t *list = x->box->head;
    __atomic_store_n(&x->box->head, NULL, __ATOMIC_RELAXED);
    x->box->tail = NULL;
    pthread_mutex_unlock(&x->box->mu);
    while (list) {
        inproc_item_t *it = list;
        list = it->next;
        it->next = NULL;
        switch (it->kind) {
        case IT_FRAME:
            inproc_frame_complete(it, BT_ERR_PEER_CLOSED);
            break;
        case IT_RELEASED:
            if (it->done) it->done(it->arg, it->status);
            inproc_item_free(it);
            break;
        case IT_ACCEPT: {
            /* a connector raced our destroy: its listener-side ep never
             * became ours; refuse the connection */
            inproc_link_t *l = it->link;
            inproc_ep_t *sep = l->ep[1];
            l->ep[1] = NULL;
            if (sep) {
                inproc_link_unref(l);
                free(sep);
            }
            inproc_item_t *c = inproc_item_new(IT_CONNECTED, l, 0);
            if (c) {
                c->side = 0;
                c->status = BT_ERR_PEER_UNREACH;
                if (!inproc_box_post(l->box[0], c, -1)) inproc_item_free(c);
            }
            inproc_item_free(it);
            break;
        }
        default:
            inproc_item_free(it);
        }
    }
    ev_async_stop(x->cfg.loop, &x->async);
    inproc_box_unref(x->box);
    free(x->job_id);
    free(x);
}

static bt_status_t inproc_listen(xport_t *base, char *addr, size_t addr_cap)
{
    inproc_xport_t *x = (inproc_xport_t *)base;
    inproc_box_t *b = x->box;
    bt_status_t st = BT_OK;
    pthread_mutex_lock(&inproc_registry_mu);
    if (!b->registered) {
        for (inproc_box_t *o = inproc_registry; o; o = o->reg_next) {
            if (!strcmp(o->name, b->name)) {
                log_error("inproc: address %s is already taken", b->name);
                st = BT_ERR_BUSY;
                goto unlock;
            }
        }
        b->reg_next = inproc_registry;
        inproc_registry = b;
        b->registered = true;
    }
unlock:
    pthread_mutex_unlock(&inproc_registry_mu);
    if (st != BT_OK) return st;
    if ((size_t)snprintf(addr, addr_cap, "%s", b->name) >= addr_cap) return BT_ERR_INVALID;
    return BT_OK;
}

static bt_status_t inproc_connect(xport_t *base, const char *addr, xport_ep_t **out)
{
    inproc_xport_t *x = (inproc_xport_t *)base;
    if (!addr || strncmp(addr, INPROC_PREFIX, strlen(INPROC_PREFIX)) != 0) {
        log_error("inproc: bad address '%s' (expected inproc:<name>)", addr ? addr : "(null)");
        return BT_ERR_INVALID;
    }
    inproc_link_t *l = calloc(1, sizeof *l);
    inproc_ep_t *cep = calloc(1, sizeof *cep);
    inproc_ep_t *sep = calloc(1, sizeof *sep);
    inproc_item_t *acc = inproc_item_new(IT_ACCEPT, NULL, 0);
    if (!l || !cep || !sep || !acc) {
        free(l); free(cep); free(sep); free(acc);
        return BT_ERR_NOMEM;
    }
    inproc_box_t *peer = NULL;
    bool job_ok = false;
    pthread_mutex_lock(&inproc_registry_mu);
    for (inproc_box_t *o = inproc_registry; o; o = o->reg_next) {
        if (!strcmp(o->name, addr)) {
            peer = o;
            inproc_box_ref(o);
            job_ok = !strcmp(o->job_id, x->job_id);
            break;
        }
    }
    pthread_mutex_unlock(&inproc_registry_mu);
    if (!peer) {
        log_error("inproc: nobody listens on %s", addr);
        free(l); free(cep); free(sep); free(acc);
        return BT_ERR_PEER_UNREACH;
    }
    /* link refs: the two endpoints */
    atomic_init(&l->refs, 2);
    inproc_box_ref(x->box);
    l->box[0] = x->box;
    l->box[1] = peer;
    l->ep[0] = cep;
    l->ep[1] = sep;
    cep->base = (xport_ep_t){.ops = &xport_inproc_ops, .x = &x->base,
                             .peer_id = XPORT_PEER_ID_UNKNOWN};
    snprintf(cep->base.peer_addr, sizeof cep->base.peer_addr, "%s", addr);
    cep->x = x;
    cep->link = l;
    cep->side = 0;
    cep->refs = 1;
    inproc_ep_link_in(cep);
    sep->base = (xport_ep_t){.ops = &xport_inproc_ops, .peer_id = x->cfg.self_id};
    snprintf(sep->base.peer_addr, sizeof sep->base.peer_addr, "%s", x->box->name);
    sep->link = l;
    sep->side = 1;
    sep->refs = 1;

    bool posted = false;
    if (job_ok) {
        pthread_mutex_lock(&peer->mu);
        if (peer->x) {
            sep->x = peer->x;
            sep->base.x = &peer->x->base;
            acc->kind = IT_ACCEPT;
            acc->side = 1;
            inproc_link_ref(l);
            acc->link = l;
            acc->next = NULL;
            if (peer->tail) peer->tail->next = acc;
            else __atomic_store_n(&peer->head, acc, __ATOMIC_RELEASE);
            peer->tail = acc;
            ev_async_send(peer->x->cfg.loop, &peer->x->async);
            posted = true;
        }
        pthread_mutex_unlock(&peer->mu);
    }
    if (!posted) {
        /* no listener side: the connection fails from our loop */
        l->ep[1] = NULL;
        l->shut[1] = true;
        free(sep);
        acc->kind = IT_CONNECTED;
        acc->side = 0;
        acc->link = l; /* takes over the listener endpoint's link reference */
        acc->status = job_ok ? BT_ERR_PEER_UNREACH : BT_ERR_PEER_AUTH;
        if (!job_ok) log_error("inproc: %s belongs to another job (ours: '%s')", addr, x->job_id);
        if (!inproc_box_post(x->box, acc, -1)) inproc_item_free(acc);
    }
    *out = &cep->base;
    return BT_IN_PROGRESS;
}

static bt_status_t inproc_send(xport_ep_t *base, const void *hdr, size_t hdr_len,
                               const struct iovec *iov, int iovcnt,
                               xport_send_done_fn done, void *arg)
{
    inproc_ep_t *ep = (inproc_ep_t *)base;
    inproc_xport_t *x = ep->x;
    if (ep->dead) return BT_ERR_PEER_CLOSED;
    size_t payload_len;
    bt_status_t st = xport_send_check(base, x->cfg.max_frame, hdr, hdr_len, iov, iovcnt, &payload_len);
    if (st != BT_OK) return st;
    size_t hdr_pad = (hdr_len + 15) & ~(size_t)15;
    inproc_item_t *it = inproc_item_new(IT_FRAME, ep->link, hdr_pad + (size_t)iovcnt * sizeof *iov);
    if (!it) return BT_ERR_NOMEM;
    if (hdr_len) memcpy(it->hdr, hdr, hdr_len);
    it->hdr_len = hdr_len;
    it->iov = (struct iovec *)(void *)(it->hdr + hdr_pad);
    it->iovcnt = 0;
    for (int i = 0; i < iovcnt; i++)
        if (iov[i].iov_len) it->iov[it->iovcnt++] = iov[i];
    it->payload_len = payload_len;
    it->done = done;
    it->arg = arg;
    inproc_box_ref(x->box);
    it->reply = x->box;
    int peer_side = 1 - ep->side;
    it->side = peer_side;
    if (!inproc_box_post(ep->link->box[peer_side], it, peer_side)) {
        inproc_item_free(it);
        return BT_ERR_PEER_CLOSED;
    }
    return BT_IN_PROGRESS;
}

static int inproc_progress(xport_t *base)
{
    return inproc_drain((inproc_xport_t *)base);
}

static uint32_t inproc_ep_peer_id(const xport_ep_t *ep) { return ep->peer_id; }

const xport_ops_t xport_inproc_ops = {
    .name       = "inproc",
    .caps       = XPORT_CAP_HOST_MEM | XPORT_CAP_ZERO_COPY,
    .create     = inproc_create,
    .destroy    = inproc_destroy,
    .listen     = inproc_listen,
    .connect    = inproc_connect,
    .send       = inproc_send,
    .close      = inproc_close,
    .progress   = inproc_progress,
    .ep_peer_id = inproc_ep_peer_id,
};
