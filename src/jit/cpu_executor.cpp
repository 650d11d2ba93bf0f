// CpuExecutor: prepare_weight repacks into QuantMatrix slots; matmul quantises activations and runs the
// JIT GEMM; attention is the flash kernel; other weight types go through the reference executor.
#include "jit/cpu_executor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "jit/attention/attention.h"
#include "jit/cpu_features.h"
#include "common/error.h"
#include "jit/weight_types.h"

namespace dllm::jit {

CpuExecutor::CpuExecutor(ThreadPool& pool, Isa isa) : Executor(&pool), pool_(pool), isa_(isa), reference_(pool) {}

CpuExecutor::~CpuExecutor() = default;

std::string CpuExecutor::name() const { return std::string("jit-") + isa_name(isa_); }

std::string CpuExecutor::load_warning() const {
  if (fallback_count_ == 0) return {};
  std::string types;
  for (GgmlType t : fallback_types_) types += (types.empty() ? "" : ", ") + ggml_type_name(t);
  const std::string more = fallback_count_ > 1 ? " and " + std::to_string(fallback_count_ - 1) + " more" : "";
  return std::to_string(fallback_count_) + (fallback_count_ == 1 ? " weight matrix" : " weight matrices") + " of type " +
         types + " (" + first_fallback_ + more + ") have no JIT kernel and run on the slow reference path; kernels exist for " +
         jit_type_list();
}

namespace {

// Drops the pages of [p, p + n) from this process's resident set: the tensor was repacked into its own
// memory and the kernels never read the mapping again. The file stays mapped (and readable) all the same.
void release_source_pages(const void* p, uint64_t n) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace

model::WeightHandle CpuExecutor::prepare_weight(const gguf::TensorInfo& t) {
  Slot slot;
  if (jit_supports(t.type())) {
    auto t0 = std::chrono::steady_clock::now();
    slot.jit = std::make_unique<QuantMatrix>(
        prepare_matrix(t.type(), t.ne[0], t.ne[1], t.data, isa_, pool_, std::string(t.name)));
    repack_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    packed_bytes_ += slot.jit->packed.size();
    const bool keep = std::find(keep_.begin(), keep_.end(), t.data) != keep_.end();
    if (keep && slot.jit->packed.size() > 0 && can_unpack_rows(t.type())) row_tables_.emplace_back(t.data, slot.jit.get());
    if (slot.jit->packed.size() > 0 && (!keep || can_unpack_rows(t.type()))) release_source_pages(t.data, t.nbytes);
  } else {
    slot.ref = reference_.prepare_weight(t);
    if (fallback_count_++ == 0) first_fallback_ = std::string(t.name) + " (" + ggml_type_name(t.type()) + ")";
    if (std::find(fallback_types_.begin(), fallback_types_.end(), t.type()) == fallback_types_.end())
      fallback_types_.push_back(t.type());
  }
  slots_.push_back(std::move(slot));
  return model::WeightHandle{static_cast<int32_t>(slots_.size() - 1)};
}

void CpuExecutor::table_row(const gguf::TensorInfo& tensor, int64_t row, float* out) const {
  for (const auto& [data, m] : row_tables_)
    if (data == tensor.data) return unpack_row(*m, row, out);
  Executor::table_row(tensor, row, out);
}

void CpuExecutor::table_rows(const gguf::TensorInfo& tensor, int64_t row0, int64_t n, float* out,
                             int64_t stride) const {
  for (const auto& [data, m] : row_tables_)
    if (data == tensor.data) return unpack_rows(*m, row0, n, out, stride);
  Executor::table_rows(tensor, row0, n, out, stride);
}

void CpuExecutor::matmul(model::WeightHandle w, const float* x, int64_t rows, float* y) {
  matmul_shared(&w, &y, 1, x, rows);
}

void CpuExecutor::matmul_shared(const model::WeightHandle* ws, float* const* ys, int n, const float* x,
                                int64_t rows) {
  if (rows <= 0) return;
  // Consecutive JIT matrices that read the same quantised activations run as one gemm_many pass.
  std::vector<const QuantMatrix*> batch;
  std::vector<float*> outs;
  ActFormat fmt{};
  int64_t k = 0;
  auto flush = [&] {
    if (!batch.empty()) gemm_many(batch.data(), outs.data(), static_cast<int>(batch.size()), acts_, pool_);
    batch.clear();
    outs.clear();
  };
  for (int i = 0; i < n; ++i) {
    if (ws[i].index < 0 || static_cast<size_t>(ws[i].index) >= slots_.size())
      throw Error("internal error: bad weight handle");
    Slot& s = slots_[static_cast<size_t>(ws[i].index)];
    if (!s.jit) {
      reference_.matmul(s.ref, x, rows, ys[i]);
      continue;
    }
    const ActFormat want = act_format_for(s.jit->type);
    if (batch.empty() || want != fmt || s.jit->k != k) {
      flush();
      quantize_acts(want, x, rows, s.jit->k, acts_, pool_);
      fmt = want, k = s.jit->k;
    }
    batch.push_back(s.jit.get());
    outs.push_back(ys[i]);
  }
  flush();
}

// The ranges of a grouped product when one gemm_ranges pass can run it (every matrix a non-AMX JIT matrix of
// row length k, all of one activation format): false otherwise. total: the rows up to the last group's end.
bool CpuExecutor::grouped_ranges(const model::WeightHandle* ws, float* const* ys, int m, const int64_t* row0,
                                 const int64_t* n, int groups, int64_t k, std::vector<GemmRange>& ranges,
                                 ActFormat& fmt, int64_t& total) const {
  ranges.clear();
  total = 0;
  for (int g = 0; g < groups; ++g) {
    if (n[g] <= 0) continue;
    total = std::max(total, row0[g] + n[g]);
    for (int j = 0; j < m; ++j) {
      const model::WeightHandle h = ws[g * m + j];
      if (h.index < 0 || static_cast<size_t>(h.index) >= slots_.size()) throw Error("internal error: bad weight handle");
      const Slot& s = slots_[static_cast<size_t>(h.index)];
      if (!s.jit || s.jit->isa == Isa::Amx || s.jit->k != k || (!ranges.empty() && act_format_for(s.jit->type) != fmt))
        return false;
      fmt = act_format_for(s.jit->type);
      ranges.push_back({s.jit.get(), ys[g * m + j], row0[g], n[g]});
    }
  }
  return true;
}

void CpuExecutor::matmul_grouped(const model::WeightHandle* ws, float* const* ys, int m, const int64_t* row0,
                                 const int64_t* n, int groups, const float* x, int64_t k) {
  std::vector<GemmRange> ranges;
  ActFormat fmt{};
  int64_t total = 0;
  if (!grouped_ranges(ws, ys, m, row0, n, groups, k, ranges, fmt, total))
    return model::Executor::matmul_grouped(ws, ys, m, row0, n, groups, x, k);
  if (ranges.empty()) return;
  quantize_acts(fmt, x, total, k, acts_, pool_);
  gemm_ranges(ranges.data(), static_cast<int>(ranges.size()), acts_, pool_);
}

void CpuExecutor::matmul_grouped_gather(const model::WeightHandle* ws, float* const* ys, int m, const int64_t* row0,
                                        const int64_t* n, int groups, const float* x, int64_t x_rows,
                                        const int64_t* src, int64_t k) {
  std::vector<GemmRange> ranges;
  ActFormat fmt{};
  int64_t total = 0;
  if (!grouped_ranges(ws, ys, m, row0, n, groups, k, ranges, fmt, total))
    return model::Executor::matmul_grouped_gather(ws, ys, m, row0, n, groups, x, x_rows, src, k);
  if (ranges.empty()) return;
  quantize_acts(fmt, x, x_rows, k, gather_src_, pool_);
  gather_acts(gather_src_, src, total, acts_, pool_);
  gemm_ranges(ranges.data(), static_cast<int>(ranges.size()), acts_, pool_);
}

void CpuExecutor::attention(const model::AttentionShape& shape, const float* q, int64_t n_q, const float* k,
                            const float* v, int64_t n_kv, float* out) {
  attention_ranges(shape, q, n_q, k, v, n_kv, nullptr, out);
}

void CpuExecutor::attention_ranges(const model::AttentionShape& shape, const float* q, int64_t n_q, const float* k,
                                   const float* v, int64_t n_kv, const model::KeyRange* ranges, float* out) {
  // A family the CPU lacks runs only under the tests' kernel interpreter (kernel_cache.h): its attention then
  // takes the widest vectors the CPU has, which give the same bits (every width keeps one reduction order).
  const Isa att = cpu_features().supports(isa_) ? isa_ : cpu_features().best();
  flash_attention(shape, q, n_q, k, v, n_kv, out, pool_, att, ranges);
}

}  // namespace dllm::jit
