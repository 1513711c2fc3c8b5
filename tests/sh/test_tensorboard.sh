#!/usr/bin/env bash
# TensorBoard event files (launch/tb.h), read back by TensorBoard's own
# reader from PyPI: every record passes its length and data CRC checks,
# and the scalars (step, value) are the run's metrics.jsonl values as
# float32. TensorBoard goes into a virtual environment under the build
# directory once ($BUILD/tb-venv); without PyPI the test says SKIP.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_tensorboard.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
venv=$PWD/${BUILD:-build}/tb-venv
if ! "$venv/bin/python" -c 'import tensorboard' 2>/dev/null; then
    rm -rf "$venv"
    if ! { python3 -m venv "$venv" && "$venv/bin/pip" install -q tensorboard; } > "$tmp/pip.log" 2>&1; then
        echo "SKIP tensorboard_readback (no TensorBoard: pip install tensorboard failed: $(tail -1 "$tmp/pip.log"))"
        rm -rf "$venv"
        exit 0
    fi
fi

mkdir -p "$tmp/data"
lcg_tokens 11 4000 40 10 64 > "$tmp/data/tokens.txt"
cat > "$tmp/job.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 2, kv_heads: 1, ffn: 64, vocab: 64}
data: {dir: $tmp/data, seq_len: 16, split: 0.1}
train: {steps: 12, micro_batch: 2, grad_accum: 1, seed: 3, eval_every: 6, eval_batches: 2}
optim: {lr: 0.01, warmup: 1}
runs: $tmp/runs
YAML
"$BATON" run "$tmp/job.yaml" --quiet > "$tmp/out.txt" 2>&1 && pass tensorboard_run || { fail tensorboard_run "$(tail -3 "$tmp/out.txt")"; exit 0; }
run=$tmp/runs/job/latest
"$venv/bin/python" - "$run" <<'PY' && pass tensorboard_readback || fail tensorboard_readback "see above"
import glob, json, struct, sys
from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
run = sys.argv[1]
files = glob.glob(run + "/tensorboard/events.out.tfevents.*")
assert len(files) == 1, files
# every record: the reader checks the masked CRC-32C of its length and data
r = pywrap_tensorflow.PyRecordReader_New(files[0].encode(), 0, b"")
n = 0
while True:
    try:
        r.GetNext()
    except errors.OutOfRangeError:
        break
    n += 1
steps = [json.loads(l) for l in open(run + "/metrics.jsonl")]
train = [s for s in steps if "loss" in s]
val = [s for s in steps if "val_loss" in s]
assert len(train) == 12 and len(val) == 2, (len(train), len(val))
ea = EventAccumulator(run + "/tensorboard", size_guidance={"scalars": 0})
ea.Reload()
tags = ea.Tags()["scalars"]
for t in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/step_time_s",
          "train/mfu", "val/loss", "val/ppl"):
    assert t in tags, (t, tags)
f32 = lambda v: struct.unpack("f", struct.pack("f", v))[0]
def same(tag, rows, key, rel=0):
    got = [(e.step, e.value) for e in ea.Scalars(tag)]
    want = [(s["step"], f32(s[key])) for s in rows]
    assert [g[0] for g in got] == [w[0] for w in want], (tag, got, want)
    assert all(abs(g[1] - w[1]) <= rel * abs(w[1]) for g, w in zip(got, want)), (tag, got, want)
same("train/loss", train, "loss")
same("train/grad_norm", train, "grad_norm")
same("train/lr", train, "lr", 1e-6)   # metrics.jsonl has 7 digits of it
same("val/loss", val, "val_loss")
# the file: version record + 7 or 8 scalars per step + 2 per evaluation
assert n >= 1 + 7 * 12 + 2 * 2, n
print("records", n, "tags", len(tags))
PY
# a flipped byte in a record is a data loss the reader reports (every bit of
# byte 200 inverted: writing a fixed 0xff there changed nothing when the
# byte, part of a record's wall time, already was 0xff)
f=$(ls "$run"/tensorboard/events.out.tfevents.*)
cp "$f" "$tmp/bad.tfevents"
b=$(od -An -tu1 -j200 -N1 "$tmp/bad.tfevents" | tr -d ' ')
printf "\\$(printf '%03o' $(( 255 - b )))" | dd of="$tmp/bad.tfevents" bs=1 seek=200 conv=notrunc status=none
cmp -s "$f" "$tmp/bad.tfevents" && fail tensorboard_crc_checked "byte 200 of the copy did not change"
"$venv/bin/python" - "$tmp/bad.tfevents" <<'PY' && pass tensorboard_crc_checked || fail tensorboard_crc_checked "a corrupt file read cleanly"
import sys
from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
r = pywrap_tensorflow.PyRecordReader_New(sys.argv[1].encode(), 0, b"")
try:
    while True:
        r.GetNext()
except errors.DataLossError:
    sys.exit(0)
except errors.OutOfRangeError:
    sys.exit(1)
PY
