#!/usr/bin/env python3
"""Build tests/fixtures/train_qwen2_moe/: a tiny random Qwen2-MoE (routed
experts, a shared expert, a dense layer, renormalised top-2, the router's
load-balancing loss on), a fixed token stream and the per-step results of the
PyTorch reference training loop (tools/train_torch_ref.py) that `baton run`
must reproduce (tests/sh/test_moe.sh), like tools/gen_train_fixture.py does for
train_llama. transformers 5.24.0, torch 2.15.0 (CPU, float32; printed below).

Files written: config.json, model.safetensors, tokens.txt, expected.json
(hyper-parameters, per-step loss / lr / grad norm, checksums of the final
parameters under the checkpoint's per-expert names, and "min_gap": the
smallest gap between the k-th and (k+1)-th routing probability seen in any
forward of the run, which must stay clear of float rounding).
Run: python3 tools/gen_moe_train_fixture.py [OUTDIR]   (CPU, ~10 s)
"""
import json
import os
import sys

import torch
import transformers
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_torch_ref as ref  # noqa: E402
from gen_train_fixture import HP, token_stream  # noqa: E402
from gen_moe_fixtures import file_names  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "train_qwen2_moe")
MIN_GAP = 1e-5


def main():
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = Qwen2MoeConfig(vocab_size=256, hidden_size=32, intermediate_size=48,
                         moe_intermediate_size=24, shared_expert_intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                         mlp_only_layers=[0], output_router_logits=True,
                         router_aux_loss_coef=0.05, max_position_embeddings=64,
                         rms_norm_eps=1e-6, initializer_range=0.1, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    model = Qwen2MoeForCausalLM(cfg).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.mul_(4.0)  # routing well away from ties, an uneven load for the aux loss
    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)
    gen_cfg = os.path.join(OUT, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)
    tokens = token_stream(401, cfg.vocab_size, 7)
    with open(os.path.join(OUT, "tokens.txt"), "w") as f:
        f.write(" ".join(str(t) for t in tokens) + "\n")

    gaps = []

    def hook(_mod, _inp, out):
        probs = torch.softmax(out[0].detach().float(), dim=-1)
        top = torch.topk(probs, cfg.num_experts_per_tok + 1, dim=-1).values
        gaps.append(float((top[:, -2] - top[:, -1]).min()))

    for name, mod in model.named_modules():
        if name.endswith(".gate") and hasattr(mod, "top_k"):
            mod.register_forward_hook(hook)
    model.train()
    steps = ref.train(model, tokens, HP, on_step=lambda r: print(
        "step %2d loss %.6f lr %.6f norm %.6f" % (r["step"], r["loss"], r["lr"], r["grad_norm"])))
    gap = min(gaps)
    if gap < MIN_GAP:
        sys.exit(f"routing near-tie during training (gap {gap:.3g})")
    final = {}
    for name, t in file_names(model, False)(lambda p: p.detach()).items():
        d = t.double().flatten()
        final[name] = {"sum": d.sum().item(), "sumsq": (d * d).sum().item(),
                       "first": [float(x) for x in d[:4]]}
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"hyper": HP, "n_tokens": len(tokens), "steps": steps, "final": final,
                   "min_gap": gap, "transformers": transformers.__version__,
                   "torch": torch.__version__}, f, indent=1)
        f.write("\n")
    for fn in os.listdir(OUT):
        os.chmod(os.path.join(OUT, fn), 0o644)
    print(f"min routing gap over the run {gap:.3g}")


if __name__ == "__main__":
    main()
