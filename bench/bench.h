/* Benchmarks behind `baton bench`. */
#ifndef BT_BENCH_BENCH_H
#define BT_BENCH_BENCH_H

#include <stddef.h>

#include "base/status.h"
#include "transport/xport.h"

/* `baton bench ckpt ...` (bench/bench_ckpt.c): one checkpoint save and load. */
int bench_ckpt_main(int argc, char **argv);

/* `baton bench transport ...` (bench/bench_transport.c). */
int bench_transport_main(int argc, char **argv);

/* Reference numbers measured without the actor runtime, in the same run. */
typedef struct {
    char   name[64];          /* e.g. "sock_pingpong", "ucx_perftest ucp_am_lat/bw" */
    double latency_us;        /* one-way, 8-byte messages; 0 when not measured */
    double bandwidth_gbps;    /* at bandwidth_bytes; 0 when not measured */
    size_t bandwidth_bytes;
    double latency_plain_us;  /* ucx: ucp_am_lat without error handling (context only); else 0 */
} bench_ref_t;

/* Measure the reference for a transport kind (bench/bench_ref.c): plain
 * blocking sockets for tcp, ucx_perftest for ucx. BT_ERR_UNSUPPORTED for
 * inproc (no reference). */
bt_status_t bench_ref_run(xport_kind_t kind, unsigned iters, size_t big_bytes, bench_ref_t *out);

#endif
