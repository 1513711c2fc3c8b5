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

/* Removes every entry of dir (files, links, sub-directories and what they
 * hold, four levels deep) and then dir itself. Returns 0, or the errno of
 * the first step that failed (ENOENT: dir was gone already; ENOTEMPTY: a
 * deeper tree, or entries created meanwhile). It makes system calls only (no allocation, stdio or locks),
 * so a child forked from a multithreaded process may call it, and it logs
 * nothing. Symbolic links are removed, never followed. */
int base_dir_clear(const char *dir);
/* mkdir -p: dir and every missing parent (0755). An error (a part that
 * cannot be created, or dir existing as something else than a directory)
 * is BT_ERR_IO with err[errlen] naming the path; nothing is logged. */
bt_status_t base_dir_make(const char *dir, char *err, size_t errlen);
/* The whole pages inside [p, p + n) of a file mapping given back to the
 * kernel (MADV_DONTNEED: clean file pages stay in the page cache and come
 * back on the next touch), so that a reader passing through a large mapping
 * does not keep it resident. */
void        base_pages_release(const void *p, size_t n);
/* Close-on-exec for descriptors that a library opens without it (UCX does:
 * its sockets, shared-memory files, pipes and timer fds). base_fd_list()
 * before the library call, base_fd_cloexec_new() after it: every
 * descriptor open then but not before gets FD_CLOEXEC. Descriptors another
 * thread opened meanwhile are ours and close-on-exec already. *fds is
 * malloc'd (free it); BT_ERR_IO when /proc/self/fd cannot be read. */
bt_status_t base_fd_list(int **fds, size_t *n);
void        base_fd_cloexec_new(const int *before, size_t n);
/* FD_CLOEXEC on every open descriptor from `first` up: for a program's
 * start, so that nothing it inherited or a library opened while loading
 * reaches the programs it runs. Returns how many were changed. */
int         base_fd_cloexec_all(int first);

#endif
