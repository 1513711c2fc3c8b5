#!/usr/bin/env bash
# Fetch the cuDNN frontend's headers (header-only C++, MIT and Apache-2.0 licences; fetched, never committed) that
# kernels/cuda/dnn.cu builds cuDNN's SDPA graphs with, into
# third_party/cudnn-frontend/include. PyPI's nvidia-cudnn-frontend wheel
# carries them; the version and the wheel's sha256 are pinned here. Only where
# nvcc is on PATH; without the headers (no network, say) the CUDA backend is
# built without cuDNN attention and says so when asked for it.
set -euo pipefail
cd "$(dirname "$0")/.."
VER=1.32.0
WHEEL=nvidia_cudnn_frontend-$VER-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
SHA=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
DEST=third_party/cudnn-frontend
command -v nvcc >/dev/null 2>&1 || exit 0
[ -f "$DEST/VERSION" ] && [ "$(cat "$DEST/VERSION")" = "$VER" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip download --quiet --no-deps --only-binary :all: --implementation cp \
        --python-version 311 --abi cp311 --platform manylinux_2_28_x86_64 \
        -d "$tmp" "nvidia-cudnn-frontend==$VER" >"$tmp/log" 2>&1; then
    echo "fetch-cudnn-frontend: cannot download nvidia-cudnn-frontend $VER (the CUDA backend builds without cuDNN attention):" >&2
    tail -3 "$tmp/log" >&2
    exit 0
fi
got=$(sha256sum "$tmp/$WHEEL" | cut -d' ' -f1)
if [ "$got" != "$SHA" ]; then
    echo "fetch-cudnn-frontend: $WHEEL has sha256 $got, expected $SHA; not used" >&2
    exit 1
fi
rm -rf "$DEST"
mkdir -p "$DEST"
python3 - "$tmp/$WHEEL" "$DEST" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for n in z.namelist():
        if n.startswith("include/") or n.endswith("LICENSE.txt") or n.endswith("LICENSE"):
            z.extract(n, sys.argv[2])
PY
echo "$VER" > "$DEST/VERSION"
echo "fetch-cudnn-frontend: headers of cuDNN frontend $VER in $DEST/include"
