/* libFuzzer target for the wire decoder (make fuzz -> build/fuzz/fuzz_wire).
 *
 * Every input is used twice:
 *  1. as a frame [u32 LE payload_len][header]: msg_decode must return OK or
 *     PEER_PROTO with a reason (never crash, leak or read out of bounds); an
 *     accepted frame must satisfy the layout invariants and re-encode to a
 *     frame that decodes to the same envelope and body;
 *  2. as the seed of a valid message x: decode(encode(x)) == x, tensor bytes
 *     included.
 *  3. differential: on the frame of 1, the fast decoder agrees with the
 *     general one or defers, and msg_decode answers as the general one does
 *     (wire_gen_diff_check); the frames of 2 must be accepted by the fast
 *     path (they are what the encoder writes).
 * Seed corpus: tests/fuzz/corpus_wire/. Run: see docs/WIRE.md.
 */
#include <stdio.h>
#include <stdlib.h>

#include "tests/fuzz/wire_gen.h"

static void fuzz_fail(const char *what)
{
    fprintf(stderr, "fuzz_wire: property violated: %s\n", what);
    abort();
}

static void fuzz_decode_bytes(const uint8_t *data, size_t size)
{
    if (size < 4) return;
    uint32_t payload_len = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 |
                           (uint32_t)data[3] << 24;
    const char *diff = wire_gen_diff_check(data + 4, size - 4, payload_len, NULL, NULL);
    if (diff) fuzz_fail(diff);
    wire_env_t env;
    msg_body_t body;
    wire_err_t err;
    bt_status_t st = msg_decode(data + 4, size - 4, payload_len, NULL, &env, &body, &err);
    if (st != BT_OK) {
        if (st != BT_ERR_PEER_PROTO && st != BT_ERR_NOMEM) fuzz_fail("unexpected status");
        if (st == BT_ERR_PEER_PROTO && err.reason[0] == '\0') fuzz_fail("rejection without a reason");
        return;
    }
    const char *bad = wire_gen_check_decoded(&env, payload_len);
    if (bad) fuzz_fail(bad);
    /* re-encode what was accepted; it must decode to the same thing */
    msgpack_sbuffer buf;
    msgpack_sbuffer_init(&buf);
    if (msg_encode(&buf, &env, &body, &err) != BT_OK) fuzz_fail(err.reason);
    wire_env_t env2;
    msg_body_t body2;
    if (msg_decode(buf.data, buf.size, payload_len, NULL, &env2, &body2, &err) != BT_OK) fuzz_fail(err.reason);
    if (!wire_gen_env_equal(&env, &env2)) fuzz_fail("re-encoded envelope differs");
    if (!msg_body_equal(env.type, &body, &body2)) fuzz_fail("re-encoded body differs");
    msgpack_sbuffer_destroy(&buf);
}

static void fuzz_round_trip(const uint8_t *data, size_t size)
{
    static uint8_t tdata[4096], payload[4096 + 4 * WIRE_ALIGN];
    wire_env_t env;
    msg_body_t body;
    tensor_t ts[4];
    const char *names[4];
    char name_buf[4][WIRE_NAME_MAX];
    int nt;
    wire_gen_message(data, size, &env, &body, ts, names, name_buf, &nt, tdata, sizeof tdata);
    msg_frame_t f;
    msg_frame_init(&f);
    wire_err_t err;
    if (msg_frame_build(&f, &env, &body, ts, names, nt, &err) != BT_OK) fuzz_fail(err.reason);
    size_t plen = wire_gen_gather(f.iov, f.iovcnt, payload);
    if (plen != f.payload_len) fuzz_fail("iovec length != payload_len");
    wire_env_t env2;
    msg_body_t body2;
    if (msg_decode(f.hdr.data, f.hdr.size, plen, NULL, &env2, &body2, &err) != BT_OK) fuzz_fail(err.reason);
    bool fast_ok = false;
    const char *diff = wire_gen_diff_check(f.hdr.data, f.hdr.size, plen, NULL, &fast_ok);
    if (diff) fuzz_fail(diff);
    if (!fast_ok) fuzz_fail("round trip: the fast path deferred on an encoder-written frame");
    if (!wire_gen_env_equal(&f.env, &env2)) fuzz_fail("round trip: envelope differs");
    if (!msg_body_equal(env.type, &body, &body2)) fuzz_fail("round trip: body differs");
    for (int i = 0; i < nt; i++) {
        tensor_t v;
        if (wire_tensor_find(&env2, names[i], payload, &v) != BT_OK) fuzz_fail("round trip: tensor missing");
        if (env2.tensors[i].nbytes && memcmp(v.data, ts[i].data, env2.tensors[i].nbytes))
            fuzz_fail("round trip: tensor bytes differ");
    }
    msg_frame_fini(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_decode_bytes(data, size);
    fuzz_round_trip(data, size);
    return 0;
}
