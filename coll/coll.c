/* What every collective backend shares (coll/coll.h): kind names, the
 * blocking form of a call, count splits and local reductions. */
#include "coll/coll.h"

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

bt_status_t coll_run(coll_comm_t *c, const coll_call_t *call)
{
    coll_req_t *req = NULL;
    bt_status_t st = coll_start(c, call, NULL, NULL, &req);
    if (st != BT_IN_PROGRESS) return st;
    return coll_wait(c, req);
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

