#!/usr/bin/env python3
"""Edits a safetensors file for the shell tests (standard library only).

  st_edit.py IN OUT add NAME FROM [SCALE]  adds tensor NAME, a copy of FROM
                                           (F32: each element times SCALE)
  st_edit.py IN OUT nan NAME               sets the first element of NAME
                                           (F32) to NaN

The header is rewritten with the data offsets of the new layout; the other
tensors keep their bytes.
"""
import json
import math
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    data = b[8 + n:]
    meta = header.pop("__metadata__", None)
    tensors = {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
               for k, v in header.items()}
    return meta, tensors


def write(path, meta, tensors):
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if meta is not None:
        header["__metadata__"] = meta
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    src, dst, op = sys.argv[1:4]
    meta, tensors = read(src)
    if op == "add":
        name, frm = sys.argv[4], sys.argv[5]
        scale = float(sys.argv[6]) if len(sys.argv) > 6 else 1.0
        dtype, shape, raw = tensors[frm]
        if scale != 1.0:
            assert dtype == "F32", "scaling needs an F32 tensor"
            vals = struct.unpack("<%df" % (len(raw) // 4), raw)
            raw = struct.pack("<%df" % len(vals), *(v * scale for v in vals))
        tensors[name] = (dtype, shape, raw)
    elif op == "nan":
        dtype, shape, raw = tensors[sys.argv[4]]
        assert dtype == "F32"
        tensors[sys.argv[4]] = (dtype, shape, struct.pack("<f", math.nan) + raw[4:])
    else:
        sys.exit("unknown operation " + op)
    write(dst, meta, tensors)


if __name__ == "__main__":
    main()
