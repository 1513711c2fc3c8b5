/* Handshake messages (see handshake.h) and the per-job secret file. */
#include "transport/handshake.h"

#include "base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define HS_HELLO_MAGIC 0x4c454842u /* "BHEL" little-endian */
#define HS_PROOF_MAGIC 0x4f525042u /* "BPRO" */
#define HS_ROLE_CLIENT 'C'
#define HS_ROLE_SERVER 'S'

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static bt_status_t random_fill(uint8_t *out, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(out + got, n - got, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            log_error("getrandom: %s", strerror(errno));
            return BT_ERR_IO;
        }
        got += (size_t)r;
    }
    return BT_OK;
}

bt_status_t xport_hs_init(xport_hs_t *hs, bool is_server, const char *job_id,
                          const uint8_t *secret, size_t secret_len, uint32_t self_id)
{
    memset(hs, 0, sizeof *hs);
    if (!job_id || strlen(job_id) > XPORT_HS_JOB_MAX) {
        log_error("handshake: job id missing or longer than %d bytes", XPORT_HS_JOB_MAX);
        return BT_ERR_INVALID;
    }
    if (!secret || secret_len == 0 || secret_len > XPORT_SECRET_MAX) {
        log_error("handshake: secret missing or longer than %d bytes", XPORT_SECRET_MAX);
        return BT_ERR_INVALID;
    }
    hs->is_server = is_server;
    memcpy(hs->job_id, job_id, strlen(job_id) + 1);
    memcpy(hs->secret, secret, secret_len);
    hs->secret_len = secret_len;
    hs->self_id = self_id;
    hs->peer_id = UINT32_MAX;
    return random_fill(hs->nonce, sizeof hs->nonce);
}

void xport_hs_clear(xport_hs_t *hs)
{
    OPENSSL_cleanse(hs->secret, sizeof hs->secret);
}

/* HELLO layout: magic u32 | version u16 | role u8 | job_len u8 | job[64] |
 * self_id u32 | nonce[32], integers little-endian. */
void xport_hs_hello_write(const xport_hs_t *hs, uint8_t out[XPORT_HS_HELLO_LEN])
{
    memset(out, 0, XPORT_HS_HELLO_LEN);
    size_t job_len = strlen(hs->job_id);
    put_u32(out, HS_HELLO_MAGIC);
    out[4] = (uint8_t)XPORT_HS_VERSION;
    out[5] = (uint8_t)(XPORT_HS_VERSION >> 8);
    out[6] = hs->is_server ? HS_ROLE_SERVER : HS_ROLE_CLIENT;
    out[7] = (uint8_t)job_len;
    memcpy(out + 8, hs->job_id, job_len);
    put_u32(out + 72, hs->self_id);
    memcpy(out + 76, hs->nonce, XPORT_HS_NONCE_LEN);
}

bt_status_t xport_hs_hello_read(xport_hs_t *hs, const uint8_t in[XPORT_HS_HELLO_LEN],
                                char *why, size_t why_cap)
{
    if (get_u32(in) != HS_HELLO_MAGIC) {
        snprintf(why, why_cap, "bad handshake magic 0x%08x", get_u32(in));
        return BT_ERR_PEER_PROTO;
    }
    unsigned version = (unsigned)in[4] | (unsigned)in[5] << 8;
    if (version != XPORT_HS_VERSION) {
        snprintf(why, why_cap, "handshake version %u, expected %u", version, XPORT_HS_VERSION);
        return BT_ERR_PEER_PROTO;
    }
    uint8_t want_role = hs->is_server ? HS_ROLE_CLIENT : HS_ROLE_SERVER;
    if (in[6] != want_role) {
        snprintf(why, why_cap, "handshake role '%c', expected '%c'", in[6] >= 32 && in[6] < 127 ? in[6] : '?', want_role);
        return BT_ERR_PEER_AUTH;
    }
    size_t job_len = in[7];
    if (job_len > XPORT_HS_JOB_MAX || job_len != strlen(hs->job_id)
        || memcmp(in + 8, hs->job_id, job_len) != 0) {
        char peer_job[XPORT_HS_JOB_MAX + 1];
        size_t n = job_len > XPORT_HS_JOB_MAX ? XPORT_HS_JOB_MAX : job_len;
        for (size_t i = 0; i < n; i++) peer_job[i] = in[8 + i] >= 32 && in[8 + i] < 127 ? (char)in[8 + i] : '?';
        peer_job[n] = '\0';
        snprintf(why, why_cap, "job id '%s' does not match ours '%s'", peer_job, hs->job_id);
        return BT_ERR_PEER_AUTH;
    }
    hs->peer_id = get_u32(in + 72);
    memcpy(hs->peer_nonce, in + 76, XPORT_HS_NONCE_LEN);
    hs->hello_ok = true;
    return BT_OK;
}

/* MAC over: role of the prover | nonce of the verifier | nonce of the prover
 * | job id | prover id | verifier id. */
static void hs_mac(const xport_hs_t *hs, bool prover_is_server, const uint8_t *verifier_nonce,
                   const uint8_t *prover_nonce, uint32_t prover_id, uint32_t verifier_id,
                   uint8_t mac[XPORT_HS_MAC_LEN])
{
    uint8_t msg[1 + 2 * XPORT_HS_NONCE_LEN + XPORT_HS_JOB_MAX + 8];
    size_t n = 0, job_len = strlen(hs->job_id);
    msg[n++] = prover_is_server ? HS_ROLE_SERVER : HS_ROLE_CLIENT;
    memcpy(msg + n, verifier_nonce, XPORT_HS_NONCE_LEN); n += XPORT_HS_NONCE_LEN;
    memcpy(msg + n, prover_nonce, XPORT_HS_NONCE_LEN); n += XPORT_HS_NONCE_LEN;
    memcpy(msg + n, hs->job_id, job_len); n += job_len;
    put_u32(msg + n, prover_id); n += 4;
    put_u32(msg + n, verifier_id); n += 4;
    unsigned mac_len = XPORT_HS_MAC_LEN;
    if (!HMAC(EVP_sha256(), hs->secret, (int)hs->secret_len, msg, n, mac, &mac_len))
        BT_PANIC("HMAC-SHA256 failed");
}

void xport_hs_proof_write(const xport_hs_t *hs, uint8_t out[XPORT_HS_PROOF_LEN])
{
    if (!hs->hello_ok) BT_PANIC("handshake proof before the peer's hello");
    put_u32(out, HS_PROOF_MAGIC);
    hs_mac(hs, hs->is_server, hs->peer_nonce, hs->nonce, hs->self_id, hs->peer_id, out + 4);
}

bt_status_t xport_hs_proof_check(const xport_hs_t *hs, const uint8_t in[XPORT_HS_PROOF_LEN],
                                 char *why, size_t why_cap)
{
    if (get_u32(in) != HS_PROOF_MAGIC) {
        snprintf(why, why_cap, "bad handshake proof magic 0x%08x", get_u32(in));
        return BT_ERR_PEER_AUTH;
    }
    uint8_t want[XPORT_HS_MAC_LEN];
    hs_mac(hs, !hs->is_server, hs->nonce, hs->peer_nonce, hs->peer_id, hs->self_id, want);
    int diff = CRYPTO_memcmp(want, in + 4, XPORT_HS_MAC_LEN);
    OPENSSL_cleanse(want, sizeof want);
    if (diff != 0) {
        snprintf(why, why_cap, "handshake HMAC mismatch (wrong secret?)");
        return BT_ERR_PEER_AUTH;
    }
    return BT_OK;
}

#define HS_ROLE_ATTACHED 'A' /* domain of the hello MAC: never a proof's 'C' or 'S' */

bt_status_t xport_hs_hello_mac_write(const xport_hs_t *hs, const uint8_t hello[XPORT_HS_HELLO_LEN],
                                     const void *data, size_t len, uint8_t out[XPORT_HS_MAC_LEN])
{
    size_t n = 1 + XPORT_HS_HELLO_LEN + len;
    uint8_t *msg = malloc(n);
    if (!msg) return BT_ERR_NOMEM;
    msg[0] = HS_ROLE_ATTACHED;
    memcpy(msg + 1, hello, XPORT_HS_HELLO_LEN);
    if (len) memcpy(msg + 1 + XPORT_HS_HELLO_LEN, data, len);
    unsigned mac_len = XPORT_HS_MAC_LEN;
    if (!HMAC(EVP_sha256(), hs->secret, (int)hs->secret_len, msg, n, out, &mac_len))
        BT_PANIC("HMAC-SHA256 failed");
    free(msg);
    return BT_OK;
}

bt_status_t xport_hs_hello_mac_check(const xport_hs_t *hs, const uint8_t hello[XPORT_HS_HELLO_LEN],
                                     const void *data, size_t len, const uint8_t mac[XPORT_HS_MAC_LEN],
                                     char *why, size_t why_cap)
{
    uint8_t want[XPORT_HS_MAC_LEN];
    if (xport_hs_hello_mac_write(hs, hello, data, len, want) != BT_OK) {
        snprintf(why, why_cap, "out of memory for the hello MAC");
        return BT_ERR_NOMEM;
    }
    int diff = CRYPTO_memcmp(want, mac, XPORT_HS_MAC_LEN);
    OPENSSL_cleanse(want, sizeof want);
    if (diff != 0) {
        snprintf(why, why_cap, "hello MAC mismatch (wrong secret, or the hello was altered)");
        return BT_ERR_PEER_AUTH;
    }
    return BT_OK;
}

bt_status_t xport_secret_load(uint8_t *out, size_t cap, size_t *len)
{
    const char *path = getenv("BATON_SECRET_FILE");
    if (!path || !*path) return BT_ERR_NOT_FOUND;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        log_error("secret file %s: %s", path, strerror(errno));
        return BT_ERR_IO;
    }
    bt_status_t st = BT_OK;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        log_error("secret file %s: not a regular file", path);
        st = BT_ERR_INVALID;
        goto close_fd;
    }
    if (sb.st_mode & (S_IRWXG | S_IRWXO)) {
        log_error("secret file %s: mode %03o lets others read it; chmod 600 it",
                  path, (unsigned)(sb.st_mode & 0777));
        st = BT_ERR_INVALID;
        goto close_fd;
    }
    if (sb.st_size <= 0 || (size_t)sb.st_size > cap || (size_t)sb.st_size > XPORT_SECRET_MAX) {
        log_error("secret file %s: size %lld, expected 1..%zu bytes", path,
                  (long long)sb.st_size, cap < XPORT_SECRET_MAX ? cap : (size_t)XPORT_SECRET_MAX);
        st = BT_ERR_INVALID;
        goto close_fd;
    }
    size_t got = 0, want = (size_t)sb.st_size;
    while (got < want) {
        ssize_t r = read(fd, out + got, want - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            log_error("secret file %s: short read", path);
            st = BT_ERR_IO;
            goto close_fd;
        }
        got += (size_t)r;
    }
    *len = got;
close_fd:
    close(fd);
    return st;
}

bt_status_t xport_secret_create(const char *path, uint8_t out[XPORT_SECRET_LEN])
{
    uint8_t key[XPORT_SECRET_LEN];
    bt_status_t st = random_fill(key, sizeof key);
    if (st != BT_OK) return st;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        log_error("secret file %s: cannot create: %s", path, strerror(errno));
        st = BT_ERR_IO;
        goto wipe_key;
    }
    size_t put = 0;
    while (put < sizeof key) {
        ssize_t w = write(fd, key + put, sizeof key - put);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            log_error("secret file %s: write: %s", path, strerror(errno));
            st = BT_ERR_IO;
            break;
        }
        put += (size_t)w;
    }
    if (close(fd) != 0 && st == BT_OK) {
        log_error("secret file %s: close: %s", path, strerror(errno));
        st = BT_ERR_IO;
    }
    if (st != BT_OK) {
        unlink(path);
        goto wipe_key;
    }
    memcpy(out, key, sizeof key);
wipe_key:
    OPENSSL_cleanse(key, sizeof key);
    return st;
}

bt_status_t xport_secret_get(const char *fallback_path, uint8_t *out, size_t cap, size_t *len)
{
    bt_status_t st = xport_secret_load(out, cap, len);
    if (st != BT_ERR_NOT_FOUND) return st;
    if (!fallback_path || cap < XPORT_SECRET_LEN) return BT_ERR_INVALID;
    st = xport_secret_create(fallback_path, out);
    if (st != BT_OK) return st;
    if (setenv("BATON_SECRET_FILE", fallback_path, 1) != 0) {
        log_error("setenv BATON_SECRET_FILE: %s", strerror(errno));
        return BT_ERR_IO;
    }
    *len = XPORT_SECRET_LEN;
    return BT_OK;
}
