// The device the GPU forward pass runs on, as a small interface: memory, copies, loading a kernel unit
// and launching its kernels with one parameter struct each. CudaDevice (cuda_device.h) implements it
// with the Driver API; the tests implement it with a CPU emulator of the same kernel code, so that the
// whole GPU forward pass (buffers, layouts, launches) is exercised on machines without a GPU.
// All work is ordered: a download returns after every earlier upload and launch has completed.
// A device may also record a forward step as one CUDA Graph (begin_capture / end_capture below).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "jit/cuda/kernel_set.h"

namespace dllm::jit::cuda {

using DevAddr = uint64_t;  // a device address (0 = none)

// What the graph capture did so far (Device::graph_stats), for --verbose and the tests.
struct GraphStats {
  size_t captured = 0;       // captures ended by end_capture() and launched as one graph each
  size_t instantiated = 0;   // of those, graphs built anew (a key not seen, or a changed topology)
  size_t updated = 0;        // of those, cached graphs updated in place with the capture's parameters
  size_t broken = 0;         // captures cut short by a download or synchronize() (their work ran as a graph, not kept)
  size_t graph_kernels = 0;  // kernel launches that ran inside graphs
};

// Cached executable graphs by step key (the executor's (rows, keys, logit rows)), at most `capacity`, least recently
// used dropped first. A capture whose key is not cached tries the most recently used graphs: a step of another
// shape usually has the topology of one of them, and updating a graph's parameters is much cheaper than building
// a new one.
template <class Exec>
class GraphCache {
 public:
  struct Entry {
    std::vector<int64_t> key;
    Exec exec;
    uint64_t used = 0;
  };
  static constexpr size_t kTries = 3;  // graphs a capture tries to update before building its own
  explicit GraphCache(size_t capacity = 16) : capacity_(capacity) {}
  // The entry of `key` alone when cached, else up to kTries entries, the most recently used first.
  std::vector<Entry*> candidates(std::span<const int64_t> key) {
    std::vector<Entry*> out;
    for (Entry& e : entries_) {
      if (std::equal(e.key.begin(), e.key.end(), key.begin(), key.end())) return {&e};
      out.push_back(&e);
    }
    std::sort(out.begin(), out.end(), [](const Entry* a, const Entry* b) { return a->used > b->used; });
    if (out.size() > kTries) out.resize(kTries);
    return out;
  }
  // Marks e as used by `key` (an updated candidate takes the new key).
  void touch(Entry& e, std::span<const int64_t> key) {
    e.key.assign(key.begin(), key.end());
    e.used = ++clock_;
  }
  // Adds a new graph; returns the exec dropped to stay within capacity (or nothing).
  std::vector<Exec> add(std::span<const int64_t> key, Exec exec) {
    std::vector<Exec> dropped;
    if (entries_.size() >= capacity_) {
      auto lru = entries_.begin();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->used < lru->used) lru = it;
      }
      dropped.push_back(std::move(lru->exec));
      entries_.erase(lru);
    }
    entries_.push_back(Entry{std::vector<int64_t>(key.begin(), key.end()), std::move(exec), ++clock_});
    return dropped;
  }
  std::vector<Entry>& entries() { return entries_; }
  size_t size() const { return entries_.size(); }

 private:
  size_t capacity_;
  uint64_t clock_ = 0;
  std::vector<Entry> entries_;
};

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

  // --- one forward step as one graph ---
  // Between begin_capture() and end_capture(), launches, copies, zeroing and uploads are recorded, not run (an
  // upload's bytes are read at the call), and frees wait until the recorded work has run. end_capture() launches
  // the recorded work as one graph, cached under `key` (GraphCache) and reused with updated parameters by the next
  // capture of the same topology; it returns true. A download or synchronize() during a capture first launches
  // what was recorded (a graph not kept) and ends the capture: what follows runs as plain launches, and
  // end_capture() then returns false. Devices without graphs (supports_graphs() false) never capture.
  virtual bool supports_graphs() const { return false; }
  virtual void begin_capture() {}
  virtual bool end_capture(std::span<const int64_t> key) {
    (void)key;
    return false;
  }
  virtual bool capturing() const { return false; }
  virtual GraphStats graph_stats() const { return {}; }

  // --- the profile's timers (DLLM_GPU_PROFILE), never used in a capture ---
  // mark() records a timestamp in the device's work queue after everything issued so far, without waiting, and returns
  // its index; seconds_between(a, b) waits until mark b has been reached and returns the device time from mark a to b;
  // clear_marks() drops every mark. A device without timers (has_timers() false) has the executor synchronise around
  // each timed group instead.
  virtual bool has_timers() const { return false; }
  virtual size_t mark() { return 0; }
  virtual double seconds_between(size_t a, size_t b) {
    (void)a;
    (void)b;
    return 0;
  }
  virtual void clear_marks() {}
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
