#!/usr/bin/env bash
# Runs every test binary ($BUILD/tests/test_*) and every shell test
# (tests/sh/*.sh), counts the PASS/FAIL lines they print, and ends with the
# line "N passed, N failed". A binary that crashes, times out or exits
# non-zero without printing a FAIL line counts as one failure. Cases that
# cannot run in this build print SKIP (tests/test.h TEST_SKIP); they are
# listed before that line, counted in neither number.
# Usage: tests/run.sh [FILTER]   (FILTER: substring of the test file name)
#
# Sanitizer builds (SAN, as given to make): every process of a test, the
# workers and drivers a shell test starts included, writes its sanitizer
# report to $logdir/NAME.san/report.PID (log_path), and each such file counts
# as a failure of the test, with the report appended to the test's log. So a
# report fails the test even where the test never looks at the process's
# exit status or output. Under SAN=thread (ThreadSanitizer) also:
#   UCX_MEM_EVENTS=no  UCX's memory-event hooks are patched into glibc's
#       madvise, which glibc calls as a thread exits, after TSan has let go
#       of the thread; the hook's rwlock then crashes TSan (SIGSEGV in every
#       binary that links UCX). UCX reads the setting once, when libucs is
#       loaded, so it must be in the environment before the process starts.
#   TSAN_OPTIONS  suppressions=tests/tsan.supp (third-party reports only).
#   BATON_TEST_TIME_SCALE=10  how much slower the build is than the plain
#       one: tests multiply their elapsed-time bounds by it.
# Values already in the environment win (TSAN_OPTIONS given by the caller
# are appended, so their flags override these).
set -u
BUILD=${BUILD:-build}
SAN=${SAN:-}
FILTER=${1:-}
TIMEOUT=${TEST_TIMEOUT:-600}
export BATON=$PWD/$BUILD/baton BUILD
# sanitizer builds: library leaks we cannot fix are listed (with why) in tests/lsan.supp.
# print_suppressions=0: LeakSanitizer otherwise writes its table of the
# suppressions it used into the report file even when every leak was
# suppressed, and a report file fails the test.
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
pass=0; fail=0; failed_names=(); skipped=()
logdir=$BUILD/test-logs; mkdir -p "$logdir"
user_tsan=${TSAN_OPTIONS:-} user_asan=${ASAN_OPTIONS:-} user_ubsan=${UBSAN_OPTIONS:-}
case ",$SAN," in *,thread,*)
    export UCX_MEM_EVENTS=${UCX_MEM_EVENTS:-no}
    export BATON_TEST_TIME_SCALE=${BATON_TEST_TIME_SCALE:-10}
    tsan_base="suppressions='$PWD/tests/tsan.supp'"
esac
# san_env DIR: point every sanitizer's reports of the next test into DIR
# (quoted: sanitizer options split at commas, as in build/san-address,undefined)
san_env() {
    export TSAN_OPTIONS="${tsan_base:-} log_path='$1/report' $user_tsan"
    export ASAN_OPTIONS="log_path='$1/report' $user_asan"
    export UBSAN_OPTIONS="log_path='$1/report' $user_ubsan"
}
# Shell tests first: tests/sh/test_bubble.sh measures per-op CPU times of a
# pipeline, and on a shared VM a minute of full load from the other tests
# skews them (one process's ops came out 25% slower, every time).
for t in tests/sh/*.sh "$BUILD"/tests/test_*; do
    [ -e "$t" ] || continue
    name=$(basename "$t"); name=${name%.sh}
    [ -n "$FILTER" ] && [[ "$name" != *"$FILTER"* ]] && continue
    # a shell test's log keeps its .sh: test_moe, test_flops and test_handoff
    # are both a binary and a script, and one log would overwrite the other
    log=$logdir/$name.log; [[ "$t" == *.sh ]] && log=$logdir/$name.sh.log
    start=$(date +%s)
    if [ -n "$SAN" ]; then sandir=$logdir/$name.san; rm -rf "$sandir"; mkdir -p "$sandir"; san_env "$PWD/$sandir"; fi
    if [[ "$t" == *.sh ]]; then timeout -k 10 "$TIMEOUT" bash "$t" >"$log" 2>&1; rc=$?
    else timeout -k 10 "$TIMEOUT" "$t" >"$log" 2>&1; rc=$?; fi
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log")
    while read -r _ c _; do skipped+=("$name:$c"); done < <(grep '^SKIP ' "$log")
    if [ -n "$SAN" ]; then
        for r in "$sandir"/report.*; do
            [ -e "$r" ] || continue
            cat "$r" >>"$log"
            echo "FAIL $name (sanitizer report from pid ${r##*.}: $r)" >>"$log"; f=$((f + 1))
        done
        rmdir "$sandir" 2>/dev/null
    fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "FAIL $name (exit $rc)" >>"$log"; fi
    pass=$((pass + p)); fail=$((fail + f))
    printf '%-28s %3d passed %3d failed  %4ds\n' "$name" "$p" "$f" $(( $(date +%s) - start ))
    if [ "$f" -ne 0 ]; then
        failed_names+=("$name"); grep -E '^FAIL |failed|error|PANIC|ERROR|^SUMMARY: ' "$log" | head -20 | sed 's/^/    /'
    fi
done
[ ${#skipped[@]} -ne 0 ] && echo "skipped in this build: ${skipped[*]}"
[ ${#failed_names[@]} -ne 0 ] && echo "failing: ${failed_names[*]} (logs in $logdir)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
