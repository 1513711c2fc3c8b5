/* Hang reports: what each rank of a multi-process job waited in when the
 * job failed without a dead process (a step past launch.step_timeout, a
 * collective that timed out, a silent rank).
 *
 * Every ALIVE heartbeat of a rank carries a "wait" text (train/stage_actor.h:
 * the pipeline input its op walk waits for, the compute job in flight, the
 * collectives its threads wait in, coll_watch_describe, and the last
 * message it sent and handled, actor_last_msgs). The driver keeps the latest
 * of each rank (hang_note) and, when the job fails that way, prints one
 * report (hang_report): for each collective some rank waits in, the group,
 * the call's number in it, its kind and size, which members have arrived
 * (wait in it or a later call of the group) and which have not, and for each
 * missing member what it is doing and its last messages; then each pipeline
 * wait, with the state of the rank the input should come from. */
#ifndef BT_LAUNCH_HANG_H
#define BT_LAUNCH_HANG_H

#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "launch/graph.h"

#define HANG_TEXT_MAX 1024

typedef struct {
    int       world;
    char    (*text)[HANG_TEXT_MAX]; /* [world] the latest "wait" text, "" for none */
    uint64_t *t_ns;                 /* [world] when it came (driver clock) */
} hang_t;

bt_status_t hang_init(hang_t *h, int world);
void        hang_free(hang_t *h);
/* The "wait" text (len bytes, not NUL-terminated; untrusted) of a heartbeat of rank. */
void        hang_note(hang_t *h, int rank, const char *text, size_t len, uint64_t now_ns);

/* describe(arg, rank, buf, cap): "rank R (pid P, host H, tp= dp= pp=)". */
typedef void (*hang_describe_fn)(void *arg, int rank, char *buf, size_t cap);
/* Writes the report to f (lines starting with two spaces after a title).
 * Returns the number of waits it reported (0: no rank reported any). */
int         hang_report(const hang_t *h, const graph_t *g, hang_describe_fn describe, void *arg,
                        uint64_t now_ns, FILE *f);
/* The ranks the report names as missing (not arrived at a collective some
 * rank waits in, or the source of a pipeline input some rank waits for),
 * in rank order, at most cap of them; returns how many (-1: out of memory). */
int         hang_missing(const hang_t *h, const graph_t *g, int *ranks, int cap);

#endif
