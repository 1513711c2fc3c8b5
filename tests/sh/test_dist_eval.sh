#!/usr/bin/env bash
# baton eval --layout: the HF fixtures evaluated as processes in parallel
# layouts give the single-process loss (rel <= 1e-6) and transformers' loss
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

out=$("$BATON" eval --model $FIX/llama --ids $FIX/llama/ids.txt --layout tp=3 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "tp 3 does not divide 4 attention heads" <<<"$out" && pass eval_layout_bad_tp \
    || fail eval_layout_bad_tp "rc $rc: $out"
out=$("$BATON" eval --model $FIX/llama --ids $FIX/llama/ids.txt --layout pp=two 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "expected tp=N,pp=N,dp=N" <<<"$out" && pass eval_layout_bad_syntax \
    || fail eval_layout_bad_syntax "rc $rc: $out"
exit 0
