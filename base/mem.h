/* How much memory this process may plan to use, and byte sizes as text.
 *
 * The limit is, in order:
 *   BATON_MEM_LIMIT   when set: a size ("512M", "2G", "1.5GiB", "123456"; K, M,
 *                     G, T are powers of 1024) or "off" (no limit);
 *   otherwise         MemAvailable of /proc/meminfo, lowered to what the
 *                     memory cgroup (v2 memory.max, v1 memory.limit_in_bytes)
 *                     still allows when one is set.
 * Commands compare their estimate (launch/run_mem.h) with it before they
 * allocate, so that a job that cannot fit is refused with the numbers
 * instead of growing until the kernel kills it. */
#ifndef BT_BASE_MEM_H
#define BT_BASE_MEM_H

#include <stddef.h>

#include "base/status.h"

typedef struct {
    double bytes;      /* INFINITY: no limit (BATON_MEM_LIMIT=off, or nothing readable) */
    char   source[96]; /* where the number comes from, for messages */
} base_mem_limit_t;

/* BT_ERR_INVALID with a message in err when BATON_MEM_LIMIT is malformed. */
bt_status_t base_mem_limit_get(base_mem_limit_t *out, char *err, size_t errlen);

/* "2G" -> 2147483648. BT_ERR_INVALID for anything but a positive number
 * with an optional K/M/G/T suffix (optionally followed by "B" or "iB"). */
bt_status_t base_mem_size_parse(const char *s, double *bytes);

/* This process's peak resident memory (VmHWM of /proc/self/status, which
 * starts afresh at exec), in bytes; -1 when unreadable. */
long long base_mem_peak_rss(void);

/* "4.3 GiB", "512 MiB", "12 KiB", "100 B" (three significant digits). */
void base_mem_size_fmt(double bytes, char *buf, size_t cap);

#endif
