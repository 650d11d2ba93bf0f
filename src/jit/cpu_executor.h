// The JIT CPU executor: the model's Executor interface on top of the repacked weights and Xbyak GEMM
// kernels (jit/gemm.h) and the vectorised flash attention (jit/attention). Matrices of the weight table
// (jit/weight_types.h: Q4_K, Q5_K, Q6_K, Q8_0, Q5_0) are repacked once at load (in parallel; the source pages of
// the mapping are released afterwards so the model is not held twice); activations are quantised to int8 once per input and shared by every matrix that
// reads it (Q, K, V; gate, up). Matrices of other types (F32, F16, Q3_K, ...) go through the reference
// executor, and load_warning() says so (the commands print it once on stderr).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "jit/cpu_features.h"
#include "jit/gemm.h"
#include "model/executor.h"
#include "model/reference_executor.h"

namespace dllm::jit {

class CpuExecutor : public model::Executor {
 public:
  CpuExecutor(ThreadPool& pool, Isa isa);
  ~CpuExecutor() override;

  std::string name() const override;
  std::string load_warning() const override;
  model::WeightHandle prepare_weight(const gguf::TensorInfo& tensor) override;
  void keep_mapped(const gguf::TensorInfo& tensor) override { keep_.push_back(tensor.data); }
  // From the packed copy where unpack_row decodes its type (then prepare_weight released the mapping's pages
  // even for a keep_mapped tensor: the table is held once), else from the mapping.
  void table_row(const gguf::TensorInfo& tensor, int64_t row, float* out) const override;
  void table_rows(const gguf::TensorInfo& tensor, int64_t row0, int64_t n, float* out, int64_t stride) const override;
  void matmul(model::WeightHandle w, const float* x, int64_t rows, float* y) override;
  void matmul_shared(const model::WeightHandle* ws, float* const* ys, int n, const float* x,
                     int64_t rows) override;
  // The mixture-of-experts groups: one activation quantisation and one gemm_ranges pass for every group
  // when all are JIT matrices of one format and row length (not AMX); otherwise group by group.
  void matmul_grouped(const model::WeightHandle* ws, float* const* ys, int m, const int64_t* row0, const int64_t* n,
                      int groups, const float* x, int64_t k) override;
  // The same over gathered rows: x's rows quantised once and the quantised rows gathered (gather_acts).
  void matmul_grouped_gather(const model::WeightHandle* ws, float* const* ys, int m, const int64_t* row0,
                             const int64_t* n, int groups, const float* x, int64_t x_rows, const int64_t* src,
                             int64_t k) override;
  void attention(const model::AttentionShape& shape, const float* q, int64_t n_q, const float* k,
                 const float* v, int64_t n_kv, float* out) override;
  // Masked attention in one flash call (keys transposed once for every row's range).
  void attention_ranges(const model::AttentionShape& shape, const float* q, int64_t n_q, const float* k,
                        const float* v, int64_t n_kv, const model::KeyRange* ranges, float* out) override;

  Isa isa() const { return isa_; }
  double repack_seconds() const { return repack_seconds_; }
  uint64_t packed_bytes() const { return packed_bytes_; }
  int fallback_matrices() const { return fallback_count_; }
  // The packed matrix behind a handle this executor returned (null: a reference-path weight).
  const QuantMatrix* matrix(model::WeightHandle w) const { return slots_.at(static_cast<size_t>(w.index)).jit.get(); }

 private:
  bool grouped_ranges(const model::WeightHandle* ws, float* const* ys, int m, const int64_t* row0, const int64_t* n,
                      int groups, int64_t k, std::vector<GemmRange>& ranges, ActFormat& fmt, int64_t& total) const;
  struct Slot {
    std::unique_ptr<QuantMatrix> jit;  // null: handled by the reference executor
    model::WeightHandle ref;
  };
  ThreadPool& pool_;
  Isa isa_;
  model::ReferenceExecutor reference_;
  std::vector<Slot> slots_;
  QuantizedActs acts_, gather_src_;  // gather_src_: matmul_grouped_gather's rows before the gather
  double repack_seconds_ = 0;
  uint64_t packed_bytes_ = 0;
  int fallback_count_ = 0;
  std::string first_fallback_;         // "blk.0.attn_output.weight (Q3_K)"
  std::vector<GgmlType> fallback_types_;  // distinct, in load order
  std::vector<const uint8_t*> keep_;      // tensors whose mapped pages stay resident (keep_mapped)
  std::vector<std::pair<const uint8_t*, const QuantMatrix*>> row_tables_;  // keep_mapped tensors table_row decodes
};

// True when the JIT kernels can take a matrix of this type (the weight table's types: jit_supports_type).
inline bool jit_supports(GgmlType type) { return jit_supports_type(type); }

}  // namespace dllm::jit
