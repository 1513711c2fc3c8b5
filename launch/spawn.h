/* Local process launch of a job's ranks (ssh/slurm launchers later take the
 * same shape): `baton worker --run-dir D --rank R` for every rank, started
 * by fork + exec of this very binary (/proc/self/exe). The job secret
 * travels in a pipe: each child inherits the read end of a pipe of its own
 * that already holds the secret (the write end is closed), and finds its
 * number in BATON_SECRET_FD; the worker reads it once and closes it. So the
 * secret is in no file and on no command line, and nothing holds it once
 * the workers have read it or died. A child asks the kernel to kill it
 * when the launching thread's process dies (PR_SET_PDEATHSIG), so a killed
 * driver leaves no orphans; spawn_stop reaps every child and SIGKILLs the
 * ones that do not exit in time.
 *
 * Descriptors: a worker gets the driver's stdin, stdout and stderr and
 * nothing else. The child closes every descriptor above 2 before exec
 * (close_range), close-on-exec or not: the driver's sockets, its files,
 * what UCX opened in it and what the driver itself inherited. */
#ifndef BT_LAUNCH_SPAWN_H
#define BT_LAUNCH_SPAWN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/status.h"

/* Every process baton starts runs NCCL with NVLink multicast (NVLS) off:
 * main() sets it for itself, and a spawned worker's environment carries it
 * in place of whatever value was inherited (docs/PARALLEL.md "Collective
 * backends"). */
#define SPAWN_NCCL_NVLS "NCCL_NVLS_ENABLE=0"

typedef struct {
    pid_t pid;
    bool  exited;
    int   status;   /* waitpid status once exited */
    int   out_fd;   /* spawn_workers_at with capture: the read end of the rank's
                     * stdout+stderr pipe (the caller closes it); else -1 */
    int   same_as;  /* -1, or the index of the entry that owns this pid (several
                     * ranks behind one ssh agent, launch/ssh.h) */
    int   in_fd;    /* -1, or the write end of an ssh agent's stdin (its lifeline,
                     * closed by spawn_stop) */
    const char *host; /* where it runs ("local" when NULL) */
} spawn_proc_t;

typedef struct {
    spawn_proc_t *procs; /* [n], index = rank */
    int           n;
} spawn_group_t;

bt_status_t spawn_workers(const char *run_dir, const uint8_t *secret, size_t secret_len, int n,
                          spawn_group_t *out);
/* The same for ranks first..first+n-1 (procs[i] is rank first+i); with
 * capture, each rank's stdout and stderr go into one pipe of its own
 * (procs[i].out_fd) instead of this process's (the ssh agent prefixes them). */
bt_status_t spawn_workers_at(const char *run_dir, const uint8_t *secret, size_t secret_len,
                             int first, int n, bool capture, spawn_group_t *out);
/* Reap children that exited (non-blocking). Returns the lowest rank that
 * exited since the last call, or -1. */
int  spawn_poll(spawn_group_t *g);
/* "exited with status 1", "killed by signal 9 (Killed)", "running". */
void spawn_describe(const spawn_proc_t *p, char *buf, size_t cap);
/* Wait up to grace_s for every child, then SIGKILL the rest and reap them.
 * Returns the number of children that had to be killed; *failed (may be
 * NULL) gets the lowest rank that exited non-zero or by a signal (-1: none).
 * Frees g->procs. */
int  spawn_stop(spawn_group_t *g, double grace_s, int *failed);
/* One byte down every agent's lifeline (in_fd, made non-blocking; a full
 * or broken pipe is skipped: spawn_poll sees an ssh or srun that ended).
 * The driver sends it every heartbeat interval; an agent that hears
 * nothing for SPAWN_LIFELINE_ENV seconds stops its ranks (launch/agent.c). */
void spawn_beat(spawn_group_t *g);
#define SPAWN_LIFELINE_ENV "BATON_AGENT_LIFELINE"

#endif
