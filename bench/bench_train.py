#!/usr/bin/env python3
"""PyTorch side of `baton bench train`: the same small Llama trained with
AdamW + clipping on random token windows, CPU eager, fixed thread count.
Prints 'RESULT tokens_per_s=<x> first_loss=<y>' (parsed by bench_train.c),
or 'NO_TORCH' when torch/transformers cannot be imported."""
import argparse
import time

try:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError:
    print("NO_TORCH")
    raise SystemExit(2)


def main():
    ap = argparse.ArgumentParser()
    for k, v in [("layers", 4), ("hidden", 256), ("heads", 8), ("kv-heads", 8), ("ffn", 768),
                 ("vocab", 8192), ("seq", 256), ("batch", 4), ("steps", 5), ("warmup", 1),
                 ("threads", 2)]:
        ap.add_argument("--" + k, type=int, default=v)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, max_position_embeddings=a.seq,
                      initializer_range=0.02, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).float().train()
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    total = a.steps + a.warmup
    toks = torch.randint(0, a.vocab, (total, a.batch, a.seq + 1))
    first = None
    t0 = None
    for s in range(total):
        if s == a.warmup:
            t0 = time.perf_counter()
        ids, tgt = toks[s, :, :-1], toks[s, :, 1:]
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, a.vocab), tgt.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if first is None:
            first = loss.item()
    dt = time.perf_counter() - t0
    print("RESULT tokens_per_s=%.3f first_loss=%.6f" % (a.steps * a.batch * a.seq / dt, first))


if __name__ == "__main__":
    main()
