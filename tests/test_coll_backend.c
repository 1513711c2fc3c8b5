/* Choosing the collective backend and loading the nccl one, without a GPU
 * (coll/backend.c): the job word, the choice for auto / host / nccl, the
 * unique-id addresses the workers exchange, and the refusals: a missing
 * libbaton_nccl.so, a file that is no library, and (where it is built) the
 * real library on a machine where NCCL cannot find a CUDA device, each an
 * error that names what is wrong, never a crash. The loads run in forked
 * children: a process loads the library once. */
#include "coll/coll.h"
#include "base/log.h"
#include "tests/helpers/group.h"
#include "tests/test.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_backend_words(void)
{
    for (int b = 0; b < COLL_BACKEND_COUNT; b++) {
        coll_backend_t got = COLL_BACKEND_COUNT;
        CHECK(coll_backend_parse(coll_backend_name((coll_backend_t)b), &got) == BT_OK);
        CHECK(got == (coll_backend_t)b);
    }
    coll_backend_t got;
    CHECK(coll_backend_parse("NCCL", &got) == BT_ERR_INVALID);
    CHECK(coll_backend_parse("", &got) == BT_ERR_INVALID);
    CHECK(coll_backend_parse(NULL, &got) == BT_ERR_INVALID);
    CHECK(!strcmp(coll_backend_name(COLL_BACKEND_NCCL), "nccl"));
}

static void test_backend_choose(void)
{
    char why[512];
    coll_backend_t got = COLL_BACKEND_COUNT;
    setenv("BATON_NCCL_LIB", "/nonexistent/libbaton_nccl.so", 1);
    CHECK(coll_backend_choose(COLL_BACKEND_HOST, true, &got, why, sizeof why) == BT_OK);
    CHECK(got == COLL_BACKEND_HOST);
    CHECK(coll_backend_choose(COLL_BACKEND_AUTO, false, &got, why, sizeof why) == BT_OK);
    CHECK(got == COLL_BACKEND_HOST);
    CHECK_MSG(strstr(why, "not every rank's device is cuda"), "why: %s", why);
    /* auto on CUDA ranks without the library: host, saying why */
    CHECK(coll_backend_choose(COLL_BACKEND_AUTO, true, &got, why, sizeof why) == BT_OK);
    CHECK(got == COLL_BACKEND_HOST);
    CHECK_MSG(strstr(why, "BATON_NCCL_LIB=/nonexistent/libbaton_nccl.so"), "why: %s", why);
    /* nccl asked for: refused, naming the reason */
    CHECK(coll_backend_choose(COLL_BACKEND_NCCL, false, &got, why, sizeof why) == BT_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(why, "every rank's device to be cuda"), "why: %s", why);
    CHECK(coll_backend_choose(COLL_BACKEND_NCCL, true, &got, why, sizeof why) == BT_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(why, "nccl collectives: BATON_NCCL_LIB=/nonexistent/libbaton_nccl.so: No such file"),
              "why: %s", why);
    /* a library file that is there: auto and nccl take it (it is loaded by the workers) */
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    REQUIRE(n > 0);
    self[n] = 0;
    setenv("BATON_NCCL_LIB", self, 1);
    CHECK(coll_backend_choose(COLL_BACKEND_AUTO, true, &got, why, sizeof why) == BT_OK);
    CHECK(got == COLL_BACKEND_NCCL);
    CHECK(coll_backend_choose(COLL_BACKEND_NCCL, true, &got, why, sizeof why) == BT_OK);
    CHECK(got == COLL_BACKEND_NCCL);
    unsetenv("BATON_NCCL_LIB");
}

static void test_nccl_addr(void)
{
    uint8_t id[128], back[128];
    for (int i = 0; i < 128; i++) id[i] = (uint8_t)(i * 37 + 11);
    char addr[XPORT_LISTEN_ADDR_MAX], why[256];
    coll_nccl_addr_format(addr, sizeof addr, id, sizeof id);
    CHECK(strlen(addr) == 5 + 256);
    CHECK(!strncmp(addr, "nccl:", 5));
    CHECK(coll_nccl_addr_parse(addr, back, sizeof back, why, sizeof why) == BT_OK);
    CHECK(!memcmp(id, back, sizeof id));
    /* upper-case hex is hex too */
    char up[XPORT_LISTEN_ADDR_MAX];
    snprintf(up, sizeof up, "%s", addr);
    for (char *p = up + 5; *p; p++)
        if (*p >= 'a' && *p <= 'f') *p = (char)(*p - 'a' + 'A');
    memset(back, 0, sizeof back);
    CHECK(coll_nccl_addr_parse(up, back, sizeof back, why, sizeof why) == BT_OK);
    CHECK(!memcmp(id, back, sizeof id));
    /* refusals, each saying what is wrong */
    CHECK(coll_nccl_addr_parse(COLL_NCCL_PEER_ADDR, back, sizeof back, why, sizeof why) == BT_ERR_INVALID);
    CHECK_MSG(strstr(why, "not a unique id"), "why: %s", why);
    CHECK(coll_nccl_addr_parse("127.0.0.1:4000", back, sizeof back, why, sizeof why) == BT_ERR_INVALID);
    CHECK_MSG(strstr(why, "not an nccl address"), "why: %s", why);
    addr[100] = 0;
    CHECK(coll_nccl_addr_parse(addr, back, sizeof back, why, sizeof why) == BT_ERR_INVALID);
    CHECK_MSG(strstr(why, "95 hex digits, want 256"), "why: %s", why);
    coll_nccl_addr_format(addr, sizeof addr, id, sizeof id);
    addr[5 + 17] = 'g';
    CHECK(coll_nccl_addr_parse(addr, back, sizeof back, why, sizeof why) == BT_ERR_INVALID);
    CHECK_MSG(strstr(why, "no hex digit at offset 17"), "why: %s", why);
    /* a buffer too small gets nothing rather than half an id */
    char small[64] = "x";
    coll_nccl_addr_format(small, sizeof small, id, sizeof id);
    CHECK(small[0] == 0);
}

/* Loads the nccl backend in a child with BATON_NCCL_LIB = lib (NULL: the
 * default search); *loaded and why[] say what came of it. False when the
 * child did not exit normally (a crash). */
static bool load_in_child(const char *lib, bool *loaded, char *why, size_t cap)
{
    int fd[2];
    if (pipe(fd)) return false;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        if (lib) setenv("BATON_NCCL_LIB", lib, 1);
        else unsetenv("BATON_NCCL_LIB");
        char w[1024] = "";
        const coll_ops_t *ops = coll_nccl_ops(w, sizeof w);
        char out[1100];
        int n = snprintf(out, sizeof out, "%d %s", ops && !strcmp(ops->name, "nccl"), w);
        if (write(fd[1], out, (size_t)n) != n) _exit(3);
        _exit(0);
    }
    close(fd[1]);
    char buf[1100];
    ssize_t n = 0, r;
    while (n < (ssize_t)sizeof buf - 1 && (r = read(fd[0], buf + n, sizeof buf - 1 - (size_t)n)) > 0)
        n += r;
    buf[n > 0 ? n : 0] = 0;
    close(fd[0]);
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
        snprintf(why, cap, "child status %d", status);
        return false;
    }
    *loaded = buf[0] == '1';
    snprintf(why, cap, "%s", n > 2 ? buf + 2 : "");
    return true;
}

static void test_nccl_load_refusals(void)
{
    char why[1100];
    bool loaded = true;
    CHECK(load_in_child("/nonexistent/libbaton_nccl.so", &loaded, why, sizeof why));
    CHECK(!loaded);
    CHECK_MSG(strstr(why, "nccl collectives unavailable: BATON_NCCL_LIB=/nonexistent/libbaton_nccl.so: "
                          "No such file or directory"), "why: %s", why);
    /* a file that is no shared object */
    char junk[] = "/tmp/baton-nccl-junk-XXXXXX";
    int fd = mkstemp(junk);
    REQUIRE(fd >= 0);
    CHECK(write(fd, "not an ELF file\n", 16) == 16);
    close(fd);
    loaded = true;
    CHECK(load_in_child(junk, &loaded, why, sizeof why));
    CHECK(!loaded);
    CHECK_MSG(strstr(why, "nccl collectives unavailable: ") && strstr(why, junk), "why: %s", why);
    unlink(junk);
    /* a shared object without the backend */
    const char *libm = "/lib/x86_64-linux-gnu/libm.so.6";
    if (access(libm, R_OK) == 0) {
        loaded = true;
        CHECK(load_in_child(libm, &loaded, why, sizeof why));
        CHECK(!loaded);
        CHECK_MSG(strstr(why, "has no coll_nccl_backend or coll_nccl_probe"), "why: %s", why);
    }
}

static void test_nccl_load_real(void)
{
    char path[PATH_MAX + 32], why[1100];
    unsetenv("BATON_NCCL_LIB");
    if (!coll_nccl_lib_find(path, sizeof path, why, sizeof why))
        TEST_SKIP("libbaton_nccl.so is not built here (no nvcc or no nccl.h)");
    bool loaded = false;
    CHECK_MSG(load_in_child(NULL, &loaded, why, sizeof why), "%s", why);
    printf("libbaton_nccl.so here: %s\n", loaded ? "loaded (a CUDA device is present)" : why);
    /* with a GPU it loads; without one the probe says so (this machine) */
    CHECK_MSG(loaded || (strstr(why, "nccl collectives unavailable: ") && strstr(why, "libbaton_nccl.so")),
              "why: %s", why);
    if (!loaded) CHECK_MSG(strstr(why, "no CUDA device") || strstr(why, "NCCL"), "why: %s", why);
}

/* avg is nccl's: the host backend refuses it at start, and the
 * communicator stays usable (the sum after it is right) */
static int avg_body(coll_comm_t *c, void *arg)
{
    float v[4] = {1, 2, 3, (float)c->rank};
    int f = 0;
    f += coll_all_reduce(c, v, 4, DT_F32, COLL_AVG) != BT_ERR_UNSUPPORTED;
    f += coll_reduce_scatter(c, v, v, (size_t[2]){2, 2}, DT_F32, COLL_AVG) != BT_ERR_UNSUPPORTED;
    f += coll_all_reduce(c, v, 4, DT_F32, COLL_SUM) != BT_OK;
    f += v[0] != 2 || v[1] != 4 || v[2] != 6 || v[3] != 1;
    return f;
}

static void test_host_refuses_avg(void)
{
    test_group_t g = {.job_id = "avg-test", .comm_id = 3, .kind = XPORT_INPROC, .size = 2,
                      .timeout_ms = 5000, .kill_rank = -1};
    CHECK(test_group_threads(&g, avg_body, NULL) == 0);
}

int main(int argc, char **argv)
{
    /* the library calls back into the executable: keep these linked */
    (void)coll_kind_name(COLL_KIND_ALL_REDUCE);
    (void)dtype_size(DT_F32);
    TEST_RUN(argc, argv, test_backend_words, test_backend_choose, test_nccl_addr,
             test_nccl_load_refusals, test_nccl_load_real, test_host_refuses_avg);
}
