#!/usr/bin/env bash
# Non-finite steps are skipped, reported and counted, in one process and in
# a pp=2 x dp=2 ZeRO-1 layout. A gradient is poisoned (made NaN) at step 3
# through the fault-injection hook BATON_TEST_NONFINITE (train/optim.h):
#   - steps 1-2 equal the clean run's, step 3's metrics line says skipped
#     with a null gradient norm, later steps train on, skipped_steps counts 1;
#   - no parameter moved at step 3: the model exported after 3 steps with
#     the poison equals the clean run's after 2 (same eval result, bit for bit);
#   - the log names the step, the rank and the first non-finite tensor;
#   - more than train.max_skipped_steps in a row stops the run with an error.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_skip_steps.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/data"
lcg_tokens 4242 6000 48 10 200 > "$tmp/data/tokens.txt"
cut -d' ' -f1-32 "$tmp/data/tokens.txt" > "$tmp/ids.txt"
cat > "$tmp/job.yaml" <<YAML
model: {layers: 4, hidden: 64, heads: 4, kv_heads: 2, ffn: 128, vocab: 256, init_std: 0.02}
data: {dir: $tmp/data, seq_len: 32, split: 0}
train: {steps: 6, micro_batch: 2, grad_accum: 2, seed: 5, log_every: 100}
optim: {lr: 0.003, min_lr: 0.003, warmup: 0}   # constant: runs of different lengths share it
YAML

# field_at FILE STEP NAME: NAME's value in FILE's metrics line of step STEP
field_at() { grep "\"step\": $2," "$1" | head -1 | sed -n "s/.*\"$3\": *\([^,}]*\).*/\1/p"; }

for lay in single pp2dp2; do
    sets=()
    [ $lay = pp2dp2 ] && sets=(--set parallel.pp=2 --set parallel.dp=2 --set parallel.zero1=true)
    at=3; [ $lay = pp2dp2 ] && at="3@1" # the poison on rank 1 (stage 0, dp rank 1)
    run() { # run NAME STEPS [ENV...]: the job for STEPS steps, exported, metrics in NAME.jsonl
        local name=$1 steps=$2; shift 2
        env "$@" "$BATON" run "$tmp/job.yaml" --quiet "${sets[@]}" --set train.steps="$steps" \
            --set metrics.file="$tmp/$lay-$name.jsonl" --set export.dir="$tmp/$lay-$name" \
            > "$tmp/$lay-$name.out" 2> "$tmp/$lay-$name.err"
    }
    run clean6 6; rc_c=$?
    run clean2 2
    run poison6 6 BATON_TEST_NONFINITE=$at; rc_p=$?
    run poison3 3 BATON_TEST_NONFINITE=$at
    same=1
    for s in 1 2; do
        [ "$(field_at "$tmp/$lay-clean6.jsonl" $s loss)" = "$(field_at "$tmp/$lay-poison6.jsonl" $s loss)" ] || same=0
    done
    sk3=$(field_at "$tmp/$lay-poison6.jsonl" 3 skipped); gn3=$(field_at "$tmp/$lay-poison6.jsonl" 3 grad_norm)
    sk4=$(field_at "$tmp/$lay-poison6.jsonl" 4 skipped); total=$(field_at "$tmp/$lay-poison6.jsonl" 6 skipped_steps)
    l6=$(field_at "$tmp/$lay-poison6.jsonl" 6 loss)
    if [ $rc_c -eq 0 ] && [ $rc_p -eq 0 ] && [ $same = 1 ] && [ "$sk3" = true ] && [ "$gn3" = null ] &&
        [ "$sk4" = false ] && [ "$total" = 1 ] && [ -n "$l6" ] && [ "$l6" != null ]; then
        pass "${lay}_skip_and_go_on"
    else
        fail "${lay}_skip_and_go_on" "rc $rc_c/$rc_p, steps 1-2 same $same, step 3 skipped '$sk3' norm '$gn3', step 4 skipped '$sk4', total '$total', step 6 loss '$l6': $(tail -2 "$tmp/$lay-poison6.err")"
    fi
    e2=$("$BATON" eval --model "$tmp/$lay-clean2" --ids "$tmp/ids.txt" --json 2>&1)
    e3=$("$BATON" eval --model "$tmp/$lay-poison3" --ids "$tmp/ids.txt" --json 2>&1)
    if [ -n "$(field loss "$e2")" ] && [ "$e2" = "$e3" ]; then pass "${lay}_skipped_step_moves_nothing"
    else fail "${lay}_skipped_step_moves_nothing" "after 2 clean steps: $e2 | after 3 with step 3 poisoned: $e3"; fi
    if [ $lay = single ]; then
        want='step 3 skipped, no update: gradient norm is NaN (first non-finite gradient: model.embed_tokens.weight'
    else
        want='step 3, rank 1: skipped, no update: gradient norm is NaN; here (layers [0, 2)) the first non-finite gradient before reduction is model.embed_tokens.weight'
    fi
    if grep -qF "$want" "$tmp/$lay-poison6.err"; then pass "${lay}_says_where"
    else fail "${lay}_says_where" "wanted '$want' in: $(grep -i skip "$tmp/$lay-poison6.err" | head -3)"; fi

    env BATON_TEST_NONFINITE="${at/3/3+}" "$BATON" run "$tmp/job.yaml" --quiet "${sets[@]}" \
        --set train.max_skipped_steps=2 --set metrics.file= > "$tmp/$lay-stop.out" 2> "$tmp/$lay-stop.err"
    rc=$?
    if [ $rc -ne 0 ] && grep -q 'step 5: gradient norm is NaN.*3 consecutive non-finite steps, more than train.max_skipped_steps = 2' "$tmp/$lay-stop.err"; then
        pass "${lay}_stops_after_max"
    else fail "${lay}_stops_after_max" "rc $rc: $(tail -3 "$tmp/$lay-stop.err")"; fi
done

# NaN weights: skipping cannot help, so the first step stops the run,
# naming the parameter (single process, and on the rank that holds it)
cp -r tests/fixtures/train_llama "$tmp/nanmodel"
size=$(stat -c %s "$tmp/nanmodel/model.safetensors")
printf '\x00\x00\xc0\x7f' | dd of="$tmp/nanmodel/model.safetensors" bs=1 seek=$((size - 4)) conv=notrunc 2>/dev/null
printf 'model: {hf: %s}\ndata: {dir: tests/fixtures/train_llama, seq_len: 16}\ntrain: {steps: 8, micro_batch: 2}\n' \
    "$tmp/nanmodel" > "$tmp/nan.yaml"
for lay in single pp2; do
    sets=(); [ $lay = pp2 ] && sets=(--set parallel.pp=2 --set train.grad_accum=2)
    out=$("$BATON" run "$tmp/nan.yaml" --quiet "${sets[@]}" 2>&1); rc=$?
    if [ $rc -eq 1 ] && [[ "$out" == *"step 1"*"parameter "*" is not finite: no update can repair that"* ]]; then
        pass "${lay}_nan_weights_stop_at_once"
    else fail "${lay}_nan_weights_stop_at_once" "rc $rc: $(echo "$out" | tail -3)"; fi
done
