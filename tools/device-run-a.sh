#!/usr/bin/env bash
# Device call of 2 Dec 2026 (session 5, call A): the model check of the
# binaries in build/h1x/a (main at the GPU progress change), outputs in $OUT.
set -u
B=build/h1x/a
tar -C $B -xJf $B/devpack.tar.xz
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ls /usr/lib/x86_64-linux-gnu/libnccl* /usr/local/cuda/lib64/libnccl* 2>/dev/null | head -3
BUILD=$B OUT=$OUT/model timeout 500 tools/device-model-check.sh > $OUT/model-check.txt 2>&1; echo "model rc $?"
cat $OUT/model-check.txt
