/* Launching a job's ranks on other hosts over OpenSSH (docs/PARALLEL.md:
 * more than one host).
 *
 * Every `hosts:` entry other than `local` is an ssh destination
 * ("node7", "user@10.0.0.2"); the ranks are split over the hosts in equal
 * contiguous blocks (host h runs ranks h*k .. h*k+k-1, k = world / hosts).
 * ssh runs as `ssh -T -o BatchMode=yes -o ConnectTimeout=10 <launch.ssh...>
 * DEST 'cd WORKDIR && exec BATON agent ...'` (launch/agent.h): the job
 * secret is written to ssh's stdin, so it travels inside the encrypted
 * channel and is on no command line and in no file; the pipe then stays
 * open as the agent's lifeline.
 *
 * Before any rank starts, ssh_probe checks every host: that it answers
 * (ssh exit 255: "cannot reach"), that WORKDIR exists, that the baton
 * binary is executable there, and that the host sees the run directory
 * (this build's rendezvous goes through files in it: the hosts share the
 * driver's $TMPDIR, docs/PARALLEL.md says how). */
#ifndef BT_LAUNCH_SSH_H
#define BT_LAUNCH_SSH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "launch/job.h"
#include "launch/spawn.h"

/* Whether the job's hosts need a launcher (any entry other than local,
 * localhost, 127.0.0.1). */
bool ssh_job_remote(const job_t *job);
/* The address of this machine's interface toward host (an ssh destination
 * or "ADDR:PORT"; "user@" is dropped): what the host would see us as. */
bt_status_t launch_addr_toward(const char *host, char *out, size_t cap);
/* Checks every host; on failure err names the host and what is missing. */
bt_status_t ssh_probe(const job_t *job, const char *run_dir, char *err, size_t errlen);
/* Starts one agent per host for world ranks; out gets one entry per rank
 * (the ranks of a host share their ssh process: same_as, host). peer: the
 * driver's control address ("ADDR:PORT"). */
bt_status_t ssh_start(const job_t *job, const char *run_dir, const uint8_t *secret, size_t secret_len,
                      int world, const char *peer, spawn_group_t *out);

#endif
