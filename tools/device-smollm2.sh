#!/usr/bin/env bash
# SmolLM2-135M on a GPU against the CPU: the loss on the first 65536 ids of the
# Austen held-out split (data/austen/val.txt, tools/fetch_austen.sh) in windows
# of 1024, as in the README, from the GGUF (tools/fetch_smollm2.sh): cuda fp32
# within 1e-5 of the CPU value, bf16 within 1e-2. SMOLLM2_CPU_LOSS gives the
# CPU value (the CPU result does not depend on the machine or its thread
# count, so it may be measured where the binary was built), else it is
# computed here first. The model may arrive in pieces (the device tool
# carries 64 MiB a call): models/parts/smol.gguf.part* are joined and checked
# against models/parts/smol.gguf.sha256 first.
#
# Prints one row per check like tools/device-model-check.sh; exit 0 when all
# pass or when the model or the text is absent (it says so), 1 otherwise.
set -u
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/device-smollm2}
BATON=$PWD/$BUILD/baton
mkdir -p "$OUT"
. "$(dirname "$0")/device-lib.sh"
smol=${SMOLLM2_GGUF:-models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
# the checksum travels with the last piece: without it the pieces are not all here yet
if [ ! -f "$smol" ] && [ -f models/parts/smol.gguf.sha256 ]; then
    mkdir -p "$(dirname "$smol")"
    cat models/parts/smol.gguf.part* > "$smol.tmp"
    if [ "$(sha256sum "$smol.tmp" | cut -d' ' -f1)" != "$(cat models/parts/smol.gguf.sha256)" ]; then
        echo "device-smollm2: the joined pieces ($(ls models/parts | tr '\n' ' ')) do not match models/parts/smol.gguf.sha256"
        rm -f "$smol.tmp"
        exit 1
    fi
    mv "$smol.tmp" "$smol"
fi
if [ ! -f "$smol" ] || [ ! -f data/austen/val.txt ]; then
    echo "SmolLM2-135M rows not run: no $smol or data/austen/val.txt here"
    exit 0
fi
ev() { "$BATON" eval --model "$smol" --text data/austen/val.txt --window 1024 --max-tokens 65536 --json "$@"; }
cpu=${SMOLLM2_CPU_LOSS:-}
if [ -z "$cpu" ]; then
    cpu=$(field loss "$(ev 2> "$OUT/smollm2_cpu.err")")
    echo "CPU value measured here: $cpu"
fi
for dt in fp32 bf16; do
    tol=1e-5; [ $dt = bf16 ] && tol=1e-2
    t0=$(date +%s.%N)
    got=$(ev --device cuda --dtype $dt 2> "$OUT/smollm2_$dt.err")
    t1=$(date +%s.%N)
    echo "$got" > "$OUT/smollm2_$dt.json"
    row "SmolLM2-135M austen val $dt loss" "$(field loss "$got")" "$cpu" $tol
    awk -v a="$t0" -v b="$t1" -v g="$got" 'BEGIN { printf "  %s (%.1f s wall)\n", g, b - a }'
done
[ $fails -eq 0 ]
