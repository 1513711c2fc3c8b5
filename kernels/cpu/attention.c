/* Grouped-query scaled dot-product attention, forward and backward.
 *
 * Per (batch, query head) the queries are taken in blocks of QB rows; a
 * block needs keys [0, nk) only (nk < Tk under the causal mask), so the
 * scores of a block are one BLAS product into a [QB, nk] scratch, the softmax is done in
 * place, and the output is a second product. Scratch is O(QB * Tk) per call,
 * never O(Tq * Tk). Heads are strided views of the [B,T,H,D] tensors, which
 * BLAS takes directly through its leading dimensions.
 *
 * The backward recomputes P = exp(S - lse) from the saved log-sum-exp:
 *   dV += P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(dO * O));
 *   dQ += scale dS K;  dK += scale dS^T Q.
 * The query heads of one group (equal h / (Hq/Hkv)) accumulate into the same
 * dK, dV rows. */
#include "kernels/cpu/cpu.h"

#include "base/log.h"

#include <math.h>
#include <stdlib.h>

/* 64 measured best of 64/128/256 on one core at T = 256 and 1024: smaller
 * blocks waste less of the causal triangle, larger ones make better GEMMs. */
enum { CPU_ATTN_QB = 64 };

/* Offsets and leading dimensions of one (b, h) pair's strided views. */
typedef struct {
    int64_t q, k, v, o; /* element offset of row 0 in q/dq, k/dk, v/dv, out/dout */
    int64_t ldq, ldk, ldv, ldo;
} cpu_attn_head_t;

static cpu_attn_head_t cpu_attn_head(const kern_attn_shape_t *s, int64_t b, int64_t h)
{
    int64_t kvh = h / (s->Hq / s->Hkv);
    cpu_attn_head_t hd = {
        .q = (b * s->Tq * s->Hq + h) * s->D,
        .k = (b * s->Tk * s->Hkv + kvh) * s->D,
        .v = (b * s->Tk * s->Hkv + kvh) * s->Dv,
        .o = (b * s->Tq * s->Hq + h) * s->Dv,
        .ldq = s->Hq * s->D,
        .ldk = s->Hkv * s->D,
        .ldv = s->Hkv * s->Dv,
        .ldo = s->Hq * s->Dv,
    };
    return hd;
}

/* Number of keys query row i (of the whole call) sees. */
static int64_t cpu_attn_limit(const kern_attn_shape_t *s, int64_t i)
{
    if (!s->causal) return s->Tk;
    int64_t lim = s->q_offset + i + 1;
    return lim < s->Tk ? lim : s->Tk;
}

/* The first key query row i sees: 0, or under a sliding window the oldest
 * of the window's keys. */
static int64_t cpu_attn_first(const kern_attn_shape_t *s, int64_t i)
{
    if (!s->causal || s->window <= 0) return 0;
    int64_t lo = s->q_offset + i + 1 - s->window;
    return lo > 0 ? lo : 0;
}

static float *cpu_attn_scratch(int64_t n, const char *op)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    if (!p) BT_PANIC("%s: out of memory for %lld scratch floats", op, (long long)n);
    return p;
}

void cpu_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                       const kern_attn_shape_t *s)
{
    int64_t qb = s->Tq < CPU_ATTN_QB ? s->Tq : CPU_ATTN_QB;
    float *sc = cpu_attn_scratch(qb * s->Tk, "kern_attention_fwd"); /* [qb, nk] */
    for (int64_t b = 0; b < s->B; b++) {
        for (int64_t h = 0; h < s->Hq; h++) {
            cpu_attn_head_t hd = cpu_attn_head(s, b, h);
            float *lse_bh = lse + (b * s->Hq + h) * s->Tq;
            for (int64_t i0 = 0; i0 < s->Tq; i0 += qb) {
                int64_t nq = s->Tq - i0 < qb ? s->Tq - i0 : qb;
                int64_t nk = cpu_attn_limit(s, i0 + nq - 1);
                cpu_matmul_ld(sc, q + hd.q + i0 * hd.ldq, k + hd.k, nq, nk, s->D, hd.ldq, hd.ldk,
                              nk, false, true, s->scale, 0.0f);
                for (int64_t r = 0; r < nq; r++) {
                    float *row = sc + r * nk;
                    int64_t lim = cpu_attn_limit(s, i0 + r), lo = cpu_attn_first(s, i0 + r);
                    float max = cpu_vmax(row + lo, lim - lo);
                    double sum = cpu_vexp_sum(row + lo, row + lo, lim - lo, max);
                    cpu_vscale(row + lo, lim - lo, (float)(1.0 / sum));
                    for (int64_t j = 0; j < lo; j++) row[j] = 0.0f;
                    for (int64_t j = lim; j < nk; j++) row[j] = 0.0f;
                    lse_bh[i0 + r] = max + (float)log(sum);
                }
                cpu_matmul_ld(out + hd.o + i0 * hd.ldo, sc, v + hd.v, nq, s->Dv, nk, nk, hd.ldv,
                              hd.ldo, false, false, 1.0f, 0.0f);
            }
        }
    }
    free(sc);
}

void cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                       const float *k, const float *v, const float *out, const float *lse,
                       const kern_attn_shape_t *s)
{
    if (!dq && !dk && !dv) return;
    int64_t qb = s->Tq < CPU_ATTN_QB ? s->Tq : CPU_ATTN_QB;
    float *p = cpu_attn_scratch(qb * s->Tk, "kern_attention_bwd");  /* [qb, nk] P, then dS */
    float *dp = cpu_attn_scratch(qb * s->Tk, "kern_attention_bwd"); /* [qb, nk] */
    float di[CPU_ATTN_QB];                                          /* rowsum(dO * O) */
    for (int64_t b = 0; b < s->B; b++) {
        for (int64_t h = 0; h < s->Hq; h++) {
            cpu_attn_head_t hd = cpu_attn_head(s, b, h);
            const float *lse_bh = lse + (b * s->Hq + h) * s->Tq;
            for (int64_t i0 = 0; i0 < s->Tq; i0 += qb) {
                int64_t nq = s->Tq - i0 < qb ? s->Tq - i0 : qb;
                int64_t nk = cpu_attn_limit(s, i0 + nq - 1);
                const float *qi = q + hd.q + i0 * hd.ldq;
                const float *doi = dout + hd.o + i0 * hd.ldo;
                cpu_matmul_ld(p, qi, k + hd.k, nq, nk, s->D, hd.ldq, hd.ldk, nk, false, true,
                              s->scale, 0.0f);
                for (int64_t r = 0; r < nq; r++) {
                    float *row = p + r * nk;
                    int64_t lim = cpu_attn_limit(s, i0 + r), lo = cpu_attn_first(s, i0 + r);
                    float l = lse_bh[i0 + r];
                    cpu_vexp_sum(row + lo, row + lo, lim - lo, l);
                    for (int64_t j = 0; j < lo; j++) row[j] = 0.0f;
                    for (int64_t j = lim; j < nk; j++) row[j] = 0.0f;
                }
                if (dv)
                    cpu_matmul_ld(dv + hd.v, p, doi, nk, s->Dv, nq, nk, hd.ldo, hd.ldv, true,
                                  false, 1.0f, 1.0f);
                if (!dq && !dk) continue;
                cpu_matmul_ld(dp, doi, v + hd.v, nq, nk, s->Dv, hd.ldo, hd.ldv, nk, false, true,
                              1.0f, 0.0f);
                for (int64_t r = 0; r < nq; r++) {
                    const float *o_r = out + hd.o + (i0 + r) * hd.ldo;
                    const float *do_r = doi + r * hd.ldo;
                    double acc = 0.0;
                    for (int64_t c = 0; c < s->Dv; c++) acc += (double)do_r[c] * o_r[c];
                    di[r] = (float)acc;
                }
                for (int64_t r = 0; r < nq; r++) cpu_vmul_sub(p + r * nk, dp + r * nk, nk, di[r]);
                if (dq)
                    cpu_matmul_ld(dq + hd.q + i0 * hd.ldq, p, k + hd.k, nq, s->D, nk, nk, hd.ldk,
                                  hd.ldq, false, false, s->scale, 1.0f);
                if (dk)
                    cpu_matmul_ld(dk + hd.k, p, qi, nk, s->D, nq, nk, hd.ldq, hd.ldk, true, false,
                                  s->scale, 1.0f);
            }
        }
    }
    free(dp);
    free(p);
}

/* Weights of the accumulated and the partial result in their union:
 * exp(a - l), exp(b - l) with l = log(exp(a) + exp(b)); an empty side
 * (lse = -inf) weighs 0. */
static void cpu_attn_merge_weights(float a, float b, float *wa, float *wb, float *l)
{
    float m = a > b ? a : b;
    if (m == -INFINITY) {
        *wa = *wb = 0;
        *l = -INFINITY;
        return;
    }
    float ea = expf(a - m), eb = expf(b - m), sum = ea + eb;
    *wa = ea / sum;
    *wb = eb / sum;
    *l = m + logf(sum);
}

void cpu_attention_merge(float *out, float *lse, const float *part_out, const float *part_lse,
                         int64_t B, int64_t Tq, int64_t Hq, int64_t Dv)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Tq; i++) {
                int64_t li = (b * Hq + h) * Tq + i, o = ((b * Tq + i) * Hq + h) * Dv;
                float wa, wb, l;
                cpu_attn_merge_weights(lse[li], part_lse[li], &wa, &wb, &l);
                for (int64_t d = 0; d < Dv; d++) out[o + d] = wa * out[o + d] + wb * part_out[o + d];
                lse[li] = l;
            }
}
