#!/usr/bin/env bash
# Device call 3 of issue 13 part 4 (one H200): bench/gpu_bench.sh on the llama1b and
# smollm2 rows with the torch.compile reference, baton w (call 2's binaries) with both
# attention variants (precise, fast). llama134m's row is call 2's.
set -u
H=build/h14
S=/tmp/h14s3
mkdir -p "$S"
sum() { echo "$*" | tee -a "$OUT/summary.txt"; }
tar -C $H -xJf $H/devpack.tar.xz && ln -sfn ../devpack $H/w/devpack
sum "start: $(date -u '+%F %T UTC'); $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader)"
sum "w: $(cat $H/w/BUILD_INFO)"
a=$SECONDS
OUT=$S/bench BUILD=$H/w ROWS="smollm2 llama1b" BUDGET=540 bench/gpu_bench.sh > $S/bench.out 2>&1
sum "gpu_bench smollm2 llama1b (w): rc=$? $((SECONDS - a)) s"
{ cat $S/bench/table.txt; echo "==== versions"; cat $S/bench/versions.txt; echo "==== logs"; cat $S/bench/logs.txt; echo "==== results"; cat $S/bench/results.jsonl; } > $OUT/bench.txt
cat $S/bench/table.txt | tee -a $OUT/summary.txt
sum "end: $SECONDS s"
