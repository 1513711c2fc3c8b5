#!/usr/bin/env bash
# baton convert (docs/CHECKPOINTS.md): a checkpoint written by a tp=2 x pp=2 x
# dp=2 ZeRO-1 run (tests/fixtures/ckpt_tp2pp2dp2, tools/gen_ckpt_fixture.sh)
# exported as a Hugging Face directory scores the same loss in `baton eval`
# as transformers gave on it (recorded by the fixture script); Hugging Face
# directories imported and exported again give byte-identical tensors (f32
# and bf16); nothing is overwritten; bad sources are clear errors.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_convert.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fx=tests/fixtures/ckpt_tp2pp2dp2

if "$BATON" convert --from "$fx/ckpt" --to "$tmp/hf" --tokenizer tests/fixtures/tok/gpt2 > "$tmp/out" 2>&1 &&
   [ -s "$tmp/hf/config.json" ] && [ -s "$tmp/hf/tokenizer.json" ]; then pass convert_export_hf
else fail convert_export_hf "$(tail -2 "$tmp/out")"; fi
got=$("$BATON" eval --model "$tmp/hf" --ids "$fx/ids.txt" --json 2>"$tmp/err")
want=$(cat "$fx/transformers.json")
if awk -v a="$(field loss "$got")" -v b="$(field loss "$want")" -v n="$(field tokens "$got")" -v m="$(field tokens "$want")" \
       'BEGIN { d = a - b; if (d < 0) d = -d; exit !(n == m && n > 0 && d <= 1e-5 * b) }'; then
    pass convert_export_matches_transformers
else fail convert_export_matches_transformers "baton $got, transformers $want $(tail -1 "$tmp/err")"; fi

# import, export: the same tensor bytes
tensors_same() { python3 - "$1" "$2" <<'PY'
import json, struct, sys
def tensors(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
bad = [k for k in a if a[k] != b[k]]
assert not bad, bad[:3]
PY
}
for m in llama qwen2_bf16 qwen2_moe; do
    src=tests/fixtures/$m
    if "$BATON" convert --from "$src" --to "$tmp/$m.ck" > "$tmp/out" 2>&1 &&
       "$BATON" convert --from "$tmp/$m.ck" --to "$tmp/$m.hf" >> "$tmp/out" 2>&1 &&
       tensors_same "$src/model.safetensors" "$tmp/$m.hf/model.safetensors"; then pass "convert_roundtrip_$m"
    else fail "convert_roundtrip_$m" "$(tail -2 "$tmp/out")"; fi
done
# an export with its tokenizer generates what the original does
rm -rf "$tmp/llama.hf2"
"$BATON" convert --from "$tmp/llama.ck" --to "$tmp/llama.hf2" --tokenizer tests/fixtures/llama > "$tmp/out" 2>&1
a=$("$BATON" generate --model tests/fixtures/llama --prompt "abc d" --max-new 12 --ignore-eos --json 2>&1)
b=$("$BATON" generate --model "$tmp/llama.hf2" --prompt "abc d" --max-new 12 --ignore-eos --json 2>&1)
[ -n "$a" ] && [ "$a" = "$b" ] && [ -s "$tmp/llama.hf2/tokenizer.json" ] && pass convert_export_generates \
    || fail convert_export_generates "original: $a; export: $b"
# the sharded HF fixture (an index and several files) imports too
"$BATON" convert --from tests/fixtures/llama_sharded --to "$tmp/sh.ck" > "$tmp/out" 2>&1 &&
    [ "$(ls "$tmp/sh.ck"/shard-*.safetensors | wc -l)" -ge 2 ] && pass convert_import_sharded \
    || fail convert_import_sharded "$(tail -2 "$tmp/out")"

# a run's checkpoint of an MoE model (experts stacked in one parameter) exports
# the same tensors as the run's own HF export of the same step
mkdir -p "$tmp/moedata"
lcg_tokens 3 2000 30 7 32 > "$tmp/moedata/tokens.txt"
cat > "$tmp/moe.yaml" <<YAML
model: {hf: tests/fixtures/qwen2_moe}
data: {dir: $tmp/moedata, seq_len: 8, split: 0}
train: {steps: 2, micro_batch: 2, grad_accum: 1, log_every: 100}
optim: {lr: 0.01, min_lr: 0.001, warmup: 0}
checkpoint: {dir: $tmp/moe.ck}
export: {dir: $tmp/moe.export}
YAML
if "$BATON" run "$tmp/moe.yaml" --quiet > "$tmp/out" 2>&1 &&
   "$BATON" convert --from "$tmp/moe.ck" --to "$tmp/moe.hf" >> "$tmp/out" 2>&1 &&
   tensors_same "$tmp/moe.export/model.safetensors" "$tmp/moe.hf/model.safetensors"; then pass convert_moe_like_export
else fail convert_moe_like_export "$(tail -3 "$tmp/out")"; fi

# offline resharding: the tp=2 x pp=2 x dp=2 checkpoint as tp=1, pp=2 (1+1)
# and tp=2, pp=1: one file per (stage, TP rank), the same tensors whole
for lay in "tp=1,pp=2,split=1+1" "tp=2,pp=1"; do
    rm -rf "$tmp/rs" "$tmp/rs.hf" "$tmp/orig.hf"
    if "$BATON" convert --from "$fx/ckpt" --to "$tmp/rs" --layout "$lay" > "$tmp/out" 2>&1 &&
       "$BATON" convert --from "$tmp/rs" --to "$tmp/rs.hf" >> "$tmp/out" 2>&1 &&
       "$BATON" convert --from "$fx/ckpt" --to "$tmp/orig.hf" >> "$tmp/out" 2>&1 &&
       tensors_same "$tmp/orig.hf/model.safetensors" "$tmp/rs.hf/model.safetensors" &&
       grep -q '"optim.exp_avg_sq/model.norm.weight"' "$tmp/rs/index.json"; then pass "convert_layout_${lay%%,split*}"
    else fail "convert_layout_${lay%%,split*}" "$(tail -2 "$tmp/out")"; fi
done
[ "$(ls "$tmp/rs"/shard-*.safetensors | wc -l)" = 2 ] || fail convert_layout_files "$(ls "$tmp/rs")"

# nothing is overwritten; bad sources
"$BATON" convert --from tests/fixtures/llama --to "$tmp/llama.ck" > "$tmp/out" 2>&1 &&
    fail convert_no_overwrite "imported over an existing directory" ||
    { grep -q 'exists: nothing is overwritten' "$tmp/out" && pass convert_no_overwrite || fail convert_no_overwrite "$(cat "$tmp/out")"; }
"$BATON" convert --from "$tmp" --to "$tmp/x" > "$tmp/out" 2>&1
grep -q 'holds no committed checkpoint' "$tmp/out" && pass convert_not_a_checkpoint || fail convert_not_a_checkpoint "$(cat "$tmp/out")"
cp -r "$fx/ckpt" "$tmp/trunc"
f=$(ls "$tmp/trunc"/shard-r00000.safetensors)
truncate -s 100 "$f"
"$BATON" convert --from "$tmp/trunc" --to "$tmp/y" > "$tmp/out" 2>&1
grep -q 'shard-r00000.safetensors.*100 bytes' "$tmp/out" && [ ! -e "$tmp/y" ] && pass convert_truncated \
    || fail convert_truncated "$(cat "$tmp/out")"
