#!/usr/bin/env bash
# tools/fuzz_run.sh RUNS TARGET...   (make fuzz-run calls it)
# Runs each libFuzzer target of build/fuzz, one after the other, for RUNS
# executions from a copy of its committed seeds (tests/fuzz/corpus_NAME for
# fuzz_NAME), on one core (-jobs=1), niced, with UBSan made fatal and a
# 10 s per-input timeout (a quadratic path shows up as a timeout). Each
# target's log, grown corpus and any crash artifact stay in
# build/fuzz/run/TARGET/; one summary line per target goes to
# build/fuzz/run/summary.txt: executions, wall time, final cov/ft as
# libFuzzer prints them, corpus size, result.
set -u
runs=$1; shift
root=$PWD
out=$root/build/fuzz/run
mkdir -p "$out"
# -max_len: above the largest committed seed of the target
opts_for() {
    case $1 in
        fuzz_xport_handshake) echo "-max_len=256" ;;
        fuzz_tokenizer) echo "-max_len=8192" ;;
        fuzz_wire) echo "-max_len=4096 -rss_limit_mb=1024" ;;
        *) echo "-max_len=4096" ;;
    esac
}
status=0
for t in "$@"; do
    work=$out/$t
    seeds=$root/tests/fuzz/corpus_${t#fuzz_}
    rm -rf "$work"; mkdir -p "$work/corpus" "$work/art"
    cp "$seeds"/* "$work/corpus/"
    n_seeds=$(ls "$seeds" | wc -l)
    t0=$(date +%s.%N)
    # shellcheck disable=SC2046
    (cd "$work" && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 nice -n 10 \
        "$root/build/fuzz/$t" $(opts_for "$t") -runs="$runs" -jobs=1 -timeout=10 -close_fd_mask=2 \
        -print_final_stats=1 -artifact_prefix=art/ corpus >driver.log 2>&1)
    t1=$(date +%s.%N)
    log=$work/fuzz-0.log
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$done_line")
    ft=$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<<"$done_line")
    files=$(ls "$work/corpus" | wc -l)
    bytes=$(du -sb "$work/corpus" | cut -f1)
    if [ -n "$(ls "$work/art")" ] || ! grep -q "exited with exit code 0" "$work/driver.log"; then
        result="FINDING: $(ls "$work/art" | tr '\n' ' ')(see $log)"; status=1
    else
        result="no crash, leak, timeout or sanitizer report"
    fi
    line=$(printf '%s %s executions %.0f s cov %s ft %s corpus %s files %s bytes (from %s seeds) options "%s" %s' \
        "$t" "${execs:-?}" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "${cov:-?}" "${ft:-?}" "$files" "$bytes" \
        "$n_seeds" "$(opts_for "$t")" "$result")
    echo "$line" | tee -a "$out/summary.txt"
done
exit $status
