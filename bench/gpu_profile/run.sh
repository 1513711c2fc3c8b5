#!/usr/bin/env bash
# One device call (issue 13 item 4, profile evidence): a per-kernel time breakdown of
# the llama134m row's training step for baton and for the torch.compile reference.
#
#   BUILD=build/h13p bench/gpu_profile/run.sh      (on the GPU machine, from the repo root)
#
# BUILD holds baton, libbaton_cuda.so, devpack.tar.xz and BUILD_INFO (as for
# bench/gpu_bench.sh) plus libcupti_trace.so (bench/gpu_profile/cupti_trace.c) and the
# libcupti.so.13 it was linked against. In order:
#   1. which profilers the machine has (nsys, ncu, the CUDA bin folders);
#   2. baton's llama134m row (gpu_bench.sh, PYTHON=false, 3 + 5 steps) with the CUPTI
#      activity recorder injected (CUDA_INJECTION64_PATH): every kernel's GPU start and
#      end, summarised per step by summarize.py (steps 4..8);
#   3. torch: gpu_bench_torch.py train with the same shape, 3 warm-up + 5 timed steps,
#      then 1 + 3 steps under torch.profiler (key_averages tables, chrome trace);
#   4. nsys profile --stats=true of the same baton run, if nsys is on PATH; ncu on a
#      range of kernels only if step 2 recorded no kernels;
#   5. the bf16 matrix peak (gpu_bench_torch.py peak) if time is left.
# Outputs under $OUT (8 files): summary.txt, bench_logs.txt, baton_summary.txt,
# baton_kernels.csv.gz, torch_summary.txt, torch_profile.txt, torch_trace.json.gz, extra.txt
set -u
B=${BUILD:-build/h13p}
LIMIT=${LIMIT:-300}          # seconds this script may use in all
GEMM_TFLOP=21.53             # llama134m: 3 x 2N(L(4C^2 + 3CF) + CV), N = 32768 (not attention)
PEAK=${PEAK:-800}
S=/tmp/prof
rm -rf "$S"; mkdir -p "$S"
sum() { echo "$*" | tee -a "$OUT/summary.txt"; }
sum "start: $(date -u '+%F %T UTC'); $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader)"
sum "binaries: $(cat $B/BUILD_INFO)"
{ echo "== which nsys ncu"; which nsys ncu; echo "== ls /usr/local/cuda*/bin"; ls /usr/local/cuda*/bin
  echo "== nsight folders"; ls -d /opt/nvidia/* /opt/nvidia/*/* /usr/local/cuda*/nsight* 2>/dev/null
  echo "== c++filt: $(command -v c++filt)"; } >> "$OUT/summary.txt" 2>&1
NSYS=$(command -v nsys || ls /opt/nvidia/nsight-systems*/*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
sum "nsys: ${NSYS:-none found}; ncu: ${NCU:-none found}"

# 2. baton under the CUPTI recorder
a=$SECONDS
CUDA_INJECTION64_PATH=$PWD/$B/libcupti_trace.so BT_CUPTI_OUT=$S/baton \
    OUT=$S/bench BUILD=$B ROWS=llama134m PYTHON=false WARMUP=3 STEPS=5 BUDGET=120 \
    bench/gpu_bench.sh > $S/bench.out 2>&1
rc=$?
sum "baton under cupti_trace: rc=$rc $((SECONDS - a)) s; $(grep -h 'llama134m baton' $S/bench.out)"
csv=$(ls -S $S/baton.*.csv 2>/dev/null | head -1)
sum "cupti csv files: $(ls -l $S/baton.*.csv 2>/dev/null | awk '{print $NF" "$5}' | tr '\n' ' ')"
nk=0
if [ -n "$csv" ]; then
    nk=$(grep -c '^K,' "$csv")
    sum "kernel records: $nk; $(tail -1 "$csv")"
    python3 bench/gpu_profile/summarize.py baton "$csv" --warmup 3 --gemm-tflop $GEMM_TFLOP \
        --peak $PEAK --top 40 > "$OUT/baton_summary.txt" 2>&1
    head -22 "$OUT/baton_summary.txt"
    gzip -c "$csv" > "$OUT/baton_kernels.csv.gz"
fi
{ cat $S/bench.out; echo "==== logs"; cat $S/bench/logs.txt; echo "==== metrics"; cat $S/bench/metrics.jsonl
  echo "==== versions"; cat $S/bench/versions.txt; } > "$OUT/bench_logs.txt" 2>&1

# 3. torch under torch.profiler
a=$SECONDS
lim=$((LIMIT - SECONDS - 40)); [ $lim -gt 220 ] && lim=220
if [ $lim -gt 60 ]; then
    PYTHONUNBUFFERED=1 timeout -k 5 $lim python3 bench/gpu_bench_torch.py train --layers 12 --hidden 768 \
        --heads 12 --kv-heads 12 --ffn 2048 --vocab 32000 --seq 1024 --batch 32 --warmup 3 --steps 5 \
        --profile 3 --profile-out $S/torch > $S/torch.out 2> $S/torch.log
    rc=$?
    sum "torch under torch.profiler: rc=$rc $((SECONDS - a)) s; $(grep -h 'median step' $S/torch.log)"
    { python3 bench/gpu_profile/summarize.py torch $S/torch/torch_trace.json.gz --steps 3 \
          --gemm-tflop $GEMM_TFLOP --peak $PEAK --top 40
      echo "==== stdout"; cat $S/torch.out; echo "==== stderr"; cat $S/torch.log
      python3 -c 'import json, sys; sys.path.insert(0, "bench"); import torch, gpu_bench_torch as g; print(json.dumps(g.versions(torch)))'
    } > "$OUT/torch_summary.txt" 2>&1
    head -20 "$OUT/torch_summary.txt"
    cp $S/torch/torch_profile.txt "$OUT/" 2>/dev/null
    cp $S/torch/torch_trace.json.gz "$OUT/" 2>/dev/null
else
    sum "torch: skipped, $lim s left"
fi

# 4. nsys (if on PATH) over the same baton row; ncu only if CUPTI gave nothing
W=$B-wrap; mkdir -p $W
cp $B/libbaton_cuda.so $B/BUILD_INFO $B/devpack.tar.xz $W/ 2>/dev/null
if [ -n "$NSYS" ] && [ $((LIMIT - SECONDS)) -gt 70 ]; then
    printf '#!/bin/sh\n[ "$1" = run ] && exec %s profile --stats=true -o %s/nsys -f true %s/baton "$@"\nexec %s/baton "$@"\n' \
        "$NSYS" "$S" "$PWD/$B" "$PWD/$B" > $W/baton; chmod +x $W/baton
    a=$SECONDS
    OUT=$S/bench2 BUILD=$W ROWS=llama134m PYTHON=false WARMUP=3 STEPS=5 BUDGET=$((LIMIT - SECONDS - 15)) \
        bench/gpu_bench.sh > $S/nsys.out 2>&1
    sum "nsys run: rc=$? $((SECONDS - a)) s"
    { echo "==== nsys"; cat $S/nsys.out; cat $S/bench2/logs.txt; } >> "$OUT/extra.txt" 2>&1
elif [ "$nk" = 0 ] && [ -n "$NCU" ] && [ $((LIMIT - SECONDS)) -gt 70 ]; then
    printf '#!/bin/sh\n[ "$1" = run ] && exec %s --clock-control none --cache-control none --metrics gpu__time_duration.sum --launch-skip 3000 --launch-count 1500 --csv --print-units base --log-file %s/ncu.csv %s/baton "$@"\nexec %s/baton "$@"\n' \
        "$NCU" "$S" "$PWD/$B" "$PWD/$B" > $W/baton; chmod +x $W/baton
    a=$SECONDS
    OUT=$S/bench2 BUILD=$W ROWS=llama134m PYTHON=false WARMUP=3 STEPS=2 RUN_TIMEOUT=$((LIMIT - SECONDS - 20)) \
        BUDGET=$((LIMIT - SECONDS - 10)) bench/gpu_bench.sh > $S/ncu.out 2>&1
    sum "ncu run: rc=$? $((SECONDS - a)) s"
    { echo "==== ncu"; cat $S/ncu.out; cat $S/ncu.csv; } >> "$OUT/extra.txt" 2>&1
else
    sum "nsys/ncu: not run (no nsys; ncu only as the fallback, kernel records: $nk)"
fi

# 5. the peak, if time is left
if [ $((LIMIT - SECONDS)) -gt 30 ]; then
    python3 bench/gpu_bench_torch.py peak > $S/peak.out 2> $S/peak.log
    sum "peak: $(grep -h 'peak:' $S/peak.log)"
fi
sum "end: $SECONDS s"
