#!/usr/bin/env python3
"""nginx (deploy/nginx/dllm.conf) in front of two `dllm serve` replicas, one of which is killed under load.

    python3 tests/serve/nginx_check.py --dllm build/dllm --model tests/data/models/tiny-llada-Q8_0.gguf \
        [--nginx /usr/sbin/nginx] [--keep]

Python 3 standard library only; loopback only (127.0.0.1), bounded in count and time (a hard deadline of
--deadline seconds, 120 by default: past it every process is killed and the check fails). Starts two replicas on
free ports and nginx with the template rendered into a temporary prefix, then:

  1. affinity: 64 conversation ids (X-Conversation-Id), each asked twice (GET /v1/models), land on one replica
     each (the access log's upstream address); 3 ids of each replica are kept for the load;
  2. Host: requests with foreign Host headers are answered (nginx passes Host: 127.0.0.1 to the replicas); an
     Origin equal to the edge's own is same-origin for the replicas, another is refused (403); /props is
     served, /metrics is not (404);
     edge limits: a body over 4 MiB (Content-Length) -> 413 JSON; an 9 KiB header -> 400 JSON; 16 requests held
     open (headers sent, body pending) -> the 17th request gets 429 JSON (limit_conn); a request line that
     never ends is closed after client_header_timeout (2 s here); 320 quick completion requests at once ->
     some 429 with JSON and Retry-After (limit_req), the rest the replica's own 400;
  3. load: 48 requests from 8 concurrent clients (streamed and whole chat and text completions, 6 of them
     dropping the connection after the first chunk of a long streamed answer), each in one of the 6
     conversations or in none; after 16 answers, while a request of the first replica's conversations is in
     flight, the first replica is SIGKILLed;
  4. after: once the dead replica's fail_timeout (2 s here) is over, 8 more requests (conversations of both
     replicas) and GET /health through nginx succeed, on the survivor, the first one after nginx tried the dead
     replica again (refused, passed on: upstream "dead, survivor" in the access log); the survivor exits 0 on
     SIGTERM.

Checks: no request hangs (every socket has a timeout, every request ends within 60 s); every request gets a
complete answer (a stream ends with `data: [DONE]`) or a clean error status with a JSON body (429, 502, 503),
except that a request in flight on the killed replica when it died may also see its stream cut; every request
started after the kill is answered completely, by the survivor; requests of one conversation go to one replica
while it lives, and the survivor's conversations never move; the survivor's /metrics count exactly the requests
the access log says it answered and the dropped streams it cancelled (so the disconnects reached it through
nginx, unbuffered); nginx's error log has no [alert]/[crit]/[emerg]. Prints "nginx_check: all passed" and exits
0; prints each failure and exits 1; exits 77 ("skipped: ...") when nginx is not installed.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "deploy", "nginx"))
import render  # noqa: E402

HOST = "127.0.0.1"
CLIENT_TIMEOUT = 30.0   # seconds per socket operation
REQUEST_BOUND = 60.0    # seconds per request, whole
LOAD_REQUESTS = 48
LOAD_CLIENTS = 8
KILL_AFTER = 16
SETTINGS = {"workers": 2, "limit_conn": 16, "limit_rate": 50, "limit_burst": 100, "header_timeout": "2s",
            "read_timeout": "60s", "max_fails": 1, "fail_timeout": "2s"}
PROMPTS = ["Hello", "Tell me a story", "What is two plus two?", "Write a haiku about the sea.", "Name three colours.",
           "Why is the sky blue?", "Count to five.", "Say something nice."]

failures = []
procs = []              # (name, Popen), all started in their own process group
cleanup_lock = threading.Lock()
cleaned = False


def fail(what):
    failures.append(what)
    print("FAIL:", what, flush=True)


def check(cond, what):
    if not cond:
        fail(what)
    return cond


def log(*a):
    print(*a, flush=True)


def free_ports(n):
    return render.free_ports(n, HOST)


def start(name, cmd, logpath):
    f = open(logpath, "wb")
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    f.close()
    procs.append((name, p))
    return p


def stop_all(quiet=False):
    """Ends every process started here (its whole process group): SIGTERM, then SIGKILL after a bound."""
    global cleaned
    with cleanup_lock:
        if cleaned:
            return
        cleaned = True
        for _, p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 15
        for name, p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                if not quiet:
                    log(f"{name} (pid {p.pid}) did not exit on SIGTERM: SIGKILL")
            try:
                os.killpg(p.pid, signal.SIGKILL)  # whatever is left of its group
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def get(port, path, headers=None, timeout=5.0):
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read(), dict(r.getheaders())
    finally:
        c.close()


def wait_health(port, proc, what, bound=60.0):
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before answering /health")
        try:
            if get(port, "/health", timeout=2.0)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer /health within {bound:.0f} s")


def metrics(port):
    text = get(port, "/metrics")[1].decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def completion_count(m):
    return sum(v for k, v in m.items() if k.startswith("dllm_requests_total{") and "completions\"" in k)


def access_log(prefix):
    entries = []
    try:
        with open(os.path.join(prefix, "access.log")) as f:
            for line in f:
                line = line.strip()
                if line:
                    entries.append(json.loads(line))
    except FileNotFoundError:
        pass
    return entries


def upstreams(entry):
    """The replicas nginx tried for a logged request, in order ("A, B" when it moved on; ":" separates internal
    redirects' groups)."""
    return [u.strip() for u in re.split(r"[,:]\s", entry.get("upstream", "")) if u.strip() and u.strip() != "-"]


def is_json_error(body):
    try:
        j = json.loads(body)
        return isinstance(j.get("error"), dict) and "message" in j["error"]
    except (ValueError, AttributeError):
        return False


def raw_exchange(port, data, timeout=5.0, shutdown_after=False):
    """Sends raw bytes, returns what comes back until the peer closes or a complete response head + body arrived."""
    s = socket.create_connection((HOST, port), timeout=timeout)
    try:
        s.sendall(data)
        if shutdown_after:
            s.shutdown(socket.SHUT_WR)
        buf = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            buf += chunk
            head, sep, body = buf.partition(b"\r\n\r\n")
            m = re.search(rb"content-length:\s*(\d+)", head, re.I)
            if sep and m and len(body) >= int(m.group(1)):
                break
        return buf
    finally:
        s.close()


def status_of(raw):
    m = re.match(rb"HTTP/1\.[01] (\d{3})", raw)
    return int(m.group(1)) if m else None


# --- one request of the load ------------------------------------------------------------------------------------


def one_request(port, spec):
    """Runs one request; returns (outcome, detail): ok, error (a clean 429/502/503 with a JSON body),
    disconnected (dropped after its first chunk, as meant), cut (the stream ended early), bad, hang."""
    headers = {"Content-Type": "application/json", "X-Request-Id": spec["id"]}
    if spec["conv"]:
        headers["X-Conversation-Id"] = spec["conv"]
    body = dict(spec["body"])
    c = http.client.HTTPConnection(HOST, port, timeout=CLIENT_TIMEOUT)
    try:
        c.request("POST", spec["path"], json.dumps(body), headers)
        r = c.getresponse()
        if r.status != 200:
            data = r.read()
            if r.status in (429, 502, 503) and is_json_error(data):
                return "error", f"{r.status}"
            return "bad", f"status {r.status}: {data[:200]!r}"
        if not body.get("stream"):
            data = r.read()
            j = json.loads(data)
            ch = j.get("choices") or []
            if ch and ch[0].get("finish_reason") in ("stop", "length"):
                return "ok", ""
            return "bad", f"whole answer without a finish_reason: {data[:200]!r}"
        done, finish, events = False, None, 0
        try:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                if done:
                    return "bad", "data after [DONE]"
                if line == "data: [DONE]":
                    done = True
                    continue
                j = json.loads(line[6:])
                events += 1
                for choice in j.get("choices", []):
                    finish = choice.get("finish_reason") or finish
                if spec["kind"] == "disconnect":
                    return "disconnected", f"after {events} chunk"
        except (http.client.IncompleteRead, ConnectionResetError, BrokenPipeError) as e:
            return "cut", f"{type(e).__name__} after {events} chunks"
        if done and finish in ("stop", "length"):
            return "ok", ""
        return "cut", f"stream ended without [DONE] after {events} chunks (finish {finish})"
    except socket.timeout:
        return "hang", f"no data for {CLIENT_TIMEOUT:.0f} s"
    except (ConnectionError, http.client.HTTPException, OSError, ValueError) as e:
        return "bad", f"{type(e).__name__}: {e}"
    finally:
        c.close()


def make_spec(i, convs):
    conv = None if i % 8 == 3 else convs[(i // 3) % len(convs)]
    prompt = PROMPTS[i % len(PROMPTS)]
    if i % 8 == 7:
        kind = "disconnect"  # a long streamed answer, dropped after its first chunk (the first step's canvas)
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": "Go on and on"}], "stream": True,
                                              "max_tokens": 256, "stream_options": {"include_canvas": True}}
    elif i % 2 == 0:
        kind = "stream"
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], "stream": True,
                                              "max_tokens": 32, "seed": i}
    elif i % 4 == 1:
        kind = "whole"
        path, body = "/v1/completions", {"prompt": prompt, "max_tokens": 32, "seed": i}
    else:
        kind = "whole"
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], "max_tokens": 32,
                                              "seed": i}
    return {"i": i, "id": f"nc-{i}", "conv": conv, "kind": kind, "path": path, "body": body}


# --- the phases ---------------------------------------------------------------------------------------------------


def phase_affinity(nport, prefix, replica_addrs):
    ids = [f"conv-{k:02d}" for k in range(64)]
    for _ in range(2):
        for cid in ids:
            st = get(nport, "/v1/models", {"X-Conversation-Id": cid, "X-Request-Id": f"aff-{cid}-{_}"})[0]
            check(st == 200, f"GET /v1/models for {cid}: {st}")
    time.sleep(0.2)
    where = {}
    for e in access_log(prefix):
        if e["request_id"].startswith("aff-"):
            where.setdefault(e["conversation"], set()).update(upstreams(e))
    by_replica = {a: [] for a in replica_addrs}
    for cid in ids:
        got = where.get(cid, set())
        if check(len(got) == 1, f"affinity: conversation {cid} went to {sorted(got)}, want one replica"):
            by_replica.setdefault(next(iter(got)), []).append(cid)
    log("affinity: " + ", ".join(f"{a}: {len(v)} conversations" for a, v in by_replica.items()))
    for a in replica_addrs:
        if len(by_replica.get(a, [])) < 3:
            raise RuntimeError(f"fewer than 3 of 64 conversations hash to {a}: {by_replica}")
    return {a: by_replica[a][:3] for a in replica_addrs}


def phase_host(nport):
    # The replicas see Host: 127.0.0.1 whatever the client sent (they refuse foreign names: DNS rebinding).
    for host in ("dllm.example.com", "127.0.0.1:1", "localhost"):
        st, body, _ = get(nport, "/v1/models", {"Host": host})
        check(st == 200, f"GET /v1/models with Host: {host} through nginx: {st} {body[:200]!r}")
    # A page served by the edge sends the edge's own origin: same-origin for the replicas too. Another origin is
    # passed on as it is, and the replicas refuse it (403, CSRF).
    for host, origin, want in (("dllm.example.com", "http://dllm.example.com", 200),
                               (f"{HOST}:{nport}", f"http://{HOST}:{nport}", 200),
                               ("dllm.example.com", "http://evil.example", 403)):
        st, body, _ = get(nport, "/v1/models", {"Host": host, "Origin": origin})
        check(st == want, f"GET /v1/models with Host: {host}, Origin: {origin} through nginx: {st}, want {want} "
                          f"{body[:200]!r}")
    st, body, _ = get(nport, "/props")
    check(st == 200, f"GET /props through nginx: {st} {body[:200]!r}")
    st, body, _ = get(nport, "/metrics")
    check(st == 404 and is_json_error(body), f"GET /metrics at the edge: {st}, want 404 (per replica only)")


def phase_limits(nport, prefix):
    # A body over 4 MiB, announced: 413 before the body is read.
    raw = raw_exchange(nport, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              b"Content-Length: 4194305\r\nConnection: close\r\n\r\n{")
    head, _, body = raw.partition(b"\r\n\r\n")
    check(status_of(raw) == 413 and is_json_error(body), f"body over 4 MiB: want 413 JSON, got {raw[:300]!r}")
    # A 9 KiB header line: 400.
    raw = raw_exchange(nport, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 +
                       b"\r\nConnection: close\r\n\r\n")
    head, _, body = raw.partition(b"\r\n\r\n")
    check(status_of(raw) == 400 and is_json_error(body), f"9 KiB header: want 400 JSON, got {raw[:300]!r}")

    # A request line that never ends: closed after client_header_timeout (2 s), in the background.
    slow = {}

    def slowloris():
        t0 = time.monotonic()
        try:
            raw = raw_exchange(nport, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ", timeout=10)
            slow["result"] = (time.monotonic() - t0, raw)
        except socket.timeout:
            slow["result"] = (time.monotonic() - t0, None)
    th = threading.Thread(target=slowloris, daemon=True)
    th.start()

    # limit_conn: 16 requests held open (headers sent, 10 body bytes of 100 pending), then a 17th: 429.
    held = []
    try:
        for k in range(SETTINGS["limit_conn"]):
            s = socket.create_connection((HOST, nport), timeout=5)
            held.append(s)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"X-Request-Id: held-%d\r\nContent-Length: 100\r\n\r\n{\"prompt\":" % k)
        got = None
        for _ in range(10):  # nginx needs a moment to read the held requests' headers
            time.sleep(0.1)
            st, body, hdrs = get(nport, "/v1/models")
            if st == 429:
                got = (st, body, hdrs)
                break
        check(got is not None and is_json_error(got[1]), f"limit_conn: the 17th request was not refused with 429 JSON")
    finally:
        for s in held:
            s.close()

    th.join(timeout=15)
    took, raw = slow.get("result", (None, None))
    check(took is not None and took < 6 and not raw,
          f"client_header_timeout: an unfinished request line was not closed within 6 s ({took}, {raw!r})")

    # limit_req: 320 quick completion requests (bodies the replica refuses at once) from 8 clients after the bucket
    # refilled: some are refused at the edge (429 JSON, Retry-After), the rest reach a replica (400).
    time.sleep(SETTINGS["limit_burst"] / SETTINGS["limit_rate"] + 0.5)
    statuses, lock, bad = {}, threading.Lock(), []

    def burst(k):
        c = http.client.HTTPConnection(HOST, nport, timeout=CLIENT_TIMEOUT)
        try:
            for j in range(40):
                c.request("POST", "/v1/completions", "{}", {"Content-Type": "application/json"})
                r = c.getresponse()
                body = r.read()
                with lock:
                    statuses[r.status] = statuses.get(r.status, 0) + 1
                    if r.status == 429 and not (is_json_error(body) and r.getheader("Retry-After")):
                        bad.append(body[:200])
                if r.getheader("Connection", "").lower() == "close":
                    c.close()
        except OSError as e:
            with lock:
                bad.append(f"{type(e).__name__}: {e}")
        finally:
            c.close()
    threads = [threading.Thread(target=burst, args=(k,), daemon=True) for k in range(8)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    took = time.monotonic() - t0
    log(f"limit_req: 320 requests in {took:.2f} s -> {dict(sorted(statuses.items()))}")
    check(not bad, f"limit_req: refusals without a JSON body and Retry-After, or errors: {bad[:3]}")
    # Within T seconds the edge lets burst + rate * T through: 320 requests see a 429 when T < 4.4 s.
    slow_machine = took >= (320 - SETTINGS["limit_burst"]) / SETTINGS["limit_rate"] * 0.9
    if slow_machine and not statuses.get(429):
        log("limit_req: the machine was too slow to exceed the rate (not a failure)")
    else:
        check(statuses.get(429, 0) > 0, "limit_req: no request was refused with 429")
    check(set(statuses) <= {400, 429}, f"limit_req: unexpected statuses {statuses}")
    check(sum(statuses.values()) == 320, f"limit_req: {sum(statuses.values())} answers of 320")
    # Let the bucket refill before the load (it fits in the burst).
    time.sleep(SETTINGS["limit_burst"] / SETTINGS["limit_rate"] + 0.5)


def phase_load(nport, specs, victim, conv_of_victim):
    """Runs the load; kills the victim replica after KILL_AFTER answers (while one of its requests is in flight, if
    that happens within 8 more answers). Returns (results, the time new requests were let in again after the kill,
    the requests in flight at the kill)."""
    todo = list(specs)
    lock = threading.Lock()
    gate = threading.Event()
    gate.set()
    inflight = {}
    results = {}
    state = {"done": 0, "kill_time": None}

    def client():
        while True:
            gate.wait(timeout=REQUEST_BOUND)
            with lock:
                if not gate.is_set():  # the kill began between the wait and here
                    continue
                if not todo:
                    return
                spec = todo.pop(0)
                t0 = time.monotonic()
                inflight[spec["i"]] = t0
            outcome, detail = one_request(nport, spec)
            t1 = time.monotonic()
            with lock:
                del inflight[spec["i"]]
                results[spec["i"]] = {"outcome": outcome, "detail": detail, "start": t0, "end": t1}
                state["done"] += 1

    def killer():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with lock:
                if state["done"] >= KILL_AFTER:
                    now = time.monotonic()
                    busy = [i for i, t0 in inflight.items() if specs[i]["conv"] in conv_of_victim
                            and specs[i]["kind"] != "disconnect" and now - t0 > 0.02]
                    if busy or state["done"] >= KILL_AFTER + 8:
                        break
            time.sleep(0.005)
        name, p = victim
        with lock:
            gate.clear()  # no new requests until the kill is over: each one is in flight now or starts after
            state["kill_time"] = time.monotonic()
            state["inflight_at_kill"] = sorted(inflight)
            done = state["done"]
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        log(f"killed {name} (SIGKILL) after {done} answers; in flight: "
            f"{[specs[i]['id'] for i in state['inflight_at_kill']]}")
        time.sleep(0.5)
        with lock:
            state["after_kill"] = time.monotonic()
        gate.set()

    kt = threading.Thread(target=killer, daemon=True)
    kt.start()
    t0 = time.monotonic()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(LOAD_CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=REQUEST_BOUND * 3)
        check(not t.is_alive(), "a load client did not finish")
    kt.join(timeout=30)
    log(f"load: {len(results)} requests in {time.monotonic() - t0:.1f} s")
    return results, state["after_kill"], state.get("inflight_at_kill", [])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dllm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--nginx", default="/usr/sbin/nginx")
    ap.add_argument("--deadline", type=float, default=120.0, help="hard limit of the whole check, seconds")
    ap.add_argument("--keep", action="store_true", help="keep the temporary prefix (logs) and print its path")
    a = ap.parse_args()

    nginx = a.nginx if os.path.sep in a.nginx else shutil.which(a.nginx)
    if not nginx or not os.access(nginx, os.X_OK):
        print(f"nginx_check: skipped: nginx is not installed ({a.nginx} not found; apt-get install nginx-light)")
        return 77
    for path, what in ((a.dllm, "--dllm"), (a.model, "--model")):
        if not os.path.exists(path):
            print(f"nginx_check: {what} {path}: no such file")
            return 1

    t_start = time.monotonic()
    prefix = tempfile.mkdtemp(prefix="dllm-nginx-check-")

    def watchdog():
        print(f"FAIL: the check ran past its deadline of {a.deadline:.0f} s: killing everything", flush=True)
        stop_all(quiet=True)
        if not a.keep:
            shutil.rmtree(prefix, ignore_errors=True)
        os._exit(1)
    timer = threading.Timer(a.deadline, watchdog)
    timer.daemon = True
    timer.start()

    try:
        p1, p2, nport = free_ports(3)
        replicas = []
        for k, port in enumerate((p1, p2)):
            cmd = [a.dllm, "serve", "--model", a.model, "--port", str(port), "--max-tokens", "16",
                   "--block-length", "8", "--threads", "1"]
            p = start(f"replica{k}", cmd, os.path.join(prefix, f"replica{k}.log"))
            replicas.append((f"replica {HOST}:{port}", p, port))
        render.write(prefix, f"{HOST}:{nport}", [f"{HOST}:{p1}", f"{HOST}:{p2}"], **SETTINGS)
        user = "user root;" if os.geteuid() == 0 else ""
        r = subprocess.run(render.command(nginx, prefix, user) + ["-t", "-q"], capture_output=True, text=True,
                           timeout=30)
        if r.returncode:
            fail(f"nginx -t: {r.stderr.strip()}")
            return 1
        ngx = start("nginx", render.command(nginx, prefix, user), os.path.join(prefix, "nginx.out"))
        for name, p, port in replicas:
            wait_health(port, p, name)
        wait_health(nport, ngx, "nginx")
        log(f"up in {time.monotonic() - t_start:.1f} s: nginx on {HOST}:{nport}, replicas on {p1} and {p2}")

        addr = [f"{HOST}:{p1}", f"{HOST}:{p2}"]
        convs_of = phase_affinity(nport, prefix, addr)
        phase_host(nport)
        phase_limits(nport, prefix)

        victim_addr, survivor_addr = addr[0], addr[1]
        victim = (replicas[0][0], replicas[0][1])
        survivor_port = p2
        convs = [convs_of[victim_addr][0], convs_of[survivor_addr][0], convs_of[victim_addr][1],
                 convs_of[survivor_addr][1], convs_of[victim_addr][2], convs_of[survivor_addr][2]]
        specs = [make_spec(i, convs) for i in range(LOAD_REQUESTS)]
        m0 = metrics(survivor_port)
        results, kill_time, inflight_at_kill = phase_load(nport, specs, victim, set(convs_of[victim_addr]))

        # After the kill: more requests of both replicas' conversations, and /health, through nginx. Once the dead
        # replica's fail_timeout is over, nginx tries it again with the next request of its conversations: refused,
        # that request goes on to the survivor (proxy_next_upstream error), the client sees nothing.
        time.sleep(2.5)  # past fail_timeout since the load's last request (the last that could mark it failed)
        after = [make_spec(100 + k, convs) for k in range(8)]
        after[0]["conv"] = convs[0]
        for s in after:
            if s["kind"] == "disconnect":
                s["kind"], s["body"] = "stream", {**s["body"], "max_tokens": 32, "stream_options": {}}
            if s["conv"] is None:
                s["conv"] = convs[0]
            t0 = time.monotonic()
            outcome, detail = one_request(nport, s)
            results[s["i"]] = {"outcome": outcome, "detail": detail, "start": t0, "end": time.monotonic()}
            specs.append(s)
        st = get(nport, "/health")[0]
        check(st == 200, f"GET /health through nginx after the kill: {st}")
        time.sleep(0.3)
        entries = {e["request_id"]: e for e in access_log(prefix)}
        route = [(s["id"], upstreams(entries[s["id"]]) if s["id"] in entries else None) for s in after]
        retried = [i for i, ups in route if ups == [victim_addr, survivor_addr]]
        check(len(retried) >= 1, f"after the kill: no request was passed on from the dead replica to the survivor "
                                 f"({route})")

        # --- the checks ---
        time.sleep(0.3)
        entries = {e["request_id"]: e for e in access_log(prefix)}
        spec_of = {s["i"]: s for s in specs}
        counts = {}
        for i, res in sorted(results.items()):
            s = spec_of[i]
            counts[res["outcome"]] = counts.get(res["outcome"], 0) + 1
            e = entries.get(s["id"])
            ups = upstreams(e) if e else []
            what = f"request {s['id']} ({s['kind']} {s['path']}, conversation {s['conv']}, via {ups})"
            check(e is not None, f"{what}: no access log line")
            took = res["end"] - res["start"]
            check(took < REQUEST_BOUND, f"{what}: took {took:.1f} s")
            started_before_kill = res["start"] < kill_time
            on_victim = bool(ups) and ups[0] == victim_addr and len(ups) == 1
            if res["outcome"] in ("bad", "hang"):
                fail(f"{what}: {res['outcome']}: {res['detail']}")
            elif res["outcome"] in ("cut", "error"):
                if not (i in inflight_at_kill and on_victim):
                    fail(f"{what}: {res['outcome']} {res['detail']}, but it was not in flight on the killed replica")
            elif res["outcome"] == "disconnected":
                check(s["kind"] == "disconnect", f"{what}: disconnected")
            elif res["outcome"] == "ok":
                check(s["kind"] != "disconnect", f"{what}: not dropped after its first chunk")
            if not started_before_kill:
                check(res["outcome"] in ("ok", "disconnected"),
                      f"{what}: started after the kill, {res['outcome']} {res['detail']}")
                check(bool(ups) and ups[-1] == survivor_addr, f"{what}: started after the kill, not on the survivor")
            # Affinity: one replica per conversation while it lives; the survivor's never move.
            if s["conv"] in convs_of[survivor_addr]:
                check(ups == [survivor_addr], f"{what}: a survivor's conversation went elsewhere")
            elif s["conv"] in convs_of[victim_addr] and started_before_kill and i not in inflight_at_kill:
                check(ups == [victim_addr],
                      f"{what}: a conversation of the first replica went elsewhere before the kill")
        log("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) +
            f" (in flight at the kill: {len(inflight_at_kill)})")

        # The survivor's own counts match the access log: every request it answered, every stream it cancelled.
        on_survivor = [s for s in specs if entries.get(s["id"]) and upstreams(entries[s["id"]])[-1:] == [survivor_addr]]
        want_requests = len(on_survivor)
        want_cancelled = sum(1 for s in on_survivor if results[s["i"]]["outcome"] == "disconnected")
        deadline = time.monotonic() + 15
        while True:
            m = metrics(survivor_port)
            got_requests = completion_count(m) - completion_count(m0)
            got_cancelled = m.get("dllm_sequences_cancelled_total", 0) - m0.get("dllm_sequences_cancelled_total", 0)
            idle = m.get("dllm_batch_sequences", 1) == 0 and m.get("dllm_queue_length", 1) == 0
            if (got_requests == want_requests and got_cancelled == want_cancelled and idle) or \
                    time.monotonic() > deadline:
                break
            time.sleep(0.1)
        log(f"survivor: {got_requests:.0f} completion requests, {got_cancelled:.0f} cancelled (access log: "
            f"{want_requests}, {want_cancelled} dropped)")
        check(got_requests == want_requests, f"survivor's /metrics counts {got_requests:.0f} completion requests, "
                                             f"the access log {want_requests}")
        check(got_cancelled == want_cancelled, f"survivor cancelled {got_cancelled:.0f} sequences, "
                                               f"{want_cancelled} clients dropped their streams there")
        check(idle, "the survivor's batch and queue emptied")

        with open(os.path.join(prefix, "error.log"), errors="replace") as f:
            errlog = f.read()
        serious = [ln for ln in errlog.splitlines() if re.search(r"\[(alert|crit|emerg)\]", ln)]
        check(not serious, f"nginx error log: {serious[:5]}")
        kinds = {}
        for ln in errlog.splitlines():
            m = re.search(r"\[error\] \d+#\d+: \*\d+ ([^,(]+)", ln)
            if m:
                kinds[m.group(1).strip()] = kinds.get(m.group(1).strip(), 0) + 1
        log(f"nginx [error] lines: {kinds}")

        # The survivor drains and exits 0 on SIGTERM.
        _, sp, _ = replicas[1]
        os.killpg(sp.pid, signal.SIGTERM)
        try:
            rc = sp.wait(timeout=15)
            check(rc == 0, f"the survivor exited with status {rc} on SIGTERM")
        except subprocess.TimeoutExpired:
            fail("the survivor did not exit within 15 s of SIGTERM")
    except Exception as e:  # noqa: BLE001: any failure of the harness itself is a failure of the check
        fail(f"{type(e).__name__}: {e}")
    finally:
        timer.cancel()
        stop_all()
        if failures:
            for name in ("replica0.log", "replica1.log", "nginx.out", "error.log"):
                path = os.path.join(prefix, name)
                if os.path.exists(path):
                    with open(path, errors="replace") as f:
                        tail = f.read()[-1500:]
                    log(f"--- {name} (end) ---\n{tail}")
        if a.keep:
            log(f"kept {prefix}")
        else:
            shutil.rmtree(prefix, ignore_errors=True)

    log(f"run time {time.monotonic() - t_start:.1f} s")
    if failures:
        print(f"nginx_check: {len(failures)} failures")
        return 1
    print("nginx_check: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
