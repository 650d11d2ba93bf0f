#!/usr/bin/env python3
"""The parity and speed stages of bench/gpu/device-check.sh (standard library only).

    check.py parity-logits      --dllm BIN --device gpu --data tests/data --out DIR [--deadline EPOCH]
    check.py parity-generations --dllm BIN --device gpu --data tests/data --out DIR [--deadline EPOCH]
    check.py speed --dllm BIN --device gpu --llada FILE --dream FILE --out DIR [--deadline EPOCH]
    check.py speed-report --out DIR          (recomputes speed.{csv,json} from DIR/speed-runs)

parity-logits: `dllm logits --device D` on every fixture model and case of tests/data/logits against the
CPU reference executor (DLLM_EXECUTOR=reference); per case the relative L2 error ||got - ref|| / ||ref||
of every row (worst and mean) and the argmax agreement, into parity-logits.{csv,json}. Models without GPU
kernels (F16, F32) must be refused with an error naming a tensor; that is recorded as "unsupported".
parity-generations: greedy `dllm run --device D` on every generation fixture the device supports, and on
variants of one fixture per model (every remasking mode of the architecture, --threshold, --dual-cache),
against `dllm run --device cpu`, token for token (also compared with the fixture's tokens, for the
record), into parity-generations.{csv,json}. With --device cpu (the harness check on a machine without
a GPU) both sides are the CPU path: that checks the plumbing and that runs repeat exactly; --against
reference compares with the reference executor instead, whose f32 activations put near-ties elsewhere
than the int8 paths do, so some runs differ by design.
speed: `dllm run --device D --json --dump-step-stats` on synthetic full-size files, at canvas 64 and 288
and with --dual-cache (its block steps timed apart), each once more with DLLM_GPU_PROFILE=1 for the
split and once with DLLM_GPU_GRAPHS=0 (every kernel launched on its own, against one graph per step); the
raw outputs go to speed-runs/, the table to speed.{csv,json}.

Every mode exits 1 when a check fails or a run errs, 0 otherwise; runs past the deadline are not started
(recorded as "skipped: budget"), so partial results are always written.
"""
import argparse
import array
import csv
import glob
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

# The same bound as tests/gpu/parity.h (kGpuLogitsTolerance): int8 activations and f16 attention against
# the f32 reference, on the random 2-layer fixtures.
LOGITS_TOLERANCE = 5e-2
# H200 SXM datasheet figures the speed table is measured against.
HBM_BYTES_PER_S = 4.8e12
INT8_DENSE_OPS_PER_S = 1979e12
DLLM_PROFILE = "DLLM_GPU_PROFILE"
DLLM_GRAPHS = "DLLM_GPU_GRAPHS"


class Deadline:
    def __init__(self, epoch):
        self.epoch = epoch

    def left(self):
        return math.inf if self.epoch is None else self.epoch - time.time()

    def passed(self, need=0.0):
        return self.left() <= need


def run(cmd, env_extra=None, env_drop=(), timeout=None):
    if timeout is not None and math.isinf(timeout):
        timeout = None
    env = dict(os.environ)
    for k in env_drop:
        env.pop(k, None)
    env.update(env_extra or {})
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env, timeout=timeout)
        return r.returncode, r.stdout, r.stderr, time.time() - t0
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return 124, "", err + f"\n(timed out after {timeout:.0f}s)", time.time() - t0


def last_error(stderr):
    lines = [l for l in stderr.strip().splitlines() if l.strip()]
    errs = [l for l in lines if l.startswith("ERROR")]
    return (errs or lines or ["(no message)"])[-1][:300]


def write_table(out_dir, stem, rows, fields):
    with open(os.path.join(out_dir, stem + ".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def status_counts(rows):
    """ "32 pass, 2 unsupported": how many rows have each status."""
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))


def dump_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


# ---------------------------------------------------------------- parity: logits

def read_f32(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return a


def compare_rows(got, ref, n_vocab):
    """Relative L2 of every row, and how many rows have the same argmax."""
    rels, agree = [], 0
    for r in range(len(ref) // n_vocab):
        g = got[r * n_vocab:(r + 1) * n_vocab]
        e = ref[r * n_vocab:(r + 1) * n_vocab]
        num = math.fsum((a - b) * (a - b) for a, b in zip(g, e))
        den = math.fsum(b * b for b in e)
        rels.append(math.sqrt(num / den) if den > 0 else math.sqrt(num))
        agree += max(range(n_vocab), key=g.__getitem__) == max(range(n_vocab), key=e.__getitem__)
    return rels, agree


def models_without_gpu_kernels(name):
    return name.endswith("-F16") or name.endswith("-F32")


def parity_logits(a):
    dl = Deadline(a.deadline)
    tmp = os.path.join(a.out, "parity-logits-tmp")
    os.makedirs(tmp, exist_ok=True)
    rows_out, failed = [], 0
    cases = sorted(glob.glob(os.path.join(a.data, "logits", "*.json")))
    for case_file in cases:
        c = json.load(open(case_file))
        model = c["model_file"]
        name = model[:-len(".gguf")]
        row = {"model": name, "case": c["case"], "device": a.device, "rows": len(c["rows"]),
               "tolerance": LOGITS_TOLERANCE}
        if dl.passed(10):
            row.update(status="skipped: budget")
            rows_out.append(row)
            continue
        base = ["logits", "--model", os.path.join(a.data, "models", model),
                "--tokens", ",".join(map(str, c["ids"])), "--rows", ",".join(map(str, c["rows"]))]
        ref_f = os.path.join(tmp, f"{name}__{c['case']}.ref.f32")
        got_f = os.path.join(tmp, f"{name}__{c['case']}.{a.device}.f32")
        rc, _, err, t_ref = run([a.dllm] + base + ["--device", "cpu", "--out", ref_f],
                                env_extra={"DLLM_EXECUTOR": "reference"}, timeout=max(5, dl.left()))
        if rc:
            row.update(status="error", message="reference: " + last_error(err))
            rows_out.append(row)
            failed += 1
            continue
        rc, _, err, t_dev = run([a.dllm] + base + ["--device", a.device, "--out", got_f], env_drop=["DLLM_EXECUTOR"],
                                timeout=max(5, dl.left()))
        row.update(ref_s=round(t_ref, 2), device_s=round(t_dev, 2))
        if rc:
            msg = last_error(err)
            if a.device == "gpu" and models_without_gpu_kernels(name) and "tensor" in msg:
                row.update(status="unsupported", message=msg)  # the documented refusal, naming a tensor
            else:
                row.update(status="error", message=msg)
                failed += 1
            rows_out.append(row)
            continue
        n_vocab = c["shape"][1]
        got, ref = read_f32(got_f), read_f32(ref_f)
        if len(got) != len(ref) or len(ref) != len(c["rows"]) * n_vocab:
            row.update(status="error", message=f"sizes differ: {len(got)} vs {len(ref)} floats")
            rows_out.append(row)
            failed += 1
            continue
        rels, agree = compare_rows(got, ref, n_vocab)
        finite = all(math.isfinite(x) for x in got)
        n = len(rels)
        need_agree = n - 1 if n < 10 else int(0.85 * n)  # as tests/gpu/parity.h
        ok = finite and max(rels) <= LOGITS_TOLERANCE and agree >= need_agree
        row.update(status="pass" if ok else "fail", rel_l2_max=max(rels), rel_l2_mean=statistics.fmean(rels),
                   argmax_agree=agree, finite=finite)
        failed += not ok
        rows_out.append(row)
        os.remove(got_f)
        os.remove(ref_f)
    os.rmdir(tmp) if not os.listdir(tmp) else None
    fields = ["model", "case", "device", "rows", "status", "rel_l2_max", "rel_l2_mean", "argmax_agree", "tolerance",
              "ref_s", "device_s", "message"]
    write_table(a.out, "parity-logits", rows_out, fields)
    dump_json(os.path.join(a.out, "parity-logits.json"), {"device": a.device, "tolerance": LOGITS_TOLERANCE,
                                                         "cases": rows_out})
    for r in rows_out:
        line = f"{r['model']:<20} {r['case']:<32} {r['status']:<12}"
        if "rel_l2_max" in r:
            line += f" rel L2 max {r['rel_l2_max']:.2e} mean {r['rel_l2_mean']:.2e}, argmax {r['argmax_agree']}/{r['rows']}"
        if r.get("message"):
            line += " " + r["message"]
        print(line)
    worst = max((r["rel_l2_max"] for r in rows_out if "rel_l2_max" in r), default=float("nan"))
    print(f"note: {len(rows_out)} cases: {status_counts(rows_out)}; worst rel L2 {worst:.2e}")
    return 1 if failed or not rows_out else 0


# ---------------------------------------------------------------- parity: generations

def generation_runs(data, device):
    """(label, model file, prompt ids, flags, expected tokens or None): every fixture the device can run,
    then variants of the first fixture of each model."""
    runs, first = [], {}
    for f in sorted(glob.glob(os.path.join(data, "generations", "*.json"))):
        g = json.load(open(f))
        name = g["model_file"][:-len(".gguf")]
        if device == "gpu" and models_without_gpu_kernels(name):
            continue
        a = g["authors_equivalent"]
        if g["arch"] == "llada":
            flags = ["--max-tokens", a["gen_length"], "--steps", a["steps"], "--block-length", a["block_length"],
                     "--remasking", "low_confidence"]
        else:
            flags = ["--max-tokens", a["max_new_tokens"], "--steps", a["steps"], "--remasking", a["alg"]]
        flags = [str(x) for x in flags]
        runs.append((os.path.basename(f)[:-len(".json")], g["model_file"], g["prompt_ids"], flags, g["generated_ids"]))
        first.setdefault(name, (g, flags))
    for name, (g, flags) in sorted(first.items()):
        base = [x for i, x in enumerate(flags) if x != "--remasking" and (i == 0 or flags[i - 1] != "--remasking")]
        if g["arch"] == "llada":
            variants = {"low_confidence": ["--remasking", "low_confidence"],
                        "random": ["--remasking", "random", "--seed", "7"],
                        "threshold": ["--remasking", "low_confidence", "--threshold", "0.5"],
                        "dual_cache": ["--remasking", "low_confidence", "--dual-cache"],
                        "dual_cache_threshold": ["--remasking", "low_confidence", "--dual-cache", "--threshold", "0.5"]}
        else:
            variants = {alg: ["--remasking", alg] for alg in ("entropy", "maskgit_plus", "topk_margin")}
        for v, extra in variants.items():
            runs.append((f"{name}__{g['case']}__{v}", g["model_file"], g["prompt_ids"], base + extra, None))
    return runs


def run_tokens(a, model, prompt, flags, device, timeout, reference=False):
    cmd = [a.dllm, "run", "--model", os.path.join(a.data, "models", model), "--prompt-tokens",
           ",".join(map(str, prompt)), "--no-early-stop", "--temperature", "0", "--json", "--device", device] + flags
    rc, out, err, secs = run(cmd, env_extra={"DLLM_EXECUTOR": "reference"} if reference else None,
                             env_drop=["DLLM_EXECUTOR", DLLM_PROFILE], timeout=timeout)
    if rc:
        return None, last_error(err), secs
    return json.loads(out)["output_ids"], "", secs


def parity_generations(a):
    dl = Deadline(a.deadline)
    # Against the CPU's JIT path (by default), or the reference executor, whose f32 activations make
    # near-ties fall differently from the int8 paths (docs/correctness.md), so it is not the default.
    reference = a.against == "reference"
    against = "DLLM_EXECUTOR=reference --device cpu" if reference else "--device cpu"
    rows_out, failed = [], 0
    for label, model, prompt, flags, expected in generation_runs(a.data, a.device):
        row = {"run": label, "model": model, "flags": " ".join(flags), "device": a.device}
        if dl.passed(10):
            row.update(status="skipped: budget")
            rows_out.append(row)
            continue
        got, err, t_dev = run_tokens(a, model, prompt, flags, a.device, max(5, dl.left()))
        want, err_cpu, t_cpu = (None, "", 0.0)
        if got is not None:
            want, err_cpu, t_cpu = run_tokens(a, model, prompt, flags, "cpu", max(5, dl.left()),
                                              reference=reference)
        if got is None or want is None:
            row.update(status="error", message=err or "cpu: " + err_cpu)
            failed += 1
        else:
            first_diff = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), None)
            same = got == want
            row.update(status="pass" if same else "fail", tokens=len(got),
                       first_difference=first_diff if not same else "",
                       same_as_fixture="" if expected is None else (got == expected),
                       cpu_same_as_fixture="" if expected is None else (want == expected),
                       device_s=round(t_dev, 2), cpu_s=round(t_cpu, 2))
            if not same:
                row.update(device_tokens=" ".join(map(str, got)), cpu_tokens=" ".join(map(str, want)))
            failed += not same
        rows_out.append(row)
        print(f"{label:<72} {row['status']:<8} {row.get('message', '')}")
    fields = ["run", "model", "flags", "device", "status", "tokens", "first_difference", "same_as_fixture",
              "cpu_same_as_fixture", "device_s", "cpu_s", "message", "device_tokens", "cpu_tokens"]
    write_table(a.out, "parity-generations", rows_out, fields)
    dump_json(os.path.join(a.out, "parity-generations.json"), {"device": a.device, "against": against,
                                                              "runs": rows_out})
    fixture = [r for r in rows_out if r.get("same_as_fixture") in (True, False)]
    print(f"note: {len(rows_out)} runs against {against}: {status_counts(rows_out)}; "
          f"{sum(r['same_as_fixture'] for r in fixture)}/{len(fixture)} equal to the fixture's tokens")
    return 1 if failed or not rows_out else 0


# ---------------------------------------------------------------- speed

PROMPT_LEN = 32
# name, arch, generated tokens, steps, block length, dual cache
SPEED_CONFIGS = [
    ("canvas64", "llada", 32, 8, 32, False),
    ("canvas288", "llada", 256, 16, 32, False),
    ("dual-cache", "llada", 256, 64, 32, True),
    ("canvas64", "dream", 32, 8, 32, False),
    ("canvas288", "dream", 256, 16, 32, False),
]
STEP_LINE = re.compile(r"^step=(\d+) .*?\bms=([0-9.]+)(.*)$")


def matrix_params(dllm, model):
    """(parameters of the per-layer projection matrices, of the LM head, hyperparameters) from inspect."""
    rc, out, err, _ = run([dllm, "inspect", model, "--json"])
    if rc:
        raise RuntimeError("dllm inspect failed: " + last_error(err))
    j = json.loads(out)
    layer = head = 0
    tensors = j["tensors"]
    names = {t["name"] for t in tensors}
    for t in tensors:
        shape = t["shape"]
        if len(shape) != 2:
            continue
        if re.match(r"blk\.\d+\.(attn_(q|k|v|output)|ffn_(gate|up|down))\.weight$", t["name"]):
            layer += shape[0] * shape[1]
        elif t["name"] == "output.weight" or (t["name"] == "token_embd.weight" and "output.weight" not in names):
            head = shape[0] * shape[1]
    return layer, head


def sig3(x):
    return float(f"{x:.3g}")


def steps_of(stderr):
    full, cached = [], []
    for line in stderr.splitlines():
        m = STEP_LINE.match(line.strip())
        if not m or "skipped" in m.group(3):
            continue
        (cached if "cached" in m.group(3) else full).append(float(m.group(2)))
    return full, cached


def speed(a):
    dl = Deadline(a.deadline)
    runs_dir = os.path.join(a.out, "speed-runs")
    os.makedirs(runs_dir, exist_ok=True)
    failed = 0
    models = {"llada": a.llada, "dream": a.dream}
    for name, arch, gen, steps, block, dual in SPEED_CONFIGS:
        model = models[arch]
        if not model or not os.path.exists(model):
            print(f"{arch} {name}: no model file")
            continue
        for variant in ("", "profile", "nographs"):
            profile = variant == "profile"
            if dual and profile:
                continue  # a dual-cache run's profile would average its full and block steps together
            tag = f"{arch}-{name}{'-' + variant if variant else ''}"
            if dl.passed(30):
                dump_json(os.path.join(runs_dir, tag + ".json"), {"skipped": "budget"})
                print(f"{tag}: skipped (budget)")
                continue
            prompt = [100 + i for i in range(PROMPT_LEN)]
            cmd = [a.dllm, "run", "--model", model, "--prompt-tokens", ",".join(map(str, prompt)), "--max-tokens",
                   str(gen), "--steps", str(steps), "--block-length", str(block), "--no-early-stop", "--json",
                   "--dump-step-stats", "--device", a.device]
            if dual:
                cmd.append("--dual-cache")
            env = {DLLM_PROFILE: "1"} if profile else {DLLM_GRAPHS: "0"} if variant == "nographs" else {}
            rc, out, err, secs = run(cmd, env_extra=env or None,
                                     env_drop=["DLLM_EXECUTOR"] + ([] if profile else [DLLM_PROFILE]) +
                                     ([] if variant == "nographs" else [DLLM_GRAPHS]),
                                     timeout=max(10, dl.left()))
            rec = {"config": name, "arch": arch, "model": model, "profile": profile, "variant": variant or "graphs",
                   "prompt": PROMPT_LEN,
                   "generated": gen, "steps": steps, "block_length": block, "dual_cache": dual, "command": cmd,
                   "exit_status": rc, "seconds": round(secs, 2)}
            if rc:
                rec["error"] = last_error(err)
                failed += 1
                print(f"{tag}: FAILED: {rec['error']}")
            else:
                rec["result"] = json.loads(out)
                rec["step_ms"], rec["cached_step_ms"] = steps_of(err)
                print(f"{tag}: {secs:.1f}s, {len(rec['step_ms'])} full steps, {len(rec['cached_step_ms'])} block steps")
            dump_json(os.path.join(runs_dir, tag + ".json"), rec)
    rows = speed_report(a.out, a.dllm)
    print(f"note: {len(rows)} speed rows")
    return 1 if failed else 0


def speed_report(out_dir, dllm=None):
    """speed.{csv,json} from the runs in speed-runs/: median step times, the profile split, the fraction of
    HBM bandwidth (device weight bytes / step time) and of the int8 dense peak (2 * rows * matrix
    parameters / step time; the LM head counted on the rows the sampler reads at most)."""
    runs = {}
    for f in sorted(glob.glob(os.path.join(out_dir, "speed-runs", "*.json"))):
        r = json.load(open(f))
        if "result" in r:
            runs[os.path.basename(f)[:-5]] = r
    params = {}
    rows = []
    for tag, r in runs.items():
        if r["profile"] or r.get("variant") == "nographs":
            continue
        res = r["result"]
        model = r["model"]
        if model not in params:
            params[model] = matrix_params(dllm or r["command"][0], model) if os.path.exists(model) else (0, 0)
        layer_p, head_p = params[model]
        weight_bytes = res["device"].get("gpu_weight_bytes")
        canvas = r["prompt"] + r["generated"]
        # rows the LM head reads per step, at most: the current block (LLaDA), every masked row (Dream)
        head_rows = r["block_length"] if r["arch"] == "llada" else r["generated"]
        kinds = [("full", r["step_ms"], canvas)]
        if r["dual_cache"]:
            kinds.append(("block", r["cached_step_ms"], r["block_length"]))
        prof = runs.get(tag + "-profile", {}).get("result", {}).get("gpu_profile")
        plain = runs.get(tag + "-nographs", {})
        for kind, times, rows_per_step in kinds:
            if not times:
                continue
            ms = statistics.median(times)
            ops = 2 * rows_per_step * layer_p + 2 * min(head_rows, rows_per_step) * head_p
            row = {"arch": r["arch"], "config": r["config"], "step_kind": kind, "canvas": canvas,
                   "rows_per_step": rows_per_step, "steps_timed": len(times), "step_ms_median": round(ms, 3),
                   "step_ms_min": round(min(times), 3), "device": res["settings"]["device"],
                   "weight_bytes": weight_bytes, "int8_ops_per_step": ops,
                   "hbm_fraction": sig3(weight_bytes / (ms / 1e3) / HBM_BYTES_PER_S) if weight_bytes else "",
                   "int8_peak_fraction": sig3(ops / (ms / 1e3) / INT8_DENSE_OPS_PER_S),
                   "load_ms": round(res["timings"]["load_ms"], 1),
                   "graphs": next((l for l in res["device"].get("description", []) if l.startswith("gpu graphs:")), "")}
            plain_times = plain.get("step_ms" if kind == "full" else "cached_step_ms")
            if plain_times:
                row["step_ms_no_graphs"] = round(statistics.median(plain_times), 3)
            if prof and kind == "full":
                row.update(profile_steps=prof["steps"], gemm_ms=round(prof["gemm_ms_per_step"], 3),
                           attention_ms=round(prof["attention_ms_per_step"], 3),
                           lm_head_ms=round(prof["lm_head_ms_per_step"], 3),
                           transfer_ms=round(prof["transfer_ms_per_step"], 3))
            rows.append(row)
    fields = ["arch", "config", "step_kind", "canvas", "rows_per_step", "steps_timed", "step_ms_median", "step_ms_min",
              "device", "weight_bytes", "int8_ops_per_step", "hbm_fraction", "int8_peak_fraction", "profile_steps",
              "gemm_ms", "attention_ms", "lm_head_ms", "transfer_ms", "load_ms", "step_ms_no_graphs", "graphs"]
    write_table(out_dir, "speed", rows, fields)
    dump_json(os.path.join(out_dir, "speed.json"),
              {"hbm_bytes_per_s": HBM_BYTES_PER_S, "int8_dense_ops_per_s": INT8_DENSE_OPS_PER_S,
               "note": "hbm_fraction: device weight bytes / step time (weights read once per step); "
                       "int8_peak_fraction: 2 * rows * projection parameters (+ LM head on at most the rows the "
                       "sampler reads) / step time; profile split measured in a separate DLLM_GPU_PROFILE=1 run "
                       "(device timers around each kernel group, graphs off)",
               "rows": rows})
    for row in rows:
        print(" ".join(f"{k}={row[k]}" for k in fields if k in row))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    for mode in ("parity-logits", "parity-generations", "speed"):
        s = sub.add_parser(mode)
        s.add_argument("--dllm", required=True)
        s.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
        s.add_argument("--out", required=True)
        s.add_argument("--deadline", type=float, default=None, help="epoch seconds: no run starts after it")
        if mode == "speed":
            s.add_argument("--llada", default="")
            s.add_argument("--dream", default="")
        else:
            s.add_argument("--data", required=True)
        if mode == "parity-generations":
            s.add_argument("--against", default="cpu", choices=["cpu", "reference"],
                           help="the CPU side: --device cpu (the JIT kernels) or DLLM_EXECUTOR=reference")
    s = sub.add_parser("speed-report")
    s.add_argument("--out", required=True)
    s.add_argument("--dllm", default=None)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.mode == "parity-logits":
        return parity_logits(a)
    if a.mode == "parity-generations":
        return parity_generations(a)
    if a.mode == "speed":
        return speed(a)
    speed_report(a.out, a.dllm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
