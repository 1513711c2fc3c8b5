#include "base/status.h"
#include "base/clock.h"
#include "base/file.h"
#include "base/log.h"
#include "tests/test.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static void test_status_ranges(void)
{
    CHECK(bt_status_is_peer(BT_ERR_PEER_CLOSED));
    CHECK(bt_status_is_peer(BT_ERR_PEER_AUTH));
    CHECK(!bt_status_is_peer(BT_ERR_INVALID));
    CHECK(!bt_status_is_peer(BT_OK));
    CHECK(!strcmp(bt_status_str(BT_ERR_PEER_CLOSED), "PEER_CLOSED"));
    CHECK(!strcmp(bt_status_str((bt_status_t)-150), "PEER_ERROR"));
}

static void test_clock_monotonic(void)
{
    uint64_t a = clock_now_ns(), b = clock_now_ns();
    CHECK(b >= a);
    CHECK(a > 0);
}

static void *log_level_reader(void *out)
{
    *(int *)out = log_enabled(LOG_INFO) + 2 * log_enabled(LOG_DEBUG);
    return NULL;
}

/* The level is read lazily from BATON_LOG by whichever thread logs first;
 * several threads doing so at once must agree with each other and with a
 * level set later (the first reads were a data race that ThreadSanitizer
 * reported from the router's loop threads). Runs first in this binary, so
 * nothing has read the level yet. */
static void test_log_level_first_use_threads(void)
{
    enum { N = 4 };
    pthread_t th[N];
    int got[N];
    for (int i = 0; i < N; i++) REQUIRE(pthread_create(&th[i], NULL, log_level_reader, &got[i]) == 0);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    const char *e = getenv("BATON_LOG");
    int want = 1; /* info on, debug off: the default */
    if (e && !strcmp(e, "debug")) want = 3;
    else if (e && (!strcmp(e, "error") || !strcmp(e, "warn"))) want = 0;
    for (int i = 0; i < N; i++) CHECK_MSG(got[i] == want, "thread %d: %d, want %d", i, got[i], want);
    log_set_level(LOG_WARN);
    int after = 0;
    pthread_create(&th[0], NULL, log_level_reader, &after);
    pthread_join(th[0], NULL);
    CHECK(after == 0 && log_enabled(LOG_WARN));
}

/* base_dir_clear removes a tree: files, a link, a sub-directory holding a
 * file (a resumed job's run directory has one: it used to stay behind). */
static void test_dir_clear_tree(void)
{
    char dir[] = "/tmp/test_base_XXXXXX", p[256];
    REQUIRE(mkdtemp(dir));
    snprintf(p, sizeof p, "%s/f", dir);
    FILE *f = fopen(p, "we");
    REQUIRE(f);
    fclose(f);
    snprintf(p, sizeof p, "%s/sub", dir);
    REQUIRE(mkdir(p, 0700) == 0);
    snprintf(p, sizeof p, "%s/sub/deeper", dir);
    REQUIRE(mkdir(p, 0700) == 0);
    snprintf(p, sizeof p, "%s/sub/deeper/g", dir);
    REQUIRE((f = fopen(p, "we")));
    fclose(f);
    snprintf(p, sizeof p, "%s/link", dir);
    REQUIRE(symlink("/", p) == 0);
    CHECK(base_dir_clear(dir) == 0);
    CHECK(access(dir, F_OK) != 0 && errno == ENOENT);
    CHECK(base_dir_clear(dir) == ENOENT);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_log_level_first_use_threads, test_status_ranges, test_clock_monotonic,
             test_dir_clear_tree);
}
