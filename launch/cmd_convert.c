/* baton convert --from SRC --to DIR [--format hf|native] [--tokenizer PATH]
 *
 *   gguf -> hf        a GGUF file (llama, qwen2, qwen3) becomes a Hugging Face
 *                     directory: config.json, model.safetensors (every tensor
 *                     dequantized to f32, Q/K rows in HF's order) and tokenizer.json
 *                     built from its tokenizer.ggml.* metadata, as `baton eval
 *                     --model FILE.gguf` reads it
 *   native -> hf      a checkpoint (step directory or root) becomes a Hugging Face
 *                     directory: config.json (the checkpoint's model), model.safetensors
 *                     (every parameter, whole, in the checkpoint's dtype, assembled
 *                     from whatever layout saved it) and, with --tokenizer, the
 *                     tokenizer files; transformers and `baton eval/generate` load it
 *   hf -> native      a Hugging Face directory becomes a checkpoint directory: one
 *                     shard file per safetensors file, each tensor in its own dtype
 *                     (importing and exporting again gives the same tensor bytes)
 * Both stream: one tensor is in memory at a time (plus the file being mapped).
 * Nothing is overwritten: the HF output replaces DIR atomically as a whole
 * (base/save.h), the native output must not exist and appears by a rename. */
#include "launch/cli.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "base/save.h"
#include "ckpt/gguf.h"
#include "ckpt/hf.h"
#include "ckpt/model_source.h"
#include "ckpt/native.h"
#include "ckpt/safetensors.h"
#include "ckpt/store.h"
#include "model/model.h"

static void convert_usage(FILE *f)
{
    fprintf(f, "usage: baton convert --from SRC --to DIR [--format hf|native] [--tokenizer PATH]\n"
               "       baton convert --from CKPT --to DIR --layout tp=N,pp=N[,split=A+B...]\n"
               "  native checkpoint (step directory or root) or GGUF file -> Hugging Face directory (--format hf,\n"
               "  the default for a checkpoint), or Hugging Face directory -> native checkpoint\n"
               "  directory (--format native, the default for an HF source); docs/CHECKPOINTS.md\n");
}

static bool is_file(const char *dir, const char *name)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* ---- gguf -> hf --------------------------------------------------------------- */

/* whether path is a file that starts with the GGUF magic */
static bool is_gguf(const char *path)
{
    FILE *f = fopen(path, "rbe");
    if (!f) return false;
    char magic[4] = {0};
    bool yes = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    fclose(f);
    return yes;
}

static int gguf_export_hf(const char *from, const char *to)
{
    model_t *m = NULL;
    if (ckpt_source_load(from, NULL, &m) != BT_OK) return 1;
    bt_status_t st = ckpt_hf_save(m, to);
    int64_t n = 0;
    for (int i = 0; i < m->n_params; i++) n += tensor_numel(&m->params[i].t);
    model_destroy(m);
    if (st != BT_OK) return 1;
    gguf_t *g = NULL;
    char tok[4200];
    snprintf(tok, sizeof tok, "%s/tokenizer.json", to);
    if ((st = gguf_open(from, &g)) == BT_OK) {
        st = gguf_tokenizer_write_json(g, tok);
        gguf_close(g);
    }
    if (st != BT_OK) {
        fprintf(stderr, "baton convert: %s: the weights are in %s, but its tokenizer could not be "
                        "written\n", from, to);
        return 1;
    }
    printf("%s -> %s: config.json, model.safetensors (%lld parameters, f32), tokenizer.json\n",
           from, to, (long long)n);
    return 0;
}

/* ---- native -> hf ------------------------------------------------------------- */

/* The checkpoint SRC names (a step directory or a root) opened, its
 * directory in dir; NULL (said why) when it cannot be. */
static ckpt_reader_t *source_open(const char *src, char *dir, size_t cap)
{
    char err[1024];
    ckpt_reader_t *r = NULL;
    const char *dirs[1] = {dir};
    if (ckpt_resolve(src, dir, cap, err, sizeof err) || ckpt_reader_open(dirs, 1, &r, err, sizeof err)) {
        fprintf(stderr, "baton convert: %s\n", err);
        return NULL;
    }
    return r;
}

/* HF tensor i comes from checkpoint tensor src[i], piece want[i]: the whole
 * tensor, or one index's slab of a stacked parameter (model.h,
 * MODEL_STACK_MARK; routed experts), which is the HF tensor's bytes. */
typedef struct {
    ckpt_reader_t *r;
    const char   (*src)[CKPT_NAME_MAX];
    const shard_spec_t *want;
    const int     *part0;  /* an HF tensor of row parts: the layout index of part 0, else -1 */
    const model_param_t *ps;
    int            np;
    char           err[1024];
} export_ctx_t;

/* HF tensor i from its checkpoint tensor, or, when it is row parts (model.h,
 * MODEL_PART_MARK) saved by a run, from each part's tensor in its rows. */
static bt_status_t export_fill(void *arg, int i, void *buf, size_t bytes)
{
    export_ctx_t *x = arg;
    if (x->part0[i] < 0) return ckpt_read(x->r, x->src[i], &x->want[i], buf, x->err, sizeof x->err);
    char base[MODEL_NAME_MAX], other[MODEL_NAME_MAX];
    int k;
    int64_t row0, rows;
    model_name_part(x->ps[x->part0[i]].name, base, sizeof base, &k);
    model_part_rows(x->ps, x->np, x->part0[i], &row0, &rows);
    size_t row_bytes = bytes / (size_t)rows;
    for (int j = 0; j < x->np; j++) {
        if (!model_name_part(x->ps[j].name, other, sizeof other, &k) || strcmp(other, base)) continue;
        model_part_rows(x->ps, x->np, j, &row0, &rows);
        shard_spec_t whole = shard_whole(x->ps[j].spec.ndim, x->ps[j].spec.global);
        bt_status_t st = ckpt_read(x->r, x->ps[j].name, &whole, (char *)buf + (size_t)row0 * row_bytes,
                                   x->err, sizeof x->err);
        if (st) return st;
    }
    return BT_OK;
}

/* The tokenizer files of PATH into the new version of the export. */
static bt_status_t tokenizer_copy(const char *path, const base_save_dir_t *d)
{
    char err[1024];
    bt_status_t st = ckpt_hf_tokenizer_copy(path, d->tmp, err, sizeof err);
    if (st) fprintf(stderr, "baton convert: --tokenizer %s\n", err);
    return st;
}

static int export_hf(const char *src, const char *to, const char *tokenizer)
{
    char dir[CKPT_PATH_MAX];
    ckpt_reader_t *r = source_open(src, dir, sizeof dir);
    if (!r) return 1;
    int rc = 1;
    const ckpt_index_t *idx = ckpt_reader_index(r);
    json_t *meta = json_loads(idx->meta ? idx->meta : "{}", 0, NULL);
    char *cfg_text = meta ? json_dumps(json_object_get(meta, "model"), JSON_COMPACT) : NULL;
    json_decref(meta);
    model_config_t cfg;
    model_param_t *ps = NULL;
    ckpt_st_entry_t *ents = NULL;
    char (*names)[MODEL_NAME_MAX] = NULL;
    char (*srcs)[CKPT_NAME_MAX] = NULL;
    shard_spec_t *want = NULL;
    int *part0 = NULL;
    base_save_dir_t d = {0};
    bool begun = false;
    if (!cfg_text || ckpt_hf_config_parse(cfg_text, strlen(cfg_text), dir, &cfg)) {
        fprintf(stderr, "baton convert: %s: the index names no model config (meta.model)\n", dir);
        goto out;
    }
    model_stage_t whole = model_stage_full(&cfg);
    int np = model_layout(&cfg, &whole, NULL);
    ps = calloc((size_t)np + 1, sizeof *ps);
    if (!ps) goto out;
    model_layout(&cfg, &whole, ps);
    int n = 0, part;
    char base[MODEL_NAME_MAX];
    for (int i = 0; i < np; i++) {
        if (model_name_part(ps[i].name, base, sizeof base, &part)) n += part == 0;
        else n += model_name_is_stacked(ps[i].name) ? (int)ps[i].spec.global[0] : 1;
    }
    ents = calloc((size_t)n + 1, sizeof *ents);
    names = calloc((size_t)n + 1, sizeof *names);
    srcs = calloc((size_t)n + 1, sizeof *srcs);
    want = calloc((size_t)n + 1, sizeof *want);
    part0 = calloc((size_t)n + 1, sizeof *part0);
    if (!ents || !names || !srcs || !want || !part0) goto out;
    int e = 0;
    for (int i = 0; i < np; i++) {
        int64_t row0, rows;
        if (model_name_part(ps[i].name, base, sizeof base, &part)) {
            if (part != 0) continue;
            /* an import keeps HF's own tensor; a run saves the parts */
            model_part_rows(ps, np, i, &row0, &rows);
            const ckpt_tensor_t *t = ckpt_index_find(idx, base);
            const ckpt_tensor_t *t0 = ckpt_index_find(idx, ps[i].name);
            if (!t && !t0) {
                fprintf(stderr, "baton convert: %s: parameter %s is not in the checkpoint\n", dir,
                        ps[i].name);
                goto out;
            }
            int64_t shape[SHARD_MAX_DIMS];
            memcpy(shape, ps[i].spec.global, sizeof shape);
            shape[0] = rows;
            snprintf(names[e], sizeof names[e], "%s", base);
            snprintf(srcs[e], sizeof srcs[e], "%s", base);
            want[e] = shard_whole(ps[i].spec.ndim, shape);
            part0[e] = t ? -1 : i;
            ents[e] = (ckpt_st_entry_t){.name = names[e],
                                        .t = tensor_make(NULL, t ? t->dtype : t0->dtype, DEVICE_CPU,
                                                         ps[i].spec.ndim, shape)};
            e++;
            continue;
        }
        part0[e] = -1;
        bool stacked = model_name_is_stacked(ps[i].name);
        int64_t count = stacked ? ps[i].spec.global[0] : 1;
        const ckpt_tensor_t *whole_t = ckpt_index_find(idx, ps[i].name);
        for (int64_t k = 0; k < count; k++, e++) {
            part0[e] = -1;
            if (stacked && !model_name_unstack(ps[i].name, k, names[e], sizeof names[e])) goto out;
            if (!stacked) snprintf(names[e], sizeof names[e], "%s", ps[i].name);
            const ckpt_tensor_t *t = whole_t;
            if (stacked && whole_t) { /* the slab of index k */
                shard_spec_t sp = shard_whole(whole_t->ndim, whole_t->shape);
                sp.offset[0] = k;
                sp.extent[0] = 1;
                want[e] = sp;
                snprintf(srcs[e], sizeof srcs[e], "%s", ps[i].name);
                ents[e] = (ckpt_st_entry_t){.name = names[e],
                                            .t = tensor_make(NULL, whole_t->dtype, DEVICE_CPU,
                                                             whole_t->ndim - 1, whole_t->shape + 1)};
                continue;
            }
            if (stacked) t = ckpt_index_find(idx, names[e]); /* an import keeps HF's own names */
            if (!t) {
                fprintf(stderr, "baton convert: %s: parameter %s is not in the checkpoint\n", dir,
                        stacked ? names[e] : ps[i].name);
                goto out;
            }
            want[e] = shard_whole(t->ndim, t->shape);
            snprintf(srcs[e], sizeof srcs[e], "%s", names[e]);
            ents[e] = (ckpt_st_entry_t){.name = names[e],
                                        .t = tensor_make(NULL, t->dtype, DEVICE_CPU, t->ndim, t->shape)};
        }
    }
    if (base_save_dir_begin(&d, to)) goto out;
    begun = true;
    char path[4200];
    char *conf = ckpt_hf_config_text(&cfg);
    base_save_dir_path(&d, "config.json", path, sizeof path);
    bt_status_t st = conf ? base_save_file(path, conf, strlen(conf), 0644) : BT_ERR_NOMEM;
    free(conf);
    if (st) goto out;
    export_ctx_t x = {.r = r, .src = (const char (*)[CKPT_NAME_MAX])srcs, .want = want,
                      .part0 = part0, .ps = ps, .np = np};
    base_save_dir_path(&d, "model.safetensors", path, sizeof path);
    const char *st_meta[] = {"format", "pt"};
    if ((st = ckpt_st_write_fill(path, ents, n, st_meta, 1, export_fill, &x, NULL))) {
        fprintf(stderr, "baton convert: %s%s\n", x.err[0] ? x.err : "cannot write ", x.err[0] ? "" : path);
        goto out;
    }
    if (tokenizer && tokenizer_copy(tokenizer, &d)) goto out;
    static const char *const owned[] = {"config.json", "model.safetensors", "tokenizer.json",
                                        "tokenizer_config.json", "special_tokens_map.json", NULL};
    if (base_save_dir_commit(&d, owned)) goto out;
    begun = false;
    printf("%s: %d tensors of %s written as a Hugging Face directory%s\n", to, n, dir,
           tokenizer ? " with its tokenizer" : " (no tokenizer: give --tokenizer for generate/eval --text)");
    rc = 0;
out:
    if (begun) base_save_dir_abort(&d);
    free(cfg_text);
    free(ps);
    free(ents);
    free(names);
    free(srcs);
    free(want);
    free(part0);
    ckpt_reader_close(r);
    return rc;
}

/* A checkpoint directory written into tmp becomes `to`: its metadata set,
 * the pieces' tiling checked, the index written last, fsynced, renamed. */
static bt_status_t ckpt_dir_finish(ckpt_index_t *idx, json_t *meta, const char *tmp, const char *to)
{
    char err[1024];
    char *mt = meta ? json_dumps(meta, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    bt_status_t st = mt ? ckpt_index_set_meta(idx, mt) : BT_ERR_NOMEM;
    free(mt);
    if (!st && (st = ckpt_index_check(idx, err, sizeof err))) fprintf(stderr, "baton convert: %s\n", err);
    if (!st) st = ckpt_index_write(idx, tmp);
    if (!st) st = base_save_dir_fsync(tmp);
    if (!st && rename(tmp, to) != 0) {
        fprintf(stderr, "baton convert: cannot rename %s to %s: %s\n", tmp, to, strerror(errno));
        st = BT_ERR_IO;
    }
    return st;
}

/* ---- hf -> native ------------------------------------------------------------- */

typedef struct {
    const ckpt_st_file_t *f;
    const ckpt_st_tensor_t **ts;
} import_ctx_t;

/* The tensor's bytes as they are in the file (no conversion: an import
 * keeps every dtype). */
static bt_status_t import_fill(void *arg, int i, void *buf, size_t bytes)
{
    import_ctx_t *x = arg;
    if (x->ts[i]->end - x->ts[i]->begin != bytes) return BT_ERR_CORRUPT;
    memcpy(buf, x->ts[i]->data, bytes);
    base_pages_release(x->ts[i]->data, bytes); /* not kept resident once copied */
    return BT_OK;
}

/* The safetensors files of an HF directory: model.safetensors, or those its
 * index names (each once, in order of first mention). */
static int hf_files(const char *dir, char ***out)
{
    *out = NULL;
    if (is_file(dir, "model.safetensors")) {
        char **v = calloc(2, sizeof *v);
        if (!v || !(v[0] = strdup("model.safetensors"))) { free(v); return -1; }
        *out = v;
        return 1;
    }
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_t *j = json_load_file(p, 0, NULL);
    json_t *map = j ? json_object_get(j, "weight_map") : NULL;
    if (!json_is_object(map)) {
        json_decref(j);
        fprintf(stderr, "baton convert: %s: no model.safetensors, no readable model.safetensors.index.json\n", dir);
        return -1;
    }
    size_t cap = json_object_size(map) + 1;
    char **v = calloc(cap, sizeof *v);
    int n = 0;
    const char *key;
    json_t *val;
    json_object_foreach(map, key, val) {
        const char *f = json_string_value(val);
        bool seen = !f || strchr(f, '/') != NULL;
        for (int i = 0; i < n && !seen; i++) seen = !strcmp(v[i], f);
        if (!seen) v[n++] = strdup(f);
    }
    json_decref(j);
    *out = v;
    return n;
}

static int import_hf(const char *src, const char *to)
{
    struct stat sb;
    if (lstat(to, &sb) == 0) {
        fprintf(stderr, "baton convert: %s exists: nothing is overwritten\n", to);
        return 1;
    }
    model_config_t cfg;
    if (ckpt_hf_config_load(src, &cfg)) return 1;
    char **files = NULL;
    int nf = hf_files(src, &files);
    if (nf <= 0) return 1;
    char tmp[CKPT_PATH_MAX], err[1024];
    snprintf(tmp, sizeof tmp, "%s.baton-tmp", to);
    base_dir_clear(tmp);
    int rc = 1;
    ckpt_index_t idx = {0};
    if (mkdir(tmp, 0755) != 0) {
        fprintf(stderr, "baton convert: cannot create %s: %s\n", tmp, strerror(errno));
        goto out;
    }
    int tensors = 0;
    for (int k = 0; k < nf; k++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", src, files[k]);
        ckpt_st_file_t *f = NULL;
        if (ckpt_st_open(path, &f)) goto out;
        int n = f->n;
        ckpt_put_t *puts = calloc((size_t)n + 1, sizeof *puts);
        const ckpt_st_tensor_t **ts = calloc((size_t)n + 1, sizeof *ts);
        bt_status_t st = puts && ts ? BT_OK : BT_ERR_NOMEM;
        for (int i = 0; i < n && !st; i++) {
            ts[i] = &f->tensors[i];
            if (ts[i]->ndim < 1 || ts[i]->ndim > SHARD_MAX_DIMS) {
                fprintf(stderr, "baton convert: %s: tensor %s has %d dims (1..%d here)\n", path,
                        ts[i]->name, ts[i]->ndim, SHARD_MAX_DIMS);
                st = BT_ERR_UNSUPPORTED;
                break;
            }
            puts[i] = (ckpt_put_t){.tensor = ts[i]->name, .dtype = ts[i]->dtype,
                                   .spec = shard_whole(ts[i]->ndim, ts[i]->shape)};
        }
        char file[64];
        snprintf(file, sizeof file, "shard-r%05d.safetensors", k);
        import_ctx_t x = {.f = f, .ts = ts};
        if (!st) st = ckpt_shard_write_fill(&idx, tmp, file, puts, n, import_fill, &x, err, sizeof err);
        if (st) fprintf(stderr, "baton convert: %s: %s\n", path, err);
        tensors += n;
        free(puts);
        free(ts);
        ckpt_st_close(f);
        if (st) goto out;
    }
    char *conf = ckpt_hf_config_text(&cfg);
    json_t *meta = json_pack("{s:o, s:s, s:I}", "model", conf ? json_loads(conf, 0, NULL) : json_null(),
                             "imported_from", src, "step", (json_int_t)0);
    free(conf);
    bt_status_t st = ckpt_dir_finish(&idx, meta, tmp, to);
    json_decref(meta);
    if (st) goto out;
    printf("%s: %d tensors of %s written as a checkpoint directory (%d shard files)\n", to, tensors,
           src, nf);
    rc = 0;
out:
    if (rc) base_dir_clear(tmp);
    ckpt_index_free(&idx);
    for (int k = 0; k < nf; k++) free(files[k]);
    free(files);
    return rc;
}

/* ---- native -> native under a layout ------------------------------------------ */

/* "tp=2,pp=2" or "tp=2,pp=2,split=4+3": the pieces one replica of that
 * layout holds. */
typedef struct {
    int     tp, pp;
    int64_t split[256];
    int     n_split;
} layout_t;

static bool layout_parse(const char *text, layout_t *l)
{
    *l = (layout_t){.tp = 1, .pp = 1};
    char buf[512];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        long long v;
        if (sscanf(kv, "tp=%lld", &v) == 1 && v >= 1 && v <= 1024) l->tp = (int)v;
        else if (sscanf(kv, "pp=%lld", &v) == 1 && v >= 1 && v <= 256) l->pp = (int)v;
        else if (sscanf(kv, "dp=%lld", &v) == 1 && v >= 1) { /* replicas hold the same pieces */ }
        else if (!strncmp(kv, "split=", 6)) {
            for (char *s2 = NULL, *x = strtok_r(kv + 6, "+", &s2); x; x = strtok_r(NULL, "+", &s2)) {
                if (l->n_split == 256 || atoll(x) < 1) return false;
                l->split[l->n_split++] = atoll(x);
            }
        } else return false;
    }
    return true;
}

typedef struct {
    ckpt_reader_t *r;
    const ckpt_put_t *puts;
    char           err[1024];
} reshard_ctx_t;

static bt_status_t reshard_fill(void *arg, int i, void *buf, size_t bytes)
{
    reshard_ctx_t *x = arg;
    (void)bytes;
    return ckpt_read(x->r, x->puts[i].tensor, &x->puts[i].spec, buf, x->err, sizeof x->err);
}

/* Each (pipeline stage, TP rank) of the layout gets a shard file with its
 * parameters and, when the checkpoint has them, their AdamW moments (TP
 * boxes; a ZeRO-1 run reads its flat ranges from them), read from whatever
 * layout wrote them, one tensor at a time. The metadata is kept, with the
 * new layout noted: the output resumes like the input. */
static int reshard(const char *src, const char *to, const char *layout_text)
{
    layout_t L;
    if (!layout_parse(layout_text, &L)) {
        fprintf(stderr, "baton convert: --layout %s: expected tp=N,pp=N[,split=A+B+...]\n", layout_text);
        return 2;
    }
    struct stat sb;
    if (lstat(to, &sb) == 0) {
        fprintf(stderr, "baton convert: %s exists: nothing is overwritten\n", to);
        return 1;
    }
    char dir[CKPT_PATH_MAX], err[1024], tmp[CKPT_PATH_MAX];
    ckpt_reader_t *r = source_open(src, dir, sizeof dir);
    if (!r) return 1;
    const ckpt_index_t *src_idx = ckpt_reader_index(r);
    json_t *meta = json_loads(src_idx->meta ? src_idx->meta : "{}", 0, NULL);
    char *cfg_text = meta ? json_dumps(json_object_get(meta, "model"), JSON_COMPACT) : NULL;
    model_config_t cfg;
    int rc = 1;
    ckpt_index_t idx = {0};
    model_param_t *ps = NULL;
    ckpt_put_t *puts = NULL;
    char (*names)[CKPT_NAME_MAX] = NULL;
    snprintf(tmp, sizeof tmp, "%s.baton-tmp", to);
    base_dir_clear(tmp);
    if (!cfg_text || ckpt_hf_config_parse(cfg_text, strlen(cfg_text), dir, &cfg)) {
        fprintf(stderr, "baton convert: %s: the index names no model config (meta.model)\n", dir);
        goto out;
    }
    int64_t L_layers = cfg.num_layers, sum = 0;
    if (L.n_split && L.n_split != L.pp) {
        fprintf(stderr, "baton convert: --layout: %d split entries for pp=%d\n", L.n_split, L.pp);
        goto out;
    }
    for (int k = 0; k < L.pp; k++) {
        if (!L.n_split) L.split[k] = L_layers / L.pp + (k < L_layers % L.pp);
        sum += L.split[k];
    }
    if (sum != L_layers || L.pp > L_layers) {
        fprintf(stderr, "baton convert: --layout: the split covers %lld layers, the model has %lld\n",
                (long long)sum, (long long)L_layers);
        goto out;
    }
    if (mkdir(tmp, 0755) != 0) {
        fprintf(stderr, "baton convert: cannot create %s: %s\n", tmp, strerror(errno));
        goto out;
    }
    int64_t first = 0, files = 0;
    for (int k = 0; k < L.pp; k++) {
        model_stage_t stage = {.first_layer = (int)first, .last_layer = (int)(first + L.split[k]),
                               .has_embedding = k == 0, .has_head = k == L.pp - 1};
        first += L.split[k];
        for (int t = 0; t < L.tp; t++) {
            model_parallel_t par = {.tp_rank = t, .tp_size = L.tp};
            int n = model_layout_tp(&cfg, &stage, &par, NULL);
            free(ps);
            free(puts);
            free(names);
            ps = calloc((size_t)n + 1, sizeof *ps);
            puts = calloc((size_t)n * 3 + 1, sizeof *puts);
            names = calloc((size_t)n * 3 + 1, sizeof *names);
            if (!ps || !puts || !names) goto out;
            model_layout_tp(&cfg, &stage, &par, ps);
            int np = 0;
            for (int i = 0; i < n; i++) {
                /* stored once: a TP-replicated tensor by TP rank 0; the tied
                 * head copy (a head stage without the embedding) never */
                if (ps[i].spec.group == SHARD_GROUP_NONE && t != 0) continue;
                if (!stage.has_embedding && !strcmp(ps[i].name, "model.embed_tokens.weight")) continue;
                static const char *const prefix[3] = {"", "optim.exp_avg/", "optim.exp_avg_sq/"};
                for (int m = 0; m < 3; m++) {
                    snprintf(names[np], sizeof names[np], "%s%s", prefix[m], ps[i].name);
                    const ckpt_tensor_t *ct = ckpt_index_find(src_idx, names[np]);
                    if (!ct) {
                        if (m) continue; /* no optimizer state (an import) */
                        fprintf(stderr, "baton convert: %s: tensor %s is not in the checkpoint\n", dir, names[np]);
                        goto out;
                    }
                    puts[np] = (ckpt_put_t){.tensor = names[np], .dtype = ct->dtype, .spec = ps[i].spec};
                    np++;
                }
            }
            char file[64];
            snprintf(file, sizeof file, "shard-pp%03d-tp%03d.safetensors", k, t);
            reshard_ctx_t x = {.r = r, .puts = puts};
            if (ckpt_shard_write_fill(&idx, tmp, file, puts, np, reshard_fill, &x, err, sizeof err)) {
                fprintf(stderr, "baton convert: %s\n", x.err[0] ? x.err : err);
                goto out;
            }
            files++;
        }
    }
    json_object_set_new(meta, "converted_to", json_pack("{s:s, s:s}", "layout", layout_text, "from", dir));
    if (ckpt_dir_finish(&idx, meta, tmp, to)) goto out;
    printf("%s: the checkpoint %s in %lld files for tp=%d pp=%d\n", to, dir, (long long)files, L.tp, L.pp);
    rc = 0;
out:
    if (rc) base_dir_clear(tmp);
    json_decref(meta);
    free(cfg_text);
    free(ps);
    free(puts);
    free(names);
    ckpt_index_free(&idx);
    ckpt_reader_close(r);
    return rc;
}

int cmd_convert(int argc, char **argv)
{
    const char *from = NULL, *to = NULL, *format = NULL, *tokenizer = NULL, *layout = NULL;
    for (int i = 1; i < argc; i++) {
        const char **slot = !strcmp(argv[i], "--from") ? &from : !strcmp(argv[i], "--to") ? &to
                          : !strcmp(argv[i], "--format") ? &format
                          : !strcmp(argv[i], "--tokenizer") ? &tokenizer
                          : !strcmp(argv[i], "--layout") ? &layout : NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            convert_usage(stdout);
            return 0;
        }
        if (!slot || i + 1 >= argc) {
            fprintf(stderr, "baton convert: unexpected argument '%s'\n", argv[i]);
            convert_usage(stderr);
            return 2;
        }
        *slot = argv[++i];
    }
    if (!from || !to) {
        convert_usage(stderr);
        return 2;
    }
    if (is_gguf(from)) {
        if ((format && strcmp(format, "hf")) || layout || tokenizer) {
            fprintf(stderr, "baton convert: %s is a GGUF file: it converts to a Hugging Face "
                            "directory (no --format native, --layout or --tokenizer; its own "
                            "tokenizer is written)\n", from);
            return 2;
        }
        return gguf_export_hf(from, to);
    }
    bool hf_src = is_file(from, "config.json");
    if (!format) format = hf_src || layout ? "native" : "hf";
    if (layout) {
        if (hf_src || strcmp(format, "native")) {
            fprintf(stderr, "baton convert: --layout reshards a checkpoint into a checkpoint (--format native)\n");
            return 2;
        }
        return reshard(from, to, layout);
    }
    if (!strcmp(format, "hf")) {
        if (hf_src) {
            fprintf(stderr, "baton convert: %s is a Hugging Face directory already\n", from);
            return 2;
        }
        return export_hf(from, to, tokenizer);
    }
    if (!strcmp(format, "native")) {
        if (!hf_src) {
            fprintf(stderr, "baton convert: --format native: %s is no Hugging Face directory "
                    "(config.json); to reshard a checkpoint give --layout (it loads under any "
                    "layout as it is, too)\n", from);
            return 2;
        }
        return import_hf(from, to);
    }
    fprintf(stderr, "baton convert: --format %s: expected hf or native\n", format);
    return 2;
}
