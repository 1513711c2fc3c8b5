/* Workers: a compute thread per device.
 *
 * Handlers never block, so long work (a forward pass, a checkpoint write) is
 * submitted to a worker: fn(arg) runs on the worker's thread, jobs in
 * submission order, and when it returns the submitting actor receives an
 * ACTOR_SYS_WORK_DONE message on its own loop with m->sys.work = {tag, arg,
 * status}. This is the shape CUDA streams take later: submit, then a
 * completion message.
 *
 * arg belongs to the actor again when the completion arrives. If the actor
 * stopped before that, or the worker is destroyed before the job started,
 * cleanup(arg) runs instead (when given) so nothing leaks.
 */
#ifndef BT_ACTORS_WORKER_H
#define BT_ACTORS_WORKER_H

#include <stdbool.h>
#include <stdint.h>

#include "actors/actor.h"

typedef struct actor_worker actor_worker_t;

bt_status_t actor_worker_create(const char *name, actor_worker_t **out);
/* Queue a job (any thread). BT_ERR_CANCELED once the worker is stopping. */
bt_status_t actor_worker_submit(actor_worker_t *w, actor_t *self, actor_work_fn fn, void *arg,
                                actor_free_fn cleanup, uint64_t tag);
/* Reports work that finished elsewhere (a collective's or a device
 * stream's completion callback) to self from any thread: self receives the
 * same ACTOR_SYS_WORK_DONE {tag, arg, status} a worker job's completion is. */
void        actor_complete(actor_t *self, uint64_t tag, void *arg, bt_status_t status);
/* The same, with cleanup(arg) run instead when self has stopped and the
 * completion is dropped (so what arg owns is not lost). */
void        actor_complete_owned(actor_t *self, uint64_t tag, void *arg, bt_status_t status,
                                 actor_free_fn cleanup);
/* From inside a running job of w (its thread): runs the jobs queued
 * meanwhile, in order, on this thread, until *done is set. For a job that
 * hands part of its work to another actor sharing this worker and waits
 * for the answer (train/expert_actor.h): that actor's job runs here, on
 * the same thread and device stream, while the first is suspended.
 * Whoever sets *done calls actor_worker_wake after. BT_OK once done;
 * BT_ERR_CANCELED when the worker stops first. */
bt_status_t actor_worker_yield_until(actor_worker_t *w, _Atomic bool *done);
void        actor_worker_wake(actor_worker_t *w);
/* Jobs queued or running now. */
uint32_t    actor_worker_backlog(actor_worker_t *w);
/* Stop: the running job finishes (its completion is delivered or dropped),
 * queued jobs that never started are canceled with cleanup(arg); then the
 * thread is joined and the worker freed. */
void        actor_worker_destroy(actor_worker_t *w);

#endif
