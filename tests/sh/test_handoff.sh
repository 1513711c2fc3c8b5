#!/usr/bin/env bash
# Pipeline activations handed off through memory shared between the ranks'
# processes (train/handoff.h; transport.handoff: ipc, here over the cpu
# backend's POSIX shared memory, CUDA IPC on a GPU) against the same runs with
# payloads (off):
#   - 1F1B pp=2 with evaluations, and interleaved pp=2 x vpp=2 x dp=2 ZeRO-1:
#     every metrics line (loss, gradient norm, validation loss) and the
#     exported model are the same bit for bit;
#   - every handed tensor is released, the buffers are reused (their count
#     stays at the messages in flight, not the steps), none is left in
#     /dev/shm after the run;
#   - auto on cpu hands nothing off; ipc on the fenced device is refused;
#   - a receiver refuses a spoiled descriptor (bad magic, a shape beyond its
#     buffer) with an error naming it, and the run stops.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_handoff.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/data"
lcg_tokens 777 8000 40 9 200 > "$tmp/data/tokens.txt"
cut -d' ' -f1-32 "$tmp/data/tokens.txt" > "$tmp/ids.txt"
cat > "$tmp/job.yaml" <<YAML
model: {layers: 4, hidden: 64, heads: 4, kv_heads: 2, ffn: 128, vocab: 256, init_std: 0.02}
data: {dir: $tmp/data, seq_len: 32, split: 0.1}
train: {steps: 6, micro_batch: 2, grad_accum: 4, seed: 11, log_every: 100, eval_every: 3, eval_batches: 3}
optim: {lr: 0.003, min_lr: 0.0003, warmup: 1}
YAML
shm_before=$(ls /dev/shm 2>/dev/null | grep -c '^baton-')

for lay in pp2 pp2vpp2dp2; do
    sets=(--set parallel.pp=2)
    [ $lay = pp2vpp2dp2 ] && sets+=(--set parallel.virtual_stages=2 --set parallel.schedule=interleaved
                                    --set parallel.dp=2 --set parallel.zero1=true)
    for h in off ipc; do
        "$BATON" run "$tmp/job.yaml" "${sets[@]}" --set transport.handoff=$h \
            --set metrics.file="$tmp/$lay-$h.jsonl" --set export.dir="$tmp/$lay-$h" \
            > "$tmp/$lay-$h.out" 2> "$tmp/$lay-$h.err"
        echo $? > "$tmp/$lay-$h.rc"
    done
    strip() { sed 's/"tokens_per_s".*"skipped"/"skipped"/' "$1" 2>/dev/null; }
    e_off=$("$BATON" eval --model "$tmp/$lay-off" --ids "$tmp/ids.txt" --json 2>&1)
    e_ipc=$("$BATON" eval --model "$tmp/$lay-ipc" --ids "$tmp/ids.txt" --json 2>&1)
    n_lines=$(strip "$tmp/$lay-ipc.jsonl" | wc -l)
    if [ "$(cat "$tmp/$lay-off.rc")" = 0 ] && [ "$(cat "$tmp/$lay-ipc.rc")" = 0 ] && [ "$n_lines" -eq 8 ] &&
        [ "$(strip "$tmp/$lay-off.jsonl")" = "$(strip "$tmp/$lay-ipc.jsonl")" ] &&
        [ -n "$(field loss "$e_ipc")" ] && [ "$e_off" = "$e_ipc" ]; then
        pass "${lay}_handoff_same_bits"
    else
        fail "${lay}_handoff_same_bits" "rc $(cat "$tmp/$lay-off.rc")/$(cat "$tmp/$lay-ipc.rc"), $n_lines lines; $(diff <(strip "$tmp/$lay-off.jsonl") <(strip "$tmp/$lay-ipc.jsonl") | head -4); eval $e_off | $e_ipc; $(grep -i error "$tmp/$lay-ipc.err" | head -2)"
    fi
    # handed = released on every rank; buffers bounded by what is in flight
    # (pp=2 1F1B: at most pp activations out, M = 4 per step; interleaved
    # with vpp=2: twice that), never one per message
    stats=$(sed -n 's/.*rank \([0-9]*\): handed \([0-9]*\) tensors off through \([0-9]*\) shared buffers .*, \([0-9]*\) released/\1 \2 \3 \4/p' "$tmp/$lay-ipc.err")
    ranks=2; maxbuf=3; [ $lay = pp2vpp2dp2 ] && ranks=4 && maxbuf=6
    ok=$(awk -v r=$ranks -v mb=$maxbuf '{ n++; if ($2 != $4 || $2 < 6 * 4 || $3 < 1 || $3 > mb) bad++ }
                                       END { print (n == r && !bad) ? 1 : 0 }' <<<"$stats")
    if [ "$ok" = 1 ] && ! grep -q 'handed' "$tmp/$lay-off.err"; then pass "${lay}_released_and_reused"
    else fail "${lay}_released_and_reused" "rank handed buffers released: $(tr '\n' ';' <<<"$stats"), off run: $(grep -c handed "$tmp/$lay-off.err")"; fi
done

shm_after=$(ls /dev/shm 2>/dev/null | grep -c '^baton-')
if [ "$shm_after" -le "$shm_before" ]; then pass "no_shared_memory_left"
else fail "no_shared_memory_left" "$shm_before baton objects in /dev/shm before, $shm_after after"; fi

"$BATON" run "$tmp/job.yaml" --set parallel.pp=2 --set train.steps=1 --set metrics.file= \
    > "$tmp/auto.out" 2> "$tmp/auto.err"
rc=$?
if [ $rc -eq 0 ] && ! grep -q 'handed' "$tmp/auto.err"; then pass "auto_on_cpu_is_off"
else fail "auto_on_cpu_is_off" "rc $rc: $(grep handed "$tmp/auto.err" | head -1)"; fi

out=$("$BATON" run "$tmp/job.yaml" --set parallel.pp=2 --set device=fenced --set transport.handoff=ipc 2>&1)
rc=$?
if [ $rc -ne 0 ] && grep -q 'transport.handoff.*fenced device has none' <<<"$out"; then pass "fenced_ipc_refused"
else fail "fenced_ipc_refused" "rc $rc: $(tail -2 <<<"$out")"; fi

for bad in corrupt oversize; do
    want='bad magic'; [ $bad = oversize ] && want='not \[rows, 32, 64\]\|bytes of tensor in a buffer'
    BATON_TEST_HANDOFF=$bad timeout "$(scaled 60)" "$BATON" run "$tmp/job.yaml" --set parallel.pp=2 \
        --set transport.handoff=ipc --set metrics.file= > "$tmp/$bad.out" 2> "$tmp/$bad.err"
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "x from rank [0-9]*: .*\($want\)" "$tmp/$bad.err"; then
        pass "spoiled_descriptor_${bad}_refused"
    else fail "spoiled_descriptor_${bad}_refused" "rc $rc: $(grep -i 'error' "$tmp/$bad.err" | head -3)"; fi
done
