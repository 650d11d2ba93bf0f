#!/usr/bin/env python3
"""Fills deploy/nginx/dllm.conf's @NAME@ markers and writes a ready nginx.conf (Python 3 standard library only).

    python3 deploy/nginx/render.py --prefix /srv/dllm-edge --listen 127.0.0.1:8080 \
        --replica 127.0.0.1:8081 --replica 127.0.0.1:8082 [--limit-conn 16] [--limit-rate 10] [--limit-burst 20]

writes PREFIX/nginx.conf (and creates PREFIX/tmp), then prints the command that runs nginx in the foreground.
tests/serve/nginx_check.py and bench/serve/bench_nginx.py import render() from here.
"""
import argparse
import os
import re
import socket
import sys

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dllm.conf")

DEFAULTS = {
    "workers": "auto",
    "limit_conn": 16,        # requests in progress per client address
    "limit_rate": 10,        # completion requests / s per client address, sustained
    "limit_burst": 20,       # completion requests per client address let through at once above the rate
    "header_timeout": "10s",
    "read_timeout": "300s",
    "max_fails": 1,
    "fail_timeout": "10s",
}


def free_ports(n, host="127.0.0.1"):
    """n distinct free TCP ports on host (bound at once, then released): for replicas and the edge."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def render(prefix, listen, replicas, **settings):
    """The configuration text: prefix (an absolute folder), listen ("127.0.0.1:8080"), replicas (["127.0.0.1:8081",
    ...]); settings override DEFAULTS."""
    unknown = set(settings) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown settings: {sorted(unknown)}")
    if not os.path.isabs(prefix):
        raise ValueError("the prefix must be an absolute path")
    if not replicas:
        raise ValueError("at least one replica")
    s = dict(DEFAULTS, **settings)
    servers = "\n        ".join(f"server {r} max_fails={s['max_fails']} fail_timeout={s['fail_timeout']};"
                                for r in replicas)
    values = {"PREFIX": prefix.rstrip("/"), "LISTEN": listen, "SERVERS": servers, "WORKERS": s["workers"],
              "LIMIT_CONN": s["limit_conn"], "LIMIT_RATE": s["limit_rate"], "LIMIT_BURST": s["limit_burst"],
              "HEADER_TIMEOUT": s["header_timeout"], "READ_TIMEOUT": s["read_timeout"]}
    with open(TEMPLATE) as f:
        text = f.read()
    fill = lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0)  # noqa: E731
    # Comment lines keep their markers (the template's header documents them).
    text = "".join(line if line.lstrip().startswith("#") else re.sub(r"@([A-Z_]+)@", fill, line)
                   for line in text.splitlines(keepends=True))
    left = re.findall(r"@[A-Z_]+@", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    if left:
        raise ValueError(f"markers left unfilled: {left}")
    return text


def write(prefix, listen, replicas, **settings):
    """Writes PREFIX/nginx.conf and creates PREFIX/tmp; returns the configuration's path."""
    os.makedirs(os.path.join(prefix, "tmp"), exist_ok=True)
    path = os.path.join(prefix, "nginx.conf")
    with open(path, "w") as f:
        f.write(render(prefix, listen, replicas, **settings))
    return path


def command(nginx, prefix, extra_globals=""):
    """The command line that runs nginx in the foreground with this prefix (as root, workers run as root only
    when extra_globals says `user root;`: pass another user in production)."""
    g = "daemon off; master_process on;" + (" " + extra_globals if extra_globals else "")
    return [nginx, "-p", prefix + "/", "-e", os.path.join(prefix, "error.log"),
            "-c", os.path.join(prefix, "nginx.conf"), "-g", g]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--listen", required=True)
    ap.add_argument("--replica", action="append", required=True, help="HOST:PORT of a dllm serve (repeat)")
    ap.add_argument("--nginx", default="/usr/sbin/nginx")
    for k, v in DEFAULTS.items():
        ap.add_argument("--" + k.replace("_", "-"), default=v, type=type(v))
    a = ap.parse_args()
    prefix = os.path.abspath(a.prefix)
    settings = {k: getattr(a, k) for k in DEFAULTS}
    path = write(prefix, a.listen, a.replica, **settings)
    print(f"wrote {path}", file=sys.stderr)
    user = " user www-data;" if os.geteuid() == 0 else ""
    print(" ".join(f"'{c}'" if " " in c else c for c in command(a.nginx, prefix, user.strip())))


if __name__ == "__main__":
    main()
