#include "tests/test.h"
#include "transport/xport.h"

#include <ctype.h>
#include <time.h>
#include <unistd.h>

int test_case_failures;
int test_case_skipped;

double test_time_scale(void)
{
    const char *e = getenv("BATON_TEST_TIME_SCALE");
    char *end = NULL;
    double k = e ? strtod(e, &end) : 1.0;
    return e && end != e && *end == '\0' && k >= 1.0 ? k : 1.0;
}

int test_main(int argc, char **argv, const test_case_t *cases, int n)
{
    const char *env_bad = xport_ucx_env_check();
    if (env_bad) {
        fprintf(stderr, "%s\n", env_bad);
        _exit(2); /* not exit(): OpenBLAS's exit handler ends its threads, which is the crash */
    }
    const char *filter = argc > 1 ? argv[1] : NULL;
    int failed = 0, ran = 0;
    for (int i = 0; i < n; i++) {
        if (filter && !strstr(cases[i].name, filter)) continue;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        test_case_failures = 0;
        test_case_skipped = 0;
        cases[i].fn();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
        const char *verdict = test_case_failures ? "FAIL" : test_case_skipped ? "SKIP" : "PASS";
        printf("%s %s (%.0f ms)\n", verdict, cases[i].name, ms);
        fflush(stdout);
        failed += test_case_failures != 0;
        ran++;
    }
    if (ran == 0) {
        fprintf(stderr, "no test case matches '%s'\n", filter ? filter : "");
        return 1;
    }
    return failed ? 1 : 0;
}

/* Split the stringified __VA_ARGS__ ("test_a, test_b") into names. */
int test_main_list(int argc, char **argv, void (*const *fns)(void), int n, const char *names)
{
    test_case_t *cases = calloc((size_t)n, sizeof *cases);
    char *buf = strdup(names);
    char *p = buf;
    for (int i = 0; i < n; i++) {
        while (*p == ',' || isspace((unsigned char)*p)) p++;
        char *start = p;
        while (*p && *p != ',' && !isspace((unsigned char)*p)) p++;
        if (*p) *p++ = '\0';
        cases[i].name = start;
        cases[i].fn = fns[i];
    }
    int rc = test_main(argc, argv, cases, n);
    free(buf);
    free(cases);
    return rc;
}
