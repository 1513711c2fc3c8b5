#!/usr/bin/env bash
# `baton data prepare` / `baton data info` from the command line: documents
# and EOS, tokenizer given as a directory or a file, shard validation errors
# naming the file, usage errors. Needs the Austen corpus (fetched here; a
# failed fetch is a FAIL, not a skip).
set -u
. "$(dirname "$0")/lib.bash"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

if ! tools/fetch_austen.sh; then fail data_fetch_corpus "tools/fetch_austen.sh failed"; exit 1; fi
pass data_fetch_corpus

# two documents, tokenizer as a directory: EOS after each; the index lists both
if $BATON data prepare --tokenizer tests/fixtures/tok/gpt2 --input data/austen/val.txt \
    tests/fixtures/tok/sample.txt --output "$TMP/a" --shard-tokens 50000 >"$TMP/a.out" 2>"$TMP/a.err" &&
   $BATON data info "$TMP/a" >"$TMP/a.info"; then
    val=$(sed -n '/"val"/,/}/s/.*"tokens": *\([0-9]*\).*/\1/p' tests/fixtures/tok/gpt2/corpus.json)
    smp=$(( $(stat -c %s tests/fixtures/tok/gpt2/sample.ids) / 2 ))
    want=$(( val + 1 + smp + 1 ))
    got=$(sed -n 's/.*: \([0-9]*\) tokens, vocab.*/\1/p' "$TMP/a.info")
    nshards=$(ls "$TMP/a"/shard_*.bin | wc -l)
    if [ "$got" = "$want" ] && [ "$nshards" -eq $(( (want + 49999) / 50000 )) ] &&
       grep -q '"file": "tests/fixtures/tok/sample.txt"' "$TMP/a/index.json" &&
       grep -q '"eos": 0' "$TMP/a/index.json"; then pass data_prepare_documents
    else fail data_prepare_documents "tokens $got want $want (HF val + EOS + HF sample + EOS), shards $nshards"; fi
else fail data_prepare_documents "$(cat "$TMP/a.err")"; fi

# tokenizer.json path accepted; same tokens as the directory form
if $BATON data prepare --tokenizer tests/fixtures/tok/gpt2/tokenizer.json --input data/austen/val.txt \
    --input tests/fixtures/tok/sample.txt --output "$TMP/b" --shard-tokens 50000 --quiet >/dev/null 2>&1 &&
   cmp -s "$TMP/a/shard_00000.bin" "$TMP/b/shard_00000.bin" &&
   [ "$(cat "$TMP"/a/shard_*.bin | md5sum)" = "$(cat "$TMP"/b/shard_*.bin | md5sum)" ]; then
    pass data_prepare_tokenizer_file
else fail data_prepare_tokenizer_file; fi

# progress lines for an input longer than one chunk
$BATON data prepare --tokenizer tests/fixtures/tok/qwen2 --input data/austen/train.txt \
    --output "$TMP/c" --chunk-bytes 1000000 >/dev/null 2>"$TMP/c.err"
if grep -q '100.0%' "$TMP/c.err"; then pass data_prepare_progress; else fail data_prepare_progress; fi

# corruption is reported naming the file and the problem
cp -r "$TMP/a" "$TMP/t"; truncate -s 1000 "$TMP/t/shard_00001.bin"
if ! $BATON data info "$TMP/t" >/dev/null 2>"$TMP/t.err" && grep -q 'shard_00001.bin: truncated' "$TMP/t.err"
then pass data_info_truncated; else fail data_info_truncated "$(cat "$TMP/t.err")"; fi
cp -r "$TMP/a" "$TMP/f"; printf '\x01' | dd of="$TMP/f/shard_00002.bin" bs=1 seek=200 conv=notrunc 2>/dev/null
if ! $BATON data info "$TMP/f" >/dev/null 2>"$TMP/f.err" && grep -q 'shard_00002.bin: checksum mismatch' "$TMP/f.err"
then pass data_info_checksum; else fail data_info_checksum "$(cat "$TMP/f.err")"; fi
cp -r "$TMP/a" "$TMP/m"; printf 'X' | dd of="$TMP/m/shard_00000.bin" bs=1 seek=0 conv=notrunc 2>/dev/null
if ! $BATON data info "$TMP/m" >/dev/null 2>"$TMP/m.err" && grep -q 'shard_00000.bin: not a token shard (bad magic)' "$TMP/m.err"
then pass data_info_magic; else fail data_info_magic "$(cat "$TMP/m.err")"; fi

# bad inputs: unsupported tokenizer, missing input, usage
printf '{"normalizer":{"type":"NFKC"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}' >"$TMP/tok.json"
$BATON data prepare --tokenizer "$TMP/tok.json" --input data/austen/val.txt --output "$TMP/x" >/dev/null 2>"$TMP/x.err"
rc=$?
if [ $rc -eq 1 ] && grep -q "normalizer 'NFKC' is not supported" "$TMP/x.err" && [ ! -e "$TMP/x/index.json" ]
then pass data_prepare_bad_tokenizer; else fail data_prepare_bad_tokenizer "rc $rc"; fi
$BATON data prepare --tokenizer tests/fixtures/tok/gpt2 --input "$TMP/nope.txt" --output "$TMP/y" >/dev/null 2>"$TMP/y.err"
rc=$?
if [ $rc -eq 1 ] && grep -q 'nope.txt: cannot open input' "$TMP/y.err" && [ ! -e "$TMP/y/index.json" ]
then pass data_prepare_missing_input; else fail data_prepare_missing_input "rc $rc"; fi
$BATON data prepare --input x >/dev/null 2>&1; rc1=$?
$BATON data frobnicate >/dev/null 2>&1; rc2=$?
$BATON data prepare --tokenizer a --input b --output c --shard-tokens 0 >/dev/null 2>&1; rc3=$?
if [ $rc1 -eq 2 ] && [ $rc2 -eq 2 ] && [ $rc3 -eq 2 ]; then pass data_usage_errors
else fail data_usage_errors "rc $rc1 $rc2 $rc3"; fi

# rerun into the same directory: stale shards of the longer run go; a failed
# run leaves no index behind (the directory no longer opens)
$BATON data prepare --tokenizer tests/fixtures/tok/gpt2 --input tests/fixtures/tok/sample.txt \
    --output "$TMP/a" --quiet >/dev/null 2>&1
n_after=$(ls "$TMP/a"/shard_*.bin | wc -l)
$BATON data info "$TMP/a" >/dev/null 2>&1; info_rc=$?
$BATON data prepare --tokenizer tests/fixtures/tok/gpt2 --input "$TMP/nope.txt" --output "$TMP/a" >/dev/null 2>&1
$BATON data info "$TMP/a" >/dev/null 2>"$TMP/r.err"; gone_rc=$?
if [ "$n_after" -eq 1 ] && [ $info_rc -eq 0 ] && [ $gone_rc -eq 1 ] && grep -q 'no shard index' "$TMP/r.err"
then pass data_prepare_rerun; else fail data_prepare_rerun "shards $n_after, rc $info_rc $gone_rc"; fi

# a GGUF's own tokenizer (rebuilt from its metadata) gives the token ids of
# its Hugging Face twin's tokenizer.json: shard payloads identical past the
# 64-byte header (which records each tokenizer's hash)
G=tests/fixtures/gguf_model
$BATON data prepare --tokenizer $G/tiny.gguf --input $G/text.txt --output "$TMP/gg" --quiet >/dev/null 2>"$TMP/gg.err"; rc1=$?
$BATON data prepare --tokenizer $G/hf --input $G/text.txt --output "$TMP/gh" --quiet >/dev/null 2>&1; rc2=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ -s "$TMP/gg/shard_00000.bin" ] &&
    cmp -s <(tail -c +65 "$TMP/gg/shard_00000.bin") <(tail -c +65 "$TMP/gh/shard_00000.bin"); then
    pass data_prepare_gguf_tokenizer
else fail data_prepare_gguf_tokenizer "rc $rc1 $rc2: $(cat "$TMP/gg.err")"; fi
