/* Logging and panics.
 *
 * One error is logged once, where it is decided (CONVENTIONS.md: status
 * and errors). Every line carries the process tag set by log_set_tag()
 * (e.g. "rank3") so that the merged output of a multi-process job says who
 * spoke.
 * Level from BATON_LOG=error|warn|info|debug (default info). A line names
 * the C source file and line that wrote it only at debug (and in a panic).
 */
#ifndef BT_BASE_LOG_H
#define BT_BASE_LOG_H

#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus /* kernels/cuda/dnn.cu logs too */
extern "C" {
#define BT_NORETURN [[noreturn]]
#else
#define BT_NORETURN _Noreturn
#endif

typedef enum { LOG_ERROR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG } log_level_t;

/* The tag is a plain buffer: set it while the process has one thread (at
 * start, or right after fork), before any other thread logs. The level may
 * be set or read from any thread. */
void log_set_tag(const char *tag);
void log_set_level(log_level_t level);
int  log_enabled(log_level_t level);
void log_write(log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
BT_NORETURN void log_panic(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif

#define log_error(...) log_write(LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)
#define log_warn(...)  log_write(LOG_WARN,  __FILE__, __LINE__, __VA_ARGS__)
#define log_info(...)  do { if (log_enabled(LOG_INFO))  log_write(LOG_INFO,  __FILE__, __LINE__, __VA_ARGS__); } while (0)
#define log_debug(...) do { if (log_enabled(LOG_DEBUG)) log_write(LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__); } while (0)

/* An impossible state: print file:line and abort. */
#define BT_PANIC(...) log_panic(__FILE__, __LINE__, __VA_ARGS__)

#endif
