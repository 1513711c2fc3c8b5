#!/usr/bin/env bash
# Device call of 3 Dec 2026 (session 8, call G): the chunked Mamba2 CUDA
# kernels (kernels/cuda/mamba.cu rewritten as tile products), binaries in
# build/h1x/g (carried).
#   - the Mamba2 op rows (test_cuda_ops mamba: f32, bf16, bf16 with f32 grads)
#   - compute-sanitizer memcheck of the same rows (--quick)
#   - tools/device-mamba.sh at its default size (4 layers, hidden 2048, T 2048,
#     2 rows), then once more under the CUPTI recorder for a per-kernel table
set -u
B=${B:-build/h1x/g}
tar -C $B -xJf $B/devpack.tar.xz
BUILD=$B; . tools/device-lib.sh
cat $B/BUILD_INFO
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
timeout 150 $B/device/test_cuda_ops mamba > $OUT/ops-mamba.txt 2>&1; echo "ops mamba rc $?"
echo "pass rows: $(grep -c " PASS" $OUT/ops-mamba.txt)"; grep -E "FAIL" $OUT/ops-mamba.txt | head -20; tail -3 $OUT/ops-mamba.txt
san=$(command -v compute-sanitizer 2>/dev/null || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$san" ]; then
    timeout 120 "$san" --tool memcheck --error-exitcode 9 $B/device/test_cuda_ops --quick mamba > $OUT/memcheck.txt 2>&1
    echo "memcheck rc $?"; grep -E "ERROR SUMMARY|Invalid" $OUT/memcheck.txt | head -5
fi
BUILD=$B OUT=$OUT/mamba timeout 300 tools/device-mamba.sh > $OUT/mamba.txt 2>&1; echo "mamba rc $?"
grep -v "Writing model shards" $OUT/mamba.txt | tail -14
if [ -f $OUT/mamba/job.yaml ]; then
    CUDA_INJECTION64_PATH=$PWD/$B/libcupti_trace.so BT_CUPTI_OUT=/tmp/mcupti \
        timeout 120 $B/baton run $OUT/mamba/job.yaml --quiet --set train.steps=5 \
        --set metrics.file=/tmp/mcupti.jsonl > $OUT/cupti-run.txt 2>&1; echo "cupti run rc $?"
    csv=$(ls -S /tmp/mcupti.*.csv 2>/dev/null | head -1)
    [ -n "$csv" ] && python3 bench/gpu_profile/summarize.py baton "$csv" --warmup 2 --top 40 > $OUT/mamba-kernels.txt 2>&1
    head -50 $OUT/mamba-kernels.txt
fi
