#!/usr/bin/env bash
# One device call (issue 13, part 3): the llama134m row before/after, then the
# device checks of the ops and the model. Binaries from a git archive of
# c6d074b in build/h13 (old: 0978d88's, today's baseline, in build/h13/old).
set -u
H=build/h13
S=/tmp/h13s
mkdir -p "$S"
sum() { echo "$*" | tee -a "$OUT/summary.txt"; }
t() { echo $SECONDS; }
tar -C $H -xJf $H/devpack.tar.xz && ln -sfn ../devpack $H/old/devpack
sum "start: $(date -u '+%F %T UTC'); $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader)"
# A: the old binary's baton run alone (no torch: PYTHON=false)
a=$(t); OUT=$S/old BUILD=$H/old ROWS=llama134m PYTHON=false BUDGET=90 bench/gpu_bench.sh > $S/old.out 2>&1
sum "old baton-only: rc=$? $(( $(t) - a )) s"
# B: the new binaries, the whole row (peak, baton, torch)
a=$(t); OUT=$S/new BUILD=$H ROWS=llama134m BUDGET=260 bench/gpu_bench.sh > $S/new.out 2>&1
sum "new full row: rc=$? $(( $(t) - a )) s"
# C: the new baton run again (spread)
a=$(t); OUT=$S/new2 BUILD=$H ROWS=llama134m PYTHON=false BUDGET=90 bench/gpu_bench.sh > $S/new2.out 2>&1
sum "new baton-only again: rc=$? $(( $(t) - a )) s"
cp $S/new/table.txt $OUT/bench_table.txt
cp $S/new/versions.txt $OUT/bench_versions.txt
cat $S/new/results.jsonl $S/old/results.jsonl $S/new2/results.jsonl > $OUT/bench_results.jsonl
{ for r in old new new2; do echo "==== $r"; cat $S/$r.out; echo "---- $r metrics"; cat $S/$r/metrics.jsonl; done
  echo "==== new logs"; cat $S/new/logs.txt; } > $OUT/bench_logs.txt
# D: model check, then E: the ops (device-check.sh: full table + memcheck --quick)
lim=$(( 470 - SECONDS )); [ $lim -gt 200 ] && lim=200; [ $lim -lt 30 ] && lim=30
a=$(t); BUILD=$H OUT=$S/model timeout $lim tools/device-model-check.sh > $OUT/model.txt 2>&1
sum "model check: rc=$? $(( $(t) - a )) s; $(grep -c PASS $OUT/model.txt) PASS, $(grep -c FAIL $OUT/model.txt) FAIL"
lim=$(( 575 - SECONDS )); [ $lim -lt 20 ] && lim=20
a=$(t); BUILD=$H OUT=$S/ops timeout $lim tools/device-check.sh > $OUT/ops.txt 2>&1
sum "ops check: rc=$? $(( $(t) - a )) s; $(grep -E 'rows:' $OUT/ops.txt | tr '\n' ' ')"
sum "old: $(grep -h 'llama134m baton' $S/old.out)"
sum "new: $(grep -h 'llama134m baton\|llama134m torch' $S/new.out)"
sum "new2: $(grep -h 'llama134m baton' $S/new2.out)"
cat $OUT/bench_table.txt
