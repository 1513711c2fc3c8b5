#!/usr/bin/env bash
# Device call K (4 Dec 2026, session 9): the dK/dV attention kernel with the
# next step's Q and dO tiles copied by cp.async while the block computes
# (B=build/h1x/k) against the kernels before it (A=build/h1x/n2, 8052da7):
# the op table's attention rows on k, then SmolLM2 and llama134m baton-only
# runs of n2 and k interleaved (fast attention, the path the table's rows use).
set -u
B=${B:-build/h1x/k}
A=${A:-build/h1x/n2}
tar -C $A -xJf $A/devpack.tar.xz
mkdir -p $B/devpack && cp -r $A/devpack/. $B/devpack/
BUILD=$B; . tools/device-lib.sh
S=$OUT/summary.txt
sum() { echo "$*" | tee -a $S; }
sum "start: $(date -u '+%F %T UTC'); $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader)"
sum "k: $(cat $B/BUILD_INFO)"
sum "n2: $(cat $A/BUILD_INFO)"
a=$SECONDS
timeout 100 $B/device/test_cuda_ops attention > $OUT/ops-attention.txt 2>&1
sum "ops attention: rc=$? $((SECONDS - a)) s; $(tail -1 $OUT/ops-attention.txt)"
grep FAIL $OUT/ops-attention.txt | head -8 | tee -a $S
ab() { # ROW TAG DIR
    local t=$SECONDS
    OUT=/tmp/ab-$2 BUILD=$3 ROWS=$1 ATTN=fast PYTHON=false WARMUP=5 STEPS=20 BUDGET=60 \
        bench/gpu_bench.sh > /tmp/ab-$2.out 2>&1
    sum "$1 $2: $(grep -hE "$1 (baton|b-fast):" /tmp/ab-$2.out | tail -1) ($((SECONDS - t)) s)"
}
for r in smollm2 llama134m; do
    for i in 1 2; do
        [ $SECONDS -lt 230 ] || break
        ab $r n2 $A; ab $r k $B
    done
done
sum "end: $SECONDS s"
