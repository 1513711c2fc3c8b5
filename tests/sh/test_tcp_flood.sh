#!/usr/bin/env bash
# Strangers on a tcp job's ports, on one host and without root (issue 18,
# item 6; tests/sh/test_ssh.sh does the same across namespace hosts as
# root): while a pp=2 dp=2 job whose every edge is tcp trains, every port
# the driver and the ranks listen on gets a raw client that sends bytes
# without the handshake and a flood of 300 idle connections, more than the
# 256 a listener lets wait in their handshake, all held until the job ends.
# Each raw client is dropped and logged, the flood past 256 refused and
# logged, and the job ends with the undisturbed run's 600 losses, bit for
# bit. The driver is stopped (SIGSTOP) while the connections go out, so
# they land inside the training whatever the machine's speed (the ranks
# wait for their next step; a heartbeat timeout of 60 s covers the pause),
# and its listener queues the 301 connections in the kernel (somaxconn,
# 4096 by default since Linux 5.4). 8 s here.
set -u
. "$(dirname "$0")/lib.bash"
PROCS="python3 $(dirname "$0")/jobprocs.py"
tmp=$(mktemp -d /tmp/test_tcp_flood.XXXXXX)
driver= attacker=
cleanup() {
    [ -n "$attacker" ] && kill "$attacker" 2>/dev/null
    [ -n "$driver" ] && kill -CONT "$driver" 2>/dev/null && kill -9 "$driver" 2>/dev/null
    [ -n "${KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT

mkdir -p "$tmp/data"
lcg_tokens 13 3000 40 9 64 > "$tmp/data/tokens.txt"
cat > "$tmp/job.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 2, kv_heads: 2, ffn: 64, vocab: 64}
data: {dir: $tmp/data, seq_len: 8, split: 0}
train: {steps: 600, micro_batch: 1, grad_accum: 2, log_every: 100000}
optim: {lr: 0.003, min_lr: 0.0003, warmup: 0}
parallel: {pp: 2, dp: 2}
transport: {control: tcp, pipeline: tcp, data_parallel: tcp, tensor_parallel: tcp}
launch: {heartbeat_timeout: 60}
runs: $tmp/runs
YAML
losses() { sed -n 's/.*"step": *\([0-9]*\).*"loss": *\([-0-9.eE+]*\).*/\1 \2/p' "$1"; }

timeout "$(scaled 120)" "$BATON" run "$tmp/job.yaml" --quiet --set metrics.file="$tmp/ref.jsonl" > "$tmp/ref.out" 2>&1
ref=$(losses "$tmp/ref.jsonl")
[ "$(wc -l <<<"$ref")" -eq 600 ] && pass tcp_flood_reference || fail tcp_flood_reference "$(tail -3 "$tmp/ref.out")"

timeout "$(scaled 300)" "$BATON" run "$tmp/job.yaml" --set metrics.file="$tmp/m.jsonl" > "$tmp/out" 2> "$tmp/err" &
runner=$!
driver=
for _ in $(seq 1 "$(scaled 3000)"); do
    [ -n "$driver" ] || driver=$(pgrep -P "$runner" -x baton)
    [ -n "$driver" ] && [ -s "$tmp/m.jsonl" ] && break
    kill -0 "$runner" 2>/dev/null || break
    sleep 0.02
done
kill -STOP "$driver"
for _ in $(seq 1 500); do # the stop is asynchronous
    st=$(awk '{ print $3 }' "/proc/$driver/stat" 2>/dev/null)
    { [ "$st" = T ] || [ -z "$st" ]; } && break
    sleep 0.01
done
steps_before=$(grep -c . "$tmp/m.jsonl")
pids=$($PROCS procs "$driver")
$PROCS listening $pids > "$tmp/ports"
nprocs=$(wc -w <<<"$pids"); nports=$(wc -l < "$tmp/ports")
# every process listens (its router's tcp listener), the driver's included
missing=
for p in $pids; do grep -q "^$p " "$tmp/ports" || missing+=" $p"; done
[ "$nprocs" -eq 5 ] && [ -z "$missing" ] && [ "$steps_before" -lt 600 ] && pass tcp_flood_job_running \
    || fail tcp_flood_job_running "processes: $pids, not listening:$missing, $steps_before steps done"
python3 - "$tmp/ports" > "$tmp/attack.out" 2>&1 <<'PY' &
import os, random, resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))
rng = random.Random(18)
held, lines = [], []
for line in open(sys.argv[1]):
    pid, host, port = line.split()
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(rng.randbytes(200))          # no handshake: bytes
    held.append(s)
    n = 0
    for _ in range(300):                   # idle connections, held
        try:
            held.append(socket.create_connection((host, int(port)), timeout=5))
            n += 1
        except OSError:
            pass
    lines.append(f"{host}:{port} (pid {pid}): raw client and {n} idle connections")
print("\n".join(lines))
print("attacked", len(lines), "ports with", len(held), "connections", flush=True)
time.sleep(3600)                           # held until the test ends it
PY
attacker=$!
for _ in $(seq 1 "$(scaled 600)"); do grep -q "^attacked" "$tmp/attack.out" && break; sleep 0.1; done
cat "$tmp/attack.out"
kill -CONT "$driver"
wait "$runner"; rc=$?
driver=
kill "$attacker" 2>/dev/null; wait "$attacker" 2>/dev/null; attacker=
got=$(losses "$tmp/m.jsonl")
[ "$(grep -c "raw client and 300 idle connections" "$tmp/attack.out")" -eq "$nports" ] && [ "$nports" -ge 5 ] \
    && pass tcp_flood_sent || fail tcp_flood_sent "$nports ports: $(cat "$tmp/attack.out")"
[ "$rc" -eq 0 ] && [ "$got" = "$ref" ] && pass tcp_flood_trains_on \
    || fail tcp_flood_trains_on "rc $rc, $(wc -l <<<"$got") losses, $(diff <(echo "$ref") <(echo "$got") | head -4); $(grep -m3 'job failed\|error' "$tmp/err")"
# every process logged its raw clients, dropped in their handshake
logged() { # NAME PATTERN: every process logged a line matching PATTERN
    local n
    n=$(grep -- "$2" "$tmp/err" | sed -n 's/^baton\(\[[a-z0-9]*\]\)\{0,1\} .*/&/p' | sed 's/ .*//' | sort -u | wc -l)
    [ "$n" -eq "$nprocs" ] && pass "$1" || fail "$1" "$n of $nprocs processes logged it: $(grep -m4 "tcp: " "$tmp/err")"
}
logged tcp_flood_raw_dropped "tcp: dropping peer .*(id -1, handshake)"
# and every port refused at least the 300 - 256 idle connections past its
# handshake limit (the raw client may or may not have been dropped by then)
short=
while read -r _ host port; do
    n=$(grep -c "tcp: refusing .* on [^ ]*:$port: 256 peers already in their handshake" "$tmp/err")
    [ "$n" -ge 44 ] || short+=" $port ($n)"
done < "$tmp/ports"
[ -z "$short" ] && pass tcp_flood_refused || fail tcp_flood_refused "ports refusing fewer than 44:$short"
exit 0
