# Sourced by every tests/sh/test_*.sh (not a test itself: tests/run.sh runs
# *.sh): the binary under test and the PASS/FAIL lines tests/run.sh counts.
BATON=${BATON:-build/baton}
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1${2:+: $2}"; }
# field NAME TEXT: the first number after "NAME": in TEXT (JSON output)
field() { sed -n "s/.*\"$1\": *\([-0-9.eE+]*\).*/\1/p" <<<"$2" | head -1; }
# rel_close A B TOL: |A - B| <= TOL |B| (false when either is empty)
rel_close() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d;
    m = b < 0 ? -b : b; exit !(a != "" && b != "" && d <= t * m) }'; }
# same_eval NAME GOT WANT: PASS when two `baton eval --json` lines (or an
# expected.json) have the same token count and loss and ppl within 1e-5
same_eval() {
    if [ "$(field tokens "$2")" = "$(field tokens "$3")" ] && rel_close "$(field loss "$2")" "$(field loss "$3")" 1e-5 \
        && rel_close "$(field ppl "$2")" "$(field ppl "$3")" 1e-5; then pass "$1"; else fail "$1" "got $2 want $3"; fi
}
# lcg_tokens SEED N PERIOD EVERY VOCAB: N token ids on one line, a ramp
# 0..PERIOD-1 repeated, where a linear congruential draw picks about one in
# EVERY to be a pseudo-random id below VOCAB instead: learnable, and the same
# on every machine
lcg_tokens() {
    awk -v x="$1" -v n="$2" -v p="$3" -v e="$4" -v v="$5" 'BEGIN { for (i = 0; i < n; i++) {
        x = (x * 1103515245 + 12345) % 2147483648; t = i % p; if (x % e == 0) t = int(x / 65536) % v
        printf "%d ", t } print "" }'
}
# cap_vm: in a subshell, caps the address space at ~4 GB so that a command
# that would allocate gigabytes fails fast instead of filling the machine;
# not under a sanitizer build (ASan reserves terabytes of address space).
cap_vm() { [[ "${BUILD:-build}" == *san-* ]] || ulimit -v 4000000; }
# scaled N: N times BATON_TEST_TIME_SCALE (tests/run.sh sets it for slow
# sanitizer builds; 1 when unset), rounded up: for bounds on elapsed time
scaled() { awk -v n="$1" -v k="${BATON_TEST_TIME_SCALE:-1}" \
    'BEGIN { k += 0; if (!(k >= 1)) k = 1; v = n * k; r = int(v); if (r < v) r++; print r }'; }
# borrow_tokenizer SRC DIR: DIR holds the HF model SRC's config.json and
# model.safetensors (links) beside the llama fixture's byte-level
# tokenizer.json (the fixtures all have its 256-id vocabulary), so that
# generate and eval --text run on a fixture that has no tokenizer of its own
borrow_tokenizer() {
    mkdir -p "$2"
    ln -s "$PWD/$1/config.json" "$PWD/$1/model.safetensors" "$2"/
    ln -s "$PWD"/tests/fixtures/llama/tokenizer.json "$2"/
}
