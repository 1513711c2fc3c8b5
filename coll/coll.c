/* What every collective backend shares (coll/coll.h): kind names, the
 * blocking form of a call, count splits and local reductions. */
#include "coll/coll.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"

static const char *const coll_kind_names[] = {
    [COLL_KIND_NONE] = "none",
    [COLL_KIND_ALL_REDUCE] = "all_reduce",
    [COLL_KIND_REDUCE_SCATTER] = "reduce_scatter",
    [COLL_KIND_ALL_GATHER] = "all_gather",
    [COLL_KIND_ALL_TO_ALL] = "all_to_all",
    [COLL_KIND_BROADCAST] = "broadcast",
    [COLL_KIND_BARRIER] = "barrier",
};
_Static_assert(sizeof coll_kind_names / sizeof coll_kind_names[0] == COLL_KIND_COUNT,
               "coll_kind_names");

const char *coll_kind_name(coll_kind_t k)
{
    return (unsigned)k < COLL_KIND_COUNT ? coll_kind_names[k] : "?";
}

/* One slot per thread that ever ran coll_run (compute threads: a handful
 * per process); a thread past the table's end runs unwatched. */
#define COLL_WATCH_MAX 32
typedef struct {
    pthread_mutex_t mu;
    bool            active;
    char            name[32];
    uint64_t        seq, bytes, t0;
    coll_kind_t     kind;
    int             rank, size;
} coll_watch_t;

static coll_watch_t watch[COLL_WATCH_MAX];
static _Atomic int watch_used;
static _Thread_local coll_watch_t *watch_mine;
static _Thread_local bool watch_claimed;

static coll_watch_t *watch_slot(void)
{
    if (!watch_claimed) {
        watch_claimed = true;
        int i = watch_used++;
        if (i < COLL_WATCH_MAX) watch_mine = &watch[i];
    }
    return watch_mine;
}

static pthread_once_t watch_once = PTHREAD_ONCE_INIT;
static char stall_name[32];
static int stall_rank = -1;
static unsigned long long stall_seq;

static void watch_init(void)
{
    for (int i = 0; i < COLL_WATCH_MAX; i++) pthread_mutex_init(&watch[i].mu, NULL);
    const char *v = getenv("BATON_TEST_COLL_STALL");
    const char *a = getenv("BATON_ATTEMPT");
    int attempt = a ? atoi(a) : 1;
    stall_rank = -1;
    /* a comma list: the first spec for this attempt (or for any) */
    for (; v && *v && stall_rank < 0; v += strcspn(v, ",") + (v[strcspn(v, ",")] == ',')) {
        int want = 0, n = sscanf(v, "%31[^:]:%d:%llu/%d", stall_name, &stall_rank, &stall_seq, &want);
        if (n < 3 || (n == 4 && want != attempt)) stall_rank = -1;
    }
}

static uint64_t call_bytes(const coll_comm_t *c, const coll_call_t *call)
{
    size_t n = 0;
    switch (call->kind) {
    case COLL_KIND_REDUCE_SCATTER:
    case COLL_KIND_ALL_GATHER:
        for (int r = 0; r < c->size; r++) n += call->counts[r];
        break;
    case COLL_KIND_ALL_TO_ALL:
        for (int r = 0; r < c->size; r++) n += call->send_counts[r];
        break;
    case COLL_KIND_BARRIER: n = 0; break;
    default: n = call->count; break;
    }
    return (uint64_t)n * dtype_size(call->dt);
}

bt_status_t coll_run(coll_comm_t *c, const coll_call_t *call)
{
    pthread_once(&watch_once, watch_init);
    uint64_t seq = ++c->n_run;
    if (stall_rank == c->rank && seq == stall_seq && c->name && !strcmp(c->name, stall_name)) {
        log_warn("coll %s rank %d: BATON_TEST_COLL_STALL: stalling before %s #%llu for good", c->name,
                 c->rank, coll_kind_name(call->kind), (unsigned long long)seq);
        for (;;) sleep(1);
    }
    coll_watch_t *w = watch_slot();
    if (w) {
        uint64_t bytes = (unsigned)call->kind < COLL_KIND_COUNT && call->kind != COLL_KIND_NONE
                             ? call_bytes(c, call) : 0;
        pthread_mutex_lock(&w->mu);
        snprintf(w->name, sizeof w->name, "%s", c->name ? c->name : "?");
        w->seq = seq;
        w->kind = call->kind;
        w->bytes = bytes;
        w->rank = c->rank;
        w->size = c->size;
        w->t0 = clock_now_ns();
        w->active = true;
        pthread_mutex_unlock(&w->mu);
    }
    coll_req_t *req = NULL;
    bt_status_t st = coll_start(c, call, NULL, NULL, &req);
    if (st == BT_IN_PROGRESS) st = coll_wait(c, req);
    if (w) {
        pthread_mutex_lock(&w->mu);
        w->active = false;
        pthread_mutex_unlock(&w->mu);
    }
    return st;
}

size_t coll_watch_describe(char *buf, size_t cap, uint64_t now_ns)
{
    pthread_once(&watch_once, watch_init);
    size_t at = 0;
    if (cap) buf[0] = 0;
    int n = watch_used < COLL_WATCH_MAX ? watch_used : COLL_WATCH_MAX;
    for (int i = 0; i < n && at + 1 < cap; i++) {
        coll_watch_t *w = &watch[i];
        pthread_mutex_lock(&w->mu);
        if (w->active) {
            int k = snprintf(buf + at, cap - at, "coll %s %llu %s %llu %llu %d %d\n", w->name,
                             (unsigned long long)w->seq, coll_kind_name(w->kind),
                             (unsigned long long)w->bytes,
                             (unsigned long long)(now_ns > w->t0 ? (now_ns - w->t0) / 1000000 : 0),
                             w->rank, w->size);
            if (k > 0) at += (size_t)k < cap - at ? (size_t)k : cap - at - 1;
        }
        pthread_mutex_unlock(&w->mu);
    }
    return at;
}

void coll_call_check(const coll_comm_t *c, const coll_call_t *call)
{
    bool needs = call->kind == COLL_KIND_REDUCE_SCATTER || call->kind == COLL_KIND_ALL_GATHER;
    if ((unsigned)call->kind <= COLL_KIND_NONE || call->kind >= COLL_KIND_COUNT ||
        (needs && !call->counts) ||
        (call->kind == COLL_KIND_ALL_TO_ALL && (!call->send_counts || !call->recv_counts)) ||
        (call->kind == COLL_KIND_BROADCAST && (call->root < 0 || call->root >= c->size)))
        BT_PANIC("coll %s %s: malformed %s call", c->ops->name, c->name, coll_kind_name(call->kind));
}

#define COLL_REDUCE_LOOP(T)                                                   \
    do {                                                                      \
        T *d = dst;                                                           \
        const T *s = src;                                                     \
        switch (op) {                                                         \
        case COLL_SUM: for (size_t i = 0; i < n; i++) d[i] += s[i]; break;    \
        case COLL_MAX: for (size_t i = 0; i < n; i++) d[i] = d[i] > s[i] ? d[i] : s[i]; break; \
        case COLL_MIN: for (size_t i = 0; i < n; i++) d[i] = d[i] < s[i] ? d[i] : s[i]; break; \
        default: BT_PANIC("coll: bad op %d", (int)op);                        \
        }                                                                     \
    } while (0)

void coll_reduce_local(void *dst, const void *src, size_t n, dtype_t dt, coll_op_t op)
{
    switch (dt) {
    case DT_F32: COLL_REDUCE_LOOP(float); break;
    case DT_F64: COLL_REDUCE_LOOP(double); break;
    case DT_I32: COLL_REDUCE_LOOP(int32_t); break;
    case DT_I64: COLL_REDUCE_LOOP(int64_t); break;
    default: BT_PANIC("coll: reduction of dtype %s not supported", dtype_name(dt));
    }
}

void coll_counts_even(size_t total, int size, size_t *counts)
{
    size_t base = total / (size_t)size, rem = total % (size_t)size;
    for (int r = 0; r < size; r++) counts[r] = base + ((size_t)r < rem ? 1 : 0);
}

