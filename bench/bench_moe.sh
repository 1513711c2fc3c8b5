#!/usr/bin/env bash
# Expert parallelism (bench/RESULTS.md, "Expert dispatch and combine"): the
# fixture MoE model (tests/fixtures/qwen2_moe: 8 experts of width 24, top-2,
# hidden 32, a shared expert, two sparse layers) trained STEPS steps of the
# same global batch in each layout, one after the other in this run:
#   dp=2 ep=1   the experts replicated on both ranks (no exchange)
#   dp=2 ep=2   4 experts per rank, tokens exchanged between the two
#   dp=4 ep=1   the experts replicated on four ranks
#   dp=4 ep=4   2 experts per rank, tokens exchanged among the four
# Per layout, from the trace counters the stage writes after every step
# (model_t moe_exchange_ns / moe_expert_ns, train/stage_actor.c), averaged
# over ranks and steps 2..STEPS: ms per step in the EP exchanges (the count
# all-to-all and the row all-to-alls of dispatch and combine, forward and
# backward, host staging included) and in the experts' grouped products
# (forward and backward), the step time (metrics elapsed_s) and the
# exchanges' share; then the overlap (model_t moe_a2a_ns / moe_a2a_wait_ns):
# a layer's rows go out and come back in two chunks of tokens, each
# all-to-all started without waiting (model/moe.c MOE_CHUNKS), so one
# chunk's rows travel while the experts compute the other's. a2a_ms is the
# time the row all-to-alls were in flight, wait_ms the part of it the
# compute thread waited, overlap = 1 - wait / a2a the share of the
# all-to-all time hidden behind compute. (exchange_ms is the compute
# thread's time in the exchanges: the count all-to-alls, staging, waits.)
#
#   bench/bench_moe.sh [BUILD] [STEPS] [MICRO_BATCH] [SEQ]   (defaults: build, 20, 8, 64)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${1:-build}
STEPS=${2:-20}
MB=${3:-8}
SEQ=${4:-64}
BATON=$BUILD/baton
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# a longer token stream than the fixture's: the fixture's ids repeated
for _ in $(seq 40); do cat tests/fixtures/train_llama/tokens.txt; echo; done > "$out/tokens.txt"
mkdir -p "$out/data" && mv "$out/tokens.txt" "$out/data/"
cat > "$out/job.yaml" <<YAML
model: {hf: tests/fixtures/qwen2_moe}
data: {dir: $out/data, seq_len: $SEQ, split: 0}
train: {steps: $STEPS, micro_batch: $MB, grad_accum: 1, seed: 1, log_every: 1000}
optim: {lr: 0.001, min_lr: 0.0001, warmup: 1}
YAML

printf '%-12s %12s %12s %12s %10s %10s %10s %8s\n' layout exchange_ms experts_ms step_ms exch_share \
    a2a_ms wait_ms overlap
for layout in "2 1" "2 2" "4 1" "4 4"; do
    set -- $layout
    name=dp$1_ep$2
    "$BATON" run "$out/job.yaml" --quiet --set parallel.dp="$1" --set parallel.ep="$2" \
        --set trace.dir="$out/$name" --set metrics.file="$out/$name.jsonl" > "$out/$name.log" 2>&1
    "$BATON" trace "$out/$name" -o "$out/$name.json" > /dev/null
    python3 - "$out/$name.json" "$out/$name.jsonl" "$name" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
series = {}  # (track, counter) -> values in time order
for e in ev:
    # counters are named after the stage's track: "stage r0 ... moe exchange ms"
    n = e.get("name", "")
    key = next((k for k in ("moe exchange ms", "moe experts ms", "moe a2a ms", "moe a2a wait ms")
                if n.endswith(k)), None)
    if e.get("ph") == "C" and key:
        series.setdefault((e.get("pid"), n, key), []).append((e["ts"], e.get("args", {}).get("value", 0)))
def per_step(name):
    # counters are cumulative per rank: the mean step-to-step increase after step 1
    incs = []
    for (p, t, n), vals in series.items():
        if n != name: continue
        vals = [x for _, x in sorted(vals)]
        incs += [b - a for a, b in zip(vals, vals[1:])]
    return sum(incs) / len(incs) if incs else 0.0
el = [json.loads(l)["elapsed_s"] for l in open(sys.argv[2]) if '"loss"' in l]
step = (el[-1] - el[0]) / (len(el) - 1) * 1e3 if len(el) > 1 else float("nan")
ex, co = per_step("moe exchange ms"), per_step("moe experts ms")
a2a, wait = per_step("moe a2a ms"), per_step("moe a2a wait ms")
share = ex / step if step > 0 else float("nan")
ov = "%7.1f%%" % (100 * (1 - wait / a2a)) if a2a > 0 else "%8s" % "-"
print("%-12s %12.3f %12.3f %12.3f %9.1f%% %10.3f %10.3f %s" % (sys.argv[3], ex, co, step, 100 * share,
                                                               a2a, wait, ov))
PY
done
