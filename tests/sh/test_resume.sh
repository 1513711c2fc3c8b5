#!/usr/bin/env bash
# Native checkpoints and --resume (docs/CHECKPOINTS.md): a run stopped after
# step 6 (train.stop_after, or kill -9 of a worker) and resumed continues
# bit for bit as the run that was never stopped: the same per-step losses
# (printed with 17 digits) and the same parameters and AdamW moments after
# the last step (shard files byte-identical). Options that carry state are
# on: tied embeddings, gradient accumulation, warmup still in progress at
# step 6 (warmup 8), ZeRO-1, the interleaved schedule. Resuming under other
# layouts (tp, pp, dp, uneven splits, ZeRO-1 on and off) continues within
# 1e-6 of the run that never changed layout. Each process may have a folder
# of its own (checkpoint.dir with {rank}); a file in none of them, a damaged
# file, a checkpoint of another model, and a rank whose writer never writes
# are clear errors.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_resume.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/data"
lcg_tokens 7 6000 48 10 64 > "$tmp/data/tokens.txt"
# 6 layers (splits 3+3, or 1+2+2+1); global batch 4 rows of 32 tokens
cat > "$tmp/job.yaml" <<YAML
model: {layers: 6, hidden: 64, heads: 4, kv_heads: 2, ffn: 128, vocab: 64, init_std: 0.02, tie_embeddings: true}
data: {dir: $tmp/data, seq_len: 32, split: 0.1}
train: {steps: 10, micro_batch: 1, grad_accum: 4, seed: 3, log_every: 100}
optim: {lr: 0.01, min_lr: 0.001, warmup: 8, weight_decay: 0.01, clip: 1.0}
checkpoint: {every: 3, keep: 2}
YAML

# run NAME [ARGS...]: one run whose metrics go to $tmp/NAME.jsonl and whose
# checkpoints go under $tmp/NAME unless ARGS say otherwise
run() {
    local name=$1; shift
    timeout "$(scaled 120)" "$BATON" run "$tmp/job.yaml" --quiet --set checkpoint.dir="$tmp/$name" \
        --set metrics.file="$tmp/$name.jsonl" "$@" > "$tmp/$name.out" 2>&1
}
# losses FILE: "step loss" per training step
losses() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "loss" in r: print(r["step"], repr(r["loss"]))' "$1"; }
# same_bits A B: the per-step losses of two runs are the same doubles
same_bits() { [ -s "$tmp/$1.jsonl" ] && cmp -s <(losses "$tmp/$1.jsonl") <(losses "$tmp/$2.jsonl"); }
# close A B: within 1e-6 relative at every step, all 10 steps there
close() { python3 - "$tmp/$1.jsonl" "$tmp/$2.jsonl" <<'PY'
import json, sys
def l(p): return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r}
a, b = l(sys.argv[1]), l(sys.argv[2])
assert sorted(a) == sorted(b) == list(range(1, 11)), (sorted(a), sorted(b))
bad = [(s, a[s], b[s]) for s in a if abs(a[s] - b[s]) > 1e-6 * abs(a[s])]
assert not bad, bad
PY
}
# same_state A B: the step-10 checkpoints hold the same bytes
same_state() {
    local f ok=1
    for f in "$tmp/$1"/step-00000010/shard-*.safetensors; do
        cmp -s "$f" "$tmp/$2/step-00000010/$(basename "$f")" || ok=0
    done
    [ -e "$f" ] && [ $ok = 1 ]
}
# stop_resume REF NAME [SETS...]: NAME stops after step 6, then resumes;
# both parts with SETS
stop_resume() {
    local ref=$1 name=$2; shift 2
    run "$name" --set train.stop_after=6 "$@" && run "$name" --resume "$@"
}

# ---- single process ------------------------------------------------------------
run one || fail resume_single_ref "$(tail -3 "$tmp/one.out")"
stop_resume one one_r || fail resume_single "$(tail -3 "$tmp/one_r.out")"
if same_bits one one_r && same_state one one_r; then pass resume_single_bit_exact
else fail resume_single_bit_exact "$(diff <(losses "$tmp/one.jsonl") <(losses "$tmp/one_r.jsonl") | head -4)"; fi
# retention: keep 2 of the saves at 3, 6, 9, 10; latest names the newest
if [ "$(cd "$tmp/one" && echo step-*)" = "step-00000009 step-00000010" ] &&
   [ "$(cat "$tmp/one/latest")" = step-00000010 ]; then pass resume_retention
else fail resume_retention "$(ls -a "$tmp/one")"; fi
# the metrics of the resumed run: steps 1..10 once each (the stopped part kept)
[ "$(losses "$tmp/one_r.jsonl" | cut -d' ' -f1 | tr '\n' ' ')" = "1 2 3 4 5 6 7 8 9 10 " ] \
    && pass resume_metrics_continue || fail resume_metrics_continue "$(losses "$tmp/one_r.jsonl" | cut -d' ' -f1 | tr '\n' ' ')"
# a committed step is never overwritten: resuming an older step into the
# same root is refused before training
cp "$tmp/one.jsonl" "$tmp/one.keep"
if run one --resume "$tmp/one/step-00000009"; then fail resume_no_overwrite "saved over step 10"
else grep -q 'already holds the checkpoint of step 10, newer than step 9' "$tmp/one.out" && pass resume_no_overwrite \
         || fail resume_no_overwrite "$(tail -2 "$tmp/one.out")"; fi
cp "$tmp/one.keep" "$tmp/one.jsonl"

# ---- multi-process, the same layout: bit for bit ----------------------------------
# pp=2 x dp=2 with ZeRO-1; tp=2 x pp=2; interleaved pp=2 v=2 (splits of 6 layers)
L1=(--set parallel.pp=2 --set parallel.dp=2 --set parallel.zero1=true --set parallel.microbatches=2)
L2=(--set parallel.tp=2 --set parallel.pp=2 --set parallel.microbatches=4)
L3=(--set parallel.pp=2 --set parallel.virtual_stages=2 --set parallel.schedule=interleaved
    --set parallel.split=[2,1,1,2] --set parallel.microbatches=4)
for k in 1 2 3; do
    eval "sets=(\"\${L$k[@]}\")"
    run "d$k" "${sets[@]}" || fail "resume_layout$k" "$(grep -v ' info ' "$tmp/d$k.out" | tail -3)"
    stop_resume "d$k" "d${k}_r" "${sets[@]}" || fail "resume_layout$k" "$(grep -v ' info ' "$tmp/d${k}_r.out" | tail -3)"
    if same_bits "d$k" "d${k}_r" && same_state "d$k" "d${k}_r"; then pass "resume_layout${k}_bit_exact"
    else fail "resume_layout${k}_bit_exact" "$(diff <(losses "$tmp/d$k.jsonl") <(losses "$tmp/d${k}_r.jsonl") | head -4)"; fi
done
# the same run as one process: the layouts agree with it to rounding
close one d1 && pass resume_layout_vs_single || fail resume_layout_vs_single

# kill -9 of a worker at the start of step 8, then resume from what was
# committed (step 6, or 3 if 6 was still being written): the same run
BATON_TEST_KILL=8@1 run k9 "${L1[@]}" && fail resume_kill9 "the run with a killed rank succeeded"
if grep -q 'rank 1 .*killed\|rank 1 (pid' "$tmp/k9.out" && [ -s "$tmp/k9/latest" ] &&
   run k9 --resume "${L1[@]}" && same_bits d1 k9 && same_state d1 k9; then pass resume_kill9
else fail resume_kill9 "$(grep -v ' info ' "$tmp/k9.out" | tail -3)"; fi

# ---- another layout on resume: resharding ------------------------------------------
# saved under tp=2 pp=2 dp=2 with ZeRO-1 (global batch 4 = dp 2 x 2 microbatches x 1 row)
S=(--set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero1=true --set parallel.microbatches=2)
run big "${S[@]}" || fail reshard_ref "$(grep -v ' info ' "$tmp/big.out" | tail -3)"
run big_6 "${S[@]}" --set train.stop_after=6 || fail reshard_save "$(grep -v ' info ' "$tmp/big_6.out" | tail -3)"
i=0
for to in "1 1 4 true 1 []" "2 1 2 false 2 []" "1 2 2 true 2 [4,2]" "1 4 1 false 4 [1,2,2,1]"; do
    read -r tp pp dp z mb split <<<"$to"
    i=$((i + 1))
    cp "$tmp/big_6.jsonl" "$tmp/re$i.jsonl"
    if run "re$i" --resume "$tmp/big_6" --set parallel.tp="$tp" --set parallel.pp="$pp" \
           --set parallel.dp="$dp" --set parallel.zero1="$z" --set parallel.microbatches="$mb" \
           --set parallel.split="$split" && close big "re$i"; then
        pass "reshard_to_tp${tp}_pp${pp}_dp${dp}"
    else fail "reshard_to_tp${tp}_pp${pp}_dp${dp}" "$(grep -v ' info ' "$tmp/re$i.out" | tail -3)"; fi
done
# resharded offline first (baton convert --layout), then resumed under it
"$BATON" convert --from "$tmp/big_6" --to "$tmp/conv6" --layout tp=1,pp=2,split=4+2 > "$tmp/conv.out" 2>&1 &&
    cp "$tmp/big_6.jsonl" "$tmp/cv.jsonl" &&
    run cv --resume "$tmp/conv6" --set parallel.pp=2 --set parallel.dp=2 --set parallel.split=[4,2] \
        --set parallel.microbatches=2 && close big cv \
    && pass reshard_offline_convert || fail reshard_offline_convert "$(cat "$tmp/conv.out"; grep -v ' info ' "$tmp/cv.out" | tail -3)"
# and back: stopped under pp=4 (uneven), resumed under the saving layout
run p4 --set parallel.pp=4 --set parallel.split=[1,2,2,1] --set parallel.microbatches=4 --set train.stop_after=6 &&
    cp "$tmp/p4.jsonl" "$tmp/back.jsonl" && run back --resume "$tmp/p4" "${S[@]}" && close big back \
    && pass reshard_back || fail reshard_back "$(grep -v ' info ' "$tmp/back.out" | tail -3)"

# ---- a folder per process; what is missing or damaged ---------------------------
run own "${L1[@]}" --set checkpoint.dir="$tmp/own/r{rank}" --set train.stop_after=6 &&
    [ -s "$tmp/own/r3/step-00000006/shard-r00003.safetensors" ] && [ ! -e "$tmp/own/r0/step-00000006/shard-r00003.safetensors" ] \
    && pass ckpt_dir_per_rank || fail ckpt_dir_per_rank "$(ls -R "$tmp/own" | head)"
cp -r "$tmp/own" "$tmp/own_copy"
cp -r "$tmp/own" "$tmp/own_p"
cp "$tmp/own.jsonl" "$tmp/own_r.jsonl"
run own_r "${L1[@]}" --set checkpoint.dir="$tmp/own/r{rank}" --resume && same_bits d1 own_r \
    && pass resume_from_rank_folders || fail resume_from_rank_folders "$(grep -v ' info ' "$tmp/own_r.out" | tail -3)"
# node-local disks (BATON_TEST_CKPT_LOCAL_ONLY: a rank sees its own folder
# only): what a rank lacks it fetches, by message through the driver, from the
# rank that wrote it; resumed the same layout bit for bit, and another
# layout (dp=4, ZeRO-1: every rank needs pieces of every file) to 1e-6
cp "$tmp/own.jsonl" "$tmp/own_l.jsonl"
BATON_LOG=info BATON_TEST_CKPT_LOCAL_ONLY=1 run own_l "${L1[@]}" --set checkpoint.dir="$tmp/own_p/r{rank}" --resume \
    && same_bits d1 own_l && grep -q 'fetched from other ranks' "$tmp/own_l.out" \
    && grep -q 'resume fetches: [1-9][0-9]* forwarded' "$tmp/own_l.out" \
    && pass resume_fetch_from_peers || fail resume_fetch_from_peers "$(grep -v ' info ' "$tmp/own_l.out" | tail -3)"
cp "$tmp/own.jsonl" "$tmp/own_d4.jsonl"
rm -rf "$tmp/own_p"
cp -r "$tmp/own_copy" "$tmp/own_p"
BATON_LOG=info BATON_TEST_CKPT_LOCAL_ONLY=1 run own_d4 --set parallel.dp=4 --set parallel.zero1=true --set parallel.microbatches=1 \
    --set checkpoint.dir="$tmp/own_p/r{rank}" --resume && close d1 own_d4 \
    && grep -q 'fetched from other ranks' "$tmp/own_d4.out" \
    && pass resume_fetch_reshard || fail resume_fetch_reshard "$(grep -v ' info ' "$tmp/own_d4.out" | tail -3)"
# fewer processes than saved it (dp=2 from pp=2 x dp=2): the folders of ranks 2
# and 3 belong to no rank of the new job; the driver finds them and serves
# their files itself
rm -rf "$tmp/own_p"
cp -r "$tmp/own_copy" "$tmp/own_p"
cp "$tmp/own.jsonl" "$tmp/own_d2.jsonl"
BATON_LOG=info BATON_TEST_CKPT_LOCAL_ONLY=1 run own_d2 --set parallel.dp=2 --set parallel.zero1=true --set parallel.microbatches=2 \
    --set checkpoint.dir="$tmp/own_p/r{rank}" --resume && close d1 own_d2 \
    && grep -q 'resume fetches: [0-9]* forwarded to the ranks that wrote them, [1-9][0-9]* served here' "$tmp/own_d2.out" \
    && pass resume_fewer_ranks || fail resume_fewer_ranks "$(grep -v ' info ' "$tmp/own_d2.out" | tail -3)"
# rank 3's folder gone: its file is in none of them, said before any rank starts
rm -rf "$tmp/own_copy/r3"
run own_copy "${L1[@]}" --set checkpoint.dir="$tmp/own_copy/r{rank}" --resume "$tmp/own_copy/r0/step-00000006"
grep -q 'file shard-r00003.safetensors (listed in its index) is in none of the' "$tmp/own_copy.out" \
    && pass resume_missing_file || fail resume_missing_file "$(grep -v ' info ' "$tmp/own_copy.out" | tail -2)"
# a damaged byte: the checksum names the file
cp -r "$tmp/one" "$tmp/bad"
f="$tmp/bad/step-00000010/shard-r00000.safetensors"
printf '\x55' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 9 )) conv=notrunc status=none
run bad --resume "$tmp/bad/step-00000010" --set train.steps=12
grep -q 'shard-r00000.safetensors.*checksum' "$tmp/bad.out" && pass resume_bad_checksum \
    || fail resume_bad_checksum "$(tail -2 "$tmp/bad.out")"
# truncated
truncate -s 1000 "$f"
run bad --resume "$tmp/bad/step-00000010" --set train.steps=12
grep -q 'shard-r00000.safetensors.*1000 bytes' "$tmp/bad.out" && pass resume_truncated \
    || fail resume_truncated "$(tail -2 "$tmp/bad.out")"
# another model
run other --resume "$tmp/one/step-00000009" --set model.hidden=32 --set model.heads=2 --set model.kv_heads=1
grep -q 'a checkpoint of another model' "$tmp/other.out" && pass resume_other_model \
    || fail resume_other_model "$(tail -2 "$tmp/other.out")"
# a writer that never writes: the save fails within the step timeout, naming it
t0=$(date +%s)
BATON_TEST_CKPT_HANG=2 BATON_STEP_TIMEOUT=3 run hang "${L1[@]}" && fail ckpt_writer_hang "succeeded"
t1=$(date +%s)
grep -q 'checkpoint of step 3 did not finish within 3 s.*no file written by rank(s) 2' "$tmp/hang.out" &&
    [ $((t1 - t0)) -le "$(scaled 30)" ] && pass ckpt_writer_hang \
    || fail ckpt_writer_hang "$((t1 - t0)) s: $(grep -v ' info ' "$tmp/hang.out" | tail -2)"
