// The generation loop against a fake model whose logits are designed per row (algorithms.md section 7):
// Dream's shift, the rows each step asks for, LLaDA's blocks and schedule, later blocks never committed,
// tie order, threshold, dual-cache call pattern, early stop, cancellation, and the usage errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <map>

#include "common/error.h"
#include "model/generate.h"
#include "common/thread_pool.h"

namespace dllm::model {
namespace {

// Logits of one row: 0 everywhere except `height` at `token`.
void peaked(float* out, int64_t V, int32_t token, float height) {
  std::fill(out, out + V, 0.0f);
  out[token] = height;
}

class FakeSource : public LogitSource {
 public:
  enum Kind { Exact, Refresh, Cached };
  struct Call {
    Kind kind;
    std::vector<int64_t> rows;
    int64_t begin = 0, end = 0;
    std::vector<int32_t> canvas;
  };
  using RowFn = std::function<void(std::span<const int32_t> canvas, int64_t row, float* out)>;

  FakeSource(int64_t V, RowFn fn) : V_(V), fn_(std::move(fn)) {}
  int64_t n_vocab() const override { return V_; }
  void forward(std::span<const int32_t> c, std::span<const int64_t> rows, float* out) override {
    record(Exact, c, rows, 0, 0, out);
  }
  void forward_refresh(std::span<const int32_t> c, std::span<const int64_t> rows, float* out) override {
    record(Refresh, c, rows, 0, 0, out);
  }
  void forward_cached(std::span<const int32_t> c, int64_t b, int64_t e, std::span<const int64_t> rows,
                      float* out) override {
    record(Cached, c, rows, b, e, out);
  }
  std::vector<Call> calls;

 private:
  void record(Kind k, std::span<const int32_t> c, std::span<const int64_t> rows, int64_t b, int64_t e, float* out) {
    calls.push_back(Call{k, {rows.begin(), rows.end()}, b, e, {c.begin(), c.end()}});
    for (size_t i = 0; i < rows.size(); ++i) fn_(c, rows[i], out + static_cast<int64_t>(i) * V_);
  }
  int64_t V_;
  RowFn fn_;
};

constexpr int64_t kV = 64;
constexpr int32_t kMask = 63;
constexpr int32_t kEos = 60, kEot = 61;

GenerateConfig llada(int64_t L, int64_t B, int64_t N) {
  GenerateConfig c;
  c.arch = Arch::LLaDA;
  c.mask_id = kMask;
  c.stop_ids = {kEos, kEot};
  c.max_tokens = L;
  c.block_length = B;
  c.steps = N;
  c.remasking = Remasking::LowConfidence;
  return c;
}

GenerateConfig dream(int64_t L, int64_t N, Remasking r = Remasking::Entropy) {
  GenerateConfig c = llada(L, L, N);
  c.arch = Arch::Dream;
  c.remasking = r;
  return c;
}

const std::vector<int32_t> kPrompt = {1, 2, 3, 4};

// Varied confidences: row r proposes token r % 50 with a height that depends on r.
void varied(std::span<const int32_t>, int64_t row, float* out) {
  peaked(out, kV, static_cast<int32_t>(row % 50), 1.0f + static_cast<float>((row * 7) % 5));
}

std::vector<int64_t> masked_positions(const std::vector<int32_t>& c, int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  for (int64_t j = lo; j < hi; ++j)
    if (c[static_cast<size_t>(j)] == kMask) out.push_back(j);
  return out;
}

TEST(Shift, DreamPositionReadsRawRowJMinus1AndLladaRowJ) {
  const int64_t V = 2048;
  FakeSource src(V, [&](std::span<const int32_t>, int64_t row, float* out) {
    peaked(out, V, static_cast<int32_t>(1000 + row), 5.0f);
  });
  GenerateConfig d = dream(8, 8);
  d.mask_id = 2047;
  GenerateResult rd = generate(src, d, kPrompt);
  GenerateConfig l = llada(8, 8, 8);
  l.mask_id = 2047;
  GenerateResult rl = generate(src, l, kPrompt);
  for (int64_t j = 4; j < 12; ++j) {
    EXPECT_EQ(rd.canvas[static_cast<size_t>(j)], 1000 + j - 1);
    EXPECT_EQ(rl.canvas[static_cast<size_t>(j)], 1000 + j);
  }
}

TEST(Rows, EachStepAsksForTheRowsItConsumes) {
  FakeSource s1(kV, varied);
  generate(s1, llada(8, 4, 4), kPrompt);  // 2 blocks of 4, 2 steps each
  ASSERT_EQ(s1.calls.size(), 4u);
  for (size_t i = 0; i < s1.calls.size(); ++i) {
    const int64_t e = 4 + 4 * static_cast<int64_t>(i / 2 + 1);
    EXPECT_EQ(s1.calls[i].rows, masked_positions(s1.calls[i].canvas, 4, e)) << "call " << i;
  }
  FakeSource s2(kV, varied);
  generate(s2, dream(8, 4), kPrompt);
  ASSERT_EQ(s2.calls.size(), 4u);
  for (const auto& c : s2.calls) {
    std::vector<int64_t> want;
    for (int64_t j : masked_positions(c.canvas, 4, 12)) want.push_back(j - 1);
    EXPECT_EQ(c.rows, want);
  }
}

TEST(Rows, FullLogitsAsksForEveryRowAndChangesNothing) {
  for (GenerateConfig c : {llada(8, 4, 4), dream(8, 4)}) {
    FakeSource a(kV, varied), b(kV, varied);
    const GenerateResult ra = generate(a, c, kPrompt);
    c.full_logits = true;
    const GenerateResult rb = generate(b, c, kPrompt);
    EXPECT_EQ(ra.canvas, rb.canvas);
    for (const auto& call : b.calls) EXPECT_EQ(call.rows.size(), 12u);
  }
}

TEST(Llada, BlocksInOrderWithTheScheduledCounts) {
  FakeSource src(kV, varied);
  std::vector<int32_t> before(kPrompt.begin(), kPrompt.end());
  before.resize(16, kMask);
  int64_t masked = 12;
  const auto k = llada_block_schedule(4, 3);  // 2, 1, 1
  GenerateHooks hooks;
  int64_t steps = 0;
  hooks.on_step = [&](const StepEvent& ev) {
    const int64_t s = 4 + ev.block * 4, e = s + 4;
    EXPECT_EQ(ev.step, ev.block * 3 + steps % 3);
    EXPECT_EQ(ev.scheduled, k[static_cast<size_t>(steps % 3)]);
    EXPECT_EQ(static_cast<int64_t>(ev.committed.size()), ev.scheduled);
    masked -= ev.scheduled;
    EXPECT_EQ(ev.masked_left, masked);
    for (size_t j = 0; j < ev.canvas.size(); ++j) {
      const bool changed = ev.canvas[j] != before[j];
      const bool listed = std::count(ev.committed.begin(), ev.committed.end(), static_cast<int64_t>(j)) > 0;
      EXPECT_EQ(changed, listed) << "position " << j;
      if (changed) {
        EXPECT_EQ(before[j], kMask);
        EXPECT_TRUE(static_cast<int64_t>(j) >= s && static_cast<int64_t>(j) < e);
      }
    }
    if (steps % 3 == 2) {
      EXPECT_TRUE(masked_positions({ev.canvas.begin(), ev.canvas.end()}, s, e).empty());
    }
    before.assign(ev.canvas.begin(), ev.canvas.end());
    ++steps;
  };
  const GenerateResult r = generate(src, llada(12, 4, 9), kPrompt, hooks);
  EXPECT_EQ(steps, 9);
  EXPECT_EQ(r.steps_run, 9);
  EXPECT_EQ(r.forward_passes, 9);
  EXPECT_EQ(r.committed, 12);
}

TEST(Llada, LaterBlocksAreNeverCommittedEarly) {
  // Rows of the second block are far more confident than those of the first.
  FakeSource src(kV, [](std::span<const int32_t>, int64_t row, float* out) {
    peaked(out, kV, 7, row >= 8 ? 30.0f : 1.0f);
  });
  GenerateHooks hooks;
  hooks.on_step = [](const StepEvent& ev) {
    for (int64_t j : ev.committed) EXPECT_EQ((j - 4) / 4, ev.block) << "step " << ev.step;
  };
  generate(src, llada(8, 4, 8), kPrompt, hooks);
}

TEST(Llada, EqualConfidencesCommitLeftToRight) {
  FakeSource src(kV, [](std::span<const int32_t>, int64_t, float* out) { peaked(out, kV, 9, 2.0f); });
  GenerateHooks hooks;
  hooks.on_step = [](const StepEvent& ev) {
    ASSERT_EQ(ev.committed.size(), 1u);
    EXPECT_EQ(ev.committed[0], 4 + ev.step);
  };
  generate(src, llada(8, 8, 8), kPrompt, hooks);
}

TEST(Llada, StepsBeyondTheBlockLengthCommitNothingAndAreNotRun) {
  FakeSource src(kV, varied);
  const GenerateResult r = generate(src, llada(4, 4, 8), kPrompt);  // k = 1,1,1,1,0,0,0,0
  EXPECT_EQ(r.forward_passes, 4);
  EXPECT_EQ(masked_positions(r.canvas, 0, 8).size(), 0u);
}

// Runs c on the `varied` fake (no stop token is ever proposed) and checks the block rules on every event:
// each step belongs to one block, runs inside the block's steps with the block's schedule, commits only
// inside the block, and starts only when every earlier block is complete; each block commits exactly its
// length; the canvas ends without a mask. Returns the per-block step counts seen.
std::vector<int64_t> check_blocks(const GenerateConfig& c, const std::vector<int32_t>& prompt = kPrompt) {
  SCOPED_TRACE(testing::Message() << "L " << c.max_tokens << " B " << c.block_length << " N " << c.steps
                                  << (c.dual_cache ? " dual cache" : "") << (c.threshold > 0 ? " threshold" : ""));
  const int64_t P = static_cast<int64_t>(prompt.size());
  const int64_t nb = llada_block_count(c.max_tokens, c.block_length);
  std::vector<int64_t> committed(static_cast<size_t>(nb)), steps(static_cast<size_t>(nb));
  int64_t last_block = 0;
  GenerateHooks hooks;
  hooks.on_step = [&](const StepEvent& ev) {
    ASSERT_GE(ev.block, last_block);  // blocks in order
    last_block = ev.block;
    const LladaBlock k = llada_block(c.max_tokens, c.block_length, c.effective_steps(), ev.block);
    ASSERT_GE(ev.step, k.first_step);
    ASSERT_LT(ev.step, k.first_step + k.steps);
    if (c.threshold <= 0) {
      EXPECT_EQ(ev.scheduled, llada_step_count(k.end - k.begin, k.steps, ev.step - k.first_step));
      EXPECT_EQ(static_cast<int64_t>(ev.committed.size()), ev.scheduled);
    }
    for (int64_t j : ev.committed) {
      EXPECT_GE(j, P + k.begin);
      EXPECT_LT(j, P + k.end);
    }
    const std::vector<int32_t> canvas(ev.canvas.begin(), ev.canvas.end());
    EXPECT_TRUE(masked_positions(canvas, P, P + k.begin).empty()) << "block " << ev.block << " before its elders";
    committed[static_cast<size_t>(ev.block)] += static_cast<int64_t>(ev.committed.size());
    ++steps[static_cast<size_t>(ev.block)];
  };
  // `varied` with the mask and the stop tokens out of reach, so that sampling commits a token everywhere.
  FakeSource src(kV, [](std::span<const int32_t> canvas, int64_t row, float* out) {
    varied(canvas, row, out);
    out[kMask] = out[kEos] = out[kEot] = -100.0f;
  });
  const GenerateResult r = generate(src, c, prompt, hooks);
  EXPECT_TRUE(masked_positions(r.canvas, 0, static_cast<int64_t>(r.canvas.size())).empty());
  EXPECT_EQ(r.committed, c.max_tokens);
  for (int64_t b = 0; b < nb; ++b) {
    const LladaBlock k = llada_block(c.max_tokens, c.block_length, c.effective_steps(), b);
    EXPECT_EQ(committed[static_cast<size_t>(b)], k.end - k.begin) << "block " << b;
  }
  return steps;
}

TEST(Llada, AnyMaxTokensAndStepsMakeBlocksWithAShorterLastOne) {
  EXPECT_EQ(check_blocks(llada(1, 32, 1)), (std::vector<int64_t>{1}));
  EXPECT_EQ(check_blocks(llada(16, 32, 16)), (std::vector<int64_t>{16}));
  EXPECT_EQ(check_blocks(llada(16, 32, 5)), (std::vector<int64_t>{5}));
  EXPECT_EQ(check_blocks(llada(100, 32, 100)), (std::vector<int64_t>{32, 32, 32, 4}));
  EXPECT_EQ(check_blocks(llada(100, 32, 10)), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(check_blocks(llada(128, 32, 10)), (std::vector<int64_t>{2, 3, 2, 3}));
  EXPECT_EQ(check_blocks(llada(12, 8, 6)), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(check_blocks(llada(12, 8, 2)), (std::vector<int64_t>{1, 1}));
  // More steps than tokens: the extra steps of a block commit nothing and are skipped (as for one block).
  // 9 and 3 steps: a block's steps after it is complete are not reported.
  EXPECT_EQ(check_blocks(llada(5, 4, 12)), (std::vector<int64_t>{4, 1}));
  // The same with the threshold, the dual cache, both, and sampling.
  for (GenerateConfig c : {llada(100, 32, 10), llada(12, 8, 5), llada(3, 32, 2)}) {
    c.threshold = 0.5;
    check_blocks(c);
    c.dual_cache = true;
    check_blocks(c);
    c.threshold = 0;
    check_blocks(c);
    c.temperature = 0.7;
    check_blocks(c);
  }
}

TEST(Llada, DividingSettingsKeepTheStepIndexOfTheAuthorsLayout) {
  // 3 blocks of 4, 9 steps: block b runs global steps 3b .. 3b + 2 (the Gumbel stream's key).
  std::vector<int64_t> seen;
  GenerateHooks hooks;
  hooks.on_step = [&](const StepEvent& ev) { seen.push_back(ev.step - 3 * ev.block); };
  FakeSource src(kV, varied);
  generate(src, llada(12, 4, 9), kPrompt, hooks);
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1, 2}));
}

TEST(DualCache, AShortLastBlockRecomputesOnlyItsRows) {
  FakeSource src(kV, varied);
  GenerateConfig c = llada(10, 4, 5);  // blocks of 4, 4, 2 with 2, 2, 1 steps
  c.dual_cache = true;
  const GenerateResult r = generate(src, c, kPrompt);
  ASSERT_EQ(src.calls.size(), 5u);
  const std::vector<FakeSource::Kind> kinds = {FakeSource::Refresh, FakeSource::Cached, FakeSource::Refresh,
                                               FakeSource::Cached, FakeSource::Refresh};
  for (size_t i = 0; i < kinds.size(); ++i) EXPECT_EQ(src.calls[i].kind, kinds[i]) << "call " << i;
  EXPECT_EQ(src.calls[3].begin, 8);
  EXPECT_EQ(src.calls[3].end, 12);
  EXPECT_EQ(src.calls[4].rows, (std::vector<int64_t>{12, 13}));
  FakeSource plain(kV, varied);
  EXPECT_EQ(generate(plain, llada(10, 4, 5), kPrompt).canvas, r.canvas);
}

TEST(Dream, CountsFollowTheTimestepScheduleAndZeroStepsAreSkipped) {
  FakeSource src(kV, varied);
  const auto k = dream_schedule(8, 8);  // 0, 1 x 6, 2
  GenerateHooks hooks;
  std::vector<int64_t> got;
  std::vector<bool> skipped;
  hooks.on_step = [&](const StepEvent& ev) {
    got.push_back(static_cast<int64_t>(ev.committed.size()));
    skipped.push_back(ev.skipped);
  };
  const GenerateResult r = generate(src, dream(8, 8), kPrompt, hooks);
  EXPECT_EQ(got, k);
  EXPECT_TRUE(skipped[0]);
  EXPECT_EQ(r.steps_run, 8);
  EXPECT_EQ(r.forward_passes, 7);
  EXPECT_EQ(src.calls.size(), 7u);
}

TEST(Threshold, CommitsTheScheduleAndEveryConfidentPosition) {
  // Rows 4..7 are confident (p ~ 0.999), the rest are not.
  auto fn = [](std::span<const int32_t>, int64_t row, float* out) {
    peaked(out, kV, 11, row < 8 ? 11.0f : 2.0f + 0.1f * static_cast<float>(row));
  };
  FakeSource exact(kV, fn), fast(kV, fn), never(kV, fn);
  GenerateConfig c = llada(8, 8, 8);
  const GenerateResult re = generate(exact, c, kPrompt);
  c.threshold = 0.9;
  std::vector<size_t> counts;
  GenerateHooks hooks;
  hooks.on_step = [&](const StepEvent& ev) {
    counts.push_back(ev.committed.size());
    EXPECT_GE(static_cast<int64_t>(ev.committed.size()), std::min<int64_t>(ev.scheduled, 8));
  };
  const GenerateResult rf = generate(fast, c, kPrompt, hooks);
  EXPECT_EQ(counts, (std::vector<size_t>{4, 1, 1, 1, 1}));
  EXPECT_EQ(rf.forward_passes, 5);
  EXPECT_EQ(rf.steps_run, 5);
  EXPECT_EQ(re.forward_passes, 8);
  EXPECT_EQ(rf.canvas, re.canvas);  // the fake model's proposals do not depend on the canvas
  c.threshold = 1.0;  // nothing reaches probability 1: same as no threshold
  const GenerateResult rn = generate(never, c, kPrompt);
  EXPECT_EQ(rn.forward_passes, 8);
  EXPECT_EQ(rn.canvas, re.canvas);
}

TEST(DualCache, RefreshAtEachBlocksFirstStepThenOnlyTheBlocksRows) {
  FakeSource src(kV, varied);
  GenerateConfig c = llada(8, 4, 8);
  c.dual_cache = true;
  const GenerateResult r = generate(src, c, kPrompt);
  ASSERT_EQ(src.calls.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    const auto& call = src.calls[i];
    const int64_t s = 4 + 4 * static_cast<int64_t>(i / 4), e = s + 4;
    EXPECT_EQ(call.kind, i % 4 == 0 ? FakeSource::Refresh : FakeSource::Cached) << "call " << i;
    if (call.kind == FakeSource::Cached) {
      EXPECT_EQ(call.begin, s);
      EXPECT_EQ(call.end, e);
    }
    EXPECT_EQ(call.rows, masked_positions(call.canvas, s, e));
  }
  FakeSource plain(kV, varied);
  EXPECT_EQ(generate(plain, llada(8, 4, 8), kPrompt).canvas, r.canvas);
}

// Position 6 (third generated) proposes EOS with the highest confidence, positions 4 and 5 token 5.
void eos_third(std::span<const int32_t>, int64_t row, float* out) {
  if (row == 6) return peaked(out, kV, kEos, 10.0f);
  if (row == 4) return peaked(out, kV, 5, 8.0f);
  if (row == 5) return peaked(out, kV, 5, 7.0f);
  peaked(out, kV, 6, 1.0f);
}

TEST(EarlyStop, StopsOnceTheAnswerIsFinalWithTheSameText) {
  FakeSource a(kV, eos_third), b(kV, eos_third);
  GenerateConfig c = llada(8, 8, 8);
  std::vector<int64_t> masked_after;
  GenerateHooks hooks;
  hooks.on_step = [&](const StepEvent& ev) { masked_after.push_back(ev.masked_left); };
  const GenerateResult early = generate(a, c, kPrompt, hooks);
  // Step 0 commits the EOS while positions 4 and 5 are masked: no stop. Step 2 fills position 5: stop.
  EXPECT_EQ(masked_after, (std::vector<int64_t>{7, 6, 5}));
  EXPECT_TRUE(early.stopped_early);
  EXPECT_EQ(early.steps_run, 3);
  c.early_stop = false;
  const GenerateResult full = generate(b, c, kPrompt);
  EXPECT_FALSE(full.stopped_early);
  EXPECT_EQ(full.steps_run, 8);
  const std::vector<int32_t> stops = {kEos, kEot};
  EXPECT_EQ(answer_tokens(early.canvas, 4, stops), (std::vector<int32_t>{5, 5}));
  EXPECT_EQ(answer_tokens(full.canvas, 4, stops), answer_tokens(early.canvas, 4, stops));
}

TEST(EarlyStop, NotEarlyWhenTheLastStepCompletesTheCanvas) {
  FakeSource src(kV, [](std::span<const int32_t>, int64_t row, float* out) {
    peaked(out, kV, row == 5 ? kEot : 5, row == 4 ? 9.0f : 3.0f);
  });
  const GenerateResult r = generate(src, llada(2, 2, 2), kPrompt);
  EXPECT_FALSE(r.stopped_early);
  EXPECT_EQ(r.steps_run, 2);
}

TEST(EarlyStop, AnswerRules) {
  const std::vector<int32_t> stops = {kEos, kEot};
  const std::vector<int32_t> c1 = {1, 2, 7, kMask, kEos, 8};
  EXPECT_FALSE(answer_is_final(c1, 2, kMask, stops));  // a stop after a masked position
  EXPECT_EQ(answer_tokens(c1, 2, stops), (std::vector<int32_t>{7, kMask}));
  const std::vector<int32_t> c2 = {1, 2, 7, kEot, kMask, kMask};
  EXPECT_TRUE(answer_is_final(c2, 2, kMask, stops));
  EXPECT_EQ(answer_tokens(c2, 2, stops), (std::vector<int32_t>{7}));
  const std::vector<int32_t> c3 = {kEos, 2, 7, 9};  // a stop inside the prompt does not count
  EXPECT_FALSE(answer_is_final(c3, 1, kMask, stops));
  EXPECT_EQ(answer_tokens(c3, 1, stops), (std::vector<int32_t>{2, 7, 9}));
}

TEST(Cancel, StopsBetweenStepsWithThePartialCanvas) {
  FakeSource src(kV, varied);
  std::atomic<bool> cancel{false};
  GenerateHooks hooks;
  hooks.cancel = &cancel;
  hooks.on_step = [&](const StepEvent& ev) {
    if (ev.step == 1) cancel = true;
  };
  const GenerateResult r = generate(src, llada(8, 8, 8), kPrompt, hooks);
  EXPECT_TRUE(r.cancelled);
  EXPECT_EQ(r.steps_run, 2);
  EXPECT_EQ(masked_positions(r.canvas, 4, 12).size(), 6u);
}

TEST(Temperature, ReproducibleWithTheSeedAndIndependentOfThreads) {
  auto flat = [](std::span<const int32_t>, int64_t row, float* out) {
    for (int64_t v = 0; v < kV; ++v) out[v] = 0.1f * static_cast<float>((v * (row + 3)) % 7);
    out[kMask] = -100.0f;
  };
  for (GenerateConfig c : {llada(16, 8, 8), dream(16, 8, Remasking::MaskgitPlus)}) {
    c.temperature = 1.0;
    FakeSource a(kV, flat), b(kV, flat), d(kV, flat);
    ThreadPool pool(3);
    GenerateHooks threaded;
    threaded.pool = &pool;
    const GenerateResult ra = generate(a, c, kPrompt);
    const GenerateResult rb = generate(b, c, kPrompt, threaded);
    EXPECT_EQ(ra.canvas, rb.canvas);
    c.seed = 43;
    EXPECT_NE(generate(d, c, kPrompt).canvas, ra.canvas);
  }
}

// --- log-probabilities ---

// ln softmax(row / T)[token] (T = 0: 1) in long double, straight from the definition.
double log_softmax(const float* row, int64_t V, int32_t token, double T) {
  const long double t = T > 0 ? T : 1.0L;
  long double mx = -INFINITY;
  for (int64_t v = 0; v < V; ++v) mx = std::max(mx, row[v] / t);
  long double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] / t - mx);
  return static_cast<double>(row[token] / t - mx - std::log(sum));
}

TEST(Logprobs, EveryGeneratedPositionFromTheRowAndStepThatCommittedIt) {
  for (GenerateConfig c : {llada(12, 8, 6), llada(8, 4, 8), dream(8, 5)}) {
    for (double T : {0.0, 0.8}) {
      for (int k : {0, 3, 20}) {
        SCOPED_TRACE(testing::Message() << (c.arch == Arch::Dream ? "dream" : "llada") << " T " << T << " k " << k);
        c.temperature = T;
        c.top_logprobs = k;
        std::map<int64_t, int64_t> step_of;  // position -> the step that committed it
        GenerateHooks hooks;
        hooks.on_step = [&](const StepEvent& ev) {
          ASSERT_EQ(ev.logprobs.size(), static_cast<size_t>(c.max_tokens));
          for (int64_t j : ev.committed) {
            step_of[j] = ev.step;
            EXPECT_EQ(ev.logprobs[static_cast<size_t>(j - 4)].step, ev.step);  // streamed as it is committed
            EXPECT_EQ(ev.logprobs[static_cast<size_t>(j - 4)].chosen.token, ev.canvas[static_cast<size_t>(j)]);
          }
        };
        FakeSource src(kV, varied);
        const GenerateResult r = generate(src, c, kPrompt, hooks);
        ASSERT_EQ(r.logprobs.size(), static_cast<size_t>(c.max_tokens));
        for (int64_t i = 0; i < c.max_tokens; ++i) {
          const int64_t j = 4 + i;
          const PositionLogprobs& p = r.logprobs[static_cast<size_t>(i)];
          EXPECT_EQ(p.chosen.token, r.canvas[static_cast<size_t>(j)]);
          EXPECT_EQ(p.step, step_of.at(j));
          // The fake's rows do not depend on the canvas: the row that proposed position j.
          std::vector<float> row(kV);
          varied({}, c.arch == Arch::Dream ? j - 1 : j, row.data());
          EXPECT_NEAR(p.chosen.logprob, log_softmax(row.data(), kV, p.chosen.token, T), 1e-12);
          ASSERT_EQ(p.top.size(), static_cast<size_t>(k));
          for (size_t a = 0; a < p.top.size(); ++a) {
            EXPECT_NEAR(p.top[a].logprob, log_softmax(row.data(), kV, p.top[a].token, T), 1e-12);
            EXPECT_LE(p.top[a].logprob, 0.0);
            if (a > 0) {  // most probable first, lowest id first among equals
              EXPECT_TRUE(p.top[a - 1].logprob > p.top[a].logprob ||
                          (p.top[a - 1].logprob == p.top[a].logprob && p.top[a - 1].token < p.top[a].token));
            }
          }
          if (T == 0 && k > 0) {  // greedy: the committed token is the most probable one
            EXPECT_EQ(p.chosen.token, p.top[0].token);
            EXPECT_EQ(p.chosen.logprob, p.top[0].logprob);
          }
          EXPECT_LE(p.chosen.logprob, 0.0);
        }
      }
    }
  }
}

TEST(Logprobs, NeverChangeTheGenerationAndAreEmptyWhenOff) {
  auto threshold = llada(12, 8, 6);
  threshold.threshold = 0.3;
  auto cached = llada(10, 4, 5);
  cached.dual_cache = true;
  for (GenerateConfig c : {llada(12, 8, 6), threshold, cached, dream(8, 5, Remasking::MaskgitPlus)}) {
    for (double T : {0.0, 1.0}) {
      c.temperature = T;
      c.top_logprobs = -1;
      FakeSource a(kV, varied), b(kV, varied);
      ThreadPool pool(3);
      GenerateHooks threaded;
      threaded.pool = &pool;
      GenerateHooks quiet;
      quiet.on_step = [](const StepEvent& ev) { EXPECT_TRUE(ev.logprobs.empty()); };
      const GenerateResult off = generate(a, c, kPrompt, quiet);
      c.top_logprobs = 5;
      const GenerateResult on = generate(b, c, kPrompt, threaded);
      EXPECT_TRUE(off.logprobs.empty());
      EXPECT_EQ(on.logprobs.size(), static_cast<size_t>(c.max_tokens));
      EXPECT_EQ(on.canvas, off.canvas);
      EXPECT_EQ(on.steps_run, off.steps_run);
      EXPECT_EQ(a.calls.size(), b.calls.size());
    }
  }
}

TEST(Logprobs, PositionsLeftMaskedHaveNoStep) {
  FakeSource src(kV, varied);
  std::atomic<bool> cancel{false};
  GenerateHooks hooks;
  hooks.cancel = &cancel;
  hooks.on_step = [&](const StepEvent&) { cancel = true; };
  GenerateConfig c = llada(8, 8, 8);
  c.top_logprobs = 2;
  const GenerateResult r = generate(src, c, kPrompt, hooks);
  ASSERT_EQ(r.logprobs.size(), 8u);
  int64_t committed = 0;
  for (size_t i = 0; i < 8; ++i) {
    const PositionLogprobs& p = r.logprobs[i];
    if (r.canvas[4 + i] == kMask) {
      EXPECT_EQ(p.step, -1);
      EXPECT_EQ(p.chosen.token, kMask);
      EXPECT_TRUE(p.top.empty());
    } else {
      EXPECT_EQ(p.step, 0);
      ++committed;
    }
  }
  EXPECT_EQ(committed, 1);
}

void expect_usage_error(const GenerateConfig& c, int64_t prompt_length, const std::string& text) {
  try {
    validate(c, prompt_length);
    ADD_FAILURE() << "no error, expected: " << text;
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_EQ(std::string(e.what()), text);
  }
}

TEST(Validate, ArchitectureChecksAreUsageErrorsNamingBothValues) {
  expect_usage_error(llada(100, 32, 3), 4,
                     "--steps 3 is fewer than the block count 4 (--max-tokens 100 / --block-length 32, rounded up): "
                     "every block needs at least one step");
  expect_usage_error(llada(8, 0, 8), 4, "flag --block-length must be at least 1, got 0");
  EXPECT_NO_THROW(validate(llada(128, 24, 128), 4));  // a shorter last block
  EXPECT_NO_THROW(validate(llada(128, 32, 10), 4));   // steps not a multiple of the block count
  EXPECT_NO_THROW(validate(llada(16, 32, 16), 4));    // one block of max_tokens
  EXPECT_NO_THROW(validate(llada(1, 32, 1), 4));
  GenerateConfig c = llada(8, 8, 8);
  c.top_logprobs = 21;
  expect_usage_error(c, 4, "flag --top-logprobs must be between 0 and 20 (-1: off), got 21");
  c.top_logprobs = -2;
  expect_usage_error(c, 4, "flag --top-logprobs must be between 0 and 20 (-1: off), got -2");
  c = llada(8, 8, 8);
  c.remasking = Remasking::Entropy;
  expect_usage_error(c, 4, "--remasking entropy is not available for LLaDA models (use low_confidence or random)");
  c = dream(8, 8, Remasking::Random);
  expect_usage_error(c, 4,
                     "--remasking random is not available for Dream models (use entropy, maskgit_plus or topk_margin)");
  c = dream(8, 8);
  c.threshold = 0.9;
  expect_usage_error(c, 4, "--threshold is for LLaDA models only (this model is Dream)");
  c = dream(8, 8);
  c.dual_cache = true;
  expect_usage_error(c, 4, "--dual-cache is for LLaDA models only (this model is Dream)");
  expect_usage_error(dream(8, 8), 0, "the prompt is empty: Dream needs at least one prompt token");
  c = llada(8, 8, 8);
  c.dual_cache = c.full_logits = true;
  expect_usage_error(c, 4, "flags --dual-cache and --full-logits cannot be combined");
  c = llada(8, 8, 8);
  c.context_length = 10;
  expect_usage_error(c, 4, "the canvas of 4 prompt tokens + --max-tokens 8 is longer than the model's context length 10");
  // Dream ignores --block-length; a Dream step count needs no multiple.
  GenerateConfig d = dream(128, 7);
  d.block_length = 24;
  EXPECT_NO_THROW(validate(d, 4));
  EXPECT_NO_THROW(validate(llada(128, 32, 0), 4));  // --steps defaults to --max-tokens
}

}  // namespace
}  // namespace dllm::model
