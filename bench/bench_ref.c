/* Reference numbers for `baton bench transport`, measured by the transport
 * helper's reference programs (bench/ref.h) in the same run:
 *   tcp     plain blocking-socket ping-pong (bench/ref_sock_pingpong.c)
 *   ucx     ucx_perftest ucp_am_lat / ucp_am_bw (bench/ref_ucx_perftest.c)
 *           with endpoints in error-handling mode, as ours are (-e); the
 *           latency without it is measured too, for context
 *   inproc  no outside reference exists; our transport without the actor
 *           layer (bench/ref_xport_pingpong.c, busy polling) stands in. */
#include "bench/bench.h"

#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "bench/ref.h"

static int ref_iters_for(size_t bytes)
{
    size_t n = (512u << 20) / (bytes ? bytes : 1);
    if (n > 20000) n = 20000;
    if (n < 8) n = 8;
    return (int)n;
}

bt_status_t bench_ref_run(xport_kind_t kind, unsigned iters, size_t big_bytes, bench_ref_t *out)
{
    memset(out, 0, sizeof *out);
    double lat = 0, bw = 0, unused = 0;
    bt_status_t st = BT_ERR_UNSUPPORTED;
    switch (kind) {
    case XPORT_TCP:
        snprintf(out->name, sizeof out->name, "sock_pingpong");
        st = bench_ref_sock_pingpong(8, (int)iters, &lat, &unused);
        if (st == BT_OK && big_bytes) st = bench_ref_sock_pingpong(big_bytes, ref_iters_for(big_bytes), &unused, &bw);
        break;
    case XPORT_UCX:
        snprintf(out->name, sizeof out->name, "ucx_perftest -e ucp_am_lat/ucp_am_bw");
        st = bench_ref_ucx_perftest("ucp_am_lat", 8, (int)iters, true, &lat, &unused);
        if (st == BT_OK && big_bytes)
            st = bench_ref_ucx_perftest("ucp_am_bw", big_bytes, ref_iters_for(big_bytes), true, &unused, &bw);
        if (st == BT_OK
            && bench_ref_ucx_perftest("ucp_am_lat", 8, (int)iters, false, &out->latency_plain_us, &unused) != BT_OK)
            out->latency_plain_us = 0;
        break;
    case XPORT_INPROC:
        snprintf(out->name, sizeof out->name, "xport_pingpong inproc (no actors)");
        st = bench_xport_pingpong(XPORT_INPROC, 8, (int)iters, true, &lat, &unused);
        if (st == BT_OK && big_bytes)
            st = bench_xport_pingpong(XPORT_INPROC, big_bytes, ref_iters_for(big_bytes), true, &unused, &bw);
        break;
    default:
        break;
    }
    if (st != BT_OK) {
        log_warn("bench: reference %s failed: %s", out->name, bt_status_str(st));
        return st;
    }
    out->latency_us = lat;
    out->bandwidth_gbps = bw;
    out->bandwidth_bytes = big_bytes;
    return BT_OK;
}
