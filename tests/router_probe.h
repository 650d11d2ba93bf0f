// An executor wrapper for the mixture-of-experts tests (test_moe, test_diffusion_gemma): it records every
// routing decision (the router probabilities and the chosen experts of each row, per route() call: one call
// per MoE layer of a pass) and can force chosen decisions the other way, to show that a difference against
// llama.cpp comes from a near-tie expert choice.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "common/error.h"
#include "model/executor.h"

namespace dllm::test {

struct Flip {
  int call = 0;       // which route() call of the pass (= the layer, for one pass)
  int64_t row = 0;
  int32_t from = 0;   // the selected expert to drop
  int32_t to = 0;     // the unselected expert to take instead
};

template <class Base>
class RouterProbe : public Base {
 public:
  using Base::Base;
  std::vector<std::vector<float>> probs;     // per call, [rows, E]
  std::vector<std::vector<int32_t>> ids;     // per call, [rows, k]
  std::vector<Flip> flips;
  std::vector<std::vector<int32_t>> forced;  // per call: take these ids instead (another executor's choice)
  std::vector<std::vector<int32_t>> own;     // per call: the ids this executor chose itself
  int calls = 0;
  int64_t width = 0;  // when set: lm_head keeps its input rows (the final-normed hidden states)
  std::vector<float> hidden;
  void reset() { probs.clear(), ids.clear(), own.clear(), calls = 0; }

  void lm_head(model::WeightHandle output, const float* x, int64_t rows, float* logits) override {
    if (width > 0) hidden.assign(x, x + rows * width);
    Base::lm_head(output, x, rows, logits);
  }

  void route(const model::MoeLayer& m, std::span<const float> router, const float* h, int64_t rows, int64_t D,
             int32_t* out_ids, float* w) override {
    const int64_t E = m.n_expert, k = m.n_used;
    std::vector<float> p(static_cast<size_t>(rows * E));
    model::moe_route(router, h, rows, D, E, k, m.norm_weights, out_ids, w, p.data());
    own.emplace_back(out_ids, out_ids + rows * k);
    auto reweigh = [&](int64_t r) {  // the weights of row r's selection, as the router gives them
      float sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += p[static_cast<size_t>(r * E + out_ids[r * k + j])];
      for (int64_t j = 0; j < k; ++j) {
        const float pj = p[static_cast<size_t>(r * E + out_ids[r * k + j])];
        w[r * k + j] = m.norm_weights ? pj / sum : pj;
      }
    };
    if (static_cast<size_t>(calls) < forced.size()) {
      const std::vector<int32_t>& f = forced[static_cast<size_t>(calls)];
      if (static_cast<int64_t>(f.size()) != rows * k) throw Error("forced routing of another shape");
      std::copy(f.begin(), f.end(), out_ids);
      for (int64_t r = 0; r < rows; ++r) reweigh(r);
    }
    for (const Flip& f : flips) {
      if (f.call != calls) continue;
      int32_t* sel = out_ids + f.row * k;
      for (int64_t j = 0; j < k; ++j)
        if (sel[j] == f.from) sel[j] = f.to;
      reweigh(f.row);
    }
    probs.push_back(std::move(p));
    ids.emplace_back(out_ids, out_ids + rows * k);
    ++calls;
  }
};

// The router decision nearest to a tie for one row at one call: the least probable selected expert and
// the most probable unselected one.
struct Decision {
  int call = 0;
  int64_t row = 0;
  int32_t selected = 0, unselected = 0;
  float margin = 0;  // p(selected) - p(unselected) >= 0
};

// Row `row`'s decision at call `call` of a recorded pass (probs/ids as RouterProbe keeps them).
inline Decision decision_at(const std::vector<std::vector<float>>& probs, const std::vector<std::vector<int32_t>>& ids,
                            int call, int64_t row, int64_t E, int64_t k) {
  const float* p = probs[static_cast<size_t>(call)].data() + row * E;
  const int32_t* sel = ids[static_cast<size_t>(call)].data() + row * k;
  int32_t last = sel[0];
  for (int64_t j = 1; j < k; ++j)
    if (p[sel[j]] < p[last]) last = sel[j];
  int32_t best = -1;
  for (int32_t e = 0; e < E; ++e) {
    if (std::find(sel, sel + k, e) != sel + k) continue;
    if (best < 0 || p[e] > p[best]) best = e;
  }
  return {call, row, last, best, p[last] - p[best]};
}

// Row `row`'s decision at each call of the recorded pass that routed at least row + 1 rows, nearest to a tie
// first.
inline std::vector<Decision> decisions_by_margin(const std::vector<std::vector<float>>& probs,
                                                 const std::vector<std::vector<int32_t>>& ids, int64_t row, int64_t E,
                                                 int64_t k) {
  std::vector<Decision> out;
  for (size_t call = 0; call < probs.size(); ++call)
    if (static_cast<int64_t>(probs[call].size()) > row * E) out.push_back(decision_at(probs, ids, static_cast<int>(call), row, E, k));
  std::sort(out.begin(), out.end(), [](const Decision& a, const Decision& b) { return a.margin < b.margin; });
  return out;
}

}  // namespace dllm::test
