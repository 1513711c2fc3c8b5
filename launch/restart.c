/* Automatic restart (launch/restart.h). */
#include "launch/restart.h"

#include <errno.h>
#include <limits.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "ckpt/store.h"
#include "launch/driver.h"
#include "launch/run_ckpt.h"

static int64_t world_of(const job_t *job)
{
    return job->parallel.tp * job->parallel.cp * job->parallel.pp * job->parallel.dp;
}

/* Whether some checkpoint root of the job, of its first `world` ranks (the
 * first attempt's: a smaller layout still finds the roots of the ranks it
 * no longer has), holds a committed step. */
static bool ckpt_any(const job_t *job, int world)
{
    if (!job->checkpoint.dir[0]) return false;
    for (int r = 0; r < world; r++) {
        char root[JOB_PATH_MAX];
        int64_t steps[4];
        if (run_ckpt_root(job, r, root, sizeof root) == BT_OK && ckpt_list_steps(root, steps, 4) > 0)
            return true;
    }
    return false;
}

/* run.json += restarts, attempts (replaced as a whole). */
static void record(const rundir_t *rd, json_t *attempts, int restarts)
{
    char path[JOB_PATH_MAX + 32], tmp[JOB_PATH_MAX + 40];
    snprintf(path, sizeof path, "%s/run.json", rd->path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) {
        log_warn("restart: cannot read %s (%s); the run record lacks the attempts", path, je.text);
        return;
    }
    json_object_set_new(o, "restarts", json_integer(restarts));
    json_object_set(o, "attempts", attempts);
    if (json_dump_file(o, tmp, JSON_INDENT(2) | JSON_PRESERVE_ORDER) || rename(tmp, path))
        log_warn("restart: cannot write %s: %s", path, strerror(errno));
    json_decref(o);
}

/* The hosts and layout of the coming attempts: which of the first
 * attempt's hosts are still in (cur[0..n_cur-1], indices into its list),
 * how often each failed, and the --set assignments that say so to the
 * driver and the workers (after the caller's own). */
typedef struct {
    int  n_cur, cur[JOB_MAX_HOSTS];
    int  fails[JOB_MAX_HOSTS];
    int  n_sets;
    char sets[4][JOB_MAX_HOSTS * (JOB_HOST_MAX * 2 + 4) + 32];
} plan_t;

/* "hosts=[...]" of the hosts cur[] of job0 but cur[skip], each quoted. */
static void hosts_set(const job_t *job0, const plan_t *p, int skip, char *buf, size_t cap)
{
    size_t at = (size_t)snprintf(buf, cap, "hosts=[");
    for (int i = 0, n = 0; i < p->n_cur && at < cap; i++) {
        if (i == skip) continue;
        at += (size_t)snprintf(buf + at, cap - at, "%s\"", n++ ? ", " : "");
        for (const char *c = job0->hosts[p->cur[i]]; *c && at + 3 < cap; c++) {
            if (*c == '"' || *c == '\\') buf[at++] = '\\';
            buf[at++] = *c;
        }
        at += (size_t)snprintf(buf + at, cap - at, "\"");
    }
    if (at < cap) snprintf(buf + at, cap - at, "]");
}

/* The job as the user gave it plus sets[], the run directory's and the plan's sets, validated
 * into *out; false (with err) when it does not validate. */
static bool job_with(const char *path, const char *const *sets, int n_sets, const rundir_t *rd, const plan_t *p,
                     job_t *out, char *err, size_t errlen)
{
    if (job_load(path, out, err, errlen)) return false;
    for (int i = 0; i < n_sets; i++)
        if (job_override(out, sets[i], err, errlen)) return false;
    for (int i = 0; i < rd->n_sets; i++) /* the run directory's paths ({run} expanded) */
        if (job_override(out, rd->sets[i], err, errlen)) return false;
    for (int i = 0; i < p->n_sets; i++)
        if (job_override(out, p->sets[i], err, errlen)) return false;
    return job_validate(out, err, errlen) == BT_OK;
}

/* Host slot h of the current attempt failed again: with
 * restart.host_failures reached, the plan leaves it out when the layout
 * still fits the other hosts (their ranks in equal blocks; on a GPU device
 * at most as many per host as the first attempt gave each: its GPUs), or
 * else with the largest smaller dp that fits and still divides the global
 * batch (the microbatches of each replica derived from it). Fills `said`
 * with what it did; false when it keeps the host (nothing fits, or not
 * failed often enough). *job becomes the new attempt's job. */
static bool leave_out(job_t *job, const job_t *job0, const char *const *sets, int n_sets, const rundir_t *rd,
                      plan_t *p, int h, char *said, size_t cap)
{
    int orig = p->cur[h];
    said[0] = 0;
    if (++p->fails[orig] < job0->restart.host_failures || !job0->restart.host_failures || p->n_cur < 2) return false;
    int n = p->n_cur - 1;
    int64_t world = world_of(job), dp = job->parallel.dp, mb = job->train.micro_batch;
    int64_t per_cap = !strncmp(job0->device, "cuda", 4) ? world_of(job0) / job0->n_hosts : INT64_MAX;
    int64_t batch = job->train.global_batch ? job->train.global_batch : dp * mb * job->train.grad_accum;
    static job_t next;
    static plan_t trial;
    char err[JOB_ERR_MAX] = "";
    for (int64_t d = dp; d >= 1; d--) {
        int64_t w = world / dp * d;
        if (w % n || w / n > per_cap || batch % (d * mb)) continue;
        trial = *p;
        trial.n_sets = 0;
        hosts_set(job0, p, h, trial.sets[trial.n_sets++], sizeof trial.sets[0]);
        if (d != dp || p->n_sets > 1) {
            int64_t acc = batch / (d * mb);
            snprintf(trial.sets[trial.n_sets++], sizeof trial.sets[0], "parallel.dp=%lld", (long long)d);
            snprintf(trial.sets[trial.n_sets++], sizeof trial.sets[0], "train.global_batch=%lld", (long long)batch);
            /* given in the job: must agree with the global batch */
            if (job_field_set(job0, "parallel.microbatches"))
                snprintf(trial.sets[trial.n_sets++], sizeof trial.sets[0], "parallel.microbatches=%lld", (long long)acc);
            else if (job_field_set(job0, "train.grad_accum"))
                snprintf(trial.sets[trial.n_sets++], sizeof trial.sets[0], "train.grad_accum=%lld", (long long)acc);
        }
        if (!job_with(job0->path, sets, n_sets, rd, &trial, &next, err, sizeof err)) continue;
        snprintf(said, cap, ", leaving out hosts[%d] %s (failed %d times): %lld ranks on %d host%s", orig,
                 job0->hosts[orig], p->fails[orig], (long long)w, n, n == 1 ? "" : "s");
        if (d != dp) {
            size_t k = strlen(said);
            snprintf(said + k, cap - k, ", dp %lld instead of %lld (%lld microbatches of %lld rows each, global batch %lld)",
                     (long long)d, (long long)dp, (long long)(batch / (d * mb)), (long long)mb, (long long)batch);
        }
        for (int i = h; i + 1 < p->n_cur; i++) p->cur[i] = p->cur[i + 1];
        p->n_cur--;
        p->n_sets = trial.n_sets;
        memcpy(p->sets, trial.sets, sizeof p->sets);
        *job = next;
        return true;
    }
    log_warn("restart: hosts[%d] %s failed %d times, but no layout without it fits the other %d host%s (dp "
             "%lld, global batch %lld%s%s); it stays in", orig, job0->hosts[orig], p->fails[orig], n, n == 1 ? "" : "s",
             (long long)dp, (long long)batch, err[0] ? "; " : "", err);
    return false;
}

int restart_run(job_t *job, const char *const *sets, int n_sets, bool quiet, const char *resume,
                const rundir_t *rd)
{
    int64_t max = job->restart.max;
    /* each attempt starts from the job as validated (the driver fills in
     * fields such as model.vocab, which it then forwards to the workers) */
    static job_t pristine, first;
    pristine = first = *job;
    int world0 = (int)world_of(job);
    static plan_t plan;
    memset(&plan, 0, sizeof plan);
    plan.n_cur = job->n_hosts;
    for (int i = 0; i < job->n_hosts; i++) plan.cur[i] = i;
    const char **all = calloc((size_t)n_sets + 4, sizeof *all);
    json_t *attempts = json_array();
    char (*why)[1024] = calloc((size_t)max + 1, sizeof *why);
    char said[1024] = "";
    int rc = 1;
    if (!attempts || !why || !all) goto out;
    for (int64_t a = 0; a <= max; a++) {
        *job = pristine;
        const char *from = resume;
        if (a > 0) {
            from = ckpt_any(job, world0) ? "latest" : NULL;
            printf("restart %lld of %lld: from %s%s\n", (long long)a, (long long)max,
                   from ? "the latest checkpoint" : "the start (no checkpoint committed yet)", said);
            fflush(stdout);
        }
        char env[24], lp[JOB_PATH_MAX + 32];
        snprintf(env, sizeof env, "%lld", (long long)a + 1);
        setenv("BATON_ATTEMPT", env, 1);
        snprintf(lp, sizeof lp, "%s/attempt-%lld.log", rd->path, (long long)a + 1);
        FILE *log = fopen(lp, "we");
        if (!log) log_warn("restart: cannot write %s: %s", lp, strerror(errno));
        if (log) fprintf(log, "attempt %lld of %lld: %s%s%s\n", (long long)a + 1, (long long)max + 1,
                         from ? "resuming from " : "from the start", from ? from : "", said);
        for (int i = 0; i < n_sets; i++) all[i] = sets[i];
        for (int i = 0; i < plan.n_sets; i++) all[n_sets + i] = plan.sets[i];
        driver_attempt_log(log);
        rc = driver_run(job, all, n_sets + plan.n_sets, quiet, from, rd);
        driver_attempt_log(NULL);
        bt_status_t st = BT_OK;
        bool failed = rc != 0 && driver_last_failure(&st, why[a], sizeof why[a]);
        int blamed = -1, down = -1;
        driver_last_blame(&blamed, &down, failed ? NULL : why[a], failed ? 0 : sizeof why[a]);
        /* a host ssh cannot start on after a failure (it went down) is a
         * failure of that host; in the first attempt, bad input */
        bool unreachable = !failed && a > 0 && down >= 0;
        if (log) {
            fprintf(log, "exit status %d%s\n", rc, rc == 0 ? " (finished)" : failed ? "" : unreachable ? " (a host "
                    "could not be reached)" : " (before any rank ran)");
            fclose(log);
        }
        /* the host the failure is blamed on (ranks fill hosts in blocks) */
        int64_t world = world_of(job);
        int h = unreachable ? down : failed && blamed >= 0 && blamed < world ? (int)(blamed / (world / job->n_hosts)) : -1;
        json_t *hosts = json_array();
        for (int i = 0; i < job->n_hosts; i++) json_array_append_new(hosts, json_string(job->hosts[i]));
        json_array_append_new(attempts, json_pack("{sI ss si ss* so sI ss*}", "attempt", (json_int_t)a + 1,
                                                  "resumed_from", from ? from : "start", "exit", rc, "failure",
                                                  failed || unreachable ? why[a] : NULL, "hosts", hosts, "dp",
                                                  (json_int_t)job->parallel.dp, "blamed_host",
                                                  h >= 0 ? job->hosts[h] : NULL));
        record(rd, attempts, (int)a);
        if (rc == 0 || !(failed || unreachable) || st == BT_ERR_CANCELED) goto out;
        if (a == max) {
            fprintf(stderr, "baton run: %s: the job failed %lld time%s, restart.max = %lld restart%s spent:\n",
                    job->path, (long long)max + 1, max ? "s" : "", (long long)max, max == 1 ? "" : "s");
            for (int64_t k = 0; k <= max; k++)
                fprintf(stderr, "  attempt %lld: job failed: %s\n", (long long)k + 1, why[k]);
            goto out;
        }
        log_warn("restart: attempt %lld of %lld failed (%s); restarting", (long long)a + 1, (long long)max + 1,
                 why[a]);
        said[0] = 0;
        *job = pristine;
        if (h >= 0 && h < plan.n_cur && leave_out(job, &first, sets, n_sets, rd, &plan, h, said, sizeof said))
            pristine = *job;
    }
out:
    unsetenv("BATON_ATTEMPT");
    json_decref(attempts);
    free(why);
    free(all);
    return rc;
}
