#!/usr/bin/env bash
# baton run end to end: a tiny random-init model on a tiny synthetic token
# stream must show falling loss, write metrics/PNG/validation perplexity;
# bad job files and unsupported layouts must fail with clear messages.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_run.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# Synthetic stream: a deterministic noisy cycle over 48 ids (learnable).
mkdir -p "$tmp/data"
awk 'BEGIN { x = 12345; for (i = 0; i < 6000; i++) { x = (x * 1103515245 + 12345) % 2147483648;
       t = (i % 48); if (x % 10 == 0) t = int(x / 65536) % 64; printf "%d ", t } print "" }' \
    > "$tmp/data/tokens.txt"

cat > "$tmp/job.yaml" <<YAML
model: {layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn: 128, vocab: 64, init_std: 0.02}
data: {dir: $tmp/data, seq_len: 32, split: 0.1}
train: {steps: 40, micro_batch: 4, grad_accum: 2, seed: 1, eval_every: 20, log_every: 10}
optim: {lr: 0.01, min_lr: 0.001, warmup: 5, weight_decay: 0.01, clip: 1.0}
metrics: {file: $tmp/metrics.jsonl, plot: $tmp/loss.png}
YAML

if "$BATON" run "$tmp/job.yaml" > "$tmp/out.txt" 2>&1; then pass run_exit; else fail run_exit "rc $?"; cat "$tmp/out.txt"; fi
# loss falls: mean of the last 5 steps well below the first step
python3 - "$tmp/metrics.jsonl" <<'PY' 2>/dev/null && pass run_loss_falls || fail run_loss_falls "see $tmp"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
tr = [r["loss"] for r in rows if "loss" in r]
assert len(tr) == 40, len(tr)
assert sum(tr[-5:]) / 5 < 0.6 * tr[0], (tr[0], tr[-5:])
PY
if ! command -v python3 >/dev/null; then
    first=$(head -1 "$tmp/metrics.jsonl" | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/')
    last=$(grep '"loss"' "$tmp/metrics.jsonl" | tail -1 | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/')
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.6 * a) }' && pass run_loss_falls || fail run_loss_falls "$first -> $last"
fi
grep -q '^final validation loss [0-9.]*, perplexity [0-9.]*' "$tmp/out.txt" && pass run_val_ppl || fail run_val_ppl "no final perplexity line"
[ "$(grep -c '"val_loss"' "$tmp/metrics.jsonl")" -eq 2 ] && pass run_eval_every || fail run_eval_every "expected 2 eval lines"
grep -q '^step     40/40 | loss [0-9.]* | lr 1.000e-03 | gnorm [0-9.]* | [0-9.]* ms/step | [0-9]* tok/s | MFU [0-9.]*% | mem [0-9.]* [KMG]iB | skipped 0 | ETA 0s$' "$tmp/out.txt" \
    && pass run_progress_line || fail run_progress_line "$(grep 'step     40' "$tmp/out.txt")"
head -c 8 "$tmp/loss.png" | od -An -tx1 | grep -q '89 50 4e 47 0d 0a 1a 0a' && pass run_png || fail run_png "not a PNG"

# same seed, same run: identical metrics (deterministic data order and init)
"$BATON" run "$tmp/job.yaml" --quiet --set train.steps=5 --set metrics.file="$tmp/a.jsonl" --set metrics.plot= >/dev/null 2>&1
"$BATON" run "$tmp/job.yaml" --quiet --set train.steps=5 --set metrics.file="$tmp/b.jsonl" --set metrics.plot= >/dev/null 2>&1
if cmp -s <(sed 's/, "tokens_per_s.*//' "$tmp/a.jsonl") <(sed 's/, "tokens_per_s.*//' "$tmp/b.jsonl") && [ -s "$tmp/a.jsonl" ]; then
    pass run_reproducible; else fail run_reproducible "two runs differ"; fi
"$BATON" run "$tmp/job.yaml" --quiet --set train.steps=5 --set train.seed=2 --set metrics.file="$tmp/c.jsonl" --set metrics.plot= >/dev/null 2>&1
cmp -s <(sed 's/, "tokens_per_s.*//' "$tmp/a.jsonl") <(sed 's/, "tokens_per_s.*//' "$tmp/c.jsonl") \
    && fail run_seed_matters "seed 2 gave the same run" || pass run_seed_matters

# The CLI path (job file -> schedule/optimizer settings -> loop) reproduces
# the PyTorch reference of tests/fixtures/train_llama (tools/gen_train_fixture.py
# hyper-parameters) step by step, and exports the model every 5 steps.
fx=tests/fixtures/train_llama
cat > "$tmp/fixture.yaml" <<YAML
model: {hf: $fx}
data: {dir: $fx, seq_len: 16, split: 0}
train: {steps: 10, micro_batch: 2, grad_accum: 2, seed: 1234, log_every: 100}
optim: {lr: 0.01, min_lr: 0.001, warmup: 3, warmup_from: zero, betas: [0.9, 0.95], eps: 1e-8,
        weight_decay: 0.1, clip: 3.0, decay: matrices}
export: {dir: $tmp/ck, every: 5}
metrics: {file: $tmp/fx.jsonl}
YAML
"$BATON" run "$tmp/fixture.yaml" --quiet > "$tmp/fx.txt" 2>&1 || { fail run_cli_matches_torch "rc $?"; cat "$tmp/fx.txt"; }
sed -n 's/.*"loss": \([0-9.e+-]*\),.*/\1/p' "$tmp/fx.jsonl" > "$tmp/fx_baton"
sed -n 's/^ *"loss": \([0-9.e+-]*\),*$/\1/p' "$fx/expected.json" > "$tmp/fx_torch"
if [ "$(wc -l < "$tmp/fx_torch")" -eq 10 ] && paste "$tmp/fx_baton" "$tmp/fx_torch" |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $2) bad++; n++ } END { exit !(n == 10 && !bad) }'; then
    pass run_cli_matches_torch; else fail run_cli_matches_torch "$(paste "$tmp/fx_baton" "$tmp/fx_torch" | tr '\n' ' ')"; fi
[ -s "$tmp/ck/config.json" ] && [ -s "$tmp/ck/model.safetensors" ] && grep -q '"num_hidden_layers": 2' "$tmp/ck/config.json" \
    && pass run_checkpoint_export || fail run_checkpoint_export "no HF export in $tmp/ck"
# the exported model loads back as the HF input of another run (step-10 weights)
printf 'model: {hf: %s}\ndata: {dir: %s, seq_len: 16, split: 0.25}\ntrain: {steps: 1, micro_batch: 2}\n' \
    "$tmp/ck" "$fx" > "$tmp/reload.yaml"
"$BATON" run "$tmp/reload.yaml" > "$tmp/reload.txt" 2>&1 && grep -q '^final validation loss' "$tmp/reload.txt" \
    && pass run_export_reloads || fail run_export_reloads "$(tail -2 "$tmp/reload.txt")"

# errors: file:line:field for a bad value
printf 'data: {dir: x}\ntrain:\n  steps: many\n' > "$tmp/bad.yaml"
out=$("$BATON" run "$tmp/bad.yaml" 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"bad.yaml:3:10: train.steps: expected an integer"* ]] && pass run_bad_job || fail run_bad_job "rc $rc: $out"
# multi-process layouts run (launch/driver.h; equivalence in tests/test_dist_equiv.c)
out=$("$BATON" run "$tmp/job.yaml" --set parallel.pp=2 --set train.grad_accum=2 --set train.steps=5 \
      --set metrics.file= --set metrics.plot= 2>&1); rc=$?
[ $rc -eq 0 ] && [[ "$out" == *"2 processes (tp=1 pp=2 dp=1"* ]] && pass run_layout_multiprocess \
    || fail run_layout_multiprocess "rc $rc: $out"
out=$("$BATON" run "$tmp/job.yaml" --set parallel.split=[1,2] --set parallel.pp=2 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"parallel.split"*"sum to 3, but the model has 2 layers"* ]] && pass run_split_checked || fail run_split_checked "rc $rc: $out"
out=$("$BATON" run "$tmp/job.yaml" --set optim.lr=1e9 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"--set optim.lr=1e9: optim.lr: 1e9 is out of range"* ]] && pass run_override_checked || fail run_override_checked "rc $rc: $out"
# NaN: a NaN in the last weight of an HF model; the error names the step
cp -r tests/fixtures/train_llama "$tmp/nanmodel"
size=$(stat -c %s "$tmp/nanmodel/model.safetensors")
printf '\x00\x00\xc0\x7f' | dd of="$tmp/nanmodel/model.safetensors" bs=1 seek=$((size - 4)) conv=notrunc 2>/dev/null
printf 'model: {hf: %s}\ndata: {dir: tests/fixtures/train_llama, seq_len: 16}\ntrain: {steps: 3, micro_batch: 2}\n' \
    "$tmp/nanmodel" > "$tmp/nan.yaml"
out=$("$BATON" run "$tmp/nan.yaml" 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"step 1: loss is NaN"* ]] && pass run_nan_named || fail run_nan_named "rc $rc: $(echo "$out" | tail -2)"
# A huge dimension is refused before any process starts, naming the field,
# the estimate and the limit (it used to pass validation; each worker then
# grew to gigabytes with no output). The address-space cap makes the old
# behaviour fail fast instead of filling the machine.
for layout in single pp2; do
    sets=(--set model.vocab=16777216); [ $layout = pp2 ] && sets+=(--set parallel.pp=2)
    out=$( (cap_vm; BATON_MEM_LIMIT=2G timeout 60 "$BATON" run "$tmp/job.yaml" "${sets[@]}" \
           --set metrics.file= --set metrics.plot=) 2>&1); rc=$?
    want="--set model.vocab=16777216: model.vocab: the job needs about"
    [ $layout = pp2 ] && want="$want 32.[0-9] GiB of memory in 2 processes (the largest, rank 1, 16.[0-9] GiB: parameters 4.00 GiB" \
                      || want="$want 32.[0-9] GiB of memory (parameters 8.00 GiB, gradients 8.00 GiB, optimizer state 16.0 GiB"
    if [ $rc -eq 1 ] && grep -q -- "$want" <<<"$out" &&
       grep -Eq "more than the 2.00 GiB available \(BATON_MEM_LIMIT=2G\); (99|100)% of it is for model.vocab 16777216 x model.hidden 64" <<<"$out" &&
       ! grep -q "^step" <<<"$out"
    then pass run_mem_refused_$layout; else fail run_mem_refused_$layout "rc $rc: $(tail -3 <<<"$out")"; fi
done

# a long evaluation shows progress: with BATON_PROGRESS_SECONDS tiny, every
# batch after the first prints how far it is (one process) and the driver
# says how long the pass has run and how many ranks are done (pp=2; each
# evaluation forward made 400 ms slower, so that the pass lasts over a
# second against lines due every 0.1 s)
out=$(BATON_PROGRESS_SECONDS=1e-9 "$BATON" run "$tmp/job.yaml" --set train.steps=2 --set optim.warmup=1 \
      --set train.eval_every=2 --set train.eval_batches=3 --set data.split=0.5 --set metrics.file= --set metrics.plot= 2>&1)
grep -Eq '^eval  batch 1/3, [0-9]+ tokens scored, loss so far [0-9.]+, ETA [0-9]+ s$' <<<"$out" &&
    grep -q '^eval  batch 2/3' <<<"$out" && pass run_eval_progress || fail run_eval_progress "$(tail -5 <<<"$out")"
out=$(BATON_PROGRESS_SECONDS=0.1 BATON_TEST_SLOW_EVAL_MS=400 "$BATON" run "$tmp/job.yaml" --set parallel.pp=2 --set train.steps=2 --set optim.warmup=1 \
      --set train.eval_every=2 --set train.eval_batches=3 --set data.split=0.5 --set metrics.file= \
      --set metrics.plot= 2>&1)
grep -Eq '^eval  after step 2: [0-9]+ s so far, [01] of 2 ranks done$' <<<"$out" &&
    grep -q '^final validation loss' <<<"$out" && pass run_eval_progress_pp || fail run_eval_progress_pp "$(grep eval <<<"$out")"
