#!/usr/bin/env python3
"""Mixture-of-experts speed benchmark: a synthetic full-size LLaDA-MoE-7B-A1B Q4_K_M (dllm synth --arch
llada-moe) against its dense twin (dllm synth --arch llada-moe --dense: a llada with the same active
parameters and attention weight types), 64-token canvas (prompt 32 + 32 generated), block 32, 8 steps,
greedy, 2 threads. Per model: time per step (dllm run --verbose, median of the runs), peak resident memory
(/usr/bin/time -v) against the file size. Writes results.csv, results.json, machine.txt and time_per_step.png
into the output folder.

usage: bench_moe.py --dllm build/dllm --models DIR --out bench/results/moe-DATE [--runs N]
"""
import argparse, csv, json, os, platform, re, statistics, subprocess, datetime


def sh(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace")


def synth(dllm, path, arch, dense):
    if os.path.exists(path):
        return
    cmd = [dllm, "synth", "--arch", arch, "--out", path] + (["--dense"] if dense else [])
    r = sh(cmd)
    if r.returncode:
        raise SystemExit(r.stderr)


def run_once(dllm, model, threads):
    ids = ",".join(str(100 + 7 * i) for i in range(32))
    cmd = ["/usr/bin/time", "-v", dllm, "run", "--model", model, "--prompt-tokens", ids, "--max-tokens", "32",
           "--steps", "8", "--block-length", "32", "--threads", str(threads), "--verbose"]
    r = sh(cmd)
    if r.returncode:
        raise SystemExit(r.stderr)
    step = float(re.search(r"([0-9.]+) ms/step", r.stderr + r.stdout).group(1))
    load = float(re.search(r"load ([0-9.]+) ms", r.stderr + r.stdout).group(1))
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    return step, load, rss_kb * 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dllm", default="build/dllm")
    ap.add_argument("--models", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    models = [("llada-moe-7B-A1B Q4_K_M", os.path.join(a.models, "synth-llada-moe-Q4_K_M.gguf"), "llada-moe", False),
              ("dense twin Q4_K_M", os.path.join(a.models, "synth-llada-moe-dense-Q4_K_M.gguf"), "llada-moe", True)]
    rows = []
    for name, path, arch, dense in models:
        synth(a.dllm, path, arch, dense)
        runs = [run_once(a.dllm, path, a.threads) for _ in range(a.runs)]
        size = os.path.getsize(path)
        rss = max(r[2] for r in runs)
        rows.append(dict(model=name, file=os.path.basename(path), file_bytes=size,
                         ms_per_step=statistics.median(r[0] for r in runs), ms_per_step_runs=[r[0] for r in runs],
                         load_ms=statistics.median(r[1] for r in runs), peak_rss_bytes=rss, rss_over_file=rss / size))
        print(rows[-1], flush=True)
    moe, dense = rows
    summary = dict(moe_over_dense_time=moe["ms_per_step"] / dense["ms_per_step"], moe_rss_over_file=moe["rss_over_file"],
                   threads=a.threads, canvas=64, block=32, steps=8, runs=a.runs)
    print(summary)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(dict(rows=rows, summary=summary), f, indent=1)
    with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != "ms_per_step_runs"])
        w.writeheader()
        for r in rows:
            w.writerow({k: v for k, v in r.items() if k != "ms_per_step_runs"})
    with open(os.path.join(a.out, "machine.txt"), "w") as f:
        f.write(f"date: {datetime.datetime.now().isoformat(timespec='seconds')}\nplatform: {platform.platform()}\n")
        f.write("$ lscpu\n" + sh(["lscpu"]).stdout + "$ free -g\n" + sh(["free", "-g"]).stdout)
        f.write("note: 2 cores shared with other work on this VM; timings are medians of the runs\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
        ax[0].bar([r["model"] for r in rows], [r["ms_per_step"] for r in rows], color=["tab:orange", "tab:blue"])
        ax[0].set_ylabel("ms per step")
        ax[0].set_title("Time per step (canvas 64, block 32, 8 steps, 2 threads)", fontsize=8)
        ax[1].bar([r["model"] for r in rows], [r["rss_over_file"] for r in rows], color=["tab:orange", "tab:blue"])
        ax[1].axhline(1.1, color="red", linestyle="--", label="target 1.1x")
        ax[1].set_ylabel("peak RSS / file size")
        ax[1].legend()
        for x in ax:
            x.tick_params(axis="x", labelsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "time_per_step.png"), dpi=110)
    except ImportError:
        print("matplotlib missing: no plot")


if __name__ == "__main__":
    main()
