#include "base/mem.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

bt_status_t base_mem_size_parse(const char *s, double *bytes)
{
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v <= 0) return BT_ERR_INVALID;
    static const char units[] = "KMGT";
    double scale = 1;
    if (*end) {
        const char *u = strchr(units, toupper((unsigned char)*end));
        if (!u) return BT_ERR_INVALID;
        scale = pow(1024.0, (double)(u - units + 1));
        end++;
        if (!strcasecmp(end, "ib")) end += 2;
        else if (!strcasecmp(end, "b")) end += 1;
    }
    if (*end) return BT_ERR_INVALID;
    *bytes = floor(v * scale);
    return BT_OK;
}

void base_mem_size_fmt(double bytes, char *buf, size_t cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    double v = bytes;
    while (v >= 1024 && u < 6) {
        v /= 1024;
        u++;
    }
    if (u == 0) snprintf(buf, cap, "%.0f B", v);
    else snprintf(buf, cap, "%.*f %s", v >= 100 ? 0 : v >= 10 ? 1 : 2, v, units[u]);
}

/* A number from the first line of a file; false when absent or "max". */
static bool file_number(const char *path, double *out)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[64];
    bool ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!ok || !isdigit((unsigned char)line[0])) return false;
    *out = strtod(line, NULL);
    return true;
}

static bool meminfo_available(double *out)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return false;
    char line[128];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            *out = (double)kb * 1024;
            found = true;
        }
    }
    fclose(f);
    return found;
}

bt_status_t base_mem_limit_get(base_mem_limit_t *out, char *err, size_t errlen)
{
    out->bytes = INFINITY;
    snprintf(out->source, sizeof out->source, "no limit found");
    const char *env = getenv("BATON_MEM_LIMIT");
    if (env && *env) {
        if (!strcasecmp(env, "off")) {
            snprintf(out->source, sizeof out->source, "BATON_MEM_LIMIT=off");
            return BT_OK;
        }
        if (base_mem_size_parse(env, &out->bytes) != BT_OK) {
            snprintf(err, errlen, "BATON_MEM_LIMIT=%.40s: expected a size such as 512M or 2G, or off",
                     env);
            return BT_ERR_INVALID;
        }
        snprintf(out->source, sizeof out->source, "BATON_MEM_LIMIT=%.60s", env);
        return BT_OK;
    }
    double avail;
    if (meminfo_available(&avail)) {
        out->bytes = avail;
        snprintf(out->source, sizeof out->source, "MemAvailable in /proc/meminfo");
    }
    /* a cgroup limit (v2, then v1; "max" or an unset v1 limit reads as none) */
    static const char *const limits[][2] = {
        {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"},
    };
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        double lim, used;
        if (!file_number(limits[i][0], &lim) || lim >= 0x1p60) continue;
        if (!file_number(limits[i][1], &used)) used = 0;
        double left = lim > used ? lim - used : 0;
        if (left < out->bytes) {
            out->bytes = left;
            snprintf(out->source, sizeof out->source, "the memory cgroup's limit (%s)", limits[i][0]);
        }
        break;
    }
    return BT_OK;
}

long long base_mem_peak_rss(void)
{
    FILE *f = fopen("/proc/self/status", "re");
    if (!f) return -1;
    char line[256];
    long long kib = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kib = strtoll(line + 6, NULL, 10);
    fclose(f);
    return kib < 0 ? -1 : kib * 1024;
}
