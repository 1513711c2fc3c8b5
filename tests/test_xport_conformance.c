/* One conformance suite run identically over every transport.
 *
 * The test process is the listener ("parent"); its peers ("children") are
 * real processes for tcp and ucx (fork + exec of /proc/self/exe with
 * --xport-child ...) and threads with their own loop for inproc. A child
 * runs one mode (echo, stream, multi, ...) and exits 0 only when everything
 * it checked on its side was right, so both ends of every transfer are
 * verified. The per-job secret reaches the children through
 * $BATON_SECRET_FILE, never through argv.
 *
 * Cases x transports come from one table (XPORT_CASES); tcp-only cases that
 * need raw sockets (bad frames, garbage/replayed handshakes, handshake
 * deadline) follow the table.
 */
#include "tests/test.h"
#include "tests/helpers/capture.h"

#include "base/clock.h"
#include "base/log.h"
#include "transport/handshake.h"
#include "transport/sockaddr.h"
#include "transport/xport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ev.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#define JOB_ID        "conformance-job"
#define ECHO_MAX      (1u << 20)       /* the echo child echoes payloads up to this */
#define PATTERN_LEN   (1u << 20)
#define BIG_KILL      (64u << 20)
#define MAX_CHILDREN  8

enum { T_DATA = 1, T_REPLY, T_REPORT, T_BYE };

typedef struct {
    uint32_t tag;
    uint32_t conn;
    uint64_t seq;
    uint64_t len;
    uint64_t hash;
    uint64_t aux;
} test_hdr_t;

/* ---- payload pattern -------------------------------------------------- */

static uint8_t *g_pattern; /* PATTERN_LEN + 256 deterministic bytes */

static void pattern_fill(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        memcpy(p + i, &s, 8);
    }
    for (; i < n; i++) p[i] = (uint8_t)(seed + i);
}

static void pattern_init(void)
{
    if (g_pattern) return;
    g_pattern = malloc(PATTERN_LEN + 256);
    pattern_fill(g_pattern, PATTERN_LEN + 256, 42);
}

/* stream frames: size and content are functions of the sequence number */
static size_t stream_size(uint64_t seq, size_t max) { return max ? (size_t)((seq * 7919u) % (max + 1)) : 0; }
static const uint8_t *stream_bytes(uint64_t seq) { return g_pattern + (seq % 251); }

/* ---- shared config ---------------------------------------------------- */

static uint8_t g_secret[XPORT_SECRET_MAX];
static size_t g_secret_len;
static char g_secret_path[128];

static void secret_cleanup(void) { if (g_secret_path[0]) unlink(g_secret_path); }

static void secret_setup(void)
{
    if (g_secret_len) return;
    snprintf(g_secret_path, sizeof g_secret_path, "/tmp/baton-conf-secret-%d", (int)getpid());
    unlink(g_secret_path);
    bt_status_t st = xport_secret_get(g_secret_path, g_secret, sizeof g_secret, &g_secret_len);
    if (st != BT_OK) BT_PANIC("secret setup failed: %s", bt_status_str(st));
    atexit(secret_cleanup); /* children exec'd later read it before we exit */
}

static xport_config_t base_cfg(struct ev_loop *loop, uint32_t self_id)
{
    return (xport_config_t){
        .loop = loop, .job_id = JOB_ID, .secret = g_secret, .secret_len = g_secret_len,
        .self_id = self_id, .listen_addr = NULL, .max_frame = 0,
        .handshake_ms = (unsigned)(2000 * test_time_scale()),
    };
}

/* ======================================================================
 * Children
 * ==================================================================== */

typedef struct {
    xport_kind_t    kind;
    const char     *addr;
    const char     *mode;
    uint64_t        n;        /* frames */
    size_t          size;     /* max payload */
    struct ev_loop *loop;
    xport_t        *x;
    xport_ep_t     *eps[64];
    int             n_eps;
    int             connected;
    bool            finished;
    uint64_t        finish_ns;   /* sendclose: finish at this time */
    int             rc;
    uint64_t        sent_done, rx_count, errors;
    uint64_t        send_errors;
    bool            report_sent;
    bool            inproc_drop; /* inproc "kill": destroy with frames queued */
    void           *held_send;   /* holdsend: abandoned by destroy (documented) */
    uint8_t        *big;         /* sendbig payload */
} child_t;

typedef struct {
    test_hdr_t  hdr;
    xport_rx_t *rx;      /* released when the send completes (echo) */
    child_t    *c;
} child_send_t;

static void child_send_done(void *arg, bt_status_t st)
{
    child_send_t *s = arg;
    if (st != BT_OK) s->c->send_errors++;
    s->c->sent_done++;
    if (s->rx) xport_rx_release(s->rx);
    free(s);
}

static child_send_t *g_last_send; /* per process/thread use only in holdsend */

static bt_status_t child_send(child_t *c, xport_ep_t *ep, test_hdr_t h, const void *p, size_t n,
                              xport_rx_t *rx)
{
    child_send_t *s = malloc(sizeof *s);
    g_last_send = s;
    s->hdr = h;
    s->rx = rx;
    s->c = c;
    struct iovec iov = {.iov_base = (void *)p, .iov_len = n};
    bt_status_t st = xport_send(ep, &s->hdr, sizeof s->hdr, &iov, n ? 1 : 0, child_send_done, s);
    if (st != BT_IN_PROGRESS) {
        free(s);
        if (rx) xport_rx_release(rx);
        c->send_errors++;
    }
    return st;
}

static void child_maybe_report(child_t *c)
{
    if (c->report_sent || (strcmp(c->mode, "stream") && strcmp(c->mode, "bidir"))) return;
    bool bidir = !strcmp(c->mode, "bidir");
    if (c->sent_done < c->n || (bidir && c->rx_count < c->n)) return;
    test_hdr_t h = {.tag = T_REPORT, .seq = c->rx_count, .aux = c->errors + c->send_errors};
    child_send(c, c->eps[0], h, NULL, 0, NULL);
    c->report_sent = true;
}

static void child_stream_start(child_t *c, xport_ep_t *ep, uint32_t conn)
{
    for (uint64_t i = 0; i < c->n; i++) {
        size_t n = stream_size(i, c->size);
        test_hdr_t h = {.tag = T_DATA, .conn = conn, .seq = i, .len = n};
        if (child_send(c, ep, h, stream_bytes(i), n, NULL) != BT_IN_PROGRESS) break;
    }
}

static void child_on_connected(void *arg, xport_ep_t *ep, bt_status_t st)
{
    child_t *c = arg;
    if (!strcmp(c->mode, "badauth")) {
        c->rc = st == BT_OK ? 1 : 0; /* a bad client must be refused */
        if (st == BT_OK) fprintf(stderr, "child: bad client was accepted\n");
        c->finished = true;
        return;
    }
    if (st != BT_OK) {
        fprintf(stderr, "child: connect failed: %s\n", bt_status_str(st));
        c->rc = 1;
        c->finished = true;
        return;
    }
    c->connected++;
    if (ep->peer_id != 1 || ep->ops->ep_peer_id(ep) != 1) {
        fprintf(stderr, "child: listener's id %u, expected 1\n", ep->peer_id);
        c->errors++;
    }
    if (!strcmp(c->mode, "stream") || !strcmp(c->mode, "bidir")) {
        child_stream_start(c, ep, 0);
    } else if (!strcmp(c->mode, "sendexit")) {
        /* post everything, then destroy the transport and exit at once,
         * without waiting for a single send to complete */
        child_stream_start(c, ep, 0);
        c->finished = true;
    } else if (!strcmp(c->mode, "sendclose")) {
        /* post everything and close the endpoint at once; the process
         * lives on a while, so the close alone must deliver the frames */
        child_stream_start(c, ep, 0);
        xport_close(ep);
        c->eps[0] = NULL;
        c->finish_ns = clock_now_ns() + 1000000000ull;
    } else if (!strcmp(c->mode, "multi")) {
        uint32_t conn = 0;
        for (int i = 0; i < c->n_eps; i++) if (c->eps[i] == ep) conn = (uint32_t)i;
        child_stream_start(c, ep, conn);
    } else if (!strcmp(c->mode, "sendbig")) {
        c->big = malloc(BIG_KILL);
        pattern_fill(c->big, BIG_KILL, 7);
        test_hdr_t h = {.tag = T_DATA, .len = BIG_KILL};
        child_send(c, ep, h, c->big, BIG_KILL, NULL); /* the parent kills us or drops it */
    } else if (!strcmp(c->mode, "holdsend")) {
        /* inproc: send one frame from a static buffer, then destroy our xport
         * while the parent still holds it */
        test_hdr_t h = {.tag = T_DATA, .len = PATTERN_LEN};
        child_send(c, ep, h, g_pattern, PATTERN_LEN, NULL);
        c->held_send = g_last_send;
    }
}

static void *child_on_alloc(void *arg, xport_ep_t *ep, const void *hdr, size_t hdr_len, size_t len)
{
    child_t *c = arg;
    if (!strcmp(c->mode, "killrecv") && len >= ECHO_MAX && c->kind != XPORT_INPROC)
        kill(getpid(), SIGKILL); /* die in the middle of a large transfer */
    return malloc(len);
}

static void child_on_free(void *arg, void *p, size_t len) { free(p); }

static void child_on_recv(void *arg, xport_ep_t *ep, xport_rx_t *rx)
{
    child_t *c = arg;
    test_hdr_t h;
    if (rx->hdr_len != sizeof h) {
        c->errors++;
        xport_rx_release(rx);
        return;
    }
    memcpy(&h, rx->hdr, sizeof h);
    if (h.tag == T_BYE) {
        xport_rx_release(rx);
        c->finished = true;
        return;
    }
    if (!strcmp(c->mode, "echo")) {
        test_hdr_t r = {.tag = T_REPLY, .seq = h.seq, .len = rx->payload_len,
                        .hash = rx->payload_len ? XXH3_64bits(rx->payload, rx->payload_len) : 0};
        if (rx->payload_len <= ECHO_MAX) {
            child_send(c, ep, r, rx->payload, rx->payload_len, rx);
        } else {
            xport_rx_release(rx);
            child_send(c, ep, r, NULL, 0, NULL);
        }
        return;
    }
    if (!strcmp(c->mode, "killrecv") && c->kind == XPORT_INPROC) {
        /* inproc stand-in for a killed peer: close from inside the callback
         * with frames still queued behind this one, then vanish */
        c->inproc_drop = true;
        xport_close(ep);
        xport_rx_release(rx);
        ev_break(c->loop, EVBREAK_ALL);
        return;
    }
    if (!strcmp(c->mode, "bidir")) {
        size_t want = stream_size(c->rx_count, c->size);
        if (h.seq != c->rx_count || rx->payload_len != want || h.len != want
            || (want && memcmp(rx->payload, stream_bytes(h.seq), want) != 0)) {
            if (c->errors++ < 5)
                fprintf(stderr, "child: frame seq %llu (expected %llu) len %zu bad\n",
                        (unsigned long long)h.seq, (unsigned long long)c->rx_count, rx->payload_len);
        }
        c->rx_count++;
    }
    xport_rx_release(rx);
}

static void child_on_error(void *arg, xport_ep_t *ep, bt_status_t why)
{
    child_t *c = arg;
    for (int i = 0; i < c->n_eps; i++) if (c->eps[i] == ep) c->eps[i] = NULL;
    if (!strcmp(c->mode, "badauth")) {
        c->finished = true;
        return;
    }
    fprintf(stderr, "child: endpoint error %s\n", bt_status_str(why));
    c->rc = 1;
    c->finished = true;
}

static void child_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
    child_t *c = w->data;
    if (c->finish_ns && clock_now_ns() >= c->finish_ns) c->finished = true;
    child_maybe_report(c);
    if (c->finished) ev_break(loop, EVBREAK_ALL);
}

static void child_prepare(struct ev_loop *loop, ev_prepare *w, int revents)
{
    child_t *c = w->data;
    child_maybe_report(c);
    if (c->finished) ev_break(loop, EVBREAK_ALL);
}

/* argv: kind addr mode n size */
#ifdef BT_HAVE_UCX
static int raw_ucx_main(const char *addr, int variant);
#endif

static int child_main(int argc, char **argv)
{
    if (argc < 5) return 2;
#ifdef BT_HAVE_UCX
    if (!strcmp(argv[2], "ucxraw")) return raw_ucx_main(argv[1], atoi(argv[4]));
#endif
    child_t *c = calloc(1, sizeof *c);
    bool is_auto;
    xport_kind_parse(argv[0], &c->kind, &is_auto);
    c->addr = argv[1];
    c->mode = argv[2];
    c->n = strtoull(argv[3], NULL, 10);
    c->size = strtoull(argv[4], NULL, 10);
    pattern_init();
    uint8_t secret[XPORT_SECRET_MAX];
    size_t secret_len = 0;
    if (xport_secret_load(secret, sizeof secret, &secret_len) != BT_OK) return 3;
    if (!strcmp(c->mode, "badauth") && !strcmp(argv[4], "1")) secret[0] ^= 1;
    c->loop = ev_loop_new(EVFLAG_AUTO);
    xport_config_t cfg = {
        .loop = c->loop, .secret = secret, .secret_len = secret_len,
        .job_id = !strcmp(c->mode, "badauth") && !strcmp(argv[4], "2") ? "another-job" : JOB_ID,
        .self_id = 7, .handshake_ms = (unsigned)(2000 * test_time_scale()),
        .cbs = {.arg = c, .connected = child_on_connected, .alloc = child_on_alloc,
                .free = child_on_free, .recv = child_on_recv, .error = child_on_error},
    };
    if (xport_create(xport_ops_get(c->kind), &cfg, &c->x) != BT_OK) return 4;
    int conns = !strcmp(c->mode, "multi") ? 64 : 1;
    for (int i = 0; i < conns; i++) {
        if (xport_connect(c->x, c->addr, &c->eps[i]) != BT_IN_PROGRESS) return 5;
        c->n_eps++;
    }
    c->rc = 0;
    ev_timer tick;
    ev_timer_init(&tick, child_tick, 0.05, 0.05);
    tick.data = c;
    ev_timer_start(c->loop, &tick);
    ev_prepare prep;
    ev_prepare_init(&prep, child_prepare);
    prep.data = c;
    ev_prepare_start(c->loop, &prep);
    uint64_t deadline = clock_now_ns() + 60ull * 1000000000ull;
    while (!c->finished && !c->inproc_drop && clock_now_ns() < deadline)
        ev_run(c->loop, EVRUN_ONCE);
    if (!c->finished && !c->inproc_drop) {
        fprintf(stderr, "child %s: timed out\n", c->mode);
        c->rc = 6;
    }
    ev_timer_stop(c->loop, &tick);
    ev_prepare_stop(c->loop, &prep);
    xport_destroy(c->x);
    /* inproc: a send whose frame the receiver still holds never completes
     * once the sender's xport is gone; its context is ours to free */
    if (c->held_send && c->sent_done == 0) free(c->held_send);
    ev_loop_destroy(c->loop);
    free(c->big);
    int rc = c->rc;
    if (c->errors || c->send_errors) rc = rc ? rc : 7;
    free(c);
    return rc;
}

/* ======================================================================
 * Parent
 * ==================================================================== */

typedef struct {
    pid_t       pid;         /* process child, or 0 */
    pthread_t   thread;      /* inproc child */
    bool        is_thread;
    atomic_int  thread_done;
    int         thread_rc;
    char       *argv[8];
    char        buf[8][96];
    char        addr[XPORT_LISTEN_ADDR_MAX]; /* argv[1] */
    bool        exited;
    int         status;      /* exit code, or 128+signal */
    uint64_t    exit_ns;
} child_proc_t;

typedef struct parent parent_t;
struct parent {
    xport_kind_t    kind;
    struct ev_loop *loop;
    xport_t        *x;
    char            addr[XPORT_LISTEN_ADDR_MAX];
    xport_ep_t     *eps[128];
    uint32_t        ep_conn_seen[128];
    int             n_eps;
    int             errors_cb;
    bt_status_t     last_error;
    uint64_t        error_ns;
    int             allocs, frees;
    uint64_t        sends_done, send_fail;
    uint64_t        recv_count;
    xport_ep_t     *close_at;       /* close_in_callback case */
    uint64_t        send_refused;   /* send() returned a peer error at once */
    bt_status_t     last_send_status;
    child_proc_t    kids[MAX_CHILDREN];
    int             n_kids;
    /* case hooks */
    void          (*on_recv)(parent_t *p, xport_ep_t *ep, xport_rx_t *rx, const test_hdr_t *h);
    void          (*on_alloc)(parent_t *p, size_t len);
    void           *ctx;
};

static uint32_t xport_ep_peer_id_get(const xport_ep_t *ep) { return ep->ops->ep_peer_id(ep); }

static void parent_on_accept(void *arg, xport_ep_t *ep, uint32_t peer_id)
{
    parent_t *p = arg;
    /* children say 7, raw test clients 99 */
    CHECK_MSG(peer_id == 7 || peer_id == 99, "peer id %u", peer_id);
    CHECK(xport_ep_peer_id_get(ep) == peer_id);
    if (p->n_eps < 128) p->eps[p->n_eps++] = ep;
}

static void *parent_on_alloc(void *arg, xport_ep_t *ep, const void *hdr, size_t hdr_len, size_t len)
{
    parent_t *p = arg;
    p->allocs++;
    if (p->on_alloc) p->on_alloc(p, len);
    return malloc(len);
}

static void parent_on_free(void *arg, void *ptr, size_t len)
{
    parent_t *p = arg;
    p->frees++;
    free(ptr);
}

static void parent_on_recv(void *arg, xport_ep_t *ep, xport_rx_t *rx)
{
    parent_t *p = arg;
    test_hdr_t h = {0};
    if (rx->hdr_len == sizeof h) memcpy(&h, rx->hdr, sizeof h);
    if (p->on_recv) p->on_recv(p, ep, rx, &h);
    else xport_rx_release(rx);
}

static void parent_on_error(void *arg, xport_ep_t *ep, bt_status_t why)
{
    parent_t *p = arg;
    static test_hdr_t late = {.tag = T_DATA};
    /* inside the error callback: a send is refused, a close is a no-op */
    CHECK(xport_send(ep, &late, sizeof late, NULL, 0, NULL, NULL) != BT_IN_PROGRESS);
    xport_close(ep);
    p->errors_cb++;
    p->last_error = why;
    p->error_ns = clock_now_ns();
    for (int i = 0; i < p->n_eps; i++) if (p->eps[i] == ep) p->eps[i] = NULL;
}

static void parent_send_done(void *arg, bt_status_t st)
{
    parent_t *p = arg;
    p->sends_done++;
    p->last_send_status = st;
    if (st != BT_OK) p->send_fail++;
}

static bool parent_setup(parent_t *p, xport_kind_t kind)
{
    memset(p, 0, sizeof *p);
    secret_setup();
    pattern_init();
    p->kind = kind;
    p->loop = ev_loop_new(EVFLAG_AUTO);
    xport_config_t cfg = base_cfg(p->loop, 1);
    if (kind == XPORT_INPROC) {
        static atomic_int seq;
        static char name[64];
        snprintf(name, sizeof name, "inproc:conf%d", atomic_fetch_add(&seq, 1));
        cfg.listen_addr = name;
    }
    cfg.cbs = (xport_cbs_t){.arg = p, .accept = parent_on_accept, .alloc = parent_on_alloc,
                            .free = parent_on_free, .recv = parent_on_recv, .error = parent_on_error};
    const xport_ops_t *ops = xport_ops_get(kind);
    if (!ops || xport_create(ops, &cfg, &p->x) != BT_OK) return false;
    return xport_listen(p->x, p->addr, sizeof p->addr) == BT_OK;
}

static void *child_thread(void *arg)
{
    child_proc_t *k = arg;
    int argc = 0;
    while (k->argv[argc]) argc++;
    k->thread_rc = child_main(argc, k->argv);
    atomic_store(&k->thread_done, 1);
    return NULL;
}

/* Start a child in `mode`; `extra` is the size argument. */
static child_proc_t *parent_spawn(parent_t *p, const char *mode, uint64_t n, uint64_t size)
{
    child_proc_t *k = &p->kids[p->n_kids++];
    memset(k, 0, sizeof *k);
    snprintf(k->buf[0], 96, "%s", xport_kind_name(p->kind));
    snprintf(k->addr, sizeof k->addr, "%s", p->addr);
    snprintf(k->buf[2], 96, "%s", mode);
    snprintf(k->buf[3], 96, "%llu", (unsigned long long)n);
    snprintf(k->buf[4], 96, "%llu", (unsigned long long)size);
    for (int i = 0; i < 5; i++) k->argv[i] = i == 1 ? k->addr : k->buf[i];
    k->argv[5] = NULL;
    if (p->kind == XPORT_INPROC) {
        k->is_thread = true;
        pthread_create(&k->thread, NULL, child_thread, k);
        return k;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        char *av[8] = {"test_xport_conformance", "--xport-child"};
        for (int i = 0; i < 5; i++) av[2 + i] = k->argv[i];
        av[7] = NULL;
        execv("/proc/self/exe", av);
        _exit(127);
    }
    k->pid = pid;
    return k;
}

static bool child_poll(child_proc_t *k)
{
    if (k->exited) return true;
    if (k->is_thread) {
        if (!atomic_load(&k->thread_done)) return false;
        pthread_join(k->thread, NULL);
        k->status = k->thread_rc;
    } else {
        int st;
        pid_t r = waitpid(k->pid, &st, WNOHANG);
        if (r != k->pid) return false;
        k->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    k->exited = true;
    k->exit_ns = clock_now_ns();
    return true;
}

static void parent_tick(struct ev_loop *loop, ev_timer *w, int revents) { ev_break(loop, EVBREAK_ONE); }

/* Run the parent loop until cond() or the timeout; children are reaped as
 * they exit. */
static bool parent_run(parent_t *p, bool (*cond)(parent_t *), double timeout_s)
{
    ev_timer tick;
    ev_timer_init(&tick, parent_tick, 0.01, 0.01);
    ev_timer_start(p->loop, &tick);
    uint64_t deadline = clock_now_ns() + (uint64_t)(timeout_s * 1e9);
    bool ok = false;
    while (clock_now_ns() < deadline) {
        for (int i = 0; i < p->n_kids; i++) child_poll(&p->kids[i]);
        if (cond(p)) {
            ok = true;
            break;
        }
        ev_run(p->loop, EVRUN_ONCE);
    }
    ev_timer_stop(p->loop, &tick);
    return ok;
}

static bool cond_all_exited(parent_t *p)
{
    for (int i = 0; i < p->n_kids; i++) if (!p->kids[i].exited) return false;
    return true;
}

static void parent_bye_all(parent_t *p)
{
    static test_hdr_t bye = {.tag = T_BYE};
    for (int i = 0; i < p->n_eps; i++)
        if (p->eps[i]) xport_send(p->eps[i], &bye, sizeof bye, NULL, 0, parent_send_done, p);
}

/* Finish: say bye, wait for every child, check their exit codes, destroy. */
static void parent_finish(parent_t *p)
{
    parent_bye_all(p);
    bool all = parent_run(p, cond_all_exited, 30.0);
    CHECK_MSG(all, "children did not exit");
    for (int i = 0; i < p->n_kids; i++) {
        child_proc_t *k = &p->kids[i];
        if (!k->exited) {
            if (k->pid) {
                kill(k->pid, SIGKILL);
                waitpid(k->pid, NULL, 0);
            }
            continue;
        }
    }
    xport_destroy(p->x);
    ev_loop_destroy(p->loop);
    CHECK_MSG(p->allocs == p->frees, "payload buffers: %d allocated, %d freed", p->allocs, p->frees);
}

static void check_kids_ok(parent_t *p)
{
    for (int i = 0; i < p->n_kids; i++)
        CHECK_MSG(p->kids[i].exited && p->kids[i].status == 0, "child %d (%s) exit status %d", i,
                  p->kids[i].argv[2], p->kids[i].status);
}

static bool cond_one_peer(parent_t *p) { return p->n_eps >= 1; }

/* ---- case: ordering (child streams numbered frames to us) -------------- */

typedef struct {
    uint64_t next[64];
    uint64_t bad;
    uint64_t got;
    uint64_t want;
    size_t   max;
    bool     report;
    uint64_t report_rx, report_err;
} stream_ctx_t;

static void stream_on_recv(parent_t *p, xport_ep_t *ep, xport_rx_t *rx, const test_hdr_t *h)
{
    stream_ctx_t *s = p->ctx;
    if (h->tag == T_REPORT) {
        s->report = true;
        s->report_rx = h->seq;
        s->report_err = h->aux;
    } else if (h->tag == T_DATA && h->conn < 64) {
        size_t want = stream_size(h->seq, s->max);
        if (h->seq != s->next[h->conn] || rx->payload_len != want
            || (want && memcmp(rx->payload, stream_bytes(h->seq), want) != 0)) {
            if (s->bad++ < 5)
                fprintf(stderr, "frame conn %u seq %llu (expected %llu) len %zu (expected %zu) bad\n",
                        h->conn, (unsigned long long)h->seq, (unsigned long long)s->next[h->conn],
                        rx->payload_len, want);
        }
        s->next[h->conn] = h->seq + 1;
        s->got++;
    } else {
        s->bad++;
    }
    xport_rx_release(rx);
}

static bool cond_stream_done(parent_t *p)
{
    stream_ctx_t *s = p->ctx;
    return s->got >= s->want && (s->report || s->want == 0);
}

static void case_order(xport_kind_t kind)
{
    parent_t p;
    REQUIRE(parent_setup(&p, kind));
    stream_ctx_t s = {.want = 5000, .max = 300};
    p.ctx = &s;
    p.on_recv = stream_on_recv;
    parent_spawn(&p, "stream", s.want, s.max);
    CHECK(parent_run(&p, cond_stream_done, 60));
    CHECK(s.got == s.want);
    CHECK(s.bad == 0);
    CHECK(s.report && s.report_err == 0);
    parent_finish(&p);
    check_kids_ok(&p);
}

/* ---- case: a peer that sends and exits at once -------------------------- */

static bool cond_stream_and_close(parent_t *p)
{
    stream_ctx_t *s = p->ctx;
    return p->errors_cb > 0 || s->bad > 0; /* the close comes after the frames, or too early */
}

/* The child posts frames of up to 1 MiB (rendezvous sizes on ucx) and
 * right away destroys its transport and exits ("sendexit") or closes the
 * endpoint and lives on ("sendclose"): every frame must still arrive, intact
 * and in order, and only then the close (tcp: the FIN after the bytes; ucx:
 * the BYE after the frames, acknowledged once their data is pulled). */
static void case_send_then(xport_kind_t kind, const char *mode)
{
    parent_t p;
    REQUIRE(parent_setup(&p, kind));
    stream_ctx_t s = {.want = 48, .max = PATTERN_LEN};
    s.report = true; /* sendexit sends no report */
    p.ctx = &s;
    p.on_recv = stream_on_recv;
    parent_spawn(&p, mode, s.want, s.max);
    CHECK(parent_run(&p, cond_stream_and_close, 60));
    CHECK_MSG(s.got == s.want, "got %llu of %llu frames before the close", (unsigned long long)s.got,
              (unsigned long long)s.want);
    CHECK(s.bad == 0);
    CHECK_MSG(p.errors_cb == 1 && p.last_error == BT_ERR_PEER_CLOSED, "%d error callbacks, last %s",
              p.errors_cb, bt_status_str(p.last_error));
    parent_finish(&p);
    check_kids_ok(&p);
}

/* ---- case: both directions at once ------------------------------------ */

static void case_bidir(xport_kind_t kind)
{
    parent_t p;
    REQUIRE(parent_setup(&p, kind));
    stream_ctx_t s = {.want = 2000, .max = 65536};
    p.ctx = &s;
    p.on_recv = stream_on_recv;
    parent_spawn(&p, "bidir", s.want, s.max);
    REQUIRE(parent_run(&p, cond_one_peer, 30));
    test_hdr_t *hdrs = calloc(s.want, sizeof *hdrs);
    for (uint64_t i = 0; i < s.want; i++) {
        size_t n = stream_size(i, s.max);
        hdrs[i] = (test_hdr_t){.tag = T_DATA, .seq = i, .len = n};
        struct iovec iov = {.iov_base = (void *)stream_bytes(i), .iov_len = n};
        CHECK(xport_send(p.eps[0], &hdrs[i], sizeof hdrs[i], &iov, n ? 1 : 0, parent_send_done, &p)
              == BT_IN_PROGRESS);
    }
    CHECK(parent_run(&p, cond_stream_done, 60));
    CHECK(s.got == s.want);
    CHECK(s.bad == 0);
    CHECK_MSG(s.report && s.report_rx == s.want && s.report_err == 0,
              "child saw %llu frames, %llu errors", (unsigned long long)s.report_rx,
              (unsigned long long)s.report_err);
    CHECK(p.sends_done == s.want && p.send_fail == 0);
    parent_finish(&p);
    free(hdrs);
    check_kids_ok(&p);
}

/* ---- case: payload sizes (echo child hashes and echoes) ----------------- */

typedef struct {
    uint64_t replies, bad;
    const uint8_t *sent[16];
    uint64_t hash[16];
} sizes_ctx_t;

static void sizes_on_recv(parent_t *p, xport_ep_t *ep, xport_rx_t *rx, const test_hdr_t *h)
{
    sizes_ctx_t *s = p->ctx;
    if (h->tag != T_REPLY || h->seq >= 16) {
        s->bad++;
    } else {
        size_t len = (size_t)h->len;
        bool ok = h->hash == s->hash[h->seq];
        if (len <= ECHO_MAX)
            ok = ok && rx->payload_len == len && (!len || !memcmp(rx->payload, s->sent[h->seq], len));
        if (!ok) {
            fprintf(stderr, "size case %llu (%zu bytes): reply mismatch\n", (unsigned long long)h->seq, len);
            s->bad++;
        }
        s->replies++;
    }
    xport_rx_release(rx);
}

static uint64_t g_sizes_want;
static uint64_t g_sends_want;
static bool cond_sizes(parent_t *p)
{
    return ((sizes_ctx_t *)p->ctx)->replies >= g_sizes_want && p->sends_done >= g_sends_want;
}

static void case_sizes(xport_kind_t kind)
{
    static const size_t sizes[] = {0, 1, 3, 17, 4095, 4096, 4097, 65537, (1u << 20) - 1,
                                   (1u << 20), (4u << 20) + 13, (256u << 20)};
    enum { N = sizeof sizes / sizeof sizes[0] };
    parent_t p;
    REQUIRE(parent_setup(&p, kind));
    sizes_ctx_t s = {0};
    p.ctx = &s;
    p.on_recv = sizes_on_recv;
    parent_spawn(&p, "echo", 0, 0);
    REQUIRE(parent_run(&p, cond_one_peer, 30));
    uint8_t *big = malloc(sizes[N - 1]);
    pattern_fill(big, sizes[N - 1], 99);
    test_hdr_t hdrs[N];
    for (int i = 0; i < N; i++) {
        const uint8_t *src = big + (sizes[i] < sizes[N - 1] ? (size_t)i * 5 : 0);
        s.sent[i] = src;
        s.hash[i] = sizes[i] ? XXH3_64bits(src, sizes[i]) : 0;
        hdrs[i] = (test_hdr_t){.tag = T_DATA, .seq = (uint64_t)i, .len = sizes[i]};
        /* odd sizes go as two iovecs to exercise gathering */
        struct iovec iov[2] = {{.iov_base = (void *)src, .iov_len = sizes[i] / 3},
                               {.iov_base = (void *)(src + sizes[i] / 3), .iov_len = sizes[i] - sizes[i] / 3}};
        int cnt = sizes[i] == 0 ? 0 : (sizes[i] & 1) ? 2 : 1;
        if (cnt == 1) iov[0].iov_len = sizes[i];
        CHECK(xport_send(p.eps[0], &hdrs[i], sizeof hdrs[i], iov, cnt, parent_send_done, &p)
              == BT_IN_PROGRESS);
    }
    g_sizes_want = N;
    g_sends_want = N;
    CHECK(parent_run(&p, cond_sizes, 90));
    CHECK(s.replies == N);
    CHECK(s.bad == 0);
    CHECK(p.sends_done == N && p.send_fail == 0);
    parent_finish(&p);
    free(big);
    check_kids_ok(&p);
}

/* ---- case: 64 concurrent peers to one listener ------------------------ */

static void case_peers64(xport_kind_t kind)
{
    parent_t p;
    REQUIRE(parent_setup(&p, kind));
    stream_ctx_t s = {.want = 64 * 50, .max = 200};
    p.ctx = &s;
    p.on_recv = stream_on_recv;
    parent_spawn(&p, "multi", 50, s.max);
    s.report = true; /* multi sends no report */
    CHECK(parent_run(&p, cond_stream_done, 60));
    CHECK_MSG(p.n_eps == 64, "accepted %d peers", p.n_eps);
    CHECK(s.got == s.want);
    CHECK(s.bad == 0);
    for (int i = 0; i < 64; i++) CHECK_MSG(s.next[i] == 50, "conn %d got %llu frames", i, (unsigned long long)s.next[i]);
    /* one bye is enough: the child stops on the first */
    for (int i = 1; i < p.n_eps; i++) p.eps[i] = NULL;
    parent_finish(&p);
    check_kids_ok(&p);
}

/* ---- case: peer killed while we send a large payload ------------------- */

static bool cond_error_and_sends(parent_t *p)
{
    return p->errors_cb >= 1 && p->sends_done + p->send_refused >= *(uint64_t *)p->ctx
           && cond_all_exited(p);
}

static void case_kill_recv(xport_kind_t kind)
{
    parent_t p;
    REQUIRE(parent_setup(&p, kind));
    uint64_t nsend = 9;
    p.ctx = &nsend;
    child_proc_t *k = parent_spawn(&p, "killrecv", 0, 0);
    REQUIRE(parent_run(&p, cond_one_peer, 30));
    uint8_t *big = malloc(BIG_KILL);
    pattern_fill(big, BIG_KILL, 5);
    test_hdr_t hdrs[9];
    for (int i = 0; i < 9; i++) {
        size_t n = i == 4 ? BIG_KILL : 100;
        hdrs[i] = (test_hdr_t){.tag = T_DATA, .seq = (uint64_t)i, .len = n};
        struct iovec iov = {.iov_base = big, .iov_len = n};
        /* inproc: the peer may already be gone (it leaves on the first frame) */
        bt_status_t st = xport_send(p.eps[0], &hdrs[i], sizeof hdrs[i], &iov, 1, parent_send_done, &p);
        if (st != BT_IN_PROGRESS) {
            CHECK(bt_status_is_peer(st));
            p.send_refused++;
        }
    }
    uint64_t t0 = clock_now_ns();
    CHECK(parent_run(&p, cond_error_and_sends, 10));
    CHECK(p.errors_cb == 1);
    CHECK(bt_status_is_peer(p.last_error));
    CHECK_MSG(p.sends_done + p.send_refused == 9, "%llu of 9 sends completed, %llu refused",
              (unsigned long long)p.sends_done, (unsigned long long)p.send_refused);
    CHECK(p.send_fail + p.send_refused >= 1);
    if (kind != XPORT_INPROC) {
        CHECK_MSG(k->exited && k->status == 128 + SIGKILL, "child status %d", k->status);
        double after_ms = ((double)p.error_ns - (double)k->exit_ns) / 1e6;
        CHECK_MSG(p.error_ns && after_ms < 2000.0, "error %.0f ms after the peer died", after_ms);
    } else {
        CHECK(k->exited && k->status == 0);
    }
    log_info("kill_recv/%s: error after %.0f ms from the first send", xport_kind_name(kind),
             ((double)p.error_ns - (double)t0) / 1e6);
    xport_destroy(p.x);
    ev_loop_destroy(p.loop);
    free(big);
    CHECK(p.allocs == p.frees);
}

/* ---- case: peer killed while it sends us a large payload (tcp, ucx) ----- */

static child_proc_t *g_kill_target;

static void killsend_on_alloc(parent_t *p, size_t len)
{
    if (len >= BIG_KILL && g_kill_target && g_kill_target->pid) kill(g_kill_target->pid, SIGKILL);
}

static bool cond_error_and_exit(parent_t *p) { return p->errors_cb >= 1 && cond_all_exited(p); }

static void case_kill_send(xport_kind_t kind)
{
    parent_t p;
    REQUIRE(parent_setup(&p, kind));
    p.on_alloc = killsend_on_alloc;
    child_proc_t *k = parent_spawn(&p, "sendbig", 0, 0);
    g_kill_target = k;
    CHECK(parent_run(&p, cond_error_and_exit, 20));
    CHECK(p.errors_cb == 1);
    CHECK(bt_status_is_peer(p.last_error));
    CHECK_MSG(k->exited && k->status == 128 + SIGKILL, "child status %d", k->status);
    double after_ms = ((double)p.error_ns - (double)k->exit_ns) / 1e6;
    CHECK_MSG(p.error_ns && after_ms < 2000.0, "error %.0f ms after the peer died", after_ms);
    CHECK_MSG(p.allocs >= 1, "the large frame never started");
    xport_destroy(p.x);
    ev_loop_destroy(p.loop);
    CHECK_MSG(p.allocs == p.frees, "%d allocated, %d freed", p.allocs, p.frees);
    g_kill_target = NULL;
}

/* inproc stand-in: the sender's xport is destroyed while we hold its frame */
typedef struct { xport_rx_t *held; } hold_ctx_t;

static void hold_on_recv(parent_t *p, xport_ep_t *ep, xport_rx_t *rx, const test_hdr_t *h)
{
    hold_ctx_t *c = p->ctx;
    if (h->tag == T_DATA && !c->held) {
        c->held = rx;
        parent_bye_all(p); /* the child then destroys its xport */
        return;
    }
    xport_rx_release(rx);
}

static bool cond_held_and_gone(parent_t *p)
{
    return ((hold_ctx_t *)p->ctx)->held && cond_all_exited(p) && p->errors_cb >= 1;
}

static void case_kill_send_inproc(void)
{
    parent_t p;
    REQUIRE(parent_setup(&p, XPORT_INPROC));
    hold_ctx_t c = {0};
    p.ctx = &c;
    p.on_recv = hold_on_recv;
    parent_spawn(&p, "holdsend", 0, 0);
    CHECK(parent_run(&p, cond_held_and_gone, 20));
    REQUIRE(c.held);
    CHECK(c.held->payload_len == PATTERN_LEN && !memcmp(c.held->payload, g_pattern, PATTERN_LEN));
    xport_rx_release(c.held); /* the sender is gone: must be safe */
    CHECK(p.errors_cb == 1 && p.last_error == BT_ERR_PEER_CLOSED);
    check_kids_ok(&p);
    xport_destroy(p.x);
    ev_loop_destroy(p.loop);
}

/* ---- case: close from inside a recv callback, frames and sends pending --- */

static void closecb_on_recv(parent_t *p, xport_ep_t *ep, xport_rx_t *rx, const test_hdr_t *h)
{
    p->recv_count++;
    xport_rx_release(rx);
    if (p->recv_count == 5) {
        xport_close(ep); /* replies and sends are still in flight */
        for (int i = 0; i < p->n_eps; i++) if (p->eps[i] == ep) p->eps[i] = NULL;
        static test_hdr_t h2 = {.tag = T_DATA};
        CHECK(xport_send(ep, &h2, sizeof h2, NULL, 0, NULL, NULL) != BT_IN_PROGRESS);
    }
}

static bool cond_sends_done(parent_t *p) { return p->sends_done >= g_sends_want && cond_all_exited(p); }

static void case_close_in_callback(xport_kind_t kind)
{
    parent_t p;
    REQUIRE(parent_setup(&p, kind));
    p.on_recv = closecb_on_recv;
    child_proc_t *k = parent_spawn(&p, "echo", 0, 0);
    REQUIRE(parent_run(&p, cond_one_peer, 30));
    enum { N = 200 };
    static test_hdr_t hdrs[N];
    for (int i = 0; i < N; i++) {
        hdrs[i] = (test_hdr_t){.tag = T_DATA, .seq = (uint64_t)i, .len = 4096};
        struct iovec iov = {.iov_base = g_pattern, .iov_len = 4096};
        CHECK(xport_send(p.eps[0], &hdrs[i], sizeof hdrs[i], &iov, 1, parent_send_done, &p) == BT_IN_PROGRESS);
    }
    g_sends_want = N;
    CHECK(parent_run(&p, cond_sends_done, 20)); /* every send completes, OK or canceled */
    CHECK_MSG(p.sends_done == N, "%llu of %d sends completed", (unsigned long long)p.sends_done, N);
    CHECK_MSG(p.recv_count == 5, "%llu frames after the close", (unsigned long long)p.recv_count);
    CHECK_MSG(p.errors_cb == 0, "a local close must not call the error callback");
    CHECK_MSG(k->exited && k->status == 1, "the echo child should have seen its peer go (status %d)",
              k->status);
    xport_destroy(p.x);
    ev_loop_destroy(p.loop);
    CHECK(p.allocs == p.frees);
}

/* ---- case: connect to an address where nobody listens ------------------ */

static bt_status_t g_conn_status;
static int g_conn_calls;
static void unreach_connected(void *arg, xport_ep_t *ep, bt_status_t st)
{
    g_conn_status = st;
    g_conn_calls++;
}
static bool cond_conn_called(parent_t *p) { return g_conn_calls > 0; }

static void case_unreachable(xport_kind_t kind)
{
    parent_t p;
    REQUIRE(parent_setup(&p, kind));
    char dead[XPORT_LISTEN_ADDR_MAX];
    if (kind == XPORT_INPROC) {
        snprintf(dead, sizeof dead, "inproc:nobody-here");
    } else if (kind == XPORT_UCX) {
        /* the address of a worker that is gone: p's own, destroyed below */
        snprintf(dead, sizeof dead, "%s", p.addr);
    } else {
        /* a port that was just free */
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t al = sizeof a;
        REQUIRE(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
        getsockname(fd, (struct sockaddr *)&a, &al);
        close(fd);
        snprintf(dead, sizeof dead, "127.0.0.1:%u", ntohs(a.sin_port));
    }
    xport_destroy(p.x);
    xport_config_t cfg = base_cfg(p.loop, 1);
    cfg.cbs = (xport_cbs_t){.arg = &p, .connected = unreach_connected, .error = parent_on_error};
    REQUIRE(xport_create(xport_ops_get(kind), &cfg, &p.x) == BT_OK);
    g_conn_calls = 0;
    xport_ep_t *ep = NULL;
    uint64_t t0 = clock_now_ns();
    bt_status_t st = xport_connect(p.x, dead, &ep);
    if (st == BT_IN_PROGRESS) {
        static test_hdr_t h = {.tag = T_DATA};
        bt_status_t s2 = xport_send(ep, &h, sizeof h, NULL, 0, parent_send_done, &p);
        CHECK(parent_run(&p, cond_conn_called, 10));
        CHECK(g_conn_calls == 1);
        CHECK_MSG(g_conn_status == BT_ERR_PEER_UNREACH, "connected(%s)", bt_status_str(g_conn_status));
        if (s2 == BT_IN_PROGRESS) CHECK(p.sends_done == 1 && p.send_fail == 1);
    } else {
        CHECK(bt_status_is_peer(st)); /* refused at once */
    }
    CHECK_MSG(clock_now_ns() - t0 < 3000000000ull, "took %.0f ms", (double)(clock_now_ns() - t0) / 1e6);
    CHECK(p.errors_cb == 0);
    xport_destroy(p.x);
    ev_loop_destroy(p.loop);
}

/* ---- case: a frame over the receiver's limit ---------------------------- */

static void case_frame_limit(xport_kind_t kind)
{
    parent_t p;
    REQUIRE(parent_setup(&p, kind));
    char addr[XPORT_LISTEN_ADDR_MAX];
    snprintf(addr, sizeof addr, "%s", p.addr);
    xport_destroy(p.x);
    xport_config_t cfg = base_cfg(p.loop, 1);
    cfg.max_frame = 1u << 20; /* the child sends 64 MiB */
    char name[XPORT_ADDR_MAX];
    snprintf(name, sizeof name, "%.80s-lim", addr);
    if (kind == XPORT_INPROC) cfg.listen_addr = name;
    cfg.cbs = (xport_cbs_t){.arg = &p, .accept = parent_on_accept, .alloc = parent_on_alloc,
                            .free = parent_on_free, .recv = parent_on_recv, .error = parent_on_error};
    REQUIRE(xport_create(xport_ops_get(kind), &cfg, &p.x) == BT_OK);
    REQUIRE(xport_listen(p.x, p.addr, sizeof p.addr) == BT_OK);
    child_proc_t *k = parent_spawn(&p, "sendbig", 0, 0);
    CHECK(parent_run(&p, cond_error_and_exit, 20));
    CHECK(p.errors_cb == 1 && p.last_error == BT_ERR_PEER_PROTO);
    CHECK_MSG(p.allocs == 0, "an oversized payload reached cbs.alloc");
    CHECK(k->exited);
    xport_destroy(p.x);
    ev_loop_destroy(p.loop);
}

/* ---- case: one xport connects to its own listener ---------------------- */

typedef struct {
    xport_ep_t *client, *server;
    int         connected, accepted;
    uint64_t    at_client, at_server, bad;
} self_ctx_t;

static void self_accept(void *arg, xport_ep_t *ep, uint32_t id) { ((self_ctx_t *)arg)->server = ep; ((self_ctx_t *)arg)->accepted++; }
static void self_connected(void *arg, xport_ep_t *ep, bt_status_t st) { if (st == BT_OK) ((self_ctx_t *)arg)->connected++; }
static void self_recv(void *arg, xport_ep_t *ep, xport_rx_t *rx)
{
    self_ctx_t *c = arg;
    test_hdr_t h;
    memcpy(&h, rx->hdr, sizeof h);
    /* frames sent by the client carry tag DATA, by the server REPLY */
    if (ep == c->server && h.tag == T_DATA && h.seq == c->at_server) c->at_server++;
    else if (ep == c->client && h.tag == T_REPLY && h.seq == c->at_client) c->at_client++;
    else c->bad++;
    xport_rx_release(rx);
}

static self_ctx_t *g_self;
static bool cond_self_connected(parent_t *p) { return g_self->connected && g_self->accepted; }
static bool cond_self_done(parent_t *p) { return g_self->at_client >= 100 && g_self->at_server >= 100; }

static void case_self_connect(xport_kind_t kind)
{
    parent_t p;
    REQUIRE(parent_setup(&p, kind));
    self_ctx_t c = {0};
    g_self = &c;
    char addr[XPORT_LISTEN_ADDR_MAX];
    snprintf(addr, sizeof addr, "%s", p.addr);
    xport_destroy(p.x);
    xport_config_t cfg = base_cfg(p.loop, 1);
    char name[XPORT_ADDR_MAX];
    snprintf(name, sizeof name, "%.80s-self", addr);
    if (kind == XPORT_INPROC) cfg.listen_addr = name;
    cfg.cbs = (xport_cbs_t){.arg = &c, .accept = self_accept, .connected = self_connected,
                            .recv = self_recv};
    REQUIRE(xport_create(xport_ops_get(kind), &cfg, &p.x) == BT_OK);
    REQUIRE(xport_listen(p.x, addr, sizeof addr) == BT_OK);
    REQUIRE(xport_connect(p.x, addr, &c.client) == BT_IN_PROGRESS);
    REQUIRE(parent_run(&p, cond_self_connected, 10));
    static test_hdr_t up[100], down[100];
    for (int i = 0; i < 100; i++) {
        up[i] = (test_hdr_t){.tag = T_DATA, .seq = (uint64_t)i};
        down[i] = (test_hdr_t){.tag = T_REPLY, .seq = (uint64_t)i};
        struct iovec iov = {.iov_base = g_pattern, .iov_len = (size_t)i * 100};
        CHECK(xport_send(c.client, &up[i], sizeof up[i], &iov, i ? 1 : 0, NULL, NULL) == BT_IN_PROGRESS);
        CHECK(xport_send(c.server, &down[i], sizeof down[i], &iov, i ? 1 : 0, NULL, NULL) == BT_IN_PROGRESS);
    }
    CHECK(parent_run(&p, cond_self_done, 20));
    CHECK(c.bad == 0);
    CHECK(xport_ep_peer_id_get(c.client) == 1 && xport_ep_peer_id_get(c.server) == 1);
    xport_destroy(p.x);
    ev_loop_destroy(p.loop);
}

/* inproc: closing takes back the frames the peer has not picked up; they
 * complete with CANCELED from the loop (their buffers are free again) */
static int g_tb_cancel, g_tb_other, g_tb_err, g_tb_recv;
static void tb_done(void *arg, bt_status_t st) { if (st == BT_ERR_CANCELED) g_tb_cancel++; else g_tb_other++; }
static void tb_error(void *arg, xport_ep_t *ep, bt_status_t st) { g_tb_err++; }
static void tb_recv(void *arg, xport_ep_t *ep, xport_rx_t *rx) { g_tb_recv++; xport_rx_release(rx); }
static bool cond_tb(parent_t *p) { return g_tb_cancel + g_tb_other >= 50 && g_tb_err >= 1; }

static void test_inproc_close_takes_back(void)
{
    parent_t p;
    REQUIRE(parent_setup(&p, XPORT_INPROC));
    self_ctx_t c = {0};
    g_self = &c;
    char addr[XPORT_ADDR_MAX];
    snprintf(addr, sizeof addr, "%.80s-tb", p.addr);
    xport_destroy(p.x);
    xport_config_t cfg = base_cfg(p.loop, 1);
    cfg.listen_addr = addr;
    cfg.cbs = (xport_cbs_t){.arg = &c, .accept = self_accept, .connected = self_connected,
                            .recv = tb_recv, .error = tb_error};
    REQUIRE(xport_create(&xport_inproc_ops, &cfg, &p.x) == BT_OK);
    REQUIRE(xport_listen(p.x, addr, sizeof addr) == BT_OK);
    REQUIRE(xport_connect(p.x, addr, &c.client) == BT_IN_PROGRESS);
    REQUIRE(parent_run(&p, cond_self_connected, 10));
    static test_hdr_t h = {.tag = T_DATA};
    struct iovec iov = {.iov_base = g_pattern, .iov_len = 1000};
    for (int i = 0; i < 50; i++)
        CHECK(xport_send(c.client, &h, sizeof h, &iov, 1, tb_done, NULL) == BT_IN_PROGRESS);
    xport_close(c.client); /* before the loop let the listener side take any */
    CHECK(g_tb_cancel == 0); /* never inside close() */
    CHECK(parent_run(&p, cond_tb, 10));
    CHECK_MSG(g_tb_cancel == 50 && g_tb_other == 0, "%d canceled, %d other", g_tb_cancel, g_tb_other);
    CHECK(g_tb_recv == 0);
    CHECK(g_tb_err == 1);
    xport_destroy(p.x);
    ev_loop_destroy(p.loop);
}

/* inproc: a connector on another thread takes its frame back out of the
 * listener's box (closing before the listener picked it up) while the
 * listener polls that box: inproc_drain reads the box head without the lock,
 * so the take-back must store it atomically. ThreadSanitizer reported the
 * plain store (seen in test_coll and close_in_callback, where it depended on
 * timing). Here the order is fixed: the listener polls its empty box, then
 * says so through a relaxed flag (which orders nothing for TSan), then the
 * connector sends and closes. */
typedef struct {
    char            addr[XPORT_ADDR_MAX];
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    bool            connected;   /* under mu */
    atomic_int      polled;      /* relaxed only */
    int             canceled, other, conn_status;
} tbp_ctx_t;
static int g_tbp_accepts, g_tbp_recv, g_tbp_err;
static void tbp_accept(void *arg, xport_ep_t *ep, uint32_t peer) { g_tbp_accepts++; }
static void tbp_recv(void *arg, xport_ep_t *ep, xport_rx_t *rx) { g_tbp_recv++; xport_rx_release(rx); }
static void tbp_error(void *arg, xport_ep_t *ep, bt_status_t st) { g_tbp_err += st == BT_ERR_PEER_CLOSED; }
static void tbp_connected(void *arg, xport_ep_t *ep, bt_status_t st)
{
    tbp_ctx_t *c = arg;
    c->conn_status = st == BT_OK ? 1 : -1;
}
static void tbp_done(void *arg, bt_status_t st)
{
    tbp_ctx_t *c = arg;
    if (st == BT_ERR_CANCELED) c->canceled++;
    else c->other++;
}

static void *tbp_connector(void *arg)
{
    tbp_ctx_t *c = arg;
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    xport_config_t cfg = base_cfg(loop, 2);
    cfg.cbs = (xport_cbs_t){.arg = c, .connected = tbp_connected};
    xport_t *x = NULL;
    xport_ep_t *ep = NULL;
    if (xport_create(&xport_inproc_ops, &cfg, &x) != BT_OK || xport_connect(x, c->addr, &ep) != BT_IN_PROGRESS) {
        c->conn_status = -1;
    } else {
        uint64_t deadline = clock_now_ns() + (uint64_t)(10e9 * test_time_scale());
        while (!c->conn_status && clock_now_ns() < deadline)
            if (!xport_progress(x)) usleep(1000);
    }
    pthread_mutex_lock(&c->mu);
    c->connected = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->conn_status == 1) {
        while (!atomic_load_explicit(&c->polled, memory_order_relaxed)) usleep(100);
        static test_hdr_t h = {.tag = T_DATA};
        struct iovec iov = {.iov_base = g_pattern, .iov_len = 100};
        if (xport_send(ep, &h, sizeof h, &iov, 1, tbp_done, c) != BT_IN_PROGRESS) c->other++;
        xport_close(ep); /* takes the frame back out of the listener's box */
        uint64_t deadline = clock_now_ns() + (uint64_t)(10e9 * test_time_scale());
        while (!c->canceled && !c->other && clock_now_ns() < deadline)
            if (!xport_progress(x)) usleep(1000);
    }
    if (x) xport_destroy(x);
    ev_loop_destroy(loop);
    return NULL;
}

static void test_inproc_take_back_while_peer_polls(void)
{
    secret_setup();
    pattern_init();
    tbp_ctx_t c = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    snprintf(c.addr, sizeof c.addr, "inproc:tbp-%d", (int)getpid());
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    xport_config_t cfg = base_cfg(loop, 1);
    cfg.listen_addr = c.addr;
    cfg.cbs = (xport_cbs_t){.accept = tbp_accept, .recv = tbp_recv, .error = tbp_error};
    xport_t *x = NULL;
    char addr[XPORT_ADDR_MAX];
    REQUIRE(xport_create(&xport_inproc_ops, &cfg, &x) == BT_OK);
    REQUIRE(xport_listen(x, addr, sizeof addr) == BT_OK);
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, tbp_connector, &c) == 0);
    /* accept on our side; the connector says when its side is connected */
    uint64_t deadline = clock_now_ns() + (uint64_t)(10e9 * test_time_scale());
    bool up = false;
    while (!up && clock_now_ns() < deadline) {
        xport_progress(x);
        pthread_mutex_lock(&c.mu);
        up = c.connected;
        pthread_mutex_unlock(&c.mu);
        if (!up) usleep(1000);
    }
    CHECK(up && g_tbp_accepts == 1);
    xport_progress(x); /* the box is empty: only the unlocked look at its head */
    atomic_store_explicit(&c.polled, 1, memory_order_relaxed);
    pthread_join(th, NULL);
    CHECK(c.conn_status == 1);
    CHECK_MSG(c.canceled == 1 && c.other == 0, "%d canceled, %d other", c.canceled, c.other);
    deadline = clock_now_ns() + (uint64_t)(10e9 * test_time_scale());
    while (!g_tbp_err && clock_now_ns() < deadline)
        if (!xport_progress(x)) usleep(1000);
    CHECK(g_tbp_err == 1);  /* the close arrived... */
    CHECK(g_tbp_recv == 0); /* ...and the frame taken back never did */
    xport_destroy(x);
    ev_loop_destroy(loop);
}

/* ---- case: bad handshake (wrong secret / wrong job id) ----------------- */

static void case_bad_handshake(xport_kind_t kind)
{
    parent_t p;
    REQUIRE(parent_setup(&p, kind));
    sizes_ctx_t s = {0};
    p.ctx = &s;
    p.on_recv = sizes_on_recv;
    parent_spawn(&p, "echo", 0, 0);
    child_proc_t *bad_job = parent_spawn(&p, "badauth", 0, 2);
    child_proc_t *bad_secret = kind != XPORT_INPROC ? parent_spawn(&p, "badauth", 0, 1) : NULL;
    REQUIRE(parent_run(&p, cond_one_peer, 30));
    /* A refused ucx client learns it from its own handshake timeout (the
     * listener tells an unauthenticated peer nothing), 2 s scaled: wait
     * well past that. */
    uint64_t deadline = clock_now_ns() + (uint64_t)(20e9 * test_time_scale());
    while (clock_now_ns() < deadline && !(child_poll(bad_job) && (!bad_secret || child_poll(bad_secret))))
        ev_run(p.loop, EVRUN_NOWAIT), usleep(1000);
    CHECK_MSG(bad_job->exited && bad_job->status == 0, "wrong-job client status %d", bad_job->status);
    if (bad_secret)
        CHECK_MSG(bad_secret->exited && bad_secret->status == 0, "wrong-secret client status %d",
                  bad_secret->status);
    /* the good peer still works */
    static test_hdr_t h = {.tag = T_DATA, .seq = 0, .len = 10};
    s.sent[0] = g_pattern;
    s.hash[0] = XXH3_64bits(g_pattern, 10);
    struct iovec iov = {.iov_base = g_pattern, .iov_len = 10};
    CHECK(xport_send(p.eps[0], &h, sizeof h, &iov, 1, parent_send_done, &p) == BT_IN_PROGRESS);
    g_sizes_want = 1;
    g_sends_want = p.sends_done + 1;
    CHECK(parent_run(&p, cond_sizes, 20));
    CHECK(s.replies == 1 && s.bad == 0);
    CHECK_MSG(p.n_eps == 1, "%d peers accepted, expected only the good one", p.n_eps);
    parent_finish(&p);
    check_kids_ok(&p);
}

/* ======================================================================
 * tcp only: raw sockets
 * ==================================================================== */

typedef enum { RAW_BAD_MAGIC, RAW_OVERSIZE, RAW_TRUNCATED, RAW_GARBAGE, RAW_SILENT, RAW_REPLAY,
               RAW_WRONG_SECRET } raw_kind_t;

typedef struct {
    raw_kind_t         what;
    struct sockaddr_storage ss;
    socklen_t          sl;
    atomic_int         done;
    bool               closed_by_server; /* read saw EOF/reset */
    bool               hs_ok;
    uint8_t            rec[XPORT_HS_HELLO_LEN + XPORT_HS_PROOF_LEN]; /* recorded client bytes */
} raw_t;

static int raw_connect(raw_t *r)
{
    int fd = socket(r->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&r->ss, r->sl) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static bool raw_read_full(int fd, uint8_t *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, p + got, n - got);
        if (k <= 0) return false;
        got += (size_t)k;
    }
    return true;
}

/* true when the server closes the connection (EOF or reset) in time */
static bool raw_wait_closed(int fd)
{
    uint8_t b[4096];
    for (;;) {
        ssize_t k = read(fd, b, sizeof b);
        if (k == 0) return true;
        if (k < 0) return errno == ECONNRESET;
    }
}

static bool raw_handshake(int fd, const uint8_t *secret, size_t len, uint8_t *rec)
{
    xport_hs_t hs;
    if (xport_hs_init(&hs, false, JOB_ID, secret, len, 99) != BT_OK) return false;
    uint8_t hello[XPORT_HS_HELLO_LEN], peer[XPORT_HS_HELLO_LEN], proof[XPORT_HS_PROOF_LEN];
    char why[128];
    xport_hs_hello_write(&hs, hello);
    if (write(fd, hello, sizeof hello) != (ssize_t)sizeof hello) return false;
    if (!raw_read_full(fd, peer, sizeof peer)) return false;
    if (xport_hs_hello_read(&hs, peer, why, sizeof why) != BT_OK) return false;
    xport_hs_proof_write(&hs, proof);
    if (rec) {
        memcpy(rec, hello, sizeof hello);
        memcpy(rec + sizeof hello, proof, sizeof proof);
    }
    if (write(fd, proof, sizeof proof) != (ssize_t)sizeof proof) return false;
    uint8_t sp[XPORT_HS_PROOF_LEN];
    if (!raw_read_full(fd, sp, sizeof sp)) return false;
    return xport_hs_proof_check(&hs, sp, why, sizeof why) == BT_OK;
}

static void put_le(uint8_t *p, uint64_t v, int n) { for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i)); }

static void *raw_thread(void *arg)
{
    raw_t *r = arg;
    int fd = raw_connect(r);
    if (fd < 0) goto done;
    uint8_t fh[24] = {0};
    put_le(fh, 0x52465442u, 4);
    put_le(fh + 4, 1, 2);
    switch (r->what) {
    case RAW_BAD_MAGIC:
    case RAW_OVERSIZE:
    case RAW_TRUNCATED:
        r->hs_ok = raw_handshake(fd, g_secret, g_secret_len, NULL);
        if (!r->hs_ok) break;
        if (r->what == RAW_BAD_MAGIC) {
            put_le(fh, 0xdeadbeefu, 4);
            put_le(fh + 8, 40, 4);
            (void)!write(fd, fh, sizeof fh);
        } else if (r->what == RAW_OVERSIZE) {
            put_le(fh + 8, 40, 4);
            put_le(fh + 16, 1ull << 40, 8); /* 1 TiB */
            (void)!write(fd, fh, sizeof fh);
        } else {
            put_le(fh + 8, 40, 4);
            put_le(fh + 16, 1000, 8);
            uint8_t part[24 + 40 + 100] = {0};
            memcpy(part, fh, 24);
            (void)!write(fd, part, sizeof part);
            shutdown(fd, SHUT_WR); /* the rest never comes */
        }
        break;
    case RAW_GARBAGE: {
        uint8_t junk[200];
        for (int i = 0; i < 200; i++) junk[i] = (uint8_t)(i * 37 + 11);
        (void)!write(fd, junk, sizeof junk);
        break;
    }
    case RAW_SILENT:
        break;
    case RAW_WRONG_SECRET: {
        uint8_t wrong[XPORT_SECRET_LEN];
        memcpy(wrong, g_secret, sizeof wrong);
        wrong[5] ^= 0x80;
        r->hs_ok = raw_handshake(fd, wrong, sizeof wrong, NULL);
        break;
    }
    case RAW_REPLAY: {
        /* record a good client's bytes, then play them on a new connection */
        r->hs_ok = raw_handshake(fd, g_secret, g_secret_len, r->rec);
        close(fd);
        fd = raw_connect(r);
        if (fd < 0) goto done;
        (void)!write(fd, r->rec, sizeof r->rec);
        break;
    }
    }
    r->closed_by_server = raw_wait_closed(fd);
    close(fd);
done:
    atomic_store(&r->done, 1);
    return NULL;
}

static bool g_raw_all_done;
static raw_t *g_raws;
static int g_nraws;
static bool cond_raws_done(parent_t *p)
{
    for (int i = 0; i < g_nraws; i++) if (!atomic_load(&g_raws[i].done)) return false;
    return true;
}

static void raw_run(parent_t *p, raw_t *raws, int n)
{
    pthread_t th[8];
    for (int i = 0; i < n; i++) {
        xport_sockaddr_parse(p->addr, &raws[i].ss, &raws[i].sl);
        pthread_create(&th[i], NULL, raw_thread, &raws[i]);
    }
    g_raws = raws;
    g_nraws = n;
    CHECK(parent_run(p, cond_raws_done, 20));
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    (void)g_raw_all_done;
}

static void good_peer_check(parent_t *p, sizes_ctx_t *s)
{
    static test_hdr_t h = {.tag = T_DATA, .seq = 1, .len = 4097};
    s->sent[1] = g_pattern;
    s->hash[1] = XXH3_64bits(g_pattern, 4097);
    struct iovec iov = {.iov_base = g_pattern, .iov_len = 4097};
    xport_ep_t *good = NULL;
    for (int i = 0; i < p->n_eps; i++) if (p->eps[i]) good = p->eps[i];
    REQUIRE(good);
    uint64_t before = s->replies;
    CHECK(xport_send(good, &h, sizeof h, &iov, 1, parent_send_done, p) == BT_IN_PROGRESS);
    g_sizes_want = before + 1;
    g_sends_want = p->sends_done + 1;
    CHECK(parent_run(p, cond_sizes, 20));
    CHECK(s->bad == 0);
}

static void test_tcp_bad_frames(void)
{
    parent_t p;
    REQUIRE(parent_setup(&p, XPORT_TCP));
    sizes_ctx_t s = {0};
    p.ctx = &s;
    p.on_recv = sizes_on_recv;
    parent_spawn(&p, "echo", 0, 0);
    REQUIRE(parent_run(&p, cond_one_peer, 30));
    raw_t raws[3] = {{.what = RAW_BAD_MAGIC}, {.what = RAW_OVERSIZE}, {.what = RAW_TRUNCATED}};
    raw_run(&p, raws, 3);
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(raws[i].hs_ok, "raw client %d did not pass the handshake", i);
        CHECK_MSG(raws[i].closed_by_server, "raw client %d was not disconnected", i);
    }
    CHECK_MSG(p.n_eps == 4, "accepted %d", p.n_eps);
    CHECK_MSG(p.errors_cb == 3, "%d error callbacks", p.errors_cb);
    CHECK_MSG(p.allocs == p.frees, "no payload may be allocated for a bad frame");
    good_peer_check(&p, &s);
    parent_finish(&p);
    check_kids_ok(&p);
}

static void test_tcp_bad_handshake_raw(void)
{
    parent_t p;
    REQUIRE(parent_setup(&p, XPORT_TCP));
    xport_destroy(p.x);
    /* short deadline so the silent peer is dropped quickly */
    xport_config_t cfg = base_cfg(p.loop, 1);
    cfg.handshake_ms = 300;
    cfg.cbs = (xport_cbs_t){.arg = &p, .accept = parent_on_accept, .alloc = parent_on_alloc,
                            .free = parent_on_free, .recv = parent_on_recv, .error = parent_on_error};
    REQUIRE(xport_create(&xport_tcp_ops, &cfg, &p.x) == BT_OK);
    REQUIRE(xport_listen(p.x, p.addr, sizeof p.addr) == BT_OK);
    sizes_ctx_t s = {0};
    p.ctx = &s;
    p.on_recv = sizes_on_recv;
    parent_spawn(&p, "echo", 0, 0);
    REQUIRE(parent_run(&p, cond_one_peer, 30));
    raw_t raws[4] = {{.what = RAW_GARBAGE}, {.what = RAW_SILENT}, {.what = RAW_REPLAY},
                     {.what = RAW_WRONG_SECRET}};
    uint64_t t0 = clock_now_ns();
    raw_run(&p, raws, 4);
    double ms = (double)(clock_now_ns() - t0) / 1e6;
    for (int i = 0; i < 4; i++) CHECK_MSG(raws[i].closed_by_server, "raw client %d was not dropped", i);
    CHECK_MSG(raws[2].hs_ok, "the recorded handshake itself should have passed");
    CHECK_MSG(!raws[3].hs_ok, "a wrong secret must not pass");
    CHECK_MSG(ms < 3000, "dropping took %.0f ms", ms);
    /* the good echo child + the recording connection of the replay case */
    CHECK_MSG(p.n_eps == 2, "accepted %d", p.n_eps);
    good_peer_check(&p, &s);
    parent_finish(&p);
    check_kids_ok(&p);
}

/* More unauthenticated connections than XPORT_HS_PENDING_MAX: the extra
 * ones are closed at once (no hello), the others got the server's hello. */
static bool g_true_after;
static void cap_tick(struct ev_loop *loop, ev_timer *w, int revents) { g_true_after = true; }
static bool cond_cap(parent_t *p) { return g_true_after; }

static void test_tcp_pending_handshake_cap(void)
{
    parent_t p;
    REQUIRE(parent_setup(&p, XPORT_TCP));
    enum { N = XPORT_HS_PENDING_MAX + 4 };
    static int fds[N];
    struct sockaddr_storage ss;
    socklen_t sl;
    REQUIRE(xport_sockaddr_parse(p.addr, &ss, &sl) == BT_OK);
    int opened = 0;
    for (int i = 0; i < N; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fds[i] < 0) break;
        if (connect(fds[i], (struct sockaddr *)&ss, sl) != 0 && errno != EINPROGRESS) break;
        opened++;
        if (i % 32 == 31) ev_run(p.loop, EVRUN_NOWAIT); /* let the listener accept */
    }
    REQUIRE(opened == N);
    ev_timer t;
    g_true_after = false;
    ev_timer_init(&t, cap_tick, 0.5, 0);
    ev_timer_start(p.loop, &t);
    parent_run(&p, cond_cap, 5);
    int hello = 0, refused = 0, other = 0;
    for (int i = 0; i < N; i++) {
        uint8_t b[XPORT_HS_HELLO_LEN];
        ssize_t r = recv(fds[i], b, sizeof b, MSG_DONTWAIT);
        if (r == (ssize_t)sizeof b) hello++;
        else if (r == 0 || (r < 0 && errno == ECONNRESET)) refused++;
        else other++;
        close(fds[i]);
    }
    CHECK_MSG(hello == XPORT_HS_PENDING_MAX && refused == 4 && other == 0,
              "%d got a hello, %d refused, %d neither", hello, refused, other);
    CHECK(p.n_eps == 0);
    xport_destroy(p.x);
    ev_loop_destroy(p.loop);
}

static void test_tcp_ipv6(void)
{
    parent_t p;
    REQUIRE(parent_setup(&p, XPORT_TCP));
    xport_destroy(p.x);
    xport_config_t cfg = base_cfg(p.loop, 1);
    cfg.listen_addr = "[::1]:0";
    cfg.cbs = (xport_cbs_t){.arg = &p, .accept = parent_on_accept, .alloc = parent_on_alloc,
                            .free = parent_on_free, .recv = parent_on_recv, .error = parent_on_error};
    REQUIRE(xport_create(&xport_tcp_ops, &cfg, &p.x) == BT_OK);
    bt_status_t st = xport_listen(p.x, p.addr, sizeof p.addr);
    if (st != BT_OK) { /* host without IPv6 loopback */
        CHECK_MSG(0, "cannot listen on [::1]");
        xport_destroy(p.x);
        ev_loop_destroy(p.loop);
        return;
    }
    CHECK(!strncmp(p.addr, "[::1]:", 6));
    stream_ctx_t s = {.want = 500, .max = 1000};
    p.ctx = &s;
    p.on_recv = stream_on_recv;
    parent_spawn(&p, "stream", s.want, s.max);
    CHECK(parent_run(&p, cond_stream_done, 30));
    CHECK(s.got == s.want && s.bad == 0);
    parent_finish(&p);
    check_kids_ok(&p);
}

#ifdef BT_HAVE_UCX
/* ---- ucx only: a raw UCP client that skips, garbles or forges the handshake */
#include <ucp/api/ucp.h>

/* transport/ucx.c's wire: AM ids 1 handshake, 2 data; a handshake header
 * starts with the receiver's (slot, tag) and the sender's, slot 0xffffffff
 * naming a new connection; a client's hello is hello | MAC, with its
 * worker address as AM data. */
static ucs_status_t raw_ucx_am(void *arg, const void *h, size_t hl, void *d, size_t l,
                               const ucp_am_recv_param_t *p)
{
    return UCS_OK; /* nothing should come back; UCX 1.13 crashes on an id with no handler */
}

static size_t raw_hex_decode(const char *hex, uint8_t *out, size_t cap)
{
    size_t n = 0;
    for (; hex[0] && hex[1] && n < cap; hex += 2) {
        unsigned v;
        if (sscanf(hex, "%2x", &v) != 1) break;
        out[n++] = (uint8_t)v;
    }
    return n;
}

/* child: sends one bad message to the server at addr, waits until UCX has
 * delivered it (send complete, then a second of progress) and exits 0;
 * the parent checks what it did with it. variant 0: a data frame with no
 * handshake; 1: a garbled hello; 2: an AM id we never registered; 3: a
 * well-formed hello whose MAC was made without the secret; 4: a hello with
 * a right MAC (the sender holds the secret) but an address that is none. */
static int raw_ucx_main(const char *addr, int variant)
{
    ucp_config_t *ucfg;
    ucp_context_h ctx;
    ucp_worker_h w;
    ucp_ep_h ep;
    if (ucp_config_read(NULL, NULL, &ucfg) != UCS_OK) return 2;
    /* as the server configures UCX (xport_ucx_net_select, xport_ucx_settings) */
    ucp_config_modify(ucfg, "TLS", "sm,self");
    ucp_config_modify(ucfg, "MM_ERROR_HANDLING", "y");
    ucp_params_t prm = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
    if (ucp_init(&prm, ucfg, &ctx) != UCS_OK) return 2;
    ucp_config_release(ucfg);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if (ucp_worker_create(ctx, &wp, &w) != UCS_OK) return 2;
    for (unsigned id = 1; id <= 3; id++) {
        ucp_am_handler_param_t hp = {
            .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB,
            .id = id, .cb = raw_ucx_am,
        };
        if (ucp_worker_set_am_recv_handler(w, &hp) != UCS_OK) return 2;
    }
    const char *hex = strchr(addr, '/');
    static uint8_t bin[XPORT_LISTEN_ADDR_MAX / 2];
    if (!hex || !raw_hex_decode(hex + 1, bin, sizeof bin)) return 2;
    ucp_ep_params_t ep_prm = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address = (const ucp_address_t *)bin,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
    };
    if (ucp_ep_create(w, &ep_prm, &ep) != UCS_OK) return 2;
    /* the hello of variants 3 and 4 */
    static uint8_t hdr[16 + XPORT_HS_HELLO_LEN + XPORT_HS_MAC_LEN], payload[64];
    static char own[XPORT_LISTEN_ADDR_MAX];
    const char *data = own;
    memset(hdr, 0xff, 8);  /* receiver: a new connection */
    memset(hdr + 8, 0, 8); /* sender: slot 0, tag 0 */
    uint8_t secret[XPORT_SECRET_MAX];
    size_t secret_len = 0;
    if (xport_secret_load(secret, sizeof secret, &secret_len) != BT_OK) return 2;
    if (variant == 3) {
        secret[0] ^= 1; /* somebody without the secret */
        ucp_address_t *a;
        size_t alen;
        if (ucp_worker_get_address(w, &a, &alen) != UCS_OK) return 2;
        int n = snprintf(own, sizeof own, "raw:%d/", (int)getpid());
        for (size_t i = 0; i < alen && (size_t)n + 3 < sizeof own; i++)
            n += snprintf(own + n, sizeof own - (size_t)n, "%02x", ((const uint8_t *)a)[i]);
        ucp_worker_release_address(w, a);
    } else {
        snprintf(own, sizeof own, "raw:%d/zz", (int)getpid());
    }
    xport_hs_t hs;
    if (xport_hs_init(&hs, false, JOB_ID, secret, secret_len, 99) != BT_OK) return 2;
    xport_hs_hello_write(&hs, hdr + 16);
    if (xport_hs_hello_mac_write(&hs, hdr + 16, own, strlen(own), hdr + 16 + XPORT_HS_HELLO_LEN) != BT_OK) return 2;
    xport_hs_clear(&hs);
    memset(payload, 0x77, sizeof payload);
    static uint8_t junk[64];
    memset(junk, 0x77, sizeof junk);
    ucp_request_param_t sp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_AM_SEND_FLAG_EAGER};
    ucs_status_ptr_t req;
    if (variant == 0) {
        req = ucp_am_send_nbx(ep, 2, junk, 40, payload, sizeof payload, &sp);
    } else if (variant == 1) {
        memcpy(junk, hdr, 16); /* a new connection, then 17 bytes of junk */
        req = ucp_am_send_nbx(ep, 1, junk, 16 + 17, payload, sizeof payload, &sp);
    } else if (variant == 2) {
        req = ucp_am_send_nbx(ep, 9, junk, 40, payload, sizeof payload, &sp);
    } else {
        req = ucp_am_send_nbx(ep, 1, hdr, sizeof hdr, data, strlen(data), &sp);
    }
    int rc = 0;
    if (UCS_PTR_IS_ERR(req)) rc = 3;
    uint64_t deadline = clock_now_ns() + (uint64_t)(5e9 * test_time_scale());
    if (req && !UCS_PTR_IS_ERR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS && clock_now_ns() < deadline)
            ucp_worker_progress(w);
        if (ucp_request_check_status(req) != UCS_OK) rc = 4;
        ucp_request_free(req);
    }
    deadline = clock_now_ns() + (uint64_t)(1e9 * test_time_scale());
    while (clock_now_ns() < deadline) {
        ucp_worker_progress(w);
        usleep(100);
    }
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
    ucs_status_ptr_t creq = ucp_ep_close_nbx(ep, &cp);
    if (creq && !UCS_PTR_IS_ERR(creq)) {
        while (ucp_request_check_status(creq) == UCS_INPROGRESS) ucp_worker_progress(w);
        ucp_request_free(creq);
    }
    ucp_worker_destroy(w);
    ucp_cleanup(ctx);
    return rc;
}

/* ucx: the peer closes in order while our sends are still in UCX's hands
 * (our queue to it is full). Their done() may fire only once UCX is done
 * with the buffers: done() here frees each buffer, and our UCX endpoint
 * keeps flushing after the peer's BYE (the ack must go out), so an early
 * done() was a heap use after free inside UCX (ucp_dt_pack). TSan caught it
 * in close_in_callback's echo child, by timing; here it is certain under
 * SAN=thread and SAN=address. Every done() must still come before the
 * error callback. The closer has a thread of its own, so it takes our
 * frames in while we wait. */
enum { OCP_FRAMES = 4096, OCP_BYTES = 4096 };
typedef struct {
    char            addr[XPORT_LISTEN_ADDR_MAX];
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int             stage;       /* under mu: 1 closer connected, 2 close now, 3 finish */
    int             conn_status; /* closer's: 1 connected, -1 failed (read after stage 1) */
    xport_ep_t     *ep;          /* ours, from accept */
    int             dones, ok, failed, bad_status, after_error, errors;
    bt_status_t     error;
} ocp_ctx_t;

static void ocp_stage_set(ocp_ctx_t *c, int stage)
{
    pthread_mutex_lock(&c->mu);
    c->stage = stage;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static int ocp_stage_get(ocp_ctx_t *c)
{
    pthread_mutex_lock(&c->mu);
    int st = c->stage;
    pthread_mutex_unlock(&c->mu);
    return st;
}

static void ocp_connected(void *arg, xport_ep_t *ep, bt_status_t st)
{
    ((ocp_ctx_t *)arg)->conn_status = st == BT_OK ? 1 : -1;
}
static void ocp_accept(void *arg, xport_ep_t *ep, uint32_t peer) { ((ocp_ctx_t *)arg)->ep = ep; }
static void ocp_closer_recv(void *arg, xport_ep_t *ep, xport_rx_t *rx) { xport_rx_release(rx); }

/* a frame's buffer starts with the context pointer */
static void ocp_send_done(void *arg, bt_status_t st)
{
    ocp_ctx_t *c;
    memcpy(&c, arg, sizeof c);
    c->dones++;
    if (c->errors) c->after_error++;
    if (st == BT_OK) c->ok++;
    else if (st == BT_ERR_PEER_CLOSED || st == BT_ERR_CANCELED) c->failed++;
    else c->bad_status++;
    free(arg);
}

static void ocp_error(void *arg, xport_ep_t *ep, bt_status_t st)
{
    ocp_ctx_t *c = arg;
    c->errors++;
    c->error = st;
}

static void *ocp_closer(void *arg)
{
    ocp_ctx_t *c = arg;
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    xport_config_t cfg = base_cfg(loop, 2);
    cfg.cbs = (xport_cbs_t){.arg = c, .connected = ocp_connected, .recv = ocp_closer_recv};
    xport_t *x = NULL;
    xport_ep_t *ep = NULL;
    uint64_t limit = (uint64_t)(20e9 * test_time_scale());
    if (xport_create(&xport_ucx_ops, &cfg, &x) != BT_OK || xport_connect(x, c->addr, &ep) != BT_IN_PROGRESS) {
        c->conn_status = -1;
    } else {
        uint64_t deadline = clock_now_ns() + limit;
        while (!c->conn_status && clock_now_ns() < deadline) ev_run(loop, EVRUN_NOWAIT);
        if (!c->conn_status) c->conn_status = -1;
    }
    ocp_stage_set(c, 1);
    if (c->conn_status == 1) {
        /* no step of our loop until the other side's queue to us is full */
        pthread_mutex_lock(&c->mu);
        while (c->stage < 2) pthread_cond_wait(&c->cv, &c->mu);
        pthread_mutex_unlock(&c->mu);
        xport_close(ep); /* BYE: the peer acks once it has our frames */
        uint64_t deadline = clock_now_ns() + limit;
        while (ocp_stage_get(c) < 3 && clock_now_ns() < deadline) ev_run(loop, EVRUN_NOWAIT);
    }
    if (x) xport_destroy(x);
    ev_loop_destroy(loop);
    return NULL;
}

static void test_ucx_orderly_close_pending_sends(void)
{
    secret_setup();
    ocp_ctx_t c = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    xport_config_t cfg = base_cfg(loop, 1);
    cfg.cbs = (xport_cbs_t){.arg = &c, .accept = ocp_accept, .error = ocp_error};
    xport_t *x = NULL;
    REQUIRE(xport_create(&xport_ucx_ops, &cfg, &x) == BT_OK);
    REQUIRE(xport_listen(x, c.addr, sizeof c.addr) == BT_OK);
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, ocp_closer, &c) == 0);
    uint64_t deadline = clock_now_ns() + (uint64_t)(20e9 * test_time_scale());
    while ((!c.ep || ocp_stage_get(&c) < 1) && clock_now_ns() < deadline) ev_run(loop, EVRUN_NOWAIT);
    bool up = c.ep && ocp_stage_get(&c) >= 1 && c.conn_status == 1;
    CHECK(up);
    if (up) {
        static test_hdr_t h = {.tag = T_DATA, .len = OCP_BYTES};
        int posted = 0;
        for (int i = 0; i < OCP_FRAMES; i++) {
            uint8_t *buf = malloc(OCP_BYTES);
            if (!buf) break;
            ocp_ctx_t *cp = &c;
            memset(buf, i & 0xff, OCP_BYTES);
            memcpy(buf, &cp, sizeof cp);
            struct iovec iov = {.iov_base = buf, .iov_len = OCP_BYTES};
            if (xport_send(c.ep, &h, sizeof h, &iov, 1, ocp_send_done, buf) != BT_IN_PROGRESS) {
                free(buf);
                break;
            }
            posted++;
        }
        CHECK(posted == OCP_FRAMES);
        /* the closer has not taken a frame: most wait in UCX's hands */
        CHECK_MSG(posted - c.dones > 0, "%d of %d sends already done", c.dones, posted);
        ocp_stage_set(&c, 2);
        deadline = clock_now_ns() + (uint64_t)(20e9 * test_time_scale());
        while (!c.errors && clock_now_ns() < deadline) ev_run(loop, EVRUN_NOWAIT);
        CHECK(c.errors == 1 && c.error == BT_ERR_PEER_CLOSED);
        CHECK_MSG(c.dones == posted && c.after_error == 0, "%d of %d done, %d after the error callback",
                  c.dones, posted, c.after_error);
        CHECK_MSG(c.bad_status == 0 && c.ok + c.failed == posted, "%d ok, %d failed, %d other", c.ok,
                  c.failed, c.bad_status);
    }
    ocp_stage_set(&c, 3);
    pthread_join(th, NULL);
    xport_destroy(x);
    ev_loop_destroy(loop);
}

static void test_ucx_raw_bad_peers(void)
{
    parent_t p;
    REQUIRE(parent_setup(&p, XPORT_UCX));
    sizes_ctx_t s = {0};
    p.ctx = &s;
    p.on_recv = sizes_on_recv;
    parent_spawn(&p, "echo", 0, 0);
    REQUIRE(parent_run(&p, cond_one_peer, 30));
    test_capture_t cap;
    test_capture_begin(&cap);
    child_proc_t *raw[5];
    for (int v = 0; v < 5; v++) raw[v] = parent_spawn(&p, "ucxraw", 0, (uint64_t)v);
    uint64_t deadline = clock_now_ns() + (uint64_t)(20e9 * test_time_scale());
    bool all = false;
    while (clock_now_ns() < deadline && !all) {
        ev_run(p.loop, EVRUN_NOWAIT), usleep(1000);
        all = true;
        for (int v = 0; v < 5; v++) all &= child_poll(raw[v]);
    }
    /* every message was in our worker before its sender exited: a few
     * more passes take them in */
    for (int i = 0; i < 10; i++) ev_run(p.loop, EVRUN_NOWAIT);
    char *log = test_capture_end(&cap);
    static const char *const what[5] = {"frame before a handshake", "garbled hello", "unknown AM id",
                                        "hello without the secret", "hello with a bad address"};
    for (int v = 0; v < 5; v++)
        CHECK_MSG(raw[v]->exited && raw[v]->status == 0, "%s: client status %d", what[v], raw[v]->status);
    CHECK_MSG(strstr(log, "unknown connection"), "the frame before a handshake was not dropped: %s", log);
    CHECK_MSG(strstr(log, "dropping a malformed hello"), "the garbled hello was not dropped: %s", log);
    CHECK_MSG(strstr(log, "hello MAC mismatch"), "the forged hello was not refused: %s", log);
    CHECK_MSG(strstr(log, "address: byte 0x7a"), "the bad address was not refused: %s", log);
    free(log);
    CHECK_MSG(p.n_eps == 1, "accepted %d", p.n_eps);
    CHECK_MSG(p.allocs == 0, "a payload of an unauthenticated peer reached cbs.alloc");
    good_peer_check(&p, &s);
    parent_finish(&p);
    check_kids_ok(&p);
}
#endif

/* ---- handshake unit checks --------------------------------------------- */

static void test_handshake_messages(void)
{
    uint8_t k1[32], k2[32];
    for (int i = 0; i < 32; i++) k1[i] = k2[i] = (uint8_t)i;
    k2[31] ^= 1;
    xport_hs_t c, s, s2;
    REQUIRE(xport_hs_init(&c, false, "job", k1, 32, 3) == BT_OK);
    REQUIRE(xport_hs_init(&s, true, "job", k1, 32, 0) == BT_OK);
    CHECK(memcmp(c.nonce, s.nonce, XPORT_HS_NONCE_LEN) != 0);
    uint8_t hc[XPORT_HS_HELLO_LEN], hsv[XPORT_HS_HELLO_LEN], pc[XPORT_HS_PROOF_LEN], ps[XPORT_HS_PROOF_LEN];
    char why[128];
    xport_hs_hello_write(&c, hc);
    xport_hs_hello_write(&s, hsv);
    CHECK(xport_hs_hello_read(&s, hc, why, sizeof why) == BT_OK);
    CHECK(xport_hs_hello_read(&c, hsv, why, sizeof why) == BT_OK);
    CHECK(s.peer_id == 3 && c.peer_id == 0);
    xport_hs_proof_write(&c, pc);
    xport_hs_proof_write(&s, ps);
    CHECK(xport_hs_proof_check(&s, pc, why, sizeof why) == BT_OK);
    CHECK(xport_hs_proof_check(&c, ps, why, sizeof why) == BT_OK);
    /* reflection: the client's own proof sent back must fail */
    CHECK(xport_hs_proof_check(&c, pc, why, sizeof why) == BT_ERR_PEER_AUTH);
    /* a client proof replayed to a new server session (fresh nonce) fails */
    REQUIRE(xport_hs_init(&s2, true, "job", k1, 32, 0) == BT_OK);
    CHECK(xport_hs_hello_read(&s2, hc, why, sizeof why) == BT_OK);
    CHECK(xport_hs_proof_check(&s2, pc, why, sizeof why) == BT_ERR_PEER_AUTH);
    /* a server with another secret rejects the proof */
    REQUIRE(xport_hs_init(&s2, true, "job", k2, 32, 0) == BT_OK);
    CHECK(xport_hs_hello_read(&s2, hc, why, sizeof why) == BT_OK);
    CHECK(xport_hs_proof_check(&s2, pc, why, sizeof why) == BT_ERR_PEER_AUTH);
    /* job id, role, magic, version */
    REQUIRE(xport_hs_init(&s2, true, "other", k1, 32, 0) == BT_OK);
    CHECK(xport_hs_hello_read(&s2, hc, why, sizeof why) == BT_ERR_PEER_AUTH);
    CHECK(strstr(why, "job id") != NULL);
    REQUIRE(xport_hs_init(&s2, true, "job", k1, 32, 0) == BT_OK);
    CHECK(xport_hs_hello_read(&s2, hsv, why, sizeof why) == BT_ERR_PEER_AUTH); /* server hello to a server */
    uint8_t bad[XPORT_HS_HELLO_LEN];
    memcpy(bad, hc, sizeof bad);
    bad[0] ^= 1;
    CHECK(xport_hs_hello_read(&s2, bad, why, sizeof why) == BT_ERR_PEER_PROTO);
    memcpy(bad, hc, sizeof bad);
    bad[4] = 9;
    CHECK(xport_hs_hello_read(&s2, bad, why, sizeof why) == BT_ERR_PEER_PROTO);
    /* proof by an independent HMAC: flip every byte position once */
    for (int i = 4; i < XPORT_HS_PROOF_LEN; i++) {
        uint8_t t[XPORT_HS_PROOF_LEN];
        memcpy(t, pc, sizeof t);
        t[i] ^= 0x40;
        CHECK(xport_hs_proof_check(&s, t, why, sizeof why) == BT_ERR_PEER_AUTH);
    }
    /* the hello MAC (ucx: the client's address rides with its hello) is
     * HMAC-SHA256(secret, "A" | hello | data) */
    static const char addr[] = "host:42/00ff";
    uint8_t mac[XPORT_HS_MAC_LEN], want[XPORT_HS_MAC_LEN], msg[1 + XPORT_HS_HELLO_LEN + sizeof addr - 1];
    unsigned want_len = sizeof want;
    REQUIRE(xport_hs_hello_mac_write(&c, hc, addr, sizeof addr - 1, mac) == BT_OK);
    msg[0] = 'A';
    memcpy(msg + 1, hc, XPORT_HS_HELLO_LEN);
    memcpy(msg + 1 + XPORT_HS_HELLO_LEN, addr, sizeof addr - 1);
    REQUIRE(HMAC(EVP_sha256(), k1, 32, msg, sizeof msg, want, &want_len));
    CHECK(!memcmp(mac, want, sizeof mac));
    REQUIRE(xport_hs_init(&s2, true, "job", k1, 32, 0) == BT_OK);
    CHECK(xport_hs_hello_mac_check(&s2, hc, addr, sizeof addr - 1, mac, why, sizeof why) == BT_OK);
    char other[] = "host:42/00fe"; /* another address under the same MAC */
    CHECK(xport_hs_hello_mac_check(&s2, hc, other, sizeof other - 1, mac, why, sizeof why) == BT_ERR_PEER_AUTH);
    CHECK(strstr(why, "hello MAC mismatch") != NULL);
    memcpy(bad, hc, sizeof bad);
    bad[80] ^= 1; /* another nonce */
    CHECK(xport_hs_hello_mac_check(&s2, bad, addr, sizeof addr - 1, mac, why, sizeof why) == BT_ERR_PEER_AUTH);
    REQUIRE(xport_hs_init(&s2, true, "job", k2, 32, 0) == BT_OK); /* another secret */
    CHECK(xport_hs_hello_mac_check(&s2, hc, addr, sizeof addr - 1, mac, why, sizeof why) == BT_ERR_PEER_AUTH);
    /* never a proof: the domains differ */
    CHECK(memcmp(mac, pc + 4, XPORT_HS_MAC_LEN) != 0);
}

/* ---- which UCX transports and devices a listen host allows ------------- */

static void mkdirs(const char *root, const char *rel)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    for (char *q = p + strlen(root) + 1; *q; q++)
        if (*q == '/') {
            *q = '\0';
            mkdir(p, 0700);
            *q = '/';
        }
    mkdir(p, 0700);
}

static void test_ucx_net_select(void)
{
    char tls[32], devs[256];
    static const char *const loopback[] = {NULL, "127.0.0.1:0", "127.3.4.5:77", "localhost:0", "[::1]:9"};
    for (size_t i = 0; i < sizeof loopback / sizeof loopback[0]; i++) {
        CHECK(xport_ucx_net_select(loopback[i], NULL, tls, sizeof tls, devs, sizeof devs) == BT_OK);
        CHECK_MSG(!strcmp(tls, "sm,self") && !strcmp(devs, "lo"), "%s: tls '%s' devs '%s'",
                  loopback[i] ? loopback[i] : "(null)", tls, devs);
    }
    CHECK(xport_ucx_net_select("0.0.0.0:0", NULL, tls, sizeof tls, devs, sizeof devs) == BT_OK);
    CHECK(!strcmp(tls, "^tcp") && !devs[0]); /* every device, never UCX's tcp */
    CHECK(xport_ucx_net_select("198.51.100.7:0", NULL, tls, sizeof tls, devs, sizeof devs) == BT_ERR_INVALID);
    CHECK(xport_ucx_net_select("no-host", NULL, tls, sizeof tls, devs, sizeof devs) == BT_ERR_INVALID);
    /* an RDMA device behind an interface (a fake /sys): its ports, in order */
    char root[64];
    snprintf(root, sizeof root, "/tmp/baton-sys-%d", (int)getpid());
    REQUIRE(mkdir(root, 0700) == 0);
    mkdirs(root, "class/infiniband/mlx5_1/device/net/ib0");
    mkdirs(root, "class/infiniband/mlx5_1/ports/2");
    mkdirs(root, "class/infiniband/mlx5_1/ports/1");
    mkdirs(root, "class/infiniband/mlx5_0/device/net/eth3");
    mkdirs(root, "class/infiniband/mlx5_0/ports/1");
    mkdirs(root, "class/infiniband/mlx5_2/device/net/ib0");
    mkdirs(root, "class/infiniband/mlx5_2/ports/1");
    char out[256] = "ib0";
    CHECK(xport_ucx_rdma_ports("ib0", root, out, sizeof out) == BT_OK);
    CHECK_MSG(!strcmp(out, "ib0,mlx5_1:1,mlx5_1:2,mlx5_2:1"), "ib0: %s", out);
    out[0] = '\0';
    CHECK(xport_ucx_rdma_ports("eth3", root, out, sizeof out) == BT_OK);
    CHECK_MSG(!strcmp(out, "mlx5_0:1"), "eth3: %s", out);
    out[0] = '\0';
    CHECK(xport_ucx_rdma_ports("eth9", root, out, sizeof out) == BT_OK && !out[0]);
    char small[8] = "";
    CHECK(xport_ucx_rdma_ports("ib0", root, small, sizeof small) == BT_ERR_INVALID);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    CHECK(system(cmd) == 0);
    /* an address of this host's own (not loopback): its interface, and
     * nothing from an RDMA-free /sys */
    struct ifaddrs *ifs;
    REQUIRE(getifaddrs(&ifs) == 0);
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        struct sockaddr_in *in = (struct sockaddr_in *)i->ifa_addr;
        if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) continue;
        char host[INET_ADDRSTRLEN + 8];
        inet_ntop(AF_INET, &in->sin_addr, host, INET_ADDRSTRLEN);
        strcat(host, ":0");
        CHECK(xport_ucx_net_select(host, "/nonexistent", tls, sizeof tls, devs, sizeof devs) == BT_OK);
        CHECK_MSG(!strcmp(tls, "^tcp") && !strcmp(devs, i->ifa_name), "%s: tls '%s' devs '%s' (%s)", host, tls, devs,
                  i->ifa_name);
        break;
    }
    freeifaddrs(ifs);
}

static void test_secret_file(void)
{
    char path[128];
    snprintf(path, sizeof path, "/tmp/baton-secret-test-%d", (int)getpid());
    unlink(path);
    uint8_t a[XPORT_SECRET_LEN], b[XPORT_SECRET_MAX];
    size_t n = 0;
    REQUIRE(xport_secret_create(path, a) == BT_OK);
    CHECK(xport_secret_create(path, a) == BT_ERR_IO); /* never overwrites */
    struct stat sb;
    REQUIRE(stat(path, &sb) == 0);
    CHECK((sb.st_mode & 0777) == 0600);
    char *old = getenv("BATON_SECRET_FILE") ? strdup(getenv("BATON_SECRET_FILE")) : NULL;
    setenv("BATON_SECRET_FILE", path, 1);
    CHECK(xport_secret_load(b, sizeof b, &n) == BT_OK);
    CHECK(n == XPORT_SECRET_LEN && !memcmp(a, b, n));
    chmod(path, 0644);
    CHECK(xport_secret_load(b, sizeof b, &n) == BT_ERR_INVALID); /* readable by others */
    unsetenv("BATON_SECRET_FILE");
    CHECK(xport_secret_load(b, sizeof b, &n) == BT_ERR_NOT_FOUND);
    if (old) {
        setenv("BATON_SECRET_FILE", old, 1);
        free(old);
    }
    unlink(path);
}

static void test_kind_table(void)
{
    xport_kind_t k;
    bool a;
    CHECK(xport_kind_parse("tcp", &k, &a) == BT_OK && k == XPORT_TCP && !a);
    CHECK(xport_kind_parse("inproc", &k, &a) == BT_OK && k == XPORT_INPROC && !a);
    CHECK(xport_kind_parse("ucx", &k, &a) == BT_OK && k == XPORT_UCX && !a);
    CHECK(xport_kind_parse("auto", &k, &a) == BT_OK && a);
    CHECK(xport_kind_parse("verbs", &k, &a) == BT_ERR_INVALID);
    CHECK(!strcmp(xport_kind_name(XPORT_TCP), "tcp"));
    CHECK(xport_ops_get(XPORT_TCP) == &xport_tcp_ops);
    CHECK(xport_ops_get(XPORT_KIND_COUNT) == NULL);
#ifdef BT_HAVE_UCX
    CHECK(xport_ops_get(XPORT_UCX) == &xport_ucx_ops);
#else
    CHECK(xport_ops_get(XPORT_UCX) == NULL);
#endif
}

/* ---- the table: every case on every transport -------------------------- */

#define XPORT_CASES(X, kind) \
    X(order, kind) X(sizes, kind) X(bidir, kind) X(peers64, kind) X(kill_recv, kind) \
    X(bad_handshake, kind) X(close_in_callback, kind) X(unreachable, kind) \
    X(self_connect, kind) X(frame_limit, kind)

#define DEFINE_CASE(name, kind) \
    static void test_##name##_##kind(void) { case_##name(XPORT_##kind##_KIND); }
#define XPORT_inproc_KIND XPORT_INPROC
#define XPORT_tcp_KIND    XPORT_TCP
#define XPORT_ucx_KIND    XPORT_UCX
XPORT_CASES(DEFINE_CASE, inproc)
XPORT_CASES(DEFINE_CASE, tcp)
static void test_kill_send_tcp(void) { case_kill_send(XPORT_TCP); }
static void test_send_exit_tcp(void) { case_send_then(XPORT_TCP, "sendexit"); }
static void test_send_close_tcp(void) { case_send_then(XPORT_TCP, "sendclose"); }
static void test_kill_send_inproc(void) { case_kill_send_inproc(); }
#ifdef BT_HAVE_UCX
XPORT_CASES(DEFINE_CASE, ucx)
static void test_kill_send_ucx(void) { case_kill_send(XPORT_UCX); }
static void test_send_exit_ucx(void) { case_send_then(XPORT_UCX, "sendexit"); }
static void test_send_close_ucx(void) { case_send_then(XPORT_UCX, "sendclose"); }
#endif

#define NAME_CASE(name, kind) test_##name##_##kind,
#ifdef BT_HAVE_UCX
#define UCX_TESTS XPORT_CASES(NAME_CASE, ucx) test_kill_send_ucx, test_send_exit_ucx, test_send_close_ucx, \
                  test_ucx_raw_bad_peers, test_ucx_orderly_close_pending_sends,
#else
#define UCX_TESTS
#endif
#define ALL_TESTS \
    test_kind_table, test_handshake_messages, test_secret_file, test_ucx_net_select, \
    XPORT_CASES(NAME_CASE, inproc) test_kill_send_inproc, test_inproc_close_takes_back, \
    test_inproc_take_back_while_peer_polls, \
    XPORT_CASES(NAME_CASE, tcp) test_kill_send_tcp, test_send_exit_tcp, test_send_close_tcp, test_tcp_bad_frames, test_tcp_bad_handshake_raw, \
    test_tcp_ipv6, test_tcp_pending_handshake_cap, \
    UCX_TESTS
#define TEST_RUN_EXPANDED(...) TEST_RUN(__VA_ARGS__)

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--xport-child")) {
        log_set_tag("child");
        return child_main(argc - 2, argv + 2);
    }
    signal(SIGPIPE, SIG_IGN);
    int rc;
    rc = 0;
    (void)rc;
    TEST_RUN_EXPANDED(argc, argv, ALL_TESTS);
}
