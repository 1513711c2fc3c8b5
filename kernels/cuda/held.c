/* Device memory held through the CUDA backend, and its peak (kernels/cuda/cuda.h):
 * a small table of live blocks under a lock. The backend allocates tens of
 * blocks (one per model block, arena, stream workspace and scratch), never
 * per op, so a linear search on free is enough. */
#ifdef BT_HAVE_CUDA

#include "kernels/cuda/cuda.h"

#include "base/log.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const void *p;
    size_t nbytes;
} held_block_t;

static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t held_once = PTHREAD_ONCE_INIT;
static held_block_t *held;
static size_t n_held, cap_held;
static size_t held_now, held_peak;
static bool held_untracked; /* a block that found no room in the table */

static void held_report(void)
{
    pthread_mutex_lock(&held_mu);
    size_t peak = held_peak, now = held_now;
    bool lost = held_untracked;
    pthread_mutex_unlock(&held_mu);
    log_info("cuda: device memory held at most %zu bytes (%.3f GiB; cudaMalloc blocks, stream "
             "scratch and cuBLASLt workspaces, not the CUDA context), %zu bytes at exit%s",
             peak, (double)peak / (1 << 30), now,
             lost ? "; incomplete: some blocks found no room in the count's table" : "");
}

static void held_init(void)
{
    const char *e = getenv("BATON_CUDA_MEM_REPORT");
    if (!e || !*e || !strcmp(e, "0")) return;
    char v[512];
    cuda_versions_str(v, sizeof v);
    log_info("cuda: %s", v);
    atexit(held_report);
}

size_t cuda_held_peak(int index)
{
    (void)index; /* one count for the process: a rank drives one GPU */
    pthread_mutex_lock(&held_mu);
    size_t peak = held_peak;
    pthread_mutex_unlock(&held_mu);
    return peak;
}

void cuda_held_peak_restore(int index, size_t peak)
{
    (void)index;
    pthread_mutex_lock(&held_mu);
    held_peak = peak > held_now ? peak : held_now;
    pthread_mutex_unlock(&held_mu);
}

void cuda_held_add(const void *p, size_t nbytes)
{
    pthread_once(&held_once, held_init);
    if (!p) return;
    pthread_mutex_lock(&held_mu);
    if (n_held == cap_held) {
        size_t cap = cap_held ? 2 * cap_held : 64;
        held_block_t *grown = realloc(held, cap * sizeof *grown);
        if (grown) {
            held = grown;
            cap_held = cap;
        }
    }
    if (n_held < cap_held) {
        held[n_held++] = (held_block_t){p, nbytes};
        held_now += nbytes;
        if (held_now > held_peak) held_peak = held_now;
    } else {
        held_untracked = true;
    }
    pthread_mutex_unlock(&held_mu);
}

void cuda_held_remove(const void *p)
{
    if (!p) return;
    pthread_mutex_lock(&held_mu);
    for (size_t i = n_held; i-- > 0;) {
        if (held[i].p != p) continue;
        held_now -= held[i].nbytes;
        held[i] = held[--n_held];
        break;
    }
    pthread_mutex_unlock(&held_mu);
}

#endif
