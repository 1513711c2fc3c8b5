#!/usr/bin/env bash
# Fine-tunes the real SmolLM2-135M-Instruct on the Austen training split with
# `baton run jobs/smollm2_finetune.yaml` (CPU, single process), exports it as
# a Hugging Face directory models/smollm2-135m-austen/ (config.json,
# model.safetensors, tokenizer.json copied from the pretrained directory), and
# evaluates the pretrained and the fine-tuned model on the first 16384 tokens
# of the held-out split (16 windows of 1024) with baton eval and with
# transformers (tools/hf_ref.py).
#
#   tools/smollm2_finetune.sh        (tens of minutes of CPU on 2 busy cores)
#
# Outputs: runs/smollm2_finetune/{run.log, metrics.jsonl, loss.png, *.json}.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
BATON=${BATON:-build/baton}
out=runs/smollm2_finetune
ntok=${NTOK:-16384}
mkdir -p "$out"
[ -x "$BATON" ] || make -j2 >/dev/null
tools/fetch_smollm2.sh --hf >/dev/null
tools/fetch_austen.sh
hf=models/smollm2-135m-hf
ft=models/smollm2-135m-austen
val=data/austen/val.txt
for split in train val; do
    if [ ! -s $out/data/$split/index.json ]; then
        rm -rf $out/data/$split
        mkdir -p $out/data
        nice "$BATON" data prepare --tokenizer $hf --input data/austen/$split.txt --output $out/data/$split --quiet
    fi
done
rm -rf "$ft"
nice "$BATON" run jobs/smollm2_finetune.yaml | tee $out/run.log
cp $hf/tokenizer.json $hf/tokenizer_config.json $ft/
[ -f $hf/generation_config.json ] && cp $hf/generation_config.json $ft/

ev() { nice "$BATON" eval --model "$1" --text $val --window 1024 --max-tokens $ntok --json; }
ev $hf >$out/baton_eval_pretrained.json
ev $ft >$out/baton_eval_finetuned.json
nice python3 tools/hf_ref.py eval --model $ft --text $val --window 1024 --max-tokens $ntok \
    >$out/hf_eval_finetuned.json 2>/dev/null

python3 - "$out" "$ntok" <<'PY'
import json, sys
d, n = sys.argv[1], sys.argv[2]
ld = lambda f: json.load(open(f"{d}/{f}.json"))
pre, fb, fh = ld("baton_eval_pretrained"), ld("baton_eval_finetuned"), ld("hf_eval_finetuned")
print(f"held-out: first {n} tokens of data/austen/val.txt in windows of 1024")
print(f"  pretrained  baton eval     loss {pre['loss']:.6f}  ppl {pre['ppl']:.4f}")
print(f"  fine-tuned  baton eval     loss {fb['loss']:.6f}  ppl {fb['ppl']:.4f}")
print(f"  fine-tuned  transformers   loss {fh['loss']:.6f}  ppl {fh['ppl']:.4f}")
rel = abs(fb["loss"] - fh["loss"]) / abs(fh["loss"])
print(f"  export: baton vs transformers rel.diff {rel:.2e}")
ok = rel <= 1e-4 and fb["tokens"] == fh["tokens"] and fb["loss"] < pre["loss"]
print("fine-tune:", "OK (perplexity fell; export reads back the same)" if ok else "CHECK FAILED")
sys.exit(0 if ok else 1)
PY
