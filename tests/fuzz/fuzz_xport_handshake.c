/* libFuzzer: handshake messages from a hostile peer. The input is split into
 * a hello and a proof; reading them must never crash, and a proof that the
 * fuzzer made up must never be accepted (it would need the secret).
 *
 *   make fuzz && build/fuzz/fuzz_xport_handshake -max_len=256 CORPUS tests/fuzz/corpus_xport_handshake
 * (a hello and a proof are 144 bytes; seeds: tests/fuzz/gen_seeds.py; make
 * fuzz-run runs the recorded campaign; docs/WIRE.md) */
#include "transport/handshake.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t secret[32] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    uint8_t hello[XPORT_HS_HELLO_LEN] = {0}, proof[XPORT_HS_PROOF_LEN] = {0};
    memcpy(hello, data, size < sizeof hello ? size : sizeof hello);
    if (size > sizeof hello) {
        size_t rest = size - sizeof hello;
        memcpy(proof, data + sizeof hello, rest < sizeof proof ? rest : sizeof proof);
    }
    for (int server = 0; server < 2; server++) {
        xport_hs_t hs;
        char why[160];
        if (xport_hs_init(&hs, server, "fuzz-job", secret, sizeof secret, 0) != BT_OK) abort();
        if (xport_hs_hello_read(&hs, hello, why, sizeof why) != BT_OK) continue;
        if (xport_hs_proof_check(&hs, proof, why, sizeof why) == BT_OK) abort();
        xport_hs_clear(&hs);
    }
    return 0;
}
