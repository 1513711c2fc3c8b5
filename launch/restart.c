/* Automatic restart (launch/restart.h). */
#include "launch/restart.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "ckpt/store.h"
#include "launch/driver.h"
#include "launch/run_ckpt.h"

/* Whether some checkpoint root of the job holds a committed step. */
static bool ckpt_any(const job_t *job)
{
    if (!job->checkpoint.dir[0]) return false;
    int world = (int)(job->parallel.tp * job->parallel.cp * job->parallel.pp * job->parallel.dp);
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

int restart_run(job_t *job, const char *const *sets, int n_sets, bool quiet, const char *resume,
                const rundir_t *rd)
{
    int64_t max = job->restart.max;
    /* each attempt starts from the job as validated (the driver fills in
     * fields such as model.vocab, which it then forwards to the workers) */
    static job_t pristine;
    pristine = *job;
    json_t *attempts = json_array();
    char (*why)[1024] = calloc((size_t)max + 1, sizeof *why);
    int rc = 1;
    if (!attempts || !why) goto out;
    for (int64_t a = 0; a <= max; a++) {
        *job = pristine;
        const char *from = resume;
        if (a > 0) {
            from = ckpt_any(job) ? "latest" : NULL;
            printf("restart %lld of %lld: from %s\n", (long long)a, (long long)max,
                   from ? "the latest checkpoint" : "the start (no checkpoint committed yet)");
            fflush(stdout);
        }
        char env[24], lp[JOB_PATH_MAX + 32];
        snprintf(env, sizeof env, "%lld", (long long)a + 1);
        setenv("BATON_ATTEMPT", env, 1);
        snprintf(lp, sizeof lp, "%s/attempt-%lld.log", rd->path, (long long)a + 1);
        FILE *log = fopen(lp, "we");
        if (!log) log_warn("restart: cannot write %s: %s", lp, strerror(errno));
        if (log) fprintf(log, "attempt %lld of %lld: %s%s\n", (long long)a + 1, (long long)max + 1,
                         from ? "resuming from " : "from the start", from ? from : "");
        driver_attempt_log(log);
        rc = driver_run(job, sets, n_sets, quiet, from, rd);
        driver_attempt_log(NULL);
        bt_status_t st = BT_OK;
        bool failed = rc != 0 && driver_last_failure(&st, why[a], sizeof why[a]);
        if (log) {
            fprintf(log, "exit status %d%s\n", rc, rc == 0 ? " (finished)" : failed ? "" : " (before any rank ran)");
            fclose(log);
        }
        json_array_append_new(attempts, json_pack("{sI ss si ss*}", "attempt", (json_int_t)a + 1, "resumed_from", from ? from : "start",
                                                  "exit", rc, "failure", failed ? why[a] : NULL));
        record(rd, attempts, (int)a);
        if (rc == 0 || !failed || st == BT_ERR_CANCELED) goto out;
        if (a == max) {
            fprintf(stderr, "baton run: %s: the job failed %lld time%s, restart.max = %lld restart%s spent:\n",
                    job->path, (long long)max + 1, max ? "s" : "", (long long)max, max == 1 ? "" : "s");
            for (int64_t k = 0; k <= max; k++)
                fprintf(stderr, "  attempt %lld: job failed: %s\n", (long long)k + 1, why[k]);
            goto out;
        }
        log_warn("restart: attempt %lld of %lld failed (%s); restarting", (long long)a + 1, (long long)max + 1,
                 why[a]);
    }
out:
    unsetenv("BATON_ATTEMPT");
    json_decref(attempts);
    free(why);
    return rc;
}
