#!/usr/bin/env bash
# The training stall a checkpoint save causes, on the `make run` job
# (jobs/austen_main.yaml: pp=2 x dp=2 ZeRO-1, 14.2 M parameters; its data as
# tools/run-default-job.sh prepares it). ROUNDS (default 3) interleaved pairs
# of STEPS-step runs (default 24, evaluation off): without checkpoints, and with
# a save after every SAVE_EVERY-th step (default 2). Step times from the
# metrics' elapsed_s. Two numbers per save, as shares of a step:
#   stall     what training waits for: each rank's copy of its state to the
#             host before the next step (the ranks' debug lines "copied to the
#             host in X ms"; the slowest rank of each save, median over saves)
#   overhead  what the save costs training in all while its writers work
#             beside it: the median time of the steps that follow a save minus
#             the median of the other steps of the same runs (on a machine whose
#             cores all train, the writers' copies into the page cache, hashing
#             and the kernel's writeback compete with the compute threads)
set -u
BATON=${BATON:-build/baton}
rounds=${ROUNDS:-3}
steps=${STEPS:-24}
every=${SAVE_EVERY:-2}
job=jobs/austen_main.yaml
[ -s data/austen_shards/train/index.json ] || { echo "stall: no data/austen_shards (tools/run-default-job.sh prepares it)"; exit 1; }
work=$(mktemp -d /tmp/bench_stall.XXXXXX)
trap 'rm -rf "$work"' EXIT
for r in $(seq 1 "$rounds"); do
    for mode in off on; do
        sets=(--set train.steps="$steps" --set train.eval_every=0 --set metrics.file="$work/$mode.$r.jsonl"
              --set metrics.plot= --set trace.dir= --set export.dir=)
        [ $mode = on ] && sets+=(--set checkpoint.dir="$work/ck.$r" --set checkpoint.every="$every" --set checkpoint.keep=2)
        log=info
        [ $mode = on ] && log=debug
        BATON_LOG=$log "$BATON" run "$job" --quiet "${sets[@]}" > "$work/$mode.$r.out" 2>&1 || { echo "stall: run failed"; tail -3 "$work/$mode.$r.out"; exit 1; }
        rm -rf "$work/ck.$r"
    done
done
python3 - "$work" "$rounds" "$every" <<'PY'
import json, re, statistics, sys
work, rounds, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
copies = {}
for r in range(1, rounds + 1):
    for line in open(f"{work}/on.{r}.out"):
        m = re.search(r"checkpoint of step (\d+): [0-9.]+ MB copied to the host in ([0-9.]+) ms", line)
        if m: copies.setdefault((r, int(m.group(1))), []).append(float(m.group(2)))
per_save = sorted(max(v) for v in copies.values())
def steps(p):
    rows = [json.loads(l) for l in open(p) if '"loss"' in l]
    t = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])]
    return [(rows[i + 1]["step"], t[i]) for i in range(len(t))]
off, after, other = [], [], []
for r in range(1, rounds + 1):
    off += [t for s, t in steps(f"{work}/off.{r}.jsonl")]
    for s, t in steps(f"{work}/on.{r}.jsonl"):
        (after if (s - 1) % every == 0 else other).append(t)
med = statistics.median
m_off, m_after, m_other = med(off), med(after), med(other)
stall = m_after - m_other
print(f"make-run job, save every {every} steps: median step {m_off * 1e3:.1f} ms without checkpoints, "
      f"{m_other * 1e3:.1f} ms between saves, {m_after * 1e3:.1f} ms right after a save")
snap = med(per_save) if per_save else float("nan")
print(f"stall per save (training waits for the host copy; slowest rank, median of {len(per_save)} saves, "
      f"the slowest, a first save into fresh pages: {max(per_save) if per_save else float('nan'):.1f} ms): {snap:.1f} ms = "
      f"{snap / 1e3 / m_other * 100:.1f}% of a step (target <= 5%)")
print(f"overhead per save (the step after a save, against the others): {stall * 1e3:.1f} ms = "
      f"{stall / m_other * 100:.1f}% of a step; all steps with saves / without: {med(after + other) / m_off:.3f}")
PY
