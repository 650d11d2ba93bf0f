// The forward program's operations on host memory (executor.h): the element-wise work (RMSNorm, bias,
// RoPE, SwiGLU, residuals; accumulations in double where forward.h says so) around the executor's four
// primitives (matmul, matmul_shared, attention, lm_head), self-conditioning's soft embedding, the key/value
// stores and per-head q/k norms. The reference and JIT CPU executors use these; the GPU overrides them. The
// mixture-of-experts operations are in moe_host.cpp; the state both share is in host_state.h.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

#include "common/error.h"
#include "model/executor.h"
#include "model/fast_math.h"
#include "model/host_state.h"
#include "model/quant.h"
#include "common/thread_pool.h"

// GCC vector types (fast_math.h) pass through always-inlined helpers only: no call crosses a vector ABI.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace dllm::model {

namespace {

// y[c] = x[c] * scale * w[c] in double, rounded to f32; compiled for AVX-512, AVX2 and baseline x86-64.
__attribute__((target_clones("avx512f", "avx2", "default"))) void scale_row(const float* x, double scale,
                                                                           const float* w, int64_t n, float* y) {
  if (!w) {  // a norm without weight (Gemma-4's value and router norms)
    for (int64_t c = 0; c < n; ++c) y[c] = static_cast<float>(static_cast<double>(x[c]) * scale);
    return;
  }
  for (int64_t c = 0; c < n; ++c) y[c] = static_cast<float>(static_cast<double>(x[c]) * scale * w[c]);
}

void add_bias(ThreadPool* pool, float* y, int64_t rows, int64_t n, const std::vector<float>* b) {
  if (!b) return;
  for_rows(pool, rows, [&](int64_t r) {
    float* yr = y + r * n;
    for (int64_t c = 0; c < n; ++c) yr[c] += (*b)[static_cast<size_t>(c)];
  });
}

// x[r] += y[r]
void add_rows(ThreadPool* pool, float* x, const float* y, int64_t rows, int64_t n) {
  for_rows(pool, rows, [&](int64_t r) {
    for (int64_t c = 0; c < n; ++c) x[r * n + c] += y[r * n + c];
  });
}

// gate[i] = silu(gate[i]) * up[i] in f32 (as llama.cpp), compiled for AVX-512, AVX2 and baseline x86-64
// and picked at run time.
__attribute__((target_clones("avx512f", "avx2", "default"))) void swiglu_row(float* gate, const float* up,
                                                                            int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    const float g = gate[c];
    gate[c] = g / (1.0f + exp_f32(-g)) * up[c];
  }
}

// ggml's GELU table, indexed by the input's F16 bits: every F16 input's gelu_tanh computed in f32 (tanhf) and
// rounded to F16, kept as the float it is.
const float* gelu_f16_table() {
  static const std::vector<float> t = [] {
    std::vector<float> v(65536);
    for (uint32_t i = 0; i < 65536; ++i) {
      const float f = quant::fp16_to_f32(static_cast<uint16_t>(i));
      const float g = 0.5f * f * (1.0f + std::tanh(0.79788456080286535587989211986876f * f * (1.0f + 0.044715f * f * f)));
      v[i] = quant::fp16_to_f32(quant::f32_to_fp16(g));
    }
    return v;
  }();
  return t.data();
}

// geglu_row with F16C's conversion (round to nearest even, as quant::f32_to_fp16) and a gather from the float
// table, 8 at a time: the same values as the scalar lookup.
__attribute__((target("avx2,f16c"))) void geglu_row_f16c(float* gate, const float* up, int64_t n) {
  const float* tab = gelu_f16_table();
  const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    const __m256 x = _mm256_loadu_ps(gate + c);
    const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 g = _mm256_i32gather_ps(tab, _mm256_cvtepu16_epi32(h), 4);
    g = _mm256_blendv_ps(g, x, _mm256_cmp_ps(x, hi, _CMP_GE_OQ));                    // x >= 10: x
    g = _mm256_blendv_ps(g, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LE_OQ));  // x <= -10: 0
    _mm256_storeu_ps(gate + c, _mm256_mul_ps(g, _mm256_loadu_ps(up + c)));
  }
  for (; c < n; ++c) gate[c] = gelu_tanh_f16_table(gate[c]) * up[c];
}

}  // namespace

// gate[i] = gelu_tanh(gate[i]) * up[i] (Glu::GeluTanh): F16C where the CPU has it, the scalar lookup otherwise.
void geglu_row(float* gate, const float* up, int64_t n) {
  static const bool f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  if (f16c) return geglu_row_f16c(gate, up, n);
  for (int64_t c = 0; c < n; ++c) gate[c] = gelu_tanh_f16_table(gate[c]) * up[c];
}

void glu_rows(ThreadPool* pool, Glu glu, float* gate, const float* up, int64_t rows, int64_t n) {
  for_rows(pool, rows, [&](int64_t r) {
    if (glu == Glu::SiLU) swiglu_row(gate + r * n, up + r * n, n);
    else geglu_row(gate + r * n, up + r * n, n);
  });
}

// out[r] = w * x[r] / sqrt(mean(x[r]^2) + eps), in double (w null: 1).
void rmsnorm(ThreadPool* pool, const float* x, int64_t rows, int64_t n, const float* w, float eps, float* out) {
  for_rows(pool, rows, [&](int64_t r) {
    const float* xr = x + r * n;
    const double ss = dot_f64(xr, xr, n);  // the sum of squares in double
    const double scale = 1.0 / std::sqrt(ss / static_cast<double>(n) + static_cast<double>(eps));
    scale_row(xr, scale, w, n, out + r * n);
  });
}

namespace {

// Rotates the first n_rot dims of every head of rows x[r] (at position pos(r)) in place.
// Norm: pairs (2p, 2p+1). Neox: pairs (p, p + n_rot/2).
template <class Pos>
void rope(ThreadPool* pool, const RopeTable& table, RopeStyle style, float* x, int64_t rows, Pos pos,
          int64_t n_heads, int64_t head_dim) {
  const int64_t half = table.half();
  for_rows(pool, rows, [&](int64_t r) {
    const double* cs = table.cos_at(pos(r));
    const double* sn = table.sin_at(pos(r));
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xh = x + (r * n_heads + h) * head_dim;
      for (int64_t p = 0; p < half; ++p) {
        const int64_t i0 = style == RopeStyle::Norm ? 2 * p : p;
        const int64_t i1 = style == RopeStyle::Norm ? 2 * p + 1 : p + half;
        const double a = xh[i0], b = xh[i1];
        xh[i0] = static_cast<float>(a * cs[p] - b * sn[p]);
        xh[i1] = static_cast<float>(a * sn[p] + b * cs[p]);
      }
    }
  });
}

}  // namespace

Executor::Executor(ThreadPool* pool) : host_pool_(pool) {}
Executor::~Executor() = default;

Executor::HostState& Executor::host() {
  if (!host_) host_ = std::make_unique<HostState>();
  return *host_;
}

VectorHandle Executor::prepare_vector(std::span<const float> v) {
  auto& h = host();
  h.vectors.emplace_back(v.begin(), v.end());
  return VectorHandle{static_cast<int32_t>(h.vectors.size() - 1)};
}

std::span<const float> Executor::host_vector(VectorHandle v) const {
  if (!v.valid() || !host_ || static_cast<size_t>(v.index) >= host_->vectors.size()) return {};
  return host_->vectors[static_cast<size_t>(v.index)];
}

float* Executor::host_data(Act a) { return host().at(a); }

Act Executor::activation(int32_t slot, int64_t rows, int64_t cols) {
  auto& b = host().buffers[slot];
  const size_t need = static_cast<size_t>(std::max<int64_t>(rows, 1) * cols);
  if (b.data.size() < need) b.data.resize(need);
  b.rows = rows, b.cols = cols;
  return Act{slot};
}

void Executor::embed(const gguf::TensorInfo& table, std::span<const int32_t> ids, Act x) {
  auto& h = host();
  float* out = h.at(x);
  const int64_t D = table.ne[0];
  for_rows(host_pool_, static_cast<int64_t>(ids.size()), [&](int64_t i) {
    table_row(table, ids[static_cast<size_t>(i)], out + i * D);
  });
}

void Executor::norm_matmul(Act x, int64_t rows, VectorHandle norm, float eps, const WeightHandle* ws,
                           const Act* ys, int n) {
  auto& h = host();
  const int64_t D = h.buf(x).cols;
  h.normed.resize(static_cast<size_t>(std::max<int64_t>(rows, 1) * D));
  rmsnorm(host_pool_, h.at(x), rows, D, h.vec(norm) ? h.vec(norm)->data() : nullptr, eps, h.normed.data());
  float* outs[8];
  if (n > 8) throw Error("internal error: norm_matmul takes at most 8 products");
  for (int i = 0; i < n; ++i) outs[i] = h.at(ys[i]);
  matmul_shared(ws, outs, n, h.normed.data(), rows);
}

void Executor::matmul_add(WeightHandle w, Act x, int64_t rows, Act y) {
  auto& h = host();
  const int64_t n = h.buf(y).cols;
  float* o = h.scratch_for(rows * n);
  matmul(w, h.at(x), rows, o);
  add_rows(host_pool_, h.at(y), o, rows, n);
}

void Executor::swiglu_matmul_add(WeightHandle w, Act gate, Act up, int64_t rows, Act y) {
  auto& h = host();
  glu_rows(host_pool_, Glu::SiLU, h.at(gate), h.at(up), rows, h.buf(gate).cols);
  matmul_add(w, gate, rows, y);
}

void Executor::norm_swiglu_ffn(Act x, int64_t rows, VectorHandle norm, float eps, WeightHandle gate_w, WeightHandle up_w,
                               WeightHandle down_w, Act gate, Act up) {
  const WeightHandle ws[2] = {gate_w, up_w};
  const Act ys[2] = {gate, up};
  norm_matmul(x, rows, norm, eps, ws, ys, 2);
  swiglu_matmul_add(down_w, gate, up, rows, x);
}

void Executor::glu_matmul(Glu glu, WeightHandle w, Act gate, Act up, int64_t rows, Act y) {
  auto& h = host();
  glu_rows(host_pool_, glu, h.at(gate), h.at(up), rows, h.buf(gate).cols);
  matmul(w, h.at(gate), rows, h.at(y));
}

void Executor::matmul_norm_add(WeightHandle w, Act x, int64_t rows, VectorHandle norm, float eps, Act y) {
  auto& h = host();
  const int64_t n = h.buf(y).cols;
  float* o = h.scratch_for(rows * n);
  matmul(w, h.at(x), rows, o);
  const std::vector<float>* nw = h.vec(norm);
  rmsnorm(host_pool_, o, rows, n, nw ? nw->data() : nullptr, eps, o);
  add_rows(host_pool_, h.at(y), o, rows, n);
}

void Executor::norm(Act x, int64_t rows, VectorHandle norm, float eps, Act y) {
  auto& h = host();
  const std::vector<float>* nw = h.vec(norm);
  rmsnorm(host_pool_, h.at(x), rows, h.buf(x).cols, nw ? nw->data() : nullptr, eps, h.at(y));
}

void Executor::norm_add(Act x, int64_t rows, VectorHandle norm, float eps, Act y) {
  auto& h = host();
  const int64_t n = h.buf(x).cols;
  float* o = h.scratch_for(rows * n);
  const std::vector<float>* nw = h.vec(norm);
  rmsnorm(host_pool_, h.at(x), rows, n, nw ? nw->data() : nullptr, eps, o);
  add_rows(host_pool_, h.at(y), o, rows, n);
}

void Executor::add(Act x, int64_t rows, Act y) {
  auto& h = host();
  add_rows(host_pool_, h.at(y), h.at(x), rows, h.buf(x).cols);
}

void Executor::scale_rows(Act x, std::span<const float> s) {
  auto& h = host();
  const int64_t n = h.buf(x).cols;
  float* xd = h.at(x);
  for_rows(host_pool_, static_cast<int64_t>(s.size()), [&](int64_t r) {
    const float f = s[static_cast<size_t>(r)];
    for (int64_t c = 0; c < n; ++c) xd[r * n + c] *= f;
  });
}

namespace {

// x[i] rounded to F16 and back (round to nearest even, as the reference's F32 -> F16 conversions): F16C's
// conversions where the CPU has them (every AVX2 CPU dllm targets), quant's software ones otherwise; the same
// values either way.
__attribute__((target("avx2,f16c"))) void round_to_f16_f16c(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(x + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) x[i] = quant::fp16_to_f32(quant::f32_to_fp16(x[i]));
}

void round_to_f16(float* x, int64_t n) {
  static const bool f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  if (f16c) return round_to_f16_f16c(x, n);
  for (int64_t i = 0; i < n; ++i) x[i] = quant::fp16_to_f32(quant::f32_to_fp16(x[i]));
}

// The largest of l[v], v < n (-inf for none; NaN ignored; exact in any order).
__attribute__((target_clones("avx512f", "avx2", "default"))) float max_of(const float* l, int64_t n) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t v = 0; v < n; ++v) mx = l[v] > mx ? l[v] : mx;
  return mx;
}

// e[v] = exp(l[v] * inv_t - mx), v < n (exp_f64: vectorised, the same in every clone), and their sum in 16
// lanes (element v into lane v % 16) reduced in one fixed order, whichever clone runs.
__attribute__((target_clones("avx512f", "avx2", "default"))) double exp_row(const float* l, int64_t n, double inv_t,
                                                                           double mx, double* e) {
  constexpr int L = 16;
  F64x8 s0 = {}, s1 = {};  // lanes 0-7 and 8-15
  int64_t v0 = 0;
  for (; v0 + L <= n; v0 += L) {
    F64x8 z0, z1, e0, e1;
    load8_f64(z0, l + v0);
    load8_f64(z1, l + v0 + 8);
    exp_f64_into(e0, z0 * inv_t - mx);
    exp_f64_into(e1, z1 * inv_t - mx);
    std::memcpy(e + v0, &e0, sizeof e0);
    std::memcpy(e + v0 + 8, &e1, sizeof e1);
    s0 += e0;
    s1 += e1;
  }
  double lane[L];
  std::memcpy(lane, &s0, sizeof s0);
  std::memcpy(lane + 8, &s1, sizeof s1);
  for (int i = 0; v0 + i < n; ++i) lane[i] += e[v0 + i] = exp_f64(static_cast<double>(l[v0 + i]) * inv_t - mx);
  for (int w = L / 2; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) lane[i] += lane[i + w];
  return lane[0];
}

// The k-th largest of x[0, n), 0 < k <= n (NaN never counts; -inf when fewer than k values are above -inf): a
// min-heap of the k largest so far, which a value enters only when it beats the smallest.
float kth_largest(const float* x, int64_t n, size_t k) {
  std::vector<float> heap(k, -INFINITY);
  for (int64_t i = 0; i < n; ++i) {
    if (!(x[i] > heap.front())) continue;
    std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
    heap.back() = x[i];
    std::push_heap(heap.begin(), heap.end(), std::greater<float>());
  }
  return heap.front();
}

// Keeps the k largest probabilities of a row (ids ascending), ties to the lower id, in ascending id order.
void keep_most_probable(std::vector<int32_t>& ids, std::vector<float>& p, size_t k) {
  std::vector<uint32_t> at(ids.size());
  std::iota(at.begin(), at.end(), 0u);
  std::nth_element(at.begin(), at.begin() + static_cast<std::ptrdiff_t>(k) - 1, at.end(),
                   [&](uint32_t a, uint32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  at.resize(k);
  std::sort(at.begin(), at.end());
  for (size_t i = 0; i < k; ++i) ids[i] = ids[at[i]], p[i] = p[at[i]];
  ids.resize(k), p.resize(k);
}

// The soft embedding's product for one row: acc[c] += p[g] * e[g][c] for g < G in that order, c < n (a multiple of
// 16), one F32 multiply and add per term (the same in every clone: GCC vectors, the loop as written). A column's
// sum stays in a register across the G terms, so acc is loaded and stored once for G table rows, which stream
// side by side.
template <int G>
[[gnu::always_inline]] inline void soft_axpy_body(float* acc, const float* p, const float* const* e, int64_t n) {
  float pk[G];
  const float* ek[G];
  for (int g = 0; g < G; ++g) pk[g] = p[g], ek[g] = e[g];
  for (int64_t c = 0; c < n; c += 16) {
    F32x16 a, v;
    std::memcpy(&a, acc + c, sizeof a);
    for (int g = 0; g < G; ++g) {
      std::memcpy(&v, ek[g] + c, sizeof v);
      a += pk[g] * v;
    }
    std::memcpy(acc + c, &a, sizeof a);
  }
}
constexpr int kAxpyRows = 8;
__attribute__((target_clones("avx512f", "avx2", "default"))) void soft_axpy(float* acc, const float* p,
                                                                           const float* const* e, int g, int64_t n) {
  switch (g) {
    case 8: return soft_axpy_body<8>(acc, p, e, n);
    case 7: return soft_axpy_body<7>(acc, p, e, n);
    case 6: return soft_axpy_body<6>(acc, p, e, n);
    case 5: return soft_axpy_body<5>(acc, p, e, n);
    case 4: return soft_axpy_body<4>(acc, p, e, n);
    case 3: return soft_axpy_body<3>(acc, p, e, n);
    case 2: return soft_axpy_body<2>(acc, p, e, n);
    default: return soft_axpy_body<1>(acc, p, e, n);
  }
}

}  // namespace

void Executor::table_row(const gguf::TensorInfo& tensor, int64_t row, float* out) const {
  quant::dequantize_row(tensor.type(), tensor.data + static_cast<uint64_t>(row) * tensor.row_bytes(), out, tensor.ne[0]);
}

void Executor::table_rows(const gguf::TensorInfo& tensor, int64_t row0, int64_t n, float* out, int64_t stride) const {
  for (int64_t i = 0; i < n; ++i) table_row(tensor, row0 + i, out + i * stride);
}

void Executor::soft_embed(const gguf::TensorInfo& table, const float* logits, int64_t rows, float temperature,
                          int64_t top_k, float scale, Act x) {
  auto& h = host();
  const int64_t D = table.ne[0], V = table.ne[1];
  const auto sz = [](int64_t v) { return static_cast<size_t>(v); };
  // Each row's probabilities, rounded to F16 (the reference multiplies F16 by F16), kept where they are not 0:
  // at the sampler's temperatures most of a large vocabulary rounds to 0. A probability below 2^-26 of the sum
  // cannot round to a nonzero F16 (the smallest is 2^-24; below 2^-25 rounds to 0), so only the others are
  // divided and rounded.
  h.soft_rows.resize(sz(rows));
  const double inv_t = 1.0 / static_cast<double>(temperature);
  for_rows(host_pool_, rows, [&](int64_t r) {
    const float* l = logits + r * V;
    thread_local std::vector<double> ex;
    ex.resize(sz(V));
    const double mx = static_cast<double>(max_of(l, V)) * inv_t;  // the largest l * inv_t (inv_t > 0)
    const double sum = exp_row(l, V, inv_t, mx, ex.data());
    double floor = sum * 0x1p-26;
    if (top_k > 0 && top_k < V) {
      // Only the tokens that can be among the top_k by F16 probability are divided and rounded: those at least
      // the top_k-th largest exponential less an F16 rounding step and a margin (below it a probability rounds
      // strictly under the top_k-th's, so it is never kept).
      const double ek = exp_f64(static_cast<double>(kth_largest(l, V, static_cast<size_t>(top_k))) * inv_t - mx);
      floor = std::max(floor, ek * (1 - 0x1p-8) - sum * 0x1p-23);
    }
    HostState::SoftRow& row = h.soft_rows[sz(r)];
    row.ids.clear(), row.p.clear();
    for (int64_t v = 0; v < V; ++v)
      if (ex[sz(v)] >= floor) row.ids.push_back(static_cast<int32_t>(v)), row.p.push_back(static_cast<float>(ex[sz(v)] / sum));
    round_to_f16(row.p.data(), static_cast<int64_t>(row.p.size()));
    size_t kept = 0;  // those that round to 0 go
    for (size_t k = 0; k < row.p.size(); ++k)
      if (row.p[k] != 0) row.ids[kept] = row.ids[k], row.p[kept++] = row.p[k];
    row.ids.resize(kept), row.p.resize(kept);
    if (top_k > 0 && static_cast<int64_t>(kept) > top_k) keep_most_probable(row.ids, row.p, static_cast<size_t>(top_k));
  });
  // Only the tokens some row gives a nonzero probability contribute: their table rows alone are decoded (and
  // rounded to F16), kBlock at a time in ascending id order (a dispatch costs more than a small block's work), and
  // every row adds its own terms in that order, in F32 (as the reference's F16 dot products accumulate): the same
  // sums as over the whole vocabulary (a zero term never changes a sum that starts at +0). Each row takes only its
  // own entries, kAxpyRows table rows at a time (soft_axpy): at the densities seen (a few to 55% of the live
  // tokens in each row) that beats 4-row register tiles over every live token, which mostly multiply zeros.
  std::vector<uint8_t> seen(sz(V), 0);
  for (const auto& row : h.soft_rows)
    for (int32_t v : row.ids) seen[sz(v)] = 1;
  std::vector<int32_t> live, at(sz(V), 0);  // at: a live token's place in `live`
  for (int64_t v = 0; v < V; ++v)
    if (seen[sz(v)]) at[sz(v)] = static_cast<int32_t>(live.size()), live.push_back(static_cast<int32_t>(v));
  constexpr int64_t kBlock = 1024;
  const int64_t n_live = static_cast<int64_t>(live.size());
  const int64_t Dp = (D + 15) / 16 * 16;  // soft_axpy's whole vectors; the padding columns stay 0
  const int64_t slices = std::min<int64_t>(rows, host_pool_ ? host_pool_->size() : 1);
  std::vector<float> acc(sz(rows * Dp), 0.0f);
  h.soft_table.resize(sz(std::min(kBlock, std::max<int64_t>(n_live, 1)) * Dp));
  std::fill(h.soft_table.begin(), h.soft_table.end(), 0.0f);
  float* block = h.soft_table.data();
  std::vector<size_t> next(sz(rows), 0);  // each row's first entry not yet added
  for (int64_t b0 = 0; b0 < n_live; b0 += kBlock) {
    const int64_t nv = std::min(kBlock, n_live - b0);
    for_rows(host_pool_, slices, [&](int64_t sl) {
      const int64_t i1 = nv * (sl + 1) / slices;
      for (int64_t i = nv * sl / slices, j; i < i1; i = j) {  // runs of consecutive tokens decoded together
        for (j = i + 1; j < i1 && live[sz(b0 + j)] == live[sz(b0 + i)] + (j - i);) ++j;
        table_rows(table, live[sz(b0 + i)], j - i, block + i * Dp, Dp);
        for (int64_t u = i; u < j; ++u) round_to_f16(block + u * Dp, D);
      }
    });
    for_rows(host_pool_, slices, [&](int64_t sl) {
      for (int64_t r = rows * sl / slices; r < rows * (sl + 1) / slices; ++r) {
        const HostState::SoftRow& row = h.soft_rows[sz(r)];
        size_t& k = next[sz(r)];
        while (k < row.ids.size() && at[sz(row.ids[k])] < b0 + nv) {
          const float* e[kAxpyRows];  // up to kAxpyRows of the row's next entries in this block, in order
          int g = 0;
          for (; g < kAxpyRows && k + g < row.ids.size() && at[sz(row.ids[k + g])] < b0 + nv; ++g)
            e[g] = block + (at[sz(row.ids[k + g])] - b0) * Dp;
          soft_axpy(acc.data() + r * Dp, row.p.data() + k, e, g, Dp);
          k += g;
        }
      }
    });
  }
  float* out = h.at(x);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < D; ++c) out[r * D + c] = acc[sz(r * Dp + c)] * scale;
}

namespace {

// x[i] = cap * tanh(x[i] * inv), the product and the tangent rounded to f32 (tanh_f64: vectorised, the same in
// every clone).
__attribute__((target_clones("avx512f", "avx2", "default"))) void softcap_row(float* x, int64_t n, float inv,
                                                                             float cap) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(tanh_f64(static_cast<double>(x[i] * inv))) * cap;
}

}  // namespace

void Executor::softcap(float* logits, int64_t n, float cap) {
  constexpr int64_t kChunk = 1 << 14;
  const float inv = 1.0f / cap;
  for_rows(host_pool_, (n + kChunk - 1) / kChunk, [&](int64_t c) {
    softcap_row(logits + c * kChunk, std::min(kChunk, n - c * kChunk), inv, cap);
  });
}

void Executor::matmul_grouped_gather(const WeightHandle* ws, float* const* ys, int m, const int64_t* row0,
                                     const int64_t* n, int groups, const float* x, int64_t x_rows,
                                     const int64_t* src, int64_t k) {
  int64_t total = 0;
  for (int g = 0; g < groups; ++g)
    if (n[g] > 0) total = std::max(total, row0[g] + n[g]);
  auto& g = host().gathered;
  g.resize(static_cast<size_t>(total * k));
  for (int64_t i = 0; i < total; ++i) {
    if (src[i] < 0 || src[i] >= x_rows) throw Error("internal error: gathered row " + std::to_string(src[i]));
  }
  for_rows(host_pool_, total, [&](int64_t i) { std::copy_n(x + src[i] * k, k, g.data() + i * k); });
  matmul_grouped(ws, ys, m, row0, n, groups, g.data(), k);
}

void Executor::gather(Act src, std::span<const int64_t> rows, Act dst) {
  auto& h = host();
  const int64_t n = h.buf(src).cols;
  // Through a scratch copy, so src and dst may be the same buffer.
  float* tmp = h.scratch_for(static_cast<int64_t>(rows.size()) * n);
  const float* s = h.at(src);
  for (size_t i = 0; i < rows.size(); ++i) std::copy_n(s + rows[i] * n, n, tmp + static_cast<int64_t>(i) * n);
  std::copy_n(tmp, rows.size() * static_cast<size_t>(n), h.at(dst));
}

void Executor::scatter(Act src, std::span<const int64_t> rows, Act dst) {
  auto& h = host();
  const int64_t n = h.buf(src).cols;
  const float* s = h.at(src);
  float* d = h.at(dst);
  for (size_t i = 0; i < rows.size(); ++i) std::copy_n(s + static_cast<int64_t>(i) * n, n, d + rows[i] * n);
}

KvHandle Executor::kv_open(std::span<const int64_t> widths, int64_t positions) {
  auto& h = host();
  auto kv = std::make_unique<HostState::Kv>();
  kv->positions = positions;
  kv->width.assign(widths.begin(), widths.end());
  for (int64_t w : widths) kv->k.emplace_back(static_cast<size_t>(positions * w), 0.0f);
  kv->v = kv->k;
  for (size_t i = 0; i < h.kv.size(); ++i) {
    if (!h.kv[i]) {
      h.kv[i] = std::move(kv);
      return KvHandle{static_cast<int32_t>(i)};
    }
  }
  h.kv.push_back(std::move(kv));
  return KvHandle{static_cast<int32_t>(h.kv.size() - 1)};
}

void Executor::kv_grow(KvHandle kv, int64_t positions) {
  auto& s = host().store(kv);
  if (positions <= s.positions) return;
  // A layer's rows are packed at its width from the start of its buffer: growing appends.
  for (auto* lv : {&s.k, &s.v})
    for (size_t l = 0; l < lv->size(); ++l) (*lv)[l].resize(static_cast<size_t>(positions * s.width[l]), 0.0f);
  s.positions = positions;
}

std::vector<float> Executor::kv_read(KvHandle kv, int64_t positions) {
  const auto& s = host().store(kv);
  if (positions < 0 || positions > s.positions) throw Error("internal error: key/value positions out of range");
  std::vector<float> out;
  for (size_t l = 0; l < s.k.size(); ++l) {
    const auto n = static_cast<std::ptrdiff_t>(positions * s.width[l]);
    out.insert(out.end(), s.k[l].begin(), s.k[l].begin() + n);
    out.insert(out.end(), s.v[l].begin(), s.v[l].begin() + n);
  }
  return out;
}

void Executor::kv_write(KvHandle kv, int64_t positions, std::span<const float> data, int64_t data_positions) {
  auto& s = host().store(kv);
  int64_t need = 0;
  for (int64_t w : s.width) need += 2 * data_positions * w;
  if (positions < 0 || positions > data_positions || positions > s.positions || static_cast<int64_t>(data.size()) != need)
    throw Error("internal error: a key/value snapshot that does not fit the store");
  const float* at = data.data();
  for (size_t l = 0; l < s.k.size(); ++l) {
    const int64_t w = s.width[l];
    std::copy_n(at, positions * w, s.k[l].data());
    std::copy_n(at + data_positions * w, positions * w, s.v[l].data());
    at += 2 * data_positions * w;
  }
}

void Executor::kv_close(KvHandle kv) {
  auto& h = host();
  if (kv.valid() && static_cast<size_t>(kv.index) < h.kv.size()) h.kv[static_cast<size_t>(kv.index)].reset();
}

void Executor::kv_store(KvHandle kv, int64_t layer, Act k, Act v, int64_t row0, int64_t rows, int64_t pos0,
                        VectorHandle bk, VectorHandle bv, const RopeSpec& spec, const AttentionShape& shape) {
  auto& h = host();
  auto& s = h.store(kv);
  const int64_t KV = shape.kv_dim();  // this layer's width (at most the store's for it)
  if (layer < 0 || layer >= static_cast<int64_t>(s.k.size()) || KV > s.width[static_cast<size_t>(layer)])
    throw Error("internal error: key/value layer out of range");
  if (pos0 < 0 || pos0 + rows > s.positions) throw Error("internal error: key/value positions out of range");
  float* kd = s.k[static_cast<size_t>(layer)].data() + pos0 * KV;
  float* vd = s.v[static_cast<size_t>(layer)].data() + pos0 * KV;
  std::copy_n(h.at(k) + row0 * KV, rows * KV, kd);
  std::copy_n(h.at(v) + row0 * KV, rows * KV, vd);
  add_bias(host_pool_, kd, rows, KV, h.vec(bk));
  add_bias(host_pool_, vd, rows, KV, h.vec(bv));
  rope(host_pool_, h.rope.get(spec, pos0 + rows), spec.style, kd, rows, [pos0](int64_t r) { return pos0 + r; },
       shape.n_head_kv, shape.head_dim);
}

void Executor::attend(KvHandle kv, int64_t layer, int64_t n_kv, Act q, int64_t row0,
                      std::span<const int64_t> positions, VectorHandle bq, const RopeSpec& spec,
                      const AttentionShape& shape, Act out, std::span<const KeyRange> ranges) {
  auto& h = host();
  auto& s = h.store(kv);
  if (n_kv > s.positions) throw Error("internal error: attending to more positions than the store holds");
  if (layer < 0 || layer >= static_cast<int64_t>(s.k.size()) || shape.kv_dim() > s.width[static_cast<size_t>(layer)])
    throw Error("internal error: key/value layer out of range");
  const int64_t Q = shape.n_head * shape.head_dim, rows = static_cast<int64_t>(positions.size());
  float* qd = h.at(q) + row0 * Q;
  add_bias(host_pool_, qd, rows, Q, h.vec(bq));
  int64_t max_pos = 0;
  for (int64_t p : positions) max_pos = std::max(max_pos, p + 1);
  rope(host_pool_, h.rope.get(spec, max_pos), spec.style, qd, rows,
       [&](int64_t r) { return positions[static_cast<size_t>(r)]; }, shape.n_head, shape.head_dim);
  const float* kd = s.k[static_cast<size_t>(layer)].data();
  const float* vd = s.v[static_cast<size_t>(layer)].data();
  if (ranges.empty()) {
    attention(shape, qd, rows, kd, vd, n_kv, h.at(out) + row0 * Q);
    return;
  }
  if (static_cast<int64_t>(ranges.size()) != rows) throw Error("internal error: one key range per query row");
  attention_ranges(shape, qd, rows, kd, vd, n_kv, ranges.data(), h.at(out) + row0 * Q);
}

void Executor::attention_ranges(const AttentionShape& shape, const float* q, int64_t n_q, const float* k,
                                const float* v, int64_t n_kv, const KeyRange* ranges, float* out) {
  const int64_t Q = shape.n_head * shape.head_dim, KV = shape.kv_dim();
  for (int64_t i = 0; i < n_q;) {
    const KeyRange r = ranges[i];
    if (r.lo < 0 || r.hi > n_kv || r.lo >= r.hi) throw Error("internal error: bad key range");
    int64_t j = i + 1;
    while (j < n_q && ranges[j] == r) ++j;
    attention(shape, q + i * Q, j - i, k + r.lo * KV, v + r.lo * KV, r.hi - r.lo, out + i * Q);
    i = j;
  }
}

void Executor::head_norm(Act x, int64_t rows, int64_t n_heads, int64_t head_dim, VectorHandle w, float eps) {
  auto& h = host();
  head_norm_on_host(host_pool_, h.at(x), rows, n_heads, head_dim, h.vec(w) ? h.vec(w)->data() : nullptr, eps);
}

float gelu_tanh_f16_table(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  return gelu_f16_table()[quant::f32_to_fp16(x)];
}

void head_norm_on_host(ThreadPool* pool, float* x, int64_t rows, int64_t n_heads, int64_t head_dim, const float* w,
                       float eps) {
  // Every head of every row is one row of head_dim values.
  rmsnorm(pool, x, rows * n_heads, head_dim, w, eps, x);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) double dot_f64(const float* a, const float* b,
                                                                           int64_t n) {
  constexpr int L = 8;
  double lane[L] = {};
  int64_t i = 0;
  for (; i + L <= n; i += L) {
#pragma omp simd
    for (int l = 0; l < L; ++l) lane[l] += static_cast<double>(a[i + l]) * b[i + l];
  }
  for (int l = 0; i + l < n; ++l) lane[l] += static_cast<double>(a[i + l]) * b[i + l];
  return sum_lanes8(lane);
}

void Executor::final_logits(WeightHandle output, Act x, int64_t rows, VectorHandle norm, float eps, float* logits) {
  auto& h = host();
  const int64_t D = h.buf(x).cols;
  h.normed.resize(static_cast<size_t>(std::max<int64_t>(rows, 1) * D));
  rmsnorm(host_pool_, h.at(x), rows, D, h.vec(norm) ? h.vec(norm)->data() : nullptr, eps, h.normed.data());
  lm_head(output, h.normed.data(), rows, logits);
}

}  // namespace dllm::model
