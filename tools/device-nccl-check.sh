#!/usr/bin/env bash
# Checks the nccl collective backend on a GPU machine, with binaries built
# elsewhere (like tools/device-check.sh).
#
# Run from the repository root of a copy of the tree that holds
# build/libbaton_nccl.so, build/libbaton_cuda.so, build/device/test_nccl and
# build/devpack/ (tools/device-pack.sh). Prints the GPUs and the NCCL the
# library resolves to, then runs build/device/test_nccl with NVLink
# multicast off (NCCL_NVLS_ENABLE=0, as baton sets it in every process) and
# NCCL's warnings on: one-rank communicators created non-blocking, every
# collective in f32 and bf16 against the host's result, the watchdog's
# abort of a call stuck past the step timeout and of an init whose peer
# never joins (docs/PARALLEL.md "Collective backends"). Copies of the
# outputs go to $OUT (default /tmp/device-nccl-check).
#
# Exit status: 0 all passed; 1 a row failed or a library is missing; 2 no
# usable GPU here.
set -u
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/device-nccl-check}
TEST=$BUILD/device/test_nccl
mkdir -p "$OUT"
section() { printf '\n== %s\n' "$*"; }

. "$(dirname "$0")/device-lib.sh" # the devpack's libraries on the library path
[ -d "$LIB" ] || echo "device-nccl-check: no $BUILD/devpack (run tools/device-pack.sh where the binaries were built)"
export NCCL_NVLS_ENABLE=0
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

section "nvidia-smi -L"
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L 2>&1 | tee "$OUT/gpus.txt"
else echo "nvidia-smi not found"; fi

section "libraries (ldd)"
rc=0
for b in "$BUILD/libbaton_nccl.so" "$BUILD/libbaton_cuda.so" "$TEST"; do
    if [ ! -e "$b" ]; then echo "device-nccl-check: $b is missing"; exit 1; fi
    echo "$b:"
    ldd "$b" | sed 's/^/  /'
    if ldd "$b" | grep -q 'not found'; then echo "device-nccl-check: $b misses libraries (above)"; rc=1; fi
done
path=$(ldd "$BUILD/libbaton_nccl.so" | awk 'index($1, "libnccl.so") == 1 {print $3}' | head -1)
echo "  libnccl.so -> ${path:+$(readlink -f "$path")}"
[ $rc -ne 0 ] && exit $rc

section "$TEST"
start=$(date +%s)
timeout 120 "$TEST" 2>&1 | tee "$OUT/test_nccl.txt"
trc=${PIPESTATUS[0]}
echo "(${trc}: $(( $(date +%s) - start )) s)"
if [ "$trc" -eq 2 ]; then echo "device-nccl-check: no usable GPU here (see the reason above)"; exit 2; fi
if [ "$trc" -eq 124 ]; then echo "device-nccl-check: the test hung (killed after 120 s)"; trc=1; fi

section "result"
[ "$trc" -eq 0 ] && echo "device-nccl-check: all passed" || echo "device-nccl-check: FAILED"
[ "$trc" -eq 0 ]
