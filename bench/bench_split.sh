#!/usr/bin/env bash
# Pipeline splits of a hybrid stack (bench/RESULTS.md, "Balanced pipeline
# splits"): a NemotronH model made here by transformers (random weights, the
# layer pattern PATTERN: M Mamba2, * attention, - relu2 MLP; by default four
# Mamba2 and attention layers in turn, then eight Mamba2 layers, so that the
# even split leaves the heavy half on stage 1) is trained STEPS steps as pp=2
# with the even split (half the layers per stage) and with
# parallel.split: balanced (launch/split.h), the same global batch. Per
# split: `baton graph`'s cost-model estimate of each stage and each rank's
# measured peak resident memory (mem_peak_bytes of the last metrics line:
# VmHWM of the rank's process, libraries included), the largest of them,
# and the losses of the two runs (they must agree bit for bit: a split
# moves layers, not arithmetic). SPLITS="even balanced [10,6]" adds
# explicit splits (each a parallel.split value; even first). What a process holds before any model (a baton
# process's baseline, the driver's when it loads none) is printed too: the
# model's part of a rank is its peak less that.
#
#   bench/bench_split.sh [BUILD] [STEPS] [HIDDEN] [SEQ] [PATTERN]
#   (defaults: build, 2, 256, 128, M*M*M*M*MMMMMMMM)
# Peak memory does not depend on the machine's load, but a rank that waits
# more than 30 s for a collective fails the run (coll/host.c), so on a loaded
# machine keep HIDDEN and SEQ small; the defaults take about a minute on 2
# cores.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${1:-build}
STEPS=${2:-2}
HIDDEN=${3:-256}
SEQ=${4:-128}
PATTERN=${5:-M*M*M*M*MMMMMMMM}
PY=${PY:-/work/fixvenv/bin/python}
BATON=$ROOT/$BUILD/baton
tmp=$(mktemp -d /tmp/bench_split.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

"$PY" - "$tmp/model" "$HIDDEN" "$PATTERN" <<'PY'
import sys, torch
from transformers import NemotronHConfig, NemotronHForCausalLM
out, hidden, pattern = sys.argv[1], int(sys.argv[2]), sys.argv[3]
heads = hidden // 32
cfg = NemotronHConfig(vocab_size=4096, hidden_size=hidden, max_position_embeddings=4096,
                      hybrid_override_pattern=pattern, num_attention_heads=heads,
                      num_key_value_heads=max(1, heads // 4), head_dim=32,
                      intermediate_size=4 * hidden, mlp_hidden_act="relu2",
                      mamba_num_heads=2 * hidden // 32, mamba_head_dim=32, n_groups=2,
                      ssm_state_size=64, conv_kernel=4, expand=2, chunk_size=64,
                      tie_word_embeddings=False, use_bias=False, mlp_bias=False,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
torch.manual_seed(7)
NemotronHForCausalLM(cfg).float().save_pretrained(out)
PY
mkdir -p "$tmp/data"
awk 'BEGIN { x = 12345; for (i = 0; i < 200000; i++) { x = (x * 1103515245 + 12345) % 2147483648;
       printf "%d ", int(x / 65536) % 4096 } print "" }' > "$tmp/data/tokens.txt"
cat > "$tmp/job.yaml" <<YAML
model: {hf: $tmp/model}
data: {dir: $tmp/data, seq_len: $SEQ, split: 0}
train: {steps: $STEPS, micro_batch: 2, grad_accum: 4, seed: 1, log_every: 1}
optim: {lr: 0.001, min_lr: 0.0001, warmup: 1}
parallel: {pp: 2}
YAML

base=$(BATON_LOG=debug "$BATON" graph "$tmp/job.yaml" 2>&1 |
       sed -n 's/.*peak resident memory \([0-9]*\) KiB.*/\1/p' | tail -1)
echo "model: NemotronH hidden $HIDDEN, pattern $PATTERN, vocab 4096; seq $SEQ, micro_batch 2, 4 microbatches, pp=2"
"$BATON" graph "$tmp/job.yaml" | grep '^parameters:'
echo "a baton process before any model (baton graph's peak): ${base:-?} KiB"
losses() { sed -n 's/.*"loss": \([0-9.e+-]*\),.*/\1/p' "$1"; }
bad=0
for split in ${SPLITS:-even balanced}; do
    tag=$(tr -c 'a-z0-9\n' '_' <<<"$split")
    sets=(--set metrics.file="$tmp/$tag.jsonl")
    [ "$split" != even ] && sets+=(--set "parallel.split=$split")
    "$BATON" graph "$tmp/job.yaml" "${sets[@]}" > "$tmp/graph_$tag.txt" 2>&1
    "$BATON" run "$tmp/job.yaml" --quiet "${sets[@]}" > "$tmp/$tag.log" 2>&1 ||
        { echo "$split: run failed: $(tail -3 "$tmp/$tag.log")"; exit 1; }
    echo "== $split: $(grep -m1 "^  this job's" "$tmp/graph_$tag.txt" | sed 's/^ *//')"
    awk '/^  balanced split/ { exit } /^    stage /' "$tmp/graph_$tag.txt"
    tail -1 "$tmp/$tag.jsonl" | "$PY" -c '
import json, sys
r = json.loads(sys.stdin.read())
m = r["mem_peak_bytes"]
base = float(sys.argv[1] or 0) * 1024
print("   measured peak resident per rank: " + ", ".join("rank %d %.1f MiB" % (k, b / 2**20) for k, b in enumerate(m))
      + "; largest %.1f MiB" % (max(m) / 2**20))
print("   less the baseline: " + ", ".join("rank %d %.1f MiB" % (k, (b - base) / 2**20) for k, b in enumerate(m)))' "$base"
    echo "   losses: $(losses "$tmp/$tag.jsonl" | tr '\n' ' ')"
    cmp -s <(losses "$tmp/even.jsonl") <(losses "$tmp/$tag.jsonl") || { echo "   losses DIFFER from the even split's"; bad=1; }
done
exit $bad
