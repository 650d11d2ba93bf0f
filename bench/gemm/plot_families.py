#!/usr/bin/env python3
"""Draws families.sh's results: G int8 ops/s against activation rows, one panel per shape, one line per
family (the median of the repeats), the VNNI peak loop dashed.
    build/venv/bin/python3 bench/gemm/plot_families.py bench/results/gemm-amx-20261206"""
import collections, glob, json, os, statistics, sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

out = sys.argv[1]
runs = collections.defaultdict(lambda: collections.defaultdict(list))  # shape -> family -> [{rows: gops}]
for f in sorted(glob.glob(os.path.join(out, "gemm-*.json"))):
    stem = os.path.basename(f)[len("gemm-"):-len(".json")].rsplit("-", 1)[0]  # TYPE-nN-kK-FAMILY
    t, n, k, family = stem.split("-", 3)
    res = json.load(open(f))["results"]
    runs[f"{t} {n} {k}"][family].append({r["rows"]: r["gops"] for r in res})
peak = json.load(open(os.path.join(out, "peak.json")))["int8_gops"]
fig, axes = plt.subplots(1, len(runs), figsize=(4 * len(runs), 3.6), squeeze=False)
for ax, (shape, fams) in zip(axes[0], sorted(runs.items())):
    for family, reps in sorted(fams.items()):
        rows = sorted(reps[0])
        ax.plot(rows, [statistics.median(r[m] for r in reps) for m in rows], marker="o", label=family)
    ax.axhline(peak, linestyle="--", color="gray", label="VNNI peak loop")
    ax.set_xscale("log", base=2)
    ax.set_title(shape)
    ax.set_xlabel("activation rows")
    ax.set_ylabel("G int8 ops/s")
    ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(out, "families.png"), dpi=110)
print(os.path.join(out, "families.png"))
