// Logits of the reference forward pass against llama.cpp's and a float64 forward pass's logits for every
// tiny model file and case in tests/data/logits (README of shared/fixtures/models, section 2), with the
// tolerances that README measured; and the `logits` command: file layout, range checks, atomic write.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/error.h"
#include "model/model.h"
#include "support.h"

namespace dllm::test {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kVocab = 1024;

// The `logits` command runs the JIT executor by default; these tests compare it with the reference model
// row for row, so they select the reference executor (tests/test_cpu_executor.cpp covers the JIT path).
const bool kReferenceExecutor = setenv("DLLM_EXECUTOR", "reference", 1) == 0;

struct Case {
  std::string name;   // <model>__<case>
  std::string model;  // tiny-llada-Q8_0 ...
  std::vector<int32_t> ids;
  std::vector<int64_t> rows;
  std::vector<float> llama;  // llama.cpp's logits, [rows, vocab]
  std::vector<float> f64;    // float64 forward on the dequantized weights (quantized files only)
};

std::vector<float> read_f32(const std::string& path, size_t count) {
  const std::string bytes = read_file(path);
  if (bytes.size() != count * 4) throw std::runtime_error(path + ": unexpected size");
  std::vector<float> v(count);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

std::vector<Case> load_cases() {
  std::vector<Case> cases;
  const fs::path dir = data_path("logits");
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    const auto j = nlohmann::json::parse(read_file(entry.path().string()));
    Case c;
    c.name = entry.path().stem().string();
    c.model = j.at("model_file").get<std::string>();
    c.model = c.model.substr(0, c.model.size() - 5);  // drop ".gguf"
    c.ids = j.at("ids").get<std::vector<int32_t>>();
    c.rows = j.at("rows").get<std::vector<int64_t>>();
    const size_t n = c.rows.size() * kVocab;
    c.llama = read_f32((dir / j.at("logits_file").get<std::string>()).string(), n);
    if (!j.at("float64_reference_logits_file").is_null()) {
      c.f64 = read_f32((dir / j.at("float64_reference_logits_file").get<std::string>()).string(), n);
    }
    cases.push_back(std::move(c));
  }
  std::sort(cases.begin(), cases.end(), [](const Case& a, const Case& b) { return a.name < b.name; });
  return cases;
}

model::Model& model_named(const std::string& name) {
  static std::map<std::string, std::unique_ptr<model::Model>> models;
  auto& m = models[name];
  if (!m) {
    model::LoadOptions opt;
    opt.threads = 2;
    m = model::Model::load(data_path("models/" + name + ".gguf"), opt);
  }
  return *m;
}

struct Comparison {
  double worst_rel_l2 = 0;  // max over rows of ||a-b|| / ||b||
  double max_abs = 0;
  int argmax_agree = 0;
  int rows = 0;
};

Comparison compare(const std::vector<float>& got, const std::vector<float>& ref) {
  Comparison c;
  c.rows = static_cast<int>(ref.size() / kVocab);
  for (int r = 0; r < c.rows; ++r) {
    const float* a = got.data() + r * kVocab;
    const float* b = ref.data() + r * kVocab;
    double diff = 0, norm = 0;
    int64_t am = 0, bm = 0;
    for (int64_t i = 0; i < kVocab; ++i) {
      diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
      norm += static_cast<double>(b[i]) * b[i];
      c.max_abs = std::max(c.max_abs, std::fabs(static_cast<double>(a[i]) - b[i]));
      if (a[i] > a[am]) am = i;
      if (b[i] > b[bm]) bm = i;
    }
    c.worst_rel_l2 = std::max(c.worst_rel_l2, std::sqrt(diff / norm));
    c.argmax_agree += am == bm;
  }
  return c;
}

TEST(Logits, EveryModelAndCaseMatchesTheReferences) {
  const std::vector<Case> cases = load_cases();
  ASSERT_EQ(cases.size(), 32u) << "8 model files x 4 cases expected in tests/data/logits";
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    model::Model& m = model_named(c.model);
    const std::vector<float> got = m.forward(c.ids, c.rows);
    ASSERT_EQ(got.size(), c.llama.size());
    const Comparison vs_llama = compare(got, c.llama);
    const bool f32 = c.model.ends_with("-F32"), f16 = c.model.ends_with("-F16");
    if (f32) {
      // llama.cpp with flash attention off is itself within 3e-6 of the float64 forward pass.
      EXPECT_LE(vs_llama.worst_rel_l2, 1e-5);
      EXPECT_LE(vs_llama.max_abs, 1e-3);
      EXPECT_EQ(vs_llama.argmax_agree, vs_llama.rows);
    } else if (f16) {
      // llama.cpp rounds activations to F16 before F16 matmuls; this path keeps them in F32.
      EXPECT_LE(vs_llama.worst_rel_l2, 3e-3);
      EXPECT_TRUE(c.f64.empty());
    } else {
      ASSERT_FALSE(c.f64.empty()) << "quantized files come with a float64 reference";
      const Comparison vs_f64 = compare(got, c.f64);
      EXPECT_LE(vs_f64.worst_rel_l2, 1e-5);  // acceptance: 1e-4; measured 3e-7
      EXPECT_EQ(vs_f64.argmax_agree, vs_f64.rows);
      // llama.cpp quantizes the activations too, so only loose agreement is possible.
      const bool q8 = c.model.ends_with("-Q8_0");
      EXPECT_LE(vs_llama.worst_rel_l2, q8 ? 6e-2 : 8e-2);
      if (vs_llama.rows < 10) {
        EXPECT_GE(vs_llama.argmax_agree, vs_llama.rows - 1);
      } else {
        EXPECT_GE(vs_llama.argmax_agree, 0.85 * vs_llama.rows);
      }
    }
  }
}

// --- the logits command, called directly ---

class LogitsCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    char tpl[] = "/tmp/dllm-test-logits-XXXXXX";
    ASSERT_NE(mkdtemp(tpl), nullptr);
    dir_ = tpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  cli::Settings settings(const std::string& model, std::vector<int64_t> tokens, std::vector<int64_t> rows) {
    cli::Settings s;
    s.command = "logits";
    s.model = data_path("models/" + model + ".gguf");
    s.tokens = std::move(tokens);
    s.rows = std::move(rows);
    s.out = dir_ + "/out.f32";
    s.threads = 2;
    return s;
  }
  // Runs cmd_logits expecting a dllm::Error; returns it (message, exit code).
  std::pair<std::string, int> error_of(const cli::Settings& s) {
    try {
      cli::cmd_logits(s);
    } catch (const Error& e) {
      return {e.what(), e.exit_code()};
    }
    return {"", 0};
  }

  std::string dir_;
};

TEST_F(LogitsCommand, WritesRawRowsInRequestedOrder) {
  // c1_short_len8 of tiny-dream-Q8_0, rows asked in a different order and with a repeat.
  const std::vector<int64_t> ids{691, 269, 265, 277, 1019, 265, 1019, 1019};
  const std::vector<int64_t> rows{6, 0, 3, 6};
  cli::Settings s = settings("tiny-dream-Q8_0", ids, rows);
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(cli::cmd_logits(s), 0);
  ::testing::internal::GetCapturedStdout();
  const std::vector<float> file = read_f32(s.out, rows.size() * kVocab);

  const std::vector<float> ref = read_f32(data_path("logits/tiny-dream-Q8_0__c1_short_len8.f64ref.f32"), 8 * kVocab);
  std::vector<float> expected;
  for (int64_t r : rows) expected.insert(expected.end(), ref.begin() + r * kVocab, ref.begin() + (r + 1) * kVocab);
  EXPECT_LE(compare(file, expected).worst_rel_l2, 1e-4);  // raw rows: no Dream shift in the file

  std::vector<int32_t> ids32(ids.begin(), ids.end());
  EXPECT_EQ(file, model_named("tiny-dream-Q8_0").forward(ids32, rows));
  // Nothing but the output file is left in the directory (the temporary was renamed).
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(LogitsCommand, ReplacesAnExistingFile) {
  cli::Settings s = settings("tiny-llada-F32", {1012, 691, 269}, {2});
  {
    std::ofstream f(s.out);
    f << std::string(100000, 'x');
  }
  ::testing::internal::CaptureStdout();
  cli::cmd_logits(s);
  ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(fs::file_size(s.out), kVocab * 4u);
}

TEST_F(LogitsCommand, RangeChecksComeFirst) {
  // A row outside the canvas: a usage error, raised before the model file is even opened.
  cli::Settings s = settings("tiny-llada-F32", {1, 2, 3}, {0, 3});
  s.model = dir_ + "/does-not-exist.gguf";
  auto [msg, code] = error_of(s);
  EXPECT_EQ(msg, "--rows: position 3 is out of range: --tokens has 3 ids (positions 0..2)");
  EXPECT_EQ(code, 2);

  s = settings("tiny-llada-F32", {1, 2, 1024}, {0});
  std::tie(msg, code) = error_of(s);
  EXPECT_EQ(msg, "--tokens: id 1024 at position 2 is out of range: the model's vocabulary has 1024 tokens "
                 "(ids 0..1023)");
  EXPECT_EQ(code, 1);

  s = settings("tiny-llada-F32", {1, -5}, {0});
  std::tie(msg, code) = error_of(s);
  EXPECT_EQ(msg, "--tokens: id -5 at position 1 is negative");
  EXPECT_EQ(code, 2);
  EXPECT_FALSE(fs::exists(dir_ + "/out.f32"));
}

TEST_F(LogitsCommand, GpuIsAClearError) {
  cli::Settings s = settings("tiny-llada-F32", {1, 2}, {0});
  s.device = "gpu";
  auto [msg, code] = error_of(s);
  EXPECT_NE(msg.find("--device cpu"), std::string::npos) << msg;
  EXPECT_EQ(code, 1);
}

TEST_F(LogitsCommand, BinaryVerboseReportsPeakMemory) {
  const std::string out = dir_ + "/bin.f32";
  RunResult r = run_dllm({"logits", "--model", data_path("models/tiny-llada-Q4_K_M.gguf"), "--tokens",
                          "1012,691,269,265,1014,277,1014,1014", "--rows", "7,4", "--out", out, "--threads", "2",
                          "--verbose"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("peak resident memory: "), std::string::npos) << r.err;
  const std::vector<float> file = read_f32(out, 2 * kVocab);
  const std::vector<float> ref = read_f32(data_path("logits/tiny-llada-Q4_K_M__c1_short_len8.f64ref.f32"), 8 * kVocab);
  std::vector<float> expected(ref.begin() + 7 * kVocab, ref.end());
  expected.insert(expected.end(), ref.begin() + 4 * kVocab, ref.begin() + 5 * kVocab);
  EXPECT_LE(compare(file, expected).worst_rel_l2, 1e-4);
}

}  // namespace
}  // namespace dllm::test
