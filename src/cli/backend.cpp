// choose_backend: --device cpu -> the JIT CPU executor (kernel family from DLLM_ISA, else the best the CPU
// has); --device gpu / auto -> a usable NVIDIA GPU (compute capability 8.0+, enough free memory, every weight
// type supported) runs the GpuExecutor, else gpu is an error and auto falls back to the CPU, saying why;
// DLLM_EXECUTOR=reference -> the portable reference executor (the oracle), for comparisons.
#include "cli/backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "jit/cpu_executor.h"
#include "jit/cpu_features.h"
#include "jit/cuda/device_select.h"
#include "jit/cuda/gpu_executor.h"
#include "jit/cuda/kernel_set.h"
#include "model/arch.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/thread_pool.h"

namespace dllm::cli {

namespace {

// Canvas rows the GPU workspace must hold: the logits command knows them; run gets a prompt allowance.
int64_t max_canvas_rows(const Settings& s) {
  if (s.command == "logits") return static_cast<int64_t>(s.tokens.size());
  return s.max_tokens + std::max<int64_t>(static_cast<int64_t>(s.prompt_tokens.size()), 1024);
}

Backend cpu_backend(const Settings& s, model::LoadOptions& options, const std::string& why) {
  const jit::Isa isa = jit::default_isa();  // DLLM_ISA cap, checked against the CPU
  options.make_executor = [isa](ThreadPool& pool) { return std::make_unique<jit::CpuExecutor>(pool, isa); };
  return {"cpu", why + ", kernel family " + jit::isa_name(isa)};
}

}  // namespace

Backend choose_backend(const Settings& s, model::LoadOptions& options) {
  // 0 = all logical CPUs. More threads than the hardware runs at once only contend: capped, and said so.
  const int hw = ThreadPool::hardware_threads();
  options.threads = static_cast<int>(std::min<int64_t>(s.threads, hw));
  if (s.threads > hw)
    std::fprintf(stderr, "dllm: warning: --threads %lld is more than the %d hardware threads: using %d\n",
                 static_cast<long long>(s.threads), hw, hw);
  const char* which = std::getenv("DLLM_EXECUTOR");
  if (which && *which && std::strcmp(which, "jit") != 0 && std::strcmp(which, "reference") != 0)
    throw usage_error(std::string("DLLM_EXECUTOR must be jit or reference, got '") + which + "'");
  const bool reference = which && std::strcmp(which, "reference") == 0;

  if (s.device == "gpu" || s.device == "auto") {
    // The model's shapes and types decide whether (and with how much memory) it can run on the GPU.
    auto file = gguf::File::open(s.model);
    const model::HParams hp = model::read_hparams(*file);
    const model::ModelTensors tensors = model::check_tensors(*file, hp);
    const uint64_t need = jit::cuda::gpu_memory_needed(hp, tensors, max_canvas_rows(s));
    const jit::cuda::DeviceChoice choice =
        jit::cuda::select_device(s.device, need, jit::cuda::gpu_model_error(hp, tensors));
    if (choice.device == jit::cuda::DeviceKind::Gpu) {
      const int ordinal = choice.gpu_ordinal;
      options.make_executor = [ordinal](ThreadPool& pool) { return jit::cuda::GpuExecutor::open(pool, ordinal); };
      return {"gpu", choice.reason};
    }
    if (reference) {
      options.make_executor = nullptr;
      return {"cpu", "DLLM_EXECUTOR=reference (" + choice.reason + ")"};
    }
    return cpu_backend(s, options, choice.reason);
  }
  if (reference) {
    options.make_executor = nullptr;  // the model's reference executor
    return {"cpu", "DLLM_EXECUTOR=reference"};
  }
  return cpu_backend(s, options, "--device cpu");
}

}  // namespace dllm::cli
