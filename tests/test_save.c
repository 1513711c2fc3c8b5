/* Atomic saves (base/save.h): files and directories replaced as a whole,
 * stale temporaries of dead processes removed (and nothing else), entries
 * the writer does not own carried over, and, killed before any one of its
 * steps (BATON_FAULT_SAVE_STEP, in a forked child), a save leaves the
 * previous version or the new one, complete, with nothing left over after
 * the next save. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "base/save.h"
#include "tests/helpers/capture.h"
#include "tests/test.h"

static const char *const owned[] = {"a.bin", "b.txt", "old-*.bin", NULL};

/* A scratch folder per case. */
static void scratch(char *dir, size_t cap)
{
    snprintf(dir, cap, "/tmp/test_save.XXXXXX");
    if (!mkdtemp(dir)) abort();
}

static void scratch_remove(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {}
}

static void file_put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) abort();
    fputs(text, f);
    fclose(f);
}

/* The text of path ("" when missing). */
static char *file_text(const char *path)
{
    static char buf[4][256];
    static int k;
    char *b = buf[k++ % 4];
    b[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return b;
    size_t n = fread(b, 1, 255, f);
    b[n] = '\0';
    fclose(f);
    return b;
}

/* Entries of dir, sorted, space-separated ("-" when dir is missing). */
static char *dir_list(const char *dir)
{
    static char out[2][1024];
    static int k;
    char *o = out[k++ % 2];
    struct dirent **names;
    int n = scandir(dir, &names, NULL, alphasort);
    if (n < 0) return strcpy(o, "-");
    o[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (strcmp(names[i]->d_name, ".") && strcmp(names[i]->d_name, "..")) {
            if (o[0]) strcat(o, " ");
            strncat(o, names[i]->d_name, 1023 - strlen(o) - 1);
        }
        free(names[i]);
    }
    free(names);
    return o;
}

/* A process id that no longer exists (a child that has exited and been
 * reaped). */
static long dead_pid(void)
{
    pid_t p = fork();
    if (p == 0) _exit(0);
    waitpid(p, NULL, 0);
    return (long)p;
}

static const char *host(void)
{
    static char h[64];
    if (gethostname(h, sizeof h) || !h[0]) snprintf(h, sizeof h, "localhost");
    return h;
}

/* Version `v` of a directory save: a.bin and b.txt hold the version's text. */
static bt_status_t version_save(const char *dir, const char *v, bool no_exchange)
{
    base_save_dir_t d = {.no_exchange = no_exchange};
    bt_status_t st = base_save_dir_begin(&d, dir);
    if (st) return st;
    char p[BASE_SAVE_PATH_MAX], text[64];
    base_save_dir_path(&d, "a.bin", p, sizeof p);
    snprintf(text, sizeof text, "A-%s", v);
    if ((st = base_save_file(p, text, strlen(text), 0644))) goto fail;
    base_save_dir_path(&d, "b.txt", p, sizeof p);
    snprintf(text, sizeof text, "B-%s", v);
    if ((st = base_save_file(p, text, strlen(text), 0644))) goto fail;
    return base_save_dir_commit(&d, owned);
fail:
    base_save_dir_abort(&d);
    return st;
}

/* Which version dir holds: "1", "2"... ; "" when missing, "mixed" otherwise. */
static const char *version_of(const char *dir)
{
    static char v[64];
    char p[512];
    snprintf(p, sizeof p, "%s/a.bin", dir);
    const char *a = file_text(p);
    snprintf(p, sizeof p, "%s/b.txt", dir);
    const char *b = file_text(p);
    struct stat sb;
    if (stat(dir, &sb) != 0) return "";
    if (a[0] == 'A' && b[0] == 'B' && !strcmp(a + 1, b + 1) && a[1] == '-') {
        snprintf(v, sizeof v, "%s", a + 2);
        return v;
    }
    return "mixed";
}

static void test_save_file_replaces_and_reaps(void)
{
    char dir[64], path[128], p[1024];
    scratch(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/f.json", dir);
    file_put(path, "old");
    long dead = dead_pid();
    /* a dead writer's temporaries (ours and the earlier writer's pattern),
     * a live one's, and names that only look alike */
    snprintf(p, sizeof p, "%s/.f.json.baton-tmp.%s.%ld", dir, host(), dead);
    file_put(p, "x");
    snprintf(p, sizeof p, "%s/f.json.tmp.%ld", dir, dead);
    file_put(p, "x");
    snprintf(p, sizeof p, "%s/.f.json.baton-tmp.%s.1", dir, host());
    file_put(p, "x");
    snprintf(p, sizeof p, "%s/.f.json.baton-tmp.otherhost.%ld", dir, dead);
    file_put(p, "x");
    snprintf(p, sizeof p, "%s/g.json.tmp.%ld", dir, dead);
    file_put(p, "x");
    REQUIRE(base_save_file(path, "new", 3, 0644) == BT_OK);
    CHECK(!strcmp(file_text(path), "new"));
    /* kept: the live writer's, another host's, another file's */
    char kept[3][160];
    snprintf(kept[0], sizeof kept[0], ".f.json.baton-tmp.%s.1", host());
    snprintf(kept[1], sizeof kept[1], ".f.json.baton-tmp.otherhost.%ld", dead);
    snprintf(kept[2], sizeof kept[2], "g.json.tmp.%ld", dead);
    int n_entries = 0;
    for (const char *l = dir_list(dir); *l; l++) n_entries += *l == ' ';
    CHECK_MSG(n_entries + 1 == 4, "%s", dir_list(dir));
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, kept[i]);
        CHECK_MSG(access(p, F_OK) == 0, "%s was removed", kept[i]);
    }
    scratch_remove(dir);
}

static void test_save_dir_first_and_replace(void)
{
    char dir[64], path[128], p[1024];
    scratch(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/ck", dir);
    REQUIRE(version_save(path, "1", false) == BT_OK);
    CHECK(!strcmp(version_of(path), "1"));
    CHECK(!strcmp(dir_list(dir), "ck"));
    /* the previous version holds files of its own: carried over unless the
     * writer owns them (or they are a dead writer's temporaries) */
    long dead = dead_pid();
    snprintf(p, sizeof p, "%s/tokenizer.json", path);
    file_put(p, "tok");
    snprintf(p, sizeof p, "%s/old-00001.bin", path);
    file_put(p, "stale shard");
    snprintf(p, sizeof p, "%s/a.bin.tmp.%ld", path, dead);
    file_put(p, "torn");
    snprintf(p, sizeof p, "%s/.b.txt.baton-tmp.%s.%ld", path, host(), dead);
    file_put(p, "torn");
    chmod(path, 0700);
    REQUIRE(version_save(path, "2", false) == BT_OK);
    CHECK(!strcmp(version_of(path), "2"));
    CHECK_MSG(!strcmp(dir_list(path), "a.bin b.txt tokenizer.json"), "%s", dir_list(path));
    snprintf(p, sizeof p, "%s/tokenizer.json", path);
    CHECK(!strcmp(file_text(p), "tok"));
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (sb.st_mode & 07777) == 0700);
    CHECK(!strcmp(dir_list(dir), "ck"));
    /* the same through the two-rename path */
    REQUIRE(version_save(path, "3", true) == BT_OK);
    CHECK(!strcmp(version_of(path), "3"));
    CHECK(!strcmp(dir_list(dir), "ck"));
    CHECK_MSG(!strcmp(dir_list(path), "a.bin b.txt tokenizer.json"), "%s", dir_list(path));
    scratch_remove(dir);
}

static void test_save_dir_refusals(void)
{
    char dir[64], path[128], p[1024];
    scratch(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/ck", dir);
    REQUIRE(version_save(path, "1", false) == BT_OK);
    /* a sub-directory would be lost: refused, the previous version stays */
    snprintf(p, sizeof p, "%s/sub", path);
    mkdir(p, 0755);
    test_capture_t cap;
    test_capture_begin(&cap);
    bt_status_t st = version_save(path, "2", false);
    char *msg = test_capture_end(&cap);
    CHECK(st == BT_ERR_INVALID && strstr(msg, "holds the directory 'sub'"));
    free(msg);
    CHECK(!strcmp(version_of(path), "1"));
    CHECK(!strcmp(dir_list(dir), "ck"));
    rmdir(p);
    /* a file where the directory should be; '.'; a link is followed */
    snprintf(p, sizeof p, "%s/file", dir);
    file_put(p, "x");
    test_capture_begin(&cap);
    st = version_save(p, "1", false);
    bt_status_t st2 = version_save(".", "1", false);
    msg = test_capture_end(&cap);
    CHECK(st == BT_ERR_INVALID && st2 == BT_ERR_INVALID && strstr(msg, "is not a directory") &&
          strstr(msg, "needs a name"));
    free(msg);
    snprintf(p, sizeof p, "%s/link", dir);
    REQUIRE(symlink("ck", p) == 0);
    REQUIRE(version_save(p, "4", false) == BT_OK);
    struct stat sb;
    CHECK(lstat(p, &sb) == 0 && S_ISLNK(sb.st_mode));
    CHECK(!strcmp(version_of(path), "4"));
    CHECK_MSG(!strcmp(dir_list(dir), "ck file link"), "%s", dir_list(dir));
    scratch_remove(dir);
}

/* Stale temporaries of the directory: a dead writer's are removed, a live
 * writer's kept; a previous version moved aside by a dead writer comes
 * back when the directory is missing. */
static void test_save_dir_recover(void)
{
    char dir[64], path[128], p[1024], q[1200];
    scratch(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/ck", dir);
    REQUIRE(version_save(path, "1", false) == BT_OK);
    long dead = dead_pid();
    snprintf(p, sizeof p, "%s/.ck.baton-tmp.%s.%ld", dir, host(), dead);
    mkdir(p, 0755);
    snprintf(q, sizeof q, "%s/a.bin", p);
    file_put(q, "torn");
    snprintf(p, sizeof p, "%s/.ck.baton-tmp.%s.1", dir, host());
    mkdir(p, 0755);
    base_save_dir_recover(path);
    char want[512];
    snprintf(want, sizeof want, ".ck.baton-tmp.%s.1 ck", host());
    CHECK_MSG(!strcmp(dir_list(dir), want), "%s", dir_list(dir));
    rmdir(p);
    snprintf(p, sizeof p, "%s/.ck.baton-old.%s.%ld", dir, host(), dead);
    REQUIRE(rename(path, p) == 0);
    base_save_dir_recover(path);
    CHECK(!strcmp(version_of(path), "1"));
    CHECK_MSG(!strcmp(dir_list(dir), "ck"), "%s", dir_list(dir));
    scratch_remove(dir);
}

/* Kill a save of version 2 over version `prev` ("" : none) before each of
 * its steps in turn; after each: version prev or 2, complete (or, on the
 * two-rename path only, the directory missing until recovery puts prev
 * back), and after the next save nothing but that version. */
static void fault_sweep(bool no_exchange, bool first)
{
    char dir[64], path[128];
    scratch(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/ck", dir);
    const char *prev = first ? "" : "1";
    /* the steps of one such save */
    if (!first) REQUIRE(version_save(path, "1", no_exchange) == BT_OK);
    unsigned s0 = base_save_steps();
    REQUIRE(version_save(path, "2", no_exchange) == BT_OK);
    unsigned steps = base_save_steps() - s0;
    REQUIRE(steps > 10);
    int killed = 0, missing = 0;
    for (unsigned n = 1; n <= steps + 1; n++) {
        scratch_remove(path);
        if (!first) REQUIRE(version_save(path, "1", no_exchange) == BT_OK);
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid == 0) {
            char v[32];
            snprintf(v, sizeof v, "%u", base_save_steps() + n);
            setenv("BATON_FAULT_SAVE_STEP", v, 1);
            _exit(version_save(path, "2", no_exchange) == BT_OK ? 0 : 1);
        }
        int status;
        REQUIRE(waitpid(pid, &status, 0) == pid);
        bool died = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
        killed += died;
        CHECK_MSG(died == (n <= steps), "step %u: status %#x", n, status);
        const char *v = version_of(path);
        bool ok = !strcmp(v, prev) || !strcmp(v, "2");
        if (!ok && !v[0] && no_exchange) { /* between the two renames */
            missing++;
            base_save_dir_recover(path);
            ok = !strcmp(version_of(path), prev);
        }
        CHECK_MSG(ok, "%s, killed before step %u of %u: holds '%s'", no_exchange ? "two renames" : "exchange",
                  n, steps, v);
        /* the next save leaves its version and nothing else */
        REQUIRE(version_save(path, "3", no_exchange) == BT_OK);
        CHECK(!strcmp(version_of(path), "3"));
        CHECK_MSG(!strcmp(dir_list(dir), "ck"), "after step %u: %s", n, dir_list(dir));
        CHECK_MSG(!strcmp(dir_list(path), "a.bin b.txt"), "after step %u: %s", n, dir_list(path));
    }
    printf("  %s%s: %u steps, killed before each; %d times between the renames\n",
           no_exchange ? "two renames" : "exchange", first ? " (first save)" : "", steps, missing);
    CHECK(killed == (int)steps);
    CHECK(!no_exchange || first || missing == 1);
    scratch_remove(dir);
}

static void test_save_fault_exchange(void) { fault_sweep(false, false); }
static void test_save_fault_two_renames(void) { fault_sweep(true, false); }
static void test_save_fault_first(void) { fault_sweep(false, true); }

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_save_file_replaces_and_reaps, test_save_dir_first_and_replace,
             test_save_dir_refusals, test_save_dir_recover, test_save_fault_exchange,
             test_save_fault_two_renames, test_save_fault_first);
}
