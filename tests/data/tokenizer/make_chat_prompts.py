#!/usr/bin/env python3
"""Collects the chat-formatted prompt ids of llama.cpp's diffusion runs on the tiny fixture models.

Reads ../shared/fixtures/models/generations/*.json (made by a copy of llama-diffusion-cli, which renders
the GGUF chat template and tokenizes it with add_special = true, parse_special = true) and writes
chat-prompts.jsonl: one line per (arch, prompt) with the prompt ids, after checking that every run of
that prompt (all quantisations share one vocabulary per arch) recorded the same ids.

Usage: python3 make_chat_prompts.py [SHARED_DIR]   (default: ../../../../shared)
"""
import glob
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
shared = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "../../../../shared")
gen_dir = os.path.join(shared, "fixtures/models/generations")

entries = {}
for path in sorted(glob.glob(os.path.join(gen_dir, "*.json"))):
    d = json.load(open(path, encoding="utf-8"))
    if not d.get("chat_template_applied") or d.get("system_prompt") is not None:
        continue
    key = (d["arch"], d["prompt"])
    e = entries.setdefault(key, {"arch": d["arch"], "prompt": d["prompt"],
                                 "formatted_prompt": d["formatted_prompt"],
                                 "prompt_ids": d["prompt_ids"], "source": os.path.basename(path)})
    assert e["prompt_ids"] == d["prompt_ids"], f"ids differ between runs of {key}"

out = sorted(entries.values(), key=lambda e: (e["arch"], e["prompt"]))
with open(os.path.join(here, "chat-prompts.jsonl"), "w", encoding="utf-8") as f:
    for e in out:
        f.write(json.dumps(e, ensure_ascii=False) + "\n")
print(f"wrote {len(out)} prompts")
