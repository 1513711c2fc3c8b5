/* A config check of the model's own files: when cond fails, the message
 * (printf-style: the field, its value and what it must be) is logged once,
 * where the check decides (CONVENTIONS.md, "Status and errors"), and the
 * enclosing function returns BT_ERR_INVALID. For functions that return
 * bt_status_t. */
#ifndef BT_MODEL_REQUIRE_H
#define BT_MODEL_REQUIRE_H

#include "base/log.h"
#include "base/status.h"

#define MODEL_REQUIRE(cond, ...)                                                                   \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            log_error(__VA_ARGS__);                                                                \
            return BT_ERR_INVALID;                                                                 \
        }                                                                                          \
    } while (0)

#endif
