#!/usr/bin/env bash
# Slurm launch against a real single-machine Slurm that this test starts
# and tears down: munged with a generated key, slurmctld and one slurmd per
# declared node (bt1, bt2: NodeHostname=localhost, each on its own port),
# all on a config of the test's own (SLURM_CONF). What this container
# cannot run is configured around: no cgroups (proctrack/linuxproc,
# task/none, jobacct_gather/none), no accounting database
# (accounting_storage/none), everything as root (SlurmUser=root).
#   slurm_losses_equal_local   `salloc -N2 baton run` of a 2 x 2-rank job
#                              (pp=2 dp=2) trains and its losses equal the
#                              local run's, bit for bit; one agent per node,
#                              each node's ranks prefixed with its name;
#   slurm_secret_not_in_argv   the job secret is on no command line of the
#                              step (srun's and the agents' argv);
#   slurm_uneven               ranks that do not split over the nodes are a
#                              clear error naming both counts;
#   slurm_outside_allocation   hosts: [slurm] outside an allocation says so.
# Needs root, as test_ssh does (SKIP, never a pass, when not root), and
# slurm-wlm + munge, which `make test` installs first (make deps): a missing
# program is a FAIL naming it, so a machine without them cannot pass by skipping.
set -u
. "$(dirname "$0")/lib.bash"
if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP slurm: needs root (slurmd runs the steps as root here)"; exit 0
fi
missing=
for c in munged slurmctld slurmd salloc srun sinfo; do command -v "$c" >/dev/null || missing+=" $c"; done
if [ -n "$missing" ]; then
    fail slurm_programs "not installed:$missing (make deps installs slurm-wlm and munge)"; exit 0
fi
BATON_ABS=$(readlink -f "$BATON")
tmp=$(mktemp -d /tmp/test_slurm.XXXXXX)
chmod 755 "$tmp"
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    [ -n "${KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

base=$(( 30000 + $$ % 15000 ))
mkdir -p "$tmp/munge" "$tmp/state" "$tmp/spool" "$tmp/data"
chmod 700 "$tmp/munge"
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge/munge.key"
munged --force --key-file="$tmp/munge/munge.key" --socket="$tmp/munge/sock" \
    --pid-file="$tmp/munge/pid" --log-file="$tmp/munge/log" --seed-file="$tmp/munge/seed" -F > "$tmp/munge/out" 2>&1 &
pids+=($!)
export SLURM_CONF=$tmp/slurm.conf
cat > "$SLURM_CONF" <<EOF
ClusterName=bt$$
SlurmctldHost=localhost
SlurmctldPort=$base
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge/sock
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool/%n
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd-%n.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd-%n.log
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
NodeName=bt1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((base + 1)) CPUs=1 State=UNKNOWN
NodeName=bt2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((base + 2)) CPUs=1 State=UNKNOWN
PartitionName=bt Nodes=bt1,bt2 Default=YES MaxTime=INFINITE State=UP
EOF
for i in 1 2; do mkdir -p "$tmp/spool/bt$i"; done
for _ in $(seq 1 50); do [ -S "$tmp/munge/sock" ] && break; sleep 0.1; done
slurmctld -D -i -f "$SLURM_CONF" > "$tmp/slurmctld.out" 2>&1 &
pids+=($!)
for i in 1 2; do
    slurmd -D -N "bt$i" -f "$SLURM_CONF" > "$tmp/slurmd-bt$i.out" 2>&1 &
    pids+=($!)
done
up=0
# a node's slurmd registers within a second on a quiet machine; under the
# whole suite's load it has been seen still "unk" after 30 s, so wait up to 90
# s of wall time. Each sinfo is bounded too: one that cannot reach slurmctld
# waits out its message timeout, and 900 of those once ran past the test
# runner's 600 s (a sanitizer run of the whole suite): a hang, not a result.
deadline=$(( $(date +%s) + $(scaled 90) ))
while [ "$(date +%s)" -lt "$deadline" ]; do
    n=$(timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null | grep -c idle)
    [ "${n:-0}" -eq 2 ] && { up=1; break; }
    sleep 0.1
done
if [ "$up" -eq 1 ]; then pass slurm_cluster_up
else
    fail slurm_cluster_up "$(timeout 10 sinfo -N 2>&1 | tail -n 3) $(tail -n 5 "$tmp/slurmctld.out" \
        "$tmp/slurmctld.log" "$tmp"/slurmd-bt*.out "$tmp"/slurmd-bt*.log 2>&1)"
    exit 0
fi

lcg_tokens 7 4000 40 9 64 > "$tmp/data/tokens.txt"
# job NAME HOSTS [PARALLEL]: the job file $tmp/NAME.yaml
job() {
    cat > "$tmp/$1.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 2, kv_heads: 2, ffn: 64, vocab: 64}
data: {dir: $tmp/data, seq_len: 8, split: 0}
train: {steps: 6, micro_batch: 1, grad_accum: 2, log_every: 1}
optim: {lr: 0.003, min_lr: 0.0003, warmup: 0}
parallel: {${3:-pp: 2, dp: 2}}
metrics: {file: $tmp/$1.jsonl}
runs: $tmp/runs
hosts: $2
YAML
}
losses() { sed -n 's/.*"loss": *\([-0-9.eE+]*\).*/\1/p' "$1" | tr '\n' ' '; }

job local "[local]"
if BATON_LAUNCH=local "$BATON" run "$tmp/local.yaml" > "$tmp/local.out" 2>&1; then pass slurm_local_reference
else fail slurm_local_reference "$(tail -5 "$tmp/local.out")"; fi
ref=$(losses "$tmp/local.jsonl")

# the allocation of both nodes: the default hosts ([local]) go through srun;
# while it runs, the step's command lines are collected
job sl "[local]"
BATON_LOG=debug timeout "$(scaled 300)" salloc -N2 -p bt --quiet "$BATON_ABS" run "$tmp/sl.yaml" \
    > "$tmp/sl.out" 2> "$tmp/sl.err" &
sal=$!
argv_seen=
while kill -0 "$sal" 2>/dev/null; do
    for p in $(pgrep -x srun; pgrep -f "agent --slurm"); do
        argv_seen+="$(tr "\0" " " 2>/dev/null < "/proc/$p/cmdline")"$'\n'
    done
    sleep 0.05
done
wait "$sal"; rc=$?
got=$(losses "$tmp/sl.jsonl")
if [ "$rc" -eq 0 ] && [ "$(wc -w <<<"$ref")" -eq 6 ] && [ "$got" = "$ref" ] \
    && grep -q "launch: slurm: srun (pid [0-9]*) starts 2 agents of 2 ranks each on bt1..bt2" "$tmp/sl.err" \
    && grep -q '^\[bt1 r0\] ' "$tmp/sl.err" && grep -q '^\[bt2 r3\] ' "$tmp/sl.err"; then
    pass slurm_losses_equal_local
else fail slurm_losses_equal_local "rc $rc: local [$ref] slurm [$got] $(grep -v '^\[' "$tmp/sl.err" | tail -5)"; fi
if grep -q "agent --slurm" <<<"$argv_seen" && ! grep -qi "secret" <<<"$argv_seen"; then
    pass slurm_secret_not_in_argv
else fail slurm_secret_not_in_argv "argv seen: $(head -c 400 <<<"$argv_seen")"; fi

# 3 ranks (pp=3) over 2 nodes
job odd "[local]" "pp: 3"
sed -i "s/layers: 2/layers: 3/; s/grad_accum: 2/grad_accum: 3/" "$tmp/odd.yaml"
timeout "$(scaled 120)" salloc -N2 -p bt --quiet "$BATON_ABS" run "$tmp/odd.yaml" > "$tmp/odd.out" 2>&1; rc=$?
if [ "$rc" -ne 0 ] && grep -q "3 ranks do not split evenly over the Slurm allocation's 2 nodes" "$tmp/odd.out"; then
    pass slurm_uneven
else fail slurm_uneven "rc $rc: $(tail -3 "$tmp/odd.out")"; fi

job outside "[slurm]"
env -u SLURM_JOB_ID timeout 60 "$BATON" run "$tmp/outside.yaml" > "$tmp/outside.out" 2>&1; rc=$?
if [ "$rc" -ne 0 ] && grep -q "hosts: slurm, but this is not inside a Slurm allocation" "$tmp/outside.out"; then
    pass slurm_outside_allocation
else fail slurm_outside_allocation "rc $rc: $(tail -3 "$tmp/outside.out")"; fi

# every step ended: no agent or rank left behind
sleep 0.2
left=$(pgrep -f "$tmp/runs|agent --slurm" | wc -l)
[ "$left" -eq 0 ] && pass slurm_no_leftovers || fail slurm_no_leftovers "$left processes: $(pgrep -af "agent --slurm")"
exit 0
