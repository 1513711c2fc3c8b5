#!/usr/bin/env bash
# ssh launch against real OpenSSH servers that this test starts (generated
# host and user keys, a config of its own, killed at the end):
#   loopback   one sshd on 127.0.0.1 (a high port); a job of 2 hosts x 2
#              ranks (pp=2 dp=2) through it trains and its losses equal
#              the local run's, bit for bit; log lines come back prefixed
#              with host and rank;
#   netns      two hosts simulated as network namespaces (veth pairs on a
#              bridge, distinct addresses, an sshd in each): the same job,
#              the same losses, and the ranks' listeners on their own
#              host's address;
#   errors     an unreachable host, a missing binary and a host whose link
#              is down are clear errors before any rank starts;
#   security   raw clients without the handshake and connection floods on
#              every port of the job are refused and logged while it trains
#              on to the local run's losses.
# Needs root, sshd and `ip netns` (SKIP, never a pass, otherwise).
set -u
. "$(dirname "$0")/lib.bash"
SSHD=${SSHD:-/usr/sbin/sshd}
if [ "$(id -u)" -ne 0 ] || [ ! -x "$SSHD" ] || ! command -v ssh >/dev/null || ! command -v ssh-keygen >/dev/null; then
    echo "SKIP ssh: needs root, $SSHD and ssh (make deps installs openssh-server)"; exit 0
fi
BATON_ABS=$(readlink -f "$BATON")
tmp=$(mktemp -d /tmp/test_ssh.XXXXXX)
chmod 755 "$tmp"
tag=$(( $$ % 200 + 20 ))
net=10.218.$tag
ns=(); links=(); sshd_pids=(); driver=
cleanup() {
    local p n
    [ -n "$driver" ] && kill -9 "$driver" 2>/dev/null
    for p in "${sshd_pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${sshd_pids[@]}"; do wait "$p" 2>/dev/null; done
    for n in "${ns[@]}"; do ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null; ip netns del "$n" 2>/dev/null; done
    for n in "${links[@]}"; do ip link del "$n" 2>/dev/null; done
    [ -n "${KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

mkdir -p /run/sshd "$tmp/data"
ssh-keygen -q -t ed25519 -N '' -f "$tmp/host_key" -C baton-test-host
ssh-keygen -q -t ed25519 -N '' -f "$tmp/user_key" -C baton-test-user
cp "$tmp/user_key.pub" "$tmp/authorized_keys"
echo "* $(cut -d' ' -f1,2 "$tmp/host_key.pub")" > "$tmp/known_hosts"
port=$(( 20000 + $$ % 20000 ))
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
# sshd_config NAME LISTEN: a server config of this test's own
sshd_config() {
    cat > "$tmp/sshd_$1.conf" <<EOF
ListenAddress $2:$port
HostKey $tmp/host_key
PidFile $tmp/sshd_$1.pid
AuthorizedKeysFile $tmp/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
AcceptEnv none
EOF
}
# wait_ssh DEST [ip netns exec NS]: poll until a command runs there
wait_ssh() {
    local dest=$1 i
    for i in $(seq 1 "$(scaled 300)"); do
        ssh -F "$tmp/ssh_config" -o BatchMode=yes -o ConnectTimeout=2 "$dest" true 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

lcg_tokens 7 4000 40 9 64 > "$tmp/data/tokens.txt"
# job NAME HOSTS [SSH_ARGS [LAUNCH_FIELDS]]: the job file $tmp/NAME.yaml
job() {
    cat > "$tmp/$1.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 2, kv_heads: 2, ffn: 64, vocab: 64}
data: {dir: $tmp/data, seq_len: 8, split: 0}
train: {steps: 6, micro_batch: 1, grad_accum: 2, log_every: 1}
optim: {lr: 0.003, min_lr: 0.0003, warmup: 0}
parallel: {pp: 2, dp: 2}
metrics: {file: $tmp/$1.jsonl}
runs: $tmp/runs
hosts: $2
launch: {ssh: [-F, $tmp/ssh_config${3:-}]${4:-}}
YAML
}
losses() { sed -n 's/.*"loss": *\([-0-9.eE+]*\).*/\1/p' "$1" | tr '\n' ' '; }

job local "[local]"
if "$BATON" run "$tmp/local.yaml" > "$tmp/local.out" 2>&1; then pass ssh_local_reference
else fail ssh_local_reference "$(tail -5 "$tmp/local.out")"; fi
ref=$(losses "$tmp/local.jsonl")

# ---- loopback -------------------------------------------------------------
sshd_config lo 127.0.0.1
"$SSHD" -D -e -f "$tmp/sshd_lo.conf" 2> "$tmp/sshd_lo.log" &
sshd_pids+=($!)
if wait_ssh root@127.0.0.1; then pass ssh_loopback_sshd_up
else fail ssh_loopback_sshd_up "$(tail -3 "$tmp/sshd_lo.log")"; fi

job lo "[root@127.0.0.1, root@localhost]"
timeout "$(scaled 300)" "$BATON" run "$tmp/lo.yaml" > "$tmp/lo.out" 2> "$tmp/lo.err"; rc=$?
got=$(losses "$tmp/lo.jsonl")
if [ "$rc" -eq 0 ] && [ -n "$ref" ] && [ "$(wc -w <<<"$ref")" -eq 6 ] && [ "$got" = "$ref" ]; then
    pass ssh_loopback_losses_equal_local
else fail ssh_loopback_losses_equal_local "rc $rc: local [$ref] ssh [$got] $(tail -5 "$tmp/lo.err")"; fi
# the job's secret is on no command line the servers saw (the agents' argv)
grep -q "agent --run-dir" "$tmp/sshd_lo.log" && fail ssh_loopback_argv "sshd logged a command" || true

# a rank's log line comes back prefixed with its host and rank
job lo_log "[root@127.0.0.1, root@localhost]"
BATON_LOG=debug timeout "$(scaled 300)" "$BATON" run "$tmp/lo_log.yaml" > "$tmp/lo_log.out" 2> "$tmp/lo_log.err"
grep -q '^\[root@localhost r3\] ' "$tmp/lo_log.err" && grep -q '^\[root@127.0.0.1 r0\] ' "$tmp/lo_log.err" \
    && pass ssh_log_prefix || fail ssh_log_prefix "$(head -5 "$tmp/lo_log.err")"

# ---- errors before any rank starts ---------------------------------------
job refused "[root@127.0.0.1, root@localhost]" ", -p, 1"
timeout "$(scaled 120)" "$BATON" run "$tmp/refused.yaml" > "$tmp/refused.out" 2>&1; rc=$?
if [ "$rc" -ne 0 ] && grep -q "hosts\[0\] root@127.0.0.1: cannot reach it over ssh" "$tmp/refused.out" \
    && [ ! -s "$tmp/refused.jsonl" ] && ! grep -q "rank" "$tmp/refused.out"; then pass ssh_unreachable_host
else fail ssh_unreachable_host "rc $rc: $(tail -3 "$tmp/refused.out")"; fi
job nobin "[root@127.0.0.1, root@localhost]" "" ", baton: $tmp/no/such/baton, workdir: $tmp"
timeout "$(scaled 120)" "$BATON" run "$tmp/nobin.yaml" > "$tmp/nobin.out" 2>&1; rc=$?
if [ "$rc" -ne 0 ] && grep -q "hosts\[0\] root@127.0.0.1: the baton binary $tmp/no/such/baton is missing" "$tmp/nobin.out" \
    && [ ! -s "$tmp/nobin.jsonl" ]; then pass ssh_missing_binary
else fail ssh_missing_binary "rc $rc: $(tail -3 "$tmp/nobin.out")"; fi

# ---- two hosts as network namespaces ---------------------------------------
if ! ip netns add "bt18-$$-probe" 2>/dev/null; then
    echo "SKIP ssh_netns: ip netns does not work here"; exit 0
fi
ip netns del "bt18-$$-probe"
br=bt18br$tag
ip link add "$br" type bridge && links+=("$br")
ip addr add "$net.1/24" dev "$br"
ip link set "$br" up
hosts=()
for i in 1 2; do
    n=bt18-$$-h$i; ns+=("$n")
    ip netns add "$n"
    ip link add "bt18v$tag$i" type veth peer name eth0 netns "$n" && links+=("bt18v$tag$i")
    ip link set "bt18v$tag$i" master "$br" up
    ip -n "$n" link set lo up
    ip -n "$n" addr add "$net.1$i/24" dev eth0
    ip -n "$n" link set eth0 up
    ip -n "$n" route add default via "$net.1"
    sshd_config "h$i" "$net.1$i"
    ip netns exec "$n" "$SSHD" -D -e -f "$tmp/sshd_h$i.conf" 2> "$tmp/sshd_h$i.log" &
    sshd_pids+=($!)
    hosts+=("$net.1$i")
done
up=1
for h in "${hosts[@]}"; do wait_ssh "$h" || up=0; done
[ "$up" -eq 1 ] && pass ssh_netns_sshd_up || fail ssh_netns_sshd_up "$(tail -3 "$tmp"/sshd_h*.log)"

job nsjob "[${hosts[0]}, ${hosts[1]}]"
timeout "$(scaled 300)" "$BATON" run "$tmp/nsjob.yaml" > "$tmp/ns.out" 2> "$tmp/ns.err"; rc=$?
got=$(losses "$tmp/nsjob.jsonl")
if [ "$rc" -eq 0 ] && [ -n "$ref" ] && [ "$got" = "$ref" ]; then pass ssh_netns_losses_equal_local
else fail ssh_netns_losses_equal_local "rc $rc: local [$ref] netns [$got] $(tail -5 "$tmp/ns.err")"; fi

# security: while a longer job trains, a raw client sends garbage to every
# port the job listens on (driver and ranks, both hosts) and floods each with
# idle connections; every one is refused and logged, and the job trains on to
# the losses of an undisturbed local run (2000 tiny steps: a few seconds)
job long "[local]"; sed -i 's/steps: 6, micro_batch: 1, grad_accum: 2, log_every: 1/steps: 2000, micro_batch: 1, grad_accum: 2, log_every: 100/' "$tmp/long.yaml"
"$BATON" run "$tmp/long.yaml" > "$tmp/long.out" 2>&1
ref_long=$(losses "$tmp/long.jsonl")
# the driver is stopped (SIGSTOP) while the attack runs, so that it falls
# inside the training whatever the machine's speed; the ranks wait for their
# next step meanwhile (a heartbeat timeout of 60 s covers the pause)
job nslong "[${hosts[0]}, ${hosts[1]}]" "" ", heartbeat_timeout: 60"; sed -i 's/steps: 6, micro_batch: 1, grad_accum: 2, log_every: 1/steps: 2000, micro_batch: 1, grad_accum: 2, log_every: 100/' "$tmp/nslong.yaml"
timeout "$(scaled 300)" "$BATON" run "$tmp/nslong.yaml" > "$tmp/nslong.out" 2> "$tmp/nslong.err" &
driver=$!
drv=
for _ in $(seq 1 "$(scaled 3000)"); do [ -n "$drv" ] || drv=$(pgrep -P "$driver" -x baton); [ -s "$tmp/nslong.jsonl" ] && break; sleep 0.02; done
kill -STOP "$drv"
steps_before=$(grep -c . "$tmp/nslong.jsonl")
ports=$(ss -Hltnp | grep "pid=$drv," | awk '{print $4}')
for n in "${ns[@]}"; do ports+=" $(ip netns exec "$n" ss -Hltnp | grep '"baton"' | awk '{print $4}')"; done
echo "listening: $ports" > "$tmp/ports.out"
(python3 - $ports > "$tmp/attack.out" 2>&1 <<'PY'
import os, resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
held = []
addrs = sys.argv[1:]
for i, a in enumerate(addrs):
    host, port = a.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(os.urandom(200))            # no handshake: garbage
    held.append(s)
    # a flood of idle connections, more than a listener lets wait in their
    # handshake, on the driver's port and on rank 0's first
    for _ in range(300 if i in (0, 1) else 20):
        try:
            held.append(socket.create_connection((host, int(port)), timeout=5))
        except OSError:
            pass
print("attacked", len(sys.argv) - 1, "ports with", len(held), "connections", flush=True)
time.sleep(4)  # held while the driver runs again (below)
PY
) &
attacker=$!
for _ in $(seq 1 "$(scaled 600)"); do grep -q attacked "$tmp/attack.out" && break; sleep 0.1; done
kill -CONT "$drv"
wait "$attacker"
wait "$driver"; rc=$?
got=$(losses "$tmp/nslong.jsonl")
nports=$(wc -w <<<"$ports")
if [ "$rc" -eq 0 ] && [ "$nports" -ge 5 ] && [ "$steps_before" -lt 2000 ] && [ "$(wc -w <<<"$ref_long")" -eq 2000 ] && [ "$got" = "$ref_long" ] \
    && grep -q "dropping peer .*(id -1, handshake)" "$tmp/nslong.err" \
    && grep -q "refusing .* peers already in their handshake" "$tmp/nslong.err"; then
    pass ssh_raw_clients_refused_job_trains_on
else fail ssh_raw_clients_refused_job_trains_on "rc $rc, $nports ports, attacked after step $steps_before ($(cat "$tmp/attack.out")), $(grep -c . "$tmp/nslong.jsonl") steps: $(grep -m3 "tcp:" "$tmp/nslong.err")"; fi

# a host that is down (its namespace's link cut) is named before any rank starts
ip -n "${ns[1]}" link set eth0 down
timeout "$(scaled 120)" "$BATON" run "$tmp/nsjob.yaml" > "$tmp/ns_down.out" 2>&1; rc=$?
if [ "$rc" -ne 0 ] && grep -q "hosts\[1\] ${hosts[1]}: cannot reach it over ssh" "$tmp/ns_down.out"; then
    pass ssh_netns_host_down
else fail ssh_netns_host_down "rc $rc: $(tail -3 "$tmp/ns_down.out")"; fi
exit 0
