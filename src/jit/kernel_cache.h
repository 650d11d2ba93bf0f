// The kernel cache: one generated kernel per GemmDesc, process-wide. Lookups take a shared lock; a miss
// reserves the entry and generates the kernel outside the lock while other callers of the same
// descriptor wait on its future. A failed generation is remembered and rethrown (a dllm::Error naming
// the kernel) to every caller.
#pragma once
#include <cstdint>
#include <future>
#include <memory>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "jit/gemm_desc.h"

namespace dllm::jit {

class JitGenerator;

// A generated kernel: its descriptor, name, entry point and machine code.
class Kernel {
 public:
  Kernel(const GemmDesc& desc, std::shared_ptr<JitGenerator> gen);
  const GemmDesc& desc() const { return desc_; }
  const std::string& name() const { return name_; }
  GemmKernelFn fn() const { return fn_; }
  const uint8_t* code() const { return code_; }
  size_t code_size() const { return size_; }

 private:
  GemmDesc desc_;
  std::string name_;
  std::shared_ptr<JitGenerator> gen_;  // owns the code memory
  GemmKernelFn fn_ = nullptr;
  const uint8_t* code_ = nullptr;
  size_t size_ = 0;
};

// Generates a kernel now (no cache). Throws dllm::Error("cannot generate kernel NAME: ..."), also for a family
// this CPU lacks unless any_cpu (code to write out or interpret, never to call: `dllm kernels --isa`).
std::shared_ptr<const Kernel> generate_kernel(const GemmDesc& desc, bool any_cpu = false);

// For the tests: a software x86-64 interpreter of generated kernels (tests/x86_emu.h), so that a CPU runs the
// kernel families it lacks. While one is set, kernels of every family are generated (generate_kernel no
// longer asks the CPU) and the GEMM driver runs every kernel call through it instead of calling the code.
// Process-wide; set it before the kernels are generated, and back to nullptr before native calls matter.
using KernelInterpreter = void (*)(const uint8_t* code, const GemmKernelArgs* args);
void set_kernel_interpreter(KernelInterpreter run);
KernelInterpreter kernel_interpreter();

class KernelCache {
 public:
  // The process-wide cache.
  static KernelCache& global();

  std::shared_ptr<const Kernel> get(const GemmDesc& desc);
  // Every kernel generated so far (failed ones left out), in name order.
  std::vector<std::shared_ptr<const Kernel>> kernels() const;
  size_t size() const;
  // How many generations ran (misses), for tests.
  int64_t generations() const;

 private:
  using Entry = std::shared_future<std::shared_ptr<const Kernel>>;
  mutable std::shared_mutex mu_;
  std::unordered_map<GemmDesc, Entry, GemmDescHash> map_;
  int64_t generations_ = 0;
};

}  // namespace dllm::jit
