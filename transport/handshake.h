/* Connection handshake and the per-job secret.
 *
 * Every connection (tcp, ucx) begins with a mutual challenge-response:
 *
 *   client -> server  HELLO  {magic, version, role, job id, self_id, nonce_c}
 *   server -> client  HELLO  {magic, version, role, job id, self_id, nonce_s}
 *   client -> server  PROOF  HMAC-SHA256(secret, "C" | nonce_s | nonce_c | job | ids)
 *   server -> client  PROOF  HMAC-SHA256(secret, "S" | nonce_c | nonce_s | job | ids)
 *
 * Each side proves knowledge of the secret over a fresh nonce chosen by the
 * other side, so a recorded handshake cannot be replayed; the role letter
 * stops a proof from being reflected back. The server proves itself only
 * after the client did, so a client that sees the server's proof knows it
 * was accepted. Both messages have fixed sizes and start with a magic and a
 * version (CONVENTIONS.md: formats); MACs are compared in constant time.
 */
#ifndef BT_TRANSPORT_HANDSHAKE_H
#define BT_TRANSPORT_HANDSHAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define XPORT_HS_VERSION     1u
#define XPORT_HS_NONCE_LEN   32
#define XPORT_HS_MAC_LEN     32
#define XPORT_HS_JOB_MAX     63   /* bytes of job id (without NUL) */
#define XPORT_HS_HELLO_LEN   (4 + 2 + 1 + 1 + 64 + 4 + XPORT_HS_NONCE_LEN)
#define XPORT_HS_PROOF_LEN   (4 + XPORT_HS_MAC_LEN)
#define XPORT_SECRET_LEN     32   /* 256 random bits */
#define XPORT_SECRET_MAX     1024

typedef struct {
    bool     is_server;
    char     job_id[XPORT_HS_JOB_MAX + 1];
    uint8_t  secret[XPORT_SECRET_MAX];
    size_t   secret_len;
    uint32_t self_id;
    uint32_t peer_id;
    uint8_t  nonce[XPORT_HS_NONCE_LEN];      /* ours, fresh per connection */
    uint8_t  peer_nonce[XPORT_HS_NONCE_LEN];
    bool     hello_ok;                       /* peer's hello passed */
} xport_hs_t;

/* Fresh nonce from getrandom(). INVALID when the job id is too long or the
 * secret is empty/too long. */
bt_status_t xport_hs_init(xport_hs_t *hs, bool is_server, const char *job_id,
                          const uint8_t *secret, size_t secret_len, uint32_t self_id);
void xport_hs_hello_write(const xport_hs_t *hs, uint8_t out[XPORT_HS_HELLO_LEN]);
/* Checks magic, version, role and job id; on failure writes the reason to
 * why and returns BT_ERR_PEER_AUTH (job id/role) or BT_ERR_PEER_PROTO
 * (magic/version/garbage). */
bt_status_t xport_hs_hello_read(xport_hs_t *hs, const uint8_t in[XPORT_HS_HELLO_LEN],
                                char *why, size_t why_cap);
/* Our proof; only after the peer's hello was read. */
void xport_hs_proof_write(const xport_hs_t *hs, uint8_t out[XPORT_HS_PROOF_LEN]);
/* BT_OK when the peer's proof matches; BT_ERR_PEER_AUTH otherwise. */
bt_status_t xport_hs_proof_check(const xport_hs_t *hs, const uint8_t in[XPORT_HS_PROOF_LEN],
                                 char *why, size_t why_cap);
/* A MAC binding bytes sent along with a hello to it: HMAC-SHA256(secret,
 * "A" | hello | data). The ucx transport sends its worker address so with
 * its hello, and the server checks the MAC before it hands the address to
 * UCX: only a holder of the secret can make the server connect somewhere.
 * It proves who made the hello, not that it is fresh (a recorded hello
 * replays); the nonce exchange that follows still refuses a replayer. */
bt_status_t xport_hs_hello_mac_write(const xport_hs_t *hs, const uint8_t hello[XPORT_HS_HELLO_LEN],
                                     const void *data, size_t len, uint8_t out[XPORT_HS_MAC_LEN]);
/* BT_OK when mac matches; BT_ERR_PEER_AUTH (reason in why) otherwise,
 * BT_ERR_NOMEM. */
bt_status_t xport_hs_hello_mac_check(const xport_hs_t *hs, const uint8_t hello[XPORT_HS_HELLO_LEN],
                                     const void *data, size_t len, const uint8_t mac[XPORT_HS_MAC_LEN],
                                     char *why, size_t why_cap);
/* Wipes the secret copy. */
void xport_hs_clear(xport_hs_t *hs);

/* Per-job secret. Never passed on a command line: processes of one job find
 * it through the file named by $BATON_SECRET_FILE.
 *
 * xport_secret_load: read $BATON_SECRET_FILE (NOT_FOUND when the variable is
 * unset; IO/INVALID when the file is unreadable, empty, too long, or readable
 * by group/others). */
bt_status_t xport_secret_load(uint8_t *out, size_t cap, size_t *len);
/* Generate XPORT_SECRET_LEN random bytes with getrandom() and write them to
 * path (created 0600, must not exist). */
bt_status_t xport_secret_create(const char *path, uint8_t out[XPORT_SECRET_LEN]);
/* Load from $BATON_SECRET_FILE when set; otherwise create at fallback_path
 * and set $BATON_SECRET_FILE to it so that child processes inherit it. */
bt_status_t xport_secret_get(const char *fallback_path, uint8_t *out, size_t cap, size_t *len);

#endif
