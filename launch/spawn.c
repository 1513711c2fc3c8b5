#include "launch/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"

extern char **environ;

/* The descriptor a worker reads the job secret from. */
#define SPAWN_SECRET_FD 3

/* In the child, before exec: the secret's pipe becomes SPAWN_SECRET_FD and
 * every other descriptor above stderr is closed. What the driver holds (its
 * sockets, UCX's, the metrics file, anything it inherited) is not the
 * worker's, whether or not it is close-on-exec; stdin, stdout, stderr and
 * the secret are what a worker inherits, on purpose. Async-signal-safe: the
 * driver has threads when it forks. Returns false when the secret could not
 * be put in place. */
static bool spawn_child_fds(int secret_fd)
{
    if (secret_fd != SPAWN_SECRET_FD) {
        if (dup2(secret_fd, SPAWN_SECRET_FD) < 0) return false; /* the copy is not close-on-exec */
    } else if (fcntl(secret_fd, F_SETFD, 0) != 0) {
        return false;
    }
    if (close_range(SPAWN_SECRET_FD + 1, ~0u, 0) == 0) return true;
    /* kernels before 5.9: one close per possible descriptor */
    struct rlimit rl;
    long max = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                   ? (long)rl.rlim_cur
                   : 65536;
    for (long fd = SPAWN_SECRET_FD + 1; fd < max; fd++) close((int)fd);
    return true;
}

/* The environment of a worker: ours without any BATON_SECRET_* variable,
 * with NVLink multicast off for NCCL whatever we inherited
 * (SPAWN_NCCL_NVLS, docs/PARALLEL.md "Collective backends"), plus one slot
 * (filled per rank) for BATON_SECRET_FD. */
static char **worker_env(char *slot)
{
    static char nvls[] = SPAWN_NCCL_NVLS;
    size_t n = 0;
    while (environ[n]) n++;
    char **env = calloc(n + 3, sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "BATON_SECRET_", 13) && strncmp(environ[i], "NCCL_NVLS_ENABLE=", 17))
            env[k++] = environ[i];
    env[k++] = nvls;
    env[k] = slot;
    return env;
}

bt_status_t spawn_workers(const char *run_dir, const uint8_t *secret, size_t secret_len, int n,
                          spawn_group_t *out)
{
    return spawn_workers_at(run_dir, secret, secret_len, 0, n, false, out);
}

bt_status_t spawn_workers_at(const char *run_dir, const uint8_t *secret, size_t secret_len,
                             int first, int n, bool capture, spawn_group_t *out)
{
    spawn_proc_t *ps = calloc((size_t)n, sizeof *ps);
    char fd_var[32] = "";
    char **env = worker_env(fd_var);
    if (!ps || !env) {
        free(ps);
        free(env);
        return BT_ERR_NOMEM;
    }
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) {
        log_error("spawn: cannot find this binary (/proc/self/exe): %s", strerror(errno));
        free(ps);
        free(env);
        return BT_ERR_IO;
    }
    exe[len] = 0;
    pid_t parent = getpid();
    int started = 0;
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) ps[r].out_fd = ps[r].same_as = ps[r].in_fd = -1;
    for (int r = 0; r < n; r++) {
        /* The secret waits in a pipe of its own for this rank: written
         * before the fork (far less than a pipe holds, so it never blocks),
         * the write end closed, the read end inherited by the child only. */
        int sp[2];
        if (pipe2(sp, O_CLOEXEC)) {
            log_error("spawn: pipe for rank %d: %s", r, strerror(errno));
            goto fail;
        }
        bool written = write(sp[1], secret, secret_len) == (ssize_t)secret_len;
        close(sp[1]);
        if (!written) {
            log_error("spawn: cannot hand the job secret to rank %d: %s", r, strerror(errno));
            close(sp[0]);
            goto fail;
        }
        int op[2] = {-1, -1};
        if (capture && pipe2(op, O_CLOEXEC)) {
            log_error("spawn: output pipe for rank %d: %s", first + r, strerror(errno));
            close(sp[0]);
            goto fail;
        }
        char rank[16];
        snprintf(rank, sizeof rank, "%d", first + r);
        snprintf(fd_var, sizeof fd_var, "BATON_SECRET_FD=%d", SPAWN_SECRET_FD);
        char *argv[] = {"baton", "worker", "--run-dir", (char *)run_dir, "--rank", rank, NULL};
        pid_t pid = fork();
        if (pid < 0) {
            log_error("spawn: fork of rank %d failed: %s", r, strerror(errno));
            close(sp[0]);
            if (capture) close(op[0]), close(op[1]);
            goto fail;
        }
        if (pid == 0) {
            /* Die with the driver; the check closes the race with a driver
             * that died before prctl. Only system calls from here to exec:
             * the driver runs other threads. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(127);
            /* the driver blocks SIGINT/SIGTERM for its signal thread; a
             * worker gets the default dispositions back */
            sigset_t none;
            sigemptyset(&none);
            sigprocmask(SIG_SETMASK, &none, NULL);
            if (capture && (dup2(op[1], 1) < 0 || dup2(op[1], 2) < 0)) _exit(127);
            if (spawn_child_fds(sp[0])) execve(exe, argv, env);
            static const char msg[] = "spawn: exec of the worker binary failed\n";
            if (write(2, msg, sizeof msg - 1) < 0) {}
            _exit(127);
        }
        close(sp[0]);
        if (capture) close(op[1]);
        ps[r].out_fd = op[0];
        ps[r].pid = pid;
        started = r + 1;
    }
    free(env);
    *out = (spawn_group_t){.procs = ps, .n = n};
    return BT_OK;
fail:
    free(env);
    *out = (spawn_group_t){.procs = ps, .n = started};
    spawn_stop(out, 0, NULL);
    return BT_ERR_IO;
}

int spawn_poll(spawn_group_t *g)
{
    int first = -1;
    for (int r = 0; r < g->n; r++) {
        spawn_proc_t *p = &g->procs[r];
        if (p->exited) continue;
        if (p->same_as >= 0) {
            const spawn_proc_t *o = &g->procs[p->same_as];
            if (o->exited) {
                p->exited = true;
                p->status = o->status;
                if (first < 0) first = r;
            }
            continue;
        }
        int status;
        pid_t got = waitpid(p->pid, &status, WNOHANG);
        if (got == p->pid) {
            p->exited = true;
            p->status = status;
            if (first < 0) first = r;
        }
    }
    return first;
}

void spawn_describe(const spawn_proc_t *p, char *buf, size_t cap)
{
    if (!p->exited) snprintf(buf, cap, "running");
    else if (WIFEXITED(p->status)) snprintf(buf, cap, "exited with status %d", WEXITSTATUS(p->status));
    else if (WIFSIGNALED(p->status))
        snprintf(buf, cap, "killed by signal %d (%s)", WTERMSIG(p->status), strsignal(WTERMSIG(p->status)));
    else snprintf(buf, cap, "ended (status %#x)", p->status);
}

int spawn_stop(spawn_group_t *g, double grace_s, int *failed)
{
    uint64_t end = clock_now_ns() + (uint64_t)(grace_s * 1e9);
    for (;;) {
        spawn_poll(g);
        int left = 0;
        for (int r = 0; r < g->n; r++) left += !g->procs[r].exited;
        if (!left || clock_now_ns() >= end) break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    int killed = 0;
    for (int r = 0; r < g->n; r++) {
        spawn_proc_t *p = &g->procs[r];
        if (p->exited) continue;
        if (p->same_as >= 0) {
            p->exited = true;
            p->status = g->procs[p->same_as].status;
            continue;
        }
        kill(p->pid, SIGKILL);
        int status;
        while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR) {}
        p->exited = true;
        p->status = status;
        killed++;
    }
    for (int r = 0; r < g->n; r++)
        if (g->procs[r].in_fd >= 0) close(g->procs[r].in_fd), g->procs[r].in_fd = -1;
    if (failed) {
        *failed = -1;
        for (int r = g->n - 1; r >= 0; r--) {
            int st = g->procs[r].status;
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) *failed = r;
        }
    }
    free(g->procs);
    g->procs = NULL;
    g->n = 0;
    return killed;
}

void spawn_beat(spawn_group_t *g)
{
    for (int r = 0; g && r < g->n; r++) {
        int fd = g->procs[r].in_fd;
        if (fd < 0) continue;
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0 && !(fl & O_NONBLOCK)) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
        if (write(fd, ".", 1) < 0) {} /* EAGAIN or EPIPE: nothing to do here */
    }
}
