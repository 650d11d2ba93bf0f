// LLaDA's approximate modes on the tiny models: the key/value cache of the forward pass (a refresh pass
// is the exact pass; reusing the cache on an unchanged canvas reproduces it bit for bit), the dual cache
// with one step per block equal to the exact run, and the measured effect of --dual-cache and --threshold
// on text and step counts against the exact run (docs/correctness-samplers.md records the same numbers).
// Reference executor throughout: the measured values are properties of the exact arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>

#include "jit/cpu_executor.h"
#include "jit/cpu_features.h"
#include "common/error.h"
#include "model/generate.h"
#include "model/model.h"
#include "support.h"

namespace dllm::model {
namespace {

Model& tiny(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Model>> cache;
  auto& m = cache[name];
  if (!m) m = Model::load(test::data_path("models/" + name));
  return *m;
}

// "Write a haiku about autumn leaves." through LLaDA's chat template (P = 32), as the reference files
// record it.
const std::vector<int32_t> kHaiku = {1012, 1015, 84, 401, 1016, 282, 54, 81, 986, 257, 558, 72, 74, 84, 699, 711,
                                     598, 501, 77, 704, 64, 85, 295, 13, 1017, 1015, 405, 82, 363, 397, 1016, 282};

std::vector<int32_t> canvas_with_masks(const Model& m, size_t n_mask) {
  std::vector<int32_t> c = kHaiku;
  c.resize(c.size() + n_mask, m.mask_token_id());
  return c;
}

void expect_cache_properties(Model& m) {
  std::vector<int32_t> canvas = canvas_with_masks(m, 32);
  canvas[40] = 500;  // a committed token in the second block of 8
  const std::vector<int64_t> rows = {40, 41, 42, 43, 44, 45, 46, 47};
  const std::vector<float> exact = m.forward(canvas, rows);

  KVCache cache;
  std::vector<float> refresh(exact.size()), reused(exact.size());
  ForwardRequest fill{canvas, rows, refresh.data()};
  fill.cache = &cache;
  fill.cache_mode = CacheMode::Fill;
  m.forward(fill);
  EXPECT_EQ(refresh, exact);  // the refresh pass is the exact pass
  EXPECT_EQ(cache.n, static_cast<int64_t>(canvas.size()));

  ForwardRequest reuse{canvas, rows, reused.data()};
  reuse.cache = &cache;
  reuse.cache_mode = CacheMode::Reuse;
  reuse.row_begin = 40;
  reuse.row_end = 48;
  m.forward(reuse);
  EXPECT_EQ(reused, exact);  // nothing changed since the refresh: the block sees exact keys/values

  // A committed token inside the block: the block's own rows are recomputed, the others are stale.
  canvas[41] = 600;
  const std::vector<float> exact2 = m.forward(canvas, rows);
  m.forward(reuse);
  EXPECT_NE(reused, exact2);
  // Closer to the exact logits of the new canvas than the logits before the change are: the block's
  // recomputed rows carry the change, only the other positions' keys/values are stale.
  auto rel_l2 = [](const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return std::sqrt(num / den);
  };
  EXPECT_LT(rel_l2(reused, exact2), 0.5 * rel_l2(exact, exact2));

  // Rows outside the recomputed block are refused.
  const std::vector<int64_t> outside = {39};
  std::vector<float> one(static_cast<size_t>(m.n_vocab()));
  ForwardRequest bad{canvas, outside, one.data()};
  bad.cache = &cache;
  bad.cache_mode = CacheMode::Reuse;
  bad.row_begin = 40;
  bad.row_end = 48;
  EXPECT_THROW(m.forward(bad), Error);
}

TEST(KVCache, RefreshIsExactAndReuseOnAnUnchangedCanvasIsBitIdentical) {
  expect_cache_properties(tiny("tiny-llada-F32.gguf"));
  expect_cache_properties(tiny("tiny-llada-Q4_K_M.gguf"));
}

TEST(KVCache, SamePropertiesWithTheJitExecutorOfEveryFamily) {
  for (jit::Isa isa : jit::cpu_features().supported()) {
    SCOPED_TRACE(jit::isa_name(isa));
    LoadOptions opt;
    opt.make_executor = [isa](ThreadPool& pool) { return std::make_unique<jit::CpuExecutor>(pool, isa); };
    auto m = Model::load(test::data_path("models/tiny-llada-Q8_0.gguf"), opt);
    expect_cache_properties(*m);
  }
}

GenerateConfig llada_config(const Model& m, int64_t L, int64_t B, int64_t N) {
  GenerateConfig c;
  c.arch = Arch::LLaDA;
  c.mask_id = m.mask_token_id();
  c.stop_ids = {1013, 1017};
  c.max_tokens = L;
  c.block_length = B;
  c.steps = N;
  c.early_stop = false;
  return c;
}

struct Outcome {
  std::vector<int32_t> generated;
  int64_t forward_passes = 0;
};

Outcome run(Model& m, const GenerateConfig& c) {
  auto src = make_model_logit_source(m);
  GenerateHooks hooks;
  hooks.pool = &m.pool();
  GenerateResult r = generate(*src, c, kHaiku, hooks);
  return {std::vector<int32_t>(r.generated().begin(), r.generated().end()), r.forward_passes};
}

int64_t differing(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  int64_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += a[i] != b[i];
  return d;
}

TEST(DualCache, OneStepPerBlockEqualsTheExactRun) {
  Model& m = tiny("tiny-llada-F32.gguf");
  GenerateConfig c = llada_config(m, 32, 8, 4);  // every block's only step is a refresh
  const Outcome exact = run(m, c);
  c.dual_cache = true;
  const Outcome cached = run(m, c);
  EXPECT_EQ(cached.generated, exact.generated);
  EXPECT_EQ(cached.forward_passes, 4);
}

// Measured on tiny-llada-F32 (random weights, so a weak model: near-ties are common and every
// approximation shows), "Write a haiku about autumn leaves.", 32 tokens in 2 blocks of 16, 32 steps
// (one token per step). The counts are what the reference executor gives; they are recorded, not
// required by any specification, and change only if the arithmetic changes.
TEST(Measured, DualCacheAndThresholdAgainstTheExactRun) {
  Model& m = tiny("tiny-llada-F32.gguf");
  const GenerateConfig base = llada_config(m, 32, 16, 32);
  const Outcome exact = run(m, base);
  EXPECT_EQ(exact.forward_passes, 32);

  GenerateConfig c = base;
  c.dual_cache = true;
  const Outcome dual = run(m, c);
  EXPECT_EQ(dual.forward_passes, 32);  // 2 refresh passes + 30 block-only passes
  EXPECT_EQ(differing(dual.generated, exact.generated), 22) << "dual cache: tokens differing from exact";

  // threshold -> (forward passes, generated tokens differing from the exact run)
  const std::map<double, std::pair<int64_t, int64_t>> measured = {{0.9, {19, 16}}, {0.7, {8, 22}}, {0.5, {6, 24}}};
  for (const auto& [thr, want] : measured) {
    c = base;
    c.threshold = thr;
    const Outcome t = run(m, c);
    EXPECT_EQ(t.forward_passes, want.first) << "threshold " << thr << ": forward passes";
    EXPECT_EQ(differing(t.generated, exact.generated), want.second) << "threshold " << thr << ": tokens differing";
  }
  c = base;
  c.threshold = 0.7;
  c.dual_cache = true;
  const Outcome both = run(m, c);
  EXPECT_EQ(both.forward_passes, 10) << "threshold 0.7 + dual cache: forward passes";
  EXPECT_EQ(differing(both.generated, exact.generated), 24) << "threshold 0.7 + dual cache: tokens differing";
}

}  // namespace
}  // namespace dllm::model
