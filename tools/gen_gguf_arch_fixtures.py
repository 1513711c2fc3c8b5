#!/usr/bin/env python3
"""Writes tests/fixtures/gguf_arch/<arch>/: tiny complete GGUF models of the
architectures other than llama that baton reads (qwen2, qwen3), and what
transformers makes of each file, for tests/sh/test_gguf_arch.sh.

    python3 tools/gen_gguf_arch_fixtures.py [ARCH...]

Needs the `gguf` package, transformers, torch, tokenizers. Deterministic.
The vocabulary, the text and the tensor encodings are those of
tools/gen_gguf_model_fixture.py (imported from it).

  <arch>/tiny.gguf       2 layers, hidden 32, 4 heads (2 KV heads), FFN 64,
                         untied head; weights in F16, BF16 and Q8_0, norms
                         and biases in F32. qwen2: q/k/v biases, pre-tokenizer
                         "qwen2"; qwen3: head_dim 128 (attention.key_length,
                         not hidden / heads), per-head q/k norms, pre-tokenizer
                         "llama-bpe" (Llama 3's split, so that both regexes
                         are exercised). Q/K rows are stored as HF keeps them:
                         llama.cpp permutes them for its llama architecture only.
  <arch>/expected.json   transformers on the GGUF file itself
                         (from_pretrained(gguf_file=...), torch fp32): tokens,
                         loss and ppl of text.txt in windows of 64, and the ids
                         of the first line as its GGUF tokenizer encodes them
  <arch>/text.txt        the text scored
"""
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_gguf_model_fixture as base  # noqa: E402
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "gguf_arch")
RNG = np.random.default_rng(20261206)

C, H, KV, F, L = 32, 4, 2, 64, 2
ARCHS = {
    "qwen2": {"head_dim": C // H, "pre": "qwen2", "bias": True, "qk_norm": False},
    # transformers reads no head_dim from a qwen3 GGUF (Qwen3Config's default, 128, stands)
    "qwen3": {"head_dim": 128, "pre": "llama-bpe", "bias": False, "qk_norm": True},
}
TYPES = (T.F16, T.Q8_0, T.BF16, T.F16, T.Q8_0, T.BF16, T.F16)  # q k v o gate up down


def rnd(*shape, s=0.15):
    return (RNG.standard_normal(shape) * s).astype(np.float32)


def write(path, arch, spec, toks, merges):
    D = spec["head_dim"]
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"baton tiny {arch}")
    base.add_shape(w, L, C, F, H, KV)
    if D != C // H:
        w.add_key_length(D)
        w.add_value_length(D)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(D)
    base.add_vocab(w, toks, merges, spec["pre"])
    data, raw = base.encode(T.F16, rnd(len(toks), C, s=1.0))
    w.add_tensor("token_embd.weight", data, raw_dtype=raw)
    data, raw = base.encode(T.Q8_0, rnd(len(toks), C, s=1.0))
    w.add_tensor("output.weight", data, raw_dtype=raw)
    shapes = {"attn_q": (H * D, C), "attn_k": (KV * D, C), "attn_v": (KV * D, C),
              "attn_output": (C, H * D), "ffn_gate": (F, C), "ffn_up": (F, C), "ffn_down": (C, F)}
    for i in range(L):
        w.add_tensor(f"blk.{i}.attn_norm.weight", (1 + rnd(C, s=0.1)).astype(np.float32))
        for (name, shape), qt in zip(shapes.items(), TYPES):
            data, raw = base.encode(qt, rnd(*shape))
            w.add_tensor(f"blk.{i}.{name}.weight", data, raw_dtype=raw)
            if spec["bias"] and name in ("attn_q", "attn_k", "attn_v"):
                w.add_tensor(f"blk.{i}.{name}.bias", rnd(shape[0], s=0.1))
        if spec["qk_norm"]:
            w.add_tensor(f"blk.{i}.attn_q_norm.weight", (1 + rnd(D, s=0.1)).astype(np.float32))
            w.add_tensor(f"blk.{i}.attn_k_norm.weight", (1 + rnd(D, s=0.1)).astype(np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", (1 + rnd(C, s=0.1)).astype(np.float32))
    w.add_tensor("output_norm.weight", (1 + rnd(C, s=0.1)).astype(np.float32))
    base.finish(w)


def main():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.manual_seed(0)
    names = sys.argv[1:] or list(ARCHS)
    toks, merges = base.train_vocab()
    for arch in names:
        spec = ARCHS[arch]
        d = os.path.join(OUT, arch)
        if os.path.isdir(d):
            shutil.rmtree(d)
        os.makedirs(d)
        with open(os.path.join(d, "text.txt"), "w") as f:
            f.write(base.TEXT)
        write(os.path.join(d, "tiny.gguf"), arch, spec, toks, merges)
        tk = AutoTokenizer.from_pretrained(d, gguf_file="tiny.gguf")
        m = AutoModelForCausalLM.from_pretrained(d, gguf_file="tiny.gguf", dtype=torch.float32)
        m.eval()
        assert m.config.model_type == arch, m.config.model_type
        ids = tk(base.TEXT, add_special_tokens=False)["input_ids"]
        e = base.score(m, ids, 64)
        e["first_line_ids"] = tk(base.TEXT.split("\n")[0], add_special_tokens=False)["input_ids"]
        with open(os.path.join(d, "expected.json"), "w") as f:
            f.write(json.dumps(e) + "\n")
        print(f"{arch}: {os.path.getsize(os.path.join(d, 'tiny.gguf'))} bytes, {len(ids)} ids, "
              f"loss {e['loss']:.6f}", file=sys.stderr)


if __name__ == "__main__":
    main()
