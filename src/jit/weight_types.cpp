// The weight-type table (weight_types.h): one row per ggml weight type with kernels.
#include "jit/weight_types.h"

#include "common/error.h"
#include "jit/kernel_order.h"
#include "model/quant.h"
#include "model/quant_ref_dot.h"

namespace dllm::jit {

namespace {

using namespace quant;

// The portable and reference dots with untyped rows.
template <class W, class A, float (*F)(int64_t, const W*, const A*)>
float portable(int64_t k, const void* w, const void* a) {
  return F(k, static_cast<const W*>(w), static_cast<const A*>(a));
}
float ref_q4_k(int64_t k, const void* w, const void* a) { return vec_dot_q4_K_q8_K(k, w, a); }
float ref_q5_k(int64_t k, const void* w, const void* a) { return vec_dot_q5_K_q8_K(k, w, a); }
float ref_q6_k(int64_t k, const void* w, const void* a) { return vec_dot_q6_K_q8_K(k, w, a); }
float ref_q5_0(int64_t k, const void* w, const void* a) { return vec_dot_q5_0_q8_0(k, w, a); }

// Register plans (x64/reg_plan.h): temporaries of each body.
//   Q4_K: raw, low and high nibbles, a scale vector, d and d/16 (AVX2 shifts the high nibbles down: no d/16; its
//         one-chain body holds the nibble mask where the high nibbles were)
//   Q5_K: raw (then the high bits), low and high quants, a scale vector, d
//   Q6_K: two weight vectors, a scale vector, d (AVX2: and a second broadcast, two groups at once; one dot chain
//         a row, each sub-block a pass of its own, so that a tile has 5 rows in 16 registers instead of 3)
//   Q8_0: two weight vectors (AVX2: and their magnitudes), two scales, a product
//   Q5_0: the nibble vector, low and high quants, the fifth bits, a temporary (then two scales, a product)
// Repacked bytes per block and panel row (repack.h): quants | meta.
const WeightTypeTraits kTable[] = {
    // type            name    tag     cpu_tag      block bytes act            quant meta temps avx2 row ch2 nib   2vec  pf amx
    {GgmlType::Q4_K, "Q4_K", "q4_k", "q4k_q8k", 256, 144, ActFormat::Q8_K, 128, 20, 6, 5 + 1, 4, 1, true, false, 4096, true,
     portable<BlockQ4_K, BlockQ8_K, kernel_order_dot_q4_K>, ref_q4_k,
     /*gpu*/ true},
    {GgmlType::Q5_K, "Q5_K", "q5_k", "q5k_q8k", 256, 176, ActFormat::Q8_K, 160, 20, 5, 5 + 1, 4, 2, true, false, 4096, true,
     portable<BlockQ5_K, BlockQ8_K, kernel_order_dot_q5_K>, ref_q5_k,
     /*gpu*/ true},
    {GgmlType::Q6_K, "Q6_K", "q6_k", "q6k_q8k", 256, 210, ActFormat::Q8_K, 256, 18, 4, 4 + 2, 4, 1, false, true, 4096, true,
     portable<BlockQ6_K, BlockQ8_K, kernel_order_dot_q6_K>, ref_q6_k,
     /*gpu*/ true},
    {GgmlType::Q8_0, "Q8_0", "q8_0", "q8_0_q8_0", 32, 34, ActFormat::Q8_0, 32, 2, 5, 5 + 1, 3, 2, false, false, 8192, true,
     portable<BlockQ8_0, BlockQ8_0, kernel_order_dot_q8_0>, vec_dot_q8_0_q8_0,
     /*gpu*/ true},
    {GgmlType::Q5_0, "Q5_0", "q5_0", "q5_0_q8_0", 32, 22, ActFormat::Q8_0, 20, 2, 5, 5 + 1, 3, 2, true, false, 8192, false,
     portable<BlockQ5_0, BlockQ8_0, kernel_order_dot_q5_0>, ref_q5_0,
     /*gpu*/ true},
};
constexpr int kCount = static_cast<int>(sizeof(kTable) / sizeof(kTable[0]));

std::string type_list(bool gpu) {
  std::string out;
  int listed = 0, total = 0;
  for (const auto& r : kTable) total += !gpu || r.gpu;
  for (const auto& r : kTable) {
    if (gpu && !r.gpu) continue;
    if (listed > 0) out += listed + 1 == total ? " and " : ", ";
    out += r.name;
    ++listed;
  }
  return out;
}

}  // namespace

const WeightTypeTraits* weight_traits(GgmlType t) {
  for (const auto& r : kTable)
    if (r.type == t) return &r;
  return nullptr;
}

const WeightTypeTraits* weight_traits_by_name(const std::string& name) {
  for (const auto& r : kTable)
    if (name == r.name) return &r;
  return nullptr;
}

const WeightTypeTraits& require_weight_traits(GgmlType t, const std::string& what) {
  if (const WeightTypeTraits* r = weight_traits(t)) return *r;
  throw Error(what + " is " + ggml_type_name(t) + ": the JIT kernels take " + jit_type_list());
}

std::string jit_type_list() { return type_list(false); }
std::string gpu_type_list() { return type_list(true); }

const WeightTypeTraits* weight_table(int* count) {
  *count = kCount;
  return kTable;
}

}  // namespace dllm::jit
