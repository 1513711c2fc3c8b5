#!/usr/bin/env bash
# Mixture-of-experts models through the CLI (tests/fixtures/mixtral, qwen2_moe,
# qwen2_moe_norm, train_qwen2_moe; tools/gen_moe_fixtures.py and
# gen_moe_train_fixture.py): `baton run` reproduces the PyTorch reference
# training loop step by step (1e-5) and exports a model that loads back;
# pipeline and data parallelism give the single-process losses; expert
# layouts that cannot fold and ZeRO-1 with experts are refused naming the
# field; a capacity factor under TP or CP drops what one process drops; `baton graph` shows the dense and expert grids
# as the fold rule says; `baton generate` gives transformers' greedy ids,
# with and without the KV cache; a capacity factor's dropped choices are
# reported by eval and by every training step, alike in every layout.
# (`baton eval` on the fixtures: tests/sh/test_eval_cli.sh.)
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
losses() { sed -n 's/.*"loss": \([0-9.e+-]*\),.*/\1/p' "$1"; }

# 1. training against the torch reference, then the export reloads
fx=tests/fixtures/train_qwen2_moe
cat > "$tmp/fixture.yaml" <<YAML
model: {hf: $fx}
data: {dir: $fx, seq_len: 16, split: 0}
train: {steps: 10, micro_batch: 2, grad_accum: 2, seed: 1234, log_every: 100}
optim: {lr: 0.01, min_lr: 0.001, warmup: 3, warmup_from: zero, betas: [0.9, 0.95], eps: 1e-8,
        weight_decay: 0.1, clip: 3.0, decay: matrices}
export: {dir: $tmp/ck, every: 10}
metrics: {file: $tmp/fx.jsonl}
YAML
"$BATON" run "$tmp/fixture.yaml" --quiet > "$tmp/fx.txt" 2>&1 || fail moe_run "rc $?: $(tail -3 "$tmp/fx.txt")"
losses "$tmp/fx.jsonl" > "$tmp/fx_baton"
sed -n 's/^ *"loss": \([0-9.e+-]*\),*$/\1/p' "$fx/expected.json" > "$tmp/fx_torch"
if [ "$(wc -l < "$tmp/fx_torch")" -eq 10 ] && paste "$tmp/fx_baton" "$tmp/fx_torch" |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $2) bad++; n++ } END { exit !(n == 10 && !bad) }'; then
    pass moe_run_matches_torch; else fail moe_run_matches_torch "$(paste "$tmp/fx_baton" "$tmp/fx_torch" | tr '\n' ' ')"; fi
if grep -q '"architectures": \[\s*"Qwen2MoeForCausalLM"' <(tr -d '\n' < "$tmp/ck/config.json") &&
   out=$("$BATON" eval --model "$tmp/ck" --ids tests/fixtures/qwen2_moe/ids.txt --json 2>&1) &&
   [ -n "$(field loss "$out")" ]; then pass moe_export_reloads; else fail moe_export_reloads "$out"; fi

# 2. layouts: pp=2 and dp=2 against one process (qwen2_moe: no load-balancing loss)
cat > "$tmp/q.yaml" <<YAML
model: {hf: tests/fixtures/qwen2_moe}
data: {dir: tests/fixtures/train_llama, seq_len: 16, split: 0}
train: {steps: 4, micro_batch: 2, grad_accum: 2, seed: 1234, log_every: 100}
optim: {lr: 0.01, min_lr: 0.001, warmup: 2}
metrics: {file: $tmp/one.jsonl}
YAML
"$BATON" run "$tmp/q.yaml" --quiet >/dev/null 2>&1 || fail moe_single "rc $?"
"$BATON" run "$tmp/q.yaml" --quiet --set parallel.pp=2 --set metrics.file="$tmp/pp2.jsonl" \
    >"$tmp/pp2.txt" 2>&1
if [ -s "$tmp/pp2.jsonl" ] && cmp -s <(losses "$tmp/one.jsonl") <(losses "$tmp/pp2.jsonl"); then
    pass moe_pp2_equals_single; else fail moe_pp2_equals_single "$(losses "$tmp/pp2.jsonl" | tr '\n' ' ') $(tail -2 "$tmp/pp2.txt")"; fi
"$BATON" run "$tmp/q.yaml" --quiet --set parallel.dp=2 --set train.grad_accum=1 \
    --set metrics.file="$tmp/dp2.jsonl" >"$tmp/dp2.txt" 2>&1
if [ "$(losses "$tmp/dp2.jsonl" | wc -l)" -eq 4 ] && paste <(losses "$tmp/one.jsonl") <(losses "$tmp/dp2.jsonl") |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $2) bad++ } END { exit bad }'; then
    pass moe_dp2_equals_single; else fail moe_dp2_equals_single "$(losses "$tmp/dp2.jsonl" | tr '\n' ' ') $(tail -2 "$tmp/dp2.txt")"; fi

# 3. refusals, naming the field
# (by the job check, before any process starts: no rank says anything;
# the expert layouts themselves: tests/test_moe_equiv.c)
out=$("$BATON" run "$tmp/q.yaml" --quiet --set parallel.dp=2 --set parallel.ep=3 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "parallel.ep: ep 3 does not divide the 8 routed experts" <<<"$out" \
    && ! grep -q "rank[0-9]" <<<"$out" \
    && pass moe_ep_refused || fail moe_ep_refused "rc $rc: $out"
out=$("$BATON" run "$tmp/q.yaml" --quiet --set parallel.dp=2 --set parallel.ep=4 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "parallel.ep: ep 4 must divide tp x cp x dp = 2" <<<"$out" \
    && pass moe_ep_fold_refused || fail moe_ep_fold_refused "rc $rc: $out"
out=$("$BATON" run "$tmp/q.yaml" --quiet --set parallel.dp=2 --set parallel.ep=2 --set parallel.zero1=true 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "parallel.zero1: ZeRO-1 shards one flat block over dp, but with ep > 1" <<<"$out" \
    && pass moe_ep_zero1_refused || fail moe_ep_zero1_refused "rc $rc: $out"
out=$("$BATON" run "$tmp/q.yaml" --quiet --set model.hf=tests/fixtures/llama --set parallel.dp=2 --set parallel.ep=2 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "parallel.ep: .*llama has no routed experts" <<<"$out" \
    && pass moe_ep_dense_refused || fail moe_ep_dense_refused "rc $rc: $out"
# (mixtral's load-balancing loss with pp > 1 or cp > 1 is no longer refused:
# tests/test_moe_equiv.c trains it against one process)

# 3b. `baton graph` shows both grids: the expert grid's line, every rank's
# (ep, edp) and experts, the ep and edp groups, against the fold worked out
# here from the rank order (rank = tp_rank + tp (cp_rank + cp (dp_rank + dp
# pp_rank)); i = rank mod tp cp dp, its place in its stage; ep_rank = i mod
# ep, edp_rank = i / ep; an ep group is the ranks of a stage with the same
# i / ep, an edp group those with the same ep_rank; groups of one rank are
# not printed, nor edp groups where they are the dp groups, ep = tp = 1)
fold() { # TP CP DP PP EP: the lines graph_print should write
    awk -v tp="$1" -v cp="$2" -v dp="$3" -v pp="$4" -v ep="$5" -v E=8 'BEGIN {
        S = tp * cp * dp; edp = S / ep; n = S * pp
        own = !(ep == 1 && tp == 1) # else the experts reduce over dp (x cp), whose groups those are
        printf "dense grid: tp=%d cp=%d dp=%d pp=%d; expert grid: etp=1 ep=%d edp=%d pp=%d (folded over tp x cp " \
            "x dp = %d ranks per stage; %d experts, %d per EP rank; expert gradients reduce over %s, dense over " \
            "dp x cp)\n", tp, cp, dp, pp, ep, edp, pp, S, E, E / ep, own ? "edp" : "dp"
        for (r = 0; r < n; r++) {
            t = r % tp; c = int(r / tp) % cp; d = int(r / (tp * cp)) % dp; p = int(r / S); i = r % S
            cs = cp > 1 ? sprintf(" cp=%d chunks %d,%d", c, c, 2 * cp - 1 - c) : ""
            printf "rank %d host local (tp=%d%s dp=%d pp=%d ep=%d edp=%d experts [%d, %d))\n", r, t, cs, d, p,
                i % ep, int(i / ep), (i % ep) * E / ep, (i % ep + 1) * E / ep
        }
        for (p = 0; p < pp && ep > 1; p++) for (g = 0; g < edp; g++) {
            s = "ep (tcp) token all-to-all: ranks"
            for (e = 0; e < ep; e++) s = s " " (p * S + g * ep + e)
            print s
        }
        for (p = 0; p < pp && edp > 1 && own; p++) for (e = 0; e < ep; e++) {
            s = "edp (tcp) expert gradients: ranks"
            for (g = 0; g < edp; g++) s = s " " (p * S + g * ep + e)
            print s
        }
    }'
}
printed() { # the same lines of `baton graph`
    sed -n -e '/^dense grid: /p' -e 's/^  \(rank [0-9]* host .*)\): stage.*/\1/p' \
        -e 's/^  \(ep (tcp) token all-to-all: ranks.*\)/\1/p' -e 's/^  \(edp (tcp) expert gradients: ranks.*\)/\1/p' <<<"$1"
}
for lay in "2 1 2 2 2" "2 1 2 1 4" "1 1 4 1 2" "2 1 4 1 4" "1 1 2 2 1" "2 1 1 1 1" "1 2 2 1 4" "2 2 1 1 2"; do
    read -r t c d p e <<<"$lay"
    g=$("$BATON" graph "$tmp/q.yaml" --set parallel.tp="$t" --set parallel.cp="$c" --set parallel.dp="$d" \
        --set parallel.pp="$p" --set parallel.ep="$e" 2>&1)
    name=moe_graph_grids_tp${t}_cp${c}_dp${d}_pp${p}_ep${e}
    want=$(fold $t $c $d $p $e); got=$(printed "$g")
    [ "$(wc -l <<<"$want")" -ge $((t * c * d * p + 1)) ] && [ "$got" = "$want" ] && pass "$name" \
        || fail "$name" "$(diff <(echo "$want") <(echo "$got") | head -20)"
done

# 4. generation: transformers' greedy ids (EOS ignored), the KV cache against
# recomputing the prefix (greedy and sampled); the fixtures borrow the llama
# fixture's byte-level tokenizer (the same 256-id vocabulary)
for name in mixtral qwen2_moe qwen2_moe_norm qwen3_moe; do
    d=$tmp/gen_$name
    borrow_tokenizer tests/fixtures/$name "$d"
    want=$(tr -d '\n' < tests/fixtures/$name/generate.json | sed 's/.*"ids": \[\([^]]*\)\].*/\1/')
    got=$("$BATON" generate --model "$d" --prompt "abc d" --max-new 20 --ignore-eos --json 2>&1)
    ids=$(sed 's/.*"ids": \[\([^]]*\)\].*/\1/' <<<"$got")
    [ -n "$want" ] && [ "$ids" = "$want" ] && grep -q '"prompt_ids": \[64, 65, 66, 220, 67\]' <<<"$got" \
        && pass "moe_generate_greedy_$name" || fail "moe_generate_greedy_$name" "got [$ids] want [$want]"
    for mode in "" "--temperature 2 --seed 5"; do
        # shellcheck disable=SC2086
        c1=$("$BATON" generate --model "$d" --prompt "abc d" --max-new 12 --ignore-eos --json $mode 2>&1)
        # shellcheck disable=SC2086
        c0=$("$BATON" generate --model "$d" --prompt "abc d" --max-new 12 --ignore-eos --json --no-cache $mode 2>&1)
        tag=${name}${mode:+_sampled}
        [[ "$c1" == *'"ids": ['[0-9]* ]] && [ "$c1" = "$c0" ] && pass "moe_generate_cache_$tag" \
            || fail "moe_generate_cache_$tag" "cache: $c1 | recompute: $c0"
    done
done

# 5. a native checkpoint of an MoE run (stacked expert tensors, docs/CHECKPOINTS.md)
# resumes bit for bit, and converts to an HF directory that evaluates
"$BATON" run "$tmp/q.yaml" --quiet --set checkpoint.dir="$tmp/cp" --set checkpoint.every=2 \
    --set metrics.file="$tmp/c1.jsonl" >/dev/null 2>&1
"$BATON" run "$tmp/q.yaml" --quiet --set checkpoint.dir="$tmp/cp2" --resume "$tmp/cp/step-00000002" \
    --set metrics.file="$tmp/c2.jsonl" >"$tmp/c2.txt" 2>&1
if [ "$(losses "$tmp/c2.jsonl" | wc -l)" -eq 2 ] && cmp -s <(losses "$tmp/c1.jsonl" | tail -2) <(losses "$tmp/c2.jsonl"); then
    pass moe_resume_bit_identical; else fail moe_resume_bit_identical "$(losses "$tmp/c1.jsonl" | tr '\n' ' ') | $(losses "$tmp/c2.jsonl" | tr '\n' ' ') $(tail -2 "$tmp/c2.txt")"; fi
"$BATON" convert --from tests/fixtures/mixtral --to "$tmp/native" >/dev/null 2>&1 &&
    "$BATON" convert --from "$tmp/native" --to "$tmp/back" >/dev/null 2>&1
a=$("$BATON" eval --model tests/fixtures/mixtral --ids tests/fixtures/mixtral/ids.txt --json 2>&1)
b=$("$BATON" eval --model "$tmp/back" --ids tests/fixtures/mixtral/ids.txt --json 2>&1)
[ -n "$(field loss "$a")" ] && [ "$a" = "$b" ] && pass moe_convert_roundtrip || fail moe_convert_roundtrip "$a | $b"

# 6. a capacity factor (baton's config.json key): eval reports what it dropped;
# a dropless model prints no such key
mkdir -p "$tmp/cap"
sed 's/"hidden_act"/"capacity_factor": 1.0,\n  "hidden_act"/' tests/fixtures/qwen2_moe/config.json > "$tmp/cap/config.json"
ln -s "$PWD"/tests/fixtures/qwen2_moe/model.safetensors "$tmp/cap/"
out=$("$BATON" eval --model "$tmp/cap" --ids tests/fixtures/qwen2_moe/ids.txt --json 2>&1)
plain=$("$BATON" eval --model tests/fixtures/qwen2_moe --ids tests/fixtures/qwen2_moe/ids.txt --json 2>&1)
d=$(field moe_dropped "$out")
[ -n "$d" ] && [ "$d" -gt 0 ] && [ "$(field loss "$out")" != "$(field loss "$plain")" ] && ! grep -q moe_dropped <<<"$plain" \
    && pass moe_eval_capacity_dropped || fail moe_eval_capacity_dropped "$out | $plain"
# training steps report the choices their forwards dropped over the global
# batch ("moe_dropped" in the metrics; evaluation forwards not counted): one
# process, dp=2 ep=2 (each rank its microbatch, the driver sums the ranks) and
# pp=2 without evaluations give the same count every step, and the same losses
cat > "$tmp/cap.yaml" <<YAML
model: {hf: $tmp/cap}
data: {dir: tests/fixtures/train_llama, seq_len: 16, split: 0.2}
train: {steps: 3, micro_batch: 2, grad_accum: 2, seed: 1234, log_every: 100, eval_every: 2, eval_batches: 1}
optim: {lr: 0.01, min_lr: 0.001, warmup: 2}
YAML
drops() { sed -n 's/.*"step": \([0-9]*\), "loss": \([0-9.e+-]*\),.*"moe_dropped": \([0-9]*\).*/\1 \2 \3/p' "$1"; }
"$BATON" run "$tmp/cap.yaml" --quiet --set metrics.file="$tmp/cap1.jsonl" > "$tmp/cap1.out" 2>&1
"$BATON" run "$tmp/cap.yaml" --quiet --set metrics.file="$tmp/cap2.jsonl" --set parallel.dp=2 --set parallel.ep=2 \
    --set train.grad_accum=1 --set trace.dir="$tmp/cap2.tr" > "$tmp/cap2.out" 2>&1
"$BATON" run "$tmp/cap.yaml" --quiet --set metrics.file="$tmp/cap3.jsonl" --set parallel.pp=2 \
    --set train.eval_every=0 > "$tmp/cap3.out" 2>&1
same_drops() { # A B: the same steps and drop counts, losses within 1e-5
    [ "$(drops "$1" | wc -l)" -eq 3 ] && join <(drops "$1") <(drops "$2") | awk '{ d = $2 - $4; if (d < 0) d = -d
        if (d > 1e-5 * $2 || $3 != $5 || !($3 > 0)) bad++; n++ } END { exit !(n == 3 && !bad) }'
}
if same_drops "$tmp/cap1.jsonl" "$tmp/cap2.jsonl" && same_drops "$tmp/cap1.jsonl" "$tmp/cap3.jsonl" &&
    grep -q '"val_loss"' "$tmp/cap1.jsonl" && ! grep -q moe_dropped "$tmp/fx.jsonl"; then
    pass moe_train_capacity_dropped
else
    fail moe_train_capacity_dropped "one: $(drops "$tmp/cap1.jsonl" | tr '\n' ' ') | dp2 ep2: $(drops "$tmp/cap2.jsonl" | tr '\n' ' ') $(tail -2 "$tmp/cap2.out") | pp2: $(drops "$tmp/cap3.jsonl" | tr '\n' ' ') $(tail -2 "$tmp/cap3.out")"
fi
# and in the trace: each rank's stage records its own count as the counter
# "moe dropped" after every training step; the ranks' counters sum to the
# step's metric
"$BATON" trace "$tmp/cap2.tr" -o "$tmp/cap2.json" > /dev/null 2>&1
if out=$(python3 - "$tmp/cap2.json" "$tmp/cap2.jsonl" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
per = {}  # actor -> values in time order
for e in sorted((e for e in ev if e.get("ph") == "C" and e["name"].endswith(" moe dropped")), key=lambda e: e["ts"]):
    per.setdefault(e["name"], []).append(e["args"]["value"])
want = [json.loads(l)["moe_dropped"] for l in open(sys.argv[2]) if '"loss"' in l]
got = [sum(v[k] for v in per.values()) for k in range(len(want))] if all(len(v) == len(want) for v in per.values()) else None
print(sorted(per.items()), "want", want)
sys.exit(0 if len(per) == 2 and len(want) == 3 and got == want and all(min(v) > 0 for v in per.values()) else 1)
PY
); then pass moe_trace_capacity_dropped; else fail moe_trace_capacity_dropped "$out"; fi

# a capacity factor where a rank sees only part of a microbatch's tokens: each
# expert's budget is the whole microbatch's, split by token order (model/moe.c
# moe_caps); tp=2 (each TP rank dispatches half the rows) and cp=2 (each CP
# rank holds two chunks of every sequence) drop the one process's choices and
# give its losses (before the split budget, cp=2 dropped 76 instead of 71 in
# step 1 and its loss was 1.7e-4 away); every rank reports its own share
for ax in tp cp; do
    "$BATON" run "$tmp/cap.yaml" --quiet --set parallel.$ax=2 --set metrics.file="$tmp/cap_$ax.jsonl" \
        > "$tmp/cap_$ax.out" 2>&1
    same_drops "$tmp/cap1.jsonl" "$tmp/cap_$ax.jsonl" && pass "moe_capacity_${ax}_exact" \
        || fail "moe_capacity_${ax}_exact" "one: $(drops "$tmp/cap1.jsonl" | tr '\n' ' ') | $ax=2: $(drops "$tmp/cap_$ax.jsonl" | tr '\n' ' ') $(tail -2 "$tmp/cap_$ax.out")"
done
