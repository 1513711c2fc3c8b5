/* UCX transport: UCP active messages, one worker per xport.
 *
 * Connections: by UCP worker address, never by socket address. listen()
 * publishes the worker's address ("host:pid/HEX", ucp_worker_get_address
 * in hex); peers learn it over a path that is authenticated already (a
 * job's run directory, mode 0700: the address book) and connect() creates
 * a UCX endpoint to it (UCP_EP_PARAM_FIELD_REMOTE_ADDRESS). There is no
 * ucp_listener_create and so no UCX connection manager socket: UCX 1.13's
 * tcp connection manager aborted the process on 17 zero bytes from anyone
 * who could reach its port (tcp_sockcm_ep.c:825, "17 > 16"), before any of
 * our checks could run. Which UCX transports the worker opens follows the
 * listen host (xport_ucx_net_select): on loopback only shared memory and
 * self, hence no network socket at all; on a named address the interface
 * that has it and the RDMA ports behind that interface (verbs where such a
 * device exists: none on the machine this was written on, so only shared
 * memory and self ran here), never UCX's own tcp transport: 16 zero bytes
 * to its port from a peer host's address stalled the real connections
 * (measured, UCX 1.13.1; between hosts without RDMA use transport tcp).
 *
 * UCX pairs the endpoints two workers create to each other in creation
 * order, so each xport keeps at most one live UCX endpoint per remote
 * worker (ucx_peer_t), shared by all connections between the two; frames
 * find their connection by the ids below, never by UCX endpoint. A client
 * connects: it creates (or reuses) the peer's endpoint and sends its hello
 * with its own worker address and a MAC over both under the job secret
 * (xport_hs_hello_mac_write). The server checks job id and MAC before it
 * hands that address to UCX (ucp_ep_create back to the client): only a
 * holder of the secret makes it connect anywhere. A hello that fails is
 * dropped without an answer (there is nobody verified to answer to); its
 * client sees its handshake deadline pass. The rest of the handshake
 * (handshake.h: nonces, proofs) runs as on tcp, then frames flow. Every
 * UCX endpoint is created with UCP_ERR_HANDLING_MODE_PEER and an error
 * callback, so a dead peer becomes an error, never a hang; its keepalive
 * (1 s here, xport_ucx_settings) notices a dead process.
 *
 * Closing one connection leaves the shared UCX endpoint to the others; the
 * endpoint is closed with its last connection. A connection we fail or
 * drop (bad frame, handshake failure, close during the handshake) tells its
 * other end with an ABORT, since closing our UCX endpoint no longer reaches
 * the peer while other connections keep theirs.
 *
 * Messages: AM id HS carries handshake messages (handshake.h) in the AM
 * header; AM id DATA carries the frame header as the AM header and the
 * payload as AM data (iovec datatype when the sender gave several pieces).
 * A DATA message before the handshake passed drops the peer. AM id BYE
 * closes in order (ucx_close_begin): the closer's BYE follows its last frame,
 * the peer acknowledges once every frame before it is in, and only then does
 * the closer let go of the UCX endpoint (closing it would fail the peer's
 * pending rendezvous pulls). BYE with UCX_BYE_ABORT drops a connection at
 * once (see above).
 *
 * Connection ids: each end of a connection has an id (slot, tag): the
 * index of its endpoint in the xport's table and a random tag. DATA and
 * BYE headers start with the receiver's id, 8 bytes (two little-endian
 * u32s); HS headers with 16: the receiver's id, then the sender's. A
 * client's first hello names slot UCX_SLOT_NEW (a new connection), every
 * later HS message the id learned from the other side's hello. A message
 * for a slot whose tag does not match is dropped (that connection is gone,
 * or the id is forged). HS messages go eager (UCP_AM_SEND_FLAG_EAGER): the
 * hello's address arrives as AM data inside the callback.
 *
 * UCX settings (xport_ucx_settings in transport/xport.c, and UCX_TLS /
 * UCX_NET_DEVICES from xport_ucx_net_select; the environment wins): UCX
 * keeps its posix/sysv shared-memory transports off for endpoints in
 * error-handling mode unless UCX_MM_ERROR_HANDLING (or its POSIX_/SYSV_
 * forms) says otherwise; we turn it on, so two processes of one host talk
 * through shared memory and a dead peer is still reported (the
 * shared-memory lane does the keepalive). We turn tcp put off, for where
 * the environment enables UCX's tcp: with tcp lanes for rendezvous RMA,
 * every ucp_worker_progress pays an epoll_wait.
 *
 * Descriptors: UCX opens its own without close-on-exec (sockets, shared
 * memory files, pipes, a keepalive timer fd). Those it opens in create and
 * ucp_ep_create get FD_CLOEXEC right after (base_fd_cloexec_new); any it
 * opens later inside progress are left to the spawn path, which closes
 * everything above stderr in a child (launch/spawn.c).
 *
 * Receive: the AM callback (inside ucp_worker_progress) only records the
 * message on its endpoint's FIFO, keeping UCX's data (persistent eager data
 * or the rendezvous descriptor). Outside progress, each FIFO head gets its
 * buffer from cbs.alloc; eager data is copied into it, rendezvous data is
 * fetched with ucp_am_recv_data_nbx straight into it. Frames are delivered in
 * arrival order. No user callback ever runs inside ucp_worker_progress.
 *
 * Loop integration: the worker's event fd (ucp_worker_get_efd) is an ev_io;
 * an ev_prepare progresses and re-arms (ucp_worker_arm) before the loop
 * blocks, and while operations are in flight a short ev_timer polls as well
 * in case a transport reports completions without an event. In busy_poll
 * mode progress() calls ucp_worker_progress directly, and while the loop
 * spins (cfg.spinning) the prepare neither arms nor watches the event fd:
 * arming fails while the peer keeps sending and costs a read of the
 * worker's event fds per attempt, and the unarmed fd stays readable, which
 * would keep libev from running the spin.
 *
 * Memory: host memory. XPORT_CAP_CUDA_MEM is set only when UCX reports CUDA
 * memory support (ucp_context_query); Debian's UCX has none, so GPU payloads
 * must be staged through pinned host memory by the caller.
 */
#include "transport/xport.h"

#include "base/clock.h"
#include "base/file.h"
#include "base/freelist.h"
#include "base/log.h"
#include "transport/handshake.h"

#include <ctype.h>
#include <errno.h>
#include <ev.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#define UCX_AM_HS   1u
#define UCX_AM_DATA 2u
#define UCX_AM_BYE  3u   /* orderly close: one header byte, UCX_BYE_* */
#define UCX_BYE_REQ 1u
#define UCX_BYE_ACK 2u
#define UCX_BYE_ABORT 3u /* the sender dropped the connection: fail it, answer nothing */
#define UCX_CLOSE_S 2.0  /* how long a closing endpoint waits for the peer's ack */
#define UCX_DEFAULT_MAX_FRAME (1ull << 30)
#define UCX_DEFAULT_HS_MS 5000u
#define UCX_POLL_S  0.002
#define UCX_PFX_LEN 8u      /* DATA, BYE: the receiver's (slot, tag) */
#define UCX_HS_PFX_LEN 16u  /* HS: the receiver's (slot, tag), then the sender's */
#define UCX_SLOT_NEW UINT32_MAX /* the receiver slot of a client's hello */
#define UCX_HELLO_HDR (XPORT_HS_HELLO_LEN + XPORT_HS_MAC_LEN) /* a client's hello: hello | MAC */

typedef struct ucx_xport ucx_xport_t;
typedef struct ucx_ep ucx_ep_t;

typedef struct ucx_send {
    struct ucx_send   *prev, *next;   /* ep's pending or in-flight list */
    struct ucx_send   *done_next;
    ucx_xport_t       *x;
    ucx_ep_t          *ep;            /* NULL once the endpoint is gone */
    xport_send_done_fn done;
    void              *arg;
    bt_status_t        status;
    bool               reported;      /* done() already fired (endpoint failure) */
    unsigned           am_id;
    size_t             blk_size;      /* bytes allocated (ucx_blk_get) */
    uint8_t           *hdr;           /* prefix (UCX_PFX_LEN, HS: UCX_HS_PFX_LEN) + the caller's header */
    size_t             hdr_len;       /* prefix included */
    size_t             payload_len;
    int                iovcnt;
    ucp_dt_iov_t       iov[];         /* followed by the header bytes */
} ucx_send_t;

typedef struct ucx_rx {
    xport_rx_t     rx;               /* first: release() gets this back */
    struct ucx_rx *next;
    ucx_xport_t   *x;
    uint8_t        kind;             /* UCX_AM_HS, UCX_AM_DATA or UCX_AM_BYE */
    size_t         blk_size;         /* bytes allocated (ucx_blk_get) */
    bool           rndv;
    uint32_t       pfx_slot, pfx_tag; /* HS: the sender's connection id */
    bool           started;          /* buffer chosen, data moving */
    bool           ready;            /* data in the buffer */
    bool           orphan;           /* endpoint died while a rndv receive was in flight */
    bt_status_t    status;
    ucs_status_t   ucs;              /* what UCX said of a failed receive */
    void          *desc;             /* UCX data or rndv descriptor not yet consumed */
    void          *req;
    void          *buf;
    size_t         len;
    size_t         hdr_len;
    uint8_t        hdr[];
} ucx_rx_t;

/* CLOSING: closed by us (ucx_close or destroy); a BYE is out and the UCX
 * endpoint stays until the peer acknowledges it (or UCX_CLOSE_S passes). */
typedef enum { UEP_HANDSHAKE, UEP_OPEN, UEP_CLOSING, UEP_DEAD } ucx_ep_state_t;

/* The UCX endpoint to one remote worker (see the top of this file). users:
 * the connections on it; at 0 it leaves the list and its UCX endpoint is
 * closed; the memory stays until UCX has finished that close, since UCX
 * may still report an error for it. */
typedef struct ucx_peer {
    struct ucx_peer *prev, *next;
    ucx_xport_t     *x;
    int              users;
    ucp_ep_h         uep;
    bool             failed;         /* UCX reported the endpoint failed: no new users */
    ucs_status_t     fail_ucs;
    char            *addr;           /* the remote worker's address text: the lookup key */
} ucx_peer_t;

struct ucx_ep {
    xport_ep_t      base;            /* first */
    ucx_xport_t    *x;
    ucx_ep_t       *prev, *next;
    int             refs;
    ucx_peer_t     *peer;            /* NULL until connected / once torn down */
    uint32_t        slot, tag;       /* our id for this connection (x->slots index, random tag) */
    uint32_t        peer_slot, peer_tag; /* the other end's, from its hello */
    bool            peer_known;      /* peer_slot/tag are set: HS messages name them */
    bool            peer_aborted;    /* it dropped the connection: no ABORT back */
    ucx_ep_state_t  state;
    bool            is_server;
    bt_status_t     fail_pending;    /* set by the UCX error callback */
    bool            fail_drained;    /* progressed until idle since: all its frames are here */
    bool            bye_seen;        /* the peer closed in order (its BYE came) */
    ucs_status_t    fail_ucs;        /* what UCX said, for the log line */
    size_t          bad_hdr, bad_len; /* an oversized frame, for the log line */
    ev_timer        hs_timer;
    xport_hs_t      hs;
    int             hs_step;
    uint8_t         hs_hello[UCX_HELLO_HDR]; /* our hello (a client's: with its MAC) */
    uint8_t         hs_proof[XPORT_HS_PROOF_LEN];
    ucx_send_t     *pending_head, *pending_tail; /* user sends before OPEN */
    ucx_send_t     *inflight;        /* doubly linked */
    ucx_rx_t       *rx_head, *rx_tail;
};

/* A client's hello for a new connection, taken out of the AM callback and
 * checked outside progress (ucx_incoming_accept). */
typedef struct ucx_incoming {
    struct ucx_incoming *next;
    uint32_t             src_slot, src_tag;
    uint8_t              hello[UCX_HELLO_HDR];
    size_t               addr_len;
    char                 addr[];     /* the client's worker address text, NUL-terminated */
} ucx_incoming_t;

struct ucx_xport {
    xport_t         base;            /* first */
    xport_config_t  cfg;
    char           *job_id;
    uint8_t        *secret;
    char           *listen_addr;
    ucp_context_h   ctx;
    ucp_worker_h    worker;
    char           *self_addr;       /* our worker's address text ("host:pid/HEX") */
    size_t          self_addr_len;
    char            self_label[XPORT_ADDR_MAX]; /* "host:pid" */
    bool            listening;       /* hellos for new connections are taken */
    int            *fds_base;        /* the descriptors open before ucp_init: any */
    size_t          n_fds_base;      /* newer one without close-on-exec is UCX's */
    ucx_peer_t     *peers;
    int             efd;
    ev_io           efd_io;
    ev_prepare      prepare;
    ev_idle         idle;
    ev_timer        poll;
    ucx_ep_t       *eps;
    base_freelist_t blks;            /* cached UCX_BLK-byte blocks (sends, receives) */
    ucx_ep_t      **slots;           /* connection ids: the endpoint of each slot, or NULL */
    uint32_t        nslots;
    uint64_t        stray;           /* data frames for no live connection (dropped) */
    ucx_incoming_t *incoming, *incoming_tail;
    unsigned        n_incoming;
    ucx_send_t     *done_head, *done_tail;
    unsigned        inflight;        /* sends + rndv receives + closes in UCX's hands */
    unsigned        events;
    int             dispatching;
};

static void ucx_dispatch(ucx_xport_t *x);

/* ---- helpers ---------------------------------------------------------- */

static bt_status_t ucx_status_map(ucs_status_t s)
{
    switch (s) {
    case UCS_OK: return BT_OK;
    case UCS_ERR_CANCELED: return BT_ERR_CANCELED;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED: return BT_ERR_PEER_UNREACH;
    case UCS_ERR_TIMED_OUT: return BT_ERR_PEER_TIMEOUT;
    /* UCS_ERR_ENDPOINT_TIMEOUT, CONNECTION_RESET, IO_ERROR: how UCX reports
     * a peer that closed or died */
    case UCS_ERR_NO_MEMORY: return BT_ERR_NOMEM;
    default: return BT_ERR_PEER_CLOSED;
    }
}

/* Send and receive records of up to UCX_BLK bytes (nearly all: a frame
 * header is small) come from a per-xport cache; it saves a calloc and a
 * free per message. Larger ones are allocated to size. Only the record's
 * struct part (zeroed bytes) is cleared; the caller fills the rest. */
#define UCX_BLK      640u
#define UCX_BLK_KEEP 256u

static void *ucx_blk_get(ucx_xport_t *x, size_t size, size_t zeroed)
{
    void *p = size <= UCX_BLK ? base_freelist_pop(&x->blks) : NULL;
    if (!p && !(p = malloc(size <= UCX_BLK ? UCX_BLK : size))) return NULL;
    memset(p, 0, zeroed);
    return p;
}

static void ucx_blk_put(ucx_xport_t *x, void *p, size_t size)
{
    if (size > UCX_BLK || !base_freelist_push(&x->blks, p)) free(p);
}

static void ucx_send_free(ucx_xport_t *x, ucx_send_t *s) { ucx_blk_put(x, s, s->blk_size); }
static void ucx_rx_free(ucx_xport_t *x, ucx_rx_t *r) { ucx_blk_put(x, r, r->blk_size); }

static void ucx_ep_hold(ucx_ep_t *ep) { ep->refs++; }

static void ucx_ep_unref(ucx_ep_t *ep)
{
    if (--ep->refs > 0) return;
    xport_hs_clear(&ep->hs);
    free(ep);
}

static void ucx_done_push(ucx_xport_t *x, ucx_send_t *s, bt_status_t st)
{
    s->status = st;
    s->done_next = NULL;
    if (x->done_tail) x->done_tail->done_next = s;
    else x->done_head = s;
    x->done_tail = s;
}

static int ucx_done_flush(ucx_xport_t *x)
{
    int n = 0;
    while (x->done_head) {
        ucx_send_t *s = x->done_head;
        x->done_head = s->done_next;
        if (!x->done_head) x->done_tail = NULL;
        if (s->done && !s->reported) s->done(s->arg, s->status);
        ucx_send_free(x, s);
        n++;
    }
    return n;
}

static void ucx_inflight_unlink(ucx_send_t *s)
{
    ucx_ep_t *ep = s->ep;
    if (!ep) return;
    if (s->prev) s->prev->next = s->next;
    else ep->inflight = s->next;
    if (s->next) s->next->prev = s->prev;
    s->prev = s->next = NULL;
}

static void ucx_pfx_write(uint8_t *p, uint32_t slot, uint32_t tag)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(slot >> (8 * i));
        p[4 + i] = (uint8_t)(tag >> (8 * i));
    }
}

static void ucx_pfx_read(const uint8_t *p, uint32_t *slot, uint32_t *tag)
{
    *slot = *tag = 0;
    for (int i = 0; i < 4; i++) {
        *slot |= (uint32_t)p[i] << (8 * i);
        *tag |= (uint32_t)p[4 + i] << (8 * i);
    }
}

/* Give ep a connection id: a free slot and a random tag (a frame for a slot
 * whose connection is gone, or was reused since, is then not delivered). */
static bool ucx_slot_take(ucx_xport_t *x, ucx_ep_t *ep)
{
    uint32_t i = 0;
    while (i < x->nslots && x->slots[i]) i++;
    if (i == x->nslots) {
        uint32_t n = x->nslots ? 2 * x->nslots : 16;
        ucx_ep_t **grown = realloc(x->slots, n * sizeof *grown);
        if (!grown) return false;
        memset(grown + x->nslots, 0, (n - x->nslots) * sizeof *grown);
        x->slots = grown;
        x->nslots = n;
    }
    if (getrandom(&ep->tag, sizeof ep->tag, 0) != (ssize_t)sizeof ep->tag) {
        log_error("ucx: getrandom: %s", strerror(errno));
        return false;
    }
    ep->slot = i;
    x->slots[i] = ep;
    return true;
}

static ucx_ep_t *ucx_slot_find(const ucx_xport_t *x, uint32_t slot, uint32_t tag)
{
    if (slot >= x->nslots) return NULL;
    ucx_ep_t *ep = x->slots[slot];
    return ep && ep->tag == tag ? ep : NULL;
}

static void ucx_wake(ucx_xport_t *x)
{
    if (!ev_is_active(&x->idle)) ev_idle_start(x->cfg.loop, &x->idle);
}

/* ---- addresses and peers ------------------------------------------------ */

static bool ucx_label_char(int c) { return isalnum(c) || c == '.' || c == '-' || c == '_' || c == ':'; }

static int ucx_hex_val(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* "host:pid/HEX" -> label ("host:pid") and, when bin is not NULL, the
 * worker address bytes (malloc'd). The text may come from a peer (a
 * hello that passed its MAC) or the caller: checked to the last byte. */
static bt_status_t ucx_addr_parse(const char *text, size_t len, char *label, size_t label_cap, uint8_t **bin,
                                  size_t *bin_len, char *why, size_t why_cap)
{
    const char *slash = memchr(text, '/', len);
    size_t lab = slash ? (size_t)(slash - text) : 0, hex = slash ? len - lab - 1 : 0;
    if (len >= XPORT_LISTEN_ADDR_MAX) {
        snprintf(why, why_cap, "%zu bytes, more than %u", len, XPORT_LISTEN_ADDR_MAX - 1);
        return BT_ERR_INVALID;
    }
    if (!slash || lab == 0 || lab >= label_cap || lab >= XPORT_ADDR_MAX) {
        snprintf(why, why_cap, "expected host:pid/HEX (a ucx listen address)");
        return BT_ERR_INVALID;
    }
    for (size_t i = 0; i < lab; i++)
        if (!ucx_label_char((unsigned char)text[i])) {
            snprintf(why, why_cap, "byte 0x%02x at %zu in the host:pid part", (unsigned char)text[i], i);
            return BT_ERR_INVALID;
        }
    if (hex == 0 || hex % 2) {
        snprintf(why, why_cap, "the worker address has %zu hex digits, expected a positive even count", hex);
        return BT_ERR_INVALID;
    }
    for (size_t i = 0; i < hex; i++)
        if (ucx_hex_val((unsigned char)slash[1 + i]) < 0) {
            snprintf(why, why_cap, "byte 0x%02x at %zu is no hex digit", (unsigned char)slash[1 + i], lab + 1 + i);
            return BT_ERR_INVALID;
        }
    memcpy(label, text, lab);
    label[lab] = '\0';
    if (!bin) return BT_OK;
    uint8_t *b = malloc(hex / 2);
    if (!b) {
        snprintf(why, why_cap, "out of memory");
        return BT_ERR_NOMEM;
    }
    for (size_t i = 0; i < hex / 2; i++)
        b[i] = (uint8_t)(ucx_hex_val((unsigned char)slash[1 + 2 * i]) << 4 | ucx_hex_val((unsigned char)slash[2 + 2 * i]));
    *bin = b;
    *bin_len = hex / 2;
    return BT_OK;
}

/* Our worker's address as text, for listen() and for every hello. */
static bt_status_t ucx_self_addr_make(ucx_xport_t *x)
{
    char host[64];
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    size_t h = 0;
    for (; host[h] && h < 48; h++)
        if (!ucx_label_char((unsigned char)host[h]) || host[h] == ':') host[h] = '_';
    host[h] = '\0';
    snprintf(x->self_label, sizeof x->self_label, "%s:%ld", host, (long)getpid());
    ucp_address_t *a;
    size_t alen;
    ucs_status_t s = ucp_worker_get_address(x->worker, &a, &alen);
    if (s != UCS_OK) {
        log_error("ucx: ucp_worker_get_address: %s", ucs_status_string(s));
        return BT_ERR_IO;
    }
    size_t lab = strlen(x->self_label);
    if (lab + 1 + 2 * alen + 1 > XPORT_LISTEN_ADDR_MAX) {
        log_error("ucx: the worker address has %zu bytes; more than an address text holds (%u)", alen,
                  XPORT_LISTEN_ADDR_MAX);
        ucp_worker_release_address(x->worker, a);
        return BT_ERR_INVALID;
    }
    x->self_addr = malloc(lab + 1 + 2 * alen + 1);
    if (!x->self_addr) {
        ucp_worker_release_address(x->worker, a);
        return BT_ERR_NOMEM;
    }
    static const char digits[] = "0123456789abcdef";
    char *p = x->self_addr + sprintf(x->self_addr, "%s/", x->self_label);
    for (size_t i = 0; i < alen; i++) {
        *p++ = digits[((const uint8_t *)a)[i] >> 4];
        *p++ = digits[((const uint8_t *)a)[i] & 15];
    }
    *p = '\0';
    x->self_addr_len = (size_t)(p - x->self_addr);
    ucp_worker_release_address(x->worker, a);
    return BT_OK;
}

static void ucx_err_cb(void *arg, ucp_ep_h uep, ucs_status_t status);

/* Close-on-exec for what UCX opened since create. Everything else in this
 * program opens its descriptors close-on-exec, so a newer one without it
 * is UCX's: made in create, in ucp_ep_create, or inside progress (an
 * endpoint a peer's wireup created, its keepalive timer, an accepted tcp
 * connection). Called where such a descriptor may have appeared: create,
 * every UCX endpoint we make, every connection accepted or opened. */
static void ucx_fds_cloexec(ucx_xport_t *x)
{
    if (x->fds_base) base_fd_cloexec_new(x->fds_base, x->n_fds_base);
}

/* The live UCX endpoint to the worker at addr (text, already parsed), made
 * if there is none; one more user on it. */
static bt_status_t ucx_peer_get(ucx_xport_t *x, const char *addr, size_t len, ucx_peer_t **out, char *why,
                                size_t why_cap)
{
    for (ucx_peer_t *p = x->peers; p; p = p->next) {
        if (!p->failed && strlen(p->addr) == len && !memcmp(p->addr, addr, len)) {
            p->users++;
            *out = p;
            return BT_OK;
        }
    }
    char label[XPORT_ADDR_MAX];
    uint8_t *bin;
    size_t bin_len;
    bt_status_t st = ucx_addr_parse(addr, len, label, sizeof label, &bin, &bin_len, why, why_cap);
    if (st != BT_OK) return st;
    ucx_peer_t *p = calloc(1, sizeof *p);
    if (!p || !(p->addr = strndup(addr, len))) {
        free(p);
        free(bin);
        snprintf(why, why_cap, "out of memory");
        return BT_ERR_NOMEM;
    }
    p->x = x;
    ucp_ep_params_t prm = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                      | UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)bin,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = ucx_err_cb, .arg = p},
    };
    ucs_status_t s = ucp_ep_create(x->worker, &prm, &p->uep);
    ucx_fds_cloexec(x); /* the keepalive timer, what it attached */
    free(bin);
    if (s != UCS_OK) {
        snprintf(why, why_cap, "ucp_ep_create: %s", ucs_status_string(s));
        free(p->addr);
        free(p);
        return s == UCS_ERR_NO_MEMORY ? BT_ERR_NOMEM : BT_ERR_PEER_UNREACH;
    }
    p->users = 1;
    p->next = x->peers;
    if (x->peers) x->peers->prev = p;
    x->peers = p;
    *out = p;
    return BT_OK;
}

static void ucx_peer_free(ucx_peer_t *p)
{
    free(p->addr);
    free(p);
}

static void ucx_peer_close_cb(void *request, ucs_status_t status, void *user_data)
{
    ucx_peer_t *p = user_data;
    ucp_request_free(request);
    p->x->inflight--;
    ucx_peer_free(p);
}

/* One user less; the last one closes the UCX endpoint: in order (flush)
 * while it works, at once when UCX reported it failed. */
static void ucx_peer_release(ucx_peer_t *p)
{
    if (--p->users > 0) return;
    ucx_xport_t *x = p->x;
    if (p->prev) p->prev->next = p->next;
    else x->peers = p->next;
    if (p->next) p->next->prev = p->prev;
    p->prev = p->next = NULL;
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA
                        | (p->failed ? UCP_OP_ATTR_FIELD_FLAGS : 0),
        .cb.send = ucx_peer_close_cb,
        .user_data = p,
        .flags = p->failed ? UCP_EP_CLOSE_FLAG_FORCE : 0,
    };
    ucs_status_ptr_t r = ucp_ep_close_nbx(p->uep, &prm);
    if (r && !UCS_PTR_IS_ERR(r)) {
        x->inflight++;  /* ucx_peer_close_cb frees it */
    } else {
        ucx_peer_free(p);
    }
    ucx_wake(x);
}

/* ---- UCX callbacks (inside ucp_worker_progress: record only) ----------- */

static void ucx_send_cb(void *request, ucs_status_t status, void *user_data)
{
    ucx_send_t *s = user_data;
    ucp_request_free(request);
    s->x->inflight--;
    ucx_inflight_unlink(s);
    ucx_done_push(s->x, s, ucx_status_map(status));
}

static void ucx_rx_free_buf(ucx_xport_t *x, void *buf, size_t len)
{
    if (!buf) return;
    if (x->cfg.cbs.free) x->cfg.cbs.free(x->cfg.cbs.arg, buf, len);
    else free(buf);
}

static void ucx_recv_data_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    ucx_rx_t *r = user_data;
    ucp_request_free(request);
    r->x->inflight--;
    r->req = NULL;
    if (r->orphan) {
        ucx_rx_free_buf(r->x, r->buf, r->len);
        ucx_rx_free(r->x, r);
        return;
    }
    r->ucs = status;
    r->status = status == UCS_OK && length == r->len ? BT_OK
              : status == UCS_OK ? BT_ERR_PEER_PROTO : ucx_status_map(status);
    r->ready = true;
}

/* The UCX endpoint to a remote worker failed: so did every connection on
 * it (reported from the loop, after the frames that are already here). */
static void ucx_err_cb(void *arg, ucp_ep_h uep, ucs_status_t status)
{
    ucx_peer_t *p = arg;
    if (p->users == 0) return; /* being closed: nobody to tell */
    if (!p->failed) {
        p->failed = true;
        p->fail_ucs = status;
    }
    for (ucx_ep_t *ep = p->x->eps; ep; ep = ep->next) {
        if (ep->peer != p) continue;
        if (ep->fail_pending == BT_OK) {
            ep->fail_pending = ucx_status_map(status);
            ep->fail_ucs = status;
        }
        if (ep->fail_pending == BT_ERR_CANCELED) ep->fail_pending = BT_ERR_PEER_CLOSED;
    }
}

/* A client's hello for a new connection: kept for ucx_incoming_accept,
 * which checks it outside progress. Bounded: at most XPORT_HS_PENDING_MAX
 * wait (each holds up to an address text). */
static void ucx_incoming_add(ucx_xport_t *x, uint32_t src_slot, uint32_t src_tag, const uint8_t *hello,
                             size_t hello_len, const void *data, size_t length)
{
    if (!x->listening) {
        x->stray++;
        log_debug("ucx: a hello for a new connection, but we do not listen: dropped");
        return;
    }
    if (hello_len != UCX_HELLO_HDR || length == 0 || length >= XPORT_LISTEN_ADDR_MAX) {
        x->stray++;
        log_warn("ucx: dropping a malformed hello (%zu header, %zu address bytes)", hello_len, length);
        return;
    }
    if (x->n_incoming >= XPORT_HS_PENDING_MAX) {
        x->stray++;
        log_warn("ucx: dropping a hello on %s: %u already wait to be checked", x->self_label, x->n_incoming);
        return;
    }
    ucx_incoming_t *c = malloc(sizeof *c + length + 1);
    if (!c) return;
    c->next = NULL;
    c->src_slot = src_slot;
    c->src_tag = src_tag;
    memcpy(c->hello, hello, UCX_HELLO_HDR);
    memcpy(c->addr, data, length);
    c->addr[length] = '\0';
    c->addr_len = length;
    if (x->incoming_tail) x->incoming_tail->next = c;
    else x->incoming = c;
    x->incoming_tail = c;
    x->n_incoming++;
}

static ucs_status_t ucx_am_cb(void *arg, const void *header, size_t header_length, void *data,
                              size_t length, const ucp_am_recv_param_t *param, uint8_t kind)
{
    bool is_hs = kind == UCX_AM_HS;
    ucx_xport_t *x = arg;
    size_t pfx = is_hs ? UCX_HS_PFX_LEN : UCX_PFX_LEN;
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    uint32_t slot = 0, tag = 0, src_slot = 0, src_tag = 0;
    if (header_length < pfx || (kind != UCX_AM_DATA && rndv)) {
        /* no connection id, or a handshake/close message as rendezvous
         * (ours go eager): nobody to deliver it to or to blame */
        x->stray++;
        log_warn("ucx: dropping a %zu+%zu-byte %s message without a connection id", header_length, length,
                 is_hs ? "handshake" : kind == UCX_AM_BYE ? "close" : "data");
        return UCS_OK;
    }
    ucx_pfx_read(header, &slot, &tag);
    if (is_hs) ucx_pfx_read((const uint8_t *)header + UCX_PFX_LEN, &src_slot, &src_tag);
    if (is_hs && slot == UCX_SLOT_NEW) {
        ucx_incoming_add(x, src_slot, src_tag, (const uint8_t *)header + pfx, header_length - pfx, data, length);
        return UCS_OK;
    }
    ucx_ep_t *ep = ucx_slot_find(x, slot, tag);
    if (!ep) {
        /* a frame for a connection closed here while the peer was still
         * sending, or a forged id */
        x->stray++;
        if (slot < x->nslots)
            log_debug("ucx: dropping a %zu+%zu-byte frame for closed connection %u/%08x",
                      header_length, length, slot, tag);
        else
            log_warn("ucx: dropping a %zu+%zu-byte frame for unknown connection %u/%08x",
                     header_length, length, slot, tag);
        return UCS_OK;
    }
    /* Dropped: a dead endpoint, or one we are failing for a reason of our
     * own. A peer that closed (fail_ucs set) still gets its last frames
     * delivered: UCX's failure notice travels apart from the data and can
     * come first. */
    if (ep->state == UEP_DEAD || (ep->fail_pending != BT_OK && ep->fail_ucs == UCS_OK))
        return UCS_OK;
    header = (const uint8_t *)header + pfx;
    header_length -= pfx;
    if (header_length > XPORT_HDR_MAX || header_length > x->cfg.max_frame
        || length > x->cfg.max_frame - header_length) {
        ep->fail_pending = BT_ERR_PEER_PROTO;
        ep->bad_hdr = header_length;
        ep->bad_len = length;
        return UCS_OK;
    }
    size_t r_size = sizeof(ucx_rx_t) + header_length;
    ucx_rx_t *r = ucx_blk_get(x, r_size, sizeof *r);
    if (!r) {
        ep->fail_pending = BT_ERR_NOMEM;
        return UCS_OK;
    }
    r->x = x;
    r->blk_size = r_size;
    r->kind = kind;
    r->rndv = rndv;
    r->pfx_slot = src_slot;
    r->pfx_tag = src_tag;
    r->len = kind == UCX_AM_DATA ? length : 0;
    r->hdr_len = header_length;
    memcpy(r->hdr, header, header_length);
    ucs_status_t ret = UCS_OK;
    if (kind == UCX_AM_DATA && length > 0) {
        if (rndv || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA)) {
            r->desc = data; /* kept: released or received outside progress */
            ret = UCS_INPROGRESS;
        } else {
            /* not persistent (should not happen with PERSISTENT_DATA): copy now */
            r->buf = malloc(length);
            if (!r->buf) {
                ucx_rx_free(x, r);
                ep->fail_pending = BT_ERR_NOMEM;
                return UCS_OK;
            }
            memcpy(r->buf, data, length);
            r->desc = NULL;
        }
    }
    if (ep->rx_tail) ep->rx_tail->next = r;
    else ep->rx_head = r;
    ep->rx_tail = r;
    return ret;
}

static ucs_status_t ucx_am_data_cb(void *arg, const void *header, size_t header_length,
                                   void *data, size_t length, const ucp_am_recv_param_t *param)
{
    return ucx_am_cb(arg, header, header_length, data, length, param, UCX_AM_DATA);
}

static ucs_status_t ucx_am_bye_cb(void *arg, const void *header, size_t header_length,
                                  void *data, size_t length, const ucp_am_recv_param_t *param)
{
    return ucx_am_cb(arg, header, header_length, data, 0, param, UCX_AM_BYE);
}

/* length is kept: a client's hello carries its address as AM data */
static ucs_status_t ucx_am_hs_cb(void *arg, const void *header, size_t header_length,
                                 void *data, size_t length, const ucp_am_recv_param_t *param)
{
    return ucx_am_cb(arg, header, header_length, data, length, param, UCX_AM_HS);
}

/* ---- sends ------------------------------------------------------------ */

/* Hand a send to UCX. On immediate completion or error it goes to the done
 * list; otherwise it waits in the endpoint's in-flight list. */
static bt_status_t ucx_send_post(ucx_ep_t *ep, ucx_send_t *s)
{
    ucx_xport_t *x = ep->x;
    bool hs = s->am_id == UCX_AM_HS;
    if (!ep->peer) return BT_ERR_PEER_CLOSED;
    if (ep->peer_known) ucx_pfx_write(s->hdr, ep->peer_slot, ep->peer_tag);
    else ucx_pfx_write(s->hdr, UCX_SLOT_NEW, 0); /* a client's hello */
    if (hs) ucx_pfx_write(s->hdr + UCX_PFX_LEN, ep->slot, ep->tag);
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA
                        | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = ucx_send_cb,
        .user_data = s,
        /* handshake and close messages are small: eager, so that the
         * receiver has a hello's address inside its AM callback */
        .flags = s->am_id == UCX_AM_DATA ? 0 : UCP_AM_SEND_FLAG_EAGER,
    };
    const void *buf = NULL;
    size_t count = 0;
    if (s->iovcnt == 1) {
        buf = s->iov[0].buffer;
        count = s->iov[0].length;
    } else if (s->iovcnt > 1) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        prm.datatype = ucp_dt_make_iov();
        buf = s->iov;
        count = (size_t)s->iovcnt;
    }
    ucs_status_ptr_t r = ucp_am_send_nbx(ep->peer->uep, s->am_id, s->hdr, s->hdr_len, buf, count, &prm);
    if (r == NULL) {
        ucx_done_push(x, s, BT_OK);
        ucx_wake(x);
        return BT_OK;
    }
    if (UCS_PTR_IS_ERR(r)) {
        bt_status_t st = ucx_status_map(UCS_PTR_STATUS(r));
        if (s->am_id == UCX_AM_BYE) /* the peer may have closed first: harmless */
            log_debug("ucx: close message to %s not sent: %s", ep->base.peer_addr,
                      ucs_status_string(UCS_PTR_STATUS(r)));
        else
            log_error("ucx: send to %s failed: %s", ep->base.peer_addr,
                      ucs_status_string(UCS_PTR_STATUS(r)));
        return st;
    }
    s->ep = ep;
    s->prev = NULL;
    s->next = ep->inflight;
    if (ep->inflight) ep->inflight->prev = s;
    ep->inflight = s;
    x->inflight++;
    return BT_IN_PROGRESS;
}

static ucx_send_t *ucx_send_new(ucx_xport_t *x, unsigned am_id, const void *hdr, size_t hdr_len,
                                const struct iovec *iov, int iovcnt,
                                xport_send_done_fn done, void *arg)
{
    size_t iov_bytes = (size_t)iovcnt * sizeof(ucp_dt_iov_t);
    size_t pfx = am_id == UCX_AM_HS ? UCX_HS_PFX_LEN : UCX_PFX_LEN;
    size_t s_size = sizeof(ucx_send_t) + iov_bytes + pfx + hdr_len;
    ucx_send_t *s = ucx_blk_get(x, s_size, sizeof *s);
    if (!s) return NULL;
    s->blk_size = s_size;
    s->x = x;
    s->am_id = am_id;
    s->hdr = (uint8_t *)s->iov + iov_bytes; /* the prefix is written when the send is posted */
    if (hdr_len) memcpy(s->hdr + pfx, hdr, hdr_len);
    s->hdr_len = pfx + hdr_len;
    s->done = done;
    s->arg = arg;
    for (int i = 0; i < iovcnt; i++) {
        if (!iov[i].iov_len) continue;
        s->iov[s->iovcnt++] = (ucp_dt_iov_t){.buffer = iov[i].iov_base, .length = iov[i].iov_len};
        s->payload_len += iov[i].iov_len;
    }
    return s;
}

static bt_status_t ucx_send(xport_ep_t *base, const void *hdr, size_t hdr_len,
                            const struct iovec *iov, int iovcnt,
                            xport_send_done_fn done, void *arg)
{
    ucx_ep_t *ep = (ucx_ep_t *)base;
    ucx_xport_t *x = ep->x;
    if (ep->state == UEP_DEAD || ep->state == UEP_CLOSING || ep->fail_pending != BT_OK)
        return BT_ERR_PEER_CLOSED;
    size_t payload_len;
    bt_status_t st = xport_send_check(base, x->cfg.max_frame, hdr, hdr_len, iov, iovcnt, &payload_len);
    if (st != BT_OK) return st;
    ucx_send_t *s = ucx_send_new(x, UCX_AM_DATA, hdr, hdr_len, iov, iovcnt, done, arg);
    if (!s) return BT_ERR_NOMEM;
    if (ep->state != UEP_OPEN) { /* frames wait for the handshake */
        if (ep->pending_tail) ep->pending_tail->next = s;
        else ep->pending_head = s;
        ep->pending_tail = s;
        return BT_IN_PROGRESS;
    }
    st = ucx_send_post(ep, s);
    if (st != BT_OK && st != BT_IN_PROGRESS) {
        ucx_send_free(x, s);
        return st;
    }
    return BT_IN_PROGRESS;
}

/* A handshake message; data (a client's hello: its address) must outlive
 * the send (it is the xport's own). */
static bt_status_t ucx_hs_send(ucx_ep_t *ep, const uint8_t *msg, size_t len, const void *data, size_t data_len)
{
    struct iovec iov = {.iov_base = (void *)data, .iov_len = data_len};
    ucx_send_t *s = ucx_send_new(ep->x, UCX_AM_HS, msg, len, &iov, data_len ? 1 : 0, NULL, NULL);
    if (!s) return BT_ERR_NOMEM;
    bt_status_t st = ucx_send_post(ep, s);
    if (st != BT_OK && st != BT_IN_PROGRESS) ucx_send_free(ep->x, s);
    return st == BT_IN_PROGRESS ? BT_OK : st;
}

/* ---- endpoint teardown ------------------------------------------------ */

static void ucx_ep_unlink(ucx_ep_t *ep)
{
    ucx_xport_t *x = ep->x;
    if (ep->slot < x->nslots && x->slots[ep->slot] == ep) x->slots[ep->slot] = NULL;
    if (ep->prev) ep->prev->next = ep->next;
    else if (x->eps == ep) x->eps = ep->next;
    if (ep->next) ep->next->prev = ep->prev;
    ep->prev = ep->next = NULL;
}

static bt_status_t ucx_bye_send(ucx_ep_t *ep, uint8_t what);

/* Drop everything the endpoint still owns and its share of the UCX
 * endpoint. abort: the other end is not closing with us in order; tell it
 * (UCX_BYE_ABORT) when it can still hear us. */
static void ucx_ep_teardown(ucx_ep_t *ep, bt_status_t status, bool abort, bool report_now)
{
    ucx_xport_t *x = ep->x;
    ev_timer_stop(x->cfg.loop, &ep->hs_timer);
    if (abort && ep->peer && !ep->peer->failed && ep->peer_known && !ep->peer_aborted)
        (void)ucx_bye_send(ep, UCX_BYE_ABORT); /* its completion frees it (s->ep is cleared below) */
    ucx_ep_unlink(ep);
    /* sends that never reached UCX */
    while (ep->pending_head) {
        ucx_send_t *s = ep->pending_head;
        ep->pending_head = s->next;
        ucx_done_push(x, s, status);
    }
    ep->pending_tail = NULL;
    /* sends in UCX's hands: their UCX completion frees them; on failure the
     * owner hears about them now, before the error callback */
    for (ucx_send_t *s = ep->inflight; s;) {
        ucx_send_t *next = s->next;
        s->ep = NULL;
        s->prev = s->next = NULL;
        if (report_now && s->done && !s->reported) {
            s->reported = true;
            s->done(s->arg, status);
        }
        s = next;
    }
    ep->inflight = NULL;
    /* received messages not yet delivered */
    while (ep->rx_head) {
        ucx_rx_t *r = ep->rx_head;
        ep->rx_head = r->next;
        if (r->started && !r->ready && r->req) {
            r->orphan = true; /* its completion frees it */
            ucp_request_cancel(x->worker, r->req);
            continue;
        }
        if (r->desc) ucp_am_data_release(x->worker, r->desc);
        ucx_rx_free_buf(x, r->buf, r->len);
        ucx_rx_free(x, r);
    }
    ep->rx_tail = NULL;
    if (ep->peer) {
        ucx_peer_release(ep->peer);
        ep->peer = NULL;
    }
    ucx_wake(x);
}

static void ucx_ep_fail(ucx_ep_t *ep, bt_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The end of a close we began (ucx_close, destroy): no callback. abort:
 * the other end did not close with us in order (see ucx_ep_teardown). */
static void ucx_ep_close_finish(ucx_ep_t *ep, bool abort)
{
    if (ep->state == UEP_DEAD) return;
    ep->state = UEP_DEAD;
    ucx_ep_hold(ep);
    ucx_ep_teardown(ep, BT_ERR_CANCELED, abort, false);
    ep->refs--;                           /* the list's reference */
    ucx_ep_unref(ep);
}

static void ucx_ep_fail(ucx_ep_t *ep, bt_status_t status, const char *fmt, ...)
{
    if (ep->state == UEP_DEAD) return;
    ucx_xport_t *x = ep->x;
    ucx_ep_state_t was = ep->state;
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (was == UEP_CLOSING) {
        log_debug("ucx: closing %s: %s", ep->base.peer_addr, why);
        ucx_ep_close_finish(ep, true);
        return;
    }
    /* an orderly close by the peer (a BYE) is no failure: flush our ack */
    bool orderly = status == BT_ERR_PEER_CLOSED && ep->bye_seen;
    if (orderly)
        log_debug("ucx: peer %s (id %u) closed the connection", ep->base.peer_addr, ep->base.peer_id);
    else if (was == UEP_OPEN && status == BT_ERR_PEER_CLOSED)
        log_warn("ucx: peer %s (id %u) gone: %s", ep->base.peer_addr, ep->base.peer_id, why);
    else
        log_error("ucx: dropping peer %s (id %d, %s): %s [%s]", ep->base.peer_addr,
                  ep->base.peer_id == XPORT_PEER_ID_UNKNOWN ? -1 : (int)ep->base.peer_id,
                  was == UEP_OPEN ? "open" : "handshake", why, bt_status_str(status));
    ep->state = UEP_DEAD;
    ucx_ep_hold(ep);
    /* An orderly close keeps the UCX endpoint flushing (our ack must reach
     * the peer), and UCX goes on reading the buffers of our sends still in
     * its hands: their done() may come only from UCX's completion, since the
     * owner may free a buffer once it has fired (teardown's early report of
     * in-flight sends is for a forced close, after which UCX reads nothing).
     * The peer is alive and takes them in; a bounded wait, then force. */
    if (orderly && ep->inflight) {
        uint64_t deadline = clock_now_ns() + (uint64_t)(UCX_CLOSE_S * 1e9);
        while (ep->inflight && clock_now_ns() < deadline) ucp_worker_progress(x->worker);
        if (ep->inflight) {
            log_warn("ucx: peer %s closed but did not take our last frames within %.0f s; dropping them",
                     ep->base.peer_addr, UCX_CLOSE_S);
            orderly = false;
        }
    }
    ucx_done_flush(x);                    /* earlier completions first */
    ucx_ep_teardown(ep, status, !orderly, true);
    ucx_done_flush(x);
    if (was == UEP_OPEN) {
        if (x->cfg.cbs.error) x->cfg.cbs.error(x->cfg.cbs.arg, &ep->base, status);
    } else if (!ep->is_server) {
        if (x->cfg.cbs.connected) x->cfg.cbs.connected(x->cfg.cbs.arg, &ep->base, status);
    }
    ep->refs--;                           /* the list's reference */
    ucx_ep_unref(ep);
}

static bt_status_t ucx_bye_send(ucx_ep_t *ep, uint8_t what)
{
    ucx_send_t *s = ucx_send_new(ep->x, UCX_AM_BYE, &what, 1, NULL, 0, NULL, NULL);
    if (!s) return BT_ERR_NOMEM;
    bt_status_t st = ucx_send_post(ep, s);
    if (st != BT_OK && st != BT_IN_PROGRESS) ucx_send_free(ep->x, s);
    return st == BT_IN_PROGRESS ? BT_OK : st;
}

/* Orderly close of an open endpoint: a BYE after everything we sent, and
 * our share of the UCX endpoint stays until the peer acknowledges it. The
 * peer answers only once every frame before the BYE is in (rendezvous data
 * pulled): closing the UCX endpoint earlier would fail the peer's pulls,
 * and a flush does not wait for them (a shared-memory sender's part is done
 * once the data is in the peer's fifo). Anything else is dropped at once,
 * with an ABORT to the other end. */
static void ucx_close_begin(ucx_ep_t *ep)
{
    if (ep->state == UEP_OPEN && ep->fail_pending == BT_OK && ep->peer
        && ucx_bye_send(ep, UCX_BYE_REQ) == BT_OK) {
        ep->state = UEP_CLOSING;
        ev_timer_set(&ep->hs_timer, UCX_CLOSE_S, 0.0);
        ev_timer_start(ep->x->cfg.loop, &ep->hs_timer);
        return;
    }
    ucx_ep_close_finish(ep, true);
}

static void ucx_close(xport_ep_t *base)
{
    ucx_ep_t *ep = (ucx_ep_t *)base;
    if (ep->state == UEP_DEAD || ep->state == UEP_CLOSING) return;
    ucx_close_begin(ep);
}

/* ---- handshake -------------------------------------------------------- */

/* The handshake's deadline, or a close's. */
static void ucx_hs_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    ucx_ep_t *ep = w->data;
    ucx_xport_t *x = ep->x; /* ep is freed by the failure */
    if (ep->state == UEP_CLOSING) {
        log_warn("ucx: peer %s did not acknowledge our close within %.0f s; closing anyway",
                 ep->base.peer_addr, UCX_CLOSE_S);
        ucx_ep_close_finish(ep, true);
    } else {
        ucx_ep_fail(ep, BT_ERR_PEER_TIMEOUT, "handshake not finished within %u ms",
                    x->cfg.handshake_ms);
    }
    ucx_dispatch(x);
}

/* At debug level, which UCX transports carry the connection, from
 * ucp_ep_print_info's lane lines ("lane[1]:  3:sysv/memory.0 md[2] -> ...
 * am am_bw#0 keepalive"): "sysv/memory.0 (am am_bw#0 keepalive); ...". */
static void ucx_ep_log_lanes(const ucx_ep_t *ep)
{
    if (!log_enabled(LOG_DEBUG) || !ep->peer) return;
    char *text = NULL;
    size_t text_len = 0;
    FILE *f = open_memstream(&text, &text_len);
    if (!f) return;
    ucp_ep_print_info(ep->peer->uep, f);
    fclose(f);
    char out[512];
    size_t n = 0;
    out[0] = '\0';
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *lane = strstr(line, "lane[");
        char *colon = lane ? strchr(lane, ':') : NULL;
        char *arrow = strstr(line, "->");
        if (!colon || !arrow) continue; /* a line that names no transport */
        char tl[64] = "", roles[128] = "";
        const char *tl_at = strchr(colon + 1, ':'); /* "  3:sysv/memory.0 md[2]" */
        if (!tl_at || sscanf(tl_at + 1, "%63s", tl) != 1) continue;
        const char *r = arrow + 2 + strspn(arrow + 2, " "); /* "md[2]/sysv/sysdev[255] am ..." */
        r += strcspn(r, " ");
        snprintf(roles, sizeof roles, "%s", r + strspn(r, " "));
        int w = snprintf(out + n, sizeof out - n, "%s%s (%s)", n ? "; " : "", tl, roles);
        if (w < 0 || (size_t)w >= sizeof out - n) break;
        n += (size_t)w;
    }
    free(text);
    log_debug("ucx: connection to %s (id %u) runs over %s", ep->base.peer_addr, ep->hs.peer_id,
              n ? out : "(no lanes reported)");
}

static void ucx_hs_finish(ucx_ep_t *ep)
{
    ucx_ep_log_lanes(ep);
    ucx_xport_t *x = ep->x;
    ucx_fds_cloexec(x);
    ev_timer_stop(x->cfg.loop, &ep->hs_timer);
    ep->state = UEP_OPEN;
    ep->base.peer_id = ep->hs.peer_id;
    xport_hs_clear(&ep->hs);
    /* sends queued before the handshake go out first, in order */
    while (ep->pending_head && ep->state == UEP_OPEN) {
        ucx_send_t *s = ep->pending_head;
        ep->pending_head = s->next;
        if (!ep->pending_head) ep->pending_tail = NULL;
        s->next = NULL;
        bt_status_t st = ucx_send_post(ep, s);
        if (st != BT_OK && st != BT_IN_PROGRESS) ucx_done_push(x, s, st);
    }
    if (ep->is_server) {
        if (x->cfg.cbs.accept) x->cfg.cbs.accept(x->cfg.cbs.arg, &ep->base, ep->base.peer_id);
    } else {
        if (x->cfg.cbs.connected) x->cfg.cbs.connected(x->cfg.cbs.arg, &ep->base, BT_OK);
    }
}

static void ucx_hs_consume(ucx_ep_t *ep, const ucx_rx_t *r)
{
    char why[160];
    bt_status_t st;
    if (ep->state != UEP_HANDSHAKE) {
        ucx_ep_fail(ep, BT_ERR_PEER_PROTO, "handshake message after the handshake");
        return;
    }
    if (ep->hs_step == 0) { /* a client: the server's hello (the server read ours on accept) */
        if (r->hdr_len != XPORT_HS_HELLO_LEN) {
            ucx_ep_fail(ep, BT_ERR_PEER_PROTO, "handshake hello of %zu bytes", r->hdr_len);
            return;
        }
        st = xport_hs_hello_read(&ep->hs, r->hdr, why, sizeof why);
        if (st != BT_OK) {
            ucx_ep_fail(ep, st, "%s", why);
            return;
        }
        ep->peer_slot = r->pfx_slot;
        ep->peer_tag = r->pfx_tag;
        ep->peer_known = true;
        ep->hs_step = 1;
        xport_hs_proof_write(&ep->hs, ep->hs_proof);
        st = ucx_hs_send(ep, ep->hs_proof, sizeof ep->hs_proof, NULL, 0);
        if (st != BT_OK) ucx_ep_fail(ep, st, "cannot send the handshake proof");
        return;
    }
    if (r->pfx_slot != ep->peer_slot || r->pfx_tag != ep->peer_tag) {
        ucx_ep_fail(ep, BT_ERR_PEER_PROTO, "handshake proof under another connection id than the hello");
        return;
    }
    if (r->hdr_len != XPORT_HS_PROOF_LEN) {
        ucx_ep_fail(ep, BT_ERR_PEER_AUTH, "handshake proof of %zu bytes", r->hdr_len);
        return;
    }
    st = xport_hs_proof_check(&ep->hs, r->hdr, why, sizeof why);
    if (st != BT_OK) {
        ucx_ep_fail(ep, st, "%s", why);
        return;
    }
    if (ep->is_server) {
        xport_hs_proof_write(&ep->hs, ep->hs_proof);
        st = ucx_hs_send(ep, ep->hs_proof, sizeof ep->hs_proof, NULL, 0);
        if (st != BT_OK) {
            ucx_ep_fail(ep, st, "cannot send the handshake proof");
            return;
        }
    }
    ucx_hs_finish(ep);
}

/* ---- receive (outside progress) -------------------------------------- */

static void ucx_rx_release(xport_rx_t *rx)
{
    ucx_rx_t *r = (ucx_rx_t *)rx;
    ucx_rx_free_buf(r->x, r->buf, r->len);
    ucx_rx_free(r->x, r);
}

/* Choose the buffer for the FIFO head and start moving its data. */
static void ucx_rx_start(ucx_ep_t *ep, ucx_rx_t *r)
{
    ucx_xport_t *x = ep->x;
    r->started = true;
    if (r->len == 0) {
        r->ready = true;
        return;
    }
    if (r->buf) { /* copied in the callback already */
        void *p = x->cfg.cbs.alloc
            ? x->cfg.cbs.alloc(x->cfg.cbs.arg, &ep->base, r->hdr, r->hdr_len, r->len)
            : malloc(r->len);
        if (p) memcpy(p, r->buf, r->len);
        free(r->buf);
        r->buf = p;
        if (!p) {
            r->status = BT_ERR_PEER_PROTO;
            r->len = 0;
        }
        r->ready = true;
        return;
    }
    void *p = x->cfg.cbs.alloc
        ? x->cfg.cbs.alloc(x->cfg.cbs.arg, &ep->base, r->hdr, r->hdr_len, r->len)
        : malloc(r->len);
    if (!p) {
        r->status = BT_ERR_PEER_PROTO;
        r->ready = true;
        return;
    }
    r->buf = p;
    if (!r->rndv) {
        memcpy(p, r->desc, r->len);
        ucp_am_data_release(x->worker, r->desc);
        r->desc = NULL;
        r->ready = true;
        return;
    }
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.recv_am = ucx_recv_data_cb,
        .user_data = r,
    };
    void *desc = r->desc;
    r->desc = NULL; /* UCX owns it now, whatever happens */
    log_debug("ucx: rendezvous receive of %zu bytes from %s", r->len, ep->base.peer_addr);
    ucs_status_ptr_t q = ucp_am_recv_data_nbx(x->worker, desc, p, r->len, &prm);
    if (q == NULL) {
        r->ready = true;
    } else if (UCS_PTR_IS_ERR(q)) {
        r->ucs = UCS_PTR_STATUS(q);
        r->status = ucx_status_map(r->ucs);
        r->ready = true;
    } else {
        r->req = q;
        x->inflight++;
    }
}

/* A BYE from the peer: everything it sent before is in (the FIFO is in
 * order and the frames before it were delivered, their data pulled). */
static void ucx_bye_consume(ucx_ep_t *ep, uint8_t what)
{
    if (what == UCX_BYE_REQ && (ep->state == UEP_OPEN || ep->state == UEP_CLOSING)) {
        (void)ucx_bye_send(ep, UCX_BYE_ACK); /* goes out before our close's flush */
        if (ep->state == UEP_CLOSING) {      /* both closed at once */
            ucx_ep_close_finish(ep, false);
            return;
        }
        ep->bye_seen = true;
        ucx_ep_fail(ep, BT_ERR_PEER_CLOSED, "peer closed the connection");
        return;
    }
    if (what == UCX_BYE_ACK && ep->state == UEP_CLOSING) {
        ucx_ep_close_finish(ep, false);
        return;
    }
    if (what == UCX_BYE_ABORT) { /* the other end dropped the connection */
        ep->peer_aborted = true;
        if (ep->state == UEP_CLOSING) ucx_ep_close_finish(ep, false);
        else ucx_ep_fail(ep, BT_ERR_PEER_CLOSED, "peer dropped the connection");
        return;
    }
    ucx_ep_fail(ep, BT_ERR_PEER_PROTO, "unexpected close message %u (%s)", what,
                ep->state == UEP_OPEN ? "open" : "handshake");
}

static void ucx_ep_dispatch(ucx_ep_t *ep)
{
    ucx_xport_t *x = ep->x;
    /* A peer that closed or died may have sent frames that are already here
     * (eager data UCX holds for us): deliver those first, as tcp delivers the
     * bytes before the FIN, then report the failure. A collective whose peer
     * finished and exited otherwise lost that peer's last frames. */
    bool peer_gone = ep->fail_pending != BT_OK && ep->fail_ucs != UCS_OK;
    if (ep->fail_pending != BT_OK && !peer_gone && ep->state != UEP_DEAD) {
        if (ep->fail_pending == BT_ERR_PEER_PROTO)
            ucx_ep_fail(ep, ep->fail_pending,
                        "frame of %zu+%zu bytes refused (no connection prefix, or over the limit: hdr %u, frame %zu)",
                        ep->bad_hdr, ep->bad_len, XPORT_HDR_MAX, x->cfg.max_frame);
        else
            ucx_ep_fail(ep, ep->fail_pending, "out of memory for a frame");
        return;
    }
    if (peer_gone && !ep->fail_drained) {
        /* frames the peer sent (and flushed) before it closed may still sit
         * in a shared-memory fifo: take them in before reporting the end */
        ep->fail_drained = true;
        while (ucp_worker_progress(x->worker)) {}
    }
    while (ep->rx_head && ep->state != UEP_DEAD) {
        ucx_rx_t *r = ep->rx_head;
        if (r->kind == UCX_AM_HS) {
            ep->rx_head = r->next;
            if (!ep->rx_head) ep->rx_tail = NULL;
            ucx_hs_consume(ep, r);
            ucx_rx_free(x, r);
            continue;
        }
        if (r->kind == UCX_AM_BYE) {
            uint8_t what = r->hdr_len == 1 ? r->hdr[0] : 0;
            ep->rx_head = r->next;
            if (!ep->rx_head) ep->rx_tail = NULL;
            ucx_rx_free(x, r);
            ucx_bye_consume(ep, what);
            return;
        }
        if (ep->state == UEP_CLOSING) { /* we closed: nobody wants it */
            if (r->started && !r->ready) return; /* a pull begun before the close */
            ep->rx_head = r->next;
            if (!ep->rx_head) ep->rx_tail = NULL;
            if (r->desc) ucp_am_data_release(x->worker, r->desc);
            ucx_rx_free_buf(x, r->buf, r->len);
            ucx_rx_free(x, r);
            continue;
        }
        if (ep->state != UEP_OPEN) {
            ucx_ep_fail(ep, BT_ERR_PEER_AUTH, "frame before the handshake finished");
            return;
        }
        if (!r->started) ucx_rx_start(ep, r);
        if (ep->state == UEP_DEAD) return; /* alloc() closed it */
        if (!r->ready) {                   /* rendezvous still moving */
            if (peer_gone) break;          /* ... and never will */
            return;
        }
        ep->rx_head = r->next;
        if (!ep->rx_head) ep->rx_tail = NULL;
        if (r->status != BT_OK) {
            bt_status_t st = r->status;
            ucs_status_t ucs = r->ucs;
            size_t len = r->len;
            ucx_rx_free_buf(x, r->buf, r->len);
            ucx_rx_free(x, r);
            if (st == BT_ERR_PEER_PROTO)
                ucx_ep_fail(ep, st, "receiver refused a payload of %zu bytes", len);
            else
                ucx_ep_fail(ep, st, "receive of a %zu-byte payload failed: %s", len, ucs_status_string(ucs));
            return;
        }
        r->rx = (xport_rx_t){
            .hdr = r->hdr, .hdr_len = r->hdr_len,
            .payload = r->len ? r->buf : NULL, .payload_len = r->len,
            .release = ucx_rx_release, .priv = NULL,
        };
        x->events++;
        if (x->cfg.cbs.recv) x->cfg.cbs.recv(x->cfg.cbs.arg, &ep->base, &r->rx);
        else ucx_rx_release(&r->rx);
    }
    if (peer_gone && ep->state != UEP_DEAD)
        ucx_ep_fail(ep, ep->fail_pending, "UCX reports the endpoint failed: %s",
                    ucs_status_string(ep->fail_ucs));
}

static ucx_ep_t *ucx_ep_new(ucx_xport_t *x, bool is_server)
{
    ucx_ep_t *ep = calloc(1, sizeof *ep);
    if (!ep) return NULL;
    ep->base.ops = &xport_ucx_ops;
    ep->base.x = &x->base;
    ep->base.peer_id = XPORT_PEER_ID_UNKNOWN;
    ep->x = x;
    ep->refs = 1;
    ep->is_server = is_server;
    ep->state = UEP_HANDSHAKE;
    if (xport_hs_init(&ep->hs, is_server, x->job_id, x->secret, x->cfg.secret_len,
                      x->cfg.self_id) != BT_OK) {
        free(ep);
        return NULL;
    }
    if (!ucx_slot_take(x, ep)) {
        xport_hs_clear(&ep->hs);
        free(ep);
        return NULL;
    }
    ev_timer_init(&ep->hs_timer, ucx_hs_timer_cb, (double)x->cfg.handshake_ms / 1000.0, 0.0);
    ep->hs_timer.data = ep;
    ep->next = x->eps;
    if (x->eps) x->eps->prev = ep;
    x->eps = ep;
    return ep;
}

/* A new connection from a client (ucx_incoming_add): check its hello and
 * the MAC over its address before the address goes to UCX, then answer
 * with our hello. A hello that fails is dropped and logged: we have no
 * verified way back to its sender. */
static void ucx_incoming_accept(ucx_xport_t *x)
{
    while (x->incoming) {
        ucx_incoming_t *c = x->incoming;
        x->incoming = c->next;
        if (!x->incoming) x->incoming_tail = NULL;
        x->n_incoming--;
        unsigned pending = 0;
        for (ucx_ep_t *o = x->eps; o; o = o->next) pending += o->is_server && o->state == UEP_HANDSHAKE;
        char why[160], label[XPORT_ADDR_MAX];
        ucx_ep_t *ep = NULL;
        bt_status_t st;
        if (pending >= XPORT_HS_PENDING_MAX) {
            log_warn("ucx: refusing a peer on %s: %u peers already in their handshake", x->self_label, pending);
            goto next;
        }
        ucx_fds_cloexec(x); /* what the client's wireup made UCX open */
        if (!(ep = ucx_ep_new(x, true))) goto next;
        if ((st = xport_hs_hello_read(&ep->hs, c->hello, why, sizeof why)) != BT_OK
            || (st = xport_hs_hello_mac_check(&ep->hs, c->hello, c->addr, c->addr_len,
                                              c->hello + XPORT_HS_HELLO_LEN, why, sizeof why)) != BT_OK) {
            log_error("ucx: refusing a connection on %s: %s [%s]", x->self_label, why, bt_status_str(st));
            goto drop;
        }
        /* authenticated as made by a holder of the secret: the address is
         * safe to parse and hand to UCX */
        if ((st = ucx_addr_parse(c->addr, c->addr_len, label, sizeof label, NULL, NULL, why, sizeof why))
                != BT_OK
            || (st = ucx_peer_get(x, c->addr, c->addr_len, &ep->peer, why, sizeof why)) != BT_OK) {
            log_error("ucx: refusing a connection on %s from id %u: address: %s", x->self_label, ep->hs.peer_id,
                      why);
            goto drop;
        }
        snprintf(ep->base.peer_addr, sizeof ep->base.peer_addr, "%s", label);
        ep->peer_slot = c->src_slot;
        ep->peer_tag = c->src_tag;
        ep->peer_known = true;
        ep->hs_step = 1;
        ev_timer_start(x->cfg.loop, &ep->hs_timer);
        xport_hs_hello_write(&ep->hs, ep->hs_hello);
        st = ucx_hs_send(ep, ep->hs_hello, XPORT_HS_HELLO_LEN, NULL, 0);
        if (st != BT_OK) ucx_ep_fail(ep, st, "cannot send the handshake hello");
        goto next;
    drop:
        ucx_ep_close_finish(ep, false);
    next:
        free(c);
    }
}

/* Everything that runs user callbacks, outside ucp_worker_progress. */
static void ucx_dispatch(ucx_xport_t *x)
{
    if (x->dispatching) return; /* a callback called progress(): the outer pass continues */
    x->dispatching++;
    ucx_done_flush(x);
    ucx_ep_t *stack[64];
    ucx_ep_t **snap = stack;
    size_t n = 0, cap = 64;
    for (ucx_ep_t *ep = x->eps; ep; ep = ep->next) {
        if (!ep->rx_head && ep->fail_pending == BT_OK) continue;
        if (n == cap) {
            ucx_ep_t **grown = malloc(2 * cap * sizeof *grown);
            if (!grown) break;
            memcpy(grown, snap, n * sizeof *grown);
            if (snap != stack) free(snap);
            snap = grown;
            cap *= 2;
        }
        ucx_ep_hold(ep);
        snap[n++] = ep;
    }
    for (size_t i = 0; i < n; i++) {
        if (snap[i]->state != UEP_DEAD) ucx_ep_dispatch(snap[i]);
        ucx_ep_unref(snap[i]);
    }
    if (snap != stack) free(snap);
    /* new connections after the old ones' messages: an ABORT or BYE that
     * came first releases its UCX endpoint before a new hello from the
     * same worker looks for one to share */
    ucx_incoming_accept(x);
    ucx_done_flush(x);
    x->dispatching--;
}

static bool ucx_has_work(const ucx_xport_t *x)
{
    if (x->incoming || x->done_head) return true;
    for (const ucx_ep_t *ep = x->eps; ep; ep = ep->next)
        if (ep->fail_pending != BT_OK || (ep->rx_head && (!ep->rx_head->started || ep->rx_head->ready)))
            return true;
    return false;
}

static int ucx_poll(ucx_xport_t *x)
{
    unsigned before = x->events;
    int n = 0;
    for (int round = 0; round < 64; round++) {
        unsigned k = 0;
        while (ucp_worker_progress(x->worker)) k++;
        n += (int)k;
        bool work = ucx_has_work(x);
        if (work) ucx_dispatch(x);
        if (!k && !work) break;
    }
    return n + (int)(x->events - before);
}

/* ---- loop watchers ---------------------------------------------------- */

static void ucx_efd_cb(struct ev_loop *loop, ev_io *w, int revents) { ucx_poll(w->data); }

static void ucx_poll_cb(struct ev_loop *loop, ev_timer *w, int revents) { ucx_poll(w->data); }

static void ucx_idle_cb(struct ev_loop *loop, ev_idle *w, int revents)
{
    ev_idle_stop(loop, w);
    ucx_poll(w->data);
}

/* Before the loop blocks: progress until the worker can be armed, so that
 * the event fd reports the next event. */
static void ucx_prepare_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
    ucx_xport_t *x = w->data;
    /* A loop that spins on progress() will not block: no arming. Arming
     * while the peer keeps sending fails (UCS_ERR_BUSY) and costs a read of
     * each of the worker's event fds per attempt (a ping-pong's busy loops
     * made ~8 attempts per libev iteration, ~60,000 reads per 44,000
     * messages). */
    if (x->cfg.busy_poll && x->cfg.spinning && x->cfg.spinning(x->cfg.cbs.arg)) {
        /* Nor watching the event fd, which stays readable while unarmed: a
         * pending fd event would keep libev from running the spin (an idle
         * watcher) and make every iteration an epoll_wait. */
        if (ev_is_active(&x->efd_io)) ev_io_stop(loop, &x->efd_io);
        if (ev_is_active(&x->poll)) ev_timer_stop(loop, &x->poll);
        return;
    }
    if (!ev_is_active(&x->efd_io)) ev_io_start(loop, &x->efd_io);
    bool armed = false;
    for (int i = 0; i < 8 && !armed; i++) {
        ucx_poll(x);
        if (ucx_has_work(x)) continue;
        armed = ucp_worker_arm(x->worker) == UCS_OK;
    }
    if (!armed || ucx_has_work(x)) ucx_wake(x);
    /* some transports complete without an event: poll while busy */
    if (x->inflight && !ev_is_active(&x->poll)) ev_timer_start(loop, &x->poll);
    else if (!x->inflight && ev_is_active(&x->poll)) ev_timer_stop(loop, &x->poll);
}

/* ---- ops -------------------------------------------------------------- */

static void ucx_xport_free(ucx_xport_t *x)
{
    if (x->worker) ucp_worker_destroy(x->worker);
    if (x->ctx) ucp_cleanup(x->ctx);
    base_freelist_drain(&x->blks);
    free(x->slots);
    free(x->job_id);
    free(x->listen_addr);
    free(x->self_addr);
    free(x->fds_base);
    if (x->secret) memset(x->secret, 0, x->cfg.secret_len);
    free(x->secret);
    free(x);
}

/* Whether a UCX_TLS value may enable what setting `name` configures
 * ("TCP_..." tcp, "MM_..." shared memory, others everything). Only plain
 * lists are read: "", "all" and "^..." forms may enable anything. */
static bool ucx_tls_has(const char *tls, const char *name)
{
    static const char *const tcp[] = {"tcp", NULL}, *const mm[] = {"sm", "shm", "mm", "posix", "sysv", NULL};
    const char *const *which = !strncmp(name, "TCP_", 4) ? tcp : !strncmp(name, "MM_", 3) ? mm : NULL;
    if (!which || !tls[0] || tls[0] == '^') return true;
    char list[256];
    snprintf(list, sizeof list, "%s", tls);
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, "all")) return true;
        for (int k = 0; which[k]; k++)
            if (!strcmp(t, which[k])) return true;
    }
    return false;
}

static bt_status_t ucx_create(const xport_config_t *cfg, xport_t **out)
{
    if (!cfg || !cfg->loop || !cfg->job_id || !cfg->secret || cfg->secret_len == 0
        || cfg->secret_len > XPORT_SECRET_MAX || strlen(cfg->job_id) > XPORT_HS_JOB_MAX) {
        log_error("ucx: create needs a loop, a job id (<= %d bytes) and a secret (1..%d bytes)",
                  XPORT_HS_JOB_MAX, XPORT_SECRET_MAX);
        return BT_ERR_INVALID;
    }
    ucx_xport_t *x = calloc(1, sizeof *x);
    if (!x) return BT_ERR_NOMEM;
    x->base.ops = &xport_ucx_ops;
    x->base.caps = xport_ucx_ops.caps;
    x->cfg = *cfg;
    x->efd = -1;
    x->blks.max = UCX_BLK_KEEP;
    if (!x->cfg.max_frame) x->cfg.max_frame = UCX_DEFAULT_MAX_FRAME;
    if (!x->cfg.handshake_ms) x->cfg.handshake_ms = UCX_DEFAULT_HS_MS;
    x->job_id = strdup(cfg->job_id);
    x->listen_addr = strdup(cfg->listen_addr ? cfg->listen_addr : "127.0.0.1:0");
    x->secret = malloc(cfg->secret_len);
    if (!x->job_id || !x->listen_addr || !x->secret) {
        ucx_xport_free(x);
        return BT_ERR_NOMEM;
    }
    memcpy(x->secret, cfg->secret, cfg->secret_len);
    x->cfg.job_id = x->job_id;
    x->cfg.secret = x->secret;
    x->cfg.listen_addr = x->listen_addr;

    /* what UCX may open follows the listen host (see the top of this file) */
    char tls[32], devs[512];
    bt_status_t st = xport_ucx_net_select(x->listen_addr, NULL, tls, sizeof tls, devs, sizeof devs);
    if (st != BT_OK) {
        ucx_xport_free(x);
        return st;
    }
    /* UCX's descriptors: close-on-exec (see ucx_fds_cloexec) */
    if (base_fd_list(&x->fds_base, &x->n_fds_base) != BT_OK) {
        x->fds_base = NULL;
        log_warn("ucx: cannot list this process's descriptors; UCX's stay open across exec");
    }
    ucp_config_t *ucfg;
    ucs_status_t s = ucp_config_read(NULL, NULL, &ucfg);
    if (s != UCS_OK) {
        log_error("ucx: ucp_config_read: %s", ucs_status_string(s));
        goto fail;
    }
    const char *net[2][3] = {{"TLS", "UCX_TLS", tls}, {"NET_DEVICES", "UCX_NET_DEVICES", devs}};
    for (int i = 0; i < 2; i++) {
        if (!net[i][2][0] || getenv(net[i][1])) continue;
        s = ucp_config_modify(ucfg, net[i][0], net[i][2]);
        if (s != UCS_OK) {
            log_error("ucx: cannot set %s=%s: %s", net[i][1], net[i][2], ucs_status_string(s));
            ucp_config_release(ucfg);
            goto fail;
        }
    }
    /* shared memory between the processes of a host, in error-handling mode
     * (see the top of this file); an explicit environment setting wins. A
     * setting for a transport UCX_TLS leaves out would only make UCX warn. */
    const char *tls_on = getenv("UCX_TLS") ? getenv("UCX_TLS") : tls;
    for (int i = 0; i < XPORT_UCX_NSETTINGS; i++) {
        const xport_ucx_setting_t *set = &xport_ucx_settings[i];
        if (xport_ucx_setting_from_env(i) || !ucx_tls_has(tls_on, set->name)) continue;
        s = ucp_config_modify(ucfg, set->key, set->value);
        if (s != UCS_OK)
            log_warn("ucx: cannot set UCX_%s=%s: %s", set->name, set->value, ucs_status_string(s));
    }
    ucp_params_t prm = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .name = "baton",
    };
    s = ucp_init(&prm, ucfg, &x->ctx);
    ucp_config_release(ucfg);
    if (s != UCS_OK) {
        log_error("ucx: ucp_init: %s", ucs_status_string(s));
        x->ctx = NULL;
        goto fail;
    }
    ucp_context_attr_t cattr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    if (ucp_context_query(x->ctx, &cattr) == UCS_OK
        && (cattr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)))
        x->base.caps |= XPORT_CAP_CUDA_MEM;
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    s = ucp_worker_create(x->ctx, &wp, &x->worker);
    if (s != UCS_OK) {
        log_error("ucx: ucp_worker_create: %s", ucs_status_string(s));
        x->worker = NULL;
        goto fail;
    }
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB
                      | UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
        .id = UCX_AM_DATA,
        .cb = ucx_am_data_cb,
        .arg = x,
        .flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA,
    };
    s = ucp_worker_set_am_recv_handler(x->worker, &hp);
    if (s == UCS_OK) {
        hp.id = UCX_AM_HS;
        hp.cb = ucx_am_hs_cb;
        hp.flags = UCP_AM_FLAG_WHOLE_MSG;
        s = ucp_worker_set_am_recv_handler(x->worker, &hp);
    }
    if (s == UCS_OK) {
        hp.id = UCX_AM_BYE;
        hp.cb = ucx_am_bye_cb;
        hp.flags = UCP_AM_FLAG_WHOLE_MSG;
        s = ucp_worker_set_am_recv_handler(x->worker, &hp);
    }
    if (s == UCS_OK) s = ucp_worker_get_efd(x->worker, &x->efd);
    if (s != UCS_OK) {
        log_error("ucx: worker setup: %s", ucs_status_string(s));
        goto fail;
    }
    if ((st = ucx_self_addr_make(x)) != BT_OK) goto fail;
    ucx_fds_cloexec(x);
    log_debug("ucx: worker %s (transports %s, devices %s)", x->self_label, tls[0] ? tls : "all",
              devs[0] ? devs : "all");
    ev_io_init(&x->efd_io, ucx_efd_cb, x->efd, EV_READ);
    x->efd_io.data = x;
    ev_io_start(cfg->loop, &x->efd_io);
    ev_prepare_init(&x->prepare, ucx_prepare_cb);
    x->prepare.data = x;
    ev_prepare_start(cfg->loop, &x->prepare);
    ev_idle_init(&x->idle, ucx_idle_cb);
    x->idle.data = x;
    ev_timer_init(&x->poll, ucx_poll_cb, UCX_POLL_S, UCX_POLL_S);
    x->poll.data = x;
    *out = &x->base;
    return BT_OK;
fail:
    ucx_fds_cloexec(x);
    ucx_xport_free(x);
    return st != BT_OK ? st : BT_ERR_UNSUPPORTED;
}

static void ucx_destroy(xport_t *base)
{
    ucx_xport_t *x = (ucx_xport_t *)base;
    /* no new peers */
    x->listening = false;
    while (x->incoming) {
        ucx_incoming_t *c = x->incoming;
        x->incoming = c->next;
        free(c);
    }
    x->incoming_tail = NULL;
    x->n_incoming = 0;
    /* Open endpoints close in order (ucx_close_begin): a peer gets all we
     * sent before destroy, as a TCP peer gets the bytes before the FIN.
     * Endpoints still in their handshake go at once. The wait is bounded,
     * so a dead or stuck peer cannot hold destroy. */
    for (ucx_ep_t *ep = x->eps, *next; ep; ep = next) {
        next = ep->next;
        if (ep->state == UEP_OPEN) ucx_close_begin(ep);
        else if (ep->state == UEP_HANDSHAKE) ucx_ep_close_finish(ep, true);
    }
    uint64_t deadline = clock_now_ns() + (uint64_t)(UCX_CLOSE_S * 1e9);
    while (x->eps && clock_now_ns() < deadline) ucx_poll(x);
    while (x->eps) {
        ucx_ep_t *ep = x->eps;
        log_warn("ucx: peer %s did not acknowledge our close at destroy", ep->base.peer_addr);
        ucx_ep_close_finish(ep, true);
    }
    /* every connection is gone, so every peer's UCX endpoint is closing;
     * let UCX finish the closes and cancellations it started */
    deadline = clock_now_ns() + 2000000000ull;
    while (x->inflight && clock_now_ns() < deadline) ucp_worker_progress(x->worker);
    if (x->inflight) log_warn("ucx: %u operations still in flight at destroy", x->inflight);
    if (x->peers) log_warn("ucx: a peer endpoint outlived its connections at destroy");
    ucx_done_flush(x);
    ev_io_stop(x->cfg.loop, &x->efd_io);
    ev_prepare_stop(x->cfg.loop, &x->prepare);
    ev_idle_stop(x->cfg.loop, &x->idle);
    ev_timer_stop(x->cfg.loop, &x->poll);
    ucx_xport_free(x);
}

/* No socket: from now on hellos for new connections are taken. The
 * address is the worker's (see the top of this file). */
static bt_status_t ucx_listen(xport_t *base, char *addr, size_t addr_cap)
{
    ucx_xport_t *x = (ucx_xport_t *)base;
    if (x->self_addr_len + 1 > addr_cap) {
        log_error("ucx: the listen address (%zu bytes) does not fit in %zu", x->self_addr_len + 1, addr_cap);
        return BT_ERR_INVALID;
    }
    memcpy(addr, x->self_addr, x->self_addr_len + 1);
    x->listening = true;
    return BT_OK;
}

static bt_status_t ucx_connect(xport_t *base, const char *addr, xport_ep_t **out)
{
    ucx_xport_t *x = (ucx_xport_t *)base;
    char why[160], label[XPORT_ADDR_MAX];
    size_t len = addr ? strnlen(addr, XPORT_LISTEN_ADDR_MAX) : 0;
    bt_status_t st = addr ? ucx_addr_parse(addr, len, label, sizeof label, NULL, NULL, why, sizeof why)
                          : BT_ERR_INVALID;
    if (st != BT_OK) {
        log_error("ucx: connect to '%.60s%s': %s", addr ? addr : "(null)", len > 60 ? "..." : "",
                  addr ? why : "no address");
        return st;
    }
    ucx_ep_t *ep = ucx_ep_new(x, false);
    if (!ep) return BT_ERR_NOMEM;
    snprintf(ep->base.peer_addr, sizeof ep->base.peer_addr, "%s", label);
    st = ucx_peer_get(x, addr, len, &ep->peer, why, sizeof why);
    if (st != BT_OK) {
        log_error("ucx: connect to %s: %s", label, why);
        ucx_ep_unlink(ep);
        ucx_ep_unref(ep);
        return st == BT_ERR_NOMEM ? st : BT_ERR_PEER_UNREACH;
    }
    /* the hello (with our address and its MAC) goes out once UCX has wired
     * the endpoint up; failures come back through the error callback,
     * reported from the loop */
    ev_timer_start(x->cfg.loop, &ep->hs_timer);
    xport_hs_hello_write(&ep->hs, ep->hs_hello);
    if (xport_hs_hello_mac_write(&ep->hs, ep->hs_hello, x->self_addr, x->self_addr_len,
                                 ep->hs_hello + XPORT_HS_HELLO_LEN) != BT_OK
        || ucx_hs_send(ep, ep->hs_hello, UCX_HELLO_HDR, x->self_addr, x->self_addr_len) != BT_OK)
        ep->fail_pending = BT_ERR_PEER_UNREACH;
    ucx_wake(x);
    *out = &ep->base;
    return BT_IN_PROGRESS;
}

/* A busy loop's poll: one ucp_worker_progress, then what it delivered. Not
 * ucx_poll's progress-until-idle: where UCX runs a socket-based lane (the
 * environment may enable one) every progress costs an epoll_wait, so the
 * extra empty progress after each event would be a syscall per message;
 * the busy loop calls again at once anyway. */
static int ucx_progress(xport_t *base)
{
    ucx_xport_t *x = (ucx_xport_t *)base;
    unsigned before = x->events;
    int n = (int)ucp_worker_progress(x->worker);
    if (ucx_has_work(x)) ucx_dispatch(x);
    return n + (int)(x->events - before);
}

static uint32_t ucx_ep_peer_id(const xport_ep_t *ep) { return ep->peer_id; }

const xport_ops_t xport_ucx_ops = {
    .name       = "ucx",
    .caps       = XPORT_CAP_HOST_MEM,
    .create     = ucx_create,
    .destroy    = ucx_destroy,
    .listen     = ucx_listen,
    .connect    = ucx_connect,
    .send       = ucx_send,
    .close      = ucx_close,
    .progress   = ucx_progress,
    .ep_peer_id = ucx_ep_peer_id,
};
