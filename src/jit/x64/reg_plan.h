// Vector register budget of the GEMM generators: how many registers each activation row of the tile
// needs (int32 sub-block dot, int32 super-block sum, f32 accumulator) and how many temporaries the
// weight unpacking needs, per weight type and family. The generators assert that their plan fits; the
// driver uses max_row_tile() (gemm_desc.h), which is computed from the same numbers.
#pragma once
#include "jit/cpu_features.h"
#include "model/ggml_types.h"

namespace dllm::jit {

struct RegPlan {
  int m = 1;                // rows in the tile
  int per_row = 0;          // registers per row (the accumulator included unless acc_in_mem)
  int temps = 0;            // temporaries, allocated after the row registers
  bool acc_in_mem = false;  // f32 accumulators on the stack (updated once per block)
  constexpr int total() const { return m * per_row + temps; }
};

inline constexpr int vector_registers(Isa isa) { return isa == Isa::Avx512Vnni ? 32 : 16; }

// Temporaries: Q4_K: raw, lo, hi, scales; Q6_K: high bits, raw, two quants, two scale vectors;
// Q8_0: weights, |weights| (AVX2) or scale product, weight scales. The ymm families add one register
// for the broadcast activations (VEX has no embedded broadcast), which AVX2 also uses for
// vpmaddubsw/vpmaddwd.
inline constexpr int plan_temps(Isa isa, GgmlType t) {
  const int base = t == GgmlType::Q4_K ? 4 : t == GgmlType::Q6_K ? 6 : 3;
  return base + (isa == Isa::Avx512Vnni ? 0 : 1);
}
inline constexpr int plan_row_regs(GgmlType t) { return t == GgmlType::Q8_0 ? 2 : 3; }

// The plan for m rows: accumulators in registers when they fit, else on the stack; m = 0 rows when
// even that does not fit (the caller treats that as "too many rows").
inline constexpr RegPlan plan_registers(Isa isa, GgmlType t, int m) {
  RegPlan p;
  p.m = m;
  p.temps = plan_temps(isa, t);
  p.per_row = plan_row_regs(t);
  if (p.total() <= vector_registers(isa)) return p;
  p.per_row -= 1;
  p.acc_in_mem = true;
  if (p.total() <= vector_registers(isa)) return p;
  p.m = 0;
  return p;
}

// Row-tile caps: enough independent vpdpbusd chains and weight reuse; more buys nothing measurable.
inline constexpr int row_tile_cap(GgmlType t) { return t == GgmlType::Q8_0 ? 12 : 8; }

}  // namespace dllm::jit
