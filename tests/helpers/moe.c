#include "tests/helpers/moe.h"

#include <stdlib.h>
#include <string.h>

bt_status_t test_moe_routers_tie(model_t *m, int ep)
{
    int64_t E = m->cfg.moe.n_experts, El = E / ep;
    for (int i = 0; i < m->n_params; i++) {
        if (!strstr(m->params[i].name, ".gate.weight") || strstr(m->params[i].name, "shared"))
            continue;
        int64_t C = m->params[i].t.shape[1];
        float *w = malloc((size_t)(E * C) * sizeof *w);
        if (!w) return BT_ERR_NOMEM;
        bt_status_t st = model_param_read(m, i, false, w);
        for (int64_t e = 1; e < E; e++)
            if (e == 1 || (e >= El && e < 2 * El)) memcpy(w + e * C, w, (size_t)C * sizeof *w);
        if (st == BT_OK) st = model_param_write(m, i, w);
        free(w);
        if (st) return st;
    }
    return BT_OK;
}
