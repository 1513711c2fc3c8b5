#!/usr/bin/env python3
"""Extract the six Jane Austen novels from Debian's r-cran-janeaustenr.

The package keeps its data sets in an R lazy-load database: data/Rdata.rdx is
a gzip'd R serialization of a list {variables, references, compressed} where
`variables` maps each object name to an (offset, length) pair in
data/Rdata.rdb; each record there is a 4-byte big-endian uncompressed length
followed by a zlib stream holding one R serialization (format 2 or 3, XDR).
Each novel is a character vector (STRSXP) with one element per printed line.

Output: OUT/<book>.txt (lines joined with "\n", trailing "\n"), plus the
held-out split documented in docs/DATA.md:
    val   = the last 10% of each book's lines (floor(n*0.9) onward),
    train = the rest;
both written in the fixed book order BOOKS, books separated by a blank line.

Usage: extract_austen.py PKGROOT OUTDIR
  PKGROOT: the directory holding usr/ from `dpkg -x`, or the janeaustenr
  package directory itself.
"""
import gzip
import os
import struct
import sys
import zlib

BOOKS = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma",
         "northangerabbey", "persuasion"]
VAL_FRACTION_NUM, VAL_FRACTION_DEN = 1, 10

# SEXP type codes (R internals, serialize.c)
NILSXP, SYMSXP, LISTSXP, CLOSXP, ENVSXP = 0, 1, 2, 3, 4
LANGSXP, CHARSXP, LGLSXP, INTSXP, REALSXP, CPLXSXP, STRSXP = 6, 9, 10, 13, 14, 15, 16
VECSXP, EXPRSXP, RAWSXP, S4SXP = 19, 20, 24, 25
REFSXP, NILVALUE_SXP, GLOBALENV_SXP, UNBOUNDVALUE_SXP = 255, 254, 253, 252
MISSINGARG_SXP, BASENAMESPACE_SXP, NAMESPACESXP, PACKAGESXP = 251, 250, 249, 248
PERSISTSXP, EMPTYENV_SXP, BASEENV_SXP, ATTRLANGSXP, ATTRLISTSXP = 247, 242, 241, 240, 239
ALTREP_SXP = 238

IS_OBJECT_BIT, HAS_ATTR_BIT, HAS_TAG_BIT = 1 << 8, 1 << 9, 1 << 10
# CHARSXP encoding flags, stored in the "levels" field (flags >> 12)
LATIN1_MASK, UTF8_MASK, BYTES_MASK, ASCII_MASK = 1 << 2, 1 << 3, 1 << 1, 1 << 6
NA_INT = -(1 << 31)


class RFormatError(Exception):
    pass


class RReader:
    """Reader for one XDR ("X\\n") R serialization stream."""

    def __init__(self, buf, what):
        self.buf, self.pos, self.what, self.refs = buf, 0, what, []
        self.native_encoding = "UTF-8"

    def fail(self, msg):
        raise RFormatError("%s: offset %d: %s" % (self.what, self.pos, msg))

    def take(self, n):
        if n < 0 or self.pos + n > len(self.buf):
            self.fail("truncated (need %d bytes, %d left)" % (n, len(self.buf) - self.pos))
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def int(self):
        return struct.unpack(">i", self.take(4))[0]

    def length(self):
        n = self.int()
        if n == -1:  # long vector: two more ints
            hi, lo = struct.unpack(">II", self.take(8))
            n = (hi << 32) | lo
        elif n < 0:
            self.fail("negative length %d" % n)
        return n

    def header(self):
        fmt = self.take(2)
        if fmt != b"X\n":
            self.fail("unsupported serialization format %r (only XDR 'X\\n')" % fmt)
        version = self.int()
        self.int()  # R version that wrote it
        self.int()  # minimal R version to read it
        if version == 3:
            n = self.int()
            self.native_encoding = self.take(n).decode("ascii", "replace")
        elif version != 2:
            self.fail("unsupported serialization version %d" % version)
        return self.item()

    def charsxp(self, levels):
        n = self.int()
        if n == -1:
            return None  # NA_character_
        raw = self.take(n)
        if levels & (UTF8_MASK | ASCII_MASK):
            enc = "utf-8"
        elif levels & LATIN1_MASK:
            enc = "latin-1"
        elif levels & BYTES_MASK:
            return raw
        else:  # native encoding of the writer
            enc = "latin-1" if "8859-1" in self.native_encoding.upper() \
                or "LATIN1" in self.native_encoding.upper() else "utf-8"
        try:
            return raw.decode(enc)
        except UnicodeDecodeError as e:
            self.fail("CHARSXP not valid %s: %s" % (enc, e))

    def attributes(self, flags):
        return self.item() if flags & HAS_ATTR_BIT else None

    def item(self):
        flags = self.int()
        t = flags & 0xFF
        levels = flags >> 12
        if t in (NILVALUE_SXP, EMPTYENV_SXP, BASEENV_SXP, GLOBALENV_SXP,
                 UNBOUNDVALUE_SXP, MISSINGARG_SXP, BASENAMESPACE_SXP):
            return None
        if t == REFSXP:
            idx = flags >> 8
            if idx == 0:
                idx = self.int()
            if not 1 <= idx <= len(self.refs):
                self.fail("reference %d out of range (%d known)" % (idx, len(self.refs)))
            return self.refs[idx - 1]
        if t == SYMSXP:
            name = self.item()
            sym = ("symbol", name)
            self.refs.append(sym)
            return sym
        if t in (PACKAGESXP, NAMESPACESXP, PERSISTSXP):
            self.int()  # always 0
            n = self.int()
            names = [self.item() for _ in range(n)]
            obj = ("env-ref", names)
            self.refs.append(obj)
            return obj
        if t == ENVSXP:
            obj = {"type": "env"}
            self.refs.append(obj)
            self.int()  # locked
            obj["enclos"] = self.item()
            obj["frame"] = self.item()
            obj["hashtab"] = self.item()
            obj["attr"] = self.item()
            return obj
        if t in (LISTSXP, LANGSXP, CLOSXP, ATTRLANGSXP, ATTRLISTSXP):
            out = []
            while True:
                attr = self.attributes(flags)
                tag = self.item() if flags & HAS_TAG_BIT else None
                car = self.item()
                out.append((tag[1] if isinstance(tag, tuple) else tag, car, attr))
                # the CDR is read iteratively to keep long pairlists off the stack
                flags = self.int()
                t = flags & 0xFF
                if t == NILVALUE_SXP:
                    return ("pairlist", out)
                if t not in (LISTSXP, LANGSXP, CLOSXP, ATTRLANGSXP, ATTRLISTSXP):
                    self.pos -= 4
                    out.append((None, self.item(), None))
                    return ("pairlist", out)
        if t == CHARSXP:
            return self.charsxp(levels)
        if t in (LGLSXP, INTSXP):
            n = self.length()
            vals = list(struct.unpack(">%di" % n, self.take(4 * n)))
            return ("int", [None if v == NA_INT else v for v in vals], self.attributes(flags))
        if t == REALSXP:
            n = self.length()
            return ("real", list(struct.unpack(">%dd" % n, self.take(8 * n))),
                    self.attributes(flags))
        if t == CPLXSXP:
            n = self.length()
            self.take(16 * n)
            return ("complex", n, self.attributes(flags))
        if t == STRSXP:
            n = self.length()
            vals = []
            for _ in range(n):
                f = self.int()
                if f & 0xFF != CHARSXP:
                    self.fail("STRSXP element of type %d, expected CHARSXP" % (f & 0xFF))
                vals.append(self.charsxp(f >> 12))
            return ("str", vals, self.attributes(flags))
        if t in (VECSXP, EXPRSXP):
            n = self.length()
            vals = [self.item() for _ in range(n)]
            return ("list", vals, self.attributes(flags))
        if t == RAWSXP:
            n = self.length()
            return ("raw", self.take(n), self.attributes(flags))
        if t == ALTREP_SXP:
            info = self.item()
            state = self.item()
            attr = self.item()
            return ("altrep", info, state, attr)
        self.fail("unsupported SEXP type %d" % t)


def attr_get(attr, name):
    if not attr or attr[0] != "pairlist":
        return None
    for tag, val, _ in attr[1]:
        if tag == name:
            return val
    return None


def read_index(path):
    raw = open(path, "rb").read()
    try:
        if raw[:2] == b"\x1f\x8b":
            data = gzip.decompress(raw)
        else:  # 4-byte length + zlib, the lazy-load record form
            data = zlib.decompress(raw[4:])
    except (OSError, EOFError, zlib.error) as e:
        raise RFormatError("%s: corrupt compressed index: %s" % (path, e))
    idx = RReader(data, path).header()
    if idx[0] != "list":
        raise RFormatError("%s: index is not a list" % path)
    names = attr_get(idx[2], "names")[1]
    index = dict(zip(names, idx[1]))
    variables = index.get("variables")
    if variables is None:
        raise RFormatError("%s: index has no 'variables'" % path)
    var_names = attr_get(variables[2], "names")[1]
    out = {}
    for name, loc in zip(var_names, variables[1]):
        out[name] = (int(loc[1][0]), int(loc[1][1]))
    return out


def read_record(rdb, name, off, length):
    rec = rdb[off:off + length]
    if len(rec) != length or length < 5:
        raise RFormatError("record %s: truncated at offset %d" % (name, off))
    want = struct.unpack(">I", rec[:4])[0]
    try:
        data = zlib.decompress(rec[4:])
    except zlib.error as e:
        raise RFormatError("record %s at offset %d: corrupt zlib stream: %s" % (name, off, e))
    if len(data) != want:
        raise RFormatError("record %s: inflated to %d bytes, header says %d" %
                           (name, len(data), want))
    return RReader(data, "record " + name).header()


def main():
    if len(sys.argv) != 3:
        sys.stderr.write("usage: extract_austen.py PKGROOT OUTDIR\n")
        return 2
    root, outdir = sys.argv[1], sys.argv[2]
    pkg = root
    cand = os.path.join(root, "usr/lib/R/site-library/janeaustenr")
    if os.path.isdir(cand):
        pkg = cand
    rdx = os.path.join(pkg, "data/Rdata.rdx")
    rdb_path = os.path.join(pkg, "data/Rdata.rdb")
    index = read_index(rdx)
    rdb = open(rdb_path, "rb").read()
    os.makedirs(outdir, exist_ok=True)
    train, val = [], []
    for book in BOOKS:
        if book not in index:
            raise RFormatError("%s: no object named %s (have %s)" %
                               (rdx, book, ", ".join(sorted(index))))
        obj = read_record(rdb, book, *index[book])
        if obj[0] != "str":
            raise RFormatError("%s: object %s is not a character vector" % (rdb_path, book))
        lines = ["" if s is None else s for s in obj[1]]
        text = "\n".join(lines) + "\n"
        with open(os.path.join(outdir, book + ".txt"), "w", encoding="utf-8", newline="") as f:
            f.write(text)
        cut = len(lines) * (VAL_FRACTION_DEN - VAL_FRACTION_NUM) // VAL_FRACTION_DEN
        train.append("\n".join(lines[:cut]) + "\n")
        val.append("\n".join(lines[cut:]) + "\n")
        print("%-17s %6d lines %8d bytes (train lines [0,%d), val [%d,%d))" %
              (book, len(lines), len(text.encode()), cut, cut, len(lines)))
    for name, parts in (("train.txt", train), ("val.txt", val)):
        with open(os.path.join(outdir, name), "w", encoding="utf-8", newline="") as f:
            f.write("\n".join(parts))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RFormatError, OSError, zlib.error) as e:
        sys.stderr.write("extract_austen: %s\n" % e)
        sys.exit(1)
