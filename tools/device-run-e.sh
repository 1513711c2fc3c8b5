#!/usr/bin/env bash
# Device call of 3 Dec 2026 (session 7, call E): the binaries in build/h1x/e.
#   ops      the per-op table (tools/device-check.sh), now with the Mamba2
#            ops' bf16 rows
#   model    the model check (bf16 Mamba2 eval rows among them)
#   mamba    the Mamba2 mixer's tokens/s against transformers' torch path
#            (tools/device-mamba.sh, fp32, 4 layers of hidden 2048, T 2048)
#   moe      bench/bench_moe.sh on this machine's quiet CPU cores (the
#            dispatch/combine figures of issue 16; no GPU involved)
# Outputs in $OUT.
set -u
B=build/h1x/e
tar -C $B -xJf $B/devpack.tar.xz
cat $B/BUILD_INFO; nproc; uptime
BUILD=$B OUT=$OUT/ops timeout 150 tools/device-check.sh > $OUT/device-check.txt 2>&1; echo "ops rc $?"
grep -iE "mamba|conv1d|ssd|ssm|gated|FAIL" $OUT/device-check.txt | head -40; tail -2 $OUT/device-check.txt
BUILD=$B OUT=$OUT/model timeout 200 tools/device-model-check.sh > $OUT/model-check.txt 2>&1; echo "model rc $?"
grep -E "FAIL|nemotron" $OUT/model-check.txt; tail -1 $OUT/model-check.txt
BUILD=$B OUT=$OUT/mamba timeout 150 tools/device-mamba.sh > $OUT/mamba.txt 2>&1; echo "mamba rc $?"
cat $OUT/mamba.txt | tail -20
timeout 200 bench/bench_moe.sh $B 5 20 8 64 > $OUT/moe.txt 2>&1; echo "moe rc $?"
tail -30 $OUT/moe.txt
