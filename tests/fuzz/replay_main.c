/* A main() for any fuzz target, built with the ordinary compiler (no
 * libFuzzer needed): feeds every file named on the command line, and every
 * regular file of every directory named, to LLVMFuzzerTestOneInput, in name
 * order, each from a heap block of exactly its size (so that a sanitizer
 * build catches a read past the end). The targets abort on a violated
 * property; this prints one line per input set and exits 0 when all ran.
 *
 * make builds $(BUILD)/fuzz-replay/fuzz_X for every tests/fuzz/fuzz_X.c, and
 * tests/sh/test_fuzz_replay.sh runs each over its committed corpus in
 * `make test` (plain and sanitizer builds). */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) {
            uint8_t *b = realloc(buf, cap *= 2);
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
        }
    }
    fclose(f);
    uint8_t *exact = buf ? malloc(n ? n : 1) : NULL;
    if (!exact) {
        free(buf);
        fprintf(stderr, "replay: %s: out of memory\n", path);
        return -1;
    }
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Returns the number of inputs run, or -1. */
static long replay_path(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) return replay_file(path) == 0 ? 1 : -1;
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    long rc = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            char **nn = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names);
            if (!nn) {
                rc = -1;
                break;
            }
            names = nn;
        }
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        if (!(names[n] = malloc(len))) {
            rc = -1;
            break;
        }
        snprintf(names[n++], len, "%s/%s", path, e->d_name);
    }
    closedir(d);
    if (names) qsort(names, n, sizeof *names, name_cmp);
    for (size_t i = 0; i < n; i++) {
        if (rc >= 0) {
            struct stat fs;
            if (stat(names[i], &fs) == 0 && S_ISREG(fs.st_mode))
                rc = replay_file(names[i]) == 0 ? rc + 1 : -1;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    long total = 0;
    for (int i = 1; i < argc; i++) {
        long n = replay_path(argv[i]);
        if (n < 0) return 1;
        printf("replayed %ld inputs from %s\n", n, argv[i]);
        total += n;
    }
    return total > 0 ? 0 : 1;
}
