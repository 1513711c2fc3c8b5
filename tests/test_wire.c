/* Wire envelope and typed messages: round trips of every type with tensors,
 * one rejection test per way a frame can lie, limits, and the fuzz
 * properties over the seed corpus plus thousands of random mutations (so
 * that `make test` exercises the decoder without clang). */
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

#include "base/clock.h"
#include "base/log.h"
#include "tests/test.h"
/* The fuzz target itself: its LLVMFuzzerTestOneInput aborts on a property
 * violation, which fails this test binary. */
#include "tests/fuzz/fuzz_wire.c"

#define CORPUS_DIR "tests/fuzz/corpus_wire"

/* ---- frame construction helpers ------------------------------------------ */

static float g_x[6] = {1, 2, 3, 4, 5, 6};          /* "x": f32 [3,2] */
static int32_t g_ids[5] = {10, -20, 30, -40, 50};  /* "ids": i32 [5] */

static wire_env_t env_make(msg_type_t type)
{
    wire_env_t e;
    memset(&e, 0, sizeof e);
    e.type = type;
    e.src = ACTOR_ADDR(1, 2);
    e.dst = ACTOR_ADDR(3, 4);
    e.seq = 77;
    e.step = 5;
    e.mb = 2;
    return e;
}

static tensor_t view_2d(void *data, dtype_t dt, int64_t a, int64_t b)
{
    tensor_t t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = 2;
    t.shape[0] = a; t.shape[1] = b;
    t.stride[0] = b; t.stride[1] = 1;
    t.data = data;
    return t;
}

static tensor_t view_1d(void *data, dtype_t dt, int64_t a)
{
    tensor_t t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = 1;
    t.shape[0] = a;
    t.stride[0] = 1;
    t.data = data;
    return t;
}

/* A valid PING header with tensor x (and ids when two) into buf. */
static size_t frame_valid(msgpack_sbuffer *buf, msg_type_t type, const void *body, int ntensors)
{
    wire_env_t e = env_make(type);
    tensor_t ts[2] = {view_2d(g_x, DT_F32, 3, 2), view_1d(g_ids, DT_I32, 5)};
    const char *names[2] = {"x", "ids"};
    struct iovec iov[4];
    int iovcnt;
    size_t plen;
    wire_err_t err;
    bt_status_t st = wire_tensors_layout(&e, ts, names, ntensors, iov, &iovcnt, &plen, &err);
    if (st == BT_OK) st = msg_encode(buf, &e, body, &err);
    if (st != BT_OK) BT_PANIC("frame_valid: %s", err.reason);
    return plen;
}

static const msg_ping_t g_ping = {.id = 9, .t_ns = 123456789};

/* ---- msgpack object tree editing, for malformed frames -------------------- */

static msgpack_object mk_str(const char *s)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_STR};
    o.via.str.ptr = s;
    o.via.str.size = (uint32_t)strlen(s);
    return o;
}

static msgpack_object mk_uint(uint64_t v)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_POSITIVE_INTEGER};
    o.via.u64 = v;
    return o;
}

static msgpack_object mk_int(int64_t v)
{
    if (v >= 0) return mk_uint((uint64_t)v);
    msgpack_object o = {.type = MSGPACK_OBJECT_NEGATIVE_INTEGER};
    o.via.i64 = v;
    return o;
}

static msgpack_object *kv_get(msgpack_object *map, const char *key)
{
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(key) &&
            !memcmp(k->via.str.ptr, key, k->via.str.size))
            return &map->via.map.ptr[i].val;
    }
    BT_PANIC("kv_get: no key %s", key);
}

static void kv_remove(msgpack_object *map, const char *key)
{
    msgpack_object *v = kv_get(map, key);
    msgpack_object_kv *kv = (msgpack_object_kv *)((char *)v - offsetof(msgpack_object_kv, val));
    size_t idx = (size_t)(kv - map->via.map.ptr);
    memmove(kv, kv + 1, (map->via.map.size - idx - 1) * sizeof *kv);
    map->via.map.size--;
}

static void kv_add(msgpack_object *map, msgpack_zone *z, const char *key, msgpack_object val)
{
    msgpack_object_kv *kv = msgpack_zone_malloc(z, (map->via.map.size + 1) * sizeof *kv);
    memcpy(kv, map->via.map.ptr, map->via.map.size * sizeof *kv);
    kv[map->via.map.size].key = mk_str(key);
    kv[map->via.map.size].val = val;
    map->via.map.ptr = kv;
    map->via.map.size++;
}

static msgpack_object *tensor0(msgpack_object *root)
{
    return &kv_get(root, "tensors")->via.array.ptr[0];
}

typedef void (*mutate_fn)(msgpack_object *root, msgpack_zone *z);

/* Build a valid frame (PING or CREDIT, ntensors), apply m to its object tree,
 * re-pack, decode with payload_len; return the status and reason. */
static bt_status_t decode_mutated(msg_type_t type, int ntensors, mutate_fn m, long payload_len,
                                  wire_err_t *err)
{
    msgpack_sbuffer buf, out;
    msgpack_sbuffer_init(&buf);
    msgpack_sbuffer_init(&out);
    msg_credit_t credit = {.edge = 3, .credits = 4};
    size_t plen = frame_valid(&buf, type, type == MSG_CREDIT ? (const void *)&credit : (const void *)&g_ping,
                              ntensors);
    msgpack_zone z;
    msgpack_zone_init(&z, 4096);
    msgpack_object root;
    size_t off = 0;
    if (msgpack_unpack(buf.data, buf.size, &off, &z, &root) != MSGPACK_UNPACK_SUCCESS) BT_PANIC("unpack");
    if (m) m(&root, &z);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &out, msgpack_sbuffer_write);
    msgpack_pack_object(&pk, root);
    wire_env_t env;
    msg_body_t body;
    bt_status_t st = msg_decode(out.data, out.size, payload_len < 0 ? plen : (size_t)payload_len, NULL, &env,
                                &body, err);
    msgpack_zone_destroy(&z);
    msgpack_sbuffer_destroy(&buf);
    msgpack_sbuffer_destroy(&out);
    return st;
}

#define EXPECT_REJECT(type, nt, fn, plen, substr) do {                                          \
    wire_err_t e_;                                                                              \
    bt_status_t s_ = decode_mutated(type, nt, fn, plen, &e_);                                   \
    CHECK_MSG(s_ == BT_ERR_PEER_PROTO && strstr(e_.reason, substr),                             \
              "%s: status %s reason '%s', wanted '%s'", #fn, bt_status_str(s_),                 \
              s_ == BT_OK ? "" : e_.reason, substr);                                             \
} while (0)

static void m_ver2(msgpack_object *r, msgpack_zone *z) { (void)z; *kv_get(r, "ver") = mk_uint(2); }
static void m_ver_not_first(msgpack_object *r, msgpack_zone *z)
{
    (void)z;
    msgpack_object_kv t = r->via.map.ptr[0];
    r->via.map.ptr[0] = r->via.map.ptr[1];
    r->via.map.ptr[1] = t;
}
static void m_no_seq(msgpack_object *r, msgpack_zone *z) { (void)z; kv_remove(r, "seq"); }
static void m_no_meta(msgpack_object *r, msgpack_zone *z) { (void)z; kv_remove(r, "meta"); }
static void m_dup_src(msgpack_object *r, msgpack_zone *z) { kv_add(r, z, "src", mk_uint(1)); }
static void m_type_str(msgpack_object *r, msgpack_zone *z) { (void)z; *kv_get(r, "type") = mk_str("PING"); }
static void m_src_big(msgpack_object *r, msgpack_zone *z) { (void)z; *kv_get(r, "src") = mk_uint(1ull << 32); }
static void m_step_neg(msgpack_object *r, msgpack_zone *z) { (void)z; *kv_get(r, "step") = mk_int(-5); }
static void m_mb_big(msgpack_object *r, msgpack_zone *z) { (void)z; *kv_get(r, "mb") = mk_uint(1ull << 31); }
static void m_tensors_map(msgpack_object *r, msgpack_zone *z) { (void)z; *kv_get(r, "tensors") = mk_uint(0); }
static void m_nbytes12(msgpack_object *r, msgpack_zone *z) { (void)z; *kv_get(tensor0(r), "nbytes") = mk_uint(12); }
static void m_offset8(msgpack_object *r, msgpack_zone *z) { (void)z; *kv_get(tensor0(r), "offset") = mk_uint(8); }
static void m_overlap(msgpack_object *r, msgpack_zone *z)
{
    (void)z;
    *kv_get(&kv_get(r, "tensors")->via.array.ptr[1], "offset") = mk_uint(16);
}
static void m_offset_huge(msgpack_object *r, msgpack_zone *z)
{
    (void)z;
    *kv_get(&kv_get(r, "tensors")->via.array.ptr[1], "offset") = mk_uint(UINT64_MAX - 8);
}
static void m_shape_overflow(msgpack_object *r, msgpack_zone *z)
{
    msgpack_object *sh = kv_get(tensor0(r), "shape");
    msgpack_object *dims = msgpack_zone_malloc(z, 4 * sizeof *dims);
    for (int i = 0; i < 4; i++) dims[i] = mk_uint(1ull << 40);
    sh->via.array.ptr = dims;
    sh->via.array.size = 4;
}
static void m_dim_huge(msgpack_object *r, msgpack_zone *z)
{
    (void)z;
    kv_get(tensor0(r), "shape")->via.array.ptr[0] = mk_uint(1ull << 41);
}
static void m_dim_neg(msgpack_object *r, msgpack_zone *z)
{
    (void)z;
    kv_get(tensor0(r), "shape")->via.array.ptr[0] = mk_int(-3);
}
static void m_ndim5(msgpack_object *r, msgpack_zone *z)
{
    msgpack_object *sh = kv_get(tensor0(r), "shape");
    msgpack_object *dims = msgpack_zone_malloc(z, 5 * sizeof *dims);
    for (int i = 0; i < 5; i++) dims[i] = mk_uint(1);
    sh->via.array.ptr = dims;
    sh->via.array.size = 5;
}
static void m_ndim0(msgpack_object *r, msgpack_zone *z)
{
    (void)z;
    kv_get(tensor0(r), "shape")->via.array.size = 0;
}
static void m_dtype_bad(msgpack_object *r, msgpack_zone *z) { (void)z; *kv_get(tensor0(r), "dtype") = mk_str("q7"); }
static void m_dtype_int(msgpack_object *r, msgpack_zone *z) { (void)z; *kv_get(tensor0(r), "dtype") = mk_uint(0); }
static void m_name_long(msgpack_object *r, msgpack_zone *z)
{
    (void)z;
    *kv_get(tensor0(r), "name") = mk_str("a_name_that_is_much_longer_than_sixty_three_bytes_which_is_the_limit_here");
}
static void m_name_empty(msgpack_object *r, msgpack_zone *z) { (void)z; *kv_get(tensor0(r), "name") = mk_str(""); }
static void m_name_dup(msgpack_object *r, msgpack_zone *z)
{
    (void)z;
    *kv_get(&kv_get(r, "tensors")->via.array.ptr[1], "name") = mk_str("x");
}
static void m_tensor_no_nbytes(msgpack_object *r, msgpack_zone *z) { (void)z; kv_remove(tensor0(r), "nbytes"); }
static void m_tensor_dup_key(msgpack_object *r, msgpack_zone *z) { kv_add(tensor0(r), z, "dtype", mk_str("f32")); }
static void m_tensor_key_int(msgpack_object *r, msgpack_zone *z)
{
    (void)z;
    tensor0(r)->via.map.ptr[0].key = mk_uint(5);
}
static void m_type99(msgpack_object *r, msgpack_zone *z) { (void)z; *kv_get(r, "type") = mk_uint(99); }
static void m_meta_int(msgpack_object *r, msgpack_zone *z) { (void)z; *kv_get(r, "meta") = mk_uint(1); }
static void m_meta_no_id(msgpack_object *r, msgpack_zone *z) { (void)z; kv_remove(kv_get(r, "meta"), "id"); }
static void m_meta_id_str(msgpack_object *r, msgpack_zone *z) { (void)z; *kv_get(kv_get(r, "meta"), "id") = mk_str("9"); }
static void m_meta_id_neg(msgpack_object *r, msgpack_zone *z) { (void)z; *kv_get(kv_get(r, "meta"), "id") = mk_int(-1); }
static void m_meta_dup(msgpack_object *r, msgpack_zone *z) { kv_add(kv_get(r, "meta"), z, "id", mk_uint(1)); }
static void m_credit0(msgpack_object *r, msgpack_zone *z) { (void)z; *kv_get(kv_get(r, "meta"), "credits") = mk_uint(0); }
static void m_credit_big(msgpack_object *r, msgpack_zone *z) { (void)z; *kv_get(kv_get(r, "meta"), "credits") = mk_uint(1ull << 32); }
static void m_root_array(msgpack_object *r, msgpack_zone *z)
{
    (void)z;
    msgpack_object a = {.type = MSGPACK_OBJECT_ARRAY};
    a.via.array.size = 0;
    *r = a;
}
static void m_key_int(msgpack_object *r, msgpack_zone *z) { (void)z; r->via.map.ptr[3].key = mk_uint(3); }

static void test_wire_rejects_lies(void)
{
    EXPECT_REJECT(MSG_PING, 1, m_ver2, -1, "envelope: version 2, expected 1");
    EXPECT_REJECT(MSG_PING, 1, m_ver_not_first, -1, "first key is not 'ver'");
    EXPECT_REJECT(MSG_PING, 1, m_no_seq, -1, "missing key 'seq'");
    EXPECT_REJECT(MSG_PING, 1, m_no_meta, -1, "missing key 'meta'");
    EXPECT_REJECT(MSG_PING, 1, m_dup_src, -1, "duplicate key 'src'");
    EXPECT_REJECT(MSG_PING, 1, m_type_str, -1, "type is not an unsigned integer");
    EXPECT_REJECT(MSG_PING, 1, m_src_big, -1, "src 4294967296 exceeds");
    EXPECT_REJECT(MSG_PING, 1, m_step_neg, -1, "step -5 out of range");
    EXPECT_REJECT(MSG_PING, 1, m_mb_big, -1, "mb 2147483648 out of range");
    EXPECT_REJECT(MSG_PING, 1, m_tensors_map, -1, "tensors is not an array");
    EXPECT_REJECT(MSG_PING, 1, m_nbytes12, -1, "envelope: tensor 'x' nbytes 12 != 3x2 f32");
    EXPECT_REJECT(MSG_PING, 1, m_offset8, -1, "tensor 'x' offset 8, expected 0");
    EXPECT_REJECT(MSG_PING, 2, m_overlap, -1, "tensor 'ids' offset 16, expected 64");
    EXPECT_REJECT(MSG_PING, 2, m_offset_huge, -1, "tensor 'ids' offset");
    EXPECT_REJECT(MSG_PING, 1, NULL, 10, "tensor 'x' [0, +24) lies beyond the 10-byte payload");
    EXPECT_REJECT(MSG_PING, 1, NULL, 100, "payload is 100 bytes but the tensors cover 24");
    EXPECT_REJECT(MSG_PING, 0, NULL, 1, "payload is 1 bytes but the tensors cover 0");
    EXPECT_REJECT(MSG_PING, 1, NULL, (long)(2ull << 30), "exceeds the limit");
    EXPECT_REJECT(MSG_PING, 1, m_shape_overflow, -1, "overflows");
    EXPECT_REJECT(MSG_PING, 1, m_dim_huge, -1, "dim 0 2199023255552 exceeds");
    EXPECT_REJECT(MSG_PING, 1, m_dim_neg, -1, "dim 0 is not an unsigned integer");
    EXPECT_REJECT(MSG_PING, 1, m_ndim5, -1, "has 5 dims");
    EXPECT_REJECT(MSG_PING, 1, m_ndim0, -1, "has 0 dims");
    EXPECT_REJECT(MSG_PING, 1, m_dtype_bad, -1, "unknown dtype");
    EXPECT_REJECT(MSG_PING, 1, m_dtype_int, -1, "unknown dtype");
    EXPECT_REJECT(MSG_PING, 1, m_name_long, -1, "exceeds 63");
    EXPECT_REJECT(MSG_PING, 1, m_name_empty, -1, "empty tensor name");
    EXPECT_REJECT(MSG_PING, 2, m_name_dup, -1, "duplicate tensor name 'x'");
    EXPECT_REJECT(MSG_PING, 1, m_tensor_no_nbytes, -1, "tensor #0 missing key 'nbytes'");
    EXPECT_REJECT(MSG_PING, 1, m_tensor_dup_key, -1, "tensor #0 duplicate key 'dtype'");
    EXPECT_REJECT(MSG_PING, 1, m_tensor_key_int, -1, "tensor #0 key #0 is not a string");
    EXPECT_REJECT(MSG_PING, 1, m_type99, -1, "unknown message type 99");
    EXPECT_REJECT(MSG_PING, 1, m_meta_int, -1, "PING: meta is not a map");
    EXPECT_REJECT(MSG_PING, 1, m_meta_no_id, -1, "PING: missing meta key 'id'");
    EXPECT_REJECT(MSG_PING, 1, m_meta_id_str, -1, "PING: meta 'id' is not an integer");
    EXPECT_REJECT(MSG_PING, 1, m_meta_id_neg, -1, "PING: meta 'id' is not an integer");
    EXPECT_REJECT(MSG_PING, 1, m_meta_dup, -1, "PING: duplicate meta key 'id'");
    EXPECT_REJECT(MSG_CREDIT, 0, m_credit0, -1, "CREDIT: grant of 0 credits");
    EXPECT_REJECT(MSG_CREDIT, 0, m_credit_big, -1, "CREDIT: meta 'credits' is not an integer in range");
    EXPECT_REJECT(MSG_PING, 1, m_root_array, -1, "not a msgpack map");
    EXPECT_REJECT(MSG_PING, 1, m_key_int, -1, "key #3 is not a string");
}

/* Extra keys anywhere are skipped: formats grow by appending. */
static void m_extra_keys(msgpack_object *r, msgpack_zone *z)
{
    kv_add(r, z, "trace_ctx", mk_uint(42));
    kv_add(tensor0(r), z, "device", mk_str("cuda:0"));
    kv_add(kv_get(r, "meta"), z, "added_in_v1_1", mk_str("x"));
}

static void test_wire_unknown_keys_skipped(void)
{
    wire_err_t err;
    bt_status_t st = decode_mutated(MSG_PING, 1, m_extra_keys, -1, &err);
    CHECK_MSG(st == BT_OK, "%s", err.reason);
}

/* Every proper prefix of a valid header is rejected, as is any header with
 * trailing bytes; nothing reads past the end (ASan run). */
static void test_wire_truncated_and_trailing(void)
{
    msgpack_sbuffer buf;
    msgpack_sbuffer_init(&buf);
    size_t plen = frame_valid(&buf, MSG_PING, &g_ping, 2);
    int rejected = 0;
    for (size_t n = 0; n < buf.size; n++) {
        uint8_t *copy = malloc(n ? n : 1); /* exact size: ASan catches overreads */
        memcpy(copy, buf.data, n);
        wire_env_t env;
        msg_body_t body;
        wire_err_t err;
        bt_status_t st = msg_decode(copy, n, plen, NULL, &env, &body, &err);
        rejected += st == BT_ERR_PEER_PROTO && err.reason[0];
        free(copy);
    }
    CHECK(rejected == (int)buf.size);
    msgpack_sbuffer_write(&buf, "\xc0", 1);
    wire_env_t env;
    msg_body_t body;
    wire_err_t err;
    CHECK(msg_decode(buf.data, buf.size, plen, NULL, &env, &body, &err) == BT_ERR_PEER_PROTO);
    CHECK(strstr(err.reason, "1 trailing bytes") != NULL);
    msgpack_sbuffer_destroy(&buf);
}

/* Containers that claim more entries than there are bytes, deep nesting and
 * invalid bytes are caught before msgpack-c allocates anything. */
static void test_wire_hostile_counts(void)
{
    static const struct { const char *bytes; size_t len; const char *want; } cases[] = {
        {"\xdd\xff\xff\xff\xff", 5, "array of 4294967295 entries"},
        {"\xdf\xff\xff\xff\xff\x00", 6, "map of 4294967295 entries"},
        {"\x82\xa3ver\x01\xa1x\xdd\x00\x10\x00\x00", 13, "overruns"},
        {"\x81\xa3ver\xdb\xff\xff\xff\xff", 10, "overruns"},
        {"\xc1", 1, "invalid msgpack byte 0xc1"},
        {"\xcf\x00\x00", 3, "overruns"},
        {"\xc7", 1, "truncated msgpack length"},
        {"", 0, "empty header"},
        {"\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x90", 19, "nested deeper"},
        {"\x93\x01\x02\x03", 4, "not a msgpack map"},
        {"\x81\xa3vet\x01", 6, "first key is not 'ver'"},
        {"\x81\xa3ver\xa1\x31", 7, "version -1, expected 1"},
        {"\x81\xa3ver\x01", 6, "missing key 'type'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        wire_env_t env;
        msg_body_t body;
        wire_err_t err;
        bt_status_t st = msg_decode(cases[i].bytes, cases[i].len, 0, NULL, &env, &body, &err);
        CHECK_MSG(st == BT_ERR_PEER_PROTO && strstr(err.reason, cases[i].want), "case %zu: %s: '%s'", i,
                  bt_status_str(st), err.reason);
    }
}

static void test_wire_limits(void)
{
    msgpack_sbuffer buf;
    msgpack_sbuffer_init(&buf);
    size_t plen = frame_valid(&buf, MSG_PING, &g_ping, 2);
    wire_env_t env;
    msg_body_t body;
    wire_err_t err;
    wire_limits_t lim = wire_limits_default();
    CHECK(msg_decode(buf.data, buf.size, plen, &lim, &env, &body, &err) == BT_OK);
    lim.max_hdr_bytes = buf.size - 1;
    CHECK(msg_decode(buf.data, buf.size, plen, &lim, &env, &body, &err) == BT_ERR_PEER_PROTO);
    CHECK(strstr(err.reason, "exceeds the limit") != NULL);
    lim = wire_limits_default();
    lim.max_tensors = 1;
    CHECK(msg_decode(buf.data, buf.size, plen, &lim, &env, &body, &err) == BT_ERR_PEER_PROTO);
    CHECK(strstr(err.reason, "2 tensors exceed the limit 1") != NULL);
    lim = wire_limits_default();
    lim.max_payload = plen - 1;
    CHECK(msg_decode(buf.data, buf.size, plen, &lim, &env, &body, &err) == BT_ERR_PEER_PROTO);
    lim = wire_limits_default();
    lim.max_dims = 1; /* x is 2-d */
    CHECK(msg_decode(buf.data, buf.size, plen, &lim, &env, &body, &err) == BT_ERR_PEER_PROTO);
    CHECK(strstr(err.reason, "has 2 dims (1..1 allowed)") != NULL);
    lim = wire_limits_default();
    lim.max_name_len = 2; /* "ids" is 3 */
    CHECK(msg_decode(buf.data, buf.size, plen, &lim, &env, &body, &err) == BT_ERR_PEER_PROTO);
    lim = wire_limits_default();
    lim.max_dim = 4; /* x is 3x2, ids is 5 */
    CHECK(msg_decode(buf.data, buf.size, plen, &lim, &env, &body, &err) == BT_ERR_PEER_PROTO);
    CHECK(strstr(err.reason, "tensor 'ids' dim 0 5 exceeds 4") != NULL);
    msgpack_sbuffer_destroy(&buf);
}

/* ---- round trips ------------------------------------------------------- */

static void bodies_fill(msg_body_t *b, msg_type_t t)
{
    memset(b, 0, sizeof *b);
    switch (t) {
    case MSG_PING: case MSG_PONG: b->ping = (msg_ping_t){.id = 1ull << 60, .t_ns = 42}; break;
    case MSG_CREDIT: b->credit = (msg_credit_t){.edge = 7, .credits = 3}; break;
    case MSG_HEARTBEAT: b->heartbeat = (msg_heartbeat_t){.t_ns = 5, .rank = 3, .state = 2, .step = -1}; break;
    case MSG_STOP: b->stop.status = BT_ERR_PEER_CLOSED; strcpy(b->stop.why, "rank 2 died"); break;
    case MSG_ERROR_REPORT:
        b->error_report.status = BT_ERR_NUMERIC;
        b->error_report.actor = ACTOR_ADDR(2, 1);
        b->error_report.peer = 0xffffffffu;
        strcpy(b->error_report.where, "stage 2 fwd");
        strcpy(b->error_report.text, "loss is NaN at step 17");
        break;
    case MSG_ACTIVATION: b->activation = (msg_activation_t){.vstage = 3, .chunk = 1}; break;
    case MSG_ACT_GRAD: b->act_grad = (msg_act_grad_t){.vstage = 2, .chunk = 0, .loss_scale = 0.125f}; break;
    case MSG_DATA_BATCH: b->data_batch = (msg_data_batch_t){.data_pos = 123456789012ull, .batch = 4, .seq_len = 1024, .epoch = 1}; break;
    case MSG_METRICS:
        b->metrics = (msg_metrics_t){.loss = 2.5f, .grad_norm = NAN, .lr = 3e-4f, .tokens = 8192,
                                     .t_fwd_ms = 1.25, .t_bwd_ms = 2.5, .t_opt_ms = 0.125, .t_step_ms = 4.0};
        break;
    case MSG_CKPT_SHARD:
        strcpy(b->ckpt_shard.name, "layers.3.attn.wq");
        b->ckpt_shard.ckpt_step = 1000;
        b->ckpt_shard.shard = 1;
        b->ckpt_shard.ndim = 2;
        b->ckpt_shard.global_shape[0] = 512; b->ckpt_shard.global_shape[1] = 256;
        b->ckpt_shard.start[0] = 256; b->ckpt_shard.start[1] = 0;
        b->ckpt_shard.is_optim = 0;
        break;
    case MSG_RELEASE: b->release = (msg_release_t){.slot = 7, .gen = 4000000001u}; break;
    case MSG_CKPT_PIECE:
        b->ckpt_piece = (msg_ckpt_piece_t){.step = 6, .index = 2, .count = 9, .ndim = 2,
                                           .glob0 = 512, .glob1 = 256, .off0 = 256, .ext0 = 256,
                                           .ext1 = 256, .flat_start = 1000, .flat_len = 24};
        strcpy(b->ckpt_piece.name, "optim.exp_avg/model.layers.3.self_attn.q_proj.weight");
        break;
    case MSG_CKPT_CTL:
        b->ckpt_ctl = (msg_ckpt_ctl_t){.step = 6, .phase = CKPT_CTL_WRITTEN, .status = 0, .rank = 3,
                                       .count = 12};
        strcpy(b->ckpt_ctl.text, "shard-r00003.safetensors");
        break;
    case MSG_CKPT_FETCH:
        b->ckpt_fetch = (msg_ckpt_fetch_t){.req = 77, .from = 2, .phase = CKPT_FETCH_REQUEST, .step = 6,
                                           .offset = 1u << 20, .length = 65536};
        strcpy(b->ckpt_fetch.file, "shard-r00005.safetensors");
        break;
    case MSG_EXPERT_TOKENS:
    case MSG_EXPERT_DONE:
        b->expert = (msg_expert_t){.call = 9000000000ull, .layer = 3, .phase = EXPERT_BWD,
                                   .rows = 64, .rows_in = 0, .status = -5};
        break;
    case MSG_CP_BLOCK:
        b->cp_block = (msg_cp_block_t){.chunk = 1, .layer = 26, .phase = CP_BLOCK_BWD,
                                       .ring_step = 3, .what = CP_BLOCK_DV};
        break;
    default: BT_PANIC("type %d", (int)t);
    }
}

static void test_wire_roundtrip_all_types(void)
{
    for (int t = 0; t < MSG_TYPE_COUNT; t++) {
        msg_body_t body, got;
        bodies_fill(&body, (msg_type_t)t);
        wire_env_t env = env_make((msg_type_t)t), denv;
        tensor_t ts[2] = {view_2d(g_x, DT_F32, 3, 2), view_1d(g_ids, DT_I32, 5)};
        const char *names[2] = {"x", "ids"};
        msg_frame_t f;
        msg_frame_init(&f);
        wire_err_t err;
        REQUIRE(msg_frame_build(&f, &env, &body, ts, names, 2, &err) == BT_OK);
        /* canonical layout: x at 0 (24 bytes), zero padding, ids at 64 (20 bytes) */
        CHECK(f.payload_len == 84);
        CHECK(f.iovcnt == 3);
        uint8_t payload[128];
        memset(payload, 0xee, sizeof payload);
        CHECK(wire_gen_gather(f.iov, f.iovcnt, payload) == 84);
        for (int i = 24; i < 64; i++) CHECK(payload[i] == 0);
        bt_status_t st = msg_decode(f.hdr.data, f.hdr.size, f.payload_len, NULL, &denv, &got, &err);
        CHECK_MSG(st == BT_OK, "%s: %s", msg_type_name((uint32_t)t), err.reason);
        if (st != BT_OK) { msg_frame_fini(&f); continue; }
        CHECK(denv.type == (uint32_t)t && denv.src == ACTOR_ADDR(1, 2) && denv.dst == ACTOR_ADDR(3, 4));
        CHECK(denv.seq == 77 && denv.step == 5 && denv.mb == 2 && denv.ntensors == 2);
        CHECK(msg_body_equal((uint32_t)t, &body, &got));
        CHECK(denv.tensors[0].offset == 0 && denv.tensors[0].nbytes == 24);
        CHECK(denv.tensors[1].offset == 64 && denv.tensors[1].nbytes == 20);
        tensor_t x, ids, none;
        REQUIRE(wire_tensor_find(&denv, "x", payload, &x) == BT_OK);
        REQUIRE(wire_tensor_find(&denv, "ids", payload, &ids) == BT_OK);
        CHECK(wire_tensor_find(&denv, "y", payload, &none) == BT_ERR_NOT_FOUND);
        CHECK(x.dtype == DT_F32 && x.ndim == 2 && x.shape[0] == 3 && x.shape[1] == 2);
        CHECK(x.stride[0] == 2 && x.stride[1] == 1);
        CHECK(ids.dtype == DT_I32 && ids.ndim == 1 && ids.shape[0] == 5);
        for (int i = 0; i < 6; i++) CHECK(((float *)x.data)[i] == g_x[i]);
        for (int i = 0; i < 5; i++) CHECK(((int32_t *)ids.data)[i] == g_ids[i]);
        msg_frame_fini(&f);
    }
    /* the specific body values, not only equality with themselves */
    msg_body_t b, got;
    bodies_fill(&b, MSG_METRICS);
    msgpack_sbuffer buf;
    msgpack_sbuffer_init(&buf);
    wire_env_t env = env_make(MSG_METRICS), denv;
    wire_err_t err;
    REQUIRE(msg_encode(&buf, &env, &b, &err) == BT_OK);
    REQUIRE(msg_decode(buf.data, buf.size, 0, NULL, &denv, &got, &err) == BT_OK);
    CHECK(got.metrics.loss == 2.5f && isnan(got.metrics.grad_norm) && got.metrics.tokens == 8192);
    CHECK(got.metrics.t_bwd_ms == 2.5 && got.metrics.lr == 3e-4f);
    msgpack_sbuffer_destroy(&buf);
}

/* A tensor's device travels in its descriptor: a host tensor keeps the five
 * keys (its bytes unchanged), another device adds "dev" last; both decoders
 * give it back, and a device name the decoder cannot parse is refused. */
static void test_wire_tensor_device(void)
{
    tensor_t ts[2] = {view_2d(g_x, DT_F32, 3, 2), view_1d(g_ids, DT_I32, 5)};
    const char *names[2] = {"x", "ids"};
    ts[0].device = (device_t){DEV_CUDA, 3};
    msg_frame_t f, host;
    msg_frame_init(&f);
    msg_frame_init(&host);
    wire_err_t err;
    wire_env_t env = env_make(MSG_ACTIVATION), henv = env_make(MSG_ACTIVATION), d;
    msg_body_t body, got;
    bodies_fill(&body, MSG_ACTIVATION);
    REQUIRE(msg_frame_build(&f, &env, &body, ts, names, 2, &err) == BT_OK);
    tensor_t plain = view_2d(g_x, DT_F32, 3, 2);
    ts[0] = plain;
    REQUIRE(msg_frame_build(&host, &henv, &body, ts, names, 2, &err) == BT_OK);
    /* "dev" + "cuda:3": 4 + 7 bytes more, and the map header says 6 keys */
    CHECK(f.hdr.size == host.hdr.size + 11);
    CHECK(memmem(f.hdr.data, f.hdr.size, "\x86\xa4name", 6) != NULL);
    CHECK(memmem(host.hdr.data, host.hdr.size, "\x86\xa4name", 6) == NULL);
    for (int path = WIRE_DECODE_AUTO; path <= WIRE_DECODE_FAST; path++) {
        wire_gen_dec_t r;
        wire_gen_dec_run(f.hdr.data, f.hdr.size, f.payload_len, NULL, (wire_decode_path_t)path, &r);
        CHECK_MSG(r.st == BT_OK, "path %d: %s", path, r.err.reason);
        CHECK(device_eq(r.env.tensors[0].device, (device_t){DEV_CUDA, 3}));
        CHECK(device_is_host(r.env.tensors[1].device));
    }
    REQUIRE(msg_decode(f.hdr.data, f.hdr.size, f.payload_len, NULL, &d, &got, &err) == BT_OK);
    uint8_t payload[128];
    wire_gen_gather(f.iov, f.iovcnt, payload);
    tensor_t x;
    REQUIRE(wire_tensor_find(&d, "x", payload, &x) == BT_OK);
    CHECK(x.device.kind == DEV_CUDA && x.device.index == 3);
    /* a device the decoder does not know: refused, naming the tensor */
    char *bad = malloc(f.hdr.size);
    memcpy(bad, f.hdr.data, f.hdr.size);
    char *at = memmem(bad, f.hdr.size, "cuda:3", 6);
    REQUIRE(at);
    memcpy(at, "tpu:03", 6);
    CHECK(msg_decode(bad, f.hdr.size, f.payload_len, NULL, &d, &got, &err) == BT_ERR_PEER_PROTO);
    CHECK_MSG(strstr(err.reason, "tensor 'x' names an unknown device") != NULL, "%s", err.reason);
    free(bad);
    msg_frame_fini(&f);
    msg_frame_fini(&host);
}

/* The exact bytes of one envelope, written out by hand from the msgpack
 * spec: the format is a contract with other processes (and other builds),
 * so an encoder change that alters them must be deliberate. */
static void test_wire_golden_bytes(void)
{
    static const uint8_t want[] = {
        0x89,                                     /* map of 9 */
        0xa3, 'v', 'e', 'r', 0x01,
        0xa4, 't', 'y', 'p', 'e', 0x00,           /* PING */
        0xa3, 's', 'r', 'c', 0xce, 0x00, 0x01, 0x00, 0x02, /* rank 1 slot 2 */
        0xa3, 'd', 's', 't', 0xce, 0x00, 0x03, 0x00, 0x04,
        0xa3, 's', 'e', 'q', 0x4d,                /* 77 */
        0xa4, 's', 't', 'e', 'p', 0x05,
        0xa2, 'm', 'b', 0x02,
        0xa7, 't', 'e', 'n', 's', 'o', 'r', 's', 0x90,
        0xa4, 'm', 'e', 't', 'a', 0x82,
        0xa2, 'i', 'd', 0x09,
        0xa4, 't', '_', 'n', 's', 0xce, 0x07, 0x5b, 0xcd, 0x15, /* 123456789 */
    };
    msgpack_sbuffer buf;
    msgpack_sbuffer_init(&buf);
    wire_env_t e = env_make(MSG_PING);
    wire_err_t err;
    REQUIRE(msg_encode(&buf, &e, &g_ping, &err) == BT_OK);
    CHECK(buf.size == sizeof want);
    CHECK(buf.size == sizeof want && !memcmp(buf.data, want, sizeof want));
    wire_env_t d;
    msg_body_t b;
    CHECK(msg_decode(want, sizeof want, 0, NULL, &d, &b, &err) == BT_OK);
    CHECK(d.src == ACTOR_ADDR(1, 2) && b.ping.t_ns == 123456789);
    msgpack_sbuffer_destroy(&buf);
}

static void test_wire_addr(void)
{
    actor_addr_t a = ACTOR_ADDR(513, 7);
    CHECK(a == ((513u << 16) | 7u));
    CHECK(actor_addr_rank(a) == 513 && actor_addr_slot(a) == 7);
    CHECK(actor_addr_slot(ACTOR_ADDR(1, 0x1ffff)) == 0xffff);
    CHECK(!strcmp(msg_type_name(MSG_ACT_GRAD), "ACT_GRAD") && !strcmp(msg_type_name(999), "?"));
}

/* The encoder refuses what the decoder would reject, with a reason. */
static void test_wire_encoder_refuses(void)
{
    msg_frame_t f;
    msg_frame_init(&f);
    wire_env_t env = env_make(MSG_PING);
    wire_err_t err;
    float data[12] = {0};
    tensor_t strided = view_2d(data, DT_F32, 3, 2);
    strided.stride[0] = 4; /* rows of a wider matrix: not contiguous */
    const char *names[1] = {"x"};
    CHECK(msg_frame_build(&f, &env, &g_ping, &strided, names, 1, &err) == BT_ERR_INVALID);
    CHECK(strstr(err.reason, "tensor 'x' is not a contiguous") != NULL);
    tensor_t ok = view_2d(data, DT_F32, 3, 2);
    const char *long_name[1] = {"0123456789012345678901234567890123456789012345678901234567890123"};
    CHECK(msg_frame_build(&f, &env, &g_ping, &ok, long_name, 1, &err) == BT_ERR_INVALID);
    tensor_t two[2] = {ok, ok};
    const char *dup[2] = {"a", "a"};
    CHECK(msg_frame_build(&f, &env, &g_ping, two, dup, 2, &err) == BT_ERR_INVALID);
    CHECK(strstr(err.reason, "duplicate tensor name 'a'") != NULL);
    env.type = MSG_TYPE_COUNT;
    CHECK(msg_frame_build(&f, &env, &g_ping, &ok, names, 1, &err) == BT_ERR_INVALID);
    env = env_make(MSG_CKPT_SHARD);
    msg_body_t b;
    bodies_fill(&b, MSG_CKPT_SHARD);
    b.ckpt_shard.ndim = 0;
    CHECK(msg_frame_build(&f, &env, &b, &ok, names, 1, &err) == BT_ERR_INVALID);
    CHECK(f.hdr.size == 0); /* no partial envelope left behind */
    env = env_make(MSG_STOP);
    bodies_fill(&b, MSG_STOP);
    memset(b.stop.why, 'a', sizeof b.stop.why); /* unterminated string */
    CHECK(msg_frame_build(&f, &env, &b, NULL, NULL, 0, &err) == BT_ERR_INVALID);
    msg_frame_fini(&f);
}

/* ---- corpus + mutations --------------------------------------------------- */

/* The checked-in seeds: one valid frame per type (with 0..2 tensors) in the
 * fuzz input format. WIRE_CORPUS_WRITE=DIR rewrites them. */
static size_t seed_make(int i, uint8_t *out, size_t cap)
{
    msg_body_t b;
    msg_type_t t = (msg_type_t)(i % MSG_TYPE_COUNT);
    bodies_fill(&b, t);
    msgpack_sbuffer buf;
    msgpack_sbuffer_init(&buf);
    uint32_t plen = (uint32_t)frame_valid(&buf, t, &b, i / MSG_TYPE_COUNT);
    size_t n = 4 + buf.size;
    if (n > cap) BT_PANIC("seed too big");
    out[0] = (uint8_t)plen; out[1] = (uint8_t)(plen >> 8); out[2] = (uint8_t)(plen >> 16); out[3] = (uint8_t)(plen >> 24);
    memcpy(out + 4, buf.data, buf.size);
    msgpack_sbuffer_destroy(&buf);
    return n;
}
#define NSEEDS (3 * MSG_TYPE_COUNT + NEDGE_SEEDS)

/* Edge seeds: the limits and corners a fuzzer rarely reaches by itself. */
enum { NEDGE_SEEDS = 4 };
static const char *const edge_seed_names[NEDGE_SEEDS] = {"16-tensors", "extreme-values", "huge-dim-empty",
                                                         "extra-keys"};

static void m_extra_keys(msgpack_object *r, msgpack_zone *z);

static size_t seed_edge(int j, uint8_t *out, size_t cap)
{
    static float fdata[64];
    msg_body_t b;
    wire_env_t e = env_make(MSG_ACTIVATION);
    bodies_fill(&b, MSG_ACTIVATION);
    tensor_t ts[WIRE_MAX_TENSORS];
    const char *names[WIRE_MAX_TENSORS];
    static char nbuf[WIRE_MAX_TENSORS][8];
    int nt = 0;
    if (j == 0) {
        static const dtype_t dts[] = {DT_F32, DT_F16, DT_BF16, DT_F64, DT_I32, DT_I64, DT_U8};
        for (nt = 0; nt < WIRE_MAX_TENSORS; nt++) {
            int64_t shape[4] = {1 + nt % 3, 2, nt % 5 == 4 ? 0 : 1, 2};
            memset(&ts[nt], 0, sizeof ts[nt]);
            ts[nt].dtype = dts[nt % 7];
            ts[nt].ndim = 1 + nt % 4;
            int64_t st = 1;
            for (int k = ts[nt].ndim - 1; k >= 0; k--) { ts[nt].shape[k] = shape[k]; ts[nt].stride[k] = st; st *= shape[k]; }
            ts[nt].data = fdata;
            snprintf(nbuf[nt], sizeof nbuf[nt], "t%d", nt);
            names[nt] = nbuf[nt];
        }
    } else if (j == 1) {
        e = env_make(MSG_METRICS);
        bodies_fill(&b, MSG_METRICS);
        e.src = e.dst = 0xffffffffu;
        e.seq = UINT64_MAX;
        e.step = INT64_MAX;
        e.mb = INT32_MAX;
    } else if (j == 2) {
        ts[0] = view_2d(NULL, DT_F32, 1ll << 40, 0);
        names[0] = "empty";
        nt = 1;
    }
    msg_frame_t f;
    msg_frame_init(&f);
    wire_err_t err;
    if (msg_frame_build(&f, &e, &b, ts, names, nt, &err) != BT_OK) BT_PANIC("edge seed %d: %s", j, err.reason);
    size_t plen = f.payload_len, hlen = f.hdr.size;
    const void *hdr = f.hdr.data;
    msgpack_sbuffer extra;
    msgpack_sbuffer_init(&extra);
    msgpack_zone z;
    msgpack_zone_init(&z, 4096);
    if (j == 3) { /* the valid 1-tensor PING plus unknown keys everywhere */
        msgpack_sbuffer base;
        msgpack_sbuffer_init(&base);
        plen = frame_valid(&base, MSG_PING, &g_ping, 1);
        msgpack_object root;
        size_t off = 0;
        if (msgpack_unpack(base.data, base.size, &off, &z, &root) != MSGPACK_UNPACK_SUCCESS) BT_PANIC("unpack");
        m_extra_keys(&root, &z);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &extra, msgpack_sbuffer_write);
        msgpack_pack_object(&pk, root);
        msgpack_sbuffer_destroy(&base);
        hdr = extra.data;
        hlen = extra.size;
    }
    if (4 + hlen > cap) BT_PANIC("seed too big");
    out[0] = (uint8_t)plen; out[1] = (uint8_t)(plen >> 8); out[2] = (uint8_t)(plen >> 16); out[3] = (uint8_t)(plen >> 24);
    memcpy(out + 4, hdr, hlen);
    msgpack_zone_destroy(&z);
    msgpack_sbuffer_destroy(&extra);
    msg_frame_fini(&f);
    return 4 + hlen;
}

typedef struct { uint8_t *data; size_t len; } blob_t;

static int corpus_load(blob_t *out, int cap)
{
    DIR *d = opendir(CORPUS_DIR);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        if (e->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", CORPUS_DIR, e->d_name);
        FILE *f = fopen(path, "rbe");
        if (!f) continue;
        out[n].data = malloc(1 << 16);
        out[n].len = fread(out[n].data, 1, 1 << 16, f);
        fclose(f);
        n++;
    }
    closedir(d);
    return n;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

static void test_wire_corpus_mutations(void)
{
    const char *w = getenv("WIRE_CORPUS_WRITE");
    if (w) {
        mkdir(w, 0755);
        for (int i = 0; i < NSEEDS; i++) {
            uint8_t tmp[4096];
            char path[512];
            size_t n;
            if (i < 3 * MSG_TYPE_COUNT) {
                n = seed_make(i, tmp, sizeof tmp);
                snprintf(path, sizeof path, "%s/seed-%02d-%s-%dt", w, i, msg_type_name((uint32_t)(i % MSG_TYPE_COUNT)),
                         i / MSG_TYPE_COUNT);
            } else {
                int j = i - 3 * MSG_TYPE_COUNT;
                n = seed_edge(j, tmp, sizeof tmp);
                snprintf(path, sizeof path, "%s/seed-%02d-edge-%s", w, i, edge_seed_names[j]);
            }
            FILE *f = fopen(path, "wbe");
            REQUIRE(f && fwrite(tmp, 1, n, f) == n);
            fclose(f);
        }
    }
    blob_t corpus[256];
    int n = corpus_load(corpus, 256);
    REQUIRE(n >= NSEEDS); /* run from the repository root */
    /* every seed is a valid frame */
    for (int i = 0; i < n; i++) {
        REQUIRE(corpus[i].len >= 4);
        uint32_t plen = corpus[i].data[0] | corpus[i].data[1] << 8 | corpus[i].data[2] << 16 |
                        (uint32_t)corpus[i].data[3] << 24;
        wire_env_t env;
        msg_body_t body;
        wire_err_t err;
        CHECK_MSG(msg_decode(corpus[i].data + 4, corpus[i].len - 4, plen, NULL, &env, &body, &err) == BT_OK,
                  "seed %d: %s", i, err.reason);
    }
    /* mutations: flips, byte sets, interesting values, inserts, deletes,
     * truncation, splices; every one goes through the fuzz properties */
    uint64_t s = 0x9e3779b97f4a7c15ull;
    int accepted = 0, total = 20000;
    uint8_t *buf = malloc(1 << 16);
    static const uint8_t interesting[] = {0x00, 0x01, 0x7f, 0x80, 0xc0, 0xc1, 0xcc, 0xcf, 0xd3,
                                          0xdc, 0xdd, 0xde, 0xdf, 0xdb, 0xff, 0x40, 0x3f};
    for (int it = 0; it < total; it++) {
        const blob_t *src = &corpus[rng_next(&s) % (uint64_t)n];
        size_t len = src->len;
        memcpy(buf, src->data, len);
        int nmut = 1 + (int)(rng_next(&s) % 4);
        for (int k = 0; k < nmut && len > 0; k++) {
            size_t pos = rng_next(&s) % len;
            switch (rng_next(&s) % 7) {
            case 0: buf[pos] ^= (uint8_t)(1u << (rng_next(&s) % 8)); break;
            case 1: buf[pos] = (uint8_t)rng_next(&s); break;
            case 2: buf[pos] = interesting[rng_next(&s) % sizeof interesting]; break;
            case 3: if (len < (1 << 16) - 1) { memmove(buf + pos + 1, buf + pos, len - pos); buf[pos] = (uint8_t)rng_next(&s); len++; } break;
            case 4: memmove(buf + pos, buf + pos + 1, len - pos - 1); len--; break;
            case 5: len = pos; break;
            case 6: { /* splice a chunk of another seed */
                const blob_t *o = &corpus[rng_next(&s) % (uint64_t)n];
                size_t from = rng_next(&s) % o->len, cnt = rng_next(&s) % 16;
                if (from + cnt > o->len) cnt = o->len - from;
                if (pos + cnt > len) cnt = len - pos;
                memcpy(buf + pos, o->data + from, cnt);
                break;
            }
            }
        }
        /* exact-size copy so ASan sees any overread */
        uint8_t *exact = malloc(len ? len : 1);
        memcpy(exact, buf, len);
        LLVMFuzzerTestOneInput(exact, len);
        if (len >= 4) {
            uint32_t plen = exact[0] | exact[1] << 8 | exact[2] << 16 | (uint32_t)exact[3] << 24;
            wire_env_t env;
            msg_body_t body;
            wire_err_t err;
            accepted += msg_decode(exact + 4, len - 4, plen, NULL, &env, &body, &err) == BT_OK;
        }
        free(exact);
    }
    /* some mutations keep a frame valid (e.g. a changed value byte); most do not */
    CHECK(accepted > 0 && accepted < total);
    printf("corpus %d seeds, %d mutations, %d accepted\n", n, total, accepted);
    free(buf);
    for (int i = 0; i < n; i++) free(corpus[i].data);
}

/* Cost of encoding and decoding one envelope (reported; the loose bound
 * only catches a pathological regression). */
static void test_wire_cost(void)
{
    enum { N = 4000 };
    msg_frame_t f;
    msg_frame_init(&f);
    wire_env_t env = env_make(MSG_ACTIVATION), denv;
    msg_body_t body, got;
    bodies_fill(&body, MSG_ACTIVATION);
    tensor_t ts[2] = {view_2d(g_x, DT_F32, 3, 2), view_1d(g_ids, DT_I32, 5)};
    const char *names[2] = {"x", "ids"};
    wire_err_t err;
    double enc[2], dec[2];
    for (int nt = 0; nt < 2; nt++) {
        int ntens = nt ? 2 : 0;
        enc[nt] = dec[nt] = 1e12;
        /* best of several rounds: the machine is shared */
        for (int round = 0; round < 7; round++) {
            uint64_t t0 = clock_now_ns();
            for (int i = 0; i < N; i++) {
                env.seq = (uint64_t)i;
                if (msg_frame_build(&f, &env, &body, ts, names, ntens, &err) != BT_OK) BT_PANIC("%s", err.reason);
            }
            uint64_t t1 = clock_now_ns();
            int ok = 0;
            for (int i = 0; i < N; i++)
                ok += msg_decode(f.hdr.data, f.hdr.size, f.payload_len, NULL, &denv, &got, &err) == BT_OK;
            uint64_t t2 = clock_now_ns();
            CHECK(ok == N);
            if ((double)(t1 - t0) / N < enc[nt]) enc[nt] = (double)(t1 - t0) / N;
            if ((double)(t2 - t1) / N < dec[nt]) dec[nt] = (double)(t2 - t1) / N;
        }
        printf("wire cost, ACTIVATION with %d tensors (%zu header bytes): encode %.0f ns, decode %.0f ns (best of 7)\n",
               ntens, f.hdr.size, enc[nt], dec[nt]);
    }
    CHECK(dec[1] < 50000.0 && enc[1] < 50000.0);
    msg_frame_fini(&f);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_wire_addr, test_wire_golden_bytes, test_wire_roundtrip_all_types, test_wire_tensor_device, test_wire_rejects_lies,
             test_wire_unknown_keys_skipped, test_wire_truncated_and_trailing, test_wire_hostile_counts,
             test_wire_limits, test_wire_encoder_refuses, test_wire_corpus_mutations, test_wire_cost);
}
