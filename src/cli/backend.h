// Which executor runs the model, decided in one place for every command from --device, DLLM_ISA and
// DLLM_EXECUTOR (=reference: the portable reference executor, the oracle, for comparisons).
#pragma once
#include <string>

#include "cli/settings.h"
#include "model/model.h"

namespace dllm::cli {

struct Backend {
  std::string device;  // "cpu" or "gpu"
  std::string reason;  // why it was chosen (for --verbose / --json)
};

// Fills options.threads and options.make_executor. Throws dllm::Error for --device gpu without a usable GPU
// and for a DLLM_ISA the CPU lacks.
Backend choose_backend(const Settings& s, model::LoadOptions& options);

}  // namespace dllm::cli
