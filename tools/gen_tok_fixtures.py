#!/usr/bin/env python3
"""Build the tokenizer fixtures under tests/fixtures/tok/ (no hub downloads).

For each tokenizer style below, train a small byte-level BPE with the Hugging
Face `tokenizers` library on data/austen/train.txt (tools/fetch_austen.sh
makes it), save its tokenizer.json, and record the ids that HF produces
(add_special_tokens=False) for:
  - sample.txt: our own non-corpus text (numbers, unicode, CRLF, tabs, emoji,
    whitespace runs, special tokens), generated here from a fixed seed and
    committed; its ids go to <style>/sample.ids (u32 little-endian);
  - unicode.txt: words of letters/digits new in Unicode 15/16 and older
    non-ASCII ones, then random code points of every plane (committed), ids in
    <style>/unicode.ids (u16 little-endian); all styles but gpt2 are also
    trained on more text of the same kind (not committed, made from a seed)
    so that their merges span these characters;
  - the first VAL_SLICE bytes of data/austen/val.txt: ids to <style>/val_head.ids
    (u16 little-endian; the text itself is not committed);
  - the whole of data/austen/train.txt and val.txt: token count and SHA-256 of
    the ids as u32 little-endian, in <style>/corpus.json.
Rerun after changing a style; the C test tests/test_tokenizer.c reads these.
"""
import hashlib
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import unicodedata

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import AddedToken

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests/fixtures/tok")
AUSTEN = os.path.join(ROOT, "data/austen")
VAL_SLICE = 200000

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def style_gpt2():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>"]
    return tok, 4096, specials, []


def style_llama3():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
                "<|start_header_id|>", "<|end_header_id|>"]
    # a non-special added token: matched like the specials, before pre-tokenization
    added = [("<tool>", False)]
    return tok, 3000, specials, added


def style_qwen2():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    # normalized added tokens: HF matches them after NFC, so a decomposed
    # "cafe\u0301" in the text must still find "café"
    added = [("café", True), ("Ångström", True)]
    return tok, 2048, specials, added


def style_digits_prefix():
    """SmolLM/StarCoder's Digits + ByteLevel, here with add_prefix_space (RoBERTa)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok, 2048, ["<|endoftext|>", "<s>"], []


SP = "\u2581"  # SentencePiece's space
SP_SPECIALS = ["<unk>", "<s>", "</s>"]


def style_llama2():
    """SentencePiece BPE as transformers converts Llama 2 / Mistral v0.1 /
    TinyLlama: Prepend + Replace normalizer, no pre-tokenizer (the whole
    segment is one BPE word), byte fallback to "<0xXX>" tokens, and the
    Replace / ByteFallback / Fuse / Strip decoder. Trained with a Metaspace
    pre-tokenizer (words), which sp_finish() then removes."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="always",
                                                 split=True)
    tok.decoder = decoders.Sequence([decoders.Replace(SP, " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    # specials between segments: the legacy normalizer prepends to each
    return tok, 2000, SP_SPECIALS + ["<|endoftext|>"], []


def style_metaspace():
    """SentencePiece BPE as newer conversions write it (Mistral v0.3,
    Llama 2 with legacy=false): a Metaspace pre-tokenizer that prepends only
    at the start of the input, no split, and the Metaspace decoder."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="always",
                                                 split=True)
    tok.decoder = decoders.Metaspace(replacement=SP, prepend_scheme="first", split=False)
    return tok, 1500, SP_SPECIALS + ["<|im_start|>", "<|im_end|>"], [("<tool>", False)]


def sp_finish(name, path):
    """The byte-fallback tokens "<0x00>".."<0xFF>" put into the vocab after
    the specials (ids 3.., as Llama's), the other ids moved up; then the
    style's own normalizer / pre-tokenizer in place of the training one."""
    j = json.load(open(path, encoding="utf-8"))
    vocab = j["model"]["vocab"]
    n_spec = len(SP_SPECIALS)
    new = {}
    for k, v in vocab.items():
        new[k] = v if v < n_spec else v + 256
    for b in range(256):
        new["<0x%02X>" % b] = n_spec + b
    j["model"]["vocab"] = new
    for a in j["added_tokens"]:
        if a["id"] >= n_spec:
            a["id"] += 256
    if name == "llama2":
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": SP},
            {"type": "Replace", "pattern": {"String": " "}, "content": SP}]}
        j["pre_tokenizer"] = None
    else:
        j["normalizer"] = None
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": SP, "prepend_scheme": "first",
                              "split": False}
    json.dump(j, open(path, "w", encoding="utf-8"), ensure_ascii=False, indent=1)


STYLES = {"gpt2": style_gpt2, "llama3": style_llama3, "qwen2": style_qwen2,
          "digits_prefix": style_digits_prefix, "llama2": style_llama2,
          "metaspace": style_metaspace}


def sample_text():
    """Our own text (not from any corpus), built from a fixed seed."""
    rng = random.Random(20261129)
    words = ["the", "baton", "passes", "between", "stages", "quickly", "and", "a", "token",
             "shard", "It's", "we'll", "THEY'RE", "you'VE", "I'm", "she'd", "don't", "o'clock",
             "x'ſ", "naïve", "café", "Straße", "Ærø", "résumé", "Ελληνικά", "русский", "日本語",
             "中文字", "한국어", "עברית", "العربية", "हिन्दी", "ﬁne", "Å", "Å", "e\u0301", "n\u0303o",
             "\u1e9b\u0323", "😀", "🚀🚀", "👩‍💻", "🇫🇷", "©", "™", "½", "²", "Ⅻ", "٣", "१२३", "…",
             "—", "–", "“quoted”", "‘single’", "(paren)", "[brackets]", "{braces}", "<tag>",
             "a.b,c;d:e!f?g", "$12.50", "€9,99", "100%", "#hash", "@user", "foo_bar",
             "snake-case", "CamelCase", "URL:https://example.invalid/a?b=c&d=e", "e-mail",
             "x\u00a0y", "nb\u202fsp", "zero\u200bwidth", "\ufeffbom", "tab\tsep",
             "\x1cfs\x1dgs", "\x85nel", "line\u2028sep", "para\u2029sep", "\x0bvt\x0cff",
             "cafe\u0301", "A\u030angstro\u0308m", "\u212bngström", "Ångström"]
    numbers = ["0", "7", "42", "123", "1234", "12345", "3.14159", "2026", "1,000,000",
               "0x1F", "9876543210", "007", "1e-5", "٣٤٥", "１２３"]
    spaces = [" ", " ", " ", " ", "  ", "   ", "    ", "\t", "\t\t", " \t ", "\n", "\r\n",
              "\n\n", "\r\n\r\n", " \n", "\n ", "  \n  ", "\r", "\n\n\n    "]
    specials = ["<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<|im_start|>",
                "<|im_end|>", "<tool>", "<|end_of_text|>"]
    out = []
    for _ in range(3000):
        r = rng.random()
        if r < 0.62:
            out.append(rng.choice(words))
        elif r < 0.80:
            out.append(rng.choice(numbers))
        elif r < 0.83:
            out.append(rng.choice(specials))
        elif r < 0.88:
            out.append(rng.choice(["'s", "'t", "'re", "'LL", "'D", "'", "''", "'x", "?!", "...",
                                   "--", "***", ";\n", ".\r\n", ",", "!\n\n"]))
        out.append(rng.choice(spaces))
    # long runs: whitespace backtracking, digit grouping, long BPE words
    out += [" " * 300, "x", "9" * 200, " ", "ab" * 300, " ", "😀" * 50, "\n" * 50, "\r\n" * 30,
            " \t" * 40, "\n", "z" * 1000, "<|endoftext|>" * 3, "   "]
    return "".join(out)


def unicode_pool():
    """Characters whose class HF's engines know but Python's Unicode 14 does
    not (letters and digits added in Unicode 15/16), plus older non-ASCII
    letters, digits and marks. Training on text made of them gives merges
    across them, so a class error in our tables changes the ids."""
    rng = random.Random(11)
    unassigned = [c for c in range(0x80, 0x110000)
                  if not 0xD800 <= c <= 0xDFFF and unicodedata.category(chr(c)) == "Cn"]
    def hf_isolated(pre, cands):
        s = "".join(chr(c) + "\x01" for c in cands)
        return sorted(ord(x) for x, _ in pre.pre_tokenize_str(s) if len(x) == 1 and x != "\x01")
    new_l = hf_isolated(pre_tokenizers.Split(Regex(r"\p{L}"), behavior="isolated"), unassigned)
    new_n = hf_isolated(pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"), unassigned)
    new_d = hf_isolated(pre_tokenizers.Digits(individual_digits=True), unassigned)
    old = [c for c in range(0x80, 0x30000) if unicodedata.category(chr(c))[0] in "LNM"]
    pool = (rng.sample(new_l, 120) + rng.sample(new_n, 40) + rng.sample(new_d, 40) +
            rng.sample(old, 150))
    return [chr(c) for c in pool]


def unicode_text(pool, seed, words):
    """Words of pool characters between spaces, ASCII letters, digits,
    apostrophes and newlines; then random code points of every plane."""
    rng = random.Random(seed)
    out = []
    for _ in range(words):
        w = "".join(rng.choice(pool) for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.2:
            w = rng.choice(["a", "The", "1", "42", "'s", "x"]) + w
        out.append(w)
        out.append(rng.choice([" ", " ", " ", "  ", "\n", " 7", "'d ", "\t", "1", "q"]))
    for _ in range(3000):
        r = rng.random()
        if r < 0.5:
            cp = rng.randrange(0x80, 0x3400)
        elif r < 0.8:
            cp = rng.randrange(0x3400, 0x30000)
        else:
            cp = rng.randrange(0x30000, 0x110000)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        out.append(chr(cp))
        k = rng.random()
        if k < 0.2:
            out.append(" ")
        elif k < 0.25:
            out.append(rng.choice(["\n", "1", "a", "'s", "  ", "\t", "!", "\u0301", "\u00a0"]))
    return "".join(out)


def ids_u32(ids):
    return struct.pack("<%dI" % len(ids), *ids)


def ids_u16(ids):
    return struct.pack("<%dH" % len(ids), *ids)


def main():
    subprocess.run([os.path.join(ROOT, "tools/fetch_austen.sh")], check=True)
    train_path = os.path.join(AUSTEN, "train.txt")
    train = open(train_path, encoding="utf-8").read()
    val = open(os.path.join(AUSTEN, "val.txt"), encoding="utf-8").read()
    os.makedirs(FIX, exist_ok=True)
    # the committed texts stay as they are once written (another Python's
    # Unicode tables would give another pool, and the older styles' ids are
    # of these texts)
    sample_path, uni_path = os.path.join(FIX, "sample.txt"), os.path.join(FIX, "unicode.txt")
    if not os.path.exists(sample_path):
        with open(sample_path, "w", encoding="utf-8", newline="") as f:
            f.write(sample_text())
    sample = open(sample_path, encoding="utf-8", newline="").read()
    pool = unicode_pool()
    uni_train = os.path.join(tempfile.mkdtemp(), "unicode_train.txt")
    with open(uni_train, "w", encoding="utf-8") as f:
        f.write(unicode_text(pool, 8, 60000))
    if not os.path.exists(uni_path):
        with open(uni_path, "w", encoding="utf-8", newline="") as f:
            f.write(unicode_text(pool, 7, 3000))
    uni = open(uni_path, encoding="utf-8", newline="").read()
    val_head = val.encode("utf-8")[:VAL_SLICE].decode("utf-8", "ignore")
    for name in sys.argv[1:] or STYLES:
        tok, vocab, specials, added = STYLES[name]()
        # gpt2 learns from Austen alone; the others also from the unicode pool
        files = [train_path] if name == "gpt2" else [train_path, uni_train]
        sp = name in ("llama2", "metaspace")
        # SentencePiece styles: an alphabet of the 150 most frequent
        # characters, so that the rest go through the byte fallback
        trainer = (trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                       special_tokens=specials, limit_alphabet=150) if sp else
                   trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                       special_tokens=specials,
                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.train(files, trainer)
        if added:
            tok.add_tokens([AddedToken(a, special=False, normalized=norm) for a, norm in added])
        d = os.path.join(FIX, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        if sp:
            sp_finish(name, os.path.join(d, "tokenizer.json"))
        if name == "gpt2":
            # the older "a b" string form of merges, as GPT-2's own file has
            path = os.path.join(d, "tokenizer.json")
            j = json.load(open(path, encoding="utf-8"))
            j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
            json.dump(j, open(path, "w", encoding="utf-8"), ensure_ascii=False, indent=1)
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        enc = lambda s: tok.encode(s, add_special_tokens=False).ids
        s_ids = enc(sample)
        open(os.path.join(d, "sample.ids"), "wb").write(ids_u16(s_ids))
        open(os.path.join(d, "unicode.ids"), "wb").write(ids_u16(enc(uni)))
        v_ids = enc(val_head)
        open(os.path.join(d, "val_head.ids"), "wb").write(ids_u16(v_ids))
        if sp:  # what HF's decoder makes of the sample's ids (valid UTF-8 throughout)
            with open(os.path.join(d, "sample.decoded.txt"), "w", encoding="utf-8",
                      newline="") as f:
                f.write(tok.decode(s_ids, skip_special_tokens=False))
        corpus = {"val_head_bytes": len(val_head.encode("utf-8"))}
        for part, text in (("train", train), ("val", val)):
            ids = enc(text)
            corpus[part] = {"tokens": len(ids), "bytes": len(text.encode("utf-8")),
                            "sha256_u32le": hashlib.sha256(ids_u32(ids)).hexdigest()}
        json.dump(corpus, open(os.path.join(d, "corpus.json"), "w"), indent=1)
        print("%-7s vocab %5d  sample %6d ids  val_head %6d ids  train %7d  val %6d" %
              (name, tok.get_vocab_size(), len(s_ids), len(v_ids), corpus["train"]["tokens"],
               corpus["val"]["tokens"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
