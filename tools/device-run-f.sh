#!/usr/bin/env bash
# Device call of 3 Dec 2026 (session 7, call F), the binaries of call E
# (build/h1x/e): what call E's time limits cut short.
#   - the Mamba2 op rows alone (test_cuda_ops mamba: f32, bf16, bf16/f32g, bf16/f32g/f32p)
#   - tools/device-mamba.sh at a size baton's simple scan finishes in time
#     (2 layers, hidden 1024, T 1024, one row, 6 steps)
#   - bench/bench_moe.sh on the machine's quiet CPU cores, with the pack's
#     libraries on the library path
set -u
B=build/h1x/e
tar -C $B -xJf $B/devpack.tar.xz
BUILD=$B; . tools/device-lib.sh
cat $B/BUILD_INFO
timeout 120 $B/device/test_cuda_ops mamba > $OUT/ops-mamba.txt 2>&1; echo "ops mamba rc $?"
grep -cE " PASS" $OUT/ops-mamba.txt; grep -E "FAIL" $OUT/ops-mamba.txt; tail -3 $OUT/ops-mamba.txt
BUILD=$B OUT=$OUT/mamba timeout 300 tools/device-mamba.sh 2 1024 1024 1 6 > $OUT/mamba.txt 2>&1; echo "mamba rc $?"
grep -v "Writing model shards" $OUT/mamba.txt | tail -14
grep -h "^ *step\|ms/step" $OUT/mamba/baton.log | tail -3
timeout 150 bench/bench_moe.sh $B 5 20 8 64 > $OUT/moe.txt 2>&1; echo "moe rc $?"
tail -25 $OUT/moe.txt
