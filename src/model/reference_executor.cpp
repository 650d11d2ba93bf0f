// The reference executor: matrix products that dequantize a few weight rows at a time into a per-thread
// buffer and take double-precision dot products with every activation row, and exact bidirectional
// grouped-query attention (double scores, max-subtracted softmax). Work is split over output columns
// (matmul) or (query row, head) pairs (attention); no value depends on the split. In the quantized-
// activations arithmetic, matrices of the types with an integer dot take the activation rows quantized as
// ggml does and sum each block's exact integer product, scaled in double.
#include "model/reference_executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "model/quant.h"
#include "model/quant_ref_dot.h"

namespace dllm::model {

namespace {

constexpr int64_t kRowTile = 8;  // weight rows dequantized together (reused across all activation rows)

// Whether the JIT (and ggml) multiplies weights of this type with int8 activations, and with which
// activation format: Q8_K rows for the K-quants, Q8_0 rows for Q8_0 and Q5_0.
bool has_integer_dot(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::Q8_0 ||
         t == GgmlType::Q5_0;
}
bool q8_0_activations(GgmlType t) { return t == GgmlType::Q8_0 || t == GgmlType::Q5_0; }

// One weight row against one quantized activation row: the blocks' exact values summed in double.
double quantized_dot(GgmlType t, const uint8_t* w, const uint8_t* a, int64_t k) {
  double s = 0;
  if (t == GgmlType::Q8_0) {
    const auto* wb = reinterpret_cast<const quant::BlockQ8_0*>(w);
    const auto* ab = reinterpret_cast<const quant::BlockQ8_0*>(a);
    for (int64_t b = 0; b < k / quant::kQK; ++b) {
      int32_t sum = 0;
      for (int i = 0; i < quant::kQK; ++i) sum += int32_t(wb[b].qs[i]) * ab[b].qs[i];
      s += double(quant::fp16_to_f32(wb[b].d)) * quant::fp16_to_f32(ab[b].d) * sum;
    }
    return s;
  }
  if (t == GgmlType::Q5_0) {
    const auto* ab = reinterpret_cast<const quant::BlockQ8_0*>(a);
    for (int64_t b = 0; b < k / quant::kQK; ++b) {
      quant::BlockQ5_0 wb;  // 22 bytes: no alignment to rely on
      std::memcpy(&wb, w + b * static_cast<int64_t>(sizeof(wb)), sizeof(wb));
      int32_t sum = 0;  // ggml's vec_dot_q5_0_q8_0: (q - 16) times the activations
      for (int i = 0; i < quant::kQK; ++i) sum += (quant::q5_0_quant(wb, i) - 16) * ab[b].qs[i];
      s += double(quant::fp16_to_f32(wb.d)) * quant::fp16_to_f32(ab[b].d) * sum;
    }
    return s;
  }
  const auto* ab = reinterpret_cast<const quant::BlockQ8_K*>(a);
  for (int64_t b = 0; b < k / quant::kQK_K; ++b) {
    if (t == GgmlType::Q4_K) s += quant::dot_parts_q4_K_q8_K(reinterpret_cast<const quant::BlockQ4_K*>(w)[b], ab[b]).exact_f64();
    else if (t == GgmlType::Q5_K) s += quant::dot_parts_q5_K_q8_K(reinterpret_cast<const quant::BlockQ5_K*>(w)[b], ab[b]).exact_f64();
    else s += quant::dot_parts_q6_K_q8_K(reinterpret_cast<const quant::BlockQ6_K*>(w)[b], ab[b]).exact_f64();
  }
  return s;
}

}  // namespace

ReferenceExecutor::ReferenceExecutor(ThreadPool& pool, Activations acts)
    : Executor(&pool), pool_(pool), acts_(acts), rows_scratch_(static_cast<size_t>(pool.size())), attn_scratch_(static_cast<size_t>(pool.size())) {}

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
  if (acts_ == Activations::Quantized && has_integer_dot(w.tensor.type())) return matmul_quantized(w, x, rows, y);
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
      for (int64_t j = j0; j < j1; ++j) yr[j] = static_cast<float>(dot_f64(xr, buf.data() + (j - j0) * k, k));
    }
  });
}

void ReferenceExecutor::matmul_quantized(const Weight& w, const float* x, int64_t rows, float* y) {
  const int64_t n = w.n, k = w.k;
  const GgmlType t = w.tensor.type();
  const bool q8_0 = q8_0_activations(t);
  const uint64_t act_bytes = q8_0 ? static_cast<uint64_t>(k / quant::kQK) * sizeof(quant::BlockQ8_0)
                                  : static_cast<uint64_t>(k / quant::kQK_K) * sizeof(quant::BlockQ8_K);
  acts_scratch_.resize(static_cast<size_t>(act_bytes * static_cast<uint64_t>(rows)));
  pool_.parallel_for(rows, [&](int64_t r, int) {
    uint8_t* dst = acts_scratch_.data() + static_cast<uint64_t>(r) * act_bytes;
    if (q8_0) quant::quantize_row_q8_0(x + r * k, reinterpret_cast<quant::BlockQ8_0*>(dst), k);
    else quant::quantize_row_q8_K(x + r * k, reinterpret_cast<quant::BlockQ8_K*>(dst), k);
  });
  const uint64_t row_bytes = w.tensor.row_bytes();
  pool_.parallel_for(n, [&](int64_t j, int) {
    const uint8_t* wr = w.tensor.data + static_cast<uint64_t>(j) * row_bytes;
    for (int64_t r = 0; r < rows; ++r) {
      y[r * n + j] = static_cast<float>(quantized_dot(t, wr, acts_scratch_.data() + static_cast<uint64_t>(r) * act_bytes, k));
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
      score[j] = dot_f64(qi, k + j * kv_stride + g * d, d) * sh.scale;
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
