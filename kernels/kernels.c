/* The kernel dispatch (kernels/kernels.h).
 *
 * Every kern_* call does three things: check its arguments, reduce them to
 * pointers and dimensions, and call the ops table of the tensors' device
 * (kernels/backend.h). A failed check is a caller bug and panics with the op's
 * name and the mismatch (STYLE.md rule 4), before any backend runs. */
#include "kernels/kernels.h"

#include "base/log.h"
#include "kernels/backend.h"

#include <stdio.h>

/* Indexed by device_kind_t. A NULL entry is a backend this binary was built
 * without; calls for it panic with a message saying so. */
static const kern_backend_ops_t *const kern_backends[] = {
    [DEV_CPU] = &kern_cpu_ops,
#ifdef BT_HAVE_CUDA
    [DEV_CUDA] = &kern_cuda_ops,
#else
    [DEV_CUDA] = NULL,
#endif
};
_Static_assert(sizeof kern_backends / sizeof kern_backends[0] == DEV_COUNT,
               "one backend entry per device kind");

static const char *const kern_device_names[] = {[DEV_CPU] = "cpu", [DEV_CUDA] = "cuda"};
_Static_assert(sizeof kern_device_names / sizeof kern_device_names[0] == DEV_COUNT,
               "one name per device kind");

/* ---- argument checks ------------------------------------------------------ */

typedef struct {
    char s[96];
} kern_shape_str_t;

static kern_shape_str_t kern_shape_str(const tensor_t *t)
{
    kern_shape_str_t r;
    int n = snprintf(r.s, sizeof r.s, "%s[", dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && n > 0 && (size_t)n < sizeof r.s; i++)
        n += snprintf(r.s + n, sizeof r.s - (size_t)n, i ? ",%lld" : "%lld",
                      (long long)t->shape[i]);
    if (n > 0 && (size_t)n < sizeof r.s) snprintf(r.s + n, sizeof r.s - (size_t)n, "]");
    return r;
}

/* A usable tensor: present, sane ndim and dtype, contiguous, data unless empty. */
static void kern_req(const char *op, const char *name, const tensor_t *t)
{
    if (!t) BT_PANIC("%s: %s is NULL", op, name);
    if (t->ndim < 1 || t->ndim > TENSOR_MAX_DIMS)
        BT_PANIC("%s: %s has ndim %d", op, name, t->ndim);
    if ((unsigned)t->dtype >= (unsigned)DT_COUNT)
        BT_PANIC("%s: %s has invalid dtype %d", op, name, (int)t->dtype);
    if ((unsigned)t->device.kind >= (unsigned)DEV_COUNT)
        BT_PANIC("%s: %s has invalid device kind %d", op, name, (int)t->device.kind);
    if (!tensor_is_contiguous(t))
        BT_PANIC("%s: %s %s is not contiguous", op, name, kern_shape_str(t).s);
    if (!t->data && tensor_numel(t) > 0)
        BT_PANIC("%s: %s %s has no data", op, name, kern_shape_str(t).s);
}

static void kern_req_dtype(const char *op, const char *name, const tensor_t *t, dtype_t dt)
{
    if (t->dtype != dt)
        BT_PANIC("%s: %s is %s, expected %s", op, name, dtype_name(t->dtype), dtype_name(dt));
}

static void kern_req_numel(const char *op, const char *name, const tensor_t *t, int64_t n)
{
    if (tensor_numel(t) != n)
        BT_PANIC("%s: %s %s has %lld elements, expected %lld", op, name, kern_shape_str(t).s,
                 (long long)tensor_numel(t), (long long)n);
}

static void kern_req_rows_cols(const char *op, const char *name, const tensor_t *t, int64_t rows,
                               int64_t cols)
{
    if (tensor_rows(t) != rows || tensor_cols(t) != cols)
        BT_PANIC("%s: %s %s is not [%lld rows, %lld cols]", op, name, kern_shape_str(t).s,
                 (long long)rows, (long long)cols);
}

static void kern_req_same_shape(const char *op, const char *name, const tensor_t *t,
                                const char *ref_name, const tensor_t *ref)
{
    if (!tensor_same_shape(t, ref))
        BT_PANIC("%s: %s %s does not match %s %s", op, name, kern_shape_str(t).s, ref_name,
                 kern_shape_str(ref).s);
}

static void kern_req_ndim(const char *op, const char *name, const tensor_t *t, int ndim)
{
    if (t->ndim != ndim)
        BT_PANIC("%s: %s %s must be %d-D", op, name, kern_shape_str(t).s, ndim);
}

/* t lives on the same device as ref (the call's first tensor). */
static void kern_req_device(const char *op, const char *name, const tensor_t *t,
                            const tensor_t *ref)
{
    if (t->device.kind != ref->device.kind || t->device.index != ref->device.index)
        BT_PANIC("%s: %s is on %s:%d but the call runs on %s:%d", op, name,
                 kern_device_names[t->device.kind], t->device.index,
                 kern_device_names[ref->device.kind], ref->device.index);
}

/* Full check of one tensor argument against the call's reference tensor. */
static void kern_arg(const char *op, const char *name, const tensor_t *t, const tensor_t *ref)
{
    kern_req(op, name, t);
    kern_req_device(op, name, t, ref);
}

static const kern_backend_ops_t *kern_backend(const char *op, const tensor_t *ref)
{
    const kern_backend_ops_t *ops = kern_backends[ref->device.kind];
    if (!ops)
        BT_PANIC("%s: %s kernels are not built into this binary (the CUDA backend needs nvcc "
                 "and kernels/cuda/*.cu at build time)",
                 op, kern_device_names[ref->device.kind]);
    return ops;
}

/* The backend computes in ref's dtype; every listed tensor has that dtype. */
static const kern_backend_ops_t *kern_compute(const char *op, const tensor_t *ref)
{
    const kern_backend_ops_t *ops = kern_backend(op, ref);
    if (!(ops->compute_dtypes & (1u << ref->dtype)))
        BT_PANIC("%s: the %s backend has no %s kernel", op, ops->name, dtype_name(ref->dtype));
    return ops;
}

void kern_cpu_set_threads(int n) { kern_cpu_ops.set_threads(n); }

/* ---- dense algebra -------------------------------------------------------- */

void kern_matmul(tensor_t *c, const tensor_t *a, const tensor_t *b, bool trans_a, bool trans_b,
                 float alpha, float beta)
{
    const char *op = "kern_matmul";
    kern_req(op, "c", c);
    kern_arg(op, "a", a, c);
    kern_arg(op, "b", b, c);
    kern_req_dtype(op, "a", a, c->dtype);
    kern_req_dtype(op, "b", b, c->dtype);
    int64_t M = trans_a ? tensor_cols(a) : tensor_rows(a);
    int64_t K = trans_a ? tensor_rows(a) : tensor_cols(a);
    int64_t Kb = trans_b ? tensor_cols(b) : tensor_rows(b);
    int64_t N = trans_b ? tensor_rows(b) : tensor_cols(b);
    if (K != Kb)
        BT_PANIC("%s: inner dims differ: op(a) of %s%s is [%lld,%lld], op(b) of %s%s is "
                 "[%lld,%lld]",
                 op, kern_shape_str(a).s, trans_a ? "^T" : "", (long long)M, (long long)K,
                 kern_shape_str(b).s, trans_b ? "^T" : "", (long long)Kb, (long long)N);
    kern_req_rows_cols(op, "c", c, M, N);
    if (c->data == a->data || c->data == b->data) BT_PANIC("%s: c aliases an input", op);
    kern_compute(op, c)->matmul(c->data, a->data, b->data, c->dtype, M, N, K, trans_a, trans_b,
                                alpha, beta);
}

void kern_linear_fwd(tensor_t *out, const tensor_t *x, const tensor_t *w, const tensor_t *bias)
{
    const char *op = "kern_linear_fwd";
    kern_req(op, "out", out);
    kern_arg(op, "x", x, out);
    kern_arg(op, "w", w, out);
    kern_req_ndim(op, "w", w, 2);
    int64_t N = tensor_rows(x), IC = tensor_cols(x), OC = w->shape[0];
    kern_req_rows_cols(op, "w", w, OC, IC);
    kern_req_rows_cols(op, "out", out, N, OC);
    kern_req_dtype(op, "x", x, out->dtype);
    kern_req_dtype(op, "w", w, out->dtype);
    if (bias) {
        kern_arg(op, "bias", bias, out);
        kern_req_dtype(op, "bias", bias, out->dtype);
        kern_req_numel(op, "bias", bias, OC);
    }
    if (out->data == x->data) BT_PANIC("%s: out aliases x", op);
    kern_compute(op, out)->linear_fwd(out->data, x->data, w->data, bias ? bias->data : NULL,
                                      out->dtype, N, IC, OC);
}

void kern_linear_bwd(tensor_t *dx, tensor_t *dw, tensor_t *dbias, const tensor_t *dout,
                     const tensor_t *x, const tensor_t *w)
{
    const char *op = "kern_linear_bwd";
    kern_req(op, "dout", dout);
    kern_arg(op, "x", x, dout);
    kern_arg(op, "w", w, dout);
    kern_req_ndim(op, "w", w, 2);
    int64_t N = tensor_rows(x), IC = tensor_cols(x), OC = w->shape[0];
    kern_req_rows_cols(op, "w", w, OC, IC);
    kern_req_rows_cols(op, "dout", dout, N, OC);
    kern_req_dtype(op, "x", x, dout->dtype);
    kern_req_dtype(op, "w", w, dout->dtype);
    if (dx) {
        kern_arg(op, "dx", dx, dout);
        kern_req_dtype(op, "dx", dx, dout->dtype);
        kern_req_rows_cols(op, "dx", dx, N, IC);
    }
    if (dw) {
        kern_arg(op, "dw", dw, dout);
        kern_req_dtype(op, "dw", dw, dout->dtype);
        kern_req_same_shape(op, "dw", dw, "w", w);
    }
    if (dbias) {
        kern_arg(op, "dbias", dbias, dout);
        kern_req_dtype(op, "dbias", dbias, dout->dtype);
        kern_req_numel(op, "dbias", dbias, OC);
    }
    kern_compute(op, dout)->linear_bwd(dx ? dx->data : NULL, dw ? dw->data : NULL,
                                       dbias ? dbias->data : NULL, dout->data, x->data, w->data,
                                       dout->dtype, N, IC, OC);
}

/* ---- elementwise ---------------------------------------------------------- */

void kern_zero(tensor_t *t)
{
    kern_req("kern_zero", "t", t);
    kern_backend("kern_zero", t)->zero(t->data, tensor_nbytes(t));
}

void kern_copy(tensor_t *dst, const tensor_t *src)
{
    const char *op = "kern_copy";
    kern_req(op, "dst", dst);
    kern_arg(op, "src", src, dst);
    kern_req_numel(op, "src", src, tensor_numel(dst));
    kern_backend(op, dst)->copy(dst->data, dst->dtype, src->data, src->dtype, tensor_numel(dst));
}

void kern_add(tensor_t *out, const tensor_t *a, const tensor_t *b)
{
    const char *op = "kern_add";
    kern_req(op, "out", out);
    kern_arg(op, "a", a, out);
    kern_arg(op, "b", b, out);
    kern_req_dtype(op, "a", a, out->dtype);
    kern_req_dtype(op, "b", b, out->dtype);
    kern_req_numel(op, "a", a, tensor_numel(out));
    kern_req_numel(op, "b", b, tensor_numel(out));
    kern_compute(op, out)->add(out->data, a->data, b->data, out->dtype, tensor_numel(out));
}

void kern_axpy(tensor_t *y, float alpha, const tensor_t *x)
{
    const char *op = "kern_axpy";
    kern_req(op, "y", y);
    kern_arg(op, "x", x, y);
    kern_req_dtype(op, "x", x, y->dtype);
    kern_req_numel(op, "x", x, tensor_numel(y));
    kern_compute(op, y)->axpy(y->data, alpha, x->data, y->dtype, tensor_numel(y));
}

void kern_scale(tensor_t *t, float s)
{
    kern_req("kern_scale", "t", t);
    kern_compute("kern_scale", t)->scale(t->data, s, t->dtype, tensor_numel(t));
}

double kern_sumsq(const tensor_t *t)
{
    kern_req("kern_sumsq", "t", t);
    return kern_backend("kern_sumsq", t)->sumsq(t->data, t->dtype, tensor_numel(t));
}

int64_t kern_count_nonfinite(const tensor_t *t)
{
    kern_req("kern_count_nonfinite", "t", t);
    return kern_backend("kern_count_nonfinite", t)->count_nonfinite(t->data, t->dtype,
                                                                    tensor_numel(t));
}

/* ---- embedding ------------------------------------------------------------ */

void kern_embedding_fwd(tensor_t *out, const tensor_t *table, const tensor_t *ids,
                        int64_t vocab_start)
{
    const char *op = "kern_embedding_fwd";
    kern_req(op, "out", out);
    kern_arg(op, "table", table, out);
    kern_arg(op, "ids", ids, out);
    kern_req_ndim(op, "table", table, 2);
    kern_req_dtype(op, "table", table, out->dtype);
    kern_req_dtype(op, "ids", ids, DT_I32);
    int64_t N = tensor_rows(out), V = table->shape[0], C = table->shape[1];
    kern_req_rows_cols(op, "out", out, N, C);
    kern_req_numel(op, "ids", ids, N);
    kern_compute(op, out)->embedding_fwd(out->data, table->data, ids->data, out->dtype, N, V, C,
                                         vocab_start);
}

void kern_embedding_bwd(tensor_t *dtable, const tensor_t *dout, const tensor_t *ids,
                        int64_t vocab_start)
{
    const char *op = "kern_embedding_bwd";
    kern_req(op, "dtable", dtable);
    kern_arg(op, "dout", dout, dtable);
    kern_arg(op, "ids", ids, dtable);
    kern_req_ndim(op, "dtable", dtable, 2);
    kern_req_dtype(op, "dout", dout, dtable->dtype);
    kern_req_dtype(op, "ids", ids, DT_I32);
    int64_t N = tensor_rows(dout), V = dtable->shape[0], C = dtable->shape[1];
    kern_req_rows_cols(op, "dout", dout, N, C);
    kern_req_numel(op, "ids", ids, N);
    kern_compute(op, dtable)->embedding_bwd(dtable->data, dout->data, ids->data, dtable->dtype, N,
                                            V, C, vocab_start);
}

/* ---- RMSNorm -------------------------------------------------------------- */

void kern_rmsnorm_fwd(tensor_t *out, tensor_t *rstd, const tensor_t *x, const tensor_t *w,
                      float eps)
{
    const char *op = "kern_rmsnorm_fwd";
    kern_req(op, "out", out);
    kern_arg(op, "rstd", rstd, out);
    kern_arg(op, "x", x, out);
    kern_arg(op, "w", w, out);
    kern_req_same_shape(op, "out", out, "x", x);
    kern_req_dtype(op, "x", x, out->dtype);
    kern_req_dtype(op, "w", w, out->dtype);
    kern_req_dtype(op, "rstd", rstd, DT_F32);
    int64_t N = tensor_rows(x), C = tensor_cols(x);
    kern_req_numel(op, "w", w, C);
    kern_req_numel(op, "rstd", rstd, N);
    kern_compute(op, out)->rmsnorm_fwd(out->data, rstd->data, x->data, w->data, out->dtype, N, C,
                                       eps);
}

void kern_rmsnorm_bwd(tensor_t *dx, tensor_t *dw, const tensor_t *dout, const tensor_t *x,
                      const tensor_t *w, const tensor_t *rstd)
{
    const char *op = "kern_rmsnorm_bwd";
    kern_req(op, "dout", dout);
    kern_arg(op, "x", x, dout);
    kern_arg(op, "w", w, dout);
    kern_arg(op, "rstd", rstd, dout);
    kern_req_same_shape(op, "dout", dout, "x", x);
    kern_req_dtype(op, "x", x, dout->dtype);
    kern_req_dtype(op, "w", w, dout->dtype);
    kern_req_dtype(op, "rstd", rstd, DT_F32);
    int64_t N = tensor_rows(x), C = tensor_cols(x);
    kern_req_numel(op, "w", w, C);
    kern_req_numel(op, "rstd", rstd, N);
    if (dx) {
        kern_arg(op, "dx", dx, dout);
        kern_req_dtype(op, "dx", dx, dout->dtype);
        kern_req_numel(op, "dx", dx, N * C);
    }
    if (dw) {
        kern_arg(op, "dw", dw, dout);
        kern_req_dtype(op, "dw", dw, dout->dtype);
        kern_req_numel(op, "dw", dw, C);
    }
    kern_compute(op, dout)->rmsnorm_bwd(dx ? dx->data : NULL, dw ? dw->data : NULL, dout->data,
                                        x->data, w->data, rstd->data, dout->dtype, N, C);
}

/* ---- rotary embeddings ---------------------------------------------------- */

/* x is [B,T,H,D] (or [B*T,H,D]); the tables [P, D/2] f32; pos [B*T] i32. */
static void kern_rope_check(const char *op, const tensor_t *x, const tensor_t *cos,
                            const tensor_t *sin, const tensor_t *pos, int64_t *BT, int64_t *H,
                            int64_t *D, int64_t *P)
{
    if (x->ndim != 3 && x->ndim != 4)
        BT_PANIC("%s: x %s must be [B,T,H,D] or [B*T,H,D]", op, kern_shape_str(x).s);
    *D = x->shape[x->ndim - 1];
    *H = x->shape[x->ndim - 2];
    *BT = tensor_numel(x) / (*D * *H > 0 ? *D * *H : 1);
    if (*D % 2) BT_PANIC("%s: head dim %lld is odd", op, (long long)*D);
    kern_arg(op, "cos", cos, x);
    kern_arg(op, "sin", sin, x);
    kern_arg(op, "pos", pos, x);
    kern_req_dtype(op, "cos", cos, DT_F32);
    kern_req_dtype(op, "sin", sin, DT_F32);
    kern_req_dtype(op, "pos", pos, DT_I32);
    kern_req_ndim(op, "cos", cos, 2);
    *P = cos->shape[0];
    kern_req_rows_cols(op, "cos", cos, *P, *D / 2);
    kern_req_same_shape(op, "sin", sin, "cos", cos);
    kern_req_numel(op, "pos", pos, *BT);
}

void kern_rope_fwd(tensor_t *out, const tensor_t *x, const tensor_t *cos, const tensor_t *sin,
                   const tensor_t *pos)
{
    const char *op = "kern_rope_fwd";
    kern_req(op, "x", x);
    kern_arg(op, "out", out, x);
    kern_req_same_shape(op, "out", out, "x", x);
    kern_req_dtype(op, "out", out, x->dtype);
    int64_t BT, H, D, P;
    kern_rope_check(op, x, cos, sin, pos, &BT, &H, &D, &P);
    kern_compute(op, x)->rope_fwd(out->data, x->data, cos->data, sin->data, pos->data, x->dtype,
                                  BT, H, D, P);
}

void kern_rope_bwd(tensor_t *dx, const tensor_t *dout, const tensor_t *cos, const tensor_t *sin,
                   const tensor_t *pos)
{
    const char *op = "kern_rope_bwd";
    kern_req(op, "dout", dout);
    kern_arg(op, "dx", dx, dout);
    kern_req_same_shape(op, "dx", dx, "dout", dout);
    kern_req_dtype(op, "dx", dx, dout->dtype);
    int64_t BT, H, D, P;
    kern_rope_check(op, dout, cos, sin, pos, &BT, &H, &D, &P);
    kern_compute(op, dout)->rope_bwd(dx->data, dout->data, cos->data, sin->data, pos->data,
                                     dout->dtype, BT, H, D, P);
}

/* ---- attention ------------------------------------------------------------ */

static kern_attn_shape_t kern_attn_check(const char *op, const tensor_t *q, const tensor_t *k,
                                         const tensor_t *v, const tensor_t *out,
                                         const tensor_t *lse, float scale, bool causal,
                                         int64_t q_offset)
{
    kern_req(op, "q", q);
    kern_arg(op, "k", k, q);
    kern_arg(op, "v", v, q);
    kern_arg(op, "out", out, q);
    kern_arg(op, "lse", lse, q);
    kern_req_ndim(op, "q", q, 4);
    kern_req_ndim(op, "k", k, 4);
    kern_req_ndim(op, "v", v, 4);
    kern_req_ndim(op, "out", out, 4);
    kern_req_dtype(op, "k", k, q->dtype);
    kern_req_dtype(op, "v", v, q->dtype);
    kern_req_dtype(op, "out", out, q->dtype);
    kern_req_dtype(op, "lse", lse, DT_F32);
    kern_attn_shape_t s = {
        .B = q->shape[0], .Tq = q->shape[1], .Hq = q->shape[2], .D = q->shape[3],
        .Tk = k->shape[1], .Hkv = k->shape[2], .Dv = v->shape[3],
        .scale = scale, .causal = causal, .q_offset = q_offset,
    };
    if (k->shape[0] != s.B || k->shape[3] != s.D)
        BT_PANIC("%s: k %s does not fit q %s (batch and head dim must match)", op,
                 kern_shape_str(k).s, kern_shape_str(q).s);
    if (v->shape[0] != s.B || v->shape[1] != s.Tk || v->shape[2] != s.Hkv)
        BT_PANIC("%s: v %s does not fit k %s", op, kern_shape_str(v).s, kern_shape_str(k).s);
    if (out->shape[0] != s.B || out->shape[1] != s.Tq || out->shape[2] != s.Hq ||
        out->shape[3] != s.Dv)
        BT_PANIC("%s: out %s is not [B,Tq,Hq,Dv] = [%lld,%lld,%lld,%lld]", op,
                 kern_shape_str(out).s, (long long)s.B, (long long)s.Tq, (long long)s.Hq,
                 (long long)s.Dv);
    if (s.Hkv < 1 || s.Hq % s.Hkv)
        BT_PANIC("%s: %lld query heads are not a multiple of %lld kv heads", op, (long long)s.Hq,
                 (long long)s.Hkv);
    if (s.Tk < 1 && s.Tq > 0) BT_PANIC("%s: no keys (k %s)", op, kern_shape_str(k).s);
    if (q_offset < 0) BT_PANIC("%s: negative q_offset %lld", op, (long long)q_offset);
    if (lse->ndim == 3) {
        if (lse->shape[0] != s.B || lse->shape[1] != s.Hq || lse->shape[2] != s.Tq)
            BT_PANIC("%s: lse %s is not [B,Hq,Tq]", op, kern_shape_str(lse).s);
    } else {
        kern_req_numel(op, "lse", lse, s.B * s.Hq * s.Tq);
    }
    return s;
}

void kern_attention_fwd(tensor_t *out, tensor_t *lse, const tensor_t *q, const tensor_t *k,
                        const tensor_t *v, float scale, bool causal, int64_t q_offset)
{
    const char *op = "kern_attention_fwd";
    kern_attn_shape_t s = kern_attn_check(op, q, k, v, out, lse, scale, causal, q_offset);
    kern_compute(op, q)->attention_fwd(out->data, lse->data, q->data, k->data, v->data, q->dtype,
                                       &s);
}

void kern_attention_bwd(tensor_t *dq, tensor_t *dk, tensor_t *dv, const tensor_t *dout,
                        const tensor_t *q, const tensor_t *k, const tensor_t *v,
                        const tensor_t *out, const tensor_t *lse, float scale, bool causal,
                        int64_t q_offset)
{
    const char *op = "kern_attention_bwd";
    kern_attn_shape_t s = kern_attn_check(op, q, k, v, out, lse, scale, causal, q_offset);
    kern_arg(op, "dout", dout, q);
    kern_req_same_shape(op, "dout", dout, "out", out);
    kern_req_dtype(op, "dout", dout, q->dtype);
    if (dq) {
        kern_arg(op, "dq", dq, q);
        kern_req_same_shape(op, "dq", dq, "q", q);
        kern_req_dtype(op, "dq", dq, q->dtype);
    }
    if (dk) {
        kern_arg(op, "dk", dk, q);
        kern_req_same_shape(op, "dk", dk, "k", k);
        kern_req_dtype(op, "dk", dk, q->dtype);
    }
    if (dv) {
        kern_arg(op, "dv", dv, q);
        kern_req_same_shape(op, "dv", dv, "v", v);
        kern_req_dtype(op, "dv", dv, q->dtype);
    }
    kern_compute(op, q)->attention_bwd(dq ? dq->data : NULL, dk ? dk->data : NULL,
                                       dv ? dv->data : NULL, dout->data, q->data, k->data,
                                       v->data, out->data, lse->data, q->dtype, &s);
}

/* ---- MLP ------------------------------------------------------------------ */

void kern_swiglu_fwd(tensor_t *out, const tensor_t *gate, const tensor_t *up)
{
    const char *op = "kern_swiglu_fwd";
    kern_req(op, "out", out);
    kern_arg(op, "gate", gate, out);
    kern_arg(op, "up", up, out);
    kern_req_dtype(op, "gate", gate, out->dtype);
    kern_req_dtype(op, "up", up, out->dtype);
    kern_req_numel(op, "gate", gate, tensor_numel(out));
    kern_req_numel(op, "up", up, tensor_numel(out));
    kern_compute(op, out)->swiglu_fwd(out->data, gate->data, up->data, out->dtype,
                                      tensor_numel(out));
}

void kern_swiglu_bwd(tensor_t *dgate, tensor_t *dup, const tensor_t *dout, const tensor_t *gate,
                     const tensor_t *up)
{
    const char *op = "kern_swiglu_bwd";
    kern_req(op, "dout", dout);
    kern_arg(op, "gate", gate, dout);
    kern_arg(op, "up", up, dout);
    int64_t n = tensor_numel(dout);
    kern_req_dtype(op, "gate", gate, dout->dtype);
    kern_req_dtype(op, "up", up, dout->dtype);
    kern_req_numel(op, "gate", gate, n);
    kern_req_numel(op, "up", up, n);
    if (dgate) {
        kern_arg(op, "dgate", dgate, dout);
        kern_req_dtype(op, "dgate", dgate, dout->dtype);
        kern_req_numel(op, "dgate", dgate, n);
    }
    if (dup) {
        kern_arg(op, "dup", dup, dout);
        kern_req_dtype(op, "dup", dup, dout->dtype);
        kern_req_numel(op, "dup", dup, n);
    }
    kern_compute(op, dout)->swiglu_bwd(dgate ? dgate->data : NULL, dup ? dup->data : NULL,
                                       dout->data, gate->data, up->data, dout->dtype, n);
}

/* ---- loss ----------------------------------------------------------------- */

/* logits [N,V]; targets [N] i32; each per-row f32 vector given has N elements. */
static void kern_xent_rows(const char *op, const tensor_t *logits, const tensor_t *targets)
{
    kern_req(op, "logits", logits);
    kern_arg(op, "targets", targets, logits);
    kern_req_dtype(op, "targets", targets, DT_I32);
    kern_req_numel(op, "targets", targets, tensor_rows(logits));
}

static void kern_xent_vec(const char *op, const char *name, const tensor_t *t,
                          const tensor_t *logits)
{
    kern_arg(op, name, t, logits);
    kern_req_dtype(op, name, t, DT_F32);
    kern_req_numel(op, name, t, tensor_rows(logits));
}

static void kern_xent_dlogits(const char *op, const tensor_t *dlogits, const tensor_t *logits)
{
    kern_arg(op, "dlogits", dlogits, logits);
    kern_req_dtype(op, "dlogits", dlogits, logits->dtype);
    kern_req_same_shape(op, "dlogits", dlogits, "logits", logits);
}

int64_t kern_xent_fwd_bwd(tensor_t *losses, tensor_t *dlogits, const tensor_t *logits,
                          const tensor_t *targets, float dloss, int32_t ignore_index)
{
    const char *op = "kern_xent_fwd_bwd";
    kern_xent_rows(op, logits, targets);
    kern_xent_vec(op, "losses", losses, logits);
    if (dlogits) kern_xent_dlogits(op, dlogits, logits);
    if (tensor_cols(logits) < 1) BT_PANIC("%s: empty vocabulary", op);
    return kern_compute(op, logits)
        ->xent_fwd_bwd(losses->data, dlogits ? dlogits->data : NULL, logits->data, targets->data,
                       logits->dtype, tensor_rows(logits), tensor_cols(logits), dloss,
                       ignore_index);
}

void kern_xent_vp_max(tensor_t *row_max, const tensor_t *logits)
{
    const char *op = "kern_xent_vp_max";
    kern_req(op, "logits", logits);
    kern_xent_vec(op, "row_max", row_max, logits);
    if (tensor_cols(logits) < 1) BT_PANIC("%s: empty vocabulary shard", op);
    kern_compute(op, logits)->xent_vp_max(row_max->data, logits->data, logits->dtype,
                                          tensor_rows(logits), tensor_cols(logits));
}

void kern_xent_vp_sum(tensor_t *sumexp, tensor_t *tgt_logit, const tensor_t *logits,
                      const tensor_t *gmax, const tensor_t *targets, int64_t vocab_start,
                      int32_t ignore_index)
{
    const char *op = "kern_xent_vp_sum";
    kern_xent_rows(op, logits, targets);
    kern_xent_vec(op, "sumexp", sumexp, logits);
    kern_xent_vec(op, "tgt_logit", tgt_logit, logits);
    kern_xent_vec(op, "gmax", gmax, logits);
    kern_compute(op, logits)->xent_vp_sum(sumexp->data, tgt_logit->data, logits->data, gmax->data,
                                          targets->data, logits->dtype, tensor_rows(logits),
                                          tensor_cols(logits), vocab_start, ignore_index);
}

int64_t kern_xent_vp_finish(tensor_t *losses, tensor_t *dlogits, const tensor_t *logits,
                            const tensor_t *gmax, const tensor_t *sumexp,
                            const tensor_t *tgt_logit, const tensor_t *targets,
                            int64_t vocab_start, float dloss, int32_t ignore_index)
{
    const char *op = "kern_xent_vp_finish";
    kern_xent_rows(op, logits, targets);
    if (losses) kern_xent_vec(op, "losses", losses, logits);
    if (dlogits) kern_xent_dlogits(op, dlogits, logits);
    kern_xent_vec(op, "gmax", gmax, logits);
    kern_xent_vec(op, "sumexp", sumexp, logits);
    kern_xent_vec(op, "tgt_logit", tgt_logit, logits);
    return kern_compute(op, logits)
        ->xent_vp_finish(losses ? losses->data : NULL, dlogits ? dlogits->data : NULL,
                         logits->data, gmax->data, sumexp->data, tgt_logit->data, targets->data,
                         logits->dtype, tensor_rows(logits), tensor_cols(logits), vocab_start,
                         dloss, ignore_index);
}

/* ---- optimizer ------------------------------------------------------------ */

void kern_adamw(tensor_t *param, const tensor_t *grad, tensor_t *m, tensor_t *v,
                const adamw_args_t *args)
{
    const char *op = "kern_adamw";
    kern_req(op, "param", param);
    kern_arg(op, "grad", grad, param);
    kern_arg(op, "m", m, param);
    kern_arg(op, "v", v, param);
    int64_t n = tensor_numel(param);
    kern_req_dtype(op, "grad", grad, param->dtype);
    kern_req_dtype(op, "m", m, DT_F32);
    kern_req_dtype(op, "v", v, DT_F32);
    kern_req_numel(op, "grad", grad, n);
    kern_req_numel(op, "m", m, n);
    kern_req_numel(op, "v", v, n);
    if (!args) BT_PANIC("%s: args is NULL", op);
    if (args->step < 1) BT_PANIC("%s: step %lld is not 1-based", op, (long long)args->step);
    kern_compute(op, param)->adamw(param->data, grad->data, m->data, v->data, param->dtype, n,
                                   args);
}
