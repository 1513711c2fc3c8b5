#!/usr/bin/env bash
# Device call O (6 Dec 2026, session 11): torch.profiler record of the llama134m
# reference with its attention told is_causal (--attn causal_sdpa), summarised
# as call M's default-sdpa record was, for the per-kernel comparison.
set -u
S=/tmp/o; mkdir -p $S
GEMM_TFLOP=21.53
PYTHONUNBUFFERED=1 timeout -k 5 200 python3 bench/gpu_bench_torch.py train --layers 12 --hidden 768 \
    --heads 12 --kv-heads 12 --ffn 2048 --vocab 32000 --seq 1024 --batch 32 --warmup 3 --steps 5 \
    --attn causal_sdpa --profile 3 --profile-out $S/torch > $S/torch.out 2> $S/torch.log
echo "torch causal_sdpa under torch.profiler: rc=$?; $(grep -h 'median step' $S/torch.log)" | tee $OUT/summary.txt
python3 bench/gpu_profile/summarize.py torch $S/torch/torch_trace.json.gz --steps 3 \
    --gemm-tflop $GEMM_TFLOP --peak 800 --top 30 > $OUT/torch_causal_summary.txt 2>&1
head -60 $OUT/torch_causal_summary.txt
