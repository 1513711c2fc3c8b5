#!/usr/bin/env bash
# The fenced test device (kernels/fenced/): its memory is mapped PROT_NONE
# except while one of the backend's own calls runs, so any host code that
# touches model, optimizer or activation memory directly dies of SIGSEGV.
# Everything below must therefore run on it, and give the CPU's results bit
# for bit (the same kernels on the same bytes):
#   - the fixture models' loss and gradient norm (baton eval --device fenced);
#   - single-process training steps and a multi-process PP, DP (ZeRO-1) and
#     TP run (device: fenced in the job), every loss and every exported
#     parameter identical to the CPU run.
# tests/test_model_api.c shows the fence does catch a direct access.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_fenced.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

for fx in llama qwen2 mistral llama_tied_llama3; do
    dir=tests/fixtures/$fx
    cpu=$("$BATON" eval --model "$dir" --ids "$dir/ids.txt" --grad-norm --json 2>&1)
    fen=$("$BATON" eval --model "$dir" --ids "$dir/ids.txt" --grad-norm --json --device fenced 2>&1)
    if [ -n "$(field loss "$cpu")" ] && [ "$cpu" = "$fen" ]; then pass "eval_$fx"
    else fail "eval_$fx" "cpu: $cpu | fenced: $fen"; fi
done
gg=tests/fixtures/gguf_model
ggf=$(ls $gg/*.gguf | head -1)
cpu=$("$BATON" eval --model "$ggf" --ids "$gg/ids200.txt" --json 2>&1)
fen=$("$BATON" eval --model "$ggf" --ids "$gg/ids200.txt" --json --device fenced 2>&1)
if [ -n "$(field loss "$cpu")" ] && [ "$cpu" = "$fen" ]; then pass eval_gguf
else fail eval_gguf "cpu: $cpu | fenced: $fen"; fi
gen_cpu=$("$BATON" generate --model tests/fixtures/llama --prompt "ab" --max-new 6 --json 2>&1)
gen_fen=$("$BATON" generate --model tests/fixtures/llama --prompt "ab" --max-new 6 --json --device fenced 2>&1)
if grep -q '"ids"' <<<"$gen_cpu" && [ "$gen_cpu" = "$gen_fen" ]; then pass generate
else fail generate "cpu: $gen_cpu | fenced: $gen_fen"; fi

mkdir -p "$tmp/data"
awk 'BEGIN { x = 12345; for (i = 0; i < 4000; i++) { x = (x * 1103515245 + 12345) % 2147483648;
       t = (i % 48); if (x % 10 == 0) t = int(x / 65536) % 200; printf "%d ", t } print "" }' \
    > "$tmp/data/tokens.txt"
cat > "$tmp/job.yaml" <<YAML
model: {layers: 4, hidden: 64, heads: 4, kv_heads: 2, ffn: 128, vocab: 256, init_std: 0.02}
data: {dir: $tmp/data, seq_len: 16, split: 0.1}
train: {steps: 4, micro_batch: 2, grad_accum: 4, seed: 7, log_every: 100, eval_every: 2, eval_batches: 2}
optim: {lr: 0.01, min_lr: 0.001, warmup: 1, weight_decay: 0.1, clip: 1.0}
YAML

# run NAME DEVICE SETS...: metrics and export in $tmp/NAME
run() {
    local name=$1 dev=$2; shift 2
    mkdir -p "$tmp/$name"
    "$BATON" run "$tmp/job.yaml" --quiet --set device="$dev" --set metrics.file="$tmp/$name/m.jsonl" \
        --set export.dir="$tmp/$name/ck" "$@" > "$tmp/$name/log" 2>&1
}

# same NAME: the fenced run equals the CPU run in losses and exported bytes
same() {
    local a=$tmp/$1_cpu b=$tmp/$1_fenced
    if [ -s "$a/m.jsonl" ] && cmp -s <(sed 's/, "tokens_per_s.*//; s/"elapsed_s.*//' "$a/m.jsonl") \
                                      <(sed 's/, "tokens_per_s.*//; s/"elapsed_s.*//' "$b/m.jsonl") &&
       cmp -s "$a/ck/model.safetensors" "$b/ck/model.safetensors"; then pass "train_$1"
    else fail "train_$1" "see $a/log and $b/log"; tail -5 "$b/log"; fi
}

for layout in "single:" "pp2:--set parallel.pp=2 --set train.grad_accum=2" \
              "dp2_zero1:--set parallel.dp=2 --set parallel.zero1=true --set train.grad_accum=2" \
              "tp2_tied:--set parallel.tp=2 --set model.tie_embeddings=true" \
              "pp2_dp2_tied:--set parallel.pp=2 --set parallel.dp=2 --set model.tie_embeddings=true --set train.grad_accum=2"; do
    name=${layout%%:*} sets=${layout#*:}
    # shellcheck disable=SC2086
    run "${name}_cpu" cpu $sets
    # shellcheck disable=SC2086
    run "${name}_fenced" fenced $sets
    same "$name"
done
