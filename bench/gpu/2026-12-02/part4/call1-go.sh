#!/usr/bin/env bash
# Device call 1 of issue 13 part 4 (one H200). Binaries:
#   build/h14/o  6f69e05, the session's start (scalar elementwise kernels)
#   build/h14/v  6f69e05 + 16-byte vector elementwise, RMSNorm, RoPE, cross-entropy
#                kernels, attention's SPLIT template (BATON_CUDA_ATTN=fast: P and dS
#                rounded to bf16 once)
# 1. the per-op table of v (every section), memcheck of --quick on the changed ops;
# 2. the model check of v; 3. llama134m baton alone: o, v, v fast interleaved, twice;
# 4. the CUPTI per-kernel record of v and of v fast on llama134m.
set -u
H=build/h14
S=/tmp/h14s
mkdir -p "$S"
sum() { echo "$*" | tee -a "$OUT/summary.txt"; }
tar -C $H -xJf $H/devpack.tar.xz
for d in o v; do ln -sfn ../devpack $H/$d/devpack; done
LIB=$PWD/$H/devpack/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$LIB:$LIB/openblas-pthread:$LIB/ucx" UCX_MODULE_DIR=$LIB/ucx
sum "start: $(date -u '+%F %T UTC'); $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader)"
sum "o: $(cat $H/o/BUILD_INFO)"; sum "v: $(cat $H/v/BUILD_INFO)"
# 1
a=$SECONDS
timeout 170 $H/v/device/test_cuda_ops > $OUT/ops.txt 2>&1
sum "ops table (v): rc=$? $((SECONDS - a)) s; $(tail -1 $OUT/ops.txt); FAIL rows: $(grep -c FAIL $OUT/ops.txt)"
grep FAIL $OUT/ops.txt | head -20 | tee -a $OUT/summary.txt
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for f in add rmsnorm rope swiglu xent attention; do
    [ -z "$SAN" ] && break
    a=$SECONDS
    timeout 60 "$SAN" --tool memcheck --report-api-errors no --error-exitcode 3 --leak-check no \
        $H/v/device/test_cuda_ops --quick $f > $S/mc_$f.txt 2>&1
    sum "memcheck --quick $f: rc=$? $((SECONDS - a)) s; $(grep -h 'ERROR SUMMARY' $S/mc_$f.txt | tail -1)"
done
# 2
a=$SECONDS
BUILD=$H/v OUT=$S/model timeout 120 tools/device-model-check.sh > $OUT/model.txt 2>&1
sum "model check (v): rc=$? $((SECONDS - a)) s; $(grep -c PASS $OUT/model.txt) PASS, $(grep -c FAIL $OUT/model.txt) FAIL"
# 3
k=0
for run in o v f o v f; do
    k=$((k + 1)); B=$H/$run; env=""; [ $run = f ] && { B=$H/v; env="BATON_CUDA_ATTN=fast"; }
    env $env OUT=$S/r$k BUILD=$B ROWS=llama134m PYTHON=false BUDGET=60 bench/gpu_bench.sh > $S/r$k.out 2>&1
    sum "llama134m $run: $(grep -h 'llama134m baton' $S/r$k.out)"
    { echo "==== run $k variant $run"; cat $S/r$k.out; cat $S/r$k/metrics.jsonl; } >> $OUT/runs.txt
done
# 4
for run in v f; do
    left=$((480 - SECONDS)); [ $left -lt 40 ] && { sum "cupti $run: skipped, $left s left"; continue; }
    env=""; [ $run = f ] && env="BATON_CUDA_ATTN=fast"
    rm -rf $S/cupti_$run; mkdir -p $S/cupti_$run
    env $env CUDA_INJECTION64_PATH=$PWD/$H/v/libcupti_trace.so BT_CUPTI_OUT=$S/cupti_$run/baton \
        OUT=$S/pb_$run BUILD=$H/v ROWS=llama134m PYTHON=false WARMUP=3 STEPS=5 BUDGET=60 \
        bench/gpu_bench.sh > $S/pb_$run.out 2>&1
    csv=$(ls -S $S/cupti_$run/baton.*.csv 2>/dev/null | head -1)
    sum "cupti $run: $(grep -h 'llama134m baton' $S/pb_$run.out); records: $([ -n "$csv" ] && wc -l < $csv)"
    [ -n "$csv" ] && python3 bench/gpu_profile/summarize.py baton "$csv" --warmup 3 --gemm-tflop 21.53 \
        --peak 800 --top 40 > "$OUT/kernels_$run.txt" 2>&1
done
sum "end: $SECONDS s"
