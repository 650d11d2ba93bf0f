// bench_batch: throughput of the batched engine (model::Batch) on one model and one setting, in one
// process, so that the peak memory belongs to that setting alone. R identical-length requests (different
// prompts, early stop off so every run does the same work) go through a batch of at most B sequences in
// flight; B = 1 is the same requests one after another. Prints one JSON object: wall time, generated
// tokens per second, batched passes, mean time per pass, resident memory after load and at peak.
//
//   bench_batch --model FILE [--batch B] [--requests R] [--prompt-tokens P] [--max-tokens L] [--steps N]
//               [--block-length K] [--dual-cache] [--threads T] [--executor jit|reference]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "jit/cpu_executor.h"
#include "jit/cpu_features.h"
#include "model/batch.h"
#include "common/error.h"
#include "model/model.h"

namespace {

uint64_t rss_bytes(bool peak) {
  if (peak) {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  }
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * 4096;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "bench_batch: %s\n", why.c_str());
  std::fprintf(stderr,
               "usage: bench_batch --model FILE [--batch B] [--requests R] [--prompt-tokens P] [--max-tokens L]\n"
               "                   [--steps N] [--block-length K] [--dual-cache] [--threads T] [--executor jit|reference]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, executor = "jit";
  int64_t batch = 1, requests = 8, prompt_tokens = 32, max_tokens = 32, steps = 0, block = 32, threads = 0;
  bool dual_cache = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("flag " + a + " needs a value");
      return argv[++i];
    };
    auto number = [&]() -> int64_t {
      const std::string v = value();
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end || n < 0) usage("flag " + a + " needs a non-negative integer, got '" + v + "'");
      return n;
    };
    if (a == "--model") model_path = value();
    else if (a == "--batch") batch = number();
    else if (a == "--requests") requests = number();
    else if (a == "--prompt-tokens") prompt_tokens = number();
    else if (a == "--max-tokens") max_tokens = number();
    else if (a == "--steps") steps = number();
    else if (a == "--block-length") block = number();
    else if (a == "--threads") threads = number();
    else if (a == "--executor") executor = value();
    else if (a == "--dual-cache") dual_cache = true;
    else usage("unknown flag " + a);
  }
  if (model_path.empty()) usage("--model is required");
  if (batch < 1 || requests < 1 || prompt_tokens < 1) usage("--batch, --requests and --prompt-tokens must be at least 1");
  if (executor != "jit" && executor != "reference") usage("--executor must be jit or reference");
  try {
    using Clock = std::chrono::steady_clock;
    const auto t_load = Clock::now();
    dllm::model::LoadOptions opt;
    opt.threads = static_cast<int>(threads);
    const dllm::jit::Isa isa = dllm::jit::default_isa();
    if (executor == "jit") {
      opt.make_executor = [isa](dllm::ThreadPool& pool) { return std::make_unique<dllm::jit::CpuExecutor>(pool, isa); };
    }
    auto m = dllm::model::Model::load(model_path, opt);
    const double load_s = std::chrono::duration<double>(Clock::now() - t_load).count();
    const uint64_t rss_loaded = rss_bytes(false);

    dllm::model::GenerateConfig cfg;
    cfg.arch = m->arch();
    cfg.mask_id = m->mask_token_id();
    cfg.max_tokens = max_tokens;
    cfg.steps = steps;
    cfg.block_length = block;
    cfg.remasking = dllm::model::default_remasking(m->arch());
    cfg.dual_cache = dual_cache;
    cfg.early_stop = false;
    cfg.context_length = m->hparams().n_ctx;

    dllm::model::Batch b(*m, {batch, 0});
    const int64_t V = m->n_vocab();
    for (int64_t r = 0; r < requests; ++r) {
      std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens));
      for (int64_t i = 0; i < prompt_tokens; ++i)  // distinct prompts, ids away from the specials
        prompt[static_cast<size_t>(i)] = static_cast<int32_t>(1000 + (r * 7919 + i * 104729) % (V - 2000));
      b.add(cfg, prompt);
    }
    const auto t0 = Clock::now();
    int64_t rows = 0;
    while (b.step()) rows += b.last_step_rows();
    const double wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
    int64_t committed = 0;
    for (const auto& [id, r] : b.take_finished()) committed += r.committed;

    nlohmann::ordered_json out;
    out["model"] = model_path;
    out["architecture"] = m->hparams().arch_name;
    out["layers"] = m->hparams().n_layer;
    out["executor"] = m->executor().name();
    out["threads"] = m->pool().size();
    out["batch"] = batch;
    out["requests"] = requests;
    out["prompt_tokens"] = prompt_tokens;
    out["max_tokens"] = max_tokens;
    out["steps"] = cfg.effective_steps();
    out["block_length"] = block;
    out["dual_cache"] = dual_cache;
    out["load_s"] = load_s;
    out["wall_s"] = wall_s;
    out["tokens"] = committed;
    out["tokens_per_s"] = committed / wall_s;
    out["passes"] = b.forward_passes();
    out["ms_per_pass"] = 1e3 * wall_s / static_cast<double>(std::max<int64_t>(b.forward_passes(), 1));
    out["rows_per_pass"] = static_cast<double>(rows) / static_cast<double>(std::max<int64_t>(b.forward_passes(), 1));
    out["rss_loaded_bytes"] = rss_loaded;
    out["rss_peak_bytes"] = rss_bytes(true);
    out["peak_per_sequence_bytes"] =
        static_cast<double>(rss_bytes(true) - std::min(rss_bytes(true), rss_loaded)) / static_cast<double>(std::min(batch, requests));
    std::cout << out.dump() << "\n";
  } catch (const dllm::Error& e) {
    std::fprintf(stderr, "bench_batch: %s\n", e.what());
    return e.exit_code();
  }
  return 0;
}
