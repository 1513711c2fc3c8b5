#!/usr/bin/env bash
# Second device call (issue 13, part 3). Binaries, each a git archive of its commit:
#   build/h13/a  baa5f55  head chunks only
#   build/h13    c6d074b  + overwrite (_set) ops
#   build/h13/n  f773db4  + one sum of squares over the gradient block (lib of c)
#   build/h13/c  0860fc2  + one clip scale of the block; test_cuda_ops with the _set fix
set -u
H=build/h13
S=/tmp/h13s
mkdir -p "$S"
sum() { echo "$*" | tee -a "$OUT/summary2.txt"; }
tar -C $H -xJf $H/devpack.tar.xz
for d in a c n; do ln -sfn ../devpack $H/$d/devpack; done
ln -sfn ../c/libbaton_cuda.so $H/n/libbaton_cuda.so
sum "start: $(date -u '+%F %T UTC'); $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader)"
LIB=$PWD/$H/devpack/root/usr/lib/x86_64-linux-gnu
# 1. the per-op table of 0860fc2 (no memcheck: call 1 ran it on the _set kernels, 0 errors)
a=$SECONDS
LD_LIBRARY_PATH="$LIB:$LIB/openblas-pthread:$LIB/ucx" UCX_MODULE_DIR=$LIB/ucx timeout 150 \
    $H/c/device/test_cuda_ops > $OUT/ops2.txt 2>&1
sum "ops table (0860fc2): rc=$? $((SECONDS - a)) s; $(tail -1 $OUT/ops2.txt); FAIL rows: $(grep -c FAIL $OUT/ops2.txt)"
# 2. the model check of 0860fc2
a=$SECONDS
BUILD=$H/c OUT=$S/model timeout 120 tools/device-model-check.sh > $OUT/model2.txt 2>&1
sum "model check (0860fc2): rc=$? $((SECONDS - a)) s; $(grep -c PASS $OUT/model2.txt) PASS, $(grep -c FAIL $OUT/model2.txt) FAIL"
# 3. llama134m, baton alone, each variant, interleaved, twice
k=0
for v in a b n c c n b a; do
    k=$((k + 1)); B=$H/$v; [ $v = b ] && B=$H
    OUT=$S/r$k BUILD=$B ROWS=llama134m PYTHON=false BUDGET=60 bench/gpu_bench.sh > $S/r$k.out 2>&1
    sum "llama134m $v ($(cat $B/BUILD_INFO | sed 's/.*commit \([0-9a-f]*\).*/\1/')): $(grep -h 'llama134m baton' $S/r$k.out)"
    { echo "==== run $k variant $v"; cat $S/r$k.out; cat $S/r$k/metrics.jsonl; } >> $OUT/runs2.txt
done
# 4. the other rows with 0860fc2, baton alone, while the call has time
for row in smollm2 llama1b; do
    left=$((430 - SECONDS)); [ $left -lt 70 ] && { sum "$row: skipped, $left s left"; continue; }
    OUT=$S/$row BUILD=$H/c ROWS=$row PYTHON=false BUDGET=$left bench/gpu_bench.sh > $S/$row.out 2>&1
    sum "$row c (0860fc2): $(grep -h "$row baton" $S/$row.out)"
    { echo "==== $row"; cat $S/$row.out; cat $S/$row/metrics.jsonl; } >> $OUT/runs2.txt
done
sum "end: $((SECONDS)) s"
