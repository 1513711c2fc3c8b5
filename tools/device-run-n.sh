#!/usr/bin/env bash
# Device call N (6 Dec 2026, session 11): the table once more with the torch
# reference's attention told is_causal (TORCH_ATTN=causal_sdpa: under
# torch.compile, transformers 5.17 with torch 2.11 hands SDPA a materialised
# mask, and a masked SDPA computes the whole T x T square), baton's cudnn
# path beside it (binaries of call L).
set -u
B=${B:-build/h1x/l}
tar -C $B -xJf $B/devpack.tar.xz
BUILD=$B; . tools/device-lib.sh
S=$OUT/summary.txt
G=/tmp/n-bench; mkdir -p $G
a=$SECONDS
OUT=$G BUILD=$B ATTN=cudnn TORCH_ATTN=causal_sdpa BUDGET=540 bench/gpu_bench.sh > $G/run.txt 2>&1
echo "gpu_bench (torch causal_sdpa): rc=$? $((SECONDS - a)) s" | tee -a $S
grep -E "torch:" $G/run.txt | head -5 | tee -a $S
cat $G/table.txt | head -20 | tee -a $S
tar -C $G -czf $OUT/bench.tar.gz .
echo "end: $SECONDS s" | tee -a $S
