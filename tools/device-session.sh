#!/usr/bin/env bash
# One device-tool call's worth of GPU checks, in order: the per-op table
# (tools/device-check.sh), the model check (tools/device-model-check.sh),
# then the default GPU job (jobs/austen_gpu.yaml) in bf16 and fp32 under
# /usr/bin/time. Outputs go under $OUT (the device tool brings them back).
# Needs build/baton, build/libbaton_cuda.so, build/device/test_cuda_ops,
# build/devpack (or its tarball build/devpack.tar.xz) and data/austen_shards
# carried along.
set -u
if [ ! -d build/devpack ] && [ -f build/devpack.tar.xz ]; then
    tar -C build -xJf build/devpack.tar.xz
fi
OUT=${OUT:-/tmp/device-session}
mkdir -p "$OUT"
LIB=$PWD/build/devpack/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$LIB:$LIB/openblas-pthread:$LIB/ucx${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULE_DIR=$LIB/ucx
rc=0
OUT=$OUT/ops tools/device-check.sh > "$OUT/device-check.txt" 2>&1 || rc=1
tail -5 "$OUT/device-check.txt"
OUT=$OUT/model tools/device-model-check.sh > "$OUT/model-check.txt" 2>&1 || rc=1
cat "$OUT/model-check.txt"
if [ -d data/austen_shards/train ]; then
    for dt in bf16 fp32; do
        /usr/bin/time -v build/baton run jobs/austen_gpu.yaml --set dtype=$dt \
            --set metrics.file="$OUT/austen_$dt.jsonl" --set metrics.plot="$OUT/austen_$dt.png" \
            > "$OUT/austen_$dt.log" 2>&1 || rc=1
        grep -E 'step +300|val|tok/s|Elapsed|Maximum resident' "$OUT/austen_$dt.log" | tail -6
    done
fi
exit $rc
