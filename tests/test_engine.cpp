// The engine layer on the tiny models (reference executor): model::Batch gives every sequence the result
// generate() gives it alone, whatever joins when (different lengths, settings and architectures' samplers,
// threshold, dual cache, a row limit); the Engine's request checks name the field at fault; the chat
// templates' system turn; a Session's answers are run()'s.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>

#include "engine/engine.h"
#include "model/batch.h"
#include "model/chat.h"
#include "common/error.h"
#include "model/generate.h"
#include "model/model.h"
#include "support.h"

namespace dllm::test {
namespace {

using model::Arch;
using model::GenerateConfig;
using model::Remasking;

const std::string kLlada = data_path("models/tiny-llada-F32.gguf");
const std::string kDream = data_path("models/tiny-dream-F32.gguf");

struct Case {
  GenerateConfig config;
  std::vector<int32_t> prompt;
};

GenerateConfig config(const model::Model& m, int64_t L, int64_t steps, int64_t B = 32) {
  GenerateConfig c;
  c.arch = m.arch();
  c.mask_id = m.mask_token_id();
  c.stop_ids = {m.arch() == Arch::LLaDA ? 1013 : 1016};
  c.max_tokens = L;
  c.steps = steps;
  c.block_length = B;
  c.remasking = model::default_remasking(m.arch());
  c.context_length = m.hparams().n_ctx;
  return c;
}

std::vector<Case> llada_cases(const model::Model& m) {
  std::vector<Case> cs;
  cs.push_back({config(m, 16, 8, 8), {1012, 5, 9, 44, 70}});
  Case b{config(m, 32, 16, 16), {1012, 300, 7}};
  b.config.temperature = 0.9, b.config.seed = 3;
  cs.push_back(b);
  Case c{config(m, 16, 16, 8), {1012, 11, 12, 13, 14, 15, 16}};
  c.config.dual_cache = true, c.config.threshold = 0.6;
  cs.push_back(c);
  Case d{config(m, 8, 4, 4), {1012, 100}};
  d.config.remasking = Remasking::Random, d.config.seed = 9, d.config.early_stop = false;
  cs.push_back(d);
  Case e{config(m, 24, 12, 8), {1012, 1, 2, 3, 4, 5, 6, 7, 8, 9}};
  e.config.dual_cache = true, e.config.temperature = 0.4;
  cs.push_back(e);
  return cs;
}

std::vector<Case> dream_cases(const model::Model& m) {
  std::vector<Case> cs;
  cs.push_back({config(m, 16, 8), {5, 6, 7, 8}});
  Case b{config(m, 8, 8), {9, 10}};
  b.config.remasking = Remasking::MaskgitPlus, b.config.temperature = 0.5, b.config.seed = 21;
  cs.push_back(b);
  Case c{config(m, 20, 10), {11, 12, 13, 14, 15, 16}};
  c.config.remasking = Remasking::TopkMargin;
  cs.push_back(c);
  Case d{config(m, 12, 12), {17}};
  d.config.early_stop = false, d.config.temperature = 1.0, d.config.seed = 2;
  cs.push_back(d);
  return cs;
}

void expect_same(const model::GenerateResult& batched, const model::GenerateResult& alone) {
  EXPECT_EQ(batched.canvas, alone.canvas);
  EXPECT_EQ(batched.prompt_length, alone.prompt_length);
  EXPECT_EQ(batched.steps_run, alone.steps_run);
  EXPECT_EQ(batched.forward_passes, alone.forward_passes);
  EXPECT_EQ(batched.total_steps, alone.total_steps);
  EXPECT_EQ(batched.stopped_early, alone.stopped_early);
  EXPECT_EQ(batched.committed, alone.committed);
  EXPECT_FALSE(batched.cancelled);
}

// Sequences join at different steps (some wait for room): each one's result is its result alone.
void check_batch(const std::string& path, std::vector<Case> (*cases)(const model::Model&)) {
  const auto m = model::Model::load(path);
  const std::vector<Case> cs = cases(*m);
  std::vector<model::GenerateResult> alone;
  for (const Case& c : cs) {
    auto src = model::make_model_logit_source(*m);
    alone.push_back(model::generate(*src, c.config, c.prompt));
  }
  for (const model::BatchLimits limits : {model::BatchLimits{3, 0}, model::BatchLimits{8, 40}}) {
    SCOPED_TRACE("max_sequences " + std::to_string(limits.max_sequences) + ", max_rows " +
                 std::to_string(limits.max_rows));
    model::Batch batch(*m, limits);
    std::map<int64_t, size_t> which;
    int64_t most = 0;  // sequences in one pass, at most
    auto step = [&] {
      const bool more = batch.step();
      most = std::max(most, batch.last_step_sequences());
      return more;
    };
    which[batch.add(cs[0].config, cs[0].prompt)] = 0;
    step();
    step();
    for (size_t i = 1; i < cs.size(); ++i) {
      which[batch.add(cs[i].config, cs[i].prompt)] = i;
      step();
    }
    while (step()) {
    }
    EXPECT_GE(most, 2);  // passes were shared
    if (limits.max_rows == 0) {
      EXPECT_LE(most, limits.max_sequences);
    }
    auto done = batch.take_finished();
    ASSERT_EQ(done.size(), cs.size());
    for (auto& [id, result] : done) {
      SCOPED_TRACE("sequence " + std::to_string(which.at(id)));
      expect_same(result, alone[which.at(id)]);
    }
    EXPECT_EQ(batch.in_flight(), 0);
    EXPECT_EQ(batch.waiting(), 0);
  }
}

TEST(Batch, LladaSequencesJoiningAtDifferentStepsMatchGenerateAlone) { check_batch(kLlada, llada_cases); }
TEST(Batch, DreamSequencesJoiningAtDifferentStepsMatchGenerateAlone) { check_batch(kDream, dream_cases); }

TEST(Batch, CancelledSequenceLeavesTheOthersUntouched) {
  const auto m = model::Model::load(kLlada);
  const std::vector<Case> cs = llada_cases(*m);
  auto src = model::make_model_logit_source(*m);
  const model::GenerateResult alone = model::generate(*src, cs[1].config, cs[1].prompt);
  model::Batch batch(*m, {4, 0});
  const int64_t a = batch.add(cs[0].config, cs[0].prompt);
  const int64_t b = batch.add(cs[1].config, cs[1].prompt);
  batch.step();
  batch.cancel(a);
  batch.run();
  for (auto& [id, r] : batch.take_finished()) {
    if (id == a) {
      EXPECT_TRUE(r.cancelled);
    }
    if (id == b) expect_same(r, alone);
  }
}

// --- the engine ---

engine::Request text_request(const std::string& prompt, int64_t max_tokens, int64_t steps, int64_t block) {
  engine::Request r;
  r.prompt = prompt;
  r.sampling.max_tokens = max_tokens;
  r.sampling.steps = steps;
  r.sampling.block_length = block;
  return r;
}

void expect_request_error(const engine::Engine& e, const engine::Request& r, const std::string& key,
                          const std::string& what, int exit_code = 2) {
  try {
    e.prepare(r);
    ADD_FAILURE() << "no error, expected: " << what;
  } catch (const engine::RequestError& err) {
    EXPECT_EQ(err.key(), key);
    EXPECT_EQ(std::string(err.what()), what);
    EXPECT_EQ(err.exit_code(), exit_code);
  }
}

TEST(Engine, RequestChecksNameTheFieldAtFault) {
  const engine::Engine llada(kLlada), dream(kDream);
  expect_request_error(llada, text_request("x", 24, 2, 8), "steps",
                       "steps 2 is fewer than the block count 3 (max_tokens 24 / block_length 8, rounded up): "
                       "every block needs at least one step");
  expect_request_error(llada, text_request("x", 16, 32, 8), "steps",
                       "setting steps must be at most max_tokens 16, got 32 (every step commits at least one token)");
  expect_request_error(llada, text_request("x", 4096, 0, 32), "max_tokens",
                       "the canvas of 15 prompt tokens + max_tokens 4096 is longer than the model's context length "
                       "4096");
  engine::Request r = text_request("x", 8, 8, 8);
  r.sampling.remasking = "entropy";
  expect_request_error(llada, r, "remasking",
                       "remasking entropy is not available for LLaDA models (use low_confidence or random)");
  r.sampling.remasking = "nope";
  expect_request_error(llada, r, "remasking", "setting remasking: unknown strategy 'nope'");
  r = text_request("", 8, 8, 8);
  r.prompt_tokens = std::vector<int64_t>{3, 2000};
  expect_request_error(llada, r, "prompt_tokens",
                       "prompt_tokens: id 2000 at position 1 is out of range: the model's vocabulary has 1024 tokens "
                       "(ids 0..1023)",
                       1);
  r = text_request("x", 8, 8, 8);
  r.sampling.threshold = 0.5;
  expect_request_error(dream, r, "threshold", "threshold is for LLaDA models only (this model is Dream)");
  r = text_request("x", 8, 8, 8);
  r.sampling.dual_cache = true;
  r.sampling.full_logits = true;
  expect_request_error(llada, r, "dual_cache", "settings dual_cache and full_logits cannot be combined");
  // The CLI's names for the same error.
  try {
    llada.prepare(text_request("x", 24, 2, 8));
    ADD_FAILURE() << "no error";
  } catch (const engine::RequestError& err) {
    EXPECT_EQ(std::string(err.as_flags().what()),
              "--steps 2 is fewer than the block count 3 (--max-tokens 24 / --block-length 8, rounded up): every "
              "block needs at least one step");
    EXPECT_EQ(err.message([](std::string_view n) { return "<" + std::string(n) + ">"; }),
              "<steps> 2 is fewer than the block count 3 (<max_tokens> 24 / <block_length> 8, rounded up): every "
              "block needs at least one step");
  }
}

TEST(Engine, SystemTurnOfBothTemplates) {
  EXPECT_EQ(model::render_chat(model::ChatTemplate::LLaDA, " hi ", "<B>", " Be brief. "),
            "<B><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(model::render_chat(model::ChatTemplate::Dream, "hi", "", "Be brief."),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(model::render_chat(model::ChatTemplate::Dream, "hi", ""),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\n");
  const engine::Engine e(kDream);
  engine::Request r = text_request("hi", 8, 8, 8);
  const auto plain = e.prepare(r).prompt;
  r.system = "You are a helpful assistant.";  // Dream's default turn, given explicitly
  EXPECT_EQ(e.prepare(r).prompt, plain);
  r.system = "Be brief.";
  EXPECT_NE(e.prepare(r).prompt, plain);
}

TEST(Engine, SessionAnswersAreRunsAnswers) {
  engine::Engine e(kLlada);
  EXPECT_FALSE(e.loaded());
  e.load({});
  EXPECT_TRUE(e.loaded());
  std::vector<engine::Request> reqs = {text_request("Write a haiku", 16, 8, 8), text_request("hi", 8, 8, 8),
                                       text_request("Tell me a story", 32, 16, 16)};
  reqs[1].sampling.temperature = 0.7;
  reqs[2].sampling.dual_cache = true;
  std::vector<engine::Answer> alone;
  for (const auto& r : reqs) alone.push_back(engine::run(e, e.prepare(r)));
  engine::Session s(e, {2, 0});
  for (const auto& r : reqs) s.add(e.prepare(r));
  EXPECT_EQ(s.tracked_requests(), reqs.size());
  std::map<int64_t, engine::Answer> got;
  while (s.step())
    for (auto& [id, a] : s.take_finished()) got[id] = std::move(a);
  for (auto& [id, a] : s.take_finished()) got[id] = std::move(a);
  ASSERT_EQ(got.size(), reqs.size());
  // A long-running session (the server's) keeps nothing of the requests it finished.
  EXPECT_EQ(s.tracked_requests(), 0u);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[static_cast<int64_t>(i)].result.canvas, alone[i].result.canvas) << i;
    EXPECT_EQ(got[static_cast<int64_t>(i)].tokens, alone[i].tokens) << i;
    EXPECT_EQ(got[static_cast<int64_t>(i)].text, alone[i].text) << i;
    EXPECT_EQ(alone[i].tokens, model::answer_tokens(alone[i].result.canvas, alone[i].result.prompt_length, e.stops()));
  }
}

}  // namespace
}  // namespace dllm::test
