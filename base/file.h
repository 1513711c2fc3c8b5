#ifndef BT_BASE_FILE_H
#define BT_BASE_FILE_H

#include <stddef.h>

#include "base/status.h"

/* Read a whole regular file into a malloc'd, NUL-terminated buffer (*len
 * excludes the NUL). max > 0 refuses larger files (BT_ERR_INVALID). Errors
 * are logged here, naming the path: BT_ERR_NOT_FOUND when it does not exist,
 * BT_ERR_IO when it cannot be opened or read or is not a regular file,
 * BT_ERR_NOMEM. Outputs are set only on success. */
bt_status_t base_file_read(const char *path, size_t max, char **buf, size_t *len);

/* Removes every entry of dir (files, links and empty sub-directories; it
 * never recurses) and then dir itself. Returns 0, or the errno of the first
 * step that failed (ENOENT: dir was gone already; ENOTEMPTY: a sub-directory
 * had entries). It makes system calls only (no allocation, stdio or locks),
 * so a child forked from a multithreaded process may call it, and it logs
 * nothing. Symbolic links are removed, never followed. */
int base_dir_clear(const char *dir);

#endif
