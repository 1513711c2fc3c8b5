#!/usr/bin/env python3
"""Writes the small committed GGUF test fixtures into tests/fixtures/gguf/.

    python3 tools/gen_gguf_fixtures.py [--smollm2 models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf]
                                       [--hf models/smollm2-135m-hf]

References are the `gguf` Python package (gguf.quants.dequantize) and
transformers' own GGUF loader; the script cross-checks the two wherever both
apply and stops if they disagree. Outputs (all little-endian):

  types/<T>.bin, types/<T>.f32   raw blocks of ggml type T and their f32 values
                                  (gguf.quants.dequantize); T in F32 F16 BF16
                                  Q4_0 Q4_1 Q8_0 Q4_K Q5_K Q6_K
  types/real_<T>.bin/.f32         the same from real SmolLM2 tensors (Q8_0,
                                  Q4_1, F32: the types that file holds)
  smollm2_excerpt.gguf            real SmolLM2 metadata (llama.*, general.*)
                                  and excerpts of real tensors, raw bytes
                                  copied: token_embd rows 0..15 (Q8_0),
                                  blk.0.attn_q / attn_k column block 0 (all
                                  rows, Q4_1), blk.0.ffn_down rows 0..3,
                                  blk.0.attn_norm (F32)
  smollm2_hf/<hf name>.f32        what transformers loaded for the same
                                  excerpts (HF layout, Q/K un-permuted)
  tiny_llama.gguf                 synthetic complete llama file (GGUFWriter):
                                  every metadata value type, nested arrays,
                                  tensors of 9 ggml types, tiny BPE vocab
  tiny_llama.json                 its expected metadata and tensor infos
  tiny_llama.f32                  expected f32 of every tensor (file order)
  tiny_llama_hf.f32               transformers' q_proj/k_proj of layer 0
  tiny_tokenizer.json             transformers' tokenizer.json for it
  tiny_smollm_tok.gguf/.json      tokenizer-only file with pre "smollm" and
                                  the tokenizer.json gguf_to_hf.py writes
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf import quants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "gguf")
RNG = np.random.default_rng(20261129)


def save(path, arr):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(np.ascontiguousarray(arr).tobytes())


def f16_bits(x):
    return np.asarray(x, dtype=np.float16).view(np.uint8)


# ---- (b) one fixture per ggml type ----------------------------------------------

def random_kquant_blocks(qtype, n_blocks):
    """Random bytes are valid K-quant blocks; only the f16 scales are set to
    finite values of a realistic size (random f16 bits would be inf/NaN)."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    b = RNG.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    if qtype in (T.Q4_K, T.Q5_K):  # d, dmin at bytes 0..3
        b[:, 0:2] = f16_bits(RNG.uniform(1e-4, 2e-2, n_blocks)).reshape(n_blocks, 2)
        b[:, 2:4] = f16_bits(RNG.uniform(1e-4, 2e-2, n_blocks)).reshape(n_blocks, 2)
    elif qtype == T.Q6_K:  # d at bytes 208..209
        b[:, 208:210] = f16_bits(RNG.uniform(1e-4, 2e-2, n_blocks)).reshape(n_blocks, 2)
    return b


def gen_types():
    out = {}
    x = (RNG.standard_normal((8, 256)) * 0.05).astype(np.float32)
    x[0, :4] = [0.0, -0.0, 1.5, -3.25]
    for qt in (T.Q4_0, T.Q4_1, T.Q8_0, T.BF16):
        q = quants.quantize(x, qt)
        out[qt.name] = (q.view(np.uint8), quants.dequantize(q, qt))
    # F16: include the edge cases of the conversion (subnormals, inf, NaN, -0)
    h = x.astype(np.float16).reshape(-1)
    specials = np.array([0x0000, 0x8000, 0x0001, 0x03ff, 0x8200, 0x0400, 0x7bff, 0xfbff,
                         0x7c00, 0xfc00, 0x7e00, 0x7c01, 0x3c00, 0xc000, 0x3555, 0x1234],
                        dtype=np.uint16)
    h.view(np.uint16)[:16] = specials
    out["F16"] = (h.view(np.uint8), quants.dequantize(h.view(np.uint8), T.F16))
    bf = out["BF16"][0].reshape(-1).view(np.uint16).copy()
    bf[:6] = [0x7f80, 0xff80, 0x7fc0, 0x0001, 0x8000, 0x3f80]  # inf, -inf, NaN, subnormal, -0, 1
    out["BF16"] = (bf.view(np.uint8), quants.dequantize(bf.view(np.uint8), T.BF16))
    f = x.reshape(-1).copy()
    out["F32"] = (f.view(np.uint8), f)
    for qt in (T.Q4_K, T.Q5_K, T.Q6_K):
        b = random_kquant_blocks(qt, 8)
        out[qt.name] = (b, quants.dequantize(b, qt))
    for name, (raw, ref) in out.items():
        ref = np.asarray(ref, dtype=np.float32).reshape(-1)
        save(os.path.join(OUT, "types", name + ".bin"), raw)
        save(os.path.join(OUT, "types", name + ".f32"), ref)
        print(f"types/{name}: {raw.size} bytes -> {ref.size} values", file=sys.stderr)


# ---- (a) real SmolLM2 excerpts ----------------------------------------------------

def unpermute(w, n_head):
    """llama.cpp stores each head's rows as (D/2, 2) transposed; put back."""
    rows = w.shape[0]
    d = rows // n_head
    return w.reshape(n_head, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gen_smollm2(gguf_path, hf_dir):
    from safetensors.numpy import load_file
    r = gguf.GGUFReader(gguf_path)
    hf = load_file(os.path.join(hf_dir, "model.safetensors"))
    n_head = int(r.fields["llama.attention.head_count"].contents())
    n_kv = int(r.fields["llama.attention.head_count_kv"].contents())
    tensors = {t.name: t for t in r.tensors}

    def raw_rows(t):
        """[rows, bytes per row] raw view of a tensor."""
        return np.asarray(t.data).view(np.uint8).reshape(int(t.shape[1]) if len(t.shape) > 1 else 1, -1)

    w = gguf.GGUFWriter(os.path.join(OUT, "smollm2_excerpt.gguf"), "llama")
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k.startswith("tokenizer."):
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, f.contents(), vt, sub_type=f.types[-1])
        else:
            w.add_key_value(k, f.contents(), vt)

    excerpts = []  # (gguf name, raw [rows, bytes], qtype, ne0, hf name, hf slice, permute heads)
    t = tensors["token_embd.weight"]
    excerpts.append(("token_embd.weight", raw_rows(t)[:16], t.tensor_type, int(t.shape[0]),
                     "model.embed_tokens.weight", (slice(0, 16), slice(None)), 0))
    for nm, hfn, heads in (("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", n_head),
                           ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight", n_kv)):
        t = tensors[nm]
        bs, ts = gguf.GGML_QUANT_SIZES[t.tensor_type]
        excerpts.append((nm, raw_rows(t)[:, :ts], t.tensor_type, bs, hfn, (slice(None), slice(0, bs)), heads))
    t = tensors["blk.0.ffn_down.weight"]
    excerpts.append(("blk.0.ffn_down.weight", raw_rows(t)[:4], t.tensor_type, int(t.shape[0]),
                     "model.layers.0.mlp.down_proj.weight", (slice(0, 4), slice(None)), 0))
    t = tensors["blk.0.attn_norm.weight"]
    excerpts.append(("blk.0.attn_norm.weight", np.asarray(t.data).view(np.uint8).reshape(1, -1),
                     t.tensor_type, int(t.shape[0]), "model.layers.0.input_layernorm.weight",
                     (slice(None),), 0))

    by_type = {}
    for name, raw, qt, ne0, hfn, sl, heads in excerpts:
        raw = np.ascontiguousarray(raw)
        rows = raw.shape[0]
        deq = quants.dequantize(raw, qt).reshape(rows, ne0) if qt != T.F32 else raw.view(np.float32).reshape(rows, ne0)
        ref = hf[hfn][sl].astype(np.float32)
        mine = unpermute(deq, heads) if heads else deq
        mine = mine.reshape(ref.shape)
        if not np.array_equal(mine, ref):
            sys.exit(f"{name}: gguf.quants.dequantize (+ un-permute) differs from transformers by "
                     f"{np.abs(mine - ref).max()}")
        if qt == T.F32:
            w.add_tensor(name, raw.view(np.float32).reshape(-1) if rows == 1 else raw.view(np.float32))
        else:
            w.add_tensor(name, raw, raw_dtype=qt)
        save(os.path.join(OUT, "smollm2_hf", hfn + ".f32"), ref)
        if qt.name not in by_type or raw.size < by_type[qt.name][0].size:
            by_type[qt.name] = (raw, deq)
        print(f"smollm2 {name} ({qt.name}, {rows} rows x {ne0}): matches transformers", file=sys.stderr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for qn, (raw, deq) in by_type.items():
        save(os.path.join(OUT, "types", "real_" + qn + ".bin"), raw)
        save(os.path.join(OUT, "types", "real_" + qn + ".f32"), deq.astype(np.float32))


# ---- (c) synthetic complete file ----------------------------------------------------

TINY = dict(vocab=None, hidden=64, heads=4, kv_heads=2, ff=256, layers=1, ctx=128)


def tiny_vocab():
    # token_type: 1 normal, 3 control, 4 user-defined
    toks = [("<|endoftext|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3),
            ("a", 1), ("b", 1), ("c", 1), ("\u0120", 1), ("1", 1), ("2", 1),
            ("ab", 1), ("abc", 1), ("\u0120a", 1), ("\u0120\u0120", 1),
            ("hello world", 1),  # plain space: not byte-level spelled, gets respelled
            ("<think>", 4), ("<bad token>", 3)]  # a control token with a space: skipped
    merges = ["a b", "ab c", "\u0120 a", "\u0120 \u0120"]
    return toks, merges


def llama_permute(w, n_head):
    """What llama.cpp's converter does to q_proj/k_proj rows."""
    d = w.shape[0] // n_head
    return w.reshape(n_head, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gen_tiny():
    C, H, KV, F = TINY["hidden"], TINY["heads"], TINY["kv_heads"], TINY["ff"]
    D = C // H
    toks, merges = tiny_vocab()
    V = len(toks)
    path = os.path.join(OUT, "tiny_llama.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny llama fixture")
    w.add_block_count(TINY["layers"])
    w.add_context_length(TINY["ctx"])
    w.add_embedding_length(C)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(50000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(D)
    w.add_file_type(1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list([t for t, _ in toks])
    w.add_token_types([ty for _, ty in toks])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    hf = {}
    tensors = []  # (gguf name, f32 data in HF layout, qtype, permute heads)
    s = 0.05

    def rnd(*shape):
        return (RNG.standard_normal(shape) * s).astype(np.float32)
    hf["token_embd.weight"] = rnd(V, C)
    tensors.append(("token_embd.weight", T.F16, 0))
    hf["blk.0.attn_norm.weight"] = (1 + rnd(C)).astype(np.float32)
    tensors.append(("blk.0.attn_norm.weight", T.F32, 0))
    hf["blk.0.attn_q.weight"] = rnd(H * D, C)
    tensors.append(("blk.0.attn_q.weight", T.Q8_0, H))
    hf["blk.0.attn_k.weight"] = rnd(KV * D, C)
    tensors.append(("blk.0.attn_k.weight", T.Q4_0, KV))
    hf["blk.0.attn_v.weight"] = rnd(KV * D, C)
    tensors.append(("blk.0.attn_v.weight", T.Q4_1, 0))
    hf["blk.0.attn_output.weight"] = rnd(C, H * D)
    tensors.append(("blk.0.attn_output.weight", T.BF16, 0))
    hf["blk.0.ffn_norm.weight"] = (1 + rnd(C)).astype(np.float32)
    tensors.append(("blk.0.ffn_norm.weight", T.F32, 0))
    hf["blk.0.ffn_gate.weight"] = rnd(F, C)
    tensors.append(("blk.0.ffn_gate.weight", T.Q8_0, 0))
    hf["blk.0.ffn_up.weight"] = rnd(F, C)
    tensors.append(("blk.0.ffn_up.weight", T.F16, 0))
    hf["blk.0.ffn_down.weight"] = None  # random Q4_K blocks, [C rows, F cols]
    tensors.append(("blk.0.ffn_down.weight", T.Q4_K, 0))
    hf["output_norm.weight"] = (1 + rnd(C)).astype(np.float32)
    tensors.append(("output_norm.weight", T.F32, 0))
    hf["output.weight"] = rnd(V, C)
    tensors.append(("output.weight", T.Q8_0, 0))
    # not model tensors: more types and shapes for the reader
    hf["extra.q5_k"] = None
    tensors.append(("extra.q5_k", T.Q5_K, 0))
    hf["extra.q6_k"] = None
    tensors.append(("extra.q6_k", T.Q6_K, 0))
    hf["extra.f32_3d"] = rnd(2, 3, 4)
    tensors.append(("extra.f32_3d", T.F32, 0))

    expect = {"metadata": {}, "tensors": [], "config": {}}
    blobs = []
    offset = 0
    for name, qt, heads in tensors:
        x = hf[name]
        if x is None:
            rows, cols = (C, F) if name == "blk.0.ffn_down.weight" else (2, 256)
            raw = random_kquant_blocks(qt, rows * cols // 256).reshape(rows, -1)
            data, ref = raw, quants.dequantize(raw, qt).reshape(rows, cols)
            shape = (rows, cols)
        else:
            shape = x.shape
            stored = llama_permute(x, heads) if heads else x
            if qt == T.F32:
                data = stored
            elif qt == T.F16:
                data = stored.astype(np.float16)
            else:
                data = quants.quantize(stored, qt)
            ref = quants.dequantize(data, qt) if qt not in (T.F32, T.F16) else data.astype(np.float32)
        if qt in (T.F32, T.F16):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=qt)
        ref = np.asarray(ref, dtype=np.float32).reshape(-1)
        ne = list(reversed(shape))
        expect["tensors"].append({"name": name, "type": int(qt), "type_name": qt.name, "ne": ne,
                                  "n_elems": int(ref.size), "expect_offset": offset,
                                  "permute_heads": heads})
        blobs.append(ref)
        offset += ref.size
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    save(os.path.join(OUT, "tiny_llama.f32"), np.concatenate(blobs))

    # What the reader must see, read back with the gguf package's own reader.
    r = gguf.GGUFReader(path)
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        types = [int(t) for t in f.types]
        val = f.contents()
        if isinstance(val, float) and not np.isfinite(val):
            val = str(val)
        expect["metadata"][k] = {"type": types[0], "types": types, "value": val}
    byname = {t.name: t for t in r.tensors}
    for e in expect["tensors"]:
        t = byname[e["name"]]
        e["offset"] = int(t.data_offset - r.data_offset) if hasattr(r, "data_offset") else None
        e["file_offset"] = int(t.data_offset)
        e["nbytes"] = int(t.n_bytes)
        assert [int(v) for v in t.shape] == e["ne"], (e["name"], t.shape, e["ne"])
    expect["alignment"] = 32
    expect["version"] = 3
    expect["n_tensors"] = len(r.tensors)
    expect["n_kv"] = len([k for k in r.fields if not k.startswith("GGUF.")])

    # transformers' view of the same file: config and un-permuted q/k.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, fn = os.path.split(path)
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=fn, dtype=torch.float32)
    cfg = m.config
    expect["config"] = {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": getattr(cfg, "head_dim", C // H),
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": (cfg.rope_parameters or {}).get("rope_theta") if hasattr(cfg, "rope_parameters")
        else cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps, "tie_word_embeddings": bool(cfg.tie_word_embeddings),
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
    }
    # the config.json transformers writes for it (minus the loader's own bookkeeping)
    cj = json.loads(cfg.to_json_string())
    for k in ("quantization_config", "transformers_version", "_name_or_path", "_model_name_or_path"):
        cj.pop(k, None)
    cj["architectures"] = [type(m).__name__]  # save_pretrained adds it
    expect["config_json"] = cj
    sd = m.state_dict()
    expect["hf_keys"] = sorted(sd.keys())
    q = sd["model.layers.0.self_attn.q_proj.weight"].numpy()
    k = sd["model.layers.0.self_attn.k_proj.weight"].numpy()
    # transformers must give back the HF tensors we started from (up to the quantization)
    for nm, got, src in (("q", q, hf["blk.0.attn_q.weight"]), ("k", k, hf["blk.0.attn_k.weight"])):
        err = np.abs(got - src).max()
        assert err < 0.03, f"transformers {nm}_proj differs from the source by {err}"
    save(os.path.join(OUT, "tiny_llama_hf.f32"), np.concatenate([q.reshape(-1), k.reshape(-1)]))
    with open(os.path.join(OUT, "tiny_llama.json"), "w") as f:
        json.dump(expect, f, indent=1, ensure_ascii=False)

    tok = AutoTokenizer.from_pretrained(d, gguf_file=fn)
    with tempfile.TemporaryDirectory() as td:
        tok.save_pretrained(td)
        shutil.copy(os.path.join(td, "tokenizer.json"), os.path.join(OUT, "tiny_tokenizer.json"))
    print(f"tiny_llama.gguf: {os.path.getsize(path)} bytes, {len(tensors)} tensors", file=sys.stderr)


def gen_meta():
    """Metadata-only file with one key of every value type and nested arrays
    (transformers' reader cannot read nested arrays, so these are kept out
    of tiny_llama.gguf)."""
    path = os.path.join(OUT, "tiny_meta.gguf")
    w = gguf.GGUFWriter(path, "test")
    w.add_custom_alignment(64)
    V_ = gguf.GGUFValueType
    w.add_key_value("test.u8", 200, V_.UINT8)
    w.add_key_value("test.i8", -100, V_.INT8)
    w.add_key_value("test.u16", 60000, V_.UINT16)
    w.add_key_value("test.i16", -30000, V_.INT16)
    w.add_key_value("test.u32", 4000000000, V_.UINT32)
    w.add_key_value("test.i32", -2000000000, V_.INT32)
    w.add_key_value("test.f32", 0.1, V_.FLOAT32)
    w.add_key_value("test.bool", True, V_.BOOL)
    w.add_key_value("test.string", "h\u00e9llo \u4e16\u754c", V_.STRING)
    w.add_key_value("test.u64", 18000000000000000000, V_.UINT64)
    w.add_key_value("test.i64", -9000000000000000000, V_.INT64)
    w.add_key_value("test.f64", 2.718281828459045, V_.FLOAT64)
    w.add_key_value("test.arr_i16", [1, -2, 3, -32768], V_.ARRAY, sub_type=V_.INT16)
    w.add_key_value("test.arr_f64", [0.5, -1e300, 3.0], V_.ARRAY, sub_type=V_.FLOAT64)
    w.add_key_value("test.arr_bool", [True, False, True], V_.ARRAY, sub_type=V_.BOOL)
    w.add_key_value("test.nested", [["x", "yy"], ["zzz"]], V_.ARRAY, sub_type=V_.ARRAY)
    w.add_key_value("test.nested_ints", [[1, 2, 3], [4]], V_.ARRAY, sub_type=V_.ARRAY)
    # two tensors, so that general.alignment = 64 places the second one
    w.add_tensor("a", np.arange(5, dtype=np.float32))
    w.add_tensor("b", np.array([-1.0, 2.0, 0.5], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = gguf.GGUFReader(path)
    meta = {}
    for k, f in r.fields.items():
        if not k.startswith("GGUF."):
            meta[k] = {"types": [int(t) for t in f.types], "value": f.contents()}
    # jansson (the C tests' JSON reader) holds integers as int64
    meta["test.u64"]["value"] = str(meta["test.u64"]["value"])
    # contents() flattens nested arrays; record their structure as written
    meta["test.nested"]["value"] = [["x", "yy"], ["zzz"]]
    meta["test.nested_ints"]["value"] = [[1, 2, 3], [4]]
    tinfo = {t.name: {"file_offset": int(t.data_offset), "nbytes": int(t.n_bytes)} for t in r.tensors}
    with open(os.path.join(OUT, "tiny_meta.json"), "w") as f:
        json.dump({"metadata": meta, "tensors": tinfo}, f, indent=1, ensure_ascii=False)


def gen_smollm_tok():
    """Tokenizer-only file with pre "smollm"; the expected tokenizer.json is
    what tools/gguf_to_hf.py writes for it (transformers' + Digits split)."""
    toks, merges = tiny_vocab()
    path = os.path.join(OUT, "tiny_smollm_tok.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list([t for t, _ in toks])
    w.add_token_types([ty for _, ty in toks])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    expect = {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}}
    # transformers' tokenizer for the digits-split file, pre-tokenizer replaced as gguf_to_hf.py does;
    # then check the result tokenizes like llama.cpp's smollm regex would: digits one by one.
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    d, fn = os.path.split(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=fn)
    with tempfile.TemporaryDirectory() as td:
        tok.save_pretrained(td)
        with open(os.path.join(td, "tokenizer.json"), encoding="utf-8") as f:
            tj = json.load(f)
    tj["pre_tokenizer"] = expect["pre_tokenizer"]
    ids = Tokenizer.from_str(json.dumps(tj)).encode("ab  12", add_special_tokens=False).ids
    assert ids == [9, 12, 7, 8], ids  # "ab", "ĠĠ" (run of spaces split off by the digit split), "1", "2"
    with open(os.path.join(OUT, "tiny_smollm_tok.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, indent=1, ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", default=os.path.join(ROOT, "models", "smollm2",
                                                        "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--hf", default=os.path.join(ROOT, "models", "smollm2-135m-hf"))
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    gen_types()
    if not os.path.exists(args.smollm2) or not os.path.exists(args.hf):
        sys.exit(f"need {args.smollm2} and {args.hf}: run tools/fetch_smollm2.sh --hf first")
    gen_smollm2(args.smollm2, args.hf)
    gen_meta()
    gen_tiny()
    gen_smollm_tok()
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(OUT) for f in fs)
    print(f"tests/fixtures/gguf: {total} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
