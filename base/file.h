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

#endif
