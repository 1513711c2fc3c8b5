#!/usr/bin/env bash
# baton against PyTorch on one GPU, in one call (issue 13, bench/GPU_NOTES.md):
# the bf16 matrix peak first (the MFU denominator), then for each row of the
# issue's table baton's training run and the torch.compile reference
# (bench/gpu_bench_torch.py) one after the other, and a table of tokens/s,
# median step time, MFU, peak GPU memory and the ratios baton/torch.
#
#   bench/gpu_bench.sh            on the GPU machine, from the repository root of a tree
#                                 that holds build/baton, build/libbaton_cuda.so and
#                                 build/devpack.tar.xz (or build/devpack/) built here
#   QUICK=1 bench/gpu_bench.sh    without a GPU: the same plumbing on tiny rows on the
#                                 CPU in fp32 (torch only where it is importable)
#
# Both sides train the same shapes from random init on random token ids, constant
# learning rate, clip 1.0, weight decay 0.1 on matrices: throughput does not depend
# on the values. Per row: WARMUP steps excluded, then the median of STEPS steps.
#   baton: bf16 parameters and activations with f32 master weights, gradients and
#     AdamW moments (docs/KERNELS.md); each step's time is the training time the run
#     reports (metrics.jsonl: tokens / tokens_per_s at step k minus the same at step
#     k-1; host clock around train_step, which ends when the step's loss and gradient
#     norm are on the host).
#   torch: fp32 parameters and AdamW state, autocast(bfloat16), torch.compile,
#     AdamW(fused=True); each step timed with CUDA events.
# tokens/s = microbatch x T / median step time (every input position counts; baton
# scores all T of a row, transformers' labels=input_ids scores T - 1).
# MFU = `baton flops` of the row's job (model/flops.h, docs/PERFORMANCE.md) x
# tokens/s / the measured bf16 peak, for both. Memory: baton's own count of the
# device memory it held at most (BATON_CUDA_MEM_REPORT, kernels/cuda/held.c)
# against torch.cuda.max_memory_allocated (and its reserved), and for both the most
# the GPU's used memory rose over its level before the run (nvidia-smi sampled
# every ~0.1 s: the whole process, CUDA context included).
#
# baton runs each row once per ATTN variant (default "precise cudnn"): precise is the
# default attention (probabilities and score gradients as bf16 hi + lo parts, dQ in
# its own kernel, bit-for-bit repeatable), fast is BATON_CUDA_ATTN=fast (both rounded
# to bf16 once and dQ added by atomics inside the dK/dV kernel, as cuDNN's and
# FlashAttention-2's kernels that torch calls do); the table has a line and ratios
# for each (impl "baton" and "b-fast"); cudnn is BATON_CUDA_ATTN=cudnn (cuDNN's fused
# SDPA graphs, the attention torch calls, where cuDNN takes the shape; impl "b-dnn").
# Environment: ROWS (llama134m llama1b smollm2), ATTN (precise cudnn; also fast), TORCH_ATTN (sdpa: the
# reference's attn_implementation; causal_sdpa calls SDPA with is_causal and no mask, see
# gpu_bench_torch.py), WARMUP (5), STEPS (20), BUILD (build),
# OUT (the device tool's, else /tmp/gpu_bench), PYTHON (python3), RUN_TIMEOUT (240 s
# a run), BUDGET (560 s for everything: a run that cannot start 20 s before it is
# skipped, and said so), MB_LLAMA134M (32), MB_LLAMA1B (8), MB_SMOLLM2 (16).
# Outputs under $OUT: table.txt, results.jsonl, logs.txt, metrics.jsonl, jobs.txt,
# versions.txt (the device tool brings back at most 8 files).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
QUICK=${QUICK:-0}
ROWS=${ROWS:-llama134m llama1b smollm2}
ATTN=${ATTN:-precise cudnn}
TORCH_ATTN=${TORCH_ATTN:-sdpa}
WARMUP=${WARMUP:-5}
STEPS=${STEPS:-20}
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/gpu_bench}
PY=${PYTHON:-python3}
RUN_TIMEOUT=${RUN_TIMEOUT:-240}
BUDGET=${BUDGET:-560}
if [ "$QUICK" = 1 ]; then WARMUP=${QUICK_WARMUP:-2}; STEPS=${QUICK_STEPS:-3}; fi
BATON=$ROOT/$BUILD/baton
TORCH_PY=$ROOT/bench/gpu_bench_torch.py

mkdir -p "$OUT"
work=$(mktemp -d /tmp/gpu_bench.XXXXXX)
smi_pid=""
stop_smi() {
    if [ -n "$smi_pid" ]; then kill "$smi_pid" 2>/dev/null; wait "$smi_pid" 2>/dev/null; fi
    smi_pid=""
}
trap 'stop_smi; rm -rf "$work"' EXIT
: > "$OUT/results.jsonl"; : > "$OUT/logs.txt"; : > "$OUT/metrics.jsonl"; : > "$OUT/jobs.txt"
say() { echo "$*" | tee -a "$OUT/logs.txt"; }
left() { echo $((BUDGET - SECONDS)); }

# ---- where things run ---------------------------------------------------------------
if [ ! -x "$BATON" ]; then
    echo "gpu_bench: $BATON is missing: build here (make) and carry build/baton" >&2
    exit 1
fi
if [ "$QUICK" != 1 ]; then
    [ -e "$BUILD/libbaton_cuda.so" ] || { echo "gpu_bench: $BUILD/libbaton_cuda.so is missing (make with nvcc on PATH)" >&2; exit 1; }
fi
# the library pack: build/devpack itself, else its tarball unpacked into the
# scratch folder (not into $BUILD: a second call carrying $BUILD would carry
# the 47 MiB of unpacked libraries too, past the device tool's 64 MiB)
PACK=$ROOT/$BUILD/devpack
if [ ! -d "$PACK" ] && [ -f "$BUILD/devpack.tar.xz" ]; then
    tar -C "$work" -xJf "$BUILD/devpack.tar.xz" && PACK=$work/devpack
fi
LIB=$PACK/root/usr/lib/x86_64-linux-gnu
if [ -d "$LIB" ]; then
    export LD_LIBRARY_PATH="$LIB:$LIB/openblas-pthread:$LIB/ucx${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export UCX_MODULE_DIR=$LIB/ucx
fi
# baton's memory check compares the job's parameters, gradients, optimizer state and
# activations with the host's MemAvailable even when they live on the GPU
# (launch/run_mem.c), and a freshly started GPU machine reports far less than it can
# use (the lent machines' memory grows as it is used): the 1.1B row would be refused
export BATON_MEM_LIMIT=off
export BATON_CUDA_MEM_REPORT=1
export PYTHONUNBUFFERED=1
if [ "$QUICK" = 1 ]; then DEVICE=cpu; DTYPE=fp32; else DEVICE=cuda; DTYPE=bf16; fi
have_smi=0
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && have_smi=1
have_torch=0
"$PY" -c 'import torch, transformers' >/dev/null 2>&1 && have_torch=1

# ---- versions -----------------------------------------------------------------------
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "tree: $(git rev-parse --short HEAD 2>/dev/null || echo 'no git here')$(git status --porcelain 2>/dev/null | grep -q . && echo ' (with local changes)')"
    [ -f "$BUILD/BUILD_INFO" ] && sed 's/^/binaries: /' "$BUILD/BUILD_INFO"
    echo "host: $(nproc) CPUs, $(uname -r)"
    if [ $have_smi = 1 ]; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit \
            --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
    else
        echo "gpu: none (nvidia-smi not found or no device)"
    fi
    if [ -e "$BUILD/libbaton_cuda.so" ]; then
        for so in libcudart.so libcublasLt.so; do
            p=$(ldd "$BUILD/libbaton_cuda.so" 2>/dev/null | awk -v s="$so" 'index($1, s) == 1 {print $3}' | head -1)
            echo "baton loads: $so -> ${p:+$(readlink -f "$p")}"
        done
    fi
    echo "python: $("$PY" --version 2>&1); torch importable: $([ $have_torch = 1 ] && echo yes || echo no)"
} > "$OUT/versions.txt"
cat "$OUT/versions.txt"

# ---- helpers ------------------------------------------------------------------------
# field NAME TEXT: the first number after "NAME": in TEXT (one JSON line)
field() { sed -n "s/.*\"$1\": *\([-0-9.eE+]*\).*/\1/p" <<<"$2" | head -1; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# GPU memory in use (MiB), sampled into FILE in the background
smi_used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1; }
start_smi() {
    [ $have_smi = 1 ] || return 0
    (while :; do smi_used; sleep 0.1; done) > "$1" 2>/dev/null &
    smi_pid=$!
}
smi_rise() { # FILE BASELINE: the most the samples rose above the baseline, MiB
    [ $have_smi = 1 ] && [ -s "$1" ] || { echo nan; return; }
    sort -n "$1" | tail -1 | awk -v b="$2" '{ print $1 - b }'
}
run_limit() { # the timeout of the next run, or nothing when none fits
    local l; l=$(( $(left) - 20 ))
    [ "$l" -le 0 ] && return 1
    [ "$l" -gt "$RUN_TIMEOUT" ] && l=$RUN_TIMEOUT
    echo "$l"
}
append_log() { { echo "==== $1"; cat "$2"; echo; } >> "$OUT/logs.txt"; }

# row NAME: the row's shape in R_* (QUICK: a tiny model of the same kind)
row() {
    case $1 in
    llama134m) R_DESC="Llama-style 134M, T 1024"; R_L=12; R_C=768; R_H=12; R_KV=12; R_F=2048
               R_V=32000; R_T=1024; R_B=${MB_LLAMA134M:-32}; R_TIE=false; R_THETA=10000 ;;
    llama1b)   R_DESC="Llama 1.1B, T 2048"; R_L=22; R_C=2048; R_H=32; R_KV=4; R_F=5632
               R_V=32000; R_T=2048; R_B=${MB_LLAMA1B:-8}; R_TIE=false; R_THETA=10000 ;;
    smollm2)   R_DESC="SmolLM2-135M (random init), T 2048"; R_L=30; R_C=576; R_H=9
               R_KV=3; R_F=1536; R_V=49152; R_T=2048; R_B=${MB_SMOLLM2:-16}; R_TIE=true
               R_THETA=100000 ;;
    *) return 1 ;;
    esac
    if [ "$QUICK" = 1 ]; then R_DESC="$R_DESC (tiny)"; R_L=2; R_C=64; R_H=4; R_KV=2; R_F=128; R_V=512; R_T=32; R_B=2; fi
    return 0
}
write_job() { # NAME DATA_DIR JOB
    cat > "$3" <<YAML
# bench/gpu_bench.sh row $1: $R_DESC, microbatch $R_B
model: {layers: $R_L, hidden: $R_C, heads: $R_H, kv_heads: $R_KV, ffn: $R_F, vocab: $R_V, seq: $R_T,
        rope_theta: $R_THETA, norm_eps: 1.0e-5, tie_embeddings: $R_TIE, init_std: 0.02}
data: {dir: $2, seq_len: $R_T, split: 0}
train: {steps: $((WARMUP + STEPS)), micro_batch: $R_B, grad_accum: 1, seed: 1234, log_every: 5}
optim: {lr: 3.0e-4, min_lr: 3.0e-4, warmup: 0, betas: [0.9, 0.95], weight_decay: 0.1, clip: 1.0}
device: $DEVICE
dtype: $DTYPE
YAML
}
make_tokens() { # DIR VOCAB N: N uniform ids below VOCAB (Park-Miller, exact in awk's doubles)
    mkdir -p "$1"
    awk -v v="$2" -v n="$3" 'BEGIN { x = 20261202; for (i = 0; i < n; i++) {
        x = (x * 16807) % 2147483647; printf "%d ", int(x / 2147483647 * v) } print "" }' > "$1/tokens.txt"
}

# ---- the peak -----------------------------------------------------------------------
PEAK=""
TORCH_VER=""
if [ $have_torch = 1 ]; then
    "$PY" "$TORCH_PY" peak > "$work/peak.out" 2> "$work/peak.log"
    append_log "torch peak" "$work/peak.log"
    r=$(sed -n 's/^RESULT //p' "$work/peak.out")
    PEAK=$(field tflops "$r")
    TORCH_VER=$(sed -n 's/.*"versions": \({[^}]*}\).*/\1/p' <<<"$r")
    echo "$r" >> "$OUT/results.jsonl"
fi
if [ -n "$PEAK" ]; then
    say "bf16 matrix peak (torch.matmul 8192^3, random data, median of 20): $PEAK TFLOP/s"
    echo "torch: $TORCH_VER" >> "$OUT/versions.txt"
    echo "torch: $TORCH_VER"
else
    say "bf16 matrix peak: not measured ($([ $have_torch = 1 ] && echo 'no GPU? see logs.txt' || echo 'torch not importable')): no MFU"
fi

# ---- the rows -----------------------------------------------------------------------
declare -A RES
impl_of() { case $1 in fast) echo b-fast ;; cudnn) echo b-dnn ;; *) echo baton ;; esac; }
measure_baton() { # NAME JOB ATTN-VARIANT
    local impl; impl=$(impl_of "$3")
    local name=$1 job=$2 lim log=$work/${impl}_$1.log met=$work/${impl}_$1.jsonl base=0 rc
    lim=$(run_limit) || { say "$name $impl: skipped, the budget of ${BUDGET} s is spent"; return; }
    [ $have_smi = 1 ] && base=$(smi_used)
    start_smi "$work/smi_${impl}_$name"
    local t0=$SECONDS attn_env=BATON_CUDA_ATTN=
    case $3 in fast | cudnn) attn_env=BATON_CUDA_ATTN=$3 ;; esac
    env "$attn_env" timeout -k 10 "$lim" "$BATON" run "$job" --quiet --set metrics.file="$met" > "$log" 2>&1
    rc=$?
    stop_smi
    append_log "$impl $name (exit $rc, $((SECONDS - t0)) s)" "$log"
    [ -f "$met" ] && { echo "{\"row\": \"$name\", \"impl\": \"$impl\"}"; cat "$met"; } >> "$OUT/metrics.jsonl"
    if [ $rc -ne 0 ]; then say "$name $impl: FAILED (exit $rc; logs.txt)"; tail -5 "$log"; return; fi
    # per step: training seconds so far = tokens / tokens_per_s; a step is the difference
    awk -v w="$WARMUP" 'function num(s, k,   t) { t = s; if (!sub(".*\"" k "\": *", "", t)) return -1
                                                 sub(/[,}].*/, "", t); return t + 0 }
        /"loss"/ { st = num($0, "step"); tok = num($0, "tokens"); tps = num($0, "tokens_per_s")
                   ts = tps > 0 ? tok / tps : 0
                   if (st > w) printf "%.9f %d\n", ts - prev, tok - ptok
                   prev = ts; ptok = tok }' "$met" > "$work/steps_${impl}_$name"
    local n med tps held skipped st=$work/steps_${impl}_$name
    n=$(wc -l < "$st")
    med=$(awk '{ print $1 * 1000 }' "$st" | median)
    tps=$(awk -v m="$med" 'NR == 1 { printf "%.1f", $2 / (m / 1000) }' "$st")
    # the held count of the last step's metrics line (kern_mem_peak), else the
    # exit log line of BATON_CUDA_MEM_REPORT (which --quiet may keep back)
    held=$(grep '"loss"' "$met" | tail -1 | sed -n 's/.*"device_mem_peak_bytes": *\[\([0-9]*\).*/\1/p')
    [ -n "$held" ] || held=$(sed -n 's/.*held at most \([0-9]*\) bytes.*/\1/p' "$log" | tail -1)
    skipped=$(grep '"loss"' "$met" | tail -1 | sed -n 's/.*"skipped_steps": *\([0-9]*\).*/\1/p')
    RES[$name.$impl.tps]=$tps; RES[$name.$impl.ms]=$med; RES[$name.$impl.n]=$n
    RES[$name.$impl.mem]=${held:-nan}; RES[$name.$impl.smi]=$(smi_rise "$work/smi_${impl}_$name" "$base")
    RES[$name.$impl.loss]=$(grep '"loss"' "$met" | tail -1 | sed -n 's/.*"loss": *\([-0-9.eE+na]*\).*/\1/p')
    [ -z "${RES[$name.cudaver]:-}" ] && RES[$name.cudaver]=$(sed -n 's/.* cuda: \(driver .*\)/\1/p' "$log" | head -1)
    echo "{\"what\": \"train\", \"impl\": \"$impl\", \"row\": \"$name\", \"steps\": $n, \"step_ms_median\": $med, \"tokens_per_s\": $tps, \"held_bytes\": ${held:-null}, \"smi_rise_mib\": \"${RES[$name.$impl.smi]}\", \"skipped_steps\": ${skipped:-null}, \"seconds\": $((SECONDS - t0))}" >> "$OUT/results.jsonl"
    say "$name $impl: median step $med ms over $n steps, $tps tokens/s, held ${held:-?} bytes, last loss ${RES[$name.$impl.loss]}, skipped steps ${skipped:-?} ($((SECONDS - t0)) s)"
}
measure_torch() { # NAME
    local name=$1 lim log=$work/torch_$1.log base=0 rc r
    if [ $have_torch != 1 ]; then say "$name torch: skipped (torch/transformers not importable here)"; return; fi
    lim=$(run_limit) || { say "$name torch: skipped, the budget of ${BUDGET} s is spent"; return; }
    [ $have_smi = 1 ] && base=$(smi_used)
    start_smi "$work/smi_torch_$name"
    local t0=$SECONDS extra=()
    [ "$R_TIE" = true ] && extra+=(--tie)
    [ "$QUICK" = 1 ] && extra+=(--device cpu --no-compile)
    timeout -k 10 "$lim" "$PY" "$TORCH_PY" train --layers "$R_L" --hidden "$R_C" --heads "$R_H" \
        --kv-heads "$R_KV" --ffn "$R_F" --vocab "$R_V" --seq "$R_T" --batch "$R_B" \
        --rope-theta "$R_THETA" --warmup "$WARMUP" --steps "$STEPS" --attn "$TORCH_ATTN" "${extra[@]}" \
        > "$work/torch_$name.out" 2> "$log"
    rc=$?
    stop_smi
    append_log "torch $name (exit $rc, $((SECONDS - t0)) s)" "$log"
    r=$(sed -n 's/^RESULT //p' "$work/torch_$name.out")
    if [ $rc -ne 0 ] || [ -z "$r" ]; then say "$name torch: FAILED (exit $rc; logs.txt)"; tail -5 "$log"; return; fi
    echo "${r%\}}, \"row\": \"$name\", \"smi_rise_mib\": \"$(smi_rise "$work/smi_torch_$name" "$base")\", \"seconds\": $((SECONDS - t0))}" >> "$OUT/results.jsonl"
    RES[$name.torch.tps]=$(field tokens_per_s "$r"); RES[$name.torch.ms]=$(field step_ms_median "$r")
    RES[$name.torch.mem]=$(field max_memory_allocated "$r"); RES[$name.torch.res]=$(field max_memory_reserved "$r")
    RES[$name.torch.smi]=$(smi_rise "$work/smi_torch_$name" "$base"); RES[$name.torch.n]=$(field steps "$r")
    RES[$name.torch.loss]=$(field final_loss "$r")
    RES[torch.setup]=$(sed -n 's/.*"setup": "\([^"]*\)".*/\1/p' <<<"$r")
    say "$name torch: median step ${RES[$name.torch.ms]} ms, ${RES[$name.torch.tps]} tokens/s, max_memory_allocated ${RES[$name.torch.mem]:-?} bytes, loss ${RES[$name.torch.loss]} ($((SECONDS - t0)) s)"
}
mfu() { # JOB TOKENS_PER_S: MFU in percent by `baton flops`, or n/a
    [ -n "$PEAK" ] && [ -n "$2" ] && [ "$2" != nan ] || { echo n/a; return; }
    local j; j=$("$BATON" flops "$1" --json --tokens-per-s "$2" --peak-tflops "$PEAK" 2>/dev/null)
    local m; m=$(field mfu "$j")
    [ -n "$m" ] && awk -v m="$m" 'BEGIN { printf "%.1f%%", 100 * m }' || echo n/a
}
gib() { awk -v b="${1:-nan}" 'BEGIN { if (b == "nan" || b == "" || b != b + 0) print "n/a"; else printf "%.2f GiB", b / 1073741824 }'; }
mib_gib() { awk -v b="${1:-nan}" 'BEGIN { if (b == "nan" || b == "" || b != b + 0) print "n/a"; else printf "%.2f GiB", b / 1024 }'; }
ratio() { awk -v a="${1:-}" -v b="${2:-}" 'BEGIN { if (a == "" || b == "" || a == "nan" || b == "nan" || a != a + 0 || b != b + 0 || b == 0) print "n/a"; else printf "%.3fx", a / b }'; }
fmt() { awk -v v="${1:-}" -v f="$2" 'BEGIN { if (v == "" || v == "nan" || v != v + 0) print "n/a"; else printf f, v }'; }

table() {
    {
        echo "bench/gpu_bench.sh: $(head -1 "$OUT/versions.txt"); $(grep '^gpu:' "$OUT/versions.txt" | head -1)"
        echo "warm-up $WARMUP steps excluded, median of $STEPS; MFU's denominator: $([ -n "$PEAK" ] && echo "$PEAK TFLOP/s, the bf16 peak measured above (torch.matmul 8192^3)" || echo "not measured")"
        printf '%-46s %-6s %10s %9s %7s %11s %11s %11s\n' row impl tokens/s "step ms" MFU "mem (own)" "mem (smi)" "reserved"
        for name in $ROWS; do
            row "$name" || continue
            local job=$work/$name.yaml d="$R_DESC, mb $R_B"
            for a in $ATTN; do
                local im; im=$(impl_of "$a")
                printf '%-46s %-6s %10s %9s %7s %11s %11s %11s\n' "$d" "$im" "$(fmt "${RES[$name.$im.tps]:-}" %.0f)" \
                    "$(fmt "${RES[$name.$im.ms]:-}" %.2f)" "$(mfu "$job" "${RES[$name.$im.tps]:-}")" \
                    "$(gib "${RES[$name.$im.mem]:-}")" "$(mib_gib "${RES[$name.$im.smi]:-}")" "-"
                d=""
            done
            printf '%-46s %-6s %10s %9s %7s %11s %11s %11s\n' "" torch "$(fmt "${RES[$name.torch.tps]:-}" %.0f)" \
                "$(fmt "${RES[$name.torch.ms]:-}" %.2f)" "$(mfu "$job" "${RES[$name.torch.tps]:-}")" \
                "$(gib "${RES[$name.torch.mem]:-}")" "$(mib_gib "${RES[$name.torch.smi]:-}")" "$(gib "${RES[$name.torch.res]:-}")"
            for a in $ATTN; do
                local im; im=$(impl_of "$a")
                printf '%-46s %-6s %10s %9s %7s %11s %11s\n' "" "ratio${a:0:1}" "$(ratio "${RES[$name.$im.tps]:-}" "${RES[$name.torch.tps]:-}")" \
                    "$(ratio "${RES[$name.$im.ms]:-}" "${RES[$name.torch.ms]:-}")" "" \
                    "$(ratio "${RES[$name.$im.mem]:-}" "${RES[$name.torch.mem]:-}")" \
                    "$(ratio "${RES[$name.$im.smi]:-}" "${RES[$name.torch.smi]:-}")"
            done
        done
        echo "ratiop, ratiof, ratioc: baton (precise attention), b-fast (BATON_CUDA_ATTN=fast) and b-dnn"
        echo "  (BATON_CUDA_ATTN=cudnn: cuDNN's SDPA graphs, kernels/cuda/dnn.cu), each / torch"
        echo "  (tokens/s above 1: baton faster; step ms and memory below 1: baton better)"
        echo "mem (own): baton's count of the device memory it held at most (kernels/cuda/held.c: cudaMalloc"
        echo "  blocks, stream scratch, cuBLASLt workspaces) / torch.cuda.max_memory_allocated; reserved:"
        echo "  torch.cuda.max_memory_reserved; mem (smi): the most nvidia-smi's used memory rose over its"
        echo "  level before the run, sampled ~10 times a second (whole process, CUDA context included)"
        echo "baton: $DTYPE parameters and activations$([ "$DTYPE" = bf16 ] && echo ", f32 master weights, f32 gradients and AdamW moments"), device $DEVICE; ${RES[cudaver]:-}"
        echo "torch: ${RES[torch.setup]:-not run}"
        echo "the SmolLM2 row trains SmolLM2-135M's config (hidden 576, 30 layers, 9/3 heads, FFN 1536,"
        echo "  vocab 49152, tied, rope_theta 1e5) from random init: its weights are not loaded (the speed"
        echo "  of a step does not depend on them)"
        echo "data: uniform random token ids; both sides use the same shapes, not the same ids"
    } > "$OUT/table.txt"
}

for name in $ROWS; do
    if ! row "$name"; then say "gpu_bench: unknown row '$name' (llama134m, llama1b, smollm2)"; continue; fi
    make_tokens "$work/data_$name" "$R_V" $(( (WARMUP + STEPS) * R_B * R_T + 1 > 2097152 ? 2097152 : (WARMUP + STEPS) * R_B * R_T + 1 ))
    write_job "$name" "$work/data_$name" "$work/$name.yaml"
    { echo "# ---- $name"; cat "$work/$name.yaml"; } >> "$OUT/jobs.txt"
    say "== $name: $R_DESC, microbatch $R_B ($(( R_B * R_T )) tokens a step); $(left) s of the budget left"
    "$BATON" flops "$work/$name.yaml" | tee -a "$OUT/logs.txt"
    for a in $ATTN; do measure_baton "$name" "$work/$name.yaml" "$a"; done
    [ -z "${RES[cudaver]:-}" ] && RES[cudaver]=${RES[$name.cudaver]:-}
    measure_torch "$name"
    table
done
table
[ -n "${RES[cudaver]:-}" ] && echo "baton cuda: ${RES[cudaver]}" >> "$OUT/versions.txt"
echo
cat "$OUT/table.txt"
echo "(${SECONDS} s in all; outputs in $OUT)"
