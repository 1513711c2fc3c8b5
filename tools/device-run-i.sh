#!/usr/bin/env bash
# Device call I (4 Dec 2026, session 9): the fused residual add + RMSNorm
# forward (kern_add_rmsnorm_fwd, 5f9f6b6) measured for the first time.
#   B=build/h1x/n  main with the fused op (binaries of the BUILD_INFO commit)
#   A=build/h1x/o  ea65b4f, the commit before it (baton and libbaton_cuda.so only)
# In order: the op table's add/rmsnorm rows on n; llama134m and llama1b
# baton-only runs of o and n interleaved (o n o n, fast attention); the full
# gpu_bench table (three rows, fast attention, torch.compile beside) on n; a
# CUPTI per-kernel record of the SmolLM2 row on n.
set -u
B=${B:-build/h1x/n}
A=${A:-build/h1x/o}
tar -C $B -xJf $B/devpack.tar.xz
mkdir -p $A/devpack && cp -r $B/devpack/. $A/devpack/
BUILD=$B; . tools/device-lib.sh
S=$OUT/summary.txt
sum() { echo "$*" | tee -a $S; }
sum "start: $(date -u '+%F %T UTC'); $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader)"
sum "n: $(cat $B/BUILD_INFO)"
sum "o: $(cat $A/BUILD_INFO)"
a=$SECONDS
timeout 120 $B/device/test_cuda_ops rmsnorm > $OUT/ops.txt 2>&1
sum "ops rmsnorm (add_rmsnorm and rmsnorm rows): rc=$? $((SECONDS - a)) s; $(tail -1 $OUT/ops.txt)"
grep FAIL $OUT/ops.txt | head -5 | tee -a $S
ab() { # ROW TAG DIR
    local t=$SECONDS
    OUT=/tmp/ab-$2 BUILD=$3 ROWS=$1 ATTN=fast PYTHON=false WARMUP=5 STEPS=20 BUDGET=120 \
        bench/gpu_bench.sh > /tmp/ab-$2.out 2>&1
    sum "$1 $2: $(grep -hE "$1 (baton|b-fast):" /tmp/ab-$2.out | tail -1) ($((SECONDS - t)) s)"
}
for r in llama134m llama1b; do
    for i in 1 2; do ab $r o $A; ab $r n $B; done
done
a=$SECONDS
OUT=$OUT/bench BUILD=$B ROWS="llama134m smollm2 llama1b" ATTN=fast BUDGET=300 \
    bench/gpu_bench.sh > $OUT/bench.txt 2>&1
sum "gpu_bench: rc=$? $((SECONDS - a)) s"
grep -A40 "^bench/gpu_bench.sh: date" $OUT/bench.txt | head -30 >> $S
if [ $SECONDS -lt 500 ]; then
    a=$SECONDS
    CUDA_INJECTION64_PATH=$PWD/$B/libcupti_trace.so BT_CUPTI_OUT=/tmp/sc OUT=/tmp/scb BUILD=$B \
        ROWS=smollm2 ATTN=fast PYTHON=false WARMUP=3 STEPS=5 BUDGET=80 bench/gpu_bench.sh > /tmp/sc.out 2>&1
    sum "cupti smollm2: rc=$? $((SECONDS - a)) s; $(grep -hE 'smollm2 (baton|b-fast):' /tmp/sc.out | tail -1)"
    csv=$(ls -S /tmp/sc.*.csv 2>/dev/null | head -1)
    [ -n "$csv" ] && python3 bench/gpu_profile/summarize.py baton "$csv" --warmup 3 --top 40 \
        > $OUT/smollm2-kernels.txt 2>&1
    head -40 $OUT/smollm2-kernels.txt
fi
sum "end: $SECONDS s"
