/* launch/trace_bubble: the pipeline bubble of hand-built traces whose
 * answers are worked out by hand (p = 2 stages, m = 4 microbatches, F = 1 ms,
 * B = 2 ms; schedules drawn in the comments). */
#include <math.h>
#include <string.h>

#include "trace/bubble.h"
#include "tests/test.h"

#define MS 1000000ull

typedef struct {
    char kind;  /* 'F' or 'B' */
    int  mb;
    int  t0, t1; /* ms within the step */
} op_t;

/* 1F1B, both stages busy 12 of the 15 ms window:
 *   stage 0: F0 0-1  F1 1-2  B0 4-6  F2 6-7  B1 7-9  F3 9-10 B2 10-12 B3 13-15
 *   stage 1: F0 1-2  B0 2-4  F1 4-5  B1 5-7  F2 7-8  B2 8-10 F3 10-11 B3 11-13 */
static const op_t s0_1f1b[] = {{'F', 0, 0, 1}, {'F', 1, 1, 2},  {'B', 0, 4, 6},   {'F', 2, 6, 7},
                               {'B', 1, 7, 9}, {'F', 3, 9, 10}, {'B', 2, 10, 12}, {'B', 3, 13, 15}};
static const op_t s1_1f1b[] = {{'F', 0, 1, 2}, {'B', 0, 2, 4},  {'F', 1, 4, 5},   {'B', 1, 5, 7},
                               {'F', 2, 7, 8}, {'B', 2, 8, 10}, {'F', 3, 10, 11}, {'B', 3, 11, 13}};
/* GPipe (all forwards, then all backwards): the same 0.2 bubble, another order. */
static const op_t s0_gpipe[] = {{'F', 0, 0, 1}, {'F', 1, 1, 2}, {'F', 2, 2, 3},   {'F', 3, 3, 4},
                                {'B', 0, 7, 9}, {'B', 1, 9, 11}, {'B', 2, 11, 13}, {'B', 3, 13, 15}};
static const op_t s1_gpipe[] = {{'F', 0, 1, 2}, {'F', 1, 2, 3}, {'F', 2, 3, 4},  {'F', 3, 4, 5},
                                {'B', 0, 5, 7}, {'B', 1, 7, 9}, {'B', 2, 9, 11}, {'B', 3, 11, 13}};

static char *names[] = {NULL, "fwd", "bwd", "optim"};
static char *actor_names[] = {"stage r0 pp0 dp0 tp0 v1", "stage r1 pp1 dp0 tp0 v1"};

/* One file per stage; steps 1..3 at 100 ms apart, an optimizer span after
 * each step (outside the window by definition). `stretch` adds ms of wall
 * time (not CPU time) to step 3's first op of stage 0, shifting nothing:
 * the window of step 3 then starts earlier. */
static void trace_build(trace_file_t f[2], trace_rec_t recs[2][64], actor_addr_t ids[2], const op_t *ops0,
                        const op_t *ops1, int stretch)
{
    const op_t *ops[2] = {ops0, ops1};
    for (int s = 0; s < 2; s++) {
        size_t n = 0;
        ids[s] = ACTOR_ADDR(s, 1);
        for (int step = 1; step <= 3; step++) {
            uint64_t base = (uint64_t)step * 100 * MS;
            for (int i = 0; i < 8; i++) {
                const op_t *o = &ops[s][i];
                uint64_t t0 = base + (uint64_t)o->t0 * MS, t1 = base + (uint64_t)o->t1 * MS;
                uint64_t cpu = t1 - t0;
                if (step == 3 && s == 0 && i == 0) t0 -= (uint64_t)stretch * MS;
                recs[s][n++] = (trace_rec_t){.ev = TRACE_EV_SPAN, .kind = TRACE_SPAN_COMPUTE, .msg_type = 0xffff,
                                             .actor = ids[s], .t0 = t0, .t1 = t1, .bytes = cpu, .step = step,
                                             .mb = o->mb, .name_id = o->kind == 'F' ? 1 : 2};
            }
            recs[s][n++] = (trace_rec_t){.ev = TRACE_EV_SPAN, .kind = TRACE_SPAN_COMPUTE, .msg_type = 0xffff,
                                         .actor = ids[s], .t0 = base + 16 * MS, .t1 = base + 20 * MS,
                                         .step = step, .mb = -1, .name_id = 3};
        }
        f[s] = (trace_file_t){.rank = (uint32_t)s, .recs = recs[s], .nrecs = n, .names = names, .nnames = 4,
                              .actor_ids = &ids[s], .actor_names = &actor_names[s], .nactors = 1,
                              .complete = true};
    }
}

/* The bubble report of the two-stage trace trace_build makes of ops0/ops1. */
static bool bubble_of(const op_t *ops0, const op_t *ops1, int stretch, trace_bubble_t *b)
{
    trace_file_t f[2];
    trace_rec_t recs[2][64];
    actor_addr_t ids[2];
    trace_build(f, recs, ids, ops0, ops1, stretch);
    trace_set_t set = {.files = f, .nfiles = 2};
    char err[128] = "";
    bt_status_t st = trace_bubble_compute(&set, b, err, sizeof err);
    if (st != BT_OK) fprintf(stderr, "trace_bubble_compute: %s\n", err);
    return st == BT_OK;
}

static void test_ideal_1f1b(void)
{
    trace_bubble_t b;
    REQUIRE(bubble_of(s0_1f1b, s1_1f1b, 0, &b));
    CHECK(b.p == 2 && b.m == 4 && b.vpp == 1 && b.nstages == 2);
    CHECK_NEAR(b.theory, 0.2, 0, 1e-12);
    for (int s = 0; s < 2; s++) {
        CHECK(b.stages[s].steps == 2); /* step 1 left out */
        CHECK_NEAR(b.stages[s].window_ms, 30.0, 0, 1e-9);
        CHECK_NEAR(b.stages[s].busy_ms, 24.0, 0, 1e-9);
        CHECK_NEAR(b.stages[s].bubble, 0.2, 0, 1e-12);
        CHECK_NEAR(b.stages[s].replay, 0.2, 0, 1e-12);
        CHECK_NEAR(b.stages[s].fwd_ms, 1.0, 0, 1e-12);
        CHECK_NEAR(b.stages[s].bwd_ms, 2.0, 0, 1e-12);
        CHECK(b.stages[s].order_1f1b);
    }
    CHECK_NEAR(b.bubble, 0.2, 0, 1e-12);
    CHECK(b.order_1f1b);
    trace_bubble_free(&b);
}

/* GPipe order: same bubble, but not the 1F1B order; the checker must say so. */
static void test_gpipe_order_flagged(void)
{
    trace_bubble_t b;
    REQUIRE(bubble_of(s0_gpipe, s1_gpipe, 0, &b));
    CHECK_NEAR(b.bubble, 0.2, 0, 1e-12);
    CHECK_NEAR(b.replay, 0.2, 0, 1e-12);
    CHECK(!b.stages[0].order_1f1b && !b.stages[1].order_1f1b && !b.order_1f1b);
    trace_bubble_free(&b);
}

/* A preempted op: 5 ms more wall time on step 3's first op of stage 0 (CPU
 * time unchanged). Window of step 3 = 20 ms; stage 0 busy 17, stage 1 busy
 * 12: measured (30/35 idle...) moves, the replay stays at the theory. */
static void test_preempted_op(void)
{
    trace_bubble_t b;
    REQUIRE(bubble_of(s0_1f1b, s1_1f1b, 5, &b));
    /* stage 0: windows 15 + 20, busy 12 + 17 -> idle 6 / 35 */
    CHECK_NEAR(b.stages[0].bubble, 6.0 / 35.0, 0, 1e-12);
    /* stage 1: busy 12 + 12 -> idle 11 / 35 */
    CHECK_NEAR(b.stages[1].bubble, 11.0 / 35.0, 0, 1e-12);
    CHECK_NEAR(b.replay, 0.2, 0, 1e-12);
    trace_bubble_free(&b);
}

static void test_no_pipeline(void)
{
    trace_rec_t r = {.ev = TRACE_EV_SPAN, .kind = TRACE_SPAN_COMPUTE, .actor = ACTOR_ADDR(0, 1), .t0 = 1, .t1 = 2,
                     .step = 1, .name_id = 1};
    actor_addr_t id = ACTOR_ADDR(0, 1);
    char *an[] = {"driver"};
    trace_file_t f = {.recs = &r, .nrecs = 1, .names = names, .nnames = 4, .actor_ids = &id, .actor_names = an,
                      .nactors = 1};
    trace_set_t set = {.files = &f, .nfiles = 1};
    trace_bubble_t b;
    char err[128] = "";
    CHECK(trace_bubble_compute(&set, &b, err, sizeof err) == BT_ERR_NOT_FOUND);
    CHECK(strstr(err, "no pipeline stage") != NULL);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_ideal_1f1b, test_gpipe_order_flagged, test_preempted_op, test_no_pipeline);
}
