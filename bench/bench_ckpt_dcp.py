#!/usr/bin/env python3
"""torch.distributed.checkpoint on the same state as `baton bench ckpt`
(bench/bench_ckpt.c): K f32 tensors of N MB in all, the same sizes, the same
disk. One process, no process group (DCP's single-process path); the
writer's files are fsynced (FileSystemWriter sync_files=True, its default),
then evicted from the page cache (posix_fadvise DONTNEED) and loaded back
into preallocated tensors. Prints one JSON line.

    python3 bench/bench_ckpt_dcp.py --dir DIR [--mb 256] [--tensors 64]
"""
import argparse
import json
import os
import shutil
import time

import torch
import torch.distributed.checkpoint as dcp


def sizes(mb, k):
    total = int(mb * 1e6 / 4)
    wsum = sum(1.0 / (1.0 + i / 4.0) for i in range(k))
    out = []
    for i in range(k):
        n = max(1, int(total * (1.0 / (1.0 + i / 4.0)) / wsum))
        shape = (n // 64, 64) if n // 64 else (1, n)
        out.append(shape)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--mb", type=float, default=256)
    ap.add_argument("--tensors", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(1)
    state = {f"model.layers.{i}.weight": torch.rand(s, generator=g) for i, s in enumerate(sizes(a.mb, a.tensors))}
    path = os.path.join(a.dir, "bench-dcp")
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    dcp.save(state, checkpoint_id=path)
    save_s = time.perf_counter() - t0
    for f in os.listdir(path):
        fd = os.open(os.path.join(path, f), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    back = {k: torch.empty_like(v) for k, v in state.items()}
    t0 = time.perf_counter()
    dcp.load(back, checkpoint_id=path)
    load_s = time.perf_counter() - t0
    assert all(torch.equal(back[k], state[k]) for k in state)
    nbytes = sum(v.numel() * 4 for v in state.values())
    shutil.rmtree(path, ignore_errors=True)
    print(json.dumps({"bytes": nbytes, "tensors": len(state), "save_s": save_s, "load_s": load_s,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
