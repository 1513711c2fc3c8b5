#!/usr/bin/env bash
# baton graph: the actor graph of a layout (placement in rank order
# tp-dp-pp with tp fastest, pipeline edges, collective groups) is printed
# without starting anything; invalid layouts fail with the field named.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_graph.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/data"
echo "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20" > "$tmp/data/tokens.txt"
cat > "$tmp/job.yaml" <<YAML
model: {layers: 4, hidden: 64, heads: 4, kv_heads: 2, ffn: 128, vocab: 256, tie_embeddings: true}
data: {dir: $tmp/data, seq_len: 4, split: 0}
train: {steps: 5, micro_batch: 2, grad_accum: 2}
parallel: {tp: 2, pp: 2, dp: 2}
YAML

out=$("$BATON" graph "$tmp/job.yaml" 2>&1); rc=$?
[ $rc -eq 0 ] && pass graph_exit || fail graph_exit "rc $rc: $out"
# rank = tp + tp*(dp + dp*pp): rank 5 is tp=1 dp=0 pp=1
grep -q '^  rank 5 host local (tp=1 dp=0 pp=1): stage slot 1 \[v1\], data slot 2$' <<<"$out" \
    && pass graph_rank_order || fail graph_rank_order "$(grep 'rank 5 ' <<<"$out")"
grep -q '^  pipeline (tcp): v0 rank 1 -> v1 rank 5 ACTIVATION, back ACT_GRAD$' <<<"$out" \
    && pass graph_pipeline_edge || fail graph_pipeline_edge "no v0 rank1 -> v1 rank5 edge"
[ "$(grep -c '^  tp (tcp): ranks' <<<"$out")" -eq 4 ] && grep -q '^  tp (tcp): ranks 2 3$' <<<"$out" \
    && [ "$(grep -c '^  dp (tcp): ranks' <<<"$out")" -eq 4 ] && grep -q '^  dp (tcp): ranks 5 7$' <<<"$out" \
    && grep -q '^  emb (tcp): ranks 3 7$' <<<"$out" && grep -q '^  world (tcp): ranks 0 1 2 3 4 5 6 7$' <<<"$out" \
    && pass graph_groups || fail graph_groups "$(sed -n '/collective/,$p' <<<"$out")"
grep -q 'world=8' <<<"$out" && grep -q '^  driver rank 8 ' <<<"$out" && pass graph_driver || fail graph_driver "no driver rank 8"

# interleaved: virtual stage v runs on stage v % pp as chunk v / pp
out=$("$BATON" graph "$tmp/job.yaml" --set parallel.tp=1 --set parallel.dp=1 --set parallel.virtual_stages=2 \
      --set parallel.schedule=interleaved --set parallel.split=[1,1,1,1] 2>&1)
grep -q '^  v2: layers \[2, 3) -> stage 0 chunk 1$' <<<"$out" && grep -q 'stage slot 1 \[v1 v3\]' <<<"$out" \
    && grep -q '^  pipeline (tcp): v1 rank 1 -> v2 rank 0 ' <<<"$out" \
    && pass graph_interleaved || fail graph_interleaved "$out"
# uneven split
out=$("$BATON" graph "$tmp/job.yaml" --set parallel.tp=1 --set parallel.dp=1 --set parallel.pp=3 \
      --set parallel.split=[2,1,1] --set train.grad_accum=3 2>&1)
grep -q '^  v0: layers \[0, 2) +embedding' <<<"$out" && grep -q '^  v2: layers \[3, 4) +head+loss' <<<"$out" \
    && pass graph_uneven_split || fail graph_uneven_split "$out"

# validation errors name the field
bad() { # name, expected text, --set args...
    local name=$1 want=$2; shift 2
    local o; o=$("$BATON" graph "$tmp/job.yaml" "$@" 2>&1); local r=$?
    if [ $r -ne 0 ] && grep -q -- "$want" <<<"$o"; then pass "$name"; else fail "$name" "rc $r: $o"; fi
}
bad graph_split_sum "parallel.split: the stage layer counts sum to 5, but the model has 4 layers" \
    --set parallel.tp=1 --set parallel.split=[3,2]
bad graph_too_many_stages "parallel.pp: 5 pipeline stages (pp 5 x virtual_stages 1) for only 4 layers" \
    --set parallel.pp=5 --set train.grad_accum=5
bad graph_tp_heads "parallel.tp: tp 3 does not divide 4 attention heads" --set parallel.tp=3
bad graph_split_entries "parallel.split: 3 entries, but there are 2 stages" --set parallel.split=[2,1,1]
bad graph_microbatches "microbatches cannot fill 2 pipeline stages" --set train.grad_accum=1
bad graph_inproc_refused "transport.tensor_parallel: inproc links threads of one process" \
    --set transport.tensor_parallel=inproc
bad graph_vocab_range "model.vocab: 16777217 is out of range \[0, 16777216\]" --set model.vocab=16777217

# A 400 KB job file nested 200 000 levels deep is refused at once with the
# limit and the line, by graph and run alike (libyaml alone spends minutes on it).
python3 -c 'import sys; d=200000; sys.stdout.write("data: {dir: x}\nhosts: " + "["*d + "]"*d + "\n")' >"$tmp/deep.yaml"
for cmd in graph run; do
    o=$(timeout 20 "$BATON" $cmd "$tmp/deep.yaml" 2>&1); r=$?
    if [ $r -eq 1 ] && grep -q -- "deep.yaml:2:39: (file): nested deeper than 32 levels" <<<"$o"; then
        pass "${cmd}_deep_nesting"; else fail "${cmd}_deep_nesting" "rc $r: ${o:0:300}"; fi
done
exit 0
