#!/usr/bin/env bash
# The GPU device check, one script for a machine with an NVIDIA GPU (compute capability 8.0+), in under
# 8 minutes: builds dllm and the GPU test programs, runs the GPU parity tests (logits of every quantised
# fixture against the CPU reference path, greedy generations identical to the references and the CPU
# path, the kernel cache, error messages), NVRTC compile checks, and a short benchmark (kernel throughput;
# the whole forward pass of a synthetic full-size LLaDA-8B when `dllm synth` exists). Everything it
# prints also goes to bench/results/gpu-check-<UTC time>-*.{log,txt,jsonl,json} (and to $OUT when set,
# as the device tool collects it). Without a GPU it says so and exits 0 without building anything
# (pass --cpu to build and run the CPU-side GPU tests anyway: NVRTC compiles and the emulator).
#
# usage: tests/gpu/device-check.sh [--cpu] [--build-dir DIR] [--prebuilt DIR] [--layers N]
#   --build-dir DIR  build there (default: build-device in the repository)
#   --prebuilt DIR   skip the build and use binaries already built in DIR (dllm and tests/test_gpu_*);
#                    for a machine without the build dependencies. Such binaries look for the test data
#                    at the path they were built from: if that path is missing it is linked to this
#                    repository (needs write access to its parent).
#   --layers N       layers of the synthetic benchmark model (default 32, the full LLaDA-8B)
# environment: DLLM_GPU_DEBUG=1 is set for the parity tests (a failing kernel is named).
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD="$ROOT/build-device"
PREBUILT=""
CPU_ONLY=0
LAYERS=32
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) CPU_ONLY=1 ;;
    --build-dir) BUILD="$2"; shift ;;
    --prebuilt) PREBUILT="$2"; shift ;;
    --layers) LAYERS="$2"; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "device-check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RESULTS="$ROOT/bench/results"
mkdir -p "$RESULTS"
PREFIX="$RESULTS/gpu-check-$STAMP"
LOG="$PREFIX.log"
SUMMARY="$PREFIX-summary.txt"
START=$(date +%s)
FAILED=0

say() { echo "$*" | tee -a "$LOG" "$SUMMARY"; }
log() { echo "$*" >>"$LOG"; }
elapsed() { echo $(( $(date +%s) - START )); }
BUDGET=${DLLM_CHECK_BUDGET:-470}  # seconds for the whole check (the device tool's run is sized for 8 minutes)
# run_step NAME SECONDS CMD...: runs with a time limit (never past the overall budget), output to the
# log; records pass/fail.
run_step() {
  local name="$1" limit="$2"; shift 2
  local left=$(( BUDGET - $(elapsed) ))
  if [ $left -lt 15 ]; then
    say "SKIP  $name: the time budget (${BUDGET}s) is spent"; FAILED=1; return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$(date +%s)
  log ""
  log "===== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then
    say "PASS  $name (${dt}s)"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    say "FAIL  $name: timed out after ${limit}s"; FAILED=1
  else
    say "FAIL  $name: exit status $rc (see $(basename "$LOG"))"; FAILED=1
  fi
  return $rc
}
finish() {
  say "total ${1:-$(elapsed)}s; results in bench/results/$(basename "$PREFIX")*"
  if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then cp "$PREFIX"* "$OUT/" 2>/dev/null || true; fi
  exit "$2"
}

: >"$SUMMARY"
say "dllm GPU device check, $STAMP, commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"

# ---- 1. Is there a GPU? (nothing is built when there is none)
GPU_INFO=""
if command -v nvidia-smi >/dev/null 2>&1; then
  GPU_INFO=$(nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,memory.free --format=csv,noheader 2>/dev/null | head -n 4)
fi
HAVE_DRIVER=0
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' || ls /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/local/nvidia/lib64/libcuda.so.1 >/dev/null 2>&1; then
  HAVE_DRIVER=1
fi
if [ -z "$GPU_INFO" ] && [ $HAVE_DRIVER -eq 0 ]; then
  say "no GPU: no NVIDIA driver found (no nvidia-smi, no libcuda.so.1); GPU execution, parity and benchmark not run"
  if [ $CPU_ONLY -eq 0 ]; then
    say "(run with --cpu to build and run the CPU-side GPU tests: NVRTC compile checks and the emulator)"
    finish "" 0
  fi
else
  say "gpu: ${GPU_INFO:-unknown (nvidia-smi missing), libcuda.so.1 present}"
fi
NVRTC=$(ldconfig -p 2>/dev/null | grep -o 'libnvrtc\.so[.0-9]*' | head -n 1)
say "nvrtc: ${NVRTC:-not in the loader path (looked up again at run time, also under /usr/local/cuda/lib64)}"
say "nvcc: $(nvcc --version 2>/dev/null | tail -n 1 || echo none)"

# ---- 2. Build (or use prebuilt binaries)
if [ -n "$PREBUILT" ]; then
  BUILD=$(cd "$PREBUILT" && pwd)
  say "using prebuilt binaries in $BUILD"
  # The binaries know the test data by the absolute path they were built from.
  DATA=$(grep -a -o -m1 '/[[:alnum:]_./+-]*/tests/data' "$BUILD/tests/test_gpu_device" 2>/dev/null | head -n 1 || true)
  if [ -n "$DATA" ] && [ ! -d "$DATA" ]; then
    SRC_ROOT=${DATA%/tests/data}
    mkdir -p "$(dirname "$SRC_ROOT")" && ln -s "$ROOT" "$SRC_ROOT" && say "linked $SRC_ROOT -> $ROOT for the test data"
  fi
else
  JOBS=$(nproc 2>/dev/null || echo 4)
  run_step "configure" 60 cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release || finish "" 1
  TARGETS="dllm test_gpu_device test_gpu_bench test_gpu_compile test_gpu_select"
  [ $CPU_ONLY -eq 1 ] && TARGETS="$TARGETS test_gpu_emulated"
  run_step "build ($TARGETS)" 240 cmake --build "$BUILD" -j "$JOBS" --target $TARGETS || finish "" 1
fi
T="$BUILD/tests"

# ---- 3. Tests (the parity tests first: they matter most)
run_step "device selection" 30 "$T/test_gpu_select" --gtest_brief=1
if [ -n "$GPU_INFO" ] || [ $HAVE_DRIVER -eq 1 ]; then
  run_step "GPU parity: logits vs CPU reference on every quantised fixture, greedy generations, cache, errors" 150 \
    env DLLM_GPU_DEBUG=1 DLLM_CACHE="$BUILD/dllm-cache-parity" "$T/test_gpu_device" "--gtest_output=json:$PREFIX-parity.json"
  grep -E '^\[  (SKIPPED|FAILED) ' "$LOG" | sort -u | head -n 40 | tee -a "$SUMMARY"
fi
run_step "NVRTC compile of every kernel (sm_80/86/89/90), kernel cache, dllm kernels" 90 "$T/test_gpu_compile" \
  --gtest_brief=1 "--gtest_output=json:$PREFIX-compile.json"
if [ $CPU_ONLY -eq 1 ]; then
  run_step "kernels and forward pass on the CPU emulator" 120 "$T/test_gpu_emulated" --gtest_brief=1
fi
if [ -z "$GPU_INFO" ] && [ $HAVE_DRIVER -eq 0 ]; then
  say "no GPU: parity tests and benchmark skipped"
  finish "" $FAILED
fi

# ---- 4. Benchmark (kernels, then the whole forward pass of a synthetic full-size model)
BENCH_DIR="$RESULTS/.bench-$STAMP"
mkdir -p "$BENCH_DIR"
export DLLM_GPU_BENCH=1 DLLM_GPU_BENCH_OUT="$BENCH_DIR" DLLM_CACHE="$BUILD/dllm-cache"
run_step "benchmark: GEMM and attention kernels" 90 "$T/test_gpu_bench" --gtest_filter='GpuBench.Gemm:GpuBench.Attention'
if "$BUILD/dllm" synth --help >/dev/null 2>&1; then
  MODEL="${TMPDIR:-/tmp}/dllm-bench-llada-q4km-$LAYERS.gguf"
  if [ ! -s "$MODEL" ]; then
    # Written under another name and renamed, so an interrupted run leaves no truncated model behind.
    run_step "dllm synth: LLaDA-8B shapes, $LAYERS layers, Q4_K_M" 120 sh -c \
      "'$BUILD/dllm' synth --arch llada --out '$MODEL.part' --layers '$LAYERS' --quant Q4_K_M && mv '$MODEL.part' '$MODEL'"
  fi
  if [ -s "$MODEL" ]; then
    run_step "benchmark: whole forward pass of the synthetic model" 120 env DLLM_GPU_BENCH_MODEL="$MODEL" \
      "$T/test_gpu_bench" --gtest_filter='GpuBench.Forward:GpuBench.ForwardProfileSplit'
  fi
else
  say "SKIP  benchmark of a synthetic full-size model: this build has no 'dllm synth'"
fi
for f in kernels forward; do
  if [ -s "$BENCH_DIR/$f.jsonl" ]; then
    mv "$BENCH_DIR/$f.jsonl" "$PREFIX-$f.jsonl"
    say "---- $f benchmark ($(basename "$PREFIX")-$f.jsonl)"
    tee -a "$SUMMARY" <"$PREFIX-$f.jsonl" >/dev/null
    cat "$PREFIX-$f.jsonl"
  fi
done
rm -rf "$BENCH_DIR"
[ $FAILED -eq 0 ] && say "device check passed" || say "device check FAILED"
finish "" $FAILED
