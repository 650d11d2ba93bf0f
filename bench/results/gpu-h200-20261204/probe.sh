#!/usr/bin/env bash
# Device probe: carried binaries (built on the dev machine) on the lent GPU machine.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
ROOT=$PWD
mkdir -p build/tests /tmp/dc/lib
tar -xJf .devcarry/bins.tar.xz -C build
tar -xJf .devcarry/libs.tar.xz -C /tmp/dc/lib
# the test binaries have /work/main compiled in
if [ ! -e /work/main ]; then mkdir -p /work && ln -s "$ROOT" /work/main; fi
# use carried libraries only for the ones this image lacks
mkdir -p /tmp/dc/use
for l in $(ldd build/dllm build/tests/test_gpu_device | awk '/not found/{print $1}' | sort -u); do
  [ -e /tmp/dc/lib/$l ] && ln -sf /tmp/dc/lib/$l /tmp/dc/use/$l && echo "carried: $l"
done
export LD_LIBRARY_PATH=/tmp/dc/use${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if ! build/dllm --help >/dev/null 2>/tmp/dc/help.err; then cat /tmp/dc/help.err; echo "using every carried library"; ln -sf /tmp/dc/lib/* /tmp/dc/use/; fi
ldd build/dllm | grep "not found"
{ uname -a; nvidia-smi; ls /usr/local/cuda/lib64/libnvrtc* 2>&1; ldd --version | head -1; } > $OUT/machine.txt 2>&1
el doctor; build/dllm doctor 2>&1 | tee $OUT/doctor.txt | tail -15
export DLLM_CACHE_DIR=/tmp/dc/cache
el gpu-device-tests
timeout 200 build/tests/test_gpu_device 2>&1 | tee $OUT/test_gpu_device.txt | grep -E "^\[ *(OK|FAILED|SKIPPED|PASSED) |Failure|rel|skip" | head -60
el gemm-bench
timeout 90 build/tests/test_gpu_bench --gtest_filter='GpuBench.Gemm:GpuBench.Attention' > $OUT/test_gpu_bench.txt 2>&1; tail -40 $OUT/test_gpu_bench.txt
el synth
timeout 120 build/dllm synth --arch llada --quant Q4_K_M --out /tmp/dc/llada-8b.gguf 2>&1 | tail -2
el e2e
for c in "--max-tokens 32 --steps 8 --block-length 32" "--max-tokens 256 --steps 32 --block-length 32" "--max-tokens 256 --steps 32 --block-length 32 --dual-cache"; do
  DLLM_GPU_PROFILE=1 timeout 120 build/dllm run --model /tmp/dc/llada-8b.gguf --device gpu --prompt "tell me about the ocean" --no-early-stop $c --json > /tmp/dc/r.json 2>/tmp/dc/r.err; echo "rc=$? $c"; tail -3 /tmp/dc/r.err
  python3 -c "import json;j=json.load(open('/tmp/dc/r.json'));print({k:v for k,v in j.items() if k not in ('text','output_ids','prompt_ids')})" 2>&1 | tee -a $OUT/e2e.txt
done
el batch
python3 -c "
import json
for i in range(16): print(json.dumps({'prompt': 'tell me about the ocean, part %d' % i}))" > /tmp/dc/p.jsonl
for b in 1 8 16; do /usr/bin/time -f "wall %e s" timeout 150 build/dllm run --model /tmp/dc/llada-8b.gguf --device gpu --prompts-file /tmp/dc/p.jsonl --batch-size $b --max-tokens 32 --steps 8 --block-length 32 --no-early-stop --json > /tmp/dc/b$b.jsonl 2>/tmp/dc/b$b.err; echo "batch $b rc=$? $(tail -1 /tmp/dc/b$b.err)" | tee -a $OUT/e2e.txt; done
cmp <(python3 -c "import json,sys;[print(json.loads(l)['output_ids']) for l in open('/tmp/dc/b1.jsonl')]") <(python3 -c "import json,sys;[print(json.loads(l)['output_ids']) for l in open('/tmp/dc/b8.jsonl')]") && echo "batch 8 tokens == batch 1 tokens" | tee -a $OUT/e2e.txt
el done
