#!/usr/bin/env bash
# Pipeline activations on one GPU: how a pp=2 layout whose two ranks share
# the GPU passes activations, measured against one process training the same
# model on the same GPU in the same run (the reference):
#   1 process        pp=1, the same 8 microbatches of 4 x 1024 tokens per step
#   pp=2 staged      transport.handoff=off: each stage output is copied on a
#                    copy stream into pinned host memory, overlapped with the
#                    next op, and sent as the message payload
#   pp=2 IPC         transport.handoff=auto: CUDA IPC buffers, a
#                    device-to-device copy at the receiver
# A 12-layer model of hidden 1024 (178 M parameters with the 32 k vocabulary),
# bf16, so one activation message is 8 MiB. Each layout runs ROUNDS times,
# interleaved (1, staged, IPC, 1, staged, IPC, ...); tokens/s is over steps
# 3..STEPS of each run's metrics; the medians and the ratios to the one
# process are printed. Needs a GPU (device: cuda).
#
#   bench/bench_pipeline_gpu.sh [BUILD] [STEPS] [ROUNDS]   (defaults: build, 12, 3)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${1:-build}
STEPS=${2:-12}
ROUNDS=${3:-3}
BATON=$BUILD/baton
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/data"
awk 'BEGIN { x = 99; for (i = 0; i < 400000; i++) { x = (x * 1103515245 + 12345) % 2147483648;
       printf "%d ", int(x / 65536) % 32000 } print "" }' > "$out/data/tokens.txt"
cat > "$out/job.yaml" <<YAML
model: {layers: 12, hidden: 1024, heads: 16, kv_heads: 8, ffn: 2816, vocab: 32000, init_std: 0.02}
data: {dir: $out/data, seq_len: 1024, split: 0}
train: {steps: $STEPS, micro_batch: 4, grad_accum: 8, seed: 3, log_every: 1000}
optim: {lr: 0.0003, min_lr: 0.0003, warmup: 0}
device: cuda
dtype: bf16
YAML
rate() { # tokens/s over steps 3..N
    awk '/"loss"/ { t = $0; sub(/.*"tokens": /, "", t); sub(/,.*/, "", t)
                    e = $0; sub(/.*"elapsed_s": /, "", e); sub(/,.*/, "", e); n++
                    if (n == 2) { t0 = t; e0 = e } if (n > 2) { t1 = t; e1 = e } }
         END { if (e1 > e0) printf "%.0f\n", (t1 - t0) / (e1 - e0); else print "nan" }' "$1"
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for r in $(seq "$ROUNDS"); do
    for lay in one staged ipc; do
        sets=()
        case $lay in staged) sets=(--set parallel.pp=2 --set transport.handoff=off) ;;
                     ipc) sets=(--set parallel.pp=2 --set transport.handoff=auto) ;; esac
        "$BATON" run "$out/job.yaml" --quiet "${sets[@]}" --set metrics.file="$out/$lay-$r.jsonl" \
            > "$out/$lay-$r.log" 2>&1 || { echo "bench_pipeline_gpu: $lay run $r failed:"; tail -5 "$out/$lay-$r.log"; exit 1; }
        echo "round $r $lay: $(rate "$out/$lay-$r.jsonl") tokens/s"
    done
done
for lay in one staged ipc; do
    for r in $(seq "$ROUNDS"); do rate "$out/$lay-$r.jsonl"; done | median > "$out/$lay.med"
done
one=$(cat "$out/one.med")
for lay in one staged ipc; do
    awk -v n="$lay" -v v="$(cat "$out/$lay.med")" -v o="$one" \
        'BEGIN { printf "%-8s median %8.0f tokens/s   ratio to one process %.3f\n", n, v, v / o }'
done
