#ifndef BT_BASE_CLOCK_H
#define BT_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Monotonic nanoseconds; the trace clock. CLOCK_MONOTONIC is shared by all
 * processes of one host, so traces of local processes line up. */
static inline uint64_t clock_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
