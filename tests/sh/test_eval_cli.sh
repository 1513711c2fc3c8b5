#!/usr/bin/env bash
# baton eval CLI against the transformers fixtures (tests/fixtures/*/expected.json,
# written by tools/gen_fixtures.py) and its error cases.
# Loss and ppl: relative error <= 1e-5; grad_norm: <= 1e-4.
set -u
. "$(dirname "$0")/lib.bash"
FIX=tests/fixtures
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT


# field NAME JSON -> the number after "NAME":
# relerr A B -> |A-B|/|B|
close() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d;
    m = b < 0 ? -b : b; exit !(a != "" && d <= t * m) }'; }

for dir in "$FIX"/*/; do
    name=$(basename "$dir")
    # eval fixtures are the ones with ids.txt (train_llama holds a training reference)
    [ -f "$dir/expected.json" ] && [ -f "$dir/ids.txt" ] || continue
    exp=$(tr -d '\n' <"$dir/expected.json")
    out=$("$BATON" eval --model "$dir" --ids "$dir/ids.txt" --json --grad-norm 2>"$tmp/err")
    rc=$?
    if [ $rc -ne 0 ]; then fail "eval_json_$name" "exit $rc: $(cat "$tmp/err")"; continue; fi
    if [ "$(grep -c . <<<"$out")" -ne 1 ]; then fail "eval_json_$name" "not one line: $out"; continue; fi
    ok=1
    [ "$(field tokens "$out")" = "$(field tokens "$exp")" ] || ok=0
    close "$(field loss "$out")" "$(field loss "$exp")" 1e-5 || ok=0
    close "$(field ppl "$out")" "$(field ppl "$exp")" 1e-5 || ok=0
    close "$(field grad_norm "$out")" "$(field grad_norm "$exp")" 1e-4 || ok=0
    if [ $ok = 1 ]; then pass "eval_json_$name"; else fail "eval_json_$name" "got $out want $exp"; fi
done

# Without --grad-norm: no grad_norm key; the same loss.
d=$FIX/llama
out=$("$BATON" eval --model $d --ids $d/ids.txt --json)
exp=$(tr -d '\n' <$d/expected.json)
if ! grep -q grad_norm <<<"$out" && close "$(field loss "$out")" "$(field loss "$exp")" 1e-5; then
    pass eval_json_no_grad_norm; else fail eval_json_no_grad_norm "$out"; fi

# Readable output names tokens, loss and ppl.
out=$("$BATON" eval --model $d --ids $d/ids.txt)
if [ $? -eq 0 ] && grep -q "tokens 37" <<<"$out" && grep -q "ppl" <<<"$out"; then
    pass eval_readable; else fail eval_readable "$out"; fi

# Blank lines are ignored.
{ echo; sed -n 1p $d/ids.txt; echo "   "; sed -n '2,$p' $d/ids.txt; echo; } >"$tmp/blank.txt"
out=$("$BATON" eval --model $d --ids "$tmp/blank.txt" --json)
ref=$("$BATON" eval --model $d --ids $d/ids.txt --json)
if [ -n "$out" ] && [ "$out" = "$ref" ]; then pass eval_blank_lines
else fail eval_blank_lines "$out"; fi

# --window T scores each T-token window as its own sequence: a 20-token line
# with --window 8 equals its windows 8+8+4 given as three lines.
first=$(sed -n 1p $d/ids.txt)
read -ra tok <<<"$first"
echo "$first" >"$tmp/one.txt"
{ echo "${tok[*]:0:8}"; echo "${tok[*]:8:8}"; echo "${tok[*]:16}"; } >"$tmp/split.txt"
a=$("$BATON" eval --model $d --ids "$tmp/one.txt" --window 8 --json)
b=$("$BATON" eval --model $d --ids "$tmp/split.txt" --json)
if [ "$(field tokens "$a")" = 17 ] && [ "$a" = "$b" ]; then pass eval_window
else fail eval_window "$a vs $b"; fi

# --text: tokenized with the fixture's byte-level tokenizer.json, scored in
# windows; references from transformers + tokenizers (expected_text_w*.json).
for w in 64 16; do
    exp=$(tr -d '\n' <$d/expected_text_w$w.json)
    args=(); [ $w = 16 ] && args=(--window 16)   # 64 is the default (max_position_embeddings)
    out=$("$BATON" eval --model $d --text $d/text.txt "${args[@]}" --json 2>"$tmp/err")
    if [ "$(field tokens "$out")" = "$(field tokens "$exp")" ] &&
       close "$(field loss "$out")" "$(field loss "$exp")" 1e-5; then pass eval_text_w$w
    else fail eval_text_w$w "got $out want $exp $(cat "$tmp/err")"; fi
done

# Error cases: non-zero exit and a message that says what and where.
expect_err() { # name pattern args...
    local name=$1 pat=$2; shift 2
    "$BATON" eval "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    if [ $rc -ne 0 ] && grep -q -- "$pat" "$tmp/err" && [ ! -s "$tmp/out" ]; then pass "$name"
    else fail "$name" "rc=$rc stderr: $(head -3 "$tmp/err")"; fi
}
expect_err eval_err_missing_dir "no_such_dir" --model "$tmp/no_such_dir" --ids $d/ids.txt
expect_err eval_err_missing_ids "nope.txt" --model $d --ids "$tmp/nope.txt"
printf '1 2 3\n4 x5 6\n' >"$tmp/bad_tok.txt"
expect_err eval_err_bad_token "bad_tok.txt:2:3: bad token 'x5'" --model $d --ids "$tmp/bad_tok.txt"
printf '1 2 3\n\n7 8 256 9\n' >"$tmp/big.txt"
expect_err eval_err_id_range "big.txt:3:5: token id 256 outside the vocabulary" --model $d --ids "$tmp/big.txt"
printf '1 -2\n' >"$tmp/neg.txt"
expect_err eval_err_negative "neg.txt:1:3: token id -2" --model $d --ids "$tmp/neg.txt"
printf '\n\n' >"$tmp/empty.txt"
expect_err eval_err_empty "no sequences" --model $d --ids "$tmp/empty.txt"
printf '5\n7\n' >"$tmp/single.txt"
expect_err eval_err_no_scored "no scored positions" --model $d --ids "$tmp/single.txt"
expect_err eval_err_usage "exactly one of" --model $d
mkdir -p "$tmp/nomodel" && cp $d/config.json "$tmp/nomodel/"
expect_err eval_err_no_weights "model.safetensors" --model "$tmp/nomodel" --ids $d/ids.txt
# Mistral fixture has sliding_window 32: a 40-token sequence is evaluated under the
# window on the CPU (exactness against transformers: the mistral_window and
# qwen2_window fixtures in the loop above)
seq 1 40 | tr '\n' ' ' >"$tmp/long.txt"; echo >>"$tmp/long.txt"
if out=$("$BATON" eval --model $FIX/mistral --ids "$tmp/long.txt" --window 64 --json 2>&1) &&
    grep -q '"tokens": 39' <<<"$out"; then pass eval_sliding_window_longer
else fail eval_sliding_window_longer "$out"; fi
expect_err eval_err_text_no_tokenizer "tokenizer.json" --model $FIX/qwen2 --text $d/text.txt
expect_err eval_err_text_missing "nothing.txt" --model $d --text "$tmp/nothing.txt"
expect_err eval_err_bad_window "window" --model $d --ids $d/ids.txt --window 1

# ---- bad input: a clear error, not a hang, a silent change or non-JSON ----
ST_EDIT="python3 tests/helpers/st_edit.py"
copy_model() { mkdir -p "$2" && cp "$1"/config.json "$1"/model.safetensors "$2"/ && \
               { [ ! -f "$1"/tokenizer.json ] || cp "$1"/tokenizer.json "$2"/; }; }
t=$FIX/llama_tied_llama3
tied_ref=$("$BATON" eval --model $t --ids $t/ids.txt --json)

# Tied embeddings with an lm_head.weight that differs from the embedding:
# refused, naming the tensor (it used to be ignored silently).
copy_model $t "$tmp/tied_head"
$ST_EDIT $t/model.safetensors "$tmp/tied_head/model.safetensors" add lm_head.weight \
    model.embed_tokens.weight 1.5
expect_err eval_err_tied_head_differs "tensor 'lm_head.weight' differs from model.embed_tokens.weight" \
    --model "$tmp/tied_head" --ids $t/ids.txt --json
grep -q "tie_word_embeddings=true" "$tmp/err" && pass eval_err_tied_head_says_config \
    || fail eval_err_tied_head_says_config "$(cat "$tmp/err")"
# the llama fixture (own head) marked tied: was loss 5.9823 (head ignored)
copy_model $d "$tmp/llama_tied"
sed -i 's/"tie_word_embeddings": false/"tie_word_embeddings": true/' "$tmp/llama_tied/config.json"
expect_err eval_err_untied_head_marked_tied "tensor 'lm_head.weight' differs from model.embed_tokens.weight" \
    --model "$tmp/llama_tied" --ids $d/ids.txt --json
# ... the same as a surplus layer tensor, which is refused too
copy_model $t "$tmp/extra_layer"
$ST_EDIT $t/model.safetensors "$tmp/extra_layer/model.safetensors" add \
    model.layers.9.input_layernorm.weight model.norm.weight
expect_err eval_err_extra_layer_tensor "unexpected tensor 'model.layers.9.input_layernorm.weight'" \
    --model "$tmp/extra_layer" --ids $t/ids.txt
# an lm_head.weight equal to the embedding (one tensor saved under both
# names) is the same model: accepted, same loss
copy_model $t "$tmp/tied_same"
$ST_EDIT $t/model.safetensors "$tmp/tied_same/model.safetensors" add lm_head.weight \
    model.embed_tokens.weight
out=$("$BATON" eval --model "$tmp/tied_same" --ids $t/ids.txt --json 2>"$tmp/err")
[ -n "$out" ] && [ "$out" = "$tied_ref" ] && pass eval_tied_head_equal_accepted \
    || fail eval_tied_head_equal_accepted "$out vs $tied_ref: $(cat "$tmp/err")"

# NaN weights: an error (exit 1, message, nothing on stdout), never
# {"loss": nan}, which is not JSON.
copy_model $d "$tmp/nan"
$ST_EDIT $d/model.safetensors "$tmp/nan/model.safetensors" nan model.norm.weight
expect_err eval_err_nan_json "the loss is NaN, not a finite number" --model "$tmp/nan" --ids $d/ids.txt --json
expect_err eval_err_nan_text "the loss is NaN" --model "$tmp/nan" --ids $d/ids.txt
expect_err eval_err_nan_grad_norm "NaN" --model "$tmp/nan" --ids $d/ids.txt --json --grad-norm

# A line longer than max_position_embeddings (64) is refused unless
# --window asks for windows; --window 64 scores it as 64 + 6 tokens.
seq 1 70 | tr '\n' ' ' >"$tmp/long70.txt"; echo >>"$tmp/long70.txt"
expect_err eval_err_longer_than_positions \
    "long70.txt: sequence 1 (of the non-blank lines) has 70 tokens, more than the model's max_position_embeddings=64; give --window N" \
    --model $d --ids "$tmp/long70.txt" --json
out=$("$BATON" eval --model $d --ids "$tmp/long70.txt" --window 64 --json 2>"$tmp/err")
[ "$(field tokens "$out")" = 68 ] && pass eval_window_explicit_long || fail eval_window_explicit_long "$out $(cat "$tmp/err")"
# --text cuts into windows of max_position_embeddings by design: it says so
"$BATON" eval --model $d --text $d/text.txt --json >"$tmp/out" 2>"$tmp/err"
grep -q "tokens scored as [0-9]* windows of at most max_position_embeddings=64 tokens" "$tmp/err" \
    && pass eval_text_windows_said || fail eval_text_windows_said "$(cat "$tmp/err")"

# A config.json with a huge vocabulary: refused before anything is
# allocated, naming the field and the estimate (the address-space cap makes
# the old behaviour, allocating 8 GiB, fail fast instead of swapping).
copy_model $d "$tmp/huge"
sed -i 's/"vocab_size": 256/"vocab_size": 16777216/' "$tmp/huge/config.json"
for cmd in eval generate; do
    if [ $cmd = eval ]; then args=(--ids $d/ids.txt --json); else args=(--prompt "It is" --max-new 2); fi
    o=$( (cap_vm; BATON_MEM_LIMIT=1G timeout 60 "$BATON" $cmd --model "$tmp/huge" "${args[@]}") 2>&1 >/dev/null); r=$?
    if [ $r -eq 1 ] && grep -q "huge: the model needs about 8.[0-9]* GiB of memory (parameters 8.00 GiB, activations" <<<"$o" &&
       grep -q "more than the 1.00 GiB available (BATON_MEM_LIMIT=1G); 9[0-9]% of it is for the vocabulary-sized tensors (vocab_size 16777216 x hidden_size 64)" <<<"$o"
    then pass ${cmd}_err_huge_config; else fail ${cmd}_err_huge_config "rc $r: $o"; fi
done
o=$(BATON_MEM_LIMIT=lots "$BATON" eval --model $d --ids $d/ids.txt 2>&1); r=$?
[ $r -eq 1 ] && grep -q "BATON_MEM_LIMIT=lots: expected a size" <<<"$o" && pass eval_err_mem_limit_syntax \
    || fail eval_err_mem_limit_syntax "rc $r: $o"
