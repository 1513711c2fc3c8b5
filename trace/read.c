/* Reading trace files, merging them into Chrome trace-event JSON, and the
 * per-edge / per-actor summary (contract in trace.h, layout in trace_file.h).
 *
 * A trace file is input like any other: every length, count and id is
 * checked before use, and a bad file is an error that names the file and
 * the byte offset.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "wire/msg.h"
#include "trace/read.h"
#include "trace/format.h"

_Static_assert(sizeof(((trace_file_t *)0)->run_id) == TRACE_STR_MAX, "run id size");
#include "base/log.h"

#define TRACE_MAX_ID (1u << 20) /* bounds name/thread tables of a hostile file */

static bt_status_t trace_errf(char *err, size_t cap, bt_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bt_status_t trace_errf(char *err, size_t cap, bt_status_t st, const char *fmt, ...)
{
    if (err && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, cap, fmt, ap);
        va_end(ap);
    }
    return st;
}

/* Set table[id] = a copy of s (len bytes), growing the table to id+1. */
static bool trace_str_put(char ***table, uint32_t *n, uint32_t id, const char *s, size_t len)
{
    if (id >= *n) {
        char **t = realloc(*table, (size_t)(id + 1) * sizeof *t);
        if (!t) return false;
        memset(t + *n, 0, (size_t)(id + 1 - *n) * sizeof *t);
        *table = t;
        *n = id + 1;
    }
    char *c = malloc(len + 1);
    if (!c) return false;
    memcpy(c, s, len);
    c[len] = '\0';
    free((*table)[id]);
    (*table)[id] = c;
    return true;
}

void trace_file_free(trace_file_t *f)
{
    free(f->path);
    free(f->recs);
    free(f->rec_tid);
    for (uint32_t i = 0; i < f->nnames; i++) free(f->names[i]);
    free(f->names);
    for (uint32_t i = 0; i < f->nthreads; i++) free(f->thread_names[i]);
    free(f->thread_names);
    for (uint32_t i = 0; i < f->nactors; i++) free(f->actor_names[i]);
    free(f->actor_names);
    free(f->actor_ids);
    memset(f, 0, sizeof *f);
}

/* Records of versions 2 and 3 (slots come here expanded), made what every
 * reader below expects:
 * - TRACE_REC_TICKS: t0/t1 (and a handled receive's dispatch delay) are TSC
 *   ticks, converted to ns with the rate between the last CLOCK block's
 *   two samples;
 * - a handled receive (TRACE_EV_RECV, kind TRACE_RECV_HANDLED: arrival t0,
 *   handler end t1, dispatch delay in name_id) becomes the receive at t0
 *   and the handler span [t0 + delay, t1] it stands for. */
static bt_status_t trace_file_v2_finish(trace_file_t *f, const trace_clock_blk_t *clk, char *err, size_t cap)
{
    size_t handled = 0;
    double rate = clk ? (double)(clk->ns1 - clk->ns0) / (double)(clk->ticks1 - clk->ticks0) : 0.0;
    /* any real TSC runs between 10 MHz and 100 GHz */
    if (clk && !(rate > 0.01 && rate < 100.0))
        return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: implausible clock block (%g ns per tick)", f->path, rate);
    for (size_t i = 0; i < f->nrecs; i++) {
        trace_rec_t *r = &f->recs[i];
        bool is_handled = r->ev == TRACE_EV_RECV && r->kind == TRACE_RECV_HANDLED;
        handled += is_handled;
        if (!(r->reserved & TRACE_REC_TICKS)) continue;
        if (!clk)
            return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: tick-stamped records but no clock block", f->path);
        double n0 = (double)(int64_t)(r->t0 - clk->ticks0) * rate;
        double n1 = (double)(int64_t)(r->t1 - clk->ticks0) * rate;
        if (!(fabs(n0) < 4e18 && fabs(n1) < 4e18)) /* a converted value must fit: no UB on a hostile file */
            return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: record %zu lies %g s from its clock base", f->path, i,
                              n0 / 1e9);
        r->t0 = clk->ns0 + (uint64_t)(int64_t)n0;
        r->t1 = clk->ns0 + (uint64_t)(int64_t)n1;
        if (r->t1 < r->t0) r->t1 = r->t0;
        if (is_handled) {
            double delay = (double)r->name_id * rate + 0.5;
            r->name_id = delay >= (double)UINT32_MAX ? UINT32_MAX : (uint32_t)delay;
        }
        r->reserved &= ~TRACE_REC_TICKS;
    }
    if (!handled) return BT_OK;
    trace_rec_t *recs = malloc((f->nrecs + handled) * sizeof *recs);
    uint32_t *tid = malloc((f->nrecs + handled) * sizeof *tid);
    if (!recs || !tid) {
        free(recs);
        free(tid);
        return BT_ERR_NOMEM;
    }
    size_t n = 0;
    for (size_t i = 0; i < f->nrecs; i++) {
        trace_rec_t r = f->recs[i];
        if (!(r.ev == TRACE_EV_RECV && r.kind == TRACE_RECV_HANDLED)) {
            recs[n] = r;
            tid[n++] = f->rec_tid[i];
            continue;
        }
        uint64_t start = r.t0 + r.name_id;
        if (start > r.t1) start = r.t1; /* rounding of the converted delay */
        trace_rec_t span = {.ev = TRACE_EV_SPAN, .kind = TRACE_SPAN_HANDLER, .msg_type = r.msg_type,
                            .actor = r.actor, .t0 = start, .t1 = r.t1, .step = r.step, .mb = r.mb};
        r.kind = 0;
        r.name_id = 0;
        r.t1 = r.t0;
        recs[n] = r;
        tid[n++] = f->rec_tid[i];
        recs[n] = span;
        tid[n++] = f->rec_tid[i];
    }
    free(f->recs);
    free(f->rec_tid);
    f->recs = recs;
    f->rec_tid = tid;
    f->nrecs = n;
    return BT_OK;
}

static bool trace_rec_valid(const trace_rec_t *r)
{
    return r->ev < TRACE_EV_COUNT && !(r->ev == TRACE_EV_SPAN && r->kind >= TRACE_SPAN_KIND_COUNT) && r->t1 >= r->t0;
}

/* ---- version 3: slots ----------------------------------------------------
 * Compact records hold the low 32 bits of an envelope seq. Per stream (a
 * send or receive, actor, peer) the seqs rise one at a time and a stream is
 * recorded by one thread in order, so the full seq is the one nearest to
 * the stream's last (within 2^31 either way). */
typedef struct {
    actor_addr_t actor, peer;
    uint8_t      used, ev;
    uint64_t     seq;   /* the stream's last */
} trace_seq_slot_t;

typedef struct trace_seqs {
    trace_seq_slot_t *v;
    size_t            cap, n; /* cap: power of two */
} trace_seqs_t;

static size_t trace_seq_hash(uint8_t ev, actor_addr_t actor, actor_addr_t peer, size_t cap)
{
    uint64_t k = ((uint64_t)actor << 32 | peer) * 0x9E3779B97F4A7C15ull ^ ev;
    return (size_t)(k >> 17) & (cap - 1);
}

/* The entry of a stream (found or new), NULL when out of memory. */
static trace_seq_slot_t *trace_seqs_at(trace_seqs_t *m, uint8_t ev, actor_addr_t actor, actor_addr_t peer,
                                       bool *fresh)
{
    if (2 * (m->n + 1) > m->cap) {
        size_t nc = m->cap ? 2 * m->cap : 64;
        trace_seq_slot_t *nv = calloc(nc, sizeof *nv);
        if (!nv) return NULL;
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->v[i].used) continue;
            size_t j = trace_seq_hash(m->v[i].ev, m->v[i].actor, m->v[i].peer, nc);
            while (nv[j].used) j = (j + 1) & (nc - 1);
            nv[j] = m->v[i];
        }
        free(m->v);
        m->v = nv;
        m->cap = nc;
    }
    size_t j = trace_seq_hash(ev, actor, peer, m->cap);
    while (m->v[j].used && !(m->v[j].ev == ev && m->v[j].actor == actor && m->v[j].peer == peer))
        j = (j + 1) & (m->cap - 1);
    *fresh = !m->v[j].used;
    if (*fresh) {
        m->v[j] = (trace_seq_slot_t){.actor = actor, .peer = peer, .used = 1, .ev = ev};
        m->n++;
    }
    return &m->v[j];
}

/* The full seq of a compact record's low 32 bits; a wide record's full seq
 * (lo64 with full = true) becomes its stream's reference. */
static bool trace_seq_restore(trace_seqs_t *m, uint8_t ev, actor_addr_t actor, actor_addr_t peer, uint64_t lo64,
                              bool full, uint64_t *seq)
{
    bool fresh;
    trace_seq_slot_t *e = trace_seqs_at(m, ev, actor, peer, &fresh);
    if (!e) return false;
    if (full || fresh) {
        *seq = lo64;
    } else {
        int32_t d = (int32_t)((uint32_t)lo64 - (uint32_t)e->seq);
        *seq = e->seq + (uint64_t)(int64_t)d;
    }
    e->seq = *seq;
    return true;
}

/* Expand n slots of a version 3 record block (file offset `at`) into f's
 * records, written by thread `tid`. Room for n records is there: a slot
 * makes at most one. */
static bt_status_t trace_slots_parse(trace_file_t *f, const uint8_t *p, uint32_t n, uint32_t tid, size_t at,
                                     trace_seqs_t *seqs, char *err, size_t cap)
{
    for (uint32_t i = 0; i < n; i++) {
        trace_slot_t s;
        memcpy(&s, p + (size_t)i * sizeof s, sizeof s);
        size_t where = at + (size_t)i * sizeof s;
        trace_rec_t r;
        if (s.ev == TRACE_SLOT_PAD) continue;
        if (s.ev & TRACE_SLOT_WIDE) {
            if (i + 1 >= n)
                return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: wide record at byte %zu ends its block", f->path,
                                  where);
            memcpy(&r, p + (size_t)i * sizeof s, sizeof r);
            r.ev &= (uint8_t)~TRACE_SLOT_WIDE;
            i++;
            if (!trace_rec_valid(&r) || (r.reserved & ~TRACE_REC_TICKS) ||
                (r.ev == TRACE_EV_RECV && r.kind == TRACE_RECV_HANDLED))
                return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: bad wide record at byte %zu (event %u, kind %u)",
                                  f->path, where, r.ev, r.kind);
            if ((r.ev == TRACE_EV_SEND || r.ev == TRACE_EV_RECV) &&
                !trace_seq_restore(seqs, r.ev, r.actor, r.peer, r.seq, true, &r.seq))
                return BT_ERR_NOMEM;
        } else {
            uint8_t ev = s.ev & TRACE_SLOT_EV_MASK;
            bool handled = s.ev & TRACE_SLOT_HANDLED;
            if ((s.ev & ~(TRACE_SLOT_EV_MASK | TRACE_SLOT_TICKS | TRACE_SLOT_HANDLED)) || ev > TRACE_EV_SPAN ||
                (handled && ev != TRACE_EV_RECV) || (ev == TRACE_EV_SPAN && s.peer >= TRACE_SPAN_KIND_COUNT))
                return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: bad record at byte %zu (event byte 0x%02x)",
                                  f->path, where, s.ev);
            uint64_t t1 = s.t0 + (uint64_t)s.delay + s.dur;
            if (t1 < s.t0)
                return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: record at byte %zu ends before it starts", f->path,
                                  where);
            r = (trace_rec_t){.ev = ev, .msg_type = s.msg_type == 0xff ? 0xffff : s.msg_type, .actor = s.actor,
                              .t0 = s.t0, .t1 = s.t0, .step = s.step, .mb = s.mb,
                              .reserved = s.ev & TRACE_SLOT_TICKS ? TRACE_REC_TICKS : 0};
            if (ev == TRACE_EV_SPAN) {
                r.kind = (uint8_t)s.peer;
                r.t1 = t1;
            } else {
                r.peer = s.peer;
                r.bytes = s.bytes;
                if (!trace_seq_restore(seqs, ev, s.actor, s.peer, s.seq, false, &r.seq)) return BT_ERR_NOMEM;
                if (handled) { /* split by trace_file_v2_finish */
                    r.kind = TRACE_RECV_HANDLED;
                    r.t1 = t1;
                    r.name_id = s.delay;
                }
            }
        }
        f->recs[f->nrecs] = r;
        f->rec_tid[f->nrecs++] = tid;
    }
    return BT_OK;
}

static bt_status_t trace_file_parse_blocks(const uint8_t *buf, size_t size, trace_file_t *f, trace_seqs_t *seqs,
                                           char *err, size_t cap)
{
    const char *path = f->path;
    trace_file_hdr_t h;
    if (size < sizeof h)
        return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: truncated header (%zu of %zu bytes)", path, size, sizeof h);
    memcpy(&h, buf, sizeof h);
    if (h.magic != TRACE_MAGIC)
        return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: not a baton trace file (magic 0x%08x)", path, h.magic);
    if (h.version < 1 || h.version > TRACE_VERSION)
        return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: trace format version %u, this baton reads 1..%u", path,
                          h.version, TRACE_VERSION);
    size_t rec_size = h.version >= 3 ? sizeof(trace_slot_t) : sizeof(trace_rec_t);
    if (h.rec_size != rec_size)
        return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: record size %u, expected %zu for version %u", path,
                          h.rec_size, rec_size, h.version);
    f->rank = h.rank;
    f->pid = h.pid;
    size_t off = sizeof h, cap_recs = 0;
    bool have_clock = false;

    trace_clock_blk_t clk = {0};
    while (off < size) {
        trace_blk_t b;
        if (size - off < sizeof b)
            return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: truncated at byte %zu (partial block header)", path, off);
        memcpy(&b, buf + off, sizeof b);
        if ((b.kind & TRACE_BLK_MAGIC_MASK) != TRACE_BLK_MAGIC)
            return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: corrupt block header at byte %zu (kind 0x%08x)", path,
                              off, b.kind);
        uint32_t kind = b.kind & ~TRACE_BLK_MAGIC_MASK;
        size_t body = off + sizeof b;
        if (b.len > size - body)
            return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: truncated at byte %zu (block needs %u bytes, %zu left)",
                              path, off, b.len, size - body);
        switch (kind) {
        case TRACE_BLK_RECS: {
            if ((uint64_t)b.count * rec_size != b.len || b.count == 0)
                return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: record block at byte %zu: %u records in %u bytes",
                                  path, off, b.count, b.len);
            /* a slot expands to at most two records (a wide pair to one) */
            if (f->nrecs + b.count > cap_recs) {
                size_t nc = cap_recs ? cap_recs : 1024;
                while (nc < f->nrecs + b.count) nc *= 2;
                trace_rec_t *r = realloc(f->recs, nc * sizeof *r);
                if (!r) return BT_ERR_NOMEM;
                f->recs = r;
                uint32_t *t = realloc(f->rec_tid, nc * sizeof *t);
                if (!t) return BT_ERR_NOMEM;
                f->rec_tid = t;
                cap_recs = nc;
            }
            if (h.version >= 3) {
                bt_status_t st = trace_slots_parse(f, buf + body, b.count, b.arg, body, seqs, err, cap);
                if (st != BT_OK) return st;
                break;
            }
            memcpy(f->recs + f->nrecs, buf + body, b.len);
            for (uint32_t i = 0; i < b.count; i++) {
                const trace_rec_t *r = &f->recs[f->nrecs + i];
                if (!trace_rec_valid(r))
                    return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: bad record at byte %zu (event %u, kind %u)",
                                      path, body + (size_t)i * sizeof *r, r->ev, r->kind);
                f->rec_tid[f->nrecs + i] = b.arg;
            }
            f->nrecs += b.count;
            break;
        }
        case TRACE_BLK_DROPPED:
            f->dropped += b.count;
            break;
        case TRACE_BLK_CLOCK:
            if (h.version < 2 || b.len != sizeof clk)
                return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: bad clock block at byte %zu (%u bytes)", path,
                                  off, b.len);
            memcpy(&clk, buf + body, sizeof clk);
            if (clk.ticks1 <= clk.ticks0 || clk.ns1 <= clk.ns0)
                return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: clock block at byte %zu does not advance", path,
                                  off);
            have_clock = true;
            break;
        case TRACE_BLK_NAME:
        case TRACE_BLK_THREAD:
        case TRACE_BLK_ACTOR: {
            if (b.len >= TRACE_STR_MAX || (kind != TRACE_BLK_ACTOR && b.arg >= TRACE_MAX_ID))
                return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: bad name block at byte %zu (id %u, %u bytes)",
                                  path, off, b.arg, b.len);
            const char *s = (const char *)buf + body;
            bool ok;
            if (kind == TRACE_BLK_NAME) {
                ok = trace_str_put(&f->names, &f->nnames, b.arg, s, b.len);
            } else if (kind == TRACE_BLK_THREAD) {
                ok = trace_str_put(&f->thread_names, &f->nthreads, b.arg, s, b.len);
            } else {
                uint32_t i = 0;
                while (i < f->nactors && f->actor_ids[i] != b.arg) i++;
                if (i == f->nactors) {
                    if (f->nactors >= TRACE_MAX_ID)
                        return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: too many actors", path);
                    actor_addr_t *ids = realloc(f->actor_ids, (f->nactors + 1) * sizeof *ids);
                    if (!ids) return BT_ERR_NOMEM;
                    f->actor_ids = ids;
                    ids[i] = b.arg;
                    uint32_t n = f->nactors;
                    if (!trace_str_put(&f->actor_names, &n, i, s, b.len)) return BT_ERR_NOMEM;
                    f->nactors = n;
                    ok = true;
                } else {
                    ok = trace_str_put(&f->actor_names, &f->nactors, i, s, b.len);
                }
            }
            if (!ok) return BT_ERR_NOMEM;
            break;
        }
        case TRACE_BLK_RUN:
            if (b.len == 0 || b.len >= TRACE_STR_MAX || f->run_id[0])
                return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: bad run block at byte %zu (%u bytes)", path,
                                  off, b.len);
            memcpy(f->run_id, buf + body, b.len);
            f->run_id[b.len] = '\0';
            break;
        case TRACE_BLK_END:
            if (body + b.len != size)
                return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: %zu bytes after the end block at byte %zu", path,
                                  size - body - b.len, off);
            f->complete = true;
            break;
        default:
            return trace_errf(err, cap, BT_ERR_CORRUPT, "%s: unknown block kind %u at byte %zu", path, kind, off);
        }
        off = body + b.len;
    }
    if (!f->complete) log_warn("trace: %s has no end block (the process did not stop cleanly); using what it holds", path);
    return h.version >= 2 ? trace_file_v2_finish(f, have_clock ? &clk : NULL, err, cap) : BT_OK;
}

static bt_status_t trace_file_parse(const uint8_t *buf, size_t size, trace_file_t *f, char *err, size_t cap)
{
    trace_seqs_t seqs = {0};
    bt_status_t st = trace_file_parse_blocks(buf, size, f, &seqs, err, cap);
    free(seqs.v);
    return st;
}

bt_status_t trace_file_load_mem(const uint8_t *buf, size_t size, const char *path, trace_file_t *f, char *err,
                                size_t cap)
{
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return trace_errf(err, cap, BT_ERR_NOMEM, "%s: out of memory", path);
    bt_status_t st = trace_file_parse(buf, size, f, err, cap);
    if (st == BT_ERR_NOMEM) trace_errf(err, cap, st, "%s: out of memory", path);
    if (st != BT_OK) trace_file_free(f);
    return st;
}

bt_status_t trace_file_load(const char *path, trace_file_t *f, char *err, size_t cap)
{
    memset(f, 0, sizeof *f);
    FILE *fp = fopen(path, "rbe");
    if (!fp) return trace_errf(err, cap, BT_ERR_IO, "%s: %s", path, strerror(errno));
    uint8_t *buf = NULL;
    bt_status_t st = BT_OK;
    if (fseek(fp, 0, SEEK_END) != 0) { st = trace_errf(err, cap, BT_ERR_IO, "%s: %s", path, strerror(errno)); goto out_file; }
    long size = ftell(fp);
    if (size < 0 || fseek(fp, 0, SEEK_SET) != 0) { st = trace_errf(err, cap, BT_ERR_IO, "%s: %s", path, strerror(errno)); goto out_file; }
    buf = malloc(size ? (size_t)size : 1);
    if (!buf) { st = trace_errf(err, cap, BT_ERR_NOMEM, "%s: out of memory (%ld bytes)", path, size); goto out_file; }
    if (fread(buf, 1, (size_t)size, fp) != (size_t)size) {
        st = trace_errf(err, cap, BT_ERR_IO, "%s: short read", path);
        goto out_buf;
    }
    st = trace_file_load_mem(buf, (size_t)size, path, f, err, cap);
out_buf:
    free(buf);
out_file:
    fclose(fp);
    return st;
}

static int trace_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every file of one run: the run ids and their file counts otherwise. */
static bt_status_t trace_runs_check(const char *dir, const trace_set_t *set, char *err, size_t cap)
{
    bool mixed = false;
    for (size_t i = 1; i < set->nfiles; i++)
        mixed |= strcmp(set->files[i].run_id, set->files[0].run_id) != 0;
    if (!mixed) return BT_OK;
    int n = snprintf(err, cap, "%s holds the traces of more than one run:", dir);
    for (size_t i = 0; i < set->nfiles && n >= 0 && (size_t)n < cap; i++) {
        bool first = true;
        for (size_t j = 0; j < i; j++) first &= strcmp(set->files[j].run_id, set->files[i].run_id) != 0;
        if (!first) continue;
        size_t count = 0;
        for (size_t j = i; j < set->nfiles; j++) count += !strcmp(set->files[j].run_id, set->files[i].run_id);
        n += snprintf(err + n, cap - (size_t)n, " %s (%zu file%s)",
                      set->files[i].run_id[0] ? set->files[i].run_id : "(no run id)", count,
                      count == 1 ? "" : "s");
    }
    if (n >= 0 && (size_t)n < cap)
        snprintf(err + n, cap - (size_t)n, "; merging them would mix two jobs: trace each run into a folder of its own "
                 "(trace.dir \"{run}/trace\" puts it in the run's directory) or remove the older files");
    return BT_ERR_INVALID;
}

bt_status_t trace_dir_load(const char *dir, trace_set_t *set, char *err, size_t cap)
{
    memset(set, 0, sizeof *set);
    DIR *d = opendir(dir);
    if (!d) return trace_errf(err, cap, BT_ERR_IO, "%s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0;
    bt_status_t st = BT_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "trace-", 6) || len < 10 || strcmp(e->d_name + len - 4, ".bin")) continue;
        char **nn = realloc(names, (n + 1) * sizeof *nn);
        if (!nn) { st = BT_ERR_NOMEM; break; }
        names = nn;
        if (!(names[n] = strdup(e->d_name))) { st = BT_ERR_NOMEM; break; }
        n++;
    }
    closedir(d);
    if (st == BT_OK && n == 0) st = trace_errf(err, cap, BT_ERR_NOT_FOUND, "%s: no trace-*.bin files", dir);
    if (st == BT_OK) {
        qsort(names, n, sizeof *names, trace_cmp_str);
        set->files = calloc(n, sizeof *set->files);
        if (!set->files) st = BT_ERR_NOMEM;
    }
    for (size_t i = 0; st == BT_OK && i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        st = trace_file_load(path, &set->files[i], err, cap);
        if (st == BT_OK) set->nfiles++;
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (st == BT_OK) st = trace_runs_check(dir, set, err, cap);
    if (st == BT_ERR_NOMEM) trace_errf(err, cap, st, "%s: out of memory", dir);
    if (st != BT_OK) trace_set_free(set);
    return st;
}

void trace_set_free(trace_set_t *set)
{
    for (size_t i = 0; i < set->nfiles; i++) trace_file_free(&set->files[i]);
    free(set->files);
    memset(set, 0, sizeof *set);
}

/* ---- joining sends with receives ----------------------------------------- */

typedef struct {
    actor_addr_t src, dst;
    uint32_t     type;
    uint64_t     seq;
    uint64_t     t;
    uint64_t     bytes;
    uint32_t     file;
    size_t       rec;
    int64_t      match; /* index of the paired ref on the other side, -1 */
} trace_ref_t;

static int trace_ref_cmp(const void *pa, const void *pb)
{
    const trace_ref_t *a = pa, *b = pb;
    if (a->src != b->src) return a->src < b->src ? -1 : 1;
    if (a->dst != b->dst) return a->dst < b->dst ? -1 : 1;
    if (a->type != b->type) return a->type < b->type ? -1 : 1;
    if (a->seq != b->seq) return a->seq < b->seq ? -1 : 1;
    if (a->t != b->t) return a->t < b->t ? -1 : 1;
    return 0;
}

static bool trace_ref_same_key(const trace_ref_t *a, const trace_ref_t *b)
{
    return a->src == b->src && a->dst == b->dst && a->type == b->type && a->seq == b->seq;
}

typedef struct {
    trace_ref_t *sends, *recvs;
    size_t       nsends, nrecvs;
} trace_join_t;

static void trace_join_free(trace_join_t *j)
{
    free(j->sends);
    free(j->recvs);
}

/* Collect every send and receive, sort both by (src, dst, type, seq, t) and
 * pair the k-th send of a key with its k-th receive. */
static bt_status_t trace_join(const trace_set_t *set, trace_join_t *j)
{
    memset(j, 0, sizeof *j);
    for (size_t fi = 0; fi < set->nfiles; fi++)
        for (size_t i = 0; i < set->files[fi].nrecs; i++) {
            uint8_t ev = set->files[fi].recs[i].ev;
            j->nsends += ev == TRACE_EV_SEND;
            j->nrecvs += ev == TRACE_EV_RECV;
        }
    j->sends = malloc((j->nsends + 1) * sizeof *j->sends);
    j->recvs = malloc((j->nrecvs + 1) * sizeof *j->recvs);
    if (!j->sends || !j->recvs) {
        trace_join_free(j);
        return BT_ERR_NOMEM;
    }
    size_t ns = 0, nr = 0;
    for (size_t fi = 0; fi < set->nfiles; fi++)
        for (size_t i = 0; i < set->files[fi].nrecs; i++) {
            const trace_rec_t *r = &set->files[fi].recs[i];
            trace_ref_t ref = {.type = r->msg_type, .seq = r->seq, .t = r->t0, .bytes = r->bytes,
                               .file = (uint32_t)fi, .rec = i, .match = -1};
            if (r->ev == TRACE_EV_SEND) {
                ref.src = r->actor;
                ref.dst = r->peer;
                j->sends[ns++] = ref;
            } else if (r->ev == TRACE_EV_RECV) {
                ref.src = r->peer;
                ref.dst = r->actor;
                j->recvs[nr++] = ref;
            }
        }
    qsort(j->sends, ns, sizeof *j->sends, trace_ref_cmp);
    qsort(j->recvs, nr, sizeof *j->recvs, trace_ref_cmp);
    size_t a = 0, b = 0;
    while (a < ns && b < nr) {
        trace_ref_t *s = &j->sends[a], *r = &j->recvs[b];
        if (trace_ref_same_key(s, r)) {
            s->match = (int64_t)b;
            r->match = (int64_t)a;
            a++;
            b++;
            continue;
        }
        /* compare keys without t */
        trace_ref_t sk = *s, rk = *r;
        sk.t = rk.t = 0;
        if (trace_ref_cmp(&sk, &rk) < 0) a++; else b++;
    }
    return BT_OK;
}

/* ---- names ------------------------------------------------------------- */

/* Actor names of the whole set, sorted by address (first file wins), so a
 * lookup per event is a binary search. */
typedef struct {
    actor_addr_t actor;
    uint32_t     order;
    const char  *name;
} trace_aname_t;

typedef struct {
    trace_aname_t *v;
    size_t         n;
} trace_anames_t;

static int trace_aname_cmp(const void *pa, const void *pb)
{
    const trace_aname_t *a = pa, *b = pb;
    if (a->actor != b->actor) return a->actor < b->actor ? -1 : 1;
    return a->order < b->order ? -1 : a->order > b->order;
}

static bt_status_t trace_anames_build(const trace_set_t *set, trace_anames_t *ix)
{
    size_t n = 0;
    for (size_t fi = 0; fi < set->nfiles; fi++) n += set->files[fi].nactors;
    ix->v = malloc((n + 1) * sizeof *ix->v);
    ix->n = 0;
    if (!ix->v) return BT_ERR_NOMEM;
    for (size_t fi = 0; fi < set->nfiles; fi++)
        for (uint32_t i = 0; i < set->files[fi].nactors; i++)
            if (set->files[fi].actor_names[i])
                ix->v[ix->n++] = (trace_aname_t){set->files[fi].actor_ids[i], (uint32_t)ix->n,
                                                 set->files[fi].actor_names[i]};
    qsort(ix->v, ix->n, sizeof *ix->v, trace_aname_cmp);
    size_t w = 0;
    for (size_t i = 0; i < ix->n; i++)
        if (w == 0 || ix->v[w - 1].actor != ix->v[i].actor) ix->v[w++] = ix->v[i];
    ix->n = w;
    return BT_OK;
}

/* The actor's name, else "r<rank>.a<slot>". */
static const char *trace_actor_label(const trace_anames_t *ix, actor_addr_t a, char *buf, size_t cap)
{
    size_t lo = 0, hi = ix->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ix->v[mid].actor < a) lo = mid + 1;
        else hi = mid;
    }
    if (lo < ix->n && ix->v[lo].actor == a) return ix->v[lo].name;
    snprintf(buf, cap, "r%u.a%u", actor_addr_rank(a), actor_addr_slot(a));
    return buf;
}

static const char *trace_name_of(const trace_file_t *f, uint32_t id)
{
    return id && id < f->nnames && f->names[id] ? f->names[id] : NULL;
}

static const char *const trace_kind_names[TRACE_SPAN_KIND_COUNT] = {
    [TRACE_SPAN_HANDLER] = "handler", [TRACE_SPAN_COMPUTE] = "compute", [TRACE_SPAN_COMM] = "comm",
    [TRACE_SPAN_IO] = "io", [TRACE_SPAN_OTHER] = "other",
};
_Static_assert(sizeof trace_kind_names / sizeof trace_kind_names[0] == TRACE_SPAN_KIND_COUNT, "span kind names");

/* ---- JSON ------------------------------------------------------------- */

/* A JSON string; bytes outside printable ASCII become '?' or \u escapes so
 * the output is valid JSON whatever a name holds. */
static void trace_json_str(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
        else if (*p < 0x20) fprintf(out, "\\u%04x", *p);
        else if (*p >= 0x7f) fputc('?', out);
        else fputc(*p, out);
    }
    fputc('"', out);
}

/* ns as microseconds with 3 decimals ("12.345"), without printf's floating
 * point (most of the merge time otherwise). buf needs 32 bytes. */
static const char *trace_us_str(char *buf, uint64_t ns)
{
    char tmp[24];
    int n = 0;
    uint64_t us = ns / 1000;
    do {
        tmp[n++] = (char)('0' + us % 10);
        us /= 10;
    } while (us);
    int k = 0;
    while (n) buf[k++] = tmp[--n];
    unsigned frac = (unsigned)(ns % 1000);
    buf[k++] = '.';
    buf[k++] = (char)('0' + frac / 100);
    buf[k++] = (char)('0' + frac / 10 % 10);
    buf[k++] = (char)('0' + frac % 10);
    buf[k] = '\0';
    return buf;
}

/* Track of an event: one per (actor, span kind); messages and handler spans
 * share the actor's main track. */
static uint64_t trace_tid(actor_addr_t a, unsigned kind)
{
    return ((uint64_t)actor_addr_slot(a) << 3) | (kind & 7u);
}

typedef struct {
    uint32_t     pid;
    uint64_t     tid;
    actor_addr_t actor;
    unsigned     kind;
} trace_track_t;

static int trace_track_cmp(const void *pa, const void *pb)
{
    const trace_track_t *a = pa, *b = pb;
    if (a->pid != b->pid) return a->pid < b->pid ? -1 : 1;
    if (a->tid != b->tid) return a->tid < b->tid ? -1 : 1;
    return 0;
}

static void trace_json_sep(FILE *out, bool *first)
{
    fputs(*first ? "\n" : ",\n", out);
    *first = false;
}

bt_status_t trace_json_write(const trace_set_t *set, FILE *out)
{
    trace_anames_t ix;
    if (trace_anames_build(set, &ix) != BT_OK) return BT_ERR_NOMEM;
    trace_join_t j;
    bt_status_t st = trace_join(set, &j);
    if (st != BT_OK) {
        free(ix.v);
        return st;
    }
    size_t total = 0;
    uint64_t t_min = UINT64_MAX;
    for (size_t fi = 0; fi < set->nfiles; fi++) {
        total += set->files[fi].nrecs;
        for (size_t i = 0; i < set->files[fi].nrecs; i++)
            if (set->files[fi].recs[i].t0 < t_min) t_min = set->files[fi].recs[i].t0;
    }
    if (t_min == UINT64_MAX) t_min = 0;
    trace_track_t *tracks = malloc((total + 1) * sizeof *tracks);
    if (!tracks) {
        trace_join_free(&j);
        free(ix.v);
        return BT_ERR_NOMEM;
    }
    size_t ntracks = 0;
    /* flow ids: per matched send, its index in j.sends; look up by (file, rec) */
    bool first = true;
    char lbl[64], lbl2[64];
    fputs("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[", out);
    for (size_t fi = 0; fi < set->nfiles; fi++) {
        const trace_file_t *f = &set->files[fi];
        trace_json_sep(out, &first);
        fprintf(out, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%u,\"tid\":0,\"args\":{\"name\":\"rank %u (pid %u)\"}}",
                f->rank, f->rank, f->pid);
        for (size_t i = 0; i < f->nrecs; i++) {
            const trace_rec_t *r = &f->recs[i];
            unsigned kind = r->ev == TRACE_EV_SPAN ? r->kind : TRACE_SPAN_HANDLER;
            uint64_t tid = trace_tid(r->actor, kind);
            tracks[ntracks++] = (trace_track_t){.pid = f->rank, .tid = tid, .actor = r->actor, .kind = kind};
            char ts[32], dur[32];
            trace_us_str(ts, r->t0 - t_min);
            const char *tname = msg_type_name(r->msg_type);
            trace_json_sep(out, &first);
            switch (r->ev) {
            case TRACE_EV_SPAN: {
                const char *name = trace_name_of(f, r->name_id);
                fputs("{\"ph\":\"X\",\"name\":", out);
                trace_json_str(out, name ? name : r->msg_type == 0xffff ? trace_kind_names[r->kind] : tname);
                fprintf(out, ",\"cat\":\"%s\",\"pid\":%u,\"tid\":%llu,\"ts\":%s,\"dur\":%s,"
                        "\"args\":{\"step\":%lld,\"mb\":%d,\"msg\":\"%s\"}}",
                        trace_kind_names[r->kind], f->rank, (unsigned long long)tid, ts,
                        trace_us_str(dur, r->t1 - r->t0), (long long)r->step, (int)r->mb,
                        r->msg_type == 0xffff ? "" : tname);
                break;
            }
            case TRACE_EV_SEND:
            case TRACE_EV_RECV: {
                bool send = r->ev == TRACE_EV_SEND;
                const char *peer = trace_actor_label(&ix, r->peer, lbl, sizeof lbl);
                fprintf(out, "{\"ph\":\"X\",\"name\":\"%s %s\",\"cat\":\"msg\",\"pid\":%u,\"tid\":%llu,\"ts\":%s,"
                        "\"dur\":0,\"args\":{\"%s\":",
                        send ? "send" : "recv", tname, f->rank, (unsigned long long)tid, ts, send ? "to" : "from");
                trace_json_str(out, peer);
                fprintf(out, ",\"bytes\":%llu,\"seq\":%llu,\"step\":%lld,\"mb\":%d}}", (unsigned long long)r->bytes,
                        (unsigned long long)r->seq, (long long)r->step, (int)r->mb);
                /* the flow, when both ends are known: find this record's ref */
                trace_ref_t key = {.src = send ? r->actor : r->peer, .dst = send ? r->peer : r->actor,
                                   .type = r->msg_type, .seq = r->seq, .t = r->t0};
                trace_ref_t *arr = send ? j.sends : j.recvs;
                size_t n = send ? j.nsends : j.nrecvs;
                trace_ref_t *hit = bsearch(&key, arr, n, sizeof *arr, trace_ref_cmp);
                /* equal (key, t) refs are interchangeable; walk to this record */
                while (hit && hit > arr && !trace_ref_cmp(hit - 1, &key)) hit--;
                while (hit && hit < arr + n && !trace_ref_cmp(hit, &key) && !(hit->file == fi && hit->rec == i)) hit++;
                if (hit && hit < arr + n && hit->file == fi && hit->rec == i && hit->match >= 0) {
                    size_t flow = send ? (size_t)(hit - arr) : (size_t)hit->match;
                    trace_json_sep(out, &first);
                    fprintf(out, "{\"ph\":\"%s\",\"name\":\"%s\",\"cat\":\"flow\",\"id\":%zu,\"pid\":%u,\"tid\":%llu,"
                            "\"ts\":%s%s}",
                            send ? "s" : "f", tname, flow, f->rank, (unsigned long long)tid, ts,
                            send ? "" : ",\"bp\":\"e\"");
                }
                break;
            }
            case TRACE_EV_INSTANT: {
                const char *name = trace_name_of(f, r->name_id);
                fputs("{\"ph\":\"i\",\"s\":\"t\",\"name\":", out);
                trace_json_str(out, name ? name : "instant");
                fprintf(out, ",\"pid\":%u,\"tid\":%llu,\"ts\":%s,\"args\":{\"step\":%lld}}", f->rank,
                        (unsigned long long)tid, ts, (long long)r->step);
                break;
            }
            case TRACE_EV_COUNTER: {
                const char *name = trace_name_of(f, r->name_id);
                snprintf(lbl2, sizeof lbl2, "%s", trace_actor_label(&ix, r->actor, lbl, sizeof lbl));
                char cname[128];
                snprintf(cname, sizeof cname, "%s %s", lbl2, name ? name : "counter");
                fputs("{\"ph\":\"C\",\"name\":", out);
                trace_json_str(out, cname);
                /* JSON has no NaN/Inf: such samples are written as 0 with a flag */
                bool fin = isfinite(r->value);
                fprintf(out, ",\"pid\":%u,\"ts\":%s,\"args\":{\"value\":%.17g%s}}", f->rank, ts, fin ? r->value : 0.0,
                        fin ? "" : ",\"nonfinite\":1");
                break;
            }
            default:
                BT_PANIC("trace: event kind %u passed validation", r->ev);
            }
        }
    }
    /* one name per track */
    qsort(tracks, ntracks, sizeof *tracks, trace_track_cmp);
    for (size_t i = 0; i < ntracks; i++) {
        if (i && !trace_track_cmp(&tracks[i], &tracks[i - 1])) continue;
        const trace_track_t *t = &tracks[i];
        const char *an = trace_actor_label(&ix, t->actor, lbl, sizeof lbl);
        char tn[128];
        if (t->kind == TRACE_SPAN_HANDLER) snprintf(tn, sizeof tn, "%s", an);
        else snprintf(tn, sizeof tn, "%s %s", an, trace_kind_names[t->kind]);
        trace_json_sep(out, &first);
        fprintf(out, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%u,\"tid\":%llu,\"args\":{\"name\":", t->pid,
                (unsigned long long)t->tid);
        trace_json_str(out, tn);
        fputs("}}", out);
        trace_json_sep(out, &first);
        fprintf(out, "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%u,\"tid\":%llu,\"args\":{\"sort_index\":%llu}}",
                t->pid, (unsigned long long)t->tid, (unsigned long long)t->tid);
    }
    fputs("\n]}\n", out);
    free(tracks);
    trace_join_free(&j);
    free(ix.v);
    return ferror(out) ? BT_ERR_IO : BT_OK;
}

/* ---- summary ------------------------------------------------------------ */

typedef struct {
    actor_addr_t actor;
    unsigned     kind;
    uint64_t     t0, t1;
} trace_ival_t;

static int trace_ival_cmp(const void *pa, const void *pb)
{
    const trace_ival_t *a = pa, *b = pb;
    if (a->actor != b->actor) return a->actor < b->actor ? -1 : 1;
    if (a->kind != b->kind) return a->kind < b->kind ? -1 : 1;
    if (a->t0 != b->t0) return a->t0 < b->t0 ? -1 : 1;
    return 0;
}

static int trace_i64_cmp(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    return a < b ? -1 : a > b;
}

bt_status_t trace_summary_compute(const trace_set_t *set, trace_summary_t *out)
{
    memset(out, 0, sizeof *out);
    trace_anames_t ix;
    if (trace_anames_build(set, &ix) != BT_OK) return BT_ERR_NOMEM;
    trace_join_t j;
    bt_status_t st = trace_join(set, &j);
    if (st != BT_OK) {
        free(ix.v);
        return st;
    }
    size_t total = 0;
    for (size_t fi = 0; fi < set->nfiles; fi++) {
        total += set->files[fi].nrecs;
        out->dropped += set->files[fi].dropped;
    }
    trace_ival_t *iv = malloc((total + 1) * sizeof *iv); /* spans, and every event as kind 7 for windows */
    int64_t *lat = malloc((j.nsends + 1) * sizeof *lat);
    out->edges = calloc(j.nsends + 1, sizeof *out->edges);
    if (!iv || !lat || !out->edges) {
        st = BT_ERR_NOMEM;
        goto out_free;
    }
    /* edges: sends are sorted by (src, dst, type, ...) so groups are runs */
    for (size_t a = 0; a < j.nsends;) {
        size_t b = a, nl = 0;
        trace_edge_stat_t *e = &out->edges[out->nedges++];
        e->src = j.sends[a].src;
        e->dst = j.sends[a].dst;
        e->msg_type = j.sends[a].type;
        while (b < j.nsends && j.sends[b].src == e->src && j.sends[b].dst == e->dst && j.sends[b].type == e->msg_type) {
            e->count++;
            e->bytes += j.sends[b].bytes;
            if (j.sends[b].match >= 0)
                lat[nl++] = (int64_t)(j.recvs[j.sends[b].match].t - j.sends[b].t);
            b++;
        }
        e->matched = nl;
        if (nl) {
            double sum = 0;
            for (size_t k = 0; k < nl; k++) sum += (double)lat[k];
            e->lat_mean_ns = sum / (double)nl;
            qsort(lat, nl, sizeof *lat, trace_i64_cmp);
            size_t rank = (size_t)ceil(0.99 * (double)nl); /* nearest rank, 1-based */
            e->lat_p99_ns = (double)lat[(rank ? rank : 1) - 1];
        }
        a = b;
    }
    for (size_t r = 0; r < j.nrecvs; r++) out->unmatched_recvs += j.recvs[r].match < 0;

    /* actors: union of spans per kind, window from every event */
    size_t n = 0;
    for (size_t fi = 0; fi < set->nfiles; fi++)
        for (size_t i = 0; i < set->files[fi].nrecs; i++) {
            const trace_rec_t *r = &set->files[fi].recs[i];
            iv[n++] = (trace_ival_t){.actor = r->actor, .kind = r->ev == TRACE_EV_SPAN ? r->kind : 7u,
                                     .t0 = r->t0, .t1 = r->t1};
        }
    qsort(iv, n, sizeof *iv, trace_ival_cmp);
    size_t nact = 0;
    for (size_t i = 0; i < n; i++) nact += i == 0 || iv[i].actor != iv[i - 1].actor;
    out->actors = calloc(nact + 1, sizeof *out->actors);
    if (!out->actors) {
        st = BT_ERR_NOMEM;
        goto out_free;
    }
    for (size_t a = 0; a < n;) {
        trace_actor_stat_t *s = &out->actors[out->nactors++];
        s->actor = iv[a].actor;
        char lbl[64];
        snprintf(s->name, sizeof s->name, "%s", trace_actor_label(&ix, s->actor, lbl, sizeof lbl));
        uint64_t wmin = UINT64_MAX, wmax = 0;
        size_t b = a;
        while (b < n && iv[b].actor == s->actor) {
            /* one kind: merge overlapping intervals (sorted by t0) */
            unsigned kind = iv[b].kind;
            uint64_t cur0 = iv[b].t0, cur1 = iv[b].t1, sum = 0;
            while (b < n && iv[b].actor == s->actor && iv[b].kind == kind) {
                if (iv[b].t0 < wmin) wmin = iv[b].t0;
                if (iv[b].t1 > wmax) wmax = iv[b].t1;
                if (iv[b].t0 > cur1) {
                    sum += cur1 - cur0;
                    cur0 = iv[b].t0;
                    cur1 = iv[b].t1;
                } else if (iv[b].t1 > cur1) {
                    cur1 = iv[b].t1;
                }
                b++;
            }
            sum += cur1 - cur0;
            if (kind < TRACE_SPAN_KIND_COUNT) s->span_ns[kind] = sum;
        }
        s->busy_ns = s->span_ns[TRACE_SPAN_COMPUTE];
        s->window_ns = wmax > wmin ? wmax - wmin : 0;
        s->idle_ns = s->window_ns > s->busy_ns ? s->window_ns - s->busy_ns : 0;
        s->busy_frac = s->window_ns ? (double)s->busy_ns / (double)s->window_ns : 0.0;
        a = b;
    }
out_free:
    free(iv);
    free(lat);
    free(ix.v);
    trace_join_free(&j);
    if (st != BT_OK) trace_summary_free(out);
    return st;
}

void trace_summary_print(const trace_summary_t *s, FILE *out)
{
    fprintf(out, "edges (send -> receive latency over matched pairs; CLOCK_MONOTONIC, same host):\n");
    fprintf(out, "  %-24s %-24s %-13s %9s %12s %9s %11s %11s\n", "src", "dst", "type", "count", "bytes", "received",
            "mean_us", "p99_us");
    for (size_t i = 0; i < s->nedges; i++) {
        const trace_edge_stat_t *e = &s->edges[i];
        char src[64], dst[64];
        const char *sn = NULL, *dn = NULL;
        for (size_t k = 0; k < s->nactors; k++) {
            if (s->actors[k].actor == e->src) sn = s->actors[k].name;
            if (s->actors[k].actor == e->dst) dn = s->actors[k].name;
        }
        snprintf(src, sizeof src, "%s", sn ? sn : "?");
        snprintf(dst, sizeof dst, "%s", dn ? dn : "?");
        fprintf(out, "  %-24s %-24s %-13s %9llu %12llu %9llu %11.3f %11.3f\n", src, dst, msg_type_name(e->msg_type),
                (unsigned long long)e->count, (unsigned long long)e->bytes, (unsigned long long)e->matched,
                e->lat_mean_ns / 1e3, e->lat_p99_ns / 1e3);
    }
    fprintf(out, "actors (busy = union of compute spans over the actor's first..last event):\n");
    fprintf(out, "  %-24s %11s %11s %11s %7s %11s %11s\n", "actor", "window_ms", "busy_ms", "idle_ms", "busy%",
            "handler_ms", "comm_ms");
    for (size_t i = 0; i < s->nactors; i++) {
        const trace_actor_stat_t *a = &s->actors[i];
        fprintf(out, "  %-24s %11.3f %11.3f %11.3f %6.1f%% %11.3f %11.3f\n", a->name, (double)a->window_ns / 1e6,
                (double)a->busy_ns / 1e6, (double)a->idle_ns / 1e6, 100.0 * a->busy_frac,
                (double)a->span_ns[TRACE_SPAN_HANDLER] / 1e6, (double)a->span_ns[TRACE_SPAN_COMM] / 1e6);
    }
    if (s->unmatched_recvs) fprintf(out, "receives without a traced send: %llu\n", (unsigned long long)s->unmatched_recvs);
    if (s->dropped) fprintf(out, "WARNING: %llu events were dropped (ring overflow): numbers are incomplete\n",
                            (unsigned long long)s->dropped);
}

void trace_summary_free(trace_summary_t *s)
{
    free(s->edges);
    free(s->actors);
    memset(s, 0, sizeof *s);
}
