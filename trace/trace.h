/* Tracing: every send, receive and handler span of every actor, cheaply.
 *
 * Recording: each thread owns a ring of 40-byte slots, created on its first
 * event and linked into a process list. A message's send, or its receive
 * together with the handler span it started, is one slot (a compact
 * record, trace_slot_t); rarer records take two (a trace_rec_t). The
 * recording thread is the only writer and the flusher the only reader
 * (single-producer single-consumer, acquire/release indices: no lock, no
 * syscall, no formatting). A full ring drops the event and counts it; it
 * never blocks. When a ring passes half full the flusher thread is woken;
 * it also wakes periodically. trace_stop() (also run at exit) drains every
 * ring into DIR/trace-<rank>-<pid>.bin and closes it.
 *
 * Cost: with tracing off every recording call is one predictable branch on
 * a global flag. With it on, what a message costs is mostly its bytes (the
 * flusher copies them into the file: 80 per message, a send slot and a
 * receive slot) and its clock reads (three: the send, the arrival, the
 * handler's end; a message handled straight from its receive callback
 * starts its handler at its arrival stamp). Timestamps are passed in by the
 * caller (clock_now_ns(), CLOCK_MONOTONIC, shared by the processes of one
 * host), because the caller usually has them already. The per-message
 * records of the actor path (trace_*_tk) take trace_ticks() instead: the
 * TSC where it is invariant and the kernel's own clock source (one rdtsc,
 * ~10 ns on our VM against ~25 ns for clock_gettime), else clock_now_ns().
 * Ticks go to the file as they are, after a CLOCK block (trace_file.h)
 * with which the reader converts them to CLOCK_MONOTONIC ns; readers see
 * ns only, and a handled receive as the receive and its handler span.
 *
 * Flow ids: a send and its receive are joined by (src, dst, seq) of the
 * envelope; trace_send is recorded by the sender with (src=self, dst=peer),
 * trace_recv by the receiver with (dst=self, src=peer).
 *
 * Reading: trace_dir_load() reads every trace-*.bin of a directory (a corrupt
 * or truncated file is an error naming the file), trace_json_write() writes
 * Chrome trace-event JSON (ui.perfetto.dev), trace_summary_compute() gives
 * per-edge latency and per-actor busy/idle numbers.
 */
#ifndef BT_TRACE_TRACE_H
#define BT_TRACE_TRACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "wire/wire.h"
#include "base/clock.h"
#include "base/status.h"

/* ---- file format (little-endian host layout; magic + version first) ------ */

#define TRACE_MAGIC   0x43525442u /* "BTRC" */
#define TRACE_VERSION 3u /* 3: 40-byte slots; 2: tick records + CLOCK blocks, handled receives; 1 and 2 still read */

typedef enum {
    TRACE_EV_SEND = 0,  /* actor = src, peer = dst */
    TRACE_EV_RECV,      /* actor = dst, peer = src */
    TRACE_EV_SPAN,      /* [t0, t1] of work of `kind` on actor */
    TRACE_EV_INSTANT,   /* a point event named name_id */
    TRACE_EV_COUNTER,   /* value of counter name_id */
    TRACE_EV_COUNT,
} trace_ev_t;

/* What a span is; "compute" spans make the busy time of the bubble report. */
typedef enum {
    TRACE_SPAN_HANDLER = 0,  /* a message handler (loop thread) */
    TRACE_SPAN_COMPUTE,      /* forward/backward/optimizer work on a device */
    TRACE_SPAN_COMM,         /* a collective or a blocking transfer */
    TRACE_SPAN_IO,           /* checkpoint / data reads and writes */
    TRACE_SPAN_OTHER,
    TRACE_SPAN_KIND_COUNT,
} trace_span_kind_t;

/* One event as readers see it (and as files of versions 1 and 2 hold it),
 * 64 bytes. Rings and version 3 files hold slots (below). */
typedef struct {
    uint8_t      ev;        /* trace_ev_t */
    uint8_t      kind;      /* trace_span_kind_t for spans */
    uint16_t     msg_type;  /* msg_type_t; 0xffff when none */
    actor_addr_t actor;
    uint64_t     t0;        /* ns, CLOCK_MONOTONIC */
    uint64_t     t1;        /* span end; == t0 otherwise */
    union {
        uint64_t bytes;     /* send/recv: header + payload bytes */
        double   value;     /* counters */
    };
    uint64_t     seq;       /* send/recv: envelope seq */
    int64_t      step;
    actor_addr_t peer;
    int32_t      mb;
    uint32_t     name_id;   /* trace_intern id; 0 = none (spans use msg type name) */
    uint32_t     reserved;  /* 0 on disk; in a ring, TRACE_REC_TICKS: t0/t1 are trace_ticks() */
} trace_rec_t;
#define TRACE_REC_TICKS 1u
/* A receive record with kind TRACE_RECV_HANDLED also carries its handler
 * span: t0 = arrival, t1 = handler end, name_id = arrival -> handler start
 * (same unit as t0/t1, saturated). Readers split it in two at load. */
#define TRACE_RECV_HANDLED 1u
_Static_assert(sizeof(trace_rec_t) == 64, "trace record is 64 bytes on disk");

/* ---- recording ---------------------------------------------------------- */

typedef struct {
    uint32_t ring_records;  /* per-thread ring capacity, power of two; 0 -> 16384 */
    bool     no_flusher;    /* no background thread: rings drain only in
                             * trace_flush()/trace_stop() (deterministic tests) */
    uint32_t flush_ms;      /* periodic flush interval; 0 -> 100 */
    const char *run_id;     /* the run the file belongs to (launch/rundir.h); NULL: none.
                             * `baton trace` refuses to merge files of different runs */
} trace_config_t;

/* Start tracing into DIR/trace-<rank>-<pid>.bin (DIR is created if missing).
 * cfg NULL -> defaults. BT_ERR_IO when the file cannot be created,
 * BT_ERR_BUSY when already started. Tracing may be started again after
 * trace_stop (new file, trace-<rank>-<pid>.<n>.bin). A child created by
 * fork() starts with tracing off and no file; it may call trace_start. */
bt_status_t trace_start(const char *dir, uint32_t rank, const trace_config_t *cfg);
/* Drain all rings, write the file's trailer, close it, stop the flusher.
 * Idempotent; registered with atexit by trace_start. Events recorded after
 * stop are ignored. */
void trace_stop(void);
/* Pause (false) or resume (true) recording without closing the file:
 * paused, every recording call costs what it costs with tracing off. No
 * effect when tracing is not started. */
void trace_set_recording(bool on);
/* Drain every ring now (any thread; serialized with the flusher). */
void trace_flush(void);
/* Events dropped because a ring was full, since trace_start. */
uint64_t trace_dropped(void);

/* Name the calling thread's track / an actor's track (metadata, not hot path).
 * Safe to call before trace_start (remembered) and when tracing is off. */
void trace_thread_name(const char *name);
void trace_actor_name(actor_addr_t actor, const char *name);
/* Id for a span/instant/counter name (e.g. "fwd", "loss"); the same string
 * gives the same id. Not for the hot path: intern once, keep the id.
 * Names longer than 47 bytes are truncated. */
uint32_t trace_intern(const char *name);

extern _Atomic bool trace_on_;  /* read through trace_enabled() */
extern _Atomic bool trace_tsc_; /* trace_ticks() reads the TSC; set by trace_start */

/* The hot-path trace clock (see the top of this file). */
static inline uint64_t trace_ticks(void)
{
#if defined(__x86_64__)
    if (atomic_load_explicit(&trace_tsc_, memory_order_relaxed)) return __builtin_ia32_rdtsc();
#endif
    return clock_now_ns();
}

/* Force clock_gettime for trace_ticks() (true) or allow the TSC (false, the
 * default); takes effect at the next trace_start. For tests. */
void trace_clock_force_monotonic(bool force);
/* A relaxed load is a plain load on every target we build for. */
static inline bool trace_enabled(void)
{
    return __builtin_expect(atomic_load_explicit(&trace_on_, memory_order_relaxed), 0);
}

/* ---- internals of recording ----------------------------------------------
 * A thread's ring is an array of 40-byte slots (single producer: the thread;
 * single consumer: the flusher), written to the file as they are. The
 * actor path's records (sends, receives with their handler span, handler
 * spans) take one slot each: a compact record, trace_slot_t. Every other
 * record, and a compact one whose fields do not fit, takes two slots: a
 * trace_rec_t in the pair's first 64 bytes, its ev or'ed with
 * TRACE_SLOT_WIDE. A pair never straddles the ring's wrap (a TRACE_SLOT_PAD
 * slot fills the last one), so a drain never splits it. A full ring drops
 * the record and counts it; it never blocks. */
#define TRACE_SLOT_EV_MASK 0x07u /* ev: the trace_ev_t */
#define TRACE_SLOT_TICKS   0x08u /* ev, compact: t0, delay and dur are trace_ticks() */
#define TRACE_SLOT_HANDLED 0x10u /* ev, compact receive: delay and dur hold its handler span */
#define TRACE_SLOT_PAD     0x40u /* ev: an empty slot before the wrap */
#define TRACE_SLOT_WIDE    0x80u /* ev: this slot and the next hold a trace_rec_t */

typedef struct {
    uint8_t      ev;       /* TRACE_EV_SEND, _RECV or _SPAN | TRACE_SLOT_TICKS | TRACE_SLOT_HANDLED */
    uint8_t      msg_type; /* 0xff: none */
    int16_t      mb;
    actor_addr_t actor;
    actor_addr_t peer;     /* spans: the trace_span_kind_t */
    uint32_t     seq;      /* the envelope seq's low 32 bits (the reader restores the rest) */
    int32_t      step;
    uint32_t     bytes;
    uint64_t     t0;       /* send: the send; receive: the arrival; span: its start */
    uint32_t     delay;    /* handled receive: arrival -> handler start */
    uint32_t     dur;      /* handled receive: handler start -> end; span: t1 - t0 */
} trace_slot_t;
#define TRACE_SLOT_SIZE 40
_Static_assert(sizeof(trace_slot_t) == TRACE_SLOT_SIZE, "a trace slot is 40 bytes on disk");
_Static_assert(sizeof(trace_rec_t) <= 2 * TRACE_SLOT_SIZE, "a wide record fits two slots");

#define TRACE_RING_NAME_MAX 48 /* == TRACE_STR_MAX (trace_file.h), asserted in trace.c */
typedef struct trace_ring {
    trace_slot_t     *buf;
    uint64_t          mask;          /* capacity in slots - 1 */
    _Atomic uint64_t  head;          /* next slot to write; owner thread only */
    _Atomic uint64_t  tail;          /* next slot to read; flusher only */
    _Atomic uint64_t  dropped;       /* records dropped; owner only */
    uint64_t          dropped_seen;  /* flusher: dropped already written */
    _Atomic int       retired;       /* owner thread exited */
    uint32_t          idx;           /* thread index within the process */
    char              name[TRACE_RING_NAME_MAX];
    bool              name_written;
    struct trace_ring *next;
} trace_ring_t;

/* The calling thread's write cursor into its ring. Slots in [pos, lim) are
 * free and before the wrap, as of the last look at the flusher's tail, so
 * taking one is a compare; the slow path (trace_claim_slow_) takes a new
 * look, wraps, creates the ring on first use and counts drops. */
typedef struct {
    trace_slot_t *pos, *lim;  /* pos: the slot of index ring->head */
    uint64_t      wake;       /* wake the flusher when ring->head reaches this */
    trace_ring_t *g;
} trace_cursor_t;
extern _Thread_local trace_cursor_t trace_cur_;

/* n (1 or 2) free slots in a row at trace_cur_.pos, or NULL when the ring
 * is full (the record is dropped and counted). */
trace_slot_t *trace_claim_slow_(uint32_t n);
void          trace_wake_flusher_(void);
/* Record r in two slots (wide). Out of line: not the actor path. */
void          trace_put_wide_(const trace_rec_t *r);
/* A compact record whose fields do not fit one slot, written wide. */
void          trace_put_compact_wide_(uint8_t ev, uint32_t msg_type, actor_addr_t actor, actor_addr_t peer,
                                      uint64_t seq, int64_t step, int32_t mb, uint64_t bytes, uint64_t t0,
                                      uint64_t delay, uint64_t dur);

static inline __attribute__((always_inline)) trace_slot_t *trace_claim_(void)
{
    trace_slot_t *sl = trace_cur_.pos;
    if (__builtin_expect(sl == trace_cur_.lim, 0)) sl = trace_claim_slow_(1);
    return sl;
}

/* Publish n slots claimed at the cursor. */
static inline __attribute__((always_inline)) void trace_commit_(uint32_t n)
{
    trace_cursor_t *c = &trace_cur_;
    c->pos += n;
    /* the owner is the only writer of head: a relaxed load is its own value */
    uint64_t h = atomic_load_explicit(&c->g->head, memory_order_relaxed) + n;
    atomic_store_explicit(&c->g->head, h, memory_order_release);
    if (__builtin_expect(h >= c->wake, 0)) trace_wake_flusher_();
}

/* One compact record: ev is TRACE_EV_* | TRACE_SLOT_TICKS/HANDLED; fields
 * out of a slot's range (a type >= 0xff other than 0xffff "none", an mb
 * outside int16, a step outside int32, bytes, delay or dur >= 2^32) make it
 * wide instead, so nothing is ever truncated but the seq, which the
 * reader restores. */
static inline __attribute__((always_inline)) void
trace_put_compact_(uint8_t ev, uint32_t msg_type, actor_addr_t actor, actor_addr_t peer, uint64_t seq, int64_t step,
                   int32_t mb, uint64_t bytes, uint64_t t0, uint64_t delay, uint64_t dur)
{
    /* 0xffff ("none") keeps its low byte, 0xff */
    bool fits = ((((uint64_t)step + 0x80000000u) | bytes | delay | dur) >> 32) == 0 &&
                ((uint32_t)mb + 0x8000u) >> 16 == 0 && (msg_type < 0xffu || msg_type == 0xffffu);
    if (__builtin_expect(!fits, 0)) {
        trace_put_compact_wide_(ev, msg_type, actor, peer, seq, step, mb, bytes, t0, delay, dur);
        return;
    }
    trace_slot_t *sl = trace_claim_();
    if (!sl) return;
    sl->ev = ev;
    sl->msg_type = (uint8_t)msg_type;
    sl->mb = (int16_t)mb;
    sl->actor = actor;
    sl->peer = peer;
    sl->seq = (uint32_t)seq;
    sl->step = (int32_t)step;
    sl->bytes = (uint32_t)bytes;
    sl->t0 = t0;
    sl->delay = (uint32_t)delay;
    sl->dur = (uint32_t)dur;
    trace_commit_(1);
}

/* TRACE_SLOT_TICKS when trace_ticks() reads the TSC, else 0 (ticks are ns). */
static inline uint8_t trace_ticks_flag_(void)
{
    return atomic_load_explicit(&trace_tsc_, memory_order_relaxed) ? TRACE_SLOT_TICKS : 0;
}

static inline void trace_send(actor_addr_t src, actor_addr_t dst, uint32_t msg_type,
                              uint64_t seq, uint64_t bytes, int64_t step, int32_t mb,
                              uint64_t t_ns)
{
    if (!trace_enabled()) return;
    trace_put_compact_(TRACE_EV_SEND, msg_type, src, dst, seq, step, mb, bytes, t_ns, 0, 0);
}

static inline void trace_recv(actor_addr_t dst, actor_addr_t src, uint32_t msg_type,
                              uint64_t seq, uint64_t bytes, int64_t step, int32_t mb,
                              uint64_t t_ns)
{
    if (!trace_enabled()) return;
    trace_put_compact_(TRACE_EV_RECV, msg_type, dst, src, seq, step, mb, bytes, t_ns, 0, 0);
}

/* A span [t0, t1] of `kind` on `actor`; name_id 0 names it after msg_type
 * (0xffff = none). */
static inline void trace_span(actor_addr_t actor, trace_span_kind_t kind, uint32_t name_id,
                              uint32_t msg_type, int64_t step, int32_t mb, uint64_t t0,
                              uint64_t t1)
{
    if (!trace_enabled()) return;
    if (name_id == 0 && t1 >= t0) {
        trace_put_compact_(TRACE_EV_SPAN, msg_type, actor, (actor_addr_t)kind, 0, step, mb, 0, t0, 0, t1 - t0);
        return;
    }
    trace_put_wide_(&(trace_rec_t){.ev = TRACE_EV_SPAN, .kind = (uint8_t)kind, .msg_type = (uint16_t)msg_type,
                                   .actor = actor, .t0 = t0, .t1 = t1, .step = step, .mb = mb, .name_id = name_id});
}

/* The actor path's records: t0/t1 from trace_ticks(). */
static inline void trace_send_tk(actor_addr_t src, actor_addr_t dst, uint32_t msg_type, uint64_t seq,
                                 uint64_t bytes, int64_t step, int32_t mb, uint64_t ticks)
{
    if (!trace_enabled()) return;
    trace_put_compact_(TRACE_EV_SEND | trace_ticks_flag_(), msg_type, src, dst, seq, step, mb, bytes, ticks, 0, 0);
}

/* A receive and the handler span it started, in one record: arrival at
 * t_arr, handler [t_start, t_end] (ticks; t_arr <= t_start <= t_end). */
static inline void trace_recv_handled_tk(actor_addr_t dst, actor_addr_t src, uint32_t msg_type, uint64_t seq,
                                         uint64_t bytes, int64_t step, int32_t mb, uint64_t t_arr,
                                         uint64_t t_start, uint64_t t_end)
{
    if (!trace_enabled()) return;
    trace_put_compact_(TRACE_EV_RECV | TRACE_SLOT_HANDLED | trace_ticks_flag_(), msg_type, dst, src, seq, step,
                       mb, bytes, t_arr, t_start - t_arr, t_end - t_start);
}

static inline void trace_span_tk(actor_addr_t actor, trace_span_kind_t kind, uint32_t msg_type,
                                 int64_t step, int32_t mb, uint64_t t0, uint64_t t1)
{
    if (!trace_enabled()) return;
    trace_put_compact_(TRACE_EV_SPAN | trace_ticks_flag_(), msg_type, actor, (actor_addr_t)kind, 0, step, mb, 0,
                       t0, 0, t1 - t0);
}

/* A compute span that also carries the CPU time the recording thread spent
 * in it (CLOCK_THREAD_CPUTIME_ID, ns; in the record's `bytes`, unused by
 * spans otherwise; 0 = not measured). Wall time minus CPU time is what the
 * machine took away (preemption, page faults): the pipeline bubble report
 * (trace/bubble.h) replays the schedule with CPU times. */
static inline void trace_span_cpu(actor_addr_t actor, uint32_t name_id, int64_t step, int32_t mb,
                                  uint64_t t0, uint64_t t1, uint64_t cpu_ns)
{
    if (!trace_enabled()) return;
    trace_put_wide_(&(trace_rec_t){.ev = TRACE_EV_SPAN, .kind = TRACE_SPAN_COMPUTE, .msg_type = 0xffff,
                                   .actor = actor, .t0 = t0, .t1 = t1, .bytes = cpu_ns, .step = step, .mb = mb,
                                   .name_id = name_id});
}

static inline void trace_instant(actor_addr_t actor, uint32_t name_id, int64_t step,
                                 uint64_t t_ns)
{
    if (!trace_enabled()) return;
    trace_put_wide_(&(trace_rec_t){.ev = TRACE_EV_INSTANT, .msg_type = 0xffff, .actor = actor, .t0 = t_ns,
                                   .t1 = t_ns, .step = step, .mb = -1, .name_id = name_id});
}

static inline void trace_counter(actor_addr_t actor, uint32_t name_id, double value,
                                 uint64_t t_ns)
{
    if (!trace_enabled()) return;
    trace_put_wide_(&(trace_rec_t){.ev = TRACE_EV_COUNTER, .msg_type = 0xffff, .actor = actor, .t0 = t_ns,
                                   .t1 = t_ns, .value = value, .step = -1, .mb = -1, .name_id = name_id});
}

#endif
