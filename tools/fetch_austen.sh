#!/usr/bin/env bash
# Fetch the Jane Austen corpus from Debian's r-cran-janeaustenr and extract
# the six novels as plain text (tools/extract_austen.py; split in docs/DATA.md).
#
#   tools/fetch_austen.sh [DATADIR]     (default: data)
#
# Writes DATADIR/raw/ (the .deb and its unpacked tree) and DATADIR/austen/
# (<book>.txt, train.txt, val.txt). Does nothing when DATADIR/austen/val.txt
# already exists. Needs no root: `apt-get download` writes into the current
# directory. If the download fails it tries once more after `apt-get update`
# (root only), then an installed copy of the package. Exit 1 when no source of
# the package works: callers treat that as a failure, never as a skip.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# absolute: the download runs inside $RAW, and a relative DATADIR (as
# tools/run-default-job.sh passes) would then name the wrong place
DATADIR=$(mkdir -p "${1:-$ROOT/data}" && cd "${1:-$ROOT/data}" && pwd)
PKG=r-cran-janeaustenr
RAW=$DATADIR/raw
OUT=$DATADIR/austen

[ -s "$OUT/val.txt" ] && [ -s "$OUT/train.txt" ] && exit 0
mkdir -p "$RAW"
# concurrent callers (parallel test runs) wait for the first one
exec 9>"$RAW/.lock"
flock 9
[ -s "$OUT/val.txt" ] && [ -s "$OUT/train.txt" ] && exit 0

deb=$(ls "$RAW"/${PKG}_*.deb 2>/dev/null | head -n1 || true)
if [ -z "$deb" ]; then
    for cached in /var/cache/apt/archives/${PKG}_*.deb; do
        [ -e "$cached" ] && cp "$cached" "$RAW/" && break
    done
    deb=$(ls "$RAW"/${PKG}_*.deb 2>/dev/null | head -n1 || true)
fi
if [ -z "$deb" ]; then
    if ! (cd "$RAW" && apt-get download -q "$PKG" >/dev/null 2>"$RAW/apt.log"); then
        if [ "$(id -u)" -eq 0 ]; then
            echo "fetch_austen: apt-get download failed, running apt-get update and retrying" >&2
            apt-get update -qq >/dev/null 2>>"$RAW/apt.log" || true
            (cd "$RAW" && apt-get download -q "$PKG" >/dev/null 2>>"$RAW/apt.log") || true
        fi
    fi
    deb=$(ls "$RAW"/${PKG}_*.deb 2>/dev/null | head -n1 || true)
fi

if [ -n "$deb" ]; then
    rm -rf "$RAW/pkg"
    dpkg -x "$deb" "$RAW/pkg"
    src=$RAW/pkg
elif [ -d /usr/lib/R/site-library/janeaustenr/data ]; then
    echo "fetch_austen: download failed; using the installed $PKG" >&2
    src=/usr/lib/R/site-library/janeaustenr
else
    echo "fetch_austen: could not obtain $PKG (apt-get download failed: $(tail -n1 "$RAW/apt.log" 2>/dev/null))" >&2
    exit 1
fi
python3 "$ROOT/tools/extract_austen.py" "$src" "$OUT.tmp" >"$RAW/extract.log"
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
