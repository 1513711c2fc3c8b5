/* Grouped-query causal attention against a naive float64 reference
 * (forward, lse, backward) at many shapes: GQA ratios 1-4, Dv != D, Tq < Tk
 * with q_offset, non-causal, and sequence lengths that cross the kernel's
 * 64-row query blocks. The kernel's gradients are also checked against
 * central differences of the float64 forward, and for accumulation; and
 * sliding windows (kern_attention_*_window). */
#include "tests/ref_attention.h"

/* One shape's inputs (q, k, v, dout random; out pre-filled with garbage),
 * the float64 reference's forward and gradients, and the tensor views. */
typedef struct {
    int64_t nq, nk, nv, no, nl;
    float scale;
    float *q, *k, *v, *dout, *out, *lse;
    attn_ctx_t c;
    double *rout, *rlse, *rdq, *rdk, *rdv;
    tensor_t Q, K, V, O, dO, L;
} attn_fix_t;

static void attn_fix_make(attn_fix_t *f, const attn_shape_t *s, kt_rng_t *rng)
{
    f->nq = s->B * s->Tq * s->Hq * s->D;
    f->nk = s->B * s->Tk * s->Hkv * s->D;
    f->nv = s->B * s->Tk * s->Hkv * s->Dv;
    f->no = s->B * s->Tq * s->Hq * s->Dv;
    f->nl = s->B * s->Hq * s->Tq;
    f->scale = (float)(1.0 / sqrt((double)s->D));
    f->q = kt_rand(rng, f->nq, -1.5, 1.5);
    f->k = kt_rand(rng, f->nk, -1.5, 1.5);
    f->v = kt_rand(rng, f->nv, -1, 1);
    f->dout = kt_rand(rng, f->no, -1, 1);
    f->out = kt_rand(rng, f->no, -9, 9);
    f->lse = kt_alloc(f->nl);
    f->c = (attn_ctx_t){*s, f->scale, kt_to_d(f->q, f->nq), kt_to_d(f->k, f->nk),
                        kt_to_d(f->v, f->nv), kt_to_d(f->dout, f->no)};
    f->rout = kt_alloc_d(f->no);
    f->rlse = kt_alloc_d(f->nl);
    f->rdq = kt_alloc_d(f->nq);
    f->rdk = kt_alloc_d(f->nk);
    f->rdv = kt_alloc_d(f->nv);
    ref_attn_fwd(f->rout, f->rlse, &f->c);
    ref_attn_bwd(f->rdq, f->rdk, f->rdv, f->rout, &f->c);
    f->Q = tensor_4d(f->q, DT_F32, s->B, s->Tq, s->Hq, s->D);
    f->K = tensor_4d(f->k, DT_F32, s->B, s->Tk, s->Hkv, s->D);
    f->V = tensor_4d(f->v, DT_F32, s->B, s->Tk, s->Hkv, s->Dv);
    f->O = tensor_4d(f->out, DT_F32, s->B, s->Tq, s->Hq, s->Dv);
    f->dO = tensor_4d(f->dout, DT_F32, s->B, s->Tq, s->Hq, s->Dv);
    f->L = tensor_3d(f->lse, DT_F32, s->B, s->Hq, s->Tq);
}

static void attn_fix_free(attn_fix_t *f)
{
    free(f->q), free(f->k), free(f->v), free(f->dout), free(f->out), free(f->lse);
    free(f->c.q), free(f->c.k), free(f->c.v), free(f->c.R);
    free(f->rout), free(f->rlse), free(f->rdq), free(f->rdk), free(f->rdv);
}

/* One shape: kernel forward/lse vs reference; backward vs reference (and
 * vs finite differences when fd is set); accumulation into pre-filled grads. */
static void attn_case(const attn_shape_t *s, bool fd, uint64_t seed)
{
    kt_rng_t rng = {seed};
    attn_fix_t F;
    attn_fix_make(&F, s, &rng);
    int64_t nq = F.nq, nk = F.nk, nv = F.nv, no = F.no, nl = F.nl;
    float scale = F.scale, *out = F.out, *lse = F.lse;
    float *dq0 = kt_rand(&rng, nq, -1, 1), *dk0 = kt_rand(&rng, nk, -1, 1);
    float *dv0 = kt_rand(&rng, nv, -1, 1);
    float *dq = kt_dup(dq0, nq), *dk = kt_dup(dk0, nk), *dv = kt_dup(dv0, nv);
    attn_ctx_t c = F.c;
    double *rout = F.rout, *rlse = F.rlse, *rdq = F.rdq, *rdk = F.rdk, *rdv = F.rdv;
    tensor_t Q = F.Q, K = F.K, V = F.V, O = F.O, dO = F.dO, L = F.L;
    tensor_t dQ = tensor_4d(dq, DT_F32, s->B, s->Tq, s->Hq, s->D);
    tensor_t dK = tensor_4d(dk, DT_F32, s->B, s->Tk, s->Hkv, s->D);
    tensor_t dV = tensor_4d(dv, DT_F32, s->B, s->Tk, s->Hkv, s->Dv);
    kern_attention_fwd(kern_stream_host(), &O, &L, &Q, &K, &V, scale, s->causal, s->q_offset);
    char what[160];
    snprintf(what, sizeof what, "B%lld Tq%lld Tk%lld Hq%lld Hkv%lld D%lld Dv%lld %s off%lld",
             (long long)s->B, (long long)s->Tq, (long long)s->Tk, (long long)s->Hq,
             (long long)s->Hkv, (long long)s->D, (long long)s->Dv,
             s->causal ? "causal" : "full", (long long)s->q_offset);
    int before = test_case_failures;
    kt_close("attn out", out, rout, no, 1e-5);
    kt_close("attn lse", lse, rlse, nl, 1e-5);
    kern_attention_bwd(kern_stream_host(), &dQ, &dK, &dV, &dO, &Q, &K, &V, &O, &L, scale, s->causal, s->q_offset);
    kt_close_base("attn dq", dq, dq0, rdq, nq, 1e-4);
    kt_close_base("attn dk", dk, dk0, rdk, nk, 1e-4);
    kt_close_base("attn dv", dv, dv0, rdv, nv, 1e-4);
    if (fd) {
        kt_fd_check("attn dq fd", c.q, nq, dq, dq0, ref_attn_loss, &c, 120, 1e-4, &rng);
        kt_fd_check("attn dk fd", c.k, nk, dk, dk0, ref_attn_loss, &c, 120, 1e-4, &rng);
        kt_fd_check("attn dv fd", c.v, nv, dv, dv0, ref_attn_loss, &c, 120, 1e-4, &rng);
    }
    /* NULL gradients are skipped and do not change the others */
    float *dk2 = kt_dup(dk0, nk);
    tensor_t dK2 = tensor_4d(dk2, DT_F32, s->B, s->Tk, s->Hkv, s->D);
    kern_attention_bwd(kern_stream_host(), NULL, &dK2, NULL, &dO, &Q, &K, &V, &O, &L, scale, s->causal, s->q_offset);
    CHECK(!memcmp(dk2, dk, (size_t)nk * sizeof *dk));
    if (test_case_failures != before) fprintf(stderr, "  ^ in attention case %s\n", what);

    free(dq0), free(dk0), free(dv0), free(dq), free(dk), free(dv), free(dk2);
    attn_fix_free(&F);
}

static void test_attention_small_shapes_fd(void)
{
    const attn_shape_t shapes[] = {
        {1, 1, 1, 1, 1, 1, 1, true, 0, 0},    {2, 3, 3, 2, 1, 4, 4, true, 0, 0},
        {1, 7, 7, 3, 1, 8, 5, true, 0, 0},    {2, 17, 17, 4, 1, 8, 8, false, 0, 0},
        {1, 5, 12, 4, 2, 6, 6, true, 7, 0},   {1, 5, 9, 2, 2, 4, 3, false, 0, 0},
        {1, 33, 40, 4, 4, 16, 16, true, 3, 0}, {1, 3, 3, 6, 2, 2, 7, true, 0, 0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        attn_case(&shapes[i], true, 100 + i);
}

static void test_attention_long_blocks(void)
{
    const attn_shape_t shapes[] = {
        {1, 300, 300, 4, 2, 16, 12, true, 0, 0}, /* crosses several 64-row query blocks */
        {2, 130, 200, 2, 1, 8, 8, true, 70, 0},  /* context-parallel shard: Tq + q_offset == Tk */
        {1, 65, 65, 3, 3, 64, 64, true, 0, 0},
        {1, 129, 129, 1, 1, 32, 32, false, 0, 0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        attn_case(&shapes[i], false, 200 + i);
}

/* Sliding windows (transformers' mask: query i sees keys j with
 * i - window < j <= i): forward, lse and the _set backward against the
 * float64 reference and its central differences, also with a decode-style
 * q_offset; and a window at least as long as the keys gives the bits of
 * plain causal attention. */
static void window_case(const attn_shape_t *s, bool fd, uint64_t seed)
{
    kt_rng_t rng = {seed};
    attn_fix_t F;
    attn_fix_make(&F, s, &rng);
    float *dq = kt_alloc(F.nq), *dk = kt_alloc(F.nk), *dv = kt_alloc(F.nv);
    tensor_t dQ = tensor_4d(dq, DT_F32, s->B, s->Tq, s->Hq, s->D);
    tensor_t dK = tensor_4d(dk, DT_F32, s->B, s->Tk, s->Hkv, s->D);
    tensor_t dV = tensor_4d(dv, DT_F32, s->B, s->Tk, s->Hkv, s->Dv);
    kern_stream_t *st = kern_stream_host();
    int before = test_case_failures;
    kern_attention_fwd_window(st, &F.O, &F.L, &F.Q, &F.K, &F.V, F.scale, true, s->q_offset,
                              s->window);
    kt_close("window out", F.out, F.rout, F.no, 1e-5);
    kt_close("window lse", F.lse, F.rlse, F.nl, 1e-5);
    kern_attention_bwd_set_window(st, &dQ, &dK, &dV, &F.dO, &F.Q, &F.K, &F.V, &F.O, &F.L,
                                  F.scale, true, s->q_offset, s->window);
    kt_close("window dq", dq, F.rdq, F.nq, 1e-4);
    kt_close("window dk", dk, F.rdk, F.nk, 1e-4);
    kt_close("window dv", dv, F.rdv, F.nv, 1e-4);
    if (fd) {
        float *zq = kt_alloc(F.nq), *zk = kt_alloc(F.nk), *zv = kt_alloc(F.nv);
        memset(zq, 0, (size_t)F.nq * sizeof *zq);
        memset(zk, 0, (size_t)F.nk * sizeof *zk);
        memset(zv, 0, (size_t)F.nv * sizeof *zv);
        kt_fd_check("window dq fd", F.c.q, F.nq, dq, zq, ref_attn_loss, &F.c, 120, 1e-4, &rng);
        kt_fd_check("window dk fd", F.c.k, F.nk, dk, zk, ref_attn_loss, &F.c, 120, 1e-4, &rng);
        kt_fd_check("window dv fd", F.c.v, F.nv, dv, zv, ref_attn_loss, &F.c, 120, 1e-4, &rng);
        free(zq), free(zk), free(zv);
    }
    /* a window that cuts nothing: the bits of the plain causal call */
    float *out2 = kt_alloc(F.no), *lse2 = kt_alloc(F.nl);
    tensor_t O2 = tensor_4d(out2, DT_F32, s->B, s->Tq, s->Hq, s->Dv);
    tensor_t L2 = tensor_3d(lse2, DT_F32, s->B, s->Hq, s->Tq);
    kern_attention_fwd_window(st, &F.O, &F.L, &F.Q, &F.K, &F.V, F.scale, true, s->q_offset, s->Tk);
    kern_attention_fwd(st, &O2, &L2, &F.Q, &F.K, &F.V, F.scale, true, s->q_offset);
    CHECK(!memcmp(F.out, out2, (size_t)F.no * sizeof *out2) &&
          !memcmp(F.lse, lse2, (size_t)F.nl * sizeof *lse2));
    if (test_case_failures != before)
        fprintf(stderr, "  ^ in window case Tq%lld Tk%lld window %lld off %lld\n", (long long)s->Tq,
                (long long)s->Tk, (long long)s->window, (long long)s->q_offset);
    free(dq), free(dk), free(dv), free(out2), free(lse2);
    attn_fix_free(&F);
}

static void test_attention_sliding_window(void)
{
    const attn_shape_t shapes[] = {
        {1, 9, 9, 2, 1, 4, 4, true, 0, 2},    {2, 12, 12, 4, 2, 8, 6, true, 0, 3},
        {1, 7, 12, 2, 2, 4, 4, true, 5, 4},   /* decoding: 5 cached positions before */
        {1, 130, 130, 2, 1, 8, 8, true, 0, 50}, /* across the 64-row query blocks */
        {1, 1, 40, 3, 1, 8, 8, true, 39, 16}, /* one decoded token */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        window_case(&shapes[i], shapes[i].Tq * shapes[i].Tk < 200, 400 + i);
}

/* Two context-parallel shards of the queries ([0,Tq/2) with q_offset 0 and
 * [Tq/2,Tq) with q_offset Tq/2, both over all keys) give exactly the rows of
 * the unsharded call, and their dK, dV add up to the unsharded ones. */
static void test_attention_context_parallel_split(void)
{
    kt_rng_t rng = {300};
    const int64_t B = 1, T = 40, H = 2, D = 8, half = 20;
    float scale = 0.35f;
    float *q = kt_rand(&rng, B * T * H * D, -1, 1), *k = kt_rand(&rng, B * T * H * D, -1, 1);
    float *v = kt_rand(&rng, B * T * H * D, -1, 1), *dout = kt_rand(&rng, B * T * H * D, -1, 1);
    float *out = kt_alloc(T * H * D), *lse = kt_alloc(H * T);
    float *dk = kt_alloc(T * H * D), *dv = kt_alloc(T * H * D);
    tensor_t Q = tensor_4d(q, DT_F32, B, T, H, D), K = tensor_4d(k, DT_F32, B, T, H, D);
    tensor_t V = tensor_4d(v, DT_F32, B, T, H, D), O = tensor_4d(out, DT_F32, B, T, H, D);
    tensor_t dO = tensor_4d(dout, DT_F32, B, T, H, D), L = tensor_3d(lse, DT_F32, B, H, T);
    tensor_t dK = tensor_4d(dk, DT_F32, B, T, H, D), dV = tensor_4d(dv, DT_F32, B, T, H, D);
    kern_attention_fwd(kern_stream_host(), &O, &L, &Q, &K, &V, scale, true, 0);
    kern_attention_bwd(kern_stream_host(), NULL, &dK, &dV, &dO, &Q, &K, &V, &O, &L, scale, true, 0);

    float *sout = kt_alloc(T * H * D), *slse = kt_alloc(H * half);
    float *sdk = kt_alloc(T * H * D), *sdv = kt_alloc(T * H * D);
    tensor_t sdK = tensor_4d(sdk, DT_F32, B, T, H, D), sdV = tensor_4d(sdv, DT_F32, B, T, H, D);
    for (int part = 0; part < 2; part++) {
        int64_t off = part * half;
        tensor_t Qs = tensor_4d(q + off * H * D, DT_F32, B, half, H, D);
        tensor_t Os = tensor_4d(sout + off * H * D, DT_F32, B, half, H, D);
        tensor_t dOs = tensor_4d(dout + off * H * D, DT_F32, B, half, H, D);
        tensor_t Ls = tensor_3d(slse, DT_F32, B, H, half);
        kern_attention_fwd(kern_stream_host(), &Os, &Ls, &Qs, &K, &V, scale, true, off);
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < half; i++)
                CHECK_NEAR(slse[h * half + i], lse[h * T + off + i], 1e-6, 1e-6);
        kern_attention_bwd(kern_stream_host(), NULL, &sdK, &sdV, &dOs, &Qs, &K, &V, &Os, &Ls, scale, true, off);
    }
    double *ro = kt_to_d(out, T * H * D), *rk = kt_to_d(dk, T * H * D), *rv = kt_to_d(dv, T * H * D);
    kt_close("cp out", sout, ro, T * H * D, 1e-6);
    kt_close("cp dk", sdk, rk, T * H * D, 1e-5);
    kt_close("cp dv", sdv, rv, T * H * D, 1e-5);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dk), free(dv);
    free(sout), free(slse), free(sdk), free(sdv), free(ro), free(rk), free(rv);
}

/* kern_attention_merge: attention over keys [0, a) merged with that over
 * [a, Tk) equals attention over all of them (float64 reference), for the
 * cpu and, bit for bit, the fenced device; an empty side (lse = -inf)
 * leaves the other as it was. */
static void test_attention_merge(void)
{
    kt_rng_t rng = {310};
    const int64_t B = 2, Tq = 5, Tk = 9, Hq = 4, Hkv = 2, D = 6, Dv = 3, a = 4;
    attn_shape_t s = {B, Tq, Tk, Hq, Hkv, D, Dv, false, 0, 0};
    int64_t nq = B * Tq * Hq * D, nk = B * Tk * Hkv * D, nv = B * Tk * Hkv * Dv;
    int64_t no = B * Tq * Hq * Dv, nl = B * Hq * Tq;
    float scale = 0.4f;
    float *q = kt_rand(&rng, nq, -1.5, 1.5), *k = kt_rand(&rng, nk, -1.5, 1.5);
    float *v = kt_rand(&rng, nv, -1, 1), *r = kt_rand(&rng, no, -1, 1);
    attn_ctx_t c = {s, scale, kt_to_d(q, nq), kt_to_d(k, nk), kt_to_d(v, nv), kt_to_d(r, no)};
    double *rout = kt_alloc_d(no), *rlse = kt_alloc_d(nl);
    ref_attn_fwd(rout, rlse, &c);
    /* the two key ranges as their own [B, n, Hkv, Dh] tensors */
    float *k1 = kt_alloc(B * a * Hkv * D), *k2 = kt_alloc(B * (Tk - a) * Hkv * D);
    float *v1 = kt_alloc(B * a * Hkv * Dv), *v2 = kt_alloc(B * (Tk - a) * Hkv * Dv);
    for (int64_t b = 0; b < B; b++) {
        memcpy(k1 + b * a * Hkv * D, k + b * Tk * Hkv * D, (size_t)(a * Hkv * D) * sizeof *k);
        memcpy(k2 + b * (Tk - a) * Hkv * D, k + (b * Tk + a) * Hkv * D,
               (size_t)((Tk - a) * Hkv * D) * sizeof *k);
        memcpy(v1 + b * a * Hkv * Dv, v + b * Tk * Hkv * Dv, (size_t)(a * Hkv * Dv) * sizeof *v);
        memcpy(v2 + b * (Tk - a) * Hkv * Dv, v + (b * Tk + a) * Hkv * Dv,
               (size_t)((Tk - a) * Hkv * Dv) * sizeof *v);
    }
    tensor_t Q = tensor_4d(q, DT_F32, B, Tq, Hq, D);
    tensor_t K1 = tensor_4d(k1, DT_F32, B, a, Hkv, D), K2 = tensor_4d(k2, DT_F32, B, Tk - a, Hkv, D);
    tensor_t V1 = tensor_4d(v1, DT_F32, B, a, Hkv, Dv), V2 = tensor_4d(v2, DT_F32, B, Tk - a, Hkv, Dv);
    float *o1 = kt_alloc(no), *l1 = kt_alloc(nl), *o2 = kt_alloc(no), *l2 = kt_alloc(nl);
    tensor_t O1 = tensor_4d(o1, DT_F32, B, Tq, Hq, Dv), L1 = tensor_3d(l1, DT_F32, B, Hq, Tq);
    tensor_t O2 = tensor_4d(o2, DT_F32, B, Tq, Hq, Dv), L2 = tensor_3d(l2, DT_F32, B, Hq, Tq);
    kern_attention_fwd(kern_stream_host(), &O1, &L1, &Q, &K1, &V1, scale, false, 0);
    kern_attention_fwd(kern_stream_host(), &O2, &L2, &Q, &K2, &V2, scale, false, 0);
    float *fo = kt_dup(o1, no), *fl = kt_dup(l1, nl);
    kern_attention_merge(kern_stream_host(), &O1, &L1, &O2, &L2);
    kt_close("merge out", o1, rout, no, 1e-5);
    kt_close("merge lse", l1, rlse, nl, 1e-5);

    /* the fenced device: the same bits */
    kern_stream_t *fs = NULL;
    device_t dev = {DEV_FENCED, 0};
    CHECK(kern_stream_create(dev, &fs) == BT_OK);
    if (fs) {
        tensor_t *host[4] = {&O2, &L2, NULL, NULL};
        tensor_t FO1 = tensor_4d(fo, DT_F32, B, Tq, Hq, Dv), FL1 = tensor_3d(fl, DT_F32, B, Hq, Tq);
        host[2] = &FO1;
        host[3] = &FL1;
        tensor_t dt[4];
        for (int i = 0; i < 4; i++) {
            void *p = NULL;
            CHECK(kern_mem_alloc(dev, tensor_nbytes(host[i]), &p) == BT_OK);
            dt[i] = tensor_make(p, DT_F32, dev, host[i]->ndim, host[i]->shape);
            kern_upload(fs, &dt[i], host[i]->data);
        }
        kern_attention_merge(fs, &dt[2], &dt[3], &dt[0], &dt[1]);
        kern_download(fs, fo, &dt[2]);
        kern_download(fs, fl, &dt[3]);
        kern_stream_sync(fs);
        CHECK(!memcmp(fo, o1, (size_t)no * sizeof *fo));
        CHECK(!memcmp(fl, l1, (size_t)nl * sizeof *fl));
        for (int i = 0; i < 4; i++) kern_mem_free(dev, dt[i].data);
        kern_stream_destroy(fs);
    }

    /* an empty side weighs nothing */
    float *eo = kt_rand(&rng, no, -9, 9), *el = kt_alloc(nl);
    for (int64_t i = 0; i < nl; i++) el[i] = -INFINITY;
    tensor_t EO = tensor_4d(eo, DT_F32, B, Tq, Hq, Dv), EL = tensor_3d(el, DT_F32, B, Hq, Tq);
    kern_attention_merge(kern_stream_host(), &EO, &EL, &O2, &L2);
    CHECK(!memcmp(eo, o2, (size_t)no * sizeof *eo));
    CHECK(!memcmp(el, l2, (size_t)nl * sizeof *el));
    free(eo);
    free(el);
    free(fo);
    free(fl);
    free(o1);
    free(l1);
    free(o2);
    free(l2);
    free(k1);
    free(k2);
    free(v1);
    free(v2);
    free(q);
    free(k);
    free(v);
    free(r);
    free(c.q);
    free(c.k);
    free(c.v);
    free(c.R);
    free(rout);
    free(rlse);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_attention_small_shapes_fd, test_attention_long_blocks,
             test_attention_context_parallel_split, test_attention_merge,
             test_attention_sliding_window);
}
