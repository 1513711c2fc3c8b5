/* Capture what the library logs to stderr while a call runs, so a test can
 * assert that an error message names what it should. */
#ifndef BT_TESTS_CAPTURE_H
#define BT_TESTS_CAPTURE_H

#include <stdio.h>

typedef struct {
    int   saved; /* the original stderr */
    FILE *tmp;
} test_capture_t;

void  test_capture_begin(test_capture_t *c);
/* Restores stderr and returns the captured text (caller frees; never NULL). */
char *test_capture_end(test_capture_t *c);

#endif
