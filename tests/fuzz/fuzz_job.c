/* libFuzzer target: the job-file reader (launch/job.h) on arbitrary bytes.
 *
 * Input: YAML text, optionally followed by a NUL byte and NUL-separated
 * `--set` assignments ("section.key=value"), at most 8 of them. The job is
 * loaded from the YAML (job_load_buffer), the overrides applied in order,
 * then validated and, when valid, turned into its actor graph, which is
 * printed to /dev/null. model.hf is cleared before validation: it names a
 * path, and the target must not read the file system.
 *
 * Properties: never a crash, leak or sanitizer report; every refusal is
 * BT_ERR_INVALID with a message that names where ("fuzz.yaml..." or
 * "--set ..."), and the reader never takes time quadratic in the input
 * (libFuzzer's -timeout catches that).
 *
 *   make fuzz && build/fuzz/fuzz_job -max_len=4096 CORPUS tests/fuzz/corpus_job
 * (make fuzz-run runs the recorded campaign; docs/JOBS.md) */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "launch/graph.h"
#include "launch/job.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_job_expect_where(bt_status_t st, const char *err, const char *what)
{
    if (st != BT_ERR_INVALID) BT_PANIC("%s: status %d, not INVALID", what, (int)st);
    if (strncmp(err, "fuzz.yaml", 9) && strncmp(err, "--set ", 6))
        BT_PANIC("%s: message names no place: '%s'", what, err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *devnull;
    static job_t job;
    static graph_t g;
    if (!devnull) {
        devnull = fopen("/dev/null", "w");
        if (!devnull) BT_PANIC("cannot open /dev/null");
    }
    const char *text = (const char *)data;
    const char *nul = memchr(text, '\0', size);
    size_t yaml_len = nul ? (size_t)(nul - text) : size;
    char err[JOB_ERR_MAX];
    err[0] = '\0';
    bt_status_t st = job_load_buffer("fuzz.yaml", text, yaml_len, &job, err, sizeof err);
    if (st) {
        fuzz_job_expect_where(st, err, "load");
        return 0;
    }
    /* the overrides: NUL-terminated pieces after the YAML (the last one may
     * run to the end of the input: copied to terminate it) */
    size_t at = yaml_len + 1;
    for (int k = 0; k < 8 && at < size; k++) {
        const char *s = text + at;
        const char *end = memchr(s, '\0', size - at);
        size_t n = end ? (size_t)(end - s) : size - at;
        char set[1024];
        if (n >= sizeof set) n = sizeof set - 1;
        memcpy(set, s, n);
        set[n] = '\0';
        at += n + 1;
        st = job_override(&job, set, err, sizeof err);
        if (st) {
            fuzz_job_expect_where(st, err, "override");
            return 0;
        }
    }
    job.model.hf[0] = '\0';
    st = job_validate(&job, err, sizeof err);
    if (st) {
        fuzz_job_expect_where(st, err, "validate");
        return 0;
    }
    if (graph_build(&job, &g, err, sizeof err) == BT_OK) {
        /* a big world prints thousands of lines: keep the input fast */
        if (g.world <= 64) graph_print(&g, &job, devnull);
    }
    return 0;
}
