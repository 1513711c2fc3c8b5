#!/usr/bin/env bash
# Failure handling: SIGKILL one rank of a running multi-process job. The
# driver must exit non-zero within a few seconds with a message naming the
# rank, and leave no process of the job behind.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_dist_kill.XXXXXX)
driver=
cleanup() { [ -n "$driver" ] && kill -9 "$driver" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

mkdir -p "$tmp/data"
awk 'BEGIN { for (i = 0; i < 3000; i++) printf "%d ", (i * 7) % 50; print "" }' > "$tmp/data/tokens.txt"
cat > "$tmp/job.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 2, kv_heads: 2, ffn: 64, vocab: 64}
data: {dir: $tmp/data, seq_len: 8, split: 0}
train: {steps: 100000, micro_batch: 1, grad_accum: 2, log_every: 100000}
optim: {lr: 0.001, min_lr: 0.0001, warmup: 0}
parallel: {pp: 2, dp: 2}
metrics: {file: $tmp/m.jsonl}
launch: {heartbeat_interval: 0.3}
YAML

# start_job OUT [VAR=value ...]: start the job in the background (its pid in
# $driver) and wait until it trains (three lines in the metrics file).
start_job() {
    local out=$1; shift
    rm -f "$tmp/m.jsonl"
    env "$@" "$BATON" run "$tmp/job.yaml" > "$out" 2>&1 &
    driver=$!
    for _ in $(seq 1 "$(scaled 100)"); do
        [ -s "$tmp/m.jsonl" ] && [ "$(wc -l < "$tmp/m.jsonl")" -ge 3 ] && break
        sleep 0.1
    done
}
# wait_driver: wait for the driver; sets rc and secs (since the call)
wait_driver() {
    local t0 t1
    t0=$(date +%s.%N)
    wait "$driver"; rc=$?
    t1=$(date +%s.%N)
    driver=
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
}
# still_running PIDS...: those of PIDS still alive (after a short grace)
still_running() {
    sleep 0.2
    local left="" p
    for p in "$@"; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
    echo "$left"
}
# stale_run_dirs: run directories of this test's job that were not removed
stale_run_dirs() {
    local stale="" d
    for d in /tmp/baton-run-*; do [ -d "$d" ] && grep -qs "$tmp" "$d/job.yaml" && stale="$stale $d"; done
    echo "$stale"
}

# SIGKILL of rank 3: the driver names it, exits non-zero fast, leaves no
# process and removes the run directory.
start_job "$tmp/out.txt"
[ "$(wc -l < "$tmp/m.jsonl" 2>/dev/null || echo 0)" -ge 3 ] && pass kill_job_running || fail kill_job_running "$(tail -5 "$tmp/out.txt")"
workers=$(pgrep -P "$driver" | tr '\n' ' ')
victim=$(pgrep -P "$driver" -f -- '--rank 3$')
if [ -z "$victim" ]; then
    fail kill_find_rank "no rank 3 among children ($workers)"
    kill -9 "$driver" 2>/dev/null
    wait_driver
else
    kill -9 "$victim"
    wait_driver
    echo "driver exited $rc after $secs s"
    [ "$rc" -ne 0 ] && pass kill_exit_nonzero || fail kill_exit_nonzero "rc 0"
    awk -v s="$secs" -v b="$(scaled 5)" 'BEGIN { exit !(s < b) }' && pass kill_exit_fast || fail kill_exit_fast "$secs s"
    grep -q "job failed: rank 3 (pid $victim, host local, tp=0 dp=1 pp=1) killed by signal 9" "$tmp/out.txt" \
        && pass kill_names_rank || fail kill_names_rank "$(grep 'job failed' "$tmp/out.txt")"
    left=$(still_running $workers)
    [ -z "$left" ] && pass kill_no_orphans || { fail kill_no_orphans "still running:$left"; kill -9 $left 2>/dev/null; }
    stale=$(stale_run_dirs)
    [ -z "$stale" ] && pass kill_run_dir_removed || fail kill_run_dir_removed "$stale"
fi

# SIGTERM to the driver: the job stops as for a failure, every worker is
# reaped and the run directory removed.
start_job "$tmp/out3.txt"
workers=$(pgrep -P "$driver" | tr '\n' ' ')
kill -TERM "$driver"
wait_driver
left=$(still_running $workers)
stale=$(stale_run_dirs)
if [ "$rc" -ne 0 ] && [ -n "$workers" ] && [ -z "$left" ] && [ -z "$stale" ] && grep -q "interrupted by a signal" "$tmp/out3.txt"; then
    pass sigterm_stops_job; else fail sigterm_stops_job "rc $rc, left:$left, stale:$stale"; fi

# A frozen rank (SIGSTOP: alive, links open, silent): the heartbeat check
# names it; with a long heartbeat timeout the step watchdog does.
frozen() { # name, expected text, env...
    local name=$1 want=$2; shift 2
    start_job "$tmp/out2.txt" "$@"
    local ws v
    ws=$(pgrep -P "$driver" | tr '\n' ' ')
    v=$(pgrep -P "$driver" -f -- '--rank 2$')
    [ -n "$v" ] && kill -STOP "$v"
    wait_driver
    echo "$name: driver exited $rc after $secs s"
    if [ -n "$v" ] && [ "$rc" -ne 0 ] && grep -q -- "$want" "$tmp/out2.txt" && awk -v s="$secs" -v b="$(scaled 8)" 'BEGIN { exit !(s < b) }'; then
        pass "$name"; else fail "$name" "rc $rc, $secs s: $(grep 'job failed' "$tmp/out2.txt")"; fi
    local left
    left=$(still_running $ws)
    [ -z "$left" ] && pass "${name}_no_orphans" || { fail "${name}_no_orphans" "still running:$left"; kill -9 $left 2>/dev/null; }
}
frozen heartbeat_names_rank "job failed: rank 2 (pid [0-9]*, host local, tp=0 dp=0 pp=1): no heartbeat for" \
    BATON_HEARTBEAT_TIMEOUT=1
frozen step_watchdog "did not finish within 1 s (step watchdog" BATON_HEARTBEAT_TIMEOUT=60 BATON_STEP_TIMEOUT=1
exit 0
