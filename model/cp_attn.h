/* Context-parallel attention core, shared by every attention kind.
 *
 * Chunk layout (causal load balancing): a sequence of T tokens is cut into
 * 2*cp chunks of L = T / (2*cp) tokens; CP rank r holds chunks r and
 * 2*cp-1-r, in that order, as its local [B, 2L, ...] tensors. Every rank then
 * has the same share of the causal triangle.
 *
 * The core takes a kind's own q [B,2L,Hq,D], k [.., Hkv, D] and v
 * [.., Hkv, Dv] (Dv may differ from D, as in MLA): K and V are separate
 * tensors with their own head sizes and are never concatenated. The caller
 * moves them between ranks (all-gather mode: one all-gather of K and one of V
 * over the CP group, a reduce-scatter of dK and of dV in backward); the core
 * computes.
 *
 * All-gather mode. A gathered tensor in rank order is [cp*B, 2L, H, Dh]
 * (what an all-gather of every rank's [B,2L,H,Dh] gives); cp_attn_to_seq
 * puts it in sequence order [B, T, H, Dh], cp_attn_to_ranks goes back (for
 * dK, dV before the reduce-scatter). cp_attn_fwd then runs each local chunk
 * c against the key prefix [0, (c+1)L) with the causal mask offset by c*L:
 * exact attention, no merging. Its lse is [B, 2, Hq, L] (local chunk
 * halves), consumed only by cp_attn_bwd. */
#ifndef BT_MODEL_CP_ATTN_H
#define BT_MODEL_CP_ATTN_H

#include "base/tensor.h"
#include "kernels/kernels.h"

#include <stdint.h>

/* Global index of local chunk half (0 or 1) of CP rank `rank`. */
static inline int cp_attn_chunk(int cp, int rank, int half)
{
    return half == 0 ? rank : 2 * cp - 1 - rank;
}

/* pos[B * 2L]: the global position of every local token of CP rank `rank`
 * (for kern_rope's pos tensor and the loss). */
void cp_attn_positions(int32_t *pos, int64_t B, int64_t L, int cp, int rank);

/* dst [B,2L,...] = rank `rank`'s chunks of src [B,T,...] (host data of
 * `row` bytes a token; the data actor's ids and targets, tests). */
void cp_attn_split_host(void *dst, const void *src, int64_t B, int64_t T, size_t row, int cp,
                        int rank);

/* seq [B,T,H,Dh] = the rank-order gathered tensor ranks [cp*B,2L,H,Dh]. */
void cp_attn_to_seq(kern_stream_t *s, tensor_t *seq, const tensor_t *ranks, int cp);
/* ranks [cp*B,2L,H,Dh] = seq [B,T,H,Dh] in rank order (the inverse). */
void cp_attn_to_ranks(kern_stream_t *s, tensor_t *ranks, const tensor_t *seq, int cp);

/* out [B,2L,Hq,Dv], lse [B,2,Hq,L] of the local q [B,2L,Hq,D] against the
 * sequence-order k [B,T,Hkv,D], v [B,T,Hkv,Dv]; causal. */
void cp_attn_fwd(kern_stream_t *s, tensor_t *out, tensor_t *lse, const tensor_t *q,
                 const tensor_t *k, const tensor_t *v, float scale, int cp, int rank);
/* dq [B,2L,Hq,D], dk [B,T,Hkv,D], dv [B,T,Hkv,Dv] accumulate (dk, dv are
 * this rank's partial sums in sequence order: to_ranks, then reduce-scatter). */
void cp_attn_bwd(kern_stream_t *s, tensor_t *dq, tensor_t *dk, tensor_t *dv,
                 const tensor_t *dout, const tensor_t *q, const tensor_t *k, const tensor_t *v,
                 const tensor_t *out, const tensor_t *lse, float scale, int cp, int rank);

/* Ring mode. Each step brings one CP rank's K/V block, k_blk [B,2L,Hkv,D]
 * and v_blk [B,2L,Hkv,Dv] (rank src's local chunks, as it holds them); the
 * local chunks attend to the block's chunks that precede them (the
 * diagonal chunk causally) and the result is merged into out, lse by
 * log-sum-exp (kern_attention_merge). The first call of a forward must be
 * the rank's own block (src == rank): it initialises out and lse. part_out
 * [1,L,Hq,Dv] and part_lse [1,Hq,L] are scratch. Every other block costs
 * each rank two L x L products, whatever src is: the load balance of the
 * chunk layout. */
void cp_attn_ring_fwd(kern_stream_t *s, tensor_t *out, tensor_t *lse, tensor_t *part_out,
                      tensor_t *part_lse, const tensor_t *q, const tensor_t *k_blk,
                      const tensor_t *v_blk, float scale, int cp, int rank, int src);
/* Backward of one ring step against the merged out and lse of the forward:
 * dq [B,2L,Hq,D] accumulates; dk_blk, dv_blk (rank src's block's gradients,
 * travelling back around the ring to src) accumulate this rank's share. */
void cp_attn_ring_bwd(kern_stream_t *s, tensor_t *dq, tensor_t *dk_blk, tensor_t *dv_blk,
                      const tensor_t *dout, const tensor_t *q, const tensor_t *k_blk,
                      const tensor_t *v_blk, const tensor_t *out, const tensor_t *lse,
                      float scale, int cp, int rank, int src);

#endif
