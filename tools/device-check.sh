#!/usr/bin/env bash
# Checks the CUDA backend on a GPU machine, with binaries built elsewhere.
#
# Run from the repository root of a copy of the tree that holds
# build/baton, build/libbaton_cuda.so, build/device/test_cuda_ops and build/devpack/ (made by
# tools/device-pack.sh on the build machine). Prints the GPU (nvidia-smi),
# the libraries the binaries load and their versions, runs the device test
# (its table of ops x dtypes x shapes), and runs it again on the small shapes
# under compute-sanitizer's memcheck when compute-sanitizer is found.
# Copies of the outputs go to $OUT (default /tmp/device-check).
#
# Exit status: 0 all passed; 1 a test or memcheck failed or a library is
# missing; 2 no usable GPU here (the test says why).
set -u
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/device-check}
TEST=$BUILD/device/test_cuda_ops
mkdir -p "$OUT"
rc=0
section() { printf '\n== %s\n' "$*"; }

LIB=$PWD/$BUILD/devpack/root/usr/lib/x86_64-linux-gnu
if [ -d "$LIB" ]; then
    export LD_LIBRARY_PATH="$LIB:$LIB/openblas-pthread:$LIB/ucx${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export UCX_MODULE_DIR=$LIB/ucx
else
    echo "device-check: no $BUILD/devpack (run tools/device-pack.sh where the binaries were built)"
fi

section "nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi 2>&1 | tee "$OUT/nvidia-smi.txt"
else echo "nvidia-smi not found"; fi

section "libraries (ldd)"
for b in "$BUILD/baton" "$BUILD/libbaton_cuda.so" "$TEST"; do
    if [ ! -x "$b" ]; then echo "device-check: $b is missing"; exit 1; fi
    echo "$b:"
    ldd "$b" | sed 's/^/  /'
    if ldd "$b" | grep -q 'not found'; then echo "device-check: $b misses libraries (above)"; rc=1; fi
done

section "library versions"
echo "  $(ldd --version 2>&1 | head -1) (the binaries need glibc 2.34 or newer)"
# the file each soname resolves to carries the full version (libcublasLt.so.13.1.0.3)
for so in libcudart.so libcublasLt.so libcudnn.so libnccl.so libcuda.so; do
    path=$(ldd "$TEST" | awk -v s="$so" 'index($1, s) == 1 {print $3}' | head -1)
    [ -z "$path" ] && path=$(ldconfig -p 2>/dev/null | awk -v s="$so" 'index($1, s) == 1 {print $NF}' | head -1)
    if [ -n "$path" ]; then echo "  $so -> $(readlink -f "$path")"; else echo "  $so: not found"; fi
done
for h in /usr/local/cuda*/include/cudnn_version.h /usr/include/cudnn_version.h; do
    [ -f "$h" ] && echo "  $h: cudnn $(awk '/#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) /{printf "%s.", $3}' "$h" | sed 's/\.$//')"
done
for h in /usr/local/cuda*/include/nccl.h /usr/include/nccl.h; do
    [ -f "$h" ] && echo "  $h: nccl $(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{printf "%s.", $3}' "$h" | sed 's/\.$//')"
done
[ $rc -ne 0 ] && exit $rc

section "$TEST"
"$TEST" 2>&1 | tee "$OUT/test_cuda_ops.txt"
trc=${PIPESTATUS[0]}
if [ "$trc" -eq 2 ]; then
    echo "device-check: no usable GPU here (see the reason above)"
    exit 2
fi
[ "$trc" -ne 0 ] && rc=1

section "compute-sanitizer memcheck ($TEST --quick)"
san=$(command -v compute-sanitizer 2>/dev/null || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$san" ]; then
    # the error-path rows fail CUDA calls on purpose (1 PiB allocations): API
    # errors are theirs, memory errors would be ours
    "$san" --tool memcheck --report-api-errors no --error-exitcode 3 --leak-check no "$TEST" --quick 2>&1 | tee "$OUT/memcheck.txt"
    src=${PIPESTATUS[0]}
    if [ "$src" -ne 0 ]; then echo "device-check: memcheck run failed (exit $src)"; rc=1; fi
else
    echo "compute-sanitizer not found (looked on PATH and in /usr/local/cuda*/bin): skipped"
fi

section "result"
[ $rc -eq 0 ] && echo "device-check: all passed" || echo "device-check: FAILED"
exit $rc
