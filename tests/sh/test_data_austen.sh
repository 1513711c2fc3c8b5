#!/usr/bin/env bash
# The Austen corpus: tools/fetch_austen.sh + tools/extract_austen.py give the
# six novels with the line counts of janeaustenr 1.0.0 (as tidytext's
# austen_books() reports them: 12624 13030 15349 16235 7856 8328), the
# documented 90/10 split, and a clear error (not a traceback) on a damaged
# package. A failed download is a FAIL.
set -u
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
. "$(dirname "$0")/lib.bash"

if ! tools/fetch_austen.sh; then fail austen_fetch "tools/fetch_austen.sh failed"; exit 1; fi
pass austen_fetch

books=(sensesensibility prideprejudice mansfieldpark emma northangerabbey persuasion)
lines=(12624 13030 15349 16235 7856 8328)
titles=("SENSE AND SENSIBILITY" "PRIDE AND PREJUDICE" "MANSFIELD PARK" "EMMA" "NORTHANGER ABBEY" "Persuasion")
bad=""; train_want=0; val_want=0
for i in "${!books[@]}"; do
    f=data/austen/${books[$i]}.txt
    n=$(wc -l <"$f")
    [ "$n" -eq "${lines[$i]}" ] || bad="$bad ${books[$i]}:$n lines"
    [ "$(head -n1 "$f")" = "${titles[$i]}" ] || bad="$bad ${books[$i]}:title"
    cut=$(( n * 9 / 10 ))
    train_want=$(( train_want + cut )); val_want=$(( val_want + n - cut ))
done
if [ -z "$bad" ]; then pass austen_books; else fail austen_books "$bad"; fi

# train/val: per-book parts separated by one empty line (5 separators each)
tn=$(wc -l <data/austen/train.txt); vn=$(wc -l <data/austen/val.txt)
if [ "$tn" -eq $(( train_want + 5 )) ] && [ "$vn" -eq $(( val_want + 5 )) ] &&
   [ "$(head -n1 data/austen/train.txt)" = "SENSE AND SENSIBILITY" ] &&
   [ "$(sed -n "$(( 12624 - 12624 * 9 / 10 ))p" data/austen/val.txt)" = "$(tail -n1 data/austen/sensesensibility.txt)" ]
then pass austen_split; else fail austen_split "train $tn (want $(( train_want + 5 ))), val $vn (want $(( val_want + 5 )))"; fi

# damaged packages: a clear error naming the problem, exit 1
pkg=data/raw/pkg/usr/lib/R/site-library/janeaustenr
mkdir -p "$TMP/trunc/data" "$TMP/flip/data"
cp "$pkg/data/Rdata.rdx" "$TMP/trunc/data/"; head -c 300000 "$pkg/data/Rdata.rdb" >"$TMP/trunc/data/Rdata.rdb"
python3 tools/extract_austen.py "$TMP/trunc" "$TMP/o1" >/dev/null 2>"$TMP/e1"; rc1=$?
cp "$pkg/data/Rdata.rdb" "$TMP/flip/data/"; head -c 100 "$pkg/data/Rdata.rdx" >"$TMP/flip/data/Rdata.rdx"
python3 tools/extract_austen.py "$TMP/flip" "$TMP/o2" >/dev/null 2>"$TMP/e2"; rc2=$?
if [ $rc1 -eq 1 ] && grep -q 'truncated' "$TMP/e1" && [ $rc2 -eq 1 ] && grep -q 'Rdata.rdx: corrupt' "$TMP/e2" &&
   ! grep -q Traceback "$TMP/e1" "$TMP/e2"
then pass austen_damaged_package; else fail austen_damaged_package "rc $rc1 $rc2: $(cat "$TMP/e1" "$TMP/e2")"; fi
