/* Run directories (launch/rundir.h). */
#include "launch/rundir.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "launch/version.h"

/* The job's name: its file's name without the directory and .yaml/.yml. */
static void job_name(const job_t *job, char *out, size_t cap)
{
    const char *b = strrchr(job->path, '/');
    b = b ? b + 1 : job->path;
    size_t n = strlen(b);
    if (n > 5 && !strcmp(b + n - 5, ".yaml")) n -= 5;
    else if (n > 4 && !strcmp(b + n - 4, ".yml")) n -= 4;
    if (n == 0) b = "job", n = 3;
    snprintf(out, cap, "%.*s", (int)n, b);
}

/* Replaces every "{run}" of the path field `name` (stored in buf[cap]) by
 * dir; records the result as an override for the workers. */
static bt_status_t expand(rundir_t *rd, const char *name, char *buf, size_t cap, char *err,
                          size_t errlen)
{
    if (!strstr(buf, "{run}")) return BT_OK;
    char out[JOB_PATH_MAX * 2];
    size_t o = 0;
    for (const char *p = buf; *p && o < sizeof out - 1;) {
        if (!strncmp(p, "{run}", 5)) {
            o += (size_t)snprintf(out + o, sizeof out - o, "%s", rd->path);
            p += 5;
        } else {
            out[o++] = *p++;
        }
    }
    out[o < sizeof out ? o : sizeof out - 1] = '\0';
    if (strlen(out) >= cap || strlen(out) >= JOB_PATH_MAX) {
        snprintf(err, errlen, "%s: %s is longer than %zu bytes once {run} is %s", name, buf, cap - 1,
                 rd->path);
        return BT_ERR_INVALID;
    }
    if (strpbrk(out, "\"\\\n")) {
        snprintf(err, errlen, "%s: %s: quotes, backslashes and newlines are not supported in "
                 "run directory paths (job field `runs`)", name, out);
        return BT_ERR_INVALID;
    }
    snprintf(buf, cap, "%s", out);
    if (rd->n_sets == RUNDIR_MAX_SETS) BT_PANIC("raise RUNDIR_MAX_SETS");
    snprintf(rd->sets[rd->n_sets++], sizeof rd->sets[0], "%s=\"%s\"", name, out);
    return BT_OK;
}

static json_t *layout_json(const job_t *job)
{
    const job_parallel_t *p = &job->parallel;
    json_t *split = json_array();
    int64_t layers[JOB_MAX_STAGES];
    int n = job_stage_layers(job, layers, JOB_MAX_STAGES);
    for (int i = 0; i < n; i++) json_array_append_new(split, json_integer(layers[i]));
    json_t *xp = json_object();
    for (int e = 0; e < JOB_EDGE_COUNT; e++)
        json_object_set_new(xp, job_edge_name((job_edge_t)e), json_string(job_xport_name(job->transport[e])));
    coll_backend_t cb = COLL_BACKEND_HOST;
    char why[600];
    if (job_collectives(job, &cb, why, sizeof why)) cb = COLL_BACKEND_HOST;
    return json_pack("{sI sI sI sI ss sI sb so sI so ss sI ss sb}", "tp", (json_int_t)p->tp, "pp", (json_int_t)p->pp,
                     "dp", (json_int_t)p->dp, "virtual_stages", (json_int_t)p->virtual_stages,
                     "schedule", p->schedule == JOB_SCHED_1F1B ? "1f1b" : "interleaved",
                     "microbatches", (json_int_t)(p->microbatches ? p->microbatches : job->train.grad_accum),
                     "zero1", p->zero1, "layers_per_stage", split,
                     "processes", (json_int_t)(p->tp * p->cp * p->pp * p->dp), "transport", xp,
                     "collectives", coll_backend_name(cb), "cp", (json_int_t)p->cp,
                     "cp_mode", p->cp_mode == JOB_CP_RING ? "ring" : "allgather",
                     "sequence_parallel", p->sequence_parallel);

}

static bt_status_t record_write(const job_t *job, const rundir_t *rd, int argc, char **argv,
                                const char *const *sets, int n_sets, char *err, size_t errlen)
{
    char path[JOB_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/job.yaml", rd->path);
    FILE *f = fopen(path, "we");
    if (!f) goto io;
    fprintf(f, "# the resolved job of run %s (%s with every override applied)\n", rd->id, job->path);
    job_write_yaml(job, f);
    if (fclose(f)) goto io;

    json_t *cmd = json_array(), *js = json_array(), *hosts = json_array();
    for (int i = 0; i < argc; i++) json_array_append_new(cmd, json_string(argv[i]));
    for (int i = 0; i < n_sets; i++) json_array_append_new(js, json_string(sets[i]));
    for (int i = 0; i < job->n_hosts; i++) json_array_append_new(hosts, json_string(job->hosts[i]));
    char when[64], cwd[1024];
    time_t now = time(NULL);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S%z", localtime_r(&now, &tm));
    if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, "?");
    json_t *o = json_pack("{ss ss so so ss ss ss ss sI so so}", "run_id", rd->id, "job_file", job->path,
                          "command", cmd, "sets", js, "release", BATON_RELEASE,
                          "revision", baton_revision(), "started", when, "cwd", cwd,
                          "pid", (json_int_t)getpid(), "hosts", hosts, "layout", layout_json(job));
    snprintf(path, sizeof path, "%s/run.json", rd->path);
    int rc = o ? json_dump_file(o, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : -1;
    json_decref(o);
    if (rc) goto io;
    return BT_OK;
io:
    snprintf(err, errlen, "runs: cannot write %s: %s", path, strerror(errno));
    return BT_ERR_IO;
}

/* runs/<job>/latest -> <id>, replaced in one rename. */
static void latest_point(const char *root, const char *id)
{
    char tmp[JOB_PATH_MAX + 64], link[JOB_PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s/.latest.%d", root, (int)getpid());
    snprintf(link, sizeof link, "%s/latest", root);
    unlink(tmp);
    if (symlink(id, tmp) || rename(tmp, link)) unlink(tmp); /* the run goes on without it */
}

bt_status_t rundir_create(job_t *job, int argc, char **argv, const char *const *sets, int n_sets,
                          rundir_t *rd, char *err, size_t errlen)
{
    memset(rd, 0, sizeof *rd);
    char name[128], root[JOB_PATH_MAX];
    job_name(job, name, sizeof name);
    const char *runs = job->runs[0] ? job->runs : ".";
    if ((size_t)snprintf(root, sizeof root, "%s/%s", runs, name) >= sizeof root - 40) {
        snprintf(err, errlen, "runs: %s/%s: path too long", runs, name);
        return BT_ERR_INVALID;
    }
    bt_status_t st = base_dir_make(root, err, errlen);
    if (st) return st;
    time_t now = time(NULL);
    struct tm tm;
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime_r(&now, &tm));
    for (int k = 1;; k++) {
        if (k == 1) snprintf(rd->id, sizeof rd->id, "%s", stamp);
        else snprintf(rd->id, sizeof rd->id, "%s-%d", stamp, k);
        if ((size_t)snprintf(rd->path, sizeof rd->path, "%s/%.40s", root, rd->id) >= sizeof rd->path) {
            snprintf(err, errlen, "runs: %s: path too long", root);
            return BT_ERR_INVALID;
        }
        if (mkdir(rd->path, 0755) == 0) break;
        if (errno != EEXIST || k == 1000) {
            snprintf(err, errlen, "runs: cannot create %s: %s", rd->path, strerror(errno));
            return BT_ERR_IO;
        }
    }
    struct { const char *name; char *buf; size_t cap; } paths[] = {
        {"metrics.file", job->metrics.file, sizeof job->metrics.file},
        {"metrics.plot", job->metrics.plot, sizeof job->metrics.plot},
        {"metrics.throughput_plot", job->metrics.throughput_plot, sizeof job->metrics.throughput_plot},
        {"metrics.tensorboard", job->metrics.tensorboard, sizeof job->metrics.tensorboard},
        {"trace.dir", job->trace_dir, sizeof job->trace_dir},
        {"export.dir", job->export.dir, sizeof job->export.dir},
        {"checkpoint.dir", job->checkpoint.dir, sizeof job->checkpoint.dir},
    };
    _Static_assert(sizeof paths / sizeof paths[0] <= RUNDIR_MAX_SETS, "RUNDIR_MAX_SETS");
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        if ((st = expand(rd, paths[i].name, paths[i].buf, paths[i].cap, err, errlen))) return st;
    if ((st = record_write(job, rd, argc, argv, sets, n_sets, err, errlen))) return st;
    latest_point(root, rd->id);
    return BT_OK;
}
