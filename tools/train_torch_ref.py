#!/usr/bin/env python3
"""PyTorch reference of baton's single-process training loop.

Implements exactly what train/train.c, train/optim.c and train/lr_schedule.c
do, so that a fixture run of both can be compared step by step:

  * data order: windows of T+1 tokens at stride T, visited per epoch in the
    order of a Fisher-Yates shuffle driven by xoshiro256** seeded with four
    splitmix64 outputs of (seed ^ epoch * 0x9E3779B97F4A7C15);
  * accumulation: every microbatch's loss is sum(NLL) / (scored positions of
    the whole global batch), so the accumulated gradient is the gradient of
    the mean over the global batch;
  * a mixture-of-experts model with output_router_logits adds its router's
    load-balancing loss (out.aux_loss, over the microbatch's tokens) times
    router_aux_loss_coef, weighted by the microbatch's share of the scored
    positions (model/kind.h, loss_end);
  * clipping: torch.nn.utils.clip_grad_norm_(max_norm);
  * optimizer: torch.optim.AdamW(foreach=False), weight decay on tensors with
    p.dim() >= 2 ("matrices"), or all / none;
  * learning rate: linear warmup then cosine decay (lr_at below, same formula
    as docs/JOBS.md).
Used by tools/gen_train_fixture.py; importable on its own.
"""
import math

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + GOLDEN) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)


def _rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & MASK64


class Xoshiro256ss:
    def __init__(self, seed):
        sm = SplitMix64(seed)
        self.s = [sm.next() for _ in range(4)]

    def next(self):
        s = self.s
        result = (_rotl((s[1] * 5) & MASK64, 7) * 9) & MASK64
        t = (s[1] << 17) & MASK64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = _rotl(s[3], 45)
        return result

    def below(self, bound):
        return (self.next() * bound) >> 64


class Sampler:
    """Window index of global sample g (train_sampler_window in train/train.c)."""

    def __init__(self, seed, n_windows):
        self.seed, self.n, self.epoch, self.perm = seed, n_windows, -1, None

    def window(self, g):
        epoch = g // self.n
        if epoch != self.epoch:
            rng = Xoshiro256ss(self.seed ^ ((epoch * GOLDEN) & MASK64))
            perm = list(range(self.n))
            for i in range(self.n - 1, 0, -1):
                j = rng.below(i + 1)
                perm[i], perm[j] = perm[j], perm[i]
            self.perm, self.epoch = perm, epoch
        return self.perm[g % self.n]


def lr_at(step, lr, min_lr, warmup, total, warmup_from_min=False):
    """0-based optimizer step -> learning rate (train/lr_schedule.c)."""
    if step < warmup:
        lr0 = min_lr if warmup_from_min else 0.0
        return lr0 + (lr - lr0) * (step + 1) / warmup
    if step >= total:
        return min_lr
    p = (step - warmup + 1) / (total - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * p))


def param_groups(model, weight_decay, decay="matrices"):
    dec, nodec = [], []
    for _, p in model.named_parameters():
        want = {"matrices": p.dim() >= 2, "all": True, "none": False}[decay]
        (dec if want else nodec).append(p)
    return [{"params": dec, "weight_decay": weight_decay},
            {"params": nodec, "weight_decay": 0.0}]


def train(model, tokens, hp, on_step=None):
    """Run hp["steps"] optimizer steps; return per-step dicts.

    hp keys: steps, micro_batch, grad_accum, seq_len, seed, lr, min_lr,
    warmup, warmup_from_min, betas, eps, weight_decay, clip, decay."""
    import torch
    import torch.nn.functional as F

    T, B, K = hp["seq_len"], hp["micro_batch"], hp["grad_accum"]
    toks = torch.tensor(tokens, dtype=torch.long)
    sampler = Sampler(hp["seed"], (len(tokens) - 1) // T)
    opt = torch.optim.AdamW(param_groups(model, hp["weight_decay"], hp.get("decay", "matrices")),
                            lr=hp["lr"], betas=tuple(hp["betas"]), eps=hp["eps"], foreach=False)
    params = [p for p in model.parameters()]
    cfg = model.config
    aux_coef = cfg.router_aux_loss_coef if getattr(cfg, "output_router_logits", False) else 0.0
    out = []
    for s in range(hp["steps"]):
        rows = []
        for k in range(K):
            for b in range(B):
                w = sampler.window((s * K + k) * B + b)
                rows.append(toks[w * T: w * T + T + 1])
        batch = torch.stack(rows).view(K, B, T + 1)
        scored = K * B * T
        opt.zero_grad(set_to_none=False)
        loss_sum = 0.0
        for k in range(K):
            ids, tgt = batch[k, :, :T], batch[k, :, 1:]
            res = model(input_ids=ids, **({"output_router_logits": True} if aux_coef else {}))
            logits = res.logits
            nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tgt.reshape(-1),
                                  reduction="sum")
            term = nll / scored
            if aux_coef:
                aux = aux_coef * res.aux_loss * (B * T)
                term = term + aux / scored
                loss_sum += aux.item()
            term.backward()
            loss_sum += nll.item()
        if hp["clip"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, hp["clip"]).item()
        else:
            norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)).item()
        lr = lr_at(s, hp["lr"], hp["min_lr"], hp["warmup"], hp["steps"], hp.get("warmup_from_min", False))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        rec = {"step": s + 1, "loss": loss_sum / scored, "lr": lr, "grad_norm": norm}
        out.append(rec)
        if on_step:
            on_step(rec)
    return out
