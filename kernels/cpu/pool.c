/* The CPU backend's thread pool.
 *
 * Why baton runs its own pool instead of OpenBLAS's: OpenBLAS's threaded
 * sgemm gives different bits for different thread counts (measured with
 * OpenBLAS 0.3.21 on an AMD EPYC: 3 600 of 24 576 elements of a 128x192x64
 * product differ between 1 and 2 threads), so a run's result depended on how
 * many processes shared the host. Here OpenBLAS always runs single-threaded,
 * and a kernel that wants several cores cuts its work into tasks fixed by the
 * problem's shape alone; the pool only decides which thread runs which task,
 * so the bits never depend on the thread count.
 *
 * Contract: cpu_pool_run(n, fn, arg) calls fn(arg, i) once for every i in
 * [0, n), on the calling thread and up to threads-1 pool threads, and returns
 * when all have returned. Tasks must write disjoint memory. One run at a time
 * uses the pool; a caller that finds it busy (another compute thread of the
 * same process) runs its tasks itself, in order, with the same result.
 * Fork: the child of a fork has no pool threads; they are started again on
 * its first run. */
#include "kernels/cpu/cpu.h"

#include "base/log.h"

#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define POOL_MAX 256

static struct {
    pthread_once_t  once;
    pthread_mutex_t run_lock; /* held by the caller of a run */
    pthread_mutex_t mu;       /* guards everything below */
    pthread_cond_t  wake;     /* pool threads wait here for a new run */
    pthread_cond_t  idle;     /* the caller waits here for the pool threads */
    int             want;     /* threads per run, caller included (>= 1) */
    int             started;  /* pool threads running */
    bool            quit;
    uint64_t        gen;      /* bumped for every run */
    int             busy;     /* pool threads still inside the current run */
    cpu_task_fn     fn;
    void           *arg;
    int64_t         n_tasks;
    atomic_int_fast64_t next; /* next task index to take */
    pthread_t       tids[POOL_MAX];
} pool = {
    .once     = PTHREAD_ONCE_INIT,
    .run_lock = PTHREAD_MUTEX_INITIALIZER,
    .mu       = PTHREAD_MUTEX_INITIALIZER,
    .wake     = PTHREAD_COND_INITIALIZER,
    .idle     = PTHREAD_COND_INITIALIZER,
};

static void pool_take_tasks(cpu_task_fn fn, void *arg, int64_t n)
{
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&pool.next, 1, memory_order_relaxed);
        if (i >= n) return;
        fn(arg, i);
    }
}

/* gen0: the generation when the thread was created, so that a thread
 * created for a run (under mu, before the run bumps gen) takes part in it. */
static void *pool_thread(void *gen0)
{
    uint64_t seen = (uint64_t)(uintptr_t)gen0;
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        while (!pool.quit && pool.gen == seen) pthread_cond_wait(&pool.wake, &pool.mu);
        if (pool.quit) break;
        seen = pool.gen;
        cpu_task_fn fn = pool.fn;
        void *arg = pool.arg;
        int64_t n = pool.n_tasks;
        pthread_mutex_unlock(&pool.mu);
        pool_take_tasks(fn, arg, n);
        pthread_mutex_lock(&pool.mu);
        if (--pool.busy == 0) pthread_cond_signal(&pool.idle);
    }
    pthread_mutex_unlock(&pool.mu);
    return NULL;
}

/* Stops every pool thread; the caller holds run_lock. */
static void pool_stop_locked(void)
{
    pthread_mutex_lock(&pool.mu);
    pool.quit = true;
    pthread_cond_broadcast(&pool.wake);
    int n = pool.started;
    pthread_mutex_unlock(&pool.mu);
    for (int i = 0; i < n; i++) pthread_join(pool.tids[i], NULL);
    pthread_mutex_lock(&pool.mu);
    pool.started = 0;
    pool.quit = false;
    pthread_mutex_unlock(&pool.mu);
}

static void pool_fork_prepare(void)
{
    pthread_mutex_lock(&pool.run_lock);
    pthread_mutex_lock(&pool.mu);
}
static void pool_fork_parent(void)
{
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.run_lock);
}
static void pool_fork_child(void)
{
    pool.started = 0; /* the threads stayed in the parent */
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.run_lock);
}

static void pool_init(void)
{
    /* Every BLAS call runs on one thread; parallelism is ours (above). */
    openblas_set_num_threads(1);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    pool.want = cores > 0 ? (int)(cores < POOL_MAX ? cores : POOL_MAX) : 1;
    const char *env = getenv("BATON_CPU_THREADS");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end || v < 1 || v > POOL_MAX)
            log_warn("BATON_CPU_THREADS=%s is not a thread count in [1, %d]; using %d", env,
                     POOL_MAX, pool.want);
        else
            pool.want = (int)v;
    }
    pthread_atfork(pool_fork_prepare, pool_fork_parent, pool_fork_child);
}

void cpu_pool_set_threads(int n)
{
    pthread_once(&pool.once, pool_init);
    if (getenv("BATON_CPU_THREADS") && *getenv("BATON_CPU_THREADS")) return; /* the user decides */
    if (n <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        n = cores > 0 ? (int)cores : 1;
    }
    if (n > POOL_MAX) n = POOL_MAX;
    pthread_mutex_lock(&pool.run_lock);
    if (n != pool.want) {
        pool_stop_locked();
        pool.want = n;
    }
    pthread_mutex_unlock(&pool.run_lock);
}

int cpu_pool_threads(void)
{
    pthread_once(&pool.once, pool_init);
    pthread_mutex_lock(&pool.mu);
    int n = pool.want;
    pthread_mutex_unlock(&pool.mu);
    return n;
}

void cpu_pool_run(int64_t n_tasks, cpu_task_fn fn, void *arg)
{
    pthread_once(&pool.once, pool_init);
    if (n_tasks <= 0) return;
    if (n_tasks == 1 || pthread_mutex_trylock(&pool.run_lock) != 0) {
        for (int64_t i = 0; i < n_tasks; i++) fn(arg, i);
        return;
    }
    pthread_mutex_lock(&pool.mu);
    /* start what is missing (a thread that fails to start only costs speed) */
    while (pool.started < pool.want - 1 &&
           pthread_create(&pool.tids[pool.started], NULL, pool_thread,
                          (void *)(uintptr_t)pool.gen) == 0)
        pool.started++;
    if (pool.started == 0) {
        pthread_mutex_unlock(&pool.mu);
        for (int64_t i = 0; i < n_tasks; i++) fn(arg, i);
        pthread_mutex_unlock(&pool.run_lock);
        return;
    }
    pool.fn = fn;
    pool.arg = arg;
    pool.n_tasks = n_tasks;
    atomic_store_explicit(&pool.next, 0, memory_order_relaxed);
    /* every started thread takes part (the ones with nothing left return at
     * once); busy counts them all so the run ends only when none still
     * reads fn/arg */
    pool.busy = pool.started;
    pool.gen++;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    pool_take_tasks(fn, arg, n_tasks);
    pthread_mutex_lock(&pool.mu);
    while (pool.busy > 0) pthread_cond_wait(&pool.idle, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.run_lock);
}
