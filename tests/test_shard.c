/* Token shards: round trip, every corruption the reader must refuse, and
 * `baton data prepare` (chunked) against the HF ids of the Austen corpus. */
#include "data/shard.h"
#include "data/tokenizer.h"
#include "launch/cli.h"
#include "tests/test.h"

#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIR_BASE "build/test-shard"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static void rm_dir(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* Writes n random ids < vocab as a set of shards of shard_tokens each, with
 * two input marks; returns the ids. */
static uint32_t *make_set(const char *dir, uint32_t vocab, size_t n, uint64_t shard_tokens)
{
    rm_dir(dir);
    mkdir("build", 0755);
    uint32_t *ids = malloc(n * sizeof *ids);
    for (size_t i = 0; i < n; i++) ids[i] = rng_u32() % vocab;
    shard_writer_t *w = NULL;
    if (shard_writer_open(dir, vocab, 0x1234abcdull, -1, 7, shard_tokens, &w) != BT_OK) {
        free(ids);
        return NULL;
    }
    /* appended in uneven pieces so that pieces straddle shard boundaries */
    size_t pos = 0, step = 1;
    while (pos < n) {
        size_t take = step < n - pos ? step : n - pos;
        if (shard_writer_append(w, ids + pos, take) != BT_OK) break;
        pos += take;
        step = step * 3 + 1;
        if (pos >= n / 2 && pos - take < n / 2) shard_writer_mark_input(w, "first", 10);
    }
    shard_writer_mark_input(w, "second", 20);
    if (shard_writer_close(w) != BT_OK || pos != n) {
        free(ids);
        return NULL;
    }
    return ids;
}

static void check_roundtrip(uint32_t vocab)
{
    const size_t n = 10007;
    uint32_t *ids = make_set(DIR_BASE "-rt", vocab, n, 1000);
    REQUIRE(ids != NULL);
    shard_set_t *set = NULL;
    REQUIRE(shard_set_open(DIR_BASE "-rt", &set) == BT_OK);
    CHECK(shard_set_count(set) == n);
    CHECK(shard_set_vocab_size(set) == vocab);
    CHECK(shard_set_tokenizer_hash(set) == 0x1234abcdull);
    uint32_t *out = malloc(n * sizeof *out);
    CHECK(shard_set_tokens(set, 0, n, out) == BT_OK);
    CHECK(!memcmp(out, ids, n * sizeof *ids));
    /* ranges inside one shard, across one and across many boundaries */
    static const size_t ranges[][2] = {{0, 1}, {999, 2}, {1000, 1000}, {1500, 3000}, {10006, 1},
                                       {10007, 0}, {3, 10004}};
    for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
        memset(out, 0xff, n * sizeof *out);
        CHECK(shard_set_tokens(set, ranges[r][0], ranges[r][1], out) == BT_OK);
        CHECK_MSG(!memcmp(out, ids + ranges[r][0], ranges[r][1] * sizeof *ids), "range %zu", r);
    }
    CHECK(shard_set_tokens(set, n - 5, 6, out) == BT_ERR_INVALID);
    CHECK(shard_set_tokens(set, n + 1, 0, out) == BT_ERR_INVALID);
    /* file size tells the dtype */
    struct stat sb;
    CHECK(stat(DIR_BASE "-rt/shard_00000.bin", &sb) == 0);
    CHECK((size_t)sb.st_size == SHARD_HEADER_BYTES + 1000 * (vocab <= 65536 ? 2 : 4));
    json_t *idx = json_load_file(DIR_BASE "-rt/index.json", 0, NULL);
    CHECK(idx && json_array_size(json_object_get(idx, "shards")) == 11);
    CHECK(idx && json_integer_value(json_object_get(idx, "eos")) == 7);
    json_t *in = json_array_get(json_object_get(idx, "inputs"), 1);
    CHECK(json_integer_value(json_object_get(in, "first_token")) +
          json_integer_value(json_object_get(in, "tokens")) == (json_int_t)n);
    json_decref(idx);
    free(out);
    free(ids);
    shard_set_close(set);
}

static void test_roundtrip_u16(void) { check_roundtrip(50000); }
static void test_roundtrip_u32(void) { check_roundtrip(151936); }

/* Applies fn to one shard file of a fresh set; the set must then be refused. */
static void check_corrupt(const char *what, void (*fn)(const char *path), bt_status_t want)
{
    uint32_t *ids = make_set(DIR_BASE "-bad", 1000, 3000, 1000);
    REQUIRE(ids != NULL);
    free(ids);
    fn(DIR_BASE "-bad/shard_00001.bin");
    shard_set_t *set = NULL;
    bt_status_t st = shard_set_open(DIR_BASE "-bad", &set);
    CHECK_MSG(st == want, "%s: got %s, want %s", what, bt_status_str(st), bt_status_str(want));
    if (st == BT_OK) shard_set_close(set);
}

static void patch_byte(const char *path, long off, uint8_t x)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    uint8_t b = 0;
    CHECK(pread(fd, &b, 1, off) == 1);
    b ^= x;
    CHECK(pwrite(fd, &b, 1, off) == 1);
    close(fd);
}

static void do_truncate_payload(const char *p) { CHECK(truncate(p, SHARD_HEADER_BYTES + 100) == 0); }
static void do_truncate_header(const char *p) { CHECK(truncate(p, 20) == 0); }
static void do_trailing(const char *p)
{
    FILE *f = fopen(p, "abe");
    fputc(0, f);
    fputc(0, f);
    fclose(f);
}
static void do_magic(const char *p) { patch_byte(p, 0, 0x20); }
static void do_version(const char *p) { patch_byte(p, 8, 0x02); }
static void do_width(const char *p) { patch_byte(p, 16, 0x01); }
static void do_payload(const char *p) { patch_byte(p, SHARD_HEADER_BYTES + 777, 0x10); }
static void do_checksum(const char *p) { patch_byte(p, 32, 0x01); }
static void do_tokhash(const char *p) { patch_byte(p, 40, 0x01); }
static void do_missing(const char *p) { CHECK(unlink(p) == 0); }
/* a valid shard of another set in its place: only the index can tell */
static void do_swap(const char *p)
{
    uint32_t ids[1000];
    for (int i = 0; i < 1000; i++) ids[i] = (uint32_t)i;
    CHECK(shard_file_write(p, ids, 1000, 1000, 0x1234abcdull) == BT_OK);
}

static void test_corrupt_truncated(void)
{
    check_corrupt("payload truncated", do_truncate_payload, BT_ERR_CORRUPT);
    check_corrupt("header truncated", do_truncate_header, BT_ERR_CORRUPT);
    check_corrupt("trailing bytes", do_trailing, BT_ERR_CORRUPT);
}
static void test_corrupt_magic(void) { check_corrupt("magic", do_magic, BT_ERR_CORRUPT); }
static void test_corrupt_version(void) { check_corrupt("version", do_version, BT_ERR_UNSUPPORTED); }
static void test_corrupt_width(void) { check_corrupt("token width", do_width, BT_ERR_CORRUPT); }
static void test_corrupt_checksum(void)
{
    check_corrupt("payload bit flip", do_payload, BT_ERR_CORRUPT);
    check_corrupt("checksum field", do_checksum, BT_ERR_CORRUPT);
}
static void test_corrupt_index_mismatch(void)
{
    check_corrupt("tokenizer hash", do_tokhash, BT_ERR_CORRUPT);
    check_corrupt("swapped shard", do_swap, BT_ERR_CORRUPT);
    check_corrupt("missing shard", do_missing, BT_ERR_NOT_FOUND);
}
static void test_corrupt_index_json(void)
{
    uint32_t *ids = make_set(DIR_BASE "-bad", 1000, 3000, 1000);
    REQUIRE(ids != NULL);
    free(ids);
    CHECK(truncate(DIR_BASE "-bad/index.json", 40) == 0);
    shard_set_t *set = NULL;
    CHECK(shard_set_open(DIR_BASE "-bad", &set) == BT_ERR_CORRUPT);
    CHECK(shard_set_open(DIR_BASE "-nothing-here", &set) == BT_ERR_NOT_FOUND);
}

/* Any change to a header field is caught (by the header checks, the size,
 * the checksum or the index); the reserved bytes 48..63 are free. */
static void test_corrupt_every_header_byte(void)
{
    uint32_t *ids = make_set(DIR_BASE "-hdr", 1000, 2500, 1000);
    REQUIRE(ids != NULL);
    free(ids);
    const char *path = DIR_BASE "-hdr/shard_00001.bin";
    for (long off = 0; off < (long)SHARD_HEADER_BYTES; off++) {
        for (int bit = 0; bit < 8; bit += 3) {
            patch_byte(path, off, (uint8_t)(1u << bit));
            shard_set_t *set = NULL;
            bt_status_t st = shard_set_open(DIR_BASE "-hdr", &set);
            if (off < 48) CHECK_MSG(st != BT_OK, "header byte %ld bit %d not caught", off, bit);
            else CHECK_MSG(st == BT_OK, "reserved byte %ld refused", off);
            shard_set_close(set);
            patch_byte(path, off, (uint8_t)(1u << bit)); /* restore */
        }
    }
    shard_set_t *set = NULL;
    CHECK(shard_set_open(DIR_BASE "-hdr", &set) == BT_OK);
    shard_set_close(set);
    rm_dir(DIR_BASE "-hdr");
}

/* `baton data prepare` with small chunks and shards gives exactly the HF ids
 * of the whole train split (fixture digest), plus the EOS after it. */
static void test_prepare_chunked_matches_hf(void)
{
    REQUIRE(system("tools/fetch_austen.sh >/dev/null") == 0);
    rm_dir(DIR_BASE "-prep");
    char *argv[] = {"data", "prepare", "--tokenizer", "tests/fixtures/tok/llama3",
                    "--input", "data/austen/train.txt", "--output", DIR_BASE "-prep",
                    "--chunk-bytes", "65536", "--shard-tokens", "100000", "--quiet", NULL};
    REQUIRE(cmd_data(13, argv) == 0);
    shard_set_t *set = NULL;
    REQUIRE(shard_set_open(DIR_BASE "-prep", &set) == BT_OK);
    json_t *ref = json_load_file("tests/fixtures/tok/llama3/corpus.json", 0, NULL);
    REQUIRE(ref != NULL);
    json_t *train = json_object_get(ref, "train");
    size_t want_n = (size_t)json_integer_value(json_object_get(train, "tokens"));
    uint64_t n = shard_set_count(set);
    CHECK_MSG(n == want_n + 1, "%llu tokens, HF %zu + EOS", (unsigned long long)n, want_n);
    uint32_t *ids = malloc((size_t)n * sizeof *ids);
    CHECK(shard_set_tokens(set, 0, (size_t)n, ids) == BT_OK);
    tok_t *tok = NULL;
    REQUIRE(tok_load("tests/fixtures/tok/llama3", &tok) == BT_OK);
    CHECK(ids[n - 1] == (uint32_t)tok_special(tok).eos);
    CHECK(shard_set_tokenizer_hash(set) == tok_hash(tok));
    unsigned char md[32];
    unsigned int mdlen;
    uint8_t *le = malloc((size_t)n * 4);
    for (size_t i = 0; i + 1 < n; i++)
        for (int b = 0; b < 4; b++) le[4 * i + (size_t)b] = (uint8_t)(ids[i] >> (8 * b));
    EVP_Digest(le, (size_t)(n - 1) * 4, md, &mdlen, EVP_sha256(), NULL);
    char hex[65];
    for (int i = 0; i < 32; i++) sprintf(hex + 2 * i, "%02x", md[i]);
    const char *want = json_string_value(json_object_get(train, "sha256_u32le"));
    CHECK_MSG(want && !strcmp(hex, want), "chunked prepare ids differ from HF");
    free(le);
    free(ids);
    tok_free(tok);
    json_decref(ref);
    shard_set_close(set);
    rm_dir(DIR_BASE "-prep");
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_roundtrip_u16, test_roundtrip_u32, test_corrupt_truncated,
             test_corrupt_magic, test_corrupt_version, test_corrupt_width, test_corrupt_checksum,
             test_corrupt_index_mismatch, test_corrupt_index_json, test_corrupt_every_header_byte,
             test_prepare_chunked_matches_hf);
}
