#!/usr/bin/env python3
"""Throughput sweep of the batched engine: batch sizes against the same requests one after another.

    python3 bench/batch/sweep.py --out bench/results/batch-<date> [--models 4L,8B] [--batches 1,2,4,8,16]
                                 [--requests 16] [--modes exact,dual] [--threads 2] [--baseline OLD_DLLM]

For each synthetic model (written with `dllm synth` when missing, under build/synth), each mode (exact passes;
LLaDA's dual cache, whose block steps compute 32 rows) and each batch size B, one bench_batch process runs the
same R requests (distinct prompts, early stop off, so every setting does the same work) with at most B sequences
in flight; B = 1 is the requests one after another. It records tokens/s, time per batched pass, rows per pass
and the peak resident memory per sequence in flight, and writes results.json, results.csv, machine.txt and plots.

--baseline OLD_DLLM also times one single-sequence `run` of the previous build (a dllm binary built from the
commit before the batched engine) side by side with this build's, alternating, on the same canvases: the
redesign must cost no single-sequence speed.
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "e2e"))
from bench import DLLM, ensure_model, machine_description, sh  # noqa: E402

BENCH = os.path.join(ROOT, "build", "bench_batch")

# name -> (arch, layers, prompt tokens, max tokens, steps, block length, requests)
MODELS = {
    "llada-4L": ("llada", 4, 32, 32, 8, 32, 16),
    "dream-4L": ("dream", 4, 32, 32, 8, 32, 16),
    "llada-8B": ("llada", 0, 32, 32, 4, 32, 8),
}


def model_path(name):
    arch, layers = MODELS[name][:2]
    label = f"{arch}-{layers}L" if layers else f"{arch}-8b"
    return ensure_model(os.path.join(ROOT, "build", "synth", f"{label}-Q4_K_M.gguf"), arch, layers, "Q4_K_M")


def bench_one(name, mode, batch, requests, threads):
    arch, layers, prompt, max_tokens, steps, block, default_requests = MODELS[name]
    requests = requests or default_requests
    cmd = [BENCH, "--model", model_path(name), "--batch", str(batch), "--requests", str(requests),
           "--prompt-tokens", str(prompt), "--max-tokens", str(max_tokens), "--steps", str(steps),
           "--block-length", str(block), "--threads", str(threads)]
    if mode == "dual":
        cmd.append("--dual-cache")
    r = sh(cmd)
    if r.returncode:
        sys.exit(f"bench_batch failed ({' '.join(cmd)}): {r.stderr}")
    out = json.loads(r.stdout)
    out.update(name=name, mode=mode)
    return out


def single_run_ms(dllm, path, prompt, max_tokens, steps, block, threads):
    """Mean ms per step of one `run` (its own --json timings)."""
    ids = ",".join(str(1000 + 104729 * i % 50000) for i in range(prompt))
    r = sh([dllm, "run", "--model", path, "--prompt-tokens", ids, "--max-tokens", str(max_tokens), "--steps",
            str(steps), "--block-length", str(block), "--threads", str(threads), "--no-early-stop", "--device", "cpu",
            "--json"])
    if r.returncode:
        sys.exit(f"{dllm} run failed: {r.stderr}")
    return json.loads(r.stdout)["timings"]["step_mean_ms"]


def plot(rows, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install matplotlib)", file=sys.stderr)
        return
    keys = sorted({(r["name"], r["mode"]) for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, mode in keys:
        pts = sorted((r["batch"], r) for r in rows if r["name"] == name and r["mode"] == mode)
        seq = next(r for b, r in pts if b == 1)
        xs = [b for b, _ in pts]
        axes[0].plot(xs, [r["tokens_per_s"] / seq["tokens_per_s"] for _, r in pts], marker="o", label=f"{name} {mode}")
        axes[1].plot(xs, [r["peak_per_sequence_bytes"] / 2**20 for _, r in pts], marker="o", label=f"{name} {mode}")
    axes[0].axhline(1.0, color="grey", lw=0.8)
    axes[0].set(xscale="log", xlabel="sequences in flight (batch size)", ylabel="tokens/s relative to one after another",
                title="Batched throughput")
    axes[1].set(xscale="log", xlabel="sequences in flight (batch size)", ylabel="MiB",
                title="Peak resident memory per sequence in flight")
    for ax in axes:
        ax.set_xticks(sorted({r["batch"] for r in rows}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "throughput.png"), dpi=110)
    print(f"wrote {os.path.join(out, 'throughput.png')}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="llada-4L,dream-4L,llada-8B")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--requests", type=int, default=0, help="requests per run (default: the model's, 16 or 8)")
    ap.add_argument("--modes", default="exact,dual")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--baseline", help="a dllm binary of the previous build, for the single-sequence comparison")
    ap.add_argument("--repeat", type=int, default=3, help="runs per program in the baseline comparison")
    ap.add_argument("--replot", action="store_true", help="only redraw the plots from --out/results.json")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.replot:
        with open(os.path.join(args.out, "results.json")) as f:
            plot(json.load(f)["sweep"], args.out)
        return
    with open(os.path.join(args.out, "machine.txt"), "w") as f:
        f.write(machine_description())
    rows = []
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            if mode == "dual" and MODELS[name][0] != "llada":
                continue
            for batch in [int(b) for b in args.batches.split(",")]:
                if batch > (args.requests or MODELS[name][6]):
                    continue
                r = bench_one(name, mode, batch, args.requests, args.threads)
                rows.append(r)
                print(f"{name:9} {mode:5} B={batch:2}: {r['tokens_per_s']:8.2f} tok/s, {r['ms_per_pass']:8.1f} ms/pass, "
                      f"{r['rows_per_pass']:6.1f} rows/pass, {r['peak_per_sequence_bytes'] / 2**20:7.1f} MiB/seq",
                      file=sys.stderr)
    baseline = []
    if args.baseline:
        for name in args.models.split(","):
            arch, layers, prompt, max_tokens, steps, block, _ = MODELS[name]
            new, old = [], []
            for _ in range(args.repeat):
                new.append(single_run_ms(DLLM, model_path(name), prompt, max_tokens, steps, block, args.threads))
                old.append(single_run_ms(args.baseline, model_path(name), prompt, max_tokens, steps, block, args.threads))
            baseline.append(dict(name=name, new_step_ms=statistics.median(new), old_step_ms=statistics.median(old),
                                 new_runs=new, old_runs=old))
            print(f"{name:9} single sequence: {baseline[-1]['new_step_ms']:.1f} ms/step (batched engine) vs "
                  f"{baseline[-1]['old_step_ms']:.1f} ms/step (previous build)", file=sys.stderr)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"sweep": rows, "single_sequence": baseline}, f, indent=1)
    fields = ["name", "mode", "batch", "requests", "tokens", "wall_s", "tokens_per_s", "passes", "ms_per_pass",
              "rows_per_pass", "rss_loaded_bytes", "rss_peak_bytes", "peak_per_sequence_bytes", "threads", "executor"]
    with open(os.path.join(args.out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    plot(rows, args.out)


if __name__ == "__main__":
    main()
