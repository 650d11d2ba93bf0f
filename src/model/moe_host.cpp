// The mixture-of-experts operations on host rows (executor.h): the router (logits in double, four rows by four
// experts at a time), the (row, expert) pairs grouped by expert for the executor's grouped GEMMs, and the
// weighted sum of the experts' outputs. The GPU runs them on a host copy of its rows.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/error.h"
#include "model/executor.h"
#include "model/fast_math.h"
#include "model/host_state.h"

// GCC vector types (fast_math.h) pass through always-inlined helpers only: no call crosses a vector ABI.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace dllm::model {

void Executor::moe_ffn(const MoeLayer& m, Act x, int64_t rows, VectorHandle norm, float eps) {
  auto& h = host();
  moe_ffn_on_host(*this, host_pool_, m, *h.vec(m.router), *h.vec(norm), eps, h.at(x), rows, h.buf(x).cols, nullptr,
                  host_vector(m.router_scale));
}

void Executor::moe_ffn_to(const MoeLayer& m, Act x, int64_t rows, VectorHandle norm, float eps, Act out) {
  auto& h = host();
  moe_ffn_on_host(*this, host_pool_, m, *h.vec(m.router), *h.vec(norm), eps, h.at(x), rows, h.buf(x).cols, h.at(out),
                  host_vector(m.router_scale));
}

void Executor::route(const MoeLayer& m, std::span<const float> router, const float* h, int64_t rows, int64_t D,
                     int32_t* ids, float* weights) {
  moe_route(router, h, rows, D, m.n_expert, m.n_used, m.norm_weights, ids, weights, nullptr, host_pool_);
}

// out[j] = dot_f64(a, b + j * stride, n), j < 4: four rows against one at once, each in its own 8 lanes (element i
// into lane i % 8) reduced in dot_f64's order, so each is dot_f64's value bit for bit; four chains of additions
// instead of one hide the additions' latency.
__attribute__((target_clones("avx512f", "avx2", "default"))) void dot4_f64(const float* a, const float* b,
                                                                          int64_t stride, int64_t n, double* out) {
  constexpr int L = 8;
  double lane[4][L] = {};
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    for (int j = 0; j < 4; ++j) {
#pragma omp simd
      for (int l = 0; l < L; ++l) lane[j][l] += static_cast<double>(a[i + l]) * b[j * stride + i + l];
    }
  }
  for (int j = 0; j < 4; ++j) {
    for (int l = 0; i + l < n; ++l) lane[j][l] += static_cast<double>(a[i + l]) * b[j * stride + i + l];
    out[j] = sum_lanes8(lane[j]);
  }
}

// out[r * 4 + j] = dot_f64(a + r * astride, b + j * bstride, n) for r, j < 4, with both operands' rows given in
// double (converted once by the caller: the products are the same; converting the router's rows inside the loop
// took as many instructions as the products): four rows against four, each product in its own 8 lanes reduced in
// dot_f64's order (bit for bit dot_f64), every element of a and b used four times. GCC's vector types
// (fast_math.h) keep the 16 sums in registers (an array of lanes stays in memory); no contraction anywhere, so
// every clone is equal.
__attribute__((target_clones("avx512f", "avx2", "default"))) void dot4x4_f64(const double* a, int64_t astride,
                                                                            const double* b, int64_t bstride,
                                                                            int64_t n, double* out) {
  constexpr int L = 8;
  F64x8 s00 = {}, s01 = {}, s02 = {}, s03 = {}, s10 = {}, s11 = {}, s12 = {}, s13 = {};
  F64x8 s20 = {}, s21 = {}, s22 = {}, s23 = {}, s30 = {}, s31 = {}, s32 = {}, s33 = {};
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    F64x8 b0, b1, b2, b3, x;
    std::memcpy(&b0, b + i, sizeof b0);
    std::memcpy(&b1, b + bstride + i, sizeof b1);
    std::memcpy(&b2, b + 2 * bstride + i, sizeof b2);
    std::memcpy(&b3, b + 3 * bstride + i, sizeof b3);
    std::memcpy(&x, a + i, sizeof x);
    s00 += x * b0, s01 += x * b1, s02 += x * b2, s03 += x * b3;
    std::memcpy(&x, a + astride + i, sizeof x);
    s10 += x * b0, s11 += x * b1, s12 += x * b2, s13 += x * b3;
    std::memcpy(&x, a + 2 * astride + i, sizeof x);
    s20 += x * b0, s21 += x * b1, s22 += x * b2, s23 += x * b3;
    std::memcpy(&x, a + 3 * astride + i, sizeof x);
    s30 += x * b0, s31 += x * b1, s32 += x * b2, s33 += x * b3;
  }
  const F64x8 sums[16] = {s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33};
  for (int r = 0; r < 4; ++r) {
    for (int j = 0; j < 4; ++j) {
      double lane[L];
      std::memcpy(lane, &sums[r * 4 + j], sizeof lane);
      for (int l = 0; i + l < n; ++l)
        lane[l] += a[r * astride + i + l] * b[j * bstride + i + l];
      out[r * 4 + j] = sum_lanes8(lane);
    }
  }
}

namespace {

// One row's routing from its E logits (overwritten with the probabilities): softmax (f32 probabilities, the sum
// in double), the k most probable experts (ties: lower index) into ids, their probabilities (renormalised when
// norm_weights) into weights, every probability into probs when given.
void route_row(float* p, int64_t E, int64_t k, bool norm_weights, int32_t* ids, float* weights, float* probs) {
  float mx = -INFINITY;
  for (int64_t e = 0; e < E; ++e) mx = std::max(mx, p[e]);
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(p[e] - mx));
  for (int64_t e = 0; e < E; ++e) p[e] = static_cast<float>(p[e] / sum);
  if (probs) std::copy(p, p + E, probs);
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  float wsum = 0;
  for (int64_t j = 0; j < k; ++j) wsum += p[order[static_cast<size_t>(j)]];
  for (int64_t j = 0; j < k; ++j) {
    const int32_t e = order[static_cast<size_t>(j)];
    ids[j] = e;
    weights[j] = norm_weights ? p[e] / wsum : p[e];
  }
}

}  // namespace

void moe_route(std::span<const float> router, const float* h, int64_t rows, int64_t D, int64_t E, int64_t k,
               bool norm_weights, int32_t* ids, float* weights, float* probs, ThreadPool* pool) {
  if (static_cast<int64_t>(router.size()) != E * D || k < 1 || k > E) throw Error("internal error: bad router shape");
  // Rows go four at a time (dot4x4_f64), the last group's rest and experts past a multiple of 4 one by one; every
  // logit is dot_f64's value whichever way it is computed.
  constexpr int64_t G = 4;
  // The router in double for dot4x4_f64, converted once per call (E x D: 2.9 MB for DiffusionGemma's 128 x 2816)
  // when some group is full.
  std::vector<double> rd;
  if (rows >= G) rd.assign(router.begin(), router.end());
  for_rows(pool, (rows + G - 1) / G, [&](int64_t grp) {
    const int64_t r0 = grp * G, nr = std::min(G, rows - r0);
    std::vector<float> logits(static_cast<size_t>(G * E));
    std::vector<double> hd;  // a full group's rows in double, converted once for every expert
    if (nr == G) hd.assign(h + r0 * D, h + (r0 + G) * D);
    int64_t e = 0;
    for (; e + 4 <= E; e += 4) {
      double d[16];
      if (nr == G) {
        dot4x4_f64(hd.data(), D, rd.data() + e * D, D, D, d);
      } else {
        for (int64_t r = 0; r < nr; ++r) dot4_f64(h + (r0 + r) * D, router.data() + e * D, D, D, d + r * 4);
      }
      for (int64_t r = 0; r < nr; ++r)
        for (int j = 0; j < 4; ++j) logits[static_cast<size_t>(r * E + e + j)] = static_cast<float>(d[r * 4 + j]);
    }
    for (; e < E; ++e)
      for (int64_t r = 0; r < nr; ++r)
        logits[static_cast<size_t>(r * E + e)] =
            static_cast<float>(dot_f64(h + (r0 + r) * D, router.data() + e * D, D));
    for (int64_t r = r0; r < r0 + nr; ++r) route_row(logits.data() + (r - r0) * E, E, k, norm_weights, ids + r * k,
                                                     weights + r * k, probs ? probs + r * E : nullptr);
  });
}

void moe_ffn_on_host(Executor& ex, ThreadPool* pool, const MoeLayer& m, std::span<const float> router,
                     std::span<const float> norm, float eps, float* x, int64_t rows, int64_t D, float* out,
                     std::span<const float> router_scale) {
  if (rows <= 0) return;
  const int64_t E = m.n_expert, k = m.n_used, F = m.n_ff;
  if (static_cast<int64_t>(m.gate.size()) != E || static_cast<int64_t>(m.up.size()) != E ||
      static_cast<int64_t>(m.down.size()) != E || static_cast<int64_t>(norm.size()) != D) {
    throw Error("internal error: bad mixture-of-experts layer");
  }
  auto& s = ex.host().moe;  // resized, not reallocated or zeroed, from one layer to the next
  const auto sz = [](int64_t v) { return static_cast<size_t>(v); };
  const int64_t R = rows * k;
  s.h.resize(sz(rows * D));
  s.ids.resize(sz(R));
  s.wts.resize(sz(R));
  if (!router_scale.empty()) {
    // Gemma-4: the router reads rmsnorm(x) / sqrt(D) * router_scale; the experts read the normed rows.
    if (static_cast<int64_t>(router_scale.size()) != D) throw Error("internal error: bad router scale");
    std::vector<float> scale(router_scale.begin(), router_scale.end());
    const double inv = 1.0 / std::sqrt(static_cast<double>(D));
    for (float& v : scale) v = static_cast<float>(v * inv);
    rmsnorm(pool, x, rows, D, scale.data(), eps, s.h.data());
    ex.route(m, router, s.h.data(), rows, D, s.ids.data(), s.wts.data());
  }
  rmsnorm(pool, x, rows, D, norm.data(), eps, s.h.data());
  if (router_scale.empty()) ex.route(m, router, s.h.data(), rows, D, s.ids.data(), s.wts.data());
  if (!m.expert_scale.empty()) {
    for (int64_t i = 0; i < rows * k; ++i) s.wts[sz(i)] *= m.expert_scale[sz(s.ids[sz(i)])];
  }

  // The (row, slot) pairs grouped by expert (expert order, rows in increasing order within an expert):
  // expert e's pairs are order[row0[e] .. row0[e] + n[e]); pair i sits at position slot[i] of that order.
  s.n.assign(sz(E), 0);
  s.row0.assign(sz(E), 0);
  s.order.resize(sz(R));
  s.slot.resize(sz(R));
  for (int64_t i = 0; i < R; ++i) ++s.n[sz(s.ids[sz(i)])];
  for (int64_t e = 1; e < E; ++e) s.row0[sz(e)] = s.row0[sz(e - 1)] + s.n[sz(e - 1)];
  s.next = s.row0;
  for (int64_t i = 0; i < R; ++i) {
    const int64_t at = s.next[sz(s.ids[sz(i)])]++;
    s.order[sz(at)] = i;
    s.slot[sz(i)] = at;
  }
  s.xin.resize(sz(R * D));
  s.gate.resize(sz(R * F));
  s.up.resize(sz(R * F));
  s.src.resize(sz(R));
  float *xin = s.xin.data(), *gate = s.gate.data(), *up = s.up.data();
  const float* h = s.h.data();
  for (int64_t i = 0; i < R; ++i) s.src[sz(i)] = s.order[sz(i)] / k;  // the row each grouped pair reads
  // Every expert's gate and up over its rows, then SwiGLU, then every expert's down: one call each.
  s.ws.resize(sz(2 * E));
  s.ys.resize(sz(2 * E));
  for (int64_t e = 0; e < E; ++e) {
    s.ws[sz(2 * e)] = m.gate[sz(e)], s.ws[sz(2 * e + 1)] = m.up[sz(e)];
    s.ys[sz(2 * e)] = gate + s.row0[sz(e)] * F, s.ys[sz(2 * e + 1)] = up + s.row0[sz(e)] * F;
  }
  const int groups = static_cast<int>(E);
  ex.matmul_grouped_gather(s.ws.data(), s.ys.data(), 2, s.row0.data(), s.n.data(), groups, h, rows, s.src.data(), D);
  glu_rows(pool, m.glu, gate, up, R, F);
  for (int64_t e = 0; e < E; ++e) {
    s.ws[sz(e)] = m.down[sz(e)], s.ys[sz(e)] = xin + s.row0[sz(e)] * D;  // the experts' outputs: [R, D]
  }
  ex.matmul_grouped(s.ws.data(), s.ys.data(), 1, s.row0.data(), s.n.data(), groups, gate, F);
  // Per row: the expert outputs times their weights (each product rounded to f32), summed in top-k order,
  // then added to the residual. The sum builds up in the row's first pair's output, which only this row reads.
  const float* wts = s.wts.data();
  for_rows(pool, rows, [&](int64_t r) {
    float* acc = xin + s.slot[sz(r * k)] * D;
    const float w0 = wts[sz(r * k)];
    for (int64_t c = 0; c < D; ++c) acc[c] *= w0;
    for (int64_t j = 1; j < k; ++j) {
      const float* y = xin + s.slot[sz(r * k + j)] * D;
      const float w = wts[sz(r * k + j)];
      for (int64_t c = 0; c < D; ++c) acc[c] += y[c] * w;
    }
    if (out) {
      std::copy_n(acc, D, out + r * D);
      return;
    }
    float* xr = x + r * D;
    for (int64_t c = 0; c < D; ++c) xr[c] += acc[c];
  });
}

}  // namespace dllm::model
