// choose_backend: cpu -> the JIT CPU executor (kernel family from DLLM_ISA, else the best the CPU has);
// gpu / auto -> a usable NVIDIA GPU (compute capability 8.0+, enough free memory, every weight type
// supported) runs the GpuExecutor, else gpu is an error and auto falls back to the CPU, saying why;
// DLLM_EXECUTOR=reference -> the portable reference executor (the oracle), for comparisons;
// DLLM_EXECUTOR=reference-int8 -> the same with llama.cpp's (and the JIT's) int8 activations.
#include "engine/backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "jit/cpu_executor.h"
#include "jit/cpu_features.h"
#include "jit/cuda/device_select.h"
#include "jit/cuda/gpu_executor.h"
#include "jit/cuda/kernel_set.h"
#include "model/arch.h"
#include "model/reference_executor.h"
#include "common/error.h"
#include "common/thread_pool.h"

namespace dllm::engine {

namespace {

Backend cpu_backend(model::LoadOptions& options, const std::string& why) {
  const jit::Isa isa = jit::default_isa();  // DLLM_ISA cap, checked against the CPU
  options.make_executor = [isa](ThreadPool& pool) { return std::make_unique<jit::CpuExecutor>(pool, isa); };
  // Under amx, what its matrices run where (the per-shape rule of matrix_family), as doctor says it.
  const std::string rule = isa == jit::Isa::Amx ? std::string(" (") + jit::kAmxRule + ")" : "";
  return {"cpu", why + ", kernel family " + jit::isa_name(isa) + rule, ""};
}

}  // namespace

Backend choose_backend(const BackendRequest& r, const model::ModelFile* file, model::LoadOptions& options) {
  // 0 = all logical CPUs. More threads than the hardware runs at once only contend: capped, and said so.
  const int hw = ThreadPool::hardware_threads();
  options.threads = static_cast<int>(std::min<int64_t>(r.threads, hw));
  std::string warning;
  if (r.threads > hw) {
    warning = "--threads " + std::to_string(r.threads) + " is more than the " + std::to_string(hw) +
              " hardware threads: using " + std::to_string(hw);
  }
  const char* which = std::getenv("DLLM_EXECUTOR");
  const std::string exec = which ? which : "";
  if (!exec.empty() && exec != "jit" && exec != "reference" && exec != "reference-int8")
    throw usage_error("DLLM_EXECUTOR must be jit, reference or reference-int8, got '" + exec + "'");
  const bool reference = exec == "reference" || exec == "reference-int8";
  // The reference executor: the model's own (f32 activations), or one with quantized activations.
  const auto use_reference = [&options, &exec] {
    if (exec == "reference") {
      options.make_executor = nullptr;
      return;
    }
    options.make_executor = [](ThreadPool& pool) {
      return std::make_unique<model::ReferenceExecutor>(pool, model::ReferenceExecutor::Activations::Quantized);
    };
  };

  Backend b;
  if (r.device == "gpu" || r.device == "auto") {
    if (!file) throw Error("internal error: choosing a GPU needs the model file");
    // The model's shapes and types decide whether (and with how much memory) it can run on the GPU.
    const model::HParams& hp = file->hparams();
    const model::ModelTensors& tensors = file->tensors();
    const uint64_t need = jit::cuda::gpu_memory_needed(hp, tensors, r.max_rows);
    const jit::cuda::DeviceChoice choice =
        jit::cuda::select_device(r.device, need, jit::cuda::gpu_model_error(hp, tensors));
    if (choice.device == jit::cuda::DeviceKind::Gpu) {
      const int ordinal = choice.gpu_ordinal;
      options.make_executor = [ordinal](ThreadPool& pool) { return jit::cuda::GpuExecutor::open(pool, ordinal); };
      b = {"gpu", choice.reason, ""};
    } else if (reference) {
      use_reference();
      b = {"cpu", "DLLM_EXECUTOR=" + exec + " (" + choice.reason + ")", ""};
    } else {
      b = cpu_backend(options, choice.reason);
    }
  } else if (reference) {
    use_reference();
    b = {"cpu", "DLLM_EXECUTOR=" + exec, ""};
  } else {
    b = cpu_backend(options, "--device cpu");
  }
  b.warning = warning;
  return b;
}

}  // namespace dllm::engine
