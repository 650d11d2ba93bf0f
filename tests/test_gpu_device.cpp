// GPU execution tests on a real NVIDIA GPU (compute capability 8.0+ and NVRTC). Every test skips with
// the reason when no usable GPU is found, so the file passes on CPU-only machines;
// bench/gpu/device-check.sh runs it on a GPU machine. Checks: logits of every quantised fixture and case
// against the CPU reference executor (the forward program on the device, with the weights prepared by
// hand and through Model), greedy generations identical to the references (and so to the CPU path) on
// every quantised generation fixture, Q5_K models (made from the Q4_K_M fixtures), a pass as one CUDA Graph against the
// same pass launched kernel by kernel, the kernel cache (a second load compiles nothing), types without GPU kernels named,
// and the device choice reported for this machine.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "gpu/parity.h"
#include "jit/cpu_executor.h"
#include "jit/cpu_features.h"
#include "jit/cuda/cuda_device.h"
#include "jit/cuda/device_select.h"
#include "jit/cuda/gpu_executor.h"
#include "common/error.h"
#include "model/model.h"
#include "q5k_model.h"
#include "support.h"

namespace dllm::test {
namespace {

namespace jc = dllm::jit::cuda;
namespace fs = std::filesystem;

// "" when a usable GPU is present, else why not (the skip message).
const std::string& no_gpu_reason() {
  static const std::string reason = [] {
    const jc::DeviceChoice c = jc::select_device("auto", 0);
    return c.device == jc::DeviceKind::Gpu ? std::string() : c.reason;
  }();
  return reason;
}

#define REQUIRE_GPU()                                                                               \
  if (!no_gpu_reason().empty()) GTEST_SKIP() << "no usable GPU, GPU execution not tested: " << no_gpu_reason()

std::unique_ptr<model::Model> cpu_model(const std::string& name) {
  model::LoadOptions opt;
  opt.threads = 4;
  return model::Model::load(data_path("models/" + name + ".gguf"), opt);
}

class GpuDevice : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuDevice, LogitsOfEveryCaseMatchTheCpuReference) {
  REQUIRE_GPU();
  const std::string name = GetParam();
  const auto cpu = cpu_model(name);
  const model::HParams& hp = cpu->hparams();
  ThreadPool pool(4);
  auto gpu = jc::GpuExecutor::open(pool);
  const model::ForwardWeights fw = model::prepare_forward_weights(hp, cpu->tensors(), *gpu);
  for (const std::string& c : logits_case_names()) {
    const LogitsCase lc = logits_case(name, c);
    std::vector<float> got(lc.rows.size() * static_cast<size_t>(hp.n_vocab));
    model::forward(hp, fw, *gpu, model::ForwardRequest{lc.ids, lc.rows, got.data()});
    expect_logits_close(got, cpu->forward(lc.ids, lc.rows), hp.n_vocab, name + " " + c);
  }
  // A long canvas (several key tiles and row blocks, rows in any order, repeats) against the CPU.
  std::vector<int32_t> ids(300);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % hp.n_vocab);
  const std::vector<int64_t> rows = {299, 0, 150, 150, 64, 63, 200};
  std::vector<float> got(rows.size() * static_cast<size_t>(hp.n_vocab));
  model::forward(hp, fw, *gpu, model::ForwardRequest{ids, rows, got.data()});
  expect_logits_close(got, cpu->forward(ids, rows), hp.n_vocab, name + " 300 tokens");
  for (const std::string& line : gpu->describe()) RecordProperty("describe", line);
}

TEST_P(GpuDevice, ExecutorPathMatchesTheCpuReference) {
  REQUIRE_GPU();
  const std::string name = GetParam();
  const auto cpu = cpu_model(name);
  model::LoadOptions opt;
  opt.threads = 4;
  opt.make_executor = [](ThreadPool& p) -> std::unique_ptr<model::Executor> { return jc::GpuExecutor::open(p); };
  const auto gm = model::Model::load(data_path("models/" + name + ".gguf"), opt);
  for (const std::string& c : logits_case_names()) {
    const LogitsCase lc = logits_case(name, c);
    expect_logits_close(gm->forward(lc.ids, lc.rows), cpu->forward(lc.ids, lc.rows), cpu->n_vocab(),
                        name + " executor path " + c);
  }
}

INSTANTIATE_TEST_SUITE_P(TinyQuantised, GpuDevice,
                         ::testing::Values("tiny-llada-Q8_0", "tiny-llada-Q4_K_M", "tiny-dream-Q8_0",
                                           "tiny-dream-Q4_K_M"));

// CUDA Graphs on the device: passes of several shapes as one graph each give the bits of the same passes launched
// kernel by kernel (DLLM_GPU_GRAPHS=0), and the graphs are really used (built once, then updated).
TEST(GpuDeviceGraphs, StepAsOneGraphEqualsPlainLaunches) {
  REQUIRE_GPU();
  for (const std::string name : {"tiny-llada-Q4_K_M", "tiny-dream-Q8_0"}) {
    SCOPED_TRACE(name);
    const auto cpu = cpu_model(name);
    const model::HParams& hp = cpu->hparams();
    ThreadPool pool(4);
    std::unique_ptr<jc::GpuExecutor> graph, plain;
    {
      ScopedEnv debug("DLLM_GPU_DEBUG", nullptr);  // the device check sets it, and it turns graphs off
      graph = jc::GpuExecutor::open(pool);
    }
    {
      ScopedEnv off("DLLM_GPU_GRAPHS", "0");
      plain = jc::GpuExecutor::open(pool);
    }
    const model::ForwardWeights fg = model::prepare_forward_weights(hp, cpu->tensors(), *graph);
    const model::ForwardWeights fp = model::prepare_forward_weights(hp, cpu->tensors(), *plain);
    size_t passes = 0;
    for (int round = 0; round < 2; ++round) {
      for (const std::string& c : logits_case_names()) {
        const LogitsCase lc = logits_case(name, c);
        std::vector<float> a(lc.rows.size() * static_cast<size_t>(hp.n_vocab)), b(a.size());
        model::forward(hp, fg, *graph, model::ForwardRequest{lc.ids, lc.rows, a.data()});
        model::forward(hp, fp, *plain, model::ForwardRequest{lc.ids, lc.rows, b.data()});
        EXPECT_EQ(a, b) << c << " round " << round;
        ++passes;
      }
    }
    const jc::GraphStats g = graph->device().graph_stats();
    EXPECT_EQ(g.captured, passes - 1) << graph->graphs_line();
    EXPECT_EQ(g.broken, 0u);
    EXPECT_LT(g.instantiated, g.captured) << "every shape comes twice: some graphs are updated, not rebuilt";
    EXPECT_EQ(plain->device().graph_stats().captured, 0u);
    RecordProperty("graphs", graph->graphs_line());
  }
}

// Q5_K on the device (q5k_model.h): the high-bits model against the CPU reference executor, and the
// same-values copy bit-identical to its Q4_K_M file (Q5_K's byte quants and Q4_K's nibbles give the same
// exact int32 dot and the same f32 operations).
TEST(GpuDeviceQ5K, Q5KModelsMatchTheCpuReferenceAndTheirQ4KFiles) {
  REQUIRE_GPU();
  for (const std::string name : {"tiny-llada-Q4_K_M", "tiny-dream-Q4_K_M"}) {
    const std::string bits = ::testing::TempDir() + "/" + name + "-gpu-q5k-bits.gguf";
    const std::string same = ::testing::TempDir() + "/" + name + "-gpu-q5k-same.gguf";
    ASSERT_GT(write_q4k_as_q5k(data_path("models/" + name + ".gguf"), bits, Q5kMode::HighBits), 5);
    ASSERT_GT(write_q4k_as_q5k(data_path("models/" + name + ".gguf"), same, Q5kMode::SameValues), 5);
    model::LoadOptions opt;
    opt.threads = 4;
    const auto cpu = model::Model::load(bits, opt);
    opt.make_executor = [](ThreadPool& p) -> std::unique_ptr<model::Executor> { return jc::GpuExecutor::open(p); };
    const auto gpu_bits = model::Model::load(bits, opt);
    const auto gpu_same = model::Model::load(same, opt);
    const auto gpu_q4 = model::Model::load(data_path("models/" + name + ".gguf"), opt);
    for (const std::string& c : logits_case_names()) {
      const LogitsCase lc = logits_case(name, c);
      expect_logits_close(gpu_bits->forward(lc.ids, lc.rows), cpu->forward(lc.ids, lc.rows), cpu->n_vocab(),
                          name + " Q5_K high bits " + c);
      const auto a = gpu_same->forward(lc.ids, lc.rows), b = gpu_q4->forward(lc.ids, lc.rows);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << name << " " << c;
    }
  }
}

// Every quantised generation reference, on the GPU and on the CPU path (the JIT CPU executor, as
// `dllm run --device cpu` uses it): identical tokens except at most the known chaotic runs (parity.h).
TEST(GpuGeneration, GreedyTokensEqualTheReferencesAndTheCpuPath) {
  REQUIRE_GPU();
  GenerationTally vs_ref, vs_cpu;
  const jit::Isa isa = jit::default_isa();
  for (const std::string& file : quantised_generation_files()) {
    const GenerationCase c = generation_case(file);
    model::LoadOptions opt;
    opt.threads = 4;
    opt.make_executor = [isa](ThreadPool& p) -> std::unique_ptr<model::Executor> {
      return std::make_unique<jit::CpuExecutor>(p, isa);
    };
    const auto cpu = model::Model::load(data_path("models/" + c.model_file), opt);
    ThreadPool pool(4);
    auto gpu = jc::GpuExecutor::open(pool);
    GpuLogitSource src(*gpu, cpu->hparams(), cpu->tensors());
    const std::vector<int32_t> on_gpu = generated_tokens(src, c);
    auto cpu_src = model::make_model_logit_source(*cpu);
    vs_cpu.add(file, on_gpu, generated_tokens(*cpu_src, c));
    vs_ref.add(file, on_gpu, c.expected);
  }
  EXPECT_EQ(vs_ref.runs, 23);
  vs_ref.expect_at_most(kChaoticGenerations, "GPU vs reference generations");
  vs_cpu.expect_at_most(kChaoticGenerations, "GPU vs CPU-path generations");
}

TEST(GpuDeviceCache, SecondLoadCompilesNothing) {
  REQUIRE_GPU();
  char tpl[] = "/tmp/dllm-gpu-cache-XXXXXX";
  const std::string dir = mkdtemp(tpl);
  const char* old = std::getenv("DLLM_CACHE");
  const std::string saved = old ? old : "";
  setenv("DLLM_CACHE", dir.c_str(), 1);
  const auto cpu = cpu_model("tiny-llada-Q4_K_M");
  const LogitsCase lc = logits_case("tiny-llada-Q4_K_M", "c1_short_len8");
  std::vector<float> first(lc.rows.size() * 1024), second(first.size());
  ThreadPool pool(2);
  for (int round = 0; round < 2; ++round) {
    auto gpu = jc::GpuExecutor::open(pool);
    const model::ForwardWeights fw = model::prepare_forward_weights(cpu->hparams(), cpu->tensors(), *gpu);
    model::forward(cpu->hparams(), fw, *gpu,
                   model::ForwardRequest{lc.ids, lc.rows, round ? second.data() : first.data()});
    const jc::KernelLoadStats& s = gpu->device().load_stats();
    if (round == 0) {
      EXPECT_EQ(s.units_compiled, 1);
      EXPECT_EQ(s.units_from_cache, 0);
    } else {
      EXPECT_EQ(s.units_compiled, 0) << "the second load compiled again";
      EXPECT_EQ(s.units_from_cache, 1);
    }
  }
  EXPECT_EQ(first, second) << "the cached kernels compute the same bits";
  if (old) {
    setenv("DLLM_CACHE", saved.c_str(), 1);
  } else {
    unsetenv("DLLM_CACHE");
  }
  fs::remove_all(dir);
}

TEST(GpuDeviceErrors, TypesWithoutKernelsNameTheTensor) {
  REQUIRE_GPU();
  model::LoadOptions opt;
  opt.make_executor = [](ThreadPool& p) -> std::unique_ptr<model::Executor> { return jc::GpuExecutor::open(p); };
  for (const char* f : {"tiny-llada-F32", "tiny-dream-F16"}) {
    try {
      model::Model::load(data_path(std::string("models/") + f + ".gguf"), opt);
      ADD_FAILURE() << f << " loaded on the GPU";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(": the GPU backend has matrix kernels for Q4_K, Q5_K, Q6_K, Q8_0 and Q5_0"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(GpuDeviceChoice, AutoPrefersThisGpuAndSaysWhy) {
  REQUIRE_GPU();
  const jc::DeviceChoice c = jc::select_device("auto", uint64_t{1} << 30);
  EXPECT_EQ(c.device, jc::DeviceKind::Gpu);
  EXPECT_NE(c.reason.find("compute capability"), std::string::npos) << c.reason;
  // More memory than any GPU has: auto falls back to the CPU, gpu is an error with both numbers.
  const uint64_t huge = uint64_t{1} << 50;
  EXPECT_EQ(jc::select_device("auto", huge).device, jc::DeviceKind::Cpu);
  try {
    jc::select_device("gpu", huge);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not enough free GPU memory on GPU"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dllm::test
