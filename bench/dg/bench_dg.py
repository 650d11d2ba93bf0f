#!/usr/bin/env python3
"""DiffusionGemma speed benchmark: `dllm run` against the llama.cpp fork's `llama-diffusion-cli`
(Cinderella-Man/llama.cpp, prompt-KV cache on, its default) on synthetic full-width DiffusionGemma-26B-A4B
files (`dllm synth --arch diffusion-gemma --layers N`, Q4_K_M), 2 threads, the same 33-token chat prompt
(the same ids in both: dllm tokenize = llama-tokenize), one 256-token block (the canvas), --eb-max-steps
steps with the early stop off (confidence 0) in both.

Per file: time per denoising step (each program's own report: dllm --json timings.step_mean_ms, the fork's
"time per step" line; the median of --repeat runs, the programs alternating), peak resident memory (GNU
time) against the file size, and dllm's split of a step (--json step_split: attention, experts, shared MLP,
LM head, self-conditioning, embedding, other, sampler). The first step of a block has no self-conditioning in
either program, so --steps should be 3 or more. Writes results.json, results.csv, machine.txt and
dg_step.png into --out.

With --self-cond-top-k K1,K2,...: dllm also runs with that opt-in approximate self-conditioning (each canvas
row's K most probable tokens), alternating with the others, as rows[i]["dllm_top_k"][K].

With --alone 30: that many layers for dllm alone (the fork's peak memory passes a 24 GiB machine at the full
30 layers), written to alone.json. With --defaults N: one 256-token answer on the N-layer file at the file's
own sampler settings (48 steps a block at most, the adaptive stop on), its tokens per second, to defaults.json.

usage: bench_dg.py --out bench/results/dg-DATE [--layers 2,6] [--steps 6] [--repeat 3]
                   [--llama-diffusion-cli PATH] [--models DIR] [--alone 30] [--defaults 2]
       bench_dg.py --out DIR --plot-only
"""
import argparse
import csv
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
import bench as e2e  # noqa: E402  (bench/e2e/bench.py: sh, machine_description, prompt_for, ...)

SPLIT = ["attention_ms", "experts_ms", "mlp_ms", "lm_head_ms", "self_conditioning_ms", "embed_ms", "other_ms",
         "sampler_ms"]


def run_dllm(model, ids, steps, threads, top_k=0, binary=None):
    """steps = 0: the file's own sampler settings (the adaptive stop on); top_k > 0: --self-cond-top-k; binary: a
    dllm other than the build's (A/B runs)."""
    cmd = [e2e.TIME, "-v", binary or e2e.DLLM, "run", "--model", model, "--prompt-tokens", ",".join(map(str, ids)),
           "--max-tokens", "256", "--threads", str(threads), "--seed", "1", "--json"]
    if top_k:
        cmd += ["--self-cond-top-k", str(top_k)]
    if steps:
        cmd += ["--eb-max-steps", str(steps), "--eb-confidence", "0"]
    r = e2e.sh(cmd)
    if r.returncode:
        raise RuntimeError(f"dllm failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    j = json.loads(r.stdout)
    out = {"step_ms": j["timings"]["step_mean_ms"], "total_ms": j["timings"]["total_ms"],
           "load_ms": j["timings"]["load_ms"], "generate_ms": j["timings"]["generate_ms"], "steps_run": j["steps_run"],
           "tokens_per_s": j["tokens_per_s"], "step_ms_each": [s["ms"] for s in j["step_stats"]],
           "peak_rss": e2e.peak_rss_from_time(r.stderr) or j["peak_rss_bytes"], "text": j["text"]}
    for k in SPLIT:
        out[k] = j["step_split"][k]
    return out


def run_fork(binary, model, text, steps, threads):
    cmd = [e2e.TIME, "-v", binary, "-m", model, "-p", text, "-t", str(threads), "-tb", str(threads), "-n", "256",
           "--diffusion-eb-max-steps", str(steps), "--diffusion-eb-confidence", "0", "--seed", "1"]
    r = e2e.sh(cmd)
    out = r.stdout + r.stderr
    m = re.search(r"total time: ([\d.]+)ms, time per step: ([\d.]+)ms \((\d+) steps", out)
    if r.returncode or not m:
        raise RuntimeError(f"llama-diffusion-cli failed: {' '.join(cmd)}\n{out[-3000:]}")
    return {"step_ms": float(m.group(2)), "total_ms": float(m.group(1)), "steps_run": int(m.group(3)),
            "peak_rss": e2e.peak_rss_from_time(r.stderr)}


def median_runs(runs):
    import statistics
    best = dict(runs[0])
    for k in best:
        if k != "peak_rss" and isinstance(best[k], float):
            best[k] = statistics.median(r[k] for r in runs)
    best["peak_rss"] = max(r["peak_rss"] or 0 for r in runs)
    return best


def plot(rows, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot (build/venv/bin/python has it)", file=sys.stderr)
        return
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    xs = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]
    for k, c in zip(SPLIT, colours):
        vals = [r["dllm"][k] / 1000 for r in rows]
        ax[0].bar([x - 0.2 for x in xs], vals, 0.4, bottom=bottom, color=c, label=k[:-3].replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, vals)]
    if all(r.get("fork") for r in rows):
        ax[0].bar([x + 0.2 for x in xs], [r["fork"]["step_ms"] / 1000 for r in rows], 0.4, color="tab:gray",
                  label="llama.cpp fork")
    ax[0].set_xticks(xs, [f"{r['layers']} layers" for r in rows])
    ax[0].set_ylabel("seconds per denoising step")
    ax[0].set_title("DiffusionGemma step, canvas 256, 33-token prompt, 2 threads", fontsize=8)
    ax[0].legend(fontsize=6)
    ax[1].bar([x - 0.2 for x in xs], [r["dllm"]["peak_rss"] / r["file_bytes"] for r in rows], 0.4,
              color="tab:orange", label="dllm")
    if all(r.get("fork") for r in rows):
        ax[1].bar([x + 0.2 for x in xs], [r["fork"]["peak_rss"] / r["file_bytes"] for r in rows], 0.4,
                  color="tab:gray", label="llama.cpp fork")
    ax[1].axhline(1.1, color="red", linestyle="--", label="target 1.1x")
    ax[1].set_xticks(xs, [f"{r['layers']} layers" for r in rows])
    ax[1].set_ylabel("peak resident memory / file size")
    ax[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "dg_step.png"), dpi=120)


def plot_alone(out):
    """The step split of every *alone*.json in `out` (runs of --alone, with and without --self-cond-top-k; files
    of repeated runs may carry a prefix), the median of each setting's runs, as stacked bars: alone_split.png."""
    import glob
    import statistics
    runs = {}
    for f in sorted(glob.glob(os.path.join(out, "*alone*.json"))):
        j = json.load(open(f))
        runs.setdefault(j.get("self_cond_top_k", 0), []).append(j)
    if not runs:
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot (build/venv/bin/python has it)", file=sys.stderr)
        return
    keys = sorted(runs)
    fig, ax = plt.subplots(figsize=(6, 4))
    bottom = [0.0] * len(keys)
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]
    for k, c in zip(SPLIT, colours):
        vals = [statistics.median(r[k] for r in runs[key]) / 1000 for key in keys]
        ax.bar(range(len(keys)), vals, 0.6, bottom=bottom, color=c, label=k[:-3].replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(keys)), ["exact" if k == 0 else f"--self-cond-top-k {k}" for k in keys])
    ax.set_ylabel("seconds per denoising step (median of runs)")
    layers = runs[keys[0]][0]["layers"]
    ax.set_title(f"DiffusionGemma {layers} layers, canvas 256, 2 threads: self-conditioning exact or top-K", fontsize=8)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "alone_split.png"), dpi=120)


def run_ab(a):
    """--ab NAME=BINARY,NAME=BINARY: the two programs alternate for --ab-rounds rounds on the --alone file, --steps
    steps each, the same prompt and seed: NAME-ROUND.json each (their texts must be equal), ab_split.png."""
    progs = [x.split("=", 1) for x in a.ab.split(",")]
    model = e2e.ensure_model(os.path.join(a.models, f"diffusion-gemma-{a.alone}L-Q4_K_M.gguf"), "diffusion-gemma",
                             a.alone, "Q4_K_M")
    text, ids = e2e.prompt_for(model, 33)
    runs = []
    for rnd in range(1, a.ab_rounds + 1):
        for name, binary in progs:
            res = run_dllm(model, ids, a.steps, a.threads, binary=binary)
            res.update({"name": name, "binary": binary, "round": rnd, "layers": a.alone, "steps": a.steps})
            with open(os.path.join(a.out, f"{name}-{rnd}.json"), "w") as f:
                json.dump(res, f, indent=1)
            runs.append(res)
            print(json.dumps({k: res[k] for k in ("name", "round", "step_ms", "self_conditioning_ms", "peak_rss")}))
    if len({r["text"] for r in runs}) != 1:
        print("the programs' texts differ", file=sys.stderr)
        return 1
    with open(os.path.join(a.out, "ab.json"), "w") as f:
        json.dump({"order": [f"{r['name']}-{r['round']}" for r in runs]}, f)
    plot_ab(a.out)
    return 0


def plot_ab(out):
    """The step split of an --ab run's files (ab.json gives their order) as horizontal stacked bars: ab_split.png."""
    if not os.path.exists(os.path.join(out, "ab.json")):
        return
    runs = [json.load(open(os.path.join(out, n + ".json"))) for n in json.load(open(os.path.join(out, "ab.json")))["order"]]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot (build/venv/bin/python has it)", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(9.5, 0.6 * len(runs) + 1.5))
    for i, r in enumerate(runs):
        left = 0.0
        for c, k in enumerate(SPLIT):
            ax.barh(i, r[k], left=left, color=f"C{c}", label=k[:-3].replace("_", " ") if i == 0 else None)
            left += r[k]
    ax.set_yticks(range(len(runs)), [f"{r['name']} {r['round']}" for r in runs])
    ax.set_xlabel(f"ms per denoising step (mean of {runs[0]['steps']})")
    ax.set_title(f"DiffusionGemma {runs[0]['layers']} layers, canvas 256, alternating", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(os.path.join(out, "ab_split.png"), dpi=100)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--layers", default="2,6")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--models", default=os.path.join(e2e.ROOT, "build", "bench-models"))
    p.add_argument("--llama-diffusion-cli", default=os.environ.get("LLAMA_DIFFUSION_CLI"))
    p.add_argument("--plot-only", action="store_true")
    p.add_argument("--alone", type=int, default=0, help="layers of a file dllm runs alone (alone.json)")
    p.add_argument("--defaults", type=int, default=0, help="layers of the file for one run at the file's settings")
    p.add_argument("--self-cond-top-k", default="", help="K1,K2,...: dllm also with --self-cond-top-k K")
    p.add_argument("--ab", default="", help="NAME=BINARY,NAME=BINARY: two dllm builds alternating on the --alone file")
    p.add_argument("--ab-rounds", type=int, default=2)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.ab:
        if not a.alone:
            p.error("--ab needs --alone LAYERS")
        with open(os.path.join(a.out, "machine.txt"), "w") as f:
            f.write(e2e.machine_description())
        return run_ab(a)
    if a.plot_only:
        if os.path.exists(os.path.join(a.out, "results.json")):
            plot(json.load(open(os.path.join(a.out, "results.json")))["rows"], a.out)
        plot_alone(a.out)
        plot_ab(a.out)
        return 0
    with open(os.path.join(a.out, "machine.txt"), "w") as f:
        f.write(e2e.machine_description())
    top_ks = [int(k) for k in a.self_cond_top_k.split(",") if k]
    alone = [(a.alone, "alone.json", a.steps, 0)] + [(a.alone, f"alone-top-{k}.json", a.steps, k) for k in top_ks]
    for layers, name, steps, top_k in alone + [(a.defaults, "defaults.json", 0, 0)]:
        if not layers:
            continue
        model = e2e.ensure_model(os.path.join(a.models, f"diffusion-gemma-{layers}L-Q4_K_M.gguf"), "diffusion-gemma",
                                 layers, "Q4_K_M")
        text, ids = e2e.prompt_for(model, 33)
        res = run_dllm(model, ids, steps, a.threads, top_k)
        res.update({"layers": layers, "model": model, "file_bytes": os.path.getsize(model), "steps": steps,
                    "self_cond_top_k": top_k, "peak_rss_over_file": res["peak_rss"] / os.path.getsize(model)})
        res["outside_layers_share"] = (res["lm_head_ms"] + res["self_conditioning_ms"] + res["sampler_ms"] +
                                       res["embed_ms"]) / res["step_ms"]
        with open(os.path.join(a.out, name), "w") as f:
            json.dump(res, f, indent=1)
        print(json.dumps({k: res[k] for k in ("layers", "self_cond_top_k", "step_ms", "tokens_per_s", "peak_rss_over_file",
                                              "outside_layers_share", "self_conditioning_ms")}))
    plot_alone(a.out)
    if not a.layers:
        return 0
    rows = []
    for layers in [int(x) for x in a.layers.split(",")]:
        model = e2e.ensure_model(os.path.join(a.models, f"diffusion-gemma-{layers}L-Q4_K_M.gguf"), "diffusion-gemma",
                                 layers, "Q4_K_M")
        text, ids = e2e.prompt_for(model, 33)
        fns = [("dllm", lambda: run_dllm(model, ids, a.steps, a.threads))]
        if a.llama_diffusion_cli:
            fns.append(("fork", lambda: run_fork(a.llama_diffusion_cli, model, text, a.steps, a.threads)))
        for k in top_ks:
            fns.append((f"dllm top-{k}", lambda k=k: run_dllm(model, ids, a.steps, a.threads, k)))
        runs = [[] for _ in fns]
        for _ in range(a.repeat):
            for i, (name, fn) in enumerate(fns):
                runs[i].append(fn())
                print(f"{layers} layers, {name}: {runs[i][-1]['step_ms']:.0f} ms/step", file=sys.stderr)
        row = {"layers": layers, "model": model, "file_bytes": os.path.getsize(model), "prompt_tokens": len(ids),
               "steps": a.steps, "threads": a.threads, "dllm": median_runs(runs[0]),
               "dllm_runs": [r["step_ms"] for r in runs[0]]}
        if a.llama_diffusion_cli:
            row["fork"] = median_runs(runs[1])
            row["fork_runs"] = [r["step_ms"] for r in runs[1]]
            row["speedup"] = row["fork"]["step_ms"] / row["dllm"]["step_ms"]
        if top_ks:
            first = len(fns) - len(top_ks)
            row["dllm_top_k"] = {}
            for j, k in enumerate(top_ks):
                d = median_runs(runs[first + j])
                d["runs"] = [r["step_ms"] for r in runs[first + j]]
                d["outside_layers_share"] = (d["lm_head_ms"] + d["self_conditioning_ms"] + d["sampler_ms"] +
                                             d["embed_ms"]) / d["step_ms"]
                if a.llama_diffusion_cli:
                    d["speedup"] = row["fork"]["step_ms"] / d["step_ms"]
                row["dllm_top_k"][str(k)] = d
        d = row["dllm"]
        row["outside_layers_share"] = (d["lm_head_ms"] + d["self_conditioning_ms"] + d["sampler_ms"] +
                                       d["embed_ms"]) / d["step_ms"]
        rows.append(row)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"rows": rows}, f, indent=1)
    with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["layers", "dllm_ms_per_step", "fork_ms_per_step", "speedup", "dllm_peak_rss_over_file",
                    "fork_peak_rss_over_file", "outside_layers_share"] + ["dllm_" + k for k in SPLIT])
        for r in rows:
            fk = r.get("fork")
            w.writerow([r["layers"], round(r["dllm"]["step_ms"], 1), round(fk["step_ms"], 1) if fk else "",
                        round(r.get("speedup", 0), 2), round(r["dllm"]["peak_rss"] / r["file_bytes"], 3),
                        round(fk["peak_rss"] / r["file_bytes"], 3) if fk else "", round(r["outside_layers_share"], 3)] +
                       [round(r["dllm"][k], 1) for k in SPLIT])
    plot(rows, a.out)
    for r in rows:
        print(json.dumps({k: r[k] for k in ("layers", "speedup", "outside_layers_share") if k in r}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
