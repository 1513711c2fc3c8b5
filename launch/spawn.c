#include "launch/spawn.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"

/* In the child, before exec: close every descriptor above stderr. What
 * the driver holds (its sockets, UCX's, the metrics file, anything it
 * inherited) is not the worker's, whether or not it is close-on-exec;
 * stdin, stdout and stderr are what a worker inherits, on purpose.
 * Async-signal-safe: the driver has threads when it forks. */
static void spawn_close_fds(void)
{
    if (close_range(3, ~0u, 0) == 0) return;
    /* kernels before 5.9: one close per possible descriptor */
    struct rlimit rl;
    long max = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (long)rl.rlim_cur : 65536;
    for (long fd = 3; fd < max; fd++) close((int)fd);
}

static void spawn_env_free(char **env)
{
    size_t n = 0;
    while (env[n + 1]) n++;
    free(env[n]); /* the BATON_SECRET_FILE entry, last; the others are environ's */
    free(env);
}

/* The worker's environment: ours with BATON_SECRET_FILE set, built before
 * fork (setenv in the child of a threaded process is not safe). */
static char **spawn_env(const char *secret_file)
{
    extern char **environ;
    size_t n = 0;
    while (environ[n]) n++;
    char **env = calloc(n + 2, sizeof *env);
    char *secret = malloc(strlen("BATON_SECRET_FILE=") + strlen(secret_file) + 1);
    if (!env || !secret) {
        free(env);
        free(secret);
        return NULL;
    }
    sprintf(secret, "BATON_SECRET_FILE=%s", secret_file);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "BATON_SECRET_FILE=", 18)) env[k++] = environ[i];
    env[k++] = secret;
    env[k] = NULL;
    return env;
}

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
    /* everything the child needs is made here: after fork it only makes
     * async-signal-safe calls */
    char **env = spawn_env(secret_file);
    char (*ranks)[16] = malloc((size_t)n * sizeof *ranks);
    if (!env || !ranks) {
        if (env) spawn_env_free(env);
        free(ranks);
        free(ps);
        return BT_ERR_NOMEM;
    }
    for (int r = 0; r < n; r++) snprintf(ranks[r], sizeof ranks[r], "%d", r);
    char exec_failed[4200];
    int exec_failed_len = snprintf(exec_failed, sizeof exec_failed, "spawn: exec %s failed\n", exe);
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            log_error("spawn: fork of rank %d failed: %s", r, strerror(errno));
            *out = (spawn_group_t){.procs = ps, .n = r};
            spawn_stop(out, 0, NULL);
            spawn_env_free(env);
            free(ranks);
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
            spawn_close_fds();
            char *argv[] = {"baton", "worker", "--run-dir", (char *)run_dir, "--rank", ranks[r], NULL};
            execve(exe, argv, env);
            if (write(2, exec_failed, (size_t)exec_failed_len) < 0) _exit(127);
            _exit(127);
        }
        ps[r].pid = pid;
    }
    spawn_env_free(env);
    free(ranks);
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
