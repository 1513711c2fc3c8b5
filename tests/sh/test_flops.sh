#!/usr/bin/env bash
# baton flops: a job's training FLOPs per token by model/flops.h (hand counts
# in tests/test_flops.c), its MFU at a given rate and peak, and refusals.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_flops.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/data"
echo "1 2 3 4 5 6 7 8 9 10" > "$tmp/data/tokens.txt"
cat > "$tmp/job.yaml" <<YAML
model: {layers: 12, hidden: 768, heads: 12, kv_heads: 12, ffn: 2048, vocab: 32000}
data: {dir: $tmp/data, seq_len: 1024, split: 0}
YAML

# Llama-style 134M at T 1024: 6 x (109 510 656 + 9 437 184)
out=$("$BATON" flops "$tmp/job.yaml" --json 2>&1); rc=$?
[ $rc -eq 0 ] && [ "$(field flops_per_token "$out")" = 713687040 ] \
    && [ "$(field matmul_params "$out")" = 109510656 ] && [ "$(field attn_fma "$out")" = 9437184 ] \
    && [ "$(field params "$out")" = 134105856 ] && [ "$(field seq_len "$out")" = 1024 ] \
    && pass flops_134m || fail flops_134m "rc $rc: $out"
# Llama 1.1B through --set and --seq, with the MFU of the issue's torch number
out=$("$BATON" flops "$tmp/job.yaml" --set model.layers=22 --set model.hidden=2048 \
      --set model.heads=32 --set model.kv_heads=4 --set model.ffn=5632 --set data.seq_len=2048 \
      --seq 2048 --tokens-per-s 58600 --peak-tflops 790 --json 2>&1)
[ "$(field flops_per_token "$out")" = 6760169472 ] && [ "$(field mfu "$out")" = 0.501451 ] \
    && pass flops_1b_mfu || fail flops_1b_mfu "$out"
# a tied head counts its product
a=$(field flops_per_token "$("$BATON" flops "$tmp/job.yaml" --json)")
b=$(field flops_per_token "$("$BATON" flops "$tmp/job.yaml" --set model.tie_embeddings=true --json)")
[ -n "$a" ] && [ "$a" = "$b" ] && pass flops_tied || fail flops_tied "$a vs $b"
out=$("$BATON" flops "$tmp/job.yaml" --tokens-per-s 450000 --peak-tflops 790 2>&1)
grep -q 'training FLOPs per token 6 x (109510656 + 9437184) = 713687040' <<<"$out" \
    && grep -q 'MFU 40.7% of 790 TFLOP/s' <<<"$out" && pass flops_text || fail flops_text "$out"

# refusals: usage (2) and a job whose vocabulary would come from the data (1)
"$BATON" flops "$tmp/job.yaml" --peak-tflops 790 >/dev/null 2>&1; r1=$?
"$BATON" flops "$tmp/job.yaml" --seq 0 >/dev/null 2>&1; r2=$?
out=$("$BATON" flops "$tmp/job.yaml" --set model.vocab=0 2>&1); r3=$?
[ $r1 -eq 2 ] && [ $r2 -eq 2 ] && [ $r3 -eq 1 ] && grep -q 'model.vocab: set it' <<<"$out" \
    && pass flops_refusals || fail flops_refusals "rc $r1 $r2 $r3: $out"
