#!/usr/bin/env python3
"""Convert a llama GGUF file into a Hugging Face directory (config.json,
model.safetensors in f32, tokenizer.json, generation_config.json) using
transformers' own GGUF loader, which dequantizes every tensor and undoes
llama.cpp's Q/K row permutation. This directory is the reference that the
C reader (ckpt/gguf.h) is checked against.

    python3 tools/gguf_to_hf.py models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        models/smollm2-135m-hf

Needs: transformers, torch, accelerate and the `gguf` package
(pip install gguf accelerate).

One deliberate change to what transformers writes: for the pre-tokenizers
that llama.cpp splits into single digits first ("smollm" among them),
transformers' converter emits a plain GPT-2 ByteLevel pre-tokenizer, which
tokenizes a run of spaces before a digit differently from the model's own
tokenizer ("a  1": [81, 216, 216, 33] instead of [81, 256, 33]). We write
Digits(individual_digits) + ByteLevel instead, the same as
gguf_tokenizer_write_json() in C; --keep-transformers-pretokenizer turns this
off.
"""
import argparse
import json
import os
import sys

DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}


def gguf_pre_tokenizer(path):
    import gguf
    r = gguf.GGUFReader(path)
    f = r.fields.get("tokenizer.ggml.pre")
    return f.contents() if f is not None else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf_file")
    ap.add_argument("out_dir")
    ap.add_argument("--keep-transformers-pretokenizer", action="store_true")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src_dir, name = os.path.split(os.path.abspath(args.gguf_file))
    model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
    # The loaded weights are plain f32 tensors; drop the "gguf quantization"
    # marker so that save_pretrained writes them as an ordinary checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(args.out_dir, safe_serialization=True)

    tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    tok.save_pretrained(args.out_dir)

    pre = gguf_pre_tokenizer(args.gguf_file)
    tj_path = os.path.join(args.out_dir, "tokenizer.json")
    if pre in DIGIT_SPLIT_PRE and not args.keep_transformers_pretokenizer:
        with open(tj_path, encoding="utf-8") as f:
            tj = json.load(f)
        tj["pre_tokenizer"] = {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            ],
        }
        with open(tj_path, "w", encoding="utf-8") as f:
            json.dump(tj, f, ensure_ascii=False, indent=2)
        print(f"tokenizer.ggml.pre={pre!r}: wrote Digits+ByteLevel pre-tokenizer", file=sys.stderr)

    n_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out_dir}: {model.config.architectures[0]}, {n_params} parameters, "
          f"vocab {model.config.vocab_size}", file=sys.stderr)


if __name__ == "__main__":
    main()
