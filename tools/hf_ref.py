#!/usr/bin/env python3
"""transformers reference numbers for `baton eval` and `baton generate`
(torch on CPU, fp32). Prints one JSON object on stdout.

    python3 tools/hf_ref.py eval --model DIR (--text FILE | --ids FILE) [--window 1024] [--max-tokens N]
    python3 tools/hf_ref.py generate --model DIR --prompt TEXT --max-new 32 [--bos] [--ignore-eos]

eval: the text is tokenized with DIR/tokenizer.json (HF `tokenizers`, no
special tokens), the first N ids are kept, cut into consecutive windows of
`window` ids, and each window is scored on its own as transformers does with
labels = input ids (window length - 1 scored positions). The loss is the mean
NLL over all scored positions of all windows: exactly what
`baton eval --text FILE --window W --max-tokens N` computes.

generate: greedy decoding (do_sample=False) of max-new tokens after the
prompt's ids (no special tokens unless --bos), stopping at the model's EOS
like `baton generate` (not with --ignore-eos); prints the new ids and their text.
"""
import argparse
import json
import math
import os
import sys


def load(model_dir):
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(int(os.environ.get("HF_REF_THREADS", "2")))
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    m.eval()
    return m


def tokenizer(model_dir):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))


def cmd_eval(a):
    import torch
    if a.text:
        with open(a.text, encoding="utf-8") as f:
            ids = tokenizer(a.model).encode(f.read(), add_special_tokens=False).ids
    else:
        with open(a.ids) as f:
            ids = [int(x) for x in f.read().split()]
    if a.max_tokens:
        ids = ids[: a.max_tokens]
    m = load(a.model)
    total, n = 0.0, 0
    with torch.no_grad():
        for o in range(0, len(ids), a.window):
            w = ids[o : o + a.window]
            if len(w) < 2:
                continue
            x = torch.tensor([w])
            out = m(input_ids=x, labels=x)
            total += float(out.loss) * (len(w) - 1)
            n += len(w) - 1
            print(f"window {o // a.window + 1}: loss {float(out.loss):.5f}", file=sys.stderr, flush=True)
    loss = total / n
    print(json.dumps({"tokens": n, "loss": loss, "ppl": math.exp(loss)}))


def cmd_generate(a):
    import torch
    tok = tokenizer(a.model)
    ids = tok.encode(a.prompt, add_special_tokens=False).ids
    m = load(a.model)
    if a.bos:
        ids = [m.config.bos_token_id] + ids
    x = torch.tensor([ids])
    eos = None if a.ignore_eos else m.generation_config.eos_token_id
    with torch.no_grad():
        out = m.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=a.max_new,
                         min_new_tokens=0, eos_token_id=eos,
                         pad_token_id=m.generation_config.pad_token_id or 0,
                         temperature=None, top_p=None, top_k=None)
    new = out[0, len(ids):].tolist()
    print(json.dumps({"prompt_ids": ids, "ids": new, "text": tok.decode(new, skip_special_tokens=False)},
                     ensure_ascii=False))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("eval")
    e.add_argument("--model", required=True)
    e.add_argument("--text")
    e.add_argument("--ids")
    e.add_argument("--window", type=int, default=1024)
    e.add_argument("--max-tokens", type=int, default=0)
    g = sub.add_parser("generate")
    g.add_argument("--model", required=True)
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-new", type=int, default=32)
    g.add_argument("--bos", action="store_true")
    g.add_argument("--ignore-eos", action="store_true")
    a = ap.parse_args()
    if a.cmd == "eval":
        if bool(a.text) == bool(a.ids):
            ap.error("eval: give exactly one of --text and --ids")
        cmd_eval(a)
    else:
        cmd_generate(a)


if __name__ == "__main__":
    main()
