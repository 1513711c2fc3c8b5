#include "base/save.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"

/* ---- steps and fault injection ---------------------------------------------- */

static atomic_uint save_steps; /* steps taken by this process, all saves together */

/* Every step that changes the file system goes through here first. */
void base_save_step(const char *what, const char *path)
{
    unsigned n = atomic_fetch_add(&save_steps, 1) + 1;
    log_debug("save step %u: %s %s", n, what, path);
    const char *v = getenv("BATON_FAULT_SAVE_STEP");
    if (v && *v && strtoul(v, NULL, 10) == n) {
        fprintf(stderr, "baton: fault injection: killed before save step %u (%s %s)\n", n, what, path);
        fflush(stderr);
        kill(getpid(), SIGKILL);
    }
}

unsigned base_save_steps(void)
{
    return atomic_load(&save_steps);
}

/* ---- names -------------------------------------------------------------------- */

static void host_get(char *out, size_t cap)
{
    if (gethostname(out, cap) != 0 || !out[0]) snprintf(out, cap, "localhost");
    out[cap - 1] = '\0';
    for (char *p = out; *p; p++)
        if (*p == '/') *p = '_';
}

/* parent and base name of path (no trailing slash): "a/b" -> "a", "b";
 * "b" -> ".", "b". false when a part does not fit. */
static bool path_split(const char *path, char *parent, size_t cap, const char **base)
{
    const char *slash = strrchr(path, '/');
    if (!slash) {
        *base = path;
        return snprintf(parent, cap, ".") < (int)cap;
    }
    *base = slash + 1;
    if (slash == path) return snprintf(parent, cap, "/") < (int)cap;
    return snprintf(parent, cap, "%.*s", (int)(slash - path), path) < (int)cap;
}

/* ".BASE.baton-KIND.HOST.PID" of this process. */
static bool temp_name(char *out, size_t cap, const char *parent, const char *base, const char *kind)
{
    char host[256];
    host_get(host, sizeof host);
    return snprintf(out, cap, "%s/.%s.baton-%s.%s.%ld", parent, base, kind, host, (long)getpid()) <
           (int)cap;
}

/* The process id in `name` when it is ".BASE.baton-KIND.HOST.PID" with our
 * host; 0 otherwise. */
static long temp_pid(const char *name, const char *base, const char *kind)
{
    char host[256], prefix[BASE_SAVE_PATH_MAX];
    host_get(host, sizeof host);
    int n = snprintf(prefix, sizeof prefix, ".%s.baton-%s.%s.", base, kind, host);
    if (n < 0 || n >= (int)sizeof prefix || strncmp(name, prefix, (size_t)n)) return 0;
    const char *d = name + n;
    if (!*d || strspn(d, "0123456789") != strlen(d) || strlen(d) > 9) return 0;
    return strtol(d, NULL, 10);
}

/* The writer process of a temporary is gone: no process has its id (EPERM:
 * one exists, of another user). Our own id counts as alive. */
static bool pid_dead(long pid)
{
    if (pid <= 0 || pid == (long)getpid()) return false;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* "X.tmp.PID" with X one of the owned names: what the earlier safetensors
 * writer left when its process died; true when that process is gone. */
static bool legacy_temp_stale(const char *name, const char *const *owned)
{
    const char *t = strstr(name, ".tmp.");
    if (!t || !owned) return false;
    const char *d = t + 5;
    if (!*d || strspn(d, "0123456789") != strlen(d) || strlen(d) > 9) return false;
    char head[BASE_SAVE_PATH_MAX];
    snprintf(head, sizeof head, "%.*s", (int)(t - name), name);
    for (const char *const *o = owned; *o; o++)
        if (fnmatch(*o, head, 0) == 0) return pid_dead(strtol(d, NULL, 10));
    return false;
}

static bool owned_match(const char *name, const char *const *owned)
{
    for (const char *const *o = owned; o && *o; o++)
        if (fnmatch(*o, name, 0) == 0) return true;
    return false;
}

bt_status_t base_save_dir_fsync(const char *dir)
{
    base_save_step("fsync directory", dir);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        log_error("%s: cannot fsync the directory: %s", dir, strerror(errno));
        if (fd >= 0) close(fd);
        return BT_ERR_IO;
    }
    close(fd);
    return BT_OK;
}

/* Removes a dead process's temporary (file or directory) at path. */
static void temp_remove(const char *path, bool is_dir)
{
    base_save_step("remove stale", path);
    int err = is_dir ? base_dir_clear(path) : (unlink(path) ? errno : 0);
    if (err && err != ENOENT) log_warn("%s: cannot remove this stale temporary: %s", path, strerror(err));
    else log_info("removed %s, a temporary of a save whose process died", path);
}

/* ---- one file ------------------------------------------------------------------ */

/* Dead processes' temporaries of the file parent/base. */
static void file_stale_reap(const char *parent, const char *base)
{
    DIR *dh = opendir(parent);
    if (!dh) return;
    const char *const own[] = {base, NULL};
    struct dirent *e;
    while ((e = readdir(dh))) {
        bool stale = pid_dead(temp_pid(e->d_name, base, "tmp")) || legacy_temp_stale(e->d_name, own);
        if (!stale) continue;
        char p[BASE_SAVE_PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", parent, e->d_name) < (int)sizeof p) temp_remove(p, false);
    }
    closedir(dh);
}

bt_status_t base_save_file_begin(base_save_file_t *f, const char *path, mode_t mode)
{
    f->fd = -1;
    char parent[BASE_SAVE_PATH_MAX];
    const char *base;
    if (snprintf(f->path, sizeof f->path, "%s", path) >= (int)sizeof f->path ||
        !path_split(f->path, parent, sizeof parent, &base) || !*base ||
        !temp_name(f->tmp, sizeof f->tmp, parent, base, "tmp")) {
        log_error("%s: not a file name this save can write (too long, or ends in '/')", path);
        return BT_ERR_INVALID;
    }
    file_stale_reap(parent, base);
    base_save_step("create", f->tmp);
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (f->fd < 0) {
        log_error("%s: cannot create: %s", f->tmp, strerror(errno));
        return BT_ERR_IO;
    }
    return BT_OK;
}

bt_status_t base_save_file_write(base_save_file_t *f, const void *buf, size_t n)
{
    base_save_step("write", f->tmp);
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(f->fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            log_error("%s: write: %s", f->tmp, strerror(errno));
            return BT_ERR_IO;
        }
        p += w;
        n -= (size_t)w;
    }
    return BT_OK;
}

bt_status_t base_save_file_commit(base_save_file_t *f)
{
    base_save_step("fsync", f->tmp);
    if (fsync(f->fd) != 0) {
        log_error("%s: fsync: %s", f->tmp, strerror(errno));
        base_save_file_abort(f);
        return BT_ERR_IO;
    }
    int rc = close(f->fd);
    f->fd = -1;
    if (rc != 0) {
        log_error("%s: close: %s", f->tmp, strerror(errno));
        base_save_file_abort(f);
        return BT_ERR_IO;
    }
    base_save_step("rename", f->path);
    if (rename(f->tmp, f->path) != 0) {
        log_error("%s: rename to %s: %s", f->tmp, f->path, strerror(errno));
        base_save_file_abort(f);
        return BT_ERR_IO;
    }
    char parent[BASE_SAVE_PATH_MAX];
    const char *base;
    path_split(f->path, parent, sizeof parent, &base);
    return base_save_dir_fsync(parent);
}

void base_save_file_abort(base_save_file_t *f)
{
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    if (f->tmp[0]) unlink(f->tmp);
}

bt_status_t base_save_file(const char *path, const void *buf, size_t n, mode_t mode)
{
    base_save_file_t f;
    bt_status_t st = base_save_file_begin(&f, path, mode);
    if (st) return st;
    if ((st = base_save_file_write(&f, buf, n))) {
        base_save_file_abort(&f);
        return st;
    }
    return base_save_file_commit(&f);
}

/* ---- a directory ---------------------------------------------------------------- */

void base_save_dir_recover(const char *dir)
{
    char parent[BASE_SAVE_PATH_MAX];
    const char *base;
    if (!path_split(dir, parent, sizeof parent, &base) || !*base) return;
    DIR *dh = opendir(parent);
    if (!dh) return;
    struct dirent *e;
    while ((e = readdir(dh))) {
        bool tmp = pid_dead(temp_pid(e->d_name, base, "tmp"));
        bool old = !tmp && pid_dead(temp_pid(e->d_name, base, "old"));
        if (!tmp && !old) continue;
        char p[BASE_SAVE_PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", parent, e->d_name) >= (int)sizeof p) continue;
        struct stat sb;
        if (old && lstat(dir, &sb) != 0 && errno == ENOENT) {
            /* the two-rename path died between its renames: the previous
             * version, complete, goes back into place */
            base_save_step("restore", dir);
            if (rename(p, dir) == 0) {
                log_warn("%s: put back the previous version, moved aside by a save whose process died",
                         dir);
                base_save_dir_fsync(parent);
                continue;
            }
            log_error("%s: cannot put back the previous version %s: %s", dir, p, strerror(errno));
            continue;
        }
        temp_remove(p, true);
    }
    closedir(dh);
}

bt_status_t base_save_dir_begin(base_save_dir_t *d, const char *dir)
{
    bool no_exchange = d->no_exchange;
    memset(d, 0, sizeof *d);
    d->no_exchange = no_exchange;
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    if (n >= sizeof d->dir) {
        log_error("%s: path too long", dir);
        return BT_ERR_INVALID;
    }
    memcpy(d->dir, dir, n);
    d->dir[n] = '\0';
    char parent[BASE_SAVE_PATH_MAX];
    const char *base;
    path_split(d->dir, parent, sizeof parent, &base);
    if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) {
        log_error("%s: a save replaces a directory as a whole, so it needs a name (not '/', '.' or '..')",
                  dir);
        return BT_ERR_INVALID;
    }
    struct stat sb;
    if (lstat(d->dir, &sb) == 0 && S_ISLNK(sb.st_mode)) {
        /* a link to the export: replace its target, keep the link */
        char real[PATH_MAX];
        if (!realpath(d->dir, real) || stat(real, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            log_error("%s: a symbolic link to something that is not a directory", dir);
            return BT_ERR_INVALID;
        }
        snprintf(d->dir, sizeof d->dir, "%s", real);
        path_split(d->dir, parent, sizeof parent, &base);
    } else if (lstat(d->dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        log_error("%s: exists and is not a directory", dir);
        return BT_ERR_INVALID;
    }
    base_save_dir_recover(d->dir);
    if (!temp_name(d->tmp, sizeof d->tmp, parent, base, "tmp")) {
        log_error("%s: path too long", dir);
        return BT_ERR_INVALID;
    }
    base_dir_clear(d->tmp); /* an earlier failed save of this very process */
    base_save_step("create directory", d->tmp);
    if (mkdir(d->tmp, 0777) != 0) {
        log_error("%s: cannot create %s: %s", dir, d->tmp, strerror(errno));
        d->tmp[0] = '\0';
        return BT_ERR_IO;
    }
    return BT_OK;
}

void base_save_dir_path(const base_save_dir_t *d, const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", d->tmp, name);
}

/* Hard links in the new version for the previous version's entries that
 * the writer does not own. */
static bt_status_t dir_carry(base_save_dir_t *d, const char *const *owned)
{
    DIR *dh = opendir(d->dir);
    if (!dh) {
        log_error("%s: cannot read the previous version: %s", d->dir, strerror(errno));
        return BT_ERR_IO;
    }
    char base_old[BASE_SAVE_PATH_MAX];
    bt_status_t st = BT_OK;
    struct dirent *e;
    while (st == BT_OK && (e = readdir(dh))) {
        const char *name = e->d_name;
        if (!strcmp(name, ".") || !strcmp(name, "..") || owned_match(name, owned) ||
            legacy_temp_stale(name, owned))
            continue;
        /* a single-file save that died inside the directory */
        const char *dot = name[0] == '.' ? strstr(name + 1, ".baton-tmp.") : NULL;
        if (dot) {
            snprintf(base_old, sizeof base_old, "%.*s", (int)(dot - name - 1), name + 1);
            if (pid_dead(temp_pid(name, base_old, "tmp"))) continue;
        }
        char from[BASE_SAVE_PATH_MAX], to[BASE_SAVE_PATH_MAX];
        if (snprintf(from, sizeof from, "%s/%s", d->dir, name) >= (int)sizeof from ||
            snprintf(to, sizeof to, "%s/%s", d->tmp, name) >= (int)sizeof to) {
            log_error("%s/%s: path too long", d->dir, name);
            st = BT_ERR_INVALID;
            break;
        }
        struct stat sb;
        if (lstat(to, &sb) == 0) continue; /* the new version has its own */
        if (lstat(from, &sb) != 0) continue;
        if (S_ISDIR(sb.st_mode)) {
            log_error("%s: holds the directory '%s', which a save does not carry over to the new "
                      "version; move it elsewhere", d->dir, name);
            st = BT_ERR_INVALID;
            break;
        }
        base_save_step("link", to);
        if (linkat(AT_FDCWD, from, AT_FDCWD, to, 0) != 0) {
            log_error("%s: cannot carry '%s' over to the new version (hard link): %s", d->dir, name,
                      strerror(errno));
            st = BT_ERR_IO;
        }
    }
    closedir(dh);
    return st;
}

bt_status_t base_save_dir_commit(base_save_dir_t *d, const char *const *owned)
{
    char parent[BASE_SAVE_PATH_MAX], aside[BASE_SAVE_PATH_MAX];
    const char *base;
    path_split(d->dir, parent, sizeof parent, &base);
    struct stat old;
    bool have_old = stat(d->dir, &old) == 0;
    bt_status_t st = BT_OK;
    if (have_old) {
        if ((st = dir_carry(d, owned))) goto abort;
        base_save_step("chmod", d->tmp);
        if (chmod(d->tmp, old.st_mode & 07777) != 0) {
            log_error("%s: chmod: %s", d->tmp, strerror(errno));
            st = BT_ERR_IO;
            goto abort;
        }
    }
    if ((st = base_save_dir_fsync(d->tmp))) goto abort;
    const char *prev = NULL; /* where the previous version is after the swap */
    if (!have_old) {
        base_save_step("rename", d->dir);
        if (rename(d->tmp, d->dir) != 0) {
            log_error("%s: rename of the new version into place: %s", d->dir, strerror(errno));
            st = BT_ERR_IO;
            goto abort;
        }
    } else {
        int rc = -1;
        if (!d->no_exchange) {
            base_save_step("exchange", d->dir);
            rc = renameat2(AT_FDCWD, d->tmp, AT_FDCWD, d->dir, RENAME_EXCHANGE);
            if (rc != 0 && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
                log_error("%s: cannot swap the new version in: %s", d->dir, strerror(errno));
                st = BT_ERR_IO;
                goto abort;
            }
        }
        if (rc == 0) {
            prev = d->tmp;
        } else { /* no RENAME_EXCHANGE here: the previous version moves aside first */
            if (!temp_name(aside, sizeof aside, parent, base, "old")) {
                st = BT_ERR_INVALID;
                goto abort;
            }
            base_save_step("rename aside", aside);
            if (rename(d->dir, aside) != 0) {
                log_error("%s: cannot move the previous version aside: %s", d->dir, strerror(errno));
                st = BT_ERR_IO;
                goto abort;
            }
            base_save_step("rename", d->dir);
            if (rename(d->tmp, d->dir) != 0) {
                log_error("%s: rename of the new version into place: %s", d->dir, strerror(errno));
                if (rename(aside, d->dir) != 0)
                    log_error("%s: and the previous version stays at %s: %s", d->dir, aside,
                              strerror(errno));
                st = BT_ERR_IO;
                goto abort;
            }
            prev = aside;
        }
    }
    /* The new version is in place. A failing fsync of the parent means its
     * entry may not be durable yet: an error, though readers see the new
     * version; the previous one stays where it is until the next save. */
    if ((st = base_save_dir_fsync(parent))) return st;
    if (prev) {
        base_save_step("remove previous", prev);
        int err = base_dir_clear(prev);
        if (err && err != ENOENT)
            log_warn("%s: cannot remove the previous version at %s: %s (the next save retries)", d->dir,
                     prev, strerror(err));
    }
    d->tmp[0] = '\0';
    return BT_OK;
abort:
    base_save_dir_abort(d);
    return st;
}

void base_save_dir_abort(base_save_dir_t *d)
{
    if (d->tmp[0]) {
        int err = base_dir_clear(d->tmp);
        if (err && err != ENOENT) log_warn("%s: cannot remove: %s", d->tmp, strerror(err));
    }
    d->tmp[0] = '\0';
}
