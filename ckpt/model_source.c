#include "ckpt/model_source.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/file.h"
#include "ckpt/gguf.h"
#include "ckpt/hf.h"

static const char *const source_kind_names[] = {
    [CKPT_SOURCE_HF_DIR] = "Hugging Face directory",
    [CKPT_SOURCE_GGUF] = "GGUF file",
};
_Static_assert(sizeof source_kind_names / sizeof source_kind_names[0] == CKPT_SOURCE_COUNT,
               "one name per source kind");

const char *ckpt_source_kind_name(ckpt_source_kind_t k)
{
    return k >= 0 && k < CKPT_SOURCE_COUNT ? source_kind_names[k] : "?";
}

bt_status_t ckpt_source_kind(const char *path, ckpt_source_kind_t *out)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        int e = errno;
        log_error("%s: cannot use as a model: %s (expected a Hugging Face directory or a .gguf "
                  "file)", path, strerror(e));
        return e == ENOENT ? BT_ERR_NOT_FOUND : BT_ERR_IO;
    }
    if (S_ISDIR(sb.st_mode)) {
        *out = CKPT_SOURCE_HF_DIR;
        return BT_OK;
    }
    FILE *f = fopen(path, "rbe");
    if (!f) {
        log_error("%s: cannot open: %s", path, strerror(errno));
        return BT_ERR_IO;
    }
    unsigned char magic[4] = {0};
    size_t n = fread(magic, 1, sizeof magic, f);
    fclose(f);
    if (n == 4 && !memcmp(magic, "GGUF", 4)) {
        *out = CKPT_SOURCE_GGUF;
        return BT_OK;
    }
    log_error("%s: not a model: a file that does not start with the GGUF magic (%zu bytes read); "
              "expected a Hugging Face directory or a .gguf file", path, n);
    return BT_ERR_INVALID;
}

/* ---- GGUF ------------------------------------------------------------------ */

/* The HF-style config of an open GGUF file, through the same config.json
 * parser the HF import uses (one set of checks for both sources). */
static bt_status_t gguf_model_config(const gguf_t *g, gguf_llama_config_t *gc, model_config_t *out)
{
    bt_status_t st = gguf_llama_config(g, gc);
    if (st != BT_OK) return st;
    char *text;
    if ((st = gguf_llama_config_json(gc, &text)) != BT_OK) return st;
    char what[600];
    snprintf(what, sizeof what, "%s (llama.* metadata)", g->path);
    st = ckpt_hf_config_parse(text, strlen(text), what, out);
    free(text);
    return st;
}

bt_status_t ckpt_gguf_config(const char *path, model_config_t *out)
{
    gguf_t *g;
    bt_status_t st = gguf_open(path, &g);
    if (st != BT_OK) return st;
    gguf_llama_config_t gc;
    st = gguf_model_config(g, &gc, out);
    gguf_close(g);
    return st;
}

/* Dequantizes every tensor of m's stage from g into m's parameter views. */
static bt_status_t gguf_weights_fill(const gguf_t *g, const gguf_llama_config_t *gc, model_t *m)
{
    int n_all = model_layout(&m->cfg, NULL, NULL);
    model_param_t *all = calloc((size_t)n_all, sizeof *all);
    bool *filled = calloc((size_t)m->n_params, sizeof *filled);
    bt_status_t st = BT_ERR_NOMEM;
    if (!all || !filled) {
        log_error("gguf: %s: out of memory", g->path);
        goto free_all;
    }
    model_layout(&m->cfg, NULL, all);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor_t *t = &g->tensors[i];
        char hf[MODEL_NAME_MAX];
        gguf_permute_t perm;
        st = gguf_llama_tensor_name(t->name, hf, sizeof hf, &perm);
        if (st == BT_ERR_NOT_FOUND) {
            /* Llama-3 files store the RoPE frequencies HF computes itself. */
            if (strcmp(t->name, "rope_freqs.weight") != 0)
                log_warn("gguf: %s: tensor '%s' has no Hugging Face counterpart; ignored", g->path,
                         t->name);
            continue;
        }
        if (st != BT_OK) goto free_all;
        int ix = model_param_find(m, hf);
        if (ix < 0) {
            bool known = false;
            for (int j = 0; j < n_all && !known; j++) known = !strcmp(all[j].name, hf);
            if (known) continue; /* another pipeline stage's tensor */
            log_error("gguf: %s: unexpected tensor '%s' (%s): not a parameter of this %s config",
                      g->path, t->name, hf, model_arch_name(m->cfg.arch));
            st = BT_ERR_INVALID;
            goto free_all;
        }
        const shard_spec_t *p = &m->params[ix].spec;
        bool same = (int)t->n_dims == p->ndim;
        for (int d = 0; same && d < p->ndim; d++) same = t->ne[p->ndim - 1 - d] == p->global[d];
        if (!same) {
            char got[96] = "", want[96] = "";
            for (uint32_t d = 0; d < t->n_dims; d++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
                         (long long)t->ne[t->n_dims - 1 - d]);
            for (int d = 0; d < p->ndim; d++)
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? ", " : "",
                         (long long)p->global[d]);
            log_error("gguf: %s: tensor '%s' (%s) has shape [%s], the config needs [%s]", g->path,
                      t->name, hf, got, want);
            st = BT_ERR_INVALID;
            goto free_all;
        }
        /* the whole tensor dequantized on the host, then this piece of it */
        int64_t whole_n = shard_global_numel(p), n = shard_numel(p);
        float *whole = malloc((size_t)whole_n * sizeof *whole), *piece = NULL;
        if (!whole) {
            st = BT_ERR_NOMEM;
            goto free_all;
        }
        if ((st = gguf_llama_tensor_to_hf_f32(g, gc, t, whole)) == BT_OK) {
            piece = shard_is_whole(p) ? whole : malloc((size_t)n * sizeof *piece);
            if (!piece) st = BT_ERR_NOMEM;
        }
        if (st == BT_OK && piece != whole) {
            shard_spec_t all_of = shard_whole(p->ndim, p->global);
            shard_copy(p, piece, &all_of, whole, sizeof(float));
        }
        if (st == BT_OK) st = model_param_write(m, ix, piece);
        if (piece != whole) free(piece);
        free(whole);
        if (st != BT_OK) goto free_all;
        filled[ix] = true;
    }
    st = BT_OK;
    for (int i = 0; i < m->n_params; i++)
        if (!filled[i]) {
            log_error("gguf: %s: no tensor for parameter '%s'", g->path, m->params[i].name);
            st = BT_ERR_NOT_FOUND;
            break;
        }
free_all:
    free(filled);
    free(all);
    return st;
}

bt_status_t ckpt_gguf_load(const char *path, const model_stage_t *stage, model_t **out)
{
    return ckpt_gguf_load_part(path, stage, NULL, NULL, out);
}

bt_status_t ckpt_gguf_load_part(const char *path, const model_stage_t *stage,
                                const model_parallel_t *par, const model_place_t *place,
                                model_t **out)
{
    model_place_t host = model_place_host();
    gguf_t *g;
    bt_status_t st = gguf_open(path, &g);
    if (st != BT_OK) return st;
    gguf_llama_config_t gc;
    model_config_t cfg;
    model_t *m = NULL;
    if ((st = gguf_model_config(g, &gc, &cfg)) != BT_OK) goto close_file;
    if ((st = model_create_on(&cfg, stage, par, place ? place : &host, &m)) != BT_OK)
        goto close_file;
    if ((st = gguf_weights_fill(g, &gc, m)) != BT_OK) {
        model_destroy(m);
        goto close_file;
    }
    *out = m;
close_file:
    gguf_close(g);
    return st;
}

static bt_status_t gguf_tokenizer_load(const char *path, tok_t **out, ckpt_source_special_t *sp)
{
    gguf_t *g;
    bt_status_t st = gguf_open(path, &g);
    if (st != BT_OK) return st;
    gguf_llama_config_t gc;
    if ((st = gguf_llama_config(g, &gc)) != BT_OK) goto close_file;
    /* gguf_tokenizer_write_json writes a file; read it back into memory so
     * that no tokenizer_config.json lying beside the temporary file is used. */
    const char *tmpdir = getenv("TMPDIR");
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s/baton-gguf-tok-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        log_error("gguf: %s: cannot create a temporary file %s for its tokenizer: %s", path, tmp,
                  strerror(errno));
        st = BT_ERR_IO;
        goto close_file;
    }
    close(fd);
    char *json = NULL;
    size_t len = 0;
    if ((st = gguf_tokenizer_write_json(g, tmp)) == BT_OK) st = base_file_read(tmp, 0, &json, &len);
    unlink(tmp);
    if (st != BT_OK) goto close_file;
    st = tok_load_json(json, len, out);
    free(json);
    if (st != BT_OK) {
        log_error("gguf: %s: the tokenizer built from tokenizer.ggml.* cannot be loaded", path);
        goto close_file;
    }
    if (sp) {
        tok_special_t ts = tok_special(*out);
        sp->bos = gc.bos_token_id >= 0 ? gc.bos_token_id : ts.bos;
        sp->n_eos = 0;
        int64_t eos = gc.eos_token_id >= 0 ? gc.eos_token_id : ts.eos;
        if (eos >= 0) sp->eos[sp->n_eos++] = eos;
    }
close_file:
    gguf_close(g);
    return st;
}

/* ---- Hugging Face directory ------------------------------------------------- */

/* bos/eos ids of DIR/name (an int or, for eos, a list of ints); false when
 * the file or the keys are absent. */
static bool hf_special_read(const char *dir, const char *name, ckpt_source_special_t *sp)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) return false;
    bool found = false;
    json_t *bos = json_object_get(root, "bos_token_id");
    json_t *eos = json_object_get(root, "eos_token_id");
    if (json_is_integer(bos)) sp->bos = json_integer_value(bos);
    if (json_is_integer(eos)) {
        sp->n_eos = 0;
        sp->eos[sp->n_eos++] = json_integer_value(eos);
        found = true;
    } else if (json_is_array(eos) && json_array_size(eos) > 0) {
        sp->n_eos = 0;
        size_t i;
        json_t *v;
        json_array_foreach(eos, i, v) {
            if (json_is_integer(v) && sp->n_eos < CKPT_SOURCE_MAX_EOS)
                sp->eos[sp->n_eos++] = json_integer_value(v);
        }
        found = sp->n_eos > 0;
    }
    json_decref(root);
    return found;
}

static bt_status_t hf_tokenizer_load(const char *dir, tok_t **out, ckpt_source_special_t *sp)
{
    bt_status_t st = tok_load(dir, out);
    if (st != BT_OK) return st;
    if (sp) {
        tok_special_t ts = tok_special(*out);
        *sp = (ckpt_source_special_t){.bos = ts.bos, .n_eos = 0};
        if (ts.eos >= 0) sp->eos[sp->n_eos++] = ts.eos;
        /* transformers' generate() takes EOS from generation_config.json,
         * which save_pretrained derives from config.json */
        if (!hf_special_read(dir, "generation_config.json", sp))
            hf_special_read(dir, "config.json", sp);
    }
    return BT_OK;
}

/* ---- dispatch ----------------------------------------------------------------- */

bt_status_t ckpt_source_config(const char *path, model_config_t *out)
{
    ckpt_source_kind_t k;
    bt_status_t st = ckpt_source_kind(path, &k);
    if (st != BT_OK) return st;
    return k == CKPT_SOURCE_GGUF ? ckpt_gguf_config(path, out) : ckpt_hf_config_load(path, out);
}

bt_status_t ckpt_source_load(const char *path, const model_stage_t *stage, model_t **out)
{
    return ckpt_source_load_part(path, stage, NULL, NULL, out);
}

bt_status_t ckpt_source_load_part(const char *path, const model_stage_t *stage,
                                  const model_parallel_t *par, const model_place_t *place,
                                  model_t **out)
{
    ckpt_source_kind_t k;
    bt_status_t st = ckpt_source_kind(path, &k);
    if (st != BT_OK) return st;
    return k == CKPT_SOURCE_GGUF ? ckpt_gguf_load_part(path, stage, par, place, out)
                                 : ckpt_hf_load_part(path, stage, par, place, out);
}

bt_status_t ckpt_source_tokenizer(const char *path, tok_t **out, ckpt_source_special_t *special)
{
    ckpt_source_kind_t k;
    bt_status_t st = ckpt_source_kind(path, &k);
    if (st != BT_OK) return st;
    return k == CKPT_SOURCE_GGUF ? gguf_tokenizer_load(path, out, special)
                                 : hf_tokenizer_load(path, out, special);
}
