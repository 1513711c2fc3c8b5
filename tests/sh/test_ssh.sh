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
. "$(dirname "$0")/netns.bash"
netns_init ssh

job local "[local]"
if "$BATON" run "$tmp/local.yaml" > "$tmp/local.out" 2>&1; then pass ssh_local_reference
else fail ssh_local_reference "$(tail -5 "$tmp/local.out")"; fi
ref=$(losses "$tmp/local.jsonl")

# ---- loopback -------------------------------------------------------------
sshd_start lo 127.0.0.1
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
netns_hosts 2
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
