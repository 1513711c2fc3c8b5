#!/usr/bin/env bash
# The default job of `make run` (README "The default job"): the Austen
# corpus, token shards, then jobs/austen_main.yaml, a 14.2 M-parameter Llama
# trained as four local processes (PP=2 x DP=2, 1F1B, ZeRO-1) for a few
# minutes, then the pipeline summary of its trace.
#
#   tools/run-default-job.sh [BUILD]        (default: build)
#
# Leaves runs/austen_main/{metrics.jsonl, loss.png, trace/}. The shards are
# (re)made when missing or made with another tokenizer; the corpus is fetched
# only when missing (tools/fetch_austen.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${1:-build}
BATON=$BUILD/baton
JOB=jobs/austen_main.yaml
RUN=runs/austen_main
TOK=tests/fixtures/tok/gpt2   # byte-level BPE, 4096 ids, trained on the Austen train split
SHARDS=data/austen_shards

# tok_hash() of $TOK as the shard index records it: shards made with another
# tokenizer are made again.
TOK_XXH64=9c7ab3bf37f925bf
shards_ok() {
    local dir=$SHARDS/$1
    [ -s "$dir/index.json" ] && grep -q "\"tokenizer_xxh64\": \"$TOK_XXH64\"" "$dir/index.json" &&
        "$BATON" data info "$dir" >/dev/null 2>&1
}
if ! shards_ok train || ! shards_ok val; then
    echo "== Austen corpus (tools/fetch_austen.sh)"
    tools/fetch_austen.sh data
    for split in train val; do
        echo "== token shards: $SHARDS/$split ($TOK)"
        rm -rf "$SHARDS/$split"
        mkdir -p "$SHARDS"
        "$BATON" data prepare --tokenizer "$TOK" --input "data/austen/$split.txt" --output "$SHARDS/$split"
    done
else
    echo "== token shards: $SHARDS/{train,val} present (tokenizer $TOK)"
fi

echo "== training: $BATON run $JOB"
rm -rf "$RUN/trace"
start=$(date +%s)
"$BATON" run "$JOB"
echo "== wall time $(( $(date +%s) - start )) s"
echo "== pipeline: $BATON trace $RUN/trace --summary (pipeline part)"
"$BATON" trace "$RUN/trace" --summary | sed -n '/^pipeline stages/,$p'
echo "== results: $RUN/metrics.jsonl, $RUN/loss.png, $RUN/trace/ (\`$BATON trace $RUN/trace\` writes a Perfetto JSON)"
