/* A kernel timeline of any CUDA program, without nsys (issue 13 item 4).
 *
 * Loaded by the CUDA driver through CUDA_INJECTION64_PATH=.../libcupti_trace.so
 * (the driver calls InitializeInjection when the program first initialises CUDA),
 * it enables CUPTI's activity records for kernels (the concurrent kind: kernels are
 * not serialised), memcpys and memsets, and writes one line per record to
 * $BT_CUPTI_OUT.<pid>.csv:
 *
 *     kind,start_ns,end_ns,stream,grid_x,grid_y,grid_z,block_x,block_y,block_z,graph,name
 *
 * (kind K kernel, C memcpy, S memset; name is the mangled kernel name, or the copy
 * kind). The timestamps are the GPU's, taken by CUPTI as the work runs, so the
 * durations are what each kernel took on the device without CUDA_LAUNCH_BLOCKING.
 * Buffers are flushed every 100 ms and the file after each buffer, so a process that
 * ends with _exit loses at most its last 100 ms.
 *
 * Build (not part of the Makefile: it needs CUPTI's headers):
 *   gcc -O2 -shared -fPIC -I$CUDA/include bench/gpu_profile/cupti_trace.c \
 *       -o DIR/libcupti_trace.so -L$CUDA/lib64 -lcupti -Wl,-rpath,'$ORIGIN'
 */
#define _GNU_SOURCE
#include <cupti.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define BUF_SIZE (4u << 20)

static FILE *out;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long n_kern, n_drop;

static void CUPTIAPI buf_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, BUF_SIZE);
    *size = *buffer ? BUF_SIZE : 0;
    *max_records = 0;
}

static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                   size_t valid)
{
    (void)ctx; (void)stream; (void)size;
    CUpti_Activity *r = NULL;
    pthread_mutex_lock(&mu);
    while (out && cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
            fprintf(out, "K,%llu,%llu,%u,%d,%d,%d,%d,%d,%d,%u,%s\n",
                    (unsigned long long)k->start, (unsigned long long)k->end, k->streamId,
                    k->gridX, k->gridY, k->gridZ, k->blockX, k->blockY, k->blockZ, k->graphId,
                    k->name ? k->name : "?");
            n_kern++;
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
            fprintf(out, "C,%llu,%llu,%u,%llu,0,0,0,0,0,%u,memcpy_kind%u\n",
                    (unsigned long long)m->start, (unsigned long long)m->end, m->streamId,
                    (unsigned long long)m->bytes, m->graphId, (unsigned)m->copyKind);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)r;
            fprintf(out, "S,%llu,%llu,%u,%llu,0,0,0,0,0,%u,memset\n",
                    (unsigned long long)m->start, (unsigned long long)m->end, m->streamId,
                    (unsigned long long)m->bytes, m->graphId);
        }
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS) n_drop += dropped;
    if (out) fflush(out);
    pthread_mutex_unlock(&mu);
    free(buffer);
}

static void finish(void)
{
    cuptiActivityFlushAll(1);
    pthread_mutex_lock(&mu);
    if (out) {
        fprintf(out, "#,end,%llu kernels,%llu dropped\n", n_kern, n_drop);
        fclose(out);
        out = NULL;
    }
    pthread_mutex_unlock(&mu);
}

#define CK(call) do { CUptiResult e_ = (call); if (e_ != CUPTI_SUCCESS) { \
    const char *s_ = NULL; cuptiGetResultString(e_, &s_); \
    fprintf(stderr, "cupti_trace: %s: %s\n", #call, s_ ? s_ : "?"); return 0; } } while (0)

__attribute__((visibility("default"))) int InitializeInjection(void)
{
    const char *base = getenv("BT_CUPTI_OUT");
    char path[4096];
    snprintf(path, sizeof path, "%s.%d.csv", base ? base : "/tmp/cupti_trace", (int)getpid());
    out = fopen(path, "w");
    if (!out) { perror(path); return 0; }
    fprintf(out, "kind,start_ns,end_ns,stream,grid_x,grid_y,grid_z,block_x,block_y,block_z,graph,name\n");
    fflush(out);
    CK(cuptiActivityRegisterCallbacks(buf_requested, buf_completed));
    CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
    CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
    CK(cuptiActivityFlushPeriod(100));
    atexit(finish);
    fprintf(stderr, "cupti_trace: recording kernels to %s\n", path);
    return 1;
}
