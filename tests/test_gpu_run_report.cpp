// What `dllm run --verbose` and `dllm run --json` report about the GPU executor, checked through the
// command itself (cmd_run_with) running the GPU executor on the CPU emulator of tests/gpu: the executor's
// description lines (device, kernel compile/load time, weight memory) reach both reports, and with
// DLLM_GPU_PROFILE=1 so does the per-step split (GEMM, attention, LM head, transfers); without it, or on
// a CPU executor, there is no split.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "gpu/emulator_device.h"
#include "jit/cuda/gpu_executor.h"
#include "support.h"

namespace dllm::test {
namespace {

namespace jc = dllm::jit::cuda;

struct RunOutput {
  int status = -1;
  std::string out, err;
};

// Sets (or clears) DLLM_GPU_PROFILE for one scope: the executor reads it when it is built.
class ProfileEnv {
 public:
  explicit ProfileEnv(bool on) {
    if (on) {
      setenv("DLLM_GPU_PROFILE", "1", 1);
    } else {
      unsetenv("DLLM_GPU_PROFILE");
    }
  }
  ~ProfileEnv() { unsetenv("DLLM_GPU_PROFILE"); }
};

// `dllm run` of 8 tokens in 4 steps on tiny-llada-Q8_0 with `flags`, on the GPU executor over the
// emulator (gpu) or on the reference executor.
RunOutput run(bool gpu, bool profile, const std::vector<std::string>& flags) {
  const ProfileEnv env(profile);
  std::vector<std::string> args = {"run",          "--model",   data_path("models/tiny-llada-Q8_0.gguf"),
                                   "--prompt-tokens", "1012,691,269,265", "--max-tokens", "8",
                                   "--block-length", "8",      "--steps", "4", "--no-early-stop"};
  args.insert(args.end(), flags.begin(), flags.end());
  std::string help;
  const cli::Settings s = cli::parse_command_line(args, &help);
  model::LoadOptions opt;
  opt.threads = 2;
  cli::Backend backend{"cpu", "DLLM_EXECUTOR=reference", ""};
  if (gpu) {
    opt.make_executor = [](ThreadPool& p) -> std::unique_ptr<model::Executor> {
      return std::make_unique<jc::GpuExecutor>(std::make_unique<EmulatorDevice>(), p);
    };
    backend = {"gpu", "the CPU emulator of the GPU kernels", ""};
  }
  RunOutput o;
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  try {
    o.status = cli::cmd_run_with(s, backend, std::move(opt));
  } catch (const std::exception& e) {
    o.err = std::string("exception: ") + e.what() + "\n";
  }
  o.out = ::testing::internal::GetCapturedStdout();
  o.err += ::testing::internal::GetCapturedStderr();
  return o;
}

bool has_line_starting(const nlohmann::json& lines, const std::string& prefix) {
  for (const auto& l : lines)
    if (l.get<std::string>().rfind(prefix, 0) == 0) return true;
  return false;
}

TEST(GpuRunReport, ProfiledRunSplitsEveryStepInJsonAndVerbose) {
  const RunOutput o = run(true, true, {"--json", "--verbose"});
  ASSERT_EQ(o.status, 0) << o.err;
  const auto j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["device"]["name"], "gpu");
  EXPECT_EQ(j["device"]["executor"], "gpu");
  const auto& lines = j["device"]["description"];
  ASSERT_TRUE(lines.is_array()) << j["device"].dump();
  EXPECT_TRUE(has_line_starting(lines, "gpu: CPU emulator")) << lines.dump();
  EXPECT_TRUE(has_line_starting(lines, "gpu kernels: ")) << lines.dump();
  EXPECT_TRUE(has_line_starting(lines, "gpu weights: ")) << lines.dump();
  EXPECT_TRUE(has_line_starting(lines, "gpu profile (device timers per kernel group, graphs off)")) << lines.dump();
  EXPECT_TRUE(has_line_starting(lines, "gpu graphs: off (DLLM_GPU_PROFILE times each operation)")) << lines.dump();
  EXPECT_GT(j["device"]["gpu_weight_bytes"].get<uint64_t>(), 0u);

  const auto& p = j["gpu_profile"];
  ASSERT_TRUE(p.is_object()) << j.dump();
  EXPECT_EQ(p["steps"], j["forward_passes"]);  // every forward pass of a plain run is a whole-model pass
  EXPECT_GT(p["steps"].get<int>(), 0);
  EXPECT_EQ(p["synchronised"], false);  // the emulator has timers: the executor marks, it never waits in a step
  for (const char* k : {"gemm_ms_per_step", "attention_ms_per_step", "lm_head_ms_per_step", "transfer_ms_per_step"}) {
    ASSERT_TRUE(p[k].is_number()) << k;
    EXPECT_GT(p[k].get<double>(), 0.0) << k;  // the emulator is slow: every part takes measurable time
  }
  // The parts of a step are at most its mean time (with the embedding lookup left out).
  const double parts = p["gemm_ms_per_step"].get<double>() + p["attention_ms_per_step"].get<double>() +
                       p["lm_head_ms_per_step"].get<double>() + p["transfer_ms_per_step"].get<double>();
  EXPECT_LE(parts, j["timings"]["step_mean_ms"].get<double>() * 1.01 + 0.5);

  // --verbose (stderr) carries the same lines.
  EXPECT_NE(o.err.find("\ngpu: CPU emulator"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("\ngpu kernels: "), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("\ngpu profile (device timers per kernel group, graphs off), per step: gemm "),
            std::string::npos)
      << o.err;
}

TEST(GpuRunReport, UnprofiledRunDescribesTheDeviceWithoutASplit) {
  const RunOutput o = run(true, false, {"--json", "--verbose"});
  ASSERT_EQ(o.status, 0) << o.err;
  const auto j = nlohmann::json::parse(o.out);
  EXPECT_TRUE(has_line_starting(j["device"]["description"], "gpu: CPU emulator")) << j["device"].dump();
  // Every pass after the first is one graph (a plain run's passes all end with logits).
  EXPECT_TRUE(has_line_starting(j["device"]["description"], "gpu graphs: on, ")) << j["device"].dump();
  for (const auto& l : j["device"]["description"]) {
    const std::string line = l.get<std::string>();
    if (line.rfind("gpu graphs: on, ", 0) != 0) continue;
    const int passes = j["forward_passes"].get<int>();
    EXPECT_NE(line.find(std::to_string(passes - 1) + " step(s) as one graph each"), std::string::npos) << line;
    EXPECT_NE(line.find(", 0 cut short"), std::string::npos) << line;
  }
  EXPECT_TRUE(j["gpu_profile"].is_null()) << j["gpu_profile"].dump();
  EXPECT_NE(o.err.find("\ngpu: CPU emulator"), std::string::npos) << o.err;
  EXPECT_EQ(o.err.find("gpu profile"), std::string::npos) << o.err;
}

TEST(GpuRunReport, VerboseTextRunPrintsTheSplit) {
  const RunOutput o = run(true, true, {"--verbose"});
  ASSERT_EQ(o.status, 0) << o.err;
  EXPECT_NE(o.err.find("\ngpu profile (device timers"), std::string::npos) << o.err;
  EXPECT_EQ(o.out.find("gpu profile"), std::string::npos) << "diagnostics belong on stderr";
}

TEST(GpuRunReport, CpuExecutorHasNoGpuLinesEvenWithTheVariableSet) {
  const RunOutput o = run(false, true, {"--json", "--verbose"});
  ASSERT_EQ(o.status, 0) << o.err;
  const auto j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["device"]["description"], nlohmann::json::array());
  EXPECT_TRUE(j["device"]["gpu_weight_bytes"].is_null());
  EXPECT_TRUE(j["gpu_profile"].is_null());
  // No line of the report is about a GPU (the model's path may contain "gpu": a worktree's name).
  EXPECT_EQ(("\n" + o.err).find("\ngpu"), std::string::npos) << o.err;
}

TEST(GpuRunReport, ProfileSplitPerStep) {
  jc::GpuProfile p;
  EXPECT_EQ(p.per_step_ms(1.0), 0.0);
  EXPECT_NE(p.report().find("no whole-model pass ran"), std::string::npos);
  p.steps = 4;
  p.gemm_s = 0.2;
  p.attention_s = 0.04;
  p.lm_head_s = 0.008;
  p.transfer_s = 0.004;
  EXPECT_DOUBLE_EQ(p.per_step_ms(p.gemm_s), 50.0);
  EXPECT_NE(p.report().find("gemm 50.00 ms, attention 10.00 ms, lm head 2.00 ms, transfer 1.00 ms"),
            std::string::npos)
      << p.report();
}

}  // namespace
}  // namespace dllm::test
