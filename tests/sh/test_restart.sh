#!/usr/bin/env bash
# Automatic restart (launch/restart.h, job field restart.max): a pp=2 dp=2
# run whose ranks are killed twice (BATON_TEST_KILL: rank 1 at step 4 in
# the first attempt, rank 2 at step 7 in the second) resumes each time from
# its latest checkpoint and ends with the same per-step losses, bit for bit,
# as the run that was never disturbed; the run record and the attempt logs
# say how many restarts happened and why. A spent budget (a rank killed at
# step 3 in every attempt) ends with one error listing each attempt's failure.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_restart.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/data"
lcg_tokens 5 3000 40 9 64 > "$tmp/data/tokens.txt"
# checkpoint every step: a save waits for the one before to commit, so when
# step k starts the checkpoint of step k-2 is committed (the resume point of
# a kill at step k is step k-2 or k-1, never the start)
cat > "$tmp/job.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 2, kv_heads: 2, ffn: 64, vocab: 64}
data: {dir: $tmp/data, seq_len: 8, split: 0}
train: {steps: 8, micro_batch: 1, grad_accum: 2, seed: 4, log_every: 100}
optim: {lr: 0.01, min_lr: 0.001, warmup: 3, weight_decay: 0.01}
parallel: {pp: 2, dp: 2}
checkpoint: {dir: "{run}/ckpt", every: 1}
restart: {max: 2}
runs: $tmp/runs
YAML
losses() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "loss" in r: print(r["step"], repr(r["loss"]))' "$1"; }
run() { # NAME ENV...: one run; its exit status in rc, its directory in dir
    local t0=$(date +%s.%N)
    local name=$1; shift
    env "$@" timeout "$(scaled 120)" "$BATON" run "$tmp/job.yaml" > "$tmp/$name.out" 2>&1; rc=$?
    dir=$(sed -n 's/^baton run .*: run [^ ]* in \(.*\)$/\1/p' "$tmp/$name.out" | head -1)
    echo "$name: exit $rc after $(awk -v a="$t0" -v b="$(date +%s.%N)" "BEGIN { printf \"%.1f\", b - a }") s"
}
attempt() { # DIR N FIELD: field FIELD of attempt N (0: the first) in DIR/run.json
    python3 -c 'import json, sys; a = json.load(open(sys.argv[1]))["attempts"][int(sys.argv[2])]; print(a.get(sys.argv[3], ""))' "$1/run.json" "$2" "$3"; }

run ref
ref=$dir
[ "$rc" -eq 0 ] && [ "$(losses "$ref/metrics.jsonl" | wc -l)" -eq 8 ] && pass ref_trains || fail ref_trains "rc $rc: $(tail -3 "$tmp/ref.out")"

run killed BATON_TEST_KILL=4@1/1,7@2/2
[ "$rc" -eq 0 ] && pass killed_finishes || fail killed_finishes "rc $rc: $(grep -E 'job failed|error' "$tmp/killed.out" | head -5)"
cmp -s <(losses "$ref/metrics.jsonl") <(losses "$dir/metrics.jsonl") && [ "$(losses "$dir/metrics.jsonl" | wc -l)" -eq 8 ] \
    && pass killed_same_losses || fail killed_same_losses "$(diff <(losses "$ref/metrics.jsonl") <(losses "$dir/metrics.jsonl") | head -6)"
[ "$(grep -c '^restart [12] of 2: from the latest checkpoint$' "$tmp/killed.out")" -eq 2 ] \
    && grep -q "^resuming from $dir/ckpt/step-0000000[23]: step [23]," "$tmp/killed.out" \
    && grep -q "^resuming from $dir/ckpt/step-0000000[56]: step [56]," "$tmp/killed.out" \
    && pass killed_resumes_checkpoints || fail killed_resumes_checkpoints "$(grep -E '^restart|^resuming' "$tmp/killed.out")"
r=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["restarts"])' "$dir/run.json" 2>&1)
[ "$r" = 2 ] && pass record_restarts || fail record_restarts "$r"
f0=$(attempt "$dir" 0 failure); f1=$(attempt "$dir" 1 failure); f2=$(attempt "$dir" 2 failure)
[[ "$f0" == "rank 1 (pid "*", host local, tp=0 dp=1 pp=0) killed by signal 9 (Killed) during step 4"* ]] \
    && [[ "$f1" == "rank 2 (pid "*", host local, tp=0 dp=0 pp=1) killed by signal 9 (Killed) during step 7"* ]] \
    && [ -z "$f2" ] && [ "$(attempt "$dir" 2 exit)" = 0 ] && [ "$(attempt "$dir" 0 resumed_from)" = start ] && [ "$(attempt "$dir" 1 resumed_from)" = latest ] \
    && pass record_why || fail record_why "0: $f0 | 1: $f1 | 2: $f2"
grep -q "^job failed: rank 1 (pid [0-9]*, host local, tp=0 dp=1 pp=0) killed by signal 9 (Killed) during step 4" "$dir/attempt-1.log" \
    && grep -q "^job failed: rank 2 (pid [0-9]*, host local, tp=0 dp=0 pp=1) killed by signal 9 (Killed) during step 7" "$dir/attempt-2.log" \
    && grep -q "^attempt 3 of 3: resuming from latest$" "$dir/attempt-3.log" \
    && grep -q "^exit status 0 (finished)$" "$dir/attempt-3.log" \
    && pass attempt_logs || fail attempt_logs "$(head -3 "$dir"/attempt-*.log)"

sed -i 's/restart: {max: 2}/restart: {max: 1}/' "$tmp/job.yaml"
run spent BATON_TEST_KILL=3@1
[ "$rc" -ne 0 ] && pass spent_fails || fail spent_fails "rc $rc"
grep -q "^baton run: $tmp/job.yaml: the job failed 2 times, restart.max = 1 restart spent:$" "$tmp/spent.out" \
    && [ "$(grep -c "^  attempt [12]: job failed: rank 1 (pid [0-9]*, host local, tp=0 dp=1 pp=0) killed by signal 9 (Killed) during step 3" "$tmp/spent.out")" -eq 2 ] \
    && pass spent_lists_attempts || fail spent_lists_attempts "$(grep -A3 'the job failed' "$tmp/spent.out")"
r=$(python3 -c 'import json, sys; o = json.load(open(sys.argv[1])); print(o["restarts"], len(o["attempts"]), o["attempts"][1]["exit"])' "$dir/run.json" 2>&1)
[ "$r" = "1 2 1" ] && pass spent_record || fail spent_record "$r"
exit 0
