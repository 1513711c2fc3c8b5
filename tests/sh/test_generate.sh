#!/usr/bin/env bash
# baton generate against transformers' greedy generate() on the tiny GGUF model
# and its HF twin (tests/fixtures/gguf_model/generate.json, written by
# tools/gen_gguf_model_fixture.py), sampling reproducibility and usage errors.
set -u
. "$(dirname "$0")/lib.bash"
F=tests/fixtures/gguf_model
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ids_of() { sed -n 's/.*"ids": \[\([^]]*\)\].*/\1/p' <<<"$1" | tr -d ' '; }

max_new=24
c=0
while IFS=$'\t' read -r prompt want_p want; do
    for m in tiny.gguf hf; do
        out=$("$BATON" generate --model $F/$m --prompt "$prompt" --max-new $max_new --json 2>"$tmp/err")
        got=$(ids_of "$out")
        got_p=$(sed -n 's/.*"prompt_ids": \[\([^]]*\)\].*/\1/p' <<<"$out" | tr -d ' ')
        if [ -n "$want" ] && [ "$got" = "$want" ] && [ "$got_p" = "$want_p" ]; then pass "generate_greedy_${m%%.*}_$c"
        else fail "generate_greedy_${m%%.*}_$c" "got [$got_p] -> [$got] want [$want_p] -> [$want] $(cat "$tmp/err")"; fi
    done
    c=$((c + 1))
done <$F/generate.tsv
[ $c -eq 2 ] || fail generate_cases "$F/generate.tsv has $c cases, expected 2"

# the KV cache (the default) gives the ids of recomputing the whole prefix
# for every token (--no-cache), greedy and sampled, on every fixture family
# (the fixtures without a tokenizer.json borrow the llama fixture's: every
# one has the same 256-id vocabulary)
for fx in llama qwen2 mistral llama_tied_llama3 qwen2_bf16 gguf_model/hf; do
    d=tests/fixtures/$fx
    if [ ! -f $d/tokenizer.json ]; then
        d=$tmp/${fx//\//_}
        borrow_tokenizer tests/fixtures/$fx "$d"
    fi
    for mode in "" "--temperature 2 --seed 5"; do
        # shellcheck disable=SC2086
        c1=$("$BATON" generate --model $d --prompt "abc d" --max-new 20 --ignore-eos --json $mode 2>&1)
        # shellcheck disable=SC2086
        c0=$("$BATON" generate --model $d --prompt "abc d" --max-new 20 --ignore-eos --json --no-cache $mode 2>&1)
        tag=${fx//\//_}_${mode:+sampled}; tag=${tag%_}
        if [ -n "$(ids_of "$c1")" ] && [ "$c1" = "$c0" ]; then pass "generate_cache_equals_recompute_$tag"
        else fail "generate_cache_equals_recompute_$tag" "cache: $c1 | recompute: $c0"; fi
    done
done

g() { "$BATON" generate --model $F/tiny.gguf --prompt "The captain said" --max-new 16 --json "$@" 2>/dev/null; }
greedy=$(ids_of "$(g)")
# top-k 1 and a tiny top-p leave one candidate: the greedy choice at any temperature
a=$(ids_of "$(g --temperature 5 --top-k 1 --seed 7)")
b=$(ids_of "$(g --temperature 5 --top-p 1e-6 --seed 9)")
if [ -n "$greedy" ] && [ "$a" = "$greedy" ] && [ "$b" = "$greedy" ]; then pass generate_topk1_topp_is_greedy
else fail generate_topk1_topp_is_greedy "greedy [$greedy] top-k 1 [$a] top-p [$b]"; fi
# sampling: the same seed gives the same ids; a high temperature leaves greedy
s1=$(ids_of "$(g --temperature 3 --seed 42)")
s2=$(ids_of "$(g --temperature 3 --seed 42)")
s3=$(ids_of "$(g --temperature 3 --seed 43)")
if [ -n "$s1" ] && [ "$s1" = "$s2" ] && [ "$s1" != "$greedy" ] && [ "$s1" != "$s3" ]; then pass generate_sampling_seeded
else fail generate_sampling_seeded "seed42 [$s1] again [$s2] seed43 [$s3] greedy [$greedy]"; fi
# plain output: the prompt followed by the continuation
out=$("$BATON" generate --model $F/hf --prompt "The captain said" --max-new 4)
if [ $? -eq 0 ] && [ "${out#The captain said}" != "$out" ]; then pass generate_plain_text
else fail generate_plain_text "$out"; fi
# --bos puts BOS (id 1) first
out=$(g --bos --max-new 2)
if grep -q '"prompt_ids": \[1, 289,' <<<"$out"; then pass generate_bos; else fail generate_bos "$out"; fi

# usage errors: exit 2 with a message
bad() {
    "$BATON" generate "$@" >/dev/null 2>"$tmp/err"
    rc=$?
    if [ $rc -eq 2 ] && [ -s "$tmp/err" ]; then pass "generate_usage_$1"; else fail "generate_usage_$1" "rc $rc"; fi
}
bad no_model --prompt hi
bad top_p --model $F/hf --prompt hi --top-p 2
bad temperature --model $F/hf --prompt hi --temperature -1
bad max_new --model $F/hf --prompt hi --max-new 0
out=$("$BATON" generate --model $F/hf --prompt hi --max-new 1000 2>"$tmp/err")
if [ $? -eq 1 ] && grep -q "exceeds the model's 256 positions" "$tmp/err"; then pass generate_too_long
else fail generate_too_long "$(cat "$tmp/err")"; fi

# sliding windows while decoding (mistral_window: 6 keys a query in every
# layer; qwen2_window: in layers 1 and 2): 30 new tokens, past the window,
# with the KV cache equal to recomputing the whole prefix each step
for name in mistral_window qwen2_window; do
    d=$tmp/gen_$name
    borrow_tokenizer tests/fixtures/$name "$d"
    c1=$("$BATON" generate --model "$d" --prompt "abc d" --max-new 30 --ignore-eos --json 2>&1)
    c0=$("$BATON" generate --model "$d" --prompt "abc d" --max-new 30 --ignore-eos --json --no-cache 2>&1)
    if [[ "$c1" == *'"ids": ['[0-9]* ]] && [ "$c1" = "$c0" ]; then pass "generate_window_cache_$name"
    else fail "generate_window_cache_$name" "cache: $c1 | recompute: $c0"; fi
done
