// One forward pass over many sequences (model::Batch, forward_batch): a sequence's logits and tokens are
// bit-identical whether it runs alone or in a batch with any others, whenever it joins, on every executor
// (the reference executor and every JIT family this CPU has; the GPU's through the emulator in
// test_gpu_emulated). Cases: both architectures, every remasking mode, temperature > 0 with seeds, LLaDA's
// threshold and dual cache, blocks that do not divide, log-probabilities, the early stop, sequences of
// different lengths joining at different steps, cancellation, and the limits on sequences and rows.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "jit/cpu_executor.h"
#include "model/batch.h"
#include "common/error.h"
#include "model/generate.h"
#include "model/model.h"
#include "support.h"

using namespace dllm;
using model::Arch;
using model::GenerateConfig;
using model::Remasking;

namespace {

// An executor: "reference" or a JIT family's label.
struct ExecutorChoice {
  std::string label;
  bool reference = false;
  jit::Isa isa = jit::Isa::Portable;
};

std::vector<ExecutorChoice> executors() {
  std::vector<ExecutorChoice> out{{"reference", true}};
  for (jit::Isa isa : jit::cpu_features().supported()) out.push_back({test::family_label(isa), false, isa});
  return out;
}

model::Model& load(const std::string& file, const ExecutorChoice& ex) {
  static std::map<std::string, std::unique_ptr<model::Model>> cache;
  auto& m = cache[file + "/" + ex.label];
  if (!m) {
    model::LoadOptions o;
    o.threads = 2;
    if (!ex.reference) {
      const jit::Isa isa = ex.isa;
      o.make_executor = [isa](ThreadPool& pool) { return std::make_unique<jit::CpuExecutor>(pool, isa); };
    }
    m = model::Model::load(test::data_path("models/" + file), o);
  }
  return *m;
}

struct Request {
  GenerateConfig config;
  std::vector<int32_t> prompt;
};

bool blocks(const model::Model& m) { return model::arch_spec(m.arch()).sampler == model::SamplerKind::Blocks; }

// Requests of different lengths and settings over the prompts of the generation references.
std::vector<Request> requests_for(const model::Model& m) {
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& f : test::generation_case_files()) {
    const test::GenerationCase c = test::load_generation_case(f);
    const bool llada = f.rfind("llada", 0) == 0;
    // llada-moe shares LLaDA's tiny vocabulary and sampler, rnd1 Dream's.
    if (llada == blocks(m) && prompts.size() < 4) prompts.push_back(c.prompt);
  }
  GenerateConfig base;
  base.arch = m.arch();
  base.mask_id = m.mask_token_id();
  base.context_length = m.hparams().n_ctx;
  base.max_tokens = 16, base.steps = 16, base.block_length = 16, base.early_stop = false;
  base.remasking = blocks(m) ? Remasking::LowConfidence : Remasking::Entropy;
  {  // the first token of a greedy answer serves as the stop token, so the early stop fires
    auto src = model::make_model_logit_source(const_cast<model::Model&>(m));
    const model::GenerateResult r = model::generate(*src, base, prompts[0]);
    base.stop_ids = {r.generated()[0]};
  }
  base.early_stop = true;
  std::vector<Request> out;
  auto add = [&](size_t prompt, auto&& edit) {
    Request r{base, prompts[prompt % prompts.size()]};
    edit(r.config);
    out.push_back(r);
  };
  if (blocks(m)) {
    add(0, [](GenerateConfig& c) { c.max_tokens = 32, c.steps = 16, c.block_length = 8; });
    add(1, [](GenerateConfig& c) { c.max_tokens = 16, c.steps = 16, c.block_length = 16, c.early_stop = false; });
    // Blocks that do not divide, with log-probabilities: 10, 10 and 4 positions with 5, 5 and 2 steps; 12, 12
    // and 8 with 3, 3 and 2.
    add(2, [](GenerateConfig& c) {
      c.max_tokens = 24, c.steps = 12, c.block_length = 10, c.remasking = Remasking::Random, c.temperature = 0.7;
      c.seed = 11, c.top_logprobs = 0;
    });
    add(3, [](GenerateConfig& c) {
      c.max_tokens = 32, c.steps = 8, c.block_length = 12, c.threshold = 0.3, c.top_logprobs = 3;
    });
    add(0, [](GenerateConfig& c) { c.max_tokens = 32, c.steps = 16, c.block_length = 8, c.dual_cache = true; });
    add(1, [](GenerateConfig& c) {
      c.max_tokens = 16, c.steps = 8, c.block_length = 8, c.dual_cache = true, c.temperature = 0.5, c.seed = 5;
      c.early_stop = false;
    });
  } else {
    add(0, [](GenerateConfig& c) { c.max_tokens = 32, c.steps = 16, c.remasking = Remasking::Entropy; });
    add(1, [](GenerateConfig& c) {
      c.max_tokens = 16, c.steps = 16, c.remasking = Remasking::MaskgitPlus, c.early_stop = false;
    });
    add(2, [](GenerateConfig& c) {
      c.max_tokens = 24, c.steps = 12, c.remasking = Remasking::TopkMargin, c.temperature = 0.6, c.seed = 9;
    });
    add(3, [](GenerateConfig& c) {
      c.max_tokens = 20, c.steps = 7, c.remasking = Remasking::Entropy, c.temperature = 1.0, c.seed = 3;
      c.top_logprobs = 4;
    });
    add(0, [](GenerateConfig& c) { c.max_tokens = 12, c.steps = 12, c.remasking = Remasking::MaskgitPlus; });
  }
  return out;
}

void expect_same(const model::GenerateResult& alone, const model::GenerateResult& batched, const std::string& what) {
  EXPECT_EQ(batched.canvas, alone.canvas) << what;
  EXPECT_EQ(batched.steps_run, alone.steps_run) << what;
  EXPECT_EQ(batched.forward_passes, alone.forward_passes) << what;
  EXPECT_EQ(batched.stopped_early, alone.stopped_early) << what;
  EXPECT_EQ(batched.committed, alone.committed) << what;
  ASSERT_EQ(batched.logprobs.size(), alone.logprobs.size()) << what;
  for (size_t i = 0; i < alone.logprobs.size(); ++i) {
    const model::PositionLogprobs &a = alone.logprobs[i], &b = batched.logprobs[i];
    EXPECT_EQ(b.step, a.step) << what << " position " << i;
    EXPECT_EQ(b.chosen.token, a.chosen.token) << what << " position " << i;
    EXPECT_EQ(b.chosen.logprob, a.chosen.logprob) << what << " position " << i;
    ASSERT_EQ(b.top.size(), a.top.size()) << what << " position " << i;
    for (size_t k = 0; k < a.top.size(); ++k) {
      EXPECT_EQ(b.top[k].token, a.top[k].token) << what << " position " << i;
      EXPECT_EQ(b.top[k].logprob, a.top[k].logprob) << what << " position " << i;
    }
  }
  EXPECT_FALSE(batched.cancelled) << what;
}

class BatchExactness : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchExactness, TokensBitIdenticalAloneOrBatchedWheneverTheyJoin) {
  const std::string file = GetParam();
  for (const ExecutorChoice& ex : executors()) {
    model::Model& m = load(file, ex);
    const std::vector<Request> reqs = requests_for(m);
    std::vector<model::GenerateResult> alone;
    for (const Request& r : reqs) {
      auto src = model::make_model_logit_source(m);
      alone.push_back(model::generate(*src, r.config, r.prompt));
    }
    int stopped_early = 0;
    for (const auto& r : alone) stopped_early += r.stopped_early;
    EXPECT_GT(stopped_early, 0) << file << ": no request exercises the early stop";

    // All at once (room for every one); three in flight (the others wait and join as sequences leave);
    // a row limit; and sequences added while others are mid-way.
    struct Plan {
      const char* name;
      model::BatchLimits limits;
      int join_every;  // add one more request every `join_every` steps (0: all up front)
    };
    int64_t longest = 0, shortest = 1 << 30;
    for (const Request& r : reqs) {
      const int64_t n = static_cast<int64_t>(r.prompt.size()) + r.config.max_tokens;
      longest = std::max(longest, n), shortest = std::min(shortest, n);
    }
    for (const Plan& plan : {Plan{"all", {16, 0}, 0}, Plan{"three", {3, 0}, 0},
                             Plan{"rows", {8, longest + shortest}, 0},
                             Plan{"staggered", {8, 0}, 2}}) {
      model::Batch batch(m, plan.limits);
      std::map<int64_t, size_t> index;
      size_t added = 0;
      auto add_next = [&] {
        index[batch.add(reqs[added].config, reqs[added].prompt)] = added;
        ++added;
      };
      if (plan.join_every == 0) {
        while (added < reqs.size()) add_next();
      } else {
        add_next();
      }
      int steps = 0, max_in_flight = 0;
      std::map<size_t, model::GenerateResult> got;
      while (batch.step() || added < reqs.size()) {
        ++steps;
        max_in_flight = std::max<int>(max_in_flight, static_cast<int>(batch.last_step_sequences()));
        EXPECT_LE(batch.in_flight(), plan.limits.max_sequences);
        if (plan.limits.max_rows > 0 && batch.last_step_sequences() > 1) {
          EXPECT_LE(batch.last_step_rows(), plan.limits.max_rows);
        }
        if (plan.join_every > 0 && steps % plan.join_every == 0 && added < reqs.size()) add_next();
        for (auto& [id, res] : batch.take_finished()) got[index.at(id)] = std::move(res);
        ASSERT_LT(steps, 10000);
      }
      ASSERT_EQ(got.size(), reqs.size()) << plan.name;
      EXPECT_GT(max_in_flight, 1) << plan.name << ": the plan never batched two sequences";
      for (size_t i = 0; i < reqs.size(); ++i)
        expect_same(alone[i], got[i], file + " " + ex.label + " " + plan.name + " request " + std::to_string(i));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, BatchExactness,
                         ::testing::Values("tiny-llada-Q4_K_M.gguf", "tiny-dream-Q4_K_M.gguf", "tiny-llada-F32.gguf",
                                           "tiny-dream-Q8_0.gguf", "../moe/gguf/tiny-llada-moe-Q4_K_M.gguf",
                                           "../moe/gguf/tiny-rnd1-Q4_K_M.gguf", "../moe/gguf/tiny-rnd1-F32.gguf"),
                         [](const auto& info) { return test::test_label(info.param); });

// The logits themselves: a batch of canvases of different lengths, with repeated and unordered rows and a
// dual-cache pair, gives each sequence the bits of its pass alone.
TEST(ForwardBatch, LogitsBitIdenticalToEachSequenceAlone) {
  for (const ExecutorChoice& ex : executors()) {
    for (const char* file : {"tiny-llada-Q4_K_M.gguf", "tiny-dream-Q4_K_M.gguf"}) {
      model::Model& m = load(file, ex);
      const int64_t V = m.n_vocab();
      const std::vector<std::vector<int32_t>> canvases = {
          {1, 5, 9, 14, 200, m.mask_token_id(), m.mask_token_id(), 7},
          {3, 4},
          {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, m.mask_token_id(), 300, 301, 302, 303, 304, 305}};
      const std::vector<std::vector<int64_t>> rows = {{7, 0, 5, 5}, {1}, {17, 3, 11}};
      std::vector<std::vector<float>> alone, batched(canvases.size());
      std::vector<model::ForwardRequest> reqs;
      for (size_t i = 0; i < canvases.size(); ++i) {
        alone.push_back(m.forward(canvases[i], rows[i]));
        batched[i].resize(rows[i].size() * static_cast<size_t>(V));
        reqs.push_back(model::ForwardRequest{canvases[i], rows[i], batched[i].data()});
      }
      m.forward_batch(reqs);
      for (size_t i = 0; i < canvases.size(); ++i) {
        ASSERT_EQ(batched[i].size(), alone[i].size());
        EXPECT_EQ(0, std::memcmp(batched[i].data(), alone[i].data(), alone[i].size() * sizeof(float)))
            << file << " " << ex.label << " canvas " << i;
      }

      // Dual cache: a Fill and a Reuse pass of two sequences batched with an exact one.
      model::KVCache alone_cache, batch_cache;
      std::vector<float> fill_alone(4 * V), reuse_alone(2 * V), fill_b(4 * V), reuse_b(2 * V), exact_b(V);
      const std::vector<int64_t> fill_rows = {12, 13, 14, 15}, reuse_rows = {13, 15}, exact_rows = {1};
      model::ForwardRequest f{canvases[2], fill_rows, fill_alone.data(), &alone_cache, model::CacheMode::Fill};
      m.forward(f);
      model::ForwardRequest r{canvases[2], reuse_rows, reuse_alone.data(), &alone_cache, model::CacheMode::Reuse, 12, 16};
      m.forward(r);
      std::vector<model::ForwardRequest> two = {
          model::ForwardRequest{canvases[2], fill_rows, fill_b.data(), &batch_cache, model::CacheMode::Fill},
          model::ForwardRequest{canvases[1], exact_rows, exact_b.data()}};
      m.forward_batch(two);
      two[0] = model::ForwardRequest{canvases[2], reuse_rows, reuse_b.data(), &batch_cache, model::CacheMode::Reuse, 12, 16};
      m.forward_batch(two);
      EXPECT_EQ(fill_b, fill_alone) << file << " " << ex.label;
      EXPECT_EQ(reuse_b, reuse_alone) << file << " " << ex.label;
      EXPECT_EQ(0, std::memcmp(exact_b.data(), alone[1].data(), V * sizeof(float)));
    }
  }
}

TEST(Batch, CancelledSequenceLeavesOthersUntouched) {
  const ExecutorChoice ex = executors().back();
  model::Model& m = load("tiny-llada-Q4_K_M.gguf", ex);
  const std::vector<Request> reqs = requests_for(m);
  model::Batch batch(m, {4, 0});
  std::vector<int64_t> ids;
  for (size_t i = 0; i < 3; ++i) ids.push_back(batch.add(reqs[i].config, reqs[i].prompt));
  ASSERT_TRUE(batch.step());
  batch.cancel(ids[1]);
  std::map<int64_t, model::GenerateResult> got;
  batch.run();
  for (auto& [id, res] : batch.take_finished()) got[id] = std::move(res);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(got[ids[1]].cancelled);
  EXPECT_EQ(got[ids[1]].steps_run, 1);
  for (size_t i : {size_t{0}, size_t{2}}) {
    auto src = model::make_model_logit_source(m);
    expect_same(model::generate(*src, reqs[i].config, reqs[i].prompt), got[ids[i]], "request " + std::to_string(i));
  }
  EXPECT_FALSE(batch.step());
}

TEST(Batch, BadRequestsAreRefusedWhenAdded) {
  model::Model& m = load("tiny-llada-Q4_K_M.gguf", executors().front());
  model::Batch batch(m);
  GenerateConfig c;
  c.mask_id = m.mask_token_id();
  c.max_tokens = 16, c.block_length = 5, c.steps = 3;  // 4 blocks
  try {
    batch.add(c, std::vector<int32_t>{1, 2});
    ADD_FAILURE() << "fewer steps than blocks were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::kUsage) << e.what();
  }
  c.block_length = 8;
  c.steps = 0;
  EXPECT_THROW(batch.add(c, std::vector<int32_t>{1, static_cast<int32_t>(m.n_vocab())}), Error);
  EXPECT_EQ(batch.waiting(), 0);
  EXPECT_FALSE(batch.step());
}

}  // namespace
