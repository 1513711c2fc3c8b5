#!/usr/bin/env bash
# One device-tool call's worth of GPU checks. PARTS picks them (default: the
# first three), in this order:
#   ops      the per-op table (tools/device-check.sh)
#   model    the model check (tools/device-model-check.sh; its SmolLM2 rows
#            run when the model is here)
#   austen   jobs/austen_gpu.yaml in bf16 and fp32 under /usr/bin/time
#   smollm2  tools/device-smollm2.sh on its own, then jobs/smollm2_finetune_gpu.yaml
# Outputs go under $OUT (the device tool brings them back).
# Needs build/baton, build/libbaton_cuda.so, build/device/test_cuda_ops,
# build/devpack (or its tarball build/devpack.tar.xz) carried along, and for
# the jobs data/austen_shards, models/ and runs/smollm2_gpu/data.
set -u
PARTS=${PARTS:-ops model austen}
OUT=${OUT:-/tmp/device-session}
mkdir -p "$OUT"
if [ ! -d build/devpack ] && [ -f build/devpack.tar.xz ]; then
    tar -C build -xJf build/devpack.tar.xz
fi
LIB=$PWD/build/devpack/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$LIB:$LIB/openblas-pthread:$LIB/ucx${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULE_DIR=$LIB/ucx
rc=0
has() { [[ " $PARTS " == *" $1 "* ]]; }
if has ops; then
    OUT=$OUT/ops tools/device-check.sh > "$OUT/device-check.txt" 2>&1 || rc=1
    tail -5 "$OUT/device-check.txt"
fi
if has model; then
    OUT=$OUT/model tools/device-model-check.sh > "$OUT/model-check.txt" 2>&1 || rc=1
    cat "$OUT/model-check.txt"
fi
timed_job() { # NAME JOB [--set ...]: the job under /usr/bin/time, its metrics and plot in $OUT
    local name=$1 job=$2; shift 2
    /usr/bin/time -v build/baton run "$job" "$@" --set metrics.file="$OUT/$name.jsonl" \
        --set metrics.plot="$OUT/$name.png" > "$OUT/$name.log" 2>&1 || rc=1
    grep -E '^step .*(/| SKIPPED)|val loss|final validation|Elapsed|Maximum resident' "$OUT/$name.log" | tail -8
}
if has austen && [ -d data/austen_shards/train ]; then
    for dt in bf16 fp32; do timed_job "austen_$dt" jobs/austen_gpu.yaml --set dtype=$dt; done
fi
if has smollm2; then
    OUT=$OUT/smollm2 tools/device-smollm2.sh > "$OUT/smollm2-check.txt" 2>&1 || rc=1
    cat "$OUT/smollm2-check.txt"
    if [ -d runs/smollm2_gpu/data/train ]; then timed_job smollm2_finetune jobs/smollm2_finetune_gpu.yaml; fi
fi
exit $rc
