// The page at GET / (server.h): plain HTML and JavaScript compiled into the binary, no CDN, no build
// step. A person types a prompt and watches the canvas denoise: each step's canvas arrives as a stream
// chunk (stream_options.include_canvas), masks are grey boxes that fade into the tokens committed at that
// step, and the final answer is shown below as its text streams in. A legend says what the boxes are; a
// position the model committed to its mask token is drawn as that token (the server sends null only for
// positions not committed yet). Long answers wrap at any width (a phone's 375 px). ?prompt=...&autorun=1
// submits at once (the headless browser test uses it). A DiffusionGemma server (body data-sampler="uniform",
// set by the server) has no masks: every position holds a token from the first step, the positions re-noised
// with random tokens are drawn faded and change each step, those accepted under the entropy bound flash, and a
// block's text settles when the block ends; the steps box sets eb_max_steps and the temperature box is hidden
// (the sampler follows its own temperature schedule).
#include "server/server.h"

namespace dllm::server {

std::string page_html(bool uniform) {
  std::string page = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>dllm serve</title>
<style>
  * { box-sizing: border-box; }
  body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 60em; padding: 0 1em; color: #222;
         overflow-wrap: anywhere; }
  h1 { font-size: 1.3em; }
  textarea { width: 100%; height: 5em; font: inherit; box-sizing: border-box; }
  .row { display: flex; gap: 1em; flex-wrap: wrap; align-items: center; margin: .5em 0; }
  .row label { font-size: .9em; }
  .row input { width: 6em; }
  #canvas { border: 1px solid #ccc; border-radius: 6px; padding: .7em; min-height: 3em; line-height: 1.9;
            font-family: ui-monospace, monospace; font-size: 14px; white-space: pre-wrap; overflow-wrap: anywhere; }
  #canvas span { transition: background-color 1.2s, color 1.2s; border-radius: 3px; }
  #canvas span.mask { display: inline-block; width: .9em; height: 1em; margin: 0 1px; vertical-align: middle;
                      background: #bbb; opacity: .55; }
  #canvas span.fresh { background: #ffe27a; }
  #canvas span.end { color: #aaa; }
  #canvas span.noise { color: #6a8f9a; opacity: .55; font-style: italic; }
  #answer { border-left: 4px solid #4a8; padding: .5em .8em; background: #f4faf6; white-space: pre-wrap; min-height: 1.5em;
            overflow-wrap: anywhere; }
  #status { color: #666; font-size: .9em; }
  .legend { color: #555; font-size: .85em; margin: .3em 0 .6em; }
  .legend span { margin-right: 1.2em; white-space: nowrap; }
  .legend .mask, .legend .fresh, .legend .noise { display: inline-block; width: .9em; height: 1em; vertical-align: middle;
                                  border-radius: 3px; margin-right: .3em; }
  .legend .mask { background: #bbb; opacity: .55; }
  .legend .fresh { background: #ffe27a; }
  .legend .noise { background: #6a8f9a; opacity: .35; }
  body[data-sampler="uniform"] .masked-only, body[data-sampler="masked"] .uniform-only { display: none; }
</style>
</head>
<body data-state="idle" data-sampler="masked">
<h1>dllm serve &mdash; watch a diffusion model denoise</h1>
<form id="form">
  <textarea id="prompt" placeholder="Type a prompt">Write a haiku about the sea.</textarea>
  <div class="row">
    <label>max tokens <input id="max_tokens" type="number" min="1" value="64"></label>
    <label><span class="masked-only">steps</span><span class="uniform-only">steps per block</span> <input id="steps" type="number" min="1" placeholder="auto"></label>
    <label class="masked-only">temperature <input id="temperature" type="number" min="0" step="0.1" value="0"></label>
    <label>API key <input id="key" type="password" placeholder="(none)"></label>
    <button id="send" type="submit">Generate</button>
    <span id="status">idle</span>
  </div>
</form>
<h2>Canvas</h2>
<div id="legend" class="legend masked-only"><span><i class="mask"></i>a position not decided yet (masked)</span><span><i class="fresh"></i>decided at this step</span><span>&middot; an empty or end-of-text token</span></div>
<div id="legend-uniform" class="legend uniform-only"><span><i class="noise"></i>a random token, re-drawn each step (not settled)</span><span><i class="fresh"></i>accepted at this step</span><span>plain: a finished block</span></div>
<div id="canvas"></div>
<h2>Answer</h2>
<div id="answer"></div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let spans = [];

const uniform = document.body.dataset.sampler === "uniform";

function drawCanvas(canvas, fresh, noise) {
  const box = $("canvas");
  if (spans.length !== canvas.length) {
    box.textContent = "";
    spans = canvas.map(() => { const s = document.createElement("span"); box.appendChild(s); return s; });
  }
  const isFresh = new Set(fresh || []), isNoise = new Set(noise || []);
  canvas.forEach((piece, i) => {
    const s = spans[i];
    if (piece === null) { s.className = "mask"; s.textContent = ""; return; }
    s.textContent = piece === "" ? "\u00b7" : piece;
    s.className = (piece === "" ? "end" : "tok") + (isFresh.has(i) ? " fresh" : "") + (isNoise.has(i) ? " noise" : "");
    if (isFresh.has(i)) setTimeout(() => s.classList.remove("fresh"), 50);
  });
}

async function generate(ev) {
  if (ev) ev.preventDefault();
  const body = {
    messages: [{ role: "user", content: $("prompt").value }],
    stream: true,
    stream_options: { include_canvas: true, include_usage: true },
    max_tokens: Number($("max_tokens").value) || 64,
  };
  if (!uniform) body.temperature = Number($("temperature").value) || 0;
  if ($("steps").value) body[uniform ? "eb_max_steps" : "steps"] = Number($("steps").value);
  const headers = { "Content-Type": "application/json" };
  if ($("key").value) headers["Authorization"] = "Bearer " + $("key").value;
  $("answer").textContent = "";
  $("canvas").textContent = "";
  spans = [];
  document.body.dataset.state = "running";
  $("status").textContent = "running";
  $("send").disabled = true;
  try {
    const res = await fetch("/v1/chat/completions", { method: "POST", headers, body: JSON.stringify(body) });
    if (!res.ok) {
      const err = await res.json().catch(() => ({ error: { message: res.statusText } }));
      throw new Error(err.error ? err.error.message : res.statusText);
    }
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let buf = "", steps = 0;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message);
          if (j.dllm) {
            steps = j.dllm.step + 1;
            drawCanvas(j.dllm.canvas, j.dllm.fresh, j.dllm.noise);
            $("status").textContent = j.dllm.noise
                ? "block " + (j.dllm.block + 1) + ", step " + steps + ", temperature " + j.dllm.temperature.toFixed(2)
                : "step " + steps + " / " + j.dllm.total_steps;
          }
          for (const c of j.choices || []) {
            if (c.delta && c.delta.content) $("answer").textContent += c.delta.content;
          }
          if (j.usage) $("status").textContent = "done: " + j.usage.completion_tokens + " tokens, " + steps + " steps";
        }
      }
    }
    document.body.dataset.state = "done";
  } catch (e) {
    $("status").textContent = "error: " + e.message;
    document.body.dataset.state = "error";
  } finally {
    $("send").disabled = false;
  }
}

$("form").addEventListener("submit", generate);
const params = new URLSearchParams(location.search);
if (params.has("prompt")) $("prompt").value = params.get("prompt");
if (params.has("max_tokens")) $("max_tokens").value = params.get("max_tokens");
if (params.get("autorun") === "1") $("send").click();
</script>
</body>
</html>
)HTML";
  if (uniform) {
    const std::string body = "<body data-state=\"idle\" data-sampler=\"masked\">";
    page.replace(page.find(body), body.size(), "<body data-state=\"idle\" data-sampler=\"uniform\">");
  }
  return page;
}

}  // namespace dllm::server
