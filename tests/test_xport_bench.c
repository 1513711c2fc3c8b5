/* Smoke runs of the transport reference benchmarks (bench/ref.h): each must
 * complete and report finite positive numbers. `test_xport_bench --measure`
 * runs the full measurement (8 B latency, 256 MiB bandwidth) for the report. */
#include "tests/test.h"

#include "base/log.h"
#include "bench/ref.h"
#include "tests/helpers/capture.h"

#include <signal.h>

static bool sane(double lat_us, double gbs)
{
    return isfinite(lat_us) && isfinite(gbs) && lat_us > 0 && gbs > 0 && lat_us < 1e7;
}

static void test_ref_sock_pingpong(void)
{
    double lat = 0, gbs = 0;
    REQUIRE(bench_ref_sock_pingpong(8, 300, &lat, &gbs) == BT_OK);
    CHECK_MSG(sane(lat, gbs), "lat %g us, %g GB/s", lat, gbs);
    REQUIRE(bench_ref_sock_pingpong(1 << 20, 5, &lat, &gbs) == BT_OK);
    CHECK_MSG(sane(lat, gbs), "lat %g us, %g GB/s", lat, gbs);
}

static void test_ref_ucx_perftest(void)
{
    double lat = 0, gbs = 0;
    for (int err_mode = 0; err_mode < 2; err_mode++) {
        REQUIRE(bench_ref_ucx_perftest("ucp_am_lat", 8, 2000, err_mode, &lat, &gbs) == BT_OK);
        CHECK_MSG(sane(lat, gbs), "err_mode %d: lat %g us, %g GB/s", err_mode, lat, gbs);
    }
    CHECK(bench_ref_ucx_perftest("no_such_test", 8, 10, true, &lat, &gbs) == BT_ERR_INVALID);
    /* the tool missing from PATH is an error, not a hang or a zero */
    char *path = strdup(getenv("PATH") ? getenv("PATH") : "");
    setenv("PATH", "/nonexistent-baton-dir", 1);
    CHECK(bench_ref_ucx_perftest("ucp_am_lat", 8, 10, true, &lat, &gbs) == BT_ERR_NOT_FOUND);
    setenv("PATH", path, 1);
    free(path);
}

#ifdef BT_HAVE_UCX
/* Same-host ucx connections must run over shared memory (transport/ucx.c
 * turns UCX_MM_ERROR_HANDLING on and, on loopback, allows nothing but
 * shared memory and self); with it forced off and tcp allowed they fall
 * back to tcp, which shows the check can tell the two apart. The transport
 * names its lanes at debug level. */
static char *ucx_lanes_logged(const char *mm_err)
{
    char *saved = getenv("UCX_MM_ERROR_HANDLING") ? strdup(getenv("UCX_MM_ERROR_HANDLING")) : NULL;
    if (mm_err) setenv("UCX_MM_ERROR_HANDLING", mm_err, 1);
    bool own_tls = mm_err && !getenv("UCX_TLS");
    if (own_tls) setenv("UCX_TLS", "sm,tcp,self", 1); /* still on loopback only (UCX_NET_DEVICES=lo) */
    log_set_level(LOG_DEBUG);
    test_capture_t cap;
    test_capture_begin(&cap);
    double lat = 0, gbs = 0;
    bt_status_t st = bench_xport_pingpong(XPORT_UCX, 8, 20, false, &lat, &gbs);
    char *text = test_capture_end(&cap);
    log_set_level(LOG_INFO);
    if (saved) setenv("UCX_MM_ERROR_HANDLING", saved, 1);
    else unsetenv("UCX_MM_ERROR_HANDLING");
    if (own_tls) unsetenv("UCX_TLS");
    free(saved);
    CHECK(st == BT_OK);
    return text;
}

static void test_ucx_same_host_shared_memory(void)
{
    char *text = ucx_lanes_logged(NULL);
    const char *line = strstr(text, "runs over ");
    CHECK_MSG(line && (!strncmp(line + 10, "sysv/", 5) || !strncmp(line + 10, "posix/", 6)),
              "ucx lanes: %.300s", line ? line : text);
    free(text);
    text = ucx_lanes_logged("n");
    line = strstr(text, "runs over ");
    CHECK_MSG(line && !strncmp(line + 10, "tcp/", 4), "ucx lanes without shm error handling: %.300s",
              line ? line : text);
    free(text);
}
#define UCX_SHM test_ucx_same_host_shared_memory,
#else
#define UCX_SHM
#endif

static void pingpong_kind(xport_kind_t kind)
{
    double lat = 0, gbs = 0;
    REQUIRE(bench_xport_pingpong(kind, 8, 300, false, &lat, &gbs) == BT_OK);
    CHECK_MSG(sane(lat, gbs), "%s 8 B: lat %g us", xport_kind_name(kind), lat);
    /* busy polling on 2 shared cores costs scheduler slices: few rounds */
    REQUIRE(bench_xport_pingpong(kind, 8, 30, true, &lat, &gbs) == BT_OK);
    CHECK_MSG(sane(lat, gbs), "%s 8 B busy: lat %g us", xport_kind_name(kind), lat);
    REQUIRE(bench_xport_pingpong(kind, 4 << 20, 3, false, &lat, &gbs) == BT_OK);
    CHECK_MSG(sane(lat, gbs), "%s 4 MiB: %g GB/s", xport_kind_name(kind), gbs);
}

static void test_xport_pingpong_inproc(void) { pingpong_kind(XPORT_INPROC); }
static void test_xport_pingpong_tcp(void) { pingpong_kind(XPORT_TCP); }
#ifdef BT_HAVE_UCX
static void test_xport_pingpong_ucx(void) { pingpong_kind(XPORT_UCX); }
#define UCX_PP test_xport_pingpong_ucx,
#else
#define UCX_PP
#endif

static int measure(void)
{
    const size_t big = 256u << 20;
    double lat, gbs;
    if (bench_ref_sock_pingpong(8, 20000, &lat, &gbs) == BT_OK)
        printf("ref sockets        8 B  latency %8.2f us\n", lat);
    if (bench_ref_sock_pingpong(big, 4, &lat, &gbs) == BT_OK)
        printf("ref sockets  256 MiB  bandwidth %8.2f GB/s\n", gbs);
    if (bench_ref_ucx_perftest("ucp_am_lat", 8, 20000, false, &lat, &gbs) == BT_OK)
        printf("ucx_perftest am_lat 8 B latency %8.2f us\n", lat);
    if (bench_ref_ucx_perftest("ucp_am_lat", 8, 20000, true, &lat, &gbs) == BT_OK)
        printf("ucx_perftest -e am_lat 8 B latency %8.2f us\n", lat);
    if (bench_ref_ucx_perftest("ucp_am_bw", big, 4, true, &lat, &gbs) == BT_OK)
        printf("ucx_perftest am_bw 256 MiB bandwidth %8.2f GB/s\n", gbs);
    for (int k = 0; k < XPORT_KIND_COUNT; k++) {
        if (!xport_ops_get((xport_kind_t)k)) continue;
        for (int busy = 0; busy < 2; busy++) {
            /* busy polling: two spinning threads on shared cores, fewer rounds */
            if (bench_xport_pingpong((xport_kind_t)k, 8, busy ? 2000 : 20000, busy, &lat, &gbs) == BT_OK)
                printf("xport %-6s %s       8 B  latency %8.2f us\n", xport_kind_name((xport_kind_t)k),
                       busy ? "busy " : "loop ", lat);
        }
        if (bench_xport_pingpong((xport_kind_t)k, big, 4, false, &lat, &gbs) == BT_OK)
            printf("xport %-6s loop  256 MiB  bandwidth %8.2f GB/s\n", xport_kind_name((xport_kind_t)k), gbs);
    }
    return 0;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc > 1 && !strcmp(argv[1], "--measure")) return measure();
#define TEST_RUN_EXPANDED(...) TEST_RUN(__VA_ARGS__)
    TEST_RUN_EXPANDED(argc, argv, test_ref_sock_pingpong, test_ref_ucx_perftest, test_xport_pingpong_inproc,
             test_xport_pingpong_tcp, UCX_PP UCX_SHM);
}
