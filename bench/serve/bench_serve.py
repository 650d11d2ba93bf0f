#!/usr/bin/env python3
"""dllm serve against `dllm run --prompts-file`: the same requests, the same batch size, the same model.

    python3 bench/serve/bench_serve.py --out bench/results/serve-<date> [--model PATH] [--clients 1,4,16]
                                       [--repeats 3] [--threads 2]

For each client count C: a server with --batch-size C gets R requests from C closed-loop clients (each sends
its next request when its answer is complete), streamed over HTTP on loopback; the same R requests go
through `run --prompts-file --batch-size C` (generation time: its --verbose total minus load). Records
requests/s of both, the server's overhead, and the server's time to first final token (from sending the
request to the first chunk with answer text) and time to answer. The model defaults to the synthetic 4-layer
LLaDA file (`dllm synth --arch llada --layers 4`, written under build/synth when missing). Runs alternate
server and file per repeat; the best of the repeats is kept (the machine is shared). Writes results.json,
results.csv, machine.txt and serve.png (matplotlib from build/venv when present).
"""
import argparse
import concurrent.futures as cf
import csv
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "e2e"))
from bench import DLLM, ensure_model, machine_description, pyplot  # noqa: E402

PROMPTS = ["Hello", "Tell me a story", "What is two plus two?", "Write a haiku about the sea.", "Name three colours.",
           "Why is the sky blue?", "Count to five.", "Say something nice.", "What is a diffusion model?",
           "Describe a cat.", "Where is Paris?", "Give me a word that rhymes with moon.", "What day is it?",
           "Explain gravity briefly.", "List two fruits.", "How are you?"]
SETTINGS = {"max_tokens": 16, "steps": 4, "block_length": 16}


def requests_for(clients):
    return PROMPTS[: max(4, 2 * clients) if clients < 16 else 16]


def start_server(model, batch, threads):
    p = subprocess.Popen([DLLM, "serve", "--model", model, "--port", "0", "--batch-size", str(batch), "--threads",
                          str(threads), "--max-queue", "64"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    for line in p.stderr:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()  # drain the log
            return p, int(m.group(1))
    raise RuntimeError("dllm serve did not start")


def one_request(port, prompt):
    """Streams one chat completion; (time to first final token, time to answer, text) in seconds."""
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "stream": True, **SETTINGS})
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]}")
    first, text = None, ""
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        j = json.loads(line[6:])
        for ch in j.get("choices", []):
            piece = ch.get("delta", {}).get("content")
            if piece:
                text += piece
                if first is None:
                    first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    c.close()
    return (first if first is not None else total), total, text


def bench_server(model, clients, threads):
    reqs = requests_for(clients)
    p, port = start_server(model, clients, threads)
    try:
        one_request(port, "warm up")  # kernels generated, pages touched
        todo = list(reqs)
        lock = threading.Lock()
        results = []

        def client():
            while True:
                with lock:
                    if not todo:
                        return
                    prompt = todo.pop(0)
                results.append(one_request(port, prompt))

        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(clients) as ex:
            for f in [ex.submit(client) for _ in range(clients)]:
                f.result()
        wall = time.perf_counter() - t0
    finally:
        p.terminate()
        p.wait(timeout=60)
    return {"requests": len(reqs), "seconds": wall, "rps": len(reqs) / wall,
            "ttft_mean_s": statistics.mean(r[0] for r in results), "answer_mean_s": statistics.mean(r[1] for r in results)}


def bench_file(model, clients, threads):
    reqs = requests_for(clients)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for prompt in reqs:
            f.write(json.dumps({"prompt": prompt, **SETTINGS}) + "\n")
        path = f.name
    try:
        r = subprocess.run([DLLM, "run", "--model", model, "--prompts-file", path, "--batch-size", str(clients),
                            "--threads", str(threads), "--verbose"], capture_output=True, text=True, errors="replace",
                           timeout=3600)
    finally:
        os.unlink(path)
    if r.returncode:
        raise RuntimeError(r.stderr)
    m = re.search(r"timings: load ([0-9.]+) ms, total ([0-9.]+) ms", r.stderr)
    gen = (float(m.group(2)) - float(m.group(1))) / 1000.0
    return {"requests": len(reqs), "seconds": gen, "rps": len(reqs) / gen}


def plot(rows, out):
    plt = pyplot()
    if plt is None:
        return
    cs = [r["clients"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(cs, [r["file_rps"] for r in rows], "o-", label="run --prompts-file")
    a.plot(cs, [r["server_rps"] for r in rows], "s-", label="dllm serve (HTTP, streamed)")
    a.set_xscale("log", base=2)
    a.set_xlabel("concurrent clients = batch size")
    a.set_ylabel("requests / s")
    a.set_title("throughput")
    a.legend()
    b.plot(cs, [r["server_ttft_s"] for r in rows], "s-", label="time to first final token")
    b.plot(cs, [r["server_answer_s"] for r in rows], "^-", label="time to answer")
    b.set_xscale("log", base=2)
    b.set_xlabel("concurrent clients")
    b.set_ylabel("seconds (mean per request)")
    b.set_title("dllm serve latency")
    b.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    model = a.model or ensure_model(os.path.join(ROOT, "build", "synth", "llada-4L-Q4_K_M.gguf"), "llada", 4, "Q4_K_M")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "machine.txt"), "w") as f:
        f.write(machine_description())
    bench_file(model, 1, a.threads)  # warm-up: kernels generated, the file in the page cache
    rows = []
    for c in [int(x) for x in a.clients.split(",")]:
        srv, fil = [], []
        for _ in range(a.repeats):
            fil.append(bench_file(model, c, a.threads))
            srv.append(bench_server(model, c, a.threads))
        s = max(srv, key=lambda r: r["rps"])
        f = max(fil, key=lambda r: r["rps"])
        row = {"clients": c, "requests": s["requests"], "file_rps": f["rps"], "server_rps": s["rps"],
               "overhead_pct": 100.0 * (f["rps"] - s["rps"]) / f["rps"], "server_ttft_s": s["ttft_mean_s"],
               "server_answer_s": s["answer_mean_s"], "file_rps_all": [r["rps"] for r in fil],
               "server_rps_all": [r["rps"] for r in srv]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"model": os.path.basename(model), "settings": SETTINGS, "threads": a.threads, "rows": rows}, f,
                  indent=1)
    with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        keys = ["clients", "requests", "file_rps", "server_rps", "overhead_pct", "server_ttft_s", "server_answer_s"]
        w.writerow(keys)
        for r in rows:
            w.writerow([r[k] for k in keys])
    plot(rows, os.path.join(a.out, "serve.png"))


if __name__ == "__main__":
    main()
