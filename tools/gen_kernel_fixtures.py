#!/usr/bin/env python3
"""Writes tests/fixtures/adamw.json: parameter trajectories of
torch.optim.AdamW (foreach=False, fused=False: the single-tensor path) in
float32, which tests/test_kernels_adamw.c replays through kern_adamw.

Each case: hyper-parameters, the initial parameter, and per step the gradient
fed in and the parameter, exp_avg and exp_avg_sq after the step. Numbers are
float32 values written as Python floats (exact, round-trip).

Usage: python3 tools/gen_kernel_fixtures.py [out.json]
"""
import json
import sys

import torch

MAGIC = "baton-kernel-fixture"
VERSION = 1


def case(name, n, steps, lr, betas, eps, wd, seed, grad_scales):
    g = torch.Generator().manual_seed(seed)
    p = torch.nn.Parameter(torch.randn(n, generator=g, dtype=torch.float32))
    init = p.detach().clone()
    opt = torch.optim.AdamW([p], lr=lr, betas=betas, eps=eps, weight_decay=wd,
                            foreach=False, fused=False)
    out_steps = []
    for s in range(steps):
        scale = grad_scales[s % len(grad_scales)]
        grad = (torch.randn(n, generator=g, dtype=torch.float32) * scale).to(torch.float32)
        p.grad = grad.clone()
        opt.step()
        st = opt.state[p]
        out_steps.append({
            "grad": [float(x) for x in grad.tolist()],
            "param": [float(x) for x in p.detach().tolist()],
            "exp_avg": [float(x) for x in st["exp_avg"].tolist()],
            "exp_avg_sq": [float(x) for x in st["exp_avg_sq"].tolist()],
        })
    return {
        "name": name, "lr": lr, "beta1": betas[0], "beta2": betas[1], "eps": eps,
        "weight_decay": wd, "init": [float(x) for x in init.tolist()], "steps": out_steps,
    }


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/adamw.json"
    cases = [
        case("default_wd0.1", 37, 10, 1e-3, (0.9, 0.999), 1e-8, 0.1, 1, [1.0]),
        case("lr3e-2_nowd", 19, 10, 3e-2, (0.8, 0.99), 1e-6, 0.0, 2, [1.0, 1e-3]),
        case("tiny_grads_eps", 23, 12, 6e-4, (0.9, 0.95), 1e-8, 0.01, 3, [1e-7, 1e-9, 2.0]),
    ]
    doc = {"magic": MAGIC, "version": VERSION, "torch": torch.__version__, "adamw": cases}
    with open(out, "w") as f:
        json.dump(doc, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
