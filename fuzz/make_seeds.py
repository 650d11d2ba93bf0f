#!/usr/bin/env python3
"""Writes small seed GGUF files for the fuzzers (run from anywhere; no dependencies).

fuzz/corpus/ (fuzz_gguf): what random mutation reaches slowly: every metadata value type, arrays of each
type, nested arrays, general.alignment, GGUF v2, and one small tensor of every type the reference decoders
handle. fuzz/seeds-model/ (fuzz_model): tiny complete llada, dream, llada-moe and rnd1 files (one layer,
width 32, F32 weights, the experts in Q8_0) that load and run as they are.
"""
import os
import random
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
OUT_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds-model")

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
    write_models(rng)


def q8_0(values):
    """Q8_0 blocks of 32: f16 scale (max |x| / 127), then 32 int8 quants."""
    out = b""
    for b in range(0, len(values), 32):
        block = values[b:b + 32]
        d = max(abs(x) for x in block) / 127 or 1.0
        out += struct.pack("<e", d) + bytes((round(x / d) & 0xFF) for x in block)
    return out


def tiny_model(arch, rng, q8_experts=False):
    """A complete one-layer model of width 32 (the loader's checks, tests/gguf_writer.h's tiny_model in small)."""
    # Vocabulary: the byte-level symbols of printable ASCII (space is "\u0120"), then the mask token, so that
    # a plain-text prompt encodes.
    vocab = ["\u0120"] + [chr(c) for c in range(33, 127)] + ["th", "hi", "<s>", "</s>", "<|mask|>"]
    pre = {"llada": "llama-bpe", "dream": "qwen2", "llada-moe": "llada-moe", "rnd1": "qwen2"}[arch]
    D, H, F, V, E, K = 32, 2, 32, len(vocab), 4, 2
    HKV = 1 if arch in ("dream", "rnd1") else 2
    d = D // H
    moe = arch in ("llada-moe", "rnd1")
    a = arch + "."
    kvs = [("general.architecture", STR, arch), (a + "block_count", U32, 1), (a + "context_length", U32, 512),
           (a + "embedding_length", U32, D), (a + "feed_forward_length", U32, F),
           (a + "attention.head_count", U32, H), (a + "attention.head_count_kv", U32, HKV),
           (a + "rope.freq_base", F32, 10000.0), (a + "attention.layer_norm_rms_epsilon", F32, 1e-5),
           ("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.pre", STR, pre),
           ("tokenizer.ggml.tokens", ARR, (STR, vocab)), ("tokenizer.ggml.merges", ARR, (STR, ["t h", "h i"])),
           ("tokenizer.ggml.bos_token_id", U32, V - 3), ("tokenizer.ggml.eos_token_id", U32, V - 2),
           ("tokenizer.ggml.mask_token_id", U32, V - 1)]
    if moe:
        kvs += [(a + "expert_count", U32, E), (a + "expert_used_count", U32, K),
                (a + "expert_feed_forward_length", U32, F)]

    def f32(name, ne, std, mean=0.0):
        n = 1
        for x in ne:
            n *= x
        return (name, ne, 0, struct.pack(f"<{n}f", *(rng.gauss(mean, std) for _ in range(n))))

    def experts(name, ne, std):
        if not q8_experts:
            return f32(name, ne, std)
        n = ne[0] * ne[1] * ne[2]
        return (name, ne, 8, q8_0([rng.gauss(0, std) for _ in range(n)]))

    t = [f32("token_embd.weight", [D, V], 1.0), f32("blk.0.attn_norm.weight", [D], 0.1, 1.0),
         f32("blk.0.attn_q.weight", [D, D], 0.1), f32("blk.0.attn_k.weight", [D, HKV * d], 0.1),
         f32("blk.0.attn_v.weight", [D, HKV * d], 0.1), f32("blk.0.attn_output.weight", [D, D], 0.1),
         f32("blk.0.ffn_norm.weight", [D], 0.1, 1.0)]
    if arch == "dream":
        t += [f32("blk.0.attn_q.bias", [D], 0.2), f32("blk.0.attn_k.bias", [HKV * d], 0.2),
              f32("blk.0.attn_v.bias", [HKV * d], 0.2)]
    if moe:
        t += [f32("blk.0.attn_q_norm.weight", [d], 0.1, 1.0), f32("blk.0.attn_k_norm.weight", [d], 0.1, 1.0),
              f32("blk.0.ffn_gate_inp.weight", [D, E], 0.5), experts("blk.0.ffn_gate_exps.weight", [D, F, E], 0.2),
              experts("blk.0.ffn_up_exps.weight", [D, F, E], 0.2),
              experts("blk.0.ffn_down_exps.weight", [F, D, E], 0.2)]
    else:
        t += [f32("blk.0.ffn_gate.weight", [D, F], 0.2), f32("blk.0.ffn_up.weight", [D, F], 0.2),
              f32("blk.0.ffn_down.weight", [F, D], 0.2)]
    t += [f32("output_norm.weight", [D], 0.1, 1.0)]
    if arch != "rnd1":  # rnd1 ties its LM head to token_embd
        t += [f32("output.weight", [D, V], 0.6)]
    return gguf(kvs, t)


def write_models(rng):
    os.makedirs(OUT_MODEL, exist_ok=True)
    for arch in ("llada", "dream", "llada-moe", "rnd1"):
        with open(os.path.join(OUT_MODEL, f"tiny-{arch}.gguf"), "wb") as f:
            f.write(tiny_model(arch, rng, q8_experts=arch in ("llada-moe", "rnd1")))


if __name__ == "__main__":
    main()
