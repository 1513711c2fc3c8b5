#!/usr/bin/env bash
# The model-level half of the device check: baton's own model code on a GPU
# against transformers' numbers (the fixtures' expected.json) and against the
# CPU run of the same binary. Run from the repository root of a tree that
# holds build/baton and build/devpack/ (tools/device-pack.sh), on a machine
# with a GPU; tools/device-check.sh runs the per-op table first.
#
# Prints one table row per check: what, the GPU value, the reference, the
# relative difference, the tolerance, PASS/FAIL.
#   eval   every HF fixture: loss and gradient norm on cuda in fp32 (1e-4 of
#          transformers) and bf16 (1e-2)
#   train  20 steps of a fixture job on cuda, fp32 and bf16, against the CPU
#          run: every step's loss within 1e-2 (fp32: 1e-4), no NaN; the same
#          for the hybrid NemotronH fixture (Mamba2, attention, MLP layers)
#   gen    greedy generation on cuda fp32 gives the CPU's ids; the KV cache
#          gives the ids of recomputing the prefix (fp32, bf16)
#   skip   a NaN gradient injected at step 3 is skipped and moves nothing
#   smollm2  SmolLM2-135M's loss on 65536 Austen ids vs the CPU (when present)
#   memcheck  a short training run under compute-sanitizer: no error
# Exit status 0 when every row passes.
set -u
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/device-model-check}
BATON=$PWD/$BUILD/baton
mkdir -p "$OUT"
. "$(dirname "$0")/device-lib.sh"
printf '%-44s %-22s %-22s %-10s %-8s %s\n' check gpu reference rel tol result
# worst_rel REF.jsonl GOT.jsonl: the largest relative difference of the 20
# step losses, nan when either run does not have 20 finite ones
worst_rel() {
    python3 - "$1" "$2" <<'PY' 2>/dev/null
import json, math, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"loss"' in l]
b = [json.loads(l)["loss"] for l in open(sys.argv[2]) if '"loss"' in l]
if len(a) != 20 or len(b) != 20 or any(x is None or not math.isfinite(x) for x in b): print("nan")
else: print(max(abs(x - y) / abs(x) for x, y in zip(a, b)))
PY
}

# the dense fixtures, then the routed-expert ones (Mixtral, Qwen2-MoE), MLA
# (DeepSeek-V2 Lite-style and full-style) and the hybrid Mamba2 stacks
for fx in llama llama_f16 llama_sharded llama_tied_llama3 mistral qwen2 qwen2_bf16 \
          mixtral qwen2_moe qwen2_moe_norm deepseek_v2_lite deepseek_v2 nemotronh nemotronh_bias; do
    d=tests/fixtures/$fx
    [ -f "$d/expected.json" ] || continue
    ref=$(cat "$d/expected.json")
    for dt in fp32 bf16; do
        tol=1e-4; [ $dt = bf16 ] && tol=1e-2
        got=$("$BATON" eval --model "$d" --ids "$d/ids.txt" --grad-norm --json --device cuda --dtype $dt 2>"$OUT/eval_${fx}_$dt.err")
        row "eval $fx $dt loss" "$(field loss "$got")" "$(field loss "$ref")" $tol
        row "eval $fx $dt grad_norm" "$(field grad_norm "$got")" "$(field grad_norm "$ref")" $tol
    done
done

tmp=$(mktemp -d)
mkdir -p "$tmp/data"
awk 'BEGIN { x = 12345; for (i = 0; i < 20000; i++) { x = (x * 1103515245 + 12345) % 2147483648;
       t = (i % 48); if (x % 10 == 0) t = int(x / 65536) % 200; printf "%d ", t } print "" }' \
    > "$tmp/data/tokens.txt"
cat > "$tmp/job.yaml" <<YAML
model: {layers: 4, hidden: 128, heads: 4, kv_heads: 2, ffn: 256, vocab: 256, init_std: 0.02}
data: {dir: $tmp/data, seq_len: 64, split: 0.1}
train: {steps: 20, micro_batch: 4, grad_accum: 2, seed: 7, log_every: 100, eval_every: 10, eval_batches: 4}
optim: {lr: 0.001, min_lr: 0.0001, warmup: 2, weight_decay: 0.1, clip: 1.0}
YAML
"$BATON" run "$tmp/job.yaml" --quiet --set metrics.file="$tmp/cpu.jsonl" > "$OUT/train_cpu.log" 2>&1
for dt in fp32 bf16; do
    tol=1e-4; [ $dt = bf16 ] && tol=1e-2
    "$BATON" run "$tmp/job.yaml" --quiet --set device=cuda --set dtype=$dt \
        --set metrics.file="$tmp/$dt.jsonl" > "$OUT/train_$dt.log" 2>&1
    worst=$(worst_rel "$tmp/cpu.jsonl" "$tmp/$dt.jsonl")
    row "train 20 steps $dt (max rel loss diff)" "$worst" 0 $tol
    cp "$tmp/$dt.jsonl" "$OUT/"
done
cp "$tmp/cpu.jsonl" "$OUT/"
# the hybrid stack from the NemotronH fixture's weights: its Mamba2 mixers
# (KERN_OP_MAMBA, f32 and bf16 on cuda) trained on cuda against the CPU fp32
cat > "$tmp/hyb.yaml" <<YAML
model: {hf: $PWD/tests/fixtures/nemotronh}
data: {dir: $PWD/tests/fixtures/train_llama, seq_len: 16, split: 0}
train: {steps: 20, micro_batch: 2, grad_accum: 4, seed: 1234, log_every: 100}
optim: {lr: 0.001, min_lr: 0.0001, warmup: 2}
YAML
"$BATON" run "$tmp/hyb.yaml" --quiet --set metrics.file="$tmp/hyb_cpu.jsonl" > "$OUT/train_hyb_cpu.log" 2>&1
for dt in fp32 bf16; do
    tol=1e-4; [ $dt = bf16 ] && tol=1e-2
    "$BATON" run "$tmp/hyb.yaml" --quiet --set device=cuda --set dtype=$dt \
        --set metrics.file="$tmp/hyb_$dt.jsonl" > "$OUT/train_hyb_$dt.log" 2>&1
    worst=$(worst_rel "$tmp/hyb_cpu.jsonl" "$tmp/hyb_$dt.jsonl")
    row "train 20 steps nemotronh $dt (max rel loss)" "$worst" 0 $tol
    cp "$tmp/hyb_$dt.jsonl" "$OUT/"
done
cp "$tmp/hyb_cpu.jsonl" "$OUT/"
# layouts with their ranks sharing the one GPU (pipeline activations handed
# off through CUDA IPC, collectives staged through host memory): each
# against the same layout on the CPU
for lay in "pp=2" "tp=2" "pp=2 dp=2 zero1" "cp=2 cp_mode=allgather" "cp=2 cp_mode=ring" "cp=2 tp=2 cp_mode=ring"; do
    sets=(); name=${lay// /_}; name=${name//=/-}
    for kv in $lay; do case $kv in zero1) sets+=(--set parallel.zero1=true) ;;
                                 *) sets+=(--set "parallel.${kv%%=*}=${kv#*=}") ;; esac; done
    "$BATON" run "$tmp/job.yaml" --quiet "${sets[@]}" --set metrics.file="$tmp/l_cpu_$name.jsonl" \
        > "$OUT/train_cpu_$name.log" 2>&1
    "$BATON" run "$tmp/job.yaml" --quiet "${sets[@]}" --set device=cuda \
        --set metrics.file="$tmp/l_gpu_$name.jsonl" > "$OUT/train_gpu_$name.log" 2>&1
    worst=$(worst_rel "$tmp/l_cpu_$name.jsonl" "$tmp/l_gpu_$name.jsonl")
    row "train 20 steps fp32 $lay on one GPU" "$worst" 0 1e-4
done

# what a practitioner watches on a GPU: every progress line and the
# summary show MFU (the device's bf16 product rate measured before the first
# step) and the device memory held, in one process and at pp=2 (rank 0
# measures, every rank reports its memory); the metrics lines carry them
for lay in "" "pp=2"; do
    sets=(); name=prog_${lay:-1}; name=${name//=/}
    [ -n "$lay" ] && sets+=(--set "parallel.${lay%%=*}=${lay#*=}")
    "$BATON" run "$tmp/job.yaml" "${sets[@]}" --set device=cuda --set dtype=bf16 --set train.log_every=5 \
        --set metrics.file="$tmp/$name.jsonl" > "$OUT/$name.log" 2>&1
    lines=$(grep -c '^step .*| MFU [0-9.]*% | mem .* host, .* device' "$OUT/$name.log")
    summ=$(grep -c 'peak memory (device)' "$OUT/$name.log")
    jl=$(python3 -c 'import json,sys,math; l=[json.loads(x) for x in open(sys.argv[1]) if "mfu" in x]; print(int(len(l)==20 and all(math.isfinite(x["mfu"]) and x["mfu"]>0 and min(x["device_mem_peak_bytes"])>0 for x in l)))' "$tmp/$name.jsonl" 2>/dev/null)
    if [ "$lines" -ge 4 ] && [ "$summ" = 1 ] && [ "$jl" = 1 ]; then ok=1; else ok=0; fi
    row "progress on cuda bf16 ${lay:-1 process}: MFU, device memory" "$ok" 1 0
    grep -E '^step +20/|MFU:|peak memory' "$OUT/$name.log" | sed 's/^/  /'
done

# pipeline activations by CUDA IPC (transport.handoff auto on a GPU) against
# staging them through host memory (off): the same bits, fp32 and bf16, 1F1B
# and interleaved; the log counts the handoffs, tokens/s of both are shown
for lay in "pp=2" "pp=2 virtual_stages=2 schedule=interleaved microbatches=4"; do
    sets=(); name=ho_${lay// /_}; name=${name//=/-}
    for kv in $lay; do sets+=(--set "parallel.${kv%%=*}=${kv#*=}"); done
    for dt in fp32 bf16; do
        for h in off auto; do
            # not --quiet: the workers' info line counts the handoffs
            "$BATON" run "$tmp/job.yaml" "${sets[@]}" --set device=cuda --set dtype=$dt \
                --set transport.handoff=$h --set export.dir="$tmp/${name}_${dt}_$h" \
                --set metrics.file="$tmp/${name}_${dt}_$h.jsonl" > "$OUT/${name}_${dt}_$h.log" 2>&1
        done
        e_off=$("$BATON" eval --model "$tmp/${name}_${dt}_off" --ids tests/fixtures/llama/ids.txt --json 2>&1)
        e_on=$("$BATON" eval --model "$tmp/${name}_${dt}_auto" --ids tests/fixtures/llama/ids.txt --json 2>&1)
        l_off=$(grep -v val_loss "$tmp/${name}_${dt}_off.jsonl" 2>/dev/null | sed 's/"tokens_per_s.*//')
        l_on=$(grep -v val_loss "$tmp/${name}_${dt}_auto.jsonl" 2>/dev/null | sed 's/"tokens_per_s.*//')
        handed=$(grep -o 'handed [0-9]* tensors off' "$OUT/${name}_${dt}_auto.log" | awk '{n += $2} END {print n + 0}')
        if [ -n "$(field loss "$e_on")" ] && [ "$e_off" = "$e_on" ] && [ -n "$l_on" ] && [ "$l_off" = "$l_on" ] &&
            [ "$handed" -gt 0 ]; then same=1; else same=0; fi
        row "$dt $lay: IPC handoff = staged" "$same" 1 0
        tps() { python3 -c 'import json,sys; l=[json.loads(x) for x in open(sys.argv[1]) if "tokens_per_s" in x]; print(l[-1]["tokens_per_s"] if l else "nan")' "$1" 2>/dev/null; }
        echo "  $dt $lay: $handed tensors handed off; tokens/s at the end: staged $(tps "$tmp/${name}_${dt}_off.jsonl"), IPC $(tps "$tmp/${name}_${dt}_auto.jsonl")"
    done
done

# greedy generation of the new kinds on cuda fp32 gives the CPU's ids
# (the fixtures hold no tokenizer: the llama fixture's one is linked in, as
# the CPU tests do)
for fx in deepseek_v2_lite nemotronh qwen2_moe; do
    d=$tmp/gen_$fx; mkdir -p "$d"
    ln -s "$PWD/tests/fixtures/$fx/config.json" "$PWD/tests/fixtures/$fx/model.safetensors" \
          "$PWD/tests/fixtures/llama/tokenizer.json" "$d"/
    g_cpu=$("$BATON" generate --model "$d" --prompt "abc d" --max-new 12 --ignore-eos --json 2>"$OUT/gen_${fx}_cpu.err")
    g_gpu=$("$BATON" generate --model "$d" --prompt "abc d" --max-new 12 --ignore-eos --json --device cuda 2>"$OUT/gen_${fx}_gpu.err")
    if [ -n "$g_cpu" ] && [ "$g_cpu" = "$g_gpu" ]; then same=1; else same=0; fi
    row "generate $fx fp32: ids equal the CPU's" "$same" 1 0
done
g_cpu=$("$BATON" generate --model tests/fixtures/llama --prompt "ab" --max-new 12 --json 2>/dev/null)
g_gpu=$("$BATON" generate --model tests/fixtures/llama --prompt "ab" --max-new 12 --json --device cuda 2>/dev/null)
if [ -n "$g_cpu" ] && [ "$g_cpu" = "$g_gpu" ]; then same=1; else same=0; fi
row "generate llama fp32: ids equal the CPU's" "$same" 1 0
# the KV cache on the GPU against recomputing the prefix there, fp32 and bf16
for dt in fp32 bf16; do
    g1=$("$BATON" generate --model tests/fixtures/gguf_model/hf --prompt "The captain said" --max-new 24 \
         --ignore-eos --json --device cuda --dtype $dt 2>/dev/null)
    g0=$("$BATON" generate --model tests/fixtures/gguf_model/hf --prompt "The captain said" --max-new 24 \
         --ignore-eos --json --device cuda --dtype $dt --no-cache 2>/dev/null)
    if [ -n "$g1" ] && [ "$g1" = "$g0" ]; then same=1; else same=0; fi
    row "generate $dt cuda: KV cache = recompute" "$same" 1 0
done

# a poisoned gradient at step 3 on the GPU: skipped, training goes on, and
# the skipped step moved nothing (3 steps with it = 2 clean steps)
sed 's/lr: 0.001, min_lr: 0.0001/lr: 0.001, min_lr: 0.001/' "$tmp/job.yaml" > "$tmp/skip.yaml"
for dt in fp32 bf16; do
    "$BATON" run "$tmp/skip.yaml" --quiet --set device=cuda --set dtype=$dt --set train.steps=2 \
        --set export.dir="$tmp/c2_$dt" --set metrics.file= > /dev/null 2>&1
    BATON_TEST_NONFINITE=3 "$BATON" run "$tmp/skip.yaml" --quiet --set device=cuda --set dtype=$dt \
        --set train.steps=3 --set export.dir="$tmp/p3_$dt" --set metrics.file="$tmp/p3_$dt.jsonl" \
        > /dev/null 2> "$OUT/skip_$dt.err"
    sk=$(grep -c '"skipped": true' "$tmp/p3_$dt.jsonl" 2>/dev/null)
    e2=$("$BATON" eval --model "$tmp/c2_$dt" --ids tests/fixtures/llama/ids.txt --json 2>&1)
    e3=$("$BATON" eval --model "$tmp/p3_$dt" --ids tests/fixtures/llama/ids.txt --json 2>&1)
    if [ "${sk:-0}" = 1 ] && [ -n "$(field loss "$e2")" ] && [ "$e2" = "$e3" ]; then same=1; else same=0; fi
    row "skip $dt cuda: NaN step skipped, nothing moved" "$same" 1 0
done

# SmolLM2-135M against the CPU (tools/device-smollm2.sh; its rows, when the
# model and the text are here)
if OUT=$OUT tools/device-smollm2.sh; then :; else fails=$((fails + 1)); fi

san=$(command -v compute-sanitizer 2>/dev/null || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$san" ]; then
    "$san" --tool memcheck --error-exitcode 3 --leak-check no "$BATON" run "$tmp/job.yaml" --quiet \
        --set device=cuda --set dtype=bf16 --set train.steps=2 --set train.eval_every=0 \
        --set metrics.file= > "$OUT/memcheck_train.log" 2>&1
    src=$?
    row "memcheck: 2 bf16 training steps (exit status)" $src 0 0
    tail -3 "$OUT/memcheck_train.log"
else
    echo "compute-sanitizer not found: memcheck row skipped"
fi
rm -rf "$tmp"
echo
[ $fails -eq 0 ] && echo "device-model-check: all passed" || echo "device-model-check: $fails FAILED"
[ $fails -eq 0 ]
