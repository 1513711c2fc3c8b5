#include "launch/worker.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "launch/split.h"
#include <unistd.h>

#include "coll/coll.h"
#include "actors/router.h"
#include "trace/trace.h"
#include "base/clock.h"
#include "base/file.h"
#include "base/log.h"
#include "kernels/kernels.h"
#include "launch/graph.h"
#include "ckpt/store.h"
#include "launch/run_ckpt.h"
#include "launch/run_setup.h"
#include "train/ckpt_state.h"
#include "train/ckpt_writer.h"
#include "train/data_actor.h"
#include "train/expert_actor.h"
#include "train/stage_actor.h"

bt_status_t worker_train_stream(const job_t *job, int32_t **tokens, int64_t *n, uint32_t *vocab)
{
    if (job->data.val_dir[0]) {
        int32_t *val = NULL;
        int64_t n_val = 0;
        uint32_t v2 = 0;
        bt_status_t st = run_stream_load(job->data.dir, tokens, n, vocab);
        if (st) {
            run_data_error("run", job, "data.dir");
            return st;
        }
        if ((st = run_stream_load(job->data.val_dir, &val, &n_val, &v2))) {
            run_data_error("run", job, "data.val_dir");
            free(*tokens);
            return st;
        }
        free(val);
        if (v2 > *vocab) *vocab = v2;
        return BT_OK;
    }
    const int32_t *val;
    int64_t n_val;
    bt_status_t st = run_tokens_load(job->data.dir, job->data.split, tokens, n, &val, &n_val, vocab);
    if (st) run_data_error("run", job, "data.dir");
    return st;
}

bt_status_t run_eval_write(const char *path, const int32_t *ids, const int32_t *targets,
                           int64_t rows, int64_t T)
{
    FILE *f = fopen(path, "wbe");
    if (!f) {
        log_error("cannot create %s: %s", path, strerror(errno));
        return BT_ERR_IO;
    }
    uint32_t head[2] = {RUN_EVAL_MAGIC, RUN_EVAL_VERSION};
    int64_t dims[2] = {rows, T};
    size_t n = (size_t)(rows * T);
    bool ok = fwrite(head, sizeof head, 1, f) == 1 && fwrite(dims, sizeof dims, 1, f) == 1 &&
              fwrite(ids, sizeof *ids, n, f) == n && fwrite(targets, sizeof *targets, n, f) == n;
    if (fclose(f) || !ok) {
        log_error("cannot write %s", path);
        return BT_ERR_IO;
    }
    return BT_OK;
}

bt_status_t run_eval_read(const char *path, bool want_data, int32_t **ids, int32_t **targets,
                          int64_t *rows, int64_t *T)
{
    FILE *f = fopen(path, "rbe");
    if (!f) return BT_ERR_NOT_FOUND;
    uint32_t head[2];
    int64_t dims[2];
    bt_status_t st = BT_ERR_CORRUPT;
    if (fread(head, sizeof head, 1, f) != 1 || fread(dims, sizeof dims, 1, f) != 1 ||
        head[0] != RUN_EVAL_MAGIC || head[1] != RUN_EVAL_VERSION || dims[0] < 0 || dims[1] < 1 ||
        dims[0] > (1ll << 30) / dims[1]) {
        log_error("%s: not an evaluation rows file of version %u", path, RUN_EVAL_VERSION);
        goto close_file;
    }
    *rows = dims[0];
    *T = dims[1];
    if (want_data) {
        size_t n = (size_t)(dims[0] * dims[1]);
        *ids = malloc(n * sizeof **ids + 1);
        *targets = malloc(n * sizeof **targets + 1);
        if (!*ids || !*targets || fread(*ids, sizeof **ids, n, f) != n ||
            fread(*targets, sizeof **targets, n, f) != n) {
            log_error("%s: truncated", path);
            free(*ids);
            free(*targets);
            *ids = *targets = NULL;
            goto close_file;
        }
    }
    st = BT_OK;
close_file:
    fclose(f);
    return st;
}

/* Everything a rank owns, released in reverse order by worker_free. */
typedef struct {
    int            rank;
    bool           eval_only;  /* an evaluation run: no gradients, no optimizer state */
    job_t          job;        /* device: this rank's own (job_rank_device) */
    char           job_device[JOB_DEVICE_MAX]; /* the job file's device field */
    graph_t        g;
    uint8_t        secret[RUN_SECRET_LEN];
    int32_t       *tokens;
    int64_t        n_tokens;
    int32_t       *eval_ids, *eval_targets;
    int64_t        eval_rows;
    model_t       *chunks[STAGE_MAX_CHUNKS];
    int            n_chunks;
    coll_comm_t   *comm[GRAPH_GROUP_COUNT];
    int            members[GRAPH_GROUP_COUNT][GRAPH_MAX_WORLD];
    int            n_members[GRAPH_GROUP_COUNT], me[GRAPH_GROUP_COUNT];
    char           coll_addr[GRAPH_GROUP_COUNT][XPORT_LISTEN_ADDR_MAX];
    actor_router_t *rt;
    dist_optim_t   *opt;
    stage_actor_t  stage;
    data_actor_t   data;
    expert_actor_t experts;    /* the rank's expert group (a model with routed experts) */
    bool           stage_inited, data_inited, experts_inited;
    bool           same_host[GRAPH_MAX_WORLD]; /* rank r runs on this host (the book's "host") */
    ckpt_items_t   items;      /* what this rank's checkpoints hold */
    ckpt_writer_t  writer;
    bool           writer_inited;
    char           run_dir[1024];
    run_ckpt_meta_t resumed;   /* the checkpoint resumed from (pos.step 0: none) */
} worker_t;

static bt_status_t file_read_all(const char *path, char *buf, size_t cap, size_t *len)
{
    FILE *f = fopen(path, "rbe");
    if (!f) return BT_ERR_NOT_FOUND;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0;
    if (len) *len = n;
    return BT_OK;
}

/* The job secret, from the pipe the driver left at descriptor
 * $BATON_SECRET_FD (launch/spawn.h): read once, then the descriptor is
 * closed and the variable dropped, so nothing this process starts sees it. */
static bt_status_t secret_read(worker_t *w)
{
    const char *v = getenv("BATON_SECRET_FD");
    if (!v) {
        log_error("worker: BATON_SECRET_FD is not set (workers are started by `baton run`)");
        return BT_ERR_INVALID;
    }
    char *end;
    errno = 0;
    long fd = strtol(v, &end, 10);
    if (errno || end == v || *end || fd < 0 || fd > INT_MAX) {
        log_error("worker: BATON_SECRET_FD=%s is not a file descriptor number", v);
        return BT_ERR_INVALID;
    }
    size_t got = 0;
    int err = 0;
    while (got < sizeof w->secret) {
        ssize_t n = read((int)fd, w->secret + got, sizeof w->secret - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            err = n < 0 ? errno : 0;
            break;
        }
        got += (size_t)n;
    }
    close((int)fd);
    unsetenv("BATON_SECRET_FD");
    if (got != sizeof w->secret) {
        log_error("worker: the job secret (descriptor %ld) gave %zu bytes, expected %d%s%s", fd, got,
                  RUN_SECRET_LEN, err ? ": " : "", err ? strerror(err) : "");
        return BT_ERR_INVALID;
    }
    return BT_OK;
}

static bt_status_t job_read(worker_t *w, const char *run_dir)
{
    char path[1024], err[JOB_ERR_MAX];
    snprintf(path, sizeof path, "%s/%s", run_dir, RUN_FILE_JOB);
    if (job_load(path, &w->job, err, sizeof err)) goto bad;
    snprintf(path, sizeof path, "%s/%s", run_dir, RUN_FILE_SETS);
    FILE *f = fopen(path, "re");
    if (f) {
        char line[2048];
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = 0;
            if (line[0] && job_override(&w->job, line, err, sizeof err)) {
                fclose(f);
                goto bad;
            }
        }
        fclose(f);
    }
    if (job_validate(&w->job, err, sizeof err) || run_split_resolve(&w->job, err, sizeof err) ||
        graph_build(&w->job, &w->g, err, sizeof err))
        goto bad;
    return BT_OK;
bad:
    log_error("worker: %s", err);
    return BT_ERR_INVALID;
}

/* The rank's chunks: each builds and loads exactly its stage and TP share
 * (random initialisation is addressed by global element, so every layout
 * starts from exactly the single-process parameters). Needs the TP
 * communicator opened. */
static bt_status_t chunks_create(worker_t *w)
{
    model_config_t cfg;
    model_place_t place;
    bt_status_t st;
    if ((st = run_model_config(&w->job, &cfg)) || (st = run_model_place(&w->job, &place)))
        return st;
    graph_coord_t c = graph_coord(&w->g, w->rank);
    model_parallel_t par = {.tp_rank = c.tp, .tp_size = w->g.tp, .tp_comm = w->comm[GRAPH_GROUP_TP],
                            .ep_rank = c.ep, .ep_size = w->g.ep, .ep_comm = w->comm[GRAPH_GROUP_EP],
                            .edp_rank = c.edp, .cp_rank = c.cp, .cp_size = w->g.cp,
                            .cp_comm = w->comm[GRAPH_GROUP_CP], .cp_ring = w->g.cp_ring,
                            .sp = w->g.sp};
    w->n_chunks = w->g.vpp;
    for (int k = 0; k < w->n_chunks; k++) {
        int v = graph_chunk_vstage(&w->g, c.pp, k);
        model_stage_t stage = graph_vstage_stage(&w->g, v, (int)cfg.num_layers);
        if ((st = run_model_create_part(&w->job, &stage, w->g.tp > 1 || w->g.cp > 1 || w->g.moe ? &par : NULL, &place,
                                        &w->chunks[k])))
            return st;
        if (!w->eval_only && (st = model_grads_alloc(w->chunks[k]))) return st;
    }
    return BT_OK;
}

static xport_kind_t edge_kind(const job_t *job, job_edge_t e)
{
    return job->transport[e] == JOB_XPORT_UCX ? XPORT_UCX : XPORT_TCP;
}

/* The ops of the job's collective backend (job_collectives: the driver made
 * the same choice). nccl is loaded here, in the worker, and a load that
 * fails fails the rank's start, naming the reason. */
static bt_status_t coll_backend_ops(worker_t *w, const coll_ops_t **ops, int *device)
{
    coll_backend_t cb;
    char why[800];
    *ops = &coll_host_ops;
    *device = 0;
    /* decided on the job file's device, as the driver decided */
    char mine[JOB_DEVICE_MAX];
    snprintf(mine, sizeof mine, "%s", w->job.device);
    snprintf(w->job.device, sizeof w->job.device, "%s", w->job_device);
    bt_status_t jst = job_collectives(&w->job, &cb, why, sizeof why);
    snprintf(w->job.device, sizeof w->job.device, "%s", mine);
    if (jst) {
        log_error("rank %d: parallel.collectives: %s", w->rank, why);
        return BT_ERR_UNSUPPORTED;
    }
    if (cb != COLL_BACKEND_NCCL) return BT_OK;
    device_t dev;
    if (device_parse(w->job.device, &dev)) *device = dev.index;
    if (!(*ops = coll_nccl_ops(why, sizeof why))) {
        log_error("rank %d: %s", w->rank, why);
        return BT_ERR_UNSUPPORTED;
    }
    return BT_OK;
}

static bt_status_t colls_open(worker_t *w, const char *job_id)
{
    const coll_ops_t *ops;
    int device;
    bt_status_t bst = coll_backend_ops(w, &ops, &device);
    if (bst) return bst;
    char listen_buf[96];
    const char *lh = getenv("BATON_LISTEN_HOST"), *listen = NULL;
    if (lh && *lh) {
        snprintf(listen_buf, sizeof listen_buf, "%s:0", lh);
        listen = listen_buf;
    }
    for (int k = 0; k < GRAPH_GROUP_COUNT; k++) {
        int n = graph_group_members(&w->g, (graph_group_t)k, w->rank, w->members[k], &w->me[k]);
        w->n_members[k] = n;
        if (n == 0) continue;
        char name[32];
        snprintf(name, sizeof name, "%s%d", graph_group_name((graph_group_t)k), w->members[k][0]);
        coll_config_t cfg = {
            .rank = w->me[k], .size = n, .comm_id = (uint32_t)(k * GRAPH_MAX_WORLD + w->members[k][0]),
            .name = name,
            .kind = edge_kind(&w->job, k == GRAPH_GROUP_TP || k == GRAPH_GROUP_CP
                                           ? JOB_EDGE_TENSOR_PARALLEL : JOB_EDGE_DATA_PARALLEL),
            .job_id = job_id, .secret = w->secret, .secret_len = sizeof w->secret,
            .timeout_ms = (unsigned)ceil(w->job.launch.collective_timeout * 1000.0),
            .device = device, .listen_addr = listen,
        };
        bt_status_t st = coll_open(ops, &cfg, &w->comm[k], w->coll_addr[k], XPORT_LISTEN_ADDR_MAX);
        if (st) {
            log_error("rank %d: cannot open collective group %s (%s)", w->rank, name, bt_status_str(st));
            return st;
        }
    }
    return BT_OK;
}

/* Which machine this is, as one word: the host name and this boot's id
 * (two containers may share a name, never a boot id and a name). */
#define HOST_ID_MAX 128
static void host_identity(char *buf, size_t cap)
{
    char name[64] = "?", boot[40] = "?";
    if (gethostname(name, sizeof name)) snprintf(name, sizeof name, "?");
    name[sizeof name - 1] = 0;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) snprintf(boot, sizeof boot, "?");
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = 0;
    /* hosts simulated as network namespaces share a name and a boot id:
     * the listen address tells them apart */
    const char *lh = getenv("BATON_LISTEN_HOST");
    snprintf(buf, cap, "%s/%s%s%s", name, boot, lh ? "/" : "", lh ? lh : "");
    for (char *c = buf; *c; c++)
        if (*c == ' ' || *c == '\t') *c = '_';
}

static bt_status_t rank_file_write(worker_t *w, const char *run_dir, const char *card)
{
    char tmp[1024], dst[1024];
    snprintf(tmp, sizeof tmp, "%s/rank.%d.tmp", run_dir, w->rank);
    snprintf(dst, sizeof dst, "%s/rank.%d", run_dir, w->rank);
    FILE *f = fopen(tmp, "we");
    if (!f) {
        log_error("rank %d: cannot write %s: %s", w->rank, tmp, strerror(errno));
        return BT_ERR_IO;
    }
    char host[HOST_ID_MAX];
    host_identity(host, sizeof host);
    fprintf(f, "card %s\n", card);
    fprintf(f, "host %s\n", host);
    for (int k = 0; k < GRAPH_GROUP_COUNT; k++)
        if (w->comm[k]) fprintf(f, "coll%d %s\n", k, w->coll_addr[k]);
    if (fclose(f) || rename(tmp, dst)) {
        log_error("rank %d: cannot write %s", w->rank, dst);
        return BT_ERR_IO;
    }
    return BT_OK;
}

/* The address book: lines "RANK card CARD" and "RANK collK ADDR" (a ucx
 * address is several hundred bytes: lines have no fixed length). Entries
 * are malloc'd; NULL where the book has none. */
typedef struct {
    char *card[GRAPH_MAX_WORLD];
    char *host[GRAPH_MAX_WORLD];
    char *coll[GRAPH_GROUP_COUNT][GRAPH_MAX_WORLD];
} book_t;

static void book_free(book_t *b)
{
    if (!b) return;
    for (int r = 0; r < GRAPH_MAX_WORLD; r++) {
        free(b->card[r]);
        free(b->host[r]);
        for (int k = 0; k < GRAPH_GROUP_COUNT; k++) free(b->coll[k][r]);
    }
    free(b);
}

static bt_status_t book_wait(worker_t *w, const char *run_dir, book_t *b)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", run_dir, RUN_FILE_BOOK);
    uint64_t end = clock_now_ns() + 120ull * 1000000000ull;
    FILE *f;
    while (!(f = fopen(path, "re"))) {
        if (clock_now_ns() > end) {
            log_error("rank %d: no address book from the driver after 120 s", w->rank);
            return BT_ERR_TIMEOUT;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    int line_no = 0;
    while ((got = getline(&line, &line_cap, f)) >= 0) {
        line_no++;
        line[strcspn(line, "\n")] = 0;
        int r, k, off = 0;
        char key[16], **slot = NULL;
        if (sscanf(line, "%d %15s %n", &r, key, &off) != 2 || r < 0 || r >= w->g.world) goto bad;
        const char *val = line + off;
        if (!strcmp(key, "card") && strlen(val) < ACTOR_CARD_MAX) slot = &b->card[r];
        else if (!strcmp(key, "host") && strlen(val) < HOST_ID_MAX) slot = &b->host[r];
        else if (sscanf(key, "coll%d", &k) == 1 && k >= 0 && k < GRAPH_GROUP_COUNT
                 && strlen(val) < XPORT_LISTEN_ADDR_MAX)
            slot = &b->coll[k][r];
        if (!slot || *slot) goto bad; /* unknown key, too long, or twice */
        if (!(*slot = strdup(val))) {
            free(line);
            fclose(f);
            return BT_ERR_NOMEM;
        }
    }
    free(line);
    fclose(f);
    for (int r = 0; r < w->g.world; r++)
        w->same_host[r] = b->host[r] && b->host[w->rank] && !strcmp(b->host[r], b->host[w->rank]);
    return BT_OK;
bad:
    log_error("rank %d: %s line %d: malformed address book line '%.120s'", w->rank, path, line_no, line);
    free(line);
    fclose(f);
    return BT_ERR_CORRUPT;
}

/* Whether the CP ring's blocks travel as stage-actor messages
 * (parallel.cp_exchange; auto: on the cpu, docs/PARALLEL.md "Ring mode"). */
static bool cp_msgs(worker_t *w)
{
    if (w->g.cp <= 1 || !w->g.cp_ring || w->n_members[GRAPH_GROUP_CP] != w->g.cp) return false;
    job_cp_exchange_t x = w->job.parallel.cp_exchange;
    if (x != JOB_CPX_AUTO) return x == JOB_CPX_MESSAGES;
    model_place_t place;
    return run_model_place(&w->job, &place) == BT_OK && device_is_host(place.dev);
}

/* The rank of the CP group member `d` places after this one (d = 1: the
 * next in the ring, d = -1: the previous). */
static int cp_peer(const worker_t *w, int d)
{
    int n = w->n_members[GRAPH_GROUP_CP];
    return w->members[GRAPH_GROUP_CP][(w->me[GRAPH_GROUP_CP] + n + d) % n];
}

/* A stage-actor link to rank q over the pipeline's transport, made by the
 * lower rank of the pair and once per peer (done[] marks it). */
static bt_status_t link_connect(worker_t *w, const book_t *b, bool *done, int q)
{
    if (q <= w->rank || done[q]) return BT_OK;
    done[q] = true;
    if (!b->card[q]) {
        log_error("rank %d: the book has no card of rank %d", w->rank, q);
        return BT_ERR_CORRUPT;
    }
    return actor_router_connect_str(w->rt, (uint32_t)q, b->card[q],
                                    job_xport_name(w->job.transport[JOB_EDGE_PIPELINE]));
}

static bt_status_t links_connect(worker_t *w, const book_t *b)
{
    graph_coord_t c = graph_coord(&w->g, w->rank);
    bool done[GRAPH_MAX_WORLD] = {0};
    /* pipeline neighbors: the lower rank of each pair connects */
    for (int k = 0; k < w->n_chunks; k++) {
        int v = graph_chunk_vstage(&w->g, c.pp, k);
        int nb[2] = {v > 0 ? graph_vstage_rank(&w->g, v - 1, w->rank) : -1,
                     v + 1 < w->g.n_vstages ? graph_vstage_rank(&w->g, v + 1, w->rank) : -1};
        for (int i = 0; i < 2; i++) {
            bt_status_t st = link_connect(w, b, done, nb[i]);
            if (st) return st;
        }
    }
    /* CP ring neighbours, when the ring's blocks are stage-actor messages:
     * the pipeline's transport, as activations */
    for (int i = 0; i < 2 && cp_msgs(w); i++) {
        bt_status_t st = link_connect(w, b, done, cp_peer(w, i ? -1 : 1));
        if (st) return st;
    }
    for (int k = 0; k < GRAPH_GROUP_COUNT; k++) {
        if (!w->comm[k]) continue;
        const char *addrs[GRAPH_MAX_WORLD];
        for (int i = 0; i < w->n_members[k]; i++) {
            addrs[i] = b->coll[k][w->members[k][i]];
            if (!addrs[i] || !addrs[i][0]) {
                log_error("rank %d: the book has no %s address of rank %d", w->rank,
                          graph_group_name((graph_group_t)k), w->members[k][i]);
                return BT_ERR_CORRUPT;
            }
        }
        /* The barrier keeps every member driving the group's loop until
         * all handshakes have finished: an acceptor leaves connect as soon
         * as its side is done, which may be before its last handshake frame
         * reached the connector. */
        bt_status_t st = coll_connect(w->comm[k], addrs);
        if (st == BT_OK) st = coll_barrier(w->comm[k]);
        if (st) {
            log_error("rank %d: collective group %s did not connect (%s)", w->rank, w->comm[k]->name,
                      bt_status_str(st));
            return st;
        }
    }
    return BT_OK;
}

/* Whether activations to pipeline neighbour `peer` are handed off
 * (train/handoff.h): never to ourselves (one process, no second copy) or
 * another host; with transport.handoff auto on a GPU, with ipc on any
 * device that shares memory (the job check refused the others). */
static bool handoff_edge(const worker_t *w, int peer)
{
    device_t dev = w->chunks[0]->place.dev;
    if (peer == w->rank || !w->same_host[peer] || !kern_ipc_supported(dev)) return false;
    return w->job.handoff == JOB_HANDOFF_IPC || (w->job.handoff == JOB_HANDOFF_AUTO && dev.kind == DEV_CUDA);
}

/* The rank's checkpoint items: its chunks' parameters (stored on
 * data-parallel rank 0; never the tied head copy) and its optimizer state. */
static bt_status_t items_build(worker_t *w, int dp_rank, int head_copy_chunk)
{
    bt_status_t st = BT_OK;
    for (int k = 0; k < w->n_chunks && !st; k++) {
        int skip = k == head_copy_chunk ? model_param_find(w->chunks[k], "model.embed_tokens.weight") : -1;
        st = ckpt_items_params(&w->items, w->chunks[k], dp_rank == 0, skip);
    }
    if (!st) st = dist_optim_ckpt_items(w->opt, &w->items, dp_rank == 0);
    return st;
}

/* --resume (the driver wrote the step directories to read): every item,
 * resharded from whatever layout saved it, and the optimizer's count. */
/* --resume (the driver wrote what to read into the run directory): every
 * item, resharded from whatever layout saved it, and the optimizer's count.
 * The reader looks in this rank's own root first, then in the step
 * directories the driver named that exist on this node, then at the copy of
 * the index in the run directory; a shard file in none of them is fetched
 * from the rank that wrote it, by message through the driver
 * (ckpt_writer_fetch). BATON_TEST_CKPT_LOCAL_ONLY=1 makes a rank see only
 * its own root (the tests' node-local disks). */
static bt_status_t resume_load(worker_t *w, const char *path)
{
    char *text = NULL, err[1400];
    size_t len = 0;
    bt_status_t st = base_file_read(path, 1u << 20, &text, &len);
    if (st) return st;
    static char dirs_buf[GRAPH_MAX_WORLD + 3][CKPT_PATH_MAX];
    const char *dirs[GRAPH_MAX_WORLD + 3];
    int n = 0;
    long long step = -1;
    const char *local_only = getenv("BATON_TEST_CKPT_LOCAL_ONLY");
    bool only_own = local_only && !strcmp(local_only, "1");
    char root[CKPT_WRITER_ROOT_MAX] = "";
    if (w->job.checkpoint.dir[0] && run_ckpt_root(&w->job, w->rank, root, sizeof root)) {
        free(text);
        return BT_ERR_INVALID;
    }
    const char *listed[GRAPH_MAX_WORLD + 1];
    int n_listed = 0;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(line, "step ", 5)) step = atoll(line + 5);
        else if (!strncmp(line, "dir ", 4) && n_listed < GRAPH_MAX_WORLD + 1) listed[n_listed++] = line + 4;
    }
    if (step < 0) {
        log_error("rank %d: --resume: %s names no step", w->rank, path);
        free(text);
        return BT_ERR_CORRUPT;
    }
    if (root[0]) { /* our own root first */
        ckpt_step_dir(root, step, dirs_buf[n], CKPT_PATH_MAX);
        if (access(dirs_buf[n], F_OK) == 0) { dirs[n] = dirs_buf[n]; n++; }
    }
    for (int k = 0; k < n_listed && !only_own; k++) { /* the others this node can see */
        bool dup = access(listed[k], F_OK) != 0;
        for (int i = 0; i < n && !dup; i++) dup = !strcmp(dirs[i], listed[k]);
        if (!dup) dirs[n++] = listed[k];
    }
    snprintf(dirs_buf[GRAPH_MAX_WORLD + 2], CKPT_PATH_MAX, "%s/%s", w->run_dir, RUN_DIR_RESUME_INDEX);
    dirs[n++] = dirs_buf[GRAPH_MAX_WORLD + 2];
    ckpt_writer_fetch_ctx_t fx = {.w = &w->writer, .step = step, .timeout_s = 60};
    uint64_t t0 = clock_now_ns(), fetched = 0;
    st = run_ckpt_restore(dirs, n, w->writer_inited ? ckpt_writer_fetch : NULL, &fx, &w->job,
                          &w->chunks[0]->cfg, NULL, &w->items, &w->resumed, &fetched, err, sizeof err);
    if (st) log_error("rank %d: --resume: %s", w->rank, err);
    else {
        dist_optim_set_steps(w->opt, w->resumed.pos.optim_steps);
        if (fetched)
            log_info("rank %d: state of step %lld restored in %.2f s, %.2f MB of it fetched from "
                     "other ranks", w->rank, (long long)w->resumed.pos.step,
                     (double)(clock_now_ns() - t0) * 1e-9, (double)fetched / 1e6);
    }
    free(text);
    return st;
}

/* The checkpoint writer: a loop and an I/O thread of its own. */
static bt_status_t writer_start(worker_t *w)
{
    const graph_t *g = &w->g;
    actor_loop_t *ck_loop;
    actor_worker_t *io;
    ckpt_writer_config_t wc = {.rank = w->rank, .keep = w->job.checkpoint.keep,
                               .driver = ACTOR_ADDR(g->world, GRAPH_SLOT_DRIVER)};
    bt_status_t st;
    if (w->job.checkpoint.dir[0] && (st = run_ckpt_root(&w->job, w->rank, wc.root, sizeof wc.root)))
        return st;
    run_ckpt_shard_name(w->rank, wc.file, sizeof wc.file);
    if ((st = actor_router_loop_new(w->rt, "ckpt", &ck_loop)) ||
        (st = actor_router_worker_new(w->rt, "ckpt-io", &io)))
        return st;
    wc.io = io;
    if ((st = ckpt_writer_init(&w->writer, &wc))) return st;
    w->writer_inited = true;
    return actor_register(w->rt, &w->writer.a, &ckpt_writer_class, ck_loop, "ckpt", GRAPH_SLOT_CKPT);
}

static bt_status_t actors_start(worker_t *w)
{
    const graph_t *g = &w->g;
    graph_coord_t c = graph_coord(g, w->rank);
    actor_loop_t *loop;
    actor_worker_t *compute;
    bt_status_t st;
    if ((st = actor_router_loop_new(w->rt, "main", &loop))) return st;
    if ((st = actor_router_worker_new(w->rt, "compute", &compute))) return st;

    train_config_t tc;
    run_train_config(&w->job, &tc);
    dist_optim_config_t oc = {.n_chunks = w->n_chunks, .embed_chunk = -1, .head_copy_chunk = -1,
                              .world = w->comm[GRAPH_GROUP_WORLD], .dp = w->comm[GRAPH_GROUP_DP],
                              .emb = w->comm[GRAPH_GROUP_EMB],
                              .edp = w->comm[graph_expert_dp_group(g)], .zero1 = g->zero1,
                              .optim = tc.optim, .lr = tc.lr, .clip = tc.clip, .rank = w->rank};
    for (int k = 0; k < w->n_chunks; k++) {
        oc.chunks[k] = w->chunks[k];
        int v = graph_chunk_vstage(g, c.pp, k);
        if (v == 0) oc.embed_chunk = k;
        if (g->tied && g->n_vstages > 1 && v == g->n_vstages - 1) oc.head_copy_chunk = k;
    }
    if (!w->eval_only && (st = dist_optim_create(&oc, &w->opt))) return st;
    char resume_path[1200];
    snprintf(resume_path, sizeof resume_path, "%s/%s", w->run_dir, RUN_FILE_RESUME);
    bool resume = !w->eval_only && access(resume_path, F_OK) == 0;
    bool saves = !w->eval_only && w->job.checkpoint.dir[0];
    /* a CP rank > 0 holds a replica of its CP group's parameters, as a dp
     * rank > 0 does */
    if ((resume || saves) && (st = items_build(w, c.dp + c.cp, oc.head_copy_chunk))) return st;
    if ((resume || saves) && (st = writer_start(w))) return st;
    if (resume && (st = resume_load(w, resume_path))) return st;

    bool data = graph_rank_needs_data(g, w->rank);
    /* Test and benchmark hooks: BATON_TEST_EXPERTS_INLINE=1 runs the
     * sparse layers' expert parts inline in the stage's forward and
     * backward instead of through the expert-group actor (the same bits:
     * tests/sh/test_moe_actor.sh); BATON_BENCH_MOE_SERIAL=1 waits for each
     * EP row all-to-all as soon as it starts (model_t moe_serial), the
     * no-overlap reference of bench/bench_moe.sh. */
    bool experts = g->moe && !getenv("BATON_TEST_EXPERTS_INLINE");
    for (int k = 0; k < w->n_chunks; k++) w->chunks[k]->moe_serial = getenv("BATON_BENCH_MOE_SERIAL") != NULL;
    int64_t rows = (int64_t)g->dp * g->microbatches * g->micro_batch;
    stage_actor_config_t sc = {
        .rank = w->rank, .pp_rank = c.pp, .pipe = g->pipe, .n_vstages = g->n_vstages,
        .driver = ACTOR_ADDR(g->world, GRAPH_SLOT_DRIVER),
        .data = data ? ACTOR_ADDR(w->rank, GRAPH_SLOT_DATA) : 0,
        .tp_rank = c.tp, .tp_size = g->tp, .dp_rank = c.dp, .dp_size = g->dp,
        .cp_rank = c.cp, .cp_size = g->cp,
        .cp_msgs = cp_msgs(w), .cp_ranks = w->members[GRAPH_GROUP_CP],
        .cp_timeout_s = w->job.launch.step_timeout,
        .eval_rows = w->eval_rows, .eval_pad = g->moe && g->ep > 1,
        /* a CP rank holds T / cp tokens of every row (model/cp_attn.h) */
        .exporter = c.dp == 0 && c.cp == 0 && c.tp == 0, .B = g->micro_batch, .T = g->seq_len / g->cp,
        .eval_only = w->eval_only,
        /* every window scores all T positions (train/train.h) */
        .dloss = 1.0f / (float)(rows * g->seq_len),
        .opt = w->opt, .worker = compute, .rt = w->rt, .heartbeat_s = w->job.launch.heartbeat_interval,
        .writer = saves ? ACTOR_ADDR(w->rank, GRAPH_SLOT_CKPT) : 0, .ckpt = &w->items,
        .first_step = w->resumed.pos.step,
        .experts = experts ? ACTOR_ADDR(w->rank, GRAPH_SLOT_EXPERTS) : 0,
    };
    for (int k = 0; k < w->n_chunks; k++) {
        int v = graph_chunk_vstage(g, c.pp, k);
        sc.chunks[k] = w->chunks[k];
        if (v + 1 < g->n_vstages) {
            int r = graph_vstage_rank(g, v + 1, w->rank);
            sc.next[k] = ACTOR_ADDR(r, GRAPH_SLOT_STAGE);
            sc.handoff_next[k] = handoff_edge(w, r);
        }
        if (v > 0) {
            int r = graph_vstage_rank(g, v - 1, w->rank);
            sc.prev[k] = ACTOR_ADDR(r, GRAPH_SLOT_STAGE);
            sc.handoff_prev[k] = handoff_edge(w, r);
        }
    }
    if (sc.cp_msgs) {
        sc.cp_next = ACTOR_ADDR(cp_peer(w, 1), GRAPH_SLOT_STAGE);
        sc.cp_prev = ACTOR_ADDR(cp_peer(w, -1), GRAPH_SLOT_STAGE);
    }
    if ((st = stage_actor_init(&w->stage, &sc))) return st;
    w->stage_inited = true;
    if (data) {
        data_actor_config_t dc = {.tokens = w->tokens, .n_tokens = w->n_tokens,
                                  .seed = (uint64_t)w->job.train.seed, .B = g->micro_batch,
                                  .T = g->seq_len, .M = g->microbatches, .dp = g->dp,
                                  .dp_rank = c.dp, .cp = g->cp, .cp_rank = c.cp, .stage = ACTOR_ADDR(w->rank, GRAPH_SLOT_STAGE),
                                  .eval_ids = w->eval_ids, .eval_targets = w->eval_targets,
                                  .eval_rows = w->eval_rows, .eval_pad = g->moe && g->ep > 1,
                                  .base_step = w->resumed.pos.step,
                                  .base_samples = w->resumed.pos.samples};
        if ((st = data_actor_init(&w->data, &dc))) return st;
        w->data_inited = true;
        if ((st = actor_register(w->rt, &w->data.a, &data_actor_class, loop, "data", GRAPH_SLOT_DATA)))
            return st;
    }
    if (experts) { /* the expert group shares the stage's loop and compute worker */
        expert_actor_config_t xc = {.rank = w->rank, .ep_rank = c.ep, .ep_size = g->ep,
                                    .edp_rank = c.edp, .stage = &w->stage.a, .worker = compute,
                                    .n_chunks = w->n_chunks};
        for (int k = 0; k < w->n_chunks; k++) xc.chunks[k] = w->chunks[k];
        if ((st = expert_actor_init(&w->experts, &xc))) return st;
        w->experts_inited = true;
        if ((st = actor_register(w->rt, &w->experts.a, &expert_actor_class, loop, "experts",
                                 GRAPH_SLOT_EXPERTS)))
            return st;
    }
    actor_router_supervisor_set(w->rt, ACTOR_ADDR(w->rank, GRAPH_SLOT_STAGE));
    if ((st = actor_register(w->rt, &w->stage.a, &stage_actor_class, loop, "stage", GRAPH_SLOT_STAGE)))
        return st;
    /* Track names, after actor_register (which names the track after the
     * class): `baton trace --summary` reads the pipeline coordinates of a
     * stage from "pp<stage> dp<replica> tp<rank>" and the virtual stages per
     * rank from "v<n>" (trace/bubble.h). */
    char tname[64];
    snprintf(tname, sizeof tname, "stage r%d pp%d dp%d tp%d v%d cp%d", w->rank, c.pp, c.dp, c.tp,
             g->vpp, c.cp);
    trace_actor_name(ACTOR_ADDR(w->rank, GRAPH_SLOT_STAGE), tname);
    snprintf(tname, sizeof tname, "data r%d", w->rank);
    trace_actor_name(ACTOR_ADDR(w->rank, GRAPH_SLOT_DATA), tname);
    if (experts) {
        snprintf(tname, sizeof tname, "experts r%d pp%d ep%d edp%d", w->rank, c.pp, c.ep, c.edp);
        trace_actor_name(ACTOR_ADDR(w->rank, GRAPH_SLOT_EXPERTS), tname);
    }
    return BT_OK;
}

static void worker_free(worker_t *w)
{
    actor_router_destroy(w->rt); /* stops the actors, the compute worker and the loops */
    if (w->stage_inited) stage_actor_fini(&w->stage);
    if (w->data_inited) data_actor_fini(&w->data);
    if (w->experts_inited) expert_actor_fini(&w->experts);
    if (w->writer_inited) ckpt_writer_fini(&w->writer);
    ckpt_items_free(&w->items);
    dist_optim_destroy(w->opt);
    for (int k = 0; k < GRAPH_GROUP_COUNT; k++)
        if (w->comm[k]) coll_destroy(w->comm[k]);
    for (int k = 0; k < w->n_chunks; k++) {
        model_destroy(w->chunks[k]);
    }
    free(w->tokens);
    free(w->eval_ids);
    free(w->eval_targets);
    free(w);
}

int worker_main(const char *run_dir, int rank)
{
    char tag[32];
    snprintf(tag, sizeof tag, "rank%d", rank);
    log_set_tag(tag);
    worker_t *w = calloc(1, sizeof *w);
    book_t *book = calloc(1, sizeof *book);
    if (!w || !book) {
        free(w);
        free(book);
        return 1;
    }
    w->rank = rank;
    snprintf(w->run_dir, sizeof w->run_dir, "%s", run_dir);
    const char *job_id = strrchr(run_dir, '/') ? strrchr(run_dir, '/') + 1 : run_dir;
    char card[ACTOR_CARD_MAX], driver_card[ACTOR_CARD_MAX], path[1024];
    bt_status_t st;
    if ((st = secret_read(w)) || (st = job_read(w, run_dir))) goto fail;
    if (rank < 0 || rank >= w->g.world) {
        log_error("worker: rank %d outside the job's %d ranks", rank, w->g.world);
        goto fail;
    }
    snprintf(w->job_device, sizeof w->job_device, "%s", w->job.device);
    if (!strcmp(w->job.device, "cuda")) { /* a GPU of its own for each of a host's ranks */
        char dev[JOB_DEVICE_MAX];
        job_rank_device(&w->job, w->g.world, rank, kern_device_count(DEV_CUDA), dev, sizeof dev);
        snprintf(w->job.device, sizeof w->job.device, "%s", dev);
        log_debug("worker: rank %d runs on %s", rank, dev);
    }
    /* The ranks of a job share this host's cores: each gets its share for
     * the CPU backend's pool (a thread per core in every process would
     * oversubscribe them). The share changes speed only, never the bits
     * (kernels/cpu/pool.c); BATON_CPU_THREADS, when set, decides instead. */
    {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        long per = cores > 0 ? cores / w->g.world : 1;
        kern_cpu_set_threads(per >= 1 ? (int)per : 1);
    }
    char run_id[64] = "";
    snprintf(path, sizeof path, "%s/%s", run_dir, RUN_FILE_RUN_ID);
    FILE *rf = fopen(path, "re");
    if (rf) {
        if (!fgets(run_id, sizeof run_id, rf)) run_id[0] = '\0';
        fclose(rf);
    }
    trace_config_t tcfg = {.run_id = run_id};
    if (w->job.trace_dir[0] && trace_start(w->job.trace_dir, (uint32_t)rank, &tcfg))
        log_warn("rank %d: tracing into %s failed; running untraced", rank, w->job.trace_dir);
    snprintf(path, sizeof path, "%s/%s", run_dir, RUN_FILE_MODE);
    bool eval_only = w->eval_only = access(path, F_OK) == 0;
    if (!eval_only && graph_rank_needs_data(&w->g, rank)) {
        uint32_t vocab;
        if ((st = worker_train_stream(&w->job, &w->tokens, &w->n_tokens, &vocab))) goto fail;
    }
    snprintf(path, sizeof path, "%s/%s", run_dir, RUN_FILE_EVAL);
    int64_t eval_T = 0;
    st = run_eval_read(path, graph_rank_needs_data(&w->g, rank), &w->eval_ids, &w->eval_targets,
                       &w->eval_rows, &eval_T);
    if (st == BT_OK && eval_T != w->g.seq_len) {
        log_error("rank %d: %s has rows of %lld tokens, the job %lld", rank, path,
                  (long long)eval_T, (long long)w->g.seq_len);
        goto fail;
    }
    if (st && st != BT_ERR_NOT_FOUND) goto fail;

    /* On a host of an ssh-launched job the agent names the address the
     * other hosts reach this one by (launch/agent.h); else loopback. */
    const char *listen_host = getenv("BATON_LISTEN_HOST");
    actor_router_config_t rc = {.rank = (uint32_t)rank, .job_id = job_id, .secret = w->secret,
                                .secret_len = sizeof w->secret, .listen_host = listen_host};
    if ((st = actor_router_create(&rc, &w->rt))) goto fail;
    unsigned kinds = 1u << XPORT_TCP;
    for (int e = 0; e < JOB_EDGE_COUNT; e++)
        if (w->job.transport[e] == JOB_XPORT_UCX) kinds |= 1u << XPORT_UCX;
    if ((st = actor_router_listen(w->rt, kinds, card, sizeof card))) goto fail;
    if ((st = colls_open(w, job_id)) || (st = chunks_create(w))) goto fail;
    if ((st = rank_file_write(w, run_dir, card))) goto fail;
    snprintf(path, sizeof path, "%s/%s", run_dir, RUN_FILE_DRIVER);
    if (file_read_all(path, driver_card, sizeof driver_card, NULL)) {
        log_error("rank %d: cannot read the driver's card %s", rank, path);
        goto fail;
    }
    if ((st = actor_router_connect_str(w->rt, (uint32_t)w->g.world, driver_card,
                                       job_xport_name(w->job.transport[JOB_EDGE_CONTROL]))))
        goto fail;
    if ((st = book_wait(w, run_dir, book)) || (st = links_connect(w, book))) goto fail;
    book_free(book);
    book = NULL;
    if ((st = actors_start(w))) goto fail;

    st = actor_router_wait(w->rt, 0);
    if (st != BT_OK) {
        /* A failure stop: a compute job may be blocked on a dead peer, so
         * leave without joining it. */
        trace_stop();
        fflush(stdout);
        fflush(stderr);
        _exit(1);
    }
    worker_free(w);
    trace_stop();
    return 0;
fail:
    book_free(book);
    log_error("rank %d: start-up failed", rank);
    trace_stop();
    fflush(stdout);
    fflush(stderr);
    _exit(1);
}
