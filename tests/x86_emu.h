// A software x86-64 interpreter for the instruction subset of dllm's generated GEMM kernels (scalar
// control flow, AVX2, AVX-VNNI, AVX-512 with masks and broadcasts, AMX tiles), decoded by Zydis. It lets the
// suite run the kernels of families this CPU lacks (avx-vnni, avx512-vnni and amx on a Zen 3) against the
// portable family; on a CPU that has a family, the same tests check the interpreter against the silicon.
// It reads and writes the process's memory directly (the kernels' operands are ordinary pointers), keeps
// its own stack, and throws dllm::Error on an instruction it does not model rather than guessing.
#pragma once
#include <cstdint>
#include <memory>

#include "jit/gemm_desc.h"

namespace dllm::test {

class X86Emulator {
 public:
  X86Emulator();
  ~X86Emulator();
  // Calls the code at entry as void f(void* arg) (System V: arg in rdi) and returns when it returns. Throws
  // after max_instructions (a runaway loop) or on an instruction outside the modelled subset.
  void call(const uint8_t* entry, const void* arg, int64_t max_instructions = int64_t{1} << 32);
  int64_t instructions() const;  // executed by the last call

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// The GEMM driver's kernel interpreter (jit::set_kernel_interpreter) the tests install: each call runs in this
// thread's X86Emulator.
void interpret_kernel(const uint8_t* code, const jit::GemmKernelArgs* args);

// Installs interpret_kernel for a scope when `on` (and removes it after): while installed, kernels of every
// family are generated and every GEMM kernel call is interpreted.
class ScopedKernelInterpreter {
 public:
  explicit ScopedKernelInterpreter(bool on = true);
  ~ScopedKernelInterpreter();
  ScopedKernelInterpreter(const ScopedKernelInterpreter&) = delete;
  ScopedKernelInterpreter& operator=(const ScopedKernelInterpreter&) = delete;

 private:
  bool on_;
};

}  // namespace dllm::test
