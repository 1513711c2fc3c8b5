#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets that take files:

  tests/fuzz/corpus_safetensors  small safetensors files (every dtype, empty and
                                 scalar shapes, metadata, unsorted offsets, a real
                                 fixture header over a cut data section)
  tests/fuzz/corpus_gguf         tiny GGUF files: the metadata-only fixtures, a
                                 one-layer llama with a tokenizer, one tensor of
                                 each dequantized type
  tests/fuzz/corpus_xport_handshake
                                 hello + proof pairs (both roles, bad fields)
  tests/fuzz/corpus_job          the example job files and hand-made ones, some
                                 with --set overrides after a NUL byte
  tests/fuzz/corpus_hf_config    the fixtures' config.json and variants (RoPE
                                 kinds, sliding windows, legacy keys)
  tests/fuzz/corpus_tokenizer    small tokenizer.json files cut from the
                                 fixtures (each pre-tokenizer and normalizer),
                                 some with a text to encode after a NUL byte

Deterministic (rerunning gives the same bytes) and standard library only;
every seed is at most the -max_len the Makefile's fuzz-run gives its target.
Run from the repository root: python3 tests/fuzz/gen_seeds.py
"""
import json
import os
import struct

OUT = "tests/fuzz"
FIX = "tests/fixtures"


def put(corpus, name, data, limit):
    path = os.path.join(OUT, "corpus_" + corpus)
    os.makedirs(path, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    assert len(data) <= limit, (corpus, name, len(data), limit)
    with open(os.path.join(path, name), "wb") as f:
        f.write(data)


# ---- safetensors -------------------------------------------------------------

def st_file(tensors, meta=None, pad=True):
    """tensors: list of (name, dtype, shape, raw bytes) in data order."""
    header, off, blobs = {}, 0, []
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    if meta is not None:
        header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def gen_safetensors():
    lim = 4096
    f32 = struct.pack("<6f", 1, -2, 0.5, 3.25, -0.0, 1e-3)
    put("safetensors", "f32_matrix", st_file([("w", "F32", [2, 3], f32)], {"format": "pt"}), lim)
    put("safetensors", "all_dtypes", st_file([
        ("a.f16", "F16", [4], struct.pack("<4H", 0x3c00, 0xc000, 0x7bff, 0x0001)),
        ("b.bf16", "BF16", [2, 2], struct.pack("<4H", 0x3f80, 0xbf80, 0x7f7f, 0x0080)),
        ("c.f64", "F64", [1], struct.pack("<d", 2.5)),
        ("d.i64", "I64", [1], struct.pack("<q", -7)),
        ("e.i32", "I32", [2], struct.pack("<2i", 1, -1)),
        ("f.u8", "U8", [3], bytes([1, 2, 255])),
    ]), lim)
    put("safetensors", "empty_and_scalar", st_file([
        ("empty", "F32", [0, 5], b""), ("scalar", "F32", [], struct.pack("<f", 7.0)),
        ("row", "F32", [1, 2], struct.pack("<2f", 1, 2))]), lim)
    # offsets not in header order (the parser sorts by offset)
    h = {"z": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
         "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    hb = json.dumps(h).encode()
    put("safetensors", "unsorted", struct.pack("<Q", len(hb)) + hb + struct.pack("<2f", 1, 2), lim)
    put("safetensors", "no_tensors", st_file([], {"k": "v"}), lim)
    put("safetensors", "unpadded", st_file([("x", "BF16", [3], b"\x80\x3f" * 3)], pad=False), lim)
    # a real fixture's header (2136 bytes) over the first 256 bytes of its data
    with open(os.path.join(FIX, "llama_tied_llama3/model.safetensors"), "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    put("safetensors", "fixture_header_cut", b[:8 + n + 256], lim)


# ---- GGUF ----------------------------------------------------------------------

GG_U32, GG_F32, GG_STR, GG_ARR = 4, 6, 8, 9
GT = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14,
      "BF16": 30}


def gg_str(s):
    s = s.encode()
    return struct.pack("<Q", len(s)) + s


def gg_kv(key, vtype, value):
    out = gg_str(key) + struct.pack("<I", vtype)
    if vtype == GG_U32:
        out += struct.pack("<I", value)
    elif vtype == GG_F32:
        out += struct.pack("<f", value)
    elif vtype == GG_STR:
        out += gg_str(value)
    elif vtype == GG_ARR:
        etype, items = value
        out += struct.pack("<IQ", etype, len(items))
        for it in items:
            out += gg_str(it) if etype == GG_STR else struct.pack("<i", it)
    return out


def gguf_file(kvs, tensors, align=32):
    """tensors: (name, ne list, type name, raw bytes)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for kv in kvs:
        out += gg_kv(*kv)
    off, data = 0, b""
    for name, ne, tname, raw in tensors:
        out += gg_str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", GT[tname], off)
        pad = (align - len(raw) % align) % align
        data += raw + b"\0" * pad
        off += len(raw) + pad
    out += b"\0" * ((align - len(out) % align) % align)
    return out + data


def f32s(n, scale=0.01):
    return struct.pack("<%df" % n, *(((i * 37 % 17) - 8) * scale for i in range(n)))


def gen_gguf():
    lim = 4096
    for name in ("tiny_meta.gguf", "tiny_smollm_tok.gguf"):
        with open(os.path.join(FIX, "gguf", name), "rb") as f:
            put("gguf", name, f.read(), lim)
    C, F, V, H, HKV = 8, 8, 12, 2, 1
    toks = ["a", "b", "c", "d", "e", " ", "ab", "cd", "<s>", "</s>", "x", "y"]
    kvs = [
        ("general.architecture", GG_STR, "llama"),
        ("llama.block_count", GG_U32, 1), ("llama.embedding_length", GG_U32, C),
        ("llama.feed_forward_length", GG_U32, F), ("llama.attention.head_count", GG_U32, H),
        ("llama.attention.head_count_kv", GG_U32, HKV), ("llama.context_length", GG_U32, 32),
        ("llama.attention.layer_norm_rms_epsilon", GG_F32, 1e-5),
        ("llama.rope.freq_base", GG_F32, 10000.0),
        ("tokenizer.ggml.model", GG_STR, "gpt2"),
        ("tokenizer.ggml.tokens", GG_ARR, (GG_STR, toks)),
        ("tokenizer.ggml.merges", GG_ARR, (GG_STR, ["a b", "c d"])),
        ("tokenizer.ggml.bos_token_id", GG_U32, 8), ("tokenizer.ggml.eos_token_id", GG_U32, 9),
    ]
    D = C // H
    ts = [
        ("token_embd.weight", [C, V], "F32", f32s(C * V)),
        ("blk.0.attn_norm.weight", [C], "F32", f32s(C, 0.1)),
        ("blk.0.attn_q.weight", [C, H * D], "F32", f32s(C * H * D)),
        ("blk.0.attn_k.weight", [C, HKV * D], "F32", f32s(C * HKV * D)),
        ("blk.0.attn_v.weight", [C, HKV * D], "F32", f32s(C * HKV * D)),
        ("blk.0.attn_output.weight", [H * D, C], "F32", f32s(C * H * D)),
        ("blk.0.ffn_norm.weight", [C], "F32", f32s(C, 0.1)),
        ("blk.0.ffn_gate.weight", [C, F], "F32", f32s(C * F)),
        ("blk.0.ffn_up.weight", [C, F], "F32", f32s(C * F)),
        ("blk.0.ffn_down.weight", [F, C], "F32", f32s(C * F)),
        ("output_norm.weight", [C], "F32", f32s(C, 0.1)),
    ]
    put("gguf", "llama_one_layer.gguf", gguf_file(kvs, ts), lim)
    # one 256-element tensor of each quantized type, bytes from the type fixtures
    sizes = {"F16": 512, "BF16": 512, "Q4_0": 144, "Q4_1": 160, "Q8_0": 272, "Q4_K": 144,
             "Q5_K": 176, "Q6_K": 210}
    ts = []
    for tname, nbytes in sizes.items():
        with open(os.path.join(FIX, "gguf/types", tname + ".bin"), "rb") as f:
            ts.append(("t." + tname, [256], tname, f.read(nbytes)))
    put("gguf", "types.gguf", gguf_file([("general.architecture", GG_STR, "llama")], ts), lim)


# ---- handshake ---------------------------------------------------------------

def hs_hello(role, job=b"fuzz-job", version=1, magic=0x4c454842, self_id=3):
    out = struct.pack("<IHcB", magic, version, role, len(job)) + job.ljust(64, b"\0")
    return out + struct.pack("<I", self_id) + bytes(range(32))


def gen_handshake():
    lim = 256
    proof = struct.pack("<I", 0x4f525042) + bytes(32)
    put("xport_handshake", "client_hello_proof", hs_hello(b"C") + proof, lim)
    put("xport_handshake", "server_hello_proof", hs_hello(b"S") + proof, lim)
    put("xport_handshake", "hello_only", hs_hello(b"C"), lim)
    put("xport_handshake", "wrong_version", hs_hello(b"C", version=2) + proof, lim)
    put("xport_handshake", "long_job_id", hs_hello(b"S", job=b"j" * 63) + proof, lim)
    put("xport_handshake", "bad_proof_magic", hs_hello(b"C") + b"XXXX" + bytes(32), lim)


# ---- job files ----------------------------------------------------------------

def gen_job():
    lim = 4096
    for name in sorted(os.listdir("jobs")):
        with open(os.path.join("jobs", name), "rb") as f:
            put("job", name, f.read(), lim)
    good = ("model: {layers: 4, hidden: 256, heads: 8, kv_heads: 4, vocab: 1000, seq: 512}\n"
            "data: {dir: /tmp/shards, seq_len: 256, split: 0.05}\n"
            "train: {steps: 50, micro_batch: 2, grad_accum: 4, seed: 7, eval_every: 10}\n"
            "optim: {lr: 1e-3, min_lr: 1.0e-4, warmup: 5, warmup_from: min_lr, betas: [0.9, 0.99],"
            " decay: all}\n"
            "parallel: {tp: 2, pp: 2, dp: 1, split: [1, 3], schedule: 1f1b, microbatches: 4}\n"
            "transport: {control: tcp, pipeline: auto, data_parallel: auto}\n"
            "hosts: [local]\nexport: {dir: /tmp/ck, every: 10}\ntrace: {dir: /tmp/tr}\n"
            "metrics: {file: m.jsonl, plot: loss.png}\n")
    put("job", "flow_all_sections.yaml", good, lim)
    sets = ["parallel.tp=1", "optim.betas=[0.8,0.9]", "hosts=[local, localhost]",
            "parallel.split=[2, 2]", "trace.dir="]
    put("job", "with_overrides", good + "\0" + "\0".join(sets), lim)
    put("job", "interleaved_overrides",
        good + "\0parallel.virtual_stages=2\0parallel.schedule=interleaved\0"
        "parallel.split=[1,1,1,1]\0parallel.dp=2\0parallel.zero1=true", lim)
    put("job", "anchors.yaml",
        "base: &b {lr: 0.01}\ndata: {dir: x}\noptim: *b\n", lim)
    put("job", "block_nested.yaml",
        "data:\n  dir: x\nmodel:\n  layers: 2\n  hidden: 64\nhosts:\n  - local\n  - local\n", lim)
    put("job", "deep_31.yaml", "data: {dir: x}\nhosts: " + "[" * 31 + "]" * 31 + "\n", lim)
    put("job", "numbers.yaml",
        "data: {dir: x}\ntrain: {steps: 1e3, seed: 0x10, micro_batch: 2.0}\n"
        "model: {vocab: 99999999999999999999}\n", lim)
    put("job", "hf_model.yaml", "model: {hf: tests/fixtures/llama}\ndata: {dir: x, seq_len: 8}\n"
        "\0model.seq=64\0data.seq_len=16", lim)


# ---- config.json -------------------------------------------------------------

def gen_hf_config():
    lim = 4096
    seen = set()
    for d in sorted(os.listdir(FIX)):
        p = os.path.join(FIX, d, "config.json")
        if os.path.isfile(p):
            with open(p, "rb") as f:
                b = f.read()
            if b not in seen:
                seen.add(b)
                put("hf_config", d + ".json", b, lim)
    with open(os.path.join(FIX, "gguf_model/hf/config.json"), "rb") as f:
        put("hf_config", "gguf_model_hf.json", f.read(), lim)
    base = {"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-6}
    variants = {
        "rope_linear.json": {"rope_scaling": {"type": "linear", "factor": 2.0}},
        "rope_llama3_legacy.json": {"rope_theta": 500000.0, "rope_scaling": {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}},
        "model_type_only.json": {"architectures": None, "model_type": "mistral",
                                 "sliding_window": 32},
        "qwen2_layer_types.json": {"architectures": ["Qwen2ForCausalLM"],
                                   "use_sliding_window": True, "sliding_window": 16,
                                   "layer_types": ["full_attention", "sliding_attention"]},
        "qwen2_max_window_layers.json": {"architectures": ["Qwen2ForCausalLM"],
                                         "use_sliding_window": True, "sliding_window": 16,
                                         "max_window_layers": 1},
        "biases_head_dim.json": {"attention_bias": True, "mlp_bias": True, "head_dim": 8,
                                 "tie_word_embeddings": True, "hidden_act": "silu",
                                 "attention_dropout": 0.1},
        "reals.json": {"vocab_size": 256.0, "num_key_value_heads": None, "partial_rotary_factor": 1.0},
        "qwen2_moe_model_type_capacity.json": {
            "architectures": None, "model_type": "qwen2_moe", "num_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48, "decoder_sparse_step": 2,
            "mlp_only_layers": [0], "capacity_factor": 1.25, "output_router_logits": True},
        "qwen3_model_type_window.json": {
            "architectures": None, "model_type": "qwen3", "head_dim": None,
            "attention_bias": True, "use_sliding_window": True, "sliding_window": 16,
            "max_window_layers": 1},
        "qwen3_moe_both_expert_keys.json": {
            "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4, "num_local_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True,
            "mlp_only_layers": [1], "use_sliding_window": True, "sliding_window": 32},
    }
    for name, change in variants.items():
        c = dict(base)
        for k, v in change.items():
            if v is None:
                c.pop(k, None)
            else:
                c[k] = v
        put("hf_config", name, json.dumps(c, indent=1), lim)


# ---- tokenizer.json ----------------------------------------------------------

def byte_chars():
    """GPT-2's printable stand-ins for the 256 bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xa1, 0xad)) + list(range(0xae, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c) for c in cs}


def tok_cut(path, n_merges):
    """The fixture tokenizer with only the byte tokens, the added tokens and
    its first n_merges merges whose parts are kept (ids renumbered)."""
    with open(path) as f:
        j = json.load(f)
    vocab, merges = j["model"]["vocab"], j["model"]["merges"]
    keep = {t for t in vocab if t in byte_chars()}
    # SentencePiece style: its space and byte-fallback tokens too
    keep |= {t for t in vocab if t == "\u2581" or (len(t) == 6 and t.startswith("<0x"))}
    added = {a["content"] for a in j["added_tokens"]}
    keep |= added & set(vocab)
    chosen = []
    for m in merges:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in keep and b in keep and a + b in vocab:
            chosen.append(m)
            keep.add(a + b)
            if len(chosen) == n_merges:
                break
    order = sorted(keep, key=lambda t: vocab[t])
    new = {t: i for i, t in enumerate(order)}
    j["model"]["vocab"] = new
    j["model"]["merges"] = chosen
    j["added_tokens"] = [dict(a, id=new[a["content"]]) for a in j["added_tokens"]
                         if a["content"] in new]
    return json.dumps(j, ensure_ascii=False, separators=(",", ":"))


def gen_tokenizer():
    lim = 8192
    for name, path in (("llama_fixture.json", "llama/tokenizer.json"),
                       ("gguf_tiny.json", "gguf/tiny_tokenizer.json")):
        with open(os.path.join(FIX, path), "rb") as f:
            put("tokenizer", name, f.read(), lim)
    text = "\0It's 1234 caf\u00e9  \n\n<|endoftext|> don't <|im_start|>x"
    for name in ("gpt2", "llama3", "qwen2", "digits_prefix", "llama2", "metaspace"):
        cut = tok_cut(os.path.join(FIX, "tok", name, "tokenizer.json"), 40)
        put("tokenizer", name + ".json", cut, lim)
        put("tokenizer", name + "_text", cut + text, lim)


def main():
    gen_safetensors()
    gen_gguf()
    gen_handshake()
    gen_job()
    gen_hf_config()
    gen_tokenizer()


if __name__ == "__main__":
    main()
