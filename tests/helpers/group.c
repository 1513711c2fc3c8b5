#include "tests/helpers/group.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/log.h"

static const uint8_t group_secret[32] = "test-group-secret-0123456789abc";

static coll_config_t group_cfg(const test_group_t *g, int rank)
{
    return (coll_config_t){.rank = rank, .size = g->size, .comm_id = g->comm_id,
                                .name = g->job_id, .kind = g->kind, .job_id = g->job_id,
                                .secret = group_secret, .secret_len = sizeof group_secret,
                                .timeout_ms = g->timeout_ms, .segment_bytes = g->segment_bytes};
}

/* Connect c to every rank's address and run body; destroys c. */
static int group_rank_run(const test_group_t *g, coll_comm_t *c, char (*addrs)[XPORT_LISTEN_ADDR_MAX],
                          test_group_body_fn body, void *arg)
{
    const char *a[TEST_GROUP_MAX];
    for (int j = 0; j < g->size; j++) a[j] = addrs[j];
    int f = coll_connect(c, a) == BT_OK ? body(c, arg) : 1;
    coll_destroy(c);
    return f;
}

typedef struct {
    const test_group_t *g;
    int rank;
    test_group_body_fn body;
    void *arg;
    char (*addrs)[XPORT_LISTEN_ADDR_MAX];
    pthread_barrier_t *bar;
    int failures;
} group_thread_t;

static void *group_thread_main(void *p)
{
    group_thread_t *t = p;
    coll_config_t cfg = group_cfg(t->g, t->rank);
    coll_comm_t *c = NULL;
    bool opened = coll_open(&coll_host_ops, &cfg, &c, t->addrs[t->rank], XPORT_LISTEN_ADDR_MAX) == BT_OK;
    pthread_barrier_wait(t->bar); /* every address is known past this point */
    t->failures = opened ? group_rank_run(t->g, c, t->addrs, t->body, t->arg) : 1;
    return NULL;
}

int test_group_threads(const test_group_t *g, test_group_body_fn body, void *arg)
{
    int n = g->size;
    char addrs[TEST_GROUP_MAX][XPORT_LISTEN_ADDR_MAX];
    pthread_barrier_t bar;
    group_thread_t t[TEST_GROUP_MAX];
    pthread_t th[TEST_GROUP_MAX];
    pthread_barrier_init(&bar, NULL, (unsigned)n);
    for (int r = 0; r < n; r++) {
        t[r] = (group_thread_t){.g = g, .rank = r, .body = body, .arg = arg, .addrs = addrs,
                                .bar = &bar};
        pthread_create(&th[r], NULL, group_thread_main, &t[r]);
    }
    int f = 0;
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        f += t[r].failures;
    }
    pthread_barrier_destroy(&bar);
    return f;
}

static int read_all(int fd, void *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t k = read(fd, (char *)buf + got, n - got);
        if (k <= 0) return -1;
        got += (size_t)k;
    }
    return 0;
}

/* Addresses go up and down pipes through the parent. */
int test_group_procs(const test_group_t *g, test_group_body_fn body, void *arg)
{
    int n = g->size;
    int up[TEST_GROUP_MAX][2], down[TEST_GROUP_MAX][2];
    pid_t pid[TEST_GROUP_MAX];
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        if (pipe2(up[r], O_CLOEXEC) || pipe2(down[r], O_CLOEXEC)) return 100;
        pid[r] = fork();
        if (pid[r] < 0) return 100;
        if (pid[r] == 0) {
            char tag[16], addrs[TEST_GROUP_MAX][XPORT_LISTEN_ADDR_MAX];
            snprintf(tag, sizeof tag, "rank%d", r);
            log_set_tag(tag);
            memset(addrs, 0, sizeof addrs);
            coll_config_t cfg = group_cfg(g, r);
            coll_comm_t *c = NULL;
            if (coll_open(&coll_host_ops, &cfg, &c, addrs[r], XPORT_LISTEN_ADDR_MAX) != BT_OK) _exit(50);
            if (write(up[r][1], addrs[r], XPORT_LISTEN_ADDR_MAX) != XPORT_LISTEN_ADDR_MAX) _exit(51);
            if (read_all(down[r][0], addrs, (size_t)n * XPORT_LISTEN_ADDR_MAX)) _exit(52);
            int f = group_rank_run(g, c, addrs, body, arg);
            _exit(f > 40 ? 40 : f);
        }
    }
    char addrs[TEST_GROUP_MAX][XPORT_LISTEN_ADDR_MAX];
    int fails = 0;
    for (int r = 0; r < n; r++)
        if (read_all(up[r][0], addrs[r], XPORT_LISTEN_ADDR_MAX)) fails = 101;
    for (int r = 0; r < n && !fails; r++)
        if (write(down[r][1], addrs, (size_t)n * XPORT_LISTEN_ADDR_MAX) < 0) fails = 102;
    if (!fails && g->kill_rank >= 0) {
        usleep((useconds_t)g->kill_after_ms * 1000);
        kill(pid[g->kill_rank], SIGKILL);
    }
    for (int r = 0; r < n; r++) {
        if (fails) close(down[r][1]); /* children blocked on the pipe give up */
        int status;
        waitpid(pid[r], &status, 0);
        close(up[r][0]);
        close(up[r][1]);
        close(down[r][0]);
        if (!fails) close(down[r][1]);
        if (r == g->kill_rank) continue;
        if (!WIFEXITED(status)) {
            fprintf(stderr, "rank %d died (signal %d)\n", r, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
            fails++;
        } else {
            fails += WEXITSTATUS(status);
        }
    }
    return fails;
}
