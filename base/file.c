#include "base/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"

bt_status_t base_file_read(const char *path, size_t max, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
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
 * finds nothing left to remove. */
int base_dir_clear(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return errno;
    int err = 0;
    for (bool removed = true; removed && !err;) {
        removed = false;
        if (lseek(fd, 0, SEEK_SET) < 0) {
            err = errno;
            break;
        }
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
                if (rc == 0) removed = true;
                else if (errno != ENOENT && !err) err = errno;
            }
        }
    }
    close(fd);
    if (rmdir(dir) && !err) err = errno;
    return err;
}
