/* Job files: schema-driven YAML reader, overrides and validation (job.h). */
#include "launch/job.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "base/tensor.h"
#include "ckpt/model_source.h"

#include <yaml.h>

/* ---- schema ------------------------------------------------------------- */

typedef enum {
    F_INT = 0, F_FLOAT, F_BOOL, F_STR, F_ENUM, F_INT_LIST, F_FLOAT_PAIR, F_STR_LIST, F_TYPE_COUNT
} field_type_t;

static const char *const field_type_desc[] = {
    [F_INT] = "an integer", [F_FLOAT] = "a number", [F_BOOL] = "true or false",
    [F_STR] = "a string", [F_ENUM] = "one of", [F_INT_LIST] = "a list of integers",
    [F_FLOAT_PAIR] = "a list of two numbers", [F_STR_LIST] = "a list of strings",
};
_Static_assert(sizeof field_type_desc / sizeof field_type_desc[0] == F_TYPE_COUNT,
               "field_type_desc must cover every field type");

typedef struct {
    const char *name;             /* "section.key", or "key" for a top-level field */
    field_type_t type;
    size_t off;                   /* offset of the value in job_t */
    double min, max;              /* inclusive range (numbers, list elements) */
    const char *const *enums;     /* F_ENUM names, indexed by the enum value */
    int n_enums;
    size_t cap;                   /* F_STR bytes; list capacity */
    size_t count_off;             /* lists: offset of the int element count */
} field_t;

static const char *const xport_names[] = {"auto", "inproc", "tcp", "ucx"};
_Static_assert(sizeof xport_names / sizeof xport_names[0] == JOB_XPORT_COUNT, "xport_names");
static const char *const sched_names[] = {"1f1b", "interleaved"};
_Static_assert(sizeof sched_names / sizeof sched_names[0] == JOB_SCHED_COUNT, "sched_names");
static const char *const warmup_names[] = {"zero", "min_lr"};
_Static_assert(sizeof warmup_names / sizeof warmup_names[0] == JOB_WARMUP_FROM_COUNT, "warmup_names");
static const char *const dtype_names[] = {"fp32", "bf16"};
_Static_assert(sizeof dtype_names / sizeof dtype_names[0] == JOB_DTYPE_COUNT, "dtype_names");
static const char *const attention_names[] = {"default", "precise", "fast", "cudnn", "simt"};
_Static_assert(sizeof attention_names / sizeof attention_names[0] == JOB_ATTN_COUNT,
               "attention_names");

const char *job_attention_env(job_attention_t a)
{
    return a > JOB_ATTN_DEFAULT && a < JOB_ATTN_COUNT ? attention_names[a] : NULL;
}

static const char *const decay_names[] = {"matrices", "all", "none"};
_Static_assert(sizeof decay_names / sizeof decay_names[0] == JOB_DECAY_COUNT, "decay_names");
static const char *const handoff_names[] = {"auto", "ipc", "off"};
static const char *const cp_mode_names[] = {"allgather", "ring"};
_Static_assert(sizeof cp_mode_names / sizeof cp_mode_names[0] == JOB_CP_MODE_COUNT, "cp_mode_names");
static const char *const cp_exchange_names[] = {"auto", "messages", "collective"};
_Static_assert(sizeof cp_exchange_names / sizeof cp_exchange_names[0] == JOB_CPX_COUNT, "cp_exchange_names");
static const char *const coll_names[] = {"auto", "host", "nccl"}; /* coll_backend_name's */
_Static_assert(sizeof coll_names / sizeof coll_names[0] == COLL_BACKEND_COUNT, "coll_names");
_Static_assert(sizeof handoff_names / sizeof handoff_names[0] == JOB_HANDOFF_COUNT, "handoff_names");
static const char *const edge_names[] = {"control", "pipeline", "data_parallel",
                                         "tensor_parallel", "checkpoint"};
_Static_assert(sizeof edge_names / sizeof edge_names[0] == JOB_EDGE_COUNT, "edge_names");

#define BIG 9.0e15
#define OFF(member) offsetof(job_t, member)
#define INT(n, m, lo, hi)   {n, F_INT, OFF(m), lo, hi, NULL, 0, 0, 0}
#define FLT(n, m, lo, hi)   {n, F_FLOAT, OFF(m), lo, hi, NULL, 0, 0, 0}
#define BOOL(n, m)          {n, F_BOOL, OFF(m), 0, 0, NULL, 0, 0, 0}
#define STR(n, m)           {n, F_STR, OFF(m), 0, 0, NULL, 0, sizeof(((job_t *)0)->m), 0}
#define ENUM(n, m, names)   {n, F_ENUM, OFF(m), 0, 0, names, (int)(sizeof names / sizeof names[0]), 0, 0}
#define EDGE(n, e)          ENUM("transport." n, transport[e], xport_names)

static const field_t fields[] = {
    STR("model.hf", model.hf),
    INT("model.layers", model.layers, 1, 4096),
    INT("model.hidden", model.hidden, 1, 1 << 20),
    INT("model.heads", model.heads, 1, 4096),
    INT("model.kv_heads", model.kv_heads, 0, 4096),
    INT("model.ffn", model.ffn, 0, 1 << 22),
    INT("model.vocab", model.vocab, 0, 1 << 24),
    INT("model.seq", model.seq, 0, 1 << 24),
    FLT("model.rope_theta", model.rope_theta, 1e-6, 1e12),
    FLT("model.norm_eps", model.norm_eps, 1e-30, 1),
    FLT("model.init_std", model.init_std, 0, 10),
    INT("model.init_seed", model.init_seed, -1, BIG),
    BOOL("model.tie_embeddings", model.tie_embeddings),

    STR("data.dir", data.dir),
    STR("data.val_dir", data.val_dir),
    INT("data.seq_len", data.seq_len, 1, 1 << 24),
    FLT("data.split", data.split, 0, 0.9),

    INT("train.steps", train.steps, 1, BIG),
    INT("train.micro_batch", train.micro_batch, 1, 1 << 20),
    INT("train.grad_accum", train.grad_accum, 1, 1 << 20),
    INT("train.global_batch", train.global_batch, 0, 1 << 30),
    INT("train.global_batch_tokens", train.global_batch_tokens, 0, BIG),
    INT("train.seed", train.seed, 0, BIG),
    INT("train.eval_every", train.eval_every, 0, BIG),
    INT("train.eval_batches", train.eval_batches, 0, 1 << 20),
    INT("train.log_every", train.log_every, 1, BIG),
    INT("train.max_skipped_steps", train.max_skipped_steps, 0, BIG),
    INT("train.stop_after", train.stop_after, 0, BIG),

    FLT("optim.lr", optim.lr, 0, 10),
    FLT("optim.min_lr", optim.min_lr, 0, 10),
    INT("optim.warmup", optim.warmup, 0, BIG),
    ENUM("optim.warmup_from", optim.warmup_from, warmup_names),
    {"optim.betas", F_FLOAT_PAIR, OFF(optim.betas), 0, 0.999999999, NULL, 0, 2, 0},
    FLT("optim.eps", optim.eps, 1e-30, 1),
    FLT("optim.weight_decay", optim.weight_decay, 0, 10),
    FLT("optim.clip", optim.clip, 0, 1e9),
    ENUM("optim.decay", optim.decay, decay_names),

    INT("parallel.tp", parallel.tp, 1, 4096),
    INT("parallel.pp", parallel.pp, 1, 4096),
    INT("parallel.dp", parallel.dp, 1, 1 << 20),
    INT("parallel.cp", parallel.cp, 1, 1024),
    ENUM("parallel.cp_mode", parallel.cp_mode, cp_mode_names),
    ENUM("parallel.cp_exchange", parallel.cp_exchange, cp_exchange_names),
    INT("parallel.ep", parallel.ep, 1, 256),
    {"parallel.split", F_INT_LIST, OFF(parallel.split), 1, 4096, NULL, 0, JOB_MAX_STAGES,
     OFF(parallel.n_split)},
    INT("parallel.virtual_stages", parallel.virtual_stages, 1, 64),
    ENUM("parallel.schedule", parallel.schedule, sched_names),
    INT("parallel.microbatches", parallel.microbatches, 0, 1 << 20),
    BOOL("parallel.zero1", parallel.zero1),
    BOOL("parallel.sequence_parallel", parallel.sequence_parallel),
    ENUM("parallel.collectives", parallel.collectives, coll_names),

    EDGE("control", JOB_EDGE_CONTROL),
    EDGE("pipeline", JOB_EDGE_PIPELINE),
    EDGE("data_parallel", JOB_EDGE_DATA_PARALLEL),
    EDGE("tensor_parallel", JOB_EDGE_TENSOR_PARALLEL),
    EDGE("checkpoint", JOB_EDGE_CKPT),
    ENUM("transport.handoff", handoff, handoff_names),

    {"hosts", F_STR_LIST, OFF(hosts), 0, 0, NULL, 0, JOB_MAX_HOSTS, OFF(n_hosts)},
    {"launch.ssh", F_STR_LIST, OFF(launch.ssh), 0, 0, NULL, 0, JOB_MAX_SSH_OPTS, OFF(launch.n_ssh)},
    STR("launch.workdir", launch.workdir),
    STR("launch.baton", launch.baton),
    FLT("launch.heartbeat_timeout", launch.heartbeat_timeout, 0.1, 86400),
    FLT("launch.heartbeat_interval", launch.heartbeat_interval, 0.05, 3600),
    FLT("launch.step_timeout", launch.step_timeout, 0.1, 1e7),
    FLT("launch.collective_timeout", launch.collective_timeout, 0.001, 86400),
    INT("restart.max", restart.max, 0, 1000),
    INT("restart.host_failures", restart.host_failures, 0, 1000),
    STR("device", device),
    ENUM("dtype", dtype, dtype_names),
    ENUM("attention", attention, attention_names),

    STR("export.dir", export.dir),
    INT("export.every", export.every, 0, BIG),
    STR("export.tokenizer", export.tokenizer),
    STR("checkpoint.dir", checkpoint.dir),
    INT("checkpoint.every", checkpoint.every, 0, BIG),
    INT("checkpoint.keep", checkpoint.keep, 0, 1 << 20),
    STR("trace.dir", trace_dir),
    STR("metrics.file", metrics.file),
    STR("metrics.plot", metrics.plot),
    STR("metrics.throughput_plot", metrics.throughput_plot),
    STR("metrics.tensorboard", metrics.tensorboard),
    BOOL("metrics.log_scale", metrics.log_scale),
    STR("runs", runs),
};
#define N_FIELDS ((int)(sizeof fields / sizeof fields[0]))
_Static_assert(sizeof fields / sizeof fields[0] <= JOB_MAX_FIELDS, "raise JOB_MAX_FIELDS");

int job_field_count(void) { return N_FIELDS; }
const char *job_field_name(int i) { return i >= 0 && i < N_FIELDS ? fields[i].name : NULL; }
const char *job_xport_name(job_xport_t x) { return x < JOB_XPORT_COUNT ? xport_names[x] : "?"; }
const char *job_edge_name(job_edge_t e) { return e < JOB_EDGE_COUNT ? edge_names[e] : "?"; }

static int field_find(const char *name)
{
    for (int i = 0; i < N_FIELDS; i++)
        if (!strcmp(fields[i].name, name)) return i;
    return -1;
}

/* Levenshtein distance of a and b (short names: a row on the stack). */
static int edit_distance(const char *a, const char *b)
{
    size_t n = strlen(b);
    if (n > 127) return 1 << 20;
    int row[128];
    for (size_t j = 0; j <= n; j++) row[j] = (int)j;
    for (size_t i = 1; a[i - 1]; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= n; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[n];
}

/* "unknown key" with the nearest known field when one is close (a third of
 * the name's length, at least 2 edits; the key alone counts too, so that
 * `train.stpes` and `optim.steps` both find train.steps). */
static void unknown_key_text(const char *name, char *out, size_t cap)
{
    int best = -1, best_d = 1 << 20;
    const char *dot = strchr(name, '.');
    for (int i = 0; i < N_FIELDS; i++) {
        int d = edit_distance(name, fields[i].name);
        const char *fdot = strchr(fields[i].name, '.');
        if (dot && fdot && !strcmp(dot, fdot) && d > 1) d = 2; /* right key, wrong section */
        if (d < best_d) best_d = d, best = i;
    }
    int limit = (int)strlen(name) / 3;
    if (limit < 2) limit = 2;
    if (best >= 0 && best_d <= limit)
        snprintf(out, cap, "unknown key (did you mean %s?)", fields[best].name);
    else
        snprintf(out, cap, "unknown key (docs/JOBS.md lists every field)");
}

/* A top-level key that names a section ("optim") rather than a field. */
static bool section_exists(const char *name)
{
    size_t n = strlen(name);
    for (int i = 0; i < N_FIELDS; i++)
        if (!strncmp(fields[i].name, name, n) && fields[i].name[n] == '.') return true;
    return false;
}

void job_defaults(job_t *job)
{
    memset(job, 0, sizeof *job);
    job->model = (job_model_t){
        .layers = 2, .hidden = 64, .heads = 4, .kv_heads = 0, .ffn = 0, .vocab = 0, .seq = 0,
        .rope_theta = 10000.0, .norm_eps = 1e-5, .init_std = 0.02, .init_seed = -1,
        .tie_embeddings = false,
    };
    job->data = (job_data_t){.seq_len = 128, .split = 0.1};
    job->train = (job_train_t){.steps = 100, .micro_batch = 4, .grad_accum = 1, .seed = 1234,
                               .eval_every = 0, .eval_batches = 8, .log_every = 10,
                               .max_skipped_steps = 5};
    job->optim = (job_optim_t){.lr = 3e-4, .min_lr = 3e-5, .warmup = 0,
                               .warmup_from = JOB_WARMUP_FROM_ZERO, .betas = {0.9, 0.95},
                               .eps = 1e-8, .weight_decay = 0.1, .clip = 1.0,
                               .decay = JOB_DECAY_MATRICES};
    job->parallel = (job_parallel_t){.tp = 1, .pp = 1, .dp = 1, .cp = 1, .ep = 1, .n_split = 0,
                                     .virtual_stages = 1, .schedule = JOB_SCHED_1F1B,
                                     .microbatches = 0, .zero1 = false};
    for (int e = 0; e < JOB_EDGE_COUNT; e++) job->transport[e] = JOB_XPORT_AUTO;
    snprintf(job->hosts[0], JOB_HOST_MAX, "local");
    job->n_hosts = 1;
    job->launch.heartbeat_timeout = 5;
    job->launch.heartbeat_interval = 1;
    job->restart.host_failures = 2;
    job->launch.step_timeout = 300;
    job->launch.collective_timeout = 30;
    snprintf(job->device, sizeof job->device, "cpu");
    job->dtype = JOB_DTYPE_FP32;
    job->checkpoint.keep = 3;
    /* every run writes into a directory of its own (launch/rundir.h) */
    snprintf(job->metrics.file, sizeof job->metrics.file, "{run}/metrics.jsonl");
    snprintf(job->metrics.plot, sizeof job->metrics.plot, "{run}/loss.png");
    snprintf(job->metrics.throughput_plot, sizeof job->metrics.throughput_plot, "{run}/throughput.png");
    snprintf(job->metrics.tensorboard, sizeof job->metrics.tensorboard, "{run}/tensorboard");
    snprintf(job->runs, sizeof job->runs, "runs");
}

/* ---- errors ------------------------------------------------------------- */

/* Where a message points: the file position of a YAML node, or an override. */
typedef struct {
    const char *file;     /* job file name, NULL for an override */
    const char *override; /* the --set text */
    const char *option;   /* or the command-line option that set the field (job_override_as) */
    int line, col;        /* 1-based */
} where_t;

static void where_fmt(char *err, size_t errlen, const where_t *w, const char *field,
                      const char *fmt, va_list ap)
{
    int n;
    if (w->option)
        n = snprintf(err, errlen, "%s: %s: ", w->option, field);
    else if (w->override && strlen(w->override) > 80) /* keep the reason in the message */
        n = snprintf(err, errlen, "--set %.60s...(%zu bytes): %s: ", w->override,
                     strlen(w->override), field);
    else if (w->override)
        n = snprintf(err, errlen, "--set %s: %s: ", w->override, field);
    else if (w->line > 0)
        n = snprintf(err, errlen, "%s:%d:%d: %s: ", w->file, w->line, w->col, field);
    else
        n = snprintf(err, errlen, "%s: %s: ", w->file, field);
    if (n < 0 || (size_t)n >= errlen) return;
    vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
}

static bt_status_t fail_at(char *err, size_t errlen, const where_t *w, const char *field,
                           const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static bt_status_t fail_at(char *err, size_t errlen, const where_t *w, const char *field,
                           const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen) where_fmt(err, errlen, w, field, fmt, ap);
    va_end(ap);
    return BT_ERR_INVALID;
}

static where_t where_node(const char *file, const yaml_node_t *node)
{
    return (where_t){.file = file, .line = (int)node->start_mark.line + 1,
                     .col = (int)node->start_mark.column + 1};
}

/* ---- scalar conversion -------------------------------------------------- */

static bool scalar_is_plain(const yaml_node_t *n)
{
    return n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE ||
           n->data.scalar.style == YAML_ANY_SCALAR_STYLE;
}

static const char *scalar_text(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

/* How a scalar reads as a number: a value, not a number at all, or a number
 * outside what the C type holds (reported with the field's range, not as
 * "not a number": 99999999999999999999 is an integer, just a huge one). */
typedef enum { NUM_OK = 0, NUM_BAD, NUM_HUGE } num_parse_t;

static num_parse_t parse_int(const char *s, int64_t *out)
{
    if (!*s) return NUM_BAD;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 0);
    if (!*end && errno == ERANGE) return NUM_HUGE;
    if (errno || *end) {
        /* Accept integral values written as 1e3 or 2.0. */
        errno = 0;
        double d = strtod(s, &end);
        if (*end || end == s) return NUM_BAD;
        if (isnan(d)) return NUM_BAD;
        if (errno == ERANGE && fabs(d) > 1) return NUM_HUGE; /* 1e400 */
        if (d != floor(d)) return NUM_BAD;
        if (fabs(d) > 9.2e18) return NUM_HUGE;
        v = (long long)d;
    }
    *out = v;
    return NUM_OK;
}

static num_parse_t parse_float(const char *s, double *out)
{
    if (!*s) return NUM_BAD;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (*end || end == s || isnan(v)) return NUM_BAD;
    /* 1e400 and inf are too large; 1e-400 underflows to 0 (or a denormal),
     * which the field's range then judges */
    if ((errno == ERANGE && fabs(v) > 1) || !isfinite(v)) return NUM_HUGE;
    *out = v;
    return NUM_OK;
}

static bool parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "True", "TRUE", "yes", "on"};
    static const char *const no[] = {"false", "False", "FALSE", "no", "off"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        if (!strcmp(s, yes[i])) { *out = true; return true; }
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (!strcmp(s, no[i])) { *out = false; return true; }
    return false;
}

/* The field's inclusive range as text: integers in full ("[1, 16777216]",
 * not %g's "[1, 1.67772e+07]"), numbers with %g. */
static void range_fmt(const field_t *f, bool integral, char *buf, size_t cap)
{
    if (integral)
        snprintf(buf, cap, "[%lld, %lld]", (long long)f->min, (long long)f->max);
    else
        snprintf(buf, cap, "[%g, %g]", f->min, f->max);
}

static bt_status_t out_of_range(const field_t *f, bool integral, const where_t *w, const char *text,
                                char *err, size_t errlen)
{
    char range[96];
    range_fmt(f, integral, range, sizeof range);
    return fail_at(err, errlen, w, f->name, "%s is out of range %s", text, range);
}

/* One scalar element of a numeric field (or list element). */
static bt_status_t scalar_number(const field_t *f, bool integral, const yaml_node_t *n,
                                 const where_t *w, double *out, char *err, size_t errlen)
{
    const char *want = integral ? "an integer" : "a number";
    if (n->type != YAML_SCALAR_NODE)
        return fail_at(err, errlen, w, f->name, "expected %s, got a %s", want,
                       n->type == YAML_MAPPING_NODE ? "mapping" : "list");
    const char *s = scalar_text(n);
    if (!scalar_is_plain(n))
        return fail_at(err, errlen, w, f->name, "expected %s, got the quoted string '%s'", want, s);
    num_parse_t r;
    if (integral) {
        int64_t v = 0;
        r = parse_int(s, &v);
        *out = (double)v;
    } else {
        r = parse_float(s, out);
    }
    if (r == NUM_HUGE) return out_of_range(f, integral, w, s, err, errlen);
    if (r == NUM_BAD) return fail_at(err, errlen, w, f->name, "expected %s, got '%s'", want, s);
    if (*out < f->min || *out > f->max) return out_of_range(f, integral, w, s, err, errlen);
    return BT_OK;
}

/* Store a YAML node into field f of job. */
static bt_status_t field_set(job_t *job, int fi, yaml_document_t *doc, yaml_node_t *n,
                             const where_t *w, char *err, size_t errlen)
{
    const field_t *f = &fields[fi];
    char *base = (char *)job + f->off;
    bt_status_t st = BT_OK;
    double d;

    switch (f->type) {
    case F_INT:
        if ((st = scalar_number(f, true, n, w, &d, err, errlen))) return st;
        *(int64_t *)base = (int64_t)d;
        break;
    case F_FLOAT:
        if ((st = scalar_number(f, false, n, w, &d, err, errlen))) return st;
        *(double *)base = d;
        break;
    case F_BOOL:
        if (n->type != YAML_SCALAR_NODE || !scalar_is_plain(n) ||
            !parse_bool(scalar_text(n), (bool *)base))
            return fail_at(err, errlen, w, f->name, "expected true or false, got %s%s%s",
                           n->type == YAML_SCALAR_NODE ? "'" : "a ",
                           n->type == YAML_SCALAR_NODE ? scalar_text(n) :
                           n->type == YAML_MAPPING_NODE ? "mapping" : "list",
                           n->type == YAML_SCALAR_NODE ? "'" : "");
        break;
    case F_STR:
        if (n->type != YAML_SCALAR_NODE)
            return fail_at(err, errlen, w, f->name, "expected a string, got a %s%s",
                           n->type == YAML_MAPPING_NODE ? "mapping" : "list",
                           n->type == YAML_MAPPING_NODE ? " (a path starting with {run} needs quotes: "
                                                          "\"{run}/...\")" : "");
        if (n->data.scalar.length >= f->cap)
            return fail_at(err, errlen, w, f->name, "string longer than %zu bytes", f->cap - 1);
        memcpy(base, n->data.scalar.value, n->data.scalar.length);
        base[n->data.scalar.length] = '\0';
        break;
    case F_ENUM: {
        if (n->type == YAML_SCALAR_NODE) {
            for (int i = 0; i < f->n_enums; i++)
                if (!strcmp(scalar_text(n), f->enums[i])) { *(int *)base = i; return BT_OK; }
        }
        char names[256] = "";
        for (int i = 0; i < f->n_enums; i++) {
            strncat(names, f->enums[i], sizeof names - strlen(names) - 1);
            if (i + 1 < f->n_enums) strncat(names, "|", sizeof names - strlen(names) - 1);
        }
        return fail_at(err, errlen, w, f->name, "expected one of %s, got %s%s%s", names,
                       n->type == YAML_SCALAR_NODE ? "'" : "a ",
                       n->type == YAML_SCALAR_NODE ? scalar_text(n) : "non-scalar",
                       n->type == YAML_SCALAR_NODE ? "'" : "");
    }
    case F_INT_LIST:
    case F_FLOAT_PAIR:
    case F_STR_LIST: {
        if (f->off == OFF(parallel.split)) { /* a list of layer counts, or balanced */
            job->parallel.split_balanced = n->type == YAML_SCALAR_NODE && scalar_is_plain(n) &&
                                           !strcmp(scalar_text(n), "balanced");
            if (job->parallel.split_balanced) {
                job->parallel.n_split = 0;
                break;
            }
            if (n->type != YAML_SEQUENCE_NODE)
                return fail_at(err, errlen, w, f->name,
                               "expected a list of layer counts per stage or balanced");
        }
        if (n->type == YAML_SCALAR_NODE && f->type == F_STR_LIST) {
            /* hosts: local  ==  hosts: [local] */
            if (n->data.scalar.length >= JOB_HOST_MAX)
                return fail_at(err, errlen, w, f->name, "name longer than %d bytes", JOB_HOST_MAX - 1);
            snprintf(base, JOB_HOST_MAX, "%s", scalar_text(n));
            *(int *)((char *)job + f->count_off) = 1;
            break;
        }
        if (n->type != YAML_SEQUENCE_NODE)
            return fail_at(err, errlen, w, f->name, "expected %s", field_type_desc[f->type]);
        int count = (int)(n->data.sequence.items.top - n->data.sequence.items.start);
        if (f->type == F_FLOAT_PAIR && count != 2)
            return fail_at(err, errlen, w, f->name, "expected exactly 2 entries, got %d", count);
        if ((size_t)count > f->cap)
            return fail_at(err, errlen, w, f->name, "expected at most %zu entries, got %d", f->cap,
                           count);
        for (int i = 0; i < count; i++) {
            yaml_node_t *item = yaml_document_get_node(doc, n->data.sequence.items.start[i]);
            where_t wi = w->override ? *w : where_node(w->file, item);
            if (f->type == F_STR_LIST) {
                if (item->type != YAML_SCALAR_NODE || item->data.scalar.length == 0 ||
                    item->data.scalar.length >= JOB_HOST_MAX)
                    return fail_at(err, errlen, &wi, f->name, "entry %d: expected a non-empty name", i);
                snprintf(base + (size_t)i * JOB_HOST_MAX, JOB_HOST_MAX, "%s", scalar_text(item));
            } else if (f->type == F_INT_LIST) {
                if ((st = scalar_number(f, true, item, &wi, &d, err, errlen))) return st;
                ((int64_t *)base)[i] = (int64_t)d;
            } else {
                if ((st = scalar_number(f, false, item, &wi, &d, err, errlen))) return st;
                ((double *)base)[i] = d;
            }
        }
        if (f->count_off) *(int *)((char *)job + f->count_off) = count;
        break;
    }
    default:
        BT_PANIC("field type %d", (int)f->type);
    }
    return BT_OK;
}

/* ---- documents ---------------------------------------------------------- */

static bt_status_t node_field(job_t *job, const char *file, const char *name, yaml_document_t *doc,
                              yaml_node_t *key, yaml_node_t *val, char *err, size_t errlen)
{
    where_t wk = where_node(file, key);
    int fi = field_find(name);
    char unk[160];
    if (fi < 0) {
        unknown_key_text(name, unk, sizeof unk);
        return fail_at(err, errlen, &wk, name, "%s", unk);
    }
    if (job->origin[fi].set && !job->origin[fi].from_override)
        return fail_at(err, errlen, &wk, name, "duplicate key (first set on line %d)",
                       job->origin[fi].line);
    where_t wv = where_node(file, val);
    bt_status_t st = field_set(job, fi, doc, val, &wv, err, errlen);
    if (st) return st;
    job->origin[fi] = (job_origin_t){.set = true, .line = wk.line, .col = wk.col};
    return BT_OK;
}

static bt_status_t doc_apply(job_t *job, const char *file, yaml_document_t *doc, char *err,
                             size_t errlen)
{
    yaml_node_t *root = yaml_document_get_root_node(doc);
    if (!root) return fail_at(err, errlen, &(where_t){.file = file}, "(file)", "empty job file");
    if (root->type != YAML_MAPPING_NODE) {
        where_t w = where_node(file, root);
        return fail_at(err, errlen, &w, "(top level)", "expected a mapping of sections");
    }
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        yaml_node_t *key = yaml_document_get_node(doc, p->key);
        yaml_node_t *val = yaml_document_get_node(doc, p->value);
        where_t wk = where_node(file, key);
        if (key->type != YAML_SCALAR_NODE)
            return fail_at(err, errlen, &wk, "(top level)", "keys must be plain names");
        const char *k = scalar_text(key);
        for (yaml_node_pair_t *q = root->data.mapping.pairs.start; q < p; q++) {
            yaml_node_t *prev = yaml_document_get_node(doc, q->key);
            if (prev->type == YAML_SCALAR_NODE && !strcmp(scalar_text(prev), k))
                return fail_at(err, errlen, &wk, k, "duplicate section (first on line %d)",
                               (int)prev->start_mark.line + 1);
        }
        bt_status_t st;
        if (field_find(k) >= 0) {
            if ((st = node_field(job, file, k, doc, key, val, err, errlen))) return st;
            continue;
        }
        if (!section_exists(k)) {
            /* the nearest section or top-level field */
            int best_d = 1 << 20;
            char best[64] = "";
            for (int i = 0; i < N_FIELDS; i++) {
                const char *dot = strchr(fields[i].name, '.');
                char cand[64];
                snprintf(cand, sizeof cand, "%.*s", dot ? (int)(dot - fields[i].name) : 63, fields[i].name);
                int d = edit_distance(k, cand);
                if (d < best_d) best_d = d, snprintf(best, sizeof best, "%s", cand);
            }
            int limit = (int)strlen(k) / 3 < 2 ? 2 : (int)strlen(k) / 3;
            if (best_d <= limit || (strlen(best) >= 3 && !strncmp(k, best, strlen(best))))
                return fail_at(err, errlen, &wk, k, "unknown section (did you mean %s?)", best);
            return fail_at(err, errlen, &wk, k, "unknown section (known: model, data, train, "
                           "optim, parallel, transport, hosts, launch, device, dtype, export, checkpoint, "
                           "trace, metrics, runs)");
        }
        if (val->type == YAML_SCALAR_NODE && val->data.scalar.length == 0) continue; /* "trace:" */
        if (val->type != YAML_MAPPING_NODE) {
            where_t wv = where_node(file, val);
            return fail_at(err, errlen, &wv, k, "expected a mapping of %s.* keys", k);
        }
        for (yaml_node_pair_t *q = val->data.mapping.pairs.start; q < val->data.mapping.pairs.top; q++) {
            yaml_node_t *sk = yaml_document_get_node(doc, q->key);
            yaml_node_t *sv = yaml_document_get_node(doc, q->value);
            if (sk->type != YAML_SCALAR_NODE) {
                where_t w = where_node(file, sk);
                return fail_at(err, errlen, &w, k, "keys must be plain names");
            }
            char name[128];
            snprintf(name, sizeof name, "%s.%s", k, scalar_text(sk));
            if ((st = node_field(job, file, name, doc, sk, sv, err, errlen))) return st;
        }
    }
    return BT_OK;
}

/* libyaml builds a document in time that grows with the square of its
 * nesting depth (a 400 KB file of 200 000 nested "[" took minutes), and a
 * job file needs three levels (section, field, list). So before loading,
 * one pass over the events counts the depth and stops at the first node
 * deeper than JOB_YAML_MAX_DEPTH, naming its line; a syntax error found on
 * the way is left to the loader, which reports it in the usual form. */
static bt_status_t yaml_depth_check(const char *text, size_t len, const where_t *base,
                                    const char *field, char *err, size_t errlen)
{
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) BT_PANIC("yaml_parser_initialize");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    bt_status_t st = BT_OK;
    int depth = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) break; /* the loader reports it */
        yaml_event_type_t type = ev.type;
        if (type == YAML_SEQUENCE_START_EVENT || type == YAML_MAPPING_START_EVENT) {
            if (++depth > JOB_YAML_MAX_DEPTH) {
                where_t w = *base;
                if (!w.override) {
                    w.line = (int)ev.start_mark.line + 1;
                    w.col = (int)ev.start_mark.column + 1;
                }
                st = fail_at(err, errlen, &w, field,
                             "nested deeper than %d levels (the limit for job files; a job "
                             "needs 3)", JOB_YAML_MAX_DEPTH);
            }
        } else if (type == YAML_SEQUENCE_END_EVENT || type == YAML_MAPPING_END_EVENT) {
            depth--;
        }
        yaml_event_delete(&ev);
        if (st || type == YAML_STREAM_END_EVENT) break;
    }
    yaml_parser_delete(&parser);
    return st;
}

bt_status_t job_load_buffer(const char *name, const char *yaml, size_t len, job_t *job, char *err,
                            size_t errlen)
{
    job_defaults(job);
    snprintf(job->path, sizeof job->path, "%s", name);
    where_t w = {.file = name};
    if (len > JOB_FILE_MAX_BYTES)
        return fail_at(err, errlen, &w, "(file)", "%zu bytes, more than the %u-byte limit for job "
                       "files", len, (unsigned)JOB_FILE_MAX_BYTES);
    bt_status_t st = yaml_depth_check(yaml, len, &w, "(file)", err, errlen);
    if (st) return st;
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) BT_PANIC("yaml_parser_initialize");
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    if (!yaml_parser_load(&parser, &doc)) {
        w.line = (int)parser.problem_mark.line + 1;
        w.col = (int)parser.problem_mark.column + 1;
        st = fail_at(err, errlen, &w, "(syntax)", "%s%s%s", parser.problem ? parser.problem : "YAML error",
                     parser.context ? " " : "", parser.context ? parser.context : "");
        goto out_parser;
    }
    st = doc_apply(job, name, &doc, err, errlen);
    yaml_document_delete(&doc);
out_parser:
    yaml_parser_delete(&parser);
    return st;
}

bt_status_t job_load_string(const char *name, const char *yaml, job_t *job, char *err, size_t errlen)
{
    return job_load_buffer(name, yaml, strlen(yaml), job, err, errlen);
}

bt_status_t job_load(const char *path, job_t *job, char *err, size_t errlen)
{
    job_defaults(job);
    snprintf(job->path, sizeof job->path, "%s", path);
    FILE *f = fopen(path, "rbe");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open job file: %s", path, strerror(errno));
        return BT_ERR_INVALID;
    }
    /* Read at most one byte past the limit: a larger file (or an endless
     * pipe) is refused without reading it all. */
    bt_status_t st = BT_ERR_INVALID;
    char *buf = malloc((size_t)JOB_FILE_MAX_BYTES + 2);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory", path);
        goto close_file;
    }
    size_t len = fread(buf, 1, (size_t)JOB_FILE_MAX_BYTES + 1, f);
    if (ferror(f)) {
        snprintf(err, errlen, "%s: cannot read job file: %s", path, strerror(errno));
        goto free_buf;
    }
    if (len > JOB_FILE_MAX_BYTES) {
        struct stat sb;
        if (fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode))
            snprintf(err, errlen, "%s: (file): %lld bytes, more than the %u-byte limit for job files",
                     path, (long long)sb.st_size, (unsigned)JOB_FILE_MAX_BYTES);
        else
            snprintf(err, errlen, "%s: (file): more than the %u-byte limit for job files", path,
                     (unsigned)JOB_FILE_MAX_BYTES);
        goto free_buf;
    }
    buf[len] = '\0';
    st = job_load_buffer(path, buf, len, job, err, errlen);
free_buf:
    free(buf);
close_file:
    fclose(f);
    return st;
}

/* field fi set by an override: its value text, or the option that set it */
static void origin_override(job_t *job, int fi, const char *value, const char *option)
{
    job->origin[fi] = (job_origin_t){.set = true, .from_override = true, .as_option = option != NULL};
    snprintf(job->origin[fi].value, sizeof job->origin[fi].value, "%s", option ? option : value);
}

bt_status_t job_override(job_t *job, const char *assignment, char *err, size_t errlen)
{
    return job_override_as(job, assignment, NULL, err, errlen);
}

bt_status_t job_override_as(job_t *job, const char *assignment, const char *option, char *err,
                            size_t errlen)
{
    where_t w = {.file = job->path, .override = assignment, .option = option};
    const char *eq = strchr(assignment, '=');
    char name[128];
    if (!eq || eq == assignment || (size_t)(eq - assignment) >= sizeof name)
        return fail_at(err, errlen, &w, "(override)", "expected section.key=value");
    memcpy(name, assignment, (size_t)(eq - assignment));
    name[eq - assignment] = '\0';
    int fi = field_find(name);
    char unk[160];
    if (fi < 0) {
        unknown_key_text(name, unk, sizeof unk);
        return fail_at(err, errlen, &w, name, "%s", unk);
    }
    const char *value = eq + 1;
    size_t vlen = strlen(value);
    if (vlen > JOB_FILE_MAX_BYTES)
        return fail_at(err, errlen, &w, name, "value of %zu bytes, more than the %u-byte limit", vlen,
                       (unsigned)JOB_FILE_MAX_BYTES);
    bt_status_t st = yaml_depth_check(value, vlen, &w, name, err, errlen);
    if (st) return st;
    /* A path with "{run}" (launch/rundir.h) would read as a YAML mapping:
     * an unquoted string value is taken as it is written. */
    if (fields[fi].type == F_STR && !strncmp(value, "{run}", 5)) {
        if (vlen >= fields[fi].cap)
            return fail_at(err, errlen, &w, name, "string longer than %zu bytes", fields[fi].cap - 1);
        memcpy((char *)job + fields[fi].off, value, vlen + 1);
        origin_override(job, fi, value, option);
        return BT_OK;
    }

    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) BT_PANIC("yaml_parser_initialize");
    yaml_parser_set_input_string(&parser, (const unsigned char *)value, vlen);
    if (!yaml_parser_load(&parser, &doc)) {
        st = fail_at(err, errlen, &w, name, "cannot parse value: %s",
                     parser.problem ? parser.problem : "YAML error");
        goto out_parser;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root) {
        /* An empty value: only meaningful for strings ("--set trace.dir="). */
        if (fields[fi].type != F_STR) {
            st = fail_at(err, errlen, &w, name, "empty value");
            goto out_doc;
        }
        ((char *)job + fields[fi].off)[0] = '\0';
        st = BT_OK;
    } else {
        st = field_set(job, fi, &doc, root, &w, err, errlen);
    }
    if (st == BT_OK) origin_override(job, fi, value, option);
out_doc:
    yaml_document_delete(&doc);
out_parser:
    yaml_parser_delete(&parser);
    return st;
}

/* ---- validation --------------------------------------------------------- */

static bt_status_t vfail_va(const job_t *job, const char *field, char *err, size_t errlen,
                            const char *fmt, va_list ap)
{
    int fi = field_find(field);
    if (fi < 0) BT_PANIC("validation names unknown field %s", field);
    const job_origin_t *o = &job->origin[fi];
    where_t w = {.file = job->path};
    char ov[200];
    if (o->set && o->as_option) {
        w.option = o->value;
    } else if (o->set && o->from_override) {
        snprintf(ov, sizeof ov, "%s=%s", field, o->value);
        w.override = ov;
    } else if (o->set) {
        w.line = o->line;
        w.col = o->col;
    }
    if (err && errlen) where_fmt(err, errlen, &w, field, fmt, ap);
    return BT_ERR_INVALID;
}

static bt_status_t vfail(const job_t *job, const char *field, char *err, size_t errlen,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static bt_status_t vfail(const job_t *job, const char *field, char *err, size_t errlen,
                         const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    bt_status_t st = vfail_va(job, field, err, errlen, fmt, ap);
    va_end(ap);
    return st;
}

bt_status_t job_error(const job_t *job, const char *field, char *err, size_t errlen,
                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    bt_status_t st = vfail_va(job, field, err, errlen, fmt, ap);
    va_end(ap);
    return st;
}

static bool field_is_set(const job_t *job, const char *name)
{
    int fi = field_find(name);
    return fi >= 0 && job->origin[fi].set;
}

/* The fields model.hf decides (or that mean nothing beside it): a job may
 * not set them with model.hf, and job_write_yaml writes them as comments. */
static const char *const shape_fields[] = {
    "model.layers", "model.hidden", "model.heads", "model.kv_heads", "model.ffn",
    "model.vocab", "model.rope_theta", "model.norm_eps", "model.tie_embeddings",
    "model.init_std", "model.init_seed"};

static bool is_shape_field(const char *name)
{
    for (size_t i = 0; i < sizeof shape_fields / sizeof shape_fields[0]; i++)
        if (!strcmp(shape_fields[i], name)) return true;
    return false;
}

/* Fill the model dimensions from model.hf: a Hugging Face directory's
 * config.json or a GGUF file's metadata (ckpt/model_source.h reads it). */
static bt_status_t hf_config_read(job_t *job, char *err, size_t errlen)
{
    for (size_t i = 0; i < sizeof shape_fields / sizeof shape_fields[0]; i++)
        if (field_is_set(job, shape_fields[i]))
            return vfail(job, shape_fields[i], err, errlen,
                         "cannot be set together with model.hf (its config.json decides)");

    model_config_t cfg;
    if (ckpt_source_config(job->model.hf, &cfg) != BT_OK) {
        size_t n = strlen(job->model.hf);
        bool gguf = n >= 5 && !strcmp(job->model.hf + n - 5, ".gguf");
        return vfail(job, "model.hf", err, errlen, "cannot use %s%s (the error above says why)",
                     job->model.hf, gguf ? "" : "/config.json");
    }
    /* what the layout cannot split yet, refused here, before a process starts */
    bool moe = false;
    for (int64_t l = 0; l < cfg.num_layers && !moe; l++) moe = cfg.blocks[l].ffn == MODEL_FFN_MOE;
    const job_parallel_t *p = &job->parallel;
    if (!moe && p->ep > 1)
        return vfail(job, "parallel.ep", err, errlen, "%s has no routed experts to split over "
                     "expert parallelism: use ep=1", job->model.hf);
    if (moe && cfg.moe.n_experts % p->ep)
        return vfail(job, "parallel.ep", err, errlen, "ep %lld does not divide the %lld routed "
                     "experts of %s", (long long)p->ep, (long long)cfg.moe.n_experts, job->model.hf);
    if (moe && (p->tp * p->cp * p->dp) % p->ep)
        return vfail(job, "parallel.ep", err, errlen, "ep %lld must divide tp x cp x dp = %lld: the "
                     "expert grid (ep x edp) folds over the dense one (tp x cp x dp) in every "
                     "pipeline stage", (long long)p->ep, (long long)(p->tp * p->cp * p->dp));
    for (int64_t l = 0; p->cp > 1 && l < cfg.num_layers; l++)
        if (cfg.blocks[l].mixer != MODEL_MIXER_ATTENTION && cfg.blocks[l].mixer != MODEL_MIXER_MLA &&
            cfg.blocks[l].mixer != MODEL_MIXER_NONE)
            return vfail(job, "parallel.cp", err, errlen, "cp %lld splits every sequence over its "
                         "ranks, but layer %lld of %s mixes with a kind that has no context-parallel "
                         "path (only attention and MLA have one): use cp=1", (long long)p->cp,
                         (long long)l, job->model.hf);
    if (moe && p->zero1 && (p->ep > 1 || p->tp > 1))
        return vfail(job, "parallel.zero1", err, errlen, "ZeRO-1 shards one flat block over dp, "
                     "but with ep > 1 or tp > 1 the experts of %s reduce over their own "
                     "expert-data-parallel group: use zero1=false", job->model.hf);
    job_model_t *m = &job->model;
    m->layers = cfg.num_layers;
    m->hidden = cfg.hidden_size;
    m->heads = cfg.attn.num_heads;
    m->kv_heads = cfg.attn.num_kv_heads;
    m->ffn = cfg.mlp.intermediate_size;
    m->vocab = cfg.vocab_size;
    if (!field_is_set(job, "model.seq")) m->seq = cfg.max_position_embeddings;
    m->rope_theta = cfg.attn.rope.theta;
    m->norm_eps = cfg.rms_norm_eps;
    m->tie_embeddings = cfg.tie_word_embeddings;
    m->has_experts = moe;
    m->n_experts = moe ? cfg.moe.n_experts : 0;
    return BT_OK;
}

/* train.global_batch: the microbatches of each data-parallel replica,
 * global_batch / (dp x micro_batch), exact; an explicit grad_accum or
 * parallel.microbatches must agree with it. train.global_batch_tokens
 * gives it in tokens: whole sequences of data.seq_len. */
static bt_status_t global_batch_derive(job_t *job, char *err, size_t errlen)
{
    job_train_t *t = &job->train;
    job_parallel_t *p = &job->parallel;
    int64_t T = job->data.seq_len;
    if (t->global_batch_tokens) {
        if (t->global_batch_tokens % T)
            return vfail(job, "train.global_batch_tokens", err, errlen,
                         "%lld tokens per step are not whole sequences of data.seq_len %lld: make it "
                         "a multiple of %lld (e.g. %lld)",
                         (long long)t->global_batch_tokens, (long long)T, (long long)T,
                         (long long)((t->global_batch_tokens + T / 2) / T > 0
                                         ? (t->global_batch_tokens + T / 2) / T * T : T));
        int64_t seqs = t->global_batch_tokens / T;
        if (job_field_set(job, "train.global_batch") && t->global_batch != seqs)
            return vfail(job, "train.global_batch", err, errlen,
                         "%lld sequences, but train.global_batch_tokens %lld / data.seq_len %lld = "
                         "%lld: give one of the two",
                         (long long)t->global_batch, (long long)t->global_batch_tokens, (long long)T,
                         (long long)seqs);
        t->global_batch = seqs;
    }
    if (!t->global_batch) return BT_OK;
    int64_t per = p->dp * t->micro_batch;
    if (t->global_batch % per)
        return vfail(job, "train.global_batch", err, errlen,
                     "%lld sequences per step do not split into parallel.dp %lld x train.micro_batch "
                     "%lld rows per microbatch: make it a multiple of %lld, or change micro_batch",
                     (long long)t->global_batch, (long long)p->dp, (long long)t->micro_batch,
                     (long long)per);
    int64_t mbs = t->global_batch / per;
    const char *clash = job_field_set(job, "parallel.microbatches") && p->microbatches != mbs
                            ? "parallel.microbatches"
                        : job_field_set(job, "train.grad_accum") && !p->microbatches && t->grad_accum != mbs
                            ? "train.grad_accum" : NULL;
    if (clash)
        return vfail(job, clash, err, errlen,
                     "%lld, but train.global_batch %lld = dp %lld x micro_batch %lld x %lld "
                     "microbatches: drop %s (it is derived) or make them agree",
                     (long long)(!strcmp(clash, "train.grad_accum") ? t->grad_accum : p->microbatches),
                     (long long)t->global_batch, (long long)p->dp, (long long)t->micro_batch,
                     (long long)mbs, clash);
    t->grad_accum = mbs;
    if (p->microbatches) p->microbatches = mbs;
    return BT_OK;
}

bt_status_t job_validate(job_t *job, char *err, size_t errlen)
{
    job_model_t *m = &job->model;
    job_parallel_t *p = &job->parallel;
    bt_status_t st;

    device_t dev = DEVICE_CPU; /* auto: cpu or cuda, both share memory between processes */
    if (strcmp(job->device, "auto") && !device_parse(job->device, &dev))
        return vfail(job, "device", err, errlen,
                     "'%s' is not a device (cpu, cuda, cuda:N, fenced or auto)", job->device);
    char cwhy[600];
    coll_backend_t cb;
    if (job_collectives(job, &cb, cwhy, sizeof cwhy))
        return vfail(job, "parallel.collectives", err, errlen, "%s (device is %s)", cwhy, job->device);
    if (m->hf[0] && (st = hf_config_read(job, err, errlen))) return st;
    if (m->kv_heads == 0) m->kv_heads = m->heads;
    if (m->ffn == 0) m->ffn = ((8 * m->hidden / 3) + 63) / 64 * 64;
    if (m->seq == 0) m->seq = job->data.seq_len;
    if (m->init_seed < 0) m->init_seed = job->train.seed;
    if ((st = global_batch_derive(job, err, errlen))) return st;
    if (job->launch.heartbeat_interval >= job->launch.heartbeat_timeout)
        return vfail(job, "launch.heartbeat_interval", err, errlen,
                     "%g s is not shorter than launch.heartbeat_timeout (%g s): every rank would "
                     "look silent", job->launch.heartbeat_interval, job->launch.heartbeat_timeout);

    if (!m->hf[0] && m->hidden % m->heads)
        return vfail(job, "model.heads", err, errlen, "%lld heads do not divide hidden %lld",
                     (long long)m->heads, (long long)m->hidden);
    if (!m->hf[0] && (m->hidden / m->heads) % 2)
        return vfail(job, "model.heads", err, errlen, "head dimension %lld must be even (rotary)",
                     (long long)(m->hidden / m->heads));
    if (m->heads % m->kv_heads)
        return vfail(job, "model.kv_heads", err, errlen, "%lld kv_heads do not divide %lld heads",
                     (long long)m->kv_heads, (long long)m->heads);
    if (job->data.seq_len > m->seq)
        return vfail(job, "data.seq_len", err, errlen,
                     "%lld is longer than the model's maximum sequence %lld (model.seq)",
                     (long long)job->data.seq_len, (long long)m->seq);
    if (!job->data.dir[0])
        return vfail(job, "data.dir", err, errlen, "required (a token shard directory)");
    if (job->data.val_dir[0] && field_is_set(job, "data.split") && job->data.split > 0)
        return vfail(job, "data.split", err, errlen,
                     "holds out part of data.dir, but data.val_dir already names the validation data");

    if (job->optim.min_lr > job->optim.lr)
        return vfail(job, "optim.min_lr", err, errlen, "%g is larger than optim.lr %g",
                     job->optim.min_lr, job->optim.lr);
    if (job->optim.warmup > job->train.steps)
        return vfail(job, "optim.warmup", err, errlen, "%lld warmup steps exceed train.steps %lld",
                     (long long)job->optim.warmup, (long long)job->train.steps);
    if (job->export.every > 0 && !job->export.dir[0])
        return vfail(job, "export.every", err, errlen,
                     "exports every %lld steps, but export.dir names no directory for them",
                     (long long)job->export.every);
    if (job->train.stop_after > job->train.steps)
        return vfail(job, "train.stop_after", err, errlen, "step %lld is past train.steps %lld",
                     (long long)job->train.stop_after, (long long)job->train.steps);
    if (job->checkpoint.every > 0 && !job->checkpoint.dir[0])
        return vfail(job, "checkpoint.every", err, errlen,
                     "saves every %lld steps, but checkpoint.dir names no directory for them",
                     (long long)job->checkpoint.every);

    if (p->cp > 1 && job->data.seq_len % (2 * p->cp))
        return vfail(job, "parallel.cp", err, errlen, "data.seq_len %lld does not cut into 2 x cp = "
                     "%lld equal chunks (CP rank r holds chunks r and 2cp-1-r of every sequence): "
                     "make seq_len a multiple of %lld", (long long)job->data.seq_len,
                     (long long)(2 * p->cp), (long long)(2 * p->cp));
    if (m->heads % p->tp)
        return vfail(job, "parallel.tp", err, errlen, "tp %lld does not divide %lld attention heads",
                     (long long)p->tp, (long long)m->heads);
    /* more ranks than KV heads replicate them (model/attention.c): a multiple of them */
    if (m->kv_heads >= p->tp ? m->kv_heads % p->tp : p->tp % m->kv_heads)
        return vfail(job, "parallel.tp", err, errlen,
                     "tp %lld %s %lld KV heads (each rank holds whole KV heads, or with more ranks "
                     "than KV heads a multiple of them replicates each)", (long long)p->tp,
                     m->kv_heads >= p->tp ? "does not divide" : "is not a multiple of",
                     (long long)m->kv_heads);
    if (m->ffn % p->tp)
        return vfail(job, "parallel.tp", err, errlen, "tp %lld does not divide ffn %lld",
                     (long long)p->tp, (long long)m->ffn);
    int64_t stages = p->pp * p->virtual_stages;
    if (stages > m->layers)
        return vfail(job, p->virtual_stages > 1 ? "parallel.virtual_stages" : "parallel.pp", err, errlen,
                     "%lld pipeline stages (pp %lld x virtual_stages %lld) for only %lld layers",
                     (long long)stages, (long long)p->pp, (long long)p->virtual_stages,
                     (long long)m->layers);
    if (p->virtual_stages > 1 && p->schedule != JOB_SCHED_INTERLEAVED)
        return vfail(job, "parallel.schedule", err, errlen,
                     "virtual_stages %lld needs schedule: interleaved", (long long)p->virtual_stages);
    if (p->schedule == JOB_SCHED_INTERLEAVED && p->virtual_stages < 2)
        return vfail(job, "parallel.virtual_stages", err, errlen,
                     "schedule interleaved needs virtual_stages >= 2");
    if (p->n_split) {
        if (p->n_split != stages)
            return vfail(job, "parallel.split", err, errlen,
                         "%d entries, but there are %lld stages (pp x virtual_stages)",
                         p->n_split, (long long)stages);
        int64_t sum = 0;
        for (int i = 0; i < p->n_split; i++) sum += p->split[i];
        if (sum != m->layers)
            return vfail(job, "parallel.split", err, errlen,
                         "the stage layer counts sum to %lld, but the model has %lld layers",
                         (long long)sum, (long long)m->layers);
    }
    int64_t mbs = p->microbatches ? p->microbatches : job->train.grad_accum;
    if (p->pp > 1 && mbs < p->pp)
        return vfail(job, p->microbatches ? "parallel.microbatches" : "train.grad_accum", err, errlen,
                     "%lld microbatches cannot fill %lld pipeline stages (at least %lld)",
                     (long long)mbs, (long long)p->pp, (long long)p->pp);
    if (p->schedule == JOB_SCHED_INTERLEAVED && mbs % p->pp)
        return vfail(job, p->microbatches ? "parallel.microbatches" : "train.grad_accum", err, errlen,
                     "interleaved schedule needs microbatches (%lld) divisible by pp %lld",
                     (long long)mbs, (long long)p->pp);
    if (!m->hf[0] && p->ep > 1)
        return vfail(job, "parallel.ep", err, errlen, "a model without model.hf has no routed "
                     "experts to split: use ep=1");
    if (p->sequence_parallel && p->tp < 2)
        return vfail(job, "parallel.sequence_parallel", err, errlen, "sequence parallelism shards "
                     "the norms and residuals of a TP group along the sequence: needs tp >= 2");
    if (p->zero1 && p->dp * p->cp < 2)
        return vfail(job, "parallel.zero1", err, errlen, "ZeRO-1 shards over data parallelism "
                     "(the dp x cp ranks): needs dp >= 2 (or cp >= 2)");
#ifndef BT_HAVE_UCX
    for (int e = 0; e < JOB_EDGE_COUNT; e++)
        if (job->transport[e] == JOB_XPORT_UCX) {
            char name[64];
            snprintf(name, sizeof name, "transport.%s", edge_names[e]);
            return vfail(job, name, err, errlen, "ucx requested but this build has no UCX");
        }
#endif
    if (job->n_hosts < 1) return vfail(job, "hosts", err, errlen, "needs at least one host");
    if (job->handoff == JOB_HANDOFF_IPC && dev.kind == DEV_FENCED)
        return vfail(job, "transport.handoff", err, errlen,
                     "ipc hands activations over in memory shared between processes; the %s device has none",
                     job->device);
    return BT_OK;
}

int job_stage_layers(const job_t *job, int64_t *out, int max)
{
    const job_parallel_t *p = &job->parallel;
    int stages = (int)(p->pp * p->virtual_stages);
    if (stages > max) return -1;
    for (int s = 0; s < stages; s++)
        out[s] = p->n_split ? p->split[s]
                            : job->model.layers / stages + (s < job->model.layers % stages);
    return stages;
}

/* ---- writing ------------------------------------------------------------ */

static void yaml_str_write(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\x%02x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

bool job_field_set(const job_t *job, const char *name)
{
    int fi = field_find(name);
    return fi >= 0 && job->origin[fi].set;
}

void job_write_yaml(const job_t *job, FILE *f)
{
    char section[64] = "";
    for (int i = 0; i < N_FIELDS; i++) {
        const field_t *fd = &fields[i];
        const char *dot = strchr(fd->name, '.');
        const char *key = fd->name;
        if (dot) {
            size_t n = (size_t)(dot - fd->name);
            if (strlen(section) != n || strncmp(section, fd->name, n)) {
                snprintf(section, sizeof section, "%.*s", (int)n, fd->name);
                fprintf(f, "%s:\n", section);
            }
            key = dot + 1;
            fprintf(f, "  ");
        } else {
            section[0] = '\0';
        }
        /* what model.hf decided is shown, not set: loading the file back
         * reads it from model.hf again (a field set beside it is refused) */
        bool derived = job->model.hf[0] && is_shape_field(fd->name);
        fprintf(f, "%s%s: ", derived ? "# " : "", key);
        const char *base = (const char *)job + fd->off;
        int count = fd->count_off ? *(const int *)((const char *)job + fd->count_off) : 0;
        switch (fd->type) {
        case F_INT: fprintf(f, "%lld", (long long)*(const int64_t *)base); break;
        case F_FLOAT: fprintf(f, "%.17g", *(const double *)base); break;
        case F_BOOL: fprintf(f, "%s", *(const bool *)base ? "true" : "false"); break;
        case F_STR: yaml_str_write(f, base); break;
        case F_ENUM: fprintf(f, "%s", fd->enums[*(const int *)base]); break;
        case F_INT_LIST:
            if (fd->off == OFF(parallel.split) && job->parallel.split_balanced) {
                fputs("balanced", f);
                break;
            }
            fputc('[', f);
            for (int k = 0; k < count; k++)
                fprintf(f, "%s%lld", k ? ", " : "", (long long)((const int64_t *)base)[k]);
            fputc(']', f);
            break;
        case F_FLOAT_PAIR:
            fprintf(f, "[%.17g, %.17g]", ((const double *)base)[0], ((const double *)base)[1]);
            break;
        case F_STR_LIST:
            fputc('[', f);
            for (int k = 0; k < count; k++) {
                if (k) fputs(", ", f);
                yaml_str_write(f, base + (size_t)k * JOB_HOST_MAX);
            }
            fputc(']', f);
            break;
        default:
            BT_PANIC("field type %d", (int)fd->type);
        }
        fputs(derived ? "  (from model.hf)\n" : "\n", f);
    }
}

int job_gpus_here(void)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (v) {
        /* "0,1", "GPU-<uuid>,...", "" (none); CUDA stops at the first invalid entry, "-1" say */
        int n = 0;
        for (const char *q = v; *q;) {
            const char *e = q + strcspn(q, ",");
            if (e == q || (q[0] == '-' && q[1] >= '0' && q[1] <= '9')) break;
            n++;
            q = *e ? e + 1 : e;
        }
        return n;
    }
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    if (!d) return 0;
    int n = 0;
    for (struct dirent *de; (de = readdir(d));)
        if (de->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

bt_status_t job_collectives(const job_t *job, coll_backend_t *out, char *why, size_t why_cap)
{
    bool all_cuda = !strncmp(job->device, "cuda", 4);
    /* NCCL refuses two ranks of a communicator on one GPU ("Duplicate GPU
     * detected"). A bare "cuda" gives each of a host's ranks a GPU of its
     * own while the host has enough (job_rank_device); "cuda:N" puts them
     * all on N. Where ranks share a GPU, auto stays on host and nccl is
     * refused before anything starts; where the GPUs cannot be counted
     * (none visible here), nccl is left to the workers to try. */
    const job_parallel_t *p = &job->parallel;
    int64_t world = p->tp * p->cp * p->pp * p->dp, hosts = job->n_hosts > 0 ? job->n_hosts : 1;
    int64_t per = world / hosts;
    if (all_cuda && per > 1 && p->collectives != COLL_BACKEND_HOST) {
        int gpus = !strcmp(job->device, "cuda") ? job_gpus_here() : 1;
        if (gpus < per && (gpus > 0 || p->collectives == COLL_BACKEND_AUTO)) {
            if (!strcmp(job->device, "cuda"))
                snprintf(why, why_cap, "%lld ranks a host share its %d visible GPU%s (NCCL needs a GPU "
                         "of its own for each rank)", (long long)per, gpus, gpus == 1 ? "" : "s");
            else
                snprintf(why, why_cap, "%lld ranks a host share %s (NCCL needs a GPU of its own for "
                         "each rank: device cuda gives each rank one)", (long long)per, job->device);
            if (p->collectives == COLL_BACKEND_NCCL) return BT_ERR_INVALID;
            *out = COLL_BACKEND_HOST;
            return BT_OK;
        }
    }
    return coll_backend_choose(job->parallel.collectives, all_cuda, out, why, why_cap);
}

void job_rank_device(const job_t *job, int world, int rank, int gpus, char *out, size_t cap)
{
    if (strcmp(job->device, "cuda") || gpus < 1) {
        snprintf(out, cap, "%s", job->device);
        return;
    }
    int hosts = job->n_hosts > 0 ? job->n_hosts : 1;
    int per = world / hosts > 0 ? world / hosts : 1;
    snprintf(out, cap, "cuda:%d", rank % per % gpus);
}
