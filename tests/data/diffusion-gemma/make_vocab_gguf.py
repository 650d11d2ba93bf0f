#!/usr/bin/env python3
"""Writes tiny-diffusion-gemma-A-vocab.gguf: the metadata of the fixture's F32 model (every key, in its order and
types: general.architecture, the diffusion-gemma hyperparameters, the gemma4 tokenizer and chat template) and no
tensors, so the tokenizer and chat tests read the real vocabulary without the 20 MB of weights.
Usage: make_vocab_gguf.py ../../../../shared/fixtures/diffusion-gemma/gguf/tiny-diffusion-gemma-A-F32.gguf OUT"""
import struct
import sys

SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def skip_value(buf, at, t):
    """Offset just past one value of GGUF type t starting at buf[at]."""
    if t == 8:  # string
        (n,) = struct.unpack_from("<Q", buf, at)
        return at + 8 + n
    if t == 9:  # array
        at_type, n = struct.unpack_from("<IQ", buf, at)
        at += 12
        if at_type in SCALAR:
            return at + n * SCALAR[at_type]
        for _ in range(n):
            at = skip_value(buf, at, at_type)
        return at
    return at + SCALAR[t]


def main(src, out):
    buf = open(src, "rb").read()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    assert magic == b"GGUF", "not a GGUF file"
    at = 24
    start = at
    for _ in range(n_kv):
        (klen,) = struct.unpack_from("<Q", buf, at)
        at += 8 + klen
        (t,) = struct.unpack_from("<I", buf, at)
        at = skip_value(buf, at + 4, t)
    kv = buf[start:at]
    with open(out, "wb") as f:
        f.write(struct.pack("<4sIQQ", magic, version, 0, n_kv))
        f.write(kv)
        f.write(b"\0" * ((-(24 + len(kv))) % 32))  # the (empty) data section starts aligned


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
