/* The CP ring over actor messages (train/cp_ring.h). */
#include "train/cp_ring.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "actors/worker.h"
#include "base/log.h"
#include "kernels/kernels.h"

static const char *const tensor_names[] = {"?", "k", "v", "dk", "dv"};
static const char *const tensor_upper[] = {"?", "K", "V", "dK", "dV"};

bool cp_ring_is_peer(const cp_ring_t *r, int rank)
{
    return rank == (int)actor_addr_rank(r->cfg.next) || rank == (int)actor_addr_rank(r->cfg.prev);
}

bt_status_t cp_ring_init(cp_ring_t *r, const cp_ring_config_t *cfg)
{
    memset(r, 0, sizeof *r);
    if (cfg->cp_size < 2 || cfg->cp_size > CP_RING_MAX || !cfg->cp_ranks || !cfg->stage)
        return BT_ERR_INVALID;
    r->cfg = *cfg;
    memcpy(r->ranks, cfg->cp_ranks, (size_t)cfg->cp_size * sizeof *r->ranks);
    r->cfg.cp_ranks = r->ranks;
    size_t at = (size_t)snprintf(r->group, sizeof r->group, "CP group of ranks");
    for (int i = 0; i < cfg->cp_size && at + 12 < sizeof r->group; i++)
        at += (size_t)snprintf(r->group + at, sizeof r->group - at, " %d", r->ranks[i]);
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca)) return BT_ERR_NOMEM;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int e = pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (e) return BT_ERR_NOMEM;
    if (pthread_mutex_init(&r->mu, NULL)) {
        pthread_cond_destroy(&r->cv);
        return BT_ERR_NOMEM;
    }
    r->kill_rank = -1;
    const char *k = getenv("BATON_TEST_CP_KILL");
    long long ks;
    if (k && sscanf(k, "%d:%lld:%d", &r->kill_rank, &ks, &r->kill_layer) == 3) r->kill_step = ks;
    else r->kill_rank = -1;
    return BT_OK;
}

void cp_ring_fini(cp_ring_t *r)
{
    if (!r->cfg.stage) return;
    while (r->head) {
        actor_msg_t *m = (actor_msg_t *)r->head;
        r->head = m->item.next;
        actor_msg_free(m);
    }
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    memset(r, 0, sizeof *r);
}

void cp_ring_context(cp_ring_t *r, int64_t step, int32_t mb, uint32_t chunk)
{
    r->step = step;
    r->mb = mb;
    r->chunk = chunk;
}

void cp_ring_fail(cp_ring_t *r, bt_status_t status, const char *why)
{
    pthread_mutex_lock(&r->mu);
    if (!r->failed) {
        r->failed = status ? status : BT_ERR_CANCELED;
        snprintf(r->why, sizeof r->why, "%s", why);
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* ---- compute thread --------------------------------------------------------- */

static struct timespec deadline(double s)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double whole = (double)(long long)s;
    t.tv_sec += (time_t)whole;
    t.tv_nsec += (long)((s - whole) * 1e9);
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

static const char *pass_name(uint32_t phase) { return phase == MODEL_CP_FWD ? "forward" : "backward"; }

/* The one error of a block that will not come (or go). */
static bt_status_t block_error(const cp_ring_t *r, const model_cp_tag_t *tag, bool sending,
                               bt_status_t st, const char *reason)
{
    int peer = sending ? (r->cfg.cp_rank + 1) % r->cfg.cp_size
                       : (r->cfg.cp_rank + r->cfg.cp_size - 1) % r->cfg.cp_size;
    log_error("rank %d: CP ring (%s; CP rank %d of %d), step %lld microbatch %d, layer %d, %s ring "
              "step %u: the %s block %s CP rank %d (rank %d) %s",
              r->cfg.rank, r->group, r->cfg.cp_rank, r->cfg.cp_size, (long long)r->step, (int)r->mb,
              (int)tag->layer, pass_name(tag->phase), tag->ring_step,
              tag->what <= MODEL_CP_DV ? tensor_upper[tag->what] : "?", sending ? "for" : "from", peer,
              r->ranks[peer], reason);
    return st;
}

static void block_sent(void *arg)
{
    cp_ring_t *r = arg;
    pthread_mutex_lock(&r->mu);
    r->in_flight--;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void block_drop(void *arg) { actor_msg_free(arg); }

static bt_status_t ring_send(void *arg, model_t *mod, const model_cp_tag_t *tag, const tensor_t *t)
{
    cp_ring_t *r = arg;
    if (r->kill_rank == r->cfg.rank && r->kill_step == r->step && r->kill_layer == tag->layer &&
        tag->phase == MODEL_CP_FWD && tag->ring_step == 0 && tag->what == MODEL_CP_K) {
        fprintf(stderr, "baton: fault injection: rank %d killed before sending its K block of layer %d "
                        "in step %lld\n", r->cfg.rank, (int)tag->layer, (long long)r->step);
        fflush(stderr);
        kill(getpid(), SIGKILL);
    }
    if (tag->what < MODEL_CP_K || tag->what > MODEL_CP_DV) BT_PANIC("cp ring: tensor %u", tag->what);
    /* the window: wait for the wire when this peer has CP_RING_WINDOW blocks queued */
    pthread_mutex_lock(&r->mu);
    struct timespec until = deadline(r->cfg.timeout_s);
    int e = 0;
    while (!r->failed && r->in_flight >= CP_RING_WINDOW && e != ETIMEDOUT)
        e = pthread_cond_timedwait(&r->cv, &r->mu, &until);
    bt_status_t failed = r->failed;
    char why[sizeof r->why];
    snprintf(why, sizeof why, "%s", r->why);
    bool go = !failed && r->in_flight < CP_RING_WINDOW;
    if (go) r->in_flight++;
    pthread_mutex_unlock(&r->mu);
    if (failed) {
        char reason[300];
        snprintf(reason, sizeof reason, "cannot be sent: %s", why);
        return block_error(r, tag, true, failed, reason);
    }
    if (!go) {
        char reason[160];
        snprintf(reason, sizeof reason, "cannot be sent: %u blocks still on their way after %.0f s "
                                        "(launch.step_timeout)", CP_RING_WINDOW, r->cfg.timeout_s);
        return block_error(r, tag, true, BT_ERR_TIMEOUT, reason);
    }
    actor_msg_t *m = actor_msg_new(MSG_CP_BLOCK);
    tensor_t *v = m ? actor_msg_tensor_new(m, tensor_names[tag->what], t->dtype, t->ndim, t->shape) : NULL;
    if (!v) {
        if (m) actor_msg_free(m);
        block_sent(r);
        return block_error(r, tag, true, BT_ERR_NOMEM, "cannot be sent: out of memory");
    }
    m->env.step = r->step;
    m->env.mb = r->mb;
    m->body.cp_block = (msg_cp_block_t){.chunk = r->chunk, .layer = tag->layer, .phase = tag->phase,
                                        .ring_step = tag->ring_step, .what = tag->what};
    kern_download(mod->stream, v->data, t);
    bt_status_t st = kern_stream_sync(mod->stream);
    if (st) {
        actor_msg_free(m);
        block_sent(r);
        return block_error(r, tag, true, st, "cannot be sent: the copy to the host failed");
    }
    actor_msg_on_free(m, block_sent, r); /* the transport wrote it (or it was dropped) */
    r->sent++;
    actor_complete_owned(r->cfg.stage, CP_RING_JOB_SEND, m, BT_OK, block_drop);
    return BT_OK;
}

static bool tag_is(const actor_msg_t *m, const cp_ring_t *r, const model_cp_tag_t *tag)
{
    const msg_cp_block_t *b = &m->body.cp_block;
    return m->env.step == r->step && m->env.mb == r->mb && b->chunk == r->chunk &&
           b->layer == tag->layer && b->phase == tag->phase && b->ring_step == tag->ring_step &&
           b->what == tag->what;
}

static bt_status_t ring_recv(void *arg, model_t *mod, const model_cp_tag_t *tag, tensor_t *t)
{
    cp_ring_t *r = arg;
    actor_msg_t *got = NULL;
    pthread_mutex_lock(&r->mu);
    struct timespec until = deadline(r->cfg.timeout_s);
    int e = 0;
    for (;;) {
        actor_item_t **pp = &r->head;
        while (*pp && !tag_is((actor_msg_t *)*pp, r, tag)) pp = &(*pp)->next;
        if (*pp) {
            got = (actor_msg_t *)*pp;
            *pp = got->item.next;
            r->held--;
            break;
        }
        if (r->failed || e == ETIMEDOUT) break;
        e = pthread_cond_timedwait(&r->cv, &r->mu, &until);
    }
    bt_status_t failed = r->failed;
    char why[sizeof r->why];
    snprintf(why, sizeof why, "%s", r->why);
    pthread_mutex_unlock(&r->mu);
    if (!got) {
        char reason[300];
        if (failed) snprintf(reason, sizeof reason, "will not come: %s", why);
        else snprintf(reason, sizeof reason, "did not arrive within %.0f s (launch.step_timeout)",
                      r->cfg.timeout_s);
        return block_error(r, tag, false, failed ? failed : BT_ERR_TIMEOUT, reason);
    }
    const tensor_t *p = &got->tensors[0];
    if (tensor_numel(p) != tensor_numel(t) || p->dtype != t->dtype) {
        char reason[200];
        snprintf(reason, sizeof reason, "has %lld elements of %s, where %lld of %s were expected",
                 (long long)tensor_numel(p), dtype_name(p->dtype), (long long)tensor_numel(t),
                 dtype_name(t->dtype));
        actor_msg_free(got);
        return block_error(r, tag, false, BT_ERR_PEER_PROTO, reason);
    }
    kern_upload(mod->stream, t, p->data);
    bt_status_t st = kern_stream_sync(mod->stream); /* the payload goes back to the transport */
    actor_msg_free(got);
    r->received++;
    if (st) return block_error(r, tag, false, st, "could not be copied to the device");
    return BT_OK;
}

const model_cp_msg_ops_t cp_ring_ops = {.send = ring_send, .recv = ring_recv};

/* ---- stage loop ------------------------------------------------------------- */

void cp_ring_send(cp_ring_t *r, actor_msg_t *m)
{
    bt_status_t st = actor_send(r->cfg.stage, r->cfg.next, m);
    if (st && st != BT_ERR_BUSY) { /* freed: the window slot is back */
        char why[160];
        snprintf(why, sizeof why, "the CP_BLOCK to rank %u was not delivered (%s)",
                 actor_addr_rank(r->cfg.next), bt_status_str(st));
        cp_ring_fail(r, st, why);
    }
}

actor_ret_t cp_ring_on_block(cp_ring_t *r, actor_msg_t *m)
{
    const msg_cp_block_t *b = &m->body.cp_block;
    if (m->env.src != r->cfg.prev || m->env.ntensors != 1 ||
        strcmp(m->env.tensors[0].name, tensor_names[b->what]) || m->env.mb < 0) {
        log_error("rank %d: CP_BLOCK from %#x (%s of layer %d, ring step %u) does not belong here "
                  "(%s: blocks come from rank %u's stage); dropped",
                  r->cfg.rank, m->env.src, tensor_upper[b->what], (int)b->layer, b->ring_step,
                  r->group, actor_addr_rank(r->cfg.prev));
        return ACTOR_DONE;
    }
    pthread_mutex_lock(&r->mu);
    m->item.next = NULL;
    actor_item_t **pp = &r->head;
    while (*pp) pp = &(*pp)->next;
    *pp = &m->item;
    r->held++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return ACTOR_KEPT;
}
