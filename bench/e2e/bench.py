#!/usr/bin/env python3
"""End-to-end benchmark of `dllm run` against llama.cpp's `llama-diffusion-cli` on the same synthetic model.

One command (see bench/e2e/README.md):

    python3 bench/e2e/bench.py --preset targets --out bench/results/e2e-<date>

It writes synthetic models with `dllm synth` when they are missing, runs every configuration of the preset
for dllm and, when LLAMA_DIFFUSION_CLI names a llama.cpp build of llama-diffusion-cli, for llama.cpp with the
same prompt tokens, canvas, steps, block length and greedy decoding, and writes results.csv, results.json,
machine.txt and plots (PNG) into --out. Each measurement is the median of --repeat runs. Times per step come
from each program's own report (dllm: --json timings; llama.cpp: its "time per step" line); peak resident
memory from GNU time. The two programs' runs alternate (dllm, llama.cpp, dllm, ...), so that a noisy stretch
of a shared machine slows both.
"""
import argparse
import csv
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DLLM = os.environ.get("DLLM_BIN", os.path.join(ROOT, "build", "dllm"))  # DLLM_BIN: another build to measure
TIME = "/usr/bin/time"


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", **kw)


def machine_description():
    lines = [f"date: {datetime.datetime.now().isoformat(timespec='seconds')}", f"platform: {platform.platform()}"]
    for cmd in (["lscpu"], ["free", "-h"], [DLLM, "doctor"]):
        try:
            r = sh(cmd)
            lines += [f"$ {' '.join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd))}", r.stdout.strip()]
        except OSError:
            pass
    return "\n".join(lines) + "\n"


def ensure_model(path, arch, layers, quant):
    if os.path.exists(path):
        return path
    print(f"writing synthetic model {path}", file=sys.stderr)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    cmd = [DLLM, "synth", "--arch", arch, "--out", path, "--quant", quant]
    if layers:
        cmd += ["--layers", str(layers)]
    r = sh(cmd)
    if r.returncode:
        sys.exit(f"dllm synth failed: {r.stderr}")
    return path


def prompt_for(model, n_tokens):
    """A text whose chat-formatted tokenization has exactly n_tokens ids (dllm tokenize = llama-tokenize)."""
    words = ["tell", "me", "about", "the", "ocean", "and", "its", "waves", "please"]
    text, ids = "", []
    for i in range(4 * n_tokens):
        candidate = (text + " " + words[i % len(words)]).strip()
        r = sh([DLLM, "tokenize", "--model", model, "--prompt", candidate, "--json"])
        if r.returncode:
            sys.exit(f"dllm tokenize failed: {r.stderr}")
        got = json.loads(r.stdout)["ids"]
        if len(got) > n_tokens:
            if not ids:  # the chat template alone is longer: use the shortest prompt there is
                text, ids = candidate, got
            break
        text, ids = candidate, got
        if len(ids) == n_tokens:
            return text, ids
    # then add short pieces (one or two tokens each) until the count is exact
    pieces = [".", "!", "?", ",", " x", "x", " a", " it"]
    while len(ids) < n_tokens:
        best = None
        for p in pieces:
            got = json.loads(sh([DLLM, "tokenize", "--model", model, "--prompt", text + p, "--json"]).stdout)["ids"]
            if len(ids) < len(got) <= n_tokens and (best is None or len(got) > len(best[1])):
                best = (text + p, got)
        if best is None:
            break
        text, ids = best
    return text, ids


def peak_rss_from_time(stderr):
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr)
    return int(m.group(1)) * 1024 if m else None


def run_dllm(cfg, ids):
    cmd = [TIME, "-v", DLLM, "run", "--model", cfg["model"], "--prompt-tokens", ",".join(map(str, ids)),
           "--max-tokens", str(cfg["gen"]), "--steps", str(cfg["steps"]), "--block-length", str(cfg["block"]),
           "--threads", str(cfg["threads"]), "--no-early-stop", "--json"]
    if cfg.get("threshold"):
        cmd += ["--threshold", str(cfg["threshold"])]
    if cfg.get("dual_cache"):
        cmd += ["--dual-cache"]
    r = sh(cmd)
    if r.returncode:
        raise RuntimeError(f"dllm failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    j = json.loads(r.stdout)
    t = j["timings"]
    return {"step_ms": t["step_mean_ms"], "total_ms": t["total_ms"], "load_ms": t["load_ms"],
            "steps_run": j["steps_run"], "peak_rss": peak_rss_from_time(r.stderr) or j.get("peak_rss_bytes"),
            "output_ids": j["output_ids"]}


def run_llama(cfg, text, llama_bin, n_prompt):
    canvas = n_prompt + cfg["gen"]
    cmd = [TIME, "-v", llama_bin, "-m", cfg["model"], "-p", text, "-t", str(cfg["threads"]), "-tb",
           str(cfg["threads"]), "-ub", str(canvas), "-b", str(canvas), "-c", str(canvas),
           "--diffusion-steps", str(cfg["steps"]), "--top-k", "1", "--temp", "0", "--seed", "42"]
    if cfg["arch"] == "llada":
        cmd += ["--diffusion-block-length", str(cfg["block"])]
    else:
        cmd += ["--diffusion-eps", "0.001", "--diffusion-algorithm", "1"]
    r = sh(cmd)
    out = r.stdout + r.stderr
    m = re.search(r"total time: ([\d.]+)ms, time per step: ([\d.]+)ms", out)
    if r.returncode or not m:
        raise RuntimeError(f"llama-diffusion-cli failed: {' '.join(cmd)}\n{out[-3000:]}")
    return {"step_ms": float(m.group(2)), "total_ms": float(m.group(1)), "peak_rss": peak_rss_from_time(r.stderr)}


def median_of_runs(runs):
    best = dict(runs[0])
    for key in ("step_ms", "total_ms", "load_ms"):
        if key in best:
            best[key] = statistics.median(r[key] for r in runs)
    best["peak_rss"] = max((r["peak_rss"] or 0) for r in runs)
    return best


def interleaved(fns, repeat):
    """Runs each function `repeat` times, alternating (a b a b ...), so that both programs see the same
    stretches of a noisy machine; returns the medians per function."""
    runs = [[] for _ in fns]
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            runs[i].append(fn())
    return [median_of_runs(r) for r in runs]


def presets(models, threads):
    t = threads
    L4, L32, D4 = models["llada4"], models.get("llada32"), models["dream4"]
    out = []
    # Targets of the speed issue: 64-token canvas (prompt 32 + 32 generated), block 32, 8 steps.
    out.append(dict(name="exact-llada-4L", arch="llada", model=L4, prompt=32, gen=32, block=32, steps=8, threads=t))
    out.append(dict(name="exact-dream-4L", arch="dream", model=D4, prompt=32, gen=32, block=32, steps=8, threads=t))
    if L32:
        out.append(dict(name="exact-llada-32L", arch="llada", model=L32, prompt=32, gen=32, block=32, steps=8,
                        threads=t))
    # Dual cache: prompt 32 + 256 generated, block 32, 64 steps, against dllm's own exact run.
    for dual in (False, True):
        out.append(dict(name="dual-cache" if dual else "dual-cache-baseline", arch="llada", model=L4, prompt=32,
                        gen=256, block=32, steps=64, threads=t, dual_cache=dual, llama=False))
    if L32:  # the same at full size (about 5 minutes a pair on 2 cores)
        for dual in (False, True):
            out.append(dict(name="dual-cache-32L" if dual else "dual-cache-32L-baseline", arch="llada", model=L32,
                            prompt=32, gen=256, block=32, steps=64, threads=t, dual_cache=dual, llama=False))
    return out


def sweep(models, threads):
    L4 = models["llada4"]
    out = []
    for th in sorted({1, threads}):
        # Steps: a multiple of dllm's block count (gen / 32) and of llama.cpp's, which cuts the whole canvas,
        # prompt included, into blocks ((32 + gen) / 32): 8, 24 and 72.
        for gen, steps in ((32, 8), (96, 24), (256, 72)):
            out.append(dict(name=f"canvas-{32 + gen}-t{th}", arch="llada", model=L4, prompt=32, gen=gen, block=32,
                            steps=steps, threads=th))
    for block in (8, 32, 64):
        out.append(dict(name=f"block-{block}", arch="llada", model=L4, prompt=32, gen=64, block=block, steps=64 // block * 4,
                        threads=threads, llama=False))
    for thr in (0.9,):
        out.append(dict(name=f"threshold-{thr}", arch="llada", model=L4, prompt=32, gen=128, block=32, steps=128,
                        threads=threads, threshold=thr, llama=False))
    out.append(dict(name="threshold-baseline", arch="llada", model=L4, prompt=32, gen=128, block=32, steps=128,
                    threads=threads, llama=False))
    return out


def baseline_of(name, runs):
    """The exact run a fast-path run is measured against: its "-baseline" twin (dual cache), or
    threshold-baseline for a threshold-<value> run; None when there is none among `runs`."""
    if name.endswith("-baseline"):
        return None
    b = "threshold-baseline" if name.startswith("threshold-") else name + "-baseline"
    return b if b in runs else None


def pyplot():
    """matplotlib.pyplot without a display (Agg), or None with a note when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots (pip install matplotlib)", file=sys.stderr)
        return None
    return plt


def plot(rows, out_dir):
    plt = pyplot()
    if plt is None:
        return []
    made = []
    exact = [r for r in rows if r["name"].startswith("exact-")]
    if exact:
        fig, ax = plt.subplots(figsize=(7, 4))
        names = [r["name"] for r in exact]
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [r["dllm_step_ms"] for r in exact], 0.4, label="dllm")
        ax.bar([x + 0.2 for x in xs], [r.get("llama_step_ms") or 0 for r in exact], 0.4, label="llama.cpp")
        ax.set_xticks(list(xs), names)
        ax.set_ylabel("ms per step")
        ax.set_title("Time per diffusion step (64-token canvas, 8 steps)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "time_per_step.png"), dpi=120)
        made.append("time_per_step.png")
    canvas = [r for r in rows if r["name"].startswith("canvas-")]
    if canvas:
        fig, ax = plt.subplots(figsize=(7, 4))
        for th in sorted({r["threads"] for r in canvas}):
            rs = [r for r in canvas if r["threads"] == th]
            ax.plot([r["prompt"] + r["gen"] for r in rs], [(r["prompt"] + r["gen"]) / r["dllm_step_ms"] * 1000 for r in rs],
                    marker="o", label=f"dllm, {th} threads")
            ll = [r for r in rs if r.get("llama_step_ms")]
            if ll:
                ax.plot([r["prompt"] + r["gen"] for r in ll], [(r["prompt"] + r["gen"]) / r["llama_step_ms"] * 1000 for r in ll],
                        marker="x", linestyle="--", label=f"llama.cpp, {th} threads")
        ax.set_xlabel("canvas length (tokens)")
        ax.set_ylabel("canvas tokens per second (forward)")
        ax.set_title("Throughput vs canvas length (synthetic LLaDA-8B widths, 4 layers)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "throughput_vs_canvas.png"), dpi=120)
        made.append("throughput_vs_canvas.png")
    have = {r["name"]: r for r in rows}
    pairs = [(a, b) for a, b in ((name, baseline_of(name, have)) for name in have) if b]
    if pairs:
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.bar([a for a, _ in pairs], [have[b]["dllm_total_ms"] / have[a]["dllm_total_ms"] for a, b in pairs])
        ax.set_ylabel("speed-up of total time vs the exact run")
        ax.set_title("Fast paths (dllm)")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "fast_path_speedup.png"), dpi=120)
        made.append("fast_path_speedup.png")
    return made


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=["targets", "sweep", "all"], default="targets")
    ap.add_argument("--out", required=True, help="results folder (created)")
    ap.add_argument("--models", default=os.path.join(ROOT, "build", "synth"), help="folder for synthetic models")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--full", action="store_true", help="also the 32-layer LLaDA-8B (4.9 GB)")
    ap.add_argument("--only", default="", help="run only configurations whose name contains this")
    args = ap.parse_args()
    if not os.path.exists(DLLM):
        sys.exit("build dllm first: ./dllm --help")
    llama_bin = os.environ.get("LLAMA_DIFFUSION_CLI")
    if llama_bin and not os.path.exists(llama_bin):
        sys.exit(f"LLAMA_DIFFUSION_CLI={llama_bin} does not exist")
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.models, exist_ok=True)
    models = {
        "llada4": ensure_model(os.path.join(args.models, "llada-4L-Q4_K_M.gguf"), "llada", 4, "Q4_K_M"),
        "dream4": ensure_model(os.path.join(args.models, "dream-4L-Q4_K_M.gguf"), "dream", 4, "Q4_K_M"),
    }
    if args.full:
        models["llada32"] = ensure_model(os.path.join(args.models, "llada-32L-Q4_K_M.gguf"), "llada", 0, "Q4_K_M")
    configs = []
    if args.preset in ("targets", "all"):
        configs += presets(models, args.threads)
    if args.preset in ("sweep", "all"):
        configs += sweep(models, args.threads)
    if args.only:
        configs = [c for c in configs if args.only in c["name"]]
    with open(os.path.join(args.out, "machine.txt"), "w") as f:
        f.write(machine_description())
        f.write(f"llama-diffusion-cli: {llama_bin or '(not given: LLAMA_DIFFUSION_CLI unset)'}\n")

    rows = []
    prompts = {}
    for cfg in configs:
        key = (cfg["model"], cfg["prompt"])
        if key not in prompts:
            prompts[key] = prompt_for(cfg["model"], cfg["prompt"])
        text, ids = prompts[key]
        row = {k: v for k, v in cfg.items() if k not in ("llama",)}
        row["model"] = os.path.basename(cfg["model"])
        row["prompt"] = len(ids)  # the prompt as tokenized (the chat template may make it longer than asked)
        row["model_bytes"] = os.path.getsize(cfg["model"])
        with_llama = bool(llama_bin and cfg.get("llama", True))
        fns = [lambda: run_dllm(cfg, ids)]
        if with_llama:
            fns.append(lambda: run_llama(cfg, text, llama_bin, len(ids)))
        medians = interleaved(fns, args.repeat)
        d = medians[0]
        row.update(dllm_step_ms=d["step_ms"], dllm_total_ms=d["total_ms"], dllm_load_ms=d["load_ms"],
                   dllm_steps_run=d["steps_run"], dllm_peak_rss=d["peak_rss"])
        if with_llama:
            l = medians[1]
            row.update(llama_step_ms=l["step_ms"], llama_total_ms=l["total_ms"], llama_peak_rss=l["peak_rss"],
                       speedup_per_step=l["step_ms"] / d["step_ms"])
        rows.append(row)
        print(json.dumps(row), flush=True)

    base = {r["name"]: r for r in rows}
    for name, r in base.items():
        b = baseline_of(name, base)
        if b:
            r["speedup_vs_exact"] = base[b]["dllm_total_ms"] / r["dllm_total_ms"]
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"rows": rows, "llama_diffusion_cli": llama_bin}, f, indent=1)
    keys = sorted({k for r in rows for k in r})
    with open(os.path.join(args.out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    made = plot(rows, args.out)
    print(f"wrote {args.out}: results.csv, results.json, machine.txt" + (", " + ", ".join(made) if made else ""))


if __name__ == "__main__":
    main()
