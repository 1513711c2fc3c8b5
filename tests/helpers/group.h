/* A group of collective ranks for tests: threads of this process (inproc) or
 * forked processes (tcp, ucx), each running `body` on its own communicator.
 * Both runners return the number of failures summed over the ranks (a forked
 * rank's exit status is its count; a rank that dies counts one). */
#ifndef BT_TESTS_GROUP_H
#define BT_TESTS_GROUP_H

#include "coll/coll.h"

#define TEST_GROUP_MAX 64

typedef int (*test_group_body_fn)(coll_comm_t *c, void *arg); /* returns failures */

typedef struct {
    const char  *job_id;        /* also names the group in logs */
    uint32_t     comm_id;
    xport_kind_t kind;
    int          size;
    unsigned     timeout_ms;
    size_t       segment_bytes; /* 0: the backend's default */
    int          kill_rank;     /* processes only: SIGKILL this rank ... (-1: none) */
    int          kill_after_ms; /* ... this long after every rank has its addresses */
} test_group_t;

int test_group_threads(const test_group_t *g, test_group_body_fn body, void *arg);
int test_group_procs(const test_group_t *g, test_group_body_fn body, void *arg);

#endif
