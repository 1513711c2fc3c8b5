/* Reference measurements for `baton bench transport` (the actor-path
 * benchmark compares against these).
 *
 * Units: lat_us is one-way latency in microseconds (half the round trip of a
 * ping-pong); gbytes_s is one-way throughput in 1e9 bytes per second. */
#ifndef BT_BENCH_REF_H
#define BT_BENCH_REF_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "transport/xport.h"

/* Plain blocking TCP sockets over 127.0.0.1: this process and a forked
 * child ping-pong `bytes` each way, `iters` times (after a short warm-up). */
bt_status_t bench_ref_sock_pingpong(size_t bytes, int iters, double *lat_us, double *gbytes_s);

/* Runs `ucx_perftest` (Debian ucx-utils) as server + client on loopback:
 * test "ucp_am_lat" (lat_us from its average latency) or "ucp_am_bw"
 * (gbytes_s from its average bandwidth; lat_us is its per-message
 * overhead). err_mode: endpoints in peer error-handling mode (-e) and the
 * UCX settings transport/ucx.c applies on loopback (xport_ucx_settings and
 * xport_ucx_net_select's UCX_TLS=sm,self, unless the environment sets
 * them), i.e. the configuration our transport runs in.
 * BT_ERR_NOT_FOUND when the tool is missing. */
bt_status_t bench_ref_ucx_perftest(const char *test, size_t bytes, int iters, bool err_mode,
                                   double *lat_us, double *gbytes_s);

/* Our own transport without actors: two threads, each with its own libev
 * loop and xport of `kind`, over loopback (inproc: in-process). The client
 * sends `bytes` of payload with an 8-byte header, the server echoes the
 * payload back. busy_poll: both sides spin on xport progress instead of
 * sleeping in the loop. */
bt_status_t bench_xport_pingpong(xport_kind_t kind, size_t bytes, int iters, bool busy_poll,
                                 double *lat_us, double *gbytes_s);

#endif
