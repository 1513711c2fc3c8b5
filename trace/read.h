/* Reading trace files offline (baton trace): loading every process's file,
 * merging them into Chrome trace-event JSON, per-edge and per-actor
 * summaries. Separate from the recorder (trace/trace.h), which the running
 * job uses; both share the file format (trace/format.h). */
#ifndef BT_TRACE_READ_H
#define BT_TRACE_READ_H

#include <stdio.h>

#include "trace/trace.h"

/* One loaded process file. Actor and name tables are per file (ids are
 * process-local). */
typedef struct {
    char        *path;
    uint32_t     rank, pid;
    trace_rec_t *recs;       /* all records of the file, in file order */
    uint32_t    *rec_tid;    /* per record: index of the recording thread */
    size_t       nrecs;
    uint64_t     dropped;    /* events the process dropped (ring overflow) */
    char       **names;      /* names[id] for trace_intern ids; [0] = NULL */
    uint32_t     nnames;
    char       **thread_names; /* per thread index; NULL when unnamed */
    uint32_t     nthreads;
    actor_addr_t *actor_ids; /* named actors */
    char       **actor_names;
    uint32_t     nactors;
    bool         complete;   /* the trailer was written (clean stop) */
    char         run_id[48]; /* "" when the file names no run (TRACE_STR_MAX bytes) */
} trace_file_t;

typedef struct {
    trace_file_t *files;
    size_t        nfiles;
} trace_set_t;

/* Load DIR/trace-*.bin. BT_ERR_NOT_FOUND when there is none; BT_ERR_CORRUPT
 * (reason in err, which names the file) for a bad magic/version/block;
 * BT_ERR_INVALID when the files belong to different runs (err names each
 * run id and how many files it has: merging them would mix two jobs).
 * A file that ends without its trailer (a crashed process) loads what it has
 * with complete = false and a warning. */
bt_status_t trace_dir_load(const char *dir, trace_set_t *set, char *err, size_t err_cap);
bt_status_t trace_file_load(const char *path, trace_file_t *f, char *err, size_t err_cap);
/* The same from a file's bytes in memory; `path` names it in errors. */
bt_status_t trace_file_load_mem(const uint8_t *buf, size_t size, const char *path, trace_file_t *f, char *err,
                                size_t err_cap);
void        trace_file_free(trace_file_t *f);
void        trace_set_free(trace_set_t *set);

/* Chrome trace-event JSON: one process (pid = rank) per file, one track
 * (tid) per actor named after it; spans as "X", instants "i", counters "C",
 * send->receive flows as "s"/"f" pairs. */
bt_status_t trace_json_write(const trace_set_t *set, FILE *out);

typedef struct {
    actor_addr_t src, dst;
    uint32_t     msg_type;
    uint64_t     count;        /* sends */
    uint64_t     matched;      /* sends with a matching receive */
    uint64_t     bytes;        /* bytes of all sends */
    double       lat_mean_ns;  /* send -> receive, over matched pairs */
    double       lat_p99_ns;   /* nearest-rank 99th percentile */
} trace_edge_stat_t;

typedef struct {
    actor_addr_t actor;
    char         name[64];
    uint64_t     span_ns[TRACE_SPAN_KIND_COUNT]; /* union of spans of each kind */
    uint64_t     busy_ns;     /* union of COMPUTE spans */
    uint64_t     window_ns;   /* first to last event of the actor */
    uint64_t     idle_ns;     /* window - busy */
    double       busy_frac;   /* busy / window; 0 when the window is empty */
} trace_actor_stat_t;

typedef struct {
    trace_edge_stat_t  *edges;
    size_t              nedges;
    trace_actor_stat_t *actors;
    size_t              nactors;
    uint64_t            unmatched_recvs;
    uint64_t            dropped;
} trace_summary_t;

bt_status_t trace_summary_compute(const trace_set_t *set, trace_summary_t *out);
void        trace_summary_print(const trace_summary_t *s, FILE *out);
void        trace_summary_free(trace_summary_t *s);

#endif
