#!/usr/bin/env bash
# Device call of 2 Dec 2026 (session 5, call B): the per-op table (new rows:
# Mamba2 ops, MoE reselect, attention merge) and the model check of the
# binaries in build/h1x/b, outputs in $OUT.
set -u
B=build/h1x/b
tar -C $B -xJf $B/devpack.tar.xz
cat $B/BUILD_INFO
BUILD=$B OUT=$OUT/ops timeout 280 tools/device-check.sh > $OUT/device-check.txt 2>&1; echo "ops rc $?"
grep -E "FAIL|mamba|reselect|merge|passed|failed" $OUT/device-check.txt | head -80
BUILD=$B OUT=$OUT/model timeout 200 tools/device-model-check.sh > $OUT/model-check.txt 2>&1; echo "model rc $?"
grep -E "FAIL|IPC|progress|FAILED|handed" $OUT/model-check.txt
tail -2 $OUT/model-check.txt
