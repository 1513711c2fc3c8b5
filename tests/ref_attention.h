/* The float64 attention reference shared by the kernel tests
 * (tests/test_kernels_attn.c for the CPU backend, tests/device/test_cuda_ops.c
 * for the others): grouped-query attention, causal or not, with a query
 * offset, Dv != D allowed; forward with lse, and the gradients of the loss
 * sum(out * R). Header-only like tests/test_kernels_common.h. */
#ifndef BT_TESTS_REF_ATTENTION_H
#define BT_TESTS_REF_ATTENTION_H

#include "tests/test_kernels_common.h"

#include <math.h>

typedef struct {
    int64_t B, Tq, Tk, Hq, Hkv, D, Dv;
    bool    causal;
    int64_t q_offset;
    int64_t window; /* causal only: keys j > q_offset + i - window; 0: none */
} attn_shape_t;

typedef struct {
    attn_shape_t s;
    double       scale;
    double      *q, *k, *v, *R; /* R: weights of the loss sum(out * R) */
} attn_ctx_t;

static inline int64_t ref_limit(const attn_shape_t *s, int64_t i)
{
    if (!s->causal) return s->Tk;
    return s->q_offset + i + 1 < s->Tk ? s->q_offset + i + 1 : s->Tk;
}

/* the first key query i sees (a sliding window's oldest) */
static inline int64_t ref_first(const attn_shape_t *s, int64_t i)
{
    int64_t lo = s->causal && s->window > 0 ? s->q_offset + i + 1 - s->window : 0;
    return lo > 0 ? lo : 0;
}

#define QI(b, i, h, d) ((((b) * s->Tq + (i)) * s->Hq + (h)) * s->D + (d))
#define KI(b, j, h, d) ((((b) * s->Tk + (j)) * s->Hkv + (h)) * s->D + (d))
#define VI(b, j, h, d) ((((b) * s->Tk + (j)) * s->Hkv + (h)) * s->Dv + (d))
#define OI(b, i, h, d) ((((b) * s->Tq + (i)) * s->Hq + (h)) * s->Dv + (d))

/* probs[Tk] of query (b, i, h); returns lse */
static inline double ref_probs(double *probs, const attn_ctx_t *c, int64_t b, int64_t i,
                               int64_t h)
{
    const attn_shape_t *s = &c->s;
    int64_t kvh = h / (s->Hq / s->Hkv), lim = ref_limit(s, i), lo = ref_first(s, i);
    double m = -INFINITY;
    for (int64_t j = lo; j < lim; j++) {
        double d = 0;
        for (int64_t e = 0; e < s->D; e++) d += c->q[QI(b, i, h, e)] * c->k[KI(b, j, kvh, e)];
        probs[j] = c->scale * d;
        m = probs[j] > m ? probs[j] : m;
    }
    double z = 0;
    for (int64_t j = lo; j < lim; j++) z += (probs[j] = exp(probs[j] - m));
    for (int64_t j = 0; j < s->Tk; j++) probs[j] = j >= lo && j < lim ? probs[j] / z : 0;
    return m + log(z);
}

/* out[B, Tq, Hq, Dv] and lse[B, Hq, Tq] (NULL: not wanted). */
static inline void ref_attn_fwd(double *out, double *lse, const attn_ctx_t *c)
{
    const attn_shape_t *s = &c->s;
    double *p = kt_alloc_d(s->Tk);
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->Hq; h++)
            for (int64_t i = 0; i < s->Tq; i++) {
                int64_t kvh = h / (s->Hq / s->Hkv);
                double l = ref_probs(p, c, b, i, h);
                if (lse) lse[(b * s->Hq + h) * s->Tq + i] = l;
                for (int64_t e = 0; e < s->Dv; e++) {
                    double acc = 0;
                    for (int64_t j = 0; j < s->Tk; j++) acc += p[j] * c->v[VI(b, j, kvh, e)];
                    out[OI(b, i, h, e)] = acc;
                }
            }
    free(p);
}

/* The gradients of sum(out * R), added onto dq, dk, dv (out: the forward's). */
static inline void ref_attn_bwd(double *dq, double *dk, double *dv, const double *out,
                                const attn_ctx_t *c)
{
    const attn_shape_t *s = &c->s;
    double *p = kt_alloc_d(s->Tk);
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->Hq; h++)
            for (int64_t i = 0; i < s->Tq; i++) {
                int64_t kvh = h / (s->Hq / s->Hkv);
                ref_probs(p, c, b, i, h);
                const double *g = c->R + OI(b, i, h, 0);
                double di = 0;
                for (int64_t e = 0; e < s->Dv; e++) di += g[e] * out[OI(b, i, h, e)];
                for (int64_t j = 0; j < s->Tk; j++) {
                    if (p[j] == 0) continue;
                    double dp = 0;
                    for (int64_t e = 0; e < s->Dv; e++) {
                        dp += g[e] * c->v[VI(b, j, kvh, e)];
                        dv[VI(b, j, kvh, e)] += p[j] * g[e];
                    }
                    double ds = p[j] * (dp - di) * c->scale;
                    for (int64_t e = 0; e < s->D; e++) {
                        dq[QI(b, i, h, e)] += ds * c->k[KI(b, j, kvh, e)];
                        dk[KI(b, j, kvh, e)] += ds * c->q[QI(b, i, h, e)];
                    }
                }
            }
    free(p);
}

/* sum(out * R): the loss the finite-difference checks differentiate. */
static inline double ref_attn_loss(void *p)
{
    attn_ctx_t *c = p;
    int64_t n = c->s.B * c->s.Tq * c->s.Hq * c->s.Dv;
    double *out = kt_alloc_d(n), l = 0;
    ref_attn_fwd(out, NULL, c);
    for (int64_t i = 0; i < n; i++) l += out[i] * c->R[i];
    free(out);
    return l;
}

#undef QI
#undef KI
#undef VI
#undef OI

#endif
