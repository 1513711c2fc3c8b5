#!/usr/bin/env bash
# Expert parallelism (bench/RESULTS.md, "Expert dispatch and combine"): the
# fixture MoE model (tests/fixtures/qwen2_moe: 8 experts of width 24, top-2,
# hidden 32, a shared expert, two sparse layers) trained STEPS steps of the
# same global batch at EP=2 (dp=2 ep=2: 4 experts per rank) and EP=4 (dp=4
# ep=4: 2 per rank), each in two modes, run interleaved REPS times
# (EP=2 on, EP=2 off, EP=4 on, EP=4 off, then again), so that a change of
# the machine's load falls on both modes alike:
#   on   as trained: a sparse layer's rows go out and come back in two
#        chunks, every all-to-all started without waiting (model/moe.c
#        MOE_CHUNKS), so one chunk's rows travel while the experts compute
#        the other's;
#   off  the reference: each row all-to-all is waited for as soon as it is
#        started (BATON_BENCH_MOE_SERIAL=1, model_t moe_serial): the same
#        collectives in the same order, the same bits, nothing overlapped.
# The expert parts run in the rank's expert-group actor (train/expert_actor.h)
# in both modes. Per run, from the trace (steps 2..STEPS, averaged over the
# ranks): ms per step that the dispatch all-to-alls (forward rows and
# backward gradients) and the combine ones were in flight (the expert
# group's comm spans), the experts' grouped products (counter moe experts
# ms), the compute thread's time in the exchanges (moe exchange ms: counts,
# staging, waits), overlap = 1 - wait / a2a (counters moe a2a ms and moe
# a2a wait ms: the share of the row all-to-alls' flight time the compute
# thread did not wait for), and the step time (the mean of the metrics'
# step_s, microseconds, over steps 2..STEPS; elapsed_s has only milliseconds).
# Printed per layout and mode: medians over the REPS runs, and the ratios
# (dispatch + combine) / experts and step(off) / step(on), each the median
# of the per-repetition ratios.
#
#   bench/bench_moe.sh [BUILD] [REPS] [STEPS] [MICRO_BATCH] [SEQ]   (defaults: build, 5, 20, 8, 64)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${1:-build}
REPS=${2:-5}
STEPS=${3:-20}
MB=${4:-8}
SEQ=${5:-64}
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

: > "$out/rows.tsv"
for rep in $(seq "$REPS"); do
    for ep in 2 4; do
        for mode in on off; do
            name=ep${ep}_${mode}_$rep
            serial=(); [ "$mode" = off ] && serial=(BATON_BENCH_MOE_SERIAL=1)
            env "${serial[@]}" "$BATON" run "$out/job.yaml" --quiet --set parallel.dp="$ep" --set parallel.ep="$ep" \
                --set trace.dir="$out/$name" --set metrics.file="$out/$name.jsonl" > "$out/$name.log" 2>&1 ||
                { echo "bench_moe: run $name failed:"; tail -5 "$out/$name.log"; exit 1; }
            "$BATON" trace "$out/$name" -o "$out/$name.json" > /dev/null 2>&1
            python3 - "$out/$name.json" "$out/$name.jsonl" "$ep" "$mode" "$rep" >> "$out/rows.tsv" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
counters = {}  # (pid, name) -> values in time order (cumulative per rank)
spans = {}     # (pid, kind) -> total ms in flight over steps >= 2
steps = set()
for e in ev:
    n = e.get("name", "")
    if e.get("ph") == "C":
        key = next((k for k in ("moe exchange ms", "moe experts ms", "moe a2a ms", "moe a2a wait ms")
                    if n.endswith(k)), None)
        if key:
            counters.setdefault((e.get("pid"), key), []).append((e["ts"], e.get("args", {}).get("value", 0)))
    elif e.get("ph") == "X" and e.get("cat") == "comm" and n.startswith("moe "):
        st = e.get("args", {}).get("step", 0)
        if st is None or st < 2: continue
        steps.add(st)
        kind = "dispatch" if "dispatch" in n else "combine"
        k = (e.get("pid"), kind)
        spans[k] = spans.get(k, 0.0) + e.get("dur", 0) * 1e-3
def per_step(name):
    # the mean step-to-step increase of a cumulative counter after step 1
    incs = []
    for (p, n), vals in counters.items():
        if n != name: continue
        vals = [x for _, x in sorted(vals)]
        incs += [b - a for a, b in zip(vals, vals[1:])]
    return sum(incs) / len(incs) if incs else float("nan")
def span_ms(kind):
    v = [t for (p, k), t in spans.items() if k == kind]
    return sum(v) / len(v) / len(steps) if v and steps else float("nan")
recs = [json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l]
ss = [r["step_s"] for r in recs if r["step"] >= 2]
step = sum(ss) / len(ss) * 1e3 if ss else float("nan")
vals = [span_ms("dispatch"), span_ms("combine"), per_step("moe experts ms"), per_step("moe exchange ms"),
        per_step("moe a2a ms"), per_step("moe a2a wait ms"), step]
print("\t".join(sys.argv[3:6] + ["%.6f" % v for v in vals]))
PY
        done
    done
done

python3 - "$out/rows.tsv" <<'PY'
import statistics as st, sys
rows = [l.split("\t") for l in open(sys.argv[1]) if l.strip()]
med = lambda v: st.median(v) if v else float("nan")
data = {}  # (ep, mode) -> rep -> values
for r in rows:
    data.setdefault((int(r[0]), r[1]), {})[int(r[2])] = [float(x) for x in r[3:]]
D, C, X, EX, A, W, S = range(7)
print("%-10s %11s %11s %11s %9s %11s %9s %9s" % ("layout", "dispatch_ms", "combine_ms", "experts_ms",
      "(d+c)/exp", "exchange_ms", "overlap", "step_ms"))
for ep in (2, 4):
    for mode in ("on", "off"):
        reps = data.get((ep, mode), {})
        v = list(reps.values())
        col = lambda i: med([x[i] for x in v])
        ratio = med([(x[D] + x[C]) / x[X] for x in v if x[X] > 0])
        ov = med([1 - x[W] / x[A] for x in v if x[A] > 0])
        print("%-10s %11.3f %11.3f %11.3f %9.1f %11.3f %8.1f%% %9.3f" % ("ep=%d %s" % (ep, mode), col(D), col(C),
              col(X), ratio, col(EX), 100 * ov, col(S)))
    on, off = data.get((ep, "on"), {}), data.get((ep, "off"), {})
    pr = [off[k][S] / on[k][S] for k in on if k in off and on[k][S] > 0]
    pe = [off[k][EX] / on[k][EX] for k in on if k in off and on[k][EX] > 0]
    print("  ep=%d: step off/on %.3f, exchange off/on %.3f (medians of %d interleaved pairs)" %
          (ep, med(pr), med(pe), len(pr)))
PY
