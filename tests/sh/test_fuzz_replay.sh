#!/usr/bin/env bash
# Every fuzz target (tests/fuzz/fuzz_X.c), built with the ordinary compiler
# against tests/fuzz/replay_main.c, runs over its committed seed corpus
# tests/fuzz/corpus_X, which also holds the inputs of past findings: the
# targets abort on a violated property, so this is the fuzzers' regression
# run in make test, without libFuzzer (under SAN=... with the sanitizers).
set -u
. "$(dirname "$0")/lib.bash"
BUILD=${BUILD:-build}
n=0
for src in tests/fuzz/fuzz_*.c; do
    t=$(basename "$src" .c); name=${t#fuzz_}
    bin=$BUILD/fuzz-replay/$t corpus=tests/fuzz/corpus_$name
    if [ ! -x "$bin" ]; then fail "fuzz_replay_$name" "$bin not built"; continue; fi
    if [ -z "$(ls "$corpus" 2>/dev/null)" ]; then fail "fuzz_replay_$name" "no seeds in $corpus"; continue; fi
    out=$("$bin" "$corpus" 2>&1); rc=$?
    if [ $rc -eq 0 ]; then pass "fuzz_replay_$name ($(sed -n 's/^replayed \([0-9]*\).*/\1/p' <<<"$out") inputs)"
    else fail "fuzz_replay_$name" "rc $rc: $(tail -5 <<<"$out")"; fi
    n=$((n + 1))
done
[ $n -ge 8 ] && pass fuzz_replay_all_targets || fail fuzz_replay_all_targets "only $n targets"
