#!/usr/bin/env python3
"""Seed files for the trace reader's fuzz target (tests/fuzz/fuzz_trace.c):
small valid trace files of format versions 1, 2 and 3, laid out as
trace/format.h and trace/trace.h describe them (little-endian x86-64).

    python3 tests/fuzz/gen_trace_seeds.py [OUT_DIR]   (default tests/fuzz/corpus_trace)
"""
import os
import struct
import sys

MAGIC, BLK = 0x43525442, 0xB7C00000
RECS, DROPPED, NAME, ACTOR, THREAD, END, CLOCK = range(1, 8)
SEND, RECV, SPAN, INSTANT, COUNTER = range(5)
TICKS_SLOT, HANDLED_SLOT, PAD, WIDE = 0x08, 0x10, 0x40, 0x80


def header(version, rec_size):
    return struct.pack("<6IQ", MAGIC, version, 3, 4242, rec_size, 0, 10**9)


def block(kind, arg=0, count=0, body=b""):
    return struct.pack("<4I", BLK | kind, arg, count, len(body)) + body


def rec64(ev, kind=0, msg_type=1, actor=0x30001, t0=10**9, t1=None, bytes_=64, seq=0, step=1, peer=0x30002,
          mb=0, name_id=0, reserved=0):
    """trace_rec_t: ev, kind, msg_type, actor, t0, t1, bytes|value, seq, step, peer, mb, name_id, reserved."""
    return struct.pack("<BBHIQQQQqIiII", ev, kind, msg_type, actor, t0, t0 if t1 is None else t1, bytes_, seq, step,
                       peer, mb, name_id, reserved)


def slot(ev, msg_type=1, mb=0, actor=0x30001, peer=0x30002, seq=0, step=1, bytes_=64, t0=10**9, delay=0, dur=0):
    """trace_slot_t, 40 bytes."""
    return struct.pack("<BBhIIIiIQII", ev, msg_type, mb, actor, peer, seq, step, bytes_, t0, delay, dur)


def names():
    return (block(NAME, 1, 0, b"fwd") + block(ACTOR, 0x30001, 0, b"stage0") + block(ACTOR, 0x30002, 0, b"stage1")
            + block(THREAD, 0, 0, b"loop0"))


def clock():
    return block(CLOCK, 0, 0, struct.pack("<4Q", 1000, 10**9, 1000 + 30_000_000, 10**9 + 10_000_000))


def v3():
    slots = [
        slot(SEND, seq=0xFFFFFFFF),
        slot(SEND | TICKS_SLOT, seq=0, t0=2000),
        slot(RECV | HANDLED_SLOT | TICKS_SLOT, actor=0x30002, peer=0x30001, seq=0, t0=3000, delay=30, dur=300),
        slot(SPAN | TICKS_SLOT, peer=0, msg_type=0xFF, t0=4000, dur=3000),
        slot(PAD),
        rec64(INSTANT | WIDE, msg_type=0xFFFF, name_id=1, mb=-1) + bytes(16),
        rec64(SPAN | WIDE, kind=1, msg_type=0xFFFF, t1=10**9 + 5000, bytes_=4000, name_id=1) + bytes(16),
    ]
    body = b"".join(slots)
    count = len(body) // 40
    return header(3, 40) + names() + clock() + block(RECS, 0, count, body) + block(DROPPED, 0, 2) + block(END)


def v2():
    recs = [
        rec64(SEND, t0=1500, reserved=1),
        rec64(RECV, kind=1, actor=0x30002, peer=0x30001, t0=2500, t1=9000, name_id=40, reserved=1),
        rec64(COUNTER, msg_type=0xFFFF, bytes_=struct.unpack("<Q", struct.pack("<d", 2.5))[0], name_id=1),
    ]
    body = b"".join(recs)
    return header(2, 64) + names() + clock() + block(RECS, 0, len(recs), body) + block(END)


def v1():
    recs = [rec64(SEND, seq=k) for k in range(3)] + [rec64(RECV, actor=0x30002, peer=0x30001, seq=k, t0=10**9 + 500)
                                                  for k in range(3)]
    return header(1, 64) + names() + block(RECS, 0, len(recs), b"".join(recs)) + block(END)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus_trace")
    os.makedirs(out, exist_ok=True)
    for name, data in (("v1.bin", v1()), ("v2.bin", v2()), ("v3.bin", v3())):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
