#!/usr/bin/env python3
"""Reference fixtures of DeepseekV2ForCausalLM (tests/test_model_hf.c,
tests/test_mla.c), written by transformers' own DeepseekV2 class, in the
layout of tools/gen_moe_fixtures.py.

Written with transformers 5.24.0 and torch 2.15.0 (CPU, float32); the versions
are stored in each fixture's expected.json. Into tests/fixtures/<name>/:
  config.json + model.safetensors   save_pretrained (the experts one tensor per
                                    expert: ...mlp.experts.<e>.gate_proj.weight)
  ids.txt, ref.safetensors, expected.json   as gen_moe_fixtures.py: ids, lens,
    the pooled loss (f64), every logit, grad.<file name> for every tensor
    (the fused expert gradients cut per expert, gate first); expected.json's
    "min_gap" is the smallest routing margin of any token of any sparse
    layer: between the k-th and (k+1)-th expert and, group-limited, between
    the topk_group-th and next group score (a near-tie is refused)
  generate.json    transformers' greedy generate() of 20 tokens after a fixed
                   prompt, EOS ignored

Fixtures:
  deepseek_v2_lite  DeepSeek-V2-Lite style: q_lora_rank null (q_proj), greedy
                    top-2 of 6 experts, 2 shared experts, first_k_dense_replace
                    1 (layer 0 dense), default RoPE, v_head_dim != qk head dim
  deepseek_v2       full DeepSeek-V2 style: q_lora_rank set (q_a_proj,
                    q_a_layernorm, q_b_proj), group_limited_greedy top-3 of 8
                    experts in 4 groups (topk_group 2), routed_scaling_factor
                    2.5, YaRN rope scaling (factor 4, mscale != mscale_all_dim,
                    so both the tables' attention factor and the softmax scale
                    differ from 1), 1 shared expert

The reference case's model (tests/reference/test_reference.sh), written only
with --reference, so that the fixtures above stay as they are:
  deepseek_v2_ref   DeepSeek-V2-Lite's shape at tiny widths: 27 layers
                    (first_k_dense_replace 1, then 26 MoE layers of 8 experts,
                    greedy top-2, 2 shared experts), q_lora_rank null, YaRN
                    as Lite ships it (mscale = mscale_all_dim = 0.707), 2
                    heads (TP=2), v_head_dim != qk head dim; weights rounded to
                    bf16 and stored so (half the bytes); config.json,
                    model.safetensors, ids.txt and expected.json (the pooled
                    loss of the ids, f64, and the gradient norm) only

Usage: python3 tools/gen_deepseek_fixtures.py [OUTDIR]   (default tests/fixtures)
       python3 tools/gen_deepseek_fixtures.py --reference [OUTDIR]
       python3 tools/gen_deepseek_fixtures.py --check-export DIR FIXTURE
         loads DIR (an HF directory baton exported, e.g. `baton convert --from
         tests/fixtures/FIXTURE --to DIR`) with transformers and checks that it
         gives the fixture's loss on the fixture's sequences (rel 1e-6)
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
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import LENS, make_sequences  # noqa: E402

MIN_GAP = 1e-4
PROMPT = [64, 65, 66, 220, 67]


def fixture_specs():
    common = dict(vocab_size=256, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                  rms_norm_eps=1e-6, hidden_act="silu", initializer_range=0.1,
                  tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                  kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
                  moe_intermediate_size=12, first_k_dense_replace=1)
    return [
        ("deepseek_v2_lite",
         DeepseekV2Config(intermediate_size=40, num_hidden_layers=3, max_position_embeddings=64,
                          q_lora_rank=None, n_routed_experts=6, num_experts_per_tok=2,
                          n_shared_experts=2, topk_method="greedy", routed_scaling_factor=1.0,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                          **common)),
        ("deepseek_v2",
         DeepseekV2Config(intermediate_size=48, num_hidden_layers=3, max_position_embeddings=64,
                          q_lora_rank=12, n_routed_experts=8, num_experts_per_tok=3,
                          n_shared_experts=1, topk_method="group_limited_greedy", n_group=4,
                          topk_group=2, routed_scaling_factor=2.5,
                          rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                           "factor": 4.0, "original_max_position_embeddings": 16,
                                           "mscale": 0.707, "mscale_all_dim": 1.0,
                                           "beta_fast": 32.0, "beta_slow": 1.0},
                          **common)),
    ]


def reference_spec():
    return DeepseekV2Config(
        vocab_size=256, hidden_size=16, intermediate_size=32, num_hidden_layers=27,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6, hidden_act="silu", initializer_range=0.1, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, q_lora_rank=None, kv_lora_rank=8,
        qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6, moe_intermediate_size=4,
        first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2,
        topk_method="greedy", routed_scaling_factor=1.0,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 16, "mscale": 0.707,
                         "mscale_all_dim": 0.707, "beta_fast": 32.0, "beta_slow": 1.0})


def build_reference(outdir):
    name, cfg = "deepseek_v2_ref", reference_spec()
    seqs = make_sequences(cfg.vocab_size, 41)
    for seed in range(4100, 4150):
        model = random_model(cfg, seed)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
        gap = routing_gap(model, seqs, cfg)
        if gap >= MIN_GAP:
            break
    else:
        sys.exit(f"{name}: every seed routes some token on a near-tie")
    d = os.path.join(outdir, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    gen = os.path.join(d, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    model = DeepseekV2ForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    assert routing_gap(model, seqs, cfg) == gap
    total_n = sum(len(s) - 1 for s in seqs)
    model.zero_grad()
    loss = 0.0
    for s in seqs:
        out = model(input_ids=s[None, :], labels=s[None, :])
        (out.loss * ((len(s) - 1) / total_n)).backward()
        loss += out.loss.double().item() * (len(s) - 1) / total_n
    grad_norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in model.parameters()))
    with open(os.path.join(d, "ids.txt"), "w") as f:
        for s in seqs:
            f.write(" ".join(str(int(t)) for t in s) + "\n")
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"tokens": total_n, "loss": loss, "ppl": math.exp(loss), "grad_norm": grad_norm,
                   "min_gap": gap, "seed": seed,
                   "transformers": transformers.__version__, "torch": torch.__version__},
                  f, indent=1)
        f.write("\n")
    for fn in os.listdir(d):
        os.chmod(os.path.join(d, fn), 0o644)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{name}: loss {loss:.6f} tokens {total_n} params {n_params} "
          f"min routing gap {gap:.3g} (seed {seed})")


def file_names(model):
    """{checkpoint tensor name: tensor} for a parameter-sized map get(p): the
    fused experts cut per expert the way save_pretrained writes them."""
    def cut(get):
        out = {}
        for name, p in model.named_parameters():
            t = get(p)
            m = re.match(r"(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$", name)
            if m:
                for e in range(t.shape[0]):
                    if m.group(2) == "gate_up_proj":
                        f = t.shape[1] // 2
                        out[f"{m.group(1)}.{e}.gate_proj.weight"] = t[e, :f]
                        out[f"{m.group(1)}.{e}.up_proj.weight"] = t[e, f:]
                    else:
                        out[f"{m.group(1)}.{e}.down_proj.weight"] = t[e]
                continue
            out[name] = t
        return out
    return cut


def routing_gap(model, seqs, cfg):
    """The smallest routing margin over every token of every sparse layer."""
    gaps = []
    hooks = []
    k = cfg.num_experts_per_tok

    def hook(_mod, _inp, out):
        scores = torch.softmax(out[0].detach().float(), dim=-1)
        if cfg.topk_method == "group_limited_greedy":
            g = scores.view(-1, cfg.n_group, cfg.n_routed_experts // cfg.n_group).max(-1).values
            top = torch.topk(g, cfg.topk_group + 1, dim=-1).values
            gaps.append(float((top[:, cfg.topk_group - 1] - top[:, cfg.topk_group]).min()))
            idx = torch.topk(g, cfg.topk_group, dim=-1).indices
            mask = torch.zeros_like(g).scatter_(1, idx, 1).repeat_interleave(
                cfg.n_routed_experts // cfg.n_group, dim=1)
            scores = scores.masked_fill(mask == 0, 0.0)
        top = torch.topk(scores, k + 1, dim=-1).values
        gaps.append(float((top[:, k - 1] - top[:, k]).min()))

    for name, mod in model.named_modules():
        if name.endswith(".mlp.gate"):
            hooks.append(mod.register_forward_hook(hook))
    assert hooks
    with torch.no_grad():
        for s in seqs:
            model(input_ids=s[None, :])
    for h in hooks:
        h.remove()
    return min(gaps)


def random_model(cfg, seed):
    torch.manual_seed(seed)
    model = DeepseekV2ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif pname.endswith("mlp.gate.weight"):
                # transformers starts the router at zero: every score tied
                p.copy_(0.4 * torch.randn_like(p))
    return model


def build(outdir, idx, name, cfg):
    seqs = make_sequences(cfg.vocab_size, 11 + idx)
    for seed in range(3000 + 100 * idx, 3000 + 100 * idx + 50):
        model = random_model(cfg, seed)
        gap = routing_gap(model, seqs, cfg)
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
    model = DeepseekV2ForCausalLM.from_pretrained(d, dtype=torch.float32).eval()

    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        stored = {k: f.get_tensor(k) for k in f.keys()}
    values = file_names(model)(lambda p: p.detach())
    assert set(values) == set(stored), sorted(set(values) ^ set(stored))
    for k, v in values.items():
        assert torch.equal(v, stored[k]), k
    assert routing_gap(model, seqs, cfg) == gap

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
    grads = file_names(model)(lambda p: p.grad.detach())
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
                   "grad_norm": math.sqrt(sumsq), "min_gap": gap, "seed": seed,
                   "softmax_scale": model.model.layers[0].self_attn.scaling,
                   "rope_attention_factor": model.model.rotary_emb.attention_scaling,
                   "transformers": transformers.__version__, "torch": torch.__version__},
                  f, indent=1)
        f.write("\n")
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
    print(f"{name}: loss {loss:.6f} tokens {total_n} params {n_params} "
          f"min routing gap {gap:.3g} (seed {seed}) scale {model.model.layers[0].self_attn.scaling:.6f} "
          f"rope factor {model.model.rotary_emb.attention_scaling:.6f}")


def check_export(d, fixture):
    model = DeepseekV2ForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    fx = os.path.join("tests/fixtures", fixture)
    want = json.load(open(os.path.join(fx, "expected.json")))["loss"]
    seqs = [torch.tensor([int(t) for t in line.split()]) for line in open(os.path.join(fx, "ids.txt"))]
    total = sum(len(s) - 1 for s in seqs)
    with torch.no_grad():
        loss = sum(model(input_ids=s[None, :], labels=s[None, :]).loss.item() * (len(s) - 1)
                   for s in seqs) / total
    rel = abs(loss - want) / abs(want)
    print(f"{d}: transformers loss {loss:.9f}, fixture {want:.9f}, rel {rel:.2e}")
    sys.exit(0 if rel <= 1e-6 else 1)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--check-export":
        check_export(sys.argv[2], sys.argv[3])
        return
    torch.set_num_threads(1)
    if len(sys.argv) > 1 and sys.argv[1] == "--reference":
        build_reference(sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures")
        return
    outdir = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for idx, (name, cfg) in enumerate(fixture_specs()):
        build(outdir, idx, name, cfg)


if __name__ == "__main__":
    main()
