/* baton agent: the ranks of one host of an ssh-launched job (agent.h). */
#include "launch/agent.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "launch/slurm.h"
#include "launch/spawn.h"
#include "launch/ssh.h"
#include "launch/worker.h"

/* A rank's output not yet ended by a newline. */
typedef struct {
    char   buf[4096];
    size_t len;
} line_buf_t;

static void out_line(const char *host, int rank, const char *s, size_t n)
{
    char head[160];
    int h = snprintf(head, sizeof head, "[%s r%d] ", host, rank);
    struct iovec_like { const char *p; size_t n; } parts[3] = {{head, (size_t)h}, {s, n}, {"\n", 1}};
    for (int i = 0; i < 3; i++) {
        size_t off = 0;
        while (off < parts[i].n) {
            ssize_t w = write(2, parts[i].p + off, parts[i].n - off);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) return; /* the driver's end is gone: nothing to tell */
            off += (size_t)w;
        }
    }
}

/* Copies what fd has into complete prefixed lines; false at its end. */
static bool out_pump(int fd, line_buf_t *lb, const char *host, int rank)
{
    ssize_t n = read(fd, lb->buf + lb->len, sizeof lb->buf - lb->len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) {
        if (lb->len) out_line(host, rank, lb->buf, lb->len);
        lb->len = 0;
        return false;
    }
    lb->len += (size_t)n;
    size_t start = 0;
    for (size_t i = 0; i < lb->len; i++)
        if (lb->buf[i] == '\n') {
            out_line(host, rank, lb->buf + start, i - start);
            start = i + 1;
        }
    if (start == 0 && lb->len == sizeof lb->buf) { /* a line longer than the buffer: cut */
        out_line(host, rank, lb->buf, lb->len);
        start = lb->len;
    }
    memmove(lb->buf, lb->buf + start, lb->len - start);
    lb->len -= start;
    return true;
}

static bt_status_t secret_from_stdin(uint8_t *secret, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(0, secret + got, len - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            log_error("agent: the job secret on stdin gave %zu bytes, expected %zu (agents are "
                      "started by `baton run`)", got, len);
            return BT_ERR_INVALID;
        }
        got += (size_t)n;
    }
    return BT_OK;
}

int agent_main(const char *run_dir, int first, int count, const char *host, const char *peer, bool slurm)
{
    char tag[JOB_HOST_MAX + 16], slurm_host[JOB_HOST_MAX];
    uint8_t secret[RUN_SECRET_LEN];
    if (slurm) { /* first rank, node and secret from srun's environment */
        if (slurm_agent_env(count, &first, slurm_host, sizeof slurm_host, secret, sizeof secret)) return 1;
        host = slurm_host;
    }
    snprintf(tag, sizeof tag, "agent %s", host);
    log_set_tag(tag);
    if (!slurm && secret_from_stdin(secret, sizeof secret)) return 1;
    char self[64];
    if (launch_addr_toward(peer, self, sizeof self)) return 1;
    setenv("BATON_LISTEN_HOST", self, 1);
    spawn_group_t g = {0};
    bt_status_t st = spawn_workers_at(run_dir, secret, sizeof secret, first, count, true, &g);
    memset(secret, 0, sizeof secret);
    if (st) return 1;
    line_buf_t *lbs = calloc((size_t)count, sizeof *lbs);
    struct pollfd *pf = calloc((size_t)count + 1, sizeof *pf);
    if (!lbs || !pf) {
        free(lbs);
        free(pf);
        spawn_stop(&g, 0, NULL);
        return 1;
    }
    int open_outs = count;
    bool lifeline = true;
    /* the driver beats down the lifeline every heartbeat interval
     * (spawn_beat); silence past this many seconds means this host is cut
     * off from it (a link down, a partition), and the ranks would
     * otherwise wait for ever on peers they cannot reach */
    const char *lv = getenv(SPAWN_LIFELINE_ENV);
    double life_s = lv ? strtod(lv, NULL) : 0;
    uint64_t heard = clock_now_ns();
    while (open_outs > 0) {
        pf[0] = (struct pollfd){.fd = lifeline ? 0 : -1, .events = POLLIN};
        for (int i = 0; i < count; i++) pf[i + 1] = (struct pollfd){.fd = g.procs[i].out_fd, .events = POLLIN};
        if (poll(pf, (nfds_t)count + 1, 250) < 0 && errno != EINTR) break;
        if (lifeline && pf[0].revents) {
            char junk[64];
            ssize_t n = read(0, junk, sizeof junk);
            if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
                log_error("agent: the driver's link ended; stopping ranks %d..%d", first, first + count - 1);
                spawn_stop(&g, 0, NULL);
                free(lbs);
                free(pf);
                return 1;
            }
            if (n > 0) heard = clock_now_ns();
        }
        double silent = (double)(clock_now_ns() - heard) * 1e-9;
        if (life_s > 0 && silent > life_s) {
            log_error("agent: nothing from the driver (%s) for %.1f s: the link between host %s and the driver "
                      "is down; stopping ranks %d..%d", peer, silent, host, first, first + count - 1);
            spawn_stop(&g, 0, NULL);
            free(lbs);
            free(pf);
            return 1;
        }
        for (int i = 0; i < count; i++) {
            if (g.procs[i].out_fd < 0 || !pf[i + 1].revents) continue;
            if (!out_pump(g.procs[i].out_fd, &lbs[i], host, first + i)) {
                close(g.procs[i].out_fd);
                g.procs[i].out_fd = -1;
                open_outs--;
            }
        }
    }
    free(lbs);
    free(pf);
    /* every output ended: the ranks have exited or are about to */
    int failed = -1;
    int code = 0;
    for (;;) {
        spawn_poll(&g);
        int left = 0;
        for (int i = 0; i < g.n; i++) left += !g.procs[i].exited;
        if (!left) break;
        struct pollfd p0 = {.fd = 0, .events = POLLIN};
        if (poll(&p0, 1, 10) > 0) {
            char junk[64];
            if (read(0, junk, sizeof junk) <= 0) break; /* the driver is gone: stop the rest */
        }
    }
    for (int i = 0; i < g.n && !code; i++) {
        int s = g.procs[i].status;
        if (!g.procs[i].exited) continue;
        if (WIFEXITED(s) && WEXITSTATUS(s)) code = WEXITSTATUS(s), failed = i;
        else if (WIFSIGNALED(s)) code = 128 + WTERMSIG(s), failed = i;
    }
    if (failed >= 0) {
        char how[96];
        spawn_describe(&g.procs[failed], how, sizeof how);
        log_error("agent: rank %d %s", first + failed, how);
    }
    int killed = spawn_stop(&g, 0, NULL);
    return code ? code : killed ? 1 : 0;
}
