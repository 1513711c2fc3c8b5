#!/usr/bin/env python3
"""Generate data/unicode_tables.c from Python's unicodedata and HF tokenizers.

Tables (all sorted, searched by binary search in data/unicode.c):
  uni_letter   code point ranges of general category L* (Lu Ll Lt Lm Lo)   = \\p{L}
  uni_number   ranges of N* (Nd Nl No)                                     = \\p{N}
  uni_space    ranges of the Unicode White_Space property                  = \\s
  uni_numeric  Rust's char::is_numeric (used by HF's Digits pre-tokenizer)

Python 3.11's unicodedata is Unicode 14.0, older than the tables compiled into
HF tokenizers (its Oniguruma regex engine and Rust's std know Unicode 15/16
letters and digits, e.g. Todhri U+105C0, Garay digits U+10D40). Since the
tokenizer must give HF's ids, the class tables are measured from HF itself:
every code point is run through Split(Regex(r"\p{L}")) etc. and Digits; the
generator checks that each measured set contains unicodedata's, so only
characters newer than Unicode 14 are taken from the measurement. NFC comes
from unicodedata, after checking that HF's NFC and NFD agree with it on every
single code point (HF's normalizer is at the same Unicode level for these).
  uni_ccc      ranges with their canonical combining class (non-zero only)
  uni_decomp   full canonical decomposition of each code point that has one
               (Hangul syllables excluded: they are algorithmic)
  uni_comp     primary composites: (first, second) -> composite, for NFC
Usage: tools/gen_unicode_tables.py > data/unicode_tables.c
"""
import sys
import unicodedata

from tokenizers import Regex, normalizers, pre_tokenizers

MAX = 0x110000
CODE_POINTS = [c for c in range(1, MAX) if not 0xD800 <= c <= 0xDFFF]


def hf_class(pre_tokenizer):
    """Code points that pre_tokenizer isolates as a piece of their own when
    each code point stands between two U+0001 separators."""
    s = "".join(chr(c) + "\x01" for c in CODE_POINTS)
    return set(ord(x) for x, _ in pre_tokenizer.pre_tokenize_str(s) if len(x) == 1 and x != "\x01")


def hf_nfc_agrees():
    sep = "\x00"
    s = sep.join(chr(c) for c in CODE_POINTS)
    for form in ("NFC", "NFD"):
        norm = getattr(normalizers, form)()
        got = norm.normalize_str(s).split(sep)
        assert len(got) == len(CODE_POINTS)
        for c, g in zip(CODE_POINTS, got):
            if g != unicodedata.normalize(form, chr(c)) and not (form == "NFD" and c == 0x11938):
                raise SystemExit("HF %s differs from unicodedata at U+%04X" % (form, c))

# White_Space (PropList.txt); unicodedata has no accessor for the property.
WHITE_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680),
               (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F),
               (0x3000, 0x3000)]


def ranges(pred):
    out, start = [], None
    for cp in range(MAX):
        if pred(cp):
            if start is None:
                start = cp
        elif start is not None:
            out.append((start, cp - 1))
            start = None
    if start is not None:
        out.append((start, MAX - 1))
    return out


def is_hangul_syllable(cp):
    return 0xAC00 <= cp <= 0xD7A3


def canonical_decomp(cp):
    d = unicodedata.decomposition(chr(cp))
    if not d or d.startswith("<"):
        return None
    return [int(x, 16) for x in d.split()]


def full_decomp(cp):
    d = canonical_decomp(cp)
    if d is None:
        return [cp]
    out = []
    for x in d:
        out.extend(full_decomp(x))
    return out


def emit_ranges(name, rs, out):
    out.append("const uni_range_t %s[] = {" % name)
    for i in range(0, len(rs), 4):
        out.append("    " + " ".join("{0x%X, 0x%X}," % r for r in rs[i:i + 4]))
    out.append("};")
    out.append("const size_t %s_len = %d;" % (name, len(rs)))
    out.append("")


def measured(name, pre_tokenizer, base):
    got = hf_class(pre_tokenizer)
    missing = base - got
    if missing:
        raise SystemExit("%s: HF lacks %d code points that unicodedata has, e.g. U+%04X" %
                         (name, len(missing), min(missing)))
    sys.stderr.write("%s: %d code points (unicodedata: %d)\n" % (name, len(got), len(base)))
    return got


def main():
    cat = {c: unicodedata.category(chr(c)) for c in CODE_POINTS}
    py_letter = {c for c in CODE_POINTS if cat[c].startswith("L")}
    py_number = {c for c in CODE_POINTS if cat[c].startswith("N")}
    py_space = set()
    for lo, hi in WHITE_SPACE:
        py_space |= set(range(lo, hi + 1))
    isolated = lambda rx: pre_tokenizers.Split(Regex(rx), behavior="isolated")
    hf_letter = measured("\\p{L}", isolated(r"\p{L}"), py_letter)
    hf_number = measured("\\p{N}", isolated(r"\p{N}"), py_number)
    hf_space = measured("\\s", isolated(r"\s"), py_space)
    if hf_space != py_space:
        raise SystemExit("\\s: HF's set differs from White_Space")
    hf_numeric = measured("is_numeric", pre_tokenizers.Digits(individual_digits=True), py_number)
    hf_nfc_agrees()
    letter = ranges(lambda c: c in hf_letter)
    number = ranges(lambda c: c in hf_number)
    numeric = ranges(lambda c: c in hf_numeric)
    for c in range(0x300):  # the NFC fast path in data/unicode.c relies on this
        assert unicodedata.normalize("NFC", chr(c)) == chr(c)
        assert unicodedata.combining(chr(c)) == 0

    ccc = []
    for cp in range(MAX):
        k = unicodedata.combining(chr(cp))
        if not k:
            continue
        if ccc and ccc[-1][1] == cp - 1 and ccc[-1][2] == k:
            ccc[-1][1] = cp
        else:
            ccc.append([cp, cp, k])

    decomp, pool = [], []
    comp = []
    for cp in range(MAX):
        if is_hangul_syllable(cp):
            continue
        d = canonical_decomp(cp)
        if d is None:
            continue
        full = full_decomp(cp)
        decomp.append((cp, len(pool), len(full)))
        pool.extend(full)
        if len(d) == 2 and unicodedata.normalize("NFC", chr(d[0]) + chr(d[1])) == chr(cp):
            comp.append((d[0], d[1], cp))
    comp.sort()

    import tokenizers
    out = ["/* Generated by tools/gen_unicode_tables.py from Python %s unicodedata "
           "(Unicode %s) and HF tokenizers %s. Do not edit. */" %
           (sys.version.split()[0], unicodedata.unidata_version, tokenizers.__version__),
           '#include "data/unicode.h"', "",
           "const char uni_table_version[] = \"%s\";" % unicodedata.unidata_version, ""]
    emit_ranges("uni_letter", letter, out)
    emit_ranges("uni_number", number, out)
    emit_ranges("uni_space", WHITE_SPACE, out)
    emit_ranges("uni_numeric", numeric, out)
    out.append("const uni_ccc_range_t uni_ccc[] = {")
    for i in range(0, len(ccc), 4):
        out.append("    " + " ".join("{0x%X, 0x%X, %d}," % tuple(r) for r in ccc[i:i + 4]))
    out.append("};")
    out.append("const size_t uni_ccc_len = %d;" % len(ccc))
    out.append("")
    out.append("const uint32_t uni_decomp_pool[] = {")
    for i in range(0, len(pool), 8):
        out.append("    " + " ".join("0x%X," % x for x in pool[i:i + 8]))
    out.append("};")
    out.append("const uni_decomp_t uni_decomp[] = {")
    for i in range(0, len(decomp), 4):
        out.append("    " + " ".join("{0x%X, %d, %d}," % e for e in decomp[i:i + 4]))
    out.append("};")
    out.append("const size_t uni_decomp_len = %d;" % len(decomp))
    out.append("")
    out.append("const uni_comp_t uni_comp[] = {")
    for i in range(0, len(comp), 4):
        out.append("    " + " ".join("{0x%X, 0x%X, 0x%X}," % e for e in comp[i:i + 4]))
    out.append("};")
    out.append("const size_t uni_comp_len = %d;" % len(comp))
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
