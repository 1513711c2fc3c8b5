#!/usr/bin/env bash
# baton eval --layout: the HF fixtures evaluated as processes in parallel
# layouts (the MoE fixture with its experts split by ep) give the
# single-process loss (rel <= 1e-6) and transformers' loss
# (tests/fixtures/*/expected.json, rel <= 1e-5); bad layouts fail clearly.
set -u
. "$(dirname "$0")/lib.bash"
FIX=tests/fixtures
export BATON_STEP_TIMEOUT=30
num() { sed -n "s/.*\"$1\": *\([0-9.eE+-]*\).*/\1/p" | head -1; }
close() { awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= r * (b < 0 ? -b : b)) }'; }

check() { # fixture layout
    local d=$FIX/$1 name="eval_layout_$1_$(tr ',=' '_' <<<"$2")"
    local one many want
    one=$("$BATON" eval --model "$d" --ids "$d/ids.txt" --json 2>/dev/null | num loss)
    many=$("$BATON" eval --model "$d" --ids "$d/ids.txt" --json --layout "$2" 2>/dev/null | num loss)
    want=$(num loss < "$d/expected.json")
    if close "$many" "$one" 1e-6 && close "$many" "$want" 1e-5; then pass "$name"
    else fail "$name" "layout $many, single $one, transformers $want"; fi
}
check llama tp=2
check llama pp=2
check llama tp=2,pp=2,dp=1
check llama tp=2,pp=2,dp=2
check llama_tied_llama3 pp=2,dp=2
check qwen2 pp=3
# routed experts split over the ranks (the expert grid, docs/PARALLEL.md)
check qwen2_moe dp=2,ep=2
check qwen2_moe tp=2,dp=2,ep=4
check qwen2_moe pp=2,dp=2,ep=2
check qwen2_moe cp=2,ep=2

out=$("$BATON" eval --model $FIX/llama --ids $FIX/llama/ids.txt --layout tp=3 2>&1); rc=$?
# errors name the option given (not a position in the job eval generates)
[ $rc -ne 0 ] && grep -q "^baton eval: --layout tp=3: parallel.tp: tp 3 does not divide 4 attention heads$" <<<"$out" &&
    ! grep -q -- "--layout:" <<<"$out" && pass eval_layout_bad_tp \
    || fail eval_layout_bad_tp "rc $rc: $out"
out=$("$BATON" eval --model $FIX/llama --ids $FIX/llama/ids.txt --layout tp=5000 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "^baton eval: --layout tp=5000: parallel.tp: 5000 is out of range \[1, 4096\]$" <<<"$out" \
    && pass eval_layout_out_of_range || fail eval_layout_out_of_range "rc $rc: $out"
out=$("$BATON" eval --model $FIX/llama --ids $FIX/llama/ids.txt --layout pp=two 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "expected tp=N,pp=N,dp=N" <<<"$out" && pass eval_layout_bad_syntax \
    || fail eval_layout_bad_syntax "rc $rc: $out"
out=$("$BATON" eval --model $FIX/qwen2_moe --ids $FIX/qwen2_moe/ids.txt --layout ep=2 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "^baton eval: --layout ep=2: parallel.ep: ep 2 must divide tp x cp x dp = 1" <<<"$out" && pass eval_layout_bad_ep \
    || fail eval_layout_bad_ep "rc $rc: $out"
# a config.json with a huge vocabulary: refused before any worker starts,
# with every rank's share counted (2 ranks x 4 GiB of embedding + the
# whole model each holds while it starts)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/huge" && cp $FIX/llama/config.json $FIX/llama/model.safetensors "$tmp/huge/"
sed -i 's/"vocab_size": 256/"vocab_size": 16777216/' "$tmp/huge/config.json"
out=$( (cap_vm; BATON_MEM_LIMIT=2G timeout 60 "$BATON" eval --model "$tmp/huge" --ids $FIX/llama/ids.txt \
      --layout pp=2 --json) 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q -- "--model $tmp/huge: model.hf: the job needs about [0-9.]* GiB of memory in 2 processes" <<<"$out" &&
    grep -q "more than the 2.00 GiB available (BATON_MEM_LIMIT=2G); [0-9]*% of it is for vocab_size 16777216 x hidden_size 64 in model.hf's config" <<<"$out" &&
    ! grep -q "rank 0 (pid" <<<"$out" && pass eval_layout_mem_refused || fail eval_layout_mem_refused "rc $rc: $out"
exit 0
