// JitGenerator: prologue/epilogue and create() with errors carrying the kernel's name.
#include "jit/x64/jit_generator.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "common/error.h"

namespace dllm::jit {

namespace {

// With DLLM_PERF_MAP=1, each kernel's address range and name go to /tmp/perf-PID.map, the file `perf
// report` reads to name JIT code (the perf JIT map convention). Off by default: nothing is written.
void note_in_perf_map(const uint8_t* code, size_t size, const std::string& name) {
  const char* v = std::getenv("DLLM_PERF_MAP");
  if (v == nullptr || v[0] != '1') return;
  static std::mutex mu;
  const std::lock_guard<std::mutex> lock(mu);
  const std::string path = "/tmp/perf-" + std::to_string(getpid()) + ".map";
  if (FILE* f = std::fopen(path.c_str(), "a")) {
    std::fprintf(f, "%llx %zx %s\n", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(code)), size,
                 name.c_str());
    std::fclose(f);
  }
}

}  // namespace

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
    note_in_perf_map(getCode(), getSize(), name_);
  } catch (const Xbyak::Error& e) {
    throw Error("cannot generate kernel " + name_ + ": Xbyak: " + e.what());
  }
}

}  // namespace dllm::jit
