/* One status type for the whole project (CONVENTIONS.md: status and errors).
 *
 *   BT_OK            success
 *   BT_IN_PROGRESS   the operation was started; a completion callback follows
 *   < 0              errors; peer/link failures live in their own range
 *                    [-199, -100] so that supervision can tell a dead peer
 *                    apart from a local bug or bad input.
 */
#ifndef BT_BASE_STATUS_H
#define BT_BASE_STATUS_H

typedef enum {
    BT_OK          = 0,
    BT_IN_PROGRESS = 1,

    /* local errors */
    BT_ERR_NOMEM       = -1,
    BT_ERR_INVALID     = -2,  /* bad argument or bad input (file, frame, job) */
    BT_ERR_IO          = -3,  /* file-system or OS call failed */
    BT_ERR_UNSUPPORTED = -4,  /* valid input we do not handle (arch, dtype...) */
    BT_ERR_NOT_FOUND   = -5,
    BT_ERR_BUSY        = -6,  /* no credit / resource temporarily exhausted */
    BT_ERR_TIMEOUT     = -7,
    BT_ERR_CANCELED    = -8,
    BT_ERR_CORRUPT     = -9,  /* checksum / format mismatch in stored data */
    BT_ERR_NUMERIC     = -10, /* NaN/Inf detected */
    BT_ERR_DEVICE      = -11, /* a device or its library failed (CUDA, cuBLASLt, NCCL) */

    /* peer and link failures: [-199, -100] */
    BT_ERR_PEER_FIRST  = -100,
    BT_ERR_PEER_CLOSED = -100, /* the peer closed or died */
    BT_ERR_PEER_PROTO  = -101, /* the peer sent a malformed frame */
    BT_ERR_PEER_AUTH   = -102, /* handshake failed (job id or HMAC) */
    BT_ERR_PEER_UNREACH= -103, /* could not connect */
    BT_ERR_PEER_TIMEOUT= -104, /* heartbeat or transfer deadline missed */
    BT_ERR_PEER_LAST   = -199,
} bt_status_t;

static inline int bt_status_is_peer(bt_status_t s)
{
    return s <= BT_ERR_PEER_FIRST && s >= BT_ERR_PEER_LAST;
}

/* Short constant name, e.g. "PEER_CLOSED". Never NULL. */
const char *bt_status_str(bt_status_t s);

#endif
