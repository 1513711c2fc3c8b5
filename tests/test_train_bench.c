/* `baton bench train` entry point (bench_train_main; bench/cmd_bench.c is
 * another helper's) on a tiny config, with stand-ins for the PyTorch script. */
#include "bench/bench_train.h"

#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include <jansson.h>

#include "tests/test.h"

static json_t *bench_json(char **args, int n)
{
    char path[] = "/tmp/test_bench_XXXXXX";
    int fd = mkostemp(path, O_CLOEXEC);
    if (fd < 0) return NULL;
    fflush(stdout);
    int saved = fcntl(1, F_DUPFD_CLOEXEC, 0);
    dup2(fd, 1);
    int rc = bench_train_main(n, args);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    close(fd);
    json_error_t e;
    json_t *j = rc == 0 ? json_load_file(path, 0, &e) : NULL;
    unlink(path);
    return j;
}

#define TINY "train", "--layers", "1", "--hidden", "32", "--heads", "2", "--kv-heads", "2", \
    "--ffn", "64", "--vocab", "64", "--seq", "16", "--batch", "2", "--steps", "2", "--threads", "1", "--json"

/* The baton side alone (C tests never need PyTorch at run time). */
static void test_train_bench_tiny(void)
{
    char *args[] = {TINY, "--no-torch"};
    json_t *j = bench_json(args, (int)(sizeof args / sizeof args[0]));
    REQUIRE(j);
    CHECK(json_number_value(json_object_get(j, "baton_tokens_per_s")) > 0);
    CHECK(json_object_get(j, "torch_tokens_per_s") == NULL && json_object_get(j, "ratio") == NULL);
    CHECK(json_integer_value(json_object_get(j, "seq")) == 16);
    json_decref(j);
}

/* A stand-in for bench_train.py (plain python3, no torch): its RESULT line
 * becomes the ratio; NO_TORCH becomes a clear message, not a failure; a
 * crashing script is a failure. */
static void fake_script(const char *path, const char *body)
{
    FILE *f = fopen(path, "we");
    if (!f) return;
    fputs(body, f);
    fclose(f);
}

static void test_train_bench_torch_side(void)
{
    char path[] = "/tmp/test_bench_py_XXXXXX";
    int fd = mkostemp(path, O_CLOEXEC);
    REQUIRE(fd >= 0);
    close(fd);
    setenv("BATON_BENCH_TRAIN_PY", path, 1);
    char *args[] = {TINY};
    int n = (int)(sizeof args / sizeof args[0]);

    fake_script(path, "print('RESULT tokens_per_s=100.0 first_loss=4.16')\n");
    json_t *j = bench_json(args, n);
    CHECK(j != NULL);
    if (j) {
        double b = json_number_value(json_object_get(j, "baton_tokens_per_s"));
        CHECK(json_number_value(json_object_get(j, "torch_tokens_per_s")) == 100.0);
        CHECK_NEAR(json_number_value(json_object_get(j, "ratio")), b / 100.0, 1e-3, 0);
        json_decref(j);
    }
    fake_script(path, "print('NO_TORCH')\nraise SystemExit(2)\n");
    j = bench_json(args, n);
    CHECK(j != NULL);
    if (j) {
        const char *why = json_string_value(json_object_get(j, "torch_error"));
        CHECK_MSG(why && strstr(why, "PyTorch is not installed"), "%s", why ? why : "(none)");
        json_decref(j);
    }
    /* the script's own words go into the JSON escaped (quotes, a tab, a
     * backslash): the line stays JSON */
    fake_script(path, "print('module \"torch\" not found\\tin C:\\\\x')\nraise SystemExit(2)\n");
    j = bench_json(args, n);
    CHECK(j != NULL);
    if (j) {
        const char *why = json_string_value(json_object_get(j, "torch_error"));
        CHECK_MSG(why && !strcmp(why, "module \"torch\" not found\tin C:\\x"), "%s", why ? why : "(none)");
        json_decref(j);
    }
    fake_script(path, "raise RuntimeError('boom')\n");
    fflush(stdout);
    int saved = fcntl(1, F_DUPFD_CLOEXEC, 0), devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    dup2(devnull, 1);
    int rc = bench_train_main(n, args);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    close(devnull);
    CHECK(rc == 1);
    unsetenv("BATON_BENCH_TRAIN_PY");
    unlink(path);
}

static void test_train_bench_usage(void)
{
    char *bad[] = {"train", "--heads", "3", "--hidden", "32"};
    CHECK(bench_train_main(5, bad) == 2);
    char *unknown[] = {"train", "--bogus"};
    CHECK(bench_train_main(2, unknown) == 2);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_train_bench_tiny, test_train_bench_torch_side, test_train_bench_usage);
}
