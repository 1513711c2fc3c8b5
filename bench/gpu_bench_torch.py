#!/usr/bin/env python3
"""The PyTorch reference of bench/gpu_bench.sh, one measurement per process.

    gpu_bench_torch.py peak  [--n 8192 --warmup 3 --reps 20]
        the bf16 matrix peak (torch.matmul of random n x n x n bf16 matrices,
        median of reps timed with CUDA events) and the versions this runs under
    gpu_bench_torch.py train --layers L --hidden C --heads H --kv-heads K --ffn F
                             --vocab V --seq T --batch B [--tie] [--rope-theta X]
                             [--warmup 5 --steps 20] [--no-compile] [--device cuda]
                             [--profile N --profile-out DIR]
        training steps of transformers' LlamaForCausalLM built from that config
        (random init, nothing downloaded) in the common torch.compile setup:
        fp32 parameters, torch.autocast(bfloat16) around the forward, the loss
        from labels = input_ids (transformers shifts them), backward, gradient
        clipping at 1.0, AdamW(fused=True) with weight decay 0.1 on matrices;
        warm-up steps excluded, every measured step timed with CUDA events;
        --profile N then runs one more step and N steps under torch.profiler
        (CPU and CUDA activities): DIR/torch_profile.txt (key_averages sorted by
        self device time, then by total device time) and DIR/torch_trace.json.gz
        (the chrome trace, for bench/gpu_profile/summarize.py)

Each command prints what it did on stderr and one line "RESULT {json}" on
stdout for the shell script. MFU is not computed here: gpu_bench.sh takes the
FLOPs per token from `baton flops` (model/flops.h), so baton and torch are
divided by the same count. torch is imported inside the commands, so --help
and py_compile work where torch is not installed.
"""
import argparse
import inspect
import json
import math
import statistics
import sys
import time


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def result(d):
    print("RESULT " + json.dumps(d), flush=True)


def versions(torch):
    import platform
    v = {"python": platform.python_version(), "torch": torch.__version__,
         "torch_cuda": torch.version.cuda, "cudnn": None, "transformers": None, "triton": None,
         "gpu": None}
    try:
        import transformers
        v["transformers"] = transformers.__version__
    except ImportError:
        pass
    try:
        import triton
        v["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.backends.cudnn.is_available():
        v["cudnn"] = torch.backends.cudnn.version()
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        v["gpu"] = "%s, %d SMs, %.1f GiB, sm_%d%d" % (p.name, p.multi_processor_count,
                                                     p.total_memory / 2**30, p.major, p.minor)
    return v


def cmd_peak(a):
    import torch
    if not torch.cuda.is_available():
        log("peak: no CUDA device")
        return 2
    v = versions(torch)
    log("versions: " + json.dumps(v))
    n = a.n
    g = torch.Generator(device="cuda").manual_seed(1)
    # three input sets in turn, each 2 x 128 MiB at n = 8192: more than the L2
    sets = [(torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g),
             torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)) for _ in range(3)]
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for i in range(a.warmup):
        torch.matmul(*sets[i % 3], out=out)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(a.reps)]
    for i, (s, e) in enumerate(ev):
        s.record()
        torch.matmul(*sets[i % 3], out=out)
        e.record()
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in ev]
    med = statistics.median(ms)
    tflops = 2.0 * n ** 3 / (med * 1e-3) / 1e12
    log("peak: bf16 %dx%dx%d torch.matmul, median %.3f ms of %d (min %.3f, max %.3f): %.1f TFLOP/s"
        % (n, n, n, med, len(ms), min(ms), max(ms), tflops))
    result({"what": "peak", "n": n, "reps": a.reps, "median_ms": med, "tflops": tflops,
            "versions": v})
    return 0


def register_causal_sdpa():
    """--attn causal_sdpa: transformers' sdpa path, but the attention call always
    says is_causal=True and gets no mask tensor. Under torch.compile transformers
    (5.17) hands SDPA a materialised [B,1,T,T] mask instead of is_causal, and a
    masked SDPA computes the whole T x T square: this variant shows torch with its
    attention's causal half only."""
    import torch.nn.functional as F
    from transformers import AttentionInterface

    def causal_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                    **kwargs):
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling,
                                             enable_gqa=query.shape[1] != key.shape[1])
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register("causal_sdpa", causal_sdpa)
    try:  # no mask is built for it (None is what sdpa_mask returns when it may skip)
        from transformers import AttentionMaskInterface
        AttentionMaskInterface.register("causal_sdpa", lambda *args, **kwargs: None)
    except ImportError:
        pass


def cmd_train(a):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    if a.attn == "causal_sdpa":
        register_causal_sdpa()
    dev = a.device
    if dev == "cuda" and not torch.cuda.is_available():
        log("train: no CUDA device")
        return 2
    torch.manual_seed(a.seed)
    # transformers 5 keeps RoPE's base in rope_parameters (as tools/gen_fixtures.py
    # writes it); older releases take rope_theta
    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:
        rope = {"rope_parameters": {"rope_type": "default", "rope_theta": a.rope_theta}}
    else:
        rope = {"rope_theta": a.rope_theta}
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, max_position_embeddings=a.seq,
                      rms_norm_eps=1e-5, tie_word_embeddings=a.tie, attention_bias=False,
                      mlp_bias=False, use_cache=False, initializer_range=0.02,
                      attn_implementation=a.attn, **rope)
    t0 = time.time()
    with torch.device(dev):
        model = LlamaForCausalLM(cfg)
    model.train()
    params = list(model.parameters())  # shared (tied) tensors once
    n_params = sum(p.numel() for p in params)
    dtypes = sorted({str(p.dtype) for p in params})
    attn_impl = getattr(model.config, "_attn_implementation", None)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=(dev == "cuda"))
    run = torch.compile(model) if a.compile else model
    setup = ("fp32 parameters and AdamW state, torch.autocast(bfloat16) forward, %s, attention "
             "%s, AdamW(fused=%s), clip_grad_norm_ 1.0, loss from labels=input_ids"
             % ("torch.compile (default mode)" if a.compile else "eager (no torch.compile)",
                attn_impl, dev == "cuda"))
    log("train: %d parameters (%s), built in %.1f s; %s" % (n_params, "/".join(dtypes),
                                                             time.time() - t0, setup))
    g = torch.Generator(device=dev).manual_seed(a.seed)
    batches = [torch.randint(0, a.vocab, (a.batch, a.seq), device=dev, generator=g)
               for _ in range(4)]

    def step(x):
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = run(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    # warm-up: the first step compiles the forward and the backward. Should
    # compilation fail, the row is measured eagerly and says so (setup).
    t0 = time.time()
    try:
        step(batches[0])
    except Exception as e:  # noqa: BLE001 (anything torch.compile raises)
        if not a.compile:
            raise
        import traceback
        traceback.print_exc()
        log("train: torch.compile failed (%s): measuring eager mode instead" % type(e).__name__)
        run = model
        setup = setup.replace("torch.compile (default mode)",
                              "EAGER: torch.compile failed with %s" % type(e).__name__)
        opt.zero_grad(set_to_none=True)
        if dev == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        step(batches[0])
    sync()
    first_s = time.time() - t0
    for i in range(1, a.warmup):
        step(batches[i % len(batches)])
    sync()
    log("train: first step (compilation included) %.1f s, %d warm-up steps in %.1f s"
        % (first_s, a.warmup, time.time() - t0))
    loss = None
    if dev == "cuda":
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(a.steps + 1)]
        t0 = time.time()
        ev[0].record()
        for i in range(a.steps):
            loss = step(batches[i % len(batches)])
            ev[i + 1].record()
        sync()
        wall = time.time() - t0
        ms = [ev[i].elapsed_time(ev[i + 1]) for i in range(a.steps)]
    else:  # the CPU check of the script itself: host clock around each step
        ms, t0 = [], time.time()
        for i in range(a.steps):
            s = time.time()
            loss = step(batches[i % len(batches)])
            ms.append((time.time() - s) * 1e3)
        wall = time.time() - t0
    final_loss = float(loss)
    if a.profile:
        profile_steps(a, torch, step, batches, sync)
    med = statistics.median(ms)
    tokens = a.batch * a.seq
    d = {"what": "train", "impl": "torch", "tokens_per_step": tokens, "steps": a.steps,
         "warmup": a.warmup, "step_ms_median": med, "step_ms_mean": statistics.mean(ms),
         "step_ms_min": min(ms), "step_ms_max": max(ms), "step_ms": ms,
         "tokens_per_s": tokens / (med * 1e-3), "wall_tokens_per_s": tokens * a.steps / wall,
         "first_step_s": first_s, "final_loss": final_loss, "params": n_params,
         "param_dtypes": dtypes, "attn_implementation": attn_impl, "setup": setup}
    if dev == "cuda":
        d["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        d["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    log("train: median step %.2f ms (%.0f tokens/s), mean %.2f, min %.2f, max %.2f; loss %.4f%s"
        % (med, d["tokens_per_s"], d["step_ms_mean"], d["step_ms_min"], d["step_ms_max"],
           final_loss, "; max_memory_allocated %.2f GiB, reserved %.2f GiB"
           % (d["max_memory_allocated"] / 2**30, d["max_memory_reserved"] / 2**30)
           if dev == "cuda" else ""))
    if not math.isfinite(final_loss):
        log("train: the loss is not finite")
        return 1
    result(d)
    return 0


def profile_steps(a, torch, step, batches, sync):
    import gzip
    import os
    import shutil
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU]
    if a.device == "cuda":
        acts.append(ProfilerActivity.CUDA)
    os.makedirs(a.profile_out, exist_ok=True)
    t0 = time.time()
    step(batches[0])
    sync()
    with profile(activities=acts) as prof:
        for i in range(a.profile):
            step(batches[(i + 1) % len(batches)])
            sync()
            prof.step()
    log("profile: %d steps (+1 warm-up) under torch.profiler in %.1f s" % (a.profile, time.time() - t0))
    ka = prof.key_averages()
    with open(os.path.join(a.profile_out, "torch_profile.txt"), "w") as f:
        for key in ("self_device_time_total", "device_time_total"):
            for k2 in (key, key.replace("device", "cuda")):
                try:
                    tbl = ka.table(sort_by=k2, row_limit=60, max_name_column_width=90)
                except Exception as e:  # noqa: BLE001 (the key's name changed across releases)
                    log("profile: sort_by=%s: %s" % (k2, e))
                    continue
                f.write("==== key_averages, %d active steps, sort_by=%s\n%s\n" % (a.profile, k2, tbl))
                break
    trace = os.path.join(a.profile_out, "torch_trace.json")
    prof.export_chrome_trace(trace)
    with open(trace, "rb") as fi, gzip.open(trace + ".gz", "wb") as fo:
        shutil.copyfileobj(fi, fo)
    os.remove(trace)
    log("profile: wrote %s and %s.gz" % (os.path.join(a.profile_out, "torch_profile.txt"), trace))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("peak", help="bf16 matrix peak and versions")
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=20)
    t = sub.add_parser("train", help="training steps of LlamaForCausalLM")
    for name in ("layers", "hidden", "heads", "kv-heads", "ffn", "vocab", "seq", "batch"):
        t.add_argument("--" + name, type=int, required=True)
    t.add_argument("--tie", action="store_true", help="tie the head to the embedding")
    t.add_argument("--rope-theta", type=float, default=10000.0)
    t.add_argument("--warmup", type=int, default=5)
    t.add_argument("--steps", type=int, default=20)
    t.add_argument("--seed", type=int, default=1234)
    t.add_argument("--attn", default="sdpa", help="transformers attn_implementation, or "
                   "causal_sdpa (SDPA told is_causal, no mask tensor)")
    t.add_argument("--no-compile", dest="compile", action="store_false")
    t.add_argument("--device", default="cuda")
    t.add_argument("--profile", type=int, default=0, help="steps under torch.profiler after the timed ones")
    t.add_argument("--profile-out", default="/tmp/torch_profile")
    a = ap.parse_args()
    if a.cmd == "train" and (a.warmup < 1 or a.steps < 1):
        ap.error("--warmup and --steps must be at least 1")
    return cmd_peak(a) if a.cmd == "peak" else cmd_train(a)


if __name__ == "__main__":
    sys.exit(main())
