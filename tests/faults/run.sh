#!/usr/bin/env bash
# `make test-faults`: every tests/faults/test_*.sh (network-fault campaigns
# between namespace hosts; root, minutes), their PASS/FAIL lines counted as
# tests/run.sh counts them, ending with "N passed, N failed"; exit 1 on any
# failure, or when a campaign ends non-zero without a FAIL line.
set -u
BUILD=${BUILD:-build}
export BATON=$PWD/$BUILD/baton BUILD
logdir=$BUILD/test-logs; mkdir -p "$logdir"
pass=0; fail=0
for t in tests/faults/test_*.sh; do
    name=$(basename "$t" .sh)
    start=$(date +%s)
    timeout "${TEST_TIMEOUT:-1200}" bash "$t" > "$logdir/$name.log" 2>&1; rc=$?
    cat "$logdir/$name.log"
    p=$(grep -c '^PASS ' "$logdir/$name.log"); f=$(grep -c '^FAIL ' "$logdir/$name.log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "FAIL $name: exited $rc"; fi
    pass=$((pass + p)); fail=$((fail + f))
    echo "$name: $p passed, $f failed in $(( $(date +%s) - start )) s"
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
