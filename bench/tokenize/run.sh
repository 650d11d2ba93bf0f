#!/usr/bin/env bash
# Tokenizer benchmark: 1 MB of mixed-script text (the tokenizer case texts, shuffled and repeated),
# tokenized by dllm with each fixture vocabulary; MB/s cold (first pass) and warm (piece cache full).
# With LLAMA_TOKENIZE=/path/to/llama-tokenize it also times llama.cpp on the same file and vocabulary
# (its model-load time removed by timing a one-byte file too) and checks that the ids are identical.
#
# usage: bench/tokenize/run.sh [BUILD_DIR]        (BUILD_DIR holds bench_tokenize; default: build)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build}
BENCH=$BUILD/bench_tokenize
SHARED=${DLLM_SHARED:-$ROOT/../shared}
if [ ! -x "$BENCH" ]; then
  echo "no $BENCH: build the bench_tokenize target first (see bench/tokenize/README.md)" >&2
  exit 1
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
TEXT=$WORK/mixed-1mb.txt
"$BENCH" make-text "$TEXT" "$ROOT/tests/data/tokenizer/cases-qwen.jsonl" --bytes 1048576 >&2
BYTES=$(stat -c %s "$TEXT")
printf 'a' > "$WORK/one.txt"

now() { date +%s.%N; }

# Seconds llama-tokenize needs for a file (ids to a file), best of 3.
time_llama() {
  local vocab=$1 file=$2 out=$3 best="" t0 t1 dt
  for _ in 1 2 3; do
    t0=$(now)
    "$LLAMA_TOKENIZE" -m "$vocab" -f "$file" --ids --no-bos --no-escape --log-disable > "$out" 2> "$WORK/llama.err"
    t1=$(now)
    dt=$(echo "$t1 - $t0" | bc -l)
    if [ -z "$best" ] || [ "$(echo "$dt < $best" | bc -l)" = 1 ]; then best=$dt; fi
  done
  echo "$best"
}

VOCABS=(
  "qwen2 (Dream)|$ROOT/tests/data/tokenizer/vocab-qwen.gguf"
  "bailingmoe (tiny LLaDA)|$ROOT/tests/data/models/tiny-llada-Q8_0.gguf"
  "gpt-2|$ROOT/tests/data/tokenizer/ggml-vocab-gpt-2.gguf"
  "llama-bpe (Llama 3)|$SHARED/fixtures/tokenizer/vocab-llama3.gguf"
)

HEADER="| vocabulary | tokens | dllm cold MB/s | dllm warm MB/s | dllm warm MB/s of CPU time |"
RULE="|---|---|---|---|---|"
if [ -n "${LLAMA_TOKENIZE:-}" ]; then
  HEADER="$HEADER llama-tokenize MB/s | same ids |"
  RULE="$RULE---|---|"
fi
ROWS=()
for entry in "${VOCABS[@]}"; do
  name=${entry%%|*}
  vocab=${entry#*|}
  if [ ! -f "$vocab" ]; then
    echo "skipping $name: $vocab is absent" >&2
    continue
  fi
  "$BENCH" run "$vocab" "$TEXT" --repeat 5 --ids-out "$WORK/dllm.ids" | tee "$WORK/dllm.log" >&2
  result=$(grep '^RESULT' "$WORK/dllm.log")
  cold=$(echo "$result" | sed 's/.*dllm_cold_mbps=\([0-9.]*\).*/\1/')
  warm=$(echo "$result" | sed 's/.*dllm_warm_mbps=\([0-9.]*\).*/\1/')
  warm_cpu=$(echo "$result" | sed 's/.*dllm_warm_cpu_mbps=\([0-9.]*\).*/\1/')
  tokens=$(echo "$result" | sed 's/.*tokens=\([0-9]*\).*/\1/')
  row="| $name | $tokens | $(printf %.1f "$cold") | $(printf %.1f "$warm") | $(printf %.1f "$warm_cpu") |"
  if [ -n "${LLAMA_TOKENIZE:-}" ]; then
    t_big=$(time_llama "$vocab" "$TEXT" "$WORK/llama.out")
    t_one=$(time_llama "$vocab" "$WORK/one.txt" "$WORK/llama-one.out")
    mbps=$(echo "$BYTES / 1048576 / ($t_big - $t_one)" | bc -l)
    tr -d '[] ' < "$WORK/llama.out" | tr ',' '\n' | sed '/^$/d' > "$WORK/llama.ids"
    if cmp -s "$WORK/llama.ids" "$WORK/dllm.ids"; then same=yes; else same=NO; fi
    row="$row $(printf %.1f "$mbps") | $same |"
  fi
  ROWS+=("$row")
done

echo
echo "text: $BYTES bytes of mixed-script text; $(nproc) CPUs; $(uname -m)"
echo "$HEADER"
echo "$RULE"
for row in "${ROWS[@]}"; do echo "$row"; done
