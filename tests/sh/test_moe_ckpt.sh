#!/usr/bin/env bash
# Checkpoints of expert-parallel runs (docs/CHECKPOINTS.md, docs/PARALLEL.md
# "Expert parallelism"): the routed experts' tensors and their AdamW moments
# are stored as boxes along dimension 0 of the stacked [E, ...] tensors, so
# keyed by the global expert index, once per edp group. A run saved at EP=4
# (dp=4) resumes at EP=2 (dp=2, two microbatches each), at tp=2 EP=2 and in
# one process (EP=1), and continues within 1e-6 of the run that never
# stopped; EP=4 resumed at EP=4 continues bit for bit. The other way, a
# one-process checkpoint resumes at EP=4 and at tp=2 EP=2 within 1e-6. The checkpoint of step 2 converts
# to an HF directory that evaluates like the run's own export of step 2.
# With aux-loss-free bias balancing the selection biases are checkpoint
# items too: a resume at EP=4 is bit for bit and in one process within 1e-6.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_moe_ckpt.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

cat > "$tmp/job.yaml" <<YAML
model: {hf: tests/fixtures/qwen2_moe}
data: {dir: tests/fixtures/train_llama, seq_len: 16, split: 0}
train: {steps: 5, micro_batch: 2, grad_accum: 1, seed: 5, log_every: 100}
optim: {lr: 0.01, min_lr: 0.001, warmup: 3, weight_decay: 0.1, clip: 1.0}
checkpoint: {every: 2, keep: 3}
YAML
# run NAME ARGS...: metrics to $tmp/NAME.jsonl, checkpoints under $tmp/NAME
run() {
    local name=$1; shift
    timeout "$(scaled 120)" "$BATON" run "$tmp/job.yaml" --quiet --set checkpoint.dir="$tmp/$name" \
        --set metrics.file="$tmp/$name.jsonl" "$@" > "$tmp/$name.out" 2>&1
}
losses() { sed -n 's/.*"step": \([0-9]*\), "loss": \([0-9.e+-]*\),.*/\1 \2/p' "$1"; }
# close A B TOL: the same steps, losses within TOL relative
close() {
    [ -n "$(losses "$2")" ] && join <(losses "$1") <(losses "$2") | awk -v tol="$3" -v n="$(losses "$2" | wc -l)" \
        '{ d = $2 - $3; if (d < 0) d = -d; if (d > tol * $3) bad++; k++ } END { exit !(k == n && !bad) }'
}

ep4=(--set parallel.dp=4 --set parallel.ep=4)
run full "${ep4[@]}" --set export.dir="$tmp/export2" --set export.every=2 --set train.stop_after=2 \
    || fail moe_ckpt_save_ep4 "rc $?: $(tail -3 "$tmp/full.out")"
run whole "${ep4[@]}" || fail moe_ckpt_whole "rc $?: $(tail -3 "$tmp/whole.out")"
ck=$tmp/full/step-00000002
[ -d "$ck" ] && grep -q '"layout"' "$ck/index.json" && pass moe_ckpt_saved_ep4 \
    || fail moe_ckpt_saved_ep4 "$(ls "$tmp/full" 2>&1)"

run same "${ep4[@]}" --resume "$ck"
if [ "$(losses "$tmp/same.jsonl" | wc -l)" -eq 3 ] &&
   cmp -s <(losses "$tmp/whole.jsonl" | tail -3) <(losses "$tmp/same.jsonl"); then
    pass moe_resume_ep4_bit_identical; else fail moe_resume_ep4_bit_identical "$(losses "$tmp/same.jsonl" | tr '\n' ' ') | $(tail -2 "$tmp/same.out")"; fi
run ep2 --set parallel.dp=2 --set parallel.ep=2 --set train.grad_accum=2 --resume "$ck"
close "$tmp/whole.jsonl" "$tmp/ep2.jsonl" 1e-6 && [ "$(losses "$tmp/ep2.jsonl" | wc -l)" -eq 3 ] \
    && pass moe_resume_ep4_as_ep2 || fail moe_resume_ep4_as_ep2 "$(losses "$tmp/ep2.jsonl" | tr '\n' ' ') | $(tail -2 "$tmp/ep2.out")"
run ep1 --set train.grad_accum=4 --resume "$ck"
close "$tmp/whole.jsonl" "$tmp/ep1.jsonl" 1e-6 && [ "$(losses "$tmp/ep1.jsonl" | wc -l)" -eq 3 ] \
    && pass moe_resume_ep4_as_one_process || fail moe_resume_ep4_as_one_process "$(losses "$tmp/ep1.jsonl" | tr '\n' ' ') | $(tail -2 "$tmp/ep1.out")"
run tp2ep2 --set parallel.tp=2 --set parallel.dp=2 --set parallel.ep=2 --set train.grad_accum=2 --resume "$ck"
close "$tmp/whole.jsonl" "$tmp/tp2ep2.jsonl" 1e-6 && [ "$(losses "$tmp/tp2ep2.jsonl" | wc -l)" -eq 3 ] \
    && pass moe_resume_ep4_as_tp2_ep2 || fail moe_resume_ep4_as_tp2_ep2 "$(losses "$tmp/tp2ep2.jsonl" | tr '\n' ' ') | $(tail -2 "$tmp/tp2ep2.out")"
# the other way: saved by one process (EP=1), resumed at EP=4 and at tp=2 EP=2,
# each rank taking its experts' boxes out of the stacked tensors
run one1 --set train.grad_accum=4 --set train.stop_after=2 || fail moe_ckpt_save_one "rc $?: $(tail -3 "$tmp/one1.out")"
run up4 "${ep4[@]}" --resume "$tmp/one1/step-00000002"
close "$tmp/whole.jsonl" "$tmp/up4.jsonl" 1e-6 && [ "$(losses "$tmp/up4.jsonl" | wc -l)" -eq 3 ] \
    && pass moe_resume_one_process_as_ep4 || fail moe_resume_one_process_as_ep4 "$(losses "$tmp/up4.jsonl" | tr '\n' ' ') | $(tail -2 "$tmp/up4.out")"
run up22 --set parallel.tp=2 --set parallel.dp=2 --set parallel.ep=2 --set train.grad_accum=2 --resume "$tmp/one1/step-00000002"
close "$tmp/whole.jsonl" "$tmp/up22.jsonl" 1e-6 && [ "$(losses "$tmp/up22.jsonl" | wc -l)" -eq 3 ] \
    && pass moe_resume_one_process_as_tp2_ep2 || fail moe_resume_one_process_as_tp2_ep2 "$(losses "$tmp/up22.jsonl" | tr '\n' ' ') | $(tail -2 "$tmp/up22.out")"
# a resume that reads something else must differ: another data seed
run seed --set train.grad_accum=4 --set train.seed=6 --resume "$ck"
close "$tmp/whole.jsonl" "$tmp/seed.jsonl" 1e-6 && fail moe_resume_compare_detects "$(losses "$tmp/seed.jsonl" | tr '\n' ' ')" \
    || pass moe_resume_compare_detects

# the checkpoint as an HF directory: the experts reassembled by global index
"$BATON" convert --from "$ck" --to "$tmp/hf2" > "$tmp/convert.out" 2>&1
a=$("$BATON" eval --model "$tmp/export2" --ids tests/fixtures/qwen2_moe/ids.txt --json 2>&1)
b=$("$BATON" eval --model "$tmp/hf2" --ids tests/fixtures/qwen2_moe/ids.txt --json 2>&1)
[ -n "$(field loss "$a")" ] && [ "$a" = "$b" ] && pass moe_ckpt_converts_like_export \
    || fail moe_ckpt_converts_like_export "$a | $b | $(tail -2 "$tmp/convert.out")"

# bias balancing (router_bias_update_rate, baton's config key): the biases
# travel in the checkpoint, so resumed steps route as the run that never stopped
mkdir -p "$tmp/bias"
sed 's/"hidden_act"/"router_bias_update_rate": 0.02,\n  "hidden_act"/' tests/fixtures/qwen2_moe/config.json > "$tmp/bias/config.json"
ln -s "$PWD"/tests/fixtures/qwen2_moe/model.safetensors "$tmp/bias/"
bias=(--set model.hf="$tmp/bias")
run bfull "${bias[@]}" "${ep4[@]}" --set train.stop_after=2 --set export.dir="$tmp/bexport" \
    --set export.every=2 || fail moe_bias_ckpt_save "rc $?: $(tail -3 "$tmp/bfull.out")"
# the EP=4 export carries the biases (DeepSeek-V3's name) and evaluates
# from them: a reload accepts them as the config's own
if head -c 65536 "$tmp/bexport/model.safetensors" | grep -aq '"model.layers.2.mlp.gate.e_score_correction_bias"' &&
   e=$("$BATON" eval --model "$tmp/bexport" --ids tests/fixtures/qwen2_moe/ids.txt --json 2>&1) &&
   [ -n "$(field loss "$e")" ]; then
    pass moe_bias_exported; else fail moe_bias_exported "${e:-no e_score_correction_bias in the export}"; fi
run bwhole "${bias[@]}" "${ep4[@]}" || fail moe_bias_whole "rc $?: $(tail -3 "$tmp/bwhole.out")"
bck=$tmp/bfull/step-00000002
run bsame "${bias[@]}" "${ep4[@]}" --resume "$bck"
if [ "$(losses "$tmp/bsame.jsonl" | wc -l)" -eq 3 ] &&
   cmp -s <(losses "$tmp/bwhole.jsonl" | tail -3) <(losses "$tmp/bsame.jsonl"); then
    pass moe_bias_resume_bit_identical; else fail moe_bias_resume_bit_identical "$(losses "$tmp/bsame.jsonl" | tr '\n' ' ') | $(tail -2 "$tmp/bsame.out")"; fi
run bone "${bias[@]}" --set train.grad_accum=4 --resume "$bck"
close "$tmp/bwhole.jsonl" "$tmp/bone.jsonl" 1e-6 && [ "$(losses "$tmp/bone.jsonl" | wc -l)" -eq 3 ] \
    && pass moe_bias_resume_as_one_process || fail moe_bias_resume_as_one_process "$(losses "$tmp/bone.jsonl" | tr '\n' ' ') | $(tail -2 "$tmp/bone.out")"
# balancing changes the routing, so a resume that dropped the biases could
# not have matched above: the run without balancing trains differently
cmp -s <(losses "$tmp/bwhole.jsonl") <(losses "$tmp/whole.jsonl") \
    && fail moe_bias_changes_training "balancing changed nothing" || pass moe_bias_changes_training
grep -q '"model.layers.0.mlp.gate.selection_bias"' "$bck"/index.json && pass moe_bias_in_checkpoint \
    || fail moe_bias_in_checkpoint "$(head -c 300 "$bck/index.json")"
