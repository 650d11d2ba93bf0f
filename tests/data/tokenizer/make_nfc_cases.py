#!/usr/bin/env python3
"""Writes nfc-qwen.jsonl: the cases of cases-qwen.jsonl where llama.cpp and the HF tokenizer disagree
(the Qwen tokenizer.json normalizes to NFC, llama.cpp does not), with the NFC form of the text.
The tokenizer test checks that dllm's ids of nfc_text equal hf_ids, i.e. that the whole difference is
the normalization.

Usage: python3 make_nfc_cases.py
"""
import json
import os
import unicodedata

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "cases-qwen.jsonl"), encoding="utf-8") as f, \
        open(os.path.join(here, "nfc-qwen.jsonl"), "w", encoding="utf-8") as out:
    n = 0
    for line in f:
        c = json.loads(line)
        if c["agree"]:
            continue
        nfc = unicodedata.normalize("NFC", c["text"])
        assert nfc != c["text"], c["id"]
        out.write(json.dumps({"id": c["id"], "text": c["text"], "nfc_text": nfc, "ids": c["ids"],
                              "hf_ids": c["hf_ids"]}, ensure_ascii=False) + "\n")
        n += 1
print(f"wrote {n} cases")
