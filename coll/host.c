/* Host collective backend: ring reduce-scatter/all-gather, chain broadcast
 * and pairwise all-to-all over any transport (inproc, tcp, ucx).
 *
 * Every frame carries a small fixed header (comm id, collective sequence
 * number, step, segment, sender rank, byte count). Edges are FIFO and every
 * rank issues the same collectives in the same order, so the next frame from
 * a peer must be exactly the one expected; anything else is a communication
 * error, reported with both sides' view, and the communicator fails.
 *
 * The communicator owns a private libev loop. The caller's thread drives it
 * while the mesh is built (open, connect); after that a progress thread of
 * the communicator owns it and runs the started calls one after another in
 * start order (ev_run ONCE while a call waits), so collectives never touch
 * an actor loop and start() never blocks. */
#include "coll/coll.h"

#include <ev.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"

#define COLL_MAGIC      0x4c435442u /* "BTCL" little-endian */
#define COLL_HDR_BYTES  36

typedef struct {
    uint32_t comm_id;
    uint32_t kind;
    uint64_t seq;
    uint32_t step;
    uint32_t seg;
    uint32_t src;
    uint64_t nbytes;
} coll_hdr_t;

typedef struct coll_frame {
    struct coll_frame *next;
    coll_hdr_t         hdr;
    xport_rx_t        *rx;
} coll_frame_t;

typedef struct {
    xport_ep_t   *ep;
    bool          ready;
    bool          closed;   /* the link went down (why says how) */
    bt_status_t   why;
    coll_frame_t *head, *tail;
} coll_peer_t;

typedef struct coll_send {
    uint8_t hdr[COLL_HDR_BYTES];
    struct coll_host *c;
    struct coll_send *prev, *next; /* c->sends: started, not completed */
} coll_send_t;

typedef struct coll_host {
    coll_comm_t     pub;
    char            name[32];
    struct ev_loop *loop;
    xport_t        *x;
    coll_peer_t    *peers;
    int             nready;
    bt_status_t     failed;
    bool            closing;      /* destroy has begun: no timer re-arms */
    uint64_t        seq;          /* sequence number of the current collective */
    coll_kind_t     kind;         /* kind of the current collective */
    unsigned        timeout_ms;
    unsigned        connect_ms;
    size_t          seg_bytes;
    int             sends_pending;
    coll_send_t    *sends;        /* the pending ones, freed by destroy if never completed */
    ev_timer        timer;
    ev_timer        poll;         /* progress tick while a call waits */
    uint8_t        *stage;        /* reduction staging (reduce-scatter work) */
    size_t          stage_cap;
    /* started calls, run by the progress thread (all below under mu) */
    pthread_mutex_t mu;
    pthread_cond_t  wake;         /* the thread waits for calls */
    pthread_cond_t  done;         /* waiters wait for their call */
    pthread_t       thread;
    bool            thread_on, stopping;
    struct coll_req *queue, **queue_tail; /* to run */
    struct coll_req *held, **held_tail;   /* started inside a group, not queued yet */
    int             group_depth;
} coll_host_t;

struct coll_req {
    coll_host_t     *c;
    struct coll_req *next;
    coll_call_t      call;
    size_t          *counts;      /* copies of the call's count arrays */
    coll_done_fn     done;
    void            *arg;
    bool             detached;    /* nobody waits: freed after done() */
    bool             finished;
    bt_status_t      status;
};

/* ---- header --------------------------------------------------------------- */

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static void coll_hdr_encode(const coll_hdr_t *h, uint8_t *out)
{
    put32(out + 0, COLL_MAGIC);
    put32(out + 4, h->comm_id);
    put32(out + 8, h->kind);
    put64(out + 12, h->seq);
    put32(out + 20, h->step);
    put32(out + 24, h->seg);
    put32(out + 28, h->src);
    put32(out + 32, (uint32_t)h->nbytes); /* segments are < 4 GiB */
}

static bool coll_hdr_decode(const void *buf, size_t len, coll_hdr_t *h)
{
    const uint8_t *p = buf;
    if (len != COLL_HDR_BYTES || get32(p) != COLL_MAGIC) return false;
    h->comm_id = get32(p + 4);
    h->kind = get32(p + 8);
    h->seq = get64(p + 12);
    h->step = get32(p + 20);
    h->seg = get32(p + 24);
    h->src = get32(p + 28);
    h->nbytes = get32(p + 32);
    return true;
}

/* ---- local reduction ---------------------------------------------------- */

static void coll_offsets(const size_t *counts, int size, size_t *offs)
{
    size_t o = 0;
    for (int r = 0; r < size; r++) {
        offs[r] = o;
        o += counts[r];
    }
}

/* ---- failure and waiting ------------------------------------------------- */

static void coll_fail(coll_host_t *c, bt_status_t st)
{
    if (c->failed == BT_OK) c->failed = st;
}

static void coll_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    coll_host_t *c = w->data;
    (void)loop; (void)revents;
    if (c->seq == 0)
        log_error("coll %s rank %d: the group did not connect within %.0f ms (%d of %d peers)",
                  c->name, c->pub.rank, w->repeat * 1000.0, c->nready, c->pub.size - 1);
    else
        log_error("coll %s rank %d: %s #%llu made no progress for %.0f ms (a peer is dead or stuck)",
                  c->name, c->pub.rank, coll_kind_name(c->kind), (unsigned long long)c->seq,
                  w->repeat * 1000.0);
    coll_fail(c, BT_ERR_PEER_TIMEOUT);
}

static void coll_progress_mark(coll_host_t *c)
{
    if (!c->closing) ev_timer_again(c->loop, &c->timer);
}

static void coll_poll_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    coll_host_t *c = w->data;
    (void)loop; (void)revents;
    xport_progress(c->x);
}

/* Wait for the next event. The calling thread is a compute thread with
 * nothing else to do, so it first spins on the transport's progress for a
 * few microseconds (a reply often arrives within them), then sleeps in the
 * loop with a 1 ms progress tick. The tick is not an optimisation: a
 * transport whose wake-up fd can miss an event (UCX's worker event fd was
 * seen to, leaving two ranks asleep in different collectives) is still
 * progressed, so a collective can be slow but never silently stuck. */
static bt_status_t coll_wait_once(coll_host_t *c)
{
    if (c->failed) return c->failed;
    if (!ev_is_active(&c->timer)) ev_timer_again(c->loop, &c->timer);
    for (int i = 0; i < 64; i++)
        if (xport_progress(c->x) > 0) {
            ev_run(c->loop, EVRUN_NOWAIT);
            return c->failed;
        }
    if (!ev_is_active(&c->poll)) ev_timer_start(c->loop, &c->poll);
    ev_run(c->loop, EVRUN_ONCE);
    return c->failed;
}

static int coll_peer_index(coll_host_t *c, xport_ep_t *ep)
{
    return (int)(intptr_t)ep->user - 1;
}

/* ---- transport callbacks -------------------------------------------------- */

static void coll_on_accept(void *arg, xport_ep_t *ep, uint32_t peer_id)
{
    coll_host_t *c = arg;
    if (peer_id >= (uint32_t)c->pub.size || (int)peer_id == c->pub.rank ||
        c->peers[peer_id].ep != NULL) {
        log_error("coll %s rank %d: unexpected connection from peer id %u (%s); dropped",
                  c->name, c->pub.rank, peer_id, ep->peer_addr);
        xport_close(ep);
        return;
    }
    ep->user = (void *)(intptr_t)(peer_id + 1);
    c->peers[peer_id].ep = ep;
    c->peers[peer_id].ready = true;
    c->nready++;
}

static void coll_on_connected(void *arg, xport_ep_t *ep, bt_status_t st)
{
    coll_host_t *c = arg;
    int p = coll_peer_index(c, ep);
    if (st != BT_OK) {
        log_error("coll %s rank %d: connecting to rank %d failed: %s", c->name, c->pub.rank, p,
                  bt_status_str(st));
        if (p >= 0) c->peers[p].ep = NULL;
        coll_fail(c, st);
        return;
    }
    c->peers[p].ready = true;
    c->nready++;
}

static void coll_on_recv(void *arg, xport_ep_t *ep, xport_rx_t *rx)
{
    coll_host_t *c = arg;
    int p = coll_peer_index(c, ep);
    coll_frame_t *f = malloc(sizeof *f);
    if (!f) {
        xport_rx_release(rx);
        coll_fail(c, BT_ERR_NOMEM);
        return;
    }
    if (!coll_hdr_decode(rx->hdr, rx->hdr_len, &f->hdr) || f->hdr.nbytes != rx->payload_len) {
        log_error("coll %s rank %d: malformed frame from rank %d (%s); closing", c->name,
                  c->pub.rank, p, ep->peer_addr);
        free(f);
        xport_rx_release(rx);
        xport_close(ep);
        c->peers[p].ep = NULL;
        coll_fail(c, BT_ERR_PEER_PROTO);
        return;
    }
    f->rx = rx;
    f->next = NULL;
    coll_peer_t *peer = &c->peers[p];
    if (peer->tail) peer->tail->next = f;
    else peer->head = f;
    peer->tail = f;
    coll_progress_mark(c);
}

/* A link that goes down is not yet a failure: a peer that finished its part
 * of the last collective and exited closes its links while frames it sent
 * are still queued here. The communicator fails when a collective needs that
 * peer (a send to it, or a frame from it that is not queued). */
static void coll_on_error(void *arg, xport_ep_t *ep, bt_status_t why)
{
    coll_host_t *c = arg;
    int p = coll_peer_index(c, ep);
    if (p < 0 || p >= c->pub.size) return;
    log_debug("coll %s rank %d: link to rank %d (%s) went down: %s", c->name, c->pub.rank, p,
              ep->peer_addr, bt_status_str(why));
    c->peers[p].ep = NULL;
    c->peers[p].closed = true;
    c->peers[p].why = bt_status_is_peer(why) ? why : BT_ERR_PEER_CLOSED;
    coll_progress_mark(c);
}

static bt_status_t coll_peer_lost(coll_host_t *c, int p)
{
    log_error("coll %s rank %d: %s #%llu needs rank %d, whose link is down (%s)", c->name,
              c->pub.rank, coll_kind_name(c->kind), (unsigned long long)c->seq, p,
              bt_status_str(c->peers[p].why ? c->peers[p].why : BT_ERR_PEER_CLOSED));
    coll_fail(c, c->peers[p].why ? c->peers[p].why : BT_ERR_PEER_CLOSED);
    return c->failed;
}

static void coll_on_send_done(void *arg, bt_status_t st)
{
    coll_send_t *s = arg;
    coll_host_t *c = s->c;
    c->sends_pending--;
    if (s->prev) s->prev->next = s->next;
    else c->sends = s->next;
    if (s->next) s->next->prev = s->prev;
    if (st != BT_OK) coll_fail(c, st);
    free(s);
    coll_progress_mark(c);
}

/* ---- point-to-point pieces ------------------------------------------------ */

static size_t coll_nsegs(const coll_host_t *c, size_t nbytes)
{
    return nbytes == 0 ? 1 : (nbytes + c->seg_bytes - 1) / c->seg_bytes;
}

/* Send one segment (one frame) to peer. buf must stay valid until the send
 * completes (coll_end waits for every send). */
static bt_status_t coll_send_seg(coll_host_t *c, int peer, uint32_t step, uint32_t seg,
                                 const void *buf, size_t len)
{
    if (c->failed) return c->failed;
    xport_ep_t *ep = c->peers[peer].ep;
    if (!ep) return coll_peer_lost(c, peer);
    coll_send_t *snd = malloc(sizeof *snd);
    if (!snd) return BT_ERR_NOMEM;
    coll_hdr_t h = {.comm_id = c->pub.id, .kind = c->kind, .seq = c->seq, .step = step,
                    .seg = seg, .src = (uint32_t)c->pub.rank, .nbytes = len};
    coll_hdr_encode(&h, snd->hdr);
    snd->c = c;
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    bt_status_t st = xport_send(ep, snd->hdr, COLL_HDR_BYTES, &iov, len ? 1 : 0,
                                coll_on_send_done, snd);
    if (st != BT_IN_PROGRESS) {
        free(snd);
        log_error("coll %s rank %d: send to rank %d failed: %s", c->name, c->pub.rank, peer,
                  bt_status_str(st));
        coll_fail(c, st == BT_OK ? BT_ERR_INVALID : st);
        return c->failed;
    }
    c->sends_pending++;
    snd->prev = NULL;
    snd->next = c->sends;
    if (c->sends) c->sends->prev = snd;
    c->sends = snd;
    return BT_OK;
}

/* Send nbytes from buf to peer as the segments of one step. */
static bt_status_t coll_send_step(coll_host_t *c, int peer, uint32_t step, const void *buf,
                                  size_t nbytes)
{
    size_t nseg = coll_nsegs(c, nbytes);
    for (size_t s = 0; s < nseg; s++) {
        size_t off = s * c->seg_bytes;
        size_t len = nbytes - off < c->seg_bytes ? nbytes - off : c->seg_bytes;
        bt_status_t st = coll_send_seg(c, peer, step, (uint32_t)s, (const uint8_t *)buf + off, len);
        if (st) return st;
    }
    return BT_OK;
}

/* Pop the next frame from peer and check it is the expected one. */
static bt_status_t coll_recv_frame(coll_host_t *c, int peer, uint32_t step, uint32_t seg,
                                   size_t nbytes, coll_frame_t **out)
{
    coll_peer_t *pp = &c->peers[peer];
    while (!pp->head) {
        if (pp->closed) return coll_peer_lost(c, peer);
        bt_status_t st = coll_wait_once(c);
        if (st) return st;
    }
    coll_frame_t *f = pp->head;
    pp->head = f->next;
    if (!pp->head) pp->tail = NULL;
    const coll_hdr_t *h = &f->hdr;
    if (h->comm_id != c->pub.id || h->kind != (uint32_t)c->kind || h->seq != c->seq ||
        h->step != step || h->seg != seg || h->src != (uint32_t)peer || h->nbytes != nbytes) {
        log_error("coll %s rank %d: collective mismatch with rank %d: expected %s #%llu step %u "
                  "seg %u (%zu B), got %s #%llu step %u seg %u (%llu B) from rank %u "
                  "(ranks issued different collectives)",
                  c->name, c->pub.rank, peer, coll_kind_name(c->kind),
                  (unsigned long long)c->seq, step, seg, nbytes,
                  h->kind < COLL_KIND_COUNT ? coll_kind_name((coll_kind_t)h->kind) : "?",
                  (unsigned long long)h->seq, h->step, h->seg, (unsigned long long)h->nbytes,
                  h->src);
        xport_rx_release(f->rx);
        free(f);
        coll_fail(c, BT_ERR_PEER_PROTO);
        return c->failed;
    }
    *out = f;
    return BT_OK;
}

static void coll_frame_done(coll_frame_t *f)
{
    xport_rx_release(f->rx);
    free(f);
}

/* Receive one step's segments from peer into dst (copy) or reduce into dst. */
static bt_status_t coll_recv_step(coll_host_t *c, int peer, uint32_t step, void *dst,
                                  size_t nbytes, dtype_t dt, bool reduce, coll_op_t op)
{
    size_t nseg = coll_nsegs(c, nbytes), es = dtype_size(dt);
    for (size_t s = 0; s < nseg; s++) {
        size_t off = s * c->seg_bytes;
        size_t len = nbytes - off < c->seg_bytes ? nbytes - off : c->seg_bytes;
        coll_frame_t *f;
        bt_status_t st = coll_recv_frame(c, peer, step, (uint32_t)s, len, &f);
        if (st) return st;
        if (len) {
            if (reduce) coll_reduce_local((uint8_t *)dst + off, f->rx->payload, len / es, dt, op);
            else memcpy((uint8_t *)dst + off, f->rx->payload, len);
        }
        coll_frame_done(f);
    }
    return BT_OK;
}

static bt_status_t coll_wait_sends(coll_host_t *c)
{
    while (c->sends_pending > 0) {
        bt_status_t st = coll_wait_once(c);
        if (st) return st;
    }
    return c->failed;
}

static bt_status_t coll_begin(coll_host_t *c, coll_kind_t kind)
{
    if (c->failed) return c->failed;
    c->seq++;
    c->kind = kind;
    coll_progress_mark(c);
    return BT_OK;
}

static bt_status_t coll_end(coll_host_t *c)
{
    bt_status_t st = coll_wait_sends(c);
    ev_timer_stop(c->loop, &c->timer);
    ev_timer_stop(c->loop, &c->poll);
    return st;
}

/* ---- ring algorithms ------------------------------------------------------ */

/* After this, chunk `rank` of work (offs/counts) holds the reduction over all
 * ranks. Step s: send chunk (r-s-1), receive and reduce chunk (r-s-2). */
static bt_status_t coll_ring_reduce_scatter(coll_host_t *c, uint8_t *work, const size_t *counts,
                                            const size_t *offs, dtype_t dt, coll_op_t op)
{
    int n = c->pub.size, r = c->pub.rank;
    int next = (r + 1) % n, prev = (r - 1 + n) % n;
    size_t es = dtype_size(dt);
    for (int s = 0; s < n - 1; s++) {
        int si = ((r - s - 1) % n + n) % n, ri = ((r - s - 2) % n + n) % n;
        bt_status_t st = coll_send_step(c, next, (uint32_t)s, work + offs[si] * es, counts[si] * es);
        if (st) return st;
        st = coll_recv_step(c, prev, (uint32_t)s, work + offs[ri] * es, counts[ri] * es, dt, true, op);
        if (st) return st;
    }
    return BT_OK;
}

/* Chunk `rank` of work is valid; after this every chunk is. Step s: send
 * chunk (r-s), receive chunk (r-s-1). */
static bt_status_t coll_ring_all_gather(coll_host_t *c, uint8_t *work, const size_t *counts,
                                        const size_t *offs, dtype_t dt, uint32_t step0)
{
    int n = c->pub.size, r = c->pub.rank;
    int next = (r + 1) % n, prev = (r - 1 + n) % n;
    size_t es = dtype_size(dt);
    for (int s = 0; s < n - 1; s++) {
        int si = ((r - s) % n + n) % n, ri = ((r - s - 1) % n + n) % n;
        bt_status_t st = coll_send_step(c, next, step0 + (uint32_t)s, work + offs[si] * es,
                                        counts[si] * es);
        if (st) return st;
        st = coll_recv_step(c, prev, step0 + (uint32_t)s, work + offs[ri] * es, counts[ri] * es,
                            dt, false, COLL_SUM);
        if (st) return st;
    }
    return BT_OK;
}

static bt_status_t exec_all_reduce(coll_host_t *c, void *buf, size_t count, dtype_t dt,
                                   coll_op_t op)
{
    coll_comm_t *comm = &c->pub;
    int n = comm->size;
    bt_status_t st = coll_begin(c, COLL_KIND_ALL_REDUCE);
    if (st) return st;
    size_t *counts = malloc(2 * (size_t)n * sizeof *counts);
    if (!counts) return BT_ERR_NOMEM;
    size_t *offs = counts + n;
    coll_counts_even(count, n, counts);
    coll_offsets(counts, n, offs);
    st = coll_ring_reduce_scatter(c, buf, counts, offs, dt, op);
    if (!st) st = coll_ring_all_gather(c, buf, counts, offs, dt, (uint32_t)n);
    free(counts);
    bt_status_t st2 = coll_end(c);
    return st ? st : st2;
}

static bt_status_t exec_reduce_scatter(coll_host_t *c, void *recv, const void *send,
                                       const size_t *counts, dtype_t dt, coll_op_t op)
{
    coll_comm_t *comm = &c->pub;
    int n = comm->size;
    size_t es = dtype_size(dt);
    bt_status_t st = coll_begin(c, COLL_KIND_REDUCE_SCATTER);
    if (st) return st;
    size_t *offs = malloc((size_t)n * sizeof *offs);
    if (!offs) return BT_ERR_NOMEM;
    coll_offsets(counts, n, offs);
    size_t total = offs[n - 1] + counts[n - 1];
    if (c->stage_cap < total * es) {
        uint8_t *p = realloc(c->stage, total * es);
        if (!p) {
            free(offs);
            return BT_ERR_NOMEM;
        }
        c->stage = p;
        c->stage_cap = total * es;
    }
    if (total) memcpy(c->stage, send, total * es);
    st = coll_ring_reduce_scatter(c, c->stage, counts, offs, dt, op);
    bt_status_t st2 = coll_end(c);
    if (!st && !st2 && counts[comm->rank])
        memmove(recv, c->stage + offs[comm->rank] * es, counts[comm->rank] * es);
    free(offs);
    return st ? st : st2;
}

static bt_status_t exec_all_gather(coll_host_t *c, void *recv, const void *send,
                                   const size_t *counts, dtype_t dt)
{
    coll_comm_t *comm = &c->pub;
    int n = comm->size;
    size_t es = dtype_size(dt);
    bt_status_t st = coll_begin(c, COLL_KIND_ALL_GATHER);
    if (st) return st;
    size_t *offs = malloc((size_t)n * sizeof *offs);
    if (!offs) return BT_ERR_NOMEM;
    coll_offsets(counts, n, offs);
    uint8_t *mine = (uint8_t *)recv + offs[comm->rank] * es;
    if (counts[comm->rank] && (const uint8_t *)send != mine)
        memmove(mine, send, counts[comm->rank] * es);
    st = coll_ring_all_gather(c, recv, counts, offs, dt, 0);
    free(offs);
    bt_status_t st2 = coll_end(c);
    return st ? st : st2;
}

/* Chain broadcast in segments: root -> root+1 -> ... ; each rank forwards a
 * segment as soon as it has it, so a large buffer streams along the chain. */
static bt_status_t exec_broadcast(coll_host_t *c, void *buf, size_t count, dtype_t dt, int root)
{
    coll_comm_t *comm = &c->pub;
    int n = comm->size, r = comm->rank;
    int pos = (r - root + n) % n;
    int next = (r + 1) % n, prev = (r - 1 + n) % n;
    size_t nbytes = count * dtype_size(dt);
    bt_status_t st = coll_begin(c, COLL_KIND_BROADCAST);
    if (st) return st;
    if (n > 1) {
        size_t nseg = coll_nsegs(c, nbytes);
        for (size_t s = 0; s < nseg && !st; s++) {
            size_t off = s * c->seg_bytes;
            size_t len = nbytes - off < c->seg_bytes ? nbytes - off : c->seg_bytes;
            if (pos > 0) {
                coll_frame_t *f;
                st = coll_recv_frame(c, prev, 0, (uint32_t)s, len, &f);
                if (st) break;
                if (len) memcpy((uint8_t *)buf + off, f->rx->payload, len);
                coll_frame_done(f);
            }
            if (pos < n - 1) st = coll_send_seg(c, next, 0, (uint32_t)s, (uint8_t *)buf + off, len);
        }
    }
    bt_status_t st2 = coll_end(c);
    return st ? st : st2;
}

static bt_status_t exec_all_to_all(coll_host_t *c, void *recv, const size_t *recv_counts,
                                   const void *send, const size_t *send_counts, dtype_t dt)
{
    coll_comm_t *comm = &c->pub;
    int n = comm->size, r = comm->rank;
    size_t es = dtype_size(dt);
    bt_status_t st = coll_begin(c, COLL_KIND_ALL_TO_ALL);
    if (st) return st;
    size_t *soff = malloc(2 * (size_t)n * sizeof *soff);
    if (!soff) return BT_ERR_NOMEM;
    size_t *roff = soff + n;
    coll_offsets(send_counts, n, soff);
    coll_offsets(recv_counts, n, roff);
    /* post every send first (in rank order starting after ours, to spread
     * load), then drain the receives in the same order */
    for (int k = 1; k < n && !st; k++) {
        int j = (r + k) % n;
        st = coll_send_step(c, j, 0, (const uint8_t *)send + soff[j] * es, send_counts[j] * es);
    }
    if (!st && send_counts[r] != recv_counts[r]) {
        log_error("coll %s rank %d: all_to_all sends %zu elements to itself but expects %zu",
                  c->name, r, send_counts[r], recv_counts[r]);
        st = BT_ERR_INVALID;
    }
    if (!st && recv_counts[r])
        memmove((uint8_t *)recv + roff[r] * es, (const uint8_t *)send + soff[r] * es,
                recv_counts[r] * es);
    for (int k = 1; k < n && !st; k++) {
        int j = (r - k + n) % n;
        st = coll_recv_step(c, j, 0, (uint8_t *)recv + roff[j] * es, recv_counts[j] * es, dt,
                            false, COLL_SUM);
    }
    free(soff);
    bt_status_t st2 = coll_end(c);
    return st ? st : st2;
}

static bt_status_t exec_barrier(coll_host_t *c)
{
    int32_t one = 1;
    return exec_all_reduce(c, &one, 1, DT_I32, COLL_SUM);
}

static bt_status_t exec_call(coll_host_t *c, const coll_call_t *k)
{
    switch (k->kind) {
    case COLL_KIND_ALL_REDUCE: return exec_all_reduce(c, k->recv, k->count, k->dt, k->op);
    case COLL_KIND_REDUCE_SCATTER:
        return exec_reduce_scatter(c, k->recv, k->send, k->counts, k->dt, k->op);
    case COLL_KIND_ALL_GATHER: return exec_all_gather(c, k->recv, k->send, k->counts, k->dt);
    case COLL_KIND_ALL_TO_ALL:
        return exec_all_to_all(c, k->recv, k->recv_counts, k->send, k->send_counts, k->dt);
    case COLL_KIND_BROADCAST: return exec_broadcast(c, k->recv, k->count, k->dt, k->root);
    case COLL_KIND_BARRIER: return exec_barrier(c);
    default: BT_PANIC("coll %s: call of kind %d", c->name, (int)k->kind);
    }
}

/* ---- started calls: the progress thread ------------------------------------ */

static void req_free(coll_req_t *r)
{
    free(r->counts);
    free(r);
}

static void *progress_main(void *arg)
{
    coll_host_t *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->queue && !c->stopping) pthread_cond_wait(&c->wake, &c->mu);
        coll_req_t *r = c->queue;
        if (!r) break; /* stopping, nothing left */
        c->queue = r->next;
        if (!c->queue) c->queue_tail = &c->queue;
        pthread_mutex_unlock(&c->mu);
        bt_status_t st = exec_call(c, &r->call);
        if (r->done) r->done(r->arg, st);
        pthread_mutex_lock(&c->mu);
        if (r->detached) {
            req_free(r);
        } else {
            r->status = st;
            r->finished = true;
            pthread_cond_broadcast(&c->done);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* the count arrays the call points to, copied (the caller may reuse them) */
static bt_status_t req_copy_counts(coll_req_t *r, int n)
{
    const size_t *src[3] = {r->call.counts, r->call.send_counts, r->call.recv_counts};
    int have = 0;
    for (int i = 0; i < 3; i++) have += src[i] != NULL;
    if (!have) return BT_OK;
    r->counts = malloc((size_t)(have * n) * sizeof *r->counts);
    if (!r->counts) return BT_ERR_NOMEM;
    size_t *at = r->counts;
    const size_t **dst[3] = {&r->call.counts, &r->call.send_counts, &r->call.recv_counts};
    for (int i = 0; i < 3; i++) {
        if (!src[i]) continue;
        memcpy(at, src[i], (size_t)n * sizeof *at);
        *dst[i] = at;
        at += n;
    }
    return BT_OK;
}

static bt_status_t coll_host_start(coll_comm_t *comm, const coll_call_t *call, coll_done_fn done,
                                   void *arg, coll_req_t **out)
{
    coll_host_t *c = (coll_host_t *)comm;
    coll_call_check(comm, call);
    if (call->op == COLL_AVG &&
        (call->kind == COLL_KIND_ALL_REDUCE || call->kind == COLL_KIND_REDUCE_SCATTER)) {
        log_error("coll %s: %s with op avg: the host backend sums (COLL_SUM) and the caller "
                  "scales; avg is the nccl backend's", c->name, coll_kind_name(call->kind));
        return BT_ERR_UNSUPPORTED;
    }
    coll_req_t *r = calloc(1, sizeof *r);
    if (!r) return BT_ERR_NOMEM;
    r->c = c;
    r->call = *call;
    r->done = done;
    r->arg = arg;
    r->detached = out == NULL;
    if (req_copy_counts(r, comm->size) != BT_OK) {
        free(r);
        return BT_ERR_NOMEM;
    }
    pthread_mutex_lock(&c->mu);
    if (!c->thread_on) {
        if (pthread_create(&c->thread, NULL, progress_main, c) != 0) {
            pthread_mutex_unlock(&c->mu);
            req_free(r);
            log_error("coll %s rank %d: cannot start the progress thread", c->name, comm->rank);
            return BT_ERR_NOMEM;
        }
        c->thread_on = true;
    }
    if (c->group_depth > 0) {
        *c->held_tail = r;
        c->held_tail = &r->next;
    } else {
        *c->queue_tail = r;
        c->queue_tail = &r->next;
        pthread_cond_signal(&c->wake);
    }
    pthread_mutex_unlock(&c->mu);
    if (out) *out = r;
    return BT_IN_PROGRESS;
}

static bt_status_t coll_host_wait(coll_req_t *r)
{
    coll_host_t *c = r->c;
    pthread_mutex_lock(&c->mu);
    if (c->group_depth > 0 && !r->finished) {
        /* waiting inside a group would wait forever: its calls start at the end */
        for (coll_req_t *h = c->held; h; h = h->next)
            if (h == r) BT_PANIC("coll %s: coll_wait on a call of an open group", c->name);
    }
    while (!r->finished) pthread_cond_wait(&c->done, &c->mu);
    pthread_mutex_unlock(&c->mu);
    bt_status_t st = r->status;
    req_free(r);
    return st;
}

static void coll_host_group_begin(coll_comm_t *comm)
{
    coll_host_t *c = (coll_host_t *)comm;
    pthread_mutex_lock(&c->mu);
    c->group_depth++;
    pthread_mutex_unlock(&c->mu);
}

static void coll_host_group_end(coll_comm_t *comm)
{
    coll_host_t *c = (coll_host_t *)comm;
    pthread_mutex_lock(&c->mu);
    if (c->group_depth == 0) BT_PANIC("coll %s: group_end without group_begin", c->name);
    if (--c->group_depth == 0 && c->held) {
        *c->queue_tail = c->held;
        c->queue_tail = c->held_tail;
        c->held = NULL;
        c->held_tail = &c->held;
        pthread_cond_signal(&c->wake);
    }
    pthread_mutex_unlock(&c->mu);
}

static void coll_host_destroy(coll_comm_t *comm)
{
    coll_host_t *c = (coll_host_t *)comm;
    if (!c) return;
    /* the calls started before run to their end (a failed communicator ends
     * them at once); then this thread owns the loop again */
    pthread_mutex_lock(&c->mu);
    if (c->group_depth > 0) {
        log_warn("coll %s: destroyed inside an open group; its calls start now", c->name);
        c->group_depth = 1;
        pthread_mutex_unlock(&c->mu);
        coll_host_group_end(comm);
        pthread_mutex_lock(&c->mu);
    }
    c->stopping = true;
    pthread_cond_signal(&c->wake);
    bool joined = c->thread_on;
    pthread_mutex_unlock(&c->mu);
    if (joined) pthread_join(c->thread, NULL);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->wake);
    pthread_cond_destroy(&c->done);
    for (int p = 0; p < comm->size; p++) {
        coll_frame_t *f = c->peers[p].head;
        while (f) {
            coll_frame_t *nx = f->next;
            coll_frame_done(f);
            f = nx;
        }
    }
    c->closing = true;
    ev_timer_stop(c->loop, &c->timer);
    ev_timer_stop(c->loop, &c->poll);
    if (c->x) xport_destroy(c->x);
    /* Let deferred completions (canceled sends) run before the loop goes,
     * for a bounded time: an inproc peer that holds one of our zero-copy
     * frames and is itself gone never completes it, and waiting for it (with
     * a completion re-arming the timer) once spun here forever. */
    uint64_t deadline = clock_now_ns() + 1000000000ull;
    while (c->sends_pending > 0 && clock_now_ns() < deadline && ev_run(c->loop, EVRUN_NOWAIT)) {}
    /* Sends still pending now never complete (xport.h: after destroy, done()
     * fires for none, an inproc frame a peer still holds included). */
    while (c->sends) {
        coll_send_t *s = c->sends;
        c->sends = s->next;
        free(s);
    }
    ev_loop_destroy(c->loop);
    free(c->peers);
    free(c->stage);
    free(c);
}

const coll_ops_t coll_host_ops = {
    .name = "host",
    .open = coll_host_open,
    .connect = coll_host_connect,
    .start = coll_host_start,
    .wait = coll_host_wait,
    .group_begin = coll_host_group_begin,
    .group_end = coll_host_group_end,
    .destroy = coll_host_destroy,
};

/* ---- creation ------------------------------------------------------------- */

bt_status_t coll_host_open(const coll_config_t *cfg, coll_comm_t **out, char *addr,
                           size_t addr_cap)
{
    if (cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size) {
        log_error("coll: rank %d outside a group of %d", cfg->rank, cfg->size);
        return BT_ERR_INVALID;
    }
    const xport_ops_t *ops = xport_ops_get(cfg->kind);
    if (!ops) {
        log_error("coll: transport %s is not built", xport_kind_name(cfg->kind));
        return BT_ERR_UNSUPPORTED;
    }
    bt_status_t st = BT_ERR_NOMEM;
    coll_host_t *c = calloc(1, sizeof *c);
    if (!c) goto fail;
    c->peers = calloc((size_t)cfg->size, sizeof *c->peers);
    if (!c->peers) goto fail_comm;
    c->loop = ev_loop_new(EVFLAG_AUTO);
    if (!c->loop) goto fail_peers;
    c->pub.ops = &coll_host_ops;
    c->pub.rank = cfg->rank;
    c->pub.size = cfg->size;
    c->pub.id = cfg->comm_id;
    c->pub.mem_devices = 1u << DEV_CPU;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->wake, NULL);
    pthread_cond_init(&c->done, NULL);
    c->queue_tail = &c->queue;
    c->held_tail = &c->held;
    snprintf(c->name, sizeof c->name, "%s", cfg->name ? cfg->name : "group");
    c->pub.name = c->name;
    c->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : 30000;
    c->connect_ms = cfg->connect_ms ? cfg->connect_ms : 120000;
    c->seg_bytes = cfg->segment_bytes ? cfg->segment_bytes : (4u << 20);
    ev_init(&c->timer, coll_timer_cb);
    c->timer.repeat = c->timeout_ms / 1000.0;
    c->timer.data = c;
    ev_timer_init(&c->poll, coll_poll_cb, 0.001, 0.001);
    c->poll.data = c;

    char inproc_name[64];
    const char *listen = cfg->listen_addr;
    if (cfg->kind == XPORT_INPROC && !listen) {
        static _Atomic unsigned inproc_seq;
        snprintf(inproc_name, sizeof inproc_name, "inproc:coll-%u-%u-%d-%u", (unsigned)getpid(),
                 cfg->comm_id, cfg->rank, inproc_seq++);
        listen = inproc_name;
    }
    xport_config_t xc = {
        .loop = c->loop,
        .job_id = cfg->job_id,
        .secret = cfg->secret,
        .secret_len = cfg->secret_len,
        .self_id = (uint32_t)cfg->rank,
        .listen_addr = listen,
        .max_frame = c->seg_bytes + 4096,
        .handshake_ms = c->connect_ms,
        .cbs = {.arg = c, .accept = coll_on_accept, .connected = coll_on_connected,
                .recv = coll_on_recv, .error = coll_on_error},
    };
    st = xport_create(ops, &xc, &c->x);
    if (st) goto fail_loop;
    st = xport_listen(c->x, addr, addr_cap);
    if (st) goto fail_xport;
    *out = &c->pub;
    return BT_OK;

fail_xport:
    xport_destroy(c->x);
fail_loop:
    ev_loop_destroy(c->loop);
fail_peers:
    free(c->peers);
fail_comm:
    free(c);
fail:
    if (st == BT_ERR_NOMEM) log_error("coll: out of memory creating a communicator");
    return st;
}

bt_status_t coll_host_connect(coll_comm_t *comm, const char *const *addrs)
{
    coll_host_t *c = (coll_host_t *)comm;
    int n = comm->size, r = comm->rank;
    for (int j = r + 1; j < n; j++) {
        xport_ep_t *ep = NULL;
        bt_status_t st = xport_connect(c->x, addrs[j], &ep);
        if (st != BT_IN_PROGRESS && st != BT_OK) {
            log_error("coll %s rank %d: cannot connect to rank %d at %s: %s", c->name, r, j,
                      addrs[j], bt_status_str(st));
            coll_fail(c, st);
            return st;
        }
        ep->user = (void *)(intptr_t)(j + 1);
        c->peers[j].ep = ep;
        if (st == BT_OK) {
            c->peers[j].ready = true;
            c->nready++;
        }
    }
    c->kind = COLL_KIND_BARRIER;
    c->timer.repeat = c->connect_ms / 1000.0;
    coll_progress_mark(c);
    while (c->nready < n - 1) {
        bt_status_t st = coll_wait_once(c);
        if (st) {
            log_error("coll %s rank %d: only %d of %d peers connected", c->name, r, c->nready,
                      n - 1);
            return st;
        }
    }
    ev_timer_stop(c->loop, &c->timer);
    ev_timer_stop(c->loop, &c->poll);
    c->timer.repeat = c->timeout_ms / 1000.0;
    return BT_OK;
}
