#!/usr/bin/env bash
# Latency of the whole actor path, repeated (bench/RESULTS.md, "baton bench
# transport"): RUNS runs of `baton bench transport --transport T --sizes ''
# --json` per transport, each with its own same-run reference, and the
# medians over the runs of: one-way average and p50 latency, the reference's
# one-way latency and the ratio avg/reference. One run on a shared 2-core
# machine says little; the median of several says what the code does.
#
#   bench/bench_latency.sh [RUNS] [TRANSPORTS...]   (defaults: 7, inproc tcp ucx)
#
# Extra arguments for every run go in BENCH_ARGS (e.g. "--iters 50000").
# The environment passes through: UCX_TLS=tcp bench/bench_latency.sh 5 ucx
# measures UCX over tcp, ours and ucx_perftest's alike.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BATON=${BATON:-$ROOT/build/baton}
RUNS=${1:-7}
shift || true
KINDS=("$@")
[ ${#KINDS[@]} -gt 0 ] || KINDS=(inproc tcp ucx)
[ -x "$BATON" ] || { echo "bench_latency: $BATON not built (make)" >&2; exit 2; }

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
for kind in "${KINDS[@]}"; do
    out=$(mktemp)
    for ((i = 1; i <= RUNS; i++)); do
        # shellcheck disable=SC2086
        "$BATON" bench transport --transport "$kind" --iters 20000 --sizes '' --json ${BENCH_ARGS:-} \
            2>/dev/null | tail -n 1 >>"$out" || echo "bench_latency: $kind run $i failed" >&2
    done
    python3 - "$kind" "$out" <<'EOF'
import json, statistics, sys
kind, path = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(path) if l.startswith("{")]
if not rows:
    sys.exit(f"{kind}: no results")
med = lambda k: statistics.median(r.get(k, 0.0) for r in rows)
ratios = [r["latency_ratio"] for r in rows if r.get("latency_ratio", 0) > 0]
line = (f"{kind:6s} runs {len(rows)}  one-way avg {med('latency_us'):.2f} us  "
        f"p50 {med('latency_p50_us'):.2f} us  p99 {med('latency_p99_us'):.2f} us")
if ratios:
    line += (f"  | ref {rows[0].get('ref', '')}: {med('ref_latency_us'):.2f} us  "
             f"ratio median {statistics.median(ratios):.2f}x (min {min(ratios):.2f}, max {max(ratios):.2f})")
plain = [r["ref_latency_plain_us"] for r in rows if r.get("ref_latency_plain_us")]
if plain:
    line += f"  | ucx_perftest without -e {statistics.median(plain):.2f} us"
print(line)
EOF
    rm -f "$out"
done
