#!/usr/bin/env bash
# baton eval on a GGUF file against its Hugging Face twin and transformers
# (tests/fixtures/gguf_model, written by tools/gen_gguf_model_fixture.py), and
# GGUF/model-source error cases. Losses: relative difference <= 1e-5.
set -u
. "$(dirname "$0")/lib.bash"
F=tests/fixtures/gguf_model
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

expected() { cat "$F/expected_$1.json"; }

# 1. The GGUF file, its HF twin and transformers agree on the whole text (windows of 64).
want=$(expected text_window64)
g=$("$BATON" eval --model $F/tiny.gguf --text $F/text.txt --window 64 --json 2>"$tmp/err") ||
    fail gguf_eval_runs "$(cat "$tmp/err")"
h=$("$BATON" eval --model $F/hf --text $F/text.txt --window 64 --json 2>"$tmp/err") ||
    fail gguf_eval_runs "$(cat "$tmp/err")"
same_eval gguf_eval_vs_transformers "$g" "$want"
same_eval gguf_eval_vs_hf_twin "$g" "$h"
same_eval hf_twin_eval_vs_transformers "$h" "$want"

# 2. --max-tokens: the first 200 ids in windows of 50 (196 scored positions).
want=$(expected text_max200_window50)
g=$("$BATON" eval --model $F/tiny.gguf --text $F/text.txt --window 50 --max-tokens 200 --json)
same_eval gguf_eval_max_tokens "$g" "$want"
# the same through --ids (HF's ids): the tokenizer built from the GGUF gives them too
i=$("$BATON" eval --model $F/tiny.gguf --ids $F/ids200.txt --window 50 --json)
same_eval gguf_tokenizer_ids_match_hf "$i" "$want"

# 3. Bad input: clear errors, exit 1.
err_case() { # NAME EXPECTED-TEXT MODEL
    out=$("$BATON" eval --model "$3" --text $F/text.txt --json 2>"$tmp/err")
    rc=$?
    if [ $rc -eq 1 ] && [ -z "$out" ] && grep -q -- "$2" "$tmp/err"; then pass "$1"
    else fail "$1" "rc $rc out '$out' err: $(head -c 300 "$tmp/err")"; fi
}
size=$(stat -c %s $F/tiny.gguf)
head -c 100 $F/tiny.gguf >"$tmp/trunc_header.gguf"
err_case gguf_err_truncated_header "cannot fit in the 76 bytes that remain" "$tmp/trunc_header.gguf"
head -c $((size - 1000)) $F/tiny.gguf >"$tmp/trunc_data.gguf"
err_case gguf_err_truncated_data "runs past the end of the file" "$tmp/trunc_data.gguf"
{ printf 'GGUF\x03\x00\x00\x00'; head -c 64 /dev/zero; } >"$tmp/empty.gguf"
err_case gguf_err_no_architecture "general.architecture is missing" "$tmp/empty.gguf"
printf 'not a model at all\n' >"$tmp/junk.bin"
err_case source_err_not_gguf "does not start with the GGUF magic" "$tmp/junk.bin"
err_case source_err_missing "No such file" "$tmp/nothing.gguf"
# a flipped byte in the version field
cp $F/tiny.gguf "$tmp/v9.gguf"
printf '\x09' | dd of="$tmp/v9.gguf" bs=1 seek=4 conv=notrunc 2>/dev/null
err_case gguf_err_version "version" "$tmp/v9.gguf"

# 4. baton run takes a GGUF as model.hf: the same training run as from its HF twin.
for m in tiny.gguf hf; do
    "$BATON" run jobs/tiny_hf.yaml --quiet --set model.hf=$F/$m --set train.steps=6 --set train.eval_every=3 \
        --set metrics.file="$tmp/metrics_${m%%.*}.jsonl" --set metrics.plot="" >"$tmp/run_${m%%.*}.out" 2>&1 ||
        fail run_from_gguf "$m: $(tail -3 "$tmp/run_${m%%.*}.out")"
done
first=$(sed -n 's/.*"loss": \([-0-9.eE+]*\).*/\1/p' "$tmp/metrics_tiny.jsonl" | head -1)
last=$(sed -n 's/.*"val_loss": \([-0-9.eE+]*\).*/\1/p' "$tmp/metrics_tiny.jsonl" | tail -1)
if [ -s "$tmp/metrics_tiny.jsonl" ] &&
   diff <(grep -o '"[a-z_]*loss": [-0-9.eE+]*' "$tmp/metrics_tiny.jsonl") \
        <(grep -o '"[a-z_]*loss": [-0-9.eE+]*' "$tmp/metrics_hf.jsonl") >/dev/null &&
   awk -v a="$last" -v b="$first" 'BEGIN { exit !(a < b) }'; then pass run_from_gguf_equals_hf_twin
else fail run_from_gguf_equals_hf_twin "first $first last val $last; $(head -c 400 "$tmp/metrics_tiny.jsonl") vs $(head -c 400 "$tmp/metrics_hf.jsonl")"; fi

# 5. A GGUF model evaluated as processes (eval --layout): every rank loads its
# stage / tensor-parallel share from the .gguf; same loss as transformers.
want=$(expected text_window64)
for L in tp=2,pp=2,dp=1 tp=1,pp=3,dp=1; do
    g=$(timeout 120 "$BATON" eval --model $F/tiny.gguf --text $F/text.txt --window 64 --json --layout $L 2>"$tmp/err")
    same_eval "gguf_eval_layout_${L//[=,]/_}" "$g" "$want"
done
