#include "launch/run_setup.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/log.h"
#include "ckpt/safetensors.h"

static bt_status_t hf_extra_read(const char *dir, model_config_t *cfg)
{
    char path[JOB_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j) {
        log_error("%s: %s (line %d)", path, jerr.text, jerr.line);
        return BT_ERR_INVALID;
    }
    bt_status_t st = BT_OK;
    const char *arch = NULL;
    json_t *a = json_object_get(j, "architectures");
    if (json_is_array(a) && json_array_size(a) > 0) arch = json_string_value(json_array_get(a, 0));
    if (!arch) arch = "LlamaForCausalLM";
    cfg->arch = MODEL_ARCH_COUNT;
    for (int i = 0; i < MODEL_ARCH_COUNT; i++)
        if (!strcmp(arch, model_arch_name((model_arch_t)i))) cfg->arch = (model_arch_t)i;
    if (cfg->arch == MODEL_ARCH_COUNT) {
        log_error("%s: architecture %s is not supported", path, arch);
        st = BT_ERR_UNSUPPORTED;
        goto out;
    }
    json_t *v;
    if ((v = json_object_get(j, "head_dim")) && json_is_integer(v)) cfg->head_dim = json_integer_value(v);
    json_t *rp = json_object_get(j, "rope_parameters");
    if (!rp) rp = json_object_get(j, "rope_scaling");
    if ((v = json_object_get(j, "rope_theta")) && json_is_number(v)) cfg->rope.theta = json_number_value(v);
    if (json_is_object(rp)) {
        if ((v = json_object_get(rp, "rope_theta")) && json_is_number(v))
            cfg->rope.theta = json_number_value(v);
        const char *type = json_string_value(json_object_get(rp, "rope_type"));
        if (!type) type = json_string_value(json_object_get(rp, "type"));
        if (type && strcmp(type, "default")) {
            log_error("%s: rope type %s needs the full HF importer (ckpt/)", path, type);
            st = BT_ERR_UNSUPPORTED;
            goto out;
        }
    }
    if ((v = json_object_get(j, "attention_bias")) && json_is_true(v)) cfg->qkv_bias = cfg->o_bias = true;
    if ((v = json_object_get(j, "mlp_bias")) && json_is_true(v)) cfg->mlp_bias = true;
    if (cfg->arch == MODEL_ARCH_QWEN2) cfg->qkv_bias = true;
    if ((v = json_object_get(j, "sliding_window")) && json_is_integer(v) &&
        (cfg->arch != MODEL_ARCH_QWEN2 || json_is_true(json_object_get(j, "use_sliding_window"))))
        cfg->sliding_window = json_integer_value(v);
out:
    json_decref(j);
    return st;
}

bt_status_t run_model_config(const job_t *job, model_config_t *cfg)
{
    const job_model_t *m = &job->model;
    *cfg = (model_config_t){
        .arch = MODEL_ARCH_LLAMA, .vocab_size = m->vocab, .hidden_size = m->hidden,
        .intermediate_size = m->ffn, .num_layers = m->layers, .num_heads = m->heads,
        .num_kv_heads = m->kv_heads, .head_dim = m->hidden / m->heads,
        .max_position_embeddings = m->seq, .rms_norm_eps = m->norm_eps,
        .rope = {.kind = MODEL_ROPE_DEFAULT, .theta = m->rope_theta},
        .tie_word_embeddings = m->tie_embeddings,
    };
    if (m->hf[0]) {
        bt_status_t st = hf_extra_read(m->hf, cfg);
        if (st) return st;
    }
    return model_config_validate(cfg);
}

static bt_status_t hf_weights_load(const char *dir, model_t *m)
{
    char path[JOB_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ckpt_st_file_t *f;
    bt_status_t st = ckpt_st_open(path, &f);
    if (st) return st;
    for (int i = 0; i < m->n_params && st == BT_OK; i++) {
        model_param_t *p = &m->params[i];
        const ckpt_st_tensor_t *t = ckpt_st_find(f, p->name);
        /* tied embeddings: HF stores no lm_head.weight */
        if (!t && m->cfg.tie_word_embeddings && !strcmp(p->name, "lm_head.weight"))
            t = ckpt_st_find(f, "model.embed_tokens.weight");
        if (!t) {
            log_error("%s: tensor %s is missing", path, p->name);
            st = BT_ERR_INVALID;
            break;
        }
        if (t->numel != tensor_numel(&p->t) || t->ndim != p->t.ndim) {
            log_error("%s: tensor %s has %lld elements, the model expects %lld", path, p->name,
                      (long long)t->numel, (long long)tensor_numel(&p->t));
            st = BT_ERR_INVALID;
            break;
        }
        st = ckpt_st_read_f32(f, t, p->t.data);
    }
    ckpt_st_close(f);
    return st;
}

bt_status_t run_model_create(const job_t *job, model_t **out)
{
    model_config_t cfg;
    bt_status_t st = run_model_config(job, &cfg);
    if (st) return st;
    model_t *m;
    if ((st = model_create(&cfg, NULL, &m))) return st;
    if (job->model.hf[0]) st = hf_weights_load(job->model.hf, m);
    else model_init_random(m, (uint64_t)job->model.init_seed, (float)job->model.init_std);
    if (st) {
        model_destroy(m);
        return st;
    }
    *out = m;
    return BT_OK;
}

static bt_status_t tokens_txt_read(const char *path, int32_t **out, int64_t *n_out)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        log_error("data: cannot open %s: %s", path, strerror(errno));
        return BT_ERR_IO;
    }
    size_t cap = 4096, n = 0;
    int32_t *v = malloc(cap * sizeof *v);
    bt_status_t st = v ? BT_OK : BT_ERR_NOMEM;
    long long x;
    int r;
    while (st == BT_OK && (r = fscanf(f, "%lld", &x)) == 1) {
        if (x < 0 || x > INT32_MAX) {
            log_error("data: %s: token %zu is %lld, not a token id", path, n, x);
            st = BT_ERR_INVALID;
            break;
        }
        if (n == cap) {
            int32_t *nv = realloc(v, 2 * cap * sizeof *v);
            if (!nv) { st = BT_ERR_NOMEM; break; }
            v = nv;
            cap *= 2;
        }
        v[n++] = (int32_t)x;
    }
    if (st == BT_OK && !feof(f)) {
        log_error("data: %s: not a token id after %zu tokens", path, n);
        st = BT_ERR_INVALID;
    }
    fclose(f);
    if (st) {
        free(v);
        return st;
    }
    *out = v;
    *n_out = (int64_t)n;
    return BT_OK;
}

bt_status_t run_tokens_load(const char *dir, double split, int32_t **tokens, int64_t *n_train,
                            const int32_t **val, int64_t *n_val)
{
    char path[JOB_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/tokens.txt", dir);
    int32_t *all;
    int64_t n;
    bt_status_t st = tokens_txt_read(path, &all, &n);
    if (st) return st;
    int64_t nv = (int64_t)((double)n * split);
    *tokens = all;
    *n_train = n - nv;
    *val = all + (n - nv);
    *n_val = nv;
    return BT_OK;
}

void run_train_config(const job_t *job, train_config_t *out)
{
    const job_optim_t *o = &job->optim;
    *out = (train_config_t){
        .steps = job->train.steps, .micro_batch = job->train.micro_batch,
        .grad_accum = job->train.grad_accum, .seq_len = job->data.seq_len,
        .seed = (uint64_t)job->train.seed, .eval_batches = job->train.eval_batches,
        .lr = {.lr = o->lr, .min_lr = o->min_lr, .warmup = o->warmup, .total = job->train.steps,
               .warmup_from_min = o->warmup_from == JOB_WARMUP_FROM_MIN},
        .optim = {.beta1 = o->betas[0], .beta2 = o->betas[1], .eps = o->eps,
                  .weight_decay = o->weight_decay,
                  .decay = o->decay == JOB_DECAY_ALL ? OPTIM_DECAY_ALL
                         : o->decay == JOB_DECAY_NONE ? OPTIM_DECAY_NONE : OPTIM_DECAY_MATRICES},
        .clip = o->clip,
    };
}
