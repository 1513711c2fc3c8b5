#!/usr/bin/env python3
"""Build the tokenizer fixtures under tests/fixtures/tok/ (no hub downloads).

For each tokenizer style below, train a small byte-level BPE with the Hugging
Face `tokenizers` library on data/austen/train.txt (tools/fetch_austen.sh
makes it), save its tokenizer.json, and record the ids that HF produces
(add_special_tokens=False) for:
  - sample.txt: our own non-corpus text (numbers, unicode, CRLF, tabs, emoji,
    whitespace runs, special tokens), generated here from a fixed seed and
    committed; its ids go to <style>/sample.ids (u32 little-endian);
  - unicode.txt: random code points of every plane (committed), ids in
    <style>/unicode.ids (u16 little-endian);
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
    added = ["<tool>"]
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
    return tok, 2048, specials, []


STYLES = {"gpt2": style_gpt2, "llama3": style_llama3, "qwen2": style_qwen2}


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
             "\x1cfs\x1dgs", "\x85nel", "line\u2028sep", "para\u2029sep", "\x0bvt\x0cff"]
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


def unicode_text():
    """Random code points from every plane (assigned or not, no surrogates),
    in short runs between spaces, digits and newlines: checks the letter,
    number and space tables and NFC against HF's regex engine."""
    rng = random.Random(7)
    out = []
    for _ in range(4000):
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
    sample = sample_text()
    with open(os.path.join(FIX, "sample.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(sample)
    uni = unicode_text()
    with open(os.path.join(FIX, "unicode.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(uni)
    val_head = val.encode("utf-8")[:VAL_SLICE].decode("utf-8", "ignore")
    for name in sys.argv[1:] or STYLES:
        tok, vocab, specials, added = STYLES[name]()
        trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                      special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train([train_path], trainer)
        if added:
            tok.add_tokens([AddedToken(a, special=False, normalized=False) for a in added])
        d = os.path.join(FIX, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
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
