#!/usr/bin/env bash
# Exports (export.dir) are atomic and honoured in every layout.
#  1. `baton run` with export.every: 1 (two saves), killed before each
#     step of both saves in turn (BATON_FAULT_SAVE_STEP, base/save.h): the
#     directory is then the previous export or the new one, byte-equal to
#     the reference export of that step, `baton eval` on it gives that
#     step's loss, and the next save leaves no temporary behind.
#  2. Real SIGKILLs of a run that exports every step: the export loads, and
#     the next save leaves no temporary.
#  3. export.every in multi-process runs: the exports of steps 2 and 3
#     (step 2 captured by killing the run before the save of step 3 starts)
#     equal the single-process run's: bitwise for pp=2 (untied: every
#     gradient is accumulated microbatch by microbatch in the same order),
#     within 1e-5 where sums run in another order: dp=2 with ZeRO-1 (the
#     replicas' gradients are added after accumulation), tp=2 pp=2 and
#     pp=2 dp=2 with tied embeddings (the embedding's two gradient halves).
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_ckpt_save.XXXXXX)
export TMPDIR=$tmp
export OPENBLAS_NUM_THREADS=1 # the same kernels in every process of every run
driver=
cleanup() { [ -n "$driver" ] && kill -9 "$driver" 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$tmp"; }
trap cleanup EXIT

mkdir -p "$tmp/data"
awk 'BEGIN { x = 12345; for (i = 0; i < 4000; i++) { x = (x * 1103515245 + 12345) % 2147483648;
       t = (i % 48); if (x % 10 == 0) t = int(x / 65536) % 64; printf "%d ", t } print "" }' \
    > "$tmp/data/tokens.txt"
printf '1 5 9 13 17 21 25 29\n2 4 6 8 10 12 14 16\n' > "$tmp/ids.txt" # at most max_position_embeddings (8)
cat > "$tmp/job.yaml" <<YAML
model: {layers: 1, hidden: 32, heads: 4, kv_heads: 2, ffn: 64, vocab: 64}
data: {dir: $tmp/data, seq_len: 8, split: 0}
train: {steps: 2, micro_batch: 2, grad_accum: 2, seed: 3, log_every: 100}
optim: {lr: 0.01, min_lr: 0.001, warmup: 1, clip: 1.0}
export: {dir: $tmp/ck/model, every: 1}
YAML
mkdir -p "$tmp/ck"

# state DIR: which reference export DIR is: "none" (missing), 1 or 2
# (byte-equal files, nothing else in it), else "torn: ...".
state() {
    local d=$1 r
    [ -e "$d" ] || { echo none; return; }
    for r in 1 2; do
        if [ "$(ls -A "$d" | tr '\n' ' ')" = "config.json model.safetensors " ] &&
           cmp -s "$d/config.json" "$tmp/ref$r/config.json" &&
           cmp -s "$d/model.safetensors" "$tmp/ref$r/model.safetensors"; then echo $r; return; fi
    done
    echo "torn: $(ls -A "$d" | tr '\n' ' ')"
}
eval_loss() { field loss "$("$BATON" eval --model "$1" --ids "$tmp/ids.txt" --json 2>/dev/null)"; }
# the step number of the k-th save's first step in a BATON_LOG=debug log
save_start() { grep 'save step [0-9]*: create directory' "$1" | sed -n "$2s/.*save step \([0-9]*\):.*/\1/p"; }

# ---- 1. fault injection over every step of two saves ----------------------------------
BATON_LOG=debug "$BATON" run "$tmp/job.yaml" --quiet > "$tmp/debug.log" 2>&1 || fail sweep_reference_run "rc $?"
total=$(grep -c 'save step [0-9]*:' "$tmp/debug.log")
second=$(save_start "$tmp/debug.log" 2)
cp -r "$tmp/ck/model" "$tmp/ref2"
rm -rf "$tmp/ck/model"
BATON_FAULT_SAVE_STEP=$second "$BATON" run "$tmp/job.yaml" --quiet > /dev/null 2>&1
cp -r "$tmp/ck/model" "$tmp/ref1"
loss1=$(eval_loss "$tmp/ref1"); loss2=$(eval_loss "$tmp/ref2")
echo "two saves: $total steps, the second from step $second; losses $loss1 (step 1), $loss2 (step 2)"
if [ -n "$second" ] && [ "$total" -gt "$second" ] && [ -n "$loss1" ] && [ -n "$loss2" ] &&
   [ "$loss1" != "$loss2" ] && ! cmp -s "$tmp/ref1/model.safetensors" "$tmp/ref2/model.safetensors"; then
    pass sweep_references
else
    fail sweep_references "total '$total', second '$second', losses '$loss1' '$loss2'"
fi
bad=""; seen=""; temps=0
for n in $(seq 1 "$total"); do
    rm -rf "$tmp/ck/model"
    BATON_FAULT_SAVE_STEP=$n "$BATON" run "$tmp/job.yaml" --quiet > "$tmp/fault.log" 2>&1
    rc=$?
    s=$(state "$tmp/ck/model")
    [ "$rc" -eq 137 ] || bad="$bad [step $n: rc $rc]"
    if [ "$n" -lt "$second" ]; then allowed="none 1"; else allowed="1 2"; fi
    case " $allowed " in *" $s "*) ;; *) bad="$bad [step $n: $s, expected one of: $allowed]" ;; esac
    if [ "$s" = 1 ] || [ "$s" = 2 ]; then
        l=$(eval_loss "$tmp/ck/model"); want=$([ "$s" = 1 ] && echo "$loss1" || echo "$loss2")
        [ "$l" = "$want" ] || bad="$bad [step $n: eval loss $l, expected $want]"
    fi
    seen="$seen$s"
    ls -A "$tmp/ck" | grep -q 'baton-tmp' && temps=$((temps + 1))
    # the next save (a one-step run exporting at its end) leaves no temporary
    "$BATON" run "$tmp/job.yaml" --quiet --set train.steps=1 --set optim.warmup=0 > "$tmp/next.log" 2>&1 ||
        bad="$bad [step $n: next save failed: $(tail -1 "$tmp/next.log")]"
    left="$(ls -A "$tmp/ck" | tr '\n' ' ')/ $(ls -A "$tmp/ck/model" | tr '\n' ' ')"
    [ "$left" = "model / config.json model.safetensors " ] || bad="$bad [step $n: after the next save: $left]"
done
echo "killed before each of $total steps: states $seen; $temps kills left a temporary"
[ -z "$bad" ] && [ "$total" -gt 0 ] && pass sweep_every_step_previous_or_new || fail sweep_every_step_previous_or_new "$bad"
case "$seen" in *none*1*1*2*) pass sweep_saw_all_states ;; *) fail sweep_saw_all_states "$seen" ;; esac

# ---- 2. real SIGKILLs of a run exporting every step --------------------------------------
bad=""; temps=0
for t in 0 1 2 3; do
    rm -rf "$tmp/ck/model"
    "$BATON" run "$tmp/job.yaml" --quiet --set train.steps=100000 --set train.log_every=100000 \
        > "$tmp/kill.log" 2>&1 &
    driver=$!
    for _ in $(seq 1 200); do [ -e "$tmp/ck/model" ] && break; sleep 0.02; done
    sleep "0.0$((t * 3))"
    kill -9 "$driver"; wait "$driver" 2>/dev/null; driver=
    ls -A "$tmp/ck" | grep -q 'baton-tmp' && temps=$((temps + 1))
    [ "$(ls -A "$tmp/ck/model" 2>/dev/null | tr '\n' ' ')" = "config.json model.safetensors " ] ||
        bad="$bad [trial $t: export holds '$(ls -A "$tmp/ck/model" 2>/dev/null | tr '\n' ' ')']"
    [ -n "$(eval_loss "$tmp/ck/model")" ] || bad="$bad [trial $t: baton eval failed]"
    "$BATON" run "$tmp/job.yaml" --quiet --set train.steps=1 --set optim.warmup=0 > /dev/null 2>&1
    [ "$(ls -A "$tmp/ck" | tr '\n' ' ')" = "model " ] || bad="$bad [trial $t: after the next save: $(ls -A "$tmp/ck")]"
done
echo "4 SIGKILLs: $temps left a temporary (removed by the next save)"
[ -z "$bad" ] && pass sigkill_export_loads_no_temporaries || fail sigkill_export_loads_no_temporaries "$bad"

# ---- 3. export.every in multi-process layouts ---------------------------------------------
cat > "$tmp/mjob.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 4, kv_heads: 2, ffn: 64, vocab: 64}
data: {dir: $tmp/data, seq_len: 8, split: 0}
train: {steps: 3, micro_batch: 2, grad_accum: 2, seed: 3, log_every: 100}
optim: {lr: 0.01, min_lr: 0.001, warmup: 1, clip: 0}
export: {dir: $tmp/mck/model, every: 1}
YAML
# exports NAME --set ...: the run's exports of step 3 (NAME.3) and step 2 (NAME.2)
exports() {
    local name=$1 k; shift
    mkdir -p "$tmp/mck"; rm -rf "$tmp/mck/model"
    BATON_LOG=debug "$BATON" run "$tmp/mjob.yaml" --quiet "$@" > "$tmp/$name.log" 2>&1 ||
        { echo "$name: rc $?"; tail -3 "$tmp/$name.log"; }
    cp -r "$tmp/mck/model" "$tmp/$name.3"
    k=$(save_start "$tmp/$name.log" 3)
    rm -rf "$tmp/mck/model"
    BATON_FAULT_SAVE_STEP=$k "$BATON" run "$tmp/mjob.yaml" --quiet "$@" > /dev/null 2>&1
    cp -r "$tmp/mck/model" "$tmp/$name.2"
}
# same A B [TOL]: every tensor of A's export equals B's (bitwise, or within TOL)
same() {
    python3 - "$1" "$2" "${3:-0}" <<'PY'
import array, json, struct, sys
def load(p):
    b = open(p + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]; a = array.array("f"); a.frombytes(b[8 + n + s:8 + n + e])
        out[k] = (v["shape"], a)
    return out
a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
assert a.keys() == b.keys(), (sorted(a), sorted(b))
worst = 0.0
for k in a:
    assert a[k][0] == b[k][0], (k, a[k][0], b[k][0])
    d = max(abs(x - y) for x, y in zip(a[k][1], b[k][1]))
    worst = max(worst, d)
    assert d <= tol, (k, d)
assert open(sys.argv[1] + "/config.json").read() == open(sys.argv[2] + "/config.json").read()
print("max abs diff %.3g" % worst)
PY
}
exports sp --set model.tie_embeddings=false
exports sp_tied --set model.tie_embeddings=true
exports sp_tied4 --set model.tie_embeddings=true --set train.grad_accum=4
check_layout() { # name reference tolerance --set ...
    local name=$1 ref=$2 tol=$3 s2 s3; shift 3
    exports "$name" "$@"
    if [ "$tol" = 0 ]; then
        cmp -s "$tmp/$name.2/model.safetensors" "$tmp/$ref.2/model.safetensors" && s2=bitwise || s2=differs
        cmp -s "$tmp/$name.3/model.safetensors" "$tmp/$ref.3/model.safetensors" && s3=bitwise || s3=differs
    else
        s2=$(same "$tmp/$name.2" "$tmp/$ref.2" "$tol" 2>&1 | tail -1)
        s3=$(same "$tmp/$name.3" "$tmp/$ref.3" "$tol" 2>&1 | tail -1)
    fi
    echo "$name: step 2 $s2; step 3 $s3"
    if cmp -s "$tmp/$name.2/model.safetensors" "$tmp/$name.3/model.safetensors"; then
        fail "every_${name}_equals_single_process" "no export of step 2 (the run wrote only at its end)"
    elif { [ "$tol" = 0 ] && [ "$s2" = bitwise ] && [ "$s3" = bitwise ]; } ||
       { [ "$tol" != 0 ] && [[ "$s2" == "max abs diff"* ]] && [[ "$s3" == "max abs diff"* ]]; }; then
        pass "every_${name}_equals_single_process"
    else fail "every_${name}_equals_single_process" "step 2: $s2; step 3: $s3"; fi
}
# the references themselves: step 2 and step 3 differ
cmp -s "$tmp/sp.2/model.safetensors" "$tmp/sp.3/model.safetensors" && fail every_reference_steps_differ ||
    pass every_reference_steps_differ
check_layout pp2 sp 0 --set model.tie_embeddings=false --set parallel.pp=2
check_layout dp2_zero1 sp 1e-5 --set model.tie_embeddings=false --set parallel.dp=2 --set train.grad_accum=1 \
    --set parallel.zero1=true
check_layout tp2_pp2_tied sp_tied 1e-5 --set model.tie_embeddings=true --set parallel.tp=2 --set parallel.pp=2
check_layout pp2_dp2_tied sp_tied4 1e-5 --set model.tie_embeddings=true --set parallel.pp=2 --set parallel.dp=2 \
    --set parallel.zero1=true
# a killed multi-process run leaves no run directory behind (its guard
# removes it right after the driver's death; up to 5 s)
for _ in $(seq 1 50); do [ -z "$(ls -d "$tmp"/baton-run-* 2>/dev/null)" ] && break; sleep 0.1; done
[ -z "$(ls -d "$tmp"/baton-run-* 2>/dev/null)" ] && pass every_kill_leaves_no_run_dir ||
    fail every_kill_leaves_no_run_dir "$(ls -d "$tmp"/baton-run-*)"
exit 0
