/* Pipeline op lists: every (microbatch, chunk) runs F then B exactly once per
 * stage, the lists cannot deadlock, and the simulated bubble of 1F1B equals
 * the theory (p-1)/(m+p-1) exactly for equal per-stage costs. */
#include "train/pipe_schedule.h"
#include "tests/test.h"

static void check_lists(const pipe_config_t *cfg)
{
    int n = pipe_ops_per_stage(cfg);
    pipe_op_t *ops = malloc((size_t)n * sizeof *ops);
    for (int s = 0; s < cfg->pp; s++) {
        REQUIRE(pipe_schedule_build(cfg, s, ops) == BT_OK);
        int seenf[64][8] = {{0}}, seenb[64][8] = {{0}};
        for (int i = 0; i < n; i++) {
            REQUIRE(ops[i].mb >= 0 && ops[i].mb < cfg->microbatches);
            REQUIRE(ops[i].chunk >= 0 && ops[i].chunk < cfg->vpp);
            if (ops[i].kind == PIPE_OP_FWD) seenf[ops[i].mb][ops[i].chunk]++;
            else {
                CHECK(seenf[ops[i].mb][ops[i].chunk] == 1); /* F before B */
                seenb[ops[i].mb][ops[i].chunk]++;
            }
        }
        for (int mb = 0; mb < cfg->microbatches; mb++)
            for (int c = 0; c < cfg->vpp; c++) CHECK(seenf[mb][c] == 1 && seenb[mb][c] == 1);
    }
    free(ops);
}

static void test_1f1b_lists_and_bubble(void)
{
    for (int pp = 1; pp <= 8; pp++)
        for (int m = 1; m <= 12; m++) {
            pipe_config_t cfg = {PIPE_SCHED_1F1B, pp, 1, m};
            check_lists(&cfg);
            pipe_sim_t sim;
            REQUIRE(pipe_schedule_simulate(&cfg, 1.0, 2.0, &sim) == BT_OK);
            CHECK_NEAR(sim.bubble, pipe_bubble_theory(&cfg), 1e-12, 1e-12);
            CHECK_NEAR(sim.makespan, (m + pp - 1) * 3.0, 1e-12, 0);
            /* 1F1B holds at most pp - s microbatches on stage s */
            for (int s = 0; s < pp; s++) CHECK(sim.max_in_flight[s] <= (pp - s < m ? pp - s : m));
        }
}

static void test_1f1b_order_stage0(void)
{
    pipe_config_t cfg = {PIPE_SCHED_1F1B, 3, 1, 4};
    pipe_op_t ops[8];
    REQUIRE(pipe_schedule_build(&cfg, 0, ops) == BT_OK);
    /* F0 F1 F2 B0 F3 B1 B2 B3 */
    const char *want = "F0F1F2B0F3B1B2B3";
    char got[32] = "", *p = got;
    for (int i = 0; i < 8; i++) p += sprintf(p, "%c%d", ops[i].kind == PIPE_OP_FWD ? 'F' : 'B', ops[i].mb);
    CHECK_MSG(!strcmp(got, want), "got %s", got);
    REQUIRE(pipe_schedule_build(&cfg, 2, ops) == BT_OK);
    p = got;
    for (int i = 0; i < 8; i++) p += sprintf(p, "%c%d", ops[i].kind == PIPE_OP_FWD ? 'F' : 'B', ops[i].mb);
    CHECK_MSG(!strcmp(got, "F0B0F1B1F2B2F3B3"), "got %s", got);
}

static void test_interleaved_lists(void)
{
    for (int pp = 2; pp <= 4; pp++)
        for (int v = 1; v <= 3; v++)
            for (int m = pp; m <= 4 * pp; m += pp) {
                pipe_config_t cfg = {PIPE_SCHED_INTERLEAVED, pp, v, m};
                check_lists(&cfg);
                pipe_sim_t sim;
                REQUIRE(pipe_schedule_simulate(&cfg, 1.0, 2.0, &sim) == BT_OK);
                pipe_config_t plain = {PIPE_SCHED_1F1B, pp, 1, m};
                pipe_sim_t simp;
                REQUIRE(pipe_schedule_simulate(&plain, 1.0, 2.0, &simp) == BT_OK);
                /* interleaving shrinks the bubble (or keeps it with v = 1) */
                CHECK(sim.bubble <= simp.bubble + 1e-12);
                if (v > 1) CHECK(sim.bubble < simp.bubble);
                CHECK(sim.bubble <= pipe_bubble_theory(&cfg) * 1.5 + 1e-12);
            }
}

static void test_config_errors(void)
{
    char why[160];
    pipe_config_t bad1 = {PIPE_SCHED_INTERLEAVED, 4, 2, 6};
    CHECK(pipe_config_check(&bad1, why, sizeof why) == BT_ERR_INVALID);
    CHECK(strstr(why, "divisible") != NULL);
    pipe_config_t bad2 = {PIPE_SCHED_1F1B, 2, 2, 4};
    CHECK(pipe_config_check(&bad2, why, sizeof why) == BT_ERR_INVALID);
    pipe_config_t bad3 = {PIPE_SCHED_1F1B, 0, 1, 4};
    CHECK(pipe_config_check(&bad3, why, sizeof why) == BT_ERR_INVALID);
    CHECK(pipe_sched_parse("1f1b") == PIPE_SCHED_1F1B);
    CHECK(pipe_sched_parse("interleaved") == PIPE_SCHED_INTERLEAVED);
    CHECK(pipe_sched_parse("gpipe") == -1);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_1f1b_lists_and_bubble, test_1f1b_order_stage0, test_interleaved_lists,
             test_config_errors);
}
