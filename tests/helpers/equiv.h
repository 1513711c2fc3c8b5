/* Layout equivalence for tests: `baton run` of a job under some --set
 * overrides into a directory of its own (metrics JSONL, the final HF
 * export, the log), and the comparison of two such runs: per-step losses,
 * validation losses and every exported parameter. tests/test_dist_equiv.c
 * (dense layouts), tests/test_moe_equiv.c (expert layouts), tests/test_cp_equiv.c
 * and tests/test_reference.c use it. */
#ifndef BT_TESTS_EQUIV_H
#define BT_TESTS_EQUIV_H

#include <stddef.h>

typedef struct {
    double loss_rel, val_rel, param_abs; /* largest relative / absolute differences */
} test_equiv_diff_t;

/* $BATON (or build/baton) run JOB --quiet SETS, with metrics.file and
 * export.dir under DIR/NAME, `threads` CPU threads per process (0: baton's
 * default share); the exit status (its log's tail printed on failure). */
int test_equiv_run(const char *dir, const char *job, const char *name, const char *sets,
                   int threads);
/* Run NAME against run REF (both under DIR): n_loss per-step losses and
 * n_val validation losses each must be there (else -1; REF's first
 * ref_val_skip validation lines are not compared: a single-process run of
 * an HF model adds one of step 0), and the exports hold the same tensors. */
int test_equiv_compare(const char *dir, const char *name, const char *ref, int n_loss, int n_val,
                       int ref_val_skip, test_equiv_diff_t *d);

/* The largest absolute difference of any parameter between the exports of
 * runs NAME and REF (under DIR) into *param_abs; -1 when either does not
 * load or they hold other tensors. */
int test_equiv_params(const char *dir, const char *name, const char *ref, double *param_abs);

/* The bound on test_equiv_params' difference for runs at peak learning
 * rate lr: lr / 20. AdamW moves an element by about lr a step whatever its
 * gradient's size (m/sqrt(v)), so the exports differ wherever f32
 * summation-order noise meets a gradient near AdamW's eps (1e-8): the
 * update lr g/(|g| + eps) then moves by up to lr |dg| / eps. That noise
 * depends on the BLAS kernels: layouts within 1e-5 of one process with
 * OpenBLAS's own choice on a Zen 5 host reached 1.3e-5 at lr 1e-3 and
 * 2.1e-5 at lr 1e-2 with OPENBLAS_CORETYPE=Haswell on the same host. An
 * element whose update went another way in any step is off by about
 * 2 lr: 40 times the bound. Losses (1e-5 relative) stay the tight check. */
double test_equiv_param_bound(double lr);

/* A fresh directory /tmp/NAME.XXXXXX into dir (cap bytes) holding
 * data/tokens.txt: 4000 ids of a fixed generator (mostly i % 48, one in ten
 * below 200), the token stream the layout-equivalence jobs train on. 0, or
 * -1 when it cannot be made. */
int test_equiv_data_dir(char *dir, size_t cap, const char *name);

/* rm -rf DIR (nothing when DIR is ""): the exit status. */
int test_equiv_remove(const char *dir);

#endif
