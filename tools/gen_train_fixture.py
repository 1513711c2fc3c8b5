#!/usr/bin/env python3
"""Build tests/fixtures/train_llama/: a tiny random Llama (HF save_pretrained,
float32), a fixed token stream and the per-step results of the PyTorch
reference training loop (tools/train_torch_ref.py) that tests/test_train.c
must reproduce.

Files written:
  config.json, model.safetensors   the initial model (transformers)
  tokens.txt                       the token stream, ids separated by spaces
  expected.json                    hyper-parameters, per-step loss / lr /
                                   grad norm, the first windows of the data
                                   order, and checksums of the final params
Run: python3 tools/gen_train_fixture.py [OUTDIR]   (CPU, ~10 s)
"""
import json
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_torch_ref as ref  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "train_llama")

HP = {
    "steps": 10, "micro_batch": 2, "grad_accum": 2, "seq_len": 16, "seed": 1234,
    "lr": 1e-2, "min_lr": 1e-3, "warmup": 3, "warmup_from_min": False,
    "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "clip": 3.0, "decay": "matrices",
}


def token_stream(n, vocab, seed):
    """A sparse random Markov chain over the vocabulary: learnable, so the
    loss visibly falls within ten steps."""
    g = torch.Generator().manual_seed(seed)
    nxt = torch.randint(0, vocab, (vocab, 4), generator=g)
    toks = [int(torch.randint(0, vocab, (1,), generator=g))]
    for _ in range(n - 1):
        toks.append(int(nxt[toks[-1], int(torch.randint(0, 4, (1,), generator=g))]))
    return toks


def main():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      rms_norm_eps=1e-6, initializer_range=0.1, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).float()
    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)
    gen_cfg = os.path.join(OUT, "generation_config.json")  # not needed by baton
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)
    # 401 tokens = 25 windows of 16: the 40 samples of 10 steps cross an epoch.
    tokens = token_stream(401, cfg.vocab_size, 7)
    with open(os.path.join(OUT, "tokens.txt"), "w") as f:
        f.write(" ".join(str(t) for t in tokens) + "\n")

    sampler = ref.Sampler(HP["seed"], (len(tokens) - 1) // HP["seq_len"])
    windows = [sampler.window(g) for g in range(60)]
    model.train()
    steps = ref.train(model, tokens, HP, on_step=lambda r: print(
        "step %2d loss %.6f lr %.6f norm %.6f" % (r["step"], r["loss"], r["lr"], r["grad_norm"])))
    final = {}
    for name, p in model.named_parameters():
        d = p.detach().double().flatten()
        final[name] = {"sum": d.sum().item(), "sumsq": (d * d).sum().item(),
                       "first": [float(x) for x in d[:4]]}
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"hyper": HP, "n_tokens": len(tokens), "windows": windows, "steps": steps,
                   "final": final}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
