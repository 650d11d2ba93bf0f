// Device (device.h) on a real NVIDIA GPU through the Driver API: the device's primary context, memory
// through cuMemAlloc, copies and launches ordered on one created (non-blocking) stream, uploads and downloads
// through pinned staging buffers (asynchronous copies; a download waits on an event, not on the whole device),
// kernel units compiled by NVRTC for the device's exact architecture (the on-disk cache first) and loaded as
// modules, and stream capture into CUDA Graphs cached by step key (device.h). DLLM_GPU_DEBUG=1 synchronises
// after every launch so that a failing kernel is named in the error, and turns graphs off.
#pragma once
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "jit/cuda/device.h"
#include "jit/cuda/driver.h"
#include "jit/cuda/staging.h"

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
  bool supports_graphs() const override { return graphs_; }
  void begin_capture() override;
  bool end_capture(std::span<const int64_t> key) override;
  bool capturing() const override { return capturing_; }
  GraphStats graph_stats() const override { return graph_stats_; }
  bool has_timers() const override { return true; }
  size_t mark() override;
  double seconds_between(size_t a, size_t b) override;
  void clear_marks() override { marks_used_ = 0; }

  const DeviceInfo& info() const { return info_; }
  // The NVRTC target used for this device: "sm_90", or "compute_YY" when NVRTC does not know the
  // device's architecture (the driver then compiles the PTX).
  const std::string& target() const { return target_; }
  // Notes about the kernel cache (a directory that could not be written, ...), for --verbose.
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  CudaDevice(Driver& d, DeviceInfo info);
  void bind() const;
  // Waits for the stream, then frees what waited for it and lets the staging memory be reused.
  void idle();
  // Ends the capture and returns its graph (throws, naming DLLM_GPU_GRAPHS=0, when the capture failed).
  CUgraph finish_capture();
  struct Pinned {
    void* p = nullptr;
    size_t bytes = 0;
  };

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
  CUstream stream_ = nullptr;
  CUevent done_ = nullptr;
  std::vector<CUevent> marks_;  // the profile's timers (timing enabled), reused after clear_marks()
  size_t marks_used_ = 0;
  StagingArena staging_;  // upload staging (pinned)
  Pinned down_;                  // download staging
  std::vector<DevAddr> deferred_free_;
  bool graphs_ = false, capturing_ = false;
  GraphCache<CUgraphExec> graphs_cache_;
  GraphStats graph_stats_;
  size_t graph_kernels_ = 0;  // launches recorded by the open capture
};

}  // namespace dllm::jit::cuda
