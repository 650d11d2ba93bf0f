// Device (device.h) on a real NVIDIA GPU through the Driver API: the device's primary context, memory
// through cuMemAlloc, copies and launches ordered on the legacy default stream, and kernel units compiled
// by NVRTC for the device's exact architecture (the on-disk cache first) and loaded as modules.
// DLLM_GPU_DEBUG=1 synchronises after every launch so that a failing kernel is named in the error.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "jit/cuda/device.h"
#include "jit/cuda/driver.h"

namespace dllm::jit::cuda {

class CudaDevice : public Device {
 public:
  // Opens GPU `ordinal`. Throws dllm::Error (no driver, no such device, NVRTC missing, ...).
  static std::unique_ptr<CudaDevice> open(int ordinal = 0);
  ~CudaDevice() override;

  std::string describe() const override;
  int arch() const override { return info_.cc_major * 10 + info_.cc_minor; }
  int sm_count() const override { return info_.sm_count; }
  DevAddr alloc(size_t bytes) override;
  void free(DevAddr p) noexcept override;
  void upload(DevAddr dst, const void* src, size_t bytes) override;
  void download(void* dst, DevAddr src, size_t bytes) override;
  void zero(DevAddr dst, size_t bytes) override;
  void copy(DevAddr dst, DevAddr src, size_t bytes) override;
  void synchronize() override;
  void load_kernels(const KernelSet& set) override;
  bool has_kernel(const std::string& name) const override { return fns_.count(name) != 0; }
  void launch(const std::string& name, const Launch& dims, const void* params, size_t bytes) override;
  const KernelLoadStats& load_stats() const override { return stats_; }

  const DeviceInfo& info() const { return info_; }
  // The NVRTC target used for this device: "sm_90", or "compute_YY" when NVRTC does not know the
  // device's architecture (the driver then compiles the PTX).
  const std::string& target() const { return target_; }
  // Notes about the kernel cache (a directory that could not be written, ...), for --verbose.
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  CudaDevice(Driver& d, DeviceInfo info);
  void bind() const;

  Driver& d_;
  DeviceInfo info_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  int driver_version_ = 0;
  std::string target_;
  bool debug_sync_ = false;
  std::vector<CUmodule> modules_;
  std::map<std::string, CUfunction> fns_;
  std::map<CUfunction, unsigned> shared_set_;  // the dynamic shared memory each function is allowed
  KernelLoadStats stats_;
  std::vector<std::string> notes_;
};

}  // namespace dllm::jit::cuda
