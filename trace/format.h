/* On-disk layout of a trace file (private to trace/record.c and trace/read.c).
 *
 *   trace_file_hdr_t                      magic, version, rank, pid, record size
 *   { trace_blk_t, body }*                blocks in write order
 *   trace_blk_t kind END                  written by trace_stop (clean close)
 *
 * Block kinds: RECS (count records of thread arg), DROPPED (count events
 * thread arg dropped), NAME (id arg), ACTOR (actor arg), THREAD (thread arg),
 * RUN (the run id, launch/rundir.h: right after the header when the
 * process belongs to a run): string bodies of len bytes, no NUL. CLOCK (version 2): a trace_clock_blk_t,
 * two (ticks, CLOCK_MONOTONIC ns) samples; records flagged TRACE_REC_TICKS
 * hold ticks, which the reader converts with the rate between the last CLOCK
 * block's samples (the writer's longest base, so the best rate). The kind's top 16 bits are a block
 * magic so that a reader notices garbage at once. Host byte order: files are
 * read on the machine (or architecture) that wrote them.
 */
#ifndef BT_TRACE_FORMAT_H
#define BT_TRACE_FORMAT_H

#include <stdint.h>

#define TRACE_STR_MAX 48 /* names, NUL included */

typedef struct {
    uint32_t magic;      /* TRACE_MAGIC */
    uint32_t version;    /* TRACE_VERSION */
    uint32_t rank;
    uint32_t pid;
    uint32_t rec_size;   /* sizeof(trace_rec_t) */
    uint32_t reserved;
    uint64_t t_start_ns;
} trace_file_hdr_t;

#define TRACE_BLK_MAGIC 0xB7C00000u
#define TRACE_BLK_MAGIC_MASK 0xFFFF0000u

enum {
    TRACE_BLK_RECS = 1,
    TRACE_BLK_DROPPED,
    TRACE_BLK_NAME,
    TRACE_BLK_ACTOR,
    TRACE_BLK_THREAD,
    TRACE_BLK_END,
    TRACE_BLK_CLOCK,
    TRACE_BLK_RUN,
};

typedef struct {
    uint64_t ticks0, ns0;   /* at the first trace_start of the process */
    uint64_t ticks1, ns1;   /* at this drain; ns1 - ns0 >= 2 ms */
} trace_clock_blk_t;

typedef struct {
    uint32_t kind;   /* TRACE_BLK_MAGIC | TRACE_BLK_* */
    uint32_t arg;
    uint32_t count;
    uint32_t len;    /* body bytes */
} trace_blk_t;

#endif
