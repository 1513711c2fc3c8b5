/* baton bench ckpt --dir DIR [--mb N] [--tensors K] [--json]
 *
 * One checkpoint save and load as a run makes them, timed: K f32 tensors of
 * N MB in all (sizes spread like a model's: a few large, many small) are
 * written as one writer's shard file into a step directory and committed
 * (ckpt/store.h: fsync of every file and directory, index, rename, latest),
 * then evicted from the page cache (posix_fadvise DONTNEED, after the
 * fsync the pages are clean) and read back whole through the reader
 * (size and hash check, then every piece). bench/bench_ckpt.sh puts the
 * numbers next to `dd conv=fsync` and torch.distributed.checkpoint on the
 * same disk, in the same run. */
#include "bench/bench.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/file.h"
#include "ckpt/native.h"
#include "ckpt/store.h"

static void evict(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

int bench_ckpt_main(int argc, char **argv)
{
    const char *dir = NULL;
    double mb = 256;
    int k = 64;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--tensors") && i + 1 < argc) k = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = true;
        else {
            fprintf(stderr, "usage: baton bench ckpt --dir DIR [--mb N] [--tensors K] [--json]\n");
            return 2;
        }
    }
    if (!dir || mb <= 0 || k < 1 || k > 100000) {
        fprintf(stderr, "baton bench ckpt: --dir DIR is required (and --mb > 0, 1 <= --tensors <= 100000)\n");
        return 2;
    }
    /* tensor i gets a share proportional to 1/(1 + i/4): a few large, many small */
    double wsum = 0;
    for (int i = 0; i < k; i++) wsum += 1.0 / (1.0 + i / 4.0);
    int64_t total = (int64_t)(mb * 1e6 / 4);
    ckpt_put_t *puts = calloc((size_t)k, sizeof *puts);
    char (*names)[64] = calloc((size_t)k, sizeof *names);
    float **bufs = calloc((size_t)k, sizeof *bufs);
    float *back = NULL;
    int64_t largest = 0, sum = 0;
    if (!puts || !names || !bufs) return 1;
    for (int i = 0; i < k; i++) {
        int64_t n = (int64_t)((double)total * (1.0 / (1.0 + i / 4.0)) / wsum);
        if (n < 1) n = 1;
        int64_t shape[2] = {n / 64 ? n / 64 : 1, n / 64 ? 64 : n};
        n = shape[0] * shape[1];
        bufs[i] = malloc((size_t)n * sizeof(float));
        if (!bufs[i]) return 1;
        uint32_t x = 2463534242u + (uint32_t)i;
        for (int64_t j = 0; j < n; j++) { /* xorshift: data that does not compress */
            x ^= x << 13; x ^= x >> 17; x ^= x << 5;
            bufs[i][j] = (float)(x >> 8) * (1.0f / 16777216.0f);
        }
        snprintf(names[i], sizeof names[i], "model.layers.%d.weight", i);
        puts[i] = (ckpt_put_t){.tensor = names[i], .dtype = DT_F32, .spec = shard_whole(2, shape),
                               .data = bufs[i]};
        if (n > largest) largest = n;
        sum += n;
    }
    char err[1024], root[4096], step_dir[4096];
    snprintf(root, sizeof root, "%s/bench-ckpt", dir);
    ckpt_step_dir(root, 1, step_dir, sizeof step_dir);
    base_dir_clear(step_dir);
    int rc = 1;
    uint64_t t0 = clock_now_ns();
    ckpt_index_t idx = {0};
    char tmp[4096];
    ckpt_step_tmp(root, 1, tmp, sizeof tmp);
    bt_status_t st = ckpt_stage_begin(root, 1, err, sizeof err);
    if (!st) st = ckpt_shard_write(&idx, tmp, "shard-r00000.safetensors", puts, k, err, sizeof err);
    if (!st) st = ckpt_commit(root, 1, &idx, 0, err, sizeof err);
    double save_s = (double)(clock_now_ns() - t0) * 1e-9;
    ckpt_index_free(&idx);
    if (st) {
        fprintf(stderr, "baton bench ckpt: save: %s\n", err);
        goto out;
    }
    char file[4200];
    snprintf(file, sizeof file, "%s/shard-r00000.safetensors", step_dir);
    evict(file);
    back = malloc((size_t)largest * sizeof *back);
    if (!back) goto out;
    t0 = clock_now_ns();
    const char *dirs[1] = {step_dir};
    ckpt_reader_t *r = NULL;
    st = ckpt_reader_open(dirs, 1, &r, err, sizeof err);
    for (int i = 0; i < k && !st; i++) {
        st = ckpt_read(r, names[i], &puts[i].spec, back, err, sizeof err);
        if (!st && memcmp(back, bufs[i], (size_t)shard_numel(&puts[i].spec) * sizeof(float))) {
            snprintf(err, sizeof err, "tensor %s read back differs", names[i]);
            st = BT_ERR_CORRUPT;
        }
    }
    ckpt_reader_close(r);
    double load_s = (double)(clock_now_ns() - t0) * 1e-9;
    if (st) {
        fprintf(stderr, "baton bench ckpt: load: %s\n", err);
        goto out;
    }
    double bytes = (double)sum * 4;
    if (json)
        printf("{\"bytes\": %.0f, \"tensors\": %d, \"save_s\": %.4f, \"load_s\": %.4f, "
               "\"save_mb_s\": %.1f, \"load_mb_s\": %.1f}\n",
               bytes, k, save_s, load_s, bytes / save_s / 1e6, bytes / load_s / 1e6);
    else
        printf("checkpoint of %.1f MB in %d tensors: save %.3f s (%.0f MB/s, fsynced and committed), "
               "load %.3f s (%.0f MB/s, from disk, checked)\n",
               bytes / 1e6, k, save_s, bytes / save_s / 1e6, load_s, bytes / load_s / 1e6);
    rc = 0;
out:
    base_dir_clear(step_dir);
    for (int i = 0; i < k; i++) free(bufs[i]);
    free(bufs);
    free(back);
    free(puts);
    free(names);
    return rc;
}
