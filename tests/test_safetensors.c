/* safetensors reader/writer: round trip of every dtype we hold, conversion to
 * f32, and rejection of corrupt headers and truncated files. */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/safetensors.h"
#include "tests/test.h"

static char tmpdir[64];

static void tmpdir_make(void)
{
    if (tmpdir[0]) return;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/bt_st_XXXXXX");
    if (!mkdtemp(tmpdir)) abort();
}

static void test_st_roundtrip(void)
{
    tmpdir_make();
    char path[128];
    snprintf(path, sizeof path, "%s/rt.safetensors", tmpdir);
    float f32[12];
    for (int i = 0; i < 12; i++) f32[i] = (float)i * 0.25f - 1.0f;
    const float small[5] = {1.5f, -2.25f, 0.0f, 65504.0f, -0.125f}; /* exact in f16 and bf16 */
    uint16_t f16[5], bf16[4];
    for (int i = 0; i < 5; i++) f16[i] = f32_to_f16(small[i]);
    const float bsmall[4] = {1.5f, -2.25f, 3.0e38f, -0.125f}; /* exact in bf16 */
    for (int i = 0; i < 4; i++) bf16[i] = f32_to_bf16(bsmall[i]);
    int32_t i32[3] = {-7, 0, 123456};
    double f64[1] = {3.141592653589793};
    ckpt_st_entry_t e[] = {
        {"a.weight", tensor_2d(f32, DT_F32, 3, 4)},
        {"b.half", tensor_1d(f16, DT_F16, 5)},
        {"c.bf", tensor_2d(bf16, DT_BF16, 2, 2)},
        {"d.ints", tensor_1d(i32, DT_I32, 3)},
        {"e.scalar", tensor_1d(f64, DT_F64, 1)},
    };
    const char *meta[] = {"format", "pt", "step", "7"};
    REQUIRE(ckpt_st_write(path, e, 5, meta, 2) == BT_OK);
    ckpt_st_file_t *f = NULL;
    REQUIRE(ckpt_st_open(path, &f) == BT_OK);
    CHECK(f->n == 5);
    for (int i = 0; i < 5; i++) {
        const ckpt_st_tensor_t *t = ckpt_st_find(f, e[i].name);
        REQUIRE(t != NULL);
        CHECK(t->dtype == e[i].t.dtype);
        CHECK(t->ndim == e[i].t.ndim);
        for (int d = 0; d < t->ndim; d++) CHECK(t->shape[d] == e[i].t.shape[d]);
        CHECK(memcmp(t->data, e[i].t.data, tensor_nbytes(&e[i].t)) == 0);
    }
    CHECK(((uintptr_t)f->data - (uintptr_t)f->map) % 8 == 0); /* padded header */
    float out[12];
    REQUIRE(ckpt_st_read_f32(f, ckpt_st_find(f, "a.weight"), out) == BT_OK);
    CHECK(memcmp(out, f32, sizeof f32) == 0);
    REQUIRE(ckpt_st_read_f32(f, ckpt_st_find(f, "b.half"), out) == BT_OK);
    for (int i = 0; i < 5; i++) CHECK(out[i] == small[i]);
    REQUIRE(ckpt_st_read_f32(f, ckpt_st_find(f, "c.bf"), out) == BT_OK);
    for (int i = 0; i < 4; i++) CHECK(out[i] == bf16_to_f32(bf16[i]));
    CHECK(out[0] == 1.5f && out[1] == -2.25f && out[3] == -0.125f);
    CHECK(fabsf(out[2] - 3.0e38f) <= 3.0e38f / 256);
    REQUIRE(ckpt_st_read_f32(f, ckpt_st_find(f, "e.scalar"), out) == BT_OK);
    CHECK(out[0] == (float)f64[0]);
    CHECK(ckpt_st_read_f32(f, ckpt_st_find(f, "d.ints"), out) == BT_ERR_UNSUPPORTED);
    CHECK(ckpt_st_find(f, "nope") == NULL);
    ckpt_st_close(f);
    /* no temporary left behind: the directory holds the file only */
    DIR *dh = opendir(tmpdir);
    REQUIRE(dh);
    int entries = 0;
    for (struct dirent *d; (d = readdir(dh));)
        if (strcmp(d->d_name, ".") && strcmp(d->d_name, "..")) {
            entries++;
            CHECK_MSG(!strcmp(d->d_name, "rt.safetensors"), "left behind: %s", d->d_name);
        }
    closedir(dh);
    CHECK(entries == 1);
    unlink(path);
}

/* A file image: 8-byte length, header, data_len bytes of data. */
static uint8_t *image(const char *header, uint64_t claimed_len, size_t data_len, size_t *size)
{
    size_t hl = strlen(header);
    *size = 8 + hl + data_len;
    uint8_t *b = calloc(1, *size);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(claimed_len >> (8 * i));
    memcpy(b + 8, header, hl);
    return b;
}

static bt_status_t parse_header(const char *header, size_t data_len)
{
    size_t size;
    uint8_t *b = image(header, strlen(header), data_len, &size);
    ckpt_st_file_t *f = NULL;
    bt_status_t st = ckpt_st_parse(b, size, "test.safetensors", &f);
    if (st == BT_OK) ckpt_st_close(f);
    free(b);
    return st;
}

static void test_st_valid_header(void)
{
    CHECK(parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                       "\"__metadata__\":{\"format\":\"pt\"}}", 16) == BT_OK);
    CHECK(parse_header("{}", 0) == BT_OK); /* no tensors is a valid file */
    CHECK(parse_header("{\"s\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[0,2]}}", 2) ==
          BT_OK); /* scalar */
}

static void test_st_corrupt_headers(void)
{
    /* header length larger than the file */
    size_t size;
    uint8_t *b = image("{}", 1000, 0, &size);
    ckpt_st_file_t *f = NULL;
    CHECK(ckpt_st_parse(b, size, "t", &f) == BT_ERR_CORRUPT);
    free(b);
    b = image("{}", UINT64_MAX, 0, &size);
    CHECK(ckpt_st_parse(b, size, "t", &f) == BT_ERR_CORRUPT);
    free(b);
    uint8_t tiny[5] = {0};
    CHECK(ckpt_st_parse(tiny, sizeof tiny, "t", &f) == BT_ERR_CORRUPT);

    CHECK(parse_header("{\"a\":", 0) == BT_ERR_CORRUPT);                     /* bad JSON */
    CHECK(parse_header("[1,2]", 0) == BT_ERR_CORRUPT);                       /* not an object */
    CHECK(parse_header("{\"a\":3}", 0) == BT_ERR_CORRUPT);                   /* entry not object */
    CHECK(parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4) == BT_ERR_CORRUPT);
    CHECK(parse_header("{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4) ==
          BT_ERR_UNSUPPORTED); /* unknown dtype */
    CHECK(parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4) ==
          BT_ERR_CORRUPT); /* past the end: truncated */
    CHECK(parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 16) ==
          BT_ERR_CORRUPT); /* bytes do not match shape */
    CHECK(parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 16) ==
          BT_ERR_CORRUPT); /* begin > end */
    CHECK(parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 16) ==
          BT_ERR_CORRUPT); /* negative dim */
    CHECK(parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                       "\"data_offsets\":[0,4]}}", 16) == BT_ERR_CORRUPT); /* overflow */
    CHECK(parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 16) ==
          BT_ERR_CORRUPT); /* overlap */
    CHECK(parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8) ==
          BT_ERR_CORRUPT); /* duplicate name */
    CHECK(parse_header("{\"__metadata__\":[1]}", 0) == BT_ERR_CORRUPT);
}

static void test_st_truncated_file(void)
{
    tmpdir_make();
    char path[128];
    snprintf(path, sizeof path, "%s/tr.safetensors", tmpdir);
    float x[64] = {0};
    ckpt_st_entry_t e = {"x", tensor_1d(x, DT_F32, 64)};
    REQUIRE(ckpt_st_write(path, &e, 1, NULL, 0) == BT_OK);
    ckpt_st_file_t *f = NULL;
    REQUIRE(ckpt_st_open(path, &f) == BT_OK);
    off_t full = (off_t)f->map_size;
    ckpt_st_close(f);
    REQUIRE(truncate(path, full - 4) == 0); /* data cut short */
    CHECK(ckpt_st_open(path, &f) == BT_ERR_CORRUPT);
    REQUIRE(truncate(path, 20) == 0); /* header cut short */
    CHECK(ckpt_st_open(path, &f) == BT_ERR_CORRUPT);
    REQUIRE(truncate(path, 3) == 0);
    CHECK(ckpt_st_open(path, &f) == BT_ERR_CORRUPT);
    unlink(path);
    CHECK(ckpt_st_open(path, &f) == BT_ERR_NOT_FOUND);
    rmdir(tmpdir);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_st_roundtrip, test_st_valid_header, test_st_corrupt_headers,
             test_st_truncated_file);
}
