#!/usr/bin/env bash
# Runs the GEMM study: `dllm bench peak` once, then `dllm bench gemm` for the real LLaDA-8B and Dream-7B
# projection shapes at 1, 8, 32, 128 and 288 activation rows, and writes everything (JSON per shape,
# the machine's description, a summary table) to bench/results/gemm-<date>-<host>/.
#   bench/gemm/run.sh [DLLM_BINARY] [extra dllm bench gemm flags, e.g. --threads 2 --isa avx2]
# Environment: TYPES (default "Q4_K Q6_K Q8_0"; any of Q4_K Q5_K Q6_K Q8_0), ROWS (default 1,8,32,128,288), QUICK=1 (three shapes).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dllm="${1:-$root/build/dllm}"
shift || true
extra=("$@")
rows="${ROWS:-1,8,32,128,288}"
types="${TYPES:-Q4_K Q6_K Q8_0}"
out="$root/bench/results/gemm-$(date +%Y%m%d-%H%M)-$(hostname -s)"
mkdir -p "$out"

{
  echo "# $(date -u +%FT%TZ)  $(uname -srm)"
  echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  lscpu
  echo
  grep -m1 -E '^MemTotal' /proc/meminfo
} > "$out/machine.txt"
"$dllm" bench peak --json "${extra[@]}" > "$out/peak.json"

# name n k  (n = weight rows / outputs, k = inputs)
shapes=(
  "llada.attn_qkvo 4096 4096"
  "llada.ffn_gate_up 12288 4096"
  "llada.ffn_down 4096 12288"
  "llada.output 126464 4096"
  "dream.attn_qo 3584 3584"
  "dream.attn_kv 512 3584"
  "dream.ffn_gate_up 18944 3584"
  "dream.ffn_down 3584 18944"
  "dream.output 152064 3584"
)
if [[ "${QUICK:-0}" == 1 ]]; then shapes=("${shapes[0]}" "${shapes[2]}" "${shapes[5]}"); fi

for t in $types; do
  for s in "${shapes[@]}"; do
    read -r name n k <<< "$s"
    echo "== $t $name n=$n k=$k rows=$rows" >&2
    "$dllm" bench gemm --type "$t" --n "$n" --k "$k" --rows "$rows" --no-peak --json "${extra[@]}" \
      > "$out/gemm-$t-$name.json"
  done
done
# The kernels alone, one thread, by their own CPU time: the profile that does not depend on how busy
# the machine is. Every JIT family this CPU has.
for isa in avx2 avx-vnni avx512-vnni amx; do
  for t in $types; do
    "$dllm" bench kernel --type "$t" --n 4096 --k 4096 --rows 8,32,128,288 --isa "$isa" --json \
      > "$out/kernel-$t-$isa.json" 2>/dev/null || rm -f "$out/kernel-$t-$isa.json"
  done
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
python3 "$here/summarize.py" "$out" > "$out/summary.md"
cat "$out/summary.md"
echo "results in $out" >&2
