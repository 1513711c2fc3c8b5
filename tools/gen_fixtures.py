#!/usr/bin/env python3
"""Reference fixtures for the model tests (tests/test_model_hf.c, tests/sh/test_eval_cli.sh).

For each tiny random model of a supported architecture this writes, into
tests/fixtures/<name>/:
  config.json + model.safetensors (or sharded + model.safetensors.index.json)
      via transformers' save_pretrained(safe_serialization=True)
  ids.txt          the token sequences, one per line (the `baton eval --ids` format)
  ref.safetensors  ids [S,Tmax] i32 (right-padded with 0), lens [S] i32,
                   loss [1] f64 (pooled mean next-token NLL, nats),
                   logits [sum(lens), V] f32 (all positions, sequences concatenated),
                   grad.<hf name> f32 for every parameter: gradient of the pooled loss
  expected.json    {"tokens", "loss", "ppl", "grad_norm"} as `baton eval --json --grad-norm` prints

The pooled loss is sum_i n_i * loss_i / sum_i n_i where loss_i is what transformers
returns for sequence i alone with labels = input ids (n_i = len_i - 1 scored positions).
Everything runs on CPU in float32 with fixed seeds. f16/bf16 fixtures store half
precision weights; their references are computed from those weights converted to f32
(exactly what the C loader does).

Usage: python3 tools/gen_fixtures.py [OUTDIR [NAME...]]   (default tests/fixtures, every
fixture; NAMEs: only those, so that adding one leaves the others' bytes as they are)

The fixtures up to llama_sharded were written with transformers 5.24.0 and torch
2.15.0, qwen3, phi3, mistral_window and qwen2_window with transformers 5.25.0 and torch 2.15.0 (all CPU, float32).
"""
import json
import math
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

LENS = [20, 13, 7]


def fixture_specs():
    common = dict(vocab_size=256, max_position_embeddings=64, rms_norm_eps=1e-6,
                  hidden_act="silu", initializer_range=0.1)
    return [
        # name, model class, config, stored dtype, max_shard_size
        ("llama", LlamaForCausalLM,
         LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2,
                     tie_word_embeddings=False, **common), torch.float32, None),
        ("llama_tied_llama3", LlamaForCausalLM,
         LlamaConfig(hidden_size=32, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True,
                     attention_bias=True, mlp_bias=True,
                     rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 16},
                     **common), torch.float32, None),
        ("mistral", MistralForCausalLM,
         MistralConfig(hidden_size=32, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       sliding_window=32, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                       **common), torch.float32, None),
        ("qwen2", Qwen2ForCausalLM,
         Qwen2Config(hidden_size=48, intermediate_size=64, num_hidden_layers=3,
                     num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False,
                     **dict(common, rms_norm_eps=1e-5)), torch.float32, None),
        ("llama_f16", LlamaForCausalLM,
         LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
                     rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
                     **common), torch.float16, None),
        ("qwen2_bf16", Qwen2ForCausalLM,
         Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                     **common), torch.bfloat16, None),
        ("llama_sharded", LlamaForCausalLM,
         LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                     **common), torch.float32, "40KB"),
        # q_norm/k_norm per head, head_dim * heads (64) != hidden (48), GQA,
        # tied embeddings as Qwen3's small models have
        ("qwen3", Qwen3ForCausalLM,
         Qwen3Config(hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     tie_word_embeddings=True,
                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                     **common), torch.float32, None),
        # q/k/v in one qkv_proj and gate/up in one gate_up_proj, GQA 6/2, a
        # sliding window longer than the fixtures' sequences (as Phi-3-mini-4k's
        # 2047), pad_token_id inside the vocabulary
        ("phi3", Phi3ForCausalLM,
         Phi3Config(hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=6, num_key_value_heads=2, sliding_window=47,
                    tie_word_embeddings=False, pad_token_id=0, original_max_position_embeddings=64,
                    resid_pdrop=0.0, embd_pdrop=0.0, **common), torch.float32, None),
        # sliding windows shorter than the sequences (20, 13, 7 tokens): every
        # layer's (Mistral), and only layers >= max_window_layers (Qwen2)
        ("mistral_window", MistralForCausalLM,
         MistralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, sliding_window=6,
                       tie_word_embeddings=False, **common), torch.float32, None),
        ("qwen2_window", Qwen2ForCausalLM,
         Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
                     sliding_window=5, max_window_layers=1, tie_word_embeddings=False,
                     **common), torch.float32, None),
    ]


def make_sequences(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g) for n in LENS]


def build(outdir, idx, name, cls, cfg, dtype, shard):
    torch.manual_seed(1000 + idx)
    model = cls(cfg).float().eval()
    # Make norm weights and biases non-trivial so that their gradients are tested.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif pname.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    d = os.path.join(outdir, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    stored = model.to(dtype)
    kw = {"safe_serialization": True}
    if shard:
        kw["max_shard_size"] = shard
    stored.save_pretrained(d, **kw)
    gen = os.path.join(d, "generation_config.json")  # not needed, keeps fixtures small
    if os.path.exists(gen):
        os.remove(gen)
    # The reference is what transformers computes from the stored files loaded
    # in float32 (as the C loader widens them); loading afresh also recomputes
    # the rotary inv_freq buffer in f32 (model.to(f16) would have rounded it).
    del stored, model
    model = cls.from_pretrained(d, dtype=torch.float32).eval()

    seqs = make_sequences(cfg.vocab_size, 7 + idx)
    model.zero_grad()
    total_n = sum(len(s) - 1 for s in seqs)
    nll_sum = 0.0
    logits_all = []
    for s in seqs:
        out = model(input_ids=s[None, :], labels=s[None, :])
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
    params = dict(model.named_parameters())
    for pname, p in params.items():
        ref["grad." + pname] = p.grad.detach().clone().contiguous()
        sumsq += float((p.grad.double() ** 2).sum())
    # transformers drops lm_head.weight from the file when it is tied; the
    # gradient of the one shared tensor is reported under the embedding name.
    save_file(ref, os.path.join(d, "ref.safetensors"))
    with open(os.path.join(d, "ids.txt"), "w") as f:
        for s in seqs:
            f.write(" ".join(str(int(t)) for t in s) + "\n")
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"tokens": total_n, "loss": loss, "ppl": math.exp(loss),
                   "grad_norm": math.sqrt(sumsq)}, f, indent=1)
        f.write("\n")
    print(f"{name}: loss {loss:.6f} tokens {total_n} params {sum(p.numel() for p in params.values())}")


TEXT = ("It is a truth universally acknowledged that a tiny random model\n"
        "knows nothing at all; its perplexity says so, token by token.\n"
        "Caf\u00e9 na\u00efve \u2014 bytes, windows & 123 numbers.\n")


def text_fixture(outdir, name="llama"):
    """A byte-level tokenizer.json (the 256 byte tokens, no merges, so ids fit
    the fixtures' vocabulary of 256) beside the `name` fixture, text.txt, and
    expected_text_w<T>.json: the pooled loss of `baton eval --text` with
    --window T, computed as transformers does on each window of the
    tokenizers-encoded text (add_special_tokens=False)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    d = os.path.join(outdir, name)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "text.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(TEXT)
    ids = Tokenizer.from_file(os.path.join(d, "tokenizer.json")).encode(
        TEXT, add_special_tokens=False).ids
    model = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    for window in (64, 16):
        nll, n = 0.0, 0
        with torch.no_grad():
            for o in range(0, len(ids), window):
                w = torch.tensor(ids[o:o + window])[None, :]
                if w.shape[1] < 2:
                    continue
                k = w.shape[1] - 1
                nll += model(input_ids=w, labels=w).loss.item() * k
                n += k
        with open(os.path.join(d, f"expected_text_w{window}.json"), "w") as f:
            json.dump({"tokens": n, "loss": nll / n, "ppl": math.exp(nll / n)}, f, indent=1)
            f.write("\n")
        print(f"{name} text: {len(ids)} ids, window {window}: loss {nll / n:.6f} over {n}")


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    only = set(sys.argv[2:])
    torch.set_num_threads(1)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for idx, spec in enumerate(fixture_specs()):
        if not only or spec[0] in only:
            build(outdir, idx, *spec)
    if not only or "text" in only:
        text_fixture(outdir)


if __name__ == "__main__":
    main()
