// Generators of the two measurement kernels behind `dllm bench peak`:
//  - PeakGen: a loop of independent int8 dot-product chains in the family's instructions (vpdpbusd zmm
//    for AVX-512-VNNI, VEX vpdpbusd ymm for AVX-VNNI, vpmaddubsw+vpmaddwd+vpaddd ymm for AVX2): the
//    int8 multiply-accumulate ceiling the GEMM kernels are measured against.
//  - ReadGen: a streaming read of a buffer with full-width loads (the memory bandwidth ceiling).
#pragma once
#include <cstdint>

#include "jit/cpu_features.h"
#include "jit/x64/jit_generator.h"

namespace dllm::jit {

class PeakGen : public JitGenerator {
 public:
  explicit PeakGen(Isa isa);
  // void fn(int64_t iterations)
  using Fn = void (*)(int64_t);
  Fn fn() const { return reinterpret_cast<Fn>(const_cast<uint8_t*>(code())); }
  // Multiply-accumulates (int8 x int8) per loop iteration.
  int64_t macs_per_iteration() const;

 private:
  void generate() override;
  Isa isa_;
  int chains_;
};

class ReadGen : public JitGenerator {
 public:
  explicit ReadGen(Isa isa);
  // void fn(const void* p, int64_t bytes): bytes a positive multiple of 256, p 64-byte aligned.
  using Fn = void (*)(const void*, int64_t);
  Fn fn() const { return reinterpret_cast<Fn>(const_cast<uint8_t*>(code())); }

 private:
  void generate() override;
  Isa isa_;
};

}  // namespace dllm::jit
