#!/usr/bin/env python3
"""Reference fixtures of the mixture-of-experts models (tests/test_model_hf.c,
tests/test_moe.c, tests/sh/test_moe.sh), in the layout of tools/gen_fixtures.py.

Written with transformers 5.24.0 and torch 2.15.0 (CPU, float32); the versions
this ran with are printed and stored in each fixture's expected.json. Into
tests/fixtures/<name>/:
  config.json + model.safetensors   save_pretrained: experts stored one tensor
                                    per expert (...experts.<e>.w1.weight or
                                    ...experts.<e>.gate_proj.weight), as
                                    transformers 5 writes them
  ids.txt, ref.safetensors, expected.json   as gen_fixtures.py, plus
    ref "aux" [1] f64: the pooled router load-balancing loss,
        sum_i n_i * aux_i / sum_i n_i (aux_i = out.aux_loss of sequence i), so
        that loss = cross-entropy + router_aux_loss_coef * aux; 0 when
        output_router_logits is off
    grad.<file name>: every gradient under the checkpoint's tensor names
        (transformers keeps the experts as fused [E, 2F, C] gate_up_proj and
        [E, C, F] down_proj parameters; their gradients are cut per expert
        here, gate first, as save_pretrained cuts the weights)
    expected.json also has "min_gap": the smallest gap between the k-th and
        (k+1)-th routing probability of any token of any sparse layer (the
        script refuses a fixture whose routing sits on a near-tie, where
        float rounding could pick other experts than transformers did)
  generate.json    {"prompt_ids", "ids"}: transformers' greedy generate() of 20
                   tokens after a fixed prompt, EOS ignored

Fixtures:
  mixtral          MixtralForCausalLM, 4 experts, top-2, router aux loss on
                   (output_router_logits, coefficient 0.05), 2 layers
  qwen2_moe        Qwen2MoeForCausalLM, 8 experts, top-2, norm_topk_prob off,
                   shared expert with its sigmoid gate, mlp_only_layers [1]
                   (layer 1 a dense MLP of intermediate_size), no aux loss
  qwen2_moe_norm   Qwen2MoeForCausalLM, 6 experts, top-3, norm_topk_prob on,
                   decoder_sparse_step 2 (layers 1 and 3 sparse), aux loss
                   0.02, tied embeddings
  qwen3_moe        Qwen3MoeForCausalLM (transformers 5.25.0): q_norm/k_norm, attention
                   biases on (q/k/v/o), 6 experts, top-2, norm_topk_prob on, no shared
                   expert, mlp_only_layers [1], aux loss 0.02, head_dim 16 != 32 / 4

Usage: python3 tools/gen_moe_fixtures.py [OUTDIR [NAME...]]   (default tests/fixtures, every
fixture; NAMEs: only those)
"""
import json
import math
import os
import re
import shutil
import sys

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import LENS, make_sequences  # noqa: E402

MIN_GAP = 1e-4  # routing probabilities closer than this are a near-tie
PROMPT = [64, 65, 66, 220, 67]


def fixture_specs():
    common = dict(vocab_size=256, max_position_embeddings=64, rms_norm_eps=1e-6,
                  hidden_act="silu", initializer_range=0.1)
    return [
        ("mixtral", MixtralForCausalLM,
         MixtralConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                       num_experts_per_tok=2, output_router_logits=True,
                       router_aux_loss_coef=0.05, tie_word_embeddings=False, **common)),
        ("qwen2_moe", Qwen2MoeForCausalLM,
         Qwen2MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=24,
                        shared_expert_intermediate_size=40, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, num_experts=8,
                        num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1,
                        mlp_only_layers=[1], output_router_logits=False,
                        tie_word_embeddings=False, **dict(common, rms_norm_eps=1e-5))),
        ("qwen2_moe_norm", Qwen2MoeForCausalLM,
         Qwen2MoeConfig(hidden_size=32, intermediate_size=56, moe_intermediate_size=16,
                        shared_expert_intermediate_size=24, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, num_experts=6,
                        num_experts_per_tok=3, norm_topk_prob=True, decoder_sparse_step=2,
                        mlp_only_layers=[], output_router_logits=True,
                        router_aux_loss_coef=0.02, tie_word_embeddings=True, **common)),
        ("qwen3_moe", Qwen3MoeForCausalLM,
         Qwen3MoeConfig(hidden_size=32, intermediate_size=56, moe_intermediate_size=20,
                        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, num_experts=6, num_experts_per_tok=2, norm_topk_prob=True,
                        decoder_sparse_step=1, mlp_only_layers=[1], output_router_logits=True,
                        router_aux_loss_coef=0.02, attention_bias=True,
                        tie_word_embeddings=False, **common)),
    ]


def file_names(model, mixtral):
    """{checkpoint tensor name: tensor (a view of a parameter or of its grad)}
    for a parameter-sized map `get(p)`: the experts' fused parameters cut per
    expert the way save_pretrained writes them."""
    def cut(get):
        out = {}
        for name, p in model.named_parameters():
            t = get(p)
            m = re.match(r"(model\.layers\.\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$", name)
            if m:
                pre = m.group(1) + (".block_sparse_moe" if mixtral else ".mlp") + ".experts."
                for e in range(t.shape[0]):
                    if m.group(2) == "gate_up_proj":
                        f = t.shape[1] // 2
                        out[pre + f"{e}.{'w1' if mixtral else 'gate_proj'}.weight"] = t[e, :f]
                        out[pre + f"{e}.{'w3' if mixtral else 'up_proj'}.weight"] = t[e, f:]
                    else:
                        out[pre + f"{e}.{'w2' if mixtral else 'down_proj'}.weight"] = t[e]
                continue
            if mixtral:
                name = name.replace(".mlp.gate.", ".block_sparse_moe.gate.")
            out[name] = t
        return out
    return cut


def routing_gap(model, seqs, top_k):
    """The smallest gap between the k-th and (k+1)-th routing probability."""
    gaps = []
    hooks = []

    def hook(_mod, _inp, out):
        probs = torch.softmax(out[0].detach().float(), dim=-1)
        top = torch.topk(probs, top_k + 1, dim=-1).values
        gaps.append(float((top[:, top_k - 1] - top[:, top_k]).min()))

    for name, mod in model.named_modules():
        if name.endswith(".gate") and hasattr(mod, "top_k"):
            hooks.append(mod.register_forward_hook(hook))
    with torch.no_grad():
        for s in seqs:
            model(input_ids=s[None, :])
    for h in hooks:
        h.remove()
    return min(gaps)


def random_model(cls, cfg, seed):
    torch.manual_seed(seed)
    model = cls(cfg).float().eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif pname.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif pname.endswith("mlp.gate.weight"):
                p.mul_(4.0)  # peakier routing: well-separated top-k, an uneven load
    return model


def build(outdir, idx, name, cls, cfg):
    mixtral = cls is MixtralForCausalLM
    seqs = make_sequences(cfg.vocab_size, 7 + idx)
    # the first seed whose routing has no near-tie (deterministic)
    for seed in range(2000 + 100 * idx, 2000 + 100 * idx + 50):
        model = random_model(cls, cfg, seed)
        gap = routing_gap(model, seqs, cfg.num_experts_per_tok)
        if gap >= MIN_GAP:
            break
    else:
        sys.exit(f"{name}: every seed routes some token on a near-tie")
    d = os.path.join(outdir, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    model.save_pretrained(d, safe_serialization=True)
    gen = os.path.join(d, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    del model
    model = cls.from_pretrained(d, dtype=torch.float32).eval()

    # the checkpoint's names are those the fused parameters are cut into
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        stored = {k: f.get_tensor(k) for k in f.keys()}
    values = file_names(model, mixtral)(lambda p: p.detach())
    assert set(values) == set(stored), sorted(set(values) ^ set(stored))
    for k, v in values.items():
        assert torch.equal(v, stored[k]), k

    assert routing_gap(model, seqs, cfg.num_experts_per_tok) == gap
    model.zero_grad()
    total_n = sum(len(s) - 1 for s in seqs)
    nll_sum, aux_sum = 0.0, 0.0
    logits_all = []
    for s in seqs:
        out = model(input_ids=s[None, :], labels=s[None, :])
        n = len(s) - 1
        (out.loss * (n / total_n)).backward()
        nll_sum += out.loss.item() * n
        if out.aux_loss is not None:
            aux_sum += out.aux_loss.item() * n
        logits_all.append(out.logits[0].detach())
    loss = nll_sum / total_n
    aux = aux_sum / total_n

    tmax = max(LENS)
    ids = torch.zeros((len(seqs), tmax), dtype=torch.int32)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s.to(torch.int32)
    ref = {
        "ids": ids,
        "lens": torch.tensor([len(s) for s in seqs], dtype=torch.int32),
        "loss": torch.tensor([loss], dtype=torch.float64),
        "aux": torch.tensor([aux], dtype=torch.float64),
        "logits": torch.cat(logits_all, 0).contiguous(),
    }
    grads = file_names(model, mixtral)(lambda p: p.grad.detach())
    sumsq = 0.0
    for gname, g in grads.items():
        ref["grad." + gname] = g.clone().contiguous()
        sumsq += float((g.double() ** 2).sum())
    save_file(ref, os.path.join(d, "ref.safetensors"))
    with open(os.path.join(d, "ids.txt"), "w") as f:
        for s in seqs:
            f.write(" ".join(str(int(t)) for t in s) + "\n")
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"tokens": total_n, "loss": loss, "ppl": math.exp(loss),
                   "grad_norm": math.sqrt(sumsq), "aux": aux, "min_gap": gap, "seed": seed,
                   "transformers": transformers.__version__, "torch": torch.__version__},
                  f, indent=1)
        f.write("\n")
    # greedy decoding of a fixed prompt ("abc d" in the llama fixture's byte
    # tokenizer), EOS ignored: what `baton generate --ignore-eos` must give
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        gen = model.generate(input_ids=torch.tensor([PROMPT]), max_new_tokens=20,
                             do_sample=False, pad_token_id=0)
    with open(os.path.join(d, "generate.json"), "w") as f:
        json.dump({"prompt_ids": PROMPT, "ids": gen[0, len(PROMPT):].tolist()}, f)
        f.write("\n")
    for fn in os.listdir(d):
        os.chmod(os.path.join(d, fn), 0o644)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{name}: loss {loss:.6f} (aux {aux:.6f}) tokens {total_n} params {n_params} "
          f"min routing gap {gap:.3g} (seed {seed})")


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    torch.set_num_threads(1)
    only = set(sys.argv[2:])
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for idx, spec in enumerate(fixture_specs()):
        if not only or spec[0] in only:
            build(outdir, idx, *spec)


if __name__ == "__main__":
    main()
