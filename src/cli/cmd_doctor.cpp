// dllm doctor (the binary's half; ./dllm doctor also checks packages and the compiler): what this machine
// offers dllm, each missing piece with the fix. Exit 1 when something dllm needs is missing; the GPU, NVRTC
// and the default model (only `run` and `serve` without --model use it; local files need none) are optional
// and only reported.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/commands.h"
#include "common/error.h"
#include "common/printable.h"
#include "hub/hub.h"
#include "jit/cpu_features.h"
#include "jit/cuda/device_select.h"
#include "jit/cuda/nvrtc.h"

namespace dllm::cli {

int cmd_doctor(const Settings&) {
  int problems = 0;
  const jit::CpuFeatures& cpu = jit::cpu_features();
  // The family that runs: the best this CPU has, or DLLM_ISA's when it names a valid one (a bad value is a
  // problem reported below, and runs refuse it).
  const jit::Isa best = cpu.best();
  const char* cap = std::getenv("DLLM_ISA");
  jit::Isa chosen = best;
  std::string cap_error;  // why DLLM_ISA is refused, when it is
  try {
    if (cap && *cap) chosen = jit::select_isa(cpu, cap);
  } catch (const std::exception& e) {
    cap_error = e.what();
  }
  std::printf("%s\n", jit::cpu_summary(cpu, chosen).c_str());
  if (!cpu.avx2 || !cpu.fma) {
    std::printf("  MISSING  AVX2 + FMA: dllm's kernels need an x86-64 CPU with AVX2 (Haswell / Zen 1 or newer)\n");
    ++problems;
  } else {
    std::printf("  ok       CPU kernels: %s%s\n", jit::isa_name(chosen),
                chosen == best ? " (the best this CPU has)" : "");
  }
  if (cap && *cap && cap_error.empty()) {
    std::printf("  ok       DLLM_ISA=%s -> %s\n", cap, jit::isa_name(chosen));
  } else if (cap && *cap) {
    std::printf("  PROBLEM  DLLM_ISA=%s: %s (fix: unset DLLM_ISA)\n", cap, cap_error.c_str());
    ++problems;
  }

  const jit::cuda::GpuProbe gpu = jit::cuda::probe_gpus();
  if (!gpu.driver_loaded) {
    std::printf("  optional NVIDIA driver: not found (%s); --device gpu needs an NVIDIA GPU and its driver\n",
                gpu.driver_error.c_str());
  } else if (gpu.devices.empty()) {
    std::printf("  optional NVIDIA driver loaded, but no GPU is visible (check nvidia-smi)\n");
  } else {
    for (const auto& d : gpu.devices) {
      const bool ok = d.arch() >= 80;
      std::printf("  %s GPU %d: %s, compute capability %d.%d, %s free of %s%s\n", ok ? "ok      " : "optional",
                  d.ordinal, d.name.c_str(), d.cc_major, d.cc_minor, jit::cuda::format_gib(d.free_bytes).c_str(),
                  jit::cuda::format_gib(d.total_bytes).c_str(),
                  ok ? "" : " (the GPU backend needs 8.0 or newer; --device cpu runs on the CPU)");
    }
  }
  if (gpu.nvrtc_loaded) {
    std::printf("  ok       NVRTC %s (GPU kernels are compiled at load)\n", jit::cuda::Nvrtc::get()->version_string().c_str());
  } else {
    std::printf("  optional NVRTC: not found (%s); fix for --device gpu: install the CUDA toolkit's NVRTC "
                "(e.g. apt-get install nvidia-cuda-toolkit, or CUDA in /usr/local/cuda)\n",
                gpu.nvrtc_error.c_str());
  }

  // The default model: looked up in the cache only (no network), never a problem.
  const std::string id = hub::default_model_id();
  const char* used_for = "only for `dllm run` and `dllm serve` without --model";
  try {
    const auto parsed = hub::parse_model_id(id);
    if (!parsed) throw Error("DLLM_MODEL=" + shown(id) + " is not a Hugging Face id owner/repo[:QUANT]");
    const std::string path = hub::find_cached(hub::options_from_env(), *parsed);
    if (!path.empty()) {
      std::printf("  ok       default model %s: %s\n", shown(id).c_str(), shown(path).c_str());
    } else {
      std::printf("  optional default model %s: not in the cache (%s; fix: dllm pull)\n", shown(id).c_str(), used_for);
    }
  } catch (const std::exception& e) {  // an ambiguous cache, a cache folder that cannot be read
    std::printf("  optional default model: %s (%s)\n", e.what(), used_for);
  }
  return problems ? 1 : 0;
}

}  // namespace dllm::cli
