#!/usr/bin/env python3
"""Summarises a bench/results/gemm-* folder (peak.json + gemm-*.json) as a Markdown table:
GOPS and the fraction of the measured int8 peak, weight GB/s and the fraction of the read bandwidth."""
import glob
import json
import os
import sys

d = sys.argv[1]
peak = json.load(open(os.path.join(d, "peak.json")))
print(f"Machine: {peak['cpu']}, {peak['threads']} threads, family {peak['isa']}  ")
print(f"Measured int8 peak {peak['int8_gops']:.0f} GOPS ({peak['int8_gops_per_thread']:.0f} one thread; "
      f"{peak['int8_gops_per_cpu_second']:.0f} per CPU-second), read bandwidth {peak['read_gbs']:.1f} GB/s "
      f"({peak['read_gb_per_cpu_second']:.1f} per CPU-second); the process got {100 * peak['cpu_share']:.0f}% "
      f"of its threads' time while measuring the peak.\n")
print("Wall-clock columns (GOPS, GB/s) depend on how busy the machine was (`cpu share`); the per-CPU-second "
      "columns divide by the CPU time the process actually got, which makes them comparable across loads.\n")
print("| type | shape | n | k | rows | kernel | median ms | GOPS | % int8 peak | weight GB/s | % read bw "
      "| cpu share | GOPS/CPU-s | % peak/CPU-s | GB/CPU-s | % read/CPU-s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for f in sorted(glob.glob(os.path.join(d, "gemm-*.json"))):
    name = os.path.basename(f)[len("gemm-"):-len(".json")].split("-", 1)[1]
    for r in json.load(open(f))["results"]:
        fp = r["gops"] / peak["int8_gops"] * 100
        fb = r["weight_gbs"] / peak["read_gbs"] * 100
        fpc = r["gops_per_cpu_second"] / peak["int8_gops_per_cpu_second"] * 100
        fbc = r["weight_gb_per_cpu_second"] / peak["read_gb_per_cpu_second"] * 100
        print(f"| {r['type']} | {name} | {r['n']} | {r['k']} | {r['rows']} | {r['kernel']} | "
              f"{r['median_s'] * 1e3:.3f} | {r['gops']:.0f} | {fp:.0f}% | {r['weight_gbs']:.1f} | {fb:.0f}% | "
              f"{100 * r['cpu_share']:.0f}% | {r['gops_per_cpu_second']:.0f} | {fpc:.0f}% | "
              f"{r['weight_gb_per_cpu_second']:.1f} | {fbc:.0f}% |")

kernels = sorted(glob.glob(os.path.join(d, "kernel-*.json")))
if kernels:
    print("\nKernels alone (`dllm bench kernel`): one thread, panel runs of 4 with every row tile passing over "
          "each, timed by the thread's own CPU time, against the int8 peak loop timed the same way "
          "(the ymm families against their own ymm loop). Rows are whole tiles of the family.\n")
    print("| family | type | n | k | rows | kernel | GOPS/CPU-s | % int8 peak |")
    print("|---|---|---|---|---|---|---|---|")
    for f in kernels:
        for r in json.load(open(f)):
            print(f"| {r['isa']} | {r['type']} | {r['n']} | {r['k']} | {r.get('rows_timed', r['rows'])} | {r['kernel']} | "
                  f"{r['gops_per_cpu_second']:.0f} | {100 * r['fraction_of_peak']:.0f}% |")
