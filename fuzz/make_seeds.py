#!/usr/bin/env python3
"""Writes small seed GGUF files for the fuzzer into fuzz/corpus/ (run from anywhere; no dependencies).

Seeds cover what random mutation reaches slowly: every metadata value type, arrays of each type,
nested arrays, general.alignment, GGUF v2, and one small tensor of every type the reference decoders handle.
"""
import os
import random
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
              BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def value(t, v):
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(value(et, x) for x in items)
    return struct.pack(SCALAR_FMT[t], v)


def gguf(kvs, tensors, version=3, alignment=32):
    """kvs: [(key, type, value)], tensors: [(name, [ne...], type_id, bytes)]"""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    head += b"".join(gstr(k) + struct.pack("<I", t) + value(t, v) for k, t, v in kvs)
    data, infos = b"", b""
    for name, ne, tid, raw in tensors:
        data += b"\0" * (-len(data) % alignment)
        infos += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        infos += struct.pack("<IQ", tid, len(data))
        data += raw
    body = head + infos
    if tensors:
        body += b"\0" * (-len(body) % alignment)
    return body + data


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = random.Random(1234)
    kvs = [("general.architecture", STR, "fuzz"), ("u8", U8, 200), ("i8", I8, -5), ("u16", U16, 60000),
           ("i16", I16, -300), ("u32", U32, 4000000000), ("i32", I32, -7), ("f32", F32, 1.5),
           ("bool", BOOL, True), ("u64", U64, 2**63 + 5), ("i64", I64, -2**40), ("f64", F64, -0.25),
           ("str", STR, "tab\there \"quoted\" \u00e9"),
           ("arr.i32", ARR, (I32, [1, -2, 3])), ("arr.str", ARR, (STR, ["a", "", "ccc"])),
           ("arr.f32", ARR, (F32, [0.5, -1.0])), ("arr.bool", ARR, (BOOL, [True, False])),
           ("arr.nested", ARR, (ARR, [(U8, [1, 2]), (STR, ["x"])])), ("arr.empty", ARR, (U64, []))]
    with open(os.path.join(OUT, "all-value-types.gguf"), "wb") as f:
        f.write(gguf(kvs, [("t", [4, 2], 0, struct.pack("<8f", *range(8)))]))
    with open(os.path.join(OUT, "v2-align64.gguf"), "wb") as f:
        f.write(gguf([("general.alignment", U32, 64)],
                     [("a", [3], 0, b"\1" * 12), ("b", [2, 1, 1, 2], 1, b"\2" * 8)], version=2, alignment=64))
    # One row of every decodable type: (type id, block elements, block bytes).
    types = [(0, 1, 4), (1, 1, 2), (30, 1, 2), (2, 32, 18), (3, 32, 20), (6, 32, 22), (7, 32, 24),
             (8, 32, 34), (10, 256, 84), (11, 256, 110), (12, 256, 144), (13, 256, 176), (14, 256, 210),
             (15, 256, 292), (20, 32, 18), (23, 256, 136)]
    tensors = []
    for tid, block, size in types:
        n = 256 if block == 256 else 32
        raw = bytes(rng.randrange(256) for _ in range(n // block * size))
        tensors.append((f"type{tid}", [n, 1], tid, raw))
    with open(os.path.join(OUT, "every-decoder.gguf"), "wb") as f:
        f.write(gguf([("general.architecture", STR, "fuzz")], tensors))


if __name__ == "__main__":
    main()
