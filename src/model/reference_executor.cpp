// The reference executor: matrix products that dequantize a few weight rows at a time into a per-thread
// buffer and take double-precision dot products with every activation row, and exact bidirectional
// grouped-query attention (double scores, max-subtracted softmax). Work is split over output columns
// (matmul) or (query row, head) pairs (attention); no value depends on the split.
#include "model/reference_executor.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "model/quant.h"

namespace dllm::model {

namespace {

constexpr int64_t kRowTile = 8;  // weight rows dequantized together (reused across all activation rows)

// sum a[i]*b[i] in double with four partial sums in a fixed order.
double dot(const float* a, const float* b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += static_cast<double>(a[i]) * b[i];
    s1 += static_cast<double>(a[i + 1]) * b[i + 1];
    s2 += static_cast<double>(a[i + 2]) * b[i + 2];
    s3 += static_cast<double>(a[i + 3]) * b[i + 3];
  }
  for (; i < n; ++i) s0 += static_cast<double>(a[i]) * b[i];
  return (s0 + s1) + (s2 + s3);
}

}  // namespace

ReferenceExecutor::ReferenceExecutor(ThreadPool& pool)
    : Executor(&pool), pool_(pool), rows_scratch_(static_cast<size_t>(pool.size())), attn_scratch_(static_cast<size_t>(pool.size())) {}

WeightHandle ReferenceExecutor::prepare_weight(const gguf::TensorInfo& t) {
  if (t.n_dims != 2) throw Error("tensor " + std::string(t.name) + " is not a matrix");
  if (!quant::can_dequantize(t.type())) {
    throw Error("unsupported GGUF tensor type: " + ggml_type_name(t.type_id) + " (tensor " + std::string(t.name) + ")");
  }
  Weight w{t, t.ne[1], t.ne[0]};
  w.tensor.name = {};
  weights_.push_back(w);
  return WeightHandle{static_cast<int32_t>(weights_.size() - 1)};
}

const ReferenceExecutor::Weight& ReferenceExecutor::weight(WeightHandle h) const {
  if (h.index < 0 || static_cast<size_t>(h.index) >= weights_.size()) {
    throw Error("internal error: invalid weight handle " + std::to_string(h.index));
  }
  return weights_[static_cast<size_t>(h.index)];
}

void ReferenceExecutor::matmul(WeightHandle h, const float* x, int64_t rows, float* y) {
  const Weight& w = weight(h);
  if (rows <= 0) return;
  const int64_t n = w.n, k = w.k;
  const gguf::TensorInfo& t = w.tensor;
  const uint64_t row_bytes = t.row_bytes();
  const int64_t n_tiles = (n + kRowTile - 1) / kRowTile;
  pool_.parallel_for(n_tiles, [&](int64_t tile, int thread) {
    std::vector<float>& buf = rows_scratch_[static_cast<size_t>(thread)];
    if (buf.size() < static_cast<size_t>(kRowTile * k)) buf.resize(static_cast<size_t>(kRowTile * k));
    const int64_t j0 = tile * kRowTile, j1 = std::min(n, j0 + kRowTile);
    for (int64_t j = j0; j < j1; ++j) {
      quant::dequantize_row(t.type(), t.data + static_cast<uint64_t>(j) * row_bytes, buf.data() + (j - j0) * k, k);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * k;
      float* yr = y + r * n;
      for (int64_t j = j0; j < j1; ++j) yr[j] = static_cast<float>(dot(xr, buf.data() + (j - j0) * k, k));
    }
  });
}

void ReferenceExecutor::attention(const AttentionShape& sh, const float* q, int64_t n_q, const float* k,
                                  const float* v, int64_t n_kv, float* out) {
  if (n_q <= 0) return;
  if (n_kv <= 0 || sh.n_head <= 0 || sh.n_head_kv <= 0 || sh.n_head % sh.n_head_kv != 0) {
    throw Error("internal error: bad attention shape");
  }
  const int64_t H = sh.n_head, d = sh.head_dim, group = sh.n_head / sh.n_head_kv;
  const int64_t q_stride = H * d, kv_stride = sh.n_head_kv * d;
  pool_.parallel_for(n_q * H, [&](int64_t item, int thread) {
    const int64_t i = item / H, h = item % H, g = h / group;
    std::vector<double>& buf = attn_scratch_[static_cast<size_t>(thread)];
    if (buf.size() < static_cast<size_t>(n_kv + d)) buf.resize(static_cast<size_t>(n_kv + d));
    double* score = buf.data();
    double* acc = buf.data() + n_kv;
    const float* qi = q + i * q_stride + h * d;
    double max_s = -INFINITY;
    for (int64_t j = 0; j < n_kv; ++j) {
      score[j] = dot(qi, k + j * kv_stride + g * d, d) * sh.scale;
      max_s = std::max(max_s, score[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < n_kv; ++j) {
      score[j] = std::exp(score[j] - max_s);
      sum += score[j];
    }
    std::fill(acc, acc + d, 0.0);
    for (int64_t j = 0; j < n_kv; ++j) {
      const float* vj = v + j * kv_stride + g * d;
      const double p = score[j];
      for (int64_t c = 0; c < d; ++c) acc[c] += p * vj[c];
    }
    float* oi = out + i * q_stride + h * d;
    for (int64_t c = 0; c < d; ++c) oi[c] = static_cast<float>(acc[c] / sum);
  });
}

}  // namespace dllm::model
