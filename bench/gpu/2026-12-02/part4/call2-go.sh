#!/usr/bin/env bash
# Device call 2 of issue 13 part 4 (one H200). Binaries:
#   build/h14/v  call 1's (vector kernels, BATON_CUDA_ATTN=fast: bf16 P and dS)
#   build/h14/w  v + the fast path's dQ fused into the dK/dV kernel (float2 atomics
#                into an f32 accumulator) and a vectorised delta kernel
# 1. w's per-op table, attention and add sections; memcheck --quick attention;
# 2. w's model check under BATON_CUDA_ATTN=fast;
# 3. llama134m baton alone, fast: v, w interleaved, twice;
# 4. bench/gpu_bench.sh llama134m with torch (both attention variants of w);
# 5. the CUPTI per-kernel record of w fast.
set -u
H=build/h14
S=/tmp/h14s2
mkdir -p "$S"
sum() { echo "$*" | tee -a "$OUT/summary.txt"; }
tar -C $H -xJf $H/devpack.tar.xz
for d in v w; do ln -sfn ../devpack $H/$d/devpack; done
LIB=$PWD/$H/devpack/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$LIB:$LIB/openblas-pthread:$LIB/ucx" UCX_MODULE_DIR=$LIB/ucx
sum "start: $(date -u '+%F %T UTC'); $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader)"
sum "v: $(cat $H/v/BUILD_INFO)"; sum "w: $(cat $H/w/BUILD_INFO)"
# 1
a=$SECONDS
{ timeout 100 $H/w/device/test_cuda_ops attention; timeout 30 $H/w/device/test_cuda_ops add; } > $OUT/ops.txt 2>&1
sum "ops table (w) attention+add: $((SECONDS - a)) s; $(grep -c PASS $OUT/ops.txt) PASS, $(grep -c FAIL $OUT/ops.txt) FAIL"
grep FAIL $OUT/ops.txt | head -20 | tee -a $OUT/summary.txt
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$SAN" ]; then
    a=$SECONDS
    timeout 90 "$SAN" --tool memcheck --report-api-errors no --error-exitcode 3 --leak-check no \
        $H/w/device/test_cuda_ops --quick attention > $S/mc.txt 2>&1
    sum "memcheck --quick attention (w): rc=$? $((SECONDS - a)) s; $(grep -h 'ERROR SUMMARY' $S/mc.txt | tail -1); $(grep -c PASS $S/mc.txt) PASS $(grep -c FAIL $S/mc.txt) FAIL"
fi
# 2
a=$SECONDS
BATON_CUDA_ATTN=fast BUILD=$H/w OUT=$S/model timeout 120 tools/device-model-check.sh > $OUT/model.txt 2>&1
sum "model check (w, fast): rc=$? $((SECONDS - a)) s; $(grep -c PASS $OUT/model.txt) PASS, $(grep -c FAIL $OUT/model.txt) FAIL"
grep FAIL $OUT/model.txt | head | tee -a $OUT/summary.txt
# 3
k=0
for run in v w w v; do
    k=$((k + 1))
    OUT=$S/r$k BUILD=$H/$run ROWS=llama134m ATTN=fast PYTHON=false BUDGET=60 bench/gpu_bench.sh > $S/r$k.out 2>&1
    sum "llama134m fast $run: $(grep -h 'llama134m b-fast' $S/r$k.out)"
    { echo "==== run $k variant $run"; cat $S/r$k.out; } >> $OUT/runs.txt
done
# 4
a=$SECONDS
OUT=$S/bench BUILD=$H/w ROWS=llama134m BUDGET=$((440 - SECONDS)) bench/gpu_bench.sh > $S/bench.out 2>&1
sum "gpu_bench llama134m (w): rc=$? $((SECONDS - a)) s"
{ cat $S/bench/table.txt; echo "==== versions"; cat $S/bench/versions.txt; echo "==== logs"; cat $S/bench/logs.txt; echo "==== results"; cat $S/bench/results.jsonl; } > $OUT/bench.txt
cat $S/bench/table.txt | tee -a $OUT/summary.txt
# 5
left=$((520 - SECONDS))
if [ $left -gt 40 ]; then
    rm -rf $S/cupti; mkdir -p $S/cupti
    BATON_CUDA_ATTN=fast CUDA_INJECTION64_PATH=$PWD/$H/w/libcupti_trace.so BT_CUPTI_OUT=$S/cupti/baton \
        OUT=$S/pb BUILD=$H/w ROWS=llama134m ATTN=fast PYTHON=false WARMUP=3 STEPS=5 BUDGET=60 \
        bench/gpu_bench.sh > $S/pb.out 2>&1
    csv=$(ls -S $S/cupti/baton.*.csv 2>/dev/null | head -1)
    sum "cupti w fast: $(grep -h 'llama134m b-fast' $S/pb.out)"
    [ -n "$csv" ] && python3 bench/gpu_profile/summarize.py baton "$csv" --warmup 3 --gemm-tflop 21.53 \
        --peak 800 --top 40 > "$OUT/kernels_w_fast.txt" 2>&1
else
    sum "cupti: skipped, $left s left"
fi
sum "end: $SECONDS s"
