#!/usr/bin/env python3
"""Writes tests/fixtures/gguf_model/: a tiny but complete llama GGUF model and
its references, for tests/sh/test_gguf_eval.sh and tests/sh/test_generate.sh.

    python3 tools/gen_gguf_model_fixture.py

Needs the `gguf` package, transformers, torch, tokenizers. Deterministic.

  tiny.gguf        llama, 3 layers, hidden 32, 4 heads (2 KV heads, head_dim 8),
                   FFN 256, untied head (output.weight, Q8_0), a byte-level BPE vocabulary of 320
                   trained on text.txt (pre-tokenizer "smollm", BOS 1, EOS 2);
                   tensors in all nine types baton dequantizes: F32 (norms),
                   F16, BF16, Q8_0, Q4_0, Q4_1 spread over the layers, and
                   ffn_down in Q4_K / Q5_K / Q6_K (one per layer)
  hf/              its Hugging Face twin written by tools/gguf_to_hf.py
                   (transformers' GGUF loader + save_pretrained)
  text.txt         English text to score
  expected_text_window64.json, expected_text_max200_window50.json
                   transformers on hf/ (torch fp32): tokens / loss / ppl of
                   text.txt in windows of 64, and of its first 200 ids in
                   windows of 50 (--max-tokens 200 --window 50)
  ids200.txt       those first 200 ids (HF `tokenizers` on hf/tokenizer.json)
  generate.json    transformers greedy generation (generate(), do_sample=False,
                   24 new tokens, EOS 2) for two prompts, with the smallest
                   top-1/top-2 logit gap seen (kept > 1e-3 so that fp32
                   rounding cannot flip a choice); generate.tsv the same as
                   prompt TAB prompt ids TAB new ids, for shell tests
"""
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf import quants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "gguf_model")
RNG = np.random.default_rng(20261130)

TEXT = """The small boat left the harbour early in the morning, while the town was still asleep.
Anne stood at the rail and watched the grey houses grow smaller, one by one, until only the
church tower could be seen above the mist. She had not slept; the letter in her pocket had kept
her awake, and she read it again now, slowly, as if the words might have changed in the night.

"My dear sister," it began, "I write in haste, for the post leaves at four." There followed two
pages of news about the garden, the new curate, the price of coal and the health of their aunt,
and only at the very end, in a smaller hand, the sentence that mattered: "He has come back, and
he asks after you every day."

By noon the wind had turned and the sea was rough. The captain, a patient man of sixty, said that
they would reach the island before dark if the weather held, and that it would not. He was right
on both counts. They landed at 7 o'clock in heavy rain, 23 passengers and 140 boxes of books.
"""

C, H, KV, F, L, V = 32, 4, 2, 256, 3, 320
D = C // H
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# per layer: attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down
LAYER_TYPES = [
    (T.Q8_0, T.Q4_0, T.Q4_1, T.BF16, T.Q8_0, T.F16, T.Q4_K),
    (T.Q4_1, T.Q8_0, T.Q4_0, T.F32, T.BF16, T.Q4_0, T.Q5_K),
    (T.F16, T.F16, T.Q8_0, T.Q4_1, T.Q4_1, T.Q8_0, T.Q6_K),
]


def train_vocab():
    """Byte-level BPE trained on TEXT: (tokens in GGUF spelling, merges)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tr = trainers.BpeTrainer(vocab_size=V, special_tokens=SPECIALS, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator([TEXT] * 4, trainer=tr)
    model = json.loads(tk.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab))), "vocabulary ids are not dense"
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    return [t for t, _ in vocab], merges


def llama_permute(w, n_head):
    """What llama.cpp's converter does to q_proj/k_proj rows."""
    d = w.shape[0] // n_head
    return w.reshape(n_head, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_kquant(qt, rows, cols):
    """The gguf package cannot quantize to K-quants: random blocks instead,
    with f16 scales small enough for weights of about 0.1."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qt]
    n = rows * cols // block_size
    b = RNG.integers(0, 256, size=(n, type_size), dtype=np.uint8)
    f16 = lambda v: np.asarray(v, dtype=np.float16).view(np.uint8).reshape(n, 2)
    if qt in (T.Q4_K, T.Q5_K):  # d, dmin at bytes 0..3
        b[:, 0:2] = f16(RNG.uniform(1e-4, 3e-4, n))
        b[:, 2:4] = f16(RNG.uniform(1e-4, 3e-4, n))
    else:  # Q6_K: d at bytes 208..209
        b[:, 208:210] = f16(RNG.uniform(2e-5, 6e-5, n))
    return b.reshape(rows, -1)


def encode(qt, x):
    """(data for GGUFWriter.add_tensor, raw_dtype) of x [rows, cols] f32."""
    if qt in (T.Q4_K, T.Q5_K, T.Q6_K):
        return random_kquant(qt, *x.shape), qt
    if qt == T.F32:
        return x.astype(np.float32), None
    if qt == T.F16:
        return x.astype(np.float16), None
    return quants.quantize(x, qt), qt


def add_shape(w, layers, hidden, ffn, heads, kv_heads):
    """The size keys of a tiny model (context 256)."""
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)


def add_vocab(w, toks, merges, pre, unk=None):
    """A gpt2 byte-level BPE vocabulary (train_vocab's), BOS 1, EOS = PAD 2, no BOS added."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(toks)
    w.add_token_types([3 if t in SPECIALS else 1 for t in toks])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    if unk is not None:
        w.add_unk_token_id(unk)
    w.add_add_bos_token(False)


def finish(w):
    """Writes what w holds and closes it."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gguf(path, toks, merges):
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("baton tiny gguf model")
    add_shape(w, L, C, F, H, KV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(D)
    w.add_vocab_size(len(toks))
    add_vocab(w, toks, merges, "smollm", unk=0)

    def rnd(*shape, s=0.15):
        return (RNG.standard_normal(shape) * s).astype(np.float32)

    data, raw = encode(T.F16, rnd(len(toks), C, s=1.0))
    w.add_tensor("token_embd.weight", data, raw_dtype=raw)
    # an untied head of large weights gives well separated logits
    data, raw = encode(T.Q8_0, rnd(len(toks), C, s=1.0))
    w.add_tensor("output.weight", data, raw_dtype=raw)
    for i, types in enumerate(LAYER_TYPES):
        shapes = {"attn_q": (H * D, C), "attn_k": (KV * D, C), "attn_v": (KV * D, C),
                  "attn_output": (C, H * D), "ffn_gate": (F, C), "ffn_up": (F, C),
                  "ffn_down": (C, F)}
        w.add_tensor(f"blk.{i}.attn_norm.weight", (1 + rnd(C, s=0.1)).astype(np.float32))
        for (name, shape), qt in zip(shapes.items(), types):
            x = rnd(*shape)
            if name == "attn_q":
                x = llama_permute(x, H)
            elif name == "attn_k":
                x = llama_permute(x, KV)
            data, raw = encode(qt, x)
            w.add_tensor(f"blk.{i}.{name}.weight", data, raw_dtype=raw)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", (1 + rnd(C, s=0.1)).astype(np.float32))
    w.add_tensor("output_norm.weight", (1 + rnd(C, s=0.1)).astype(np.float32))
    finish(w)


def score(model, ids, window):
    import torch
    total, n = 0.0, 0
    with torch.no_grad():
        for o in range(0, len(ids), window):
            win = ids[o:o + window]
            if len(win) < 2:
                continue
            x = torch.tensor([win])
            total += float(model(input_ids=x, labels=x).loss.double()) * (len(win) - 1)
            n += len(win) - 1
    return {"tokens": n, "loss": total / n, "ppl": math.exp(total / n)}


def greedy(model, ids, max_new, eos):
    """transformers generate() plus the smallest top-1/top-2 gap of its steps."""
    import torch
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=max_new, eos_token_id=eos, pad_token_id=eos,
                             output_scores=True, return_dict_in_generate=True,
                             temperature=None, top_p=None, top_k=None)
    gaps = []
    for s in out.scores:
        top = torch.topk(s[0].double(), 2).values
        gaps.append(float(top[0] - top[1]))
    return out.sequences[0, len(ids):].tolist(), min(gaps)


def main():
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    with open(os.path.join(OUT, "text.txt"), "w") as f:
        f.write(TEXT)
    toks, merges = train_vocab()
    gpath = os.path.join(OUT, "tiny.gguf")
    write_gguf(gpath, toks, merges)
    hf = os.path.join(OUT, "hf")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gguf_to_hf.py"), gpath, hf], check=True,
                   stderr=subprocess.DEVNULL)
    for extra in ("chat_template.jinja",):
        p = os.path.join(hf, extra)
        if os.path.exists(p):
            os.remove(p)

    tk = Tokenizer.from_file(os.path.join(hf, "tokenizer.json"))
    ids = tk.encode(TEXT, add_special_tokens=False).ids
    m = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    m.eval()
    # the twin must be what transformers reads from the GGUF directly
    mg = AutoModelForCausalLM.from_pretrained(OUT, gguf_file="tiny.gguf", dtype=torch.float32)
    for (k, a), (_, b) in zip(sorted(m.state_dict().items()), sorted(mg.state_dict().items())):
        assert torch.equal(a, b), k
    expect = {"text_window64": score(m, ids, 64), "text_max200_window50": score(m, ids[:200], 50)}
    for name, e in expect.items():
        with open(os.path.join(OUT, f"expected_{name}.json"), "w") as f:
            f.write(json.dumps(e) + "\n")
    with open(os.path.join(OUT, "ids200.txt"), "w") as f:
        f.write(" ".join(map(str, ids[:200])) + "\n")
    gens = []
    eos = m.generation_config.eos_token_id
    for prompt in ("The captain said", "She read the letter"):
        pids = tk.encode(prompt, add_special_tokens=False).ids
        new, gap = greedy(m, pids, 24, eos)
        assert gap > 1e-3, f"near tie in greedy generation for {prompt!r}: {gap}"
        gens.append({"prompt": prompt, "prompt_ids": pids, "ids": new, "min_gap": gap,
                     "text": tk.decode(new, skip_special_tokens=False)})
    with open(os.path.join(OUT, "generate.json"), "w") as f:
        json.dump({"max_new": 24, "eos": eos, "cases": gens}, f, indent=1, ensure_ascii=False)
    # the same for shell tests: prompt TAB prompt ids TAB new ids (comma-separated)
    with open(os.path.join(OUT, "generate.tsv"), "w") as f:
        for g in gens:
            f.write("\t".join([g["prompt"], ",".join(map(str, g["prompt_ids"])), ",".join(map(str, g["ids"]))]) + "\n")
    size = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(OUT) for fn in fns)
    print(f"wrote {OUT}: {size} bytes; {len(ids)} text ids; {expect}", file=sys.stderr)


if __name__ == "__main__":
    main()
