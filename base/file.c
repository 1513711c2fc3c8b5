#include "base/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"

bt_status_t base_file_read(const char *path, size_t max, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rbe");
    if (!f) {
        log_error("%s: cannot open: %s", path, strerror(errno));
        return errno == ENOENT ? BT_ERR_NOT_FOUND : BT_ERR_IO;
    }
    bt_status_t st = BT_ERR_IO;
    char *b = NULL;
    struct stat sb;
    if (fstat(fileno(f), &sb) || !S_ISREG(sb.st_mode)) {
        log_error("%s: not a regular file", path);
        goto close_file;
    }
    size_t n = (size_t)sb.st_size;
    if (max && n > max) {
        log_error("%s: %zu bytes, more than the %zu this file may have", path, n, max);
        st = BT_ERR_INVALID;
        goto close_file;
    }
    b = malloc(n + 1);
    if (!b) {
        log_error("%s: out of memory for %zu bytes", path, n);
        st = BT_ERR_NOMEM;
        goto close_file;
    }
    if (fread(b, 1, n, f) != n) {
        log_error("%s: short read", path);
        free(b);
        goto close_file;
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    st = BT_OK;
close_file:
    fclose(f);
    return st;
}

/* Unlinking entries while reading the directory may make getdents skip some
 * (the file system is free to reorder), so the scan repeats until a pass
 * finds nothing left to remove. A sub-directory that is not empty is
 * cleared through its own descriptor first, a few levels deep at most. */
static int dir_entries_clear(int fd, int depth)
{
    int err = 0;
    for (bool removed = true; removed && !err;) {
        removed = false;
        if (lseek(fd, 0, SEEK_SET) < 0) return errno;
        char buf[4096] __attribute__((aligned(8)));
        for (;;) {
            ssize_t n = getdents64(fd, buf, sizeof buf);
            if (n <= 0) {
                if (n < 0) err = errno;
                break;
            }
            for (ssize_t off = 0; off < n;) {
                const struct dirent64 *e = (const struct dirent64 *)(buf + off);
                off += e->d_reclen;
                const char *name = e->d_name;
                if (name[0] == '.' && (!name[1] || (name[1] == '.' && !name[2]))) continue;
                int flags = e->d_type == DT_DIR ? AT_REMOVEDIR : 0;
                int rc = unlinkat(fd, name, flags);
                if (rc && errno == EISDIR) rc = unlinkat(fd, name, AT_REMOVEDIR); /* d_type unknown */
                if (rc && errno == ENOTEMPTY && depth < 4) {
                    int sub = openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                    if (sub >= 0) {
                        dir_entries_clear(sub, depth + 1);
                        close(sub);
                        rc = unlinkat(fd, name, AT_REMOVEDIR);
                    }
                }
                if (rc == 0) removed = true;
                else if (errno != ENOENT && !err) err = errno;
            }
        }
    }
    return err;
}

int base_dir_clear(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return errno;
    int err = dir_entries_clear(fd, 0);
    close(fd);
    if (rmdir(dir) && !err) err = errno;
    return err;
}

bt_status_t base_fd_list(int **fds, size_t *n)
{
    DIR *d = opendir("/proc/self/fd"); /* glibc opens it close-on-exec */
    if (!d) return BT_ERR_IO;
    int self = dirfd(d);
    size_t len = 0, cap = 64;
    int *v = malloc(cap * sizeof *v);
    for (struct dirent *e; v && (e = readdir(d));) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        int fd = atoi(e->d_name);
        if (fd == self) continue;
        if (len == cap) {
            int *grown = realloc(v, 2 * cap * sizeof *v);
            if (!grown) {
                free(v);
                v = NULL;
                break;
            }
            v = grown;
            cap *= 2;
        }
        v[len++] = fd;
    }
    closedir(d);
    if (!v) return BT_ERR_NOMEM;
    *fds = v;
    *n = len;
    return BT_OK;
}

static void fd_cloexec_set(int fd)
{
    int flags = fcntl(fd, F_GETFD);
    if (flags >= 0 && !(flags & FD_CLOEXEC)) fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

void base_fd_cloexec_new(const int *before, size_t n)
{
    int *now;
    size_t m;
    if (base_fd_list(&now, &m) != BT_OK) return;
    for (size_t i = 0; i < m; i++) {
        bool old = false;
        for (size_t j = 0; j < n && !old; j++) old = before[j] == now[i];
        if (!old) fd_cloexec_set(now[i]);
    }
    free(now);
}

int base_fd_cloexec_all(int first)
{
    int *now;
    size_t m;
    int changed = 0;
    if (base_fd_list(&now, &m) != BT_OK) return 0;
    for (size_t i = 0; i < m; i++) {
        if (now[i] < first) continue;
        int flags = fcntl(now[i], F_GETFD);
        if (flags >= 0 && !(flags & FD_CLOEXEC) && fcntl(now[i], F_SETFD, flags | FD_CLOEXEC) == 0) changed++;
    }
    free(now);
    return changed;
}

bt_status_t base_dir_make(const char *dir, char *err, size_t errlen)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) {
        snprintf(err, errlen, "%.200s...: path too long", dir);
        return BT_ERR_IO;
    }
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
            snprintf(err, errlen, "cannot create directory %s: %s", buf, strerror(errno));
            return BT_ERR_IO;
        }
        *p = c;
        if (!c) break;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        snprintf(err, errlen, "%s is not a directory", dir);
        return BT_ERR_IO;
    }
    return BT_OK;
}

void base_pages_release(const void *p, size_t n)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + page - 1) / page * page, hi = ((uintptr_t)p + n) / page * page;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}
