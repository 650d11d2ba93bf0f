// Base class of every Xbyak generator: the System V prologue/epilogue, W^X code memory, and create(),
// which runs generate() and turns any Xbyak failure into a dllm::Error naming the kernel.
#pragma once
#include <xbyak/xbyak.h>

#include <string>

namespace dllm::jit {

class JitGenerator : public Xbyak::CodeGenerator {
 public:
  // max_code_bytes bounds the generated code; exceeding it is reported as an error by create().
  JitGenerator(std::string name, size_t max_code_bytes);
  ~JitGenerator() override = default;

  const std::string& kernel_name() const { return name_; }
  // Generates the code and makes it read+execute. Throws dllm::Error("cannot generate kernel NAME: ...").
  void create();

  const uint8_t* code() const { return getCode(); }
  size_t code_size() const { return getSize(); }

 protected:
  virtual void generate() = 0;

  // Saves the callee-saved registers the generators use (rbx, rbp, r12-r15) and sets rbp = rsp.
  void preamble();
  // Restores them, clears the upper vector state and returns.
  void postamble();

  const Xbyak::Reg64 abi_param1 = rdi;  // System V: first integer argument

 private:
  std::string name_;
};

}  // namespace dllm::jit
