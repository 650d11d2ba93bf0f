// JitGenerator: prologue/epilogue and create() with errors carrying the kernel's name.
#include "jit/x64/jit_generator.h"

#include "model/error.h"

namespace dllm::jit {

JitGenerator::JitGenerator(std::string name, size_t max_code_bytes)
    : Xbyak::CodeGenerator(max_code_bytes, Xbyak::DontSetProtectRWE), name_(std::move(name)) {}

void JitGenerator::preamble() {
  push(rbp);
  mov(rbp, rsp);
  push(rbx);
  push(r12);
  push(r13);
  push(r14);
  push(r15);
}

void JitGenerator::postamble() {
  lea(rsp, ptr[rbp - 5 * 8]);
  pop(r15);
  pop(r14);
  pop(r13);
  pop(r12);
  pop(rbx);
  pop(rbp);
  vzeroupper();
  ret();
}

void JitGenerator::create() {
  try {
    generate();
    ready();
    if (!setProtectModeRE(false)) throw Error("cannot generate kernel " + name_ + ": mprotect(PROT_READ|PROT_EXEC) failed");
  } catch (const Xbyak::Error& e) {
    throw Error("cannot generate kernel " + name_ + ": Xbyak: " + e.what());
  }
}

}  // namespace dllm::jit
