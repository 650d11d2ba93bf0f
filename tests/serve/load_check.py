#!/usr/bin/env python3
"""Load on a live `dllm serve` (run by tests/test_serve.cpp), loopback only, bounded in count and time.

32 streaming clients (8 different requests, 4 each) plus 8 that disconnect after their first chunk, all at
once. Every completed answer must equal its single-run result (`dllm run --prompts-file` with the same
requests); the 8 disconnected sequences must be cancelled (dllm_sequences_cancelled_total); the server's
resident memory must come back to its idle level (after a warm-up round, within 32 MiB); and it must keep
serving afterwards. Prints "load_check: all passed"; exits 1 on a failure.
"""
import argparse
import concurrent.futures as cf
import json
import re
import subprocess
import sys
import time
import urllib.request

import openai

PROMPTS = ["Hello", "Tell me a story", "What is two plus two?", "Write a haiku about the sea.",
           "Name three colours.", "Why is the sky blue?", "Count to five.", "Say something nice."]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return -1


def metrics(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def stream_one(client, model, prompt, seed):
    text, finish = "", None
    for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                stream=True, seed=seed, temperature=0.5):
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    return text, finish


def disconnect_one(client, model):
    # A long answer, dropped after its first chunk (the first step's canvas): the server must cancel it.
    s = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Go on and on"}],
                                       stream=True, max_tokens=256, stream_options={"include_canvas": True})
    for _ in s:
        break
    s.response.close()
    return True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--dllm", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--pid", type=int, required=True)
    a = p.parse_args()
    client = openai.OpenAI(base_url=a.url + "/v1", api_key="none", max_retries=0, timeout=120)
    model = client.models.list().data[0].id

    # Single-run results: the same requests through `dllm run --prompts-file` (temperature 0.5, seeds).
    lines = "".join(json.dumps({"prompt": pr, "seed": i, "temperature": 0.5}) + "\n" for i, pr in enumerate(PROMPTS))
    r = subprocess.run([a.dllm, "run", "--model", a.model, "--max-tokens", "16", "--block-length", "8",
                        "--prompts-file", "-", "--json"], input=lines, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        print(r.stderr)
        return 1
    ref = [json.loads(line)["text"] for line in r.stdout.splitlines()]

    # Warm-up (every code path once, 8 at a time), then the idle level.
    with cf.ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda i: stream_one(client, model, PROMPTS[i], i), range(8)))
    time.sleep(0.5)
    idle = rss(a.pid)
    cancelled0 = metrics(a.url).get("dllm_sequences_cancelled_total", 0)

    t0 = time.time()
    with cf.ThreadPoolExecutor(40) as ex:
        streams = [ex.submit(stream_one, client, model, PROMPTS[i % 8], i % 8) for i in range(32)]
        drops = [ex.submit(disconnect_one, client, model) for _ in range(8)]
        for i, f in enumerate(streams):
            text, finish = f.result(timeout=180)
            check(text == ref[i % 8], f"client {i}: {text!r} != single run {ref[i % 8]!r}")
            check(finish in ("stop", "length"), f"client {i}: finish_reason {finish}")
        for f in drops:
            f.result(timeout=180)
    elapsed = time.time() - t0
    print(f"load: 32 streams + 8 disconnects in {elapsed:.1f} s")
    check(elapsed < 150, f"load took {elapsed:.0f} s")

    # The dropped sequences are cancelled, and the batch empties.
    deadline = time.time() + 60
    while time.time() < deadline:
        m = metrics(a.url)
        if m.get("dllm_sequences_cancelled_total", 0) - cancelled0 >= 8 and m.get("dllm_batch_sequences", 1) == 0 \
                and m.get("dllm_queue_length", 1) == 0:
            break
        time.sleep(0.1)
    m = metrics(a.url)
    check(m.get("dllm_sequences_cancelled_total", 0) - cancelled0 == 8,
          f"cancelled sequences: {m.get('dllm_sequences_cancelled_total', 0) - cancelled0}, want 8")
    check(m.get("dllm_batch_sequences", 1) == 0 and m.get("dllm_queue_length", 1) == 0, "the batch emptied")

    time.sleep(0.5)
    after = rss(a.pid)
    print(f"resident memory: idle {idle / 2**20:.1f} MiB, after the load {after / 2**20:.1f} MiB")
    check(after <= idle + 32 * 2**20, f"memory did not return to its idle level: {idle} -> {after} bytes")

    # Still serving, with the same answers.
    text, _ = stream_one(client, model, PROMPTS[0], 0)
    check(text == ref[0], "an answer after the load")

    if failures:
        print(f"load_check: {len(failures)} failures")
        return 1
    print("load_check: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
