#include "launch/jobdir.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"

/* What the guard answers once, right after mkdtemp (one write, smaller than
 * PIPE_BUF, so it arrives whole or not at all). */
typedef struct {
    int  err; /* 0, or mkdtemp's errno */
    char path[sizeof ((jobdir_t *)0)->path];
} guard_reply_t;

/* Workers may still write a rendezvous file for a moment after the driver
 * died: the kernel closes the driver's descriptors (which wakes the guard)
 * before it signals the children (PR_SET_PDEATHSIG). So the removal is
 * retried while the directory still has entries, for up to 2 s. */
static void guard_clear(const char *dir)
{
    for (int i = 0; i < 200; i++) {
        int err = base_dir_clear(dir);
        if (err == 0 || err == ENOENT) return;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static void fds_close_range(unsigned lo, unsigned hi)
{
    if (lo > hi) return;
    if (close_range(lo, hi, 0) == 0) return;
    /* kernels before 5.9: one by one, up to the descriptor limit */
    long max = sysconf(_SC_OPEN_MAX);
    if (max < 0 || max > 65536) max = 65536;
    for (long fd = lo; fd <= (long)hi && fd < max; fd++) close((int)fd);
}

/* The guard: a child forked from a process that may run other threads, so
 * it makes system calls only until it exits. */
static _Noreturn void guard_main(char *tmpl, int up, int down)
{
    struct sigaction ign = {.sa_handler = SIG_IGN};
    sigemptyset(&ign.sa_mask);
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &ign, NULL);
    prctl(PR_SET_NAME, "baton-guard");
    unsigned lo = (unsigned)(up < down ? up : down), hi = (unsigned)(up < down ? down : up);
    if (lo > 0) fds_close_range(0, lo - 1);
    fds_close_range(lo + 1, hi - 1);
    fds_close_range(hi + 1, ~0u);

    guard_reply_t r = {0};
    if (mkdtemp(tmpl)) memcpy(r.path, tmpl, strnlen(tmpl, sizeof r.path - 1));
    else r.err = errno ? errno : EIO;
    ssize_t n = write(up, &r, sizeof r);
    close(up);
    if (r.err || n != (ssize_t)sizeof r) {
        if (!r.err) guard_clear(tmpl);
        _exit(1);
    }
    char b;
    for (;;) { /* EOF: the driver is gone or done */
        ssize_t got = read(down, &b, 1);
        if (got == 0 || (got < 0 && errno != EINTR)) break;
    }
    guard_clear(tmpl);
    _exit(0);
}

bt_status_t jobdir_create(jobdir_t *d)
{
    *d = (jobdir_t){.guard_fd = -1};
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = "/tmp";
    char tmpl[sizeof d->path];
    if (snprintf(tmpl, sizeof tmpl, "%s/baton-run-XXXXXX", tmp) >= (int)sizeof tmpl) {
        log_error("cannot create a run directory in %s: the path is too long", tmp);
        return BT_ERR_INVALID;
    }
    int up[2], down[2];
    if (pipe2(up, O_CLOEXEC)) {
        log_error("cannot create a run directory in %s: pipe: %s", tmp, strerror(errno));
        return BT_ERR_IO;
    }
    if (pipe2(down, O_CLOEXEC)) {
        log_error("cannot create a run directory in %s: pipe: %s", tmp, strerror(errno));
        close(up[0]);
        close(up[1]);
        return BT_ERR_IO;
    }
    pid_t pid = fork();
    if (pid == 0) guard_main(tmpl, up[1], down[0]);
    int fork_err = errno;
    close(up[1]);
    close(down[0]);
    if (pid < 0) {
        log_error("cannot create a run directory in %s: fork of its guard: %s", tmp,
                  strerror(fork_err));
        close(up[0]);
        close(down[1]);
        return BT_ERR_IO;
    }
    d->guard = pid;
    d->guard_fd = down[1];
    guard_reply_t r;
    ssize_t n;
    while ((n = read(up[0], &r, sizeof r)) < 0 && errno == EINTR) {}
    close(up[0]);
    if (n != (ssize_t)sizeof r || r.err) {
        log_error("cannot create a run directory in %s: %s", tmp,
                  n == (ssize_t)sizeof r ? strerror(r.err) : "its guard process died");
        jobdir_remove(d);
        return BT_ERR_IO;
    }
    r.path[sizeof r.path - 1] = '\0';
    memcpy(d->path, r.path, sizeof d->path);
    return BT_OK;
}

void jobdir_remove(jobdir_t *d)
{
    if (d->path[0]) {
        int err = base_dir_clear(d->path);
        if (err && err != ENOENT) log_warn("run directory %s: cannot remove: %s", d->path, strerror(err));
        d->path[0] = '\0';
    }
    if (d->guard_fd >= 0) {
        close(d->guard_fd);
        d->guard_fd = -1;
    }
    if (d->guard > 0) {
        while (waitpid(d->guard, NULL, 0) < 0 && errno == EINTR) {}
        d->guard = 0;
    }
}
