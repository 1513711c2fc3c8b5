#!/usr/bin/env bash
# baton run on token shards (data/shard.h): text -> `baton data prepare`
# (fixture GPT-2-style tokenizer) -> training with a separate validation
# shard set; the vocabulary comes from the shards (model.vocab unset).
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_run_shards.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

gen() {  # repetitive text with 5% random insertions (seeded: deterministic)
    awk -v seed="$1" -v n="$2" 'BEGIN { srand(seed);
        split("the cat sat on a mat and the dog ran to the park while birds sang in trees", w, " ");
        for (i = 0; i < n; i++) { printf "%s ", w[(i % 17) + 1];
            if (rand() < 0.05) printf "%s ", w[int(rand() * 17) + 1];
            if (i % 17 == 16) printf ".\n" } }'
}
gen 3 3000 > "$tmp/train.txt"
gen 4 400 > "$tmp/val.txt"
tok=tests/fixtures/tok/gpt2
"$BATON" data prepare --tokenizer "$tok" --input "$tmp/train.txt" --output "$tmp/train" --quiet >/dev/null 2>&1 &&
"$BATON" data prepare --tokenizer "$tok" --input "$tmp/val.txt" --output "$tmp/val" --quiet >/dev/null 2>&1 \
    && pass run_shards_prepare || fail run_shards_prepare "baton data prepare failed"

cat > "$tmp/job.yaml" <<YAML
model: {layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn: 128}
data: {dir: $tmp/train, val_dir: $tmp/val, seq_len: 32}
train: {steps: 30, micro_batch: 4, grad_accum: 1, seed: 5, log_every: 10}
optim: {lr: 0.01, min_lr: 0.001, warmup: 3}
metrics: {file: $tmp/m.jsonl}
YAML
"$BATON" run "$tmp/job.yaml" > "$tmp/out.txt" 2>&1 && pass run_shards_exit || { fail run_shards_exit "rc $?"; cat "$tmp/out.txt"; }
first=$(grep '"loss"' "$tmp/m.jsonl" | head -1 | sed 's/.*"loss": \([0-9.e+-]*\),.*/\1/')
last=$(grep '"loss"' "$tmp/m.jsonl" | tail -1 | sed 's/.*"loss": \([0-9.e+-]*\),.*/\1/')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 7.5 && b < 0.5 * a) }' \
    && pass run_shards_loss_falls || fail run_shards_loss_falls "first $first last $last"
vppl=$(sed -n 's/^final validation loss [0-9.]*, perplexity \([0-9.]*\)$/\1/p' "$tmp/out.txt")
# random init over 4096 ids starts near ppl 4096; trained it must be far lower
awk -v p="$vppl" 'BEGIN { exit !(p != "" && p > 1 && p < 400) }' \
    && { echo "validation perplexity $vppl"; pass run_shards_val_ppl; } || fail run_shards_val_ppl "val ppl '$vppl'"
grep -q 'hidden 64, vocab 4096$' "$tmp/out.txt" \
    && pass run_shards_vocab || fail run_shards_vocab "vocab not taken from shards"

# shards with more ids than the model's vocabulary: refused
out=$("$BATON" run "$tmp/job.yaml" --set model.vocab=1000 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"tokenizer has 4096 ids but the model's vocabulary is 1000"* ]] \
    && pass run_shards_vocab_mismatch || fail run_shards_vocab_mismatch "rc $rc: $out"
# a missing data directory is named
out=$("$BATON" run "$tmp/job.yaml" --set data.dir="$tmp/nope" 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"$tmp/nope holds neither a shard set"* ]] \
    && pass run_shards_missing || fail run_shards_missing "rc $rc: $out"
