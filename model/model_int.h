/* Internals shared by the model's own files (model.c, run.c, tp.c). */
#ifndef BT_MODEL_MODEL_INT_H
#define BT_MODEL_MODEL_INT_H

#include "coll/coll.h"
#include "model/model.h"

/* This TP rank's near-even share [*start, *start + *count) of the vocabulary. */
void        model_vocab_split(int64_t vocab, int tp_size, int tp_rank, int64_t *start,
                              int64_t *count);
/* m's host staging buffer, grown to at least bytes. */
bt_status_t model_host_buf(model_t *m, size_t bytes, void **out);
/* t reduced in place over the TP group with op (staged through host memory
 * when the collective cannot take m's device memory). */
bt_status_t model_tp_reduce(model_t *m, tensor_t *t, coll_op_t op, const char *what, int layer);
/* t (a tensor of m's device in its own dtype) = host[numel] f32, and back. */
bt_status_t model_tensor_write_f32(model_t *m, tensor_t *t, const float *host);
bt_status_t model_tensor_read_f32(const model_t *m, const tensor_t *t, float *host);
/* Bytes of the activation arena of B x T that model_acts_create (mode
 * MODEL_ACTS_TRAIN), model_acts_create_fwd (_FWD) or
 * model_acts_create_decode (_DECODE, B = 1) would allocate (a double: never
 * wrapped). */
enum { MODEL_ACTS_TRAIN = 0, MODEL_ACTS_FWD, MODEL_ACTS_DECODE };
double      model_acts_plan_bytes(const model_t *m, int64_t B, int64_t T, int mode);
/* Sparse layer k's (model_t.moe_load_mem) load [E] (which 0), its scratch (1)
 * or its selection bias (2). */
tensor_t    model_moe_load_view(const model_t *m, int k, int which);
/* Whether the collective can work on memory of m's device directly. */
bool        model_coll_direct(const model_t *m, const coll_comm_t *c);

#endif
