#!/usr/bin/env bash
# Network faults between two hosts simulated as network namespaces (the set-up
# of tests/sh/netns.bash: a bridge, a veth pair per host, an sshd in each),
# under a 2-host x 2-rank job (pp=2 dp=2; ranks 0-1 on h1, 2-3 on h2) launched
# over ssh. `make test-faults` runs it (minutes; not part of `make test`).
# Each fault either is ridden through (the job ends 0 with the losses of the
# unfaulted local run, bit for bit) or is detected (the job ends non-zero
# within the heartbeat timeout + 10 s of the fault, the report names the
# host, every loss logged before it equals the reference's, and what the job
# left on the cut-off host ends by itself within 2 x the heartbeat timeout
# + 3 s while the fault is still in place: the agent's lifeline):
#   faults_link_down     h2's eth0 set down mid-run           detected
#   faults_partition     nftables drops all of h2's eth0      detected
#                        traffic both ways mid-run
#   faults_loss30        nftables drops 30% of h2's packets   ridden through,
#                        both ways (numgen random mod 100 < 30)  or detected
#                        (a retransmission backs off past the collective's
#                        30 s no-progress limit: bounded from the last step)
#   faults_slow_link     htb shapes both ends of h2's link    ridden through
#                        to 300 kbit/s
#   faults_xport_delay   the fault transport delays every     ridden through
#                        tcp frame of h2's ranks 10+-10 ms
#   faults_xport_cut     the fault transport cuts one of      detected, the
#                        h2's links after 150 frames          link named
# (This kernel has no netem, so delay goes through the wrapper transport,
# transport/fault.c.)
set -u
here=$(dirname "$0")
. "$here/../sh/lib.bash"
. "$here/../sh/netns.bash"
netns_init faults
for c in nft tc; do command -v $c >/dev/null || { fail faults_programs "$c is not installed (make deps installs nftables, iproute2)"; exit 0; }; done
netns_hosts 2 faults
for h in "${hosts[@]}"; do wait_ssh "$h" || { fail faults_sshd_up "$h: $(tail -3 "$tmp"/sshd_h*.log)"; exit 0; }; done
h2=${ns[1]}
HB=5
# the runs that ride a fault through: 60 steps, the fault at the 20th; the
# runs that must detect one: 400 steps (they end at the fault, so the fault
# falls well inside the run however fast the machine logs the first steps)
train="steps: 60, micro_batch: 1, grad_accum: 2, log_every: 1"
trainL="steps: 400, micro_batch: 1, grad_accum: 2, log_every: 1"

job ref "[local]" "" "" "$train"
"$BATON" run "$tmp/ref.yaml" > "$tmp/ref.out" 2>&1
ref=$(losses "$tmp/ref.jsonl")
job refL "[local]" "" "" "$trainL"
"$BATON" run "$tmp/refL.yaml" > "$tmp/refL.out" 2>&1
refL=$(losses "$tmp/refL.jsonl")
[ "$(wc -w <<<"$ref")" -eq 60 ] && [ "$(wc -w <<<"$refL")" -eq 400 ] && pass faults_reference \
    || { fail faults_reference "$(tail -3 "$tmp/ref.out" "$tmp/refL.out")"; exit 0; }
# prefix_ok FILE: every loss FILE holds is the reference's at that step (the
# 400-step one's for a 400-step job)
prefix_ok() {
    local got want=$ref
    got=$(losses "$1"); grep -q "steps: 400" "${1%.jsonl}.yaml" && want=$refL
    [ -n "$got" ] && [[ "$want" == "$got"* ]]
}

# bprocs: the baton processes in h2's namespace
bprocs() { local p; for p in $(ip netns pids "$h2"); do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = baton ] && echo "$p"; done; }
# clear_faults: first, with the fault still in place, waits for what the
# job left on h2 (its agent and ranks cannot hear of the driver's end while
# h2 is cut off) to end by itself: the agent stops its ranks once its
# lifeline from the driver has been silent for 2 x the heartbeat timeout
# (spawn_beat); sets orphans_ok (1: gone within that + 3 s). Then h2's
# link up, no nftables rules, no qdisc.
clear_faults() {
    local left i p t0 bound
    left=$(bprocs | wc -l)
    bound=$(( 2 * ${HB_JOB:-$HB} + 3 ))
    t0=$(date +%s.%N)
    for i in $(seq 1 $(( bound * 10 ))); do [ -z "$(bprocs)" ] && break; sleep 0.1; done
    orphans_ok=0; [ -z "$(bprocs)" ] && orphans_ok=1
    echo "    $left baton processes on h2 when the driver ended; $(bprocs | wc -l) of them left" \
         "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s later, the fault still in place" >> "$tmp/summary"
    ip -n "$h2" link set eth0 up 2>/dev/null
    ip -n "$h2" route replace default via "$net.1" 2>/dev/null
    ip netns exec "$h2" nft flush ruleset 2>/dev/null
    ip netns exec "$h2" tc qdisc del dev eth0 root 2>/dev/null
    tc qdisc del dev "bt18v${tag}2" root 2>/dev/null
    for p in $(bprocs); do kill -9 "$p" 2>/dev/null; done
    sleep 0.2
}

# run_faulted NAME AT FAULT_CMD [ENV...]: starts job NAME (with its launch
# fields already written), applies FAULT_CMD once AT losses are logged, waits
# for the driver; sets rc, elapsed (s, fault to end) and the files
# $tmp/NAME.{out,err,jsonl}
run_faulted() {
    local name=$1 at=$2 cmd=$3 t0 i
    shift 3
    env "$@" timeout 300 "$BATON" run "$tmp/$name.yaml" > "$tmp/$name.out" 2> "$tmp/$name.err" &
    driver=$!
    for i in $(seq 1 3000); do
        [ "$(cat "$tmp/$name.jsonl" 2>/dev/null | grep -c .)" -ge "$at" ] && break
        kill -0 "$driver" 2>/dev/null || break
        sleep 0.02
    done
    t0=$(date +%s.%N)
    eval "$cmd"
    wait "$driver"; rc=$?
    driver=
    elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    echo "$name: rc $rc, ${elapsed} s after the fault, $(grep -c . "$tmp/$name.jsonl") steps logged" >> "$tmp/summary"
}

# detected TEST JOB WHAT [HOSTS [REPORT]]: failed in time (within the
# heartbeat timeout + 10 s of the fault), the driver's report names h2 (or
# one of HOSTS, a regex) and matches REPORT (a regex), no wrong loss was
# written, and nothing of the job is left on h2 once its lifeline bound
# has passed (clear_faults)
detected() {
    local test=$1 name=$2 what=$3 named=${4:-${hosts[1]}} report=${5:-.}
    clear_faults
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && awk -v e="$elapsed" -v m="$((HB + 10))" 'BEGIN { exit !(e <= m) }' \
        && grep -Eq "job failed: .*host ($named)," "$tmp/$name.err" && grep "job failed" "$tmp/$name.err" | grep -Eq "$report" \
        && prefix_ok "$tmp/$name.jsonl" && [ "$orphans_ok" -eq 1 ]; then
        pass "$test"
    else fail "$test" "$what: rc $rc after ${elapsed} s, h2 cleared: $orphans_ok: $(grep -m2 "job failed\|error" "$tmp/$name.err")"; fi
    grep -m1 "job failed" "$tmp/$name.err" | sed "s/^/  $test report: /"
}
ridden() {
    local test=$1 name=$2 what=$3 proof=$4 got
    clear_faults
    got=$(losses "$tmp/$name.jsonl")
    if [ "$rc" -eq 0 ] && [ "$got" = "$ref" ] && [ "$proof" -eq 1 ]; then pass "$test"
    else fail "$test" "$what (fault in effect: $proof): rc $rc after ${elapsed} s, $(wc -w <<<"$got") losses, $(grep -m2 "job failed\|error" "$tmp/$name.err")"; fi
}

two="[${hosts[0]}, ${hosts[1]}]"
# nft_h2 RULES: loads the table RULES (nft syntax) into h2's namespace
nft_h2() { printf '%s\n' "$1" > "$tmp/rules.nft"; ip netns exec "$h2" nft -f "$tmp/rules.nft" || echo "nft failed" >> "$tmp/summary"; }

job down "$two" "" ", heartbeat_timeout: $HB" "$trainL"
run_faulted down 20 "ip -n $h2 link set eth0 down"
detected faults_link_down down "link down" "${hosts[1]}" "nor from the other 1 rank\\(s\\) of host ${hosts[1]}: that host, or the link between it and this driver, is down"

job part "$two" "" ", heartbeat_timeout: $HB" "$trainL"
run_faulted part 20 'nft_h2 "table inet part {
  chain i { type filter hook input priority 0; iifname \"eth0\" drop; }
  chain o { type filter hook output priority 0; oifname \"eth0\" drop; }
}"'
detected faults_partition part "partition of h2" "${hosts[1]}" "nor from the other 1 rank\\(s\\) of host ${hosts[1]}: that host, or the link between it and this driver, is down"

# 30% loss each way: TCP retransmits; a retransmission timeout doubles at each
# loss of the same segment, so the heartbeat timeout is raised to ride it out
job loss "$two" "" ", heartbeat_timeout: 60" "$train"
run_faulted loss 20 'nft_h2 "table inet loss {
  chain i { type filter hook input priority 0; iifname \"eth0\" numgen random mod 100 < 30 counter drop; }
  chain o { type filter hook output priority 0; oifname \"eth0\" numgen random mod 100 < 30 counter drop; }
}"'
drops=$(ip netns exec "$h2" nft list ruleset 2>/dev/null | grep -o 'packets [0-9]*' | awk '{ s += $2 } END { print s + 0 }')
if [ "$rc" -eq 0 ]; then
    ridden faults_loss30 loss "30% loss" "$([ "$drops" -gt 50 ] && echo 1 || echo 0)"
    echo "  loss30: ridden through"
else
    # a retransmission backed off past the collective's 30 s no-progress
    # limit: detected. Bounded from the last step logged by that limit plus
    # what the step in flight spent making slow progress first (TCP's
    # retransmission back-off under 30% loss: each resend resets the
    # no-progress clock) plus the report's 10 s: 30 + 20 + 10. A 4 Dec run
    # ended 43 s after its last step, past the 40 s this bound was before.
    since=$(( $(date +%s) - $(stat -c %Y "$tmp/loss.jsonl") ))
    elapsed=$since; HB_SAVE=$HB; HB=50; HB_JOB=60
    if [ "$drops" -gt 50 ]; then detected faults_loss30 loss "30% loss" "${hosts[0]}|${hosts[1]}"
    else fail faults_loss30 "the rules dropped $drops packets"; clear_faults; fi
    HB=$HB_SAVE; HB_JOB=
    echo "  loss30: detected, the job ended ${since} s after its last logged step"
fi
echo "  loss30: $drops packets dropped by h2's rules"

job slow "$two" "" ", heartbeat_timeout: $HB" "$train"
run_faulted slow 3 "ip netns exec $h2 tc qdisc add dev eth0 root handle 1: htb default 10
ip netns exec $h2 tc class add dev eth0 parent 1: classid 1:10 htb rate 300kbit ceil 300kbit
tc qdisc add dev bt18v${tag}2 root handle 1: htb default 10
tc class add dev bt18v${tag}2 parent 1: classid 1:10 htb rate 300kbit ceil 300kbit"
shaped=$(ip netns exec "$h2" tc -s class show dev eth0 | sed -n 's/.*Sent \([0-9]*\) bytes.*/\1/p' | head -1)
ridden faults_slow_link slow "htb 300 kbit/s" "$([ "${shaped:-0}" -gt 100000 ] && echo 1 || echo 0)"
echo "  slow link: $shaped bytes sent through h2's 300 kbit/s class"

job delay "$two" "" ", heartbeat_timeout: $HB" "$train"
run_faulted delay 0 ":" "BATON_TEST_XPORT_FAULT=delay_ms=10,jitter_ms=10,host=${hosts[1]}"
wrapped=$(grep -c "^\[${hosts[1]} r[23]\] .*go through the fault wrapper" "$tmp/delay.err")
unwrapped=$(grep -c "^\[${hosts[0]} r[01]\] .*go through the fault wrapper" "$tmp/delay.err")
ridden faults_xport_delay delay "wrapper delay 10+-10 ms" "$([ "$wrapped" -eq 2 ] && [ "$unwrapped" -eq 0 ] && echo 1 || echo 0)"

job cut "$two" "" ", heartbeat_timeout: $HB" "$trainL"
run_faulted cut 0 ":" "BATON_TEST_XPORT_FAULT=drop_after=150,host=${hosts[1]},peer=${hosts[0]}:"
if grep -q "^\[${hosts[1]} r[23]\] .*cutting the link ${hosts[1]} -> ${hosts[0]}:" "$tmp/cut.err"; then
    # either end of the cut link may report first: both name the link's hosts
    detected faults_xport_cut cut "wrapper cut" "${hosts[0]}|${hosts[1]}"
else fail faults_xport_cut "no cut reported: $(grep -m3 "fault\|job failed" "$tmp/cut.err")"; clear_faults; fi
grep -m1 "cutting the link" "$tmp/cut.err" | sed "s/^/  faults_xport_cut: /"

sed 's/^/  /' "$tmp/summary"
exit 0
