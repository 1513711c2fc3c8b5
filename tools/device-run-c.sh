#!/usr/bin/env bash
# Device call of 2 Dec 2026 (session 5, call C): the NCCL backend's one-GPU
# check and the model check of the binaries in build/h1x/c (main with the
# nccl backend), outputs in $OUT.
set -u
B=build/h1x/c
tar -C $B -xJf $B/devpack.tar.xz
cat $B/BUILD_INFO
BUILD=$B OUT=$OUT/nccl timeout 150 tools/device-nccl-check.sh > $OUT/nccl-check.txt 2>&1; echo "nccl rc $?"
tail -45 $OUT/nccl-check.txt
BUILD=$B OUT=$OUT/model timeout 250 tools/device-model-check.sh > $OUT/model-check.txt 2>&1; echo "model rc $?"
grep -E "FAIL|progress|FAILED|one GPU" $OUT/model-check.txt
grep -h "collectives\|nccl" $OUT/model/train_gpu_*.log 2>/dev/null | head -8
tail -2 $OUT/model-check.txt
