#!/usr/bin/env python3
"""Mixture-of-experts speed benchmark: a synthetic full-size LLaDA-MoE-7B-A1B Q4_K_M (dllm synth --arch
llada-moe) against its dense twin (dllm synth --arch llada-moe --dense: a llada with the same active
parameters and attention weight types), 64-token canvas (prompt 32 + 32 generated), block 32, 8 steps,
greedy, 2 threads. Per model: time per step (dllm run --json timings, median of the runs), peak resident
memory (/usr/bin/time -v) against the file size; with --llama-diffusion-cli, llama.cpp's diffusion CLI on the
same files and canvas, its runs alternating with dllm's (bench/e2e/bench.py's helpers: same prompt length,
steps, block length, greedy). Writes results.csv, results.json, machine.txt and time_per_step.png into the
output folder.

With --arch rnd1 [--layers N]: a synthetic RND1-30B-A3B (N layers) alone, llama.cpp run with the timestep
schedule its README documents for RND1.

usage: bench_moe.py --models DIR --out bench/results/moe-DATE [--runs N] [--llama-diffusion-cli PATH]
                    [--arch llada-moe|rnd1] [--layers N]
       bench_moe.py --out DIR --plot-only   (redraws the plot, e.g. with build/venv/bin/python)
"""
import argparse, csv, json, os, platform, statistics, subprocess, sys, datetime

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
import bench as e2e  # noqa: E402  (bench/e2e/bench.py)


def sh(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace")


def synth(dllm, path, arch, dense, layers=None):
    if os.path.exists(path):
        return
    cmd = [dllm, "synth", "--arch", arch, "--out", path] + (["--dense"] if dense else [])
    cmd += ["--layers", str(layers)] if layers else []
    r = sh(cmd)
    if r.returncode:
        raise SystemExit(r.stderr)


def plot(rows, out, llama):
    """time_per_step.png: dllm (and llama.cpp) ms per step, and peak RSS over the file size, per model."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
        xs = range(len(rows))
        w = 0.4 if llama else 0.8
        ax[0].bar([x - (w / 2 if llama else 0) for x in xs], [r["ms_per_step"] for r in rows], w,
                  label="dllm", color="tab:orange")
        if llama:
            ax[0].bar([x + w / 2 for x in xs], [r["llama_ms_per_step"] for r in rows], w, label="llama.cpp",
                      color="tab:gray")
        ax[0].set_xticks(list(xs), [r["model"] for r in rows])
        ax[0].legend()
        ax[0].set_ylabel("ms per step")
        ax[0].set_title(f"Time per step (canvas {rows[0]['prompt_tokens'] + 32}, 8 steps, 2 threads)", fontsize=8)
        ax[1].bar([r["model"] for r in rows], [r["rss_over_file"] for r in rows], color=["tab:orange", "tab:blue"][:len(rows)])
        ax[1].axhline(1.1, color="red", linestyle="--", label="target 1.1x")
        ax[1].set_ylabel("peak RSS / file size")
        ax[1].legend()
        for x in ax:
            x.tick_params(axis="x", labelsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "time_per_step.png"), dpi=110)
    except ImportError:
        print("matplotlib missing: no plot")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dllm", default=e2e.DLLM)
    ap.add_argument("--llama-diffusion-cli", help="a llama.cpp build of llama-diffusion-cli, run side by side")
    ap.add_argument("--models", help="folder of the synthetic files (written when missing); not needed with --plot-only")
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--arch", choices=["llada-moe", "rnd1"], default="llada-moe",
                    help="llada-moe (with its dense twin) or rnd1 (alone: it has no dense twin)")
    ap.add_argument("--layers", type=int, help="rnd1: fewer layers of the real widths (synth --layers)")
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from --out's results.json")
    a = ap.parse_args()
    e2e.DLLM = a.dllm
    if a.plot_only:
        with open(os.path.join(a.out, "results.json")) as f:
            saved = json.load(f)
        plot(saved["rows"], a.out, bool(saved["summary"].get("llama_diffusion_cli")))
        return
    if not a.models:
        ap.error("--models is required (except with --plot-only)")
    os.makedirs(a.out, exist_ok=True)
    if a.arch == "llada-moe":
        models = [("llada-moe-7B-A1B Q4_K_M", os.path.join(a.models, "synth-llada-moe-Q4_K_M.gguf"), "llada-moe", False),
                  ("dense twin Q4_K_M", os.path.join(a.models, "synth-llada-moe-dense-Q4_K_M.gguf"), "llada-moe", True)]
    else:
        tag = f"-{a.layers}L" if a.layers else ""
        models = [(f"RND1-30B-A3B{tag} Q4_K_M", os.path.join(a.models, f"synth-rnd1{tag}-Q4_K_M.gguf"), "rnd1", False)]
    rows = []
    for name, path, arch, dense in models:
        synth(a.dllm, path, arch, dense, a.layers)
        text, ids = e2e.prompt_for(path, 32)
        # llama.cpp: LLaDA-MoE block by block; RND1 with the timestep schedule and entropy order its README
        # documents (bench/e2e/bench.py's run_llama for a non-llada arch).
        cfg = dict(model=path, arch="llada" if arch == "llada-moe" else "dream", gen=32, block=32, steps=8,
                   threads=a.threads)
        fns = [lambda: e2e.run_dllm(cfg, ids)]
        if a.llama_diffusion_cli:
            fns.append(lambda: e2e.run_llama(cfg, text, a.llama_diffusion_cli, len(ids)))
        runs = [[] for _ in fns]
        for _ in range(a.runs):  # alternating: dllm, llama.cpp, dllm, ...
            for i, fn in enumerate(fns):
                runs[i].append(fn())
        size = os.path.getsize(path)
        d = runs[0]
        row = dict(model=name, file=os.path.basename(path), file_bytes=size, prompt_tokens=len(ids),
                   ms_per_step=statistics.median(r["step_ms"] for r in d), ms_per_step_runs=[r["step_ms"] for r in d],
                   load_ms=statistics.median(r["load_ms"] for r in d), peak_rss_bytes=max(r["peak_rss"] for r in d))
        row["rss_over_file"] = row["peak_rss_bytes"] / size
        if a.llama_diffusion_cli:
            ll = runs[1]
            row.update(llama_ms_per_step=statistics.median(r["step_ms"] for r in ll),
                       llama_ms_per_step_runs=[r["step_ms"] for r in ll],
                       llama_peak_rss_bytes=max(r["peak_rss"] or 0 for r in ll))
            row["speedup_vs_llama"] = row["llama_ms_per_step"] / row["ms_per_step"]
        rows.append(row)
        print(rows[-1], flush=True)
    moe = rows[0]
    summary = dict(arch=a.arch, moe_rss_over_file=moe["rss_over_file"], threads=a.threads,
                   canvas=moe["prompt_tokens"] + 32, block=32,
                   steps=8, runs=a.runs, llama_diffusion_cli=a.llama_diffusion_cli)
    if len(rows) == 2:
        summary["moe_over_dense_time"] = moe["ms_per_step"] / rows[1]["ms_per_step"]
    if a.llama_diffusion_cli:
        summary["moe_speedup_vs_llama"] = moe["speedup_vs_llama"]
    print(summary)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(dict(rows=rows, summary=summary), f, indent=1)
    with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[k for k in rows[0] if not k.endswith("_runs")])
        w.writeheader()
        for r in rows:
            w.writerow({k: v for k, v in r.items() if not k.endswith("_runs")})
    with open(os.path.join(a.out, "machine.txt"), "w") as f:
        f.write(f"date: {datetime.datetime.now().isoformat(timespec='seconds')}\nplatform: {platform.platform()}\n")
        f.write("$ lscpu\n" + sh(["lscpu"]).stdout + "$ free -g\n" + sh(["free", "-g"]).stdout)
        f.write(f"llama-diffusion-cli: {a.llama_diffusion_cli or '(not run)'}\n")
        f.write("note: 2 cores shared with other work on this VM; timings are medians of the runs\n")
    plot(rows, a.out, bool(a.llama_diffusion_cli))


if __name__ == "__main__":
    main()
