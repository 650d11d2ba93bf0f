#!/usr/bin/env python3
"""Plots the GEMM throughput per CPU-second of the weight types in one bench/gemm/run.sh result folder.

    build/venv/bin/python3 bench/gemm/plot_types.py bench/results/gemm-...   # writes types_per_cpu_second.png

One group of bars per (shape, rows), one bar per type: `dllm bench gemm`'s GOPS per CPU-second (the
column that does not depend on how busy the machine was), and the kernels alone as a second panel.
"""
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    folder = sys.argv[1]
    gemm = {}
    for path in sorted(glob.glob(os.path.join(folder, "gemm-*.json"))):
        for r in json.load(open(path))["results"]:
            shape = os.path.basename(path)[len("gemm-") + len(r["type"]) + 1 : -len(".json")]
            gemm.setdefault(r["type"], {})[(shape, r["rows"])] = r["gops_per_cpu_second"]
    kernel = {}
    for path in sorted(glob.glob(os.path.join(folder, "kernel-*.json"))):
        for r in json.load(open(path)):
            kernel.setdefault(r["type"], {})[r["rows_timed"]] = r["gops_per_cpu_second"]
    types = sorted(gemm)
    keys = sorted({k for t in types for k in gemm[t]})
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / len(types)
    for i, t in enumerate(types):
        a.bar([x + i * width for x in range(len(keys))], [gemm[t].get(k, 0) for k in keys], width, label=t)
    a.set_xticks([x + 0.4 - width / 2 for x in range(len(keys))])
    a.set_xticklabels([f"{s}\n{r} rows" for s, r in keys], fontsize=7)
    a.set_ylabel("GOPS per CPU-second")
    a.set_title("dllm bench gemm, 2 threads")
    a.legend()
    rows = sorted({r for t in kernel for r in kernel[t]})
    for i, t in enumerate(sorted(kernel)):
        b.bar([x + i * width for x in range(len(rows))], [kernel[t].get(r, 0) for r in rows], width, label=t)
    b.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))])
    b.set_xticklabels([str(r) for r in rows])
    b.set_xlabel("rows (4096 x 4096)")
    b.set_title("kernel alone, 1 thread")
    b.legend()
    fig.tight_layout()
    out = os.path.join(folder, "types_per_cpu_second.png")
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
