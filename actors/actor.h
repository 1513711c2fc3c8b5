/* Actors: caller-allocated state machines driven by messages.
 *
 * An actor is a struct of the caller's with actor_t as its FIRST member
 * (CONVENTIONS.md: structs with a runtime header). Its class gives one
 * handler per message type (a table indexed by type) plus start/stop hooks.
 * All of an actor's hooks, handlers and timers run on one loop thread, one
 * at a time, so an actor needs no locks for its own state. A handler never
 * blocks: long work goes to a worker (actors/worker.h), whose completion
 * comes back as a message.
 *
 * Ownership (CONVENTIONS.md: ownership of messages): a handler returns
 * ACTOR_DONE (the runtime frees the message when the handler returns) or
 * ACTOR_KEPT (the actor owns it and calls actor_msg_free later, on any
 * thread). Freeing a received message returns its buffer to the transport
 * and its credit to the sender. actor_send always takes ownership of the
 * message it is given.
 *
 * Types: wire message types (msg_type_t, wire/msg.h) travel between
 * processes; the ACTOR_SYS_* types after them are local runtime events
 * (worker completions, credit notices) that never go on the wire. Both are
 * dispatched through the same table.
 */
#ifndef BT_ACTORS_ACTOR_H
#define BT_ACTORS_ACTOR_H

#include <stdbool.h>
#include <stdint.h>

#include "actors/loop.h"
#include "wire/msg.h"
#include "base/status.h"
#include "base/tensor.h"

/* Local runtime events, numbered after the wire types. */
typedef enum {
    ACTOR_SYS_WORK_DONE = MSG_TYPE_COUNT, /* a worker job finished: m->sys.work */
    ACTOR_SYS_CREDIT_READY,               /* an edge this actor was held on has credit again:
                                           * m->sys.credit_rank */
    ACTOR_TYPE_COUNT,
} actor_sys_type_t;

typedef enum {
    ACTOR_DONE = 0, /* the runtime frees the message */
    ACTOR_KEPT = 1, /* the actor frees it later with actor_msg_free */
} actor_ret_t;

typedef struct actor actor_t;
typedef struct actor_msg actor_msg_t;
typedef struct actor_router actor_router_t;
typedef struct actor_timer actor_timer_t;

typedef actor_ret_t (*actor_handler_fn)(actor_t *self, actor_msg_t *m);
typedef void (*actor_hook_fn)(actor_t *self);
typedef bt_status_t (*actor_work_fn)(void *arg);
typedef void (*actor_free_fn)(void *arg);

/* An actor class, normally a static const with designated initializers:
 *   static const actor_class_t pinger = {.name = "pinger",
 *       .handlers = {[MSG_PONG] = pinger_on_pong}, .stop = pinger_stop};
 * A message whose handler is NULL is logged (debug) and freed. */
typedef struct actor_class {
    const char      *name;
    actor_handler_fn handlers[ACTOR_TYPE_COUNT];
    actor_hook_fn    start;  /* on the actor's loop once it is registered (may send) */
    actor_hook_fn    stop;   /* on the actor's loop, once: release kept messages here */
} actor_class_t;

typedef enum { ACTOR_NEW = 0, ACTOR_RUNNING, ACTOR_STOPPED } actor_state_t;

/* The runtime header. Fields are read-only for the actor; set by
 * actor_register. */
struct actor {
    const actor_class_t *cls;
    actor_router_t      *rt;
    actor_loop_t        *loop;
    uint32_t             addr;   /* actor_addr_t: (rank << 16) | slot */
    const char          *name;
    uint64_t             seq;    /* next envelope seq of this sender */
    actor_state_t        state;
    actor_timer_t       *timers; /* started timers, stopped with the actor */
};

typedef struct {
    uint64_t      tag;     /* as given to actor_worker_submit */
    void         *arg;
    bt_status_t   status;  /* the job function's result */
    actor_free_fn cleanup; /* runs on arg if the message is dropped undelivered */
} actor_work_result_t;

/* Bytes of a tensor that actor_msg_tensor_new keeps inside the message. */
#define ACTOR_MSG_SMALL 128u

/* A message. env holds type, src, dst, seq, step, mb and the tensor
 * descriptors; body the typed meta (msg.h); tensors[i] the views of
 * env.tensors[i] (received: into the payload; local: the sender's views). */
struct actor_msg {
    actor_item_t item;       /* runtime: queue link */
    wire_env_t   env;
    msg_body_t   body;
    tensor_t     tensors[WIRE_MAX_TENSORS];
    union {
        actor_work_result_t work;        /* ACTOR_SYS_WORK_DONE */
        uint32_t            credit_rank; /* ACTOR_SYS_CREDIT_READY */
    } sys;
    /* runtime private from here on */
    actor_t       *to;
    actor_free_fn  on_free;      /* releases borrowed tensor memory */
    void          *on_free_arg;
    void          *rx;           /* xport_rx_t of a received frame */
    uint64_t       t_recv_tk;    /* trace_ticks() at arrival, while tracing, else 0 (router; with rx) */
    uint64_t       rx_bytes;     /* header + payload bytes of the frame (router; with rx) */
    void          *edge;         /* edge it came from (credit return) */
    void          *tx_edge;      /* edge it is being sent on */
    uint32_t       nowned;       /* owned[0..nowned) are valid (NULL or a buffer) */
    bool           small_used;
    /* Not cleared by actor_msg_new from here on (owned[] beyond nowned is
     * stale until an allocation writes it). */
    void          *owned[WIRE_MAX_TENSORS]; /* buffers allocated by actor_msg_tensor_new */
    /* Storage for the first small tensor of actor_msg_tensor_new (aligned
     * inside to WIRE_ALIGN): a small message allocates nothing but itself. */
    uint8_t        small[WIRE_ALIGN + ACTOR_MSG_SMALL];
};

/* ---- messages ---------------------------------------------------------- */

/* A new message of `type` with step = mb = -1 and a zeroed body (for a wire
 * type: that type's struct in the body union); NULL when out of memory. */
actor_msg_t *actor_msg_new(uint32_t type);
/* Free a message (any thread). Received messages give their buffer back to
 * the transport and a credit to the sender. */
void         actor_msg_free(actor_msg_t *m);
/* A message's tensors are host memory; a view's device field is the
 * tensor's home (where its sender keeps it and its receiver puts it), which
 * travels in the descriptor (wire/wire.h). */
/* Attach a tensor in memory the message owns (64-byte aligned, zeroed);
 * returns the view or NULL (too many tensors, bad name, out of memory). Its
 * home is the host until the caller sets view->device. */
tensor_t    *actor_msg_tensor_new(actor_msg_t *m, const char *name, dtype_t dt, int ndim,
                                  const int64_t *shape);
/* Attach a view of memory the sender keeps valid until the message is freed
 * (arrange that with actor_msg_on_free). BT_ERR_INVALID for a bad name or
 * too many tensors. */
bt_status_t  actor_msg_tensor_add(actor_msg_t *m, const char *name, const tensor_t *view);
/* fn(arg) runs when the message is freed: after the transport send completed
 * or, for a local delivery, when the receiver freed it. */
void         actor_msg_on_free(actor_msg_t *m, actor_free_fn fn, void *arg);
/* The view of the tensor called `name`, or NULL. */
tensor_t    *actor_msg_tensor(actor_msg_t *m, const char *name);
/* Text (a JSON document, a path) carried as the u8 tensor `name`: added as
 * a copy (false: out of memory, too many tensors, bad name), and read back
 * as a view of its bytes, *len of them, not NUL-terminated (NULL when the
 * message has no 1-D u8 tensor of that name). */
bool         actor_msg_text_add(actor_msg_t *m, const char *name, const char *text);
const char  *actor_msg_text(actor_msg_t *m, const char *name, size_t *len);
/* Bytes of payload (sum of tensor sizes). */
size_t       actor_msg_payload_bytes(const actor_msg_t *m);

/* ---- actors -------------------------------------------------------------- */

#define ACTOR_SLOT_ANY UINT32_MAX

/* Register `self` with the router on `loop` under `slot` (ACTOR_SLOT_ANY:
 * the next free one) and run its start hook on that loop. `name` must
 * outlive the actor. BT_ERR_BUSY when the slot is taken. Any thread. */
bt_status_t actor_register(actor_router_t *rt, actor_t *self, const actor_class_t *cls,
                           actor_loop_t *loop, const char *name, uint32_t slot);

/* Send m to dst (takes ownership, sets src/dst/seq). On self's loop only.
 *   BT_OK           delivered locally or handed to the transport path
 *   BT_ERR_BUSY     accepted but held: the edge to dst is out of credit.
 *                   The message goes out when credit returns, and self then
 *                   gets one ACTOR_SYS_CREDIT_READY; stop producing until then.
 *   BT_ERR_NOT_FOUND / BT_ERR_PEER_*  not delivered (message freed). */
bt_status_t actor_send(actor_t *self, uint32_t dst, actor_msg_t *m);

/* The last message this process sent and the last it handled, of the types
 * that move a step forward (every type but HEARTBEAT, CREDIT, PING and PONG,
 * which flow whether the job moves or not), for hang reports
 * (launch/driver.h). Recorded on every send and dispatch: three relaxed
 * stores, no lock; a reader racing a writer may see fields of two
 * messages, which a report can live with. valid false: none yet. */
typedef struct {
    bool     valid;
    uint32_t type, peer; /* peer: the other end's rank */
    int64_t  step;
    int32_t  mb;
    uint64_t t_ns;       /* clock_now_ns() of the send / the dispatch */
} actor_last_msg_t;
void actor_last_msgs(actor_last_msg_t *sent, actor_last_msg_t *handled);

/* Stop the actor now (on its loop): timers stop, the stop hook runs, and
 * messages that arrive afterwards are freed undelivered. */
void actor_stop(actor_t *self);

/* ---- timers -------------------------------------------------------------- */

typedef void (*actor_timer_fn)(actor_t *self, actor_timer_t *t);

/* Caller-allocated (usually inside the actor); opaque fields. */
struct actor_timer {
    _Alignas(16) uint8_t w[64]; /* ev_timer storage (checked in actor.c) */
    actor_t       *owner;
    actor_timer_fn cb;
    actor_timer_t *next;
    bool           active;
};

/* One-shot (repeat_s = 0) or repeating timer on self's loop; call on that
 * loop. Restarting an active timer re-arms it. */
void actor_timer_start(actor_t *self, actor_timer_t *t, double after_s, double repeat_s,
                       actor_timer_fn cb);
void actor_timer_stop(actor_timer_t *t);

/* ---- runtime internals shared by router.c and worker.c ------------------- */

/* Queue m for actor `to` on its loop: dispatched at once when the caller is
 * on that loop outside any handler, otherwise posted. */
void actor_deliver_(actor_t *to, actor_msg_t *m);

/* A message for a received frame: as actor_msg_new(0) but the body is not
 * zeroed (the decoder writes it, zeroing its type's struct first). */
actor_msg_t *actor_msg_new_rx_(void);

#endif
