#!/usr/bin/env bash
# The fault-injecting transport (transport/fault.c, BATON_TEST_XPORT_FAULT)
# on one host, the smoke case of the network-fault campaigns (those run
# between namespace hosts: tests/faults/, `make test-faults`):
#   xport_fault_delay_equal   every tcp frame of a 4-rank job (pp=2 dp=2)
#                             delayed 10+-10 ms: the wrapper is in use in
#                             every rank, and the losses equal the
#                             undelayed run's, bit for bit;
#   xport_fault_cut_detected  every link cut after its 40th frame: the job
#                             fails, well within the heartbeat timeout, the
#                             rank's line names the link, the driver names
#                             a rank, and no loss logged before is wrong;
#   xport_fault_bad_spec      a malformed setting is an error naming it.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_xport_fault.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/data"
lcg_tokens 7 4000 40 9 64 > "$tmp/data/tokens.txt"
cat > "$tmp/j.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 2, kv_heads: 2, ffn: 64, vocab: 64}
data: {dir: $tmp/data, seq_len: 8, split: 0}
train: {steps: 6, micro_batch: 1, grad_accum: 2, log_every: 1}
optim: {lr: 0.003, min_lr: 0.0003, warmup: 0}
parallel: {pp: 2, dp: 2}
transport: {pipeline: tcp, data_parallel: tcp}
metrics: {file: $tmp/m.jsonl}
runs: $tmp/runs
YAML
losses() { sed -n 's/.*"loss": *\([-0-9.eE+]*\).*/\1/p' "$1" | tr '\n' ' '; }

"$BATON" run "$tmp/j.yaml" > "$tmp/ref.out" 2>&1
ref=$(losses "$tmp/m.jsonl")

BATON_TEST_XPORT_FAULT=delay_ms=10,jitter_ms=10 timeout "$(scaled 120)" "$BATON" run "$tmp/j.yaml" \
    > "$tmp/delay.out" 2>&1; rc=$?
got=$(losses "$tmp/m.jsonl")
wrapped=$(grep -c "^baton\[rank[0-3]\] warn: fault: .*go through the fault wrapper" "$tmp/delay.out")
if [ "$rc" -eq 0 ] && [ "$(wc -w <<<"$ref")" -eq 6 ] && [ "$got" = "$ref" ] && [ "$wrapped" -eq 4 ]; then
    pass xport_fault_delay_equal
else fail xport_fault_delay_equal "rc $rc, $wrapped ranks wrapped: ref [$ref] delayed [$got]"; fi

t0=$(date +%s.%N)
BATON_TEST_XPORT_FAULT=drop_after=40 timeout "$(scaled 60)" "$BATON" run "$tmp/j.yaml" > "$tmp/cut.out" 2>&1; rc=$?
el=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
got=$(losses "$tmp/m.jsonl")
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && awk -v e="$el" -v m="$(scaled 5)" 'BEGIN { exit !(e < m) }' \
    && grep -q "^baton\[rank[0-3]\] error: fault: .*cutting the link this host -> 127.0.0.1:[0-9]* (id [0-9]) after 40 frames" "$tmp/cut.out" \
    && grep -q "job failed: rank [0-3] (pid [0-9]*, host local" "$tmp/cut.out" && [[ "$ref" == "$got"* ]]; then
    pass xport_fault_cut_detected
else fail xport_fault_cut_detected "rc $rc after $el s: $(grep -m2 "cutting\|job failed" "$tmp/cut.out")"; fi

BATON_TEST_XPORT_FAULT=delay=5 timeout "$(scaled 60)" "$BATON" run "$tmp/j.yaml" > "$tmp/bad.out" 2>&1; rc=$?
if [ "$rc" -ne 0 ] && grep -q "BATON_TEST_XPORT_FAULT=delay=5: expected delay_ms=" "$tmp/bad.out"; then
    pass xport_fault_bad_spec
else fail xport_fault_bad_spec "rc $rc: $(tail -3 "$tmp/bad.out")"; fi
exit 0
