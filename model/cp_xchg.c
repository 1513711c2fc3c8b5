/* Context parallelism's K/V exchanges (model/cp_xchg.h). */
#include "model/cp_xchg.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "coll/coll.h"
#include "kernels/kernels.h"
#include "model/cp_attn.h"
#include "model/kind.h"
#include "model/model_int.h"

static bt_status_t cp_fail(const model_t *m, const char *op, const char *what, int layer,
                           bt_status_t st)
{
    char where[32] = "";
    if (layer >= 0) snprintf(where, sizeof where, " in layer %d", layer);
    log_error("model: CP %s of %s%s failed (CP rank %d of %d): %s", op, what, where,
              m->par.cp_rank, m->par.cp_size, bt_status_str(st));
    return st;
}

bt_status_t model_cp_gather(model_t *m, tensor_t *seq, tensor_t *ranks, const tensor_t *local,
                            const char *what, int layer)
{
    int cp = m->par.cp_size;
    coll_comm_t *comm = m->par.cp_comm;
    size_t n = (size_t)tensor_numel(local), counts[1024];
    if (tensor_numel(ranks) != (int64_t)n * cp || cp > 1024)
        BT_PANIC("model_cp_gather: ranks %s is not cp = %d times local %s", kern_shape_str(ranks).s,
                 cp, kern_shape_str(local).s);
    for (int r = 0; r < cp; r++) counts[r] = n;
    bt_status_t st = kern_stream_sync(m->stream); /* local is written by queued kernels */
    if (st == BT_OK && model_coll_direct(m, comm)) {
        st = coll_all_gather(comm, ranks->data, local->data, counts, local->dtype);
    } else if (st == BT_OK) {
        size_t nb = tensor_nbytes(local);
        void *h;
        if ((st = model_host_buf(m, nb * (size_t)(cp + 1), &h)) != BT_OK) return st;
        kern_download(m->stream, (char *)h + nb * (size_t)cp, local);
        if ((st = kern_stream_sync(m->stream)) == BT_OK &&
            (st = coll_all_gather(comm, h, (char *)h + nb * (size_t)cp, counts, local->dtype)) ==
                BT_OK) {
            kern_upload(m->stream, ranks, h);
            st = kern_stream_sync(m->stream); /* h is reused by the next exchange */
        }
    }
    if (st != BT_OK) return cp_fail(m, "all-gather", what, layer, st);
    cp_attn_to_seq(m->stream, seq, ranks, cp);
    return BT_OK;
}

bt_status_t model_cp_scatter_sum(model_t *m, tensor_t *local, tensor_t *ranks,
                                 const tensor_t *seq, const char *what, int layer)
{
    int cp = m->par.cp_size;
    coll_comm_t *comm = m->par.cp_comm;
    size_t n = (size_t)tensor_numel(local), counts[1024];
    if (tensor_numel(ranks) != (int64_t)n * cp || cp > 1024)
        BT_PANIC("model_cp_scatter_sum: ranks %s is not cp = %d times local %s",
                 kern_shape_str(ranks).s, cp, kern_shape_str(local).s);
    for (int r = 0; r < cp; r++) counts[r] = n;
    cp_attn_to_ranks(m->stream, ranks, seq, cp);
    bt_status_t st = kern_stream_sync(m->stream);
    if (st == BT_OK && model_coll_direct(m, comm)) {
        st = coll_reduce_scatter(comm, local->data, ranks->data, counts, local->dtype, COLL_SUM);
    } else if (st == BT_OK) {
        size_t nb = tensor_nbytes(local);
        void *h;
        if ((st = model_host_buf(m, nb * (size_t)(cp + 1), &h)) != BT_OK) return st;
        kern_download(m->stream, h, ranks);
        if ((st = kern_stream_sync(m->stream)) == BT_OK &&
            (st = coll_reduce_scatter(comm, (char *)h + nb * (size_t)cp, h, counts, local->dtype,
                                      COLL_SUM)) == BT_OK) {
            kern_upload(m->stream, local, (char *)h + nb * (size_t)cp);
            st = kern_stream_sync(m->stream);
        }
    }
    if (st != BT_OK) return cp_fail(m, "reduce-scatter", what, layer, st);
    return BT_OK;
}

bt_status_t model_cp_ring_start(model_t *m, model_cp_ring_t *x, int n, tensor_t *const *recv,
                                const tensor_t *const *send, const char *what, int layer,
                                uint32_t phase, int ring_step, uint32_t what0)
{
    int cp = m->par.cp_size, me = m->par.cp_rank, next = (me + 1) % cp, prev = (me + cp - 1) % cp;
    coll_comm_t *comm = m->par.cp_comm;
    memset(x, 0, sizeof *x);
    if (n < 1 || n > 2 || cp > 1024)
        BT_PANIC("model_cp_ring_start: %d tensors (1 or 2), cp %d", n, cp);
    x->n = n;
    bt_status_t st = kern_stream_sync(m->stream); /* send is written by queued kernels */
    if (m->par.cp_msgs) { /* the stage actor's CP_BLOCK messages */
        x->msgs = true;
        for (int i = 0; i < n && st == BT_OK; i++) {
            if (tensor_numel(send[i]) != tensor_numel(recv[i]) || send[i]->dtype != recv[i]->dtype)
                BT_PANIC("model_cp_ring_start: send %s and recv %s differ", kern_shape_str(send[i]).s,
                         kern_shape_str(recv[i]).s);
            x->recv[i] = *recv[i];
            x->tag[i] = (model_cp_tag_t){.layer = layer, .phase = phase,
                                         .ring_step = (uint32_t)ring_step, .what = what0 + (uint32_t)i};
            st = m->par.cp_msgs->send(m->par.cp_msgs_arg, m, &x->tag[i], send[i]);
        }
        if (st != BT_OK) {
            memset(x, 0, sizeof *x);
            return cp_fail(m, "ring send", what, layer, st);
        }
        return BT_OK;
    }
    bool direct = model_coll_direct(m, comm);
    if (st == BT_OK && !direct) {
        size_t at = 0;
        for (int i = 0; i < n; i++) {
            x->off[i][0] = at;
            at += model_align(tensor_nbytes(send[i]));
            x->off[i][1] = at;
            at += model_align(tensor_nbytes(recv[i]));
        }
        if (!(x->host = malloc(at))) st = BT_ERR_NOMEM;
        for (int i = 0; i < n && st == BT_OK; i++)
            kern_download(m->stream, (char *)x->host + x->off[i][0], send[i]);
        if (st == BT_OK) st = kern_stream_sync(m->stream);
    }
    for (int i = 0; i < n && st == BT_OK; i++) {
        if (tensor_numel(send[i]) != tensor_numel(recv[i]) || send[i]->dtype != recv[i]->dtype)
            BT_PANIC("model_cp_ring_start: send %s and recv %s differ", kern_shape_str(send[i]).s,
                     kern_shape_str(recv[i]).s);
        size_t sc[1024] = {0}, rc[1024] = {0};
        sc[next] = (size_t)tensor_numel(send[i]);
        rc[prev] = (size_t)tensor_numel(recv[i]);
        x->recv[i] = *recv[i];
        coll_call_t call = {.kind = COLL_KIND_ALL_TO_ALL,
                            .recv = direct ? recv[i]->data : (char *)x->host + x->off[i][1],
                            .send = direct ? send[i]->data : (char *)x->host + x->off[i][0],
                            .send_counts = sc, .recv_counts = rc, .dt = send[i]->dtype};
        st = coll_start(comm, &call, NULL, NULL, &x->req[i]);
        if (st == BT_IN_PROGRESS) st = BT_OK;
        else x->req[i] = NULL;
    }
    if (st != BT_OK) {
        for (int i = 0; i < n; i++)
            if (x->req[i]) coll_wait(comm, x->req[i]);
        free(x->host);
        memset(x, 0, sizeof *x);
        return cp_fail(m, "ring send/receive", what, layer, st);
    }
    return BT_OK;
}

bt_status_t model_cp_ring_wait(model_t *m, model_cp_ring_t *x, const char *what, int layer)
{
    bt_status_t st = BT_OK;
    if (x->msgs) {
        for (int i = 0; i < x->n && st == BT_OK; i++)
            st = m->par.cp_msgs->recv(m->par.cp_msgs_arg, m, &x->tag[i], &x->recv[i]);
        x->n = 0;
        x->msgs = false;
        if (st != BT_OK) return cp_fail(m, "ring receive", what, layer, st);
        return BT_OK;
    }
    for (int i = 0; i < x->n; i++) {
        if (!x->req[i]) continue;
        bt_status_t s = coll_wait(m->par.cp_comm, x->req[i]);
        x->req[i] = NULL;
        if (st == BT_OK) st = s;
    }
    if (st == BT_OK && x->host) {
        for (int i = 0; i < x->n; i++) kern_upload(m->stream, &x->recv[i], (char *)x->host + x->off[i][1]);
        st = kern_stream_sync(m->stream);
    }
    free(x->host);
    x->host = NULL;
    x->n = 0;
    if (st != BT_OK) return cp_fail(m, "ring send/receive", what, layer, st);
    return BT_OK;
}

/* ---- one attention call under CP ------------------------------------------------ */

/* The scratch of one call. All-gather mode: K, V in rank order
 * [cp*B, 2L, Hkv, D*], then K, V, dK, dV in sequence order [B, T, Hkv, D*].
 * Ring mode: the partial result of one chunk pair (out [1, L, Hq, Dv], lse
 * [1, Hq, L]), then five K-sized and five V-sized block buffers: the
 * incoming block of two steps, the accumulators of two steps, the
 * accumulator arriving. */
typedef struct {
    tensor_t kr, vr, ks, vs, dks, dvs;     /* all-gather */
    tensor_t po, pl, kb[5], vb[5];         /* ring */
} cp_views_t;

static double cp_scratch(const model_t *m, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                         int64_t Dk, int64_t Dv, void *base, cp_views_t *w)
{
    int cp = m->par.cp_size;
    double es = (double)dtype_size(m->place.act_dtype), N = (double)B * (double)T;
    double nk = model_align_d(N * (double)(Hkv * Dk) * es), nv = model_align_d(N * (double)(Hkv * Dv) * es);
    if (!m->par.cp_ring) {
        if (w) {
            size_t o = 0;
            w->kr = model_act_view(m, base, o, 4, (int64_t[]){cp * B, T, Hkv, Dk});
            o += (size_t)(cp * nk);
            w->vr = model_act_view(m, base, o, 4, (int64_t[]){cp * B, T, Hkv, Dv});
            o += (size_t)(cp * nv);
            tensor_t *seq[4] = {&w->ks, &w->vs, &w->dks, &w->dvs};
            for (int i = 0; i < 4; i++) {
                int64_t D = i % 2 ? Dv : Dk;
                *seq[i] = model_act_view(m, base, o, 4, (int64_t[]){B, T * cp, Hkv, D});
                o += (size_t)(cp * (i % 2 ? nv : nk));
            }
        }
        return 3 * (double)cp * (nk + nv);
    }
    int64_t L = T / 2;
    double po = model_align_d((double)L * (double)(Hq * Dv) * es);
    double pl = model_align_d((double)L * (double)Hq * 4);
    if (w) {
        w->po = model_act_view(m, base, 0, 4, (int64_t[]){1, L, Hq, Dv});
        w->pl = tensor_make((char *)base + (size_t)po, DT_F32, m->place.dev, 3,
                            (int64_t[]){1, Hq, L});
        size_t o = (size_t)(po + pl);
        for (int j = 0; j < 5; j++, o += (size_t)nk)
            w->kb[j] = model_act_view(m, base, o, 4, (int64_t[]){B, T, Hkv, Dk});
        for (int j = 0; j < 5; j++, o += (size_t)nv)
            w->vb[j] = model_act_view(m, base, o, 4, (int64_t[]){B, T, Hkv, Dv});
    }
    return po + pl + 5 * (nk + nv);
}

double model_cp_attn_scratch_bytes(const model_t *m, int64_t B, int64_t T, int64_t Hq,
                                   int64_t Hkv, int64_t Dk, int64_t Dv)
{
    if (m->par.cp_size <= 1) return 0;
    return cp_scratch(m, B, T, Hq, Hkv, Dk, Dv, NULL, NULL);
}

static void cp_views(const model_t *m, void *base, const tensor_t *q, const tensor_t *k,
                     const tensor_t *v, cp_views_t *w)
{
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || k->shape[2] != v->shape[2] ||
        k->shape[0] != q->shape[0] || k->shape[1] != q->shape[1] || v->shape[1] != q->shape[1])
        BT_PANIC("model_cp_attn: q %s, k %s, v %s are not [B,2L,H,D] chunks of one call",
                 kern_shape_str(q).s, kern_shape_str(k).s, kern_shape_str(v).s);
    cp_scratch(m, q->shape[0], q->shape[1], q->shape[2], k->shape[2], k->shape[3], v->shape[3],
               base, w);
}

bt_status_t model_cp_attn_fwd(model_t *m, void *scratch, tensor_t *out, tensor_t *lse,
                              const tensor_t *q, const tensor_t *k, const tensor_t *v,
                              float scale, int layer)
{
    kern_stream_t *s = m->stream;
    int cp = m->par.cp_size, me = m->par.cp_rank;
    cp_views_t w;
    cp_views(m, scratch, q, k, v, &w);
    bt_status_t st;
    if (!m->par.cp_ring) {
        if ((st = model_cp_gather(m, &w.ks, &w.kr, k, "K", layer)) ||
            (st = model_cp_gather(m, &w.vs, &w.vr, v, "V", layer)))
            return st;
        cp_attn_fwd(s, out, lse, q, &w.ks, &w.vs, scale, cp, me);
        return BT_OK;
    }
    const tensor_t *ck = k, *cv = v;
    for (int i = 0, src = me; i < cp; i++, src = (src + cp - 1) % cp) {
        model_cp_ring_t x;
        tensor_t *rk = &w.kb[i % 2], *rv = &w.vb[i % 2];
        if (i + 1 < cp &&
            (st = model_cp_ring_start(m, &x, 2, (tensor_t *[]){rk, rv},
                                      (const tensor_t *[]){ck, cv}, "the K/V block", layer,
                                      MODEL_CP_FWD, i, MODEL_CP_K)))
            return st;
        /* the block in hand while the next one travels */
        cp_attn_ring_fwd(s, out, lse, &w.po, &w.pl, q, ck, cv, scale, cp, me, src);
        if (i + 1 < cp) {
            if ((st = model_cp_ring_wait(m, &x, "the K/V block", layer))) return st;
            ck = rk;
            cv = rv;
        }
    }
    return BT_OK;
}

bt_status_t model_cp_attn_bwd(model_t *m, void *scratch, tensor_t *dq, tensor_t *dk,
                              tensor_t *dv, const tensor_t *dout, const tensor_t *q,
                              const tensor_t *k, const tensor_t *v, const tensor_t *out,
                              const tensor_t *lse, float scale, int layer)
{
    kern_stream_t *s = m->stream;
    int cp = m->par.cp_size, me = m->par.cp_rank;
    cp_views_t w;
    cp_views(m, scratch, q, k, v, &w);
    bt_status_t st;
    kern_zero(s, dq);
    if (!m->par.cp_ring) { /* gather again; dK, dV of the whole sequence reduce-scattered */
        if ((st = model_cp_gather(m, &w.ks, &w.kr, k, "K", layer)) ||
            (st = model_cp_gather(m, &w.vs, &w.vr, v, "V", layer)))
            return st;
        kern_zero(s, &w.dks);
        kern_zero(s, &w.dvs);
        cp_attn_bwd(s, dq, &w.dks, &w.dvs, dout, q, &w.ks, &w.vs, out, lse, scale, cp, me);
        if ((st = model_cp_scatter_sum(m, dk, &w.kr, &w.dks, "dK", layer)) ||
            (st = model_cp_scatter_sum(m, dv, &w.vr, &w.dvs, "dV", layer)))
            return st;
        return BT_OK;
    }
    const tensor_t *ck = k, *cv = v;
    tensor_t *in_k = &w.kb[4], *in_v = &w.vb[4];
    model_cp_ring_t xg; /* the dK/dV accumulators in flight */
    for (int i = 0, src = me; i < cp; i++, src = (src + cp - 1) % cp) {
        model_cp_ring_t xkv;
        tensor_t *rk = &w.kb[i % 2], *rv = &w.vb[i % 2];
        tensor_t *gk = &w.kb[2 + i % 2], *gv = &w.vb[2 + i % 2];
        if (i + 1 < cp &&
            (st = model_cp_ring_start(m, &xkv, 2, (tensor_t *[]){rk, rv},
                                      (const tensor_t *[]){ck, cv}, "the K/V block", layer,
                                      MODEL_CP_BWD, i, MODEL_CP_K)))
            return st;
        /* this rank's share of block src's dK, dV, while the next block and
         * the previous accumulators travel */
        kern_zero(s, gk);
        kern_zero(s, gv);
        cp_attn_ring_bwd(s, dq, gk, gv, dout, q, ck, cv, out, lse, scale, cp, me, src);
        if (i > 0) { /* the shares of the ranks before us, for the same block */
            if ((st = model_cp_ring_wait(m, &xg, "the dK/dV block", layer))) return st;
            kern_add(s, gk, gk, in_k);
            kern_add(s, gv, gv, in_v);
        }
        /* the last step's accumulators go to their owner, CP rank + 1, and
         * ours arrive whole: straight into dk, dv */
        tensor_t *tk = i + 1 < cp ? in_k : dk, *tv = i + 1 < cp ? in_v : dv;
        if ((st = model_cp_ring_start(m, &xg, 2, (tensor_t *[]){tk, tv},
                                      (const tensor_t *[]){gk, gv}, "the dK/dV block", layer,
                                      MODEL_CP_BWD, i, MODEL_CP_DK)))
            return st;
        if (i + 1 < cp) {
            if ((st = model_cp_ring_wait(m, &xkv, "the K/V block", layer))) return st;
            ck = rk;
            cv = rv;
        }
    }
    return model_cp_ring_wait(m, &xg, "the dK/dV block", layer);
}
