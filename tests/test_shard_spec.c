/* Shard specs (base/shard_spec.h): splits cover a tensor exactly once, slicing
 * and assembling are inverse, and any layout's pieces load into any other's
 * by copying what overlaps (the resharding a checkpoint load does). Every
 * result is compared element by element with the whole tensor. */
#include "base/shard_spec.h"
#include "tests/test.h"

#include <stdint.h>

/* value of global element i: its own index, so a misplaced copy shows */
static float *whole_values(int64_t n)
{
    float *w = malloc((size_t)n * sizeof *w);
    for (int64_t i = 0; i < n; i++) w[i] = (float)i;
    return w;
}

/* piece data must hold exactly its elements of the whole */
static int piece_wrong(const shard_spec_t *s, const float *data)
{
    int bad = 0;
    for (int64_t k = 0; k < shard_numel(s); k++) bad += data[k] != (float)shard_global_index(s, k);
    return bad;
}

static void test_split_covers_once(void)
{
    const int64_t shape[3] = {10, 12, 6};
    shard_spec_t w = shard_whole(3, shape);
    for (int dim = 0; dim < 3; dim++)
        for (int size = 1; size <= 5; size++) {
            int64_t unit = dim == 1 ? 2 : 1, sum = 0, next = 0;
            for (int r = 0; r < size; r++) {
                shard_spec_t p = shard_split(&w, dim, SHARD_GROUP_TP, r, size, unit);
                CHECK(p.offset[dim] == next);
                CHECK(p.extent[dim] % unit == 0);
                next += p.extent[dim];
                sum += shard_numel(&p);
                /* near-even: sizes differ by at most one unit */
                int64_t lo = shape[dim] / unit / size * unit;
                CHECK(p.extent[dim] == lo || p.extent[dim] == lo + unit);
            }
            CHECK(next == shape[dim]);
            CHECK(sum == shard_global_numel(&w));
        }
}

static void test_slice_assemble_roundtrip(void)
{
    const int64_t shape[2] = {7, 9};
    shard_spec_t w = shard_whole(2, shape);
    float *whole = whole_values(63), *back = calloc(63, sizeof *back);
    for (int dim = 0; dim < 2; dim++) {
        memset(back, 0, 63 * sizeof *back);
        int64_t copied = 0;
        for (int r = 0; r < 3; r++) {
            shard_spec_t p = shard_split(&w, dim, SHARD_GROUP_TP, r, 3, 1);
            float *buf = malloc((size_t)shard_numel(&p) * sizeof *buf);
            CHECK(shard_copy(&p, buf, &w, whole, sizeof(float)) == shard_numel(&p));
            CHECK(piece_wrong(&p, buf) == 0);
            copied += shard_copy(&w, back, &p, buf, sizeof(float));
            free(buf);
        }
        CHECK(copied == 63);
        CHECK(!memcmp(back, whole, 63 * sizeof *back));
    }
    free(whole), free(back);
}

/* tp=3 column pieces, each ZeRO-partitioned in 2 flat ranges, load into
 * tp=2 row pieces without ever assembling the whole tensor. */
static void test_reshard_any_to_any(void)
{
    const int64_t shape[2] = {8, 12};
    shard_spec_t w = shard_whole(2, shape);
    float *whole = whole_values(96);
    shard_spec_t stored[6];
    float *sdata[6];
    int ns = 0;
    for (int r = 0; r < 3; r++) {
        shard_spec_t tp = shard_split(&w, 1, SHARD_GROUP_TP, r, 3, 1);
        int64_t n = shard_numel(&tp), half = n / 2 + 1;
        for (int z = 0; z < 2; z++) {
            int64_t start = z ? half : 0, len = z ? n - half : half;
            stored[ns] = shard_flat(&tp, SHARD_GROUP_DP, z, 2, start, len);
            sdata[ns] = malloc((size_t)len * sizeof(float));
            CHECK(shard_copy(&stored[ns], sdata[ns], &w, whole, sizeof(float)) == len);
            CHECK(piece_wrong(&stored[ns], sdata[ns]) == 0);
            ns++;
        }
    }
    for (int r = 0; r < 2; r++) {
        shard_spec_t want = shard_split(&w, 0, SHARD_GROUP_TP, r, 2, 1);
        float *buf = calloc((size_t)shard_numel(&want), sizeof *buf);
        int64_t got = 0;
        for (int k = 0; k < ns; k++) got += shard_copy(&want, buf, &stored[k], sdata[k], 4);
        CHECK(got == shard_numel(&want));
        CHECK(piece_wrong(&want, buf) == 0);
        free(buf);
    }
    for (int k = 0; k < ns; k++) free(sdata[k]);
    free(whole);
}

static void count_run(void *arg, int64_t s, int64_t d, int64_t n)
{
    (void)s, (void)d, (void)n;
    (*(int64_t *)arg)++;
}

static void test_overlap_and_runs(void)
{
    const int64_t shape[2] = {6, 10};
    shard_spec_t w = shard_whole(2, shape);
    shard_spec_t rows = shard_split(&w, 0, SHARD_GROUP_TP, 1, 2, 1); /* rows 3..6 */
    shard_spec_t cols = shard_split(&w, 1, SHARD_GROUP_TP, 0, 2, 1); /* cols 0..5 */
    shard_spec_t box;
    REQUIRE(shard_overlap(&rows, &cols, &box));
    CHECK(box.offset[0] == 3 && box.extent[0] == 3 && box.offset[1] == 0 && box.extent[1] == 5);
    shard_spec_t other = shard_split(&w, 0, SHARD_GROUP_TP, 0, 2, 1);
    CHECK(!shard_overlap(&rows, &other, NULL));
    /* global indices, worked by hand: piece element k -> row-major index in [6, 10] */
    CHECK(shard_global_index(&rows, 0) == 30 && shard_global_index(&rows, 11) == 41);
    CHECK(shard_global_index(&cols, 7) == 12 && shard_global_index(&cols, 29) == 54);
    shard_spec_t part = shard_flat(&cols, SHARD_GROUP_DP, 1, 2, 3, 10);
    CHECK(shard_global_index(&part, 4) == 12); /* box element 7: row 1, column 2 */
    /* a row piece read from the whole is one contiguous run, a column piece
     * one run per row */
    int64_t runs = 0;
    shard_spec_t *cases[2] = {&rows, &cols};
    int64_t want_runs[2] = {1, 6};
    for (int c = 0; c < 2; c++) {
        runs = 0;
        CHECK(shard_runs(cases[c], &w, count_run, &runs) == shard_numel(cases[c]));
        CHECK_MSG(runs == want_runs[c], "case %d: %lld runs", c, (long long)runs);
    }
    char buf[SHARD_STR_MAX];
    CHECK(!strcmp(shard_str(&cols, buf), "tp 0/2 [0:6, 0:5] of [6, 10]"));
}

static void test_1d_and_4d(void)
{
    const int64_t s1[1] = {11}, s4[4] = {2, 3, 4, 5};
    shard_spec_t w1 = shard_whole(1, s1), w4 = shard_whole(4, s4);
    float *v1 = whole_values(11), *v4 = whole_values(120);
    shard_spec_t p1 = shard_split(&w1, 0, SHARD_GROUP_EP, 2, 4, 1);
    float b1[4];
    CHECK(shard_copy(&p1, b1, &w1, v1, 4) == shard_numel(&p1) && piece_wrong(&p1, b1) == 0);
    shard_spec_t p4 = shard_split(&w4, 2, SHARD_GROUP_CP, 1, 2, 1);
    p4 = shard_split(&p4, 3, SHARD_GROUP_TP, 0, 2, 1); /* split twice: cp then tp */
    float b4[120];
    CHECK(shard_copy(&p4, b4, &w4, v4, 4) == 2 * 3 * 2 * 3 && piece_wrong(&p4, b4) == 0);
    free(v1), free(v4);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_split_covers_once, test_slice_assemble_roundtrip,
             test_reshard_any_to_any, test_overlap_and_runs, test_1d_and_4d);
}
