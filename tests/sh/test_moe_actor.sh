#!/usr/bin/env bash
# The expert group as an actor (train/expert_actor.h): in a run of the
# fixture MoE model (tests/fixtures/qwen2_moe: sparse layers 0 and 2, a
# dense layer 1) at dp=2 pp=2 ep=2, every sparse layer's forward and
# backward hands its routed rows to the rank's expert-group actor as
# EXPERT_TOKENS and waits for its EXPERT_DONE. Asserted:
#   graph     `baton graph` lists the expert group of every rank (slot 4)
#             and its edge with the stage, and the EP groups it exchanges in;
#   trace     `baton trace --summary` has, per rank, exactly one
#             EXPERT_TOKENS and one EXPERT_DONE per sparse layer of its
#             stage per microbatch per phase (steps x 2 microbatches x 1
#             layer x 2, plus one per evaluation forward), every one
#             received, and the group's track carries the row all-to-alls
#             as communication time;
#   counters  the trace's counters `tokens L<layer> e<expert>` of each
#             training step equal that step's `expert_tokens` in the
#             metrics (the global batch's choices per expert), written by
#             the one stage that reports them per pipeline stage (dp 0,
#             tp 0), layer 0 on stage 0 and layer 2 on stage 1;
#   same bits the losses, gradient norms, validation losses and exported
#             parameters equal, byte for byte, those of the same run with
#             the expert parts inline in the stage's compute
#             (BATON_TEST_EXPERTS_INLINE=1: no expert actor).
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_moe_actor.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT

steps=3
cat > "$tmp/job.yaml" <<YAML
model: {hf: tests/fixtures/qwen2_moe}
data: {dir: tests/fixtures/train_llama, seq_len: 16, split: 0.2}
train: {steps: $steps, micro_batch: 2, grad_accum: 2, seed: 3, log_every: 100, eval_every: $steps,
        eval_batches: 1}
optim: {lr: 0.01, min_lr: 0.001, warmup: 1}
parallel: {dp: 2, pp: 2, ep: 2}
YAML

# graph
g=$("$BATON" graph "$tmp/job.yaml" 2>&1)
if [ "$(grep -c 'stage slot 1 \[v[01]\].*experts slot 4' <<<"$g")" -eq 4 ] &&
    grep -q 'experts: rank 0 stage -> rank 0 experts EXPERT_TOKENS, back EXPERT_DONE (local, per sparse layer; rows all-to-all over the ep group, ranks 0 1)' <<<"$g" &&
    grep -q 'experts: rank 3 stage -> rank 3 experts EXPERT_TOKENS, back EXPERT_DONE (local, per sparse layer; rows all-to-all over the ep group, ranks 2 3)' <<<"$g"; then
    pass moe_actor_graph; else fail moe_actor_graph "$g"; fi

# run NAME [ENV...]: metrics, export and trace under $tmp/NAME*
run() {
    local name=$1; shift
    env "$@" timeout "$(scaled 120)" "$BATON" run "$tmp/job.yaml" --quiet --set metrics.file="$tmp/$name.jsonl" \
        --set export.dir="$tmp/$name.ck" --set export.every=$steps --set trace.dir="$tmp/$name.tr" \
        > "$tmp/$name.out" 2>&1
}
run actor || fail moe_actor_run "rc $?: $(tail -3 "$tmp/actor.out")"
run inline BATON_TEST_EXPERTS_INLINE=1 || fail moe_actor_inline_run "rc $?: $(tail -3 "$tmp/inline.out")"

# trace: per rank, TOKENS and DONE counts (count and received columns)
"$BATON" trace "$tmp/actor.tr" --summary > "$tmp/sum.txt" 2>&1
evals=$(grep -c '"val_loss"' "$tmp/actor.jsonl")
want=$((steps * 2 * 2 + evals))
ok=1
for r in 0 1 2 3; do
    t=$(awk -v r="r$r" '$2 == r && $(NF-5) == "EXPERT_TOKENS" && $0 ~ "experts " r " " { print $(NF-4), $(NF-2) }' "$tmp/sum.txt")
    d=$(awk -v r="r$r" '$1 == "experts" && $2 == r && $(NF-5) == "EXPERT_DONE" { print $(NF-4), $(NF-2) }' "$tmp/sum.txt")
    c=$(awk -v r="r$r" '$1 == "experts" && $2 == r && NF == 11 { print $NF }' "$tmp/sum.txt")
    [ "$t" = "$want $want" ] && [ "$d" = "$want $want" ] && awk -v c="$c" 'BEGIN { exit !(c > 0) }' || ok=0
    [ $ok = 1 ] || { fail moe_actor_trace "rank $r: tokens [$t] done [$d] comm_ms [$c], want $want each ($evals evaluations); $(cat "$tmp/sum.txt")"; break; }
done
[ $ok = 1 ] && [ "$evals" -ge 1 ] && pass moe_actor_trace
! grep -q EXPERT_TOKENS <("$BATON" trace "$tmp/inline.tr" --summary 2>&1) && pass moe_actor_inline_has_none \
    || fail moe_actor_inline_has_none "the inline run sent EXPERT_TOKENS"

# counters: tokens per expert per step, as the metrics have them
"$BATON" trace "$tmp/actor.tr" -o "$tmp/actor.json" > /dev/null 2>&1
if out=$(python3 - "$tmp/actor.json" "$tmp/actor.jsonl" $steps <<'PY'
import json, re, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
steps = int(sys.argv[3])
seen = {}  # (actor, layer, expert) -> values in time order
for e in sorted((e for e in ev if e.get("ph") == "C"), key=lambda e: e["ts"]):
    m = re.fullmatch(r"(stage r\d+ pp(\d+) dp(\d+) tp(\d+) v\d+(?: cp\d+)?) tokens L(\d+) e(\d+)", e["name"])
    if m:
        seen.setdefault((m.group(1), int(m.group(5)), int(m.group(6))), []).append(e["args"]["value"])
want = {}  # (layer, expert) -> per step
for line in open(sys.argv[2]):
    rec = json.loads(line)
    if "loss" in rec:
        for layer, counts in rec["expert_tokens"].items():
            for x, c in enumerate(counts):
                want.setdefault((int(layer), x), []).append(c)
stage_of = {0: "pp0", 2: "pp1"}
got = {(l, x): v for (a, l, x), v in seen.items()}
actors = {(a, l) for (a, l, x) in seen}
ok = (len(want) == 16 and all(len(v) == steps for v in want.values()) and got == want and
      len(actors) == 2 and all(" %s dp0 tp0 " % stage_of[l] in a + " " for a, l in actors))
print("counters", sorted(seen.items())[:4], "... want", sorted(want.items())[:4])
sys.exit(0 if ok else 1)
PY
); then pass moe_actor_token_counters; else fail moe_actor_token_counters "$out"; fi

# same bits: metrics (without the timings) and the export
strip() { sed -e 's/"elapsed_s": [^,}]*//' -e 's/"t_[a-z_]*": [^,}]*//g' -e 's/"mem[a-z_]*": [^,}]*//g' \
    -e 's/"tok[a-z_]*_per_s": [^,}]*//g' -e 's/"mfu": [^,}]*//g' "$1" | grep -o '"\(loss\|grad_norm\|val_loss\|lr\)": [^,}]*'; }
if [ -n "$(strip "$tmp/actor.jsonl")" ] && [ "$(strip "$tmp/actor.jsonl")" = "$(strip "$tmp/inline.jsonl")" ] &&
    cmp -s "$tmp/actor.ck/model.safetensors" "$tmp/inline.ck/model.safetensors"; then
    pass moe_actor_same_bits
else
    fail moe_actor_same_bits "$(strip "$tmp/actor.jsonl" | tr '\n' ' ') | $(strip "$tmp/inline.jsonl" | tr '\n' ' ')"
fi
