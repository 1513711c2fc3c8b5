/* The kernel dispatch (kernels/kernels.h).
 *
 * Every kern_* call does two things: check its arguments (every tensor on
 * the stream's device, shapes, dtypes), and call the ops table of the
 * stream's backend (kernels/backend.h) with the tensors. A failed check is a
 * caller bug and panics with the op's name and the mismatch, before any
 * backend runs. */
#include "kernels/kernels.h"

#include "base/log.h"
#include "kernels/backend.h"
#include "base/clock.h"
#include "kernels/cpu/cpu.h"

#include <stdio.h>

/* ---- argument checks ------------------------------------------------------ */

kern_shape_str_t kern_shape_str(const tensor_t *t)
{
    kern_shape_str_t r;
    int n = snprintf(r.s, sizeof r.s, "%s[", dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && n > 0 && (size_t)n < sizeof r.s; i++)
        n +=
            snprintf(r.s + n, sizeof r.s - (size_t)n, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    if (n > 0 && (size_t)n < sizeof r.s) snprintf(r.s + n, sizeof r.s - (size_t)n, "]");
    return r;
}

/* A usable tensor: present, sane ndim and dtype, contiguous, data unless
 * empty, on the stream's device. */
static void kern_req(kern_stream_t *s, const char *op, const char *name, const tensor_t *t)
{
    if (!s) BT_PANIC("%s: no stream", op);
    if (!t) BT_PANIC("%s: %s is NULL", op, name);
    if (t->ndim < 1 || t->ndim > TENSOR_MAX_DIMS) BT_PANIC("%s: %s has ndim %d", op, name, t->ndim);
    if ((unsigned)t->dtype >= (unsigned)DT_COUNT)
        BT_PANIC("%s: %s has invalid dtype %d", op, name, (int)t->dtype);
    if ((unsigned)t->device.kind >= (unsigned)DEV_COUNT)
        BT_PANIC("%s: %s has invalid device kind %d", op, name, (int)t->device.kind);
    if (!tensor_is_contiguous(t))
        BT_PANIC("%s: %s %s is not contiguous", op, name, kern_shape_str(t).s);
    if (!t->data && tensor_numel(t) > 0)
        BT_PANIC("%s: %s %s has no data", op, name, kern_shape_str(t).s);
    if (!device_eq(t->device, s->dev)) {
        char a[DEVICE_STR_MAX], b[DEVICE_STR_MAX];
        BT_PANIC("%s: %s is on %s but the call runs on %s", op, name, device_str(t->device, a),
                 device_str(s->dev, b));
    }
}

static void kern_req_dtype(const char *op, const char *name, const tensor_t *t, dtype_t dt)
{
    if (t->dtype != dt)
        BT_PANIC("%s: %s is %s, expected %s", op, name, dtype_name(t->dtype), dtype_name(dt));
}

/* A gradient output accumulates in the compute dtype or in f32 (bf16
 * activations keep f32 weight gradients). */
static void kern_req_grad_dtype(const char *op, const char *name, const tensor_t *t, dtype_t dt)
{
    if (t->dtype != dt && t->dtype != DT_F32)
        BT_PANIC("%s: %s is %s, expected %s or f32", op, name, dtype_name(t->dtype),
                 dtype_name(dt));
}

/* A small parameter that a model may keep in f32 under a lower compute
 * dtype (model.h, keep_f32): the compute dtype or f32, as a gradient. */
static void kern_req_param_dtype(const char *op, const char *name, const tensor_t *t, dtype_t dt)
{
    kern_req_grad_dtype(op, name, t, dt);
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
    if (t->ndim != ndim) BT_PANIC("%s: %s %s must be %d-D", op, name, kern_shape_str(t).s, ndim);
}

/* The backend of s, after checking that it computes op in dtype dt. */
static const kern_backend_t *kern_compute(kern_stream_t *s, const char *op, kern_op_t kop,
                                          dtype_t dt)
{
    const kern_backend_t *be = s->be;
    if (!(be->op_dtypes[kop] & (1u << dt)))
        BT_PANIC("%s: the %s backend has no %s kernel", op, be->name, dtype_name(dt));
    return be;
}

void kern_cpu_set_threads(int n) { cpu_pool_set_threads(n); }

void kern_host_parallel(int64_t n_tasks, void (*fn)(void *arg, int64_t task), void *arg)
{
    if (n_tasks > 0) cpu_pool_run(n_tasks, fn, arg);
}

/* ---- dense algebra -------------------------------------------------------- */

double kern_peak_flops(device_t dev, dtype_t dt)
{
    if (dev.kind == DEV_CPU || dev.kind == DEV_FENCED) return kern_cpu_peak_flops();
    if (dt != DT_F32 && dt != DT_BF16 && dt != DT_F16) return 0;
    enum { N = 4096, ROUNDS = 5, CALLS = 10 };
    int64_t shape[2] = {N, N};
    size_t nbytes = (size_t)N * N * dtype_size(dt);
    void *mem[3] = {0};
    kern_stream_t *s = NULL;
    uint64_t peak_before = kern_mem_peak(dev);
    double best = 0;
    bool ok = kern_stream_create(dev, &s) == BT_OK;
    for (int i = 0; i < 3 && ok; i++) ok = kern_mem_alloc(dev, nbytes, &mem[i]) == BT_OK;
    if (ok) {
        tensor_t a = tensor_make(mem[0], dt, dev, 2, shape), b = tensor_make(mem[1], dt, dev, 2, shape),
                 c = tensor_make(mem[2], dt, dev, 2, shape);
        /* operands of varied values (products of zeros draw less power
         * and run faster than training's) */
        void *host = NULL;
        ok = kern_host_alloc(dev, nbytes, &host) == BT_OK;
        for (size_t i = 0; ok && i < (size_t)N * N; i++) {
            float v = (float)((uint32_t)(i * 2654435761u) >> 24) / 256.0f - 0.5f;
            if (dt == DT_F32) ((float *)host)[i] = v;
            else ((uint16_t *)host)[i] = dt == DT_BF16 ? f32_to_bf16(v) : f32_to_f16(v);
        }
        if (ok) {
            kern_upload(s, &a, host);
            kern_upload(s, &b, host);
            ok = kern_stream_sync(s) == BT_OK;
        }
        kern_host_free(dev, host);
        for (int i = 0; i < 3 && ok; i++) kern_matmul(s, &c, &a, &b, false, false, 1.0f, 0.0f);
        if (ok) ok = kern_stream_sync(s) == BT_OK;
        for (int round = 0; round < ROUNDS && ok; round++) {
            uint64_t t0 = clock_now_ns();
            for (int i = 0; i < CALLS; i++) kern_matmul(s, &c, &a, &b, false, false, 1.0f, 0.0f);
            ok = kern_stream_sync(s) == BT_OK;
            double sec = (double)(clock_now_ns() - t0) * 1e-9;
            double rate = 2.0 * N * N * (double)N * CALLS / sec;
            if (ok && rate > best) best = rate;
        }
    }
    for (int i = 0; i < 3; i++) kern_mem_free(dev, mem[i]);
    if (s) kern_stream_destroy(s);
    kern_mem_peak_restore(dev, peak_before);
    return ok ? best : 0;
}

void kern_matmul(kern_stream_t *s, tensor_t *c, const tensor_t *a, const tensor_t *b, bool trans_a,
                 bool trans_b, float alpha, float beta)
{
    const char *op = "kern_matmul";
    kern_req(s, op, "c", c);
    kern_req(s, op, "a", a);
    kern_req(s, op, "b", b);
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
    if (c->data && (c->data == a->data || c->data == b->data))
        BT_PANIC("%s: c aliases an input", op);
    kern_compute(s, op, KERN_OP_MATMUL, c->dtype)
        ->matmul(s, c, a, b, trans_a, trans_b, alpha, beta);
}

void kern_linear_fwd(kern_stream_t *s, tensor_t *out, const tensor_t *x, const tensor_t *w,
                     const tensor_t *bias)
{
    const char *op = "kern_linear_fwd";
    kern_req(s, op, "out", out);
    kern_req(s, op, "x", x);
    kern_req(s, op, "w", w);
    kern_req_ndim(op, "w", w, 2);
    int64_t N = tensor_rows(x), IC = tensor_cols(x), OC = w->shape[0];
    kern_req_rows_cols(op, "w", w, OC, IC);
    kern_req_rows_cols(op, "out", out, N, OC);
    kern_req_dtype(op, "x", x, out->dtype);
    kern_req_dtype(op, "w", w, out->dtype);
    if (bias) {
        kern_req(s, op, "bias", bias);
        kern_req_dtype(op, "bias", bias, out->dtype);
        kern_req_numel(op, "bias", bias, OC);
    }
    if (out->data && out->data == x->data) BT_PANIC("%s: out aliases x", op);
    kern_compute(s, op, KERN_OP_LINEAR, out->dtype)->linear_fwd(s, out, x, w, bias);
}

/* An overwritten output (a _set op's) that aliases an input would be
 * destroyed before it is read where the backend zeroes first. */
static void kern_req_no_alias(const char *op, const char *name, const tensor_t *t,
                              const tensor_t *in)
{
    if (t && in && t->data && t->data == in->data)
        BT_PANIC("%s: %s aliases an input (an overwritten output may not)", op, name);
}

static void linear_bwd(kern_stream_t *s, const char *op, bool set, tensor_t *dx, tensor_t *dw,
                       tensor_t *dbias, const tensor_t *dout, const tensor_t *x, const tensor_t *w)
{
    kern_req(s, op, "dout", dout);
    kern_req(s, op, "x", x);
    kern_req(s, op, "w", w);
    kern_req_ndim(op, "w", w, 2);
    int64_t N = tensor_rows(x), IC = tensor_cols(x), OC = w->shape[0];
    kern_req_rows_cols(op, "w", w, OC, IC);
    kern_req_rows_cols(op, "dout", dout, N, OC);
    kern_req_dtype(op, "x", x, dout->dtype);
    kern_req_dtype(op, "w", w, dout->dtype);
    if (dx) {
        kern_req(s, op, "dx", dx);
        kern_req_dtype(op, "dx", dx, dout->dtype);
        kern_req_rows_cols(op, "dx", dx, N, IC);
    }
    if (dw) {
        kern_req(s, op, "dw", dw);
        kern_req_grad_dtype(op, "dw", dw, dout->dtype);
        kern_req_same_shape(op, "dw", dw, "w", w);
    }
    if (dbias) {
        kern_req(s, op, "dbias", dbias);
        kern_req_grad_dtype(op, "dbias", dbias, dout->dtype);
        kern_req_numel(op, "dbias", dbias, OC);
    }
    if (set) {
        kern_req_no_alias(op, "dx", dx, dout);
        kern_req_no_alias(op, "dx", dx, x);
        kern_req_no_alias(op, "dx", dx, w);
    }
    kern_compute(s, op, KERN_OP_LINEAR, dout->dtype)
        ->linear_bwd(s, dx, dw, dbias, dout, x, w, set);
}

void kern_linear_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, tensor_t *dbias,
                     const tensor_t *dout, const tensor_t *x, const tensor_t *w)
{
    linear_bwd(s, "kern_linear_bwd", false, dx, dw, dbias, dout, x, w);
}

void kern_linear_bwd_set(kern_stream_t *s, tensor_t *dx, tensor_t *dw, tensor_t *dbias,
                         const tensor_t *dout, const tensor_t *x, const tensor_t *w)
{
    linear_bwd(s, "kern_linear_bwd_set", true, dx, dw, dbias, dout, x, w);
}

/* ---- elementwise ---------------------------------------------------------- */

void kern_zero(kern_stream_t *s, tensor_t *t)
{
    kern_req(s, "kern_zero", "t", t);
    s->be->zero(s, t);
}

void kern_copy(kern_stream_t *s, tensor_t *dst, const tensor_t *src)
{
    const char *op = "kern_copy";
    kern_req(s, op, "dst", dst);
    kern_req(s, op, "src", src);
    kern_req_numel(op, "src", src, tensor_numel(dst));
    s->be->copy(s, dst, src);
}

void kern_add(kern_stream_t *s, tensor_t *out, const tensor_t *a, const tensor_t *b)
{
    const char *op = "kern_add";
    kern_req(s, op, "out", out);
    kern_req(s, op, "a", a);
    kern_req(s, op, "b", b);
    kern_req_dtype(op, "a", a, out->dtype);
    kern_req_dtype(op, "b", b, out->dtype);
    kern_req_numel(op, "a", a, tensor_numel(out));
    kern_req_numel(op, "b", b, tensor_numel(out));
    kern_compute(s, op, KERN_OP_ELEMENTWISE, out->dtype)->add(s, out, a, b);
}

void kern_axpy(kern_stream_t *s, tensor_t *y, float alpha, const tensor_t *x)
{
    const char *op = "kern_axpy";
    kern_req(s, op, "y", y);
    kern_req(s, op, "x", x);
    kern_req_dtype(op, "x", x, y->dtype);
    kern_req_numel(op, "x", x, tensor_numel(y));
    kern_compute(s, op, KERN_OP_ELEMENTWISE, y->dtype)->axpy(s, y, alpha, x);
}

void kern_copy_cols(kern_stream_t *s, tensor_t *dst, const tensor_t *src, const kern_cols_t *c)
{
    const char *op = "kern_copy_cols";
    kern_req(s, op, "dst", dst);
    kern_req(s, op, "src", src);
    kern_req_dtype(op, "src", src, dst->dtype);
    if (c->n < 1 || c->dstep < 1 || c->sstep < 1 || c->div < 1 || c->d0 < 0 || c->s0 < 0)
        BT_PANIC("%s: bad columns (n %lld, steps %lld %lld, div %lld, starts %lld %lld)", op,
                 (long long)c->n, (long long)c->dstep, (long long)c->sstep, (long long)c->div,
                 (long long)c->d0, (long long)c->s0);
    if (tensor_rows(dst) != tensor_rows(src) * c->div)
        BT_PANIC("%s: dst %s has not %lld x the rows of src %s", op, kern_shape_str(dst).s,
                 (long long)c->div, kern_shape_str(src).s);
    if (c->d0 + (c->n - 1) * c->dstep >= tensor_cols(dst) ||
        c->s0 + (c->n - 1) * c->sstep >= tensor_cols(src))
        BT_PANIC("%s: columns past dst %s or src %s", op, kern_shape_str(dst).s,
                 kern_shape_str(src).s);
    kern_compute(s, op, KERN_OP_ELEMENTWISE, dst->dtype)->copy_cols(s, dst, src, c);
}

void kern_scale(kern_stream_t *s, tensor_t *t, float f)
{
    kern_req(s, "kern_scale", "t", t);
    kern_compute(s, "kern_scale", KERN_OP_ELEMENTWISE, t->dtype)->scale(s, t, f);
}

double kern_sumsq(kern_stream_t *s, const tensor_t *t)
{
    kern_req(s, "kern_sumsq", "t", t);
    return s->be->sumsq(s, t);
}

int64_t kern_count_nonfinite(kern_stream_t *s, const tensor_t *t)
{
    kern_req(s, "kern_count_nonfinite", "t", t);
    return s->be->count_nonfinite(s, t);
}

/* ---- embedding ------------------------------------------------------------ */

void kern_embedding_fwd(kern_stream_t *s, tensor_t *out, const tensor_t *table, const tensor_t *ids,
                        int64_t vocab_start)
{
    const char *op = "kern_embedding_fwd";
    kern_req(s, op, "out", out);
    kern_req(s, op, "table", table);
    kern_req(s, op, "ids", ids);
    kern_req_ndim(op, "table", table, 2);
    kern_req_dtype(op, "table", table, out->dtype);
    kern_req_dtype(op, "ids", ids, DT_I32);
    int64_t N = tensor_rows(out), C = table->shape[1];
    kern_req_rows_cols(op, "out", out, N, C);
    kern_req_numel(op, "ids", ids, N);
    kern_compute(s, op, KERN_OP_EMBEDDING, out->dtype)
        ->embedding_fwd(s, out, table, ids, vocab_start);
}

void kern_embedding_bwd(kern_stream_t *s, tensor_t *dtable, const tensor_t *dout,
                        const tensor_t *ids, int64_t vocab_start)
{
    const char *op = "kern_embedding_bwd";
    kern_req(s, op, "dtable", dtable);
    kern_req(s, op, "dout", dout);
    kern_req(s, op, "ids", ids);
    kern_req_ndim(op, "dtable", dtable, 2);
    kern_req_grad_dtype(op, "dtable", dtable, dout->dtype);
    kern_req_dtype(op, "ids", ids, DT_I32);
    int64_t N = tensor_rows(dout), C = dtable->shape[1];
    kern_req_rows_cols(op, "dout", dout, N, C);
    kern_req_numel(op, "ids", ids, N);
    kern_compute(s, op, KERN_OP_EMBEDDING, dout->dtype)
        ->embedding_bwd(s, dtable, dout, ids, vocab_start);
}

/* ---- RMSNorm -------------------------------------------------------------- */

void kern_rmsnorm_fwd(kern_stream_t *s, tensor_t *out, tensor_t *rstd, const tensor_t *x,
                      const tensor_t *w, float eps)
{
    const char *op = "kern_rmsnorm_fwd";
    kern_req(s, op, "out", out);
    kern_req(s, op, "rstd", rstd);
    kern_req(s, op, "x", x);
    kern_req(s, op, "w", w);
    kern_req_same_shape(op, "out", out, "x", x);
    kern_req_dtype(op, "x", x, out->dtype);
    kern_req_dtype(op, "w", w, out->dtype);
    kern_req_dtype(op, "rstd", rstd, DT_F32);
    int64_t N = tensor_rows(x), C = tensor_cols(x);
    kern_req_numel(op, "w", w, C);
    kern_req_numel(op, "rstd", rstd, N);
    kern_compute(s, op, KERN_OP_RMSNORM, out->dtype)->rmsnorm_fwd(s, out, rstd, x, w, eps);
}

void kern_add_rmsnorm_fwd(kern_stream_t *s, tensor_t *xout, tensor_t *ln, tensor_t *rstd,
                          const tensor_t *x, const tensor_t *y, const tensor_t *w, float eps)
{
    const char *op = "kern_add_rmsnorm_fwd";
    kern_req(s, op, "xout", xout);
    kern_req(s, op, "ln", ln);
    kern_req(s, op, "rstd", rstd);
    kern_req(s, op, "x", x);
    kern_req(s, op, "y", y);
    kern_req(s, op, "w", w);
    kern_req_same_shape(op, "x", x, "xout", xout);
    kern_req_same_shape(op, "y", y, "xout", xout);
    kern_req_same_shape(op, "ln", ln, "xout", xout);
    kern_req_dtype(op, "x", x, xout->dtype);
    kern_req_dtype(op, "y", y, xout->dtype);
    kern_req_dtype(op, "ln", ln, xout->dtype);
    kern_req_dtype(op, "w", w, xout->dtype);
    kern_req_dtype(op, "rstd", rstd, DT_F32);
    int64_t N = tensor_rows(xout), C = tensor_cols(xout);
    kern_req_numel(op, "w", w, C);
    kern_req_numel(op, "rstd", rstd, N);
    if (ln->data && (ln->data == xout->data || ln->data == x->data || ln->data == y->data))
        BT_PANIC("%s: ln aliases xout, x or y", op);
    kern_compute(s, op, KERN_OP_RMSNORM, xout->dtype)
        ->add_rmsnorm_fwd(s, xout, ln, rstd, x, y, w, eps);
}

void kern_rmsnorm_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, const tensor_t *dout,
                      const tensor_t *x, const tensor_t *w, const tensor_t *rstd)
{
    const char *op = "kern_rmsnorm_bwd";
    kern_req(s, op, "dout", dout);
    kern_req(s, op, "x", x);
    kern_req(s, op, "w", w);
    kern_req(s, op, "rstd", rstd);
    kern_req_same_shape(op, "dout", dout, "x", x);
    kern_req_dtype(op, "x", x, dout->dtype);
    kern_req_dtype(op, "w", w, dout->dtype);
    kern_req_dtype(op, "rstd", rstd, DT_F32);
    int64_t N = tensor_rows(x), C = tensor_cols(x);
    kern_req_numel(op, "w", w, C);
    kern_req_numel(op, "rstd", rstd, N);
    if (dx) {
        kern_req(s, op, "dx", dx);
        kern_req_dtype(op, "dx", dx, dout->dtype);
        kern_req_numel(op, "dx", dx, N * C);
    }
    if (dw) {
        kern_req(s, op, "dw", dw);
        kern_req_grad_dtype(op, "dw", dw, dout->dtype);
        kern_req_numel(op, "dw", dw, C);
    }
    kern_compute(s, op, KERN_OP_RMSNORM, dout->dtype)->rmsnorm_bwd(s, dx, dw, dout, x, w, rstd);
}

/* ---- rotary embeddings ---------------------------------------------------- */

/* x is [B,T,H,D] (or [B*T,H,D]); the tables [P, D/2] f32; pos [B*T] i32. */
static void kern_rope_check(kern_stream_t *s, const char *op, const tensor_t *x,
                            const tensor_t *cos, const tensor_t *sin, const tensor_t *pos,
                            int64_t *BT, int64_t *H, int64_t *D, int64_t *P)
{
    if (x->ndim != 3 && x->ndim != 4)
        BT_PANIC("%s: x %s must be [B,T,H,D] or [B*T,H,D]", op, kern_shape_str(x).s);
    *D = x->shape[x->ndim - 1];
    *H = x->shape[x->ndim - 2];
    *BT = tensor_numel(x) / (*D * *H > 0 ? *D * *H : 1);
    if (*D % 2) BT_PANIC("%s: head dim %lld is odd", op, (long long)*D);
    kern_req(s, op, "cos", cos);
    kern_req(s, op, "sin", sin);
    kern_req(s, op, "pos", pos);
    kern_req_dtype(op, "cos", cos, DT_F32);
    kern_req_dtype(op, "sin", sin, DT_F32);
    kern_req_dtype(op, "pos", pos, DT_I32);
    kern_req_ndim(op, "cos", cos, 2);
    *P = cos->shape[0];
    kern_req_rows_cols(op, "cos", cos, *P, *D / 2);
    kern_req_same_shape(op, "sin", sin, "cos", cos);
    kern_req_numel(op, "pos", pos, *BT);
}

void kern_rope_fwd(kern_stream_t *s, tensor_t *out, const tensor_t *x, const tensor_t *cos,
                   const tensor_t *sin, const tensor_t *pos)
{
    const char *op = "kern_rope_fwd";
    kern_req(s, op, "x", x);
    kern_req(s, op, "out", out);
    kern_req_same_shape(op, "out", out, "x", x);
    kern_req_dtype(op, "out", out, x->dtype);
    int64_t BT, H, D, P;
    kern_rope_check(s, op, x, cos, sin, pos, &BT, &H, &D, &P);
    kern_compute(s, op, KERN_OP_ROPE, x->dtype)->rope_fwd(s, out, x, cos, sin, pos);
}

static void rope_bwd(kern_stream_t *s, const char *op, bool set, tensor_t *dx,
                     const tensor_t *dout, const tensor_t *cos, const tensor_t *sin,
                     const tensor_t *pos)
{
    kern_req(s, op, "dout", dout);
    kern_req(s, op, "dx", dx);
    kern_req_same_shape(op, "dx", dx, "dout", dout);
    kern_req_dtype(op, "dx", dx, dout->dtype);
    int64_t BT, H, D, P;
    kern_rope_check(s, op, dout, cos, sin, pos, &BT, &H, &D, &P);
    if (set) kern_req_no_alias(op, "dx", dx, dout);
    kern_compute(s, op, KERN_OP_ROPE, dout->dtype)->rope_bwd(s, dx, dout, cos, sin, pos, set);
}

void kern_rope_bwd(kern_stream_t *s, tensor_t *dx, const tensor_t *dout, const tensor_t *cos,
                   const tensor_t *sin, const tensor_t *pos)
{
    rope_bwd(s, "kern_rope_bwd", false, dx, dout, cos, sin, pos);
}

void kern_rope_bwd_set(kern_stream_t *s, tensor_t *dx, const tensor_t *dout, const tensor_t *cos,
                       const tensor_t *sin, const tensor_t *pos)
{
    rope_bwd(s, "kern_rope_bwd_set", true, dx, dout, cos, sin, pos);
}

/* ---- attention ------------------------------------------------------------ */

static kern_attn_shape_t kern_attn_check(kern_stream_t *s, const char *op, const tensor_t *q,
                                         const tensor_t *k, const tensor_t *v, const tensor_t *out,
                                         const tensor_t *lse, float scale, bool causal,
                                         int64_t q_offset)
{
    kern_req(s, op, "q", q);
    kern_req(s, op, "k", k);
    kern_req(s, op, "v", v);
    kern_req(s, op, "out", out);
    kern_req(s, op, "lse", lse);
    kern_req_ndim(op, "q", q, 4);
    kern_req_ndim(op, "k", k, 4);
    kern_req_ndim(op, "v", v, 4);
    kern_req_ndim(op, "out", out, 4);
    kern_req_dtype(op, "k", k, q->dtype);
    kern_req_dtype(op, "v", v, q->dtype);
    kern_req_dtype(op, "out", out, q->dtype);
    kern_req_dtype(op, "lse", lse, DT_F32);
    kern_attn_shape_t sh = {
        .B = q->shape[0],
        .Tq = q->shape[1],
        .Hq = q->shape[2],
        .D = q->shape[3],
        .Tk = k->shape[1],
        .Hkv = k->shape[2],
        .Dv = v->shape[3],
        .scale = scale,
        .causal = causal,
        .q_offset = q_offset,
    };
    if (k->shape[0] != sh.B || k->shape[3] != sh.D)
        BT_PANIC("%s: k %s does not fit q %s (batch and head dim must match)", op,
                 kern_shape_str(k).s, kern_shape_str(q).s);
    if (v->shape[0] != sh.B || v->shape[1] != sh.Tk || v->shape[2] != sh.Hkv)
        BT_PANIC("%s: v %s does not fit k %s", op, kern_shape_str(v).s, kern_shape_str(k).s);
    if (out->shape[0] != sh.B || out->shape[1] != sh.Tq || out->shape[2] != sh.Hq ||
        out->shape[3] != sh.Dv)
        BT_PANIC("%s: out %s is not [B,Tq,Hq,Dv] = [%lld,%lld,%lld,%lld]", op,
                 kern_shape_str(out).s, (long long)sh.B, (long long)sh.Tq, (long long)sh.Hq,
                 (long long)sh.Dv);
    if (sh.Hkv < 1 || sh.Hq % sh.Hkv)
        BT_PANIC("%s: %lld query heads are not a multiple of %lld kv heads", op, (long long)sh.Hq,
                 (long long)sh.Hkv);
    if (sh.Tk < 1 && sh.Tq > 0) BT_PANIC("%s: no keys (k %s)", op, kern_shape_str(k).s);
    if (q_offset < 0) BT_PANIC("%s: negative q_offset %lld", op, (long long)q_offset);
    if (lse->ndim == 3) {
        if (lse->shape[0] != sh.B || lse->shape[1] != sh.Hq || lse->shape[2] != sh.Tq)
            BT_PANIC("%s: lse %s is not [B,Hq,Tq]", op, kern_shape_str(lse).s);
    } else {
        kern_req_numel(op, "lse", lse, sh.B * sh.Hq * sh.Tq);
    }
    return sh;
}

/* A sliding window needs the causal mask over the whole key range: the
 * queries are the last Tq of the Tk keys (self-attention, or decoding with
 * the cache before them). */
static void kern_attn_window(const char *op, kern_attn_shape_t *sh, int64_t window)
{
    if (window < 0 || (window > 0 && (!sh->causal || sh->q_offset + sh->Tq != sh->Tk)))
        BT_PANIC("%s: sliding window %lld needs causal attention with q_offset + Tq == Tk "
                 "(got causal %d, q_offset %lld, Tq %lld, Tk %lld)", op, (long long)window,
                 (int)sh->causal, (long long)sh->q_offset, (long long)sh->Tq, (long long)sh->Tk);
    sh->window = window;
}

void kern_attention_fwd(kern_stream_t *s, tensor_t *out, tensor_t *lse, const tensor_t *q,
                        const tensor_t *k, const tensor_t *v, float scale, bool causal,
                        int64_t q_offset)
{
    kern_attention_fwd_window(s, out, lse, q, k, v, scale, causal, q_offset, 0);
}

void kern_attention_fwd_window(kern_stream_t *s, tensor_t *out, tensor_t *lse, const tensor_t *q,
                               const tensor_t *k, const tensor_t *v, float scale, bool causal,
                               int64_t q_offset, int64_t window)
{
    const char *op = "kern_attention_fwd";
    kern_attn_shape_t sh = kern_attn_check(s, op, q, k, v, out, lse, scale, causal, q_offset);
    kern_attn_window(op, &sh, window);
    kern_compute(s, op, KERN_OP_ATTENTION, q->dtype)->attention_fwd(s, out, lse, q, k, v, &sh);
}

void kern_attention_merge(kern_stream_t *s, tensor_t *out, tensor_t *lse,
                          const tensor_t *part_out, const tensor_t *part_lse)
{
    const char *op = "kern_attention_merge";
    kern_req(s, op, "out", out);
    kern_req(s, op, "lse", lse);
    kern_req(s, op, "part_out", part_out);
    kern_req(s, op, "part_lse", part_lse);
    kern_req_ndim(op, "out", out, 4);
    kern_req_ndim(op, "lse", lse, 3);
    kern_req_same_shape(op, "part_out", part_out, "out", out);
    kern_req_same_shape(op, "part_lse", part_lse, "lse", lse);
    kern_req_dtype(op, "part_out", part_out, out->dtype);
    kern_req_dtype(op, "lse", lse, DT_F32);
    kern_req_dtype(op, "part_lse", part_lse, DT_F32);
    if (lse->shape[0] != out->shape[0] || lse->shape[1] != out->shape[2] ||
        lse->shape[2] != out->shape[1])
        BT_PANIC("%s: lse %s is not [B,Hq,Tq] of out %s", op, kern_shape_str(lse).s,
                 kern_shape_str(out).s);
    kern_compute(s, op, KERN_OP_ATTENTION, out->dtype)
        ->attention_merge(s, out, lse, part_out, part_lse);
}

static void attention_bwd(kern_stream_t *s, const char *op, bool set, tensor_t *dq, tensor_t *dk,
                          tensor_t *dv, const tensor_t *dout, const tensor_t *q, const tensor_t *k,
                          const tensor_t *v, const tensor_t *out, const tensor_t *lse, float scale,
                          bool causal, int64_t q_offset, int64_t window)
{
    kern_attn_shape_t sh = kern_attn_check(s, op, q, k, v, out, lse, scale, causal, q_offset);
    kern_attn_window(op, &sh, window);
    kern_req(s, op, "dout", dout);
    kern_req_same_shape(op, "dout", dout, "out", out);
    kern_req_dtype(op, "dout", dout, q->dtype);
    if (dq) {
        kern_req(s, op, "dq", dq);
        kern_req_same_shape(op, "dq", dq, "q", q);
        kern_req_dtype(op, "dq", dq, q->dtype);
    }
    if (dk) {
        kern_req(s, op, "dk", dk);
        kern_req_same_shape(op, "dk", dk, "k", k);
        kern_req_dtype(op, "dk", dk, q->dtype);
    }
    if (dv) {
        kern_req(s, op, "dv", dv);
        kern_req_same_shape(op, "dv", dv, "v", v);
        kern_req_dtype(op, "dv", dv, q->dtype);
    }
    if (set) {
        const tensor_t *in[] = {dout, q, k, v, out};
        for (int i = 0; i < 5; i++) {
            kern_req_no_alias(op, "dq", dq, in[i]);
            kern_req_no_alias(op, "dk", dk, in[i]);
            kern_req_no_alias(op, "dv", dv, in[i]);
        }
    }
    kern_compute(s, op, KERN_OP_ATTENTION, q->dtype)
        ->attention_bwd(s, dq, dk, dv, dout, q, k, v, out, lse, &sh, set);
}

void kern_attention_bwd(kern_stream_t *s, tensor_t *dq, tensor_t *dk, tensor_t *dv,
                        const tensor_t *dout, const tensor_t *q, const tensor_t *k,
                        const tensor_t *v, const tensor_t *out, const tensor_t *lse, float scale,
                        bool causal, int64_t q_offset)
{
    attention_bwd(s, "kern_attention_bwd", false, dq, dk, dv, dout, q, k, v, out, lse, scale,
                  causal, q_offset, 0);
}

void kern_attention_bwd_set(kern_stream_t *s, tensor_t *dq, tensor_t *dk, tensor_t *dv,
                            const tensor_t *dout, const tensor_t *q, const tensor_t *k,
                            const tensor_t *v, const tensor_t *out, const tensor_t *lse,
                            float scale, bool causal, int64_t q_offset)
{
    attention_bwd(s, "kern_attention_bwd_set", true, dq, dk, dv, dout, q, k, v, out, lse, scale,
                  causal, q_offset, 0);
}

void kern_attention_bwd_set_window(kern_stream_t *s, tensor_t *dq, tensor_t *dk, tensor_t *dv,
                                   const tensor_t *dout, const tensor_t *q, const tensor_t *k,
                                   const tensor_t *v, const tensor_t *out, const tensor_t *lse,
                                   float scale, bool causal, int64_t q_offset, int64_t window)
{
    attention_bwd(s, "kern_attention_bwd_set", true, dq, dk, dv, dout, q, k, v, out, lse, scale,
                  causal, q_offset, window);
}

/* ---- MLP ------------------------------------------------------------------ */

void kern_swiglu_fwd(kern_stream_t *s, tensor_t *out, const tensor_t *gate, const tensor_t *up)
{
    const char *op = "kern_swiglu_fwd";
    kern_req(s, op, "out", out);
    kern_req(s, op, "gate", gate);
    kern_req(s, op, "up", up);
    kern_req_dtype(op, "gate", gate, out->dtype);
    kern_req_dtype(op, "up", up, out->dtype);
    kern_req_numel(op, "gate", gate, tensor_numel(out));
    kern_req_numel(op, "up", up, tensor_numel(out));
    kern_compute(s, op, KERN_OP_SWIGLU, out->dtype)->swiglu_fwd(s, out, gate, up);
}

static void swiglu_bwd(kern_stream_t *s, const char *op, bool set, tensor_t *dgate, tensor_t *dup,
                       const tensor_t *dout, const tensor_t *gate, const tensor_t *up)
{
    kern_req(s, op, "dout", dout);
    kern_req(s, op, "gate", gate);
    kern_req(s, op, "up", up);
    int64_t n = tensor_numel(dout);
    kern_req_dtype(op, "gate", gate, dout->dtype);
    kern_req_dtype(op, "up", up, dout->dtype);
    kern_req_numel(op, "gate", gate, n);
    kern_req_numel(op, "up", up, n);
    if (dgate) {
        kern_req(s, op, "dgate", dgate);
        kern_req_dtype(op, "dgate", dgate, dout->dtype);
        kern_req_numel(op, "dgate", dgate, n);
    }
    if (dup) {
        kern_req(s, op, "dup", dup);
        kern_req_dtype(op, "dup", dup, dout->dtype);
        kern_req_numel(op, "dup", dup, n);
    }
    if (set) {
        const tensor_t *in[] = {dout, gate, up};
        for (int i = 0; i < 3; i++) {
            kern_req_no_alias(op, "dgate", dgate, in[i]);
            kern_req_no_alias(op, "dup", dup, in[i]);
        }
    }
    kern_compute(s, op, KERN_OP_SWIGLU, dout->dtype)
        ->swiglu_bwd(s, dgate, dup, dout, gate, up, set);
}

void kern_swiglu_bwd(kern_stream_t *s, tensor_t *dgate, tensor_t *dup, const tensor_t *dout,
                     const tensor_t *gate, const tensor_t *up)
{
    swiglu_bwd(s, "kern_swiglu_bwd", false, dgate, dup, dout, gate, up);
}

void kern_swiglu_bwd_set(kern_stream_t *s, tensor_t *dgate, tensor_t *dup, const tensor_t *dout,
                         const tensor_t *gate, const tensor_t *up)
{
    swiglu_bwd(s, "kern_swiglu_bwd_set", true, dgate, dup, dout, gate, up);
}

void kern_relu2_fwd(kern_stream_t *s, tensor_t *out, const tensor_t *x)
{
    const char *op = "kern_relu2_fwd";
    kern_req(s, op, "out", out);
    kern_req(s, op, "x", x);
    kern_req_dtype(op, "x", x, out->dtype);
    kern_req_numel(op, "x", x, tensor_numel(out));
    kern_compute(s, op, KERN_OP_RELU2, out->dtype)->relu2_fwd(s, out, x);
}

static void relu2_bwd(kern_stream_t *s, const char *op, bool set, tensor_t *dx,
                      const tensor_t *dout, const tensor_t *x)
{
    kern_req(s, op, "dx", dx);
    kern_req(s, op, "dout", dout);
    kern_req(s, op, "x", x);
    kern_req_dtype(op, "dout", dout, dx->dtype);
    kern_req_dtype(op, "x", x, dx->dtype);
    kern_req_numel(op, "dout", dout, tensor_numel(dx));
    kern_req_numel(op, "x", x, tensor_numel(dx));
    kern_compute(s, op, KERN_OP_RELU2, dx->dtype)->relu2_bwd(s, dx, dout, x, set);
}

void kern_relu2_bwd(kern_stream_t *s, tensor_t *dx, const tensor_t *dout, const tensor_t *x)
{
    relu2_bwd(s, "kern_relu2_bwd", false, dx, dout, x);
}

void kern_relu2_bwd_set(kern_stream_t *s, tensor_t *dx, const tensor_t *dout, const tensor_t *x)
{
    relu2_bwd(s, "kern_relu2_bwd_set", true, dx, dout, x);
}

/* ---- loss ----------------------------------------------------------------- */

/* logits [N,V]; targets [N] i32; each per-row f32 vector given has N elements. */
static void kern_xent_rows(kern_stream_t *s, const char *op, const tensor_t *logits,
                           const tensor_t *targets)
{
    kern_req(s, op, "logits", logits);
    kern_req(s, op, "targets", targets);
    kern_req_dtype(op, "targets", targets, DT_I32);
    kern_req_numel(op, "targets", targets, tensor_rows(logits));
}

static void kern_xent_vec(kern_stream_t *s, const char *op, const char *name, const tensor_t *t,
                          const tensor_t *logits)
{
    kern_req(s, op, name, t);
    kern_req_dtype(op, name, t, DT_F32);
    kern_req_numel(op, name, t, tensor_rows(logits));
}

static void kern_xent_dlogits(kern_stream_t *s, const char *op, const tensor_t *dlogits,
                              const tensor_t *logits)
{
    kern_req(s, op, "dlogits", dlogits);
    kern_req_dtype(op, "dlogits", dlogits, logits->dtype);
    kern_req_same_shape(op, "dlogits", dlogits, "logits", logits);
}

void kern_xent_fwd_bwd(kern_stream_t *s, tensor_t *losses, tensor_t *dlogits,
                       const tensor_t *logits, const tensor_t *targets, float dloss,
                       int32_t ignore_index)
{
    const char *op = "kern_xent_fwd_bwd";
    kern_xent_rows(s, op, logits, targets);
    kern_xent_vec(s, op, "losses", losses, logits);
    if (dlogits) kern_xent_dlogits(s, op, dlogits, logits);
    if (tensor_cols(logits) < 1) BT_PANIC("%s: empty vocabulary", op);
    kern_compute(s, op, KERN_OP_XENT, logits->dtype)
        ->xent_fwd_bwd(s, losses, dlogits, logits, targets, dloss, ignore_index);
}

void kern_xent_vp_max(kern_stream_t *s, tensor_t *row_max, const tensor_t *logits)
{
    const char *op = "kern_xent_vp_max";
    kern_req(s, op, "logits", logits);
    kern_xent_vec(s, op, "row_max", row_max, logits);
    if (tensor_cols(logits) < 1) BT_PANIC("%s: empty vocabulary shard", op);
    kern_compute(s, op, KERN_OP_XENT, logits->dtype)->xent_vp_max(s, row_max, logits);
}

void kern_xent_vp_sum(kern_stream_t *s, tensor_t *sumexp, tensor_t *tgt_logit,
                      const tensor_t *logits, const tensor_t *gmax, const tensor_t *targets,
                      int64_t vocab_start, int32_t ignore_index)
{
    const char *op = "kern_xent_vp_sum";
    kern_xent_rows(s, op, logits, targets);
    kern_xent_vec(s, op, "sumexp", sumexp, logits);
    kern_xent_vec(s, op, "tgt_logit", tgt_logit, logits);
    kern_xent_vec(s, op, "gmax", gmax, logits);
    kern_compute(s, op, KERN_OP_XENT, logits->dtype)
        ->xent_vp_sum(s, sumexp, tgt_logit, logits, gmax, targets, vocab_start, ignore_index);
}

void kern_xent_vp_finish(kern_stream_t *s, tensor_t *losses, tensor_t *dlogits,
                         const tensor_t *logits, const tensor_t *gmax, const tensor_t *sumexp,
                         const tensor_t *tgt_logit, const tensor_t *targets, int64_t vocab_start,
                         float dloss, int32_t ignore_index)
{
    const char *op = "kern_xent_vp_finish";
    kern_xent_rows(s, op, logits, targets);
    if (losses) kern_xent_vec(s, op, "losses", losses, logits);
    if (dlogits) kern_xent_dlogits(s, op, dlogits, logits);
    kern_xent_vec(s, op, "gmax", gmax, logits);
    kern_xent_vec(s, op, "sumexp", sumexp, logits);
    kern_xent_vec(s, op, "tgt_logit", tgt_logit, logits);
    kern_compute(s, op, KERN_OP_XENT, logits->dtype)
        ->xent_vp_finish(s, losses, dlogits, logits, gmax, sumexp, tgt_logit, targets, vocab_start,
                         dloss, ignore_index);
}

/* ---- optimizer ------------------------------------------------------------ */

void kern_adamw(kern_stream_t *s, tensor_t *param, tensor_t *param_copy, const tensor_t *grad,
                tensor_t *m, tensor_t *v, const adamw_args_t *args)
{
    const char *op = "kern_adamw";
    kern_req(s, op, "param", param);
    kern_req(s, op, "grad", grad);
    kern_req(s, op, "m", m);
    kern_req(s, op, "v", v);
    int64_t n = tensor_numel(param);
    if (param_copy) {
        kern_req(s, op, "param_copy", param_copy);
        kern_req_numel(op, "param_copy", param_copy, n);
        if (!dtype_is_float(param_copy->dtype))
            BT_PANIC("%s: param_copy is %s", op, dtype_name(param_copy->dtype));
    }
    kern_req_grad_dtype(op, "grad", grad, param->dtype);
    kern_req_dtype(op, "m", m, DT_F32);
    kern_req_dtype(op, "v", v, DT_F32);
    kern_req_numel(op, "grad", grad, n);
    kern_req_numel(op, "m", m, n);
    kern_req_numel(op, "v", v, n);
    if (!args) BT_PANIC("%s: args is NULL", op);
    if (args->step < 1) BT_PANIC("%s: step %lld is not 1-based", op, (long long)args->step);
    kern_compute(s, op, KERN_OP_ADAMW, param->dtype)->adamw(s, param, param_copy, grad, m, v, args);
}

/* ---- mixture of experts --------------------------------------------------- */

/* experts[N,K] i32 for N rows; returns K. */
static int64_t kern_moe_choices(kern_stream_t *s, const char *op, const tensor_t *experts,
                                int64_t N)
{
    kern_req(s, op, "experts", experts);
    kern_req_ndim(op, "experts", experts, 2);
    kern_req_dtype(op, "experts", experts, DT_I32);
    if (experts->shape[0] != N)
        BT_PANIC("%s: experts %s has %lld rows, expected %lld", op, kern_shape_str(experts).s,
                 (long long)experts->shape[0], (long long)N);
    if (experts->shape[1] < 1) BT_PANIC("%s: experts %s chooses none", op, kern_shape_str(experts).s);
    return experts->shape[1];
}

void kern_moe_route_fwd(kern_stream_t *s, tensor_t *weights, tensor_t *experts, tensor_t *probs,
                        const tensor_t *logits, bool norm)
{
    const char *op = "kern_moe_route_fwd";
    kern_req(s, op, "logits", logits);
    kern_req(s, op, "probs", probs);
    kern_req(s, op, "weights", weights);
    kern_req_ndim(op, "logits", logits, 2);
    int64_t N = logits->shape[0], E = logits->shape[1];
    int64_t K = kern_moe_choices(s, op, experts, N);
    if (K > E) BT_PANIC("%s: top-%lld of %lld experts", op, (long long)K, (long long)E);
    kern_req_dtype(op, "probs", probs, DT_F32);
    kern_req_rows_cols(op, "probs", probs, N, E);
    kern_req_dtype(op, "weights", weights, DT_F32);
    kern_req_rows_cols(op, "weights", weights, N, K);
    kern_compute(s, op, KERN_OP_MOE_ROUTE, logits->dtype)
        ->moe_route_fwd(s, weights, experts, probs, logits, norm);
}

void kern_moe_route_bwd(kern_stream_t *s, tensor_t *dlogits, const tensor_t *dweights,
                        const tensor_t *dprobs, const tensor_t *probs, const tensor_t *experts,
                        bool norm)
{
    const char *op = "kern_moe_route_bwd";
    kern_req(s, op, "dlogits", dlogits);
    kern_req(s, op, "probs", probs);
    kern_req_ndim(op, "probs", probs, 2);
    kern_req_dtype(op, "probs", probs, DT_F32);
    int64_t N = probs->shape[0], E = probs->shape[1];
    int64_t K = kern_moe_choices(s, op, experts, N);
    kern_req_rows_cols(op, "dlogits", dlogits, N, E);
    if (dweights) {
        kern_req(s, op, "dweights", dweights);
        kern_req_dtype(op, "dweights", dweights, DT_F32);
        kern_req_rows_cols(op, "dweights", dweights, N, K);
    }
    if (dprobs) {
        kern_req(s, op, "dprobs", dprobs);
        kern_req_dtype(op, "dprobs", dprobs, DT_F32);
        kern_req_numel(op, "dprobs", dprobs, E);
    }
    kern_compute(s, op, KERN_OP_MOE_ROUTE, dlogits->dtype)
        ->moe_route_bwd(s, dlogits, dweights, dprobs, probs, experts, norm);
}

void kern_moe_route_stats(kern_stream_t *s, tensor_t *counts, tensor_t *psum,
                          const tensor_t *probs, const tensor_t *experts)
{
    const char *op = "kern_moe_route_stats";
    kern_req(s, op, "counts", counts);
    kern_req(s, op, "psum", psum);
    kern_req(s, op, "probs", probs);
    kern_req_ndim(op, "probs", probs, 2);
    kern_req_dtype(op, "probs", probs, DT_F32);
    int64_t N = probs->shape[0], E = probs->shape[1];
    kern_moe_choices(s, op, experts, N);
    kern_req_dtype(op, "counts", counts, DT_F32);
    kern_req_numel(op, "counts", counts, E);
    kern_req_dtype(op, "psum", psum, DT_F32);
    kern_req_numel(op, "psum", psum, E);
    kern_compute(s, op, KERN_OP_MOE_ROUTE, DT_F32)->moe_route_stats(s, counts, psum, probs, experts);
}

void kern_moe_route_reselect(kern_stream_t *s, tensor_t *weights, tensor_t *experts,
                             const tensor_t *probs, const tensor_t *bias, bool norm)
{
    const char *op = "kern_moe_route_reselect";
    kern_req(s, op, "weights", weights);
    kern_req(s, op, "probs", probs);
    kern_req(s, op, "bias", bias);
    kern_req_ndim(op, "probs", probs, 2);
    kern_req_dtype(op, "probs", probs, DT_F32);
    int64_t N = probs->shape[0], E = probs->shape[1];
    int64_t K = kern_moe_choices(s, op, experts, N);
    if (K > E) BT_PANIC("%s: top-%lld of %lld experts", op, (long long)K, (long long)E);
    kern_req_dtype(op, "weights", weights, DT_F32);
    kern_req_rows_cols(op, "weights", weights, N, K);
    kern_req_dtype(op, "bias", bias, DT_F32);
    kern_req_numel(op, "bias", bias, E);
    kern_compute(s, op, KERN_OP_MOE_RESELECT, DT_F32)
        ->moe_route_reselect(s, weights, experts, probs, bias, norm);
}

static void permute_fwd(kern_stream_t *s, tensor_t *xp, tensor_t *slot, tensor_t *sizes,
                        tensor_t *routed, const tensor_t *x, const tensor_t *experts,
                        int64_t capacity, const tensor_t *caps)
{
    const char *op = "kern_moe_permute_fwd";
    kern_req(s, op, "xp", xp);
    kern_req(s, op, "slot", slot);
    kern_req(s, op, "sizes", sizes);
    kern_req(s, op, "routed", routed);
    kern_req(s, op, "x", x);
    int64_t N = tensor_rows(x), C = tensor_cols(x);
    int64_t K = kern_moe_choices(s, op, experts, N);
    kern_req_dtype(op, "xp", xp, x->dtype);
    kern_req_rows_cols(op, "xp", xp, N * K, C);
    kern_req_dtype(op, "slot", slot, DT_I32);
    kern_req_same_shape(op, "slot", slot, "experts", experts);
    kern_req_dtype(op, "sizes", sizes, DT_I32);
    kern_req_dtype(op, "routed", routed, DT_I32);
    if (tensor_numel(sizes) < 1) BT_PANIC("%s: sizes %s holds no expert", op, kern_shape_str(sizes).s);
    kern_req_numel(op, "routed", routed, tensor_numel(sizes));
    if (caps) {
        kern_req(s, op, "caps", caps);
        kern_req_dtype(op, "caps", caps, DT_I32);
        kern_req_numel(op, "caps", caps, tensor_numel(sizes));
    }
    kern_compute(s, op, KERN_OP_MOE_PERMUTE, x->dtype)
        ->moe_permute_fwd(s, xp, slot, sizes, routed, x, experts, capacity, caps);
}

void kern_moe_permute_fwd(kern_stream_t *s, tensor_t *xp, tensor_t *slot, tensor_t *sizes,
                          tensor_t *routed, const tensor_t *x, const tensor_t *experts,
                          int64_t capacity)
{
    permute_fwd(s, xp, slot, sizes, routed, x, experts, capacity, NULL);
}

void kern_moe_permute_fwd_caps(kern_stream_t *s, tensor_t *xp, tensor_t *slot, tensor_t *sizes,
                               tensor_t *routed, const tensor_t *x, const tensor_t *experts,
                               const tensor_t *caps)
{
    if (!caps) BT_PANIC("kern_moe_permute_fwd_caps: caps is NULL");
    permute_fwd(s, xp, slot, sizes, routed, x, experts, -1, caps);
}

/* slot[N,K] i32 for N rows; returns K. */
static int64_t kern_moe_slots(kern_stream_t *s, const char *op, const tensor_t *slot, int64_t N)
{
    kern_req(s, op, "slot", slot);
    kern_req_ndim(op, "slot", slot, 2);
    kern_req_dtype(op, "slot", slot, DT_I32);
    if (slot->shape[0] != N)
        BT_PANIC("%s: slot %s has %lld rows, expected %lld", op, kern_shape_str(slot).s,
                 (long long)slot->shape[0], (long long)N);
    return slot->shape[1];
}

void kern_moe_permute_bwd(kern_stream_t *s, tensor_t *dx, const tensor_t *dxp, const tensor_t *slot)
{
    const char *op = "kern_moe_permute_bwd";
    kern_req(s, op, "dx", dx);
    kern_req(s, op, "dxp", dxp);
    int64_t N = tensor_rows(dx), C = tensor_cols(dx);
    int64_t K = kern_moe_slots(s, op, slot, N);
    kern_req_dtype(op, "dxp", dxp, dx->dtype);
    kern_req_rows_cols(op, "dxp", dxp, N * K, C);
    kern_compute(s, op, KERN_OP_MOE_PERMUTE, dx->dtype)->moe_permute_bwd(s, dx, dxp, slot);
}

void kern_moe_combine_fwd(kern_stream_t *s, tensor_t *y, const tensor_t *yp, const tensor_t *slot,
                          const tensor_t *weights)
{
    const char *op = "kern_moe_combine_fwd";
    kern_req(s, op, "y", y);
    kern_req(s, op, "yp", yp);
    kern_req(s, op, "weights", weights);
    int64_t N = tensor_rows(y), C = tensor_cols(y);
    int64_t K = kern_moe_slots(s, op, slot, N);
    kern_req_dtype(op, "yp", yp, y->dtype);
    kern_req_rows_cols(op, "yp", yp, N * K, C);
    kern_req_dtype(op, "weights", weights, DT_F32);
    kern_req_same_shape(op, "weights", weights, "slot", slot);
    if (y->data && y->data == yp->data) BT_PANIC("%s: y aliases yp", op);
    kern_compute(s, op, KERN_OP_MOE_COMBINE, y->dtype)->moe_combine_fwd(s, y, yp, slot, weights);
}

void kern_moe_combine_bwd(kern_stream_t *s, tensor_t *dyp, tensor_t *dweights, const tensor_t *dy,
                          const tensor_t *yp, const tensor_t *slot, const tensor_t *weights)
{
    const char *op = "kern_moe_combine_bwd";
    kern_req(s, op, "dy", dy);
    kern_req(s, op, "yp", yp);
    kern_req(s, op, "weights", weights);
    int64_t N = tensor_rows(dy), C = tensor_cols(dy);
    int64_t K = kern_moe_slots(s, op, slot, N);
    kern_req_dtype(op, "yp", yp, dy->dtype);
    kern_req_rows_cols(op, "yp", yp, N * K, C);
    kern_req_dtype(op, "weights", weights, DT_F32);
    kern_req_same_shape(op, "weights", weights, "slot", slot);
    if (dyp) {
        kern_req(s, op, "dyp", dyp);
        kern_req_dtype(op, "dyp", dyp, dy->dtype);
        kern_req_same_shape(op, "dyp", dyp, "yp", yp);
    }
    if (dweights) {
        kern_req(s, op, "dweights", dweights);
        kern_req_dtype(op, "dweights", dweights, DT_F32);
        kern_req_same_shape(op, "dweights", dweights, "slot", slot);
    }
    kern_compute(s, op, KERN_OP_MOE_COMBINE, dy->dtype)
        ->moe_combine_bwd(s, dyp, dweights, dy, yp, slot, weights);
}

/* gate [N] or [N,1] for x's N rows */
static void kern_gate_check(kern_stream_t *s, const char *op, const tensor_t *gate,
                            const tensor_t *x)
{
    kern_req(s, op, "gate", gate);
    kern_req(s, op, "x", x);
    kern_req_dtype(op, "gate", gate, x->dtype);
    kern_req_numel(op, "gate", gate, tensor_rows(x));
    if (gate->ndim > 2 || (gate->ndim == 2 && gate->shape[1] != 1))
        BT_PANIC("%s: gate %s is not [N] or [N,1]", op, kern_shape_str(gate).s);
}

void kern_sigmoid_gate_fwd(kern_stream_t *s, tensor_t *out, const tensor_t *gate,
                           const tensor_t *x)
{
    const char *op = "kern_sigmoid_gate_fwd";
    kern_req(s, op, "out", out);
    kern_gate_check(s, op, gate, x);
    kern_req_dtype(op, "out", out, x->dtype);
    kern_req_same_shape(op, "out", out, "x", x);
    kern_compute(s, op, KERN_OP_MOE_COMBINE, x->dtype)->sigmoid_gate_fwd(s, out, gate, x);
}

void kern_sigmoid_gate_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dgate, const tensor_t *dout,
                           const tensor_t *gate, const tensor_t *x)
{
    const char *op = "kern_sigmoid_gate_bwd";
    kern_req(s, op, "dout", dout);
    kern_gate_check(s, op, gate, x);
    kern_req_dtype(op, "dout", dout, x->dtype);
    kern_req_same_shape(op, "dout", dout, "x", x);
    if (dx) {
        kern_req(s, op, "dx", dx);
        kern_req_dtype(op, "dx", dx, x->dtype);
        kern_req_same_shape(op, "dx", dx, "x", x);
    }
    if (dgate) {
        kern_req(s, op, "dgate", dgate);
        kern_req_dtype(op, "dgate", dgate, x->dtype);
        kern_req_same_shape(op, "dgate", dgate, "gate", gate);
    }
    kern_compute(s, op, KERN_OP_MOE_COMBINE, x->dtype)->sigmoid_gate_bwd(s, dx, dgate, dout, gate, x);
}

/* w[G,OC,IC], x[M,IC], sizes[G] i32. */
static void kern_grouped_check(kern_stream_t *s, const char *op, const tensor_t *x,
                               const tensor_t *w, const tensor_t *sizes)
{
    kern_req(s, op, "x", x);
    kern_req(s, op, "w", w);
    kern_req(s, op, "sizes", sizes);
    kern_req_ndim(op, "w", w, 3);
    kern_req_dtype(op, "w", w, x->dtype);
    kern_req_dtype(op, "sizes", sizes, DT_I32);
    kern_req_numel(op, "sizes", sizes, w->shape[0]);
    if (tensor_cols(x) != w->shape[2])
        BT_PANIC("%s: x %s does not fit w %s (IC)", op, kern_shape_str(x).s, kern_shape_str(w).s);
}

void kern_grouped_linear_fwd(kern_stream_t *s, tensor_t *out, const tensor_t *x, const tensor_t *w,
                             const tensor_t *sizes)
{
    const char *op = "kern_grouped_linear_fwd";
    kern_req(s, op, "out", out);
    kern_grouped_check(s, op, x, w, sizes);
    kern_req_dtype(op, "out", out, x->dtype);
    kern_req_rows_cols(op, "out", out, tensor_rows(x), w->shape[1]);
    if (out->data && out->data == x->data) BT_PANIC("%s: out aliases x", op);
    kern_compute(s, op, KERN_OP_GROUPED_LINEAR, x->dtype)->grouped_linear_fwd(s, out, x, w, sizes);
}

void kern_grouped_linear_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, const tensor_t *dout,
                             const tensor_t *x, const tensor_t *w, const tensor_t *sizes)
{
    const char *op = "kern_grouped_linear_bwd";
    kern_req(s, op, "dout", dout);
    kern_grouped_check(s, op, x, w, sizes);
    kern_req_dtype(op, "dout", dout, x->dtype);
    kern_req_rows_cols(op, "dout", dout, tensor_rows(x), w->shape[1]);
    if (dx) {
        kern_req(s, op, "dx", dx);
        kern_req_dtype(op, "dx", dx, x->dtype);
        kern_req_same_shape(op, "dx", dx, "x", x);
    }
    if (dw) {
        kern_req(s, op, "dw", dw);
        kern_req_grad_dtype(op, "dw", dw, x->dtype);
        kern_req_same_shape(op, "dw", dw, "w", w);
    }
    kern_compute(s, op, KERN_OP_GROUPED_LINEAR, x->dtype)
        ->grouped_linear_bwd(s, dx, dw, dout, x, w, sizes);
}

/* ---- Mamba2 mixer --------------------------------------------------------- */

static void kern_req_opt(kern_stream_t *s, const char *op, const char *name, const tensor_t *t,
                         dtype_t dt, const tensor_t *like)
{
    if (!t) return;
    kern_req(s, op, name, t);
    kern_req_dtype(op, name, t, dt);
    if (like) kern_req_numel(op, name, t, tensor_numel(like));
}

/* x [B,T,C] or [T,C] (one batch row); w [C,K]; bias [C] */
static void kern_conv_check(kern_stream_t *s, const char *op, const tensor_t *x, const tensor_t *w,
                            const tensor_t *bias)
{
    kern_req(s, op, "x", x);
    kern_req(s, op, "w", w);
    if (x->ndim != 2 && x->ndim != 3) BT_PANIC("%s: x %s must be [B,T,C] or [T,C]", op, kern_shape_str(x).s);
    kern_req_ndim(op, "w", w, 2);
    kern_req_dtype(op, "w", w, x->dtype);
    if (w->shape[0] != tensor_cols(x) || w->shape[1] < 1)
        BT_PANIC("%s: w %s is not [%lld channels, K >= 1]", op, kern_shape_str(w).s,
                 (long long)tensor_cols(x));
    if (bias) {
        kern_req(s, op, "bias", bias);
        kern_req_dtype(op, "bias", bias, x->dtype);
        kern_req_numel(op, "bias", bias, tensor_cols(x));
    }
}

void kern_conv1d_causal_fwd(kern_stream_t *s, tensor_t *out, tensor_t *state, const tensor_t *x,
                            const tensor_t *w, const tensor_t *bias, kern_act_t act)
{
    const char *op = "kern_conv1d_causal_fwd";
    kern_conv_check(s, op, x, w, bias);
    kern_req(s, op, "out", out);
    kern_req_dtype(op, "out", out, x->dtype);
    kern_req_same_shape(op, "out", out, "x", x);
    if (w->shape[1] > 65) BT_PANIC("%s: kernel width %lld > 65", op, (long long)w->shape[1]);
    if (state) {
        kern_req(s, op, "state", state);
        kern_req_dtype(op, "state", state, x->dtype);
        int64_t B = x->ndim == 3 ? x->shape[0] : 1;
        kern_req_numel(op, "state", state, B * (w->shape[1] - 1) * tensor_cols(x));
    }
    kern_compute(s, op, KERN_OP_MAMBA, x->dtype)->conv1d_causal_fwd(s, out, state, x, w, bias, act);
}

void kern_conv1d_causal_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *dw, tensor_t *dbias,
                            const tensor_t *dout, const tensor_t *x, const tensor_t *w,
                            const tensor_t *bias, kern_act_t act)
{
    const char *op = "kern_conv1d_causal_bwd";
    kern_conv_check(s, op, x, w, bias);
    kern_req(s, op, "dout", dout);
    kern_req_dtype(op, "dout", dout, x->dtype);
    kern_req_same_shape(op, "dout", dout, "x", x);
    kern_req_opt(s, op, "dx", dx, x->dtype, x);
    if (dw) {
        kern_req(s, op, "dw", dw);
        kern_req_grad_dtype(op, "dw", dw, x->dtype);
        kern_req_numel(op, "dw", dw, tensor_numel(w));
    }
    if (dbias) {
        kern_req(s, op, "dbias", dbias);
        kern_req_grad_dtype(op, "dbias", dbias, x->dtype);
        kern_req_numel(op, "dbias", dbias, tensor_cols(x));
    }
    kern_compute(s, op, KERN_OP_MAMBA, x->dtype)
        ->conv1d_causal_bwd(s, dx, dw, dbias, dout, x, w, bias, act);
}

static void kern_dt_check(kern_stream_t *s, const char *op, const tensor_t *raw,
                          const tensor_t *bias, float lo, float hi)
{
    kern_req(s, op, "raw", raw);
    kern_req(s, op, "bias", bias);
    kern_req_param_dtype(op, "bias", bias, raw->dtype);
    kern_req_numel(op, "bias", bias, tensor_cols(raw));
    if (!(lo <= hi)) BT_PANIC("%s: limits [%g, %g] are empty", op, (double)lo, (double)hi);
}

void kern_ssm_dt_fwd(kern_stream_t *s, tensor_t *dt, const tensor_t *raw, const tensor_t *bias,
                     float lo, float hi)
{
    const char *op = "kern_ssm_dt_fwd";
    kern_dt_check(s, op, raw, bias, lo, hi);
    kern_req(s, op, "dt", dt);
    kern_req_dtype(op, "dt", dt, raw->dtype);
    kern_req_same_shape(op, "dt", dt, "raw", raw);
    kern_compute(s, op, KERN_OP_MAMBA, raw->dtype)->ssm_dt_fwd(s, dt, raw, bias, lo, hi);
}

void kern_ssm_dt_bwd(kern_stream_t *s, tensor_t *draw, tensor_t *dbias, const tensor_t *ddt,
                     const tensor_t *raw, const tensor_t *bias, float lo, float hi)
{
    const char *op = "kern_ssm_dt_bwd";
    kern_dt_check(s, op, raw, bias, lo, hi);
    kern_req(s, op, "ddt", ddt);
    kern_req_dtype(op, "ddt", ddt, raw->dtype);
    kern_req_same_shape(op, "ddt", ddt, "raw", raw);
    kern_req_opt(s, op, "draw", draw, raw->dtype, raw);
    if (dbias) {
        kern_req(s, op, "dbias", dbias);
        kern_req_grad_dtype(op, "dbias", dbias, raw->dtype);
        kern_req_numel(op, "dbias", dbias, tensor_cols(raw));
    }
    kern_compute(s, op, KERN_OP_MAMBA, raw->dtype)->ssm_dt_bwd(s, draw, dbias, ddt, raw, bias, lo, hi);
}

/* x [B,T,H,P], dt [B,T,H], A_log [H], Bm Cm [B,T,G,N], D [H]; H % G == 0 */
static void kern_ssd_check(kern_stream_t *s, const char *op, const tensor_t *x, const tensor_t *dt,
                           const tensor_t *A_log, const tensor_t *Bm, const tensor_t *Cm,
                           const tensor_t *D, int64_t chunk)
{
    kern_req(s, op, "x", x);
    kern_req(s, op, "dt", dt);
    kern_req(s, op, "A_log", A_log);
    kern_req(s, op, "Bm", Bm);
    kern_req(s, op, "Cm", Cm);
    kern_req_ndim(op, "x", x, 4);
    kern_req_ndim(op, "Bm", Bm, 4);
    dtype_t d = x->dtype;
    kern_req_dtype(op, "dt", dt, d);
    kern_req_param_dtype(op, "A_log", A_log, d);
    kern_req_dtype(op, "Bm", Bm, d);
    kern_req_dtype(op, "Cm", Cm, d);
    int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], G = Bm->shape[2];
    kern_req_numel(op, "dt", dt, B * T * H);
    kern_req_numel(op, "A_log", A_log, H);
    if (Bm->shape[0] != B || Bm->shape[1] != T || G < 1 || H % G != 0)
        BT_PANIC("%s: Bm %s is not [%lld,%lld,G,N] with G dividing %lld heads", op,
                 kern_shape_str(Bm).s, (long long)B, (long long)T, (long long)H);
    kern_req_same_shape(op, "Cm", Cm, "Bm", Bm);
    if (D) {
        kern_req(s, op, "D", D);
        kern_req_param_dtype(op, "D", D, d);
        kern_req_numel(op, "D", D, H);
    }
    if (chunk < 1) BT_PANIC("%s: chunk size %lld < 1", op, (long long)chunk);
}

static int64_t kern_ssd_state_numel(const tensor_t *x, const tensor_t *Bm)
{
    return x->shape[0] * x->shape[2] * x->shape[3] * Bm->shape[3];
}

void kern_ssd_scan_fwd(kern_stream_t *s, tensor_t *y, tensor_t *chunk_states, tensor_t *state,
                       const tensor_t *x, const tensor_t *dt, const tensor_t *A_log,
                       const tensor_t *Bm, const tensor_t *Cm, const tensor_t *D, int64_t chunk)
{
    const char *op = "kern_ssd_scan_fwd";
    kern_ssd_check(s, op, x, dt, A_log, Bm, Cm, D, chunk);
    kern_req(s, op, "y", y);
    kern_req_dtype(op, "y", y, x->dtype);
    kern_req_same_shape(op, "y", y, "x", x);
    int64_t nc = (x->shape[1] + chunk - 1) / chunk;
    if (chunk_states) {
        kern_req(s, op, "chunk_states", chunk_states);
        kern_req_dtype(op, "chunk_states", chunk_states, DT_F32);
        kern_req_numel(op, "chunk_states", chunk_states, nc * kern_ssd_state_numel(x, Bm));
    }
    if (state) {
        kern_req(s, op, "state", state);
        kern_req_dtype(op, "state", state, DT_F32);
        kern_req_numel(op, "state", state, kern_ssd_state_numel(x, Bm));
    }
    kern_compute(s, op, KERN_OP_MAMBA, x->dtype)
        ->ssd_scan_fwd(s, y, chunk_states, state, x, dt, A_log, Bm, Cm, D, chunk);
}

void kern_ssd_scan_bwd(kern_stream_t *s, tensor_t *dx, tensor_t *ddt, tensor_t *dA_log,
                       tensor_t *dB, tensor_t *dC, tensor_t *dD, const tensor_t *dy,
                       const tensor_t *x, const tensor_t *dt, const tensor_t *A_log,
                       const tensor_t *Bm, const tensor_t *Cm, const tensor_t *D,
                       const tensor_t *chunk_states, int64_t chunk)
{
    const char *op = "kern_ssd_scan_bwd";
    kern_ssd_check(s, op, x, dt, A_log, Bm, Cm, D, chunk);
    kern_req(s, op, "dy", dy);
    kern_req_dtype(op, "dy", dy, x->dtype);
    kern_req_same_shape(op, "dy", dy, "x", x);
    kern_req(s, op, "chunk_states", chunk_states);
    kern_req_dtype(op, "chunk_states", chunk_states, DT_F32);
    int64_t nc = (x->shape[1] + chunk - 1) / chunk;
    kern_req_numel(op, "chunk_states", chunk_states, nc * kern_ssd_state_numel(x, Bm));
    kern_req_opt(s, op, "dx", dx, x->dtype, x);
    kern_req_opt(s, op, "ddt", ddt, x->dtype, dt);
    kern_req_opt(s, op, "dB", dB, x->dtype, Bm);
    kern_req_opt(s, op, "dC", dC, x->dtype, Cm);
    if (dA_log) {
        kern_req(s, op, "dA_log", dA_log);
        kern_req_grad_dtype(op, "dA_log", dA_log, x->dtype);
        kern_req_numel(op, "dA_log", dA_log, x->shape[2]);
    }
    if (dD) {
        kern_req(s, op, "dD", dD);
        kern_req_grad_dtype(op, "dD", dD, x->dtype);
        kern_req_numel(op, "dD", dD, x->shape[2]);
    }
    kern_compute(s, op, KERN_OP_MAMBA, x->dtype)
        ->ssd_scan_bwd(s, dx, ddt, dA_log, dB, dC, dD, dy, x, dt, A_log, Bm, Cm, D, chunk_states,
                       chunk);
}

static void kern_gnorm_check(kern_stream_t *s, const char *op, const tensor_t *y,
                             const tensor_t *z, const tensor_t *w, const tensor_t *rstd,
                             int64_t groups)
{
    kern_req(s, op, "y", y);
    kern_req(s, op, "z", z);
    kern_req(s, op, "w", w);
    kern_req(s, op, "rstd", rstd);
    kern_req_dtype(op, "z", z, y->dtype);
    kern_req_param_dtype(op, "w", w, y->dtype);
    kern_req_dtype(op, "rstd", rstd, DT_F32);
    kern_req_same_shape(op, "z", z, "y", y);
    int64_t C = tensor_cols(y);
    if (groups < 1 || C % groups != 0)
        BT_PANIC("%s: %lld groups do not divide %lld columns", op, (long long)groups, (long long)C);
    kern_req_numel(op, "w", w, C);
    kern_req_numel(op, "rstd", rstd, tensor_rows(y) * groups);
}

void kern_gated_rmsnorm_fwd(kern_stream_t *s, tensor_t *out, tensor_t *rstd, const tensor_t *y,
                            const tensor_t *z, const tensor_t *w, int64_t groups, float eps)
{
    const char *op = "kern_gated_rmsnorm_fwd";
    kern_gnorm_check(s, op, y, z, w, rstd, groups);
    kern_req(s, op, "out", out);
    kern_req_dtype(op, "out", out, y->dtype);
    kern_req_same_shape(op, "out", out, "y", y);
    kern_compute(s, op, KERN_OP_MAMBA, y->dtype)->gated_rmsnorm_fwd(s, out, rstd, y, z, w, groups, eps);
}

void kern_gated_rmsnorm_bwd(kern_stream_t *s, tensor_t *dy, tensor_t *dz, tensor_t *dw,
                            const tensor_t *dout, const tensor_t *y, const tensor_t *z,
                            const tensor_t *w, const tensor_t *rstd, int64_t groups)
{
    const char *op = "kern_gated_rmsnorm_bwd";
    kern_gnorm_check(s, op, y, z, w, rstd, groups);
    kern_req(s, op, "dout", dout);
    kern_req_dtype(op, "dout", dout, y->dtype);
    kern_req_same_shape(op, "dout", dout, "y", y);
    kern_req_opt(s, op, "dy", dy, y->dtype, y);
    kern_req_opt(s, op, "dz", dz, y->dtype, z);
    if (dw) {
        kern_req(s, op, "dw", dw);
        kern_req_grad_dtype(op, "dw", dw, y->dtype);
        kern_req_numel(op, "dw", dw, tensor_cols(y));
    }
    kern_compute(s, op, KERN_OP_MAMBA, y->dtype)
        ->gated_rmsnorm_bwd(s, dy, dz, dw, dout, y, z, w, rstd, groups);
}
