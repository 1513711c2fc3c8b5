#include "base/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
