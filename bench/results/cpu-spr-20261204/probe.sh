#!/usr/bin/env bash
# Device-host probe: the CPU kernel families this dev machine lacks (AVX-VNNI, AVX-512 VNNI) on the GPU host's CPU.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
ROOT=$PWD
mkdir -p build/tests /tmp/dc/lib /tmp/dc/use
tar -xJf .devcarry/bins.tar.xz -C build
tar -xJf .devcarry/libs.tar.xz -C /tmp/dc/lib
if [ ! -e /work/main ]; then mkdir -p /work && ln -s "$ROOT" /work/main; fi
for l in $(ldd build/dllm build/tests/* | awk '/not found/{print $1}' | sort -u); do ln -sf /tmp/dc/lib/$l /tmp/dc/use/$l; done
export LD_LIBRARY_PATH=/tmp/dc/use
build/dllm doctor 2>&1 | head -4 | tee $OUT/doctor.txt
lscpu > $OUT/lscpu.txt 2>&1
export DLLM_CACHE_DIR=/tmp/dc/cache
cd build/tests
for t in "test_jit_gemm" "test_jit_repack" "test_q5k_model" "test_attention" "test_families" "test_batch --gtest_filter=-*moe*" "test_jit_cli"; do
  name=${t%% *}; el "$t"
  timeout 150 ./$t --gtest_brief=1 > $OUT/$name.txt 2>&1; rc=$?
  echo "$name rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' $OUT/$name.txt | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' $OUT/$name.txt | head -10
done
el done
