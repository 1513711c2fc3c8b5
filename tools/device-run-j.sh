#!/usr/bin/env bash
# Device call J (4 Dec 2026, session 9): binaries of the BUILD_INFO commit
# (model_init_random on the host pool). The Llama 1.1B row with torch.compile
# beside it (call I ran out of time before it), then a per-kernel record of one
# SmolLM2-135M step for baton (CUPTI) and for torch (torch.profiler).
set -u
B=${B:-build/h1x/n2}
tar -C $B -xJf $B/devpack.tar.xz
BUILD=$B; . tools/device-lib.sh
S=$OUT/summary.txt
sum() { echo "$*" | tee -a $S; }
sum "start: $(date -u '+%F %T UTC'); $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader)"
sum "binaries: $(cat $B/BUILD_INFO)"
a=$SECONDS
OUT=$OUT/bench BUILD=$B ROWS=llama1b ATTN=fast BUDGET=260 bench/gpu_bench.sh > $OUT/bench.txt 2>&1
sum "gpu_bench llama1b: rc=$? $((SECONDS - a)) s"
grep -E "llama1b (b-fast|torch):" $OUT/bench.txt | tee -a $S
grep -A6 "^row " $OUT/bench.txt | tee -a $S
GEMM_TFLOP=26.44 # SmolLM2: 6 x 134479872 matrix weights x 32768 tokens
a=$SECONDS
CUDA_INJECTION64_PATH=$PWD/$B/libcupti_trace.so BT_CUPTI_OUT=/tmp/sc OUT=/tmp/scb BUILD=$B \
    ROWS=smollm2 ATTN=fast PYTHON=false WARMUP=3 STEPS=5 BUDGET=80 bench/gpu_bench.sh > /tmp/sc.out 2>&1
sum "cupti smollm2: rc=$? $((SECONDS - a)) s; $(grep -hE 'smollm2 (baton|b-fast):' /tmp/sc.out | tail -1)"
csv=$(ls -S /tmp/sc.*.csv 2>/dev/null | head -1)
[ -n "$csv" ] && python3 bench/gpu_profile/summarize.py baton "$csv" --warmup 3 --gemm-tflop $GEMM_TFLOP \
    --peak 800 --top 40 > $OUT/smollm2-baton-kernels.txt 2>&1
head -30 $OUT/smollm2-baton-kernels.txt
lim=$((560 - SECONDS)); [ $lim -gt 200 ] && lim=200
if [ $lim -gt 60 ]; then
    a=$SECONDS
    PYTHONUNBUFFERED=1 timeout -k 5 $lim python3 bench/gpu_bench_torch.py train --layers 30 --hidden 576 \
        --heads 9 --kv-heads 3 --ffn 1536 --vocab 49152 --seq 2048 --batch 16 --tie --rope-theta 100000 \
        --warmup 3 --steps 5 --profile 3 --profile-out /tmp/storch > /tmp/storch.out 2> /tmp/storch.log
    sum "torch smollm2 under torch.profiler: rc=$? $((SECONDS - a)) s; $(grep -h 'median step' /tmp/storch.log)"
    python3 bench/gpu_profile/summarize.py torch /tmp/storch/torch_trace.json.gz --steps 3 \
        --gemm-tflop $GEMM_TFLOP --peak 800 --top 40 > $OUT/smollm2-torch-kernels.txt 2>&1
    head -30 $OUT/smollm2-torch-kernels.txt
fi
sum "end: $SECONDS s"
