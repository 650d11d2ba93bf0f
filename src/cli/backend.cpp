// choose_backend: --device cpu -> the JIT CPU executor (kernel family from DLLM_ISA, else the best the CPU
// has); DLLM_EXECUTOR=reference -> the reference executor; --device gpu / auto -> see the GPU backend.
#include "cli/backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "jit/cpu_executor.h"
#include "jit/cpu_features.h"
#include "model/error.h"

namespace dllm::cli {

Backend choose_backend(const Settings& s, model::LoadOptions& options) {
  options.threads = static_cast<int>(std::min<int64_t>(s.threads, 4096));  // 0 = all logical CPUs
  if (s.device == "gpu")
    throw Error("no GPU found: the GPU backend needs an NVIDIA GPU with compute capability 8.0 or newer "
                "(run with --device cpu)");
  const char* which = std::getenv("DLLM_EXECUTOR");
  if (which && std::strcmp(which, "reference") == 0) {
    options.make_executor = nullptr;  // the model's reference executor
    return {"cpu", "DLLM_EXECUTOR=reference"};
  }
  if (which && *which && std::strcmp(which, "jit") != 0)
    throw usage_error(std::string("DLLM_EXECUTOR must be jit or reference, got '") + which + "'");
  const jit::Isa isa = jit::default_isa();  // DLLM_ISA cap, checked against the CPU
  options.make_executor = [isa](ThreadPool& pool) { return std::make_unique<jit::CpuExecutor>(pool, isa); };
  std::string reason = s.device == "auto" ? "--device auto: no usable GPU" : "--device cpu";
  return {"cpu", reason + ", kernel family " + jit::isa_name(isa)};
}

}  // namespace dllm::cli
