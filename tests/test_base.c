#include "base/status.h"
#include "base/clock.h"
#include "base/log.h"
#include "tests/test.h"

#include <pthread.h>

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

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_log_level_first_use_threads, test_status_ranges, test_clock_monotonic);
}
