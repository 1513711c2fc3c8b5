#include "launch/spawn.h"

#include <errno.h>
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

bt_status_t spawn_workers(const char *run_dir, const char *secret_file, int n, spawn_group_t *out)
{
    spawn_proc_t *ps = calloc((size_t)n, sizeof *ps);
    if (!ps) return BT_ERR_NOMEM;
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) {
        log_error("spawn: cannot find this binary (/proc/self/exe): %s", strerror(errno));
        free(ps);
        return BT_ERR_IO;
    }
    exe[len] = 0;
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            log_error("spawn: fork of rank %d failed: %s", r, strerror(errno));
            *out = (spawn_group_t){.procs = ps, .n = r};
            spawn_stop(out, 0, NULL);
            return BT_ERR_IO;
        }
        if (pid == 0) {
            /* Die with the driver; the check closes the race with a driver
             * that died before prctl. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(127);
            /* the driver blocks SIGINT/SIGTERM for its signal thread; a
             * worker gets the default dispositions back */
            sigset_t none;
            sigemptyset(&none);
            sigprocmask(SIG_SETMASK, &none, NULL);
            char rank[16];
            snprintf(rank, sizeof rank, "%d", r);
            setenv("BATON_SECRET_FILE", secret_file, 1);
            char *argv[] = {"baton", "worker", "--run-dir", (char *)run_dir, "--rank", rank, NULL};
            execv(exe, argv);
            fprintf(stderr, "spawn: exec %s failed: %s\n", exe, strerror(errno));
            _exit(127);
        }
        ps[r].pid = pid;
    }
    *out = (spawn_group_t){.procs = ps, .n = n};
    return BT_OK;
}

int spawn_poll(spawn_group_t *g)
{
    int first = -1;
    for (int r = 0; r < g->n; r++) {
        spawn_proc_t *p = &g->procs[r];
        if (p->exited) continue;
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
        kill(p->pid, SIGKILL);
        int status;
        while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR) {}
        p->exited = true;
        p->status = status;
        killed++;
    }
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
