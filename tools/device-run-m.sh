#!/usr/bin/env bash
# Device call M (6 Dec 2026, session 11): with the binaries of call L
# (BATON_CUDA_ATTN=cudnn), a per-kernel record of one llama134m step for baton
# (CUPTI) and torch (torch.profiler) by bench/gpu_profile/run.sh, then the whole
# table once more (cudnn only, torch beside it) as a second sample of the ratios.
set -u
B=${B:-build/h1x/l}
BUILD=$B; . tools/device-lib.sh
P=/tmp/m-prof; G=/tmp/m-bench; mkdir -p $P $G
a=$SECONDS
ATTN=cudnn OUT=$P BUILD=$B LIMIT=240 bench/gpu_profile/run.sh > $P/run.txt 2>&1
sum "profile: rc=$? $((SECONDS - a)) s"
grep -E "cupti|kernel records|torch under|peak" $P/summary.txt | tee -a $OUT/summary.txt
head -45 $P/baton_summary.txt | tee -a $OUT/summary.txt
tar -C $P -czf $OUT/prof.tar.gz .
a=$SECONDS
OUT=$G BUILD=$B ATTN=cudnn BUDGET=$((580 - SECONDS)) bench/gpu_bench.sh > $G/run.txt 2>&1
sum "gpu_bench: rc=$? $((SECONDS - a)) s"
cat $G/table.txt | head -20 | tee -a $OUT/summary.txt
tar -C $G -czf $OUT/bench.tar.gz .
sum "end: $SECONDS s"
