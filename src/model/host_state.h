// The executor's host-side state and the row helpers that host_ops.cpp (the dense operations) and moe_host.cpp
// (the mixture-of-experts operations) share. Private to those two files.
#pragma once
#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/thread_pool.h"
#include "model/executor.h"

namespace dllm::model {

// Runs fn over rows on the pool when there is one.
template <class F>
void for_rows(ThreadPool* pool, int64_t rows, F&& fn) {
  if (pool) {
    pool->parallel_for(rows, [&](int64_t r, int) { fn(r); });
  } else {
    for (int64_t r = 0; r < rows; ++r) fn(r);
  }
}

// out[r] = w * x[r] / sqrt(mean(x[r]^2) + eps), in double (w null: 1).
void rmsnorm(ThreadPool* pool, const float* x, int64_t rows, int64_t n, const float* w, float eps, float* out);

// gate[r] = glu(gate[r]) * up[r] for r < rows (SwiGLU or GeGLU by glu), n values a row.
void glu_rows(ThreadPool* pool, Glu glu, float* gate, const float* up, int64_t rows, int64_t n);

// cos/sin of position * base^(-2p/n_rot) / freq_factors[p] for positions 0..n_pos-1 and pairs p < n_rot/2, in
// double; grown on demand (a position's values do not depend on the table's size).
class RopeTable {
 public:
  bool is_for(const RopeSpec& spec) const {
    return spec.n_rot == n_rot_ && spec.base == base_ && spec.freq_factors == factors_;
  }
  void ensure(const RopeSpec& spec, int64_t n_pos) {
    if (is_for(spec) && n_pos <= n_pos_) return;
    if (!is_for(spec)) n_pos_ = 0;
    n_rot_ = spec.n_rot, base_ = spec.base, factors_ = spec.freq_factors, n_pos_ = std::max(n_pos, 2 * n_pos_);
    half_ = n_rot_ / 2;
    cos_.assign(static_cast<size_t>(n_pos_ * half_), 0.0);
    sin_.assign(cos_.size(), 0.0);
    for (int64_t p = 0; p < half_; ++p) {
      double inv_freq = std::pow(static_cast<double>(base_), -2.0 * static_cast<double>(p) /
                                                                 static_cast<double>(n_rot_));
      if (factors_) inv_freq /= static_cast<double>(factors_[p]);
      for (int64_t pos = 0; pos < n_pos_; ++pos) {
        const double theta = static_cast<double>(pos) * inv_freq;
        cos_[static_cast<size_t>(pos * half_ + p)] = std::cos(theta);
        sin_[static_cast<size_t>(pos * half_ + p)] = std::sin(theta);
      }
    }
  }
  int64_t half() const { return half_; }
  const double* cos_at(int64_t pos) const { return cos_.data() + pos * half_; }
  const double* sin_at(int64_t pos) const { return sin_.data() + pos * half_; }

 private:
  int64_t n_rot_ = -1, n_pos_ = 0, half_ = 0;
  float base_ = 0;
  const float* factors_ = nullptr;
  std::vector<double> cos_, sin_;
};

// One table per RoPE flavour in use (Gemma-4 alternates sliding and global layers with different RoPE).
class RopeTables {
 public:
  const RopeTable& get(const RopeSpec& spec, int64_t n_pos) {
    for (RopeTable& t : tables_) {
      if (t.is_for(spec)) {
        t.ensure(spec, n_pos);
        return t;
      }
    }
    tables_.emplace_back().ensure(spec, n_pos);
    return tables_.back();
  }

 private:
  std::deque<RopeTable> tables_;
};

struct Executor::HostState {
  struct Buffer {
    std::vector<float> data;
    int64_t rows = 0, cols = 0;
  };
  struct Kv {
    int64_t positions = 0;
    std::vector<int64_t> width;            // per layer
    std::vector<std::vector<float>> k, v;  // per layer [positions, width]
  };
  std::vector<std::vector<float>> vectors;
  std::map<int32_t, Buffer> buffers;
  std::vector<std::unique_ptr<Kv>> kv;  // null = closed (index reused)
  std::vector<float> scratch, normed;
  std::vector<float> gathered;  // matmul_grouped_gather's default: the gathered rows
  struct SoftRow {  // soft_embed: one row's nonzero F16 probabilities, ascending ids
    std::vector<int32_t> ids;
    std::vector<float> p;
  };
  std::vector<SoftRow> soft_rows;
  std::vector<float> soft_table;  // soft_embed: a block of decoded table rows
  RopeTables rope;
  // moe_ffn_on_host's buffers, kept so that a layer neither allocates nor zeroes them again.
  struct Moe {
    std::vector<float> h, xin, gate, up, wts;
    std::vector<int32_t> ids;
    std::vector<int64_t> n, row0, next, order, slot, src;
    std::vector<WeightHandle> ws;
    std::vector<float*> ys;
  } moe;

  Buffer& buf(Act a) {
    auto it = buffers.find(a.slot);
    if (it == buffers.end()) throw Error("internal error: activation slot " + std::to_string(a.slot) + " was never sized");
    return it->second;
  }
  float* at(Act a) { return buf(a).data.data(); }
  const std::vector<float>* vec(VectorHandle h) {
    if (!h.valid()) return nullptr;
    if (static_cast<size_t>(h.index) >= vectors.size()) throw Error("internal error: invalid vector handle");
    return &vectors[static_cast<size_t>(h.index)];
  }
  Kv& store(KvHandle h) {
    if (!h.valid() || static_cast<size_t>(h.index) >= kv.size() || !kv[static_cast<size_t>(h.index)])
      throw Error("internal error: invalid key/value store handle");
    return *kv[static_cast<size_t>(h.index)];
  }
  float* scratch_for(int64_t n) {
    if (static_cast<int64_t>(scratch.size()) < n) scratch.resize(static_cast<size_t>(n));
    return scratch.data();
  }
};

}  // namespace dllm::model
