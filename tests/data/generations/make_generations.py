#!/usr/bin/env python3
"""Copies the reference generations that follow the authors' algorithms into tests/data/generations.

Source: ../shared/fixtures/models/generations/*.json (llama.cpp's diffusion loop with the authors' greedy
sampler, cross-checked by a float64 loop; see that folder's README, section 3). Only the files marked
`matches_authors_algorithm: true` are copied, and only the fields the tests read, so the copies stay small.
Run from the repository root: python3 tests/data/generations/make_generations.py
"""
import glob
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "..", "..", "..", "shared", "fixtures", "models", "generations")
KEEP = ["case", "arch", "model_file", "model_sha256", "variant", "prompt", "prompt_ids", "mask_token_id",
        "generated_ids", "generated_text_hex", "authors_equivalent", "matches_authors_algorithm", "trace"]

def main():
    for old in glob.glob(os.path.join(HERE, "*.json")):
        os.remove(old)
    n = 0
    for path in sorted(glob.glob(os.path.join(SRC, "*.json"))):
        with open(path) as f:
            d = json.load(f)
        if not d.get("matches_authors_algorithm"):
            continue
        slim = {k: d[k] for k in KEEP}
        slim["source"] = "shared/fixtures/models/generations/" + os.path.basename(path)
        with open(os.path.join(HERE, os.path.basename(path)), "w") as f:
            json.dump(slim, f, separators=(",", ":"))
            f.write("\n")
        n += 1
    print(f"wrote {n} files")

if __name__ == "__main__":
    main()
