#!/usr/bin/env bash
# Distributed training throughput (bench/RESULTS.md, "Distributed training
# throughput"): the model of the default job (jobs/austen_main.yaml, 14.2 M
# parameters, T = 256) trained for STEPS steps of the same global batch
# (2048 tokens: 8 rows of 256, one row per microbatch as in the job) in
# three layouts, one after the other in this run:
#   1 process            pp=1 dp=1, 8 microbatches (grad_accum 8)
#   PP=2 x DP=2          4 processes, 1F1B, 4 microbatches per replica, ZeRO-1
#   DP=4                 4 processes, 2 microbatches per replica, ZeRO-1
# tokens/s = tokens of steps 2..STEPS / their time, from each run's
# metrics.jsonl (step 1 pays for first-touch allocations). No evaluation.
#
#   bench/bench_dist.sh [BUILD] [STEPS]      (defaults: build, 10)
#
# Needs the token shards of the default job (tools/run-default-job.sh makes
# them; they are committed in data/austen_shards).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${1:-build}
STEPS=${2:-10}
BATON=$BUILD/baton
JOB=jobs/austen_main.yaml
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# tokens/s over steps 2..N of a metrics file (lines with "loss")
rate() {
    awk '/"loss"/ {
        t = $0; sub(/.*"tokens": /, "", t); sub(/,.*/, "", t)
        e = $0; sub(/.*"elapsed_s": /, "", e); sub(/[,}].*/, "", e)
        t += 0; e += 0; n++; if (n == 1) { t1 = t; e1 = e } tl = t; el = e
    } END { if (n < 2 || el <= e1) print "nan"; else printf "%.1f\n", (tl - t1) / (el - e1) }' "$1"
}

run() { # name, --set overrides...
    local name=$1
    shift
    local sets=(--set train.steps="$STEPS" --set optim.warmup=1 --set train.eval_every=0
                --set data.val_dir= --set data.split=0 --set metrics.file="$out/$name.jsonl"
                --set metrics.plot= --set trace.dir= --set train.log_every=1000)
    for kv in "$@"; do sets+=(--set "$kv"); done
    local t0 t1
    t0=$(date +%s.%N)
    if ! "$BATON" run "$JOB" "${sets[@]}" >"$out/$name.log" 2>&1; then
        echo "bench_dist: $name failed:" >&2
        tail -n 5 "$out/$name.log" >&2
        exit 1
    fi
    t1=$(date +%s.%N)
    echo "$name $(rate "$out/$name.jsonl") $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')" >>"$out/results"
}

echo "bench_dist: $JOB, $STEPS steps x 2048 tokens per layout; $(nproc) cores ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n1)); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
# run() is not called in $(...): the EXIT trap would remove $out in the subshell
run one_process parallel.pp=1 parallel.dp=1 parallel.split=[] parallel.zero1=false train.grad_accum=8
run pp2_dp2 parallel.pp=2 parallel.dp=2 train.grad_accum=4
run dp4 parallel.pp=1 parallel.dp=4 parallel.split=[] train.grad_accum=2
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
base=$(awk 'NR == 1 { print $2 }' "$out/results")
printf '%-14s %12s %8s %10s\n' layout "tokens/s" ratio "wall_s"
while read -r r; do
    set -- $r
    printf '%-14s %12s %8s %10s\n' "$1" "$2" "$(awk -v a="$2" -v b="$base" 'BEGIN { printf "%.2fx", a / b }')" "$3"
done <"$out/results"
