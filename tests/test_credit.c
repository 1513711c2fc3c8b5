/* Credit-based flow control: the per-edge state machine, and a producer 100x
 * faster than its consumer for 10 s over tcp between two real processes,
 * with resident memory measured from /proc/self/statm on both sides. */
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "actors/actor.h"
#include "actors/credit.h"
#include "actors/router.h"
#include "actors/worker.h"
#include "base/clock.h"
#include "base/log.h"
#include "tests/test.h"

#ifdef __SANITIZE_ADDRESS__
/* ASan's quarantine keeps freed memory resident on purpose; keep it small so
 * that resident memory means what it means without ASan. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "quarantine_size_mb=4:thread_local_quarantine_size_kb=64"; }
#define RSS_SLACK_MB 48.0
#else
#define RSS_SLACK_MB 16.0
#endif

/* ---- the state machine --------------------------------------------------- */

static void test_credit_tx_holds_and_releases_in_order(void)
{
    actor_credit_tx_t tx;
    actor_credit_tx_init(&tx, true);
    actor_t a1 = {.addr = 1}, a2 = {.addr = 2};
    actor_msg_t *m[5];
    for (int i = 0; i < 5; i++) {
        m[i] = actor_msg_new(MSG_PING);
        m[i]->body.ping.id = (uint64_t)i;
    }
    /* no credit yet: everything is held, a1 and a2 noted once each */
    CHECK(!actor_credit_tx_take(&tx, &a1, m[0]));
    CHECK(!actor_credit_tx_take(&tx, &a1, m[1]));
    CHECK(!actor_credit_tx_take(&tx, &a2, m[2]));
    CHECK(tx.npending == 3 && tx.nwaiters == 2);
    actor_t **w;
    uint32_t nw;
    /* 2 credits release the first two, in order; waiters stay (one still held) */
    actor_msg_t *out = actor_credit_tx_grant(&tx, 2, &w, &nw);
    REQUIRE(out == m[0] && (actor_msg_t *)out->item.next == m[1] && m[1]->item.next == NULL);
    CHECK(nw == 0 && w == NULL && tx.avail == 0 && tx.npending == 1);
    /* a new message cannot overtake the held one even once credit exists */
    out = actor_credit_tx_grant(&tx, 3, &w, &nw);
    REQUIRE(out == m[2]);
    CHECK(nw == 2 && w[0] == &a1 && w[1] == &a2);
    free(w);
    CHECK(tx.avail == 2);
    CHECK(actor_credit_tx_take(&tx, &a1, m[3]));
    CHECK(actor_credit_tx_take(&tx, &a1, m[4]));
    CHECK(tx.avail == 0);
    CHECK(tx.held_total == 3);
    for (int i = 0; i < 5; i++) actor_msg_free(m[i]);
    actor_credit_tx_fini(&tx);

    /* disabled: never holds */
    actor_credit_tx_init(&tx, false);
    actor_msg_t *x = actor_msg_new(MSG_PING);
    CHECK(actor_credit_tx_take(&tx, &a1, x));
    actor_msg_free(x);
    actor_credit_tx_fini(&tx);
}

static void test_credit_rx_batches(void)
{
    actor_credit_rx_t rx;
    actor_credit_rx_init(&rx, 16);
    uint32_t returned = 0, calls = 0;
    for (int i = 0; i < 100; i++) {
        uint32_t n = actor_credit_rx_release(&rx);
        if (n) {
            CHECK(n == 4);
            calls++;
        }
        returned += n;
        /* never more than a batch minus one withheld */
        CHECK((uint32_t)(i + 1) - returned < 4);
    }
    CHECK(returned == 100 && calls == 25);
    actor_credit_rx_init(&rx, 1);
    CHECK(actor_credit_rx_release(&rx) == 1);
    actor_credit_rx_init(&rx, 0);
    CHECK(actor_credit_rx_release(&rx) == 0);
}

/* ---- producer 100x faster than its consumer, two processes over tcp ------- */

#define MSG_BYTES      (16 * 1024)
#define CONSUME_US     10000 /* consumer: 100 messages/s */
#define PRODUCE_PER_MS 10    /* producer: 10000 messages/s when not held */

static double rss_mb(void)
{
    FILE *f = fopen("/proc/self/statm", "re");
    if (!f) return -1;
    long size = 0, resident = 0;
    if (fscanf(f, "%ld %ld", &size, &resident) != 2) resident = -1;
    fclose(f);
    return (double)resident * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

typedef struct {
    double   base_mb, max_mb;
    uint32_t max_backlog;   /* messages received and not yet consumed */
    uint64_t consumed;
} consumer_report_t;

typedef struct {
    actor_t           base;
    actor_worker_t   *w;
    actor_timer_t     sample;
    uint32_t          backlog;
    consumer_report_t rep;
} consumer_t;

static bt_status_t consume_job(void *arg)
{
    actor_msg_t *m = arg;
    const uint8_t *p = m->tensors[0].data;
    volatile unsigned sum = 0;
    for (size_t i = 0; i < MSG_BYTES; i += 512) sum += p[i];
    usleep(CONSUME_US);
    return BT_OK;
}

static void consumer_sample(actor_t *self, actor_timer_t *t)
{
    consumer_t *c = (consumer_t *)self;
    (void)t;
    double r = rss_mb();
    if (r > c->rep.max_mb) c->rep.max_mb = r;
}

static void consumer_start(actor_t *self)
{
    consumer_t *c = (consumer_t *)self;
    c->rep.base_mb = c->rep.max_mb = rss_mb();
    actor_timer_start(self, &c->sample, 0.02, 0.02, consumer_sample);
}

static void consumer_release(void *arg) { actor_msg_free(arg); }

static actor_ret_t consumer_on_act(actor_t *self, actor_msg_t *m)
{
    consumer_t *c = (consumer_t *)self;
    if (++c->backlog > c->rep.max_backlog) c->rep.max_backlog = c->backlog;
    /* kept until the worker is done with it: that is when its credit returns */
    if (actor_worker_submit(c->w, self, consume_job, m, consumer_release, 0) != BT_OK) {
        c->backlog--;
        return ACTOR_DONE;
    }
    return ACTOR_KEPT;
}

static actor_ret_t consumer_on_done(actor_t *self, actor_msg_t *m)
{
    consumer_t *c = (consumer_t *)self;
    actor_msg_free(m->sys.work.arg);
    c->backlog--;
    c->rep.consumed++;
    return ACTOR_DONE;
}

static actor_ret_t consumer_on_report(actor_t *self, actor_msg_t *m)
{
    (void)m;
    actor_router_stop_request(self->rt, BT_OK); /* the producer went away */
    return ACTOR_DONE;
}

static const actor_class_t consumer_class = {
    .name = "consumer",
    .start = consumer_start,
    .handlers = {[MSG_ACTIVATION] = consumer_on_act, [ACTOR_SYS_WORK_DONE] = consumer_on_done,
                 [MSG_ERROR_REPORT] = consumer_on_report},
};

static void child_consumer(int fd_card, int fd_rep, uint32_t credits)
{
    log_set_tag("consumer");
    actor_router_config_t cfg = {.rank = 1, .job_id = "test-credit", .credits = credits};
    actor_router_t *rt;
    if (actor_router_create(&cfg, &rt) != BT_OK) _exit(3);
    actor_loop_t *l;
    consumer_t c = {0};
    if (actor_router_loop_new(rt, "consumer", &l) != BT_OK) _exit(3);
    if (actor_router_worker_new(rt, "dev", &c.w) != BT_OK) _exit(3);
    if (actor_register(rt, &c.base, &consumer_class, l, "consumer", 1) != BT_OK) _exit(4);
    actor_router_supervisor_set(rt, c.base.addr);
    char card[ACTOR_CARD_MAX];
    if (actor_router_listen(rt, 1u << XPORT_TCP, card, sizeof card) != BT_OK) _exit(5);
    if (write(fd_card, card, strlen(card) + 1) < 0) _exit(6);
    close(fd_card);
    actor_router_wait(rt, 60000);
    /* the consumer's loop (its rss sampling timer) runs until destroy joins it */
    actor_router_destroy(rt);
    consumer_report_t rep = c.rep;
    if (write(fd_rep, &rep, sizeof rep) != (ssize_t)sizeof rep) _exit(6);
    _exit(0);
}

typedef struct {
    actor_t       base;
    actor_timer_t tick, sample;
    bool          held;
    uint64_t      sent, held_events, ticks_skipped;
    double        base_mb, max_mb;
    uint8_t       block[MSG_BYTES];
} producer_t;

static void producer_sample(actor_t *self, actor_timer_t *t)
{
    producer_t *p = (producer_t *)self;
    (void)t;
    double r = rss_mb();
    if (r > p->max_mb) p->max_mb = r;
}

static void producer_tick(actor_t *self, actor_timer_t *t)
{
    producer_t *p = (producer_t *)self;
    (void)t;
    if (p->held) {
        p->ticks_skipped++;
        return;
    }
    for (int i = 0; i < PRODUCE_PER_MS && !p->held; i++) {
        actor_msg_t *m = actor_msg_new(MSG_ACTIVATION);
        int64_t shape[1] = {MSG_BYTES};
        tensor_t *x = actor_msg_tensor_new(m, "x", DT_U8, 1, shape);
        memcpy(x->data, p->block, MSG_BYTES);
        m->env.step = (int64_t)p->sent;
        bt_status_t st = actor_send(self, ACTOR_ADDR(1, 1), m);
        if (st == BT_ERR_BUSY) {
            p->held = true; /* accepted, but wait for CREDIT_READY before the next */
            p->held_events++;
        } else if (st != BT_OK) {
            return;
        }
        p->sent++;
    }
}

static actor_ret_t producer_on_credit(actor_t *self, actor_msg_t *m)
{
    (void)m;
    ((producer_t *)self)->held = false;
    return ACTOR_DONE;
}

static void producer_start(actor_t *self)
{
    producer_t *p = (producer_t *)self;
    p->base_mb = p->max_mb = rss_mb();
    actor_timer_start(self, &p->tick, 0.001, 0.001, producer_tick);
    actor_timer_start(self, &p->sample, 0.02, 0.02, producer_sample);
}

static const actor_class_t producer_class = {
    .name = "producer", .start = producer_start, .handlers = {[ACTOR_SYS_CREDIT_READY] = producer_on_credit}};

typedef struct {
    consumer_report_t cons;
    double            prod_base_mb, prod_max_mb;
    uint64_t          sent, held_events;
    uint32_t          max_pending;
    bool              ok;
} flow_result_t;

static void flow_run(uint32_t credits, double seconds, flow_result_t *res)
{
    memset(res, 0, sizeof *res);
    int pc[2], pr[2];
    if (pipe2(pc, O_CLOEXEC) || pipe2(pr, O_CLOEXEC)) return;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(pc[0]);
        close(pr[0]);
        child_consumer(pc[1], pr[1], credits);
    }
    close(pc[1]);
    close(pr[1]);
    char card[ACTOR_CARD_MAX] = {0};
    ssize_t n = read(pc[0], card, sizeof card - 1);
    close(pc[0]);
    if (n <= 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(pr[0]);
        return;
    }
    actor_router_config_t cfg = {.rank = 0, .job_id = "test-credit", .credits = credits};
    actor_router_t *rt;
    if (actor_router_create(&cfg, &rt) != BT_OK) return;
    producer_t *p = calloc(1, sizeof *p);
    for (int i = 0; i < MSG_BYTES; i++) p->block[i] = (uint8_t)(i * 31);
    if (actor_router_connect_str(rt, 1, card, "tcp") == BT_OK && actor_router_wait_peer(rt, 1, 5000) == BT_OK &&
        actor_register(rt, &p->base, &producer_class, actor_router_io_loop(rt), "producer", 1) == BT_OK) {
        uint64_t end = clock_now_ns() + (uint64_t)(seconds * 1e9);
        while (clock_now_ns() < end) {
            actor_edge_stats_t es;
            if (actor_router_edge_stats(rt, 1, &es) == BT_OK && es.pending > res->max_pending)
                res->max_pending = es.pending;
            usleep(20000);
        }
        res->ok = true;
    }
    actor_router_destroy(rt);
    res->sent = p->sent;
    res->held_events = p->held_events;
    res->prod_base_mb = p->base_mb;
    res->prod_max_mb = p->max_mb;
    free(p);
    if (read(pr[0], &res->cons, sizeof res->cons) != (ssize_t)sizeof res->cons) res->ok = false;
    close(pr[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) res->ok = false;
}

static void flow_print(const char *what, uint32_t credits, const flow_result_t *r)
{
    printf("%s credits=%u: sent %llu consumed %llu held %llu; consumer rss %.1f -> max %.1f MiB, "
           "backlog max %u; producer rss %.1f -> max %.1f MiB, pending max %u\n",
           what, credits, (unsigned long long)r->sent, (unsigned long long)r->cons.consumed,
           (unsigned long long)r->held_events, r->cons.base_mb, r->cons.max_mb, r->cons.max_backlog,
           r->prod_base_mb, r->prod_max_mb, r->max_pending);
}

#define BOUND_CREDITS 16

/* The bound both processes must stay under: every granted buffer in flight
 * twice (receive buffer + the sender's copy) plus slack for the runtime. */
static double flow_bound_mb(uint32_t credits)
{
    return 2.0 * credits * MSG_BYTES / (1024.0 * 1024.0) + RSS_SLACK_MB;
}

static void test_credit_bounds_memory_tcp_10s(void)
{
    flow_result_t r;
    flow_run(BOUND_CREDITS, 10.0, &r);
    flow_print("bounded", BOUND_CREDITS, &r);
    REQUIRE(r.ok);
    double bound = flow_bound_mb(BOUND_CREDITS);
    CHECK_MSG(r.cons.max_mb - r.cons.base_mb < bound, "consumer grew %.1f MiB (bound %.1f)",
              r.cons.max_mb - r.cons.base_mb, bound);
    CHECK_MSG(r.prod_max_mb - r.prod_base_mb < bound, "producer grew %.1f MiB (bound %.1f)",
              r.prod_max_mb - r.prod_base_mb, bound);
    CHECK(r.cons.max_backlog <= BOUND_CREDITS);
    CHECK(r.max_pending <= 1);   /* the producer stops at its first held message */
    CHECK(r.held_events > 10);   /* it really was held back, repeatedly */
    /* the consumer ran at its own pace the whole time (100/s, minus overheads) */
    CHECK_MSG(r.cons.consumed >= 300 && r.cons.consumed <= 1100, "consumed %llu",
              (unsigned long long)r.cons.consumed);
}

static void test_credit_huge_window_grows(void)
{
    /* Same producer and consumer, with a window so large it never binds:
     * the backlog and the consumer's memory grow with time. */
    flow_result_t r;
    flow_run(1000000, 1.5, &r);
    flow_print("unbounded", 1000000, &r);
    REQUIRE(r.ok);
    CHECK_MSG(r.cons.max_backlog > 20 * BOUND_CREDITS, "backlog max %u", r.cons.max_backlog);
    CHECK_MSG(r.cons.max_mb - r.cons.base_mb > flow_bound_mb(BOUND_CREDITS),
              "consumer grew only %.1f MiB", r.cons.max_mb - r.cons.base_mb);
    CHECK(r.held_events == 0);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    TEST_RUN(argc, argv, test_credit_tx_holds_and_releases_in_order, test_credit_rx_batches,
             test_credit_bounds_memory_tcp_10s, test_credit_huge_window_grows);
}
