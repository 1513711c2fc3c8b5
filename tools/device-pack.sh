#!/usr/bin/env bash
# Packs the Debian runtime libraries that the binaries built here need and a
# GPU machine may lack (libev, libopenblas, libucx, libssl, ...) into
# build/devpack/ (git-ignored), for tools/device-check.sh to put on
# LD_LIBRARY_PATH there.
#
# It asks ldd which libraries build/baton, build/libbaton_cuda.so,
# build/libbaton_nccl.so and the device tests load, dpkg -S which Debian package owns each, fetches those packages with
# `apt-get download` and unpacks them with `dpkg -x`. Left out: glibc (it
# cannot be swapped through LD_LIBRARY_PATH), the C++ runtime and zlib that
# every system has (Debian 12's libstdc++ needs glibc 2.36, newer than the
# binaries' own 2.34, so packing it would only narrow where they run), and
# the CUDA libraries, which no package owns here and the GPU machine has.
# Only the shared objects are kept, so the pack stays under 64 MiB.
#
# Usage: tools/device-pack.sh            (after `make`; BUILD=build by default)
set -euo pipefail
BUILD=${BUILD:-build}
PACK=$BUILD/devpack
BINS=("$BUILD/baton" "$BUILD/libbaton_cuda.so" "$BUILD/libbaton_nccl.so" "$BUILD/device/test_cuda_ops" "$BUILD/device/test_nccl")
for b in "${BINS[@]}"; do
    [ -x "$b" ] || { echo "device-pack: $b is missing: run make first (with nvcc on PATH)" >&2; exit 1; }
done

pkgs=()
while read -r lib; do
    owner=""
    for path in "$lib" "$(readlink -f "$lib")"; do
        owner=$(dpkg -S "$path" 2>/dev/null | head -1 | cut -d: -f1) && [ -n "$owner" ] && break
    done
    if [ -z "$owner" ]; then
        echo "device-pack: no package owns $lib (left out: the GPU machine must have it)"
        continue
    fi
    case $owner in libc6 | libgcc-s1 | libstdc++6 | zlib1g) continue ;; esac
    pkgs+=("$owner")
done < <(ldd "${BINS[@]}" | awk '/=> \//{print $3}' | sort -u)
mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
echo "device-pack: packages: ${pkgs[*]}"

rm -rf "$PACK"
mkdir -p "$PACK/debs"
(cd "$PACK/debs" && apt-get download "${pkgs[@]}")
for deb in "$PACK"/debs/*.deb; do dpkg -x "$deb" "$PACK/root"; done
rm -rf "$PACK/debs"

# Keep shared objects (and the links to them) only; UCX's transport modules
# stay in ucx/ for UCX_MODULE_DIR. LAPACK and the reference BLAS that come
# with libopenblas0-pthread are not loaded by baton.
LIB=$PACK/root/usr/lib/x86_64-linux-gnu
mkdir -p "$LIB"
if [ -d "$PACK/root/lib/x86_64-linux-gnu" ]; then
    cp -a "$PACK/root/lib/x86_64-linux-gnu/." "$LIB/"
    rm -rf "$PACK/root/lib"
fi
rm -rf "$PACK/root/usr/share" "$PACK/root/etc" "$PACK/root/usr/bin" "$PACK/root/usr/sbin"
find "$LIB" -type d -name cmake -prune -exec rm -rf {} +
find "$LIB" -type d -name pkgconfig -prune -exec rm -rf {} +
rm -f "$LIB"/openblas-pthread/liblapack.so* "$LIB"/openblas-pthread/libblas.so*
# libopenblas.so.0 is an alternatives link on Debian; the pack links it directly
if [ -e "$LIB/openblas-pthread/libopenblas.so.0" ]; then
    ln -sf openblas-pthread/libopenblas.so.0 "$LIB/libopenblas.so.0"
fi

size=$(du -sm "$PACK" | cut -f1)
echo "device-pack: $PACK holds $(find "$LIB" -name '*.so*' | wc -l) shared objects, ${size} MiB"
if [ "$size" -ge 64 ]; then
    echo "device-pack: the pack is over 64 MiB" >&2
    exit 1
fi
# The device tool carries at most 64 MiB with the working tree, so the pack
# also travels as one xz tarball (about 8 MiB); tools/device-session.sh
# unpacks it on the GPU machine when build/devpack itself was not carried.
tar -C "$BUILD" -cJf "$BUILD/devpack.tar.xz" devpack
echo "device-pack: $BUILD/devpack.tar.xz is $(du -m "$BUILD/devpack.tar.xz" | cut -f1) MiB"
