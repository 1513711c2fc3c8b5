#include "transport/sockaddr.h"

#include "base/log.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bt_status_t xport_sockaddr_parse(const char *text, struct sockaddr_storage *ss, socklen_t *len)
{
    char host[64];
    const char *port_text;
    if (!text || !*text) text = "127.0.0.1:0";
    memset(ss, 0, sizeof *ss);
    if (text[0] == '[') {
        const char *end = strchr(text, ']');
        if (!end || end[1] != ':' || (size_t)(end - text - 1) >= sizeof host) goto bad;
        memcpy(host, text + 1, (size_t)(end - text - 1));
        host[end - text - 1] = '\0';
        port_text = end + 2;
    } else {
        const char *colon = strrchr(text, ':');
        if (!colon || (size_t)(colon - text) >= sizeof host) goto bad;
        memcpy(host, text, (size_t)(colon - text));
        host[colon - text] = '\0';
        port_text = colon + 1;
    }
    char *end_port;
    long port = strtol(port_text, &end_port, 10);
    if (!*port_text || *end_port || port < 0 || port > 65535) goto bad;
    if (!strcmp(host, "localhost") || !host[0]) snprintf(host, sizeof host, "127.0.0.1");

    struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        *len = sizeof *v4;
        return BT_OK;
    }
    if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        *len = sizeof *v6;
        return BT_OK;
    }
bad:
    log_error("bad address '%s': expected numeric host:port or [v6]:port", text);
    return BT_ERR_INVALID;
}

void xport_sockaddr_format(const struct sockaddr *sa, char *out, size_t cap)
{
    char host[INET6_ADDRSTRLEN];
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *v4 = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
        snprintf(out, cap, "%s:%u", host, ntohs(v4->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
        snprintf(out, cap, "[%s]:%u", host, ntohs(v6->sin6_port));
    } else {
        snprintf(out, cap, "?family%d", sa->sa_family);
    }
}
