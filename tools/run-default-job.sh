#!/usr/bin/env bash
# The default job of `make run` (README "The default job"): the Austen
# corpus, token shards, then jobs/austen_main.yaml, a 14.2 M-parameter Llama
# trained as four local processes (PP=2 x DP=2, 1F1B, ZeRO-1) for a few
# minutes, then the pipeline summary of its trace.
#
#   tools/run-default-job.sh [BUILD]        (default: build)
#
# Leaves runs/austen_main/{metrics.jsonl, loss.png, trace/}. The corpus is
# fetched only when missing (tools/fetch_austen.sh); the shards are made from
# it each time (under a second).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${1:-build}
BATON=$BUILD/baton
JOB=jobs/austen_main.yaml
RUN=runs/austen_main
TOK=tests/fixtures/tok/gpt2   # byte-level BPE, 4096 ids, trained on the Austen train split
SHARDS=data/austen_shards

# tok_hash() of $TOK as the shard index records it.
TOK_XXH64=9c7ab3bf37f925bf
shards_ok() {
    local dir=$SHARDS/$1
    [ -s "$dir/index.json" ] && grep -q "\"tokenizer_xxh64\": \"$TOK_XXH64\"" "$dir/index.json" &&
        "$BATON" data info "$dir" >/dev/null 2>&1
}
# The shards are made from the corpus every time (0.4 s each; the result is
# byte-identical to the committed data/austen_shards). Without the corpus
# (no network for apt-get download) the committed shards are used.
echo "== Austen corpus: data/austen (tools/fetch_austen.sh)"
if tools/fetch_austen.sh data; then
    for split in train val; do
        echo "== token shards: $SHARDS/$split ($TOK)"
        rm -rf "$SHARDS/$split.tmp"
        mkdir -p "$SHARDS"
        "$BATON" data prepare --quiet --tokenizer "$TOK" --input "data/austen/$split.txt" --output "$SHARDS/$split.tmp"
        rm -rf "$SHARDS/$split"
        mv "$SHARDS/$split.tmp" "$SHARDS/$split"
    done
elif shards_ok train && shards_ok val; then
    echo "run-default-job: the corpus could not be fetched; using the committed shards in $SHARDS" >&2
else
    echo "run-default-job: no Austen corpus and no valid shards in $SHARDS" >&2
    exit 1
fi

# quieter logs: the per-link "closed during stop" lines of a normal end are info
export BATON_LOG=${BATON_LOG:-warn}
echo "== training: $BATON run $JOB"
rm -rf "$RUN/trace"
start=$(date +%s)
"$BATON" run "$JOB"
echo "== wall time $(( $(date +%s) - start )) s"
echo "== pipeline: $BATON trace $RUN/trace --summary (pipeline part)"
"$BATON" trace "$RUN/trace" --summary | sed -n '/^pipeline stages/,$p'
echo "== results: $RUN/metrics.jsonl, $RUN/loss.png, $RUN/trace/ (\`$BATON trace $RUN/trace\` writes a Perfetto JSON)"
