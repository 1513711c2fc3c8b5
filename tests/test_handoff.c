/* train/handoff.h: the descriptor's codec and checks, the sender's pool
 * (growth, reuse, stale and forged releases) and the receiver's map over the
 * cpu backend's shared memory (what one side writes the other reads). */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/test.h"
#include "train/handoff.h"

static tensor_t desc_tensor(uint8_t *buf) { return tensor_make(buf, DT_U8, DEVICE_CPU, 1, (int64_t[]){HANDOFF_DESC_BYTES}); }

static handoff_desc_t sample(void)
{
    handoff_desc_t d = {.slot = 5, .gen = 4000000001u, .kind = DEV_CUDA, .dtype = DT_BF16, .ndim = 3,
                        .shape = {4, 1024, 576}, .capacity = 4 * 1024 * 576 * 2};
    for (int i = 0; i < KERN_IPC_HANDLE_MAX; i++) d.handle.bytes[i] = (uint8_t)(i * 7 + 1);
    return d;
}

static void test_desc_roundtrip(void)
{
    handoff_desc_t d = sample(), got;
    uint8_t buf[HANDOFF_DESC_BYTES];
    handoff_desc_write(&d, buf);
    tensor_t t = desc_tensor(buf);
    char err[160] = "";
    REQUIRE(handoff_desc_read(&t, &got, err, sizeof err) == BT_OK);
    CHECK(got.slot == 5 && got.gen == 4000000001u && got.kind == DEV_CUDA && got.dtype == DT_BF16);
    CHECK(got.ndim == 3 && got.shape[0] == 4 && got.shape[1] == 1024 && got.shape[2] == 576);
    CHECK(got.capacity == d.capacity && !memcmp(got.handle.bytes, d.handle.bytes, KERN_IPC_HANDLE_MAX));
    CHECK(!memcmp(buf, "BTHO", 4) && buf[4] == 1 && buf[8] == 5); /* little-endian fields */
}

/* Each spoiled field is refused with a message naming it. */
static void test_desc_refusals(void)
{
    struct { int off; uint8_t val; const char *says; } bad[] = {
        {0, 'X', "magic"},                 /* magic */
        {4, 2, "version"},                 /* version 2 */
        {8, HANDOFF_MAX_SLOTS, "slot"},    /* slot out of range */
        {16, DEV_COUNT, "device kind"},    /* unknown device */
        {20, DT_COUNT, "dtype"},           /* unknown dtype */
        {24, 0, "ndim"},                   /* ndim 0 */
        {24, 5, "ndim"},                   /* ndim 5 */
        {28, 0, "dim 0"},                  /* a zero dim */
        {28 + 8 * 2 + 7, 0x40, "dim 2"},   /* a dim of 2^62 */
        {60 + 2, 0, "bytes of tensor in a buffer"}, /* capacity below the shape */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        handoff_desc_t d = sample(), got;
        uint8_t buf[HANDOFF_DESC_BYTES];
        handoff_desc_write(&d, buf);
        buf[bad[i].off] = bad[i].val;
        if (bad[i].off == 60 + 2) buf[60 + 3] = 0; /* capacity = its two low bytes only */
        tensor_t t = desc_tensor(buf);
        char err[160] = "";
        bt_status_t st = handoff_desc_read(&t, &got, err, sizeof err);
        CHECK_MSG(st == BT_ERR_PEER_PROTO && strstr(err, bad[i].says), "case %zu: status %d, '%s'", i,
                  (int)st, err);
    }
    uint8_t buf[HANDOFF_DESC_BYTES + 1] = {0};
    tensor_t t = tensor_make(buf, DT_U8, DEVICE_CPU, 1, (int64_t[]){HANDOFF_DESC_BYTES + 1});
    handoff_desc_t got;
    char err[160] = "";
    CHECK(handoff_desc_read(&t, &got, err, sizeof err) == BT_ERR_PEER_PROTO && strstr(err, "u8"));
    t = tensor_make(buf, DT_F32, DEVICE_CPU, 1, (int64_t[]){HANDOFF_DESC_BYTES / 4});
    CHECK(handoff_desc_read(&t, &got, err, sizeof err) == BT_ERR_PEER_PROTO);
}

static bool shm_exists(const handoff_desc_t *d)
{
    int fd = shm_open((const char *)d->handle.bytes, O_RDONLY, 0);
    if (fd >= 0) close(fd);
    return fd >= 0;
}

static void test_pool_reuse_and_releases(void)
{
    handoff_pool_t p;
    REQUIRE(handoff_pool_init(&p, DEVICE_CPU) == BT_OK);
    int64_t big[3] = {2, 8, 16}, small[3] = {1, 8, 16};
    tensor_t v0, v1, v2;
    handoff_desc_t d0, d1, d2;
    REQUIRE(handoff_take(&p, DT_F32, 3, big, &v0, &d0) == BT_OK);
    REQUIRE(handoff_take(&p, DT_F32, 3, big, &v1, &d1) == BT_OK);
    CHECK(d0.slot == 0 && d1.slot == 1 && d0.gen == 1 && d1.gen == 1 && v0.data != v1.data);
    CHECK(d0.capacity == 2 * 8 * 16 * 4 && v0.device.kind == DEV_CPU && tensor_numel(&v0) == 256);
    CHECK(shm_exists(&d0) && shm_exists(&d1));
    /* releases: a wrong generation, an unknown slot, then the right one, then twice */
    CHECK(handoff_release(&p, 0, 2) == BT_ERR_INVALID);
    CHECK(handoff_release(&p, 9, 1) == BT_ERR_INVALID);
    CHECK(handoff_release(&p, 0, 1) == BT_OK);
    CHECK(handoff_release(&p, 0, 1) == BT_ERR_INVALID);
    /* the released buffer is reused (a smaller tensor fits), with a new generation */
    REQUIRE(handoff_take(&p, DT_F32, 3, small, &v2, &d2) == BT_OK);
    CHECK(d2.slot == 0 && d2.gen == 2 && v2.data == v0.data && p.n_slots == 2);
    CHECK(handoff_release(&p, 0, 1) == BT_ERR_INVALID); /* the old use's release is stale now */
    /* a bigger tensor than any free buffer gets a new one */
    CHECK(handoff_release(&p, 1, 1) == BT_OK);
    int64_t bigger[3] = {4, 8, 16};
    tensor_t v3;
    handoff_desc_t d3;
    REQUIRE(handoff_take(&p, DT_F32, 3, bigger, &v3, &d3) == BT_OK);
    CHECK(d3.slot == 2 && p.n_slots == 3);
    int n;
    size_t bytes;
    handoff_pool_usage(&p, &n, &bytes);
    CHECK(n == 3 && bytes == (256 + 256 + 512) * 4 && p.handed == 4 && p.released == 2);
    handoff_pool_fini(&p);
    CHECK(!shm_exists(&d0) && !shm_exists(&d3)); /* the names are gone with the pool */
}

static void test_pool_bounded(void)
{
    handoff_pool_t p;
    REQUIRE(handoff_pool_init(&p, DEVICE_CPU) == BT_OK);
    int64_t sh[3] = {1, 1, 4};
    tensor_t v;
    handoff_desc_t d;
    for (int i = 0; i < HANDOFF_MAX_SLOTS; i++) REQUIRE(handoff_take(&p, DT_F32, 3, sh, &v, &d) == BT_OK);
    CHECK(handoff_take(&p, DT_F32, 3, sh, &v, &d) == BT_ERR_BUSY);
    CHECK(handoff_release(&p, 17, 1) == BT_OK);
    CHECK(handoff_take(&p, DT_F32, 3, sh, &v, &d) == BT_OK && d.slot == 17 && d.gen == 2);
    handoff_pool_fini(&p);
    handoff_pool_t f;
    CHECK(handoff_pool_init(&f, (device_t){DEV_FENCED, 0}) == BT_ERR_UNSUPPORTED);
}

/* The receiver's mapping shares the sender's pages both ways. */
static void test_map_shares_memory(void)
{
    handoff_pool_t p;
    REQUIRE(handoff_pool_init(&p, DEVICE_CPU) == BT_OK);
    int64_t sh[3] = {2, 3, 5};
    tensor_t v, w, w2;
    handoff_desc_t d;
    REQUIRE(handoff_take(&p, DT_F32, 3, sh, &v, &d) == BT_OK);
    float *a = v.data;
    for (int i = 0; i < 30; i++) a[i] = (float)i * 0.5f - 3.0f;
    /* through the wire form, as a neighbour gets it */
    uint8_t buf[HANDOFF_DESC_BYTES];
    handoff_desc_write(&d, buf);
    tensor_t t = desc_tensor(buf);
    handoff_desc_t got;
    char err[160];
    REQUIRE(handoff_desc_read(&t, &got, err, sizeof err) == BT_OK);
    handoff_map_t m;
    handoff_map_init(&m, DEVICE_CPU);
    REQUIRE(handoff_map_view(&m, &got, &w) == BT_OK);
    CHECK(w.data != v.data && w.dtype == DT_F32 && w.shape[2] == 5 && m.n == 1);
    CHECK(!memcmp(w.data, v.data, 30 * sizeof(float)));
    ((float *)w.data)[7] = 42.0f;
    CHECK(a[7] == 42.0f);
    REQUIRE(handoff_map_view(&m, &got, &w2) == BT_OK); /* mapped once */
    CHECK(w2.data == w.data && m.n == 1);
    /* what the map refuses: another device kind, a grown capacity, a name
     * not ours, an object that is not there, one smaller than said */
    handoff_desc_t bad = got;
    bad.kind = DEV_CUDA;
    CHECK(handoff_map_view(&m, &bad, &w2) == BT_ERR_PEER_PROTO);
    bad = got;
    bad.capacity *= 2;
    CHECK(handoff_map_view(&m, &bad, &w2) == BT_ERR_PEER_PROTO);
    bad = got;
    memset(bad.handle.bytes, 0, KERN_IPC_HANDLE_MAX);
    strcpy((char *)bad.handle.bytes, "/dev-shm-elsewhere");
    CHECK(handoff_map_view(&m, &bad, &w2) == BT_ERR_INVALID);
    memset(bad.handle.bytes, 'a', KERN_IPC_HANDLE_MAX); /* no NUL at all */
    CHECK(handoff_map_view(&m, &bad, &w2) == BT_ERR_INVALID);
    memset(bad.handle.bytes, 0, KERN_IPC_HANDLE_MAX);
    strcpy((char *)bad.handle.bytes, "/baton-0-0-nothere");
    CHECK(handoff_map_view(&m, &bad, &w2) == BT_ERR_NOT_FOUND);
    tensor_t v2;
    handoff_desc_t small;
    REQUIRE(handoff_take(&p, DT_F32, 3, (int64_t[]){1, 1, 2}, &v2, &small) == BT_OK);
    small.capacity = 1 << 20;
    small.shape[2] = 1 << 18;
    CHECK(handoff_map_view(&m, &small, &w2) == BT_ERR_CORRUPT);
    CHECK(m.n == 1);
    handoff_map_fini(&m);
    handoff_pool_fini(&p);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_desc_roundtrip, test_desc_refusals, test_pool_reuse_and_releases,
             test_pool_bounded, test_map_shares_memory);
}
