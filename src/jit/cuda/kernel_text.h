// The device code of dllm's GPU kernels (src/jit/cuda/kernels/*.cuh) embedded in the binary as text, so
// that NVRTC can compile it at run time without any file beside the executable. The definition is generated
// from the .cuh files at build time (cmake/embed_kernels.cmake, into the build tree), so there is no copy to
// keep in step.
#pragma once
#include <string_view>
#include <vector>

namespace dllm::jit::cuda {

struct KernelFile {
  std::string_view name;  // "common.cuh", ...
  std::string_view text;
};

// The .cuh files in the order a translation unit includes them (params, common, quant, gemm, attention).
const std::vector<KernelFile>& kernel_files();

}  // namespace dllm::jit::cuda
