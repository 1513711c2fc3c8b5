/* Transports behind one ops table (CONVENTIONS.md: ops tables).
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
 * BT_IN_PROGRESS and finish in a callback (CONVENTIONS.md: loops never block).
 *
 * Threading: an xport_t belongs to the libev loop it was created with; all
 * calls on it and its endpoints come from that loop's thread, and all
 * callbacks run on it.
 *
 * Every connection starts with an authenticated handshake (job id + HMAC over
 * a per-job secret, see handshake.h); only a peer that passes it is reported
 * through accept/connected, and no frame of a peer that failed it is delivered.
 *
 * Callback contracts (all transports):
 *  - send() returns BT_IN_PROGRESS and then calls done() exactly once, never
 *    from inside send() itself; any other return means the send was not
 *    started and done() will not be called.
 *  - A callback may call send() and close() on any endpoint of its xport
 *    (the endpoint it was called for included). It must not call destroy().
 *  - Endpoint failure: pending sends complete with the failure status, then
 *    cbs.error(ep) fires once, then ep is freed. For an outgoing connection
 *    that fails before its handshake completed, cbs.connected(ep, error) fires
 *    instead of cbs.error and ep is freed after it returns.
 *  - close(ep): no error callback; every pending send still completes, from
 *    the loop and not from inside close(): with BT_ERR_CANCELED (tcp: not yet
 *    written; inproc: not yet picked up by the peer's loop; ucx: whatever UCX
 *    reports after flushing), or BT_OK when it had left (inproc: when the
 *    peer releases a frame it had already received).
 *    The peer sees BT_ERR_PEER_CLOSED through its error callback.
 *  - destroy(x): closes every endpoint and completes their pending sends
 *    (done() may run inside destroy()). Exception, inproc zero-copy: a frame
 *    the receiver still holds keeps the sender's buffer, and its done() never
 *    fires once the sender's xport is destroyed.
 *  - Received payloads (xport_rx_t) outlive their endpoint: release them any
 *    time before destroy() of the xport that delivered them.
 *  - Errors are logged by the transport once, with the peer's address and
 *    the reason (bad magic, oversized frame, HMAC mismatch, handshake
 *    deadline...); callers need not log them again.
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

/* Largest frame header (msgpack envelope) any transport accepts; checked
 * before anything is allocated. */
#define XPORT_HDR_MAX   (256u * 1024u)
/* A peer's name in log lines and error reports (xport_ep_t.peer_addr):
 * "host:port", "[v6]:port", "inproc:<name>", ucx: "host:pid". */
#define XPORT_ADDR_MAX  96
/* What listen() writes and connect() takes: "host:port" (tcp), "inproc:<name>",
 * ucx: "host:pid/HEX" with the UCP worker address in hex (a few hundred
 * bytes on one host, more with RDMA devices), so it is longer. */
#define XPORT_LISTEN_ADDR_MAX 8192
#define XPORT_PEER_ID_UNKNOWN UINT32_MAX
/* Incoming connections still in their handshake, per listener; more are
 * refused at once (each unauthenticated one holds an fd and buffers until
 * its handshake deadline). */
#define XPORT_HS_PENDING_MAX 256

typedef struct xport xport_t;       /* one instance: (process, loop, kind) */
typedef struct xport_ep xport_ep_t; /* one connection to one peer */
struct xport_ops;

/* The public head of every transport's instance and endpoint: each
 * transport's own struct embeds these as its first member. Callers may read
 * them and own the `user` fields (e.g. to map an endpoint to an actor edge);
 * everything else is the transport's. */
struct xport {
    const struct xport_ops *ops;
    void                   *user;
    unsigned                caps;     /* ops->caps plus what create() found
                                       * (XPORT_CAP_CUDA_MEM only when UCX
                                       * reports CUDA memory support) */
};
struct xport_ep {
    const struct xport_ops *ops;
    xport_t                *x;        /* the instance this endpoint belongs to */
    void                   *user;     /* free for the caller */
    uint32_t                peer_id;  /* peer's self_id once the handshake passed */
    char                    peer_addr[XPORT_ADDR_MAX]; /* for log lines */
};

/* A received frame. The header is valid only during the recv callback; the
 * payload belongs to the receiver until it calls xport_rx_release(), which
 * returns it to whoever allocated it (the receiver's alloc callback's buffer
 * is released through cbs.free; for zero-copy inproc the sender's send
 * completion fires on release). Inproc is zero-copy when the sender gave one
 * iovec: payload then points into the sender's buffer and cbs.alloc is not
 * called. release() may be called from the callback or later, on the loop
 * thread of the xport that delivered it. */
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
    const char     *listen_addr;  /* "host:port"; NULL -> "127.0.0.1:0". ucx: the
                                   * host picks what UCX may use (see
                                   * xport_ucx_net_select), the port is unused */
    size_t          max_frame;    /* bytes of header+payload; 0 -> 1 GiB */
    unsigned        handshake_ms; /* a peer that has not finished the handshake
                                   * by then is dropped; 0 -> 5000 */
    bool            busy_poll;    /* the caller spins on progress(): the transport
                                   * then polls sockets/workers itself and does not
                                   * wait for the loop to report readiness */
    /* With busy_poll: true while the loop will not block in its next poll
     * (it spins on progress()), called with cbs.arg from the loop's thread
     * before it polls. A transport that must arm for readiness (ucx:
     * ucp_worker_arm) does so only when this is false. NULL: always. */
    bool          (*spinning)(void *arg);
    xport_cbs_t     cbs;
} xport_config_t;

typedef void (*xport_send_done_fn)(void *arg, bt_status_t status);

typedef struct xport_ops {
    const char *name;
    unsigned    caps;
    bt_status_t (*create)(const xport_config_t *cfg, xport_t **out);
    void        (*destroy)(xport_t *x);     /* closes every endpoint */
    /* Start listening; write the address peers pass to connect() (at most
     * XPORT_LISTEN_ADDR_MAX bytes with the NUL). */
    bt_status_t (*listen)(xport_t *x, char *addr, size_t addr_cap);
    /* BT_IN_PROGRESS, then cbs.connected. *ep is valid at once (sends queue). */
    bt_status_t (*connect)(xport_t *x, const char *addr, xport_ep_t **ep);
    /* Send hdr + payload. BT_IN_PROGRESS, then done(arg, status) once the
     * caller may reuse the buffers. Buffers must stay valid until then. */
    bt_status_t (*send)(xport_ep_t *ep, const void *hdr, size_t hdr_len,
                        const struct iovec *iov, int iovcnt,
                        xport_send_done_fn done, void *arg);
    /* Close: no error callback for a local close. Frames send() accepted
     * are still delivered, within a bounded time (tcp: the queue drains,
     * then FIN; ucx: an orderly close the peer acknowledges once the frames
     * are in; inproc: hand-off is immediate). destroy() does the same for
     * every open endpoint before it returns. The peer sees BT_ERR_PEER_CLOSED
     * after the last frame. */
    void        (*close)(xport_ep_t *ep);
    /* Make progress without waiting; returns how many events were handled.
     * The libev watchers call this too; busy loops call it directly. */
    int         (*progress)(xport_t *x);
    uint32_t    (*ep_peer_id)(const xport_ep_t *ep);
} xport_ops_t;

/* Small wrappers so callers do not touch the ops table. */
static inline bt_status_t xport_create(const xport_ops_t *ops, const xport_config_t *cfg,
                                       xport_t **out)
{
    return ops->create(cfg, out);
}
static inline void xport_destroy(xport_t *x) { x->ops->destroy(x); }
static inline bt_status_t xport_listen(xport_t *x, char *addr, size_t addr_cap)
{
    return x->ops->listen(x, addr, addr_cap);
}
static inline bt_status_t xport_connect(xport_t *x, const char *addr, xport_ep_t **ep)
{
    return x->ops->connect(x, addr, ep);
}
static inline bt_status_t xport_send(xport_ep_t *ep, const void *hdr, size_t hdr_len,
                                     const struct iovec *iov, int iovcnt,
                                     xport_send_done_fn done, void *arg)
{
    return ep->ops->send(ep, hdr, hdr_len, iov, iovcnt, done, arg);
}
static inline void xport_close(xport_ep_t *ep) { ep->ops->close(ep); }
static inline int  xport_progress(xport_t *x) { return x->ops->progress(x); }

extern const xport_ops_t xport_inproc_ops;
extern const xport_ops_t xport_tcp_ops;
extern const xport_ops_t xport_ucx_ops; /* present when built with UCX */
/* Test hook (transport/fault.c): tcp wrapped in delays and cut links, what
 * xport_ops_get(XPORT_TCP) returns where BATON_TEST_XPORT_FAULT applies. */
extern const xport_ops_t xport_fault_ops;
bool xport_fault_wanted(void);

/* The argument checks every send() makes: BT_ERR_INVALID for a NULL
 * pointer with a length, or a frame over XPORT_HDR_MAX / max_frame (logged,
 * naming the transport and the peer); else BT_OK and *payload_len. */
bt_status_t xport_send_check(const xport_ep_t *ep, size_t max_frame, const void *hdr, size_t hdr_len,
                             const struct iovec *iov, int iovcnt, size_t *payload_len);

/* UCX settings the ucx transport applies to its context unless the
 * environment sets them (or an alias of them); the benchmark's ucx_perftest
 * reference runs under the same ones. Names are without the "UCX_" prefix. */
typedef struct {
    const char *name;       /* the environment variable, less "UCX_" */
    const char *key;        /* what ucp_config_modify takes for it (UCX 1.13 matches
                             * some names with their table prefix, some without) */
    const char *value;
    const char *aliases[2]; /* other variables that mean the same, NULL if none */
} xport_ucx_setting_t;
#define XPORT_UCX_NSETTINGS 3
extern const xport_ucx_setting_t xport_ucx_settings[XPORT_UCX_NSETTINGS];
/* True when the environment sets setting i (by its name or an alias). */
bool xport_ucx_setting_from_env(int i);

/* The UCX transports (UCX_TLS) and devices (UCX_NET_DEVICES) a ucx xport
 * whose listen address is listen_addr ("host:port", NULL: loopback) may use;
 * "" means UCX's default (all). The environment's UCX_TLS / UCX_NET_DEVICES
 * win over these.
 *   loopback (127.0.0.0/8, ::1, localhost): tls "sm,self", devs "lo": shared
 *     memory between the processes of the host, no network transport and so
 *     no socket (the job has no peer elsewhere);
 *   another address: tls "^tcp" (everything but UCX's own tcp transport,
 *     which hostile bytes from a peer host's address can stall), devs = the
 *     interface that has it plus the ports of the RDMA devices behind that
 *     interface (sys_root/class/infiniband/DEV/device/net/IFNAME; sys_root
 *     NULL: /sys), "eth1,mlx5_0:1": verbs runs where such a device is;
 *   0.0.0.0 / ::  tls "^tcp", every device.
 * BT_ERR_INVALID (logged) for a malformed address or one this host lacks. */
bt_status_t xport_ucx_net_select(const char *listen_addr, const char *sys_root, char *tls, size_t tls_cap,
                                 char *devs, size_t devs_cap);
/* Appends "DEV:PORT" for every port of every RDMA device that drives
 * interface ifname (comma-separated, after what out already holds). */
bt_status_t xport_ucx_rdma_ports(const char *ifname, const char *sys_root, char *out, size_t cap);
/* NULL when UCX lets this process run; else the message to print before
 * exiting (main and the test harness check first thing). Only a
 * ThreadSanitizer build with UCX can fail it: libucs's constructor patches
 * UCX's memory-event hooks into glibc's madvise before main, glibc calls
 * madvise as a thread exits, after TSan has released the thread, and the
 * hook's rwlock then crashes TSan. UCX_MEM_EVENTS=no in the environment
 * (read at that load, so it cannot be set later) keeps the hooks out. */
const char *xport_ucx_env_check(void);

/* Ops for a kind, or NULL when that transport is not built. */
const xport_ops_t *xport_ops_get(xport_kind_t kind);
/* "inproc"|"tcp"|"ucx"|"auto" -> kind; auto is resolved by the caller
 * (actors/) because it depends on where the peer lives. */
bt_status_t xport_kind_parse(const char *name, xport_kind_t *kind, bool *is_auto);
const char *xport_kind_name(xport_kind_t kind);

#endif
