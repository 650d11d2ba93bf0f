// Entry points of the GPU-facing commands.
//   dllm kernels --gpu-arch sm_XX --model PATH --out DIR
// writes the CUDA C++ translation unit generated for the model's shapes, and the PTX and CUBIN NVRTC
// makes of it for that architecture, without needing a GPU (NVRTC is needed). Usage errors are thrown
// as dllm::usage_error (exit 2), everything else as dllm::Error (exit 1).
#pragma once
#include <string>

namespace dllm::cli {

// Writes DIR/<unit>.cu, DIR/<unit>.sm_XX.ptx, DIR/<unit>.sm_XX.cubin and DIR/gpu-manifest.json (every
// kernel with its shape and the tensors that use it), creating DIR if needed; prints a summary to stdout.
// Returns the exit status (0).
int cmd_kernels_gpu(const std::string& model_path, const std::string& arch, const std::string& out_dir);

}  // namespace dllm::cli
