/* Forward and backward of the Llama-family decoder (Llama, Mistral, Qwen2),
 * written out by hand over kernels/kernels.h (llm.c style). Per layer:
 *
 *   ln1 = rmsnorm(res_l)            q,k,v = ln1 W^T (+b); rope(q), rope(k)
 *   att = attention(q,k,v)          mid = res_l + att Wo^T (+b)
 *   ln2 = rmsnorm(mid)              h = silu(ln2 Wg^T) * (ln2 Wu^T)
 *   res_{l+1} = mid + h Wd^T (+b)
 *
 * Everything backward needs is kept in the activation arena; the head
 * (final norm, lm_head, cross-entropy) runs in row chunks so that the
 * [N, vocab] logits never exist whole, and when a backward will follow it
 * computes its gradients in the same pass.
 *
 * Tensor parallelism (docs/PARALLEL.md): with m->par.tp_size > 1 the shapes
 * below are this rank's share (Hq/tp heads, F/tp, a vocabulary slice) and
 * the Megatron conjugate operators are all-reduces over m->par.tp_comm on
 * the calling thread:
 *   forward:  the embedding output, o_proj's and down_proj's outputs (their
 *             biases added once, after the sum), the vocab-parallel loss's
 *             row max (MAX) and sum-exp/target logit (SUM);
 *   backward: d ln1 and d ln2 (input gradients of the column-parallel q/k/v
 *             and gate/up blocks) before the norm backward, and d of the
 *             final norm's output (lm_head's input). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/coll.h"
#include "base/log.h"
#include "kernels/kernels.h"
#include "model/model.h"

/* Rows per head chunk: bounds the logits scratch to about 4M floats. */
#define MODEL_HEAD_CHUNK_ELEMS (4u << 20)

struct model_acts {
    model_t *m;
    int64_t  B, T;        /* capacity */
    int64_t  cb, ct;      /* shape of the last forward */
    bool     grad_ready;  /* last forward had dloss > 0 */
    int      nl;
    int64_t  head_chunk;  /* rows per head chunk */
    float   *mem;
    int32_t *ids;         /* [B*T] copy of the last forward's ids */
    int32_t *pos;         /* [B*T] positions of the last forward */
    float   *cos, *sin;   /* [T, D/2] rope tables for positions 0..T-1 */
    /* per layer, stacked over nl layers */
    float *res;           /* [nl+1, N, C] residual stream; res[0] = stage input */
    float *ln1, *rstd1;   /* [nl, N, C], [nl, N] */
    float *q, *k, *v;     /* [nl, N, Cq], [nl, N, Ckv] x2 (q, k after rope) */
    float *att, *lse;     /* [nl, N, Cq], [nl, B, Hq, T] */
    float *mid;           /* [nl, N, C] residual after attention */
    float *ln2, *rstd2;   /* [nl, N, C], [nl, N] */
    float *gate, *up, *h; /* [nl, N, F] x3 */
    /* head */
    float *lnf, *rstdf;   /* [N, C], [N] */
    float *dlnf;          /* [N, C] gradient at the final norm's output */
    float *logits, *dlogits, *losses; /* [chunk, V] x2, [chunk] (V: this rank's vocab) */
    float *vmax, *vsum;   /* [chunk], [2, chunk] vocab-parallel row max; sum-exp, target logit */
    float *ones;          /* [N] of 1: adds a replicated bias after a TP reduction */
    /* scratch */
    float *tmp;           /* [N, C] */
    float *dres, *dln;    /* [N, C] */
    float *dq, *dqr, *datt; /* [N, Cq] */
    float *dk, *dkr, *dv; /* [N, Ckv] */
    float *dgate, *dup, *dh; /* [N, F] */
};

static inline tensor_t t1(float *p, int64_t a) { return tensor_1d(p, DT_F32, a); }
static inline tensor_t t2(float *p, int64_t a, int64_t b) { return tensor_2d(p, DT_F32, a, b); }
static inline tensor_t t3(float *p, int64_t a, int64_t b, int64_t c)
{
    return tensor_3d(p, DT_F32, a, b, c);
}
static inline tensor_t t4(float *p, int64_t a, int64_t b, int64_t c, int64_t d)
{
    return tensor_4d(p, DT_F32, a, b, c, d);
}

static inline const tensor_t *P(const model_t *m, int ix) { return ix >= 0 ? &m->params[ix].t : NULL; }
static inline tensor_t *G(model_t *m, int ix) { return ix >= 0 ? &m->grads[ix].t : NULL; }

/* Inverse frequencies as transformers computes them (float32 arithmetic). */
static void rope_inv_freq(const model_config_t *c, float *inv, int64_t half)
{
    const model_rope_t *r = &c->rope;
    int64_t dim = c->head_dim;
    for (int64_t i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)dim;
        float f = 1.0f / powf((float)r->theta, e);
        if (r->kind == MODEL_ROPE_LINEAR) {
            f = f / (float)r->factor;
        } else if (r->kind == MODEL_ROPE_LLAMA3) {
            double old = (double)r->original_max_position;
            double low_wl = old / r->low_freq_factor, high_wl = old / r->high_freq_factor;
            double wl = 2.0 * M_PI / (double)f;
            float scaled = wl > low_wl ? f / (float)r->factor : f;
            if (!(wl < high_wl) && !(wl > low_wl)) {
                double smooth = (old / wl - r->low_freq_factor) /
                                (r->high_freq_factor - r->low_freq_factor);
                scaled = (float)((1.0 - smooth) * scaled / r->factor + smooth * scaled);
            }
            f = scaled;
        }
        inv[i] = f;
    }
}

/* Floats of one activation arena (the CARVE list of model_acts_create) and,
 * in *chunk, the head chunk rows; doubles, so that no shape wraps. */
static double acts_floats(const model_acts_dims_t *d, int64_t B, int64_t T, int64_t *chunk)
{
    double N = (double)B * (double)T, C = (double)d->C, F = (double)d->F;
    double Cq = (double)(d->Hq * d->D), Ckv = (double)(d->Hkv * d->D);
    double V = (double)d->V, L = (double)d->layers, half = (double)(d->D / 2);
    double rows = d->V > 0 ? (double)(MODEL_HEAD_CHUNK_ELEMS / (uint64_t)d->V) : 1;
    if (rows < 1) rows = 1;
    if (rows > N) rows = N;
    if (chunk) *chunk = (int64_t)rows;
    double n = 2 * (double)T * half;
    n += (L + 1) * N * C;
    n += L * (N * C * 3 + N * 2 + N * Cq * 2 + N * Ckv * 2 + (double)B * (double)d->Hq * (double)T +
              N * F * 3);
    if (d->head) n += N * C * 2 + N + rows * (2 * V + 1) + rows * 3;
    n += N * C * 3 + N * Cq * 3 + N * Ckv * 3 + N * F * 3;
    n += N;
    return n;
}

double model_acts_bytes(const model_acts_dims_t *d, int64_t B, int64_t T)
{
    /* the float arena, the ids and positions copies, the rope frequencies */
    return 4.0 * acts_floats(d, B, T, NULL) + 8.0 * (double)B * (double)T + 4.0 * (double)(d->D / 2);
}

static model_acts_dims_t acts_dims(const model_t *m, int nl)
{
    return (model_acts_dims_t){.C = m->cfg.hidden_size, .F = m->ffn, .Hq = m->n_heads,
                               .Hkv = m->n_kv_heads, .D = m->cfg.head_dim, .V = m->vocab,
                               .layers = nl, .head = m->stage.has_head};
}

bt_status_t model_acts_create(model_t *m, int64_t B, int64_t T, model_acts_t **out)
{
    const model_config_t *c = &m->cfg;
    if (B <= 0 || T <= 0) {
        log_error("model: activation arena needs B > 0 and T > 0 (got %lld, %lld)",
                  (long long)B, (long long)T);
        return BT_ERR_INVALID;
    }
    if (c->sliding_window > 0 && T > c->sliding_window) {
        log_error("model: sequence length %lld exceeds sliding_window=%lld; sliding-window "
                  "attention is not implemented (shorten the window/--window)",
                  (long long)T, (long long)c->sliding_window);
        return BT_ERR_UNSUPPORTED;
    }
    model_acts_t *a = calloc(1, sizeof *a);
    if (!a) return BT_ERR_NOMEM;
    a->m = m;
    a->B = B;
    a->T = T;
    a->nl = m->stage.last_layer - m->stage.first_layer;
    int64_t N = B * T;
    model_acts_dims_t dims = acts_dims(m, a->nl);
    double nfd = acts_floats(&dims, B, T, &a->head_chunk);
    /* an arena no size_t holds is refused, not wrapped into a small one */
    if (nfd * 4.0 > 0x1p62 || (double)N * 4.0 > 0x1p62) {
        log_error("model: an activation arena for B=%lld T=%lld would be %.3g bytes",
                  (long long)B, (long long)T, nfd * 4.0);
        free(a);
        return BT_ERR_NOMEM;
    }
    size_t nf = (size_t)nfd;
    a->mem = malloc(nf * sizeof(float));
    a->ids = malloc((size_t)N * sizeof(int32_t));
    a->pos = malloc((size_t)N * sizeof(int32_t));
    if (!a->mem || !a->ids || !a->pos) {
        log_error("model: cannot allocate %.1f MB of activations for B=%lld T=%lld",
                  (double)nf * 4 / 1e6, (long long)B, (long long)T);
        model_acts_destroy(a);
        return BT_ERR_NOMEM;
    }
    size_t C = (size_t)c->hidden_size, F = (size_t)m->ffn;
    size_t Cq = (size_t)(m->n_heads * c->head_dim), Ckv = (size_t)(m->n_kv_heads * c->head_dim);
    size_t L = (size_t)a->nl, n = (size_t)N, half = (size_t)c->head_dim / 2;
    float *p = a->mem;
#define CARVE(field, count) do { a->field = p; p += (count); } while (0)
    CARVE(cos, (size_t)T * half);
    CARVE(sin, (size_t)T * half);
    CARVE(res, (L + 1) * n * C);
    CARVE(ln1, L * n * C);
    CARVE(rstd1, L * n);
    CARVE(q, L * n * Cq);
    CARVE(k, L * n * Ckv);
    CARVE(v, L * n * Ckv);
    CARVE(att, L * n * Cq);
    CARVE(lse, L * (size_t)(B * m->n_heads * T));
    CARVE(mid, L * n * C);
    CARVE(ln2, L * n * C);
    CARVE(rstd2, L * n);
    CARVE(gate, L * n * F);
    CARVE(up, L * n * F);
    CARVE(h, L * n * F);
    if (m->stage.has_head) {
        CARVE(lnf, n * C);
        CARVE(dlnf, n * C);
        CARVE(rstdf, n);
        CARVE(logits, (size_t)a->head_chunk * (size_t)m->vocab);
        CARVE(dlogits, (size_t)a->head_chunk * (size_t)m->vocab);
        CARVE(losses, (size_t)a->head_chunk);
        CARVE(vmax, (size_t)a->head_chunk);
        CARVE(vsum, 2 * (size_t)a->head_chunk);
    }
    CARVE(tmp, n * C);
    CARVE(dres, n * C);
    CARVE(dln, n * C);
    CARVE(dq, n * Cq);
    CARVE(dqr, n * Cq);
    CARVE(datt, n * Cq);
    CARVE(dk, n * Ckv);
    CARVE(dkr, n * Ckv);
    CARVE(dv, n * Ckv);
    CARVE(dgate, n * F);
    CARVE(dup, n * F);
    CARVE(dh, n * F);
    CARVE(ones, n);
#undef CARVE
    if ((size_t)(p - a->mem) != nf) BT_PANIC("model acts: carved %zu of %zu floats",
                                             (size_t)(p - a->mem), nf);
    float *inv = malloc(half * sizeof(float));
    if (!inv) {
        model_acts_destroy(a);
        return BT_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) a->ones[i] = 1.0f;
    rope_inv_freq(c, inv, (int64_t)half);
    for (int64_t t = 0; t < T; t++)
        for (size_t i = 0; i < half; i++) {
            float ang = (float)t * inv[i];
            a->cos[(size_t)t * half + i] = cosf(ang);
            a->sin[(size_t)t * half + i] = sinf(ang);
        }
    free(inv);
    *out = a;
    return BT_OK;
}

void model_acts_destroy(model_acts_t *a)
{
    if (!a) return;
    free(a->pos);
    free(a->ids);
    free(a->mem);
    free(a);
}

/* buf[n] reduced in place over the TP group (nothing without TP); `what`
 * and `layer` (-1: none) say which tensor in the error. */
static bt_status_t tp_all_reduce(model_t *m, float *buf, size_t n, coll_op_t op,
                                 const char *what, int layer)
{
    if (m->par.tp_size == 1) return BT_OK;
    bt_status_t st = coll_all_reduce(m->par.tp_comm, buf, n, DT_F32, op);
    if (st != BT_OK) {
        char where[32] = "";
        if (layer >= 0) snprintf(where, sizeof where, " in layer %d", layer);
        log_error("model: TP all-reduce of %s%s failed (TP rank %d of %d): %s", what, where,
                  m->par.tp_rank, m->par.tp_size, bt_status_str(st));
    }
    return st;
}

/* Row-parallel linear: out[N,C] = sum over TP ranks of x_r[N,IC_r] W_r^T,
 * then the replicated bias, added once after the sum (as a rank-1 update
 * ones[N,1] @ bias[1,C], which every backend has). */
static bt_status_t row_parallel_fwd(model_t *m, model_acts_t *a, tensor_t *out,
                                    const tensor_t *x, int w, int bias, const char *what,
                                    int layer)
{
    if (m->par.tp_size == 1) {
        kern_linear_fwd(out, x, P(m, w), P(m, bias));
        return BT_OK;
    }
    kern_linear_fwd(out, x, P(m, w), NULL);
    int64_t N = out->shape[0], C = out->shape[1];
    bt_status_t st = tp_all_reduce(m, out->data, (size_t)(N * C), COLL_SUM, what, layer);
    if (st != BT_OK || bias < 0) return st;
    tensor_t ones = t2(a->ones, N, 1), b = t2(P(m, bias)->data, 1, C);
    kern_matmul(out, &ones, &b, false, false, 1.0f, 1.0f);
    return BT_OK;
}

/* One decoder layer forward; li is the stage-local layer index. */
static bt_status_t layer_forward(model_t *m, model_acts_t *a, int li, int64_t B, int64_t T)
{
    const model_config_t *c = &m->cfg;
    const model_layer_ix_t *x = &m->layers[li];
    int64_t N = B * T, C = c->hidden_size, F = m->ffn, D = c->head_dim;
    int64_t Hq = m->n_heads, Hkv = m->n_kv_heads, Cq = Hq * D, Ckv = Hkv * D;
    int layer = m->stage.first_layer + li;
    bt_status_t st;
    int64_t half = D / 2;
    size_t l = (size_t)li, n = (size_t)N;

    tensor_t res = t2(a->res + l * n * C, N, C);
    tensor_t res_next = t2(a->res + (l + 1) * n * C, N, C);
    tensor_t ln1 = t2(a->ln1 + l * n * C, N, C), rstd1 = t1(a->rstd1 + l * n, N);
    tensor_t q = t2(a->q + l * n * Cq, N, Cq);
    tensor_t k = t2(a->k + l * n * Ckv, N, Ckv), v = t2(a->v + l * n * Ckv, N, Ckv);
    tensor_t q4 = t4(q.data, B, T, Hq, D), k4 = t4(k.data, B, T, Hkv, D);
    tensor_t v4 = t4(v.data, B, T, Hkv, D);
    tensor_t att4 = t4(a->att + l * n * Cq, B, T, Hq, D), att = t2(att4.data, N, Cq);
    tensor_t lse = t3(a->lse + l * (size_t)(B * Hq * T), B, Hq, T);
    tensor_t mid = t2(a->mid + l * n * C, N, C);
    tensor_t ln2 = t2(a->ln2 + l * n * C, N, C), rstd2 = t1(a->rstd2 + l * n, N);
    tensor_t gate = t2(a->gate + l * n * F, N, F), up = t2(a->up + l * n * F, N, F);
    tensor_t h = t2(a->h + l * n * F, N, F);
    tensor_t tmp = t2(a->tmp, N, C);
    tensor_t cos = t2(a->cos, a->T, half), sin = t2(a->sin, a->T, half);
    tensor_t pos = tensor_1d(a->pos, DT_I32, N);
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)D);

    kern_rmsnorm_fwd(&ln1, &rstd1, &res, P(m, x->input_norm), eps);
    kern_linear_fwd(&q, &ln1, P(m, x->q), P(m, x->q_bias));
    kern_linear_fwd(&k, &ln1, P(m, x->k), P(m, x->k_bias));
    kern_linear_fwd(&v, &ln1, P(m, x->v), P(m, x->v_bias));
    kern_rope_fwd(&q4, &q4, &cos, &sin, &pos);
    kern_rope_fwd(&k4, &k4, &cos, &sin, &pos);
    kern_attention_fwd(&att4, &lse, &q4, &k4, &v4, scale, true, 0);
    st = row_parallel_fwd(m, a, &tmp, &att, x->o, x->o_bias, "o_proj output", layer);
    if (st != BT_OK) return st;
    kern_add(&mid, &res, &tmp);
    kern_rmsnorm_fwd(&ln2, &rstd2, &mid, P(m, x->post_norm), eps);
    kern_linear_fwd(&gate, &ln2, P(m, x->gate), P(m, x->gate_bias));
    kern_linear_fwd(&up, &ln2, P(m, x->up), P(m, x->up_bias));
    kern_swiglu_fwd(&h, &gate, &up);
    st = row_parallel_fwd(m, a, &tmp, &h, x->down, x->down_bias, "down_proj output", layer);
    if (st != BT_OK) return st;
    kern_add(&res_next, &mid, &tmp);
    return BT_OK;
}

/* One decoder layer backward: a->dres holds d res_{l+1} on entry and
 * d res_l on return. With TP, dres is whole (replicated) and the gradients of
 * the replicated norm weights and row-parallel biases come out identical on
 * every rank. */
static bt_status_t layer_backward(model_t *m, model_acts_t *a, int li, int64_t B, int64_t T)
{
    const model_config_t *c = &m->cfg;
    const model_layer_ix_t *x = &m->layers[li];
    int64_t N = B * T, C = c->hidden_size, F = m->ffn, D = c->head_dim;
    int64_t Hq = m->n_heads, Hkv = m->n_kv_heads, Cq = Hq * D, Ckv = Hkv * D;
    int layer = m->stage.first_layer + li;
    bt_status_t st;
    int64_t half = D / 2;
    size_t l = (size_t)li, n = (size_t)N;

    tensor_t res = t2(a->res + l * n * C, N, C);
    tensor_t ln1 = t2(a->ln1 + l * n * C, N, C), rstd1 = t1(a->rstd1 + l * n, N);
    tensor_t q4 = t4(a->q + l * n * Cq, B, T, Hq, D);
    tensor_t k4 = t4(a->k + l * n * Ckv, B, T, Hkv, D);
    tensor_t v4 = t4(a->v + l * n * Ckv, B, T, Hkv, D);
    tensor_t att4 = t4(a->att + l * n * Cq, B, T, Hq, D), att = t2(att4.data, N, Cq);
    tensor_t lse = t3(a->lse + l * (size_t)(B * Hq * T), B, Hq, T);
    tensor_t mid = t2(a->mid + l * n * C, N, C);
    tensor_t ln2 = t2(a->ln2 + l * n * C, N, C), rstd2 = t1(a->rstd2 + l * n, N);
    tensor_t gate = t2(a->gate + l * n * F, N, F), up = t2(a->up + l * n * F, N, F);
    tensor_t h = t2(a->h + l * n * F, N, F);
    tensor_t cos = t2(a->cos, a->T, half), sin = t2(a->sin, a->T, half);
    tensor_t pos = tensor_1d(a->pos, DT_I32, N);
    float scale = 1.0f / sqrtf((float)D);

    tensor_t dres = t2(a->dres, N, C), dln = t2(a->dln, N, C);
    tensor_t dh = t2(a->dh, N, F), dgate = t2(a->dgate, N, F), dup = t2(a->dup, N, F);
    tensor_t datt = t2(a->datt, N, Cq), datt4 = t4(a->datt, B, T, Hq, D);
    tensor_t dq4 = t4(a->dq, B, T, Hq, D), dqr4 = t4(a->dqr, B, T, Hq, D);
    tensor_t dk4 = t4(a->dk, B, T, Hkv, D), dkr4 = t4(a->dkr, B, T, Hkv, D);
    tensor_t dv4 = t4(a->dv, B, T, Hkv, D);
    tensor_t dqr = t2(a->dqr, N, Cq), dkr = t2(a->dkr, N, Ckv), dv = t2(a->dv, N, Ckv);

    /* MLP: res_{l+1} = mid + down(swiglu(gate(ln2), up(ln2))) */
    kern_zero(&dh);
    kern_linear_bwd(&dh, G(m, x->down), G(m, x->down_bias), &dres, &h, P(m, x->down));
    kern_zero(&dgate);
    kern_zero(&dup);
    kern_swiglu_bwd(&dgate, &dup, &dh, &gate, &up);
    kern_zero(&dln);
    kern_linear_bwd(&dln, G(m, x->gate), G(m, x->gate_bias), &dgate, &ln2, P(m, x->gate));
    kern_linear_bwd(&dln, G(m, x->up), G(m, x->up_bias), &dup, &ln2, P(m, x->up));
    st = tp_all_reduce(m, a->dln, (size_t)(N * C), COLL_SUM, "d post_attention_layernorm", layer);
    if (st != BT_OK) return st;
    kern_rmsnorm_bwd(&dres, G(m, x->post_norm), &dln, &mid, P(m, x->post_norm), &rstd2);

    /* attention: mid = res_l + o(attn(rope(q(ln1)), rope(k(ln1)), v(ln1))) */
    kern_zero(&datt);
    kern_linear_bwd(&datt, G(m, x->o), G(m, x->o_bias), &dres, &att, P(m, x->o));
    kern_zero(&dq4);
    kern_zero(&dk4);
    kern_zero(&dv4);
    kern_attention_bwd(&dq4, &dk4, &dv4, &datt4, &q4, &k4, &v4, &att4, &lse, scale, true, 0);
    kern_zero(&dqr4);
    kern_zero(&dkr4);
    kern_rope_bwd(&dqr4, &dq4, &cos, &sin, &pos);
    kern_rope_bwd(&dkr4, &dk4, &cos, &sin, &pos);
    kern_zero(&dln);
    kern_linear_bwd(&dln, G(m, x->q), G(m, x->q_bias), &dqr, &ln1, P(m, x->q));
    kern_linear_bwd(&dln, G(m, x->k), G(m, x->k_bias), &dkr, &ln1, P(m, x->k));
    kern_linear_bwd(&dln, G(m, x->v), G(m, x->v_bias), &dv, &ln1, P(m, x->v));
    st = tp_all_reduce(m, a->dln, (size_t)(N * C), COLL_SUM, "d input_layernorm", layer);
    if (st != BT_OK) return st;
    kern_rmsnorm_bwd(&dres, G(m, x->input_norm), &dln, &res, P(m, x->input_norm), &rstd1);
    return BT_OK;
}

/* logits_out[rows, V] (row stride V) = the whole-vocabulary logits of one
 * chunk, gathered from every TP rank's logits[rows, Vr]. */
static bt_status_t head_logits_gather(model_t *m, float *logits_out, const float *logits,
                                      int64_t rows)
{
    int tp = m->par.tp_size;
    int64_t V = m->cfg.vocab_size;
    size_t *counts = malloc((size_t)tp * sizeof *counts);
    float *all = malloc((size_t)(rows * V) * sizeof *all);
    bt_status_t st = BT_ERR_NOMEM;
    if (!counts || !all) goto free_bufs;
    for (int r = 0; r < tp; r++) {
        int64_t start, n;
        model_tp_split(V, tp, r, &start, &n);
        counts[r] = (size_t)(rows * n);
    }
    st = coll_all_gather(m->par.tp_comm, all, logits, counts, DT_F32);
    if (st != BT_OK) {
        log_error("model: TP all-gather of the logits failed: %s", bt_status_str(st));
        goto free_bufs;
    }
    const float *blk = all;
    for (int r = 0; r < tp; r++) {
        int64_t start, n;
        model_tp_split(V, tp, r, &start, &n);
        for (int64_t i = 0; i < rows; i++)
            memcpy(logits_out + i * V + start, blk + i * n, (size_t)n * sizeof(float));
        blk += rows * n;
    }
free_bufs:
    free(all);
    free(counts);
    return st;
}

/* Cross-entropy of one chunk: fused without TP; with TP the vocabulary-
 * parallel three passes around an all-reduce MAX and one SUM (sum-exp and
 * target logit in one buffer). losses come out whole on every rank, dlogits
 * (when non-NULL) for this rank's vocabulary slice. Returns scored rows or
 * a negative status. */
static int64_t head_xent(model_t *m, model_acts_t *a, tensor_t *losses, tensor_t *dlogits,
                         const tensor_t *logits, const tensor_t *tg, float dloss)
{
    if (m->par.tp_size == 1)
        return kern_xent_fwd_bwd(losses, dlogits, logits, tg, dloss, MODEL_IGNORE_INDEX);
    int64_t rows = logits->shape[0];
    tensor_t gmax = t1(a->vmax, rows), sumexp = t1(a->vsum, rows), tgt = t1(a->vsum + rows, rows);
    kern_xent_vp_max(&gmax, logits);
    bt_status_t st = tp_all_reduce(m, a->vmax, (size_t)rows, COLL_MAX, "the logits' row max", -1);
    if (st != BT_OK) return st;
    kern_xent_vp_sum(&sumexp, &tgt, logits, &gmax, tg, m->vocab_start, MODEL_IGNORE_INDEX);
    st = tp_all_reduce(m, a->vsum, 2 * (size_t)rows, COLL_SUM, "the logits' sum-exp", -1);
    if (st != BT_OK) return st;
    return kern_xent_vp_finish(losses, dlogits, logits, &gmax, &sumexp, &tgt, tg, m->vocab_start,
                               dloss, MODEL_IGNORE_INDEX);
}

/* Final norm, lm_head and cross-entropy over row chunks. With dloss > 0 the
 * lm_head gradient and d(final norm output) (a->dlnf) are computed too; with
 * TP each rank adds its vocabulary slice's share to dlnf, summed once at the
 * end. */
static bt_status_t head_forward(model_t *m, model_acts_t *a, const model_batch_t *b, float dloss,
                                model_loss_t *loss)
{
    const model_config_t *c = &m->cfg;
    int64_t N = b->B * b->T, C = c->hidden_size, V = m->vocab;
    tensor_t x = t2(a->res + (size_t)a->nl * (size_t)N * (size_t)C, N, C);
    tensor_t lnf = t2(a->lnf, N, C), rstdf = t1(a->rstdf, N);
    kern_rmsnorm_fwd(&lnf, &rstdf, &x, P(m, m->final_norm), (float)c->rms_norm_eps);
    if (dloss > 0) {
        tensor_t dlnf = t2(a->dlnf, N, C);
        kern_zero(&dlnf);
    }
    double sum = 0.0;
    int64_t scored = 0;
    bt_status_t st;
    for (int64_t r0 = 0; r0 < N; r0 += a->head_chunk) {
        int64_t rows = N - r0 < a->head_chunk ? N - r0 : a->head_chunk;
        if (!b->logits_out && model_count_scored(b->targets + r0, rows) == 0) continue;
        tensor_t xin = t2(a->lnf + (size_t)r0 * (size_t)C, rows, C);
        tensor_t logits = t2(a->logits, rows, V), losses = t1(a->losses, rows);
        tensor_t tg = tensor_1d((void *)(b->targets + r0), DT_I32, rows);
        kern_linear_fwd(&logits, &xin, P(m, m->lm_head), NULL);
        if (b->logits_out) {
            float *dst = b->logits_out + (size_t)r0 * (size_t)c->vocab_size;
            if (m->par.tp_size == 1)
                memcpy(dst, a->logits, (size_t)(rows * V) * sizeof(float));
            else if ((st = head_logits_gather(m, dst, a->logits, rows)) != BT_OK)
                return st;
        }
        tensor_t dlogits = t2(a->dlogits, rows, V);
        int64_t k = head_xent(m, a, &losses, dloss > 0 ? &dlogits : NULL, &logits, &tg, dloss);
        if (k < 0) return (bt_status_t)k;
        scored += k;
        for (int64_t i = 0; i < rows; i++) sum += a->losses[i];
        if (dloss > 0) {
            tensor_t dx = t2(a->dlnf + (size_t)r0 * (size_t)C, rows, C);
            kern_linear_bwd(&dx, G(m, m->lm_head), NULL, &dlogits, &xin, P(m, m->lm_head));
        }
    }
    if (dloss > 0 &&
        (st = tp_all_reduce(m, a->dlnf, (size_t)(N * C), COLL_SUM, "d model.norm", -1)) != BT_OK)
        return st;
    loss->loss_sum = sum;
    loss->n_scored = scored;
    return BT_OK;
}

bt_status_t model_stage_forward(model_t *m, model_acts_t *a, const model_batch_t *b,
                                const float *x_in, float dloss, float *x_out,
                                model_loss_t *loss)
{
    const model_config_t *c = &m->cfg;
    const model_stage_t *s = &m->stage;
    if (a->m != m || b->B <= 0 || b->T <= 0 || b->B * b->T > a->B * a->T || b->T > a->T) {
        log_error("model: batch %lldx%lld does not fit the activation arena %lldx%lld",
                  (long long)b->B, (long long)b->T, (long long)a->B, (long long)a->T);
        return BT_ERR_INVALID;
    }
    if ((s->has_embedding ? !b->ids : !x_in) || (s->has_head ? !b->targets || !loss : !x_out)) {
        log_error("model: stage [%d,%d) needs %s input and %s", s->first_layer, s->last_layer,
                  s->has_embedding ? "token-id" : "hidden-state",
                  s->has_head ? "targets and a loss" : "an output buffer");
        return BT_ERR_INVALID;
    }
    int64_t N = b->B * b->T, C = c->hidden_size;
    if (dloss > 0) {
        bt_status_t st = model_grads_alloc(m);
        if (st != BT_OK) return st;
    }
    if (s->has_embedding) {
        for (int64_t i = 0; i < N; i++)
            if (b->ids[i] < 0 || b->ids[i] >= c->vocab_size) {
                log_error("model: token id %d at row %lld position %lld outside the vocabulary "
                          "(%lld)", b->ids[i], (long long)(i / b->T), (long long)(i % b->T),
                          (long long)c->vocab_size);
                return BT_ERR_INVALID;
            }
        memcpy(a->ids, b->ids, (size_t)N * sizeof(int32_t));
    }
    if (s->has_head)
        for (int64_t i = 0; i < N; i++)
            if (b->targets[i] != MODEL_IGNORE_INDEX &&
                (b->targets[i] < 0 || b->targets[i] >= c->vocab_size)) {
                log_error("model: target %d at row %lld position %lld outside the vocabulary",
                          b->targets[i], (long long)(i / b->T), (long long)(i % b->T));
                return BT_ERR_INVALID;
            }
    for (int64_t i = 0; i < N; i++) {
        int32_t p = b->pos ? b->pos[i] : (int32_t)(i % b->T);
        if (p < 0 || p >= a->T) {
            log_error("model: position %d outside the rope table [0, %lld)", p, (long long)a->T);
            return BT_ERR_INVALID;
        }
        a->pos[i] = p;
    }
    a->cb = b->B;
    a->ct = b->T;
    a->grad_ready = false;

    tensor_t res0 = t2(a->res, N, C);
    bt_status_t st;
    if (s->has_embedding) {
        /* vocab-parallel: rows outside this rank's slice are zero, so the
         * sum over the group is the lookup */
        tensor_t ids = tensor_1d(a->ids, DT_I32, N);
        kern_embedding_fwd(&res0, P(m, m->embed), &ids, m->vocab_start);
        st = tp_all_reduce(m, a->res, (size_t)(N * C), COLL_SUM, "the embedding", -1);
        if (st != BT_OK) return st;
    } else {
        memcpy(a->res, x_in, (size_t)(N * C) * sizeof(float));
    }
    for (int li = 0; li < a->nl; li++)
        if ((st = layer_forward(m, a, li, b->B, b->T)) != BT_OK) return st;
    if (s->has_head) {
        if ((st = head_forward(m, a, b, dloss, loss)) != BT_OK) return st;
    } else {
        memcpy(x_out, a->res + (size_t)a->nl * (size_t)(N * C), (size_t)(N * C) * sizeof(float));
    }
    a->grad_ready = dloss > 0;
    return BT_OK;
}

bt_status_t model_stage_backward(model_t *m, model_acts_t *a, const float *dx_out, float *dx_in)
{
    const model_stage_t *s = &m->stage;
    if (!a->grad_ready) {
        log_error("model: backward without a forward with dloss > 0 on this arena");
        return BT_ERR_INVALID;
    }
    if ((!s->has_head && !dx_out) || (!s->has_embedding && !dx_in)) {
        log_error("model: stage [%d,%d) backward needs %s", s->first_layer, s->last_layer,
                  !dx_out && !s->has_head ? "dx_out" : "dx_in");
        return BT_ERR_INVALID;
    }
    int64_t B = a->cb, T = a->ct, N = B * T, C = m->cfg.hidden_size;
    tensor_t dres = t2(a->dres, N, C);
    if (s->has_head) {
        tensor_t x = t2(a->res + (size_t)a->nl * (size_t)(N * C), N, C);
        tensor_t dlnf = t2(a->dlnf, N, C), rstdf = t1(a->rstdf, N);
        kern_zero(&dres);
        kern_rmsnorm_bwd(&dres, G(m, m->final_norm), &dlnf, &x, P(m, m->final_norm), &rstdf);
    } else {
        memcpy(a->dres, dx_out, (size_t)(N * C) * sizeof(float));
    }
    a->grad_ready = false; /* a failed collective leaves partial gradients */
    for (int li = a->nl - 1; li >= 0; li--) {
        bt_status_t st = layer_backward(m, a, li, B, T);
        if (st != BT_OK) return st;
    }
    if (s->has_embedding) {
        tensor_t ids = tensor_1d(a->ids, DT_I32, N);
        kern_embedding_bwd(G(m, m->embed), &dres, &ids, m->vocab_start);
    } else {
        memcpy(dx_in, a->dres, (size_t)(N * C) * sizeof(float));
    }
    return BT_OK;
}

bt_status_t model_forward_backward(model_t *m, model_acts_t *a, const model_batch_t *batch,
                                   float dloss, model_loss_t *loss)
{
    if (!m->stage.has_embedding || !m->stage.has_head) {
        log_error("model: model_forward_backward needs a whole model (embedding and head)");
        return BT_ERR_INVALID;
    }
    bt_status_t st = model_stage_forward(m, a, batch, NULL, dloss, NULL, loss);
    if (st != BT_OK || dloss <= 0) return st;
    return model_stage_backward(m, a, NULL, NULL);
}
