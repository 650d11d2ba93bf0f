// Flash-style bidirectional grouped-query attention on the CPU: tiles of queries against streamed tiles of
// keys with an online softmax, vectorised with AVX-512 or AVX2 (chosen by the kernel family), no [n, n] score
// matrix. Same contract as model::Executor::attention: q [n_q, H*d] (RoPE'd), k and v [n_kv, Hkv*d],
// out [n_q, H*d]; query head h reads kv head h / (H / Hkv). With `ranges` (one per query row), row i attends
// to keys [lo, hi) only, each row's result bit-identical to an unmasked call over its keys alone (the keys
// are transposed once for every row: a causal prompt is one call, not one per row).
#pragma once
#include <cstdint>

#include "jit/cpu_features.h"
#include "model/executor.h"
#include "common/thread_pool.h"

namespace dllm::jit {

void flash_attention(const model::AttentionShape& shape, const float* q, int64_t n_q, const float* k,
                     const float* v, int64_t n_kv, float* out, ThreadPool& pool, Isa isa,
                     const model::KeyRange* ranges = nullptr);

}  // namespace dllm::jit
