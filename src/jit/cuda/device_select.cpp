// Device selection for --device (device_select.h).
#include "jit/cuda/device_select.h"

#include <algorithm>
#include <cstdio>

#include "jit/cuda/gpu_executor.h"
#include "jit/cuda/nvrtc.h"
#include "jit/cuda/weight_pack.h"
#include "common/error.h"

namespace dllm::jit::cuda {

namespace {

constexpr const char* kNoGpu =
    "no GPU found: the GPU backend needs an NVIDIA GPU with compute capability 8.0 or newer (run with --device cpu)";
constexpr int kMinArch = 80;
constexpr uint64_t kFixedOverhead = uint64_t{512} << 20;  // context, modules, allocator slack

std::string label(const DeviceInfo& d) { return "GPU " + std::to_string(d.ordinal) + " (" + d.name + ")"; }

std::string cc(const DeviceInfo& d) { return std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor); }

}  // namespace

std::string format_gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

GpuProbe probe_gpus() {
  GpuProbe p;
  Driver* d = Driver::get();
  if (!d) {
    p.driver_error = Driver::load_error();
  } else {
    p.driver_loaded = true;
    int count = 0;
    if (d->cuDeviceGetCount(&count) != CUDA_SUCCESS) count = 0;
    for (int i = 0; i < count; ++i) {
      DeviceInfo info;
      info.ordinal = i;
      CUdevice dev = 0;
      if (d->cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
      char name[256] = {};
      d->cuDeviceGetName(name, static_cast<int>(sizeof name - 1), dev);
      info.name = name;
      d->cuDeviceGetAttribute(&info.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
      d->cuDeviceGetAttribute(&info.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
      d->cuDeviceGetAttribute(&info.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
      d->cuDeviceTotalMem(&info.total_bytes, dev);
      // Free memory needs a context: the primary one, released again at once.
      CUcontext ctx = nullptr;
      if (d->cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS) {
        size_t free_b = 0, total_b = 0;
        if (d->cuCtxSetCurrent(ctx) == CUDA_SUCCESS && d->cuMemGetInfo(&free_b, &total_b) == CUDA_SUCCESS) {
          info.free_bytes = free_b;
        }
        d->cuCtxSetCurrent(nullptr);
        d->cuDevicePrimaryCtxRelease(dev);
      }
      p.devices.push_back(info);
    }
    if (p.devices.empty()) p.driver_error = "the NVIDIA driver reports no device";
  }
  if (Nvrtc::get()) {
    p.nvrtc_loaded = true;
  } else {
    p.nvrtc_error = Nvrtc::load_error();
  }
  return p;
}

DeviceChoice select_device(const std::string& requested, uint64_t need, const GpuProbe& probe,
                           const std::string& unsupported) {
  if (requested != "auto" && requested != "cpu" && requested != "gpu") {
    throw usage_error("flag --device must be auto, cpu or gpu, got '" + requested + "'");
  }
  DeviceChoice c;
  if (requested == "cpu") {
    c.reason = "--device cpu";
    return c;
  }
  const bool must = requested == "gpu";
  // Why the GPU cannot be used, as the error --device gpu reports; "" when it can.
  std::string why;
  const DeviceInfo* chosen = nullptr;
  if (!probe.driver_loaded || probe.devices.empty()) {
    why = kNoGpu;
  } else {
    const DeviceInfo* capable = nullptr;
    for (const DeviceInfo& d : probe.devices) {
      if (d.arch() < kMinArch) continue;
      if (!capable) capable = &d;
      if (d.free_bytes >= need) {
        chosen = &d;
        break;
      }
    }
    if (!capable) {
      const DeviceInfo& d = probe.devices.front();
      why = label(d) + " has compute capability " + cc(d) +
            ": the GPU backend needs 8.0 or newer (run with --device cpu)";
    } else if (!chosen) {
      why = "not enough free GPU memory on " + label(*capable) + ": the model needs " + format_gib(need) + ", " +
            format_gib(capable->free_bytes) + " is free (run with --device cpu)";
    } else if (!probe.nvrtc_loaded) {
      why = "the GPU backend needs NVRTC (libnvrtc.so from the CUDA toolkit, or set DLLM_NVRTC): " +
            probe.nvrtc_error + " (run with --device cpu)";
      chosen = nullptr;
    } else if (!unsupported.empty()) {
      why = unsupported;
      chosen = nullptr;
    }
  }
  if (chosen) {
    c.device = DeviceKind::Gpu;
    c.gpu_ordinal = chosen->ordinal;
    c.reason = label(*chosen) + ", compute capability " + cc(*chosen) + ", " + format_gib(chosen->free_bytes) +
               " free, the model needs " + format_gib(need);
    return c;
  }
  if (must) throw Error(why);
  c.reason = "--device auto fell back to the CPU: " + why;
  return c;
}

DeviceChoice select_device(const std::string& requested, uint64_t need, const std::string& unsupported) {
  if (requested == "cpu") return select_device(requested, need, GpuProbe{}, unsupported);
  return select_device(requested, need, probe_gpus(), unsupported);
}

uint64_t gpu_memory_needed(const model::HParams& hp, const model::ModelTensors& tensors, int64_t max_rows) {
  uint64_t bytes = kFixedOverhead;
  auto add = [&](const gguf::TensorInfo* t) {
    if (!t) return;
    WeightFormat f = WeightFormat::Q8_0;
    if (weight_format_of(t->type(), &f) && t->ne[1] % 8 == 0) {
      gguf::TensorInfo one = *t;  // a 3-D expert tensor: one expert's matrix, times the experts
      one.n_dims = 2, one.ne[2] = 1;
      bytes += packed_layout(one).device_bytes() * static_cast<uint64_t>(t->ne[2]);
    } else {
      bytes += t->nbytes;  // no kernel for it: counted as stored (the choice reports the type anyway)
    }
  };
  for (const model::LayerTensors& l : tensors.layers) {
    for (const gguf::TensorInfo* m : l.matrices()) add(m);
    bytes += static_cast<uint64_t>(hp.n_embd * 2 + 3 * hp.q_dim()) * sizeof(float);  // norms, biases
  }
  add(tensors.output);
  const int64_t rows = std::max<int64_t>(1, max_rows);
  bytes += GpuExecutor::workspace_bytes(hp, rows, rows);
  return bytes;
}

}  // namespace dllm::jit::cuda
