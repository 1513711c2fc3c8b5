/* Hang reports (launch/hang.h). */
#include "launch/hang.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

bt_status_t hang_init(hang_t *h, int world)
{
    h->world = world;
    h->text = calloc((size_t)world, sizeof *h->text);
    h->t_ns = calloc((size_t)world, sizeof *h->t_ns);
    if (!h->text || !h->t_ns) {
        hang_free(h);
        return BT_ERR_NOMEM;
    }
    return BT_OK;
}

void hang_free(hang_t *h)
{
    free(h->text);
    free(h->t_ns);
    h->text = NULL;
    h->t_ns = NULL;
}

void hang_note(hang_t *h, int rank, const char *text, size_t len, uint64_t now_ns)
{
    if (!h->text || rank < 0 || rank >= h->world) return;
    if (len >= HANG_TEXT_MAX) len = HANG_TEXT_MAX - 1;
    /* printable ASCII and newlines only: it goes to the user's terminal */
    char *d = h->text[rank];
    for (size_t i = 0; i < len; i++) d[i] = text[i] == '\n' || (text[i] >= 32 && text[i] < 127) ? text[i] : '?';
    d[len] = 0;
    h->t_ns[rank] = now_ns;
}

typedef struct {
    char name[32], kind[24];
    unsigned long long seq, bytes, ms;
    int rank, size;
} coll_wait_t;

/* One rank's parsed text. Times are ms as of its heartbeat. */
typedef struct {
    bool     busy;
    long long busy_step;
    unsigned long long busy_ms;
    bool     pipe;
    char     pipe_type[24];
    long long pipe_step;
    int      pipe_mb, pipe_vstage;
    unsigned pipe_from;
    unsigned long long pipe_ms;
    int      n_coll;
    coll_wait_t coll[4];
    bool     has_msg[2];
    struct {
        char type[24];
        unsigned peer;
        long long step;
        int mb;
        unsigned long long ago;
    } msg[2]; /* sent, handled */
    double   age_s; /* since the heartbeat */
} rank_wait_t;

static void parse(const hang_t *h, int r, uint64_t now, rank_wait_t *w)
{
    memset(w, 0, sizeof *w);
    w->age_s = h->t_ns[r] && now > h->t_ns[r] ? (double)(now - h->t_ns[r]) * 1e-9 : 0;
    char line[HANG_TEXT_MAX];
    for (const char *p = h->text[r]; *p;) {
        size_t n = strcspn(p, "\n");
        snprintf(line, sizeof line, "%.*s", (int)n, p);
        p += n + (p[n] == '\n');
        if (!strncmp(line, "busy ", 5)) {
            w->busy = sscanf(line, "busy %lld %llu", &w->busy_step, &w->busy_ms) == 2;
        } else if (!strncmp(line, "pipe ", 5)) {
            w->pipe = sscanf(line, "pipe %23s %lld %d %d %u %llu", w->pipe_type, &w->pipe_step, &w->pipe_mb,
                             &w->pipe_vstage, &w->pipe_from, &w->pipe_ms) == 6 &&
                      w->pipe_from < (unsigned)h->world;
        } else if (!strncmp(line, "coll ", 5) && w->n_coll < 4) {
            coll_wait_t *c = &w->coll[w->n_coll];
            if (sscanf(line, "coll %31s %llu %23s %llu %llu %d %d", c->name, &c->seq, c->kind, &c->bytes, &c->ms,
                       &c->rank, &c->size) == 7)
                w->n_coll++;
        } else if (!strncmp(line, "sent ", 5) || !strncmp(line, "recv ", 5)) {
            int i = line[0] == 'r';
            w->has_msg[i] = sscanf(line + 5, "%23s %u %lld %d %llu", w->msg[i].type, &w->msg[i].peer,
                                   &w->msg[i].step, &w->msg[i].mb, &w->msg[i].ago) == 5;
        }
    }
}

static void step_mb(char *buf, size_t cap, long long step, int mb)
{
    if (step < 0) snprintf(buf, cap, "evaluation microbatch %d", mb);
    else snprintf(buf, cap, "step %lld microbatch %d", step, mb);
}

/* What rank r does, and its last messages, in one line. */
static void rank_state(const rank_wait_t *w, char *buf, size_t cap)
{
    size_t at = 0;
    char sm[64];
#define PUT(...) do { int k_ = snprintf(buf + at, cap - at, __VA_ARGS__); \
                      if (k_ > 0) at += (size_t)k_ < cap - at ? (size_t)k_ : cap - at - 1; } while (0)
    buf[0] = 0;
    if (w->n_coll)
        PUT("waits %.1f s in %s #%llu %s", (double)w->coll[0].ms * 1e-3 + w->age_s, w->coll[0].name,
            w->coll[0].seq, w->coll[0].kind);
    else if (w->busy)
        PUT("computing (a job of step %lld, %.1f s so far), in no collective", w->busy_step,
            (double)w->busy_ms * 1e-3 + w->age_s);
    else if (w->pipe) {
        step_mb(sm, sizeof sm, w->pipe_step, w->pipe_mb);
        PUT("waits %.1f s for the %s of %s from rank %u", (double)w->pipe_ms * 1e-3 + w->age_s, w->pipe_type,
            sm, w->pipe_from);
    } else
        PUT("idle (no op, collective or input due)");
    static const char *const what[2] = {"sent", "handled"};
    for (int i = 0; i < 2; i++) {
        if (!w->has_msg[i]) {
            PUT("; nothing %s yet", what[i]);
            continue;
        }
        step_mb(sm, sizeof sm, w->msg[i].step, w->msg[i].mb);
        PUT("; last %s %s (%s) %s rank %u %.1f s ago", what[i], w->msg[i].type, sm, i ? "from" : "to",
            w->msg[i].peer, (double)w->msg[i].ago * 1e-3 + w->age_s);
    }
#undef PUT
}

/* The members of the group called `name` that rank r is in, or 0. */
static int group_of(const graph_t *g, const char *name, int r, int *members)
{
    for (int k = 0; k < GRAPH_GROUP_COUNT; k++) {
        int me, n = graph_group_members(g, (graph_group_t)k, r, members, &me);
        char nm[48];
        if (n <= 0) continue;
        snprintf(nm, sizeof nm, "%s%d", graph_group_name((graph_group_t)k), members[0]);
        if (!strcmp(nm, name)) return n;
    }
    return 0;
}

int hang_missing(const hang_t *h, const graph_t *g, int *ranks, int cap)
{
    int world = h->world, n_out = 0;
    rank_wait_t *w = calloc((size_t)world, sizeof *w);
    bool *miss = calloc((size_t)world, sizeof *miss);
    int *mem = calloc(GRAPH_MAX_WORLD, sizeof *mem);
    if (!w || !miss || !mem) {
        n_out = -1;
        goto out;
    }
    for (int r = 0; r < world; r++) parse(h, r, 0, &w[r]);
    for (int r = 0; r < world; r++) {
        for (int i = 0; i < w[r].n_coll; i++) {
            const coll_wait_t *c = &w[r].coll[i];
            int n = group_of(g, c->name, r, mem);
            for (int j = 0; j < n; j++) {
                int q = mem[j];
                bool in = false;
                for (int k = 0; k < w[q].n_coll; k++)
                    in |= !strcmp(w[q].coll[k].name, c->name) && w[q].coll[k].seq >= c->seq;
                if (!in) miss[q] = true;
            }
        }
        if (w[r].pipe && !w[r].n_coll && !w[r].busy) miss[w[r].pipe_from] = true;
    }
    for (int r = 0; r < world; r++)
        if (miss[r] && n_out < cap) ranks[n_out++] = r;
out:
    free(w);
    free(miss);
    free(mem);
    return n_out;
}

int hang_report(const hang_t *h, const graph_t *g, hang_describe_fn describe, void *arg, uint64_t now_ns,
                FILE *f)
{
    int world = h->world, reported = 0;
    rank_wait_t *w = calloc((size_t)world, sizeof *w);
    bool *shown = calloc((size_t)world, sizeof *shown);
    int *mem = calloc(GRAPH_MAX_WORLD, sizeof *mem);
    char (*done)[48] = calloc((size_t)world * 4, sizeof *done);
    if (!w || !shown || !mem || !done) {
        fprintf(f, "hang report: out of memory\n");
        goto out;
    }
    for (int r = 0; r < world; r++) parse(h, r, now_ns, &w[r]);
    fprintf(f, "hang report (each rank as of its last heartbeat):\n");
    char who[256], state[768];
    int n_done = 0;
    for (int r = 0; r < world; r++)
        for (int i = 0; i < w[r].n_coll; i++) {
            const coll_wait_t *c = &w[r].coll[i];
            char key[48];
            snprintf(key, sizeof key, "%s#%llu", c->name, c->seq);
            bool seen = false;
            for (int k = 0; k < n_done && !seen; k++) seen = !strcmp(done[k], key);
            if (seen || n_done >= world * 4) continue;
            snprintf(done[n_done++], sizeof done[0], "%s", key);
            int n = group_of(g, c->name, r, mem);
            if (n <= 0) continue;
            reported++;
            char arrived[512] = "", missing[512] = "";
            size_t aa = 0, ma = 0;
            int n_missing = 0;
            for (int j = 0; j < n; j++) {
                int q = mem[j];
                bool in = false;
                double ms = 0;
                for (int k = 0; k < w[q].n_coll; k++)
                    if (!strcmp(w[q].coll[k].name, c->name) && w[q].coll[k].seq >= c->seq) {
                        in = true;
                        ms = (double)w[q].coll[k].ms * 1e-3 + w[q].age_s;
                    }
                if (in && aa < sizeof arrived)
                    aa += (size_t)snprintf(arrived + aa, sizeof arrived - aa, "%s%d (%.1f s)", aa ? ", " : "", q, ms);
                else if (!in && ma < sizeof missing) {
                    ma += (size_t)snprintf(missing + ma, sizeof missing - ma, "%s%d", ma ? ", " : "", q);
                    n_missing++;
                }
            }
            fprintf(f, "  collective %s #%llu %s of %llu bytes, group of %d: arrived rank(s) %s; not arrived "
                       "rank(s) %s\n", c->name, c->seq, c->kind, c->bytes, n, arrived[0] ? arrived : "none",
                    missing[0] ? missing : "none");
            for (int j = 0; j < n && n_missing; j++) {
                int q = mem[j];
                bool in = false;
                for (int k = 0; k < w[q].n_coll; k++)
                    in |= !strcmp(w[q].coll[k].name, c->name) && w[q].coll[k].seq >= c->seq;
                if (in) continue;
                describe(arg, q, who, sizeof who);
                rank_state(&w[q], state, sizeof state);
                fprintf(f, "    missing %s: %s\n", who, state);
                shown[q] = true;
            }
        }
    for (int r = 0; r < world; r++) {
        if (!w[r].pipe || w[r].n_coll || w[r].busy) continue;
        reported++;
        char sm[64];
        step_mb(sm, sizeof sm, w[r].pipe_step, w[r].pipe_mb);
        describe(arg, r, who, sizeof who);
        fprintf(f, "  pipeline: %s waits %.1f s for the %s of %s (virtual stage %d) from rank %u\n", who,
                (double)w[r].pipe_ms * 1e-3 + w[r].age_s, w[r].pipe_type, sm, w[r].pipe_vstage, w[r].pipe_from);
        int q = (int)w[r].pipe_from;
        if (shown[q]) continue;
        shown[q] = true;
        describe(arg, q, who, sizeof who);
        rank_state(&w[q], state, sizeof state);
        fprintf(f, "    from %s: %s\n", who, state);
    }
    if (!reported) fprintf(f, "  no rank reported a collective or pipeline wait\n");
    fprintf(f, "  every rank%s:\n", world > 32 ? " (the first 32)" : "");
    for (int r = 0; r < world && r < 32; r++) {
        describe(arg, r, who, sizeof who);
        if (!h->t_ns[r]) {
            fprintf(f, "    %s: no heartbeat with a state yet\n", who);
            continue;
        }
        rank_state(&w[r], state, sizeof state);
        fprintf(f, "    %s: %s\n", who, state);
    }
    fflush(f);
out:
    free(w);
    free(shown);
    free(mem);
    free(done);
    return reported;
}
