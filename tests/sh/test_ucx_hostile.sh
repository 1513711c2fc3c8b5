#!/usr/bin/env bash
# No unauthenticated peer can crash a process of a ucx job: while a job
# whose every edge is ucx trains, hostile bytes (zero runs, random bytes:
# tests/sh/jobprocs.py payloads) go to every listening TCP port of the
# driver and of every worker, and as datagrams to each one's UCX wake-up
# sockets. The job must still train to completion, with the metrics of an
# undisturbed run.
#
# The driver is stopped (SIGSTOP) while the bytes go out, so the job cannot
# end before every port was hit: steps only start on the driver's word. Its
# own ports queue the connections in the kernel and it reads them once it
# continues. (UCX 1.13's connection manager aborted the process on 17 zero
# bytes: "tcp_sockcm_ep.c:825 Assertion ... failed: 17 > 16".)
set -u
. "$(dirname "$0")/lib.bash"
PROCS="python3 $(dirname "$0")/jobprocs.py"
# the Makefile builds the ucx transport exactly when pkg-config finds ucx
if ! command -v python3 >/dev/null || ! pkg-config --exists ucx 2>/dev/null; then
    echo "SKIP ucx_hostile: needs python3 and a build with ucx"; exit 0
fi
tmp=$(mktemp -d /tmp/test_ucx_hostile.XXXXXX)
driver=
cleanup() { [ -n "$driver" ] && kill -CONT "$driver" 2>/dev/null && kill -9 "$driver" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

mkdir -p "$tmp/data"
awk 'BEGIN { for (i = 0; i < 3000; i++) printf "%d ", (i * 7) % 50; print "" }' > "$tmp/data/tokens.txt"
cat > "$tmp/job.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 2, kv_heads: 2, ffn: 64, vocab: 64}
data: {dir: $tmp/data, seq_len: 8, split: 0}
train: {steps: 600, micro_batch: 1, grad_accum: 2, log_every: 100000}
optim: {lr: 0.001, min_lr: 0.0001, warmup: 0}
parallel: {pp: 2, dp: 2}
transport: {control: ucx, pipeline: ucx, data_parallel: ucx, tensor_parallel: ucx}
YAML
strip() { sed 's/, "tokens_per_s.*//' "$1"; }

# the undisturbed run
"$BATON" run "$tmp/job.yaml" --quiet --set metrics.file="$tmp/ref.jsonl" > "$tmp/ref.txt" 2>&1 \
    && [ "$(wc -l < "$tmp/ref.jsonl")" -eq 600 ] && pass ucx_hostile_reference \
    || fail ucx_hostile_reference "rc $?: $(tail -3 "$tmp/ref.txt")"

# the attacked run
BATON_HEARTBEAT_TIMEOUT=60 "$BATON" run "$tmp/job.yaml" --quiet --set metrics.file="$tmp/m.jsonl" \
    > "$tmp/out.txt" 2>&1 &
driver=$!
for _ in $(seq 1 3000); do
    [ -s "$tmp/m.jsonl" ] && break
    kill -0 "$driver" 2>/dev/null || break
    sleep 0.02
done
kill -STOP "$driver"
# the stop is asynchronous: wait until the driver is in state T
for _ in $(seq 1 500); do
    st=$(awk '{ print $3 }' "/proc/$driver/stat" 2>/dev/null)
    { [ "$st" = T ] || [ -z "$st" ]; } && break
    sleep 0.01
done
state=$(awk '{ print $3 }' "/proc/$driver/stat" 2>/dev/null)
pids=$($PROCS procs "$driver")
nprocs=$(wc -w <<<"$pids")
[ "$state" = T ] && [ "$nprocs" -eq 5 ] && pass ucx_hostile_job_running \
    || fail ucx_hostile_job_running "driver state '$state', processes: $pids; $(tail -3 "$tmp/out.txt")"
$PROCS listening $pids > "$tmp/ports"
cat "$tmp/ports"
# every process listens somewhere (at least the tcp transport of its router)
for p in $pids; do
    grep -q "^$p " "$tmp/ports" || fail ucx_hostile_ports "pid $p has no listening socket"
done
nports=$(wc -l < "$tmp/ports")
hits=0
while read -r pid host port; do
    # the stopped driver reads its connections once it continues
    wait_s=1; [ "$pid" = "$driver" ] && wait_s=0
    out=$($PROCS attack "$host" "$port" $wait_s)
    echo "pid $pid: $out"
    [[ "$out" == *" 10 hostile connections" ]] && hits=$((hits + 1))
done < "$tmp/ports"
[ "$nports" -ge 5 ] && [ "$hits" -eq "$nports" ] && pass ucx_hostile_sent \
    || fail ucx_hostile_sent "$hits of $nports ports took all hostile connections"
# the only other sockets of a ucx process: UCX's shared-memory wake-up
# sockets (abstract unix datagram sockets, reachable by any local user)
out=$($PROCS datagrams $pids)
echo "unix datagram sockets: $out"
[[ "$out" =~ ^([0-9]+)\ sockets,\ ([0-9]+)\ datagrams$ ]] && [ "${BASH_REMATCH[1]}" -ge 5 ] \
    && [ "${BASH_REMATCH[2]}" -eq $((BASH_REMATCH[1] * 10)) ] && pass ucx_hostile_datagrams_sent \
    || fail ucx_hostile_datagrams_sent "$out"
# alive: not gone and not a zombie (the stopped driver reaps no child)
alive=0
for p in $pids; do
    [ "$(awk '{ print $3 }' "/proc/$p/stat" 2>/dev/null)" ] && [ "$(awk '{ print $3 }' "/proc/$p/stat")" != Z ] \
        && alive=$((alive + 1))
done
kill -CONT "$driver"
wait "$driver"; rc=$?
driver=
grep -n "Assertion\|Segmentation\|Aborted\|job failed" "$tmp/out.txt" | head -5
[ "$alive" -eq 5 ] && [ "$rc" -eq 0 ] && ! grep -q "Assertion" "$tmp/out.txt" && pass ucx_hostile_survived \
    || fail ucx_hostile_survived "rc $rc, $alive of 5 processes alive after the bytes; $(grep -m3 'Assertion\|job failed' "$tmp/out.txt")"
if [ -s "$tmp/m.jsonl" ] && cmp -s <(strip "$tmp/ref.jsonl") <(strip "$tmp/m.jsonl"); then
    pass ucx_hostile_same_result
else
    fail ucx_hostile_same_result "metrics differ from the undisturbed run ($(wc -l < "$tmp/m.jsonl" 2>/dev/null) lines)"
fi
