/* libFuzzer target: trace_file_load_mem on arbitrary bytes (trace format
 * versions 1-3: 64-byte records, 40-byte slots, CLOCK blocks, wide and pad
 * slots). The reader must refuse the input with BT_ERR_CORRUPT (or
 * NOMEM) or load records that the JSON writer and the summary then take
 * without a fault.
 *
 *   make fuzz && build/fuzz/fuzz_trace -max_len=4096 -close_fd_mask=2 CORPUS tests/fuzz/corpus_trace
 * (seeds: python3 tests/fuzz/gen_trace_seeds.py; make fuzz-run runs the
 * recorded campaign; docs/TRACING.md) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "trace/read.h"
#include "base/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *devnull;
    if (!devnull) {
        devnull = fopen("/dev/null", "we");
        log_set_level(LOG_ERROR); /* the reader's warnings are expected here */
    }
    trace_file_t f;
    char err[512];
    bt_status_t st = trace_file_load_mem(data, size, "fuzz", &f, err, sizeof err);
    if (st != BT_OK) {
        if (st != BT_ERR_CORRUPT && st != BT_ERR_NOMEM) BT_PANIC("unexpected status %d: %s", (int)st, err);
        return 0;
    }
    for (size_t i = 0; i < f.nrecs; i++)
        if (f.recs[i].ev >= TRACE_EV_COUNT || f.recs[i].t1 < f.recs[i].t0) BT_PANIC("record %zu loaded bad", i);
    trace_set_t set = {.files = malloc(sizeof f), .nfiles = 1};
    if (!set.files) BT_PANIC("out of memory");
    set.files[0] = f;
    if (trace_json_write(&set, devnull) != BT_OK) BT_PANIC("json of a loaded file failed");
    trace_summary_t sum;
    if (trace_summary_compute(&set, &sum) == BT_OK) {
        trace_summary_print(&sum, devnull);
        trace_summary_free(&sum);
    }
    trace_set_free(&set);
    return 0;
}
