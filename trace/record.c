/* Trace recording: per-thread SPSC rings, a flusher thread, one binary file
 * per process (contract in trace.h; file layout in trace_file.h).
 *
 * Memory safety across start/stop: a ring is never freed while its thread
 * lives (the thread may be inside a recording call at any moment, even after
 * trace_stop cleared the flag), only after the thread exited (pthread key
 * destructor marks it retired) and the flusher drained it, or never for the
 * main thread. Rings outlive sessions: trace_start discards what an old
 * session left in them.
 */
#include "trace/trace.h"
#include "trace/format.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"

_Atomic bool trace_on_;
_Atomic bool trace_tsc_;

/* ---- the tick clock (trace_ticks) ------------------------------------------ */

static bool     g_tsc_forced_off;
static bool     g_cal_set;          /* a calibration base exists */
static uint64_t g_cal_tsc0, g_cal_ns0;
#define TRACE_CAL_MIN_NS 2000000ull /* shortest base the rate is taken over */

void trace_clock_force_monotonic(bool force) { g_tsc_forced_off = force; }

/* The TSC is usable as a clock shared by threads and processes when the CPU
 * says it is invariant and the kernel keeps time with it (the kernel then
 * checked it is synchronized across CPUs). */
static bool trace_tsc_usable(void)
{
#if defined(__x86_64__)
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000000u), "c"(0));
    if (a < 0x80000007u) return false;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000007u), "c"(0));
    if (!(d & (1u << 8))) return false; /* invariant TSC */
    char src[32] = "";
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "re");
    if (!f) return false;
    bool ok = fgets(src, sizeof src, f) && !strncmp(src, "tsc", 3) && (src[3] == '\n' || !src[3]);
    fclose(f);
    return ok;
#else
    return false;
#endif
}

/* A (ticks, ns) pair read as close together as the clocks allow. */
static void trace_cal_sample(uint64_t *tsc, uint64_t *ns)
{
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 5; i++) {
        uint64_t a = clock_now_ns();
        uint64_t t = trace_ticks();
        uint64_t b = clock_now_ns();
        if (b - a < best) {
            best = b - a;
            *tsc = t;
            *ns = a + (b - a) / 2;
        }
    }
}

/* A sample at least TRACE_CAL_MIN_NS after the base (a trace that stops
 * right after it started waits that long), for a CLOCK block: the reader
 * takes the rate between the base and the last block's sample, whose error
 * is the sampling jitter (~tens of ns) over the base. */
static void trace_cal_block(trace_clock_blk_t *c)
{
    uint64_t tsc, ns;
    trace_cal_sample(&tsc, &ns);
    while (ns - g_cal_ns0 < TRACE_CAL_MIN_NS) trace_cal_sample(&tsc, &ns);
    *c = (trace_clock_blk_t){.ticks0 = g_cal_tsc0, .ns0 = g_cal_ns0, .ticks1 = tsc, .ns1 = ns};
}

typedef struct {
    actor_addr_t actor;
    char         name[TRACE_STR_MAX];
    bool         written;
} trace_actor_name_t;

#define TRACE_MAX_NAMES  4096
#define TRACE_MAX_ACTORS 4096

/* g_mu guards everything below except the rings' SPSC indices. The file is
 * written only with g_mu held (flusher, trace_flush, trace_stop). */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static trace_ring_t   *g_rings;
static uint32_t        g_next_thread;
static uint64_t        g_dropped_retired; /* drops of freed rings, this session */
static char            g_names[TRACE_MAX_NAMES][TRACE_STR_MAX]; /* [0] unused */
static uint32_t        g_nnames = 1, g_names_written = 1;
static trace_actor_name_t g_actors[TRACE_MAX_ACTORS];
static uint32_t        g_nactors;
static FILE           *g_file;
static char            g_path[4096];
static uint32_t        g_ring_records = 16384; /* slots */
static uint32_t        g_sessions;
static bool            g_atexit_registered;

static pthread_key_t   g_key;
static pthread_once_t  g_key_once = PTHREAD_ONCE_INIT;

/* flusher: woken through a semaphore, not a condition variable (a post is
 * one atomic and at most one futex wake, with no waiter groups that a
 * fork() could copy half-updated into the child; glibc 2.36's condition
 * variables also have a lost-wakeup bug, sourceware 25847). Never destroyed:
 * a producer may post at any time, flusher or not. */
static sem_t           g_wake_sem;
static pthread_once_t  g_wake_once = PTHREAD_ONCE_INIT;
static _Atomic int     g_wake;     /* a post is pending: producers post once */
static _Atomic bool    g_stopping;
static bool            g_flusher_running;
static pthread_t       g_flusher;
static uint32_t        g_flush_ms = 100;

_Static_assert(TRACE_RING_NAME_MAX == TRACE_STR_MAX, "ring names are file names");
_Thread_local trace_cursor_t trace_cur_;

static void trace_ring_retire(void *p)
{
    trace_ring_t *g = p;
    /* a later event of this thread (another destructor) gets a new ring */
    trace_cur_ = (trace_cursor_t){0};
    atomic_store_explicit(&g->retired, 1, memory_order_release);
}

static void trace_key_init(void)
{
    if (pthread_key_create(&g_key, trace_ring_retire) != 0) BT_PANIC("trace: pthread_key_create");
}

/* The calling thread's ring, created on first use (not the hot path). */
static trace_ring_t *trace_ring_get(void)
{
    if (trace_cur_.g) return trace_cur_.g;
    pthread_once(&g_key_once, trace_key_init);
    trace_ring_t *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    pthread_mutex_lock(&g_mu);
    uint64_t cap = g_ring_records;
    pthread_mutex_unlock(&g_mu);
    g->buf = malloc(cap * sizeof *g->buf);
    if (!g->buf) {
        free(g);
        return NULL;
    }
    g->mask = cap - 1;
    pthread_mutex_lock(&g_mu);
    g->idx = g_next_thread++;
    g->next = g_rings;
    g_rings = g;
    pthread_mutex_unlock(&g_mu);
    pthread_setspecific(g_key, g);
    trace_cur_ = (trace_cursor_t){.pos = g->buf, .lim = g->buf, .g = g};
    return g;
}

/* A new look at the flusher's tail: the cursor's free run (up to the wrap)
 * and the head at which the fill reaches half the ring. */
trace_slot_t *trace_claim_slow_(uint32_t n)
{
    trace_ring_t *g = trace_ring_get();
    if (!g) return NULL;
    trace_cursor_t *c = &trace_cur_;
    uint64_t cap = g->mask + 1, h = atomic_load_explicit(&g->head, memory_order_relaxed);
    uint64_t t = atomic_load_explicit(&g->tail, memory_order_acquire);
    uint64_t used = h - t, at = h & g->mask, to_wrap = cap - at;
    if (to_wrap < n) { /* a pair would straddle the wrap: a pad slot first */
        if (used + to_wrap + n > cap) goto full;
        g->buf[at].ev = TRACE_SLOT_PAD;
        h += to_wrap;
        atomic_store_explicit(&g->head, h, memory_order_release);
        used += to_wrap;
        at = 0;
        to_wrap = cap;
    }
    if (cap - used < n) goto full;
    c->pos = &g->buf[at];
    c->lim = c->pos + (cap - used < to_wrap ? cap - used : to_wrap);
    c->wake = used < cap / 2 ? t + cap / 2 : h + 1; /* at half full (again, if it is past) */
    return c->pos;
full:
    atomic_store_explicit(&g->dropped, atomic_load_explicit(&g->dropped, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    c->pos = c->lim = &g->buf[at]; /* the next record looks again */
    return NULL;
}

/* Once per look at the tail (trace_claim_slow_ sets the next wake). */
void trace_wake_flusher_(void)
{
    trace_cur_.wake = UINT64_MAX;
    if (atomic_exchange_explicit(&g_wake, 1, memory_order_acq_rel) == 0) sem_post(&g_wake_sem);
}

void trace_put_wide_(const trace_rec_t *r)
{
    trace_slot_t *at = trace_cur_.pos;
    if (trace_cur_.lim - at < 2 && !(at = trace_claim_slow_(2))) return;
    memset(at, 0, 2 * sizeof *at);
    memcpy(at, r, sizeof *r);
    at->ev = (uint8_t)(r->ev | TRACE_SLOT_WIDE);
    trace_commit_(2);
}

void trace_put_compact_wide_(uint8_t ev, uint32_t msg_type, actor_addr_t actor, actor_addr_t peer, uint64_t seq,
                             int64_t step, int32_t mb, uint64_t bytes, uint64_t t0, uint64_t delay, uint64_t dur)
{
    uint32_t flags = ev & TRACE_SLOT_TICKS ? TRACE_REC_TICKS : 0;
    uint8_t  e = ev & TRACE_SLOT_EV_MASK;
    uint64_t t1 = t0 + dur < t0 ? t0 : t0 + dur;
    if (e == TRACE_EV_SPAN) {
        trace_put_wide_(&(trace_rec_t){.ev = e, .kind = (uint8_t)peer, .msg_type = (uint16_t)msg_type,
                                       .actor = actor, .t0 = t0, .t1 = t1, .step = step, .mb = mb,
                                       .reserved = flags});
        return;
    }
    trace_rec_t r = {.ev = e, .msg_type = (uint16_t)msg_type, .actor = actor, .peer = peer, .t0 = t0, .t1 = t0,
                     .bytes = bytes, .seq = seq, .step = step, .mb = mb, .reserved = flags};
    trace_put_wide_(&r);
    if (e == TRACE_EV_RECV && (ev & TRACE_SLOT_HANDLED)) { /* the handler span, a record of its own */
        uint64_t start = t0 + delay < t0 ? t0 : t0 + delay;
        uint64_t end = start + dur < start ? start : start + dur;
        trace_put_wide_(&(trace_rec_t){.ev = TRACE_EV_SPAN, .kind = TRACE_SPAN_HANDLER,
                                       .msg_type = (uint16_t)msg_type, .actor = actor, .t0 = start, .t1 = end,
                                       .step = step, .mb = mb, .reserved = flags});
    }
}

/* ---- file writing (g_mu held) -------------------------------------------- */

static bool trace_blk_write(uint32_t kind, uint32_t arg, uint32_t count, const void *body, size_t len)
{
    trace_blk_t b = {.kind = TRACE_BLK_MAGIC | kind, .arg = arg, .count = count, .len = (uint32_t)len};
    return fwrite(&b, sizeof b, 1, g_file) == 1 && (len == 0 || fwrite(body, len, 1, g_file) == 1);
}

static bool trace_str_blk(uint32_t kind, uint32_t arg, const char *s)
{
    return trace_blk_write(kind, arg, 0, s, strnlen(s, TRACE_STR_MAX - 1));
}

/* Names, then every ring's records and drop counts; frees drained rings of
 * exited threads. */
static void trace_drain_locked(void)
{
    if (!g_file) return;
    bool ok = true;
    for (; g_names_written < g_nnames; g_names_written++)
        ok &= trace_str_blk(TRACE_BLK_NAME, g_names_written, g_names[g_names_written]);
    for (uint32_t i = 0; i < g_nactors; i++) {
        if (g_actors[i].written) continue;
        ok &= trace_str_blk(TRACE_BLK_ACTOR, g_actors[i].actor, g_actors[i].name);
        g_actors[i].written = true;
    }
    /* tick records are written as they are, after a CLOCK block the reader
     * converts them with */
    if (g_cal_set && atomic_load(&trace_tsc_)) {
        trace_clock_blk_t c;
        trace_cal_block(&c);
        ok &= trace_blk_write(TRACE_BLK_CLOCK, 0, 0, &c, sizeof c);
    }
    for (trace_ring_t **pp = &g_rings; *pp;) {
        trace_ring_t *g = *pp;
        if (g->name[0] && !g->name_written) {
            ok &= trace_str_blk(TRACE_BLK_THREAD, g->idx, g->name);
            g->name_written = true;
        }
        int retired = atomic_load_explicit(&g->retired, memory_order_acquire);
        uint64_t h = atomic_load_explicit(&g->head, memory_order_acquire);
        uint64_t t = atomic_load_explicit(&g->tail, memory_order_relaxed);
        while (t < h) {
            uint64_t cap = g->mask + 1, at = t & g->mask;
            uint64_t n = h - t < cap - at ? h - t : cap - at; /* up to the wrap */
            ok &= trace_blk_write(TRACE_BLK_RECS, g->idx, (uint32_t)n, &g->buf[at], n * sizeof(trace_slot_t));
            t += n;
            atomic_store_explicit(&g->tail, t, memory_order_release);
        }
        uint64_t d = atomic_load_explicit(&g->dropped, memory_order_relaxed);
        if (d != g->dropped_seen) {
            uint64_t delta = d - g->dropped_seen;
            ok &= trace_blk_write(TRACE_BLK_DROPPED, g->idx, (uint32_t)(delta > UINT32_MAX ? UINT32_MAX : delta),
                                  NULL, 0);
            g->dropped_seen = d;
        }
        if (retired) {
            g_dropped_retired += d;
            *pp = g->next;
            free(g->buf);
            free(g);
            continue;
        }
        pp = &g->next;
    }
    ok &= fflush(g_file) == 0;
    if (!ok) {
        log_error("trace: writing %s failed: %s; tracing stops", g_path, strerror(errno));
        atomic_store(&trace_on_, false);
    }
}

static void trace_wake_init(void)
{
    if (sem_init(&g_wake_sem, 0, 0) != 0) BT_PANIC("trace: sem_init: %s", strerror(errno));
}

static void *trace_flusher_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&g_stopping)) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)g_flush_ms * 1000000ull;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        while (sem_clockwait(&g_wake_sem, CLOCK_MONOTONIC, &ts) != 0 && errno == EINTR) {}
        atomic_store(&g_wake, 0);
        if (atomic_load(&g_stopping)) break;
        pthread_mutex_lock(&g_mu);
        trace_drain_locked();
        pthread_mutex_unlock(&g_mu);
    }
    return NULL;
}

static void trace_atexit(void) { trace_stop(); }

/* fork(): the child must neither write into the parent's file (the FILE's
 * buffer and offset are copies) nor wait for a flusher it does not have, and
 * no lock may be held by a thread that does not exist in it. So the locks
 * are taken around fork and the child starts with tracing off and no file;
 * it may call trace_start itself. */
static void trace_fork_prepare(void) { pthread_mutex_lock(&g_mu); }

static void trace_fork_parent(void) { pthread_mutex_unlock(&g_mu); }

static void trace_fork_child(void)
{
    atomic_store(&trace_on_, false);
    g_file = NULL; /* the parent's FILE is not ours to flush or close */
    g_flusher_running = false;
    atomic_store(&g_stopping, false);
    atomic_store(&g_wake, 0);
    /* the parent's flusher may have been waiting on it: a fresh one */
    sem_destroy(&g_wake_sem);
    trace_wake_init();
    pthread_mutex_unlock(&g_mu);
}

bt_status_t trace_start(const char *dir, uint32_t rank, const trace_config_t *cfg)
{
    trace_config_t c = cfg ? *cfg : (trace_config_t){0};
    uint32_t ring = c.ring_records ? c.ring_records : 16384;
    if (ring < 2 || (ring & (ring - 1))) {
        log_error("trace: ring_records %u is not a power of two >= 2", ring);
        return BT_ERR_INVALID;
    }
    pthread_mutex_lock(&g_mu);
    if (g_file) {
        pthread_mutex_unlock(&g_mu);
        log_error("trace: already started (%s)", g_path);
        return BT_ERR_BUSY;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        log_error("trace: cannot create directory %s: %s", dir, strerror(errno));
        pthread_mutex_unlock(&g_mu);
        return BT_ERR_IO;
    }
    if (g_sessions == 0)
        snprintf(g_path, sizeof g_path, "%s/trace-%u-%d.bin", dir, rank, (int)getpid());
    else
        snprintf(g_path, sizeof g_path, "%s/trace-%u-%d.%u.bin", dir, rank, (int)getpid(), g_sessions);
    FILE *f = fopen(g_path, "wbe");
    if (!f) {
        log_error("trace: cannot create %s: %s", g_path, strerror(errno));
        pthread_mutex_unlock(&g_mu);
        return BT_ERR_IO;
    }
    trace_file_hdr_t h = {.magic = TRACE_MAGIC, .version = TRACE_VERSION, .rank = rank,
                          .pid = (uint32_t)getpid(), .rec_size = sizeof(trace_slot_t),
                          .t_start_ns = clock_now_ns()};
    if (fwrite(&h, sizeof h, 1, f) != 1) {
        log_error("trace: cannot write %s: %s", g_path, strerror(errno));
        fclose(f);
        pthread_mutex_unlock(&g_mu);
        return BT_ERR_IO;
    }
    if (c.run_id && c.run_id[0]) {
        trace_blk_t b = {.kind = TRACE_BLK_MAGIC | TRACE_BLK_RUN,
                         .len = (uint32_t)strnlen(c.run_id, TRACE_STR_MAX - 1)};
        if (fwrite(&b, sizeof b, 1, f) != 1 || fwrite(c.run_id, b.len, 1, f) != 1) {
            log_error("trace: cannot write %s: %s", g_path, strerror(errno));
            fclose(f);
            pthread_mutex_unlock(&g_mu);
            return BT_ERR_IO;
        }
    }
    g_file = f;
    g_sessions++;
    /* the tick clock: decided while no event is being recorded */
    const char *clk = getenv("BATON_TRACE_CLOCK"); /* "monotonic": never the TSC */
    atomic_store(&trace_tsc_, !g_tsc_forced_off && !(clk && !strcmp(clk, "monotonic")) && trace_tsc_usable());
    if (atomic_load(&trace_tsc_) && !g_cal_set) {
        trace_cal_sample(&g_cal_tsc0, &g_cal_ns0);
        g_cal_set = true;
    }
    g_ring_records = ring;
    g_flush_ms = c.flush_ms ? c.flush_ms : 100;
    g_dropped_retired = 0;
    /* A new file: every name is written again; stale events are discarded. */
    g_names_written = 1;
    for (uint32_t i = 0; i < g_nactors; i++) g_actors[i].written = false;
    for (trace_ring_t *g = g_rings; g; g = g->next) {
        g->name_written = false;
        atomic_store(&g->tail, atomic_load(&g->head));
        g->dropped_seen = atomic_load(&g->dropped);
        g_dropped_retired -= g->dropped_seen; /* so trace_dropped() counts from now */
    }
    if (!g_atexit_registered) {
        atexit(trace_atexit);
        pthread_atfork(trace_fork_prepare, trace_fork_parent, trace_fork_child);
        g_atexit_registered = true;
    }
    pthread_once(&g_wake_once, trace_wake_init);
    atomic_store(&g_stopping, false);
    g_flusher_running = false;
    atomic_store(&g_wake, 0);
    if (!c.no_flusher) {
        if (pthread_create(&g_flusher, NULL, trace_flusher_main, NULL) != 0) {
            log_warn("trace: no flusher thread; rings drain only at trace_flush/trace_stop");
        } else {
            g_flusher_running = true;
        }
    }
    atomic_store(&trace_on_, true);
    pthread_mutex_unlock(&g_mu);
    return BT_OK;
}

void trace_stop(void)
{
    pthread_mutex_lock(&g_mu);
    if (!g_file) {
        pthread_mutex_unlock(&g_mu);
        return;
    }
    atomic_store(&trace_on_, false);
    bool running = g_flusher_running;
    g_flusher_running = false;
    pthread_mutex_unlock(&g_mu);
    if (running) {
        atomic_store(&g_stopping, true);
        sem_post(&g_wake_sem);
        pthread_join(g_flusher, NULL);
    }
    pthread_mutex_lock(&g_mu);
    trace_drain_locked();
    if (g_file) {
        bool ok = trace_blk_write(TRACE_BLK_END, 0, 0, NULL, 0);
        ok &= fclose(g_file) == 0;
        if (!ok) log_error("trace: closing %s failed: %s", g_path, strerror(errno));
        g_file = NULL;
    }
    pthread_mutex_unlock(&g_mu);
}

void trace_set_recording(bool on)
{
    pthread_mutex_lock(&g_mu);
    if (g_file) atomic_store(&trace_on_, on);
    pthread_mutex_unlock(&g_mu);
}

void trace_flush(void)
{
    pthread_mutex_lock(&g_mu);
    trace_drain_locked();
    pthread_mutex_unlock(&g_mu);
}

uint64_t trace_dropped(void)
{
    pthread_mutex_lock(&g_mu);
    uint64_t n = g_dropped_retired;
    for (trace_ring_t *g = g_rings; g; g = g->next) n += atomic_load(&g->dropped);
    pthread_mutex_unlock(&g_mu);
    return n;
}

void trace_thread_name(const char *name)
{
    trace_ring_t *g = trace_ring_get();
    if (!g) return;
    pthread_mutex_lock(&g_mu);
    snprintf(g->name, sizeof g->name, "%s", name);
    g->name_written = false;
    pthread_mutex_unlock(&g_mu);
}

void trace_actor_name(actor_addr_t actor, const char *name)
{
    pthread_mutex_lock(&g_mu);
    uint32_t i = 0;
    while (i < g_nactors && g_actors[i].actor != actor) i++;
    if (i == g_nactors) {
        if (g_nactors == TRACE_MAX_ACTORS) {
            pthread_mutex_unlock(&g_mu);
            log_warn("trace: more than %d named actors; %s stays unnamed", TRACE_MAX_ACTORS, name);
            return;
        }
        g_nactors++;
    }
    g_actors[i].actor = actor;
    snprintf(g_actors[i].name, sizeof g_actors[i].name, "%s", name);
    g_actors[i].written = false;
    pthread_mutex_unlock(&g_mu);
}

uint32_t trace_intern(const char *name)
{
    char key[TRACE_STR_MAX];
    snprintf(key, sizeof key, "%s", name);
    pthread_mutex_lock(&g_mu);
    uint32_t id = 1;
    while (id < g_nnames && strcmp(g_names[id], key)) id++;
    if (id == g_nnames) {
        if (g_nnames == TRACE_MAX_NAMES) {
            pthread_mutex_unlock(&g_mu);
            log_warn("trace: more than %d names; '%s' is recorded unnamed", TRACE_MAX_NAMES - 1, key);
            return 0;
        }
        memcpy(g_names[id], key, sizeof key);
        g_nnames++;
    }
    pthread_mutex_unlock(&g_mu);
    return id;
}
