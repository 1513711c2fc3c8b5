#!/usr/bin/env python3
"""Reference fixtures of the hybrid Mamba2-Transformer NemotronH
(tests/test_model_hf.c, tests/sh/test_nemotronh.sh), in the layout of
tools/gen_fixtures.py, written by transformers' own NemotronHForCausalLM on its
torch path (no mamba_ssm / causal_conv1d installed: the chunked scan and the
conv1d of modeling_nemotron_h.py), CPU, float32, fixed seeds.

Into tests/fixtures/<name>/:
  config.json + model.safetensors   save_pretrained
  ids.txt, ref.safetensors, expected.json   as gen_fixtures.py (loss pooled
      over the sequences of LENS, logits, grad.<name> of every parameter)
  generate.json    {"prompt_ids", "ids"}: greedy generate() of 20 tokens
                   after a fixed prompt, EOS ignored (transformers' hybrid
                   cache: conv and SSM states per Mamba layer, K/V per
                   attention layer)

Fixtures:
  nemotronh        pattern "M*M-M-": Mamba2 mixers (4 heads of 8, 2 groups,
                   state 8, conv 4, chunk 8 so that a sequence of 20 spans
                   three chunks, the last padded), one attention layer (no
                   RoPE, as NemotronH has none), relu2 MLPs; conv bias on
  nemotronh_bias   pattern "-M*M": in_proj/out_proj and MLP biases,
                   tie_word_embeddings true in config.json, which
                   NemotronHForCausalLM ignores (no tied keys: lm_head is its
                   own tensor, saved and trained apart from the embedding), no conv bias, chunk 4, time_step_min 0.05
                   (so the dt floor clamps some positions)

Usage: python3 tools/gen_nemotronh_fixtures.py [OUTDIR]   (default tests/fixtures)
"""
import json
import math
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import NemotronHConfig, NemotronHForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import LENS, make_sequences  # noqa: E402

PROMPT = [64, 65, 66, 220, 67]


def fixture_specs():
    common = dict(vocab_size=256, hidden_size=32, max_position_embeddings=64,
                  layer_norm_epsilon=1e-5, initializer_range=0.1,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  intermediate_size=48, mlp_hidden_act="relu2",
                  mamba_num_heads=4, mamba_head_dim=8, n_groups=2, ssm_state_size=8,
                  conv_kernel=4, expand=1, mamba_hidden_act="silu",
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return [
        ("nemotronh", NemotronHConfig(
            hybrid_override_pattern="M*M-M-", tie_word_embeddings=False, use_conv_bias=True,
            chunk_size=8, use_bias=False, mlp_bias=False, **common)),
        ("nemotronh_bias", NemotronHConfig(
            hybrid_override_pattern="-M*M", tie_word_embeddings=True, use_conv_bias=False,
            chunk_size=4, use_bias=True, mlp_bias=True, time_step_min=0.05, **common)),
    ]


def build(outdir, idx, name, cfg):
    torch.manual_seed(2000 + idx)
    model = NemotronHForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight") or pname.endswith("norm_f.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif pname.endswith(".bias") and "dt_bias" not in pname:
                p.copy_(0.1 * torch.randn_like(p))
            elif pname.endswith(".D"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif pname.endswith("A_log"):
                p.add_(0.1 * torch.randn_like(p))
    d = os.path.join(outdir, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    model.save_pretrained(d, safe_serialization=True)
    gen = os.path.join(d, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    del model
    model = NemotronHForCausalLM.from_pretrained(d, dtype=torch.float32)
    model.train()  # the training path: no cache, the chunked scan from a zero state

    seqs = make_sequences(cfg.vocab_size, 17 + idx)
    model.zero_grad()
    total_n = sum(len(s) - 1 for s in seqs)
    nll_sum = 0.0
    logits_all = []
    for s in seqs:
        out = model(input_ids=s[None, :], labels=s[None, :], use_cache=False)
        n = len(s) - 1
        (out.loss * (n / total_n)).backward()
        nll_sum += out.loss.item() * n
        logits_all.append(out.logits[0].detach())
    loss = nll_sum / total_n

    tmax = max(LENS)
    ids = torch.zeros((len(seqs), tmax), dtype=torch.int32)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s.to(torch.int32)
    ref = {
        "ids": ids,
        "lens": torch.tensor([len(s) for s in seqs], dtype=torch.int32),
        "loss": torch.tensor([loss], dtype=torch.float64),
        "logits": torch.cat(logits_all, 0).contiguous(),
    }
    sumsq = 0.0
    for pname, p in model.named_parameters():
        # under the checkpoint's names: transformers keeps the body as
        # model.*, save_pretrained writes it as backbone.*
        fname = "backbone." + pname[len("model."):] if pname.startswith("model.") else pname
        ref["grad." + fname] = p.grad.detach().clone().contiguous()
        sumsq += float((p.grad.double() ** 2).sum())
    save_file(ref, os.path.join(d, "ref.safetensors"))
    with open(os.path.join(d, "ids.txt"), "w") as f:
        for s in seqs:
            f.write(" ".join(str(int(t)) for t in s) + "\n")
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"tokens": total_n, "loss": loss, "ppl": math.exp(loss),
                   "grad_norm": math.sqrt(sumsq), "transformers": transformers.__version__,
                   "torch": torch.__version__}, f, indent=1)
        f.write("\n")
    model.eval()
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        gen = model.generate(input_ids=torch.tensor([PROMPT]), max_new_tokens=20,
                             do_sample=False, pad_token_id=0)
        # the cache path against recomputing every prefix: generate() must agree
        # with argmax of a full forward at every step, or the fixture is on a tie
        seq = torch.tensor([PROMPT])
        for _ in range(20):
            lg = model(input_ids=seq, use_cache=False).logits[0, -1]
            top = torch.topk(lg, 2).values
            assert float(top[0] - top[1]) > 1e-4, f"{name}: greedy step on a near-tie"
            seq = torch.cat([seq, lg.argmax().view(1, 1)], 1)
        assert seq[0, len(PROMPT):].tolist() == gen[0, len(PROMPT):].tolist(), \
            f"{name}: generate() with its cache differs from full forwards"
    with open(os.path.join(d, "generate.json"), "w") as f:
        json.dump({"prompt_ids": PROMPT, "ids": gen[0, len(PROMPT):].tolist()}, f)
        f.write("\n")
    for fn in os.listdir(d):
        os.chmod(os.path.join(d, fn), 0o644)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{name}: loss {loss:.6f} tokens {total_n} params {n_params}")


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    torch.set_num_threads(1)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for idx, (name, cfg) in enumerate(fixture_specs()):
        build(outdir, idx, name, cfg)


if __name__ == "__main__":
    main()
