#!/usr/bin/env python3
"""The page at / of a live `dllm serve` in headless Chromium, driven over the DevTools protocol (run by
tests/test_serve.cpp; standard library only: the protocol goes over --remote-debugging-pipe, no websocket).

Loads /, types the prompt into the text box, presses Generate, waits until the page says it is done (at most
--timeout s), saves a screenshot, and prints one JSON line with what the page shows: the state, the canvas's
pieces and masks, the answer's text, how many canvas updates it drew, the most re-noised positions it showed at
once (DiffusionGemma), the sampler the page was served for, the visible legend's text, and whether the page
still fits its window's width (--width, e.g. a phone's 375 px) with a long unbroken answer put in.
"""
import argparse
import base64
import json
import os
import subprocess
import sys
import time


class Browser:
    def __init__(self, binary, profile, width):
        r_chrome, w_ours = os.pipe()  # our commands -> Chromium's fd 3
        r_ours, w_chrome = os.pipe()  # Chromium's fd 4 -> our replies
        for fd in (r_chrome, w_chrome):
            os.set_inheritable(fd, True)
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--remote-debugging-pipe",
             "--user-data-dir=" + profile, "--window-size=%d,900" % width, "about:blank"],
            close_fds=False, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, preexec_fn=lambda: (os.dup2(r_chrome, 3), os.dup2(w_chrome, 4)))
        os.close(r_chrome)
        os.close(w_chrome)
        self.w, self.r = w_ours, r_ours
        self.buf = b""
        self.next_id = 0

    def call(self, method, params=None, session=None):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self.buf:
                chunk = os.read(self.r, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the pipe")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def close(self):
        try:
            self.call("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--chromium", required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-tokens", type=int, required=True)
    p.add_argument("--out", required=True)  # the test's output folder
    p.add_argument("--timeout", type=float, default=90)
    p.add_argument("--width", type=int, default=1000)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    b = Browser(a.chromium, os.path.join(a.out, "chromium-profile"), a.width)
    try:
        target = b.call("Target.createTarget", {"url": a.url + "/"})["targetId"]
        s = b.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

        def js(expr):
            r = b.call("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True}, s)
            return r["result"].get("value")

        deadline = time.time() + a.timeout
        while not js("document.readyState === 'complete' && document.getElementById('send') !== null"):
            if time.time() > deadline:
                raise RuntimeError("the page did not load")
            time.sleep(0.05)
        # A person's actions: type the prompt, set the length, press Generate; count the canvas redraws.
        js("""(() => {
            window.__draws = 0;
            window.__noise = 0;
            new MutationObserver(() => {
                window.__draws++;
                window.__noise = Math.max(window.__noise, document.querySelectorAll('#canvas span.noise').length);
            }).observe(document.getElementById('canvas'),
                {subtree: true, childList: true, characterData: true, attributes: true});
            document.getElementById('prompt').value = %s;
            document.getElementById('max_tokens').value = %d;
            document.getElementById('send').click();
        })()""" % (json.dumps(a.prompt), a.max_tokens))
        state = None
        while time.time() < deadline:
            state = js("document.body.dataset.state")
            if state in ("done", "error"):
                break
            time.sleep(0.05)
        time.sleep(1.5)  # the last committed tokens finish fading in
        if a.width != 1000:
            b.call("Emulation.setDeviceMetricsOverride",
                   {"width": a.width, "height": 900, "deviceScaleFactor": 1, "mobile": True}, s)
        shot = b.call("Page.captureScreenshot", {"format": "png"}, s)["data"]
        with open(os.path.join(a.out, "serve_page%s.png" % ("" if a.width == 1000 else "-%d" % a.width)), "wb") as f:
            f.write(base64.b64decode(shot))
        seen = js("""(() => ({
            state: document.body.dataset.state,
            status: document.getElementById('status').textContent,
            answer: document.getElementById('answer').textContent,
            pieces: Array.from(document.querySelectorAll('#canvas span')).map(x => x.className === 'mask' ? null : x.textContent),
            draws: window.__draws,
            noise_max: window.__noise,
            sampler: document.body.dataset.sampler,
            legend: Array.from(document.querySelectorAll('#legend, #legend-uniform'))
                .filter(x => getComputedStyle(x).display !== 'none').map(x => x.textContent).join(' '),
        }))()""")
        # A long answer without a break (a URL, a run of symbols): the page must still fit the window.
        seen["fits"] = js("""(() => {
            const a = document.getElementById('answer');
            const kept = a.textContent;
            a.textContent = kept + ' ' + 'x'.repeat(400) + ' ' + 'https://example.invalid/' + 'y'.repeat(300);
            const fits = document.documentElement.scrollWidth <= window.innerWidth;
            a.textContent = kept;
            return fits;
        })()""")
        print(json.dumps(seen))
    finally:
        b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
