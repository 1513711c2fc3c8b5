#!/usr/bin/env bash
# Messages people can act on: `baton --version`; `baton help CMD` and
# `baton CMD --help` print the same text and exit 0 for every command; an
# unknown key names the nearest known one; a runtime error names the job
# field and its line; no message carries a C source location unless
# BATON_LOG=debug; train.global_batch gives every layout the same tokens per
# step.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_cli.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

v=$("$BATON" --version); rc=$?
[ "$rc" = 0 ] && [[ "$v" =~ ^baton\ [0-9]+\.[0-9]+\.[0-9]+\ \(source\ revision\ ([0-9a-f]{12}(-dirty)?|unknown)\)$ ]] \
    && pass cli_version || fail cli_version "rc $rc: '$v'"

bad=
for c in $("$BATON" help | sed -n 's/^  \([a-z]*\) .*/\1/p'); do
    a=$("$BATON" help "$c" 2>&1); ra=$?
    b=$("$BATON" "$c" --help 2>&1); rb=$?
    if [ "$ra" != 0 ] || [ "$rb" != 0 ] || [ "$a" != "$b" ] || ! grep -q "^usage: baton $c" <<<"$a"; then
        bad+=" $c(rc $ra/$rb)"
    fi
    n=$((${n:-0} + 1))
done
[ -z "$bad" ] && [ "${n:-0}" -ge 9 ] && pass cli_help_agrees || fail cli_help_agrees "${n:-0} commands;$bad"
"$BATON" help nosuch > /dev/null 2>&1; [ $? = 2 ] && pass cli_help_unknown || fail cli_help_unknown "rc not 2"

mkdir -p "$tmp/data"
lcg_tokens 3 400 40 10 64 > "$tmp/data/tokens.txt"
cat > "$tmp/job.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 2, kv_heads: 1, ffn: 64, vocab: 64}
data: {dir: $tmp/data, seq_len: 16, split: 0.1}
train: {steps: 1, micro_batch: 2, global_batch: 8}
runs: $tmp/runs
YAML
"$BATON" run "$tmp/job.yaml" --set train.stpes=3 > /dev/null 2> "$tmp/e1"; rc=$?
[ "$rc" = 1 ] && grep -q '^baton run: --set train.stpes=3: train.stpes: unknown key (did you mean train.steps?)$' "$tmp/e1" \
    && pass cli_did_you_mean || fail cli_did_you_mean "rc $rc: $(cat "$tmp/e1")"
sed 's/^train:/trian:/' "$tmp/job.yaml" > "$tmp/typo.yaml"
"$BATON" run "$tmp/typo.yaml" > /dev/null 2> "$tmp/e2"
grep -q 'typo.yaml:3:1: trian: unknown section (did you mean train?)' "$tmp/e2" \
    && pass cli_did_you_mean_section || fail cli_did_you_mean_section "$(cat "$tmp/e2")"

# a runtime error: the data directory is missing; the field and its line
sed "s|dir: $tmp/data|dir: $tmp/nothing|" "$tmp/job.yaml" > "$tmp/nodata.yaml"
"$BATON" run "$tmp/nodata.yaml" > /dev/null 2> "$tmp/e3"; rc=$?
[ "$rc" = 1 ] && grep -q "^baton run: $tmp/nodata.yaml:2:[0-9]*: data.dir: cannot read a token stream from $tmp/nothing" "$tmp/e3" \
    && pass cli_runtime_error_names_field || fail cli_runtime_error_names_field "rc $rc: $(cat "$tmp/e3")"
# the same as four processes: the driver says it before starting any
"$BATON" run "$tmp/nodata.yaml" --set parallel.dp=2 > /dev/null 2> "$tmp/e4"
grep -q "^baton run: $tmp/nodata.yaml:2:[0-9]*: data.dir: cannot read" "$tmp/e4" \
    && pass cli_runtime_error_layout || fail cli_runtime_error_layout "$(cat "$tmp/e4")"
# source locations: none by default, there with BATON_LOG=debug
mkdir -p "$tmp/emptymodel"
printf 'model: {hf: %s}\ndata: {dir: %s, seq_len: 16}\n' "$tmp/emptymodel" "$tmp/data" > "$tmp/hf.yaml"
"$BATON" run "$tmp/hf.yaml" > /dev/null 2> "$tmp/e5"
BATON_LOG=debug "$BATON" run "$tmp/hf.yaml" > /dev/null 2> "$tmp/e6"
if grep -q 'model.hf' "$tmp/e5" && ! grep -qE '[a-z_]+\.c:[0-9]+' "$tmp/e3" "$tmp/e4" "$tmp/e5" &&
   grep -qE '^baton error [a-z_/]+\.c:[0-9]+: ' "$tmp/e6"; then
    pass cli_source_locations_debug_only
else
    fail cli_source_locations_debug_only "default: $(cat "$tmp/e5") | debug: $(head -2 "$tmp/e6")"
fi

# train.global_batch: 8 sequences of 16 tokens per step in every layout
tps=
for layout in "parallel.dp=1" "parallel.dp=2" "parallel.dp=4" "parallel.pp=2"; do
    "$BATON" run "$tmp/job.yaml" --quiet --set "$layout" > "$tmp/gb.out" 2>&1
    tps+="$(sed -n 's/^  batch: \([0-9]*\) tokens per step (\([0-9]*\) sequences.*/\1x\2/p' "$tmp/gb.out") "
done
[ "$tps" = "128x8 128x8 128x8 128x8 " ] && pass cli_global_batch_layouts || fail cli_global_batch_layouts "'$tps'"
"$BATON" run "$tmp/job.yaml" --set parallel.dp=3 > /dev/null 2> "$tmp/e7"
grep -q "job.yaml:3:[0-9]*: train.global_batch: 8 sequences per step do not split into parallel.dp 3 x train.micro_batch 2" "$tmp/e7" \
    && pass cli_global_batch_refused || fail cli_global_batch_refused "$(cat "$tmp/e7")"

# a long evaluation says how far it is (BATON_PROGRESS_SECONDS: how often)
BATON_PROGRESS_SECONDS=0 "$BATON" eval --model tests/fixtures/llama --ids tests/fixtures/llama/ids.txt \
    --window 8 --json > "$tmp/ev.json" 2> "$tmp/ev.err"
n=$(grep -c '^baton eval: window [0-9]*/[0-9]*, [0-9]* positions scored, loss so far [0-9.]*, [0-9]* tok/s, ETA [0-9]* s$' "$tmp/ev.err")
[ "$n" -ge 2 ] && grep -q '"loss"' "$tmp/ev.json" && pass cli_eval_progress || fail cli_eval_progress "$n lines: $(head -3 "$tmp/ev.err")"

# --resume at a checkpoint that is not there: said as such, with where it
# looked (the absolute path of a relative one), before a run directory
# exists; the value may come before or after the job file
runs_before=$(ls "$tmp/runs" 2>/dev/null | wc -l)
"$BATON" run "$tmp/job.yaml" --resume "$tmp/nockpt" > /dev/null 2> "$tmp/e8"; rc=$?
"$BATON" run --resume "$tmp/nockpt" "$tmp/job.yaml" > /dev/null 2> "$tmp/e9"; rc9=$?
abs_baton=$(realpath "$BATON")
(cd "$tmp" && "$abs_baton" run job.yaml --resume nockpt > /dev/null 2> "$tmp/e10")
mkdir -p "$tmp/emptyckpt"
"$BATON" run "$tmp/job.yaml" --resume "$tmp/emptyckpt" > /dev/null 2> "$tmp/e11"
want="^baton run: --resume: $tmp/nockpt: no such checkpoint (No such file or directory)\$"
if [ "$rc" = 1 ] && [ "$rc9" = 1 ] && grep -q "$want" "$tmp/e8" && grep -q "$want" "$tmp/e9" &&
   grep -q "^baton run: --resume: nockpt: no such checkpoint .* (looked at $(cd "$tmp" && pwd -P)/nockpt)\$" "$tmp/e10" &&
   grep -q "^baton run: --resume: $tmp/emptyckpt holds no committed checkpoint" "$tmp/e11" &&
   ! grep -q 'unexpected argument' "$tmp/e8" "$tmp/e9" "$tmp/e10" &&
   [ "$(ls "$tmp/runs" 2>/dev/null | wc -l)" = "$runs_before" ]; then
    pass cli_resume_missing
else
    fail cli_resume_missing "rc $rc/$rc9: $(cat "$tmp/e8" "$tmp/e9" "$tmp/e10" "$tmp/e11")"
fi
