#!/usr/bin/env bash
# The kill campaign of the checkpoint commit (docs/CHECKPOINTS.md, "A root"):
# a run that saves after every step is SIGKILLed right before one of the
# file-system steps of its saves (BATON_FAULT_SAVE_STEP: every directory
# creation, file creation, write, fsync, rename, removal: mid-file, between
# the files and the rename, between the rename and `latest`), trial after
# trial, one step further each time. After each kill `--resume latest` must
# load a complete checkpoint, never a partial or corrupt one, and the run
# must then go on exactly as the run that was never killed (the same losses,
# bit for bit). Single process: KILL_TRIALS trials (default 100) spread
# over every step of four saves; then a pp=2 x dp=2 job (every rank process
# dies at its N-th step) for KILL_DIST_TRIALS (default 12).
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_ckpt_kill.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# sanitizer builds run a few times slower: fewer trials there (the campaign of
# record is the plain build's)
case "${BUILD:-build}" in *san-*) trials=${KILL_TRIALS:-25}; dist_trials=${KILL_DIST_TRIALS:-4} ;;
    *) trials=${KILL_TRIALS:-100}; dist_trials=${KILL_DIST_TRIALS:-12} ;; esac

mkdir -p "$tmp/data"
lcg_tokens 11 4000 40 9 64 > "$tmp/data/tokens.txt"
cat > "$tmp/job.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 2, kv_heads: 1, ffn: 64, vocab: 64, init_std: 0.02}
data: {dir: $tmp/data, seq_len: 16, split: 0}
train: {steps: 8, micro_batch: 2, grad_accum: 2, seed: 5, log_every: 100}
optim: {lr: 0.01, min_lr: 0.001, warmup: 3}
checkpoint: {every: 1, keep: 2}
YAML
losses() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "loss" in r: print(r["step"], repr(r["loss"]))' "$1"; }

# campaign NAME TRIALS [SETS...]
campaign() {
    local name=$1 n=$2; shift 2
    local dir="$tmp/$name"
    "$BATON" run "$tmp/job.yaml" --quiet --set checkpoint.dir="$dir/ref" --set metrics.file="$dir/ref.jsonl" \
        "$@" > "$dir.ref.out" 2>&1 || { fail "${name}_reference" "$(tail -2 "$dir.ref.out")"; return; }
    # the save steps of a run that stops after step 4 (four saves)
    BATON_LOG=debug "$BATON" run "$tmp/job.yaml" --quiet --set checkpoint.dir="$dir/count" \
        --set metrics.file="$dir/count.jsonl" --set train.stop_after=4 "$@" > "$dir.count.out" 2>&1
    local total
    total=$(grep -o 'save step [0-9]*:' "$dir.count.out" | sed 's/[^0-9]//g' | sort -n | tail -1)
    [ "${total:-0}" -gt 20 ] || { fail "${name}_count" "${total:-no} save steps"; return; }
    local bad=0 loaded=0 none=0 prev=0 k at
    for k in $(seq 1 "$n"); do
        at=$(( (k - 1) * total / n + 1 ))
        [ "$at" = "$prev" ] && continue
        prev=$at
        rm -rf "$dir/t" "$dir/t.jsonl"
        (BATON_FAULT_SAVE_STEP=$at "$BATON" run "$tmp/job.yaml" --quiet --set checkpoint.dir="$dir/t" \
            --set metrics.file="$dir/t.jsonl" --set train.stop_after=4 "$@"; :) > "$dir.kill.out" 2>&1
        if ! grep -q 'fault injection: killed before save step' "$dir.kill.out"; then
            bad=$((bad + 1)); echo "# trial $at: not killed: $(tail -1 "$dir.kill.out")"; continue
        fi
        "$BATON" run "$tmp/job.yaml" --quiet --resume --set checkpoint.dir="$dir/t" \
            --set metrics.file="$dir/t.jsonl" "$@" > "$dir.resume.out" 2>&1
        local rc=$?
        if [ $rc != 0 ] && grep -q 'no committed checkpoint' "$dir.resume.out" && [ ! -e "$dir/t/latest" ]; then
            none=$((none + 1)); continue # killed before the first commit: nothing to load, said so
        fi
        if [ $rc = 0 ] && cmp -s <(losses "$dir/ref.jsonl") <(losses "$dir/t.jsonl") &&
           cmp -s "$dir/ref/step-00000008/shard-r00000.safetensors" "$dir/t/step-00000008/shard-r00000.safetensors"; then
            loaded=$((loaded + 1))
        else
            bad=$((bad + 1))
            echo "# trial $at ($(grep -o 'killed before save step.*' "$dir.kill.out")): rc $rc: $(grep -v ' info ' "$dir.resume.out" | tail -2)"
        fi
    done
    echo "# $name: $total save steps, $loaded trials resumed exactly, $none killed before any commit, $bad bad"
    [ $bad = 0 ] && [ $((loaded + none)) -ge $(( n < total ? n : total )) ] && [ $loaded -gt $none ] \
        && pass "${name}_kill_campaign" || fail "${name}_kill_campaign" "$bad bad of $((loaded + none + bad))"
}

mkdir -p "$tmp/single" "$tmp/dist"
campaign single "$trials"
campaign dist "$dist_trials" --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero1=true \
    --set parallel.microbatches=2
