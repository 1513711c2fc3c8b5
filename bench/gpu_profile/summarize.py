#!/usr/bin/env python3
"""Per-kernel time of one training step, from a kernel timeline (issue 13 item 4).

    summarize.py baton FILE.csv [--warmup 3] [--gemm-tflop X] [--peak 800]
        FILE.csv from bench/gpu_profile/cupti_trace.c (CUPTI activity records of a
        `baton run`); steps are cut after each group of k_adamw launches, the first
        --warmup steps and any step after the last such group are left out
    summarize.py torch TRACE.json[.gz] [--steps N] [--gemm-tflop X] [--peak 800]
        a torch.profiler chrome trace of N active steps (gpu_bench_torch.py --profile)

Prints, per step (the mean over the steps kept): the span from the step's first
kernel start to its last kernel end, the time the GPU ran any kernel (the union of
kernel intervals), the sum of kernel times, then the kernels grouped by name
(demangled with c++filt where it exists, template arguments shortened) with their
total ms a step, launches a step and share of the kernel sum, and the same by class
(GEMM = cuBLASLt / cuBLAS / CUTLASS kernels, attention, and the rest). With
--gemm-tflop (the matrix-product FLOPs of a step outside attention), the GEMMs'
achieved TFLOP/s and their fraction of --peak.
"""
import argparse
import collections
import gzip
import json
import re
import shutil
import subprocess
import sys


def demangle(names):
    names = list(names)
    if not names or not shutil.which("c++filt"):
        return {n: n for n in names}
    p = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True)
    out = p.stdout.split("\n")
    return {n: (out[i] if i < len(out) and out[i] else n) for i, n in enumerate(names)}


def short(name, width=90):
    # drop template arguments and parameter lists: k_add<__nv_bfloat16>(...) -> k_add<..>
    s = name
    for _ in range(8):
        t = re.sub(r"<[^<>]*>", "<>", s)
        if t == s:
            break
        s = t
    s = re.sub(r"\([^()]*\)$", "", s)
    s = s.replace("void ", "", 1) if s.startswith("void ") else s
    return s if len(s) <= width else s[:width - 3] + "..."


GEMM_RE = re.compile(r"nvjet|gemm|xmma|cutlass|cublas|splitkreduce|sm90_.*(tn|nt|nn|tt)_", re.I)
ATTN_RE = re.compile(r"attn|flash|fmha|sdpa|attention|cudnn::fusion", re.I)

# what each kernel does, for baton's kernels and torch.compile's (Triton kernel names
# list the aten ops they fuse); the first pattern that matches names the kernel
FUNCS = [
    ("matrix products (GEMM)", None),
    ("attention forward", r"k_attn_fwd|flash_fprop"),
    ("attention backward", r"k_attn_bwd|k_attn_delta|flash_bprop|compute_dot_do_o|convert_dq"),
    ("cross-entropy (torch: + dlogits fill)", r"xent|log_softmax|FillFunctor|_nll_"),
    ("residual add + RMSNorm forward", r"k_add|k_rmsnorm_fwd|mean_mul_pow_rsqrt"),
    ("RMSNorm backward (dx, dw)", r"k_rmsnorm_bwd|colsum|div_expand_mul_pow_sum|reduce_kernel"),
    ("SwiGLU backward", r"swiglu_bwd|silu_backward"),
    ("SwiGLU forward", r"swiglu_fwd|mul_silu"),
    ("RoPE (torch: + head transposes, q/k/v cat)", r"k_rope|cos_mul_neg_sin"),
    ("optimizer, gradient norm and clip", r"adamw|multi_tensor|k_reduce_partial|k_reduce_finish"),
    ("embedding", r"embedding|radix_sort"),
    ("casts (torch: fp32 weights to bf16)", r"to_copy"),
    ("copies / memsets", r"^memcpy|^memset$|^Memset|^Memcpy"),
]


def func(name):
    for label, pat in FUNCS:
        if pat is None:
            if klass(name).startswith("GEMM"):
                return label
        elif re.search(pat, name):
            return label
    return "other"


def klass(name):
    if GEMM_RE.search(name) and not ATTN_RE.search(name):
        return "GEMM (cuBLASLt/cuBLAS/CUTLASS)"
    if ATTN_RE.search(name):
        return "attention"
    if re.search(r"adam|multi_tensor|foreach", name, re.I):
        return "optimizer"
    if name.startswith("triton_"):
        return "triton (other fused)"
    if name.startswith("memcpy") or name == "memset":
        return "copies / memsets"
    return "other kernels"


def union_ns(iv):
    tot, cur_s, cur_e = 0, None, None
    for s, e in sorted(iv):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                tot += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        tot += cur_e - cur_s
    return tot


def report(title, steps, a, n=None):
    """steps: list of lists of (start_ns, end_ns, name); n: the steps they hold
    (len(steps) unless one list holds several)."""
    n = n or len(steps)
    print("== %s: %d step(s) kept" % (title, n))
    if n == 0:
        return
    spans = [max(e for _, e, _ in st) - min(s for s, _, _ in st) for st in steps]
    busy = [union_ns([(s, e) for s, e, _ in st]) for st in steps]
    ksum = [sum(e - s for s, e, _ in st) for st in steps]
    ms = lambda v: v / 1e6
    print("step span (first kernel start to last kernel end): mean %.2f ms (%s)"
          % (ms(sum(spans) / n), ", ".join("%.2f" % ms(v) for v in spans)))
    print("GPU busy (union of kernel intervals): mean %.2f ms = %.1f%% of the span"
          % (ms(sum(busy) / n), 100.0 * sum(busy) / sum(spans)))
    print("sum of kernel times: mean %.2f ms; launches a step: %.0f"
          % (ms(sum(ksum) / n), sum(len(st) for st in steps) / n))
    names = {nm for st in steps for _, _, nm in st}
    dem = demangle(names)
    by = collections.defaultdict(lambda: [0, 0])
    cls = collections.defaultdict(lambda: [0, 0])
    for st in steps:
        for s, e, nm in st:
            key = short(dem[nm])
            by[key][0] += e - s
            by[key][1] += 1
            c = klass(dem[nm])
            cls[c][0] += e - s
            cls[c][1] += 1
    total = sum(ksum)
    fn = collections.defaultdict(lambda: [0, 0])
    for st in steps:
        for s, e, nm in st:
            f = func(dem[nm])
            fn[f][0] += e - s
            fn[f][1] += 1
    print("\nby function                                  ms/step   share  launches/step")
    for f in [x for x, _ in FUNCS] + ["other"]:
        if f in fn:
            print("%-44s %8.2f %6.1f%% %8.1f" % (f, ms(fn[f][0] / n), 100.0 * fn[f][0] / total,
                                                fn[f][1] / n))
    print("\nby class              ms/step   share  launches/step")
    for c, (t, k) in sorted(cls.items(), key=lambda x: -x[1][0]):
        print("%-30s %8.2f %6.1f%% %8.1f" % (c, ms(t / n), 100.0 * t / total, k / n))
    g = cls.get("GEMM (cuBLASLt/cuBLAS/CUTLASS)")
    if g and a.gemm_tflop:
        gms = ms(g[0] / n)
        tf = a.gemm_tflop / (gms * 1e-3)
        print("GEMMs: %.2f TFLOP a step in %.2f ms: %.0f TFLOP/s, %.1f%% of the %.0f TFLOP/s peak"
              % (a.gemm_tflop, gms, tf, 100.0 * tf / a.peak, a.peak))
        print("       (whole step at the kernel-sum: %.1f%% of its time in GEMMs; span: %.1f%%)"
              % (100.0 * g[0] / total, 100.0 * g[0] / sum(spans)))
    print("\nms/step  share  launches/step  us/launch  kernel")
    for key, (t, k) in sorted(by.items(), key=lambda x: -x[1][0])[:a.top]:
        print("%7.3f %5.1f%% %8.1f %10.1f  %s" % (ms(t / n), 100.0 * t / total, k / n,
                                                 t / k / 1e3, key))
    print()


def baton(a):
    recs = []
    with open(a.file) as f:
        for line in f:
            if line.startswith(("kind,", "#")):
                continue
            p = line.rstrip("\n").split(",", 11)
            if len(p) < 12:
                continue
            kind, s, e = p[0], int(p[1]), int(p[2])
            name = p[11] if kind == "K" else ("memset" if kind == "S" else p[11])
            recs.append((s, e, name, kind))
    recs.sort()
    print("%s: %d records (%d kernels)" % (a.file, len(recs), sum(r[3] == "K" for r in recs)))
    # a step ends after a group of k_adamw launches
    ends = [i for i, r in enumerate(recs)
            if "adamw" in r[2] and (i + 1 == len(recs) or "adamw" not in recs[i + 1][2])]
    print("optimizer groups (step ends) found: %d" % len(ends))
    steps, prev = [], -1
    for i in ends:
        steps.append([(s, e, nm) for s, e, nm, _ in recs[prev + 1:i + 1]])
        prev = i
    kept = steps[a.warmup:]
    # the period: from the previous step's last kernel end to this one's (the host's
    # gaps between steps included)
    per = [max(e for _, e, _ in steps[i]) - max(e for _, e, _ in steps[i - 1])
           for i in range(max(a.warmup, 1), len(steps))]
    if per:
        print("step period (last kernel end to last kernel end): mean %.2f ms (%s)"
              % (sum(per) / len(per) / 1e6, ", ".join("%.2f" % (v / 1e6) for v in per)))
    report("baton, steps %d..%d" % (a.warmup + 1, len(steps)), kept, a)


def torch_(a):
    op = gzip.open if a.file.endswith(".gz") else open
    with op(a.file, "rt") as f:
        tr = json.load(f)
    ev = tr["traceEvents"] if isinstance(tr, dict) else tr
    k = [(int(float(e["ts"]) * 1000), int((float(e["ts"]) + float(e.get("dur", 0))) * 1000), e["name"])
         for e in ev if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    k.sort()
    print("%s: %d GPU events" % (a.file, len(k)))
    # the active steps' GPU events, cut by the profiler's step annotations on the GPU
    # side where present, else divided evenly
    marks = sorted((float(e["ts"]) * 1000, float(e["ts"]) * 1000 + float(e.get("dur", 0)) * 1000)
                   for e in ev if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
                   and e.get("cat") in ("gpu_user_annotation",))
    if marks and len(marks) == a.steps:
        steps = [[x for x in k if ms_ <= x[0] < me] for ms_, me in marks]
    else:
        steps = [k]
        print("(no per-step GPU annotations: the %d steps taken together, divided by %d)"
              % (a.steps, a.steps))
    report("torch.compile, %d profiled step(s)" % a.steps, steps, a,
           n=a.steps if len(steps) == 1 else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("which", choices=["baton", "torch"])
    ap.add_argument("file")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--gemm-tflop", type=float, default=0.0)
    ap.add_argument("--peak", type=float, default=800.0)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    (baton if a.which == "baton" else torch_)(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
