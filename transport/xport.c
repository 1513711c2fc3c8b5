/* Kind names and the ops table per kind. */
#include "transport/xport.h"

#include <string.h>

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
