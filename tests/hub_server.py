#!/usr/bin/env python3
"""A fake Hugging Face hub on 127.0.0.1 for dllm's download tests (tests/test_hub_pull.cpp).

It serves the shapes dllm reads from the real hub:
  GET /api/models/OWNER/NAME/tree/main?recursive=true  -> [{"type","oid","size","path","lfs":{"oid","size",...}}]
      (paginated with a Link: <...>; rel="next" header when the page_size knob is set)
  GET /api/models/OWNER/NAME                           -> {"id", "siblings": [{"rfilename","size","lfs":{...}}]}
  GET /OWNER/NAME/resolve/main/PATH                    -> 302 to /_cdn/OWNER/NAME/PATH, like the hub's CDN redirect
  GET /_cdn/OWNER/NAME/PATH                            -> the bytes, with Range support (206 + Content-Range)
The files are the tiny GGUF fixtures of --models; their sha256 are computed here with hashlib.

Knobs, set by the tests between requests:
  GET /_control/set?KEY=VALUE&...   GET /_control/reset   GET /_control/log (the requests seen, as JSON)
  api_status=N     the file listing answers N (401, 403, 404, 500...)
  api_html=1       the file listing answers with an HTML page
  gated=1          the file listing answers 403 with X-Error-Code: GatedRepo
  file_status=N    file downloads answer N
  html=1           file downloads answer 200 with an HTML page (text/html)
  html_octet=1     the same page, labelled application/octet-stream
  bad_sha=1        the listing publishes a wrong sha256 for every file
  huge=1           the listing publishes a size far larger than any disk
  nosha=1          the listing publishes no sha256 (no "lfs" object), only sizes
  nosize=1         the listing publishes neither sizes nor sha256
  cut=N            downloads send the first N bytes of what was asked, then drop the connection
  cut_times=K      only the next K downloads are cut (default: all)
  slow=B           downloads send about B bytes per second
  trickle=1        downloads send one byte every half second (a stalled server)
  norange=1        downloads ignore Range requests (200 with the whole file)
  page_size=N      the tree listing returns N entries per page
  cdn_host=H       the resolve redirect points at host H (same port), e.g. localhost
  next_host=H      the listing's next-page link points at host H (same port), another origin
  next_url=U       the listing's next-page link is U, whatever it is (with page_size)
  redirect=file    the resolve redirect points at file:///etc/passwd
  redirect=loop    the resolve redirect points at itself, for ever
The repo test/private-GGUF needs "Authorization: Bearer hf_test_token".

Usage: hub_server.py --models DIR [--port N]. Prints "PORT <n>" once listening; exits when stdin closes.
"""
import argparse
import hashlib
import json
import os
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = "hf_test_token"
README = b"# A test repo\n\nNot a model: a small file kept in git, so the hub publishes no sha256 for it.\n"

# repo -> {path in the repo: fixture file name, or bytes for a small non-LFS file}
REPOS = {
    "test/tiny-llada-GGUF": {
        "README.md": README,
        "tiny-llada-Q4_K_M.gguf": "tiny-llada-Q4_K_M.gguf",
        "tiny-llada-Q8_0.gguf": "tiny-llada-Q8_0.gguf",
        "tiny-llada-F16.gguf": "tiny-llada-F16.gguf",
    },
    "test/tiny-dream-GGUF": {
        "tiny-dream-Q4_K_M.gguf": "tiny-dream-Q4_K_M.gguf",
        "tiny-dream-Q8_0.gguf": "tiny-dream-Q8_0.gguf",
    },
    # The same quant twice (in two folders), and a default-less repo.
    "test/ambiguous-GGUF": {
        "a/model-Q4_K_M.gguf": "tiny-llada-Q4_K_M.gguf",
        "b/model-Q4_K_M.gguf": "tiny-dream-Q4_K_M.gguf",
        "model-Q8_0.gguf": "tiny-llada-Q8_0.gguf",
    },
    "test/no-default-GGUF": {
        "model-Q8_0.gguf": "tiny-llada-Q8_0.gguf",
        "model-F16.gguf": "tiny-llada-F16.gguf",
    },
    "test/single-GGUF": {"only.gguf": "tiny-dream-Q4_K_M.gguf"},
    "test/private-GGUF": {"tiny-llada-Q4_K_M.gguf": "tiny-llada-Q4_K_M.gguf"},
    # A legal (valid UTF-8, no control byte) name with a right-to-left override, U+202E.
    "test/bidi-GGUF": {"evil\u202eggu.Q8_0.gguf": "tiny-llada-Q8_0.gguf"},
}

HTML_PAGE = (b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head>"
             b"<body><p>Please sign in to continue.</p></body></html>\n")


class State:
    def __init__(self, models_dir):
        self.models_dir = models_dir
        self.lock = threading.Lock()
        self.knobs = {}
        self.log = []
        self.cuts_done = 0
        self._sha = {}

    def content(self, source):
        if isinstance(source, bytes):
            return source
        with open(os.path.join(self.models_dir, source), "rb") as f:
            return f.read()

    def sha256(self, source):
        key = source if isinstance(source, str) else hashlib.sha1(source).hexdigest()
        if key not in self._sha:
            self._sha[key] = hashlib.sha256(self.content(source)).hexdigest()
        return self._sha[key]

    def knob(self, name, default=None):
        with self.lock:
            return self.knobs.get(name, default)

    def entries(self, repo):
        out = []
        for path, source in sorted(REPOS[repo].items()):
            size = len(self.content(source))
            e = {"type": "file", "oid": hashlib.sha1(b"blob %d\0" % size + self.content(source)).hexdigest(),
                 "size": size, "path": path}
            if isinstance(source, str):  # LFS files carry their sha256 as the LFS object id
                sha = self.sha256(source)
                if self.knob("bad_sha"):
                    sha = hashlib.sha256(b"not the file").hexdigest()
                if self.knob("huge"):
                    size = 10 ** 15
                e["size"] = size
                e["lfs"] = {"oid": sha, "size": size, "pointerSize": 134}
            if self.knob("nosha") or self.knob("nosize"):
                e.pop("lfs", None)
            if self.knob("nosize"):
                e.pop("size", None)
            out.append(e)
        return out


class Handler(BaseHTTPRequestHandler):
    server_version = "fake-hub/1.0"

    def log_message(self, *args):  # quiet
        pass

    @property
    def state(self):
        return self.server.state

    # ---- responses ----
    def send_json(self, obj, status=200, headers=None):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def send_error_status(self, status, code, message):
        self.send_json({"error": message}, status, {"X-Error-Code": code, "X-Error-Message": message})

    def send_html(self, content_type="text/html; charset=utf-8"):
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(HTML_PAGE)))
        self.end_headers()
        self.wfile.write(HTML_PAGE)

    def authorized(self, repo):
        return repo != "test/private-GGUF" or self.headers.get("Authorization") == "Bearer " + TOKEN

    # ---- routes ----
    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        path = urllib.parse.unquote(url.path)
        if path.startswith("/_control/"):
            return self.control(path[len("/_control/"):], query)
        with self.state.lock:
            self.state.log.append({"path": path, "query": url.query, "range": self.headers.get("Range", ""),
                                   "auth": self.headers.get("Authorization", ""), "host": self.headers.get("Host", "")})
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            return self.api(parts[2] + "/" + parts[3], parts[4:], query)
        if parts[0] == "_cdn" and len(parts) >= 4:
            return self.cdn(parts[1] + "/" + parts[2], "/".join(parts[3:]))
        if len(parts) >= 5 and parts[2] == "resolve":
            return self.resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]))
        self.send_error_status(404, "EntryNotFound", "no such page")

    def control(self, what, query):
        with self.state.lock:
            if what == "reset":
                self.state.knobs, self.state.log, self.state.cuts_done = {}, [], 0
            elif what == "set":
                for k, v in query.items():
                    self.state.knobs[k] = int(v) if v.lstrip("-").isdigit() else v
            elif what == "log":
                return self.send_json(self.state.log)
        self.send_json({"ok": True})

    def api(self, repo, rest, query):
        if self.state.knob("api_status"):
            return self.send_error_status(int(self.state.knob("api_status")), "Forced", "forced by a test knob")
        if self.state.knob("api_html"):
            return self.send_html()
        if self.state.knob("gated"):
            return self.send_error_status(403, "GatedRepo", "Access to model %s is restricted" % repo)
        if repo not in REPOS:
            return self.send_error_status(404, "RepoNotFound", "Repository not found")
        if not self.authorized(repo):
            return self.send_error_status(401, "RepoNotFound", "Invalid credentials in Authorization header")
        entries = self.state.entries(repo)
        if rest[:2] == ["tree", "main"]:
            size = int(self.state.knob("page_size", 0)) or len(entries) or 1
            start = int(query.get("cursor", "0"))
            headers = {}
            if start + size < len(entries):
                host = self.headers.get("Host")
                if self.state.knob("next_host"):
                    host = "%s:%d" % (self.state.knob("next_host"), self.server.server_address[1])
                nxt = "http://%s/api/models/%s/tree/main?recursive=true&cursor=%d" % (host, repo, start + size)
                if self.state.knob("next_url"):
                    nxt = self.state.knob("next_url")
                headers["Link"] = '<%s>; rel="next"' % nxt
            return self.send_json(entries[start:start + size], 200, headers)
        if not rest:
            siblings = []
            for e in entries:
                s = {"rfilename": e["path"], "size": e["size"]}
                if "lfs" in e:
                    s["lfs"] = {"sha256": e["lfs"]["oid"], "size": e["lfs"]["size"], "pointerSize": 134}
                siblings.append(s)
            return self.send_json({"id": repo, "modelId": repo, "sha": "0" * 40, "siblings": siblings})
        self.send_error_status(404, "EntryNotFound", "no such API")

    def resolve(self, repo, revision, path):
        if repo not in REPOS:
            return self.send_error_status(404, "RepoNotFound", "Repository not found")
        if not self.authorized(repo):
            return self.send_error_status(401, "RepoNotFound", "Invalid credentials in Authorization header")
        if revision != "main" or path not in REPOS[repo]:
            return self.send_error_status(404, "EntryNotFound", "Entry not found")
        if self.state.knob("file_status"):
            return self.send_error_status(int(self.state.knob("file_status")), "Forced", "forced by a test knob")
        host = self.headers.get("Host")
        if self.state.knob("cdn_host"):
            host = "%s:%d" % (self.state.knob("cdn_host"), self.server.server_address[1])
        location = "http://%s/_cdn/%s/%s" % (host, repo, urllib.parse.quote(path))
        if self.state.knob("redirect") == "file":
            location = "file:///etc/passwd"
        elif self.state.knob("redirect") == "loop":
            location = "http://%s%s" % (host, self.path)
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.send_header("X-Repo-Commit", "0" * 40)
        self.end_headers()

    def cdn(self, repo, path):
        if repo not in REPOS or path not in REPOS[repo]:
            return self.send_error_status(404, "EntryNotFound", "Entry not found")
        if self.state.knob("html"):
            return self.send_html()
        if self.state.knob("html_octet"):
            return self.send_html("application/octet-stream")
        data = self.state.content(REPOS[repo][path])
        start = 0
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes=") and not self.state.knob("norange"):
            start = int(rng[len("bytes="):].split("-")[0])
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % len(data))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        limit = len(body)
        with self.state.lock:
            cut, times = self.state.knobs.get("cut"), self.state.knobs.get("cut_times", -1)
            if cut is not None and (times < 0 or self.state.cuts_done < times):
                limit = min(limit, int(cut))
                self.state.cuts_done += 1
        rate = self.state.knob("slow")
        if self.state.knob("trickle"):
            try:
                for at in range(0, min(limit, 60)):
                    self.wfile.write(body[at:at + 1])
                    self.wfile.flush()
                    time.sleep(0.5)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        try:
            chunk = 16384
            for at in range(0, limit, chunk):
                self.wfile.write(body[at:min(at + chunk, limit)])
                if rate:
                    self.wfile.flush()
                    time.sleep(chunk / float(rate))
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return
        if limit < len(body):
            self.close_connection = True
            self.connection.shutdown(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True, help="folder of the GGUF fixtures")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.state = State(args.models)
    print("PORT %d" % server.server_address[1], flush=True)

    def watch_stdin():  # the test that started us is gone: stop
        try:
            while sys.stdin.read(4096):
                pass
        finally:
            os._exit(0)

    threading.Thread(target=watch_stdin, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
