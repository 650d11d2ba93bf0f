// GemmDesc names and hashing, and the row-tile limits.
#include "jit/gemm_desc.h"

#include <algorithm>

#include "jit/x64/reg_plan.h"

namespace dllm::jit {

std::string GemmDesc::name() const {
  const WeightTypeTraits* w = weight_traits(wtype);
  return std::string(w ? w->cpu_tag : "unsupported") + "_gemm_" + std::to_string(m) + "x" + std::to_string(p()) + "__" +
         isa_short_name(isa) + "_k" + std::to_string(k) + "_n" + std::to_string(n) + (prefetch ? "_pf" : "");
}

bool first_tile_prefetches(Isa isa, int m) { return isa == Isa::Avx2 && m < 4; }

size_t GemmDescHash::operator()(const GemmDesc& d) const {
  size_t h = std::hash<int64_t>()(d.n);
  auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  mix(static_cast<uint64_t>(d.k));
  mix(static_cast<uint64_t>(d.m));
  mix(static_cast<uint64_t>(d.isa));
  mix(static_cast<uint64_t>(d.wtype));
  mix(static_cast<uint64_t>(d.prefetch));
  return h;
}

int max_row_tile(Isa isa, GgmlType wtype, int64_t k) {
  if (isa == Isa::Portable) return 1;
  if (isa == Isa::Amx) return 16;  // the rows of an AMX tile
  int best = 1;
  for (int m = 1; m <= row_tile_cap(wtype); ++m)
    if (plan_registers(isa, wtype, m, k).m == m) best = m;
  return best;
}

}  // namespace dllm::jit
