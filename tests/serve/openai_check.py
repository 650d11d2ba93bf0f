#!/usr/bin/env python3
"""dllm serve through the official `openai` client (run by tests/test_serve.cpp against a live server).

Checks, for one model: /v1/models; chat and completions, streamed and not, equal `dllm run` with the same
settings token for token (greedy); streamed text equals the whole answer; multi-turn conversations reach
the model as exactly the ids of Python's jinja2 rendering of the model's own chat template
(tests/data/chat_templates), tokenized by `dllm tokenize --no-chat` after llama.cpp's BOS rule; n > 1;
errors as the client's exceptions. Prints "openai_check: all passed" at the end; exits 1 on a failure.
"""
import argparse
import json
import subprocess
import sys

import jinja2
import openai

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def dllm(args, binary):
    r = subprocess.run([binary] + args, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"dllm {' '.join(args)} failed: {r.stderr}")
    return r.stdout


def run_answer(a, extra):
    """`dllm run --json` with the server's defaults: (answer ids, text)."""
    args = ["run", "--json", "--model", a.model, "--max-tokens", str(a.max_tokens)]
    if a.block_length:
        args += ["--block-length", str(a.block_length)]
    j = json.loads(dllm(args + extra, a.dllm))
    return j["output_ids"][: j["answer_length"]], j["text"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--dllm", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--templates", required=True)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--block-length", type=int, default=0)
    a = p.parse_args()

    meta = json.loads(dllm(["inspect", a.model, "--json"], a.dllm))["metadata"]
    arch = meta["general.architecture"]["value"]
    # The BOS token's text, when the tokenizer adds one (an empty text tokenizes to just it).
    empty = json.loads(dllm(["tokenize", "--model", a.model, "--no-chat", "--json", "--prompt", ""], a.dllm))
    add_bos = len(empty["ids"]) > 0
    bos_text = empty["pieces"][0] if add_bos else ""

    client = openai.OpenAI(base_url=a.url + "/v1", api_key="none", max_retries=0, timeout=120)
    models = client.models.list()
    ids = [m.id for m in models.data]
    check(len(ids) == 1, f"one model listed, got {ids}")
    model = ids[0]

    # --- chat, not streamed and streamed, against `dllm run --prompt` ---
    ref_ids, ref_text = run_answer(a, ["--prompt", "What is the capital of France?"])
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0, extra_body={"return_tokens": True})
    choice = r.choices[0]
    check(choice.model_extra["dllm"]["tokens"] == ref_ids, f"chat tokens {choice.model_extra['dllm']['tokens']} != run {ref_ids}")
    check(choice.message.content == ref_text, f"chat text {choice.message.content!r} != run {ref_text!r}")
    check(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason}")
    check(r.usage.completion_tokens == len(ref_ids), "usage.completion_tokens")
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is the capital of France?"}], stream=True,
        stream_options={"include_usage": True})
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                text += c.delta.content
            if c.finish_reason:
                finish = c.finish_reason
    check(text == ref_text, f"streamed chat {text!r} != run {ref_text!r}")
    check(finish == choice.finish_reason, f"streamed finish {finish} != {choice.finish_reason}")
    check(usage is not None and usage.completion_tokens == len(ref_ids), f"streamed usage {usage}")

    # --- a system turn: the same ids as `dllm run`'s one-turn template (checked against jinja2 below) ---

    # --- completions (raw prompt), settings in the body ---
    steps = a.max_tokens // 2
    ref_ids, ref_text = run_answer(a, ["--prompt", "Once upon a time", "--no-chat", "--steps", str(steps)])
    r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=a.max_tokens,
                                  extra_body={"steps": steps, "return_tokens": True})
    check(r.choices[0].model_extra["dllm"]["tokens"] == ref_ids, "completion tokens != run --no-chat")
    check(r.choices[0].text == ref_text, f"completion {r.choices[0].text!r} != run {ref_text!r}")
    text = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=a.max_tokens, stream=True, extra_body={"steps": steps})
        if c.choices)
    check(text == ref_text, f"streamed completion {text!r} != run {ref_text!r}")

    # --- multi-turn prompts: jinja2's rendering of the model's own template ---
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(a.templates))
    tmpl = env.get_template(f"{arch}.jinja")
    conversations = [
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": " Hello \n"}],
        [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
         {"role": "user", "content": "Another one?"}],
        [{"role": "system", "content": "You answer in French."}, {"role": "user", "content": "Hello"},
         {"role": "assistant", "content": "Bonjour !"}, {"role": "user", "content": "Thanks, bye"}],
    ]
    for conv in conversations:
        text = tmpl.render(messages=conv, bos_token=bos_text, add_generation_prompt=True)
        if add_bos and bos_text and text.startswith(bos_text):
            text = text[len(bos_text):]  # llama.cpp's rule: the tokenizer adds BOS itself
        want = json.loads(dllm(["tokenize", "--model", a.model, "--no-chat", "--json", "--prompt", text],
                               a.dllm))["ids"]
        r = client.chat.completions.create(model=model, messages=conv, extra_body={"return_tokens": True})
        got = r.model_extra["dllm"]["prompt_tokens"]
        check(got == want, f"prompt ids of {conv}: server {got} != jinja2 {want}")
        check(r.usage.prompt_tokens == len(want), "usage.prompt_tokens")

    # --- n choices ---
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], n=2,
                                       temperature=1.0, seed=3)
    check(len(r.choices) == 2 and [c.index for c in r.choices] == [0, 1], "n=2: two choices")

    # --- errors as the client raises them ---
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], max_tokens=-1)
        check(False, "max_tokens=-1 accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body.get("param") == "max_tokens", f"max_tokens error: {e.body}")
    try:
        client.chat.completions.create(model="not-this-one", messages=[{"role": "user", "content": "x"}])
        check(False, "an unknown model accepted")
    except openai.NotFoundError as e:
        check(e.body.get("code") == "model_not_found", f"model error: {e.body}")

    if failures:
        print(f"openai_check: {len(failures)} failures")
        return 1
    print("openai_check: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
