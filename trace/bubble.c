/* Pipeline bubble of a traced run: definitions in trace_bubble.h. */
#include "trace/bubble.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t  step;
    int32_t  mb;
    bool     bwd;
    uint64_t t0, t1;
    uint64_t cpu;  /* thread CPU ns of the op; 0 = not recorded */
} bub_op_t;

typedef struct {
    char      name[64];
    int       pp, dp, tp, vpp;
    bub_op_t *ops;
    size_t    nops, cap;
} bub_stage_t;

static void bub_errf(char *err, size_t cap, const char *fmt, ...)
{
    if (!err || !cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

/* "stage r<rank> pp<p> dp<d> tp<t> v<v>"; false for any other track. */
static bool bub_name_parse(const char *name, bub_stage_t *s)
{
    int rank;
    if (sscanf(name, "stage r%d pp%d dp%d tp%d v%d", &rank, &s->pp, &s->dp, &s->tp, &s->vpp) != 5) return false;
    snprintf(s->name, sizeof s->name, "%s", name);
    return s->pp >= 0 && s->dp >= 0 && s->tp >= 0 && s->vpp >= 1;
}

static bool bub_op_push(bub_stage_t *s, const bub_op_t *op)
{
    if (s->nops == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        bub_op_t *n = realloc(s->ops, cap * sizeof *n);
        if (!n) return false;
        s->ops = n;
        s->cap = cap;
    }
    s->ops[s->nops++] = *op;
    return true;
}

static int bub_op_cmp(const void *pa, const void *pb)
{
    const bub_op_t *a = pa, *b = pb;
    if (a->step != b->step) return a->step < b->step ? -1 : 1;
    if (a->t0 != b->t0) return a->t0 < b->t0 ? -1 : 1;
    return a->t1 < b->t1 ? -1 : a->t1 > b->t1;
}

static int bub_stage_cmp(const void *pa, const void *pb)
{
    const bub_stage_t *a = pa, *b = pb;
    if (a->dp != b->dp) return a->dp - b->dp;
    if (a->tp != b->tp) return a->tp - b->tp;
    return a->pp - b->pp;
}

static int bub_dbl_cmp(const void *pa, const void *pb)
{
    double a = *(const double *)pa, b = *(const double *)pb;
    return a < b ? -1 : a > b;
}

/* [lo, hi) of the ops of `step` in a stage sorted by (step, t0). */
static void bub_step_range(const bub_stage_t *s, int64_t step, size_t *lo, size_t *hi)
{
    size_t i = 0;
    while (i < s->nops && s->ops[i].step < step) i++;
    *lo = i;
    while (i < s->nops && s->ops[i].step == step) i++;
    *hi = i;
}

static bool bub_step_has_bwd(const bub_stage_t *s, int64_t step)
{
    size_t lo, hi;
    bub_step_range(s, step, &lo, &hi);
    for (size_t i = lo; i < hi; i++)
        if (s->ops[i].bwd) return true;
    return false;
}

/* Union length of the (t0-sorted) spans. */
static uint64_t bub_union_ns(const bub_op_t *ops, size_t n)
{
    uint64_t total = 0, cur0 = 0, cur1 = 0;
    bool open = false;
    for (size_t i = 0; i < n; i++) {
        if (open && ops[i].t0 <= cur1) {
            if (ops[i].t1 > cur1) cur1 = ops[i].t1;
            continue;
        }
        if (open) total += cur1 - cur0;
        cur0 = ops[i].t0;
        cur1 = ops[i].t1;
        open = true;
    }
    if (open) total += cur1 - cur0;
    return total;
}

/* The 1F1B order of stage s of p with m microbatches: warm-up forwards,
 * one F one B, cool-down backwards. Microbatches are numbered 0..m-1. */
static bool bub_order_is_1f1b(const bub_op_t *ops, size_t n, int s, int p, int m)
{
    if (n != (size_t)(2 * m)) return false;
    int warm = p - 1 - s < m ? p - 1 - s : m;
    size_t k = 0;
    for (int i = 0; i < warm; i++, k++)
        if (ops[k].bwd || ops[k].mb != i) return false;
    for (int i = 0; i < m - warm; i++) {
        if (ops[k].bwd || ops[k].mb != warm + i) return false;
        k++;
        if (!ops[k].bwd || ops[k].mb != i) return false;
        k++;
    }
    for (int i = m - warm; i < m; i++, k++)
        if (!ops[k].bwd || ops[k].mb != i) return false;
    return true;
}

/* Replay one step of a replica (stages st[0..p-1] in pipeline order): the
 * executed per-stage order, op times fdur/bdur, messages free. Writes the
 * window and each stage's busy time; false when the order cannot run
 * (an op waits on one that comes later) or a microbatch is out of range. */
static bool bub_replay(bub_stage_t *const *st, const size_t *lo, const size_t *hi, int p, int m,
                       const double *fdur, const double *bdur, double *window, double *busy)
{
    size_t cells = (size_t)p * (size_t)m;
    double *fend = malloc(cells * sizeof *fend), *bend = malloc(cells * sizeof *bend);
    size_t *ptr = calloc((size_t)p, sizeof *ptr);
    double *free_at = calloc((size_t)p, sizeof *free_at);
    bool ok = fend && bend && ptr && free_at;
    if (ok) {
        for (size_t i = 0; i < cells; i++) fend[i] = bend[i] = -1;
        for (int s = 0; s < p; s++) busy[s] = 0;
        size_t left = 0;
        for (int s = 0; s < p; s++) left += hi[s] - lo[s];
        bool progress = true;
        while (left && progress) {
            progress = false;
            for (int s = 0; s < p; s++) {
                while (lo[s] + ptr[s] < hi[s]) {
                    const bub_op_t *op = &st[s]->ops[lo[s] + ptr[s]];
                    if (op->mb < 0 || op->mb >= m) {
                        ok = false;
                        goto free_tables;
                    }
                    double dep;
                    if (!op->bwd) dep = s == 0 ? 0 : fend[(size_t)(s - 1) * m + op->mb];
                    else dep = s == p - 1 ? fend[(size_t)s * m + op->mb] : bend[(size_t)(s + 1) * m + op->mb];
                    if (dep < 0) break;
                    double t0 = dep > free_at[s] ? dep : free_at[s];
                    double d = op->bwd ? bdur[s] : fdur[s];
                    free_at[s] = t0 + d;
                    busy[s] += d;
                    (op->bwd ? bend : fend)[(size_t)s * m + op->mb] = t0 + d;
                    ptr[s]++;
                    left--;
                    progress = true;
                }
            }
        }
        ok = left == 0;
        *window = 0;
        for (int s = 0; s < p; s++)
            if (free_at[s] > *window) *window = free_at[s];
    }
free_tables:
    free(fend);
    free(bend);
    free(ptr);
    free(free_at);
    return ok;
}

static double bub_median(double *v, size_t n)
{
    if (!n) return NAN;
    qsort(v, n, sizeof *v, bub_dbl_cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bt_status_t trace_bubble_compute(const trace_set_t *set, trace_bubble_t *out, char *err, size_t err_cap)
{
    memset(out, 0, sizeof *out);
    out->theory = out->bubble = out->replay = NAN;
    bt_status_t st = BT_ERR_NOMEM;
    bub_stage_t *stages = NULL;
    size_t nst = 0;
    double *durs = NULL;
    /* one stage per named stage track; its F/B compute spans of training steps */
    for (size_t fi = 0; fi < set->nfiles; fi++) {
        const trace_file_t *f = &set->files[fi];
        for (uint32_t ai = 0; ai < f->nactors; ai++) {
            bub_stage_t s = {0};
            if (!f->actor_names[ai] || !bub_name_parse(f->actor_names[ai], &s)) continue;
            for (size_t i = 0; i < f->nrecs; i++) {
                const trace_rec_t *r = &f->recs[i];
                if (r->ev != TRACE_EV_SPAN || r->kind != TRACE_SPAN_COMPUTE || r->actor != f->actor_ids[ai] ||
                    r->step < 1 || r->name_id == 0 || r->name_id >= f->nnames || !f->names[r->name_id])
                    continue;
                const char *nm = f->names[r->name_id];
                bool fwd = !strcmp(nm, "fwd"), bwd = !strcmp(nm, "bwd");
                if (!fwd && !bwd) continue;
                bub_op_t op = {.step = r->step, .mb = r->mb, .bwd = bwd, .t0 = r->t0, .t1 = r->t1,
                                .cpu = r->bytes};
                if (!bub_op_push(&s, &op)) {
                    free(s.ops);
                    goto free_stages;
                }
            }
            if (!s.nops) continue;
            qsort(s.ops, s.nops, sizeof *s.ops, bub_op_cmp);
            bub_stage_t *n = realloc(stages, (nst + 1) * sizeof *n);
            if (!n) {
                free(s.ops);
                goto free_stages;
            }
            stages = n;
            stages[nst++] = s;
        }
    }
    if (!nst) {
        bub_errf(err, err_cap, "no pipeline stage track with fwd/bwd compute spans of a training step");
        st = BT_ERR_NOT_FOUND;
        goto free_stages;
    }
    qsort(stages, nst, sizeof *stages, bub_stage_cmp);
    out->stages = calloc(nst, sizeof *out->stages);
    if (!out->stages) goto free_stages;
    out->nstages = nst;
    out->order_1f1b = true;
    out->vpp = stages[0].vpp;
    size_t max_ops = 0;
    for (size_t i = 0; i < nst; i++)
        if (stages[i].nops > max_ops) max_ops = stages[i].nops;
    durs = malloc((max_ops + 1) * sizeof *durs);
    if (!durs) goto free_stages;

    double sum_bubble = 0, sum_replay = 0;
    size_t n_bubble = 0, n_replay = 0;
    /* replicas: runs of stages with the same (dp, tp), in pipeline order */
    for (size_t r0 = 0; r0 < nst;) {
        size_t r1 = r0 + 1;
        while (r1 < nst && stages[r1].dp == stages[r0].dp && stages[r1].tp == stages[r0].tp) r1++;
        int p = (int)(r1 - r0);
        bub_stage_t *rep[64] = {0};
        if (p > 64) p = 64;
        for (int s = 0; s < p; s++) rep[s] = &stages[r0 + (size_t)s];
        /* training steps every stage of the replica has, in order */
        int64_t first = INT64_MAX, last = 0;
        for (size_t i = 0; i < rep[0]->nops; i++) {
            if (rep[0]->ops[i].step < first) first = rep[0]->ops[i].step;
            if (rep[0]->ops[i].step > last) last = rep[0]->ops[i].step;
        }
        /* the median F and B time of each stage over the counted steps */
        double fdur[64], bdur[64];
        for (int s = 0; s < p; s++) {
            trace_stage_stat_t *o = &out->stages[r0 + (size_t)s];
            snprintf(o->name, sizeof o->name, "%s", rep[s]->name);
            o->pp = rep[s]->pp;
            o->dp = rep[s]->dp;
            o->tp = rep[s]->tp;
            o->order_1f1b = true;
            o->replay = NAN;
            for (int pass = 0; pass < 2; pass++) {
                size_t n = 0;
                for (size_t i = 0; i < rep[s]->nops; i++) {
                    const bub_op_t *op = &rep[s]->ops[i];
                    if (op->step <= first || op->bwd != (pass == 1)) continue;
                    if (!op->cpu) o->wall_only = true;
                    durs[n++] = (double)(op->cpu ? op->cpu : op->t1 - op->t0) * 1e-6;
                }
                (pass ? bdur : fdur)[s] = bub_median(durs, n);
            }
            o->fwd_ms = fdur[s];
            o->bwd_ms = bdur[s];
        }
        double rwin[64] = {0}, ridle[64] = {0};
        bool replayed = out->vpp == 1;
        for (int64_t step = first + 1; step <= last; step++) {
            bool all = true;
            for (int s = 0; s < p && all; s++) all = bub_step_has_bwd(rep[s], step);
            if (!all) continue;
            size_t lo[64], hi[64];
            uint64_t w0 = UINT64_MAX, w1 = 0;
            for (int s = 0; s < p; s++) {
                bub_step_range(rep[s], step, &lo[s], &hi[s]);
                for (size_t i = lo[s]; i < hi[s]; i++) {
                    if (rep[s]->ops[i].t0 < w0) w0 = rep[s]->ops[i].t0;
                    if (rep[s]->ops[i].t1 > w1) w1 = rep[s]->ops[i].t1;
                }
            }
            double win = (double)(w1 - w0) * 1e-6;
            int m = 0;
            for (size_t i = lo[0]; i < hi[0]; i++) m += !rep[0]->ops[i].bwd;
            if (out->vpp > 1) m /= out->vpp;
            for (int s = 0; s < p; s++) {
                trace_stage_stat_t *o = &out->stages[r0 + (size_t)s];
                double busy = (double)bub_union_ns(rep[s]->ops + lo[s], hi[s] - lo[s]) * 1e-6;
                o->steps++;
                o->m = m;
                o->window_ms += win;
                o->busy_ms += busy;
                o->idle_ms += win > busy ? win - busy : 0;
                if (out->vpp == 1 && !bub_order_is_1f1b(rep[s]->ops + lo[s], hi[s] - lo[s], s, p, m))
                    o->order_1f1b = false;
            }
            double rw, rb[64];
            if (replayed && bub_replay(rep, lo, hi, p, m, fdur, bdur, &rw, rb)) {
                for (int s = 0; s < p; s++) {
                    rwin[s] += rw;
                    ridle[s] += rw - rb[s];
                }
            } else {
                replayed = false;
            }
            out->p = p;
            out->m = m;
        }
        for (int s = 0; s < p; s++) {
            trace_stage_stat_t *o = &out->stages[r0 + (size_t)s];
            if (!o->steps) continue;
            o->bubble = o->window_ms > 0 ? o->idle_ms / o->window_ms : 0;
            sum_bubble += o->bubble;
            n_bubble++;
            if (!o->order_1f1b) out->order_1f1b = false;
            if (replayed && rwin[s] > 0) {
                o->replay = ridle[s] / rwin[s];
                sum_replay += o->replay;
                n_replay++;
            }
        }
        r0 = r1;
    }
    if (!n_bubble) {
        bub_errf(err, err_cap, "no pipeline replica has two training steps of fwd/bwd spans");
        st = BT_ERR_NOT_FOUND;
        goto free_stages;
    }
    out->bubble = sum_bubble / (double)n_bubble;
    if (n_replay == n_bubble) out->replay = sum_replay / (double)n_replay;
    if (out->p >= 1 && out->m >= 1)
        out->theory = (double)(out->p - 1) / ((double)out->vpp * out->m + out->p - 1);
    st = BT_OK;
free_stages:
    for (size_t i = 0; i < nst; i++) free(stages[i].ops);
    free(stages);
    free(durs);
    if (st != BT_OK) trace_bubble_free(out);
    return st;
}

void trace_bubble_print(const trace_bubble_t *b, FILE *out)
{
    fprintf(out, "pipeline stages (per training step after the first: window = first F .. last B of the\n"
                 "replica, busy = union of the stage's F/B compute spans, bubble = idle / window;\n"
                 "optimizer and DP reduction are outside the window):\n");
    fprintf(out, "  %-28s %5s %3s %10s %10s %10s %7s %7s %8s %8s %5s\n", "stage", "steps", "m", "window_ms",
            "busy_ms", "idle_ms", "bubble", "replay", "fwd_ms", "bwd_ms", "1F1B");
    for (size_t i = 0; i < b->nstages; i++) {
        const trace_stage_stat_t *s = &b->stages[i];
        if (!s->steps) continue;
        fprintf(out, "  %-28s %5lld %3d %10.1f %10.1f %10.1f %7.3f %7.3f %8.2f %8.2f %5s\n", s->name,
                (long long)s->steps, s->m, s->window_ms, s->busy_ms, s->idle_ms, s->bubble, s->replay, s->fwd_ms,
                s->bwd_ms, b->vpp > 1 ? "-" : s->order_1f1b ? "yes" : "NO");
    }
    fprintf(out, "bubble: measured %.3f (mean over stages) | replayed %.3f (executed order, median op times) | "
                 "theory (p-1)/(%sm+p-1) = %.3f (p=%d, m=%d, v=%d) | executed order: %s\n",
            b->bubble, b->replay, b->vpp > 1 ? "v*" : "", b->theory, b->p, b->m, b->vpp,
            b->vpp > 1 ? "interleaved (not checked)" : b->order_1f1b ? "1F1B" : "NOT 1F1B");
    if (isfinite(b->theory) && b->theory > 0)
        fprintf(out, "bubble vs theory: measured %+.1f%%, replayed %+.1f%%\n", 100.0 * (b->bubble / b->theory - 1),
                100.0 * (b->replay / b->theory - 1));
}

void trace_bubble_free(trace_bubble_t *b)
{
    free(b->stages);
    b->stages = NULL;
    b->nstages = 0;
}
