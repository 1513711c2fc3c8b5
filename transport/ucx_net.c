/* Where a ucx xport may open network resources: its listen host decides
 * (see xport_ucx_net_select in xport.h). Built with or without UCX: it only
 * reads the host's interfaces and sysfs, so tests can check the choice. */
#include "transport/xport.h"

#include "base/log.h"
#include "transport/sockaddr.h"

#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Append ",item" (or "item" to an empty list); false when it does not fit. */
static bool list_add(char *list, size_t cap, const char *item)
{
    size_t n = strlen(list);
    int w = snprintf(list + n, cap - n, "%s%s", n ? "," : "", item);
    return w >= 0 && (size_t)w < cap - n;
}

static bool sa_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a)) return true;
        return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
    }
    return false;
}

static bool sa_any(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return ((const struct sockaddr_in *)sa)->sin_addr.s_addr == htonl(INADDR_ANY);
    if (sa->sa_family == AF_INET6)
        return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)sa)->sin6_addr);
    return false;
}

static bool sa_same_host(const struct sockaddr *a, const struct sockaddr *b)
{
    if (a->sa_family != b->sa_family) return false;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->sa_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                       sizeof(struct in6_addr));
    return false;
}

static int ucx_net_visible(const struct dirent *e) { return e->d_name[0] != '.'; }

bt_status_t xport_ucx_rdma_ports(const char *ifname, const char *sys_root, char *out, size_t cap)
{
    char path[512];
    const char *root = sys_root ? sys_root : "/sys";
    snprintf(path, sizeof path, "%s/class/infiniband", root);
    struct dirent **devs;
    int n_devs = scandir(path, &devs, ucx_net_visible, alphasort); /* sorted: the same list every time */
    if (n_devs < 0) return BT_OK; /* no RDMA device on this host */
    bt_status_t st = BT_OK;
    for (int d = 0; d < n_devs; d++) {
        struct stat sb;
        /* the RDMA device drives this interface (RoCE: the Ethernet port;
         * InfiniBand: its IPoIB interface) */
        snprintf(path, sizeof path, "%s/class/infiniband/%s/device/net/%s", root, devs[d]->d_name, ifname);
        if (st != BT_OK || stat(path, &sb) != 0) continue;
        snprintf(path, sizeof path, "%s/class/infiniband/%s/ports", root, devs[d]->d_name);
        struct dirent **ports;
        int n_ports = scandir(path, &ports, ucx_net_visible, alphasort);
        for (int p = 0; p < n_ports; p++) {
            char item[2 * NAME_MAX + 2];
            snprintf(item, sizeof item, "%s:%s", devs[d]->d_name, ports[p]->d_name);
            if (st == BT_OK && !list_add(out, cap, item)) {
                log_error("ucx: the RDMA ports of %s do not fit in %zu bytes", ifname, cap);
                st = BT_ERR_INVALID;
            }
            free(ports[p]);
        }
        if (n_ports >= 0) free(ports);
    }
    for (int d = 0; d < n_devs; d++) free(devs[d]);
    free(devs);
    return st;
}

bt_status_t xport_ucx_net_select(const char *listen_addr, const char *sys_root, char *tls, size_t tls_cap,
                                 char *devs, size_t devs_cap)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    bt_status_t st = xport_sockaddr_parse(listen_addr, &ss, &sl);
    if (st != BT_OK) return st;
    tls[0] = devs[0] = '\0';
    const struct sockaddr *sa = (const struct sockaddr *)&ss;
    if (sa_loopback(sa)) {
        /* Processes of one host: shared memory, and self for an xport that
         * connects to itself. No network transport, so no socket at all. */
        snprintf(tls, tls_cap, "sm,self");
        snprintf(devs, devs_cap, "lo");
        return BT_OK;
    }
    /* Never UCX's own tcp transport: a connection to its port from a peer
     * host's address, carrying 16 zero bytes, stalls that peer's real
     * connections (measured with UCX 1.13.1; from another address it is
     * dropped). Between hosts without RDMA, baton's tcp transport is the
     * one to use (auto falls back to it). */
    snprintf(tls, tls_cap, "^tcp");
    if (sa_any(sa)) return BT_OK; /* every interface */
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0) {
        log_error("ucx: cannot list this host's interfaces: %m");
        return BT_ERR_IO;
    }
    const char *name = NULL;
    for (struct ifaddrs *i = ifs; i && !name; i = i->ifa_next)
        if (i->ifa_addr && sa_same_host(i->ifa_addr, sa)) name = i->ifa_name;
    if (!name) {
        log_error("ucx: listen address %s is not an address of this host", listen_addr);
        freeifaddrs(ifs);
        return BT_ERR_INVALID;
    }
    if (!list_add(devs, devs_cap, name)) st = BT_ERR_INVALID;
    else st = xport_ucx_rdma_ports(name, sys_root, devs, devs_cap);
    freeifaddrs(ifs);
    return st;
}
