// Greedy generations on the tiny models, token for token and step for step, against every reference of
// tests/data/generations (copies of the shared fixtures marked matches_authors_algorithm: true: the
// authors' LLaDA and Dream samplers at temperature 0 over llama.cpp's forward pass, cross-checked by a
// float64 loop). Runs through the library with the reference executor and --no-early-stop semantics.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <memory>

#include "model/generate.h"
#include "model/model.h"
#include "support.h"

namespace dllm::model {
namespace {

using nlohmann::json;

std::vector<std::string> reference_files() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(test::data_path("generations")))
    if (e.path().extension() == ".json") out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

Model& tiny_model(const std::string& file) {
  static std::map<std::string, std::unique_ptr<Model>> cache;
  auto& m = cache[file];
  if (!m) m = Model::load(test::data_path("models/" + file));
  return *m;
}

class Reference : public ::testing::TestWithParam<std::string> {};

TEST_P(Reference, SameCanvasAndSameCommitsPerStep) {
  const json ref = json::parse(test::read_file(test::data_path("generations/" + GetParam())));
  ASSERT_TRUE(ref.at("matches_authors_algorithm").get<bool>());
  Model& m = tiny_model(ref.at("model_file").get<std::string>());
  const json& a = ref.at("authors_equivalent");

  GenerateConfig cfg;
  cfg.mask_id = m.mask_token_id();
  ASSERT_EQ(cfg.mask_id, ref.at("mask_token_id").get<int32_t>());
  cfg.early_stop = false;
  cfg.steps = a.at("steps").get<int64_t>();
  if (ref.at("arch") == "llada") {
    cfg.arch = Arch::LLaDA;
    cfg.max_tokens = a.at("gen_length").get<int64_t>();
    cfg.block_length = a.at("block_length").get<int64_t>();
    ASSERT_EQ(a.at("remasking"), "low_confidence");
    cfg.remasking = Remasking::LowConfidence;
  } else {
    cfg.arch = Arch::Dream;
    cfg.max_tokens = a.at("max_new_tokens").get<int64_t>();
    auto r = parse_remasking(a.at("alg").get<std::string>());
    ASSERT_TRUE(r.has_value());
    cfg.remasking = *r;
  }
  ASSERT_EQ(a.at("temperature").get<double>(), 0.0);
  const auto prompt = ref.at("prompt_ids").get<std::vector<int32_t>>();

  // step -> committed (position, token) pairs, as the reference trace lists them
  std::map<int64_t, std::vector<std::pair<int64_t, int32_t>>> steps;
  GenerateHooks hooks;
  hooks.pool = &m.pool();
  hooks.on_step = [&](const StepEvent& ev) {
    for (int64_t j : ev.committed)
      steps[ev.step].emplace_back(j, ev.canvas[static_cast<size_t>(j)]);
  };
  auto src = make_model_logit_source(m);
  const GenerateResult res = generate(*src, cfg, prompt, hooks);

  const auto want = ref.at("generated_ids").get<std::vector<int32_t>>();
  const auto got = std::vector<int32_t>(res.generated().begin(), res.generated().end());
  EXPECT_EQ(got, want);
  EXPECT_FALSE(res.stopped_early);
  for (const auto& t : ref.at("trace")) {
    std::vector<std::pair<int64_t, int32_t>> w;
    for (const auto& u : t.at("unmasked")) w.emplace_back(u[0].get<int64_t>(), u[1].get<int32_t>());
    std::sort(w.begin(), w.end());
    EXPECT_EQ(steps[t.at("step").get<int64_t>()], w) << "step " << t.at("step");
  }
  size_t nonempty = 0;
  for (const auto& [s, v] : steps) nonempty += !v.empty();
  EXPECT_EQ(nonempty, ref.at("trace").size());
}

std::string case_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param.substr(0, info.param.size() - 5);
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Generations, Reference, ::testing::ValuesIn(reference_files()), case_name);

TEST(ReferenceSet, HasEveryAuthorsAlgorithmRun) {
  // 43 of the 78 shared runs follow the authors' algorithms (README section 3.5); all are copied.
  EXPECT_EQ(reference_files().size(), 43u);
}

}  // namespace
}  // namespace dllm::model
