#!/usr/bin/env bash
# Device call H (3 Dec 2026, session 8): main at the BUILD_INFO commit (fast
# Mamba2 kernels with the warp-per-token and row-split conv sums; A_log, D,
# dt_bias and the gated norm weight kept f32 under bf16).
set -u
B=${B:-build/h1x/h}
tar -C $B -xJf $B/devpack.tar.xz
BUILD=$B; . tools/device-lib.sh
cat $B/BUILD_INFO
timeout 100 $B/device/test_cuda_ops mamba > $OUT/ops-mamba.txt 2>&1; echo "ops mamba rc $?"
tail -1 $OUT/ops-mamba.txt; grep FAIL $OUT/ops-mamba.txt | head
BUILD=$B OUT=$OUT/model timeout 260 tools/device-model-check.sh > $OUT/model-check.txt 2>&1; echo "model rc $?"
grep -E "FAIL|nemotron" $OUT/model-check.txt; tail -1 $OUT/model-check.txt
BUILD=$B OUT=$OUT/mamba timeout 200 tools/device-mamba.sh > $OUT/mamba.txt 2>&1; echo "mamba rc $?"
grep -v "Writing model shards" $OUT/mamba.txt | tail -12
if [ -f $OUT/mamba/job.yaml ]; then
    CUDA_INJECTION64_PATH=$PWD/$B/libcupti_trace.so BT_CUPTI_OUT=/tmp/mcupti \
        timeout 60 $B/baton run $OUT/mamba/job.yaml --quiet --set train.steps=5 \
        --set metrics.file=/tmp/mcupti.jsonl > $OUT/cupti-run.txt 2>&1; echo "cupti run rc $?"
    csv=$(ls -S /tmp/mcupti.*.csv 2>/dev/null | head -1)
    [ -n "$csv" ] && python3 bench/gpu_profile/summarize.py baton "$csv" --warmup 2 --top 30 > $OUT/mamba-kernels.txt 2>&1
    sed -n 1,12p $OUT/mamba-kernels.txt; grep -E "k_ssd|k_conv|k_gnorm|k_dt" $OUT/mamba-kernels.txt
fi
