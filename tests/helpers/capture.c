#include "tests/helpers/capture.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

void test_capture_begin(test_capture_t *c)
{
    fflush(stderr);
    c->tmp = tmpfile();
    if (c->tmp) fcntl(fileno(c->tmp), F_SETFD, FD_CLOEXEC); /* tmpfile() opens it without */
    c->saved = fcntl(2, F_DUPFD_CLOEXEC, 0);
    if (c->tmp) dup2(fileno(c->tmp), 2);
}

char *test_capture_end(test_capture_t *c)
{
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    long n = c->tmp ? ftell(c->tmp) : 0;
    char *s = calloc((size_t)(n > 0 ? n : 0) + 1, 1);
    if (c->tmp) {
        rewind(c->tmp);
        if (s && n > 0 && fread(s, 1, (size_t)n, c->tmp) != (size_t)n) s[0] = '\0';
        fclose(c->tmp);
    }
    return s;
}
