/* Which collective backend a job runs on, and the loader of the nccl one
 * (coll/coll.h: "backend selection", "nccl backend"). */
#include "coll/coll.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const backend_names[] = {
    [COLL_BACKEND_AUTO] = "auto",
    [COLL_BACKEND_HOST] = "host",
    [COLL_BACKEND_NCCL] = "nccl",
};
_Static_assert(sizeof backend_names / sizeof backend_names[0] == COLL_BACKEND_COUNT,
               "one name per collective backend");

const char *coll_backend_name(coll_backend_t b)
{
    return (unsigned)b < COLL_BACKEND_COUNT ? backend_names[b] : "invalid";
}

bt_status_t coll_backend_parse(const char *s, coll_backend_t *out)
{
    for (int b = 0; b < COLL_BACKEND_COUNT; b++)
        if (s && !strcmp(s, backend_names[b])) {
            *out = (coll_backend_t)b;
            return BT_OK;
        }
    return BT_ERR_INVALID;
}

bool coll_nccl_lib_find(char *path, size_t cap, char *why, size_t why_cap)
{
    const char *env = getenv("BATON_NCCL_LIB");
    if (env && *env) {
        if (access(env, R_OK) == 0) {
            snprintf(path, cap, "%s", env);
            return true;
        }
        snprintf(why, why_cap, "BATON_NCCL_LIB=%s: %s", env, strerror(errno));
        return false;
    }
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash = len > 0 ? (exe[len] = 0, strrchr(exe, '/')) : NULL;
    if (slash) {
        *slash = 0;
        const char *const rel[] = {"libbaton_nccl.so", "../libbaton_nccl.so"};
        for (int i = 0; i < 2; i++) {
            snprintf(path, cap, "%s/%s", exe, rel[i]);
            if (access(path, R_OK) == 0) return true;
        }
    }
    snprintf(why, why_cap,
             "no libbaton_nccl.so beside the executable (it is built where nvcc and NCCL are "
             "found; BATON_NCCL_LIB names another)");
    return false;
}

bt_status_t coll_backend_choose(coll_backend_t want, bool all_cuda, coll_backend_t *out,
                                char *why, size_t why_cap)
{
    char path[PATH_MAX + 32], lib_why[512] = "";
    why[0] = 0;
    bool lib = (want == COLL_BACKEND_AUTO && !all_cuda) ||
               coll_nccl_lib_find(path, sizeof path, lib_why, sizeof lib_why);
    switch (want) {
    case COLL_BACKEND_HOST: *out = COLL_BACKEND_HOST; return BT_OK;
    case COLL_BACKEND_NCCL:
        if (!all_cuda) {
            snprintf(why, why_cap, "nccl collectives need every rank's device to be cuda");
            return BT_ERR_UNSUPPORTED;
        }
        if (!lib) {
            snprintf(why, why_cap, "nccl collectives: %s", lib_why);
            return BT_ERR_UNSUPPORTED;
        }
        *out = COLL_BACKEND_NCCL;
        return BT_OK;
    case COLL_BACKEND_AUTO:
        *out = all_cuda && lib ? COLL_BACKEND_NCCL : COLL_BACKEND_HOST;
        if (!all_cuda) snprintf(why, why_cap, "not every rank's device is cuda");
        else if (!lib) snprintf(why, why_cap, "%s", lib_why);
        return BT_OK;
    default: snprintf(why, why_cap, "invalid collective backend %d", (int)want); return BT_ERR_INVALID;
    }
}

/* ---- the nccl library --------------------------------------------------------------- */

static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
static const coll_ops_t *nccl_ops;
static char nccl_why[PATH_MAX + 1024];

static void nccl_load(void)
{
    char path[PATH_MAX + 32];
    if (!coll_nccl_lib_find(path, sizeof path, nccl_why, sizeof nccl_why)) return;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(nccl_why, sizeof nccl_why, "%s", dlerror());
        return;
    }
    const coll_ops_t *ops = dlsym(h, "coll_nccl_backend");
    bool (*probe)(char *, size_t) = (bool (*)(char *, size_t))dlsym(h, "coll_nccl_probe");
    if (!ops || !probe) {
        snprintf(nccl_why, sizeof nccl_why, "%s has no coll_nccl_backend or coll_nccl_probe", path);
        dlclose(h);
        return;
    }
    char pw[512] = "";
    if (!probe(pw, sizeof pw)) {
        snprintf(nccl_why, sizeof nccl_why, "%s: %s", path, pw);
        return; /* not closed: NCCL or cudart may have started threads */
    }
    nccl_ops = ops; /* never closed: communicators outlive any caller */
}

const coll_ops_t *coll_nccl_ops(char *why, size_t why_cap)
{
    pthread_once(&nccl_once, nccl_load);
    if (!nccl_ops) snprintf(why, why_cap, "nccl collectives unavailable: %s", nccl_why);
    return nccl_ops;
}

/* ---- addresses ---------------------------------------------------------------------- */

#define NCCL_ADDR_PREFIX "nccl:"

void coll_nccl_addr_format(char *addr, size_t cap, const uint8_t *id, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t need = sizeof NCCL_ADDR_PREFIX + 2 * n;
    if (cap < need) {
        if (cap) addr[0] = 0;
        return;
    }
    memcpy(addr, NCCL_ADDR_PREFIX, sizeof NCCL_ADDR_PREFIX - 1);
    char *p = addr + sizeof NCCL_ADDR_PREFIX - 1;
    for (size_t i = 0; i < n; i++) {
        *p++ = hex[id[i] >> 4];
        *p++ = hex[id[i] & 15];
    }
    *p = 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

bt_status_t coll_nccl_addr_parse(const char *addr, uint8_t *id, size_t n, char *why,
                                 size_t why_cap)
{
    size_t pl = sizeof NCCL_ADDR_PREFIX - 1;
    if (!addr || strncmp(addr, NCCL_ADDR_PREFIX, pl)) {
        snprintf(why, why_cap, "\"%.40s\" is not an nccl address (no \"nccl:\" prefix)",
                 addr ? addr : "(null)");
        return BT_ERR_INVALID;
    }
    const char *h = addr + pl;
    if (!strcmp(addr, COLL_NCCL_PEER_ADDR)) {
        snprintf(why, why_cap, "rank 0's address is \"%s\", not a unique id", addr);
        return BT_ERR_INVALID;
    }
    size_t len = strlen(h);
    if (len != 2 * n) {
        snprintf(why, why_cap, "nccl unique id of %zu hex digits, want %zu", len, 2 * n);
        return BT_ERR_INVALID;
    }
    for (size_t i = 0; i < n; i++) {
        int a = hexval(h[2 * i]), b = hexval(h[2 * i + 1]);
        if (a < 0 || b < 0) {
            snprintf(why, why_cap, "nccl unique id: no hex digit at offset %zu",
                     2 * i + (a < 0 ? 0 : 1));
            return BT_ERR_INVALID;
        }
        id[i] = (uint8_t)(a << 4 | b);
    }
    return BT_OK;
}
