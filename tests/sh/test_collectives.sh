#!/usr/bin/env bash
# Choosing the collective backend (parallel.collectives, docs/PARALLEL.md
# "Collective backends") without a GPU: nccl on a CPU device and an unknown
# word are job errors naming the field; nccl without its library names
# BATON_NCCL_LIB; with the library built but no GPU (this machine) every
# worker refuses to start, naming the reason, and the job stops cleanly;
# auto on cpu runs on host and says so in the header and run.json.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_collectives.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
BATON=$(readlink -f "$BATON")
mkdir -p "$tmp/data"
awk 'BEGIN { for (i = 0; i < 3000; i++) printf "%d ", (i * 7) % 50; print "" }' > "$tmp/data/tokens.txt"
cat > "$tmp/j.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 2, kv_heads: 2, ffn: 64, vocab: 64}
data: {dir: $tmp/data, seq_len: 8, split: 0}
train: {steps: 2, micro_batch: 1, grad_accum: 2, log_every: 1}
optim: {lr: 0.001, warmup: 0}
parallel: {dp: 2, collectives: nccl}
YAML
cd "$tmp"

"$BATON" run j.yaml > o1 2> e1; rc=$?
[ $rc = 1 ] && grep -q "j.yaml:5:19: parallel.collectives: nccl collectives need every rank's device to be cuda (device is cpu)" e1 \
    && pass collectives_nccl_needs_cuda || fail collectives_nccl_needs_cuda "rc $rc: $(cat e1)"
"$BATON" run j.yaml --set parallel.collectives=gloo > o2 2> e2; rc=$?
[ $rc = 1 ] && grep -q "parallel.collectives: expected one of auto|host|nccl, got 'gloo'" e2 \
    && pass collectives_unknown_word || fail collectives_unknown_word "rc $rc: $(cat e2)"
BATON_NCCL_LIB=$tmp/none.so "$BATON" run j.yaml --set device=cuda > o3 2> e3; rc=$?
[ $rc = 1 ] && grep -q "parallel.collectives: nccl collectives: BATON_NCCL_LIB=$tmp/none.so: No such file or directory (device is cuda)" e3 \
    && [ ! -d runs ] && pass collectives_nccl_missing_lib || fail collectives_nccl_missing_lib "rc $rc: $(cat e3)"

# the library itself, where it is built, on a machine without a GPU
lib=$(dirname "$BATON")/libbaton_nccl.so
if [ ! -e "$lib" ]; then
    echo "SKIP collectives_nccl_no_gpu: $lib is not built here"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "SKIP collectives_nccl_no_gpu: this machine has a GPU"
else
    timeout 60 "$BATON" run j.yaml --set device=cuda > o4 2> e4; rc=$?
    if [ $rc = 1 ] && grep -q "collectives: nccl$" o4 &&
       grep -q "rank 0: nccl collectives unavailable: .*libbaton_nccl.so: .*no CUDA device" e4 &&
       grep -q "rank 1: nccl collectives unavailable" e4 && grep -q "job failed: rank" e4; then
        pass collectives_nccl_no_gpu
    else
        fail collectives_nccl_no_gpu "rc $rc: $(tail -4 e4)"
    fi
fi

# auto on cpu: host, in the header and the record
"$BATON" run j.yaml --set parallel.collectives=auto > o5 2> e5; rc=$?
run=$(sed -n 's/^baton run j.yaml: run \([0-9-]*\) in .*/\1/p' o5)
[ $rc = 0 ] && grep -q '| collectives: host$' o5 && grep -q '"collectives": *"host"' "runs/j/$run/run.json" \
    && pass collectives_auto_cpu_host || fail collectives_auto_cpu_host "rc $rc: $(tail -3 e5)"

# auto with several ranks on a host's one GPU: host (NCCL refuses two ranks of a
# communicator on one device), whatever the library; the header says so
# before any worker starts (here they then fail for want of a GPU)
timeout 60 "$BATON" run j.yaml --set device=cuda --set parallel.collectives=auto > o6 2> e6
grep -q '| collectives: host$' o6 && pass collectives_auto_shared_gpu_host \
    || fail collectives_auto_shared_gpu_host "$(grep -h 'collectives' o6 e6 | head -3)"
