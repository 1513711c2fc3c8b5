/* ckpt/native.h: pieces written under one layout (tensor-parallel boxes, each
 * cut in ZeRO-1 flat ranges, a 3-D split, a zero-size tensor) by two "ranks"
 * into their own shard files, merged into one index, then read back whole
 * and under other layouts, bit for bit; shard files in two directories (a
 * node-local checkpoint); the coverage check; and every kind of damage:
 * truncated and altered files, a newer or broken index, pieces that do not
 * match their file. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "ckpt/native.h"
#include "tests/test.h"

/* Every tensor holds f(global index) so any piece can be checked alone. */
static float val(int tensor, int64_t g) { return (float)tensor * 1000.0f + (float)g * 0.5f + 0.25f; }

static float *piece_data(int tensor, const shard_spec_t *s)
{
    int64_t n = shard_numel(s);
    float *d = malloc((size_t)(n ? n : 1) * sizeof *d);
    for (int64_t k = 0; k < n; k++) d[k] = val(tensor, shard_global_index(s, k));
    return d;
}

static int64_t piece_wrong(int tensor, const shard_spec_t *s, const float *d)
{
    int64_t bad = 0, n = shard_numel(s);
    for (int64_t k = 0; k < n; k++) bad += d[k] != val(tensor, shard_global_index(s, k));
    return bad;
}

#define NT 4
static const char *names[NT] = {"model.w", "model.e", "optim.exp_avg/model.m", "model.z"};
static const int ndims[NT] = {2, 1, 3, 2};
static const int64_t shapes[NT][4] = {{6, 10}, {7}, {4, 3, 5}, {0, 4}};

static shard_spec_t whole_of(int t) { return shard_whole(ndims[t], shapes[t]); }

/* Layout A, as two ranks would hold it: W tp=2 on dim 0, each half cut
 * into 3 flat ranges (ZeRO-1 over dp=3: ranks 0 and 1 write different
 * ones); E whole (a replica, written once, by rank 0); M split on dim 1
 * (extents 2 and 1); Z whole and empty. Rank r's puts into puts[]. */
static int layout_a(int rank, ckpt_put_t *puts, float **bufs)
{
    int n = 0;
    for (int tp = 0; tp < 2; tp++) {
        shard_spec_t w = whole_of(0), half = shard_split(&w, 0, SHARD_GROUP_TP, tp, 2, 1);
        int64_t hn = shard_numel(&half), cuts[4] = {0, 7, 7, hn}; /* an empty middle range */
        for (int dp = 0; dp < 3; dp++) {
            if ((tp * 3 + dp) % 2 != rank) continue;
            shard_spec_t f = shard_flat(&half, SHARD_GROUP_DP, dp, 3, cuts[dp], cuts[dp + 1] - cuts[dp]);
            bufs[n] = piece_data(0, &f);
            puts[n] = (ckpt_put_t){.tensor = names[0], .dtype = DT_F32, .spec = f, .data = bufs[n]};
            n++;
        }
    }
    if (rank == 0) {
        shard_spec_t e = whole_of(1);
        bufs[n] = piece_data(1, &e);
        puts[n] = (ckpt_put_t){.tensor = names[1], .dtype = DT_F32, .spec = e, .data = bufs[n]};
        n++;
        shard_spec_t z = whole_of(3);
        bufs[n] = piece_data(3, &z);
        puts[n] = (ckpt_put_t){.tensor = names[3], .dtype = DT_F32, .spec = z, .data = bufs[n]};
        n++;
    }
    shard_spec_t m = whole_of(2), mp = shard_split(&m, 1, SHARD_GROUP_TP, rank, 2, 1);
    bufs[n] = piece_data(2, &mp);
    puts[n] = (ckpt_put_t){.tensor = names[2], .dtype = DT_F32, .spec = mp, .data = bufs[n]};
    return n + 1;
}

static char g_dir[256];

/* Writes the two ranks' files into dir (rank 1's into dir1 when given)
 * and the merged index into dir. */
static void save_a(const char *dir, const char *dir1)
{
    ckpt_index_t idx = {0};
    char err[256] = "";
    for (int r = 0; r < 2; r++) {
        ckpt_put_t puts[8];
        float *bufs[8];
        int n = layout_a(r, puts, bufs);
        ckpt_index_t part = {0};
        char file[32];
        snprintf(file, sizeof file, "shard-r%d.safetensors", r);
        CHECK_MSG(ckpt_shard_write(&part, r == 1 && dir1 ? dir1 : dir, file, puts, n, err, sizeof err) == BT_OK,
                  "%s", err);
        CHECK_MSG(ckpt_index_merge(&idx, &part, err, sizeof err) == BT_OK, "%s", err);
        ckpt_index_free(&part);
        for (int i = 0; i < n; i++) free(bufs[i]);
    }
    REQUIRE(ckpt_index_set_meta(&idx, "{\"step\": 6, \"layout\": {\"tp\": 2, \"dp\": 3}}") == BT_OK);
    CHECK(ckpt_index_set_meta(&idx, "[1]") == BT_ERR_INVALID);
    CHECK(ckpt_index_write(&idx, dir) == BT_OK);
    ckpt_index_free(&idx);
}

static void mkdtemp_into(char *buf, size_t cap, const char *tag)
{
    snprintf(buf, cap, "/tmp/test_ckpt_native.%s.XXXXXX", tag);
    REQUIRE(mkdtemp(buf) != NULL);
}

/* Reads every tensor whole and in other layouts and checks the values. */
static void read_all(const char *const *dirs, int nd)
{
    ckpt_reader_t *r;
    char err[256] = "";
    if (ckpt_reader_open(dirs, nd, &r, err, sizeof err) != BT_OK) {
        CHECK_MSG(0, "open: %s", err);
        return;
    }
    const ckpt_index_t *idx = ckpt_reader_index(r);
    CHECK(idx->n_tensors == NT && idx->n_files == 2 && strstr(idx->meta, "\"step\":6"));
    for (int t = 0; t < NT; t++) {
        shard_spec_t w = whole_of(t);
        int64_t n = shard_numel(&w);
        float *d = calloc((size_t)n + 1, sizeof *d);
        CHECK_MSG(ckpt_read(r, names[t], &w, d, err, sizeof err) == BT_OK, "%s: %s", names[t], err);
        CHECK_MSG(piece_wrong(t, &w, d) == 0, "tensor %s whole", names[t]);
        free(d);
        /* another layout: split the last dim in 3, each third's box cut in 4 flat ranges */
        int ld = ndims[t] - 1;
        for (int part = 0; part < 3; part++) {
            if (shapes[t][ld] < 3) continue;
            shard_spec_t b = shard_split(&w, ld, SHARD_GROUP_TP, part, 3, 1);
            int64_t bn = shard_numel(&b);
            for (int q = 0; q < 4; q++) {
                int64_t s0 = bn * q / 4, s1 = bn * (q + 1) / 4;
                shard_spec_t f = shard_flat(&b, SHARD_GROUP_DP, q, 4, s0, s1 - s0);
                float *fd = calloc((size_t)(s1 - s0) + 1, sizeof *fd);
                CHECK_MSG(ckpt_read(r, names[t], &f, fd, err, sizeof err) == BT_OK, "%s", err);
                CHECK_MSG(piece_wrong(t, &f, fd) == 0, "tensor %s third %d quarter %d", names[t], part, q);
                free(fd);
            }
        }
    }
    shard_spec_t w = whole_of(0);
    float one[60];
    CHECK(ckpt_read(r, "model.nothere", &w, one, err, sizeof err) == BT_ERR_NOT_FOUND && strstr(err, "model.nothere"));
    shard_spec_t other = whole_of(1);
    CHECK(ckpt_read(r, names[0], &other, one, err, sizeof err) == BT_ERR_INVALID);
    ckpt_reader_close(r);
}

static void test_reshard_roundtrip(void)
{
    mkdtemp_into(g_dir, sizeof g_dir, "a");
    save_a(g_dir, NULL);
    const char *dirs[] = {g_dir};
    read_all(dirs, 1);
    /* the index text reads back as it was written */
    ckpt_index_t a, b;
    char err[256];
    REQUIRE(ckpt_index_read(g_dir, &a, err, sizeof err) == BT_OK);
    char *t1 = ckpt_index_dump(&a);
    REQUIRE(ckpt_index_parse(t1, strlen(t1), "dump", &b, err, sizeof err) == BT_OK);
    char *t2 = ckpt_index_dump(&b);
    CHECK(!strcmp(t1, t2));
    int empty = 0;
    for (int k = 0; k < b.tensors[0].n_pieces; k++) empty += b.tensors[0].pieces[k].spec.flat_len == 0;
    CHECK(a.tensors[0].n_pieces == 6 && empty == 2 && ckpt_index_find(&b, "model.z")->n_pieces == 1);
    free(t1), free(t2);
    ckpt_index_free(&a), ckpt_index_free(&b);
}

/* Shard files in two directories, as two nodes keep them. */
static void test_two_directories(void)
{
    char d0[256], d1[256], err[256] = "";
    mkdtemp_into(d0, sizeof d0, "n0");
    mkdtemp_into(d1, sizeof d1, "n1");
    save_a(d0, d1);
    const char *both[] = {d0, d1}, *rev[] = {d1, d0}, *one[] = {d0};
    read_all(both, 2);
    read_all(rev, 2); /* the index found in the second directory */
    ckpt_reader_t *r;
    REQUIRE(ckpt_reader_open(one, 1, &r, err, sizeof err) == BT_OK);
    shard_spec_t w = whole_of(0);
    float d[60];
    CHECK(ckpt_read(r, names[0], &w, d, err, sizeof err) == BT_ERR_NOT_FOUND && strstr(err, "shard-r1.safetensors"));
    ckpt_reader_close(r);
    const char *none[] = {d1};
    base_dir_clear(d1);
    CHECK(ckpt_reader_open(none, 1, &r, err, sizeof err) == BT_ERR_NOT_FOUND && strstr(err, "index.json"));
    base_dir_clear(d0);
    rmdir(d0), rmdir(d1);
}

static char *slurp(const char *path, size_t *len)
{
    char *t = NULL;
    if (base_file_read(path, 1 << 24, &t, len) != BT_OK) abort();
    return t;
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "we");
    REQUIRE(f);
    fputs(text, f);
    fclose(f);
}

/* The index text with the first `from` replaced by `to`. */
static char *replaced(const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    if (!at) {
        fprintf(stderr, "test: '%s' is not in the index\n", from);
        abort();
    }
    size_t n = strlen(text) - strlen(from) + strlen(to);
    char *out = malloc(n + 1);
    size_t head = (size_t)(at - text);
    memcpy(out, text, head);
    strcpy(out + head, to);
    strcat(out, at + strlen(from));
    return out;
}

static bt_status_t parse_text(const char *text, char *err, size_t cap)
{
    ckpt_index_t idx;
    bt_status_t st = ckpt_index_parse(text, strlen(text), "index", &idx, err, cap);
    if (st == BT_OK) {
        st = ckpt_index_check(&idx, err, cap);
        ckpt_index_free(&idx);
    }
    return st;
}

static void test_index_refusals(void)
{
    char path[300], err[256];
    snprintf(path, sizeof path, "%s/index.json", g_dir);
    size_t len;
    char *text = slurp(path, &len);
    CHECK(parse_text(text, err, sizeof err) == BT_OK);
    struct { const char *from, *to, *says; bt_status_t st; } bad[] = {
        {"\"version\":1", "\"version\":2", "newer than this build", BT_ERR_UNSUPPORTED},
        {"\"version\":1", "\"version\":0", "positive integer", BT_ERR_CORRUPT},
        {"baton-checkpoint", "baton-checkpoinx", "magic", BT_ERR_CORRUPT},
        {"\"dtype\":\"F32\"", "\"dtype\":\"F33\"", "dtype", BT_ERR_CORRUPT},
        {"\"file\":0", "\"file\":7", "not in 'files'", BT_ERR_CORRUPT},
        {"\"start\":[0,0]", "\"start\":[5,0]", "beyond the global", BT_ERR_CORRUPT},
        {"\"flat\":[0,7]", "\"flat\":[0,31]", "inside its box", BT_ERR_CORRUPT},
        {"\"flat\":[0,7]", "\"flat\":[1,6]", "in no piece", BT_ERR_CORRUPT},
        {"\"flat\":[7,0]", "\"flat\":[6,1]", "in two pieces", BT_ERR_CORRUPT},
        {"\"shape\":[6,10]", "\"shape\":[6,10,1,1,1]", "shape", BT_ERR_CORRUPT},
        {"\"shape\":[6,10]", "\"shape\":[6,-10]", "shape", BT_ERR_CORRUPT},
        {"shard-r0.safetensors", "../r0.safetensors", "plain", BT_ERR_CORRUPT},
        {"\"offset\":", "\"offset\":-", "negative offset", BT_ERR_CORRUPT},
        {"\"xxh3\":\"", "\"xxh3\":\"z", "hex", BT_ERR_CORRUPT},
        {"{", "[", "not JSON", BT_ERR_CORRUPT},
        {"\"meta\":{", "\"meta\":[{", "JSON", BT_ERR_CORRUPT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *t = replaced(text, bad[i].from, bad[i].to);
        err[0] = 0;
        bt_status_t st = parse_text(t, err, sizeof err);
        CHECK_MSG(st == bad[i].st && strstr(err, bad[i].says), "case %zu (%s): %s '%s'", i, bad[i].to,
                  bt_status_str(st), err);
        free(t);
    }
    CHECK(parse_text("", err, sizeof err) == BT_ERR_CORRUPT && strstr(err, "not JSON"));
    CHECK(parse_text("[1]", err, sizeof err) == BT_ERR_CORRUPT && strstr(err, "not a baton"));
    free(text);
}

static void copy_file(const char *from, const char *to)
{
    size_t n;
    char *t = slurp(from, &n);
    FILE *f = fopen(to, "wbe");
    REQUIRE(f && fwrite(t, 1, n, f) == n);
    fclose(f);
    free(t);
}

/* Damaged shard files are refused before their bytes are used. */
static void test_damaged_files(void)
{
    char file[300], keep[300], err[256];
    snprintf(file, sizeof file, "%s/shard-r1.safetensors", g_dir);
    snprintf(keep, sizeof keep, "%s/keep", g_dir);
    copy_file(file, keep);
    const char *dirs[] = {g_dir};
    shard_spec_t w = whole_of(0);
    float d[60];
    struct stat sb;
    REQUIRE(stat(file, &sb) == 0);
    for (int kind = 0; kind < 3; kind++) {
        copy_file(keep, file);
        if (kind == 0) REQUIRE(truncate(file, sb.st_size - 5) == 0);
        if (kind == 1 || kind == 2) { /* one byte of data changed, or of the header */
            int fd = open(file, O_RDWR);
            off_t at = kind == 1 ? sb.st_size - 3 : 12;
            char c;
            REQUIRE(pread(fd, &c, 1, at) == 1);
            c ^= 1;
            REQUIRE(pwrite(fd, &c, 1, at) == 1);
            close(fd);
        }
        ckpt_reader_t *r;
        REQUIRE(ckpt_reader_open(dirs, 1, &r, err, sizeof err) == BT_OK);
        err[0] = 0;
        bt_status_t st = ckpt_read(r, names[0], &w, d, err, sizeof err);
        const char *want = kind == 0 ? "the index says" : "checksum";
        CHECK_MSG(st == BT_ERR_CORRUPT && strstr(err, "shard-r1.safetensors") && strstr(err, want), "kind %d: %s '%s'",
                  kind, bt_status_str(st), err);
        ckpt_reader_close(r);
    }
    copy_file(keep, file);
    /* an index whose piece names a key the file does not have */
    char ipath[300];
    snprintf(ipath, sizeof ipath, "%s/index.json", g_dir);
    size_t n;
    char *text = slurp(ipath, &n), *t = replaced(text, "\"model.w#0\"", "\"model.w#9\"");
    put(ipath, t);
    ckpt_reader_t *r;
    REQUIRE(ckpt_reader_open(dirs, 1, &r, err, sizeof err) == BT_OK);
    CHECK(ckpt_read(r, names[0], &w, d, err, sizeof err) == BT_ERR_CORRUPT && strstr(err, "does not match the index"));
    ckpt_reader_close(r);
    put(ipath, text);
    free(text), free(t);
    unlink(keep);
    base_dir_clear(g_dir);
    rmdir(g_dir);
}

/* The writer refuses what it cannot store and names it. */
static void test_writer_refusals(void)
{
    char dir[256], err[256];
    mkdtemp_into(dir, sizeof dir, "w");
    ckpt_index_t idx = {0};
    float x[4] = {1, 2, 3, 4};
    shard_spec_t s = shard_whole(1, (int64_t[]){4});
    ckpt_put_t p = {.tensor = "t", .dtype = DT_F32, .spec = s, .data = x};
    CHECK(ckpt_shard_write(&idx, dir, "a/b", &p, 1, err, sizeof err) == BT_ERR_INVALID);
    CHECK(ckpt_shard_write(&idx, dir, "a.safetensors", &p, 1, err, sizeof err) == BT_OK);
    CHECK(ckpt_shard_write(&idx, dir, "a.safetensors", &p, 1, err, sizeof err) == BT_ERR_INVALID && strstr(err, "twice"));
    float y[5] = {1, 2, 3, 4, 5};
    ckpt_put_t q = {.tensor = "t", .dtype = DT_F32, .spec = shard_whole(1, (int64_t[]){5}), .data = y};
    CHECK(ckpt_shard_write(&idx, dir, "b.safetensors", &q, 1, err, sizeof err) == BT_ERR_INVALID &&
          strstr(err, "two dtypes or global shapes"));
    char bpath[300];
    snprintf(bpath, sizeof bpath, "%s/b.safetensors", dir);
    CHECK(access(bpath, F_OK) != 0); /* refused before anything was written */
    ckpt_put_t two[2] = {q, q};
    two[1].dtype = DT_F64;
    CHECK(ckpt_shard_write(&idx, dir, "c.safetensors", two, 2, err, sizeof err) == BT_ERR_INVALID);
    CHECK(idx.n_files == 1);
    ckpt_index_free(&idx);
    base_dir_clear(dir);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_reshard_roundtrip, test_two_directories, test_index_refusals,
             test_damaged_files, test_writer_refusals);
}
