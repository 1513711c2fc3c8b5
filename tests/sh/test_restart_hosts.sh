#!/usr/bin/env bash
# Restart leaves out a host that keeps failing (launch/restart.h,
# restart.host_failures, default 2), against a real OpenSSH server that the
# test starts on two loopback addresses (127.0.0.1, 127.0.0.2; generated
# keys, a config of its own), each address one "host" of the job:
#   same layout  pp=2 dp=2 on 2 hosts; rank 3 (host 1) is killed in
#                attempts 1 and 2; attempt 3 runs all 4 ranks on host 0 and
#                the run ends with the local run's losses, bit for bit;
#   smaller dp   dp=3 on 3 hosts (global batch 6); rank 2 (host 2) is killed
#                twice; 3 ranks do not split over 2 hosts, so attempt 3
#                trains dp=2 (3 microbatches per replica) on hosts 0 and 1:
#                its losses equal, bit for bit, the local dp=3 run up to the
#                checkpoint it resumed from and, after it, a local dp=2 run
#                resumed from that run's checkpoint of the same step;
#   a hang       dp=2 on 2 hosts; rank 1 (host 1) never arrives at an
#                all-reduce in attempts 1 and 2 (step timeout); the hang is
#                blamed on the missing rank's host, and attempt 3 runs both
#                ranks on host 0 to the local run's losses, bit for bit.
# Needs root, sshd and ssh (SKIP, never a pass, otherwise).
set -u
. "$(dirname "$0")/lib.bash"
SSHD=${SSHD:-/usr/sbin/sshd}
if [ "$(id -u)" -ne 0 ] || [ ! -x "$SSHD" ] || ! command -v ssh >/dev/null || ! command -v ssh-keygen >/dev/null; then
    echo "SKIP restart_hosts: needs root, $SSHD and ssh (make deps installs openssh-server)"; exit 0
fi
tmp=$(mktemp -d /tmp/test_restart_hosts.XXXXXX)
chmod 755 "$tmp"
sshd_pid=
cleanup() {
    [ -n "$sshd_pid" ] && kill "$sshd_pid" 2>/dev/null && wait "$sshd_pid" 2>/dev/null
    [ -n "${KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

mkdir -p /run/sshd "$tmp/data"
ssh-keygen -q -t ed25519 -N '' -f "$tmp/host_key" -C baton-test-host
ssh-keygen -q -t ed25519 -N '' -f "$tmp/user_key" -C baton-test-user
cp "$tmp/user_key.pub" "$tmp/authorized_keys"
echo "* $(cut -d' ' -f1,2 "$tmp/host_key.pub")" > "$tmp/known_hosts"
# start_sshd PORT: configs for PORT and a server on both addresses; true
# once both answer, false when the server exits first (the port is taken)
start_sshd() {
    local port=$1
    cat > "$tmp/ssh_config" <<EOF
Host *
    Port $port
    User root
    IdentityFile $tmp/user_key
    IdentitiesOnly yes
    UserKnownHostsFile $tmp/known_hosts
    StrictHostKeyChecking yes
    LogLevel ERROR
EOF
    cat > "$tmp/sshd.conf" <<EOF
ListenAddress 127.0.0.1:$port
ListenAddress 127.0.0.2:$port
HostKey $tmp/host_key
PidFile $tmp/sshd.pid
AuthorizedKeysFile $tmp/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
AcceptEnv none
EOF
    # sanitizer builds: ssh carries no environment, so the server gives the
    # agents (and the ranks they start) what tests/run.sh set for this test
    for v in UCX_MEM_EVENTS TSAN_OPTIONS ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS; do
        [ -n "${!v:-}" ] && printf 'SetEnv "%s=%s"\n' "$v" "${!v}" >> "$tmp/sshd.conf"
    done
    "$SSHD" -D -e -f "$tmp/sshd.conf" 2> "$tmp/sshd.log" &
    sshd_pid=$!
    up=0
    for _ in $(seq 1 "$(scaled 300)"); do
        kill -0 "$sshd_pid" 2>/dev/null || break
        ssh -F "$tmp/ssh_config" -o BatchMode=yes -o ConnectTimeout=2 root@127.0.0.1 true 2>/dev/null \
            && ssh -F "$tmp/ssh_config" -o BatchMode=yes -o ConnectTimeout=2 root@127.0.0.2 true 2>/dev/null && { up=1; break; }
        sleep 0.1
    done
    [ "$up" -eq 1 ]
}
up=0
for try in 1 2 3 4 5; do
    port=$(( 20000 + ($$ * 7 + try * 7919) % 20000 ))
    start_sshd "$port" && break
    [ -n "$sshd_pid" ] && kill "$sshd_pid" 2>/dev/null; wait "$sshd_pid" 2>/dev/null; sshd_pid=
done
[ "$up" -eq 1 ] && pass restart_hosts_sshd_up || { fail restart_hosts_sshd_up "$(tail -3 "$tmp/sshd.log")"; exit 0; }

lcg_tokens 11 3000 40 9 64 > "$tmp/data/tokens.txt"
# job NAME PARALLEL HOSTS: the job file $tmp/NAME.yaml; a checkpoint every
# step, so a kill at step k resumes from step k-2 or k-1
job() {
    cat > "$tmp/$1.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 2, kv_heads: 2, ffn: 64, vocab: 64}
data: {dir: $tmp/data, seq_len: 8, split: 0}
train: {steps: 8, micro_batch: 1, global_batch: 6, seed: 3, log_every: 100}
optim: {lr: 0.01, min_lr: 0.001, warmup: 2}
parallel: {$2}
checkpoint: {dir: "{run}/ckpt", every: 1, keep: 10}
restart: {max: 2}
runs: $tmp/runs
hosts: $3
launch: {ssh: [-F, $tmp/ssh_config]${4:-}}
YAML
}
losses() { python3 -c '
import json, sys
lo, hi = int(sys.argv[2]), int(sys.argv[3])
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "loss" in r and lo <= r["step"] <= hi: print(r["step"], repr(r["loss"]))' "$1" "${2:-0}" "${3:-1000000}"; }
run() { # NAME ARGS...: baton run ARGS; exit status in rc, run directory in dir
    local name=$1; shift
    timeout "$(scaled 300)" "$BATON" run "$@" > "$tmp/$name.out" 2>&1; rc=$?
    dir=$(sed -n 's/^baton run .*: run [^ ]* in \(.*\)$/\1/p' "$tmp/$name.out" | head -1)
    echo "$name: exit $rc"
}
attempt() { # DIR N EXPR: a python expression of attempt N (0: the first) `a` of DIR/run.json
    python3 -c 'import json, sys; a = json.load(open(sys.argv[1]))["attempts"][int(sys.argv[2])]; print(eval(sys.argv[3]))' \
        "$1/run.json" "$2" "$3" 2>&1; }

# ---- same layout on fewer hosts ----------------------------------------------
job ref2 "pp: 2, dp: 2" "[local]"
run ref2 "$tmp/ref2.yaml"; ref2=$dir
[ "$rc" -eq 0 ] && [ "$(losses "$ref2/metrics.jsonl" | wc -l)" -eq 8 ] && pass restart_hosts_ref_trains \
    || fail restart_hosts_ref_trains "rc $rc: $(tail -3 "$tmp/ref2.out")"
job two "pp: 2, dp: 2" "[root@127.0.0.1, root@127.0.0.2]"
BATON_TEST_KILL=4@3/1,6@3/2 run two "$tmp/two.yaml"
[ "$rc" -eq 0 ] && grep -q "^restart 1 of 2: from the latest checkpoint$" "$tmp/two.out" \
    && grep -q "^restart 2 of 2: from the latest checkpoint, leaving out hosts\[1\] root@127.0.0.2 (failed 2 times): 4 ranks on 1 host$" "$tmp/two.out" \
    && pass restart_hosts_left_out || fail restart_hosts_left_out "rc $rc: $(grep -E '^restart|job failed|error' "$tmp/two.out" | head -6)"
cmp -s <(losses "$ref2/metrics.jsonl") <(losses "$dir/metrics.jsonl") && [ "$(losses "$dir/metrics.jsonl" | wc -l)" -eq 8 ] \
    && pass restart_hosts_same_losses || fail restart_hosts_same_losses "$(diff <(losses "$ref2/metrics.jsonl") <(losses "$dir/metrics.jsonl") | head -6)"
# the run record: which hosts and dp each attempt ran with, and the host each failure is blamed on
[ "$(attempt "$dir" 0 'a["hosts"], a["dp"], a["blamed_host"]')" = "(['root@127.0.0.1', 'root@127.0.0.2'], 2, 'root@127.0.0.2')" ] \
    && [ "$(attempt "$dir" 1 'a["hosts"], a["dp"], a["blamed_host"]')" = "(['root@127.0.0.1', 'root@127.0.0.2'], 2, 'root@127.0.0.2')" ] \
    && [ "$(attempt "$dir" 2 'a["hosts"], a["dp"], a["exit"], a.get("blamed_host")')" = "(['root@127.0.0.1'], 2, 0, None)" ] \
    && pass restart_hosts_record || fail restart_hosts_record "$(python3 -m json.tool "$dir/run.json" | grep -A40 attempts)"

# ---- a smaller dp -------------------------------------------------------------
job ref3 "dp: 3" "[local]"
run ref3 "$tmp/ref3.yaml"; ref3=$dir
job three "dp: 3" "[root@127.0.0.1, root@127.0.0.2, root@localhost]"
BATON_TEST_KILL=3@2/1,5@2/2 run three "$tmp/three.yaml"; d3=$dir
[ "$rc" -eq 0 ] && grep -q "^restart 2 of 2: from the latest checkpoint, leaving out hosts\[2\] root@localhost (failed 2 times): 2 ranks on 2 hosts, dp 2 instead of 3 (3 microbatches of 1 rows each, global batch 6)$" "$tmp/three.out" \
    && [ "$(attempt "$dir" 2 'a["hosts"], a["dp"], a["exit"]')" = "(['root@127.0.0.1', 'root@127.0.0.2'], 2, 0)" ] \
    && pass restart_hosts_smaller_dp || fail restart_hosts_smaller_dp "rc $rc: $(grep -E '^restart|job failed|error|warn' "$tmp/three.out" | head -6)"
# the step attempt 3 resumed from
k=$(sed -n 's/^resuming from .*\/ckpt\/step-0*\([0-9]*\): step .*/\1/p' "$tmp/three.out" | tail -1)
# the reference for the steps after it: the local dp=3 run's checkpoint of
# that step, resumed locally with dp=2 (the global batch kept)
if [ -n "$k" ] && [ -d "$ref3/ckpt/step-0000000$k" ]; then
    run ref3b "$tmp/ref3.yaml" --resume "$ref3/ckpt/step-0000000$k" --set parallel.dp=2
    ref3b=$dir
    if [ "$rc" -eq 0 ] && cmp -s <(losses "$ref3/metrics.jsonl" 1 "$k") <(losses "$d3/metrics.jsonl" 1 "$k") \
        && cmp -s <(losses "$ref3b/metrics.jsonl" $((k + 1)) 8) <(losses "$d3/metrics.jsonl" $((k + 1)) 8) \
        && [ "$(losses "$d3/metrics.jsonl" | wc -l)" -eq 8 ] && [ "$(losses "$ref3b/metrics.jsonl" $((k + 1)) 8 | wc -l)" -eq $((8 - k)) ]; then
        pass restart_hosts_smaller_dp_losses
    else fail restart_hosts_smaller_dp_losses "k=$k rc $rc: ref3 $(losses "$ref3/metrics.jsonl" | tr '\n' ' ') | ref3b $(losses "$ref3b/metrics.jsonl" | tr '\n' ' ') | got $(losses "$d3/metrics.jsonl" | tr '\n' ' ')"; fi
else fail restart_hosts_smaller_dp_losses "no resume step ($k) or no local checkpoint of it"; fi
# ---- a hang, blamed on the host of the rank that never arrives -----------------
job refh "dp: 2" "[local]"
run refh "$tmp/refh.yaml"; refh=$dir
step_to=$(scaled 2)
job hang "dp: 2" "[root@127.0.0.1, root@127.0.0.2]" ", step_timeout: $step_to"
# dp0 #4: step 3's gradient all-reduce (#1 is the start-up barrier)
BATON_TEST_COLL_STALL=dp0:1:4/1,dp0:1:4/2 run hang "$tmp/hang.yaml"
[ "$rc" -eq 0 ] && [ "$(grep -c "^  collective dp0 #4 all_reduce of [0-9]* bytes, group of 2: arrived rank(s) 0 ([0-9.]* s); not arrived rank(s) 1$" "$tmp/hang.out")" -eq 2 ] \
    && grep -q "^restart 2 of 2: from the latest checkpoint, leaving out hosts\[1\] root@127.0.0.2 (failed 2 times): 2 ranks on 1 host$" "$tmp/hang.out" \
    && [ "$(attempt "$dir" 0 'a["blamed_host"], a["failure"].split(" (")[0]')" = "('root@127.0.0.2', 'step 3 did not finish within $step_to s')" ] \
    && [ "$(attempt "$dir" 1 'a["blamed_host"], "did not finish within" in a["failure"]')" = "('root@127.0.0.2', True)" ] \
    && pass restart_hosts_hang_left_out || fail restart_hosts_hang_left_out "rc $rc: $(grep -E '^restart|job failed|not arrived' "$tmp/hang.out" | head -6)"
cmp -s <(losses "$refh/metrics.jsonl") <(losses "$dir/metrics.jsonl") && [ "$(losses "$dir/metrics.jsonl" | wc -l)" -eq 8 ] \
    && pass restart_hosts_hang_same_losses || fail restart_hosts_hang_same_losses "$(diff <(losses "$refh/metrics.jsonl") <(losses "$dir/metrics.jsonl") | head -6)"
exit 0
