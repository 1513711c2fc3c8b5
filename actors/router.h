/* The router: one per rank (normally one per process). It owns the actor
 * table of its rank (slot -> actor), the loops and workers created through
 * it, and one edge per remote rank.
 *
 * Routing a message to address (rank << 16) | slot:
 *   - our rank: the actor's loop (same loop: direct, other loop: ev_async post);
 *   - another rank: that rank's edge. The frame is encoded (wire/msg.h) and
 *     sent by the edge's transport from the I/O loop, which owns every
 *     transport instance of this router. Received frames are decoded on the
 *     I/O loop and dispatched to the destination actor's loop.
 *
 * Transport per edge: actor_router_connect(kind) with kind inproc|tcp|ucx|auto.
 * auto picks inproc when the peer's card says it lives in our process, ucx
 * when it is built here and the peer listens on it, else tcp; a ucx connect
 * that fails falls back to tcp once.
 *
 * Flow control (credits, actors/credit.h): when cfg.credits > 0 every rank
 * grants each peer that many message buffers; a sender out of credit holds
 * messages locally (actor_send returns BT_ERR_BUSY) and tells the sending
 * actor when credit is back. All ranks of a job must use the same setting.
 *
 * Failures: a bad frame (decode error, wrong destination) is logged with its
 * reason and closes that connection only; a transport error closes the edge.
 * Both become an MSG_ERROR_REPORT message to the supervisor actor (if set):
 * status = the peer error, peer = the remote rank, where = "tcp 127.0.0.1:..."
 *
 * Stop: actor_router_stop_request (any thread, e.g. from a handler) wakes
 * actor_router_wait; actor_router_destroy then stops every actor (stop
 * hooks), finishes the workers' jobs, drains the loops, closes the
 * transports, stops and joins the loops and frees everything.
 */
#ifndef BT_ACTORS_ROUTER_H
#define BT_ACTORS_ROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "actors/actor.h"
#include "actors/worker.h"
#include "transport/xport.h"

#define ACTOR_ROUTER_MAX_SLOTS 1024u
#define ACTOR_ROUTER_MAX_RANKS 1024u
/* "pid=..;inproc=..;tcp=..;ucx=..": a listen address per transport, the
 * ucx one up to XPORT_LISTEN_ADDR_MAX */
#define ACTOR_CARD_MAX (XPORT_LISTEN_ADDR_MAX + 512)

typedef struct {
    uint32_t       rank;
    const char    *job_id;       /* both ends must agree; NULL -> "baton" */
    const uint8_t *secret;       /* per-job secret; NULL -> a fixed test secret */
    size_t         secret_len;
    uint32_t       credits;      /* buffers granted per peer; 0 = no flow control */
    uint32_t       busy_poll_us; /* I/O loop spins this long after each event; 0 = off */
    const char    *listen_host;  /* NULL -> 127.0.0.1 */
    size_t         max_frame;    /* 0 -> transport default (1 GiB) */
} actor_router_config_t;

/* Creates the router and its I/O loop thread ("io"). */
bt_status_t actor_router_create(const actor_router_config_t *cfg, actor_router_t **out);
/* Orderly stop of everything the router owns (see above), then free. Call
 * from a thread that is none of its loops. */
void        actor_router_destroy(actor_router_t *rt);

uint32_t      actor_router_rank(const actor_router_t *rt);
actor_loop_t *actor_router_io_loop(actor_router_t *rt);
/* A new loop with its own thread, owned (stopped, joined, freed) by rt. */
bt_status_t   actor_router_loop_new(actor_router_t *rt, const char *name, actor_loop_t **out);
/* A new worker thread owned by rt (finished and joined before the loops stop). */
bt_status_t   actor_router_worker_new(actor_router_t *rt, const char *name, actor_worker_t **out);

/* Listen on the transports in `kinds` (bit (1 << xport_kind_t); those not
 * built are skipped) and write our card, which peers pass to connect. */
bt_status_t actor_router_listen(actor_router_t *rt, unsigned kinds, char *card, size_t cap);
#define ACTOR_KINDS_ALL ((1u << XPORT_INPROC) | (1u << XPORT_TCP) | (1u << XPORT_UCX))

/* Connect to `rank` whose card is `card`, over kind (auto = true picks it).
 * Returns once the connection is started (messages to rank queue meanwhile);
 * completion or failure is logged, failure is reported to the supervisor. */
bt_status_t actor_router_connect(actor_router_t *rt, uint32_t rank, const char *card,
                                 xport_kind_t kind, bool is_auto);
/* Parse "inproc|tcp|ucx|auto" and connect. */
bt_status_t actor_router_connect_str(actor_router_t *rt, uint32_t rank, const char *card,
                                     const char *kind);
/* Block until the edge to rank is up (handshake passed) or timeout_ms; any
 * thread but the I/O loop's. BT_OK, BT_ERR_TIMEOUT or the connect error. */
bt_status_t actor_router_wait_peer(actor_router_t *rt, uint32_t rank, unsigned timeout_ms);
/* Kind actually used for the edge to rank (after auto); -1 when none. */
int         actor_router_peer_kind(actor_router_t *rt, uint32_t rank);

/* The actor that receives MSG_ERROR_REPORT for peer failures. */
void actor_router_supervisor_set(actor_router_t *rt, uint32_t addr);

/* The job is ending: from now on a peer that closes its link is leaving, not
 * failing (logged as info, still reported to the supervisor). When every rank
 * quiesces before any rank tears down, the normal end of a job logs no link
 * errors. Any thread. */
void        actor_router_quiesce(actor_router_t *rt);
/* Ask actor_router_wait to return (any thread, any number of times; the
 * first status wins). */
void        actor_router_stop_request(actor_router_t *rt, bt_status_t status);
/* Wait for a stop request; timeout_ms 0 = forever. Returns its status or
 * BT_ERR_TIMEOUT. */
bt_status_t actor_router_wait(actor_router_t *rt, unsigned timeout_ms);

/* Counters of the edge to rank (for tests and benchmarks). */
typedef struct {
    uint64_t sent, received;    /* data frames */
    uint64_t held;              /* sends that found no credit */
    uint32_t credits;           /* credits we hold for sending to rank now */
    uint32_t pending;           /* messages held for lack of credit now */
    bool     up, failed;
} actor_edge_stats_t;
bt_status_t actor_router_edge_stats(actor_router_t *rt, uint32_t rank, actor_edge_stats_t *out);

/* ---- internals for actor.c ------------------------------------------------ */
actor_t    *actor_router_lookup_(actor_router_t *rt, uint32_t slot);
bt_status_t actor_router_register_(actor_router_t *rt, actor_t *a, uint32_t slot);
bt_status_t actor_router_send_remote_(actor_router_t *rt, actor_t *from, actor_msg_t *m);
void        actor_router_rx_free_(actor_msg_t *m);

#endif
