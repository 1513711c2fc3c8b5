#include "train/pipe_schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

static const char *const pipe_sched_names[] = {
    [PIPE_SCHED_1F1B] = "1f1b",
    [PIPE_SCHED_INTERLEAVED] = "interleaved",
};
_Static_assert(sizeof pipe_sched_names / sizeof pipe_sched_names[0] == PIPE_SCHED_COUNT,
               "pipe_sched_names");

const char *pipe_sched_name(pipe_sched_kind_t k)
{
    return (unsigned)k < PIPE_SCHED_COUNT ? pipe_sched_names[k] : "?";
}

int pipe_sched_parse(const char *name)
{
    for (int k = 0; k < PIPE_SCHED_COUNT; k++)
        if (!strcmp(name, pipe_sched_names[k])) return k;
    return -1;
}

bt_status_t pipe_config_check(const pipe_config_t *cfg, char *why, size_t why_cap)
{
    char tmp[160];
    if (!why) {
        why = tmp;
        why_cap = sizeof tmp;
    }
    if (cfg->pp < 1 || cfg->pp > 64) {
        snprintf(why, why_cap, "pp = %d must be in 1..64", cfg->pp);
        return BT_ERR_INVALID;
    }
    if (cfg->microbatches < 1) {
        snprintf(why, why_cap, "microbatches = %d must be >= 1", cfg->microbatches);
        return BT_ERR_INVALID;
    }
    if (cfg->vpp < 1) {
        snprintf(why, why_cap, "virtual_stages = %d must be >= 1", cfg->vpp);
        return BT_ERR_INVALID;
    }
    switch (cfg->kind) {
    case PIPE_SCHED_1F1B:
        if (cfg->vpp != 1) {
            snprintf(why, why_cap, "schedule 1f1b runs one chunk per stage (virtual_stages = %d); "
                     "use schedule: interleaved", cfg->vpp);
            return BT_ERR_INVALID;
        }
        return BT_OK;
    case PIPE_SCHED_INTERLEAVED:
        if (cfg->microbatches % cfg->pp != 0) {
            snprintf(why, why_cap, "interleaved schedule needs microbatches (%d) divisible by pp (%d)",
                     cfg->microbatches, cfg->pp);
            return BT_ERR_INVALID;
        }
        return BT_OK;
    default:
        snprintf(why, why_cap, "unknown schedule kind %d", (int)cfg->kind);
        return BT_ERR_INVALID;
    }
}

int pipe_ops_per_stage(const pipe_config_t *cfg)
{
    return 2 * cfg->microbatches * cfg->vpp;
}

static void pipe_build_1f1b(const pipe_config_t *cfg, int stage, pipe_op_t *ops)
{
    int m = cfg->microbatches;
    int warmup = cfg->pp - stage - 1;
    if (warmup > m) warmup = m;
    int n = 0, f = 0, b = 0;
    for (; f < warmup; f++) ops[n++] = (pipe_op_t){PIPE_OP_FWD, f, 0};
    while (f < m) {
        ops[n++] = (pipe_op_t){PIPE_OP_FWD, f++, 0};
        ops[n++] = (pipe_op_t){PIPE_OP_BWD, b++, 0};
    }
    while (b < m) ops[n++] = (pipe_op_t){PIPE_OP_BWD, b++, 0};
}

/* k-th forward (or backward) of a stage in the interleaved order: microbatches
 * go in groups of pp; within a group all chunks in turn (reversed for
 * backward). */
static pipe_op_t pipe_interleaved_op(const pipe_config_t *cfg, int k, pipe_op_kind_t kind)
{
    int pp = cfg->pp, v = cfg->vpp;
    int chunk = (k / pp) % v;
    if (kind == PIPE_OP_BWD) chunk = v - 1 - chunk;
    int mb = (k / (pp * v)) * pp + k % pp;
    return (pipe_op_t){kind, mb, chunk};
}

static void pipe_build_interleaved(const pipe_config_t *cfg, int stage, pipe_op_t *ops)
{
    int total = cfg->microbatches * cfg->vpp;
    int warmup;
    if (cfg->microbatches == cfg->pp) {
        warmup = total; /* Megatron-LM: all forwards first when m == pp */
    } else {
        warmup = (cfg->pp - stage - 1) * 2 + (cfg->vpp - 1) * cfg->pp;
        if (warmup > total) warmup = total;
    }
    int n = 0, f = 0, b = 0;
    for (; f < warmup; f++) ops[n++] = pipe_interleaved_op(cfg, f, PIPE_OP_FWD);
    while (f < total) {
        ops[n++] = pipe_interleaved_op(cfg, f++, PIPE_OP_FWD);
        ops[n++] = pipe_interleaved_op(cfg, b++, PIPE_OP_BWD);
    }
    while (b < total) ops[n++] = pipe_interleaved_op(cfg, b++, PIPE_OP_BWD);
}

bt_status_t pipe_schedule_build(const pipe_config_t *cfg, int stage, pipe_op_t *ops)
{
    char why[160];
    if (pipe_config_check(cfg, why, sizeof why) != BT_OK) {
        log_error("pipeline schedule: %s", why);
        return BT_ERR_INVALID;
    }
    if (stage < 0 || stage >= cfg->pp) {
        log_error("pipeline schedule: stage %d outside 0..%d", stage, cfg->pp - 1);
        return BT_ERR_INVALID;
    }
    if (cfg->kind == PIPE_SCHED_1F1B) pipe_build_1f1b(cfg, stage, ops);
    else pipe_build_interleaved(cfg, stage, ops);
    return BT_OK;
}

double pipe_bubble_theory(const pipe_config_t *cfg)
{
    double p = cfg->pp, m = cfg->microbatches, v = cfg->vpp;
    return (p - 1) / (v * m + p - 1);
}

bt_status_t pipe_schedule_simulate(const pipe_config_t *cfg, double t_fwd, double t_bwd,
                                   pipe_sim_t *out)
{
    int pp = cfg->pp, m = cfg->microbatches, vs_n = cfg->pp * cfg->vpp;
    int nops = pipe_ops_per_stage(cfg);
    if (pp > 64 || pipe_config_check(cfg, NULL, 0) != BT_OK) return BT_ERR_INVALID;
    bt_status_t st = BT_ERR_NOMEM;
    pipe_op_t *ops = malloc((size_t)pp * (size_t)nops * sizeof *ops);
    double *fdone = malloc(2 * (size_t)m * (size_t)vs_n * sizeof *fdone);
    if (!ops || !fdone) goto out;
    double *bdone = fdone + (size_t)m * (size_t)vs_n;
    for (size_t i = 0; i < 2 * (size_t)m * (size_t)vs_n; i++) fdone[i] = -1;
    for (int s = 0; s < pp; s++) pipe_schedule_build(cfg, s, ops + (size_t)s * (size_t)nops);

    int idx[64] = {0}, held[64] = {0};
    double tfree[64] = {0};
    memset(out, 0, sizeof *out);
    /* per-chunk costs: a stage's work is split over its vpp chunks */
    double cf = t_fwd / cfg->vpp, cb = t_bwd / cfg->vpp;
    int remaining = pp * nops;
    while (remaining > 0) {
        bool progress = false;
        for (int s = 0; s < pp; s++) {
            while (idx[s] < nops) {
                pipe_op_t op = ops[(size_t)s * (size_t)nops + (size_t)idx[s]];
                int vs = pipe_virtual_stage(cfg, s, op.chunk);
                size_t at = (size_t)op.mb * (size_t)vs_n + (size_t)vs;
                double ready;
                if (op.kind == PIPE_OP_FWD) {
                    ready = vs == 0 ? 0 : fdone[at - 1];
                } else {
                    if (fdone[at] < 0) {
                        log_error("pipeline schedule %s: stage %d runs B(mb %d, chunk %d) before "
                                  "its own forward", pipe_sched_name(cfg->kind), s, op.mb, op.chunk);
                        st = BT_ERR_INVALID;
                        goto out;
                    }
                    ready = vs == vs_n - 1 ? fdone[at] : bdone[at + 1];
                }
                if (ready < 0) break; /* waits for another stage */
                double start = ready > tfree[s] ? ready : tfree[s];
                double end = start + (op.kind == PIPE_OP_FWD ? cf : cb);
                if (op.kind == PIPE_OP_FWD) {
                    fdone[at] = end;
                    held[s]++;
                    if (held[s] > out->max_in_flight[s]) out->max_in_flight[s] = held[s];
                } else {
                    bdone[at] = end;
                    held[s]--;
                }
                out->busy[s] += end - start;
                tfree[s] = end;
                idx[s]++;
                remaining--;
                progress = true;
            }
        }
        if (!progress) {
            for (int s = 0; s < pp; s++)
                if (idx[s] < nops) {
                    pipe_op_t op = ops[(size_t)s * (size_t)nops + (size_t)idx[s]];
                    log_error("pipeline schedule %s (pp %d, vpp %d, m %d) deadlocks: stage %d "
                              "waits at op %d (%s mb %d chunk %d)", pipe_sched_name(cfg->kind),
                              pp, cfg->vpp, m, s, idx[s], op.kind == PIPE_OP_FWD ? "F" : "B",
                              op.mb, op.chunk);
                }
            st = BT_ERR_INVALID;
            goto out;
        }
    }
    for (int s = 0; s < pp; s++)
        if (tfree[s] > out->makespan) out->makespan = tfree[s];
    for (int s = 0; s < pp; s++) out->bubble += (out->makespan - out->busy[s]) / out->makespan;
    out->bubble /= pp;
    st = BT_OK;
out:
    free(ops);
    free(fdone);
    return st;
}
