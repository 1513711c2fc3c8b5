#!/usr/bin/env bash
# Runs every test binary ($BUILD/tests/test_*) and every shell test
# (tests/sh/*.sh), counts the PASS/FAIL lines they print, and ends with the
# line "N passed, N failed". A binary that crashes, times out or exits
# non-zero without printing a FAIL line counts as one failure.
# Usage: tests/run.sh [FILTER]   (FILTER: substring of the test file name)
set -u
BUILD=${BUILD:-build}
FILTER=${1:-}
TIMEOUT=${TEST_TIMEOUT:-600}
export BATON=$PWD/$BUILD/baton BUILD
# sanitizer builds: library leaks we cannot fix are listed (with why) in tests/lsan.supp
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
pass=0; fail=0; failed_names=()
logdir=$BUILD/test-logs; mkdir -p "$logdir"
# Shell tests first: tests/sh/test_bubble.sh measures per-op CPU times of a
# pipeline, and on a shared VM a minute of full load from the other tests
# skews them (one process's ops came out 25% slower, every time).
for t in tests/sh/*.sh "$BUILD"/tests/test_*; do
    [ -e "$t" ] || continue
    name=$(basename "$t"); name=${name%.sh}
    [ -n "$FILTER" ] && [[ "$name" != *"$FILTER"* ]] && continue
    log=$logdir/$name.log
    start=$(date +%s)
    if [[ "$t" == *.sh ]]; then timeout -k 10 "$TIMEOUT" bash "$t" >"$log" 2>&1; rc=$?
    else timeout -k 10 "$TIMEOUT" "$t" >"$log" 2>&1; rc=$?; fi
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "FAIL $name (exit $rc)" >>"$log"; fi
    pass=$((pass + p)); fail=$((fail + f))
    printf '%-28s %3d passed %3d failed  %4ds\n' "$name" "$p" "$f" $(( $(date +%s) - start ))
    if [ "$f" -ne 0 ]; then
        failed_names+=("$name"); grep -E '^FAIL |failed|error|PANIC|ERROR' "$log" | head -20 | sed 's/^/    /'
    fi
done
[ ${#failed_names[@]} -ne 0 ] && echo "failing: ${failed_names[*]} (logs in $logdir)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
