#!/usr/bin/env bash
# Checkpoint write and read speed against references measured in the same
# run, on the same disk (bench/RESULTS.md, "Checkpoints"):
#   dd         dd if=/dev/zero bs=1M conv=fsync of the same byte count
#   baton      `baton bench ckpt`: one writer's shard file, fsynced and committed;
#              load from disk (page cache evicted), hash-checked
#   DCP        torch.distributed.checkpoint save/load of the same tensors
#              (bench/bench_ckpt_dcp.py; skipped with a note when no python with
#              torch: PYTHON names one)
# ROUNDS rounds (default 5), interleaved; medians; ratios. Then the stall a save
# causes in the `make run` job (bench/bench_ckpt_stall.sh) unless STALL=0.
#   bench/bench_ckpt.sh [DIR]      DIR: where to write (default /tmp)
set -u
BATON=${BATON:-build/baton}
PYTHON=${PYTHON:-python3}
dir=${1:-/tmp}
rounds=${ROUNDS:-5}
mb=${MB:-256}
tensors=${TENSORS:-64}
work=$(mktemp -d "$dir/bench_ckpt.XXXXXX")
trap 'rm -rf "$work"' EXIT
have_torch=1
"$PYTHON" -c 'import torch.distributed.checkpoint' 2>/dev/null || have_torch=0
echo "# $(date -u +%FT%TZ) $(uname -n), $(nproc) cores, $(df -h "$dir" | tail -1 | awk '{print $1, $2}'), $mb MB in $tensors tensors, $rounds rounds"
for r in $(seq 1 "$rounds"); do
    t0=$(date +%s.%N)
    dd if=/dev/zero of="$work/dd.bin" bs=1M count="$mb" conv=fsync status=none
    t1=$(date +%s.%N)
    rm -f "$work/dd.bin"
    echo "dd $(awk -v a="$t0" -v b="$t1" -v m="$mb" 'BEGIN { printf "%.4f %.1f", b - a, m * 1048576 / (b - a) / 1e6 }')"
    "$BATON" bench ckpt --dir "$work" --mb "$mb" --tensors "$tensors" --json | sed 's/^/baton /'
    [ $have_torch = 1 ] && "$PYTHON" bench/bench_ckpt_dcp.py --dir "$work" --mb "$mb" --tensors "$tensors" 2>/dev/null | sed 's/^/dcp /'
done > "$work/raw.txt"
python3 - "$work/raw.txt" "$have_torch" <<'PY'
import json, statistics, sys
dd, bt, dc = [], [], []
for line in open(sys.argv[1]):
    k, _, rest = line.partition(" ")
    if k == "dd":
        s, mbs = rest.split(); dd.append(float(mbs))
    elif k == "baton": bt.append(json.loads(rest))
    elif k == "dcp": dc.append(json.loads(rest))
med = statistics.median
save_mb = med(b["bytes"] / b["save_s"] / 1e6 for b in bt)
load_mb = med(b["bytes"] / b["load_s"] / 1e6 for b in bt)
print(f"dd conv=fsync           {med(dd):8.1f} MB/s   (runs: {', '.join(f'{x:.0f}' for x in dd)})")
print(f"baton save (committed)  {save_mb:8.1f} MB/s   = {save_mb / med(dd):.2f} x dd")
print(f"baton load (from disk)  {load_mb:8.1f} MB/s")
if dc:
    ds, dl = med(d["save_s"] for d in dc), med(d["load_s"] for d in dc)
    bs, bl = med(b["save_s"] for b in bt), med(b["load_s"] for b in bt)
    print(f"DCP save {ds:.3f} s, load {dl:.3f} s (torch {dc[0]['torch']}); baton save {bs:.3f} s, load {bl:.3f} s")
    print(f"time ratio baton / DCP: save {bs / ds:.2f}, load {bl / dl:.2f}   (< 1: baton faster)")
else:
    print("DCP: skipped (no python with torch; PYTHON=...)")
PY
[ "${STALL:-1}" = 0 ] || bash bench/bench_ckpt_stall.sh
