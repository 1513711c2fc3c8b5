/* Reference: ucx_perftest (ucx-utils) server + client on loopback, output
 * parsed from its "Final:" line (see ref.h). */
#include "bench/ref.h"

#include "base/clock.h"
#include "base/log.h"
#include "transport/xport.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define PERFTEST_TIMEOUT_S 120

static bool perftest_find(char *path, size_t cap)
{
    const char *env = getenv("PATH");
    char *dirs = strdup(env ? env : "/usr/bin:/bin");
    bool found = false;
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        snprintf(path, cap, "%s/ucx_perftest", d);
        found = access(path, X_OK) == 0;
    }
    free(dirs);
    return found;
}

/* A port that was free a moment ago (the tool binds it itself). */
static int perftest_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0
        && getsockname(fd, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

static pid_t perftest_spawn(const char *tool, char *const argv[], int out_fd, bool err_mode)
{
    char tls[32], devs[64];
    if (xport_ucx_net_select(NULL, NULL, tls, sizeof tls, devs, sizeof devs) != BT_OK) tls[0] = devs[0] = '\0';
    const char *net[2][2] = {{"UCX_TLS", tls}, {"UCX_NET_DEVICES", devs}};
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0) return pid;
    /* as transport/ucx.c configures its context on loopback (the TLS and
     * NET_DEVICES choice is made before fork by the caller: net[]) */
    for (int i = 0; err_mode && i < XPORT_UCX_NSETTINGS; i++) {
        char env[96];
        snprintf(env, sizeof env, "UCX_%s", xport_ucx_settings[i].name);
        if (!xport_ucx_setting_from_env(i)) setenv(env, xport_ucx_settings[i].value, 1);
    }
    for (int i = 0; err_mode && i < 2; i++)
        if (net[i][1][0] && !getenv(net[i][0])) setenv(net[i][0], net[i][1], 1);
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC); /* dup2 below: 1 and 2 stay open */
    dup2(out_fd >= 0 ? out_fd : null_fd, 1);
    dup2(null_fd, 2);
    execv(tool, argv);
    _exit(127);
}

static void perftest_reap(pid_t pid, bool kill_it)
{
    if (pid <= 0) return;
    if (kill_it) kill(pid, SIGKILL);
    int ws;
    waitpid(pid, &ws, 0);
}

/* Run the client, collect its stdout (bounded), return its exit status. */
static int perftest_client(const char *tool, char *const argv[], bool err_mode, char *out, size_t cap)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) return -1; /* the child dup2s the write end to 1 */
    pid_t pid = perftest_spawn(tool, argv, pfd[1], err_mode);
    close(pfd[1]);
    size_t got = 0;
    uint64_t deadline = clock_now_ns() + PERFTEST_TIMEOUT_S * 1000000000ull;
    bool timed_out = false;
    for (;;) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        if (clock_now_ns() > deadline) {
            timed_out = true;
            break;
        }
        if (poll(&p, 1, 1000) <= 0) continue;
        char tmp[4096];
        ssize_t r = read(pfd[0], tmp, sizeof tmp);
        if (r <= 0) break;
        size_t keep = (size_t)r < cap - 1 - got ? (size_t)r : cap - 1 - got;
        memcpy(out + got, tmp, keep);
        got += keep;
    }
    out[got] = '\0';
    close(pfd[0]);
    int ws = 0;
    if (timed_out) kill(pid, SIGKILL);
    waitpid(pid, &ws, 0);
    return timed_out ? -1 : WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

bt_status_t bench_ref_ucx_perftest(const char *test, size_t bytes, int iters, bool err_mode,
                                   double *lat_us, double *gbytes_s)
{
    char tool[512];
    if (!perftest_find(tool, sizeof tool)) {
        log_error("ucx_perftest not found in PATH (Debian package ucx-utils)");
        return BT_ERR_NOT_FOUND;
    }
    if (strcmp(test, "ucp_am_lat") && strcmp(test, "ucp_am_bw")) return BT_ERR_INVALID;
    bt_status_t st = BT_ERR_IO;
    char port[16], size[32], n[32], warm[32];
    char *out = malloc(1 << 16);
    if (!out) return BT_ERR_NOMEM;
    for (int attempt = 0; attempt < 5 && st != BT_OK; attempt++) {
        snprintf(port, sizeof port, "%d", perftest_free_port());
        snprintf(size, sizeof size, "%zu", bytes);
        snprintf(n, sizeof n, "%d", iters);
        snprintf(warm, sizeof warm, "%d", bytes >= (1u << 20) ? 1 : 1000);
        /* "-e" last, or the terminating NULL in its place */
        char *srv_argv[] = {"ucx_perftest", "-p", port, err_mode ? "-e" : NULL, NULL};
        pid_t srv = perftest_spawn(tool, srv_argv, -1, err_mode);
        usleep(200000 * (useconds_t)(attempt + 1)); /* let the server bind */
        char *cli_argv[] = {"ucx_perftest", "127.0.0.1", "-p", port, "-t", (char *)test,
                            "-s", size, "-n", n, "-w", warm, err_mode ? "-e" : NULL, NULL};
        int rc = perftest_client(tool, cli_argv, err_mode, out, 1 << 16);
        const char *fin = strstr(out, "Final:");
        unsigned long it;
        double p50, lat_avg, lat_all, bw_avg, bw_all;
        if (rc == 0 && fin
            && sscanf(fin, "Final: %lu %lf %lf %lf %lf %lf", &it, &p50, &lat_avg, &lat_all,
                      &bw_avg, &bw_all) == 6) {
            *lat_us = lat_avg;
            *gbytes_s = bw_avg * 1048576.0 / 1e9; /* the tool's MB/s are MiB/s */
            st = BT_OK;
        }
        perftest_reap(srv, st != BT_OK);
    }
    if (st != BT_OK) log_error("ucx_perftest %s %zu B: no result (output: %.200s)", test, bytes, out);
    free(out);
    return st;
}
