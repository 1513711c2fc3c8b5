/* A rank's training state as checkpoint pieces (docs/CHECKPOINTS.md).
 *
 * An item is one piece of one checkpoint tensor that this rank holds on
 * its device: a parameter (its f32 master when it computes in bf16), or an
 * AdamW moment of one ("optim.exp_avg/NAME", "optim.exp_avg_sq/NAME"),
 * described by its shard spec (base/shard_spec.h). The same list serves
 * both directions:
 *   save     ckpt_snapshot_take copies the items this rank stores into one
 *            host block (the only time training waits) and gives the
 *            ckpt_put_t list a writer writes (ckpt_shard_write);
 *   resume   ckpt_items_restore fills every item, stored or not, from a
 *            checkpoint written under any layout (ckpt_read reshards).
 *
 * Who stores what: a piece that several ranks hold identically is stored
 * by one of them, so that the pieces of a checkpoint tile every tensor
 * exactly once:
 *   - data-parallel replicas: replica 0 (with ZeRO-1 every rank stores its
 *     own partition of the optimizer state, and replica 0 the parameters);
 *   - a tensor replicated over the TP group (group "none", e.g. norm
 *     weights): TP rank 0;
 *   - the tied embedding's copy on the head stage: never (the embedding
 *     stage holds the same values; both are restored from it);
 *   - routed experts (split along dimension 0 over EP, keyed by the global
 *     expert index through their shard spec): edp rank 0 of the replicas
 *     of each piece, whatever the caller's flag says (model.h
 *     model_parallel_t; ZeRO-1 partitions, with experts only where edp is
 *     dp, follow the partition rule).
 * The caller says which by the `store` flags; ckpt_items_* apply the TP,
 * expert and tied rules themselves. */
#ifndef BT_TRAIN_CKPT_STATE_H
#define BT_TRAIN_CKPT_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "ckpt/native.h"
#include "model/model.h"
#include "train/optim.h"

#define CKPT_EXP_AVG    "optim.exp_avg/"
#define CKPT_EXP_AVG_SQ "optim.exp_avg_sq/"

typedef struct {
    char           name[CKPT_NAME_MAX];
    shard_spec_t   spec;
    tensor_t       t;      /* device view of shard_numel(spec) contiguous f32 values */
    kern_stream_t *s;      /* the stream its model runs on */
    model_t       *m;      /* a parameter: restored with model_param_write(m, param) */
    int            param;  /* ... (its bf16 copy too); -1 for optimizer state */
    bool           store;  /* this rank writes it */
} ckpt_item_t;

typedef struct ckpt_items {
    ckpt_item_t *v;
    int          n, cap;
} ckpt_items_t;

/* The parameters of m. skip: index of a parameter never stored (the tied
 * head copy), or -1. */
bt_status_t ckpt_items_params(ckpt_items_t *it, model_t *m, bool store, int skip);
/* The moments of o, an optimizer over every parameter of m in m's order
 * (optim_create_for_model). skip as above. */
bt_status_t ckpt_items_optim(ckpt_items_t *it, model_t *m, const optim_t *o, bool store, int skip);
/* The moments of o, an optimizer over 1-D ranges of m's parameter block
 * (a ZeRO-1 partition: each range a flat piece of one parameter). */
bt_status_t ckpt_items_optim_ranges(ckpt_items_t *it, model_t *m, const optim_t *o, bool store);
void        ckpt_items_free(ckpt_items_t *it);

/* The stored items copied to host memory (one block; puts point into it). */
typedef struct {
    ckpt_put_t *puts;
    int         n;
    void       *block;
    size_t      bytes;
    size_t      cap;   /* of block */
} ckpt_snapshot_t;

/* out->block (cap bytes) is reused when it is large enough (a run saving
 * again: no fresh pages to fault in), else replaced. */
bt_status_t ckpt_snapshot_take(const ckpt_items_t *it, ckpt_snapshot_t *out);
void        ckpt_snapshot_free(ckpt_snapshot_t *s);

/* Every item from r. A tensor the checkpoint lacks, or whose global shape
 * differs from the item's (another model), is an error naming it. */
bt_status_t ckpt_items_restore(const ckpt_items_t *it, ckpt_reader_t *r, char *err, size_t errlen);

#endif
