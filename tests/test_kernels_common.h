/* Shared helpers of the kernel tests: a deterministic RNG, comparisons of
 * fp32 kernel results against float64 references, central finite
 * differences in double, and a check that a call panics.
 * Header-only (static functions) so every test binary stays one file. */
#ifndef BT_TESTS_TEST_KERNELS_COMMON_H
#define BT_TESTS_TEST_KERNELS_COMMON_H

#include "kernels/kernels.h"
#include "tests/test.h"

#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- deterministic random numbers (splitmix64) --------------------------- */

typedef struct {
    uint64_t s;
} kt_rng_t;

static inline uint64_t kt_next(kt_rng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [lo, hi) */
static inline double kt_uniform(kt_rng_t *r, double lo, double hi)
{
    return lo + (hi - lo) * (double)(kt_next(r) >> 11) * 0x1p-53;
}

static inline int64_t kt_int(kt_rng_t *r, int64_t n) { return (int64_t)(kt_next(r) % (uint64_t)n); }

static inline float *kt_alloc(int64_t n)
{
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    if (!p) abort();
    return p;
}

static inline double *kt_alloc_d(int64_t n)
{
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    if (!p) abort();
    return p;
}

static inline float *kt_rand(kt_rng_t *r, int64_t n, double lo, double hi)
{
    float *p = kt_alloc(n);
    for (int64_t i = 0; i < n; i++) p[i] = (float)kt_uniform(r, lo, hi);
    return p;
}

static inline double *kt_to_d(const float *f, int64_t n)
{
    double *d = kt_alloc_d(n);
    for (int64_t i = 0; i < n; i++) d[i] = f[i];
    return d;
}

static inline float *kt_dup(const float *f, int64_t n)
{
    float *p = kt_alloc(n);
    memcpy(p, f, (size_t)n * sizeof *p);
    return p;
}

/* ---- comparisons ----------------------------------------------------------- */

static inline double kt_max_abs_d(const double *x, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* got (fp32) against ref (f64): |got - ref| <= rtol * (|ref| + max|ref|/10)
 * elementwise. The max|ref| term keeps values that cancel to ~0 from failing
 * on rounding; any real bug gives errors of order max|ref|, far above it.
 * `base` (may be NULL) is subtracted from got first: for accumulating
 * backward kernels it holds the gradient buffer's prior contents. */
static inline bool kt_close_base(const char *what, const float *got, const float *base,
                                 const double *ref, int64_t n, double rtol)
{
    double scale = kt_max_abs_d(ref, n) / 10.0;
    double worst = 0;
    int64_t worst_i = -1;
    for (int64_t i = 0; i < n; i++) {
        double g = (double)got[i] - (base ? (double)base[i] : 0.0);
        double err = fabs(g - ref[i]) / (fabs(ref[i]) + scale + 1e-300);
        if (!(err <= worst)) { /* catches NaN too */
            worst = isnan(err) ? INFINITY : err;
            worst_i = i;
        }
    }
    if (worst > rtol) {
        test_case_failures++;
        double g = (double)got[worst_i] - (base ? (double)base[worst_i] : 0.0);
        fprintf(stderr, "  %s: element %lld: got %.9g, reference %.9g (rel err %.3g > %.3g)\n", what,
                (long long)worst_i, g, ref[worst_i], worst, rtol);
        return false;
    }
    return true;
}

static inline bool kt_close(const char *what, const float *got, const double *ref, int64_t n,
                            double rtol)
{
    return kt_close_base(what, got, NULL, ref, n, rtol);
}

/* ---- finite differences ------------------------------------------------------ */

/* A scalar loss of double inputs held in ctx. */
typedef double (*kt_loss_fn)(void *ctx);

/* Checks grad[i] - base[i] against central differences of loss() with
 * respect to x[i] (x is one of the double inputs loss() reads) for up to
 * max_coords coordinates (all when n <= max_coords, else a random sample).
 * h = 1e-5 relative step in double: truncation ~h^2, roundoff ~1e-16/h. */
static inline bool kt_fd_check(const char *what, double *x, int64_t n, const float *grad,
                               const float *base, kt_loss_fn loss, void *ctx, int64_t max_coords,
                               double rtol, kt_rng_t *rng)
{
    int64_t count = n <= max_coords ? n : max_coords;
    double *fd = kt_alloc_d(count);
    float *got = kt_alloc(count);
    float *gbase = base ? kt_alloc(count) : NULL;
    for (int64_t c = 0; c < count; c++) {
        int64_t i = n <= max_coords ? c : kt_int(rng, n);
        double saved = x[i];
        double h = 1e-5 * (fabs(saved) > 1.0 ? fabs(saved) : 1.0);
        x[i] = saved + h;
        double lp = loss(ctx);
        x[i] = saved - h;
        double lm = loss(ctx);
        x[i] = saved;
        fd[c] = (lp - lm) / (2 * h);
        got[c] = grad[i];
        if (gbase) gbase[c] = base[i];
    }
    bool ok = kt_close_base(what, got, gbase, fd, count, rtol);
    free(fd);
    free(got);
    free(gbase);
    return ok;
}

/* ---- panics ------------------------------------------------------------------ */

/* Runs fn(arg) in a child process; true when it died by SIGABRT with a
 * message on stderr containing `needle` (the op name and the mismatch). */
static inline bool kt_panics(void (*fn)(void *), void *arg, const char *needle)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC)) return false;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        close(pfd[0]);
        dup2(pfd[1], 2);
        fn(arg);
        _exit(0); /* no panic */
    }
    close(pfd[1]);
    char buf[4096];
    size_t len = 0;
    ssize_t r;
    while ((r = read(pfd[0], buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)r;
    buf[len] = '\0';
    close(pfd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    bool died = WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
    bool said = strstr(buf, needle) != NULL;
    if (!died || !said)
        fprintf(stderr, "  expected a panic mentioning '%s'; status %d, stderr: %s\n", needle, st,
                buf);
    return died && said;
}

#endif
