#include "ckpt/store.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "base/save.h"

#define STEP_PREFIX "step-"
#define TMP_SUFFIX  ".tmp"

static bt_status_t errf(char *err, size_t cap, bt_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bt_status_t errf(char *err, size_t cap, bt_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return st;
}

void ckpt_step_name(int64_t step, char *buf, size_t cap)
{
    snprintf(buf, cap, STEP_PREFIX "%08lld", (long long)step);
}

void ckpt_step_dir(const char *root, int64_t step, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/" STEP_PREFIX "%08lld", root, (long long)step);
}

void ckpt_step_tmp(const char *root, int64_t step, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/." STEP_PREFIX "%08lld" TMP_SUFFIX, root, (long long)step);
}

/* "step-N" (committed) or ".step-N.tmp" (tmp): its step, else -1. */
static int64_t step_of(const char *name, bool tmp)
{
    if (tmp) {
        if (name[0] != '.') return -1;
        name++;
    }
    size_t pl = strlen(STEP_PREFIX), n = strlen(name);
    if (strncmp(name, STEP_PREFIX, pl)) return -1;
    size_t end = n;
    if (tmp) {
        size_t sl = strlen(TMP_SUFFIX);
        if (n < pl + sl || strcmp(name + n - sl, TMP_SUFFIX)) return -1;
        end = n - sl;
    }
    if (end == pl || end - pl > 18) return -1;
    int64_t v = 0;
    for (size_t i = pl; i < end; i++) {
        if (name[i] < '0' || name[i] > '9') return -1;
        v = v * 10 + (name[i] - '0');
    }
    return v;
}

bt_status_t ckpt_stage_begin(const char *root, int64_t step, char *err, size_t errlen)
{
    bt_status_t st = base_dir_make(root, err, errlen);
    if (st) return st;
    char tmp[CKPT_PATH_MAX];
    ckpt_step_tmp(root, step, tmp, sizeof tmp);
    base_save_step("create directory", tmp);
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return errf(err, errlen, BT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    return BT_OK;
}

static bool listed(const ckpt_index_t *idx, const char *name)
{
    if (!strcmp(name, CKPT_INDEX_FILE)) return true;
    for (int i = 0; i < idx->n_files; i++)
        if (!strcmp(idx->files[i].name, name)) return true;
    return false;
}

/* Removes a step directory (flat: files only). */
static void dir_remove(const char *dir)
{
    base_save_step("remove directory", dir);
    int e = base_dir_clear(dir);
    if (e && e != ENOENT) log_warn("checkpoint: cannot remove %s: %s", dir, strerror(e));
}

/* Files of the temporary directory that the index does not list: left by
 * a save of the same step that died (another world size). */
static void tmp_prune(const char *tmp, const ckpt_index_t *idx)
{
    DIR *d = opendir(tmp);
    if (!d) return;
    struct dirent *e;
    char path[CKPT_PATH_MAX + 512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || listed(idx, e->d_name)) continue;
        snprintf(path, sizeof path, "%s/%s", tmp, e->d_name);
        base_save_step("remove unlisted", path);
        if (unlink(path) != 0) log_warn("checkpoint: cannot remove %s: %s", path, strerror(errno));
    }
    closedir(d);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Every committed step of root (ascending) into a malloc'd array. */
static int steps_all(const char *root, int64_t **out)
{
    *out = NULL;
    DIR *d = opendir(root);
    if (!d) return 0;
    int n = 0, cap = 0;
    int64_t *v = NULL;
    struct dirent *e;
    char path[CKPT_PATH_MAX + 512];
    while ((e = readdir(d))) {
        int64_t s = step_of(e->d_name, false);
        if (s < 0) continue;
        snprintf(path, sizeof path, "%s/%s/" CKPT_INDEX_FILE, root, e->d_name);
        if (access(path, F_OK) != 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) break;
            v = nv;
        }
        v[n++] = s;
    }
    closedir(d);
    if (n) qsort(v, (size_t)n, sizeof *v, cmp_i64);
    *out = v;
    return n;
}

int ckpt_list_steps(const char *root, int64_t *steps, int max)
{
    int64_t *all;
    int n = steps_all(root, &all);
    int k = n < max ? n : max;
    if (k > 0) memcpy(steps, all + (n - k), (size_t)k * sizeof *steps);
    free(all);
    return k;
}

/* Temporaries of other steps: saves that died. Only one save of a root is
 * in flight at a time, so every other temporary is stale. */
static void stale_tmps_remove(const char *root, int64_t step)
{
    DIR *d = opendir(root);
    if (!d) return;
    struct dirent *e;
    char path[CKPT_PATH_MAX + 512];
    while ((e = readdir(d))) {
        int64_t s = step_of(e->d_name, true);
        if (s < 0 || s == step) continue;
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        dir_remove(path);
    }
    closedir(d);
}

static void retention(const char *root, int64_t keep)
{
    if (keep <= 0) return;
    int64_t *all;
    int n = steps_all(root, &all);
    char path[CKPT_PATH_MAX];
    for (int i = 0; i + keep < n; i++) {
        ckpt_step_dir(root, all[i], path, sizeof path);
        char idx[CKPT_PATH_MAX + 16];
        /* the index goes first: a directory without one is never read */
        snprintf(idx, sizeof idx, "%s/" CKPT_INDEX_FILE, path);
        base_save_step("remove index", idx);
        if (unlink(idx) != 0 && errno != ENOENT) {
            log_warn("checkpoint: retention: cannot remove %s: %s", idx, strerror(errno));
            continue;
        }
        dir_remove(path);
    }
    free(all);
}

bt_status_t ckpt_commit(const char *root, int64_t step, const ckpt_index_t *idx, int64_t keep,
                        char *err, size_t errlen)
{
    char tmp[CKPT_PATH_MAX], dir[CKPT_PATH_MAX], name[64];
    ckpt_step_tmp(root, step, tmp, sizeof tmp);
    ckpt_step_dir(root, step, dir, sizeof dir);
    ckpt_step_name(step, name, sizeof name);
    struct stat sb;
    if (lstat(dir, &sb) == 0)
        return errf(err, errlen, BT_ERR_INVALID, "%s exists already (a checkpoint of step %lld): "
                    "nothing is overwritten; move it away or resume from it", dir, (long long)step);
    tmp_prune(tmp, idx);
    bt_status_t st = ckpt_index_write(idx, tmp);
    if (st) return errf(err, errlen, st, "%s: cannot write the index", tmp);
    if ((st = base_save_dir_fsync(tmp))) return errf(err, errlen, st, "%s: fsync failed", tmp);
    base_save_step("rename", tmp);
    if (rename(tmp, dir) != 0)
        return errf(err, errlen, BT_ERR_IO, "cannot rename %s to %s: %s", tmp, dir, strerror(errno));
    if ((st = base_save_dir_fsync(root))) return errf(err, errlen, st, "%s: fsync failed", root);
    char latest[CKPT_PATH_MAX], text[80];
    snprintf(latest, sizeof latest, "%s/" CKPT_LATEST_FILE, root);
    int n = snprintf(text, sizeof text, "%s\n", name);
    if ((st = base_save_file(latest, text, (size_t)n, 0644)))
        return errf(err, errlen, st, "%s: cannot update", latest);
    stale_tmps_remove(root, step);
    retention(root, keep);
    return BT_OK;
}

static bool has_index(const char *dir)
{
    char p[CKPT_PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/" CKPT_INDEX_FILE, dir);
    return access(p, F_OK) == 0;
}

bt_status_t ckpt_resolve(const char *path, char *dir, size_t cap, char *err, size_t errlen)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return errf(err, errlen, BT_ERR_NOT_FOUND, "%s: no such checkpoint (%s)", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return errf(err, errlen, BT_ERR_INVALID, "%s is not a directory", path);
    if (has_index(path)) {
        snprintf(dir, cap, "%s", path);
        return BT_OK;
    }
    /* A root: its newest committed step. A committed directory is complete
     * by construction (its index is written last, then it is renamed into
     * place), while `latest` is replaced after that rename: a crash in
     * between leaves `latest` one step behind, never ahead. */
    int64_t newest;
    if (ckpt_list_steps(path, &newest, 1) != 1)
        return errf(err, errlen, BT_ERR_NOT_FOUND, "%s holds no committed checkpoint (no index.json, "
                    "no step-N directory with one)", path);
    ckpt_step_dir(path, newest, dir, cap);
    return BT_OK;
}
