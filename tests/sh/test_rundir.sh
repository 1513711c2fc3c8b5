#!/usr/bin/env bash
# Run directories and what a run tells (launch/rundir.h, launch/report.h):
# every run writes into runs/<job>/<run id>/ of its own with a `latest`
# link, records the resolved job, its command line, overrides, revision,
# hosts and layout; `baton trace` refuses to merge two runs' files and names
# both; the progress line, the header and the summary carry their fields; a
# clean run logs nothing above info, a --quiet one nothing at all; the export
# holds the tokenizer and `baton generate` works on runs/<job>/latest/export.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d /tmp/test_rundir.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
BATON=$(readlink -f "$BATON")
tok=$PWD/tests/fixtures/tok/gpt2
# a token stream over the fixture tokenizer's 4096 ids (so that the export
# can generate text with it)
mkdir -p "$tmp/data"
lcg_tokens 7 6000 300 9 4096 > "$tmp/data/tokens.txt"
cat > "$tmp/tiny.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 2, kv_heads: 1, ffn: 64, vocab: 4096}
data: {dir: $tmp/data, seq_len: 16, split: 0.1}
train: {steps: 6, micro_batch: 2, grad_accum: 2, seed: 3, eval_every: 3, eval_batches: 2, log_every: 2}
optim: {lr: 0.01, warmup: 1}
parallel: {pp: 2, dp: 2}
trace: {dir: "{run}/trace"}
export: {dir: "{run}/export", tokenizer: $tok}
YAML
cd "$tmp"   # runs/ is made in the working directory

# two runs of one job: two directories, `latest` at the second
"$BATON" run tiny.yaml --set train.steps=4 > a.out 2> a.err; rc_a=$?
"$BATON" run tiny.yaml > b.out 2> b.err; rc_b=$?
ids=$(ls runs/tiny | grep -v latest | sort)
n=$(wc -w <<<"$ids")
second=$(sed -n 's/^baton run tiny.yaml: run \([0-9-]*\) in .*/\1/p' b.out)
first=$(sed -n 's/^baton run tiny.yaml: run \([0-9-]*\) in .*/\1/p' a.out)
if [ "$rc_a" = 0 ] && [ "$rc_b" = 0 ] && [ "$n" = 2 ] && [ -n "$first" ] && [ "$first" != "$second" ] &&
   [ "$(readlink runs/tiny/latest)" = "$second" ]; then
    pass rundir_one_per_run
else
    fail rundir_one_per_run "rc $rc_a $rc_b, dirs '$ids', latest $(readlink runs/tiny/latest), runs '$first' '$second'"
    tail -5 a.err b.err
fi
A=runs/tiny/$first B=runs/tiny/$second
# each run's outputs in its own directory, none shared
ok=1
for d in "$A" "$B"; do
    for f in job.yaml run.json metrics.jsonl loss.png throughput.png export/config.json \
             export/model.safetensors export/tokenizer.json; do
        [ -s "$d/$f" ] || { ok=0; echo "missing $d/$f"; }
    done
    ls "$d"/tensorboard/events.out.tfevents.* >/dev/null 2>&1 || { ok=0; echo "no event file in $d"; }
    ls "$d"/trace/trace-*.bin >/dev/null 2>&1 || { ok=0; echo "no trace in $d"; }
done
[ "$(grep -c '"loss"' "$A/metrics.jsonl")" = 4 ] && [ "$(grep -c '"loss"' "$B/metrics.jsonl")" = 6 ] || ok=0
[ "$ok" = 1 ] && pass rundir_outputs_own || fail rundir_outputs_own "see above"

# the record: the resolved job (the override applied, {run} resolved) loads
# again; run.json has the command line, overrides, revision, hosts, layout
python3 - "$A" "$first" "$("$BATON" --version)" <<'PY' && pass rundir_record || fail rundir_record "see above"
import json, re, sys
d, rid, version = sys.argv[1], sys.argv[2], sys.argv[3]
r = json.load(open(d + "/run.json"))
assert r["run_id"] == rid, r
assert r["command"] == ["baton", "run", "tiny.yaml", "--set", "train.steps=4"], r["command"]
assert r["sets"] == ["train.steps=4"], r["sets"]
# the binary's own: "baton 0.1.0 (source revision 0123456789ab[-dirty])"
assert version == "baton %s (source revision %s)" % (r["release"], r["revision"]), (version, r)
assert re.fullmatch(r"[0-9a-f]{12}(-dirty)?|unknown", r["revision"]), r["revision"]
assert r["hosts"] == ["local"], r["hosts"]
L = r["layout"]
assert (L["tp"], L["pp"], L["dp"], L["processes"], L["microbatches"]) == (1, 2, 2, 4, 2), L
assert L["layers_per_stage"] == [1, 1], L
assert L["collectives"] == "host", L
job = open(d + "/job.yaml").read()
assert "  steps: 4\n" in job, job
assert '  dir: "%s/trace"\n' % d in job, job
PY
"$BATON" graph "$A/job.yaml" > g.out 2>&1 && grep -q 'tp=1 pp=2 dp=2' g.out \
    && pass rundir_job_reloads || fail rundir_job_reloads "$(head -3 g.out)"

# the header, progress and summary lines
if grep -q '^  model: random init, [0-9.]* [kM] parameters ([0-9]*), 2 layers, hidden 32, vocab 4096$' b.out &&
   grep -q '^  layout: 4 processes (tp=1 pp=2 dp=2), 1 virtual stage per rank, 1f1b, 2 microbatches of 2 per replica, ZeRO-1 off | transports: control tcp, pipeline tcp, data_parallel tcp, tensor_parallel tcp | collectives: host$' b.out &&
   grep -q '^  batch: 128 tokens per step (8 sequences of 16), 6 steps' b.out &&
   grep -q '^  MFU: [0-9.e-]* GFLOP per token (model/flops.h) against [0-9.]* GFLOP/s fp32, measured on this host now$' b.out; then
    pass rundir_header
else
    fail rundir_header "$(head -5 b.out)"
fi
prog='^step      [246]/6 | loss [0-9.]* | lr [0-9.e+-]* | gnorm [0-9.]* | [0-9.]* ms/step | [0-9]* tok/s | MFU [0-9.]*% | mem [0-9.]* MiB (rank [0-3]) | skipped 0 | ETA [0-9]*s$'
[ "$(grep -c "$prog" b.out)" = 3 ] && pass rundir_progress_line || fail rundir_progress_line "$(grep '^step' b.out)"
if grep -q "^done: 768 tokens in [0-9.]* s wall ([0-9.]* s of steps), [0-9]* tok/s, MFU [0-9.]*% | best val loss [0-9.]* (ppl [0-9.]*) at step [36]$" b.out &&
   grep -q '^  peak memory (resident) per rank: [0-9.]* MiB, [0-9.]* MiB, [0-9.]* MiB, [0-9.]* MiB$' b.out &&
   grep -q "^  metrics         $B/metrics.jsonl$" b.out &&
   grep -q "^  trace           $B/trace  (baton trace $B/trace --summary)$" b.out &&
   grep -q "^  export          $B/export  (baton generate --model $B/export --prompt TEXT)$" b.out; then
    pass rundir_summary
else
    fail rundir_summary "$(sed -n '/^done/,$p' b.out)"
fi
# best validation loss: the smallest of the evaluations
python3 - b.out <<'PY' && pass rundir_best_val || fail rundir_best_val "see above"
import re, sys
t = open(sys.argv[1]).read()
vals = [float(v) for v in re.findall(r"^eval  step \d+ \| val loss ([0-9.]+)", t, re.M)]
best = float(re.search(r"best val loss ([0-9.]+)", t).group(1))
assert len(vals) == 2 and best == min(vals), (vals, best)
PY
# a clean end logs nothing above info (no "link closed" warnings either)
grep -qE '^baton(\[[a-z0-9]*\])? (warn|error)' a.err b.err \
    && fail rundir_clean_stop_quiet_logs "$(cat b.err | head -5)" || pass rundir_clean_stop_quiet_logs
# --quiet: not a single log line, however many processes
"$BATON" run tiny.yaml --quiet > q.out 2> q.err
[ $? = 0 ] && [ ! -s q.err ] && ! grep -q '^step ' q.out && pass rundir_quiet_silent \
    || fail rundir_quiet_silent "$(head -3 q.err)"

# baton trace: one run's folder works; two runs in one folder are refused,
# naming both
"$BATON" trace "$B/trace" --summary > t1.out 2>&1 && grep -q "^trace $B/trace: 5 files" t1.out \
    && pass rundir_trace_one_run || fail rundir_trace_one_run "$(head -3 t1.out)"
"$BATON" run tiny.yaml --quiet --set train.steps=2 --set trace.dir="$tmp/shared" > /dev/null 2>&1
"$BATON" run tiny.yaml --quiet --set train.steps=2 --set trace.dir="$tmp/shared" > /dev/null 2>&1
r1=$(ls runs/tiny | grep -v latest | sort | tail -2 | head -1); r2=$(readlink runs/tiny/latest)
"$BATON" trace "$tmp/shared" --summary > t2.out 2>&1; rc=$?
if [ "$rc" = 1 ] && grep -q "holds the traces of more than one run: .*$r1 (5 files).*$r2 (5 files)\|holds the traces of more than one run: .*$r2 (5 files).*$r1 (5 files)" t2.out &&
   [ ! -e "$tmp/shared/trace.json" ]; then
    pass rundir_trace_refuses_two_runs
else
    fail rundir_trace_refuses_two_runs "rc $rc: $(cat t2.out)"
fi
"$BATON" trace "$tmp/shared" > t3.out 2>&1 && fail rundir_trace_json_refuses "merged" || pass rundir_trace_json_refuses

# train, then use it: generate from runs/<job>/latest/export
"$BATON" generate --model runs/tiny/latest/export --prompt "It is a truth" --max-new 4 > gen.out 2>&1 \
    && [ -s gen.out ] && pass rundir_generate_from_latest || fail rundir_generate_from_latest "$(tail -2 gen.out)"

# the runs root: the job field `runs`
"$BATON" run tiny.yaml --quiet --set train.steps=1 --set runs="$tmp/elsewhere" > /dev/null 2>&1
[ -L "$tmp/elsewhere/tiny/latest" ] && [ -s "$tmp/elsewhere/tiny/latest/run.json" ] \
    && pass rundir_runs_field || fail rundir_runs_field "$(ls -R "$tmp/elsewhere" 2>&1 | head)"
