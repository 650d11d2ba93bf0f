#!/usr/bin/env python3
"""Roofline of dllm's GPU GEMMs: each product's time predicted from its bytes and operations on a named GPU.

A GEMM of `rows` activation rows by an N x K weight matrix reads the weights once (their device bytes, the
GGUF's size: weight_pack.h; measured rows carry the exact count),
the int8 activations and their scales,
and writes rows x N f32 outputs; it does 2 rows N K integer operations. Its floor is the larger of
bytes / HBM bandwidth and operations / int8 tensor-core peak (dense, no sparsity). The GPU table holds the
vendors' datasheet numbers (SXM parts).

  bench/gpu/roofline.py --gpu H200                              # the LLaDA-8B step's GEMMs, predicted
  bench/gpu/roofline.py --gpu H200 --kernels OUT/kernels.jsonl  # and measured (GpuBench.Gemm) against it
  bench/gpu/roofline.py --gpu "NVIDIA H200" --json              # names as nvidia-smi prints them work too

With --kernels, every measured row gets its prediction, the fraction of the roofline it reaches, and the
fractions of int8 peak and of HBM bandwidth the issue's targets name (30% of peak at 128+ rows, 70% of HBM
at 1-32 rows).
"""
import argparse
import json
import sys

# name: (int8 dense tensor TOPS, HBM GB/s, SMs)
GPUS = {
    "H200": (1979.0, 4800.0, 132),
    "H100": (1979.0, 3350.0, 132),  # SXM5
    "H100-PCIE": (1513.0, 2000.0, 114),
    "A100": (624.0, 2039.0, 108),   # SXM4 80 GB
    "L40S": (733.0, 864.0, 142),
    "RTX4090": (660.6, 1008.0, 128),
}

# Bytes per 256 weights on the device (src/jit/cuda/weight_pack.h): the GGUF's, but Q6_K's d as an f32.
DEVICE_BYTES_PER_256 = {
    "Q4_K": 144.0,
    "Q5_K": 176.0,
    "Q6_K": 212.0,
    "Q8_0": 8 * 34.0,
    "Q5_0": 8 * 22.0,
}

# The projections of one LLaDA-8B layer (Q4_K_M: attn_v and ffn_down are Q6_K in half the layers; counted as
# Q4_K here except the output head) and the LM head.
LLADA_8B = [
    ("q/k/v/o", 4 * 1, 4096, 4096, "Q4_K"),
    ("ffn gate/up", 2, 12288, 4096, "Q4_K"),
    ("ffn down", 1, 4096, 12288, "Q4_K"),
]
LLADA_LAYERS = 32
LLADA_HEAD = ("lm head", 1, 126464, 4096, "Q6_K")


def gpu_spec(name):
    key = name.upper().replace("NVIDIA", "").replace(" ", "").replace("_", "-")
    for k in sorted(GPUS, key=len, reverse=True):
        if k.replace("-", "") in key.replace("-", ""):
            if k == "H100" and "PCIE" in key:
                return "H100-PCIE", GPUS["H100-PCIE"]
            return k, GPUS[k]
    raise SystemExit("roofline: unknown GPU %r (known: %s)" % (name, ", ".join(GPUS)))


def gemm_bytes(rows, n, k, wtype, weight_bytes=None):
    weights = weight_bytes if weight_bytes else n * k / 256.0 * DEVICE_BYTES_PER_256[wtype]
    acts = rows * k + rows * (k / 32) * (4 + 4)  # int8 quants, da, the int16 sums of each 16
    out = rows * n * 4
    return weights + acts + out


def predict(rows, n, k, wtype, spec, weight_bytes=None):
    tops, gbps, _ = spec
    ops = 2.0 * rows * n * k
    b = gemm_bytes(rows, n, k, wtype, weight_bytes)
    t_mem = b / (gbps * 1e9)
    t_ops = ops / (tops * 1e12)
    return {"ops": ops, "bytes": b, "t_mem_ms": t_mem * 1e3, "t_ops_ms": t_ops * 1e3,
            "predicted_ms": max(t_mem, t_ops) * 1e3, "bound": "memory" if t_mem >= t_ops else "compute"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", required=True, help="H200, H100, H100-PCIE, A100, L40S, RTX4090 or an nvidia-smi name")
    ap.add_argument("--kernels", help="kernels.jsonl from GpuBench.Gemm (DLLM_GPU_BENCH_OUT)")
    ap.add_argument("--rows", default="1,64,288", help="rows of the predicted step table (default 1,64,288)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()
    name, spec = gpu_spec(args.gpu)
    out = {"gpu": name, "int8_tops": spec[0], "hbm_gbps": spec[1], "step": [], "measured": []}

    for rows in [int(r) for r in args.rows.split(",") if r]:
        total = 0.0
        parts = []
        for what, count, n, k, wtype in LLADA_8B:
            p = predict(rows, n, k, wtype, spec)
            parts.append({"what": what, "rows": rows, "n": n, "k": k, "type": wtype, "count": count * LLADA_LAYERS, **p})
            total += p["predicted_ms"] * count * LLADA_LAYERS
        what, count, n, k, wtype = LLADA_HEAD
        p = predict(rows, n, k, wtype, spec)
        parts.append({"what": what, "rows": rows, "n": n, "k": k, "type": wtype, "count": 1, **p})
        total += p["predicted_ms"]
        out["step"].append({"rows": rows, "gemm_ms": total, "parts": parts})

    if args.kernels:
        with open(args.kernels, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                if r.get("bench") != "gemm":
                    continue
                p = predict(r["rows"], r["n"], r["k"], r["type"], spec, r.get("weight_bytes"))
                ms = r["ms"]
                out["measured"].append({
                    "type": r["type"], "n": r["n"], "k": r["k"], "rows": r["rows"], "ms": ms, **p,
                    "of_roofline": p["predicted_ms"] / ms if ms > 0 else 0.0,
                    "of_int8_peak": p["ops"] / (ms * 1e-3) / (spec[0] * 1e12) if ms > 0 else 0.0,
                    "of_hbm": p["bytes"] / (ms * 1e-3) / (spec[1] * 1e9) if ms > 0 else 0.0,
                })

    if args.json:
        json.dump(out, sys.stdout, indent=1)
        print()
        return
    print("roofline for %s: %.0f int8 TOPS (dense), %.0f GB/s HBM" % (name, spec[0], spec[1]))
    print("\nLLaDA-8B Q4_K_M step, GEMMs only (32 layers + LM head over every row):")
    for s in out["step"]:
        print("  %5d rows: %8.3f ms predicted" % (s["rows"], s["gemm_ms"]))
        for p in s["parts"]:
            print("      %-12s %6d x %-6d %-5s x%-4d %8.4f ms each (%s bound)" %
                  (p["what"], p["n"], p["k"], p["type"], p["count"], p["predicted_ms"], p["bound"]))
    if out["measured"]:
        print("\nmeasured (GpuBench.Gemm) against the roofline:")
        print("  %-5s %6s %6s %5s %9s %9s %7s %7s %7s" %
              ("type", "n", "k", "rows", "ms", "roof ms", "roof%", "peak%", "hbm%"))
        for m in out["measured"]:
            print("  %-5s %6d %6d %5d %9.4f %9.4f %6.1f%% %6.1f%% %6.1f%%" %
                  (m["type"], m["n"], m["k"], m["rows"], m["ms"], m["predicted_ms"], 100 * m["of_roofline"],
                   100 * m["of_int8_peak"], 100 * m["of_hbm"]))


if __name__ == "__main__":
    main()
