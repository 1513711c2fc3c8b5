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
                                const tensor_t *const *send, const char *what, int layer)
{
    int cp = m->par.cp_size, me = m->par.cp_rank, next = (me + 1) % cp, prev = (me + cp - 1) % cp;
    coll_comm_t *comm = m->par.cp_comm;
    memset(x, 0, sizeof *x);
    if (n < 1 || n > 2 || cp > 1024)
        BT_PANIC("model_cp_ring_start: %d tensors (1 or 2), cp %d", n, cp);
    x->n = n;
    bt_status_t st = kern_stream_sync(m->stream); /* send is written by queued kernels */
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
