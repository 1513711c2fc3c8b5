/* Atomic saves: a file, or a whole directory of files, is replaced so that
 * a reader (or a crash, at any instant) sees either the previous version
 * complete or the new one complete, never a mixture or a torn file.
 *
 * One file (base_save_file_*): the bytes go to a temporary sibling
 * ".NAME.baton-tmp.HOST.PID"; commit fsyncs it, renames it over NAME and
 * fsyncs the directory.
 *
 * A directory (base_save_dir_*): its files are written (each as above) into
 * a temporary sibling directory ".NAME.baton-tmp.HOST.PID"; commit carries
 * over the entries of the current version that the writer does not own
 * (say a tokenizer.json copied next to the weights; hard links, no copy),
 * gives the new directory the old one's permissions, fsyncs it, swaps it
 * into place with one renameat2(RENAME_EXCHANGE) (a plain rename when there
 * was no previous version), fsyncs the parent and removes the previous
 * version. A file system without RENAME_EXCHANGE gets two renames (the
 * previous version moves aside to ".NAME.baton-old.HOST.PID" first): a
 * crash between them leaves NAME missing for a moment, and the next save
 * of NAME (base_save_dir_recover) puts the previous version back.
 *
 * Stale temporaries: a save first removes the temporaries of NAME that a
 * dead process left (our host's name in them, and a process id that no
 * longer exists), and inside a directory it drops the "OWNED.tmp.PID"
 * files of the earlier safetensors writer whose process is dead. Entries of
 * live processes and names of any other shape are never touched.
 *
 * Fault injection (tests): BATON_FAULT_SAVE_STEP=N makes the process
 * SIGKILL itself right before the N-th step of all the saves it makes
 * (steps: every directory creation, file creation, write, fsync, rename,
 * link, permission change and removal above); with BATON_LOG=debug every
 * step is logged ("save step N: ..."), so a test can count them and kill a
 * save at each one in turn.
 *
 * Errors are logged here, naming the path and the step. Directory trees
 * are one level deep: a sub-directory in a saved directory is refused. */
#ifndef BT_BASE_SAVE_H
#define BT_BASE_SAVE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "base/status.h"

#define BASE_SAVE_PATH_MAX 4096

typedef struct {
    int  fd;                          /* -1 when not open */
    char path[BASE_SAVE_PATH_MAX];    /* final name */
    char tmp[BASE_SAVE_PATH_MAX];     /* the temporary sibling */
} base_save_file_t;

/* Starts replacing path (mode: of a new file, before the umask). */
bt_status_t base_save_file_begin(base_save_file_t *f, const char *path, mode_t mode);
bt_status_t base_save_file_write(base_save_file_t *f, const void *buf, size_t n);
/* fsync, close, rename over path, fsync the directory. The temporary is
 * removed when a step fails. */
bt_status_t base_save_file_commit(base_save_file_t *f);
/* Closes and removes the temporary (after a failure of the caller). */
void        base_save_file_abort(base_save_file_t *f);
/* The whole file in one call. */
bt_status_t base_save_file(const char *path, const void *buf, size_t n, mode_t mode);

typedef struct {
    char dir[BASE_SAVE_PATH_MAX];     /* final name (symbolic links resolved) */
    char tmp[BASE_SAVE_PATH_MAX];     /* the new version being written */
    bool no_exchange;                 /* tests: take the two-rename path */
} base_save_dir_t;

/* Starts replacing dir (its parent must exist): stale temporaries of dir
 * are removed (base_save_dir_recover) and the temporary directory created.
 * BT_ERR_INVALID when dir exists and is not a directory, or is "." / "..". */
bt_status_t base_save_dir_begin(base_save_dir_t *d, const char *dir);
/* Where the file `name` of the new version goes (open it with
 * base_save_file_* or any writer that fsyncs). */
void        base_save_dir_path(const base_save_dir_t *d, const char *name, char *out, size_t cap);
/* Swaps the new version in. owned: NULL-terminated fnmatch patterns of the
 * names this writer produces; entries of the previous version that match
 * none (and are not stale temporaries) are carried over. On failure before
 * the swap the previous version stays and the temporary is removed. */
bt_status_t base_save_dir_commit(base_save_dir_t *d, const char *const *owned);
void        base_save_dir_abort(base_save_dir_t *d);
/* The clean-up the next save does first: removes the temporaries of dir
 * left by dead processes of this host and, when dir is missing, puts back
 * a previous version a dead process had moved aside (the two-rename path). */
void        base_save_dir_recover(const char *dir);

/* Other writers' file-system steps (a rename, a removal) go through the
 * same count and fault injection: base_save_step before each. */
void        base_save_step(const char *what, const char *path);
/* fsync of a directory (after entries in it were created or renamed). */
bt_status_t base_save_dir_fsync(const char *dir);

/* Steps taken so far by this process (what BATON_FAULT_SAVE_STEP counts;
 * a forked child continues from its parent's count). */
unsigned    base_save_steps(void);

#endif
