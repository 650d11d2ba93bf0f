#!/usr/bin/env bash
# Two kernel families side by side on the LLaDA-8B shapes that decide a step (Q4_K gate/up, Q6_K down and an
# LM-head slice, Q8_0), alternating family by family and repeated, 2 threads, weights streamed:
#   bench/gemm/families.sh OUT_DIR [FAMILY_A FAMILY_B] [REPEATS]     (default: amx avx512-vnni, 2)
# Writes OUT_DIR/machine.txt, peak.json and gemm-TYPE-nN-kK-FAMILY-REP.json; plot_families.py draws them.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dllm="$root/build/dllm"
out="$1"; a="${2:-amx}"; b="${3:-avx512-vnni}"; reps="${4:-2}"
mkdir -p "$out"
{ date -u; lscpu; "$dllm" doctor 2>&1 | head -6; } > "$out/machine.txt"
"$dllm" bench peak --json > "$out/peak.json"
for rep in $(seq 1 "$reps"); do
  for isa in "$a" "$b"; do
    for s in "Q4_K 12288 4096" "Q6_K 4096 12288" "Q6_K 32768 4096" "Q8_0 4096 4096"; do
      read -r t n k <<< "$s"
      "$dllm" bench gemm --type "$t" --n "$n" --k "$k" --rows 1,4,16,32,64,128 --isa "$isa" --no-peak \
        --min-seconds 0.3 --json > "$out/gemm-$t-n$n-k$k-$isa-$rep.json"
    done
  done
done
echo "results in $out" >&2
