#include "base/status.h"
#include "base/clock.h"
#include "tests/test.h"

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

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_status_ranges, test_clock_monotonic);
}
