#!/usr/bin/env bash
# The default job of `make run` (README "The default job"): the Austen
# corpus, token shards, then jobs/austen_main.yaml, a 14.2 M-parameter Llama
# trained as four local processes (PP=2 x DP=2, 1F1B, ZeRO-1) for a few
# minutes (exporting the model with its tokenizer), then the pipeline summary
# of its trace and a generation from the export.
#
#   tools/run-default-job.sh [BUILD]        (default: build)
#
# Leaves runs/austen_main/<run id>/ (runs/austen_main/latest points at it):
# job.yaml, run.json, metrics.jsonl, loss.png, throughput.png, tensorboard/,
# trace/, export/. The corpus is
# fetched only when missing (tools/fetch_austen.sh); the shards are made from
# it each time (under a second).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${1:-build}
BATON=$BUILD/baton
JOB=jobs/austen_main.yaml
RUN=runs/austen_main/latest
TOK=tests/fixtures/tok/gpt2   # byte-level BPE, 4096 ids, trained on the Austen train split
SHARDS=data/austen_shards

# The shards are made from the corpus every time (under a second each). No
# corpus text is committed, not even as token ids: without the corpus (no
# network for apt-get download) the job cannot run, and says so.
echo "== Austen corpus: data/austen (tools/fetch_austen.sh)"
if ! tools/fetch_austen.sh data; then
    echo "run-default-job: the Austen corpus could not be fetched (tools/fetch_austen.sh needs" >&2
    echo "  apt-get download access to Debian's r-cran-janeaustenr); nothing to train on" >&2
    exit 1
fi
for split in train val; do
    echo "== token shards: $SHARDS/$split ($TOK)"
    rm -rf "$SHARDS/$split.tmp"
    mkdir -p "$SHARDS"
    "$BATON" data prepare --quiet --tokenizer "$TOK" --input "data/austen/$split.txt" --output "$SHARDS/$split.tmp"
    rm -rf "$SHARDS/$split"
    mv "$SHARDS/$split.tmp" "$SHARDS/$split"
done

echo "== training: $BATON run $JOB"
start=$(date +%s)
"$BATON" run "$JOB"
echo "== wall time $(( $(date +%s) - start )) s"
echo "== pipeline: $BATON trace $RUN/trace --summary (pipeline part)"
"$BATON" trace "$RUN/trace" --summary | sed -n '/^pipeline stages/,$p'
echo "== the model just trained: $BATON generate --model $RUN/export --prompt \"It is a truth\" --max-new 32 --temperature 0.8 --seed 3"
"$BATON" generate --model "$RUN/export" --prompt "It is a truth" --max-new 32 --temperature 0.8 --seed 3
echo "== results in $(readlink -f "$RUN") (\`$BATON trace $RUN/trace\` writes a Perfetto JSON; tensorboard --logdir runs/)"
