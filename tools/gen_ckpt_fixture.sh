#!/usr/bin/env bash
# The checkpoint fixture of tests/sh/test_convert.sh: a tiny Llama trained 4
# steps as tp=2 x pp=2 x dp=2 with ZeRO-1 (8 processes, so that its pieces are
# TP boxes, pipeline stages and ZeRO flat ranges), its committed step
# directory copied to tests/fixtures/ckpt_tp2pp2dp2/ckpt, ids to score, and
# transformers' loss on the Hugging Face export of it (tools/hf_ref.py; needs
# torch and transformers: PYTHON names an interpreter that has them).
#   PYTHON=/tmp/venv/bin/python tools/gen_ckpt_fixture.sh
set -eu
BATON=${BATON:-build/baton}
PYTHON=${PYTHON:-python3}
out=tests/fixtures/ckpt_tp2pp2dp2
tmp=$(mktemp -d /tmp/gen_ckpt_fixture.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
. tests/sh/lib.bash
mkdir -p "$tmp/data"
lcg_tokens 21 3000 40 9 64 > "$tmp/data/tokens.txt"
cat > "$tmp/job.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 4, kv_heads: 2, ffn: 64, vocab: 64, seq: 64, init_std: 0.05}
data: {dir: $tmp/data, seq_len: 16, split: 0}
train: {steps: 4, micro_batch: 1, grad_accum: 2, seed: 9, log_every: 100}
optim: {lr: 0.02, min_lr: 0.002, warmup: 1}
parallel: {tp: 2, pp: 2, dp: 2, zero1: true, microbatches: 2}
checkpoint: {dir: $tmp/ck}
YAML
"$BATON" run "$tmp/job.yaml" --quiet
rm -rf "$out"
mkdir -p "$out"
cp -r "$tmp/ck/step-00000004" "$out/ckpt"
# one sequence of 40 ids below the vocabulary (hf_ref.py reads the file as one stream)
lcg_tokens 5 40 64 3 64 > "$out/ids.txt"
"$BATON" convert --from "$out/ckpt" --to "$tmp/hf"
"$PYTHON" tools/hf_ref.py eval --model "$tmp/hf" --ids "$out/ids.txt" > "$out/transformers.json"
"$PYTHON" -c 'import torch, transformers, json, sys; json.dump({"torch": torch.__version__, "transformers": transformers.__version__}, sys.stdout)' > "$out/versions.json"
cat "$out/transformers.json"
