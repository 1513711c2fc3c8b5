#ifndef BT_BASE_CLOCK_H
#define BT_BASE_CLOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* Monotonic nanoseconds; the trace clock. CLOCK_MONOTONIC is shared by all
 * processes of one host, so traces of local processes line up. */
static inline uint64_t clock_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A long loop's progress lines: clock_every_due is true once every
 * BATON_PROGRESS_SECONDS (default 10, 0 every call; read at clock_every_start) and gives
 * the seconds since the start. */
typedef struct {
    uint64_t t_start, t_last;
    double   every_s;
} clock_every_t;

static inline void clock_every_start(clock_every_t *e)
{
    const char *v = getenv("BATON_PROGRESS_SECONDS");
    double s = v && *v ? strtod(v, NULL) : -1;
    e->every_s = s >= 0 ? s : 10.0; /* 0: a line every time it is asked */
    e->t_start = e->t_last = clock_now_ns();
}

static inline bool clock_every_due(clock_every_t *e, double *elapsed_s)
{
    uint64_t now = clock_now_ns();
    if ((double)(now - e->t_last) * 1e-9 < e->every_s) return false;
    e->t_last = now;
    *elapsed_s = (double)(now - e->t_start) * 1e-9;
    return true;
}

#endif
