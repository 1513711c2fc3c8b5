#!/usr/bin/env bash
# The CP ring's blocks as messages between stage actors (train/cp_ring.h,
# docs/PARALLEL.md "Ring mode"). Asserted:
#   cp_msgs_trace_cpN   a traced ring run (cp 2 and cp 4, 2 layers, 2
#                       microbatches, 3 steps, parallel.cp_exchange auto on
#                       the cpu) has, on every edge r -> r+1 of the ring and
#                       on no other, CP_BLOCK messages numbering
#                       steps * microbatches * layers * (forward K, V:
#                       2 (cp-1); backward K, V: 2 (cp-1), dK, dV: 2 cp),
#                       every one received;
#   cp_msgs_same_losses the same job with parallel.cp_exchange=collective
#                       logs the same losses, digit for digit, and its trace
#                       has no CP_BLOCK;
#   cp_msgs_kill_*      rank 1 of a cp 2 ring killed before sending its K
#                       block of layer 1 in step 2 (BATON_TEST_CP_KILL):
#                       the job fails well before the step timeout, rank 0
#                       logs which block it waited for (CP group, step,
#                       microbatch, layer, pass and ring step, the peer's CP
#                       rank and rank), and no process is left. Rank 0 may
#                       still wait in layer 0 (the blocks rank 1 handed its
#                       loop before it died may never have left), for K or
#                       V, and the reason is the peer's failure or, if the
#                       driver's stop comes first, the stage stopping.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_cp_msgs.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/data"
awk 'BEGIN { for (i = 0; i < 3000; i++) printf "%d ", (i * 7) % 50; print "" }' > "$tmp/data/tokens.txt"
steps=3 mbs=2 layers=2
cat > "$tmp/job.yaml" <<YAML
model: {layers: $layers, hidden: 32, heads: 2, kv_heads: 2, ffn: 64, vocab: 64}
data: {dir: $tmp/data, seq_len: 16, split: 0}
train: {steps: $steps, micro_batch: 1, grad_accum: $mbs, log_every: 1}
optim: {lr: 0.001, min_lr: 0.0001, warmup: 0}
parallel: {cp: 2, cp_mode: ring}
runs: $tmp/runs
YAML

# run NAME ARGS...: output in $tmp/NAME.out, trace in $tmp/NAME.tr
run() {
    local name=$1; shift
    timeout "$(scaled 120)" "$BATON" run "$tmp/job.yaml" --set trace.dir="$tmp/$name.tr" "$@" \
        > "$tmp/$name.out" 2>&1
}
losses() { sed -n 's/^step .*| loss \([0-9.]*\) .*/\1/p' "$tmp/$1.out" | tr '\n' ' '; }

for cp in 2 4; do
    run "m$cp" --set parallel.cp=$cp || fail "cp_msgs_run_cp$cp" "rc $?: $(tail -3 "$tmp/m$cp.out")"
    "$BATON" trace "$tmp/m$cp.tr" --summary > "$tmp/m$cp.sum" 2>&1
    want=$((steps * mbs * layers * (4 * (cp - 1) + 2 * cp)))
    # lines "stage rA ... stage rB ... CP_BLOCK count bytes received mean p99"
    got=$(awk '$(NF-5) == "CP_BLOCK" { for (i = 1; i <= NF; i++) if ($i ~ /^r[0-9]+$/) { r[++n] = substr($i, 2) }
               print r[1] "->" r[2], $(NF-4), $(NF-2); n = 0 }' "$tmp/m$cp.sum" | sort -n)
    expect=$(for ((r = 0; r < cp; r++)); do echo "$r->$(((r + 1) % cp)) $want $want"; done | sort -n)
    [ -n "$got" ] && [ "$got" = "$expect" ] && pass "cp_msgs_trace_cp$cp" \
        || fail "cp_msgs_trace_cp$cp" "want [$expect], got [$got]: $(grep -i 'src\|CP_BLOCK' "$tmp/m$cp.sum")"
done

run coll --set parallel.cp_exchange=collective || fail cp_msgs_run_collective "rc $?: $(tail -3 "$tmp/coll.out")"
a=$(losses m2) b=$(losses coll)
[ -n "$a" ] && [ "$(wc -w <<<"$a")" -eq $steps ] && [ "$a" = "$b" ] && pass cp_msgs_same_losses \
    || fail cp_msgs_same_losses "messages [$a], collective [$b]"
! grep -q CP_BLOCK <("$BATON" trace "$tmp/coll.tr" --summary 2>&1) && pass cp_msgs_collective_has_none \
    || fail cp_msgs_collective_has_none "the collective run sent CP_BLOCK messages"

# a CP peer killed in the middle of step 2
step_to=$(scaled 30)
t0=$(date +%s.%N)
BATON_TEST_CP_KILL=1:2:1 setsid --wait bash -c 'echo $$ > "$1"; exec timeout "$2" "$3" run "$4" --set launch.step_timeout="$5"' \
    _ "$tmp/sid" "$(scaled 60)" "$BATON" "$tmp/job.yaml" "$step_to" > "$tmp/kill.out" 2>&1; rc=$?
t1=$(date +%s.%N)
secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && pass cp_msgs_kill_fails || fail cp_msgs_kill_fails "rc $rc"
# not the watchdog: the peer's death ends the wait
awk -v s="$secs" -v b="$((step_to / 2))" 'BEGIN { exit !(s < b) }' && pass cp_msgs_kill_fast \
    || fail cp_msgs_kill_fast "$secs s (step timeout $step_to s)"
grep -q 'fault injection: rank 1 killed before sending its K block of layer 1 in step 2' "$tmp/kill.out" &&
    grep -qE 'rank 0: CP ring \(CP group of ranks 0 1; CP rank 0 of 2\), step 2 microbatch 0, layer [01], forward ring step 0: the [KV] block from CP rank 1 \(rank 1\) will not come: (rank 1 failed|this rank.s stage is stopping)' "$tmp/kill.out" &&
    pass cp_msgs_kill_error || fail cp_msgs_kill_error "$(grep -v '^step' "$tmp/kill.out" | head -12)"
sleep 0.2
left=$(pgrep -s "$(cat "$tmp/sid")" | tr '\n' ' ')
[ -z "$left" ] && pass cp_msgs_kill_no_orphans || fail cp_msgs_kill_no_orphans "$left"
