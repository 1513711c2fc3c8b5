#!/usr/bin/env bash
# The sockets and descriptors of a running multi-process job (read from
# /proc by tests/sh/jobprocs.py): every inet socket of the driver and of the
# workers is bound to loopback (the job names no interface), no worker holds
# an open file of the driver other than stdin/stdout/stderr, and every
# descriptor above 2 of every process is close-on-exec (those the job
# inherited from this test aside). The job mixes transports: control over
# tcp, the pipeline and the data-parallel collectives over ucx.
set -u
. "$(dirname "$0")/lib.bash"
PROCS="python3 $(dirname "$0")/jobprocs.py"
if ! command -v python3 >/dev/null; then echo "SKIP job_fds: needs python3"; exit 0; fi
tmp=$(mktemp -d /tmp/test_job_fds.XXXXXX)
driver=
cleanup() { [ -n "$driver" ] && kill -CONT "$driver" 2>/dev/null && kill -9 "$driver" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

# ucx where it is built (the Makefile's test), tcp otherwise
xp=tcp
pkg-config --exists ucx 2>/dev/null && xp=ucx
mkdir -p "$tmp/data"
awk 'BEGIN { for (i = 0; i < 3000; i++) printf "%d ", (i * 7) % 50; print "" }' > "$tmp/data/tokens.txt"
cat > "$tmp/job.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 2, kv_heads: 2, ffn: 64, vocab: 64}
data: {dir: $tmp/data, seq_len: 8, split: 0}
train: {steps: 600, micro_batch: 1, grad_accum: 2, log_every: 100000}
optim: {lr: 0.001, min_lr: 0.0001, warmup: 0}
parallel: {pp: 2, dp: 2}
transport: {control: tcp, pipeline: $xp, data_parallel: $xp}
metrics: {file: $tmp/m.jsonl}
YAML

# NVLink multicast asked for by the environment: the workers must have it off
NCCL_NVLS_ENABLE=1 BATON_HEARTBEAT_TIMEOUT=60 "$BATON" run "$tmp/job.yaml" --quiet > "$tmp/out.txt" 2>&1 &
driver=$!
for _ in $(seq 1 3000); do
    [ -s "$tmp/m.jsonl" ] && break
    kill -0 "$driver" 2>/dev/null || break
    sleep 0.02
done
# stopped, the driver's descriptors hold still while we read them
kill -STOP "$driver"
# the stop is asynchronous: wait until the driver is in state T
for _ in $(seq 1 500); do
    st=$(awk '{ print $3 }' "/proc/$driver/stat" 2>/dev/null)
    { [ "$st" = T ] || [ -z "$st" ]; } && break
    sleep 0.01
done
pids=$($PROCS procs "$driver")
workers=${pids#* }
[ "$(awk '{ print $3 }' "/proc/$driver/stat" 2>/dev/null)" = T ] && [ "$(wc -w <<<"$pids")" -eq 5 ] \
    && pass job_fds_running || fail job_fds_running "processes: $pids; $(tail -3 "$tmp/out.txt")"

out=$($PROCS sockets $pids); rc=$?
echo "$out"
[ $rc -eq 0 ] && [ -n "$out" ] && pass job_fds_sockets_loopback \
    || fail job_fds_sockets_loopback "$(grep -c 'NOT LOOPBACK' <<<"$out") sockets elsewhere: $(grep -m3 'NOT LOOPBACK' <<<"$out" | tr '\n' ';')"
# every worker starts with NCCL_NVLS_ENABLE=0 and no other value of it
# (launch/spawn.h: SPAWN_NCCL_NVLS)
bad=
for w in $workers; do
    vals=$(tr '\0' '\n' < "/proc/$w/environ" | grep '^NCCL_NVLS_ENABLE=' | tr '\n' ' ')
    [ "$vals" = "NCCL_NVLS_ENABLE=0 " ] || bad="$bad $w:'$vals'"
done
[ -n "$workers" ] && [ -z "$bad" ] && pass job_fds_nccl_nvls_off || fail job_fds_nccl_nvls_off "workers$bad"
guard=$($PROCS guard "$driver")
[ -n "$guard" ] && pass job_fds_guard_found || fail job_fds_guard_found "no baton-guard child"
out=$($PROCS inherited $driver $workers $guard); rc=$?
[ $rc -eq 0 ] && pass job_fds_not_inherited \
    || fail job_fds_not_inherited "$(wc -l <<<"$out") descriptors: $(head -3 <<<"$out" | tr '\n' ';')"
out=$($PROCS cloexec $$ $pids); rc=$?
[ $rc -eq 0 ] && pass job_fds_cloexec \
    || fail job_fds_cloexec "$(wc -l <<<"$out") descriptors: $(head -3 <<<"$out" | tr '\n' ';')"

kill -CONT "$driver"
wait "$driver"; rc=$?
driver=
[ $rc -eq 0 ] && [ "$(wc -l < "$tmp/m.jsonl")" -eq 600 ] && pass job_fds_job_finished \
    || fail job_fds_job_finished "rc $rc: $(tail -3 "$tmp/out.txt")"
