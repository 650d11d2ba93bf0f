// ggml tensor types as GGUF stores them: ids, names, block sizes and bytes per block.
// The GGUF reader needs this table to size every tensor; the quant decoders say which types they decode.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace dllm {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, /* 4, 5: Q4_2, Q4_3 removed */ Q5_0 = 6, Q5_1 = 7,
  Q8_0 = 8, Q8_1 = 9, Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  /* 31-33 removed (Q4_0_4_4 ...) */ TQ1_0 = 34, TQ2_0 = 35, /* 36-38 removed */ MXFP4 = 39,
};

struct GgmlTypeInfo {
  GgmlType type;
  const char* name;     // as ggml spells it: "Q4_K", "F32", ...
  uint32_t block_size;  // elements per block
  uint32_t type_size;   // bytes per block
};

// The type with this GGUF id, or nullopt for ids that are unknown or were removed from ggml.
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t id);
// Name for any id: the ggml name when known, else "type <id>".
std::string ggml_type_name(uint32_t id);
inline std::string ggml_type_name(GgmlType t) { return ggml_type_name(static_cast<uint32_t>(t)); }

}  // namespace dllm
