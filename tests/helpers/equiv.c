#include "tests/helpers/equiv.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "ckpt/hf.h"
#include "model/model.h"

static const char *baton(void)
{
    const char *b = getenv("BATON");
    return b && *b ? b : "build/baton";
}

int test_equiv_run(const char *dir, const char *job, const char *name, const char *sets,
                   int threads)
{
    char cmd[4096], env[64] = "";
    if (threads > 0) snprintf(env, sizeof env, "BATON_CPU_THREADS=%d ", threads);
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/%s && %s%s run %s --quiet %s --set metrics.file=%s/%s/m.jsonl "
             "--set export.dir=%s/%s/ck > %s/%s/log 2>&1",
             dir, name, env, baton(), job, sets, dir, name, dir, name, dir, name);
    int rc = system(cmd);
    if (rc != 0) {
        fprintf(stderr, "%s failed (status %d); its log:\n", name, rc);
        snprintf(cmd, sizeof cmd, "tail -20 %s/%s/log >&2", dir, name);
        if (system(cmd)) {}
    }
    return rc;
}

int test_equiv_data_dir(char *dir, size_t cap, const char *name)
{
    snprintf(dir, cap, "/tmp/%s.XXXXXX", name);
    if (!mkdtemp(dir)) return -1;
    char p[512];
    snprintf(p, sizeof p, "%s/data", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/data/tokens.txt", dir);
    FILE *f = fopen(p, "w");
    if (!f) return -1;
    uint64_t x = 12345;
    for (int i = 0; i < 4000; i++) {
        x = (x * 1103515245u + 12345u) % 2147483648u;
        int t = i % 48;
        if (x % 10 == 0) t = (int)(x / 65536 % 200);
        fprintf(f, "%d ", t);
    }
    return fclose(f) ? -1 : 0;
}

int test_equiv_remove(const char *dir)
{
    if (!dir[0]) return 0;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

/* The values of `key` in the metrics lines of run `name`. */
static int values(const char *dir, const char *name, const char *key, double *out, int max)
{
    char p[512], line[4096];
    snprintf(p, sizeof p, "%s/%s/m.jsonl", dir, name);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        json_t *l = j ? json_object_get(j, key) : NULL;
        if (l && json_is_number(l)) out[n++] = json_number_value(l);
        json_decref(j);
    }
    fclose(f);
    return n;
}

/* The largest relative difference between the `key` values of runs name
 * and ref, of which there must be `want` each: -1 when there are not. */
static int max_rel_diff(const char *dir, const char *name, const char *ref, const char *key,
                        int want, int ref_skip, double *out)
{
    double a[64], b[64];
    int na = values(dir, name, key, a, 64), nb = values(dir, ref, key, b, 64) - ref_skip;
    if (na != want || nb != want) {
        fprintf(stderr, "%s: %d %s values, reference %d (want %d)\n", name, na, key, nb, want);
        return -1;
    }
    *out = 0;
    for (int i = 0; i < want; i++) {
        double r = fabs(a[i] - b[ref_skip + i]) / fabs(b[ref_skip + i]);
        if (r > *out) *out = r;
    }
    return 0;
}

int test_equiv_compare(const char *dir, const char *name, const char *ref, int n_loss, int n_val,
                       int ref_val_skip, test_equiv_diff_t *d)
{
    d->loss_rel = d->val_rel = d->param_abs = 0;
    if (max_rel_diff(dir, name, ref, "loss", n_loss, 0, &d->loss_rel) != 0) return -1;
    if (n_val &&
        max_rel_diff(dir, name, ref, "val_loss", n_val, ref_val_skip, &d->val_rel) != 0)
        return -1;
    return test_equiv_params(dir, name, ref, &d->param_abs);
}

double test_equiv_param_bound(double lr) { return lr / 20; }

int test_equiv_params(const char *dir, const char *name, const char *ref, double *param_abs)
{
    *param_abs = 0;
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/%s/ck", dir, name);
    snprintf(pb, sizeof pb, "%s/%s/ck", dir, ref);
    model_t *ma = NULL, *mb = NULL;
    if (ckpt_hf_load(pa, NULL, &ma) || ckpt_hf_load(pb, NULL, &mb)) {
        model_destroy(ma);
        return -1;
    }
    int bad = ma->n_params != mb->n_params;
    for (int i = 0; i < ma->n_params && !bad; i++) {
        int j = model_param_find(mb, ma->params[i].name);
        if (j < 0 || tensor_numel(&ma->params[i].t) != tensor_numel(&mb->params[j].t)) {
            bad = 1;
            break;
        }
        const float *x = ma->params[i].t.data, *y = mb->params[j].t.data;
        for (int64_t k = 0; k < tensor_numel(&ma->params[i].t); k++) {
            double e = fabs((double)x[k] - (double)y[k]);
            if (e > *param_abs) *param_abs = e;
        }
    }
    model_destroy(ma);
    model_destroy(mb);
    return bad ? -1 : 0;
}
