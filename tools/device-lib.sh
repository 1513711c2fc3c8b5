# Sourced by tools/device-model-check.sh and tools/device-smollm2.sh (not run
# by itself): the pack's libraries on the library path, and the table rows.
if [ ! -d "${BUILD:-build}/devpack" ] && [ -f "${BUILD:-build}/devpack.tar.xz" ]; then
    tar -C "${BUILD:-build}" -xJf "${BUILD:-build}/devpack.tar.xz"
fi
LIB=$PWD/${BUILD:-build}/devpack/root/usr/lib/x86_64-linux-gnu
if [ -d "$LIB" ]; then
    export LD_LIBRARY_PATH="$LIB:$LIB/openblas-pthread:$LIB/ucx${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export UCX_MODULE_DIR=$LIB/ucx
fi
fails=0
# row WHAT GOT WANT TOL: one table row, PASS when |got - want| / |want| <= tol
# (absolute when want is 0); counts failures in $fails
row() {
    local r
    r=$(awk -v a="$2" -v b="$3" -v t="$4" 'BEGIN {
        if (a == "" || b == "" || tolower(a) ~ /nan|inf/ || a != a + 0) { print "nan FAIL"; exit }
        d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; r = m > 0 ? d / m : d;
        printf "%.3g %s\n", r, (r <= t ? "PASS" : "FAIL") }')
    printf '%-44s %-22s %-22s %-10s %-8s %s\n' "$1" "$2" "$3" "${r% *}" "$4" "${r#* }"
    [ "${r#* }" = PASS ] || fails=$((fails + 1))
}
# field NAME TEXT: the first number after "NAME": in TEXT (JSON output)
field() { sed -n "s/.*\"$1\": *\([-0-9.eE+]*\).*/\1/p" <<<"$2" | head -1; }
# sum TEXT: one line to stdout and to $OUT/summary.txt
sum() { echo "$*" | tee -a "$OUT/summary.txt"; }
# call_start: a device call's first summary lines: when, which GPU, which binaries
call_start() {
    sum "start: $(date -u '+%F %T UTC'); $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader)"
    sum "binaries: $(cat "${BUILD:-build}/BUILD_INFO")"
}
