/* TensorBoard event files: what `tensorboard --logdir runs/` reads.
 *
 * A file DIR/events.out.tfevents.<seconds>.<host>.<pid> holds TFRecord
 * records (u64 little-endian length, its masked CRC-32C, the bytes, their
 * masked CRC-32C), each an `Event` protobuf message: wall_time (1, double),
 * step (2, int64), then either file_version (3, "brain.Event:2", the first
 * record) or a summary (5) of scalar values (Summary.Value: tag 1,
 * simple_value 2). Only these fields are written; the encoder is the few
 * protobuf wire rules they need (varints, fixed 32/64-bit, length-delimited
 * fields). tests/sh/test_tensorboard.sh reads a run's file back with
 * TensorBoard's own reader. */
#ifndef BT_LAUNCH_TB_H
#define BT_LAUNCH_TB_H

#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

typedef struct {
    FILE *f;
    char  path[1024];
} tb_writer_t;

/* Creates DIR (and parents) and the event file. BT_ERR_IO (logged). */
bt_status_t tb_open(tb_writer_t *w, const char *dir);
/* One scalar `tag` at `step`; NaN and infinities are written as they are
 * (TensorBoard shows them). A write error closes the writer (logged once):
 * the metrics JSON lines still hold every value. */
void        tb_scalar(tb_writer_t *w, const char *tag, int64_t step, double value);
void        tb_close(tb_writer_t *w);

/* CRC-32C (Castagnoli) of n bytes, and TFRecord's masked form (tests). */
uint32_t    tb_crc32c(const void *p, size_t n);
uint32_t    tb_crc_mask(uint32_t crc);

#endif
