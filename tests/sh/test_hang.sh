#!/usr/bin/env bash
# Hang forensics (launch/hang.h): a rank that stalls inside a collective
# (BATON_TEST_COLL_STALL: rank 1 of dp0 never arrives at the group's 4th
# call, the all-reduce of step 3's gradients) or a stage that never sends
# an activation (BATON_TEST_HOLD_ACTIVATION: rank 0's of step 3,
# microbatch 0) fails the job at the step timeout with a report naming the
# group, the call's number, kind and size, the ranks that arrived and those
# that did not, and the missing ranks' state and last messages; every
# process is gone afterwards. With restart configured (restart.max) the same
# stall, in the first attempt only, restarts the job from its latest
# checkpoint, and it ends with the undisturbed run's losses bit for bit. A
# heartbeat interval not shorter than the heartbeat timeout is refused.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_hang.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/data"
awk 'BEGIN { for (i = 0; i < 3000; i++) printf "%d ", (i * 7) % 50; print "" }' > "$tmp/data/tokens.txt"
step_to=$(scaled 2)
job() { # LAYOUT [MORE_YAML]
    cat > "$tmp/job.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 2, kv_heads: 2, ffn: 64, vocab: 64}
data: {dir: $tmp/data, seq_len: 8, split: 0}
train: {steps: 20, micro_batch: 1, grad_accum: 2, log_every: 1}
optim: {lr: 0.001, min_lr: 0.0001, warmup: 0}
parallel: {$1}
launch: {step_timeout: $step_to}
runs: $tmp/runs
${2:-}
YAML
}
# hang NAME ENV...: run the job with ENV; sets rc and secs; output in $tmp/NAME.out
hang() {
    local name=$1; shift
    local t0 t1
    t0=$(date +%s.%N)
    # its own session: whatever of the job is left afterwards is in it
    env "$@" setsid --wait bash -c 'echo $$ > "$1"; exec timeout "$2" "$3" run "$4"' _ "$tmp/sid" \
        "$(scaled 60)" "$BATON" "$tmp/job.yaml" > "$tmp/$name.out" 2>&1; rc=$?
    t1=$(date +%s.%N)
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
    echo "$name: exit $rc after $secs s"
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && pass "${name}_fails" || fail "${name}_fails" "rc $rc"
    # the step timeout + 10 s, from the start of the run (start-up included)
    awk -v s="$secs" -v b="$((step_to + $(scaled 10)))" 'BEGIN { exit !(s < b) }' && pass "${name}_in_time" || fail "${name}_in_time" "$secs s"
    local left
    sleep 0.2
    left=$(pgrep -s "$(cat "$tmp/sid")" | tr '\n' ' ')
    [ -z "$left" ] && pass "${name}_no_orphans" || fail "${name}_no_orphans" "$left"
}
has() { # NAME TEST PATTERN: the output of run NAME has a line matching PATTERN
    if grep -q -- "$3" "$tmp/$1.out"; then pass "$2"; else fail "$2" "no '$3' in: $(sed -n '/hang report/,$p' "$tmp/$1.out" | head -12)"; fi
}

job "dp: 2"
hang coll BATON_TEST_COLL_STALL=dp0:1:4
params=$(sed -n 's/.*parameters (\([0-9]*\)).*/\1/p' "$tmp/coll.out")
has coll coll_watchdog "job failed: step 3 did not finish within $step_to s (step watchdog"
# the group's 4th call: its start-up barrier, then one gradient all-reduce
# per step (every f32 gradient: 4 bytes per parameter)
has coll coll_names_call "^  collective dp0 #4 all_reduce of $((params * 4)) bytes, group of 2: arrived rank(s) 0 ([0-9.]* s); not arrived rank(s) 1$"
has coll coll_missing_state "^    missing rank 1 (pid [0-9]*, host local, tp=0 dp=1 pp=0): computing (a job of step 3, [0-9.]* s so far), in no collective; last sent DATA_BATCH (step 3 microbatch 1) to rank 1 [0-9.]* s ago; last handled DATA_BATCH (step 3 microbatch 1) from rank 1"
has coll coll_arrived_state "^    rank 0 (pid [0-9]*, host local, tp=0 dp=0 pp=0): waits [0-9.]* s in dp0 #4 all_reduce"

# launch.collective_timeout below the step timeout: the waiting rank's
# collective gives up first and names the call
job "dp: 2"
# (3 s: a rank that is only slow to arrive, under a sanitizer on a loaded
# machine, must not trip it in steps 1 and 2)
coll_to=$(scaled 3)
sed -i "s/^launch: {step_timeout: $step_to}\$/launch: {step_timeout: $step_to, collective_timeout: $coll_to}/" "$tmp/job.yaml"
sed -i "s/^launch: {step_timeout: $step_to, /launch: {step_timeout: $(scaled 60), /" "$tmp/job.yaml"
hang colltimeout BATON_TEST_COLL_STALL=dp0:1:4
has colltimeout coll_timeout_own "coll dp0 rank 0: all_reduce #4 made no progress for ${coll_to}000 ms (a peer is dead or stuck)"
if grep -q "step watchdog" "$tmp/colltimeout.out"; then fail coll_timeout_first "the step watchdog fired"; else pass coll_timeout_first; fi

job "pp: 2"
hang pipe BATON_TEST_HOLD_ACTIVATION=3@0
has pipe pipe_waiter "^  pipeline: rank 1 (pid [0-9]*, host local, tp=0 dp=0 pp=1) waits [0-9.]* s for the ACTIVATION of step 3 microbatch 0 (virtual stage 1) from rank 0$"
# 1F1B with 2 microbatches: rank 0 sent microbatch 1's activation, never 0's,
# and waits for the gradient of 0
has pipe pipe_sender "^    from rank 0 (pid [0-9]*, host local, tp=0 dp=0 pp=0): waits [0-9.]* s for the ACT_GRAD of step 3 microbatch 0 from rank 1; last sent ACTIVATION (step 3 microbatch 1) to rank 1"

# a hang with restart configured restarts: the stall happens in attempt 1
# only (BATON_TEST_COLL_STALL .../1); attempt 2 resumes from the checkpoint
# of step 1 or 2 (one per step) and trains to the end
losses() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "loss" in r: print(r["step"], repr(r["loss"]))' "$1"; }
rundir() { sed -n 's/^baton run .*: run [^ ]* in \(.*\)$/\1/p' "$1" | head -1; }
job "dp: 2" "checkpoint: {dir: \"{run}/ckpt\", every: 1}"
timeout "$(scaled 60)" "$BATON" run "$tmp/job.yaml" > "$tmp/ref.out" 2>&1; rc=$?
ref=$(rundir "$tmp/ref.out")
[ "$rc" -eq 0 ] && [ "$(losses "$ref/metrics.jsonl" | wc -l)" -eq 20 ] && pass restart_ref_trains \
    || fail restart_ref_trains "rc $rc: $(tail -3 "$tmp/ref.out")"
job "dp: 2" "checkpoint: {dir: \"{run}/ckpt\", every: 1}
restart: {max: 1}"
BATON_TEST_COLL_STALL=dp0:1:4/1 timeout "$(scaled 60)" "$BATON" run "$tmp/job.yaml" > "$tmp/restart.out" 2>&1; rc=$?
dir=$(rundir "$tmp/restart.out")
echo "restart: exit $rc"
[ "$rc" -eq 0 ] && grep -q "^restart 1 of 1: from the latest checkpoint$" "$tmp/restart.out" \
    && grep -q "^resuming from $dir/ckpt/step-0000000[12]: step [12]," "$tmp/restart.out" \
    && pass restart_after_hang || fail restart_after_hang "rc $rc: $(grep -E '^restart|^resuming|job failed' "$tmp/restart.out")"
cmp -s <(losses "$ref/metrics.jsonl") <(losses "$dir/metrics.jsonl") && [ "$(losses "$dir/metrics.jsonl" | wc -l)" -eq 20 ] \
    && pass restart_after_hang_same_losses || fail restart_after_hang_same_losses "$(diff <(losses "$ref/metrics.jsonl") <(losses "$dir/metrics.jsonl") | head -6)"
# the first attempt's log holds its verdict and hang report; the run record its failure
grep -q "^job failed: step 3 did not finish within $step_to s (step watchdog" "$dir/attempt-1.log" \
    && grep -q "^  collective dp0 #4 all_reduce of [0-9]* bytes, group of 2: arrived rank(s) 0 ([0-9.]* s); not arrived rank(s) 1$" "$dir/attempt-1.log" \
    && grep -q "^exit status 0 (finished)$" "$dir/attempt-2.log" \
    && [[ "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["attempts"][0]["failure"])' "$dir/run.json" 2>&1)" == "step 3 did not finish within $step_to s"* ]] \
    && pass restart_after_hang_logged || fail restart_after_hang_logged "$(head -4 "$dir"/attempt-*.log)"

# the interval must be shorter than the timeout
"$BATON" run "$tmp/job.yaml" --set launch.heartbeat_interval=5 > "$tmp/bad.out" 2>&1; rc=$?
[ "$rc" -ne 0 ] && grep -q "launch.heartbeat_interval: 5 s is not shorter than launch.heartbeat_timeout (5 s)" "$tmp/bad.out" \
    && pass interval_checked || fail interval_checked "rc $rc: $(cat "$tmp/bad.out")"
exit 0
