#include "train/data_actor.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "model/cp_attn.h"

bt_status_t data_actor_init(data_actor_t *d, const data_actor_config_t *cfg)
{
    memset(d, 0, sizeof *d);
    d->cfg = *cfg;
    if (!cfg->tokens) return BT_OK; /* evaluation only */
    if (cfg->n_tokens < cfg->T + 1) {
        log_error("data: the training stream has %lld tokens, fewer than one window of %lld",
                  (long long)cfg->n_tokens, (long long)(cfg->T + 1));
        return BT_ERR_INVALID;
    }
    return train_sampler_init(&d->sampler, cfg->seed, (cfg->n_tokens - 1) / cfg->T);
}

void data_actor_fini(data_actor_t *d) { train_sampler_free(&d->sampler); }

/* ids and targets [rows, T] of whole rows (in out's "tokens" / "targets",
 * allocated [rows, T/cp]) cut down to this CP rank's chunks in place of
 * a copy: the whole rows come from src_ids / src_tg. */
static void cp_cut(const data_actor_config_t *c, tensor_t *ids, tensor_t *tg,
                   const int32_t *src_ids, const int32_t *src_tg, int64_t rows)
{
    cp_attn_split_host(ids->data, src_ids, rows, c->T, sizeof(int32_t), c->cp, c->cp_rank);
    cp_attn_split_host(tg->data, src_tg, rows, c->T, sizeof(int32_t), c->cp, c->cp_rank);
}

static int data_cp(const data_actor_config_t *c) { return c->cp > 1 ? c->cp : 1; }

static void eval_send(data_actor_t *d)
{
    const data_actor_config_t *c = &d->cfg;
    int64_t K = (c->eval_rows + c->B - 1) / c->B;
    /* padded (eval_pad): as many as dp rank 0 runs, the missing ones one
     * row with nothing scored */
    int64_t Kp = c->eval_pad && K > 0 ? (K + c->dp - 1) / c->dp * c->dp : K;
    int j = 0;
    for (int64_t k = c->dp_rank; k < Kp; k += c->dp, j++) {
        bool pad = k >= K;
        int64_t r0 = pad ? 0 : k * c->B, rows = pad ? 1 : c->eval_rows - r0 < c->B ? c->eval_rows - r0 : c->B;
        int64_t shape[2] = {rows, c->T / data_cp(c)};
        actor_msg_t *out = actor_msg_new(MSG_DATA_BATCH);
        tensor_t *ids = out ? actor_msg_tensor_new(out, "tokens", DT_I32, 2, shape) : NULL;
        tensor_t *tg = ids ? actor_msg_tensor_new(out, "targets", DT_I32, 2, shape) : NULL;
        if (!tg) {
            log_error("data: out of memory for evaluation microbatch %d", j);
            if (out) actor_msg_free(out);
            return;
        }
        if (pad) {
            for (int64_t i = 0; i < rows * shape[1]; i++) ((int32_t *)tg->data)[i] = -100;
            memcpy(ids->data, c->eval_ids, (size_t)(rows * shape[1]) * sizeof(int32_t));
        } else if (data_cp(c) > 1) {
            cp_cut(c, ids, tg, c->eval_ids + r0 * c->T, c->eval_targets + r0 * c->T, rows);
        } else {
            memcpy(ids->data, c->eval_ids + r0 * c->T, (size_t)(rows * c->T) * sizeof(int32_t));
            memcpy(tg->data, c->eval_targets + r0 * c->T, (size_t)(rows * c->T) * sizeof(int32_t));
        }
        out->env.step = -1;
        out->env.mb = j;
        out->body.data_batch = (msg_data_batch_t){.data_pos = (uint64_t)r0, .batch = (uint32_t)rows,
                                                  .seq_len = (uint32_t)shape[1]};
        bt_status_t st = actor_send(&d->a, c->stage, out);
        if (st && st != BT_ERR_BUSY)
            log_error("data: evaluation microbatch %d not delivered (%s)", j, bt_status_str(st));
    }
}

static actor_ret_t data_on_heartbeat(actor_t *self, actor_msg_t *m)
{
    data_actor_t *d = (data_actor_t *)self;
    const data_actor_config_t *c = &d->cfg;
    if (m->body.heartbeat.state == DATA_CMD_EVAL) {
        eval_send(d);
        return ACTOR_DONE;
    }
    if (m->body.heartbeat.state != DATA_CMD_STEP || !c->tokens) return ACTOR_DONE;
    int64_t step = m->body.heartbeat.step; /* 1-based */
    int64_t R = (int64_t)c->dp * c->M * c->B;
    int64_t first = c->base_samples + (step - 1 - c->base_step) * R; /* this step's first sample */
    int64_t shape[2] = {c->B, c->T / data_cp(c)};
    int32_t *whole = NULL; /* CP: the whole rows (ids, then targets) before the cut */
    if (data_cp(c) > 1 && !(whole = malloc((size_t)(2 * c->B * c->T) * sizeof *whole))) {
        log_error("data: out of memory for step %lld", (long long)step);
        return ACTOR_DONE;
    }
    for (int k = 0; k < c->M; k++) {
        actor_msg_t *out = actor_msg_new(MSG_DATA_BATCH);
        tensor_t *ids = out ? actor_msg_tensor_new(out, "tokens", DT_I32, 2, shape) : NULL;
        tensor_t *tg = ids ? actor_msg_tensor_new(out, "targets", DT_I32, 2, shape) : NULL;
        if (!tg) {
            log_error("data: out of memory for step %lld microbatch %d", (long long)step, k);
            if (out) actor_msg_free(out);
            free(whole);
            return ACTOR_DONE;
        }
        int32_t *wid = whole ? whole : ids->data, *wtg = whole ? whole + c->B * c->T : tg->data;
        for (int64_t b = 0; b < c->B; b++) {
            int64_t g = first + ((int64_t)c->dp_rank * c->M + k) * c->B + b;
            int64_t w = train_sampler_window(&d->sampler, g);
            const int32_t *src = c->tokens + w * c->T;
            memcpy(wid + b * c->T, src, (size_t)c->T * sizeof(int32_t));
            memcpy(wtg + b * c->T, src + 1, (size_t)c->T * sizeof(int32_t));
        }
        if (whole) cp_cut(c, ids, tg, wid, wtg, c->B);
        out->env.step = step;
        out->env.mb = k;
        out->body.data_batch = (msg_data_batch_t){
            .data_pos = (uint64_t)((step - 1) * R), .batch = (uint32_t)c->B,
            .seq_len = (uint32_t)shape[1], .epoch = (uint32_t)((step - 1) * R / d->sampler.n_windows)};
        bt_status_t st = actor_send(self, c->stage, out);
        if (st && st != BT_ERR_BUSY)
            log_error("data: step %lld microbatch %d not delivered (%s)", (long long)step, k,
                      bt_status_str(st));
    }
    free(whole);
    return ACTOR_DONE;
}

const actor_class_t data_actor_class = {
    .name = "data",
    .handlers = {[MSG_HEARTBEAT] = data_on_heartbeat},
};
