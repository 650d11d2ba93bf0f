#!/usr/bin/env python3
"""Writes inspect-expected.json: what gguf-py's GGUFReader reports for each tiny model GGUF here.

test_inspect compares `dllm inspect --json` with it: version, alignment, data offset, every metadata key
(type; value, or for arrays the element type, length and first items), and every tensor's name, type,
shape (ne order, ne0 first), offset in the data section and size in bytes.
Run from anywhere: pip install gguf numpy && python3 make_inspect_expected.py
"""
import json
import os
from collections import Counter

from gguf import GGUFReader, GGUFValueType

HERE = os.path.dirname(os.path.abspath(__file__))
FIRST_ITEMS = 8  # the number of array items dllm inspect --json keeps

TYPE_NAMES = {
    GGUFValueType.UINT8: "u8", GGUFValueType.INT8: "i8", GGUFValueType.UINT16: "u16",
    GGUFValueType.INT16: "i16", GGUFValueType.UINT32: "u32", GGUFValueType.INT32: "i32",
    GGUFValueType.FLOAT32: "f32", GGUFValueType.BOOL: "bool", GGUFValueType.STRING: "str",
    GGUFValueType.ARRAY: "arr", GGUFValueType.UINT64: "u64", GGUFValueType.INT64: "i64",
    GGUFValueType.FLOAT64: "f64",
}


def plain(v):
    """numpy scalars and lists to JSON-able Python values."""
    if isinstance(v, list):
        return [plain(x) for x in v]
    if hasattr(v, "item"):
        return v.item()
    return v


def describe(path):
    r = GGUFReader(path)
    meta = {}
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue  # the header fields gguf-py lists as pseudo-keys
        t = field.types[0]
        if t == GGUFValueType.ARRAY:
            items = plain(field.contents())
            meta[key] = {"type": "arr", "elem_type": TYPE_NAMES[field.types[1]], "length": len(field.data),
                         "first": items[:FIRST_ITEMS]}
        else:
            meta[key] = {"type": TYPE_NAMES[t], "value": plain(field.contents())}
    tensors = [{"name": t.name, "type": t.tensor_type.name, "shape": [int(n) for n in t.shape],
                "offset": int(t.data_offset) - int(r.data_offset), "nbytes": int(t.n_bytes)}
               for t in r.tensors]
    return {
        "version": int(r.fields["GGUF.version"].contents()),
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "file_size": os.path.getsize(path),
        "metadata": meta,
        "tensor_type_counts": dict(Counter(t["type"] for t in tensors)),
        "tensors": tensors,
    }


def main():
    files = sorted(f for f in os.listdir(HERE) if f.endswith(".gguf"))
    out = {f: describe(os.path.join(HERE, f)) for f in files}
    with open(os.path.join(HERE, "inspect-expected.json"), "w") as fh:
        json.dump(out, fh, indent=1, ensure_ascii=False)
        fh.write("\n")


if __name__ == "__main__":
    main()
