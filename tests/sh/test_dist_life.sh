#!/usr/bin/env bash
# Nothing of a multi-process job outlives it, whoever dies first: the job
# secret is never in a file (the workers get it through a pipe), and the run
# directory and every process of the job are gone after the driver ends by
# SIGKILL (mid-run and during start-up), by abort (SIGABRT), by a closed
# standard output (`| head -1`: no SIGPIPE death, a clean stop instead) and
# at a normal end. The driver's run directories go to a TMPDIR of this test
# only, so "nothing left" is: that folder is empty and no process names this
# test's folder on its command line.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_dist_life.XXXXXX)
export TMPDIR=$tmp/t
mkdir -p "$TMPDIR"
ulimit -c 0
driver=
job_pids() { pgrep -f -- "$tmp/" | tr '\n' ' '; }
cleanup() {
    [ -n "$driver" ] && kill -9 "$driver" 2>/dev/null
    local p
    for p in $(job_pids); do kill -9 "$p" 2>/dev/null; done
    [ -n "${KEEP:-}" ] || rm -rf "$tmp"
}
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
YAML

# start_job OUT [--set ...]: the job in the background (pid in $driver),
# waiting until it trains (three metrics lines) or at most 10 s.
start_job() {
    local out=$1; shift
    rm -f "$tmp/m.jsonl"
    "$BATON" run "$tmp/job.yaml" "$@" > "$out" 2>&1 &
    driver=$!
    for _ in $(seq 1 100); do
        [ -s "$tmp/m.jsonl" ] && [ "$(wc -l < "$tmp/m.jsonl")" -ge 3 ] && break
        sleep 0.1
    done
}
# nothing_left NAME: after the driver ended, TMPDIR must become empty and
# the job's processes (guard, workers) must end; each has up to 5 s.
nothing_left() {
    local name=$1 files procs
    for _ in $(seq 1 50); do
        files=$(cd "$TMPDIR" && find . -mindepth 1 | sort | tr '\n' ' ')
        procs=$(job_pids)
        [ -z "$files" ] && [ -z "$procs" ] && break
        sleep 0.1
    done
    if [ -z "$files" ] && [ -z "$procs" ]; then pass "$name"; else
        fail "$name" "left in TMPDIR: ${files:-none}; processes: ${procs:-none}"
        local p
        for p in $procs; do kill -9 "$p" 2>/dev/null; done
        rm -rf "${TMPDIR:?}"/*
    fi
}

# While the job runs: no file holds the secret (none named so, none
# announced to the workers); the workers were given a descriptor instead.
start_job "$tmp/out1.txt"
workers=$(pgrep -P "$driver" -f -- '--rank [0-9]*$' | tr '\n' ' ')
secret_files=$(find "$TMPDIR" -name 'secret*' | tr '\n' ' ')
bad=""
for w in $workers; do
    env=$(tr '\0' '\n' < "/proc/$w/environ")
    grep -q '^BATON_SECRET_FILE=' <<<"$env" && bad="$bad $w:has-BATON_SECRET_FILE"
    grep -q '^BATON_SECRET_FD=[0-9][0-9]*$' <<<"$env" || bad="$bad $w:no-BATON_SECRET_FD"
done
if [ "$(echo $workers | wc -w)" -eq 4 ] && [ -z "$secret_files" ] && [ -z "$bad" ]; then
    pass running_secret_in_no_file
else
    fail running_secret_in_no_file "workers: $workers; secret files: ${secret_files:-none}; problems:${bad:- none}"
fi

# SIGKILL of the driver mid-run.
kill -9 "$driver"; wait "$driver" 2>/dev/null; driver=
nothing_left sigkill_mid_run_leaves_nothing

# SIGKILL of the driver during start-up: as soon as its run directory exists.
rm -f "$tmp/m.jsonl"
"$BATON" run "$tmp/job.yaml" > "$tmp/out2.txt" 2>&1 &
driver=$!
for _ in $(seq 1 500); do [ -n "$(ls -A "$TMPDIR")" ] && break; sleep 0.01; done
kill -9 "$driver"; wait "$driver" 2>/dev/null; driver=
nothing_left sigkill_start_up_leaves_nothing

# abort() of the driver (SIGABRT, as BT_PANIC ends a process).
start_job "$tmp/out3.txt"
kill -ABRT "$driver"; wait "$driver" 2>/dev/null; rc=$?; driver=
[ "$rc" -eq 134 ] && pass abort_kills_driver || fail abort_kills_driver "rc $rc"
nothing_left abort_leaves_nothing

# Standard output closed under the driver: it does not die of SIGPIPE, it
# says why and stops the job (exit 1) with every worker reaped.
"$BATON" run "$tmp/job.yaml" --set train.log_every=1 2> "$tmp/pipe.err" | head -1 > "$tmp/pipe.out"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 1 ] && grep -q "job failed: cannot write to standard output" "$tmp/pipe.err" &&
   grep -q '^baton run .*: run [0-9-]* in runs/' "$tmp/pipe.out"; then
    pass sigpipe_stops_job_cleanly
else
    fail sigpipe_stops_job_cleanly "rc $rc, out: $(cat "$tmp/pipe.out"), err: $(tail -3 "$tmp/pipe.err")"
fi
nothing_left sigpipe_leaves_nothing

# A normal end.
if "$BATON" run "$tmp/job.yaml" --set train.steps=2 > "$tmp/out4.txt" 2>&1; then
    pass normal_end_exit
else
    fail normal_end_exit "$(tail -3 "$tmp/out4.txt")"
fi
nothing_left normal_end_leaves_nothing

# A worker started by hand has no secret and says so.
out=$(env -u BATON_SECRET_FD "$BATON" worker --run-dir "$tmp" --rank 0 2>&1)
rc=$?
[ "$rc" -ne 0 ] && grep -q "BATON_SECRET_FD is not set" <<<"$out" && pass worker_without_secret_refused \
    || fail worker_without_secret_refused "rc $rc: $out"
out=$(BATON_SECRET_FD=banana "$BATON" worker --run-dir "$tmp" --rank 0 2>&1)
grep -q "BATON_SECRET_FD=banana is not a file descriptor number" <<<"$out" && pass worker_bad_secret_fd_refused \
    || fail worker_bad_secret_fd_refused "$out"
exit 0
