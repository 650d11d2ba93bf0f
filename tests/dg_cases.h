// The diffusion-gemma fixture cases (tests/data/diffusion-gemma/logits: the llama.cpp fork's canvas logits of
// every case through the unified forward and the prompt-KV path) and the two ways dllm computes them on a
// loaded Model; shared by the tests of every executor (test_diffusion_gemma, test_gpu_emulated).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/forward.h"
#include "model/model.h"
#include "support.h"

namespace dllm::test::dg {

inline std::string dg_path(const std::string& rel) { return data_path("diffusion-gemma/" + rel); }

inline std::vector<float> read_f32(const std::string& path) {
  const std::string bytes = read_file(path);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

struct Case {
  std::string name;
  std::vector<int32_t> ids;
  int64_t n_prompt = 0;
  std::vector<int64_t> rows;
  std::vector<float> self_cond;
  float temperature = 1;
  std::vector<double> margin;
  std::vector<float> want;  // the reference's [rows, n_vocab] of one path
};

inline Case load_case(const std::string& model, const std::string& name, const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(read_file(dg_path("logits/" + model + "__" + name + "__" + path + ".json")));
  Case c;
  c.name = name + " (" + path + ")";
  for (int v : j["prompt_ids"]) c.ids.push_back(v);
  c.n_prompt = static_cast<int64_t>(c.ids.size());
  for (int v : j["canvas_ids"]) c.ids.push_back(v);
  for (int64_t r : j["rows"]) c.rows.push_back(r);
  for (double m : j["top1_minus_top2_logit"]) c.margin.push_back(m);
  if (j.contains("self_conditioning") && !j["self_conditioning"].is_null()) {
    c.self_cond = read_f32(dg_path("logits/" + j["self_conditioning"]["input_logits_file"].get<std::string>()));
    c.temperature = j["self_conditioning"]["temperature"].get<float>();
  }
  c.want = read_f32(dg_path("logits/" + j["logits_file"].get<std::string>()));
  return c;
}

inline const std::vector<std::string>& case_names() {
  static const std::vector<std::string> n{"a1_prompt5_short", "a2_prompt29_long", "a3_chat_prompt_uniform_canvas",
                                          "a4_prompt8_equals_window", "a5_self_cond_after_a3_t0.8"};
  return n;
}

inline model::ForwardRequest request(const Case& c, float* out) {
  model::ForwardRequest r{c.ids, c.rows, out};
  r.n_prompt = c.n_prompt;
  if (!c.self_cond.empty()) r.self_cond_logits = c.self_cond.data(), r.self_cond_temperature = c.temperature;
  return r;
}

inline std::vector<float> unified(model::Model& m, const Case& c) {
  std::vector<float> out(c.rows.size() * static_cast<size_t>(m.n_vocab()));
  m.forward(request(c, out.data()));
  return out;
}

// The prompt encoded once (in `pieces` calls), then the canvas against the cache.
inline std::vector<float> prompt_kv(model::Model& m, const Case& c, int pieces = 1) {
  std::vector<float> out(c.rows.size() * static_cast<size_t>(m.n_vocab()));
  model::KVCache cache;
  for (int i = 1; i <= pieces; ++i) {
    const int64_t end = c.n_prompt * i / pieces;
    if (end == 0 || (cache.handle.valid() && end <= cache.n)) continue;
    model::ForwardRequest enc{std::span<const int32_t>(c.ids.data(), static_cast<size_t>(end)), {}, nullptr, &cache,
                              model::CacheMode::Extend};
    enc.n_prompt = end;
    m.forward(enc);
    EXPECT_EQ(cache.n, end);
  }
  model::ForwardRequest r = request(c, out.data());
  if (c.n_prompt > 0) r.cache = &cache, r.cache_mode = model::CacheMode::Prefix;
  m.forward(r);
  EXPECT_EQ(cache.n, c.n_prompt) << "a canvas step leaves the cached prefix as it was";
  return out;
}

struct Deviation {
  double rel = 0, max_abs = 0;
  int argmax_diff = 0;  // rows above the margin whose argmax differs
};

inline Deviation compare(const std::vector<float>& got, const Case& c, int64_t V, double margin) {
  Deviation e;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - c.want[i];
    num += d * d, den += static_cast<double>(c.want[i]) * c.want[i];
    e.max_abs = std::max(e.max_abs, std::abs(d));
  }
  e.rel = std::sqrt(num / den);
  for (size_t r = 0; r < c.rows.size(); ++r) {
    const float* g = got.data() + r * V;
    const float* w = c.want.data() + r * V;
    if (c.margin[r] > margin && std::max_element(g, g + V) - g != std::max_element(w, w + V) - w) ++e.argmax_diff;
  }
  return e;
}

}  // namespace dllm::test::dg
