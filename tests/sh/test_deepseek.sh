#!/usr/bin/env bash
# DeepSeek-V2 through the CLI (tests/fixtures/deepseek_v2_lite: q_lora_rank
# null, greedy routing; tests/fixtures/deepseek_v2: the q_a/q_b bottleneck,
# YaRN, group-limited routing; both tools/gen_deepseek_fixtures.py):
# `baton eval` gives transformers' pooled loss and gradient norm
# (expected.json) on the cpu and the fenced device; `baton generate` gives
# transformers' greedy ids (generate.json), and the MLA decode cache what
# recomputing every prefix gives, greedy and sampled; an HF export (convert
# through the native format and back) evaluates to the same loss; training
# with the pipeline cut after the dense layer and between MoE layers (pp 2,
# 3) gives the one-process losses bit for bit, dp=2 and dp=2 x ep=2 within
# 1e-5 relative.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
close() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d;
    if (b < 0) b = -b; exit !(a != "" && d <= t * b) }'; }
losses() { sed -n 's/.*"loss": \([0-9.e+-]*\),.*/\1/p' "$1"; }

for name in deepseek_v2_lite deepseek_v2; do
    fx=tests/fixtures/$name
    want_loss=$(field loss "$(cat "$fx/expected.json")")
    want_gn=$(field grad_norm "$(cat "$fx/expected.json")")
    for dev in cpu fenced; do
        out=$("$BATON" eval --model "$fx" --ids "$fx/ids.txt" --grad-norm --json --device $dev 2>&1)
        close "$(field loss "$out")" "$want_loss" 1e-5 && close "$(field grad_norm "$out")" "$want_gn" 1e-4 \
            && pass "deepseek_eval_${name}_$dev" \
            || fail "deepseek_eval_${name}_$dev" "$out | want loss $want_loss grad_norm $want_gn"
    done
    d=$tmp/gen_$name
    borrow_tokenizer "$fx" "$d"
    want=$(tr -d '\n' < "$fx/generate.json" | sed 's/.*"ids": \[\([^]]*\)\].*/\1/')
    got=$("$BATON" generate --model "$d" --prompt "abc d" --max-new 20 --ignore-eos --json 2>/dev/null)
    ids=$(sed 's/.*"ids": \[\([^]]*\)\].*/\1/' <<<"$got")
    [ -n "$want" ] && [ "$ids" = "$want" ] && grep -q '"prompt_ids": \[64, 65, 66, 220, 67\]' <<<"$got" \
        && pass "deepseek_generate_greedy_$name" || fail "deepseek_generate_greedy_$name" "got [$ids] want [$want]"
    for mode in "" "--temperature 2 --seed 5"; do
        # shellcheck disable=SC2086
        c1=$("$BATON" generate --model "$d" --prompt "abc d" --max-new 12 --ignore-eos --json $mode 2>&1)
        # shellcheck disable=SC2086
        c0=$("$BATON" generate --model "$d" --prompt "abc d" --max-new 12 --ignore-eos --json --no-cache $mode 2>&1)
        tag=${name}${mode:+_sampled}
        [[ "$c1" == *'"ids": ['[0-9]* ]] && [ "$c1" = "$c0" ] && pass "deepseek_generate_cache_$tag" \
            || fail "deepseek_generate_cache_$tag" "cache: $c1 | recompute: $c0"
    done
    "$BATON" convert --from "$fx" --to "$tmp/native_$name" >/dev/null 2>&1 &&
        "$BATON" convert --from "$tmp/native_$name" --to "$tmp/back_$name" >/dev/null 2>&1
    a=$("$BATON" eval --model "$fx" --ids "$fx/ids.txt" --json 2>/dev/null)
    b=$("$BATON" eval --model "$tmp/back_$name" --ids "$fx/ids.txt" --json 2>/dev/null)
    [ -n "$(field loss "$a")" ] && [ "$a" = "$b" ] && pass "deepseek_convert_roundtrip_$name" \
        || fail "deepseek_convert_roundtrip_$name" "$a | $b"
done

# training, both fixtures (layer 0 dense, 1 and 2 MoE): pp=2 and pp=3 as
# processes give the one-process losses bit for bit; dp=2, and dp=2 with the
# experts split ep=2, within 1e-5 relative
for name in deepseek_v2_lite deepseek_v2; do
cat > "$tmp/d.yaml" <<YAML
model: {hf: tests/fixtures/$name}
data: {dir: tests/fixtures/train_llama, seq_len: 16, split: 0}
train: {steps: 4, micro_batch: 2, grad_accum: 4, seed: 1234, log_every: 100}
optim: {lr: 0.01, min_lr: 0.001, warmup: 2}
metrics: {file: $tmp/one.jsonl}
YAML
rm -f "$tmp"/*.jsonl
"$BATON" run "$tmp/d.yaml" --quiet >"$tmp/one.txt" 2>&1 || fail "deepseek_train_single_$name" "rc $?: $(tail -2 "$tmp/one.txt")"
for pp in 2 3; do
    "$BATON" run "$tmp/d.yaml" --quiet --set parallel.pp=$pp --set metrics.file="$tmp/pp$pp.jsonl" \
        >"$tmp/pp$pp.txt" 2>&1
    if [ "$(losses "$tmp/one.jsonl" | wc -l)" -eq 4 ] && cmp -s <(losses "$tmp/one.jsonl") <(losses "$tmp/pp$pp.jsonl"); then
        pass "deepseek_pp${pp}_equals_single_$name"
    else fail "deepseek_pp${pp}_equals_single_$name" "$(losses "$tmp/one.jsonl" | tr '\n' ' ') | $(losses "$tmp/pp$pp.jsonl" | tr '\n' ' ') $(tail -2 "$tmp/pp$pp.txt")"; fi
done
for lay in "dp2:--set parallel.dp=2" "dp2_ep2:--set parallel.dp=2 --set parallel.ep=2"; do
    tag=${lay%%:*}
    # shellcheck disable=SC2086
    "$BATON" run "$tmp/d.yaml" --quiet ${lay#*:} --set train.grad_accum=2 \
        --set metrics.file="$tmp/$tag.jsonl" >"$tmp/$tag.txt" 2>&1
    if [ "$(losses "$tmp/one.jsonl" | wc -l)" -eq 4 ] && [ "$(losses "$tmp/$tag.jsonl" | wc -l)" -eq 4 ] &&
        paste <(losses "$tmp/one.jsonl") <(losses "$tmp/$tag.jsonl") |
        awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $2) bad++ } END { exit bad }'; then
        pass "deepseek_${tag}_equals_single_$name"
    else fail "deepseek_${tag}_equals_single_$name" "$(losses "$tmp/one.jsonl" | tr '\n' ' ') | $(losses "$tmp/$tag.jsonl" | tr '\n' ' ') $(tail -2 "$tmp/$tag.txt")"; fi
done
done

# baton graph at DeepSeek-V2-Lite's widths (tests/fixtures/deepseek_v2_lite_config: the
# config alone) in the reference layout: per stage what it holds and its activations,
# the balanced split [14, 13], and the neighbour [13, 14] with a larger largest stage
cat > "$tmp/lite.yaml" <<YAML
model: {hf: tests/fixtures/deepseek_v2_lite_config}
data: {dir: tests/fixtures/train_llama, seq_len: 4096}
train: {micro_batch: 1, grad_accum: 8}
parallel: {tp: 2, pp: 2, cp: 2, dp: 2, ep: 4, split: [14, 13]}
YAML
g=$("$BATON" graph "$tmp/lite.yaml" 2>&1)
pct=$(sed -n 's/^    \[13, 14\] (layer 13, 1 mla+moe, to stage 1): largest stage 1, .* (+\([0-9.]*\)%)$/\1/p' <<<"$g")
if grep -q '^  balanced split \[14, 13\]' <<<"$g" &&
   grep -q '^      holds the embedding, 1 mla+mlp, 13 mla+moe; activations .* (8 arenas)$' <<<"$g" &&
   grep -q '^      holds 13 mla+moe, the head; activations' <<<"$g" &&
   [ -n "$pct" ] && awk -v p="$pct" 'BEGIN { exit !(p > 0) }'; then
    pass deepseek_graph_split_14_13
else fail deepseek_graph_split_14_13 "$g"; fi
