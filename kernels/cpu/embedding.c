/* Token embedding (vocabulary-parallel shards by vocab_start). */
#include "kernels/cpu/cpu.h"

#include <string.h>

void cpu_embedding_fwd(float *out, const float *table, const int32_t *ids, int64_t N, int64_t V,
                       int64_t C, int64_t vocab_start)
{
    for (int64_t n = 0; n < N; n++) {
        int64_t r = (int64_t)ids[n] - vocab_start;
        if (r >= 0 && r < V) memcpy(out + n * C, table + r * C, (size_t)C * sizeof *out);
        else memset(out + n * C, 0, (size_t)C * sizeof *out);
    }
}

void cpu_embedding_bwd(float *dtable, const float *dout, const int32_t *ids, int64_t N, int64_t V,
                       int64_t C, int64_t vocab_start)
{
    for (int64_t n = 0; n < N; n++) {
        int64_t r = (int64_t)ids[n] - vocab_start;
        if (r < 0 || r >= V) continue;
        float *d = dtable + r * C;
        const float *g = dout + n * C;
        for (int64_t c = 0; c < C; c++) d[c] += g[c];
    }
}
