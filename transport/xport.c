/* Kind names and the ops table per kind. */
#include "transport/xport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

/* gcc says __SANITIZE_THREAD__; clang answers __has_feature */
#if defined(__SANITIZE_THREAD__)
#define XPORT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define XPORT_TSAN 1
#endif
#endif
#if defined(XPORT_TSAN) && defined(BT_HAVE_UCX)
#include <ucm/api/ucm.h>
#endif

const char *xport_ucx_env_check(void)
{
#if defined(XPORT_TSAN) && defined(BT_HAVE_UCX)
    /* what UCX parsed (environment, or a UCX config file), not getenv */
    if (ucm_global_opts.enable_events)
        return "this ThreadSanitizer build needs UCX_MEM_EVENTS=no in its environment: UCX's "
               "memory-event hook on madvise crashes TSan when a thread exits (tests/run.sh sets it)";
#endif
    return NULL;
}

bt_status_t xport_send_check(const xport_ep_t *ep, size_t max_frame, const void *hdr, size_t hdr_len,
                             const struct iovec *iov, int iovcnt, size_t *payload_len)
{
    if (iovcnt < 0 || (iovcnt > 0 && !iov) || (hdr_len > 0 && !hdr)) return BT_ERR_INVALID;
    size_t n = 0;
    for (int i = 0; i < iovcnt; i++) n += iov[i].iov_len;
    if (hdr_len > XPORT_HDR_MAX || hdr_len > max_frame || n > max_frame - hdr_len) {
        log_error("%s: send of %zu+%zu bytes to %s exceeds the frame limit (hdr %u, frame %zu)", ep->ops->name,
                  hdr_len, n, ep->peer_addr, XPORT_HDR_MAX, max_frame);
        return BT_ERR_INVALID;
    }
    *payload_len = n;
    return BT_OK;
}

/* Why each (see transport/ucx.c's header comment for the measurements):
 *  MM_ERROR_HANDLING=y  shared memory between the processes of a host in
 *      peer error-handling mode; UCX 1.13 keeps posix/sysv off in that mode
 *      by default, which sends same-host traffic over tcp on loopback.
 *  TCP_PUT_ENABLE=n     no tcp lanes for rendezvous RMA: with them every
 *      ucp_worker_progress makes an epoll_wait for the tcp interface (~500
 *      ns instead of ~11 ns per empty progress here), and same-host
 *      rendezvous over shared-memory AM fragments was faster too. Costs ~25%
 *      bandwidth when UCX runs over plain tcp between hosts: set
 *      UCX_TCP_PUT_ENABLE=y there. RDMA transports are unaffected.
 *  KEEPALIVE_INTERVAL=1s  how soon a dead peer is noticed. Endpoints are
 *      connected by worker address (no connection manager socket whose
 *      close would report it at once), so over shared memory UCX's
 *      keepalive finds a dead process: every 20 s by default. A round
 *      checks each endpoint's peer process, cheap at this rate. */
const xport_ucx_setting_t xport_ucx_settings[XPORT_UCX_NSETTINGS] = {
    {"MM_ERROR_HANDLING", "MM_ERROR_HANDLING", "y", {"POSIX_ERROR_HANDLING", "SYSV_ERROR_HANDLING"}},
    {"TCP_PUT_ENABLE", "PUT_ENABLE", "n", {NULL, NULL}},
    {"KEEPALIVE_INTERVAL", "KEEPALIVE_INTERVAL", "1s", {NULL, NULL}},
};

bool xport_ucx_setting_from_env(int i)
{
    const xport_ucx_setting_t *s = &xport_ucx_settings[i];
    const char *names[] = {s->name, s->aliases[0], s->aliases[1]};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char env[96];
        if (!names[k]) continue;
        snprintf(env, sizeof env, "UCX_%s", names[k]);
        if (getenv(env)) return true;
    }
    return false;
}

/* Indexed by xport_kind_t; NULL where a transport is not built. */
static const xport_ops_t *const xport_ops_table[] = {
    [XPORT_INPROC] = &xport_inproc_ops,
    [XPORT_TCP]    = &xport_tcp_ops,
#ifdef BT_HAVE_UCX
    [XPORT_UCX]    = &xport_ucx_ops,
#else
    [XPORT_UCX]    = NULL,
#endif
};
_Static_assert(sizeof xport_ops_table / sizeof xport_ops_table[0] == XPORT_KIND_COUNT,
               "one ops entry per xport_kind_t");

static const char *const xport_kind_names[] = {
    [XPORT_INPROC] = "inproc",
    [XPORT_TCP]    = "tcp",
    [XPORT_UCX]    = "ucx",
};
_Static_assert(sizeof xport_kind_names / sizeof xport_kind_names[0] == XPORT_KIND_COUNT,
               "one name per xport_kind_t");

const xport_ops_t *xport_ops_get(xport_kind_t kind)
{
    if ((unsigned)kind >= XPORT_KIND_COUNT) return NULL;
    if (kind == XPORT_TCP && xport_fault_wanted()) return &xport_fault_ops;
    return xport_ops_table[kind];
}

const char *xport_kind_name(xport_kind_t kind)
{
    if ((unsigned)kind >= XPORT_KIND_COUNT) return "?";
    return xport_kind_names[kind];
}

bt_status_t xport_kind_parse(const char *name, xport_kind_t *kind, bool *is_auto)
{
    if (!name) return BT_ERR_INVALID;
    if (!strcmp(name, "auto")) {
        *kind = XPORT_TCP; /* placeholder: the caller resolves auto per edge */
        *is_auto = true;
        return BT_OK;
    }
    for (int k = 0; k < XPORT_KIND_COUNT; k++) {
        if (!strcmp(name, xport_kind_names[k])) {
            *kind = (xport_kind_t)k;
            *is_auto = false;
            return BT_OK;
        }
    }
    return BT_ERR_INVALID;
}
