#!/usr/bin/env bash
# GGUF files of the architectures besides llama (tests/fixtures/gguf_arch,
# written by tools/gen_gguf_arch_fixtures.py): qwen2 (q/k/v biases, the Qwen2
# pre-tokenizer) and qwen3 (per-head q/k norms, head_dim from
# attention.key_length, the Llama 3 pre-tokenizer). baton reads each file
# itself, tokenizer included, and must score its text as transformers does
# reading the same file (loss within 1e-5), in one process and as a
# tensor-parallel layout, and so must the Hugging Face directory `baton
# convert` makes of it; an unknown architecture is refused by name.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for a in qwen2 qwen3; do
    F=tests/fixtures/gguf_arch/$a
    want=$(cat $F/expected.json)
    g=$("$BATON" eval --model $F/tiny.gguf --text $F/text.txt --window 64 --json 2>"$tmp/err") ||
        fail "gguf_${a}_eval_runs" "$(head -c 400 "$tmp/err")"
    same_eval "gguf_${a}_eval_vs_transformers" "$g" "$want"
    # the tokenizer built from the file gives transformers' ids for the first line
    printf %s "$(head -1 $F/text.txt)" >"$tmp/line.txt"
    sed -n 's/.*"first_line_ids": \[\([0-9, ]*\)\].*/\1/p' $F/expected.json | tr -d ',' >"$tmp/ids.txt"
    t=$("$BATON" eval --model $F/tiny.gguf --text "$tmp/line.txt" --json 2>/dev/null)
    i=$("$BATON" eval --model $F/tiny.gguf --ids "$tmp/ids.txt" --json 2>/dev/null)
    if [ -s "$tmp/ids.txt" ] && [ -n "$t" ] && [ "$t" = "$i" ]; then pass "gguf_${a}_tokenizer_ids"
    else fail "gguf_${a}_tokenizer_ids" "text: $t ids: $i"; fi
    g=$(timeout 120 "$BATON" eval --model $F/tiny.gguf --text $F/text.txt --window 64 --json \
        --layout tp=2,pp=1,dp=1 2>"$tmp/err")
    same_eval "gguf_${a}_eval_tp2" "$g" "$want"
    # baton convert writes its Hugging Face twin (config, f32 weights, tokenizer.json),
    # which scores the same (transformers loads it too: checked by hand, 0 difference)
    "$BATON" convert --from $F/tiny.gguf --to "$tmp/hf_$a" >"$tmp/conv" 2>&1 ||
        fail "gguf_${a}_convert" "$(head -c 300 "$tmp/conv")"
    h=$("$BATON" eval --model "$tmp/hf_$a" --text $F/text.txt --window 64 --json 2>"$tmp/err")
    same_eval "gguf_${a}_convert_to_hf" "$h" "$want"
done
# and the llama file of tests/fixtures/gguf_model (Q/K rows permuted there)
G=tests/fixtures/gguf_model
"$BATON" convert --from $G/tiny.gguf --to "$tmp/hf_llama" >"$tmp/conv" 2>&1 ||
    fail gguf_llama_convert "$(head -c 300 "$tmp/conv")"
h=$("$BATON" eval --model "$tmp/hf_llama" --text $G/text.txt --window 64 --json 2>"$tmp/err")
same_eval gguf_llama_convert_to_hf "$h" "$(cat $G/expected_text_window64.json)"
out=$("$BATON" convert --from tests/fixtures/gguf_arch/qwen2/tiny.gguf --to "$tmp/native" --format native 2>&1)
rc=$?
if [ $rc -eq 2 ] && grep -q "converts to a Hugging Face directory" <<<"$out" && [ ! -e "$tmp/native" ]; then
    pass gguf_convert_native_refused
else fail gguf_convert_native_refused "rc $rc: $out"; fi
# every "qwen2" of the file (architecture and key prefixes) spelled "qwenx"
perl -0777 -pe 's/qwen2/qwenx/g' tests/fixtures/gguf_arch/qwen2/tiny.gguf >"$tmp/qwenx.gguf"
out=$("$BATON" eval --model "$tmp/qwenx.gguf" --text tests/fixtures/gguf_arch/qwen2/text.txt --json 2>"$tmp/err")
rc=$?
if [ $rc -eq 1 ] && [ -z "$out" ] && grep -q "architecture 'qwenx' is not supported" "$tmp/err"; then
    pass gguf_arch_unknown_refused
else fail gguf_arch_unknown_refused "rc $rc out '$out' err: $(head -c 300 "$tmp/err")"; fi
