// GemmDesc names and hashing, the weight types the kernels take, and the row-tile limits.
#include "jit/gemm_desc.h"

#include <algorithm>

#include "jit/x64/reg_plan.h"

namespace dllm::jit {

namespace {
const char* type_tag(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_K: return "q4k_q8k";
    case GgmlType::Q6_K: return "q6k_q8k";
    case GgmlType::Q8_0: return "q8_0_q8_0";
    default: return "unsupported";
  }
}
}  // namespace

std::string GemmDesc::name() const {
  return std::string(type_tag(wtype)) + "_gemm_" + std::to_string(m) + "x" + std::to_string(p()) + "__" +
         isa_short_name(isa) + "_k" + std::to_string(k) + "_n" + std::to_string(n);
}

size_t GemmDescHash::operator()(const GemmDesc& d) const {
  size_t h = std::hash<int64_t>()(d.n);
  auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  mix(static_cast<uint64_t>(d.k));
  mix(static_cast<uint64_t>(d.m));
  mix(static_cast<uint64_t>(d.isa));
  mix(static_cast<uint64_t>(d.wtype));
  return h;
}

ActFormat act_format_for(GgmlType wtype) { return wtype == GgmlType::Q8_0 ? ActFormat::Q8_0 : ActFormat::Q8_K; }

bool jit_supports_type(GgmlType t) { return t == GgmlType::Q4_K || t == GgmlType::Q6_K || t == GgmlType::Q8_0; }

int max_row_tile(Isa isa, GgmlType wtype, int64_t k) {
  if (isa == Isa::Portable) return 1;
  if (isa == Isa::Amx) return 16;  // the rows of an AMX tile
  int best = 1;
  for (int m = 1; m <= row_tile_cap(wtype); ++m)
    if (plan_registers(isa, wtype, m, k).m == m) best = m;
  return best;
}

}  // namespace dllm::jit
