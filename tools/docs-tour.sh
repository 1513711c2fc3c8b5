#!/usr/bin/env bash
# The commands of README.md's tour and docs/CHECKPOINTS.md's examples, run
# as the documents write them (tests/sh/test_docs.py finds each of them
# here), on the Austen corpus (fetched and tokenized first, as
# tools/run-default-job.sh does).
#   tools/docs-tour.sh [tour|checkpoints|all]     (default: tour)
# tour: graph, a 20-step run, trace, trace --summary, generate from the
# export (about a minute on 2 cores); checkpoints: save, resume, resume into
# another layout, convert, for jobs/austen_main.yaml and jobs/austen_pp2_dp2.yaml
# (full runs: several minutes each). Everything goes under runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-tour}
export PATH=$PWD/build:$PATH   # the documents write both build/baton and baton
tools/fetch_austen.sh data
for split in train val; do
    [ -f data/austen_shards/$split/index.json ] ||
        build/baton data prepare --tokenizer tests/fixtures/tok/gpt2 \
            --input data/austen/$split.txt --output data/austen_shards/$split
done
if [ "$what" = tour ] || [ "$what" = all ]; then
    build/baton graph jobs/austen_main.yaml
    build/baton run jobs/austen_main.yaml --set train.steps=20
    build/baton trace runs/austen_main/latest/trace
    build/baton trace runs/austen_main/latest/trace --summary
    build/baton generate --model runs/austen_main/latest/export --prompt "It is a truth" --max-new 32 --temperature 0.8 --seed 3
    build/baton run jobs/austen_main.yaml --set parallel.dp=1 --set parallel.zero1=false \
        --set train.global_batch=4 --set train.steps=8 --set optim.warmup=1 --set train.eval_every=0 \
        --set data.val_dir= --set data.split=0 --set trace.dir=/tmp/t4
    build/baton trace /tmp/t4 --summary
    rm -rf /tmp/t4
fi
if [ "$what" = checkpoints ] || [ "$what" = all ]; then
    rm -rf runs/ck runs/ck1 runs/ck2 runs/ck4 runs/model-hf runs/ck-tp2
    build/baton run jobs/austen_main.yaml --set checkpoint.dir=runs/ck --set checkpoint.every=20
    build/baton run jobs/austen_main.yaml --set checkpoint.dir=runs/ck --resume
    build/baton run jobs/austen_main.yaml --resume runs/ck --set checkpoint.dir=runs/ck1 \
        --set parallel.pp=1 --set parallel.dp=4
    build/baton convert --from runs/ck --to runs/model-hf --tokenizer tests/fixtures/tok/gpt2
    rm -rf runs/ck runs/model-hf
    baton run jobs/austen_pp2_dp2.yaml --set checkpoint.dir=runs/ck --set checkpoint.every=50
    baton run jobs/austen_pp2_dp2.yaml --set checkpoint.dir=runs/ck --resume
    baton run jobs/austen_pp2_dp2.yaml --set checkpoint.dir=runs/ck2 --resume runs/ck/step-00000050
    baton run jobs/austen_pp2_dp2.yaml --resume runs/ck --set checkpoint.dir=runs/ck4 \
        --set parallel.pp=1 --set parallel.dp=4
    baton convert --from runs/ck --to runs/model-hf --tokenizer tests/fixtures/tok/gpt2
    baton convert --from runs/ck --to runs/ck-tp2 --layout tp=2,pp=1
    baton convert --from runs/model-hf --to runs/imported
fi
