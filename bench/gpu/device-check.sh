#!/usr/bin/env bash
# The GPU device check of dllm: one script for a lent machine with an NVIDIA GPU (compute capability 8.0+).
#
# usage: OUT=DIR bench/gpu/device-check.sh BUDGET_SECONDS [options]
#
# Stops cleanly before BUDGET_SECONDS (wall clock, from the start of the script): every stage runs under a
# time limit that ends before the budget does, and a stage that no longer fits is reported as
# skipped(budget). Stages, in order (each prints its own time; a failing stage does not stop the later
# stages that do not depend on it):
#   machine             uname, CPU, memory, `nvidia-smi -q`, driver and CUDA versions, nvcc, NVRTC library
#   configure, build    CMake Release with Ninja, all cores, only the targets the check needs
#   versions            `dllm doctor` (the NVRTC version dllm loads, the GPU it sees)
#   gpu-tests-device    ctest -R on the device suites (GpuDevice*, GpuGeneration; GpuDeviceGraphs compares a
#                       pass as one CUDA Graph with plain launches, bit for bit); they skip themselves
#                       without a usable GPU, so any skip here fails the stage
#   parity-logits       `dllm logits --device gpu` on every fixture model and case against the CPU
#                       reference executor (DLLM_EXECUTOR=reference): relative L2 per case
#   parity-generations  greedy `dllm run --device gpu` on the generation fixtures and on variants (every
#                       remasking mode, --threshold, --dual-cache) against `--device cpu`, token for token
#   speed-synth         synthetic full-size LLaDA-8B / Dream-7B files (`dllm synth`), outside $OUT
#   speed-kernels       GEMM (1, 64, 288, 1024 rows, every format) and attention kernel throughput
#                       (GpuBench.Gemm / .Attention in tests/test_gpu_bench.cpp, DLLM_GPU_BENCH=1)
#   roofline            bench/gpu/roofline.py: each measured GEMM against its predicted time on this GPU
#                       (bytes / HBM bandwidth, operations / int8 peak), fractions of peak and of HBM
#   speed-e2e           time per step at canvas 64 and 288, dual-cache block steps, the DLLM_GPU_PROFILE
#                       split (GEMM, attention, LM head), fraction of HBM bandwidth and of int8 peak
#   gpu-tests-cpu-side  ctest -R on the GPU suites that need no device (device choice, NVRTC compiles,
#                       kernel cache, `dllm kernels`, run --verbose/--json through the emulator); last,
#                       since any machine can run them
#   summary             every stage: pass, fail, skipped(budget) or skipped(reason)
# Without a GPU (no nvidia-smi listing one and no libcuda.so.1), or with --skip-gpu /
# DLLM_DEVICE_CHECK_SKIP_GPU=1, the GPU stages are skipped(no GPU) and everything else runs.
#
# options:
#   --skip-gpu          treat the machine as having no GPU
#   --force-gpu         run the GPU stages even when no GPU is detected (they then fail: shows that a
#                       device test that skips fails its stage)
#   --cpu-harness       without a GPU, run the parity and speed stages with --device cpu instead (proves
#                       the harness on a CPU machine; tiny synthetic models, results labelled as such)
#   --build-dir DIR     build there (default: build-device in the repository)
#   --jobs N            build jobs (default: every core)
#   --layers N          layers of the synthetic models (default: the real 32 / 28; --cpu-harness: 1)
#   --scratch DIR       where the synthetic models and the kernel cache go (default: $TMPDIR or /tmp,
#                       under dllm-device-check); never under $OUT, whose contents are sent back
# environment: OUT (default: bench/results/device-check-<UTC time>), DLLM_DEVICE_CHECK_SKIP_GPU=1.
# Results under $OUT: summary.txt, summary.json, logs/<stage>.log, machine.txt, nvidia-smi-q.txt,
# versions.txt, doctor.txt, ctest-*.txt, parity-logits.{csv,json}, parity-generations.{csv,json},
# kernels.jsonl, roofline.{txt,json}, speed.{csv,json}, speed-runs/*.json. Exit status: 0 when no stage failed, 1 otherwise,
# 2 for a usage error. bench/gpu/README.md says more.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$ROOT/bench/gpu"
usage() { sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
die_usage() { echo "device-check: $*" >&2; echo "usage: OUT=DIR $0 BUDGET_SECONDS [options] (--help)" >&2; exit 2; }

BUDGET=""
SKIP_GPU=${DLLM_DEVICE_CHECK_SKIP_GPU:-0}
FORCE_GPU=0
CPU_HARNESS=0
BUILD="$ROOT/build-device"
JOBS=$(nproc 2>/dev/null || echo 4)
LAYERS=""
SCRATCH="${TMPDIR:-/tmp}/dllm-device-check"
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --skip-gpu) SKIP_GPU=1 ;;
    --force-gpu) FORCE_GPU=1 ;;
    --cpu-harness) CPU_HARNESS=1 ;;
    --build-dir|--jobs|--layers|--scratch)
      [ $# -ge 2 ] || die_usage "$1 needs a value"
      case "$1" in
        --build-dir) BUILD="$2" ;;
        --jobs) JOBS="$2" ;;
        --layers) LAYERS="$2" ;;
        --scratch) SCRATCH="$2" ;;
      esac
      shift ;;
    -*) die_usage "unknown option $1" ;;
    *) [ -z "$BUDGET" ] || die_usage "one budget only (got $BUDGET and $1)"; BUDGET="$1" ;;
  esac
  shift
done
[ -n "$BUDGET" ] || die_usage "the time budget in seconds is required"
[[ "$BUDGET" =~ ^[0-9]+$ ]] || die_usage "the budget must be a whole number of seconds, got '$BUDGET'"
[ "$BUDGET" -ge 30 ] || die_usage "a budget under 30 s leaves no time for any stage, got $BUDGET"
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || die_usage "--jobs must be a positive number, got '$JOBS'"
[ -z "$LAYERS" ] || [[ "$LAYERS" =~ ^[1-9][0-9]*$ ]] || die_usage "--layers must be a positive number, got '$LAYERS'"
[ "$SKIP_GPU" = 0 ] || SKIP_GPU=1
[ "$SKIP_GPU" = 0 ] || [ "$FORCE_GPU" = 0 ] || die_usage "--skip-gpu and --force-gpu contradict each other"

START=$(date +%s)
DEADLINE=$((START + BUDGET))
RESERVE=5  # seconds kept for the summary
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=${OUT:-$ROOT/bench/results/device-check-$STAMP}
mkdir -p "$OUT/logs" || { echo "device-check: cannot create $OUT" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd)
mkdir -p "$SCRATCH" "$BUILD" || { echo "device-check: cannot create $SCRATCH or $BUILD" >&2; exit 2; }
SCRATCH=$(cd "$SCRATCH" && pwd); BUILD=$(cd "$BUILD" && pwd)
case "$SCRATCH/" in "$OUT"/*) die_usage "--scratch must not be under \$OUT (its contents are sent back)" ;; esac
DLLM="$BUILD/dllm"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

# ---------------------------------------------------------------- is there a GPU?
GPU_WHY=""
if [ "$SKIP_GPU" = 1 ]; then
  GPU_WHY="--skip-gpu / DLLM_DEVICE_CHECK_SKIP_GPU=1"
else
  HAVE_SMI=0; HAVE_LIBCUDA=0
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && HAVE_SMI=1
  if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' ||
     ls /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1 /usr/local/nvidia/lib64/libcuda.so.1 >/dev/null 2>&1; then
    HAVE_LIBCUDA=1
  fi
  if [ $HAVE_SMI = 0 ] && [ $HAVE_LIBCUDA = 0 ]; then GPU_WHY="no nvidia-smi listing a GPU and no libcuda.so.1"; fi
fi
HAVE_GPU=1; [ -z "$GPU_WHY" ] || HAVE_GPU=0
[ $FORCE_GPU = 0 ] || { HAVE_GPU=1; GPU_WHY=""; }
# What the parity and speed stages run on: the GPU, or (--cpu-harness without a GPU) the CPU.
TEST_DEVICE=gpu
if [ $HAVE_GPU = 0 ] && [ $CPU_HARNESS = 1 ]; then TEST_DEVICE=cpu; fi
[ -n "$LAYERS" ] || { [ $TEST_DEVICE = cpu ] && LAYERS=1; }
PY=$(command -v python3 || true)

say() { echo "$*" | tee -a "$SUMMARY"; }
now() { date +%s; }

# ---------------------------------------------------------------- stages
# A stage is a function run in a child bash under `timeout`, its output in $OUT/logs/<name>.log (and its
# last lines on the terminal when it fails). Return 0 = pass, 77 = skipped (the reason is the last line
# that starts with "skip: "), anything else = fail.
NAMES=(); STATUS=(); SECS=(); NOTES=()
record() { NAMES+=("$1"); STATUS+=("$2"); SECS+=("$3"); NOTES+=("$4"); }

# stage NAME MIN_SECONDS MAX_SECONDS FUNCTION [ARGS...]: skipped(budget) when fewer than MIN_SECONDS are
# left; otherwise runs with a limit of MAX_SECONDS or what is left, whichever is less.
stage() {
  local name="$1" min="$2" max="$3"; shift 3
  local left=$((DEADLINE - RESERVE - $(now)))
  if [ "$left" -lt "$min" ]; then
    say "==> $name: skipped(budget): needs ${min}s, ${left}s left"
    record "$name" "skipped(budget)" 0 "needs ${min}s, ${left}s left"
    return 0
  fi
  local limit=$max; [ "$limit" -le "$left" ] || limit=$left
  local log="$OUT/logs/$name.log" t0; t0=$(now)
  echo "==> $name (limit ${limit}s)"
  # STAGE_END: when check.py must have written its tables (it starts no run past it).
  STAGE_END=$((t0 + limit - 5)) timeout --kill-after=5 "$limit" bash -c '"$@"' stage "$@" >"$log" 2>&1
  local rc=$? dt=$(($(now) - t0))
  local status note=""
  case $rc in
    0) status=pass ;;
    77) # "skip: no GPU: why" -> skipped(no GPU), note "why"
      note=$(grep '^skip: ' "$log" | tail -n 1 | cut -c7-)
      status="skipped(${note%%:*})"
      case "$note" in *:*) note="${note#*: }" ;; *) note="" ;; esac ;;
    124|137) status=fail; note="timed out after ${limit}s" ;;
    *) status=fail; note="exit status $rc" ;;
  esac
  [ -z "$(grep '^note: ' "$log" | tail -n 1)" ] || note="${note:+$note; }$(grep '^note: ' "$log" | tail -n 1 | cut -c7-)"
  if [ "$status" = fail ]; then
    echo "---- last lines of logs/$name.log:"
    tail -n 25 "$log" | sed 's/^/    /'
  fi
  say "<== $name: $status in ${dt}s${note:+ ($note)}"
  record "$name" "$status" "$dt" "$note"
}

# Everything a stage function uses, for the child bash.
export ROOT HERE OUT BUILD DLLM JOBS LAYERS SCRATCH HAVE_GPU GPU_WHY TEST_DEVICE PY DEADLINE RESERVE

skip() { echo "skip: $*"; exit 77; }
need_dllm() { [ -x "$DLLM" ] || skip "no dllm: $DLLM is missing (the build failed or did not run)"; }
need_device() {
  if [ "$TEST_DEVICE" = gpu ] && [ "$HAVE_GPU" = 0 ]; then skip "no GPU: $GPU_WHY"; fi
}
need_python() { [ -n "$PY" ] || skip "no python3: the parity and speed stages need it"; }
export -f skip need_dllm need_device need_python

st_machine() {
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (with local changes)')"
    echo "uname: $(uname -a)"
    echo "cores: $(nproc)"
    lscpu 2>/dev/null | grep -E '^(Model name|Socket|Core|Thread|NUMA node\(s\)|Flags)' | cut -c1-300
    free -g 2>/dev/null
    echo "gpu: $([ "$HAVE_GPU" = 1 ] && echo present || echo "none ($GPU_WHY)")"
    echo "cmake: $(cmake --version 2>/dev/null | head -n 1)"; echo "ninja: $(ninja --version 2>/dev/null || echo none)"
    echo "g++: $(g++ --version 2>/dev/null | head -n 1)"; echo "python3: $(${PY:-false} --version 2>&1 || echo none)"
  } >"$OUT/machine.txt"
  {
    if command -v nvidia-smi >/dev/null 2>&1; then
      nvidia-smi -q >"$OUT/nvidia-smi-q.txt" 2>&1 || echo "nvidia-smi -q failed (see nvidia-smi-q.txt)"
      echo "nvidia-smi: $(nvidia-smi 2>/dev/null | grep -o 'Driver Version: [0-9.]*.*CUDA Version: [0-9.]*' | tr -s ' ')"
      nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,memory.free,clocks.max.sm,clocks.max.mem \
        --format=csv 2>/dev/null
    else
      echo "nvidia-smi: not found"
    fi
    [ -r /proc/driver/nvidia/version ] && sed 's/^/kernel module: /' /proc/driver/nvidia/version
    echo "libcuda: $(ldconfig -p 2>/dev/null | grep -o 'libcuda\.so\.1 .*' | head -n 1 | grep . || echo 'not in the loader cache')"
    echo "nvrtc: $(ldconfig -p 2>/dev/null | grep -o 'libnvrtc\.so[.0-9]* .*' | head -n 1 | grep . || echo 'not in the loader cache')"
    ls -d /usr/local/cuda*/lib64/libnvrtc.so.* 2>/dev/null | sed 's/^/nvrtc file: /'
    echo "nvcc: $(nvcc --version 2>/dev/null | tail -n 1 || echo none)"
  } >"$OUT/versions.txt"
  cat "$OUT/machine.txt" "$OUT/versions.txt"
}

st_configure() {
  local gen=(); command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release
}

st_build() {
  [ -f "$BUILD/CMakeCache.txt" ] || { echo "not configured"; return 1; }
  cmake --build "$BUILD" -j "$JOBS" --target dllm test_gpu_select test_gpu_compile test_gpu_run_report \
    test_gpu_device test_gpu_bench
}

st_versions() {
  need_dllm
  "$DLLM" doctor >"$OUT/doctor.txt" 2>&1; echo "dllm doctor: exit status $? (1 = a required piece is missing)"
  cat "$OUT/doctor.txt"
  { echo "dllm doctor:"; grep -E 'NVRTC|NVIDIA driver|GPU [0-9]' "$OUT/doctor.txt"; } >>"$OUT/versions.txt"
}

# ctest_stage NAME REGEX SKIPS_ALLOWED_REGEX: runs the tests matching REGEX; fails on any failure, on no
# test at all, and on a skip whose name does not match SKIPS_ALLOWED_REGEX (empty: none allowed).
ctest_stage() {
  local name="$1" regex="$2" allowed="$3" txt="$OUT/ctest-$1.txt"
  [ -f "$BUILD/CTestTestfile.cmake" ] || skip "no build: nothing to test in $BUILD (the build failed or did not run)"
  ctest --test-dir "$BUILD" -R "$regex" --output-on-failure --timeout 600 --output-junit "$OUT/ctest-$name.xml" \
    2>&1 | tee "$txt"
  local rc=${PIPESTATUS[0]}
  local total; total=$(grep -oE 'tests? failed out of [0-9]+' "$txt" | grep -oE '[0-9]+$' | tail -n 1)
  local skipped; skipped=$(grep -E '\(Skipped\)$' "$txt" | sed -E 's/^[[:space:]]*[0-9]+ - //; s/ \(Skipped\)$//')
  local bad="$skipped"; [ -z "$allowed" ] || bad=$(grep -vE "$allowed" <<<"$skipped" || true)
  echo "tests: ${total:-0}; skipped: $(grep -c . <<<"$skipped" || true); ctest exit status $rc"
  if [ -z "$total" ] || [ "$total" = 0 ]; then echo "FAIL: no test matched $regex"; return 1; fi
  if [ -n "$bad" ]; then
    echo "FAIL: these tests skipped, so they did not run:"; sed 's/^/  /' <<<"$bad"; return 1
  fi
  echo "note: ${total} tests$([ -z "$skipped" ] || echo ", allowed skips: $(tr '\n' ' ' <<<"$skipped")")"
  return "$rc"
}
export -f ctest_stage

st_gpu_tests_cpu_side() {
  # Skips allowed: the no-driver check on a machine with a driver, NVRTC compiles where NVRTC is missing
  # (the versions stage shows whether it is).
  ctest_stage cpu-side '^(GpuSelect|GpuCompile|GpuSass|GpuDiskCache|GpuKernelSet|GpuKernelText|GpuKernelsCommand|GpuRunReport)\.' \
    'ThisMachineWithoutADriverHasNoGpu|GpuCompile\.|GpuSass\.|GpuDiskCache\.|GpuKernelsCommand\.'
}

st_gpu_tests_device() {
  [ "$HAVE_GPU" = 1 ] || skip "no GPU: $GPU_WHY"
  export DLLM_GPU_DEBUG=1 DLLM_CACHE="$SCRATCH/cache"
  ctest_stage device '^([A-Za-z]+/)?(GpuDevice|GpuDeviceQ5K|GpuDeviceGraphs|GpuDeviceCache|GpuDeviceChoice|GpuDeviceErrors|GpuGeneration)\.' ''
}

st_parity_logits() {
  need_device; need_python; need_dllm
  DLLM_CACHE="$SCRATCH/cache" "$PY" "$HERE/check.py" parity-logits --dllm "$DLLM" --device "$TEST_DEVICE" \
    --data "$ROOT/tests/data" --out "$OUT" --deadline "$STAGE_END"
}

st_parity_generations() {
  need_device; need_python; need_dllm
  DLLM_CACHE="$SCRATCH/cache" "$PY" "$HERE/check.py" parity-generations --dllm "$DLLM" --device "$TEST_DEVICE" \
    --data "$ROOT/tests/data" --out "$OUT" --deadline "$STAGE_END"
}

st_speed_synth() {
  need_device; need_dllm
  local arch f
  for arch in llada dream; do
    f="$SCRATCH/synth-$arch-${LAYERS:-full}-Q4_K_M.gguf"
    if [ -s "$f" ]; then echo "have $f"; continue; fi
    # Written under another name and renamed, so an interrupted run leaves no truncated model behind.
    "$DLLM" synth --arch "$arch" --out "$f.part" ${LAYERS:+--layers "$LAYERS"} --quant Q4_K_M && mv "$f.part" "$f" ||
      return 1
  done
}

st_speed_kernels() {
  [ "$HAVE_GPU" = 1 ] || skip "no GPU: $GPU_WHY"
  [ -x "$BUILD/tests/test_gpu_bench" ] || skip "no build: tests/test_gpu_bench is missing (the build failed or did not run)"
  local dir="$SCRATCH/bench-out"; rm -rf "$dir"; mkdir -p "$dir"
  DLLM_GPU_BENCH=1 DLLM_GPU_BENCH_OUT="$dir" DLLM_CACHE="$SCRATCH/cache" \
    "$BUILD/tests/test_gpu_bench" --gtest_filter='GpuBench.Gemm:GpuBench.Attention' | tee "$dir/gtest.txt" ||
    return 1
  if grep -q '^\[  SKIPPED \]' "$dir/gtest.txt"; then echo "FAIL: the kernel benchmark skipped"; return 1; fi
  cp "$dir/kernels.jsonl" "$OUT/kernels.jsonl"
}

st_roofline() {
  need_python
  [ -s "$OUT/kernels.jsonl" ] || skip "no kernels.jsonl: speed-kernels wrote none (it failed or did not run)"
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  [ -n "$name" ] || name=H200
  "$PY" "$HERE/roofline.py" --gpu "$name" --kernels "$OUT/kernels.jsonl" | tee "$OUT/roofline.txt" &&
    "$PY" "$HERE/roofline.py" --gpu "$name" --kernels "$OUT/kernels.jsonl" --json > "$OUT/roofline.json"
}

st_speed_e2e() {
  need_device; need_python; need_dllm
  local l="$SCRATCH/synth-llada-${LAYERS:-full}-Q4_K_M.gguf" d="$SCRATCH/synth-dream-${LAYERS:-full}-Q4_K_M.gguf"
  [ -s "$l" ] || [ -s "$d" ] || skip "no model: speed-synth wrote none (it failed or did not run)"
  DLLM_CACHE="$SCRATCH/cache" "$PY" "$HERE/check.py" speed --dllm "$DLLM" --device "$TEST_DEVICE" \
    --llada "$l" --dream "$d" --out "$OUT" --deadline "$STAGE_END"
}
export -f st_machine st_configure st_build st_versions st_gpu_tests_cpu_side st_gpu_tests_device \
  st_parity_logits st_parity_generations st_speed_synth st_speed_kernels st_roofline st_speed_e2e

# ---------------------------------------------------------------- the run
say "dllm device check $STAMP: budget ${BUDGET}s, results in $OUT"
say "gpu: $([ $HAVE_GPU = 1 ] && echo "present$([ $FORCE_GPU = 1 ] && echo ' (assumed: --force-gpu)')" || echo "none ($GPU_WHY): the GPU stages are skipped")$([ $TEST_DEVICE = cpu ] && echo '; --cpu-harness: parity and speed run with --device cpu')"
# MIN seconds: what a stage needs at the least to be worth starting; MAX: its own cap.
stage machine 5 60 st_machine
stage configure 10 120 st_configure
stage build 30 1800 st_build
stage versions 5 30 st_versions
stage gpu-tests-device 30 300 st_gpu_tests_device
stage parity-logits 20 240 st_parity_logits
stage parity-generations 30 300 st_parity_generations
stage speed-synth 30 300 st_speed_synth
stage speed-kernels 20 120 st_speed_kernels
stage roofline 5 30 st_roofline
stage speed-e2e 30 600 st_speed_e2e
# Last: these need no device, so the device's time goes to the stages above first.
stage gpu-tests-cpu-side 20 240 st_gpu_tests_cpu_side

# ---------------------------------------------------------------- summary
jstr() { printf '"%s"' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g' | tr '\t\n' '  ')"; }
FAILED=0
ROWS=()
say ""
say "summary ($(($(now) - START))s of ${BUDGET}s):"
for i in "${!NAMES[@]}"; do
  [ "${STATUS[$i]}" != fail ] || FAILED=1
  say "$(printf '  %-20s %-34s %5ss  %s' "${NAMES[$i]}" "${STATUS[$i]}" "${SECS[$i]}" "${NOTES[$i]}")"
  ROWS+=("$(printf '  {"stage": %s, "status": %s, "seconds": %s, "note": %s}' "$(jstr "${NAMES[$i]}")" \
    "$(jstr "${STATUS[$i]}")" "${SECS[$i]}" "$(jstr "${NOTES[$i]}")")")
done
{
  printf '{"stamp": %s, "budget_s": %s, "elapsed_s": %s, "gpu": %s, "test_device": %s, "passed": %s, "stages": [\n' \
    "$(jstr "$STAMP")" "$BUDGET" "$(($(now) - START))" "$([ $HAVE_GPU = 1 ] && echo true || echo false)" \
    "$(jstr "$TEST_DEVICE")" "$([ $FAILED = 0 ] && echo true || echo false)"
  printf '%s' "${ROWS[0]}"; [ ${#ROWS[@]} -lt 2 ] || printf ',\n%s' "${ROWS[@]:1}"
  printf '\n]}\n'
} >"$OUT/summary.json"
say "$([ $FAILED = 0 ] && echo 'device check: no stage failed' || echo 'device check: FAILED')"
exit $FAILED
