// Which executor runs the model, decided in one place for every command from the requested device, DLLM_ISA
// and DLLM_EXECUTOR (=reference: the portable reference executor, the oracle, for comparisons).
#pragma once
#include <cstdint>
#include <string>

#include "model/model.h"

namespace dllm::engine {

struct BackendRequest {
  std::string device = "auto";  // cpu, gpu, or auto (a usable GPU, else the CPU)
  int64_t threads = 0;          // worker threads; 0 = all logical CPUs
  int64_t max_rows = 0;         // canvas rows (over all sequences of a step) the GPU workspace must hold
};

struct Backend {
  std::string device;   // "cpu" or "gpu"
  std::string reason;   // why it was chosen (for --verbose / --json)
  std::string warning;  // for the user, "" when none (more threads than the hardware runs: capped)
};

// Fills options.threads and options.make_executor. file: the model, opened once; read (its tensors
// checked) only for gpu / auto, and may be null for cpu. Throws dllm::Error for gpu without a usable GPU,
// for a DLLM_ISA the CPU lacks, and (usage) for a DLLM_EXECUTOR other than jit or reference.
Backend choose_backend(const BackendRequest& request, const model::ModelFile* file, model::LoadOptions& options);

}  // namespace dllm::engine
