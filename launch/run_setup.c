#include "launch/run_setup.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "ckpt/hf.h"
#include "ckpt/model_source.h"
#include "kernels/device.h"
#include "data/shard.h"

bt_status_t run_model_config(const job_t *job, model_config_t *cfg)
{
    if (job->model.hf[0]) return ckpt_source_config(job->model.hf, cfg);
    const job_model_t *m = &job->model;
    model_config_llama(cfg, &(model_llama_dims_t){
                                .vocab = m->vocab, .hidden = m->hidden, .layers = m->layers,
                                .heads = m->heads, .kv_heads = m->kv_heads, .ffn = m->ffn,
                                .max_position = m->seq, .norm_eps = m->norm_eps,
                                .rope_theta = m->rope_theta, .tie_embeddings = m->tie_embeddings});
    return model_config_validate(cfg);
}

bt_status_t run_place_parse(const char *device, const char *dtype, model_place_t *out)
{
    model_place_t p = model_place_host();
    char why[160];
    if (!device) device = "cpu";
    if (!strcmp(device, "auto")) {
        device_t cuda = {DEV_CUDA, 0};
        if (kern_device_usable(cuda, why, sizeof why)) p.dev = cuda;
    } else if (!device_parse(device, &p.dev)) {
        log_error("device '%s' is not a device (cpu, cuda, cuda:N, fenced or auto)", device);
        return BT_ERR_INVALID;
    }
    if (dtype && !strcmp(dtype, "bf16")) {
        p.param_dtype = p.act_dtype = DT_BF16;
        p.grad_dtype = DT_F32;
    } else if (dtype && strcmp(dtype, "fp32")) {
        log_error("dtype '%s' is not a precision (fp32 or bf16)", dtype);
        return BT_ERR_INVALID;
    }
    if (!kern_device_usable(p.dev, why, sizeof why)) {
        char d[DEVICE_STR_MAX];
        log_error("device %s cannot be used: %s", device_str(p.dev, d), why);
        return BT_ERR_UNSUPPORTED;
    }
    *out = p;
    return BT_OK;
}

bt_status_t run_model_place(const job_t *job, model_place_t *out)
{
    return run_place_parse(job->device, job->dtype == JOB_DTYPE_BF16 ? "bf16" : "fp32", out);
}

bt_status_t run_model_create(const job_t *job, model_t **out)
{
    return run_model_create_part(job, NULL, NULL, NULL, out);
}

bt_status_t run_model_create_part(const job_t *job, const model_stage_t *stage,
                                  const model_parallel_t *par, const model_place_t *place,
                                  model_t **out)
{
    if (job->model.hf[0]) return ckpt_source_load_part(job->model.hf, stage, par, place, out);
    model_config_t cfg;
    bt_status_t st = run_model_config(job, &cfg);
    if (st) return st;
    model_place_t host = model_place_host();
    model_t *m;
    if ((st = model_create_on(&cfg, stage, par, place ? place : &host, &m))) return st;
    /* addressed by global element: every piece gets the whole model's values */
    if ((st = model_init_random(m, (uint64_t)job->model.init_seed, (float)job->model.init_std))) {
        model_destroy(m);
        return st;
    }
    *out = m;
    return BT_OK;
}

static bt_status_t tokens_txt_read(const char *path, int32_t **out, int64_t *n_out)
{
    FILE *f = fopen(path, "re");
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

/* A shard set (data/shard.h) as int32 ids. */
static bt_status_t shard_stream_read(const char *dir, int32_t **out, int64_t *n_out, uint32_t *vocab)
{
    shard_set_t *set;
    bt_status_t st = shard_set_open(dir, &set);
    if (st) return st;
    uint64_t n = shard_set_count(set);
    if (n > (uint64_t)INT64_MAX / 8) {
        log_error("data: %s: %llu tokens is more than this build reads into memory", dir,
                  (unsigned long long)n);
        shard_set_close(set);
        return BT_ERR_UNSUPPORTED;
    }
    uint32_t *v = malloc((size_t)n * sizeof *v + 1);
    if (!v) {
        shard_set_close(set);
        return BT_ERR_NOMEM;
    }
    st = shard_set_tokens(set, 0, (size_t)n, v);
    *vocab = shard_set_vocab_size(set);
    shard_set_close(set);
    if (st) {
        free(v);
        return st;
    }
    for (uint64_t i = 0; i < n; i++)
        if (v[i] > INT32_MAX) {
            log_error("data: %s: token %llu is %u, not a valid id", dir, (unsigned long long)i, v[i]);
            free(v);
            return BT_ERR_INVALID;
        }
    /* u32 -> i32 in place (same size, values checked above) */
    *out = (int32_t *)v;
    *n_out = (int64_t)n;
    return BT_OK;
}

bt_status_t run_stream_load(const char *dir, int32_t **tokens, int64_t *n, uint32_t *vocab)
{
    char path[JOB_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/index.json", dir);
    if (access(path, F_OK) == 0) return shard_stream_read(dir, tokens, n, vocab);
    snprintf(path, sizeof path, "%s/tokens.txt", dir);
    if (access(path, F_OK) != 0) {
        log_error("data: %s holds neither a shard set (index.json, see `baton data prepare`) "
                  "nor tokens.txt", dir);
        return BT_ERR_NOT_FOUND;
    }
    *vocab = 0;
    return tokens_txt_read(path, tokens, n);
}

bt_status_t run_tokens_load(const char *dir, double split, int32_t **tokens, int64_t *n_train,
                            const int32_t **val, int64_t *n_val, uint32_t *vocab_out)
{
    int32_t *all;
    int64_t n;
    uint32_t vocab;
    bt_status_t st = run_stream_load(dir, &all, &n, &vocab);
    if (st) return st;
    int64_t nv = (int64_t)((double)n * split);
    *tokens = all;
    *n_train = n - nv;
    *val = all + (n - nv);
    *n_val = nv;
    if (vocab_out) *vocab_out = vocab;
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
        .max_skipped_steps = job->train.max_skipped_steps,
    };
}

/* mkdir -p dir */
bt_status_t run_dir_make(const char *dir)
{
    char err[4200];
    bt_status_t st = base_dir_make(dir, err, sizeof err);
    if (st) log_error("%s", err);
    return st;
}

/* The directory part of an output path (a file, or a directory written as
 * a whole; trailing slashes do not count), created when missing. */
bt_status_t run_parent_make(const char *path)
{
    char dir[JOB_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') dir[--n] = '\0';
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return BT_OK;
    *slash = '\0';
    return run_dir_make(dir);
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one. */
static size_t json_utf8_len(const unsigned char *s, size_t n)
{
    size_t len = s[0] < 0x80 ? 1 : s[0] >= 0xc2 && s[0] <= 0xdf ? 2
               : s[0] >= 0xe0 && s[0] <= 0xef ? 3 : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;
    if (len == 0 || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (len == 3 && ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0))) return 0;
    if (len == 4 && ((s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))) return 0;
    return len;
}

void run_json_str(FILE *f, const char *text, size_t len)
{
    const unsigned char *s = (const unsigned char *)text;
    fputc('"', f);
    for (size_t i = 0; i < len;) {
        unsigned char c = s[i];
        size_t n = json_utf8_len(s + i, len - i);
        if (n == 0) {
            fputs("\\ufffd", f);
            i++;
            continue;
        }
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\u%04x", c);
        else fwrite(s + i, 1, n, f);
        i += n;
    }
    fputc('"', f);
}

void run_json_num(FILE *f, const char *fmt, double v)
{
    if (isfinite(v)) fprintf(f, fmt, v);
    else fputs("null", f);
}

void run_eval_metrics_write(FILE *f, int64_t step, double loss)
{
    if (!f) return;
    fprintf(f, "{\"step\": %lld, \"val_loss\": ", (long long)step);
    run_json_num(f, "%.17g", loss);
    fputs(", \"val_ppl\": ", f);
    run_json_num(f, "%.7g", exp(loss));
    fputs("}\n", f);
    fflush(f);
}


const char *run_export_tokenizer(const job_t *job)
{
    if (job->export.tokenizer[0]) return job->export.tokenizer;
    if (job->model.hf[0]) {
        char p[JOB_PATH_MAX + 32];
        snprintf(p, sizeof p, "%s/tokenizer.json", job->model.hf);
        if (access(p, R_OK) == 0) return job->model.hf;
    }
    return "";
}

bt_status_t run_model_export(const model_t *m, const job_t *job)
{
    const char *dir = job->export.dir;
    bt_status_t st = run_parent_make(dir);
    if (st == BT_OK && (st = ckpt_hf_save(m, dir)))
        log_error("export.dir: cannot write the model to %s", dir);
    const char *tok = run_export_tokenizer(job);
    char err[1024];
    if (st == BT_OK && tok[0] && (st = ckpt_hf_tokenizer_copy(tok, dir, err, sizeof err)))
        log_error("export.tokenizer: %s", err);
    return st;
}

void run_data_error(const char *cmd, const job_t *job, const char *field)
{
    char err[JOB_ERR_MAX];
    job_error(job, field, err, sizeof err,
              "cannot read a token stream from %s (the line above says why; `baton data prepare` "
              "makes one)", !strcmp(field, "data.val_dir") ? job->data.val_dir : job->data.dir);
    fprintf(stderr, "baton %s: %s\n", cmd, err);
}
