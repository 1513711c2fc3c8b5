#!/usr/bin/env bash
# Device call N (6 Dec 2026, session 11): the table once more with the torch
# reference's attention told is_causal (TORCH_ATTN=causal_sdpa: under
# torch.compile, transformers 5.17 with torch 2.11 hands SDPA a materialised
# mask, and a masked SDPA computes the whole T x T square), baton's cudnn
# path beside it (binaries of call L).
set -u
B=${B:-build/h1x/l}
BUILD=$B; . tools/device-lib.sh
G=/tmp/n-bench; mkdir -p $G
a=$SECONDS
OUT=$G BUILD=$B ATTN=cudnn TORCH_ATTN=causal_sdpa BUDGET=540 bench/gpu_bench.sh > $G/run.txt 2>&1
sum "gpu_bench (torch causal_sdpa): rc=$? $((SECONDS - a)) s"
grep -E "torch:" $G/run.txt | head -5 | tee -a $OUT/summary.txt
cat $G/table.txt | head -20 | tee -a $OUT/summary.txt
tar -C $G -czf $OUT/bench.tar.gz .
sum "end: $SECONDS s"
