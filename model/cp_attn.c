/* Context-parallel attention core (model/cp_attn.h): the chunk layout and
 * the all-gather mode's compute, for any attention kind's q, k, v. Every
 * piece is a contiguous view (one batch row, one chunk), so the kernels run
 * on any backend and nothing is copied but the rank/sequence reorders. */
#include "model/cp_attn.h"

#include "base/log.h"

#include <string.h>

/* [1, L, H, Dh] view of piece `i` of t seen as [n, L, H, Dh]. */
static tensor_t cp_piece(const tensor_t *t, int64_t n, int64_t L, int64_t i)
{
    if (t->ndim != 4 || t->shape[0] * t->shape[1] != n * L)
        BT_PANIC("cp_attn: %lld-dim tensor does not cut into %lld pieces of %lld tokens",
                 (long long)t->ndim, (long long)n, (long long)L);
    int64_t sh[4] = {n, L, t->shape[2], t->shape[3]};
    tensor_t r = tensor_reshape(t, 4, sh);
    return tensor_narrow(&r, i, 1);
}

/* [1, n, H, Dh]: the first n tokens of batch row b of seq [B,T,H,Dh]. */
static tensor_t cp_prefix(const tensor_t *seq, int64_t b, int64_t n)
{
    tensor_t row = tensor_narrow(seq, b, 1);
    int64_t sh3[3] = {seq->shape[1], seq->shape[2], seq->shape[3]};
    tensor_t r3 = tensor_reshape(&row, 3, sh3);
    tensor_t p = tensor_narrow(&r3, 0, n);
    int64_t sh4[4] = {1, n, seq->shape[2], seq->shape[3]};
    return tensor_reshape(&p, 4, sh4);
}

void cp_attn_positions(int32_t *pos, int64_t B, int64_t L, int cp, int rank)
{
    for (int64_t b = 0; b < B; b++)
        for (int h = 0; h < 2; h++) {
            int64_t start = (int64_t)cp_attn_chunk(cp, rank, h) * L;
            for (int64_t i = 0; i < L; i++) pos[(b * 2 + h) * L + i] = (int32_t)(start + i);
        }
}

void cp_attn_split_host(void *dst, const void *src, int64_t B, int64_t T, size_t row, int cp,
                        int rank)
{
    if (cp < 1 || T % (2 * cp))
        BT_PANIC("cp_attn_split_host: %lld tokens do not cut into 2*cp = %d chunks", (long long)T,
                 2 * cp);
    int64_t L = T / (2 * cp);
    for (int64_t b = 0; b < B; b++)
        for (int h = 0; h < 2; h++)
            memcpy((char *)dst + (size_t)((b * 2 + h) * L) * row,
                   (const char *)src + (size_t)(b * T + cp_attn_chunk(cp, rank, h) * L) * row,
                   (size_t)L * row);
}

/* Copy between every (rank, batch, half) piece of ranks and its chunk of seq. */
static void cp_reorder(kern_stream_t *s, tensor_t *seq, tensor_t *ranks, int cp, bool to_seq)
{
    const char *op = to_seq ? "cp_attn_to_seq" : "cp_attn_to_ranks";
    if (seq->ndim != 4 || ranks->ndim != 4 || cp < 1 || seq->shape[1] % (2 * cp) ||
        ranks->shape[0] != cp * seq->shape[0] || ranks->shape[1] * cp != seq->shape[1] ||
        ranks->shape[2] != seq->shape[2] || ranks->shape[3] != seq->shape[3])
        BT_PANIC("%s: ranks %s and seq %s are not [cp*B,2L,H,Dh] and [B,2L*cp,H,Dh] (cp = %d)",
                 op, kern_shape_str(ranks).s, kern_shape_str(seq).s, cp);
    int64_t B = seq->shape[0], L = seq->shape[1] / (2 * cp);
    for (int r = 0; r < cp; r++)
        for (int64_t b = 0; b < B; b++)
            for (int h = 0; h < 2; h++) {
                tensor_t pr = cp_piece(ranks, (int64_t)cp * B * 2, L, ((int64_t)r * B + b) * 2 + h);
                tensor_t ps = cp_piece(seq, B * 2 * cp, L, b * 2 * cp + cp_attn_chunk(cp, r, h));
                if (to_seq) kern_copy(s, &ps, &pr);
                else kern_copy(s, &pr, &ps);
            }
}

void cp_attn_to_seq(kern_stream_t *s, tensor_t *seq, const tensor_t *ranks, int cp)
{
    cp_reorder(s, seq, (tensor_t *)ranks, cp, true);
}

void cp_attn_to_ranks(kern_stream_t *s, tensor_t *ranks, const tensor_t *seq, int cp)
{
    cp_reorder(s, (tensor_t *)seq, ranks, cp, false);
}

/* Local tokens per chunk, checking q against the sequence-order k. */
static int64_t cp_attn_L(const char *op, const tensor_t *q, const tensor_t *k, int cp, int rank)
{
    if (q->ndim != 4 || k->ndim != 4 || cp < 1 || rank < 0 || rank >= cp ||
        q->shape[1] % 2 || k->shape[1] != q->shape[1] * cp || k->shape[0] != q->shape[0])
        BT_PANIC("%s: q %s (local, 2 chunks) and k %s (whole sequence) do not fit cp = %d "
                 "rank %d",
                 op, kern_shape_str(q).s, kern_shape_str(k).s, cp, rank);
    return q->shape[1] / 2;
}

/* [1, Hq, L] lse view of (b, half) of lse [B,2,Hq,L]. */
static tensor_t cp_lse_piece(const tensor_t *lse, int64_t B, int64_t Hq, int64_t L, int64_t i)
{
    if (tensor_numel(lse) != B * 2 * Hq * L)
        BT_PANIC("cp_attn: lse %s is not [B,2,Hq,L] = [%lld,2,%lld,%lld]", kern_shape_str(lse).s,
                 (long long)B, (long long)Hq, (long long)L);
    int64_t sh[3] = {B * 2, Hq, L};
    tensor_t r = tensor_reshape(lse, 3, sh);
    return tensor_narrow(&r, i, 1);
}

void cp_attn_fwd(kern_stream_t *s, tensor_t *out, tensor_t *lse, const tensor_t *q,
                 const tensor_t *k, const tensor_t *v, float scale, int cp, int rank)
{
    int64_t L = cp_attn_L("cp_attn_fwd", q, k, cp, rank), B = q->shape[0];
    for (int64_t b = 0; b < B; b++)
        for (int h = 0; h < 2; h++) {
            int64_t c = cp_attn_chunk(cp, rank, h), i = b * 2 + h;
            tensor_t qp = cp_piece(q, B * 2, L, i), op = cp_piece(out, B * 2, L, i);
            tensor_t lp = cp_lse_piece(lse, B, q->shape[2], L, i);
            tensor_t kp = cp_prefix(k, b, (c + 1) * L), vp = cp_prefix(v, b, (c + 1) * L);
            kern_attention_fwd(s, &op, &lp, &qp, &kp, &vp, scale, true, c * L);
        }
}

void cp_attn_bwd(kern_stream_t *s, tensor_t *dq, tensor_t *dk, tensor_t *dv,
                 const tensor_t *dout, const tensor_t *q, const tensor_t *k, const tensor_t *v,
                 const tensor_t *out, const tensor_t *lse, float scale, int cp, int rank)
{
    int64_t L = cp_attn_L("cp_attn_bwd", q, k, cp, rank), B = q->shape[0];
    for (int64_t b = 0; b < B; b++)
        for (int h = 0; h < 2; h++) {
            int64_t c = cp_attn_chunk(cp, rank, h), i = b * 2 + h, n = (c + 1) * L;
            tensor_t qp = cp_piece(q, B * 2, L, i), op = cp_piece(out, B * 2, L, i);
            tensor_t gp = cp_piece(dout, B * 2, L, i);
            tensor_t lp = cp_lse_piece(lse, B, q->shape[2], L, i);
            tensor_t kp = cp_prefix(k, b, n), vp = cp_prefix(v, b, n);
            tensor_t dqp, dkp, dvp;
            if (dq) dqp = cp_piece(dq, B * 2, L, i);
            if (dk) dkp = cp_prefix(dk, b, n);
            if (dv) dvp = cp_prefix(dv, b, n);
            kern_attention_bwd(s, dq ? &dqp : NULL, dk ? &dkp : NULL, dv ? &dvp : NULL, &gp, &qp,
                               &kp, &vp, &op, &lp, scale, true, c * L);
        }
}

/* How local chunk half hq of `rank` sees chunk half hk of `src`: -1 not at
 * all (it follows), 0 causally (the same chunk), 1 wholly (it precedes). */
static int cp_ring_sees(int cp, int rank, int hq, int src, int hk)
{
    int cq = cp_attn_chunk(cp, rank, hq), ck = cp_attn_chunk(cp, src, hk);
    return ck > cq ? -1 : ck == cq ? 0 : 1;
}

static int64_t cp_ring_L(const char *op, const tensor_t *q, const tensor_t *k_blk, int cp,
                         int rank, int src)
{
    if (q->ndim != 4 || k_blk->ndim != 4 || cp < 1 || rank < 0 || rank >= cp || src < 0 ||
        src >= cp || q->shape[1] % 2 || k_blk->shape[1] != q->shape[1] ||
        k_blk->shape[0] != q->shape[0])
        BT_PANIC("%s: q %s and the block k %s are not both [B,2L,..] local chunks (cp = %d, "
                 "rank %d, src %d)",
                 op, kern_shape_str(q).s, kern_shape_str(k_blk).s, cp, rank, src);
    return q->shape[1] / 2;
}

void cp_attn_ring_fwd(kern_stream_t *s, tensor_t *out, tensor_t *lse, tensor_t *part_out,
                      tensor_t *part_lse, const tensor_t *q, const tensor_t *k_blk,
                      const tensor_t *v_blk, float scale, int cp, int rank, int src)
{
    int64_t L = cp_ring_L("cp_attn_ring_fwd", q, k_blk, cp, rank, src), B = q->shape[0];
    /* the own block's diagonal pieces first: they initialise every local row */
    for (int64_t b = 0; b < B; b++)
        for (int pass = 0; pass < 2; pass++)
            for (int hq = 0; hq < 2; hq++)
                for (int hk = 0; hk < 2; hk++) {
                    int how = cp_ring_sees(cp, rank, hq, src, hk);
                    if (how < 0 || (pass == 0) != (how == 0)) continue;
                    int64_t i = b * 2 + hq;
                    tensor_t qp = cp_piece(q, B * 2, L, i), op = cp_piece(out, B * 2, L, i);
                    tensor_t lp = cp_lse_piece(lse, B, q->shape[2], L, i);
                    tensor_t kp = cp_piece(k_blk, B * 2, L, b * 2 + hk);
                    tensor_t vp = cp_piece(v_blk, B * 2, L, b * 2 + hk);
                    if (how == 0) {
                        kern_attention_fwd(s, &op, &lp, &qp, &kp, &vp, scale, true, 0);
                    } else {
                        kern_attention_fwd(s, part_out, part_lse, &qp, &kp, &vp, scale, false, 0);
                        kern_attention_merge(s, &op, &lp, part_out, part_lse);
                    }
                }
}

void cp_attn_ring_bwd(kern_stream_t *s, tensor_t *dq, tensor_t *dk_blk, tensor_t *dv_blk,
                      const tensor_t *dout, const tensor_t *q, const tensor_t *k_blk,
                      const tensor_t *v_blk, const tensor_t *out, const tensor_t *lse,
                      float scale, int cp, int rank, int src)
{
    int64_t L = cp_ring_L("cp_attn_ring_bwd", q, k_blk, cp, rank, src), B = q->shape[0];
    for (int64_t b = 0; b < B; b++)
        for (int hq = 0; hq < 2; hq++)
            for (int hk = 0; hk < 2; hk++) {
                int how = cp_ring_sees(cp, rank, hq, src, hk);
                if (how < 0) continue;
                int64_t i = b * 2 + hq, j = b * 2 + hk;
                tensor_t qp = cp_piece(q, B * 2, L, i), op = cp_piece(out, B * 2, L, i);
                tensor_t gp = cp_piece(dout, B * 2, L, i);
                tensor_t lp = cp_lse_piece(lse, B, q->shape[2], L, i);
                tensor_t kp = cp_piece(k_blk, B * 2, L, j), vp = cp_piece(v_blk, B * 2, L, j);
                tensor_t dqp, dkp, dvp;
                if (dq) dqp = cp_piece(dq, B * 2, L, i);
                if (dk_blk) dkp = cp_piece(dk_blk, B * 2, L, j);
                if (dv_blk) dvp = cp_piece(dv_blk, B * 2, L, j);
                kern_attention_bwd(s, dq ? &dqp : NULL, dk_blk ? &dkp : NULL,
                                   dv_blk ? &dvp : NULL, &gp, &qp, &kp, &vp, &op, &lp, scale,
                                   how == 0, 0);
            }
}
