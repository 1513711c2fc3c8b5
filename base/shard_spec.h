/* One description of how a tensor is split, for loading, initialisation,
 * export, optimizer sharding and checkpoints alike.
 *
 * A piece of a tensor of global shape G[ndim] is a box (offset[d],
 * extent[d] per dimension) and, optionally, a flat range [flat_start,
 * flat_start + flat_len) of that box's elements in row-major order. Boxes
 * describe tensor-, expert- and context-parallel splits (whole slices along
 * a dimension); the flat range describes a ZeRO-1 partition, which cuts the
 * flattened parameters at arbitrary element boundaries. A piece's data is
 * stored densely: the box row-major, or just the flat range of it.
 *
 * The group says over which parallel group the piece was cut (for messages
 * and for checkpoints, which record it); the arithmetic never needs it.
 *
 *   shard_spec_t whole = shard_whole(2, (int64_t[]){V, C});
 *   shard_spec_t mine  = shard_split(&whole, 0, SHARD_GROUP_TP, r, tp, 1);
 *   shard_copy(&mine, buf_mine, &whole, buf_whole, 4);   // slice
 *   shard_copy(&whole, buf_whole, &mine, buf_mine, 4);   // assemble
 * shard_copy moves exactly the elements both pieces hold, so loading any
 * stored pieces into any wanted piece is a loop over the stored ones.
 */
#ifndef BT_BASE_SHARD_SPEC_H
#define BT_BASE_SHARD_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHARD_MAX_DIMS 4

typedef enum {
    SHARD_GROUP_NONE = 0, /* not split (a whole tensor, or a replica) */
    SHARD_GROUP_TP,       /* tensor parallel */
    SHARD_GROUP_EP,       /* expert parallel */
    SHARD_GROUP_CP,       /* context parallel */
    SHARD_GROUP_DP,       /* data-parallel optimizer partition (ZeRO-1) */
    SHARD_GROUP_COUNT,
} shard_group_t;

typedef struct {
    int           ndim;
    int64_t       global[SHARD_MAX_DIMS];
    int64_t       offset[SHARD_MAX_DIMS];
    int64_t       extent[SHARD_MAX_DIMS];
    int64_t       flat_start, flat_len; /* flat_len < 0: the whole box */
    shard_group_t group;
    int           split_dim;            /* -1: not split along a dimension */
    int64_t       unit;                 /* the split's granularity along split_dim */
    int           rank, size;           /* place in the group (0, 1 when not split) */
} shard_spec_t;

const char *shard_group_name(shard_group_t g); /* "tp", "ep", ... */

/* The whole tensor of shape[ndim] (ndim in 1..SHARD_MAX_DIMS). */
shard_spec_t shard_whole(int ndim, const int64_t *shape);
/* Rank r of `size`'s part of `of` along dimension dim: `of`'s extent there
 * cut into near-even runs of whole units (unit elements each; the first
 * (extent/unit) % size ranks get one unit more). `of` must have no flat
 * range. Units: 1 for a vocabulary, head_dim for attention heads. */
shard_spec_t shard_split(const shard_spec_t *of, int dim, shard_group_t group, int r, int size,
                         int64_t unit);
/* The flat range [start, start + len) of `of`'s box (ZeRO-1). */
shard_spec_t shard_flat(const shard_spec_t *of, shard_group_t group, int r, int size,
                        int64_t start, int64_t len);

/* Elements a piece holds (box, or its flat range). */
int64_t shard_numel(const shard_spec_t *s);
int64_t shard_global_numel(const shard_spec_t *s);
/* The shape of the piece's box, for a view of its data (flat pieces: 1-D). */
int     shard_local_shape(const shard_spec_t *s, int64_t *shape);
bool    shard_is_whole(const shard_spec_t *s);
bool    shard_same_global(const shard_spec_t *a, const shard_spec_t *b);
/* Global row-major index of the piece's k-th stored element. */
int64_t shard_global_index(const shard_spec_t *s, int64_t k);
/* Whether a and b share at least one element; *out (may be NULL) the
 * intersection of their boxes (flat ranges are not intersected). */
bool    shard_overlap(const shard_spec_t *a, const shard_spec_t *b, shard_spec_t *out);

/* dst_data (laid out as dst) receives every element that both dst and src
 * hold, from src_data (laid out as src); elem bytes each. The global shapes
 * must match. Returns the number of elements copied. Host memory. */
int64_t shard_copy(const shard_spec_t *dst, void *dst_data, const shard_spec_t *src,
                   const void *src_data, size_t elem);

/* The contiguous runs of src's data that cover its overlap with dst, in
 * order: fn(arg, src_elem_offset, dst_elem_offset, n) for each. shard_copy
 * is this with memcpy; a loader uses it to read only the bytes it needs
 * from a file. Returns the elements visited. */
typedef void (*shard_run_fn)(void *arg, int64_t src_off, int64_t dst_off, int64_t n);
int64_t shard_runs(const shard_spec_t *dst, const shard_spec_t *src, shard_run_fn fn, void *arg);

/* "tp 1/2 dim 0 [512:1024, 0:64] of [1024, 64]" into buf; returns buf. */
#define SHARD_STR_MAX 160
const char *shard_str(const shard_spec_t *s, char *buf);

#endif
