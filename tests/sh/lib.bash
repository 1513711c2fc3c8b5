# Sourced by every tests/sh/test_*.sh (not a test itself: tests/run.sh runs
# *.sh): the binary under test and the PASS/FAIL lines tests/run.sh counts.
BATON=${BATON:-build/baton}
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1${2:+: $2}"; }
# field NAME TEXT: the first number after "NAME": in TEXT (JSON output)
field() { sed -n "s/.*\"$1\": *\([-0-9.eE+]*\).*/\1/p" <<<"$2" | head -1; }
