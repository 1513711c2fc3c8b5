#include "train/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "kernels/kernels.h"

/* ---- PRNG ------------------------------------------------------------------ */

uint64_t train_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void train_rng_seed(train_rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = train_splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t train_rng_next(train_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t train_rng_below(train_rng_t *r, uint64_t bound)
{
    return (uint64_t)(((unsigned __int128)train_rng_next(r) * bound) >> 64);
}

/* ---- sampler --------------------------------------------------------------- */

bt_status_t train_sampler_init(train_sampler_t *s, uint64_t seed, int64_t n_windows)
{
    memset(s, 0, sizeof *s);
    if (n_windows <= 0) return BT_ERR_INVALID;
    s->perm = malloc((size_t)n_windows * sizeof *s->perm);
    if (!s->perm) return BT_ERR_NOMEM;
    s->seed = seed;
    s->n_windows = n_windows;
    s->epoch = -1;
    return BT_OK;
}

void train_sampler_free(train_sampler_t *s)
{
    free(s->perm);
    s->perm = NULL;
}

int64_t train_sampler_window(train_sampler_t *s, int64_t g)
{
    int64_t epoch = g / s->n_windows;
    if (epoch != s->epoch) {
        train_rng_t r;
        train_rng_seed(&r, s->seed ^ ((uint64_t)epoch * 0x9E3779B97F4A7C15ull));
        for (int64_t i = 0; i < s->n_windows; i++) s->perm[i] = i;
        for (int64_t i = s->n_windows - 1; i > 0; i--) {
            int64_t j = (int64_t)train_rng_below(&r, (uint64_t)i + 1);
            int64_t tmp = s->perm[i];
            s->perm[i] = s->perm[j];
            s->perm[j] = tmp;
        }
        s->epoch = epoch;
    }
    return s->perm[g % s->n_windows];
}

/* Every token of a stream is an id of the model's vocabulary; says which is not. */
static bool tokens_in_vocab(const int32_t *tokens, int64_t n, int64_t vocab, const char *which)
{
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab) {
            log_error("train: token %lld of the %s stream is %d, outside the model's "
                      "vocabulary [0, %lld)", (long long)i, which, tokens[i], (long long)vocab);
            return false;
        }
    return true;
}


/* ---- loop ------------------------------------------------------------------ */

struct train {
    train_config_t  cfg;
    model_t        *model;
    model_acts_t   *acts;
    optim_t        *optim;
    const int32_t  *tokens, *val_tokens;
    int64_t         n_tokens, n_val;
    train_sampler_t sampler;
    int32_t        *ids, *targets; /* [grad_accum][micro_batch * seq_len] */
    int64_t         step;          /* steps done (skipped ones included) */
    int64_t         skip_run;      /* consecutive skipped steps just before this one */
    int64_t         skipped;       /* skipped steps in all */
    int64_t         base_step;     /* resumed: the step the checkpoint was of, */
    int64_t         base_samples;  /* ... and the samples consumed by then (0, 0: none) */
};

bt_status_t train_create(const train_config_t *cfg, model_t *m, const int32_t *train_tokens,
                         int64_t n_train, const int32_t *val_tokens, int64_t n_val,
                         train_t **out)
{
    if (!m->stage.has_embedding || !m->stage.has_head) {
        log_error("train: single-process training needs the whole model");
        return BT_ERR_INVALID;
    }
    int64_t T = cfg->seq_len;
    if (n_train < T + 1) {
        log_error("train: the training stream has %lld tokens, fewer than one window of "
                  "seq_len + 1 = %lld", (long long)n_train, (long long)(T + 1));
        return BT_ERR_INVALID;
    }
    if (!tokens_in_vocab(train_tokens, n_train, m->cfg.vocab_size, "training") ||
        !tokens_in_vocab(val_tokens, n_val, m->cfg.vocab_size, "validation"))
        return BT_ERR_INVALID;

    train_t *t = calloc(1, sizeof *t);
    if (!t) return BT_ERR_NOMEM;
    t->cfg = *cfg;
    t->model = m;
    t->tokens = train_tokens;
    t->n_tokens = n_train;
    t->val_tokens = val_tokens;
    t->n_val = n_val;
    bt_status_t st;
    if ((st = model_grads_alloc(m))) goto destroy_train;
    model_grads_zero(m);
    if ((st = model_acts_create(m, cfg->micro_batch, T, &t->acts))) goto destroy_train;
    if ((st = optim_create_for_model(&cfg->optim, m, &t->optim))) goto destroy_train;
    if ((st = train_sampler_init(&t->sampler, cfg->seed, (n_train - 1) / T))) goto destroy_train;
    size_t n = (size_t)(cfg->grad_accum * cfg->micro_batch * T);
    t->ids = malloc(n * sizeof *t->ids);
    t->targets = malloc(n * sizeof *t->targets);
    if (!t->ids || !t->targets) {
        st = BT_ERR_NOMEM;
        goto destroy_train;
    }
    *out = t;
    return BT_OK;
destroy_train:
    train_destroy(t);
    return st;
}

void train_destroy(train_t *t)
{
    if (!t) return;
    free(t->targets);
    free(t->ids);
    train_sampler_free(&t->sampler);
    optim_destroy(t->optim);
    model_acts_destroy(t->acts);
    free(t);
}

int64_t train_steps_done(const train_t *t) { return t->step; }

void train_position(const train_t *t, train_position_t *p)
{
    *p = (train_position_t){.step = t->step, .samples = train_samples_done(t),
                            .skipped = t->skipped, .skip_run = t->skip_run,
                            .optim_steps = optim_step_count(t->optim)};
}

int64_t train_samples_done(const train_t *t)
{
    return t->base_samples + (t->step - t->base_step) * t->cfg.grad_accum * t->cfg.micro_batch;
}

void train_resume(train_t *t, const train_position_t *p)
{
    t->step = t->base_step = p->step;
    t->base_samples = p->samples;
    t->skipped = p->skipped;
    t->skip_run = p->skip_run;
    optim_set_step_count(t->optim, p->optim_steps);
}
optim_t *train_optimizer(train_t *t) { return t->optim; }

/* Copy window w of `tokens` into one batch row: ids = w*T .. w*T+T-1,
 * targets = the next token of each. */
static void window_copy(int32_t *ids, int32_t *targets, const int32_t *tokens, int64_t w, int64_t T)
{
    const int32_t *src = tokens + w * T;
    memcpy(ids, src, (size_t)T * sizeof *ids);
    memcpy(targets, src + 1, (size_t)T * sizeof *targets);
}

bt_status_t train_step(train_t *t, train_step_info_t *info)
{
    const train_config_t *c = &t->cfg;
    int64_t B = c->micro_batch, T = c->seq_len, K = c->grad_accum;
    uint64_t t0 = clock_now_ns();

    /* Gather the whole global batch first: dloss needs its scored count. */
    for (int64_t k = 0; k < K; k++)
        for (int64_t b = 0; b < B; b++) {
            int64_t g = t->base_samples + ((t->step - t->base_step) * K + k) * B + b;
            int64_t w = train_sampler_window(&t->sampler, g);
            size_t row = (size_t)((k * B + b) * T);
            window_copy(t->ids + row, t->targets + row, t->tokens, w, T);
        }
    int64_t scored = model_count_scored(t->targets, K * B * T);
    float dloss = 1.0f / (float)scored;

    model_grads_zero(t->model);
    double loss_sum = 0.0;
    for (int64_t k = 0; k < K; k++) {
        model_batch_t batch = {.B = B, .T = T, .ids = t->ids + k * B * T,
                               .targets = t->targets + k * B * T};
        model_loss_t loss;
        bt_status_t st = model_forward_backward(t->model, t->acts, &batch, dloss, &loss);
        if (st) {
            log_error("train: step %lld microbatch %lld: forward/backward failed (%s)",
                      (long long)(t->step + 1), (long long)k, bt_status_str(st));
            return st;
        }
        loss_sum += loss.loss_sum;
    }
    double loss = loss_sum / (double)scored;
    int64_t step = t->step + 1;
    if (optim_test_poison(step, 0)) kern_scale(t->model->stream, &t->model->grads[0].t, NAN);
    double norm = optim_grad_norm(t->optim);
    double lr = lr_schedule_at(&c->lr, t->step);
    bool skip = !isfinite(loss) || !isfinite(norm);
    if (skip) {
        /* no update: parameters and optimizer state stay as they were; the
         * step's data is consumed (the next step takes the next batch) */
        const char *bad = optim_find_nonfinite_grad(t->optim);
        char what[160];
        if (!isfinite(loss))
            snprintf(what, sizeof what, "loss is %s", isnan(loss) ? "NaN" : "Inf");
        else
            snprintf(what, sizeof what, "gradient norm is %s", isnan(norm) ? "NaN" : "Inf");
        const char *bad_param = model_first_nonfinite_param(t->model);
        if (bad_param) {
            log_error("train: step %lld: %s, and parameter %s is not finite: no update can "
                      "repair that (check the model or lower optim.lr)",
                      (long long)step, what, bad_param);
            return BT_ERR_NUMERIC;
        }
        t->skip_run++;
        t->skipped++;
        if (t->skip_run > c->max_skipped_steps) {
            log_error("train: step %lld: %s (first non-finite gradient: %s); %lld consecutive "
                      "non-finite steps, more than train.max_skipped_steps = %lld: stopping "
                      "(lower optim.lr, check the data)",
                      (long long)step, what, bad ? bad : "none", (long long)t->skip_run,
                      (long long)c->max_skipped_steps);
            return BT_ERR_NUMERIC;
        }
        log_warn("train: step %lld skipped, no update: %s (first non-finite gradient: %s; %lld "
                 "in a row, %lld in all)",
                 (long long)step, what, bad ? bad : "none, the sum of squares overflowed",
                 (long long)t->skip_run, (long long)t->skipped);
    } else {
        t->skip_run = 0;
        optim_step(t->optim, lr, optim_clip_coef(norm, c->clip));
    }
    t->step = step;

    if (info)
        *info = (train_step_info_t){.step = step, .loss = loss, .lr = lr, .grad_norm = norm,
                                    .tokens = scored, .skipped = skip,
                                    .skipped_total = t->skipped,
                                    .seconds = (double)(clock_now_ns() - t0) * 1e-9};
    return BT_OK;
}

bt_status_t train_eval(train_t *t, double *loss, double *ppl)
{
    int64_t B = t->cfg.micro_batch, T = t->cfg.seq_len;
    int64_t n_windows = t->n_val > T ? (t->n_val - 1) / T : 0;
    if (n_windows == 0) {
        log_error("train: no validation window (%lld held-out tokens, seq_len %lld)",
                  (long long)t->n_val, (long long)T);
        return BT_ERR_INVALID;
    }
    double sum = 0.0;
    int64_t scored = 0, w = 0;
    int64_t n_batches = (n_windows + B - 1) / B;
    if (t->cfg.eval_batches && t->cfg.eval_batches < n_batches) n_batches = t->cfg.eval_batches;
    clock_every_t every; /* a long evaluation says how far it is */
    clock_every_start(&every);
    for (int64_t k = 0; (t->cfg.eval_batches == 0 || k < t->cfg.eval_batches) && w < n_windows; k++) {
        double el;
        if (k > 0 && clock_every_due(&every, &el)) {
            printf("eval  batch %lld/%lld, %lld tokens scored, loss so far %.4f, ETA %.0f s\n",
                   (long long)k, (long long)n_batches, (long long)scored, sum / (double)scored,
                   el / (double)k * (double)(n_batches - k));
            fflush(stdout);
        }
        int64_t rows = 0;
        for (; rows < B && w < n_windows; rows++, w++)
            window_copy(t->ids + rows * T, t->targets + rows * T, t->val_tokens, w, T);
        model_batch_t batch = {.B = rows, .T = T, .ids = t->ids, .targets = t->targets};
        model_loss_t l;
        bt_status_t st = model_forward_backward(t->model, t->acts, &batch, 0.0f, &l);
        if (st) {
            log_error("train: validation forward failed (%s)", bt_status_str(st));
            return st;
        }
        sum += l.loss_sum;
        scored += l.n_scored;
    }
    *loss = sum / (double)scored;
    *ppl = exp(*loss);
    return BT_OK;
}
