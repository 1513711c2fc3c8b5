/* Reference measurements for `baton bench transport`. */
#include "bench/bench.h"

#include <string.h>

bt_status_t bench_ref_run(xport_kind_t kind, unsigned iters, size_t big_bytes, bench_ref_t *out)
{
    (void)iters; (void)big_bytes;
    memset(out, 0, sizeof *out);
    (void)kind;
    return BT_ERR_UNSUPPORTED;
}
