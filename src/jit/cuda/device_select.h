// --device auto|cpu|gpu: which device runs the model, and why. A GPU is usable when the NVIDIA driver
// loads, the device has compute capability 8.0 or newer, NVRTC can be loaded, and enough device memory
// is free for the model. `auto` prefers a usable GPU and otherwise falls back to the CPU, saying why;
// `gpu` with no usable GPU is an error with the spec's message:
//   "no GPU found: the GPU backend needs an NVIDIA GPU with compute capability 8.0 or newer (run with --device cpu)"
//   "GPU 0 (NVIDIA GeForce GTX 1080) has compute capability 6.1: the GPU backend needs 8.0 or newer (run with --device cpu)"
//   "not enough free GPU memory on GPU 0 (NVIDIA A10): the model needs 9.3 GiB, 7.9 GiB is free (run with --device cpu)"
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "jit/cuda/driver.h"
#include "model/arch.h"

namespace dllm::jit::cuda {

enum class DeviceKind { Cpu, Gpu };

struct DeviceChoice {
  DeviceKind device = DeviceKind::Cpu;
  int gpu_ordinal = -1;   // the GPU to open when device == Gpu
  std::string reason;     // one line for --verbose / --json: "NVIDIA H200 (compute capability 9.0, 139.8 GiB free)"
};

// What the machine offers, gathered once (probe_gpus) or made up by tests.
struct GpuProbe {
  bool driver_loaded = false;
  std::string driver_error;       // why libcuda could not be used
  std::vector<DeviceInfo> devices;
  bool nvrtc_loaded = false;
  std::string nvrtc_error;
};

// Loads the driver and NVRTC (if present) and lists the devices with their free memory. Never throws.
GpuProbe probe_gpus();

// requested: "auto", "cpu" or "gpu" (anything else is a usage error). gpu_bytes_needed: device memory
// the model needs (gpu_memory_needed()). unsupported: "" or why the model cannot run on the GPU at all
// (gpu_support_error() of kernel_set.h); with `gpu` it is thrown, with `auto` it selects the CPU.
// Throws dllm::Error for `gpu` without a usable GPU.
DeviceChoice select_device(const std::string& requested, uint64_t gpu_bytes_needed, const GpuProbe& probe,
                           const std::string& unsupported = {});
// The same against the real machine (probe_gpus(), run only when the choice needs it).
DeviceChoice select_device(const std::string& requested, uint64_t gpu_bytes_needed,
                           const std::string& unsupported = {});

// Device memory to run this model: the packed weights plus the forward pass's workspace for a canvas
// of `max_rows` rows (logits for all of them) plus a fixed allowance for the context and kernels.
uint64_t gpu_memory_needed(const model::HParams& hp, const model::ModelTensors& tensors, int64_t max_rows);

// "9.3 GiB"
std::string format_gib(uint64_t bytes);

}  // namespace dllm::jit::cuda
