// The device the GPU forward pass runs on, as a small interface: memory, copies, loading a kernel unit
// and launching its kernels with one parameter struct each. CudaDevice (cuda_device.h) implements it
// with the Driver API; the tests implement it with a CPU emulator of the same kernel code, so that the
// whole GPU forward pass (buffers, layouts, launches) is exercised on machines without a GPU.
// All work is ordered: a download returns after every earlier upload and launch has completed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "jit/cuda/kernel_set.h"

namespace dllm::jit::cuda {

using DevAddr = uint64_t;  // a device address (0 = none)

// Time spent making kernels launchable, for --verbose.
struct KernelLoadStats {
  int units_compiled = 0;     // translation units NVRTC compiled
  int units_from_cache = 0;   // units whose binary came from the on-disk cache
  double compile_seconds = 0; // NVRTC time
  double load_seconds = 0;    // total time of load_kernels(), compile and module load included
};

class Device {
 public:
  virtual ~Device() = default;

  virtual std::string describe() const = 0;  // "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)"
  // 10 * major + minor of the compute capability (90 for sm_90); 0 for the CPU emulator.
  virtual int arch() const { return 0; }
  // Streaming multiprocessors (the GEMMs' choice of tiling); 0 when unknown.
  virtual int sm_count() const { return 0; }

  virtual DevAddr alloc(size_t bytes) = 0;   // uninitialised; throws dllm::Error when out of memory
  virtual void free(DevAddr p) noexcept = 0;
  virtual void upload(DevAddr dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, DevAddr src, size_t bytes) = 0;
  virtual void zero(DevAddr dst, size_t bytes) = 0;
  virtual void copy(DevAddr dst, DevAddr src, size_t bytes) = 0;  // device to device (may not overlap)
  virtual void synchronize() = 0;

  // Makes every kernel of `set` launchable (compiling the set as one unit when needed).
  virtual void load_kernels(const KernelSet& set) = 0;
  virtual bool has_kernel(const std::string& name) const = 0;
  // Launches kernel `name` with one parameter struct (params points at it, `bytes` long) and dims.shared_bytes
  // of dynamic shared memory.
  virtual void launch(const std::string& name, const Launch& dims, const void* params, size_t bytes) = 0;

  virtual const KernelLoadStats& load_stats() const = 0;
};

// A device allocation freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device& dev, size_t bytes) : dev_(&dev), bytes_(bytes), addr_(bytes ? dev.alloc(bytes) : 0) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : dev_(o.dev_), bytes_(o.bytes_), addr_(o.addr_) { o.addr_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      dev_ = o.dev_;
      bytes_ = o.bytes_;
      addr_ = o.addr_;
      o.addr_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  DevAddr addr() const { return addr_; }
  size_t bytes() const { return bytes_; }
  template <class T>
  T* as() const { return reinterpret_cast<T*>(static_cast<uintptr_t>(addr_)); }  // for parameter structs
  void reset() {
    if (addr_ && dev_) dev_->free(addr_);
    addr_ = 0;
    bytes_ = 0;
  }

 private:
  Device* dev_ = nullptr;
  size_t bytes_ = 0;
  DevAddr addr_ = 0;
};

}  // namespace dllm::jit::cuda
