#!/usr/bin/env bash
# Device call 4 (one H200): the per-op table sections the review's refactor touched
# (one host-side vector check cu_rows_vec, cu_colsum_finish_run, CU_WARP_ROWS), of
# build/h15/m (26cf174's kernels after the refactor; same conditions, same math).
set -u
H=build/h15
tar -C $H -xJf $H/devpack.tar.xz && ln -sfn ../devpack $H/m/devpack
LIB=$PWD/$H/devpack/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$LIB:$LIB/openblas-pthread:$LIB/ucx" UCX_MODULE_DIR=$LIB/ucx
echo "start: $(date -u '+%F %T UTC'); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)" | tee $OUT/summary.txt
for f in rmsnorm rope xent attention; do
    a=$SECONDS
    timeout 100 $H/m/device/test_cuda_ops $f > $OUT/ops_$f.txt 2>&1
    echo "$f: rc=$? $((SECONDS - a)) s; $(grep -c PASS $OUT/ops_$f.txt) PASS, $(grep -c FAIL $OUT/ops_$f.txt) FAIL" | tee -a $OUT/summary.txt
done
