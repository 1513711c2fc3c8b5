#include "launch/run_ckpt.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "base/save.h"
#include "ckpt/hf.h"
#include "ckpt/store.h"
#include "train/ckpt_state.h"

char *run_ckpt_meta_json(const job_t *job, const char *const *sets, int n_sets,
                         const model_config_t *cfg, const train_position_t *pos,
                         int64_t rows_per_step)
{
    const job_parallel_t *p = &job->parallel;
    json_t *split = json_array();
    for (int i = 0; i < p->n_split; i++) json_array_append_new(split, json_integer(p->split[i]));
    json_t *jsets = json_array();
    for (int i = 0; i < n_sets; i++) json_array_append_new(jsets, json_string(sets[i]));
    char *text = NULL;
    size_t len = 0;
    if (job->path[0] && base_file_read(job->path, JOB_FILE_MAX_BYTES, &text, &len)) text = NULL;
    char *cfg_text = ckpt_hf_config_text(cfg);
    json_t *model = cfg_text ? json_loads(cfg_text, 0, NULL) : NULL;
    free(cfg_text);
    int64_t micro = p->microbatches ? p->microbatches : job->train.grad_accum;
    json_t *j = json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
        " s:{s:I, s:I, s:I, s:I, s:b, s:I, s:I, s:o},"
        " s:{s:f, s:f, s:I, s:I},"
        " s:o, s:{s:s, s:o, s:s}}",
        "step", (json_int_t)pos->step, "samples", (json_int_t)pos->samples,
        "rows_per_step", (json_int_t)rows_per_step, "skipped", (json_int_t)pos->skipped,
        "skip_run", (json_int_t)pos->skip_run, "optim_steps", (json_int_t)pos->optim_steps,
        "seed", (json_int_t)job->train.seed,
        "layout", "tp", (json_int_t)p->tp, "pp", (json_int_t)p->pp, "dp", (json_int_t)p->dp,
        "virtual_stages", (json_int_t)p->virtual_stages, "zero1", (int)p->zero1,
        "microbatches", (json_int_t)micro, "micro_batch", (json_int_t)job->train.micro_batch,
        "split", split,
        "lr", "lr", job->optim.lr, "min_lr", job->optim.min_lr, "warmup", (json_int_t)job->optim.warmup,
        "steps", (json_int_t)job->train.steps,
        "model", model ? model : json_null(),
        "job", "file", job->path, "sets", jsets, "text", text ? text : "");
    free(text);
    char *out = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    return out;
}

static bool get_int(json_t *o, const char *key, int64_t *v)
{
    json_t *x = json_object_get(o, key);
    if (!json_is_integer(x)) return false;
    *v = json_integer_value(x);
    return true;
}

bt_status_t run_ckpt_meta_check(const ckpt_index_t *idx, const char *dir, const job_t *job,
                                const model_config_t *cfg, run_ckpt_meta_t *out, char *err,
                                size_t errlen)
{
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *m = json_loads(idx->meta ? idx->meta : "{}", 0, &je);
    json_t *layout = m ? json_object_get(m, "layout") : NULL;
    int64_t seed = 0, zero1 = 0;
    train_position_t *p = &out->pos;
    bool ok = m && get_int(m, "step", &p->step) && get_int(m, "samples", &p->samples) &&
              get_int(m, "rows_per_step", &out->rows_per_step) &&
              get_int(m, "skipped", &p->skipped) && get_int(m, "skip_run", &p->skip_run) &&
              get_int(m, "optim_steps", &p->optim_steps) && get_int(m, "seed", &seed) &&
              json_is_object(layout) && get_int(layout, "tp", &out->tp) &&
              get_int(layout, "pp", &out->pp) && get_int(layout, "dp", &out->dp) &&
              get_int(layout, "virtual_stages", &out->vpp);
    if (ok) {
        json_t *z = json_object_get(layout, "zero1");
        zero1 = json_is_true(z);
        ok = json_is_boolean(z) && p->step >= 0 && p->samples >= 0 && p->skipped >= 0 &&
             p->skip_run >= 0 && p->optim_steps >= 0 && p->optim_steps <= p->step;
    }
    if (!ok) {
        json_decref(m);
        snprintf(err, errlen, "%s: index.json meta is not a training checkpoint's (step, samples, "
                 "optimizer steps, layout missing or out of range): written by `baton convert`, "
                 "or damaged", dir);
        return BT_ERR_CORRUPT;
    }
    out->seed = (uint64_t)seed;
    out->zero1 = zero1;
    char *mine = ckpt_hf_config_text(cfg);
    char *theirs = json_dumps(json_object_get(m, "model"), JSON_COMPACT | JSON_PRESERVE_ORDER);
    bool same = mine && theirs && !strcmp(mine, theirs);
    if (!same)
        snprintf(err, errlen, "%s: a checkpoint of another model: its config %.200s%s, this job's "
                 "%.200s%s", dir, theirs ? theirs : "?", theirs && strlen(theirs) > 200 ? "..." : "",
                 mine ? mine : "?", mine && strlen(mine) > 200 ? "..." : "");
    free(mine);
    free(theirs);
    json_decref(m);
    if (!same) return BT_ERR_INVALID;
    if (p->step >= job->train.steps) {
        snprintf(err, errlen, "%s is of step %lld; train.steps is %lld: nothing left to train "
                 "(raise train.steps)", dir, (long long)p->step, (long long)job->train.steps);
        return BT_ERR_INVALID;
    }
    if (out->seed != (uint64_t)job->train.seed)
        log_warn("resume: %s was trained with train.seed %llu, this job says %lld: the data order "
                 "from here on follows the new seed", dir, (unsigned long long)out->seed,
                 (long long)job->train.seed);
    return BT_OK;
}

bt_status_t run_ckpt_root(const job_t *job, int rank, char *out, size_t cap)
{
    char host[256];
    if (gethostname(host, sizeof host)) snprintf(host, sizeof host, "host");
    host[sizeof host - 1] = 0;
    size_t at = 0;
    for (const char *s = job->checkpoint.dir; *s; ) {
        const char *rep = NULL;
        char num[24];
        size_t skip = 1;
        if (!strncmp(s, "{rank}", 6)) {
            snprintf(num, sizeof num, "%d", rank);
            rep = num;
            skip = 6;
        } else if (!strncmp(s, "{host}", 6)) {
            rep = host;
            skip = 6;
        }
        size_t n = rep ? strlen(rep) : 1;
        if (at + n + 1 > cap) {
            log_error("checkpoint.dir: %s expands to more than %zu bytes", job->checkpoint.dir, cap - 1);
            return BT_ERR_INVALID;
        }
        memcpy(out + at, rep ? rep : s, n);
        at += n;
        s += skip;
    }
    out[at] = 0;
    return BT_OK;
}

void run_ckpt_shard_name(int rank, char *buf, size_t cap)
{
    snprintf(buf, cap, "shard-r%05d.safetensors", rank);
}

bt_status_t run_ckpt_find(const char *what, const char *root, char *dir, size_t cap, char *err,
                          size_t errlen)
{
    if (!what || !strcmp(what, "latest")) {
        if (!root || !root[0]) {
            snprintf(err, errlen, "--resume latest: checkpoint.dir names no checkpoint root");
            return BT_ERR_INVALID;
        }
        what = root;
    }
    return ckpt_resolve(what, dir, cap, err, errlen);
}

bt_status_t run_metrics_trim(const char *path, int64_t step, int64_t *tokens)
{
    *tokens = 0;
    if (!path[0] || access(path, F_OK) != 0) return BT_OK;
    char *text = NULL;
    size_t len = 0;
    bt_status_t st = base_file_read(path, 1u << 30, &text, &len);
    if (st) return st;
    char *out = malloc(len + 1);
    if (!out) {
        free(text);
        return BT_ERR_NOMEM;
    }
    size_t n = 0;
    for (char *line = text, *next; line < text + len; line = next) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        next = nl ? nl + 1 : text + len;
        json_t *j = json_loadb(line, (size_t)(next - line), 0, NULL);
        json_t *s = j ? json_object_get(j, "step") : NULL;
        if (json_is_integer(s) && json_integer_value(s) <= step) {
            memcpy(out + n, line, (size_t)(next - line));
            n += (size_t)(next - line);
            if (nl == NULL) out[n++] = '\n';
            json_t *t = json_object_get(j, "tokens");
            if (json_is_integer(t)) *tokens = json_integer_value(t);
        }
        json_decref(j);
    }
    st = base_save_file(path, out, n, 0644);
    free(out);
    free(text);
    return st;
}

bt_status_t run_ckpt_save_one(const char *root, int64_t step, const char *file,
                              const ckpt_put_t *puts, int n, const char *meta, int64_t keep,
                              char *err, size_t errlen)
{
    bt_status_t st = ckpt_stage_begin(root, step, err, errlen);
    if (st) return st;
    char tmp[CKPT_PATH_MAX];
    ckpt_step_tmp(root, step, tmp, sizeof tmp);
    ckpt_index_t idx = {0};
    if ((st = ckpt_shard_write(&idx, tmp, file, puts, n, err, errlen))) goto out;
    if ((st = ckpt_index_set_meta(&idx, meta ? meta : "{}"))) {
        snprintf(err, errlen, "checkpoint of step %lld: bad metadata", (long long)step);
        goto out;
    }
    if ((st = ckpt_index_check(&idx, err, errlen))) goto out;
    st = ckpt_commit(root, step, &idx, keep, err, errlen);
out:
    ckpt_index_free(&idx);
    return st;
}

bt_status_t run_ckpt_newer_check(const char *root, int64_t step, char *err, size_t errlen)
{
    int64_t newest;
    if (!root[0] || ckpt_list_steps(root, &newest, 1) != 1 || newest <= step) return BT_OK;
    snprintf(err, errlen, "%s already holds the checkpoint of step %lld, newer than step %lld "
             "resumed from: the run would save over it; give it another checkpoint.dir, or move "
             "the newer steps away", root, (long long)newest, (long long)step);
    return BT_ERR_INVALID;
}

bt_status_t run_ckpt_restore(const char *const *dirs, int n, ckpt_fetch_fn fetch, void *fetch_arg,
                             const job_t *job, const model_config_t *cfg, const char *save_root,
                             const struct ckpt_items *items, run_ckpt_meta_t *meta,
                             uint64_t *fetched, char *err, size_t errlen)
{
    ckpt_reader_t *r = NULL;
    bt_status_t st = ckpt_reader_open(dirs, n, &r, err, errlen);
    if (!st && fetch) ckpt_reader_set_fetch(r, fetch, fetch_arg);
    if (!st) st = run_ckpt_meta_check(ckpt_reader_index(r), dirs[0], job, cfg, meta, err, errlen);
    if (!st && save_root && save_root[0])
        st = run_ckpt_newer_check(save_root, meta->pos.step, err, errlen);
    if (!st) st = ckpt_items_restore(items, r, err, errlen);
    if (fetched) *fetched = r ? ckpt_reader_fetched(r) : 0;
    ckpt_reader_close(r);
    return st;
}
