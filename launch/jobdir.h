/* The private run directory of a multi-process job,
 * $TMPDIR/baton-run-XXXXXX (0700): the job file and its overrides, the
 * evaluation rows and the rendezvous files of driver and workers (never the
 * job secret: launch/spawn.h hands that over through a pipe).
 *
 * The directory must not outlive the job, however the driver ends: normal
 * exit, a failure, a signal it handles, or one it cannot (SIGKILL, SIGSEGV,
 * abort()). So a guard process, forked before the directory exists, creates
 * it and then blocks reading a pipe whose only write end the driver holds.
 * The kernel closes that end when the driver exits, by whatever cause; the
 * guard then removes the directory and exits. jobdir_remove does the same
 * at a normal end and reaps the guard. The guard ignores the signals a
 * terminal or a supervisor sends to the whole process group (SIGINT,
 * SIGTERM, SIGHUP, SIGQUIT, SIGPIPE) and closes every inherited descriptor,
 * so it holds no pipe of the caller's (`baton run | head` ends when the
 * driver does) and outlives the driver only by the removal. */
#ifndef BT_LAUNCH_JOBDIR_H
#define BT_LAUNCH_JOBDIR_H

#include <sys/types.h>

#include "base/status.h"

typedef struct {
    char  path[512];
    pid_t guard;    /* 0: none */
    int   guard_fd; /* the write end the guard watches; -1: none */
} jobdir_t;

/* Creates the directory under $TMPDIR (default /tmp) with its guard.
 * BT_ERR_IO (logged, naming the folder) when either cannot be made. */
bt_status_t jobdir_create(jobdir_t *d);
/* Removes the directory and everything in it, releases the guard and
 * reaps it. Safe on a jobdir_t that jobdir_create failed on (zeroed). */
void        jobdir_remove(jobdir_t *d);

#endif
