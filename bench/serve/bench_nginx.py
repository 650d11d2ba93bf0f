#!/usr/bin/env python3
"""64 concurrent clients through nginx (deploy/nginx/dllm.conf) to 2 `dllm serve` replicas, against 64 clients
straight to one replica. Python 3 standard library only; loopback only.

    python3 bench/serve/bench_nginx.py --out bench/results/serve-nginx-<date> [--dllm build/dllm]
        [--model tests/data/models/tiny-llada-Q8_0.gguf] [--clients 64] [--per-client 8] [--threads 1]
        [--batch-size 8] [--repeats 3] [--nginx /usr/sbin/nginx]

Setups, each with the same closed-loop load (every client streams --per-client chat completions one after the
other, each in its own conversation: X-Conversation-Id client-N, so the edge spreads clients over the replicas):

  direct-1      the clients straight to one replica (--threads T)
  nginx-1       through nginx to that one replica: what the edge itself costs
  nginx-2       through nginx to two replicas (--threads T each)
  direct-1-2T   straight to one replica with 2T threads: the same cores as nginx-2 in one process

Records requests/s (requests over the wall time of the whole load), time to first final token (the first chunk
with answer text) and time to answer (p50, p90, p99, mean, max), errors, the kernel's count of connections
refused by a full listen queue during the load (TcpExt ListenOverflows: each costs the client a 1 s SYN
retransmit), and for the nginx setups how many requests each replica answered (the access log). The edge's
limits are raised above the load (the bench measures throughput, not the limits). Every setup runs at once
(idle replicas cost nothing) and the --repeats alternate between the setups; a setup's row is its median run
(rps_runs keeps every run's rate). Writes results.json, results.csv, machine.txt (the machine as
bench/serve/bench_serve.py records it, plus nginx -v and the git commit) and serve_nginx.png (matplotlib from
build/venv when present) into --out. The listen-overflow count is the whole machine's: other programs' overflows count too.
"""
import argparse
import csv
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "deploy", "nginx"))
from bench import machine_description, pyplot  # noqa: E402
import render  # noqa: E402

HOST = "127.0.0.1"
PROMPTS = ["Hello", "Tell me a story", "What is two plus two?", "Write a haiku about the sea.", "Name three colours.",
           "Why is the sky blue?", "Count to five.", "Say something nice.", "What is a diffusion model?",
           "Describe a cat.", "Where is Paris?", "Give me a word that rhymes with moon.", "What day is it?",
           "Explain gravity briefly.", "List two fruits.", "How are you?"]
SETTINGS = {"max_tokens": 16, "steps": 4, "block_length": 16}  # as bench_serve.py
EDGE = {"limit_conn": 4096, "limit_rate": 100000, "limit_burst": 100000, "read_timeout": "600s"}


def free_ports(n):
    return render.free_ports(n, HOST)


class Procs:
    """Processes started in their own process groups; stop() ends them all (SIGTERM, then SIGKILL)."""

    def __init__(self):
        self.procs = []

    def start(self, cmd, logpath):
        with open(logpath, "wb") as f:
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        self.procs.append(p)
        return p

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        self.procs = []


def wait_health(port, proc, bound=60.0):
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.args[0]} exited with {proc.returncode}")
        try:
            c = http.client.HTTPConnection(HOST, port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                c.close()
                return
            c.close()
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"nothing answers /health on port {port}")


def one_request(port, prompt, conv):
    """Streams one chat completion: (time to first final token, time to answer) in seconds, or an error string."""
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "stream": True, **SETTINGS})
    t0 = time.perf_counter()
    c = http.client.HTTPConnection(HOST, port, timeout=600)
    try:
        c.request("POST", "/v1/chat/completions", body,
                  {"Content-Type": "application/json", "X-Conversation-Id": conv})
        r = c.getresponse()
        if r.status != 200:
            return f"HTTP {r.status}"
        first, done = None, False
        for raw in r:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: ") and first is None:
                for ch in json.loads(line[6:]).get("choices", []):
                    if ch.get("delta", {}).get("content"):
                        first = time.perf_counter() - t0
        total = time.perf_counter() - t0
        if not done:
            return "stream without [DONE]"
        return (first if first is not None else total), total
    except (OSError, http.client.HTTPException, ValueError) as e:
        return f"{type(e).__name__}"
    finally:
        c.close()


def percentiles(xs):
    if not xs:
        return {}
    s = sorted(xs)

    def q(p):
        return s[min(len(s) - 1, max(0, int(round(p / 100.0 * len(s) + 0.5)) - 1))]
    return {"p50": q(50), "p90": q(90), "p99": q(99), "mean": statistics.mean(s), "max": s[-1]}


def listen_overflows():
    """The kernel's count of connections dropped because a listen queue was full (TcpExt ListenOverflows): the
    client's SYN is then retransmitted after 1 s, 3 s, ... (a dllm serve built on cpp-httplib 0.11 listens with a
    backlog of 5)."""
    try:
        with open("/proc/net/netstat") as f:
            lines = f.read().splitlines()
        for names, values in zip(lines[::2], lines[1::2]):
            if names.startswith("TcpExt:"):
                return int(dict(zip(names.split()[1:], values.split()[1:]))["ListenOverflows"])
    except (OSError, KeyError, ValueError):
        pass
    return -1


def load(port, clients, per_client):
    results, errors, lock = [], {}, threading.Lock()

    def client(k):
        for j in range(per_client):
            r = one_request(port, PROMPTS[(k + j) % len(PROMPTS)], f"client-{k}")
            with lock:
                if isinstance(r, str):
                    errors[r] = errors.get(r, 0) + 1
                else:
                    results.append(r)
    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    overflows0 = listen_overflows()
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    n = clients * per_client
    return {"requests": n, "answered": len(results), "errors": errors, "seconds": wall, "rps": len(results) / wall,
            "listen_overflows": listen_overflows() - overflows0,
            "ttft_s": percentiles([r[0] for r in results]), "answer_s": percentiles([r[1] for r in results])}


def start_setup(a, procs, name, replicas, threads, via_nginx, workdir):
    """Starts a setup's replicas (and nginx) and warms them up; returns (port, nginx prefix or None)."""
    ports = free_ports(replicas + 1)
    rports, nport = ports[:replicas], ports[-1]
    for k, port in enumerate(rports):
        cmd = [a.dllm, "serve", "--model", a.model, "--port", str(port), "--threads", str(threads),
               "--batch-size", str(a.batch_size), "--max-queue", str(max(64, a.clients)), "--max-tokens", "16",
               "--block-length", "16"]
        p = procs.start(cmd, os.path.join(workdir, f"{name}-replica{k}.log"))
        wait_health(port, p)
    port, prefix = rports[0], None
    if via_nginx:
        prefix = os.path.join(workdir, f"{name}-nginx")
        render.write(prefix, f"{HOST}:{nport}", [f"{HOST}:{p}" for p in rports], **EDGE)
        user = "user root;" if os.geteuid() == 0 else ""
        ng = procs.start(render.command(a.nginx, prefix, user), os.path.join(prefix, "nginx.out"))
        wait_health(nport, ng)
        port = nport
    for k in range(replicas):  # warm-up: every replica once (kernels generated, pages touched)
        for rp in rports:
            one_request(rp, "warm up", f"warm-{k}")
    return port, prefix


def measure(a, port, prefix):
    """One load run; with nginx, how many requests each replica answered (from the access log)."""
    if prefix:
        open(os.path.join(prefix, "access.log"), "w").close()
    r = load(port, a.clients, a.per_client)
    if prefix:
        per = {}
        with open(os.path.join(prefix, "access.log")) as f:
            for line in f:
                e = json.loads(line)
                if e["uri"] == "/v1/chat/completions":
                    up = e["upstream"].split(",")[-1].strip()
                    per[up] = per.get(up, 0) + 1
        r["per_replica"] = per
    return r


def run_setups(a, names, table, workdir):
    """Every setup started at once (idle replicas cost nothing), then the repeats alternate between them: each
    setup's row is its median run by requests/s (all runs' rates kept in rps_runs)."""
    procs = Procs()
    try:
        started = {}
        for name in names:
            replicas, threads, via = table[name]
            started[name] = start_setup(a, procs, name, replicas, threads, via, workdir)
        runs = {name: [] for name in names}
        for _ in range(a.repeats):
            for name in names:
                runs[name].append(measure(a, *started[name]))
        rows = []
        for name in names:
            ordered = sorted(runs[name], key=lambda r: r["rps"])
            row = dict(ordered[len(ordered) // 2])
            replicas, threads, via = table[name]
            row.update({"setup": name, "replicas": replicas, "threads_per_replica": threads, "via_nginx": via,
                        "clients": a.clients, "rps_runs": [round(r["rps"], 2) for r in runs[name]]})
            rows.append(row)
        return rows
    finally:
        procs.stop()


def plot(rows, out):
    plt = pyplot()
    if plt is None:
        return
    names = [r["setup"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(names, [r["rps"] for r in rows], color="#4a8")
    a.set_ylabel("requests / s (median run)")
    a.set_title(f"{rows[0]['clients']} streaming clients")
    for k in ("p50", "p99"):
        b.plot(names, [r["answer_s"].get(k, 0) for r in rows], "o-", label=f"answer {k}")
    b.set_ylabel("seconds")
    b.set_title("time to the whole answer")
    b.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dllm", default=os.path.join(ROOT, "build", "dllm"))
    ap.add_argument("--model", default=os.path.join(ROOT, "tests", "data", "models", "tiny-llada-Q8_0.gguf"))
    ap.add_argument("--nginx", default="/usr/sbin/nginx")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--per-client", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--setups", default="direct-1,nginx-1,nginx-2,direct-1-2T")
    a = ap.parse_args()
    if not os.access(a.nginx, os.X_OK):
        sys.exit(f"bench_nginx: {a.nginx} not found (apt-get install nginx-light)")
    os.makedirs(a.out, exist_ok=True)
    nginx_v = subprocess.run([a.nginx, "-v"], capture_output=True, text=True).stderr.strip()
    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--short", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.split("\n")
    build = {"commit": git, "modified": [ln[3:] for ln in dirty if ln.strip()],
             "dllm": a.dllm, "dllm_mtime": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(os.path.getmtime(a.dllm)))}
    with open(os.path.join(a.out, "machine.txt"), "w") as f:
        f.write(machine_description() + f"$ nginx -v\n{nginx_v}\n$ git rev-parse HEAD\n{git}\n"
                f"modified: {' '.join(build['modified'])}\n")
    table = {"direct-1": (1, a.threads, False), "nginx-1": (1, a.threads, True), "nginx-2": (2, a.threads, True),
             "direct-1-2T": (1, 2 * a.threads, False)}
    workdir = tempfile.mkdtemp(prefix="dllm-bench-nginx-")
    try:
        rows = run_setups(a, a.setups.split(","), table, workdir)
        for row in rows:
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"model": os.path.basename(a.model), "settings": SETTINGS, "clients": a.clients,
                   "per_client": a.per_client, "batch_size": a.batch_size, "threads": a.threads,
                   "repeats": a.repeats, "nginx": nginx_v, "edge": EDGE, "build": build, "rows": rows}, f, indent=1)
    with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["setup", "replicas", "threads_per_replica", "clients", "requests", "answered", "rps",
                    "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "answer_p50_s", "answer_p90_s", "answer_p99_s",
                    "answer_max_s", "listen_overflows", "errors"])
        for r in rows:
            t, s = r["ttft_s"], r["answer_s"]
            w.writerow([r["setup"], r["replicas"], r["threads_per_replica"], r["clients"], r["requests"],
                        r["answered"], f"{r['rps']:.2f}", *(f"{t.get(k, 0):.4f}" for k in ("p50", "p90", "p99")),
                        *(f"{s.get(k, 0):.4f}" for k in ("p50", "p90", "p99", "max")),
                        r["listen_overflows"], json.dumps(r["errors"])])
    plot(rows, os.path.join(a.out, "serve_nginx.png"))
    print(f"wrote {a.out}/results.json, results.csv, machine.txt, serve_nginx.png")


if __name__ == "__main__":
    main()
