#!/usr/bin/env bash
# The docs match the program: every baton command of README.md and docs/ is
# a synopsis whose options exist, a fixture command that runs (and prints
# the numbers shown), or one a test or tools/ script runs (tests/sh/test_docs.py).
# The README's first two commands are `make run` and `make test`.
set -u
. "$(dirname "$0")/lib.bash"
out=$(python3 tests/sh/test_docs.py "$BATON" 2>&1); rc=$?
echo "$out"
[ "$rc" = 0 ] && pass docs_commands || fail docs_commands "$(grep -c '^BAD' <<<"$out") not accounted for"
first=$(grep -m2 -E '^    make ' README.md | awk '{print $1, $2}' | tr '\n' ' ')
[ "$first" = "make run make test " ] && pass docs_readme_setup || fail docs_readme_setup "'$first'"
