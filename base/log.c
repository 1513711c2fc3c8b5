#include "base/log.h"
#include "base/status.h"
#include "base/clock.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

static char g_tag[32] = "";
/* -1 until the first log_enabled() reads BATON_LOG (or log_set_level sets
 * it). Any thread may be first, so it is atomic; relaxed is enough because
 * the level is the only thing published. */
static _Atomic int g_level = -1;

void log_set_tag(const char *tag)
{
    snprintf(g_tag, sizeof g_tag, "%s", tag ? tag : "");
}

void log_set_level(log_level_t level) { atomic_store_explicit(&g_level, (int)level, memory_order_relaxed); }

static int log_level_get(void)
{
    int level = atomic_load_explicit(&g_level, memory_order_relaxed);
    if (level >= 0) return level;
    const char *e = getenv("BATON_LOG");
    level = LOG_INFO;
    if (e) {
        if (!strcmp(e, "error")) level = LOG_ERROR;
        else if (!strcmp(e, "warn")) level = LOG_WARN;
        else if (!strcmp(e, "debug")) level = LOG_DEBUG;
    }
    /* threads racing here compute the same value; a log_set_level that got
     * in first wins over the environment */
    int unset = -1;
    if (!atomic_compare_exchange_strong_explicit(&g_level, &unset, level, memory_order_relaxed,
                                                 memory_order_relaxed))
        level = unset;
    return level;
}

int log_enabled(log_level_t level) { return (int)level <= log_level_get(); }

static void log_vwrite(const char *lvl, const char *file, int line, const char *fmt, va_list ap)
{
    char buf[2048];
    /* The source location is for whoever debugs baton, not for whoever runs
     * it: only at BATON_LOG=debug (and in a panic, a bug of baton's). */
    int n;
    if (file && g_tag[0]) n = snprintf(buf, sizeof buf, "baton[%s] %s %s:%d: ", g_tag, lvl, file, line);
    else if (file) n = snprintf(buf, sizeof buf, "baton %s %s:%d: ", lvl, file, line);
    else if (g_tag[0]) n = snprintf(buf, sizeof buf, "baton[%s] %s: ", g_tag, lvl);
    else n = snprintf(buf, sizeof buf, "baton %s: ", lvl);
    if (n < 0) n = 0;
    if ((size_t)n < sizeof buf) vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    size_t len = strnlen(buf, sizeof buf - 2);
    buf[len++] = '\n';
    /* one write() per line so that lines of concurrent processes do not interleave */
    ssize_t w = write(2, buf, len);
    (void)w;
}

void log_write(log_level_t level, const char *file, int line, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    _Static_assert(sizeof names / sizeof names[0] == LOG_DEBUG + 1, "level names");
    if (!log_enabled(level)) return;
    va_list ap;
    va_start(ap, fmt);
    log_vwrite(names[level], log_enabled(LOG_DEBUG) ? file : NULL, line, fmt, ap);
    va_end(ap);
}

void log_panic(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vwrite("PANIC", file, line, fmt, ap);
    va_end(ap);
    abort();
}

const char *bt_status_str(bt_status_t s)
{
    switch (s) {
    case BT_OK: return "OK";
    case BT_IN_PROGRESS: return "IN_PROGRESS";
    case BT_ERR_NOMEM: return "NOMEM";
    case BT_ERR_INVALID: return "INVALID";
    case BT_ERR_IO: return "IO";
    case BT_ERR_UNSUPPORTED: return "UNSUPPORTED";
    case BT_ERR_NOT_FOUND: return "NOT_FOUND";
    case BT_ERR_BUSY: return "BUSY";
    case BT_ERR_TIMEOUT: return "TIMEOUT";
    case BT_ERR_CANCELED: return "CANCELED";
    case BT_ERR_CORRUPT: return "CORRUPT";
    case BT_ERR_NUMERIC: return "NUMERIC";
    case BT_ERR_DEVICE: return "DEVICE";
    case BT_ERR_PEER_CLOSED: return "PEER_CLOSED";
    case BT_ERR_PEER_PROTO: return "PEER_PROTO";
    case BT_ERR_PEER_AUTH: return "PEER_AUTH";
    case BT_ERR_PEER_UNREACH: return "PEER_UNREACH";
    case BT_ERR_PEER_TIMEOUT: return "PEER_TIMEOUT";
    default: return bt_status_is_peer(s) ? "PEER_ERROR" : "UNKNOWN";
    }
}
