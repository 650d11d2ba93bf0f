// Vector register budget of the GEMM generators: how many registers each activation row of the tile
// needs (int32 sub-block dot, int32 super-block sum, f32 accumulator) and how many temporaries the
// weight unpacking needs, per weight type and family. The generators assert that their plan fits; the
// driver uses max_row_tile() (gemm_desc.h), which is computed from the same numbers.
#pragma once
#include "jit/cpu_features.h"
#include "jit/gemm_desc.h"
#include "jit/weight_types.h"
#include "model/ggml_types.h"

namespace dllm::jit {

struct RegPlan {
  int m = 1;                // rows in the tile
  int vectors = 1;          // vectors per panel (panel_rows / vector_rows): each row has this many of each
  int chains = 2;           // int32 dot chains per row and vector
  int per_row = 0;          // registers per row (the accumulators included unless acc_in_mem)
  int temps = 0;            // temporaries, allocated after the row registers
  bool acc_in_mem = false;  // f32 accumulators on the stack (updated once per block)
  constexpr int total() const { return m * per_row + temps; }
};

inline constexpr int vector_registers(Isa isa) { return isa_has_avx512(isa) ? 32 : 16; }

// Temporaries per weight type: the table's counts (weight_types.cpp says what each body holds). The ymm
// families add one register for the broadcast activations (VEX has no embedded broadcast), which AVX2
// also uses for vpmaddubsw/vpmaddwd (its own count, temps_avx2, includes it).
// Two-vector panels (Q6_K on zmm): two weight vectors, two scale vectors and two d (one per vector of
// the panel), and two broadcast activation registers used by alternate rows (the tile broadcasts each
// activation once for both vectors): twice the one-vector count.
inline int plan_temps(Isa isa, GgmlType t, int64_t k) {
  const WeightTypeTraits& w = require_weight_traits(t, "register plan: weight type");
  if (isa == Isa::Avx2) return w.temps_avx2;
  if (panel_rows(isa, t, k) / vector_rows(isa) == 2) return 2 * w.temps;
  return w.temps + (isa_has_avx512(isa) ? 0 : 1);
}
// Per row: two int32 dot chains (two sub-blocks, or two Q8_0 blocks, in flight; on AVX2 the table's chains_avx2),
// the f32 sum of the current super-block (K-quants), and the f32 accumulator.
inline int plan_chains(Isa isa, GgmlType t) {
  return isa == Isa::Avx2 ? require_weight_traits(t, "register plan: weight type").chains_avx2 : 2;
}
inline int plan_row_regs(Isa isa, GgmlType t) {
  return require_weight_traits(t, "register plan: weight type").row_regs - 2 + plan_chains(isa, t);
}

// The plan for m rows: accumulators in registers when they fit, else on the stack; m = 0 rows when
// even that does not fit (the caller treats that as "too many rows").
inline RegPlan plan_registers(Isa isa, GgmlType t, int m, int64_t k) {
  RegPlan p;
  p.m = m;
  p.temps = plan_temps(isa, t, k);
  p.vectors = panel_rows(isa, t, k) / vector_rows(isa);
  p.chains = plan_chains(isa, t);
  p.per_row = plan_row_regs(isa, t) * p.vectors;
  if (p.total() <= vector_registers(isa)) return p;
  p.per_row -= p.vectors;
  p.acc_in_mem = true;
  if (p.total() <= vector_registers(isa)) return p;
  p.m = 0;
  return p;
}

// Row-tile cap: 8 rows give 16 independent vpdpbusd chains and reuse each weight vector 8 times.
inline constexpr int row_tile_cap(GgmlType) { return 8; }

}  // namespace dllm::jit
