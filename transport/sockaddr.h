/* "host:port" <-> struct sockaddr for the tcp and ucx transports.
 * Numeric addresses only ("127.0.0.1:5000", "[::1]:5000", "localhost:5000"
 * which means 127.0.0.1): resolving a name could block the loop. */
#ifndef BT_TRANSPORT_SOCKADDR_H
#define BT_TRANSPORT_SOCKADDR_H

#include <stddef.h>
#include <sys/socket.h>

#include "base/status.h"

/* NULL or "" -> 127.0.0.1:0. BT_ERR_INVALID (logged) when malformed. */
bt_status_t xport_sockaddr_parse(const char *text, struct sockaddr_storage *ss, socklen_t *len);
/* "a.b.c.d:port" or "[v6]:port" */
void xport_sockaddr_format(const struct sockaddr *sa, char *out, size_t cap);

#endif
