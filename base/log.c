#include "base/log.h"
#include "base/status.h"
#include "base/clock.h"

#include <stdarg.h>
#include <string.h>
#include <unistd.h>

static char g_tag[32] = "";
static int g_level = -1;

void log_set_tag(const char *tag)
{
    snprintf(g_tag, sizeof g_tag, "%s", tag ? tag : "");
}

void log_set_level(log_level_t level) { g_level = (int)level; }

static int log_level_get(void)
{
    if (g_level < 0) {
        const char *e = getenv("BATON_LOG");
        g_level = LOG_INFO;
        if (e) {
            if (!strcmp(e, "error")) g_level = LOG_ERROR;
            else if (!strcmp(e, "warn")) g_level = LOG_WARN;
            else if (!strcmp(e, "debug")) g_level = LOG_DEBUG;
        }
    }
    return g_level;
}

int log_enabled(log_level_t level) { return (int)level <= log_level_get(); }

static void log_vwrite(const char *lvl, const char *file, int line, const char *fmt, va_list ap)
{
    char buf[2048];
    int n = g_tag[0] ? snprintf(buf, sizeof buf, "baton[%s] %s %s:%d: ", g_tag, lvl, file, line)
                     : snprintf(buf, sizeof buf, "baton %s %s:%d: ", lvl, file, line);
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
    log_vwrite(names[level], file, line, fmt, ap);
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
