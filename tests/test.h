/* Minimal test harness. A test binary holds many cases:
 *
 *   static void test_foo(void) { CHECK(x == 1); CHECK_NEAR(a, b, 1e-5, 0); }
 *   int main(int argc, char **argv) { TEST_RUN(argc, argv, test_foo, test_bar); }
 *
 * Each case prints "PASS name" or "FAIL name" on stdout; tests/run.sh counts
 * these lines (and "SKIP name", see TEST_SKIP). `./test_x name` runs the
 * cases whose name contains `name`.
 * CHECK continues after a failure (all failures of a case are reported);
 * REQUIRE returns from the case. */
#ifndef BT_TESTS_TEST_H
#define BT_TESTS_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern int test_case_failures;
extern int test_case_skipped;

/* Ends a case that cannot run in this build (the reason is printed with
 * it): the case reports "SKIP name", not PASS; tests/run.sh lists skips. */
#define TEST_SKIP(why) do { test_case_skipped = 1; printf("skipped: %s\n", why); return; } while (0)

#define CHECK(c) do { if (!(c)) { test_case_failures++; \
    fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c); } } while (0)
#define REQUIRE(c) do { if (!(c)) { test_case_failures++; \
    fprintf(stderr, "%s:%d: REQUIRE(%s) failed\n", __FILE__, __LINE__, #c); return; } } while (0)
#define CHECK_MSG(c, ...) do { if (!(c)) { test_case_failures++; \
    fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #c); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
/* |a-b| <= atol + rtol*|b| */
#define CHECK_NEAR(a, b, rtol, atol) do { double _a = (a), _b = (b); \
    if (!(fabs(_a - _b) <= (atol) + (rtol) * fabs(_b))) { test_case_failures++; \
    fprintf(stderr, "%s:%d: CHECK_NEAR(%s, %s) failed: %.9g vs %.9g\n", __FILE__, __LINE__, \
            #a, #b, _a, _b); } } while (0)

/* How many times slower than the plain build this one runs: tests multiply
 * their bounds on elapsed time (never on counts or values) by it.
 * BATON_TEST_TIME_SCALE from the environment (tests/run.sh sets 10 for
 * ThreadSanitizer builds); 1 when unset, or when not a number >= 1. */
double test_time_scale(void);

/* 1 in a ThreadSanitizer build (gcc defines __SANITIZE_THREAD__, clang
 * answers __has_feature), for the few cases TSan cannot run. */
#if defined(__SANITIZE_THREAD__)
#define TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TEST_TSAN 1
#endif
#endif
#ifndef TEST_TSAN
#define TEST_TSAN 0
#endif

typedef struct { const char *name; void (*fn)(void); } test_case_t;
int test_main(int argc, char **argv, const test_case_t *cases, int n);

#define TEST_CASE_(fn) {#fn, fn}
#define TEST_RUN(argc, argv, ...) do { \
    static void (*const fns_[])(void) = {__VA_ARGS__}; \
    static const char names_[] = #__VA_ARGS__; \
    return test_main_list(argc, argv, fns_, (int)(sizeof fns_ / sizeof fns_[0]), names_); \
} while (0)
int test_main_list(int argc, char **argv, void (*const *fns)(void), int n, const char *names);

#endif
