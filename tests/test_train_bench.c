/* `baton bench train` entry point on a tiny config: both sides run and the
 * JSON line carries positive throughputs and their ratio. (bench/cmd_bench.c
 * is another helper's; this calls bench_train_main directly.) */
#include "bench/bench_train.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "tests/test.h"

static json_t *bench_json(char **args, int n)
{
    char path[] = "/tmp/test_bench_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return NULL;
    fflush(stdout);
    int saved = dup(1);
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

static void test_train_bench_tiny(void)
{
    char *args[] = {"train", "--layers", "1", "--hidden", "32", "--heads", "2", "--kv-heads", "2",
                    "--ffn", "64", "--vocab", "64", "--seq", "16", "--batch", "2", "--steps", "2",
                    "--threads", "1", "--json"};
    json_t *j = bench_json(args, (int)(sizeof args / sizeof args[0]));
    REQUIRE(j);
    double b = json_number_value(json_object_get(j, "baton_tokens_per_s"));
    double t = json_number_value(json_object_get(j, "torch_tokens_per_s"));
    double r = json_number_value(json_object_get(j, "ratio"));
    CHECK_MSG(json_object_get(j, "torch_error") == NULL, "%s",
              json_string_value(json_object_get(j, "torch_error")));
    CHECK(b > 0 && t > 0);
    CHECK_NEAR(r, b / t, 1e-3, 0);
    CHECK(json_integer_value(json_object_get(j, "seq")) == 16);
    json_decref(j);
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
    TEST_RUN(argc, argv, test_train_bench_tiny, test_train_bench_usage);
}
