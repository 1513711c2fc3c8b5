/* Typed messages: one C struct + encode/decode per message type, carried in
 * the envelope's meta map (wire/wire.h). The table msg_types[] is indexed
 * by msg_type_t.
 *
 * Compatibility: msg_type_t values are wire values. New types are appended
 * before MSG_TYPE_COUNT, never inserted; new fields of a body are appended to
 * its meta map and decoded as optional (absent -> default) so that old
 * senders still decode. Fields that exist today are all required.
 *
 * Bodies are fixed-size structs (strings are bounded char arrays) so decoding
 * never allocates; bulk data (activations, token ids, shards) travels as
 * tensors in the payload, described by the envelope.
 */
#ifndef BT_WIRE_MSG_H
#define BT_WIRE_MSG_H

#include "wire/wire.h"

typedef enum {
    MSG_PING = 0,      /* benchmark / liveness probe; echo as PONG */
    MSG_PONG,
    MSG_CREDIT,        /* receiver grants N more buffers on an edge */
    MSG_HEARTBEAT,
    MSG_STOP,          /* stop the receiver (and its process when it is the last actor) */
    MSG_ERROR_REPORT,  /* an actor reports a failure to the driver */
    MSG_ACTIVATION,    /* pipeline forward: tensor "x" (and more), envelope step/mb */
    MSG_ACT_GRAD,      /* pipeline backward: tensor "dx" */
    MSG_DATA_BATCH,    /* tensors "tokens" (i32 [B,T]) and "targets" */
    MSG_METRICS,       /* loss, tokens, timings of one step of one actor */
    MSG_CKPT_SHARD,    /* one slice of one named parameter, tensor "data" */
    MSG_RELEASE,       /* the receiver is done with memory the sender handed off */
    MSG_CKPT_PIECE,    /* one piece of a checkpoint tensor for a writer, tensor "data" */
    MSG_CKPT_CTL,      /* checkpoint protocol between stage, writer and driver */
    MSG_CKPT_FETCH,    /* resume: bytes of a shard file another rank holds */
    MSG_EXPERT_TOKENS, /* stage -> its expert group: a sparse layer's routed rows are ready */
    MSG_EXPERT_DONE,   /* expert group -> stage: the experts' results are back */
    MSG_CP_BLOCK,      /* CP ring: a K, V, dK or dV block, stage of CP rank r -> r + 1 */
    MSG_TYPE_COUNT,
} msg_type_t;

#define MSG_TEXT_MAX 256 /* bounded strings, NUL included */
#define MSG_NAME_MAX 128

/* PING and PONG */
typedef struct {
    uint64_t id;     /* echoed unchanged in the PONG */
    uint64_t t_ns;   /* sender's clock_now_ns() at send */
} msg_ping_t;
typedef msg_ping_t msg_pong_t;

typedef struct {
    uint32_t edge;     /* edge id, as both ends know it from the graph */
    uint32_t credits;  /* additional buffers granted (> 0) */
} msg_credit_t;

typedef struct {
    uint64_t t_ns;    /* sender's clock */
    uint32_t rank;
    uint32_t state;   /* sender-defined state code (e.g. running, stopping) */
    int64_t  step;    /* last completed step, -1 before the first */
} msg_heartbeat_t;

typedef struct {
    int32_t status;              /* bt_status_t: BT_OK for a normal stop */
    char    why[MSG_TEXT_MAX];   /* may be empty */
} msg_stop_t;

typedef struct {
    int32_t      status;              /* bt_status_t of the failure */
    actor_addr_t actor;               /* the actor that failed */
    uint32_t     peer;                /* the peer / link involved, 0xffffffff when none */
    char         where[MSG_NAME_MAX]; /* e.g. "stage 2 fwd" or "tcp 127.0.0.1:4000" */
    char         text[MSG_TEXT_MAX];
} msg_error_report_t;

/* ACTIVATION and ACT_GRAD: the step and microbatch are the envelope's. */
typedef struct {
    int32_t  vstage;  /* virtual pipeline stage the tensors are for */
    uint32_t chunk;   /* context-parallel / sequence chunk index, 0 when unused */
} msg_activation_t;
typedef struct {
    int32_t  vstage;
    uint32_t chunk;
    float    loss_scale;  /* gradient scale applied by the sender (1.0 when none) */
} msg_act_grad_t;

typedef struct {
    uint64_t data_pos;  /* position in the token stream (for checkpoint/resume) */
    uint32_t batch;     /* B */
    uint32_t seq_len;   /* T */
    uint32_t epoch;
} msg_data_batch_t;

typedef struct {
    float    loss;        /* NaN when the actor computes no loss */
    float    grad_norm;   /* NaN when unknown */
    float    lr;
    uint64_t tokens;      /* tokens processed in this step */
    double   t_fwd_ms, t_bwd_ms, t_opt_ms, t_step_ms;
} msg_metrics_t;

typedef struct {
    char     name[MSG_NAME_MAX];  /* parameter name, e.g. "layers.3.attn.wq" */
    int64_t  ckpt_step;           /* checkpoint's training step */
    uint32_t shard;               /* shard index within the parameter */
    uint32_t ndim;                /* 1..TENSOR_MAX_DIMS */
    int64_t  global_shape[TENSOR_MAX_DIMS];
    int64_t  start[TENSOR_MAX_DIMS];  /* slice start within the global tensor */
    uint32_t is_optim;            /* 0 = weights, 1.. = optimizer state slot */
} msg_ckpt_shard_t;

/* RELEASE: an ACTIVATION or ACT_GRAD whose tensor was handed off (its
 * bytes left in the sender's shared device memory, train/handoff.h) has
 * been read; the sender may reuse that memory. */
typedef struct {
    uint32_t slot; /* the sender's buffer, as the handoff named it */
    uint32_t gen;  /* which use of it */
} msg_release_t;

/* CKPT_PIECE: piece `index` of the `count` a stage hands its writer for
 * the checkpoint of `step`: the box (off, ext) of the global tensor
 * (ndim dims, global shape glob) and, flat_len >= 0, the flat range
 * [flat_start, flat_start + flat_len) of the box (base/shard_spec.h).
 * Tensor "data": its elements, densely (f32). */
typedef struct {
    char     name[MSG_NAME_MAX];
    int64_t  step;
    uint32_t index, count, ndim;
    int64_t  glob0, glob1, glob2, glob3;
    int64_t  off0, off1, off2, off3;
    int64_t  ext0, ext1, ext2, ext3;
    int64_t  flat_start, flat_len;
} msg_ckpt_piece_t;

/* CKPT_CTL phases (docs/CHECKPOINTS.md, "Saving from a distributed run"). */
enum {
    CKPT_CTL_BEGIN = 1,     /* stage -> writer: `count` pieces of `step` follow */
    CKPT_CTL_WRITTEN = 2,   /* writer -> driver: its file is on disk; tensors "index" (the
                             * file's fragment of index.json) and "root" (its directory) */
    CKPT_CTL_COMMIT = 3,    /* driver -> writer: commit with tensor "index" (the whole one) */
    CKPT_CTL_COMMITTED = 4, /* writer -> driver */
    CKPT_CTL_FAILED = 5,    /* writer -> driver: status, text */
    CKPT_CTL_UP = 6,        /* writer -> driver: registered; fetches for it may come */
};
typedef struct {
    int64_t  step;
    uint32_t phase;
    int32_t  status;
    uint32_t rank;
    uint32_t count;
    char     text[MSG_TEXT_MAX];
} msg_ckpt_ctl_t;

/* CKPT_FETCH (docs/CHECKPOINTS.md, "No shared storage"): a resuming rank
 * whose folders lack a shard file asks for [offset, offset + length) of it
 * (request, phase 1) through the driver, which forwards it to the rank that
 * wrote the file or serves it itself; the answer (phase 2) carries tensor
 * "data" (u8 [length]) or a status and text saying why not. */
enum { CKPT_FETCH_REQUEST = 1, CKPT_FETCH_REPLY = 2 };
#define CKPT_FETCH_MAX_BYTES (8u << 20) /* one request asks for at most this */
typedef struct {
    uint64_t req;      /* the requester's id of the request */
    uint32_t from;     /* the requesting rank */
    uint32_t phase;
    int64_t  step;     /* of the checkpoint */
    uint64_t offset, length;
    int32_t  status;   /* reply: BT_OK, or why not (text) */
    char     file[MSG_NAME_MAX];
    char     text[MSG_TEXT_MAX];
} msg_ckpt_fetch_t;

/* EXPERT_TOKENS and EXPERT_DONE (train/expert_actor.h): between a stage
 * and the expert-group actor of its rank. TOKENS: the routed rows of
 * sparse layer `layer` of the stage's op (envelope step and microbatch)
 * are in that layer's dispatch buffers, `rows` of them (token, expert
 * choices) for the experts of the whole EP group; DONE: the group has
 * exchanged them, run its experts on the `rows_in` rows that reached it
 * and sent the results back into the layer's combine buffers, with
 * `status`. `call` numbers the stage's hand-overs; the answer names the
 * same one. Phase EXPERT_FWD or EXPERT_BWD (the gradients' way). */
enum { EXPERT_FWD = 1, EXPERT_BWD = 2 };
typedef struct {
    uint64_t call;
    int32_t  layer;
    uint32_t phase;
    int64_t  rows, rows_in;
    int32_t  status;
} msg_expert_t;

/* CP_BLOCK (train/cp_ring.h, docs/PARALLEL.md "Ring mode"): one block of
 * the context-parallel ring, from the stage actor of CP rank r to that of
 * r + 1: tensor "k", "v", "dk" or "dv" (by `what`), the sender's view of
 * it with its own head size ([B, 2L, H, D]). Its tag is the envelope's step
 * and microbatch and the fields: the model chunk (virtual stage index of
 * the rank), the layer, the pass (CP_BLOCK_FWD / CP_BLOCK_BWD) and the ring
 * step of that pass. */
enum { CP_BLOCK_K = 1, CP_BLOCK_V = 2, CP_BLOCK_DK = 3, CP_BLOCK_DV = 4 };
enum { CP_BLOCK_FWD = 1, CP_BLOCK_BWD = 2 };
typedef struct {
    uint32_t chunk;
    int32_t  layer;
    uint32_t phase;
    uint32_t ring_step;
    uint32_t what;
} msg_cp_block_t;

/* Storage for any body; decode into this when the type is not known yet. */
typedef union {
    msg_ping_t         ping;
    msg_pong_t         pong;
    msg_credit_t       credit;
    msg_heartbeat_t    heartbeat;
    msg_stop_t         stop;
    msg_error_report_t error_report;
    msg_activation_t   activation;
    msg_act_grad_t     act_grad;
    msg_data_batch_t   data_batch;
    msg_metrics_t      metrics;
    msg_ckpt_shard_t   ckpt_shard;
    msg_release_t      release;
    msg_ckpt_piece_t   ckpt_piece;
    msg_ckpt_ctl_t     ckpt_ctl;
    msg_ckpt_fetch_t   ckpt_fetch;
    msg_expert_t       expert;
    msg_cp_block_t     cp_block;
} msg_body_t;

typedef bt_status_t (*msg_encode_fn)(msgpack_packer *pk, const void *body);
typedef bt_status_t (*msg_decode_fn)(const msgpack_object *meta, void *body, wire_err_t *err);

typedef struct {
    const char   *name;    /* "PING", ... */
    msg_encode_fn encode;  /* writes the meta map */
    msg_decode_fn decode;  /* validates and reads the meta map into a body */
    size_t        size;    /* sizeof the body struct */
} msg_type_info_t;

extern const msg_type_info_t msg_types[MSG_TYPE_COUNT];

/* Field-by-field equality of two bodies of `type` (floats bitwise, strings
 * up to their NUL); for tests and the fuzzer's round-trip property. */
bool msg_body_equal(uint32_t type, const void *a, const void *b);

/* "PING" ..., or "?" for an unknown value. */
const char *msg_type_name(uint32_t type);

/* Encode envelope `env` (env->type selects the body encoder, body points to
 * that type's struct) into buf. See wire_env_encode for errors. */
bt_status_t msg_encode(msgpack_sbuffer *buf, const wire_env_t *env, const void *body,
                       wire_err_t *err);

/* msg_encode with (raw = true, what msg_encode does) or without the fast
 * meta writer; both write the same bytes (checked by tests/test_wire_fast.c). */
bt_status_t msg_encode_ex(msgpack_sbuffer *buf, const wire_env_t *env, const void *body, bool raw,
                          wire_err_t *err);

/* Decode hostile header bytes into env + body (body is msg_types[env->type]
 * .size bytes of the union). BT_OK or BT_ERR_PEER_PROTO with err->reason. */
bt_status_t msg_decode(const void *hdr, size_t hdr_len, size_t payload_len,
                       const wire_limits_t *lim, wire_env_t *env, msg_body_t *body,
                       wire_err_t *err);

/* msg_decode through a chosen decoder path (wire_decode_path_t): for the
 * differential tests and the fuzzer, which compare the fast and the general
 * path. FAST and FAST_RAW return BT_ERR_UNSUPPORTED when they defer. */
bt_status_t msg_decode_ex(const void *hdr, size_t hdr_len, size_t payload_len,
                          const wire_limits_t *lim, wire_env_t *env, msg_body_t *body,
                          wire_decode_path_t path, wire_err_t *err);

/* A frame ready to send: the encoded envelope and the payload iovec.
 * msg_frame_init before first use, msg_frame_fini at the end; a frame can be
 * rebuilt many times (its header buffer is reused). The frame and the tensor
 * memory must stay valid until the transport's send completes. */
typedef struct {
    msgpack_sbuffer hdr;
    wire_env_t      env;  /* as encoded: offsets filled in */
    struct iovec    iov[2 * WIRE_MAX_TENSORS];
    int             iovcnt;
    size_t          payload_len;
} msg_frame_t;

void msg_frame_init(msg_frame_t *f);
void msg_frame_fini(msg_frame_t *f);

/* Build a frame: the envelope fields of *env (type, src, dst, seq, step, mb;
 * its tensors are ignored) + body + the n tensor views named names[i]. */
bt_status_t msg_frame_build(msg_frame_t *f, const wire_env_t *env, const void *body,
                            const tensor_t *ts, const char *const *names, int n,
                            wire_err_t *err);

/* ---- meta map reading helpers (used by the per-type decoders) ------------- */

/* A meta map checked to be a map whose keys are all strings, with no
 * duplicate key. Returns BT_OK or BT_ERR_PEER_PROTO. */
bt_status_t msg_meta_check(const msgpack_object *meta, const char *what, wire_err_t *err);
/* Look up a key in a checked map: NULL when absent. */
const msgpack_object *msg_meta_get(const msgpack_object *map, const char *key);

#endif
