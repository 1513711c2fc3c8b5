/* Transports behind one ops table (STYLE.md rule 2).
 *
 * A transport moves opaque frames between two processes (or two loops of one
 * process). A frame is a header (the msgpack envelope, opaque here: the
 * transport never parses it) followed by a payload given as an iovec on the
 * send side and delivered as one contiguous buffer on the receive side. The
 * receiver picks the payload buffer (xport_cbs_t.alloc) before the payload
 * moves, so large payloads land where the receiver wants them (rendezvous).
 *
 * Layering: this folder uses only libev, UCX, OpenSSL (HMAC) and base/.
 * Every call made from a loop is non-blocking: connect and send return
 * BT_IN_PROGRESS and finish in a callback (STYLE.md rule 3).
 *
 * Threading: an xport_t belongs to the libev loop it was created with; all
 * calls on it and its endpoints come from that loop's thread, and all
 * callbacks run on it.
 *
 * Every connection starts with an authenticated handshake (job id + HMAC over
 * a per-job secret, see handshake.h); only a peer that passes it is reported
 * through accept/connected, and no frame of a peer that failed it is delivered.
 */
#ifndef BT_TRANSPORT_XPORT_H
#define BT_TRANSPORT_XPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "base/status.h"

struct ev_loop;

typedef enum {
    XPORT_INPROC = 0,
    XPORT_TCP,
    XPORT_UCX,
    XPORT_KIND_COUNT,
} xport_kind_t;

/* capability bits (xport_ops_t.caps) */
#define XPORT_CAP_HOST_MEM  (1u << 0)
#define XPORT_CAP_CUDA_MEM  (1u << 1) /* payload may be device memory (UCX built with CUDA) */
#define XPORT_CAP_ZERO_COPY (1u << 2) /* receiver sees the sender's buffer (inproc) */

typedef struct xport xport_t;       /* one instance: (process, loop, kind) */
typedef struct xport_ep xport_ep_t; /* one connection to one peer */

/* A received frame. The header is valid only during the recv callback; the
 * payload belongs to the receiver until it calls xport_rx_release(), which
 * returns it to whoever allocated it (the receiver's alloc callback's buffer
 * is released through cbs.free; for zero-copy inproc the sender's send
 * completion fires on release). */
typedef struct xport_rx {
    const void *hdr;
    size_t      hdr_len;
    void       *payload;     /* NULL when payload_len == 0 */
    size_t      payload_len;
    void      (*release)(struct xport_rx *rx); /* set by the transport */
    void       *priv;        /* transport private */
} xport_rx_t;

static inline void xport_rx_release(xport_rx_t *rx) { rx->release(rx); }

typedef struct {
    void *arg;
    /* A peer connected to our listener and passed the handshake. */
    void  (*accept)(void *arg, xport_ep_t *ep, uint32_t peer_id);
    /* Our connect() finished: status BT_OK or a peer error. */
    void  (*connected)(void *arg, xport_ep_t *ep, bt_status_t status);
    /* Destination for an incoming payload, chosen by the receiver. Return NULL
     * to refuse the frame (the connection is closed with BT_ERR_PEER_PROTO).
     * When alloc is NULL the transport uses malloc/free. */
    void *(*alloc)(void *arg, xport_ep_t *ep, const void *hdr, size_t hdr_len,
                   size_t payload_len);
    void  (*free)(void *arg, void *payload, size_t payload_len);
    /* A whole frame arrived. Frames of one endpoint arrive in send order. */
    void  (*recv)(void *arg, xport_ep_t *ep, xport_rx_t *rx);
    /* The endpoint failed or the peer closed/died. Called once per endpoint;
     * pending sends complete with the same status first; ep is freed after
     * this returns. */
    void  (*error)(void *arg, xport_ep_t *ep, bt_status_t why);
} xport_cbs_t;

typedef struct {
    struct ev_loop *loop;
    const char     *job_id;       /* must match on both sides */
    const uint8_t  *secret;       /* per-job secret; never on a command line */
    size_t          secret_len;
    uint32_t        self_id;      /* our id, sent in the handshake (e.g. rank) */
    const char     *listen_addr;  /* "host:port"; NULL -> "127.0.0.1:0" */
    size_t          max_frame;    /* bytes of header+payload; 0 -> 1 GiB */
    bool            busy_poll;    /* spin on progress while sends are in flight */
    xport_cbs_t     cbs;
} xport_config_t;

typedef void (*xport_send_done_fn)(void *arg, bt_status_t status);

typedef struct xport_ops {
    const char *name;
    unsigned    caps;
    bt_status_t (*create)(const xport_config_t *cfg, xport_t **out);
    void        (*destroy)(xport_t *x);     /* closes every endpoint */
    /* Start listening; write the address peers pass to connect(). */
    bt_status_t (*listen)(xport_t *x, char *addr, size_t addr_cap);
    /* BT_IN_PROGRESS, then cbs.connected. *ep is valid at once (sends queue). */
    bt_status_t (*connect)(xport_t *x, const char *addr, xport_ep_t **ep);
    /* Send hdr + payload. BT_IN_PROGRESS, then done(arg, status) once the
     * caller may reuse the buffers. Buffers must stay valid until then. */
    bt_status_t (*send)(xport_ep_t *ep, const void *hdr, size_t hdr_len,
                        const struct iovec *iov, int iovcnt,
                        xport_send_done_fn done, void *arg);
    void        (*close)(xport_ep_t *ep);   /* no error callback for a local close */
    /* Make progress without waiting; returns how many events were handled.
     * The libev watchers call this too; busy loops call it directly. */
    int         (*progress)(xport_t *x);
    uint32_t    (*ep_peer_id)(const xport_ep_t *ep);
} xport_ops_t;

extern const xport_ops_t xport_inproc_ops;
extern const xport_ops_t xport_tcp_ops;
extern const xport_ops_t xport_ucx_ops; /* present when built with UCX */

/* Ops for a kind, or NULL when that transport is not built. */
const xport_ops_t *xport_ops_get(xport_kind_t kind);
/* "inproc"|"tcp"|"ucx"|"auto" -> kind; auto is resolved by the caller
 * (actors/) because it depends on where the peer lives. */
bt_status_t xport_kind_parse(const char *name, xport_kind_t *kind, bool *is_auto);
const char *xport_kind_name(xport_kind_t kind);

#endif
