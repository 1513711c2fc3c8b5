/* Running a model stage: the activation arena, the embedding, the
 * sublayer loop (pre-norm, kind, residual) and the head, forward and
 * backward (model/model.h, model/kind.h).
 *
 *   x[0]          = embedding(ids)   (or the stage's input)
 *   ln[s], rstd[s]= rmsnorm(x[s])
 *   x[s+1]        = x[s] + kind_s(ln[s])
 *   head          = rmsnorm(x[S]) -> lm_head -> cross-entropy, in row chunks
 *
 * Each residual add runs with the norm after it (kern_add_rmsnorm_fwd: x[s+1]
 * and ln[s+1], or the head's final norm, in one pass).
 *
 * Everything lives in one device allocation per arena; the host keeps only
 * its inputs (ids, targets, positions) and the losses it downloads. The head
 * runs in row chunks so that the [N, vocab] logits never exist whole, and
 * when a backward will follow it computes its gradients in the same pass.
 *
 * Tensor parallelism: the embedding output and the head's final-norm
 * gradient are all-reduced here; the vocabulary-parallel loss's row max
 * (MAX) and sum-exp/target logit (SUM) too. The kinds reduce their own
 * outputs and input gradients. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kernels/kernels.h"
#include "model/kind.h"
#include "model/model_int.h"

/* Rows per head chunk on the CPU and the fenced test device: the logits
 * scratch holds at most about 4M elements. Each chunk's lm_head weight
 * gradient product adds into the f32 gradient, so the chunking fixes the
 * order of that sum: changing it changes the bits that the tests pin (and
 * that fenced must share with cpu). */
#define MODEL_HEAD_CHUNK_ELEMS (4u << 20)
/* On a GPU the logits chunk (and, training, the dlogits chunk beside it) may
 * take up to this many bytes each. 4M-element chunks there made every one of
 * 251 chunks a step read and write the whole f32 [V, C] gradient (Llama-style
 * 134M, vocab 32000, 32 x 1024 tokens: 49 GB a step) and ran the products on
 * 131 rows, half a tile past 128 (bench/GPU_NOTES.md, item 4). */
#define MODEL_HEAD_CHUNK_GPU_BYTES (256.0 * 1024 * 1024)
#define MODEL_MAX_KINDS 8

struct model_acts {
    model_t *m;
    int64_t  B, T;       /* capacity */
    int64_t  cb, ct;     /* shape of the last forward */
    bool     grad_ready; /* last forward had dloss > 0 */
    bool     fwd_only;   /* model_acts_create_fwd/_decode: slots reused, no backward */
    bool     decode;     /* model_acts_create_decode: the kinds' caches below */
    void   **cache;      /* [S] host array: each sublayer's cache region, or NULL */
    int64_t  cached;     /* decode: positions [0, cached) are in the caches */
    int64_t  head_chunk; /* rows per head chunk */
    void    *mem;        /* device: everything below */
    size_t   bytes;
    /* device regions */
    void    *x;          /* [S+1, N, C] residual stream at every sublayer boundary */
    void    *ln;         /* [S, N, C] */
    float   *rstd;       /* [S, N] */
    void    *saved;      /* the sublayers' saved regions, at saved_off[s] */
    size_t  *saved_off;  /* [S] (host array of offsets) */
    int32_t *ids, *targets, *pos; /* [N] */
    void    *ones;       /* [N] of 1 */
    void    *tmp, *dres, *dln;    /* [N, C] */
    void    *scratch;    /* the largest kind scratch */
    void    *partial;    /* TP-partial gradients (grad_partial): [2, their elements] stash and sum */
    int     *partial_ix; /* training arena: those parameters' indices, in order */
    int      n_partial;
    int64_t  partial_elems; /* their elements together */
    /* sequence parallelism in a training arena (compact): x holds only the
     * stage input whole; the residual at boundaries 1..S and the norm
     * outputs keep this TP rank's rows (xl [S, R, C], ln [S, R, C], R =
     * ceil(N / tp)); lnw is the one whole norm output a sublayer reads, xo
     * the whole stage output (no head) */
    bool     compact;
    void    *xl, *lnw, *xo;
    /* head */
    void    *lnf, *dlnf; /* [N, C] */
    float   *rstdf;      /* [N] */
    void    *logits, *dlogits; /* [chunk, V] (this rank's vocabulary) */
    float   *losses;     /* [N] */
    float   *vmax, *vsum; /* [chunk], [2, chunk] vocabulary-parallel row max; sum-exp, target */
    /* each kind's shared state */
    const model_kind_t *shared_kind[MODEL_MAX_KINDS];
    void               *shared[MODEL_MAX_KINDS];
    int                 n_shared;
    /* host */
    double  *aux;        /* the load-balancing carry: forward sums, then the gradient
                          * (model_aux_len), or NULL */
    int32_t *h_pos;      /* [N] */
    float   *h_losses;   /* [N] */
};

/* ---- views ------------------------------------------------------------------ */

tensor_t model_act_view(const model_t *m, void *base, size_t off, int ndim, const int64_t *shape)
{
    return tensor_make((char *)base + off, m->place.act_dtype, m->place.dev, ndim, shape);
}

static tensor_t f32_view(const model_t *m, void *base, int ndim, const int64_t *shape)
{
    return tensor_make(base, DT_F32, m->place.dev, ndim, shape);
}

static tensor_t i32_view(const model_t *m, void *base, int64_t n)
{
    return tensor_make(base, DT_I32, m->place.dev, 1, &n);
}

const tensor_t *model_sub_param(const model_t *m, const model_sub_t *sub, int slot)
{
    int i = sub->ix[slot];
    return i >= 0 ? &m->params[i].t : NULL;
}

tensor_t *model_sub_grad(model_t *m, const model_sub_t *sub, int slot)
{
    int i = sub->ix[slot];
    return i >= 0 ? &m->grads[i].t : NULL;
}

/* Sequence parallelism in this arena: on with TP, off in decode arenas (one
 * sequence, one token at a time). */
static bool acts_sp(const model_t *m, const model_acts_t *a)
{
    return m->par.sp && m->par.tp_size > 1 && !a->decode;
}

/* rows [r0, r0 + n) of a [N, C] activation view */
static tensor_t rows_of(const tensor_t *t, int64_t r0, int64_t n)
{
    size_t row = (size_t)t->shape[1] * dtype_size(t->dtype);
    return tensor_make((char *)t->data + (size_t)r0 * row, t->dtype, t->device, 2,
                       (int64_t[]){n, t->shape[1]});
}

static const tensor_t *P(const model_t *m, int ix) { return ix >= 0 ? &m->params[ix].t : NULL; }
static tensor_t *G(model_t *m, int ix) { return ix >= 0 ? &m->grads[ix].t : NULL; }

/* [N, C] row s (0-based) of a stacked region */
static tensor_t stack_view(const model_t *m, void *base, int64_t s, int64_t N, int64_t C)
{
    size_t es = dtype_size(m->place.act_dtype);
    return model_act_view(m, base, (size_t)(s * N * C) * es, 2, (int64_t[]){N, C});
}

static void *shared_of(const model_acts_t *a, const model_kind_t *k)
{
    for (int i = 0; i < a->n_shared; i++)
        if (a->shared_kind[i] == k) return a->shared[i];
    return NULL;
}

/* ---- TP-partial gradients ------------------------------------------------------ */

/* The parameters whose gradient one backward leaves as this TP rank's share
 * only: under sequence parallelism (sp) the norm weights (each rank's rows),
 * and under any TP those a kind marked grad_tp_partial (Qwen3's q_norm and
 * k_norm, fed by this rank's heads). grad_partial_begin sets what they
 * accumulated so far aside and zeroes them; grad_partial_end sums this
 * backward's shares over the TP group (one all-reduce of them all) and adds
 * what was set aside back, so they come out bit-identical on every rank.
 *
 * grad_partial_list writes their indices in parameter order into ix (NULL:
 * count only) and their elements together into *elems; -1 when out of
 * memory. A training arena keeps the list (partial_ix). */
static int grad_partial_list(const model_t *m, bool sp, int *ix, int64_t *elems)
{
    *elems = 0;
    if (m->par.tp_size <= 1 || m->n_params <= 0) return 0;
    bool *mark = calloc((size_t)m->n_params, sizeof *mark);
    if (!mark) return -1;
    for (int i = 0; i < m->n_params; i++) mark[i] = m->params[i].grad_tp_partial;
    if (sp) {
        for (int k = 0; k < m->n_subs; k++)
            if (m->subs[k].norm >= 0) mark[m->subs[k].norm] = true;
        if (m->stage.has_head && m->final_norm >= 0) mark[m->final_norm] = true;
    }
    int n = 0;
    for (int i = 0; i < m->n_params; i++) {
        if (!mark[i]) continue;
        if (ix) ix[n] = i;
        n++;
        *elems += shard_numel(&m->params[i].spec);
    }
    free(mark);
    return n;
}

/* elements [at, at + n) of half 0 (set aside) or 1 (the sums); a half is
 * sized for 8 bytes an element (acts_plan) */
static tensor_t grad_partial_slot(model_t *m, model_acts_t *a, int half, int64_t at, int64_t n)
{
    size_t es = dtype_size(m->place.grad_dtype), one = (size_t)a->partial_elems * 8;
    return tensor_make((char *)a->partial + (size_t)half * one + (size_t)at * es,
                       m->place.grad_dtype, m->place.dev, 1, &n);
}

/* parameter k of the list as a flat gradient, and the element it starts at */
static tensor_t grad_partial_flat(model_t *m, const model_acts_t *a, int k, int64_t *at)
{
    tensor_t *g = &m->grads[a->partial_ix[k]].t;
    int64_t n = tensor_numel(g);
    tensor_t flat = tensor_reshape(g, 1, &n);
    *at += n;
    return flat;
}

/* every listed gradient copied into its slot of half `half`; with zero, the
 * gradients zeroed after (set aside for a new backward's shares) */
static int64_t grad_partial_copy(model_t *m, model_acts_t *a, int half, bool zero)
{
    int64_t at = 0;
    for (int k = 0; k < a->n_partial; k++) {
        int64_t from = at;
        tensor_t flat = grad_partial_flat(m, a, k, &at);
        tensor_t slot = grad_partial_slot(m, a, half, from, at - from);
        kern_copy(m->stream, &slot, &flat);
        if (zero) kern_zero(m->stream, &flat);
    }
    return at;
}

static void grad_partial_begin(model_t *m, model_acts_t *a) { grad_partial_copy(m, a, 0, true); }

static bt_status_t grad_partial_end(model_t *m, model_acts_t *a)
{
    int64_t at = grad_partial_copy(m, a, 1, false);
    tensor_t all = grad_partial_slot(m, a, 1, 0, at);
    bt_status_t st = model_tp_sum(m, &all, "the TP-partial gradients (norm weights)", -1);
    if (st != BT_OK) return st;
    at = 0;
    for (int k = 0; k < a->n_partial; k++) {
        int64_t from = at;
        tensor_t flat = grad_partial_flat(m, a, k, &at);
        tensor_t sum = grad_partial_slot(m, a, 1, from, at - from);
        tensor_t keep = grad_partial_slot(m, a, 0, from, at - from);
        kern_add(m->stream, &flat, &sum, &keep);
    }
    return BT_OK;
}

/* ---- the arena ---------------------------------------------------------------- */

/* Where every region of an arena for B x T goes: byte offsets and the
 * total, in doubles (an absurd shape gives an absurd size, never a wrapped
 * one). model_acts_create carves by it and model_mem_estimate reports its
 * total, so the two cannot disagree. */
typedef struct {
    double  total;
    int64_t head_chunk;
    bool    fwd_only, decode;
    double  x, ln, rstd, saved, ids, tg, pos, ones, tmp, dres, dln, scratch, partial, xl, lnw, xo;
    bool    compact;
    double  lnf, dlnf, rstdf, logits, dlogits, losses, vmax, vsum;
    const model_kind_t *shared_kind[MODEL_MAX_KINDS];
    double  shared[MODEL_MAX_KINDS];
    int     n_shared;
} acts_plan_t;

/* Rows per head chunk for an arena of N rows: on the CPU and fenced at most
 * MODEL_HEAD_CHUNK_ELEMS logits; on a GPU the fewest chunks whose logits fit
 * MODEL_HEAD_CHUNK_GPU_BYTES, of equal size rounded up to 64 rows (32 x 1024
 * rows at vocab 32000 in bf16: 8 chunks of 4096). */
static double head_chunk_rows(const model_t *m, double N)
{
    double V = (double)m->vocab, es = (double)dtype_size(m->place.act_dtype), chunk;
    if (m->vocab <= 0) return 1;
    if (m->place.dev.kind == DEV_CUDA) {
        double most = floor(MODEL_HEAD_CHUNK_GPU_BYTES / (V * es));
        if (most < 64) most = 64;
        double n = ceil(N / most);
        chunk = ceil(ceil(N / n) / 64) * 64;
        if (chunk > most) chunk = floor(most / 64) * 64;
    } else {
        chunk = floor((double)MODEL_HEAD_CHUNK_ELEMS / V);
    }
    if (chunk < 1) chunk = 1;
    if (chunk > N) chunk = N;
    return chunk;
}

static double take(double *off, double bytes)
{
    double at = *off;
    *off += model_align_d(bytes > 0 ? bytes : 1);
    return at;
}

/* saved_off[S] (may be NULL) receives each sublayer's saved region, relative
 * to p->saved; cache_off[S] (may be NULL) each sublayer's decode cache
 * (absolute; -1: none).
 *
 * A forward-only arena (fwd_only) keeps what one forward pass needs at a
 * time: two residual slots used in turn, one norm slot, and one saved region
 * (the largest sublayer's) that every sublayer overwrites; no gradient
 * regions. Its size does not grow with the number of layers. A decode arena
 * (MODEL_ACTS_DECODE) is a forward-only one plus every sublayer's cache. */
static void acts_plan(const model_t *m, int64_t B, int64_t T, int mode, acts_plan_t *p,
                      double *saved_off, double *cache_off)
{
    memset(p, 0, sizeof *p);
    bool fwd_only = mode != MODEL_ACTS_TRAIN;
    p->fwd_only = fwd_only;
    p->decode = mode == MODEL_ACTS_DECODE;
    int S = m->n_subs;
    double N = (double)B * (double)T, C = (double)m->cfg.hidden_size, V = (double)m->vocab;
    double es = (double)dtype_size(m->place.act_dtype), NC = N * C * es;
    double chunk = head_chunk_rows(m, N);
    p->head_chunk = (int64_t)chunk;
    double off = 0, scratch = 0;
    /* sequence parallelism in a training arena: the residual stream and
     * the norm outputs at this TP rank's rows (struct model_acts, compact) */
    p->compact = !fwd_only && m->par.sp && m->par.tp_size > 1;
    if (p->compact) {
        double R = ceil(N / (double)m->par.tp_size) * C * es;
        p->x = take(&off, NC);
        p->xl = take(&off, S * R);
        p->xo = take(&off, m->stage.has_head ? 0 : NC);
        p->ln = take(&off, S * R);
        p->lnw = take(&off, NC);
    } else {
        p->x = take(&off, (fwd_only ? 2 : S + 1) * NC);
        p->ln = take(&off, (fwd_only ? 1 : S) * NC);
    }
    p->rstd = take(&off, (fwd_only ? 1 : S) * N * 4);
    p->saved = off;
    if (fwd_only) { /* one region, the largest sublayer's, before the shared state */
        double most = 0;
        for (int s = 0; s < S; s++) {
            double sb = m->subs[s].kind->saved_bytes(m, B, T);
            if (sb > most) most = sb;
        }
        take(&off, most);
    }
    for (int s = 0; s < S; s++) {
        const model_kind_t *k = m->subs[s].kind;
        double at = fwd_only ? 0 : take(&off, k->saved_bytes(m, B, T)) - p->saved;
        if (saved_off) saved_off[s] = at;
        double sc = k->scratch_bytes(m, B, T);
        if (sc > scratch) scratch = sc;
        bool have = false;
        for (int i = 0; i < p->n_shared; i++) have |= p->shared_kind[i] == k;
        if (!have && k->shared_bytes) {
            if (p->n_shared == MODEL_MAX_KINDS)
                BT_PANIC("model acts: more than %d kinds", MODEL_MAX_KINDS);
            p->shared_kind[p->n_shared] = k;
            /* per-position tables cover the whole sequence: a CP rank's
             * positions reach T * cp_size - 1 */
            p->shared[p->n_shared++] = take(&off, k->shared_bytes(m, T * m->par.cp_size));
        }
    }
    for (int s = 0; s < S; s++) {
        const model_kind_t *k = m->subs[s].kind;
        double at = p->decode && k->cache_bytes ? take(&off, k->cache_bytes(m, T)) : -1;
        if (cache_off) cache_off[s] = at;
    }
    double grads = fwd_only ? 0 : 1; /* gradient regions: none in a forward-only arena */
    p->ids = take(&off, N * 4);
    p->tg = take(&off, N * 4);
    p->pos = take(&off, N * 4);
    p->ones = take(&off, N * es);
    p->tmp = take(&off, NC);
    p->dres = take(&off, grads * NC);
    p->dln = take(&off, grads * NC);
    p->scratch = take(&off, scratch);
    /* the gradients one backward leaves as this TP rank's share
     * (grad_partial): their earlier value and the reduction's buffer, in the
     * gradient dtype (8 bytes an element at most) */
    int64_t partial_elems = 0;
    if (grads) grad_partial_list(m, m->par.sp && m->par.tp_size > 1, NULL, &partial_elems);
    p->partial = take(&off, grads * 2.0 * (double)partial_elems * 8);
    if (m->stage.has_head) {
        p->lnf = take(&off, NC);
        p->dlnf = take(&off, grads * NC);
        p->rstdf = take(&off, N * 4);
        p->logits = take(&off, chunk * V * es);
        p->dlogits = take(&off, grads * chunk * V * es);
        p->losses = take(&off, N * 4);
        p->vmax = take(&off, chunk * 4);
        p->vsum = take(&off, 2 * chunk * 4);
    }
    p->total = off;
}

double model_acts_plan_bytes(const model_t *m, int64_t B, int64_t T, int mode)
{
    acts_plan_t p;
    acts_plan(m, B, T, mode, &p, NULL, NULL);
    return p.total;
}

static bt_status_t acts_create(model_t *m, int64_t B, int64_t T, int mode, model_acts_t **out)
{
    if (B <= 0 || T <= 0) {
        log_error("model: activation arena needs B > 0 and T > 0 (got %lld, %lld)", (long long)B,
                  (long long)T);
        return BT_ERR_INVALID;
    }
    if (mode == MODEL_ACTS_DECODE && m->par.cp_size > 1) {
        log_error("model: decoding keeps one sequence whole; a context-parallel model (cp_size=%d) "
                  "has no decode arena", m->par.cp_size);
        return BT_ERR_INVALID;
    }
    model_acts_t *a = calloc(1, sizeof *a);
    if (!a) return BT_ERR_NOMEM;
    a->m = m;
    a->B = B;
    a->T = T;
    a->fwd_only = mode != MODEL_ACTS_TRAIN;
    a->decode = mode == MODEL_ACTS_DECODE;
    int S = m->n_subs;
    double *saved_d = calloc(2 * ((size_t)S + 1), sizeof *saved_d), *cache_d = saved_d + S + 1;
    acts_plan_t p;
    if (saved_d) acts_plan(m, B, T, mode, &p, saved_d, cache_d);
    /* an arena past 2^62 bytes cannot be allocated anywhere: refuse it
     * before the offsets are turned into sizes */
    bool fits = saved_d && p.total < 4611686018427387904.0 && (double)B * (double)T < 1e15;
    a->saved_off = calloc((size_t)S + 1, sizeof *a->saved_off);
    a->cache = calloc((size_t)S + 1, sizeof *a->cache);
    a->h_pos = fits ? malloc((size_t)(B * T) * sizeof *a->h_pos) : NULL;
    a->h_losses = fits ? malloc((size_t)(B * T) * sizeof *a->h_losses) : NULL;
    int64_t n_aux = model_aux_len(m, false) + model_aux_len(m, true);
    a->aux = n_aux ? calloc((size_t)n_aux, sizeof *a->aux) : NULL;
    /* a training arena's TP-partial gradients (the plan sized their region) */
    bool sp_train = m->par.sp && m->par.tp_size > 1;
    int n_partial = a->fwd_only ? 0 : grad_partial_list(m, sp_train, NULL, &a->partial_elems);
    if (n_partial > 0 && (a->partial_ix = malloc((size_t)n_partial * sizeof *a->partial_ix)))
        a->n_partial = grad_partial_list(m, sp_train, a->partial_ix, &a->partial_elems);
    if (!a->saved_off || !a->cache || !a->h_pos || !a->h_losses || (n_aux && !a->aux) ||
        n_partial < 0 || (n_partial > 0 && !a->partial_ix)) {
        if (saved_d && !fits)
            log_error("model: cannot allocate %.3g bytes of activations for B=%lld T=%lld",
                      p.total, (long long)B, (long long)T);
        free(saved_d);
        model_acts_destroy(a);
        return BT_ERR_NOMEM;
    }
    for (int s = 0; s < S; s++) a->saved_off[s] = (size_t)saved_d[s];
    a->head_chunk = p.head_chunk;
    a->bytes = (size_t)p.total;
    if (kern_mem_alloc(m->place.dev, a->bytes, &a->mem) != BT_OK) {
        log_error("model: cannot allocate %.1f MB of activations for B=%lld T=%lld",
                  (double)a->bytes / 1e6, (long long)B, (long long)T);
        free(saved_d);
        model_acts_destroy(a);
        return BT_ERR_NOMEM;
    }
    char *base = a->mem;
#define AT(o) ((void *)(base + (size_t)(o)))
    for (int s = 0; s < S; s++) a->cache[s] = cache_d[s] >= 0 ? AT(cache_d[s]) : NULL;
    free(saved_d);
    a->x = AT(p.x);
    a->ln = AT(p.ln);
    a->compact = p.compact;
    if (p.compact) {
        a->xl = AT(p.xl);
        a->xo = AT(p.xo);
        a->lnw = AT(p.lnw);
    }
    a->rstd = AT(p.rstd);
    a->saved = AT(p.saved);
    a->n_shared = p.n_shared;
    for (int i = 0; i < p.n_shared; i++) {
        a->shared_kind[i] = p.shared_kind[i];
        a->shared[i] = AT(p.shared[i]);
    }
    a->ids = AT(p.ids);
    a->targets = AT(p.tg);
    a->pos = AT(p.pos);
    a->ones = AT(p.ones);
    a->tmp = AT(p.tmp);
    a->dres = AT(p.dres);
    a->dln = AT(p.dln);
    a->scratch = AT(p.scratch);
    a->partial = AT(p.partial);
    if (m->stage.has_head) {
        a->lnf = AT(p.lnf);
        a->dlnf = AT(p.dlnf);
        a->rstdf = AT(p.rstdf);
        a->logits = AT(p.logits);
        a->dlogits = AT(p.dlogits);
        a->losses = AT(p.losses);
        a->vmax = AT(p.vmax);
        a->vsum = AT(p.vsum);
    }
#undef AT
    int64_t N = B * T;
    size_t es = dtype_size(m->place.act_dtype);
    bt_status_t st = BT_OK;
    for (int i = 0; i < a->n_shared && st == BT_OK; i++)
        st = a->shared_kind[i]->shared_init(m, T * m->par.cp_size, a->shared[i]);
    if (st == BT_OK) {
        /* the ones vector, in the activation dtype */
        float *one = malloc((size_t)N * sizeof *one);
        void *conv = one && es != 4 ? malloc((size_t)N * es) : one;
        if (!one || !conv) st = BT_ERR_NOMEM;
        else {
            for (int64_t i = 0; i < N; i++) one[i] = 1.0f;
            if (conv != one) {
                tensor_t src = tensor_1d(one, DT_F32, N), dst = src;
                dst.dtype = m->place.act_dtype;
                dst.data = conv;
                kern_copy(kern_stream_host(), &dst, &src);
            }
            tensor_t ones = model_act_view(m, a->ones, 0, 1, &N);
            kern_upload(m->stream, &ones, conv);
            st = kern_stream_sync(m->stream);
        }
        if (conv != one) free(conv);
        free(one);
    }
    if (st != BT_OK) {
        model_acts_destroy(a);
        return st;
    }
    *out = a;
    return BT_OK;
}

bt_status_t model_acts_create(model_t *m, int64_t B, int64_t T, model_acts_t **out)
{
    return acts_create(m, B, T, MODEL_ACTS_TRAIN, out);
}

bt_status_t model_acts_create_fwd(model_t *m, int64_t B, int64_t T, model_acts_t **out)
{
    return acts_create(m, B, T, MODEL_ACTS_FWD, out);
}

bt_status_t model_acts_create_decode(model_t *m, int64_t T, model_acts_t **out)
{
    return acts_create(m, 1, T, MODEL_ACTS_DECODE, out);
}

/* Residual slot of sublayer boundary k, norm slot of sublayer k: a
 * forward-only arena takes turns between two and reuses one. */
static int64_t x_slot(const model_acts_t *a, int64_t k) { return a->fwd_only ? k % 2 : k; }
static int64_t ln_slot(const model_acts_t *a, int64_t k) { return a->fwd_only ? 0 : k; }

/* This TP rank's rows [s0, s0 + sn) of the residual at sublayer boundary k
 * (all rows without sequence parallelism): a slot of its own in a compact
 * arena (k >= 1), else rows of the whole slot. */
static tensor_t x_rows(const model_t *m, const model_acts_t *a, int64_t k, int64_t N, int64_t s0,
                       int64_t sn)
{
    int64_t C = m->cfg.hidden_size;
    if (!a->compact || k == 0) {
        tensor_t x = stack_view(m, a->x, x_slot(a, k), N, C);
        return rows_of(&x, s0, sn);
    }
    int64_t R = (N + m->par.tp_size - 1) / m->par.tp_size;
    size_t es = dtype_size(m->place.act_dtype);
    return model_act_view(m, a->xl, (size_t)((k - 1) * R * C) * es, 2, (int64_t[]){sn, C});
}

/* The same for sublayer k's norm output, and the whole one it reads. */
static tensor_t ln_rows(const model_t *m, const model_acts_t *a, int64_t k, int64_t N, int64_t s0,
                        int64_t sn)
{
    int64_t C = m->cfg.hidden_size;
    if (!a->compact) {
        tensor_t ln = stack_view(m, a->ln, ln_slot(a, k), N, C);
        return rows_of(&ln, s0, sn);
    }
    int64_t R = (N + m->par.tp_size - 1) / m->par.tp_size;
    size_t es = dtype_size(m->place.act_dtype);
    return model_act_view(m, a->ln, (size_t)(k * R * C) * es, 2, (int64_t[]){sn, C});
}

static tensor_t ln_whole(const model_t *m, const model_acts_t *a, int64_t k, int64_t N)
{
    return a->compact ? stack_view(m, a->lnw, 0, N, m->cfg.hidden_size)
                      : stack_view(m, a->ln, ln_slot(a, k), N, m->cfg.hidden_size);
}

/* Under sequence parallelism: the whole norm output of sublayer k for the
 * sublayer, gathered from every TP rank's rows (in place, or from a compact
 * arena's own slot). */
static bt_status_t ln_gather(model_t *m, model_acts_t *a, int64_t k, int64_t N, int64_t s0,
                             int64_t sn, int layer)
{
    tensor_t ln = ln_whole(m, a, k, N);
    if (!a->compact) return model_sp_gather(m, &ln, "the norm output", layer);
    tensor_t mine = ln_rows(m, a, k, N, s0, sn);
    return model_sp_gather_from(m, &ln, &mine, "the norm output", layer);
}

void model_acts_destroy(model_acts_t *a)
{
    if (!a) return;
    if (a->mem) kern_mem_free(a->m->place.dev, a->mem);
    free(a->h_losses);
    free(a->h_pos);
    free(a->saved_off);
    free(a->cache);
    free(a->aux);
    free(a->partial_ix);
    free(a);
}

double *model_acts_aux(model_acts_t *a, bool grad)
{
    if (!a->aux) return NULL;
    return grad ? a->aux + model_aux_len(a->m, false) : a->aux;
}

tensor_t model_acts_x_in(model_acts_t *a, int64_t B, int64_t T)
{
    return model_act_view(a->m, a->x, 0, 3, (int64_t[]){B, T, a->m->cfg.hidden_size});
}

tensor_t model_acts_x_out(model_acts_t *a)
{
    int64_t N = a->cb * a->ct, C = a->m->cfg.hidden_size;
    size_t es = dtype_size(a->m->place.act_dtype);
    if (a->compact && !a->m->stage.has_head)
        return model_act_view(a->m, a->xo, 0, 3, (int64_t[]){a->cb, a->ct, C});
    return model_act_view(a->m, a->x, (size_t)(x_slot(a, a->m->n_subs) * N * C) * es, 3,
                          (int64_t[]){a->cb, a->ct, C});
}

tensor_t model_acts_dx_out(model_acts_t *a)
{
    return model_act_view(a->m, a->dres, 0, 3, (int64_t[]){a->cb, a->ct, a->m->cfg.hidden_size});
}

tensor_t model_acts_dx_in(model_acts_t *a) { return model_acts_dx_out(a); }

/* ---- the head ------------------------------------------------------------------ */

/* logits_out[rows, V] (row stride V, host) = the whole-vocabulary logits of
 * one chunk: this rank's [rows, Vr] downloaded and, with TP, gathered. */
static bt_status_t head_logits_out(model_t *m, float *logits_out, const tensor_t *logits,
                                   int64_t rows)
{
    int tp = m->par.tp_size;
    int64_t V = m->cfg.vocab_size, Vr = m->vocab;
    float *mine = malloc((size_t)(rows * Vr) * sizeof *mine);
    if (!mine) return BT_ERR_NOMEM;
    tensor_t lv = *logits;
    bt_status_t st = BT_OK;
    if (lv.dtype == DT_F32) {
        kern_download(m->stream, mine, &lv);
        st = kern_stream_sync(m->stream);
    } else {
        /* via the parameter reader's conversion path */
        void *raw = malloc(tensor_nbytes(&lv));
        if (!raw) st = BT_ERR_NOMEM;
        else {
            kern_download(m->stream, raw, &lv);
            st = kern_stream_sync(m->stream);
            tensor_t src = tensor_on(lv, DEVICE_CPU), dst = tensor_on(lv, DEVICE_CPU);
            src.data = raw;
            dst.dtype = DT_F32;
            dst.data = mine;
            if (st == BT_OK) kern_copy(kern_stream_host(), &dst, &src);
            free(raw);
        }
    }
    if (st != BT_OK) goto out;
    if (tp == 1) {
        memcpy(logits_out, mine, (size_t)(rows * V) * sizeof(float));
        goto out;
    }
    size_t *counts = malloc((size_t)tp * sizeof *counts);
    float *all = malloc((size_t)(rows * V) * sizeof *all);
    st = BT_ERR_NOMEM;
    if (counts && all) {
        for (int r = 0; r < tp; r++) {
            int64_t start, n;
            model_vocab_split(V, tp, r, &start, &n);
            counts[r] = (size_t)(rows * n);
        }
        st = coll_all_gather(m->par.tp_comm, all, mine, counts, DT_F32);
        if (st != BT_OK) log_error("model: TP all-gather of the logits failed: %s", bt_status_str(st));
        const float *blk = all;
        for (int r = 0; r < tp && st == BT_OK; r++) {
            int64_t start, n;
            model_vocab_split(V, tp, r, &start, &n);
            for (int64_t i = 0; i < rows; i++)
                memcpy(logits_out + i * V + start, blk + i * n, (size_t)n * sizeof(float));
            blk += rows * n;
        }
    }
    free(all);
    free(counts);
out:
    free(mine);
    return st;
}

/* Cross-entropy of one chunk: fused without TP; with TP the vocabulary-
 * parallel three passes around an all-reduce MAX and one SUM (sum-exp and
 * target logit in one buffer). losses come out whole on every rank, dlogits
 * (when non-NULL) for this rank's vocabulary slice. */
static bt_status_t head_xent(model_t *m, model_acts_t *a, tensor_t *losses, tensor_t *dlogits,
                             const tensor_t *logits, const tensor_t *tg, float dloss)
{
    kern_stream_t *s = m->stream;
    if (m->par.tp_size == 1) {
        kern_xent_fwd_bwd(s, losses, dlogits, logits, tg, dloss, MODEL_IGNORE_INDEX);
        return BT_OK;
    }
    int64_t rows = logits->shape[0];
    tensor_t gmax = f32_view(m, a->vmax, 1, &rows), sumexp = f32_view(m, a->vsum, 1, &rows);
    tensor_t tgt = f32_view(m, a->vsum + rows, 1, &rows);
    tensor_t both = f32_view(m, a->vsum, 1, (int64_t[]){2 * rows});
    kern_xent_vp_max(s, &gmax, logits);
    bt_status_t st = model_tp_reduce(m, &gmax, COLL_MAX, "the logits' row max", -1);
    if (st != BT_OK) return st;
    kern_xent_vp_sum(s, &sumexp, &tgt, logits, &gmax, tg, m->vocab_start, MODEL_IGNORE_INDEX);
    st = model_tp_reduce(m, &both, COLL_SUM, "the logits' sum-exp", -1);
    if (st != BT_OK) return st;
    kern_xent_vp_finish(s, losses, dlogits, logits, &gmax, &sumexp, &tgt, tg, m->vocab_start,
                        dloss, MODEL_IGNORE_INDEX);
    return BT_OK;
}

/* Final norm, lm_head and cross-entropy over row chunks (normed: the final
 * norm already ran, fused with the last residual add). With dloss > 0 the
 * lm_head gradient and d(final norm output) (dlnf) are computed too; with
 * TP each rank adds its vocabulary slice's share to dlnf, summed once at the
 * end. */
static bt_status_t head_forward(model_t *m, model_acts_t *a, const model_batch_t *b, float dloss,
                                bool normed, model_loss_t *loss)
{
    kern_stream_t *s = m->stream;
    const model_config_t *c = &m->cfg;
    int64_t N = b->B * b->T, C = c->hidden_size, V = m->vocab;
    size_t es = dtype_size(m->place.act_dtype);
    tensor_t lnf = stack_view(m, a->lnf, 0, N, C);
    bool sp = acts_sp(m, a);
    int64_t s0 = 0, sn = N;
    if (sp) model_sp_rows(m, N, &s0, &sn);
    bt_status_t st;
    if (sn > 0 && !normed) { /* under SP this rank's rows, then all of them gathered */
        tensor_t xl = x_rows(m, a, m->n_subs, N, s0, sn), lnl = rows_of(&lnf, s0, sn);
        tensor_t rstdl = f32_view(m, a->rstdf + s0, 1, &sn);
        kern_rmsnorm_fwd(s, &lnl, &rstdl, &xl, P(m, m->final_norm), (float)c->rms_norm_eps);
    }
    if (sp && (st = model_sp_gather(m, &lnf, "the final norm output", -1)) != BT_OK) return st;
    tensor_t dlnf = stack_view(m, a->dlnf, 0, N, C);
    tensor_t all_losses = f32_view(m, a->losses, 1, &N);
    kern_zero(s, &all_losses);
    int64_t scored = 0;
    for (int64_t r0 = 0; r0 < N; r0 += a->head_chunk) {
        int64_t rows = N - r0 < a->head_chunk ? N - r0 : a->head_chunk;
        int64_t k = model_count_scored(b->targets + r0, rows);
        bool want = b->logits_out && r0 + rows > b->logits_from;
        /* each chunk writes its rows of dlnf (kern_linear_bwd_set below); a
         * skipped one zeroes them */
        tensor_t dx = model_act_view(m, a->dlnf, (size_t)(r0 * C) * es, 2, (int64_t[]){rows, C});
        if (!want && k == 0) {
            if (dloss > 0) kern_zero(s, &dx);
            continue;
        }
        tensor_t xin = model_act_view(m, a->lnf, (size_t)(r0 * C) * es, 2, (int64_t[]){rows, C});
        tensor_t logits = model_act_view(m, a->logits, 0, 2, (int64_t[]){rows, V});
        tensor_t dlogits = model_act_view(m, a->dlogits, 0, 2, (int64_t[]){rows, V});
        tensor_t losses = f32_view(m, a->losses + r0, 1, &rows);
        tensor_t tg = i32_view(m, a->targets + r0, rows);
        kern_linear_fwd(s, &logits, &xin, P(m, m->lm_head), NULL);
        if (want) { /* the rows from logits_from on */
            int64_t lo = b->logits_from > r0 ? b->logits_from : r0;
            tensor_t part = model_act_view(m, a->logits, (size_t)((lo - r0) * V) * es, 2,
                                           (int64_t[]){r0 + rows - lo, V});
            st = head_logits_out(m, b->logits_out + (lo - b->logits_from) * c->vocab_size, &part,
                                 r0 + rows - lo);
            if (st != BT_OK) return st;
        }
        if ((st = head_xent(m, a, &losses, dloss > 0 ? &dlogits : NULL, &logits, &tg, dloss)))
            return st;
        scored += k;
        if (dloss > 0)
            kern_linear_bwd_set(s, &dx, G(m, m->lm_head), NULL, &dlogits, &xin, P(m, m->lm_head));
    }
    if (dloss > 0 && (st = sp ? model_sp_scatter_sum(m, &dlnf, "d model.norm", -1)
                              : model_tp_reduce(m, &dlnf, COLL_SUM, "d model.norm", -1)) != BT_OK)
        return st;
    kern_download(s, a->h_losses, &all_losses);
    if ((st = kern_stream_sync(s)) != BT_OK) return st;
    /* in position order; positions not scored hold 0 */
    double sum = 0.0;
    for (int64_t i = 0; i < N; i++) sum += a->h_losses[i];
    loss->loss_sum = sum;
    loss->n_scored = scored;
    return BT_OK;
}

/* ---- forward and backward --------------------------------------------------------- */

static model_run_t run_ctx(model_t *m, model_acts_t *a, int64_t B, int64_t T, tensor_t *pos,
                           tensor_t *ones)
{
    int64_t N = B * T;
    *pos = i32_view(m, a->pos, N);
    *ones = model_act_view(m, a->ones, 0, 2, (int64_t[]){N, 1});
    return (model_run_t){.m = m, .s = m->stream, .B = B, .T = T, .N = N,
                         .T_cap = a->T * m->par.cp_size, .N_cap = a->B * a->T,
                         .pos = pos, .ones = ones, .scratch = a->scratch, .sp = acts_sp(m, a)};
}

bt_status_t model_stage_forward(model_t *m, model_acts_t *a, const model_batch_t *b, float dloss,
                                model_loss_t *loss)
{
    const model_config_t *c = &m->cfg;
    const model_stage_t *st_ = &m->stage;
    kern_stream_t *s = m->stream;
    if (a->m != m || b->B <= 0 || b->T <= 0 || b->B * b->T > a->B * a->T || b->T > a->T) {
        log_error("model: batch %lldx%lld does not fit the activation arena %lldx%lld",
                  (long long)b->B, (long long)b->T, (long long)a->B, (long long)a->T);
        return BT_ERR_INVALID;
    }
    if ((st_->has_embedding && !b->ids) || (st_->has_head && (!b->targets || !loss))) {
        log_error("model: stage [%d,%d) needs %s", st_->first_layer, st_->last_layer,
                  st_->has_embedding && !b->ids ? "token ids" : "targets and a loss");
        return BT_ERR_INVALID;
    }
    if (dloss > 0 && a->fwd_only) {
        log_error("model: a forward with gradients (dloss > 0) on a forward-only arena "
                  "(model_acts_create_fwd keeps nothing for a backward)");
        return BT_ERR_INVALID;
    }
    int64_t N = b->B * b->T, C = c->hidden_size;
    bt_status_t st;
    if (dloss > 0 && (st = model_grads_alloc(m)) != BT_OK) return st;
    if (st_->has_embedding) {
        for (int64_t i = 0; i < N; i++)
            if (b->ids[i] < 0 || b->ids[i] >= c->vocab_size) {
                log_error("model: token id %d at row %lld position %lld outside the vocabulary "
                          "(%lld)",
                          b->ids[i], (long long)(i / b->T), (long long)(i % b->T),
                          (long long)c->vocab_size);
                return BT_ERR_INVALID;
            }
        tensor_t ids = i32_view(m, a->ids, N);
        kern_upload(s, &ids, b->ids);
    }
    if (st_->has_head) {
        for (int64_t i = 0; i < N; i++)
            if (b->targets[i] != MODEL_IGNORE_INDEX &&
                (b->targets[i] < 0 || b->targets[i] >= c->vocab_size)) {
                log_error("model: target %d at row %lld position %lld outside the vocabulary",
                          b->targets[i], (long long)(i / b->T), (long long)(i % b->T));
                return BT_ERR_INVALID;
            }
        tensor_t tg = i32_view(m, a->targets, N);
        kern_upload(s, &tg, b->targets);
    }
    for (int64_t i = 0; i < N; i++) {
        int32_t p = b->pos ? b->pos[i] : (int32_t)(i % b->T);
        if (p < 0 || p >= a->T * m->par.cp_size) {
            log_error("model: position %d outside the rope table [0, %lld)", p,
                      (long long)(a->T * m->par.cp_size));
            return BT_ERR_INVALID;
        }
        a->h_pos[i] = p;
    }
    int64_t pos0 = a->h_pos[0];
    if (a->decode) {
        bool run = b->B == 1;
        for (int64_t i = 0; i < N && run; i++) run = a->h_pos[i] == pos0 + i;
        if (!run || pos0 > a->cached) {
            log_error("model: a decode arena takes one row of consecutive positions that continue "
                      "the %lld cached ones (got %lld rows from position %lld)",
                      (long long)a->cached, (long long)b->B, (long long)pos0);
            return BT_ERR_INVALID;
        }
    }
    tensor_t pos, ones;
    model_run_t r = run_ctx(m, a, b->B, b->T, &pos, &ones);
    r.pos0 = a->decode ? pos0 : 0;
    r.training = dloss > 0;
    kern_upload(s, &pos, a->h_pos);
    a->cb = b->B;
    a->ct = b->T;
    a->grad_ready = false;

    tensor_t x0 = stack_view(m, a->x, 0, N, C);
    if (st_->has_embedding) {
        /* vocab-parallel: rows outside this rank's slice are zero, so the
         * sum over the group is the lookup */
        tensor_t ids = i32_view(m, a->ids, N);
        kern_embedding_fwd(s, &x0, P(m, m->embed), &ids, m->vocab_start);
        if ((st = r.sp ? model_sp_scatter_sum(m, &x0, "the embedding", -1)
                       : model_tp_sum(m, &x0, "the embedding", -1)) != BT_OK)
            return st;
    }
    /* sequence parallelism: the norms and the residual stream on this TP
     * rank's rows [s0, s0 + sn); each norm's output gathered whole for the
     * sublayer, whose output is right on those rows (model/kind.h) */
    int64_t s0 = 0, sn = N;
    if (r.sp) model_sp_rows(m, N, &s0, &sn);
    tensor_t tmp = stack_view(m, a->tmp, 0, N, C);
    float eps = (float)c->rms_norm_eps;
    bool aux_on = model_aux_len(m, false) > 0; /* the router's loss term starts over */
    r.shared = shared_of(a, &model_kind_moe);
    if (aux_on && (st = model_moe_aux_begin(&r)) != BT_OK) return st;
    for (int k = 0; k < m->n_subs; k++) {
        const model_sub_t *sub = &m->subs[k];
        tensor_t ln = ln_whole(m, a, k, N);
        tensor_t rstd = f32_view(m, a->rstd + ln_slot(a, k) * N + s0, 1, &sn);
        tensor_t xl = x_rows(m, a, k, N, s0, sn), xnl = x_rows(m, a, k + 1, N, s0, sn);
        tensor_t lnl = ln_rows(m, a, k, N, s0, sn), tmpl = rows_of(&tmp, s0, sn);
        /* sublayer 0's norm; every later one ran with the residual add before it */
        if (k == 0 && sn > 0) kern_rmsnorm_fwd(s, &lnl, &rstd, &xl, P(m, sub->norm), eps);
        if (r.sp && (st = ln_gather(m, a, k, N, s0, sn, sub->layer)) != BT_OK) return st;
        r.shared = shared_of(a, sub->kind);
        r.cache = a->decode ? a->cache[k] : NULL;
        if ((st = sub->kind->forward(&r, sub, (char *)a->saved + a->saved_off[k], &ln, &tmp)))
            return st;
        if (sn <= 0) continue;
        /* the residual add and the next norm (the next sublayer's, or the
         * head's final norm) in one pass: kern_add + kern_rmsnorm_fwd's bits */
        if (k + 1 < m->n_subs) {
            tensor_t lnn = ln_rows(m, a, k + 1, N, s0, sn);
            tensor_t rstdn = f32_view(m, a->rstd + ln_slot(a, k + 1) * N + s0, 1, &sn);
            kern_add_rmsnorm_fwd(s, &xnl, &lnn, &rstdn, &xl, &tmpl, P(m, m->subs[k + 1].norm),
                                 eps);
        } else if (st_->has_head) {
            tensor_t lnf = stack_view(m, a->lnf, 0, N, C), lnfl = rows_of(&lnf, s0, sn);
            tensor_t rstdf = f32_view(m, a->rstdf + s0, 1, &sn);
            kern_add_rmsnorm_fwd(s, &xnl, &lnfl, &rstdf, &xl, &tmpl, P(m, m->final_norm), eps);
        } else {
            kern_add(s, &xnl, &xl, &tmpl);
        }
    }
    /* a stage's output leaves whole */
    if (r.sp && !st_->has_head) {
        tensor_t xo = a->compact ? stack_view(m, a->xo, 0, N, C)
                                 : stack_view(m, a->x, x_slot(a, m->n_subs), N, C);
        tensor_t mine = x_rows(m, a, m->n_subs, N, s0, sn);
        if ((st = a->compact ? model_sp_gather_from(m, &xo, &mine, "the stage output", -1)
                             : model_sp_gather(m, &xo, "the stage output", -1)) != BT_OK)
            return st;
    }
    /* the router's loss term enters once per forward, weighted by its
     * scored positions (model/kind.h, model_moe_aux_end) */
    int64_t scored = st_->has_head ? model_count_scored(b->targets, N) : 0;
    double aux = 0;
    r.shared = shared_of(a, &model_kind_moe);
    if (aux_on && (st = model_moe_aux_end(&r, a->aux, a->aux + model_aux_len(m, false), dloss,
                                          scored, &aux)) != BT_OK)
        return st;
    if (st_->has_head && (st = head_forward(m, a, b, dloss, m->n_subs > 0, loss)) != BT_OK)
        return st;
    if (st_->has_head) {
        loss->aux_sum = aux * (double)loss->n_scored;
        loss->loss_sum += loss->aux_sum;
    }
    if ((st = kern_stream_sync(s)) != BT_OK) return st;
    if (a->decode) a->cached = pos0 + b->T;
    a->grad_ready = dloss > 0;
    return BT_OK;
}

bt_status_t model_stage_backward(model_t *m, model_acts_t *a)
{
    const model_stage_t *st_ = &m->stage;
    kern_stream_t *s = m->stream;
    if (!a->grad_ready) {
        log_error("model: backward without a forward with dloss > 0 on this arena");
        return BT_ERR_INVALID;
    }
    int64_t B = a->cb, T = a->ct, N = B * T, C = m->cfg.hidden_size;
    tensor_t dres = stack_view(m, a->dres, 0, N, C), dln = stack_view(m, a->dln, 0, N, C);
    tensor_t pos, ones;
    model_run_t r = run_ctx(m, a, B, T, &pos, &ones);
    /* sequence parallelism: the norms' backward and the residual gradient on
     * this TP rank's rows; the residual gradient gathered whole for each
     * sublayer (its dy), whose dln is right on those rows */
    int64_t s0 = 0, sn = N;
    if (r.sp) model_sp_rows(m, N, &s0, &sn);
    bool partial = a->n_partial > 0;
    if (partial) grad_partial_begin(m, a);
    tensor_t dresl = rows_of(&dres, s0, sn), dlnl = rows_of(&dln, s0, sn);
    if (st_->has_head) {
        tensor_t dlnf = stack_view(m, a->dlnf, 0, N, C), rstdf = f32_view(m, a->rstdf + s0, 1, &sn);
        tensor_t xl = x_rows(m, a, m->n_subs, N, s0, sn), dlnfl = rows_of(&dlnf, s0, sn);
        kern_zero(s, &dres);
        if (sn > 0)
            kern_rmsnorm_bwd(s, &dresl, G(m, m->final_norm), &dlnfl, &xl, P(m, m->final_norm),
                             &rstdf);
    }
    a->grad_ready = false; /* a failed collective leaves partial gradients */
    bt_status_t st;
    r.shared = shared_of(a, &model_kind_moe);
    if (model_aux_len(m, false) > 0 &&
        (st = model_moe_aux_grad(&r, a->aux + model_aux_len(m, false))) != BT_OK)
        return st;
    for (int k = m->n_subs - 1; k >= 0; k--) {
        const model_sub_t *sub = &m->subs[k];
        tensor_t ln = ln_whole(m, a, k, N);
        tensor_t rstd = f32_view(m, a->rstd + k * N + s0, 1, &sn), xl = x_rows(m, a, k, N, s0, sn);
        r.shared = shared_of(a, sub->kind);
        if (r.sp && (st = model_sp_gather(m, &dres, "the residual gradient", sub->layer)))
            return st;
        /* a compact arena kept only its rows of the norm output: gathered
         * again for the sublayer's backward */
        if (a->compact && (st = ln_gather(m, a, k, N, s0, sn, sub->layer)) != BT_OK) return st;
        if ((st = sub->kind->backward(&r, sub, (char *)a->saved + a->saved_off[k], &ln, &dres,
                                      &dln)))
            return st;
        if (sn > 0) kern_rmsnorm_bwd(s, &dresl, G(m, sub->norm), &dlnl, &xl, P(m, sub->norm), &rstd);
    }
    /* whole again: the embedding's backward, or the stage's input gradient */
    if (r.sp && (st = model_sp_gather(m, &dres, "the input gradient", -1)) != BT_OK) return st;
    if (partial && (st = grad_partial_end(m, a)) != BT_OK) return st;
    if (st_->has_embedding) {
        tensor_t ids = i32_view(m, a->ids, N);
        kern_embedding_bwd(s, G(m, m->embed), &dres, &ids, m->vocab_start);
    }
    return kern_stream_sync(s);
}

/* Fills dst (an arena view) from an endpoint: upload from host memory or a
 * copy on the device. */
static void io_in(model_t *m, tensor_t *dst, model_io_t from)
{
    if (from.dev) kern_copy(m->stream, dst, from.dev);
    else kern_upload(m->stream, dst, from.host);
}

static void io_out(model_t *m, model_io_t to, const tensor_t *src)
{
    if (to.keep) return;
    if (to.dev) {
        tensor_t d = *to.dev;
        kern_copy(m->stream, &d, src);
    } else {
        kern_download(m->stream, to.host, src);
    }
}

static bool io_set(model_io_t e) { return e.host || e.dev || e.keep; }

bt_status_t model_stage_forward_at(model_t *m, model_acts_t *a, const model_batch_t *b,
                                   model_io_t x_in, float dloss, model_io_t x_out,
                                   model_loss_t *loss)
{
    if ((!m->stage.has_embedding && !io_set(x_in)) || (!m->stage.has_head && !io_set(x_out))) {
        log_error("model: stage [%d,%d) needs %s", m->stage.first_layer, m->stage.last_layer,
                  !m->stage.has_embedding && !io_set(x_in) ? "hidden-state input" : "an output buffer");
        return BT_ERR_INVALID;
    }
    if (!m->stage.has_embedding) {
        tensor_t x = model_acts_x_in(a, b->B, b->T);
        io_in(m, &x, x_in);
    }
    bt_status_t st = model_stage_forward(m, a, b, dloss, m->stage.has_head ? loss : NULL);
    if (st != BT_OK || m->stage.has_head) return st;
    tensor_t y = model_acts_x_out(a);
    io_out(m, x_out, &y);
    return kern_stream_sync(m->stream);
}

bt_status_t model_stage_backward_at(model_t *m, model_acts_t *a, model_io_t dx_out, model_io_t dx_in)
{
    if ((!m->stage.has_head && !io_set(dx_out)) || (!m->stage.has_embedding && !io_set(dx_in))) {
        log_error("model: stage [%d,%d) backward needs %s", m->stage.first_layer,
                  m->stage.last_layer, !io_set(dx_out) && !m->stage.has_head ? "dx_out" : "dx_in");
        return BT_ERR_INVALID;
    }
    if (!a->grad_ready) {
        log_error("model: backward without a forward with dloss > 0 on this arena");
        return BT_ERR_INVALID;
    }
    if (!m->stage.has_head) {
        tensor_t d = model_acts_dx_out(a);
        io_in(m, &d, dx_out);
    }
    bt_status_t st = model_stage_backward(m, a);
    if (st != BT_OK || m->stage.has_embedding) return st;
    tensor_t dx = model_acts_dx_in(a);
    io_out(m, dx_in, &dx);
    return kern_stream_sync(m->stream);
}

bt_status_t model_stage_forward_io(model_t *m, model_acts_t *a, const model_batch_t *b,
                                   const void *x_in, float dloss, void *x_out,
                                   model_loss_t *loss)
{
    return model_stage_forward_at(m, a, b, MODEL_IO_HOST(x_in), dloss, MODEL_IO_HOST(x_out), loss);
}

bt_status_t model_stage_backward_io(model_t *m, model_acts_t *a, const void *dx_out, void *dx_in)
{
    return model_stage_backward_at(m, a, MODEL_IO_HOST(dx_out), MODEL_IO_HOST(dx_in));
}

bt_status_t model_forward_backward(model_t *m, model_acts_t *a, const model_batch_t *batch,
                                   float dloss, model_loss_t *loss)
{
    if (!m->stage.has_embedding || !m->stage.has_head) {
        log_error("model: model_forward_backward needs a whole model (embedding and head)");
        return BT_ERR_INVALID;
    }
    bt_status_t st = model_stage_forward(m, a, batch, dloss, loss);
    if (st != BT_OK || dloss <= 0) return st;
    return model_stage_backward(m, a);
}
